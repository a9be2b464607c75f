"""pFedMe's in-place round against the straightforward formula, bit for bit (the hand
computation and the smoke runs are in ``test_personalized.py``)."""

from __future__ import annotations

import pytest
import torch

from fedhp.algorithms.base import Task
from fedhp.algorithms.pfedme import PFedMe, PFedMeOptions
from fedhp.engine.ops import mean_group_loss, weighted_mean
from fedhp.models.base import BatchedModel
from fedhp.models.zoo import BatchedMLP
from tests.algorithms.pfedme_reference import reference_train
from tests.algorithms.tiny import init_params, tiny_context
from tests.policies import use_policy


def unfused_round(algo: PFedMe, state: dict[str, torch.Tensor], task: Task) -> dict[str, float]:
    """``PFedMe.train`` then ``aggregate`` before issue 15 (fedhp 38d7633): the readable train
    (``tests/algorithms/pfedme_reference.py``), and the upload sent with
    ``RunContext.send``."""
    ctx, opt = algo.ctx, algo.options
    clients = task.clients
    update = reference_train(algo, state, task)
    sent = ctx.send("client_cloud", "up", update.per_client["local"], clients)
    mean = weighted_mean(sent, ctx.client_weights(clients))
    state["global"] = (1 - opt.beta) * state["global"] + opt.beta * mean
    assert update.losses is not None
    return {"local_loss": mean_group_loss(update.losses, opt.R)}


@pytest.mark.parametrize(
    ("theta_init", "eps", "l2", "fraction"),
    [("round", 0.0, 0.0, 1.0), ("reset", 0.05, 0.01, 1.0), ("warm", 0.02, 0.0, 0.6)],
)
@pytest.mark.parametrize("cache", [10**9, 60], ids=["one part", "parts of 2 clients"])
def test_round_is_the_unfused_formula_bit_for_bit(
    theta_init: str,
    eps: float,
    l2: float,
    fraction: float,
    cache: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two rounds on identical contexts: the same state, statistics and ledger, exactly,
    whether the clients fit one cache-sized part or run their local rounds in parts of two
    (``theta`` and ``w_loc``: 2 x 15 floats each against a cache of ``cache``). The MLR takes
    the reference step (gradient, then pull, then step): the MLPs' step inside the backward
    pass rounds once less (tests/models: equal to 1e-6)."""
    monkeypatch.setattr(BatchedMLP, "sgd_step", BatchedModel.sgd_step)
    opt = PFedMeOptions(
        lam=3.0,
        K=3,
        R=3,
        personal_lr=0.1,
        lr=0.2,
        beta=0.8,
        batch_size=4,
        l2=l2,
        theta_init=theta_init,
    )
    runs = []
    for _ in range(2):
        ctx = tiny_context(edge_sizes=(5,), zero_threshold=eps, weighting="samples")
        use_policy(ctx.model, cache_floats=cache)
        ctx.participation.client_fraction = fraction
        algo = opt.build(ctx)
        assert isinstance(algo, PFedMe)
        state = algo.init_state(init_params())
        state["theta"] += 0.1 * torch.randn(
            state["theta"].shape, generator=torch.Generator().manual_seed(5)
        )
        runs.append((algo, state))
    (algo, state), (plain_algo, plain_state) = runs
    for rnd in range(2):
        stats = algo.run_round(state, rnd)
        plain_stats = unfused_round(plain_algo, plain_state, plain_algo.plan(plain_state, rnd))
        assert stats == plain_stats
        for key, value in state.items():
            assert torch.equal(value, plain_state[key]), key
        assert algo.ctx.ledger.state_dict() == plain_algo.ctx.ledger.state_dict()


def test_personal_local_evaluates_each_clients_last_w_loc() -> None:
    """``personal: local`` keeps each trained client's last w_loc as its personalized model
    (the reference code's report), and trains exactly as the default (θ evaluated)."""
    from tests.algorithms.stacked_runs import TINY, start

    base = [*TINY, "algorithm.name=pfedme", "algorithm.K=2", "algorithm.R=3"]
    results = []
    for personal in ("theta", "local"):
        exp, state, task = start([*base, f"algorithm.personal={personal}"])
        update = exp.algorithm.train(state, task)
        results.append((exp, state, task, update))
    (a_exp, a_state, _, a_update), (b_exp, b_state, b_task, b_update) = results
    assert torch.equal(a_state["theta"], b_state["theta"])  # the same training
    assert torch.equal(a_update.per_client["local"], b_update.per_client["local"])
    assert torch.equal(a_exp.algorithm.personal_models(a_state), a_state["theta"])
    kept = b_exp.algorithm.personal_models(b_state)
    assert torch.equal(kept[b_task.clients], b_update.per_client["local"])
    assert not torch.equal(kept[b_task.clients], b_state["theta"][b_task.clients])
