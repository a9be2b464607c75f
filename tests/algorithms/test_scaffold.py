"""SCAFFOLD: zero-started control variates, option II with the real step counts, client state
kept between rounds, correction on gradients only, control variates billed both ways."""

from __future__ import annotations

import pytest
import torch

from fedhp.algorithms.base import Task
from fedhp.algorithms.scaffold import option_two
from fedhp.engine.ops import weighted_mean
from fedhp.models.base import BatchedModel
from fedhp.models.zoo import BatchedMLP
from tests.algorithms.test_buffers import BN
from tests.conftest import small_experiment
from tests.engine.test_local_epochs import COUNTS, unequal_context

STEPS = ["algorithm.local_steps=3", "algorithm.batch_size=5"]


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_zero_control_variates_one_client_is_plain_sgd(
    momentum: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With c = c_i = 0 (the start) and one client, a round is that client's plain SGD: the
    same global model as FedAvg's round from the same seed — with local momentum too (the
    correction is a gradient term, inside the momentum). FedAvg takes the reference step
    (gradient, then step): the MLPs' fused step rounds once less (tests/models)."""
    monkeypatch.setattr(BatchedMLP, "sgd_step", BatchedModel.sgd_step)
    one = ["federation.num_clients=1", "federation.num_edges=1", *STEPS]
    one.append(f"algorithm.momentum={momentum}")
    sc = small_experiment("algorithm.name=scaffold", *one)
    fa = small_experiment("algorithm.name=fedavg", *one)
    s_state = sc.algorithm.init_state(sc.model.init_params(0))
    f_state = fa.algorithm.init_state(fa.model.init_params(0))
    assert float(s_state["c"].abs().max()) == 0.0 and float(s_state["c_local"].abs().max()) == 0.0
    sc.algorithm.run_round(s_state, 0)
    fa.algorithm.run_round(f_state, 0)
    assert torch.equal(s_state["global"], f_state["global"])
    assert not torch.equal(s_state["global"], sc.model.init_params(0))


def test_option_two_by_hand() -> None:
    c_local = torch.tensor([[1.0, -1.0]])
    c = torch.tensor([0.5, 0.5])
    x = torch.tensor([2.0, 0.0])
    y = torch.tensor([[1.0, 1.0]])
    out = option_two(c_local, c, x, y, torch.tensor([4]), 0.5)
    # c_i - c + (x - y) / (K * lr) = [0.5, -1.5] + [1, -1] / 2
    assert out.tolist() == [[1.0, -2.0]]


def test_client_control_variates_are_stored_and_reused() -> None:
    """Round 1 (half the clients): their c_i become option II of their own update, the others
    stay 0. Round 2: a client sampled again starts from its stored c_i — its new c_i is option II
    from the stored one and the new server c, and its local steps used the correction c − c_i."""
    exp = small_experiment("algorithm.name=scaffold", "federation.client_fraction=0.5", *STEPS)
    algo, ctx = exp.algorithm, exp.ctx
    state = algo.init_state(exp.model.init_params(0))
    task = algo.plan(state, 0)
    update = algo.train(state, task)
    x0 = task.broadcast["global"]
    expected = option_two(
        torch.zeros_like(update.per_client["model"]),
        torch.zeros_like(x0),
        x0,
        update.per_client["model"],
        torch.full((len(task.clients),), 3),
        algo.options.lr,
    )
    torch.testing.assert_close(state["c_local"][task.clients], expected)
    others = torch.ones(ctx.num_clients, dtype=torch.bool)
    others[task.clients] = False
    assert float(state["c_local"][others].abs().max()) == 0.0
    algo.aggregate(state, task, update)
    weights = ctx.client_weights(task.clients)
    frac = len(task.clients) / ctx.num_clients
    torch.testing.assert_close(state["c"], frac * weighted_mean(expected, weights))
    stored = state["c_local"].clone()
    for rnd in range(1, 6):  # until some client of round 1 is sampled again
        again = algo.plan(state, rnd)
        both = again.clients[torch.isin(again.clients, task.clients)]
        if len(both):
            break
        algo.aggregate(state, again, algo.train(state, again))
        stored = state["c_local"].clone()
    assert len(both), "no client sampled twice in 6 rounds"
    c_now = again.broadcast["c"]
    upd = algo.train(state, again)
    rows = torch.isin(again.clients, both)
    y = upd.per_client["model"][rows]
    want = option_two(
        stored[both],
        c_now,
        again.broadcast["global"],
        y,
        torch.full((len(both),), 3),
        algo.options.lr,
    )
    torch.testing.assert_close(state["c_local"][both], want)
    torch.testing.assert_close(upd.per_client["dc"][rows], want - stored[both])


def test_correction_acts_on_the_gradient() -> None:
    """Against a per-client torch.optim.SGD loop on the same minibatches whose gradients get
    c − c_i added before each step (non-zero control variates)."""
    exp = small_experiment(
        "algorithm.name=scaffold", "federation.num_clients=2", "federation.num_edges=1", *STEPS
    )
    algo, ctx, model = exp.algorithm, exp.ctx, exp.model
    state = algo.init_state(model.init_params(0))
    g = torch.Generator().manual_seed(3)
    before = torch.randn(2, model.num_params, generator=g)
    state["c_local"] = before.clone()
    state["c"] = torch.randn(model.num_params, generator=g)
    task = algo.plan(state, 0)
    gen = ctx.generator.get_state()
    y = algo.train(state, task).per_client["model"]
    ctx.generator.set_state(gen)
    draw = ctx.batches(task.clients, 5)
    batches = [draw() for _ in range(3)]
    for c in range(2):
        module = model.make_module(task.broadcast["global"])
        opt = torch.optim.SGD(module.parameters(), lr=algo.options.lr)
        shift = task.broadcast["c"] - before[c]
        for x, yb in batches:
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(module(x[c]), yb[c]).backward()
            at = 0
            for prm in module.parameters():
                assert prm.grad is not None
                prm.grad.add_(shift[at : at + prm.numel()].view_as(prm))
                at += prm.numel()
            opt.step()
        torch.testing.assert_close(model.layout.flatten_module(module), y[c], atol=1e-5, rtol=0)


def test_real_step_counts_under_local_epochs() -> None:
    """Unequal clients: K_i in option II is each client's own step count, not a common one."""
    from fedhp.algorithms.base import ALGORITHMS
    from fedhp.models.zoo import DNNOptions

    model = DNNOptions(hidden=[8]).build((1, 8, 8), 3)
    ctx = unequal_context(model)
    opts = ALGORITHMS.build(
        {"name": "scaffold", "local_epochs": 2, "batch_size": 4, "lr": 0.1}, "algorithm"
    )
    algo = opts.build(ctx)
    state = algo.init_state(model.init_params(0))
    task = Task(ctx.all_clients, broadcast={"global": state["global"], "c": state["c"]})
    update = algo.train(state, task)
    assert update.steps is not None
    assert update.steps.tolist() == [2 * ((n + 3) // 4) for n in COUNTS]
    want = option_two(
        torch.zeros(len(COUNTS), model.num_params),
        state["c"],
        state["global"],
        update.per_client["model"],
        update.steps,
        0.1,
    )
    torch.testing.assert_close(state["c_local"], want)


def test_control_variates_are_billed_both_ways() -> None:
    exp = small_experiment("algorithm.name=scaffold", *STEPS)
    algo = exp.algorithm
    state = algo.init_state(exp.model.init_params(0))
    algo.run_round(state, 0)
    totals = exp.ctx.ledger.current()
    n, p = exp.ctx.num_clients, exp.model.num_params
    assert totals["params_client_cloud_down"] == n * 2 * p
    assert totals["params_client_cloud_up"] == n * 2 * p


def test_batchnorm_statistics_are_averaged_not_corrected() -> None:
    exp = small_experiment("algorithm.name=scaffold", *BN, "algorithm.local_steps=2")
    algo = exp.algorithm
    state = algo.init_state(exp.model.init_params(0))
    assert state["c"].numel() == exp.model.num_params  # no control variate for the buffers
    task = algo.plan(state, 0)
    update = algo.train(state, task)
    algo.aggregate(state, task, update)
    weights = exp.ctx.client_weights(task.clients)
    torch.testing.assert_close(
        state["global_buffers"], weighted_mean(update.per_client["buffers"], weights)
    )


@pytest.mark.parametrize("server_lr", [0.5])
def test_server_step_size(server_lr: float) -> None:
    exp = small_experiment("algorithm.name=scaffold", f"algorithm.server_lr={server_lr}", *STEPS)
    algo = exp.algorithm
    state = algo.init_state(exp.model.init_params(0))
    x = state["global"].clone()
    task = algo.plan(state, 0)
    update = algo.train(state, task)
    algo.aggregate(state, task, update)
    mean = weighted_mean(update.per_client["model"], exp.ctx.client_weights(task.clients))
    torch.testing.assert_close(state["global"], x + server_lr * (mean - x))


def test_with_momentum_the_variates_use_the_momentum_step_weight() -> None:
    """Option II with local momentum ρ divides by a_i (FedNova's), not K: (x − y)/(a_i η) is the
    mean corrected gradient; with K the variates come out ~1/(1 − ρ) too large."""
    from fedhp.algorithms.fednova import momentum_norm

    exp = small_experiment("algorithm.name=scaffold", "algorithm.momentum=0.9", *STEPS)
    algo = exp.algorithm
    state = algo.init_state(exp.model.init_params(0))
    task = algo.plan(state, 0)
    update = algo.train(state, task)
    x, y = task.broadcast["global"], update.per_client["model"]
    a = momentum_norm(torch.full((len(task.clients),), 3), 0.9)
    assert float(a[0]) == pytest.approx((3 - 0.9 * (1 - 0.9**3) / 0.1) / 0.1)
    zeros = torch.zeros_like(y)
    expected = option_two(zeros, torch.zeros_like(x), x, y, a, algo.options.lr)
    torch.testing.assert_close(state["c_local"][task.clients], expected)
