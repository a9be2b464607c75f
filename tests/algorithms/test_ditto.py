"""Ditto: the global side is FedAvg's round; the personal side is prox-SGD from each client's
stored model toward the received global one, with the same sampler; unsampled clients keep
theirs."""

from __future__ import annotations

import pytest
import torch

from fedhp.engine.ops import LocalWork, prox_grad
from tests.conftest import small_experiment

STEPS = ["algorithm.local_steps=3", "algorithm.batch_size=5"]


@pytest.mark.parametrize("lam", [0.0, 2.0])
def test_round_is_fedavg_then_prox_sgd_on_the_personal_models(lam: float) -> None:
    ditto = small_experiment("algorithm.name=ditto", f"algorithm.lam={lam}", *STEPS)
    avg = small_experiment("algorithm.name=fedavg", *STEPS)
    init = ditto.model.init_params(0)
    d_state = ditto.algorithm.init_state(init)
    d_state["personal"] += 0.01 * torch.randn(d_state["personal"].shape)  # v ≠ w
    v0 = d_state["personal"].clone()
    a_state = avg.algorithm.init_state(init)
    ditto.algorithm.run_round(d_state, 0)
    task = avg.algorithm.plan(a_state, 0)
    update = avg.algorithm.train(a_state, task)
    # the personal update draws its minibatches after the global update, from the same stream
    ref = avg.ctx.local_sgd(
        v0[task.clients],
        task.clients,
        LocalWork(0.05, 5, 3),
        prox_grad(task.broadcast["global"], lam),
    )[0]
    avg.algorithm.aggregate(a_state, task, update)
    torch.testing.assert_close(d_state["global"], a_state["global"])
    torch.testing.assert_close(d_state["personal"][task.clients], ref)


def test_unsampled_clients_keep_their_personal_models() -> None:
    exp = small_experiment("algorithm.name=ditto", "federation.client_fraction=0.5", *STEPS)
    algo = exp.algorithm
    state = algo.init_state(exp.model.init_params(0))
    before = state["personal"].clone()
    task = algo.plan(state, 0)
    algo.train(state, task)
    others = torch.ones(exp.ctx.num_clients, dtype=torch.bool)
    others[task.clients] = False
    assert torch.equal(state["personal"][others], before[others])
    assert not torch.equal(state["personal"][task.clients], before[task.clients])
    assert algo.personal_models(state) is state["personal"]
