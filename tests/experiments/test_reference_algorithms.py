"""The centralized (GM ceiling) and local-only (PM floor) reference algorithms."""

from __future__ import annotations

import torch

from fedhp.algorithms.local import LocalOptions
from fedhp.engine.runner import evaluate_state
from tests.algorithms.tiny import client_data, init_params, mlr_grad, tiny_context
from tests.conftest import small_experiment

TINY = ["partition.train_per_class=20", "partition.test_per_class=20", "model.name=mlr"]


def test_centralized_uses_union_batches_of_batch_times_clients() -> None:
    exp = small_experiment("algorithm.name=centralized", "algorithm.local_steps=3", *TINY)
    shapes: list[tuple[int, ...]] = []
    original = exp.model.loss_and_grad

    def spy(flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor):  # type: ignore[no-untyped-def]
        shapes.append(tuple(x.shape[:2]))
        return original(flat, x, y)

    exp.model.loss_and_grad = spy  # type: ignore[method-assign]
    state = exp.algorithm.init_state(exp.model.init_params(0))
    before = state["global"].clone()
    exp.algorithm.run_round(state, 0)
    assert shapes == [(1, 20 * 20)] * 3  # local_steps steps of batch_size × num_clients
    assert exp.options.gradient_evaluations() == 3
    assert not torch.equal(before, state["global"])
    assert exp.ctx.ledger.end_round() == {
        "bytes_total": 0.0,
        "dense_bytes_total": 0.0,
        "remark1_bits_total": 0.0,
    }
    assert exp.algorithm.personal_models(state) is None


def test_centralized_learns_the_union() -> None:
    exp = small_experiment("algorithm.name=centralized", "algorithm.local_steps=20", *TINY)
    state = exp.algorithm.init_state(exp.model.init_params(0))
    for rnd in range(3):
        exp.algorithm.run_round(state, rnd)
    row, _ = evaluate_state(exp, state)
    assert row["global_acc"] > 0.6 and "personal_acc" not in row


def test_local_only_matches_a_per_client_loop() -> None:
    """Every client continues plain SGD from its OWN model, on its own data, round after round."""
    ctx = tiny_context(edge_sizes=(3, 2))
    opt = LocalOptions(local_steps=3, lr=0.2, batch_size=6)
    algo = opt.build(ctx)
    state = algo.init_state(init_params())
    assert algo.global_model(state) is None
    state["theta"] += torch.randn(state["theta"].shape, generator=torch.Generator().manual_seed(1))
    thetas = list(state["theta"].clone())
    for rnd in range(2):
        algo.run_round(state, rnd)
        for c in range(5):
            for _ in range(opt.local_steps):
                thetas[c] = thetas[c] - opt.lr * mlr_grad(thetas[c], *client_data(ctx, c))
        torch.testing.assert_close(state["theta"], torch.stack(thetas), atol=1e-6, rtol=1e-5)
    assert ctx.ledger.end_round()["bytes_total"] == 0.0  # no communication


def test_local_only_reports_personal_rows_only() -> None:
    exp = small_experiment("algorithm.name=local", "algorithm.local_steps=4", *TINY)
    state = exp.algorithm.init_state(exp.model.init_params(0))
    exp.algorithm.run_round(state, 0)
    row, _ = evaluate_state(exp, state)
    assert "global_acc" not in row and row["personal_acc"] > 0.3  # chance: 0.1


def test_local_only_client_ignores_other_clients_data() -> None:
    """Client 0's model does not depend on client 1's data (one client's rows, no mixing)."""
    exp = small_experiment("algorithm.name=local", "algorithm.local_steps=2", *TINY)
    state = exp.algorithm.init_state(exp.model.init_params(0))
    gen = exp.ctx.generator.get_state()
    exp.algorithm.run_round(state, 0)
    first = state["theta"][0].clone()
    fed = exp.ctx.fed
    lo, hi = int(fed.train.offsets[1]), int(fed.train.offsets[2])
    fed.train.x[lo:hi] = torch.randn_like(fed.train.x[lo:hi])  # scramble client 1's data
    state = exp.algorithm.init_state(exp.model.init_params(0))
    exp.ctx.generator.set_state(gen)
    exp.algorithm.run_round(state, 0)
    torch.testing.assert_close(state["theta"][0], first)
