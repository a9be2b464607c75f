"""FedNova: equal step counts give FedAvg; unequal ones are normalized by each client's real
steps; the momentum form of a_i matches heavy-ball SGD's accumulated step weights."""

from __future__ import annotations

import pytest
import torch

from fedhp.algorithms.base import ALGORITHMS, Task
from fedhp.algorithms.fednova import NormalizedStep, momentum_norm, normalized_average
from fedhp.models.zoo import DNNOptions
from tests.conftest import small_experiment
from tests.engine.test_local_epochs import COUNTS, unequal_context


def test_equal_step_counts_give_fedavg() -> None:
    args = ["algorithm.local_steps=4", "algorithm.batch_size=5", "federation.client_fraction=0.5"]
    nova = small_experiment("algorithm.name=fednova", *args)
    avg = small_experiment("algorithm.name=fedavg", *args)
    states = [e.algorithm.init_state(e.model.init_params(0)) for e in (nova, avg)]
    for rnd in range(2):
        nova.algorithm.run_round(states[0], rnd)
        avg.algorithm.run_round(states[1], rnd)
    torch.testing.assert_close(states[0]["global"], states[1]["global"], atol=1e-6, rtol=0)
    assert not torch.equal(states[0]["global"], nova.model.init_params(0))


def test_normalized_average_by_hand() -> None:
    x = torch.tensor([1.0, 1.0])
    y = torch.tensor([[0.0, 1.0], [1.0, -1.0]])
    a = torch.tensor([2.0, 4.0])
    weights = torch.tensor([1.0, 3.0])  # p = 1/4, 3/4; tau_eff = 0.5 + 3 = 3.5
    # d_1 = (x - y_1)/2 = [0.5, 0]; d_2 = (x - y_2)/4 = [0, 0.5]
    # x - 3.5 * (0.25 * d_1 + 0.75 * d_2) = [1 - 0.4375, 1 - 1.3125]
    out = normalized_average(x, y, a, weights)
    torch.testing.assert_close(out, torch.tensor([0.5625, -0.3125]))


def test_unequal_clients_are_normalized_by_their_real_steps() -> None:
    """Local epochs over clients of 5/13/27/1 samples: the aggregate is FedNova's formula with
    a_i = the step counts the clients really took, and differs from FedAvg's average."""
    model = DNNOptions(hidden=[8]).build((1, 8, 8), 3)
    ctx = unequal_context(model)
    opts = ALGORITHMS.build({"name": "fednova", "local_epochs": 1, "batch_size": 4}, "algorithm")
    algo = opts.build(ctx)
    state = algo.init_state(model.init_params(0))
    x = state["global"].clone()
    task = Task(ctx.all_clients, broadcast={"global": x})
    update = algo.train(state, task)
    assert update.steps is not None and update.steps.tolist() == [(n + 3) // 4 for n in COUNTS]
    algo.aggregate(state, task, update)
    y = update.per_client["model"]
    tau = update.steps.double()
    p = torch.full((len(COUNTS),), 1 / len(COUNTS), dtype=torch.float64)
    expected = x.double() - (p * tau).sum() * ((p / tau).unsqueeze(1) * (x - y).double()).sum(0)
    torch.testing.assert_close(state["global"].double(), expected, atol=1e-6, rtol=0)
    fedavg = y.mean(0)
    assert float((state["global"] - fedavg).abs().max()) > 1e-4


def test_the_round_is_normalized_average_through_the_uplink() -> None:
    """FedNova's round aggregates through FedAvg's uplink fold with its round's
    :class:`NormalizedStep` (a ``Summed`` combine): bit for bit :func:`normalized_average` of
    the uploads with the clients' real step counts, in one part and summed over two parts."""
    model = DNNOptions(hidden=[8]).build((1, 8, 8), 3)
    ctx = unequal_context(model)
    opts = ALGORITHMS.build({"name": "fednova", "local_epochs": 1, "batch_size": 4}, "algorithm")
    algo = opts.build(ctx)
    state = algo.init_state(model.init_params(0))
    x = state["global"].clone()
    task = Task(ctx.all_clients, broadcast={"global": x})
    update = algo.train(state, task)
    combine = algo.round_combine(state, task)["global"]
    assert isinstance(combine, NormalizedStep)
    y, steps = update.per_client["model"], update.steps
    assert steps is not None
    expected = normalized_average(x, y, steps.double(), ctx.client_weights(task.clients))
    algo.aggregate(state, task, update)
    assert torch.equal(state["global"], expected)
    halves = combine.share(y[:2], 0).add_(combine.share(y[2:], 2))
    torch.testing.assert_close(combine.finish(halves), expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("rho", [0.0, 0.5, 0.9])
@pytest.mark.parametrize("tau", [1, 3, 7])
def test_momentum_norm_is_heavy_ball_sgds_accumulated_step(rho: float, tau: int) -> None:
    """With a constant gradient g, τ steps of torch.optim.SGD(momentum=ρ) move the weights by
    lr · a(τ, ρ) · g: a is the total weight the steps' gradients receive."""
    w = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1, momentum=rho)
    for _ in range(tau):
        opt.zero_grad()
        (2.0 * w).sum().backward()  # gradient 2 everywhere
        opt.step()
    a = float(momentum_norm(torch.tensor([tau]), rho)[0])
    assert float(-w.detach()[0]) == pytest.approx(0.1 * a * 2.0, rel=1e-5)
