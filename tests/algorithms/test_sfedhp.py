"""sFedHP: one round against an independent per-client hand computation, the fused round
against the straightforward vectorized formula (bit for bit), the smooth l1 penalty, the
sparsity schedule, communication accounting and an end-to-end smoke run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from fedhp.algorithms.penalties import smooth_l1, smooth_l1_grad, truncate
from fedhp.algorithms.sfedhp import SFedHP, SFedHPOptions
from fedhp.build import build_experiment
from fedhp.config import resolve_config
from fedhp.engine.faults import RoundFaults
from fedhp.engine.runner import run_experiment
from fedhp.models.base import BatchedModel
from fedhp.models.zoo import BatchedMLP
from fedhp.topology import Topology
from tests.algorithms.sfedhp_reference import reference_train
from tests.algorithms.tiny import client_data, init_params, mlr_grad, tiny_context
from tests.policies import use_policy

OPTS = dict(lam1=2.0, lam2=3.0, K=3, R=2, lr=0.1, edge_lr=0.2, beta=0.7, rho=0.5)


def _tr(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x.clone() if eps == 0 else torch.where(x.abs() > eps, x, torch.zeros_like(x))


def hand_round(
    ctx,
    w: torch.Tensor,
    thetas: list[torch.Tensor],
    gamma: float,
    eps: float,
    reset: bool,
    round_start: bool = False,
) -> tuple[torch.Tensor, list[torch.Tensor]]:  # type: ignore[no-untyped-def]
    """Algorithm 1 for one global round, written with plain loops over edges and clients.

    ``reset``: theta <- phi_i every local round; ``round_start``: at the first local round only."""
    lam1, lam2, rho = OPTS["lam1"], OPTS["lam2"], OPTS["rho"]
    thetas = [t.clone() for t in thetas]
    edge_models = []
    for e in range(ctx.topology.num_edges):
        members = ctx.topology.clients_of(e).tolist()
        w_i, phi_i = _tr(w, eps), _tr(w, eps)
        for r in range(int(OPTS["R"])):
            phi_recv, w_recv = _tr(phi_i, eps), _tr(w_i, eps)
            sent = []
            for c in members:
                th = phi_recv.clone() if reset or (round_start and r == 0) else thetas[c]
                x, y = client_data(ctx, c)
                for _ in range(int(OPTS["K"])):
                    g = mlr_grad(th, x, y) + gamma * torch.tanh(th / rho) + lam1 * (th - phi_recv)
                    th = th - OPTS["lr"] * g
                thetas[c] = th
                sent.append(_tr((lam1 * th + lam2 * w_recv) / (lam1 + lam2), eps))
            phi_i = torch.stack(sent).mean(0)
            w_i = w_i - OPTS["edge_lr"] * (lam2 * (w_i - phi_i) + gamma * torch.tanh(w_i / rho))
        edge_models.append(_tr(w_i, eps))
    w_new = (1 - OPTS["beta"]) * w + OPTS["beta"] * torch.stack(edge_models).mean(0)
    return w_new, thetas


@pytest.mark.parametrize(
    ("gamma", "eps", "theta_init"), [(0.0, 0.0, "warm"), (0.05, 0.0, "warm"), (0.05, 0.05, "reset")]
)
def test_one_round_matches_hand_computation(gamma: float, eps: float, theta_init: str) -> None:
    ctx = tiny_context(edge_sizes=(3, 2), zero_threshold=eps)
    opt = SFedHPOptions(
        **OPTS,
        batch_size=6,
        gamma1=gamma,
        gamma2=gamma,
        theta_init=theta_init,  # type: ignore[arg-type]
    )
    algo = opt.build(ctx)
    state = algo.init_state(init_params())
    # Start from distinct client models so warm-starting matters.
    state["theta"] += 0.1 * torch.randn(
        state["theta"].shape, generator=torch.Generator().manual_seed(5)
    )
    w0, th0 = state["global"].clone(), list(state["theta"].clone())
    for rnd in range(2):
        algo.run_round(state, rnd)
        w0, th0 = hand_round(ctx, w0, th0, gamma, eps, theta_init == "reset")
        torch.testing.assert_close(state["global"], w0, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(state["theta"], torch.stack(th0), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("theta_init", ["round", "warm", "reset"])
def test_theta_init_over_two_rounds(monkeypatch: pytest.MonkeyPatch, theta_init: str) -> None:
    """``round`` (the default): a client's theta at the start of round t+1 is the phi_i its edge
    sends first in round t+1 (the truncated global model), not its theta from round t."""
    eps = 0.05
    ctx = tiny_context(edge_sizes=(3, 2), zero_threshold=eps)
    opt = SFedHPOptions(**OPTS, batch_size=6, theta_init=theta_init)  # type: ignore[arg-type]
    algo = opt.build(ctx)
    state = algo.init_state(init_params())
    starts: list[torch.Tensor] = []  # theta at each round's first gradient
    original = ctx.model.sgd_step  # the step sFedHP's plain prox steps take

    def recording(theta, x, y, lr, before=None):  # type: ignore[no-untyped-def]
        if len(starts) < rounds_started:
            starts.append(theta.clone())
        return original(theta, x, y, lr, before)

    monkeypatch.setattr(ctx.model, "sgd_step", recording)
    w, thetas = state["global"].clone(), list(state["theta"].clone())
    for rnd in range(2):
        sent, theta_before = _tr(state["global"], eps), state["theta"].clone()
        rounds_started = rnd + 1
        algo.run_round(state, rnd)
        start = theta_before if theta_init == "warm" else sent.expand(5, -1)
        torch.testing.assert_close(starts[rnd], start, atol=0, rtol=0)
        w, thetas = hand_round(
            ctx, w, thetas, 0.0, eps, theta_init == "reset", round_start=theta_init == "round"
        )
        torch.testing.assert_close(state["global"], w, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(state["theta"], torch.stack(thetas), atol=1e-5, rtol=1e-4)
    if theta_init != "warm":  # phi differs from round 1's theta: the choice matters
        assert not torch.allclose(starts[1], theta_before, atol=1e-3)


def test_communication_per_link() -> None:
    ctx = tiny_context(edge_sizes=(3, 2))
    algo = SFedHPOptions(**OPTS, batch_size=6).build(ctx)  # type: ignore[arg-type]
    state = algo.init_state(init_params())
    algo.run_round(state, 0)
    cur = ctx.ledger.current()
    c, n, r = 5, 2, int(OPTS["R"])
    assert cur["messages_client_edge_up"] == r * c
    assert cur["messages_client_edge_down"] == 2 * r * c
    assert cur["messages_edge_cloud_up"] == n and cur["messages_edge_cloud_down"] == n
    assert "messages_client_cloud_up" not in cur


def test_smooth_l1_gradient_is_tanh_and_stable() -> None:
    rho = 6e-5
    x = (torch.randn(50, dtype=torch.float64) * 1e-4).requires_grad_(True)
    (g,) = torch.autograd.grad(smooth_l1(x, rho), x)
    torch.testing.assert_close(g, smooth_l1_grad(x.detach(), rho))
    moderate = torch.linspace(-3, 3, 13, dtype=torch.float64)
    naive = (torch.log(torch.cosh(moderate))).sum()
    torch.testing.assert_close(smooth_l1(moderate, 1.0), naive)
    big = torch.tensor([1e6 * rho, -1e6 * rho, 0.0])
    value = smooth_l1(big, rho)
    assert torch.isfinite(value)
    assert float(value) == pytest.approx(
        2 * (1e6 * rho) - 2 * rho * float(torch.log(torch.tensor(2.0))), rel=1e-5
    )
    assert torch.isfinite(smooth_l1_grad(big, rho)).all()


def test_truncate_sends_small_entries_as_zero() -> None:
    x = torch.tensor([0.001, -0.002, 0.5, -0.003])
    assert torch.equal(truncate(x, 0.002), torch.tensor([0.0, 0.0, 0.5, -0.003]))
    assert truncate(x, 0.0) is x


def test_gamma_schedule_switches_exactly() -> None:
    ctx = tiny_context(zero_threshold=0.1)
    opt = SFedHPOptions(gamma1=1e-3, gamma2=2e-3, sparse_schedule=True, gamma_tiny=1e-6)
    algo = opt.build(ctx)
    assert isinstance(algo, SFedHP)
    state = algo.init_state(torch.ones(15))
    algo.update_gammas(state, 0)
    assert float(state["gamma1"]) == pytest.approx(1e-3) and float(
        state["gamma2"]
    ) == pytest.approx(2e-3)
    # Density exactly at the target (3 of 15 = 0.2): no switch; below it: switch.
    state["theta"].zero_()
    state["theta"][:, :3] = 1.0
    algo.update_gammas(state, 50)
    assert float(state["gamma1"]) == pytest.approx(1e-3)
    state["theta"][:, 2] = 0.05  # below the zero threshold: density 2/15 < 0.2
    algo.update_gammas(state, 51)
    assert float(state["gamma1"]) == pytest.approx(1e-6)
    state["theta"].fill_(1.0)  # the switch is for good
    algo.update_gammas(state, 52)
    assert float(state["gamma1"]) == pytest.approx(1e-6)
    algo.update_gammas(state, 99)
    assert float(state["gamma2"]) == pytest.approx(2e-3)
    algo.update_gammas(state, 100)
    assert float(state["gamma2"]) == pytest.approx(1e-6)
    assert algo.extra_metrics(state)["gamma2"] == pytest.approx(1e-6)


def test_no_schedule_keeps_gammas() -> None:
    ctx = tiny_context(zero_threshold=0.1)
    algo = SFedHPOptions(gamma1=1e-3, gamma2=2e-3).build(ctx)
    assert isinstance(algo, SFedHP)
    state = algo.init_state(torch.zeros(15))
    algo.update_gammas(state, 500)
    assert float(state["gamma1"]) == pytest.approx(1e-3) and float(
        state["gamma2"]
    ) == pytest.approx(2e-3)


def test_options_validate() -> None:
    opt = SFedHPOptions(lam=20, lam2=5, R=4, K=3)
    assert (opt.lam1_value, opt.lam2_value, opt.gradient_evaluations()) == (20, 5, 12)
    with pytest.raises(ValueError):
        SFedHPOptions(inner="adam")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        SFedHPOptions(gamma1=-1)


def test_sfedhp_smoke_mnist(tmp_path: Path) -> None:
    cfg = resolve_config(
        None,
        [
            "progress=false",
            "rounds=2",
            "model.name=mlr",
            "algorithm.name=sfedhp",
            "algorithm.lam=15",
            "algorithm.R=5",
            "algorithm.K=3",
            "algorithm.gamma1=0.001",
            "algorithm.gamma2=0.001",
            "algorithm.sparse_schedule=true",
            "algorithm.inner=nesterov",
            "comm.zero_threshold=0.001",
        ],
    )
    summary = run_experiment(build_experiment(cfg), tmp_path, progress=False)
    assert summary["final_global_acc"] > 0.5 and summary["final_personal_acc"] > 0.3  # chance: 0.1
    assert summary["gradient_evaluations_per_round"] == 15
    assert (tmp_path / "metrics.csv").read_text().count("density_edge") == 1


def test_nesterov_inner_solver_matches_hand() -> None:
    """``inner: nesterov``: PyTorch's Nesterov SGD on the theta-subproblem (momentum reset every
    local round), for one round against a per-client loop."""
    ctx = tiny_context(edge_sizes=(3, 2))
    opt = SFedHPOptions(
        **OPTS,  # type: ignore[arg-type]
        batch_size=6,
        gamma1=0.05,
        gamma2=0.05,
        inner="nesterov",
        theta_init="warm",  # the hand loop continues from the perturbed thetas
    )
    lam1, lam2, rho, mom = opt.lam1_value, opt.lam2_value, opt.rho, opt.momentum
    algo = opt.build(ctx)
    state = algo.init_state(init_params())
    state["theta"] += 0.1 * torch.randn(
        state["theta"].shape, generator=torch.Generator().manual_seed(5)
    )
    w, thetas = state["global"].clone(), list(state["theta"].clone())
    edge_models = []
    for e in range(2):
        members = ctx.topology.clients_of(e).tolist()
        w_i, phi_i = w.clone(), w.clone()
        for _ in range(opt.R):
            sent = []
            for c in members:
                th, v = thetas[c], torch.zeros_like(w)
                x, y = client_data(ctx, c)
                for _ in range(opt.K):
                    g = mlr_grad(th, x, y) + 0.05 * torch.tanh(th / rho) + lam1 * (th - phi_i)
                    v = mom * v + g
                    th = th - opt.lr * (g + mom * v)
                thetas[c] = th
                sent.append((lam1 * th + lam2 * w_i) / (lam1 + lam2))
            phi_i = torch.stack(sent).mean(0)
            w_i = w_i - opt.edge_lr * (lam2 * (w_i - phi_i) + 0.05 * torch.tanh(w_i / rho))
        edge_models.append(w_i)
    expected = (1 - opt.beta) * w + opt.beta * torch.stack(edge_models).mean(0)
    gd_state = {k: v.clone() for k, v in state.items()}  # the same round with plain GD
    gd = SFedHPOptions(**OPTS, batch_size=6, gamma1=0.05, gamma2=0.05, theta_init="warm")  # type: ignore[arg-type]
    gd.build(tiny_context()).run_round(gd_state, 0)
    algo.run_round(state, 0)
    torch.testing.assert_close(state["theta"], torch.stack(thetas), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(state["global"], expected, atol=1e-5, rtol=1e-4)
    assert (gd_state["global"] - expected).abs().max() > 1e-3  # momentum changed the result


def test_straggler_is_billed_every_edge_message_it_received() -> None:
    """A straggler under a training edge receives phi_i and w_i in each of the R local rounds
    (2R messages, the values its edge mates receive) and sends nothing; a dropped client
    receives nothing."""
    eps = 0.05
    ctx = tiny_context(edge_sizes=(3, 2), zero_threshold=eps)
    algo = SFedHPOptions(**OPTS, batch_size=6, gamma1=0.05).build(ctx)  # type: ignore[arg-type]
    state = algo.init_state(init_params())
    ctx.participation.round_faults = RoundFaults(
        dropped=torch.tensor([False, False, False, True, False]),
        straggler=torch.tensor([False, True, False, False, False]),
        edge_failed=torch.tensor([False, False]),
    )
    algo.run_round(state, 0)
    ctx.ledger.end_round()
    nodes = ctx.ledger.node_totals("client_edge")
    r = int(OPTS["R"])
    assert sorted(nodes) == [0, 1, 2, 4]  # client 3 dropped out
    assert nodes[1]["messages_down"] == 2 * r and nodes[1]["messages_up"] == 0
    for mate in (0, 2):  # same edge: the same broadcasts, so the same bytes
        assert nodes[mate]["messages_up"] == r
        assert nodes[1]["bytes_down"] == nodes[mate]["bytes_down"]
        assert nodes[1]["nnz_down"] == nodes[mate]["nnz_down"]


FUSED_CASES: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
    # name: (context keywords, option keywords, client layout)
    "plain, uneven edges": ({}, {}, "contiguous"),
    "equal edges, sparse, reset": (
        {"edge_sizes": (2, 2), "zero_threshold": 0.05},
        {"gamma1": 0.05, "gamma2": 0.05, "theta_init": "reset"},
        "contiguous",
    ),
    "nesterov, warm, weighted": (
        {"n_train": (6, 3, 2, 6, 3), "weighting": "samples", "zero_threshold": 0.02},
        {"inner": "nesterov", "theta_init": "warm", "gamma1": 0.05},
        "contiguous",
    ),
    "clients not grouped by edge": ({"zero_threshold": 0.05}, {"gamma2": 0.05}, "interleaved"),
    "lr lam1 = 1, theta restarts at the centre": (
        {"zero_threshold": 0.02},
        {"lam1": 10.0, "gamma1": 0.05},
        "interleaved",
    ),
    "lr lam1 = 1, grouped": ({"edge_sizes": (2, 2)}, {"lam1": 10.0}, "contiguous"),
    "stragglers, all edges train": (
        {"edge_sizes": (2, 2, 2), "zero_threshold": 0.05},
        {"all_edges_train": True, "gamma1": 0.05},
        "faults",
    ),
}


@pytest.mark.parametrize("cache", [10**9, 30], ids=["one part", "parts of 2 clients"])
@pytest.mark.parametrize("case", list(FUSED_CASES))
def test_fused_round_is_the_unfused_formula_bit_for_bit(
    case: str, cache: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two rounds of the fused ``train`` against the readable Algorithm 1, the straightforward
    formula (``tests/algorithms/sfedhp_reference.py``'s ``reference_train``), on identical
    contexts: the same state, uploads, losses and ledger, exactly (no tolerance; ``torch.equal``,
    for which -0.0 == 0.0: see ``sfedhp.solve_theta`` on ``lr * lam1 = 1``),
    whether the clients fit one cache-sized part or are trained in parts of two (the MLR's 15
    parameters against a cache of ``cache`` floats; an edge's clients then span parts)."""
    # The reference step (gradient, then the pull, then the step) for the MLR: the MLPs' own
    # step inside the backward pass rounds once less (tests/models: equal to 1e-6).
    monkeypatch.setattr(BatchedMLP, "sgd_step", BatchedModel.sgd_step)
    ctx_kw, opt_kw, layout = FUSED_CASES[case]
    runs = []
    for _ in range(2):
        ctx = tiny_context(**ctx_kw)
        use_policy(ctx.model, cache_floats=cache)
        if layout == "interleaved":  # clients 0, 2, 4 on edge 0: rows must be gathered
            ctx.topology = ctx.participation.topology = Topology(torch.tensor([0, 1, 0, 1, 0]), 2)
        if layout == "faults":
            ctx.participation.edges_per_round = 2
        algo = SFedHPOptions(**{**OPTS, **opt_kw}, batch_size=6).build(ctx)
        assert isinstance(algo, SFedHP)
        state = algo.init_state(init_params())
        state["theta"] += 0.1 * torch.randn(
            state["theta"].shape, generator=torch.Generator().manual_seed(5)
        )
        runs.append((ctx, algo, state))
    for rnd in range(2):
        results = []
        for (ctx, algo, state), train in zip(runs, (SFedHP.train, reference_train), strict=True):
            if layout == "faults":
                ctx.participation.round_faults = RoundFaults(
                    dropped=torch.tensor([False, False, False, False, True, False]),
                    straggler=torch.tensor([False, True, False, False, False, False]),
                    edge_failed=torch.tensor([False, False, False]),
                )
            task = algo.plan(state, rnd)
            update = train(algo, state, task)
            stats = algo.aggregate(state, task, update)
            results.append((task, update, stats, ctx.ledger.state_dict()))
        (task, fused, stats, ledger), (_, plain, plain_stats, plain_ledger) = results
        if layout == "faults":
            assert task.stragglers is not None and len(task.stragglers) == 1
            assert task.up_edges is not None and len(task.up_edges) == 2
        assert fused.losses is not None and plain.losses is not None
        assert torch.equal(fused.losses, plain.losses)
        assert torch.equal(fused.per_edge["w"], plain.per_edge["w"])
        for key, value in runs[0][2].items():
            assert torch.equal(value, runs[1][2][key]), key
        assert stats == plain_stats
        assert ledger == plain_ledger
