"""FedProx's systems heterogeneity (``faults.straggler_work: partial``): a straggler does 1 .. E-1
of its E local epochs (or steps), drawn from the faults stream; FedProx keeps its partial work and
FedAvg drops it, as every method does under ``drop`` (the default)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from fedhp.algorithms.base import PARTIAL_WORK
from fedhp.build import build_experiment
from fedhp.cli import main
from fedhp.config import FaultsConfig, resolve_config
from fedhp.engine.faults import FAULT_SEED_OFFSET, FaultModel, partial_units
from fedhp.engine.ops import LocalOptimizer, LocalWork, prox_grad, weighted_mean
from fedhp.engine.runner import run_experiment
from fedhp.errors import ConfigError

FAST = [
    "progress=false",
    "threads=2",
    "model.name=mlr",
    "algorithm.local_steps=4",
    "rounds=2",
    "federation.num_clients=10",
]
PARTIAL = ["faults.straggler=0.5", "faults.straggler_work=partial"]


def experiment(*overrides: str) -> Any:  # an Experiment
    """(``refuse_unread=False``: the engine must drop FedAvg's stragglers even where the config
    layer, which refuses ``straggler_work`` for FedAvg, is bypassed.)"""
    return build_experiment(resolve_config(None, [*FAST, *overrides], refuse_unread=False))


def test_partial_units_are_fedprox_randint_1_to_e() -> None:
    """u in [0, 1) gives 1 .. E-1 (numpy's randint(1, E)), uniformly; a draw of 1 gives E."""
    edges = [0.0, 0.2 - 1e-12, 0.2, 0.5, 0.8 - 1e-12, 0.8, 1 - 1e-16, 1.0, 1.5]
    assert partial_units(torch.tensor(edges, dtype=torch.float64), 6).tolist() == [
        1,
        1,
        2,
        3,
        4,
        5,
        5,
        6,
        6,
    ]
    assert partial_units(torch.tensor([0.0, 0.999, 1.0], dtype=torch.float64), 2).tolist() == [
        1,
        1,
        2,
    ]
    u = torch.from_numpy(np.random.default_rng(0).random(40_000))
    counts = torch.bincount(partial_units(u, 5), minlength=6)
    assert counts[0] == 0 and counts[5] == 0
    assert bool(((counts[1:5] - 10_000).abs() < 400).all()), counts  # uniform on 1..4


def test_work_draws_are_seeded_and_leave_the_earlier_draws_as_they_were() -> None:
    cfg = FaultsConfig(client_dropout=0.2, straggler=0.4, edge_failure=0.3)
    a, b = FaultModel(cfg, 3, 50, 5).draw(7), FaultModel(cfg, 3, 50, 5).draw(7)
    assert a.work is not None and b.work is not None
    assert torch.equal(a.work, b.work) and a.work.dtype == torch.float64
    assert bool(((a.work >= 0) & (a.work < 1)).all())
    other = FaultModel(cfg, 3, 50, 5).draw(8).work
    assert other is not None and not torch.equal(a.work, other)
    # The dropout, straggler and edge draws are the ones drawn before the work draw existed.
    rng = np.random.default_rng([3 + FAULT_SEED_OFFSET, 7])
    u_drop, u_strag, u_edge = rng.random(50), rng.random(50), rng.random(5)
    assert a.dropped.tolist() == (u_drop < 0.2).tolist()
    assert a.straggler.tolist() == ((u_drop >= 0.2) & (u_strag < 0.4)).tolist()
    assert a.edge_failed.tolist() == (u_edge < 0.3).tolist()
    assert a.work.tolist() == rng.random(50).tolist()
    # the share does not depend on the probabilities (nested: only who straggles changes)
    more = FaultModel(FaultsConfig(straggler=0.9), 3, 50, 5).draw(7).work
    assert more is not None and torch.equal(a.work, more)


def _lone_runs(
    exp: Any,
    start: torch.Tensor,
    work: LocalWork,
    partial: torch.Tensor,
    gen_state: torch.Tensor,
    center: torch.Tensor,
    mu: float,
) -> torch.Tensor:
    """Each client trained alone from the same generator state: a straggler for its units."""
    ctx, rows = exp.ctx, []
    total = work.epochs if work.epochs is not None else work.steps
    units = partial_units(partial, total)
    for c in range(len(partial)):
        k = int(units[c])
        alone = LocalWork(
            work.lr,
            work.batch_size,
            k if work.epochs is None else work.steps,
            None if work.epochs is None else k,
            work.optimizer,
        )
        ctx.sampler.generator.set_state(gen_state)
        params, _, _ = ctx.local_sgd(
            start[c : c + 1], torch.tensor([c]), alone, prox_grad(center, mu)
        )
        rows.append(params[0])
    return torch.stack(rows)


@pytest.mark.parametrize("mode", ["steps", "epochs"])
@pytest.mark.parametrize("chunk", [None, 3])
@pytest.mark.parametrize("momentum", [0.0, 0.5])
def test_a_straggler_with_k_of_e_units_is_the_client_trained_k_units_alone(
    mode: str, chunk: int | None, momentum: float
) -> None:
    """Row by row, the batched round with per-client budgets (stragglers: k of E; the others:
    E) equals each client's own run of its budget: bit for bit against the same clients trained
    k units together, and against each client trained alone (bit for bit under steps, where the
    model steps row by row; to float32 rounding under epochs, whose weighted kernels round a
    batch of 8 clients and one apart even at full work); the step counts follow."""
    extra = ["algorithm.name=fedprox", "algorithm.mu=0.1"]
    if chunk is not None:
        extra.append(f"engine.clients_per_chunk={chunk}")
    exp = experiment(*extra)
    ctx = exp.ctx
    n, gen = 8, exp.ctx.sampler.generator
    clients = torch.arange(n)
    total = 4 if mode == "steps" else 3
    opt = LocalOptimizer(momentum) if momentum else None

    def work_of(units: int) -> LocalWork:
        if mode == "steps":
            return LocalWork(0.05, 5, units, None, opt)
        return LocalWork(0.05, 64, 1, units, opt)

    # clients 1, 2, 4, 6 straggle: 1, 2, 1 and 2 units of E = 3 / 4 (the others all of them)
    u = [1.0, 0.0, 0.6, 1.0, 0.1, 1.0, 0.5, 1.0]
    partial = torch.tensor(u, dtype=torch.float64)
    w = exp.model.init_params(0)
    start = w.expand(n, -1) + 0.01 * torch.randn(n, w.numel(), generator=torch.Generator())
    state = gen.get_state()
    work = work_of(total)
    params, loss, steps = ctx.local_sgd(start, clients, work, prox_grad(w, 0.1), partial=partial)
    after = gen.get_state()
    units = partial_units(partial, total)
    expected_units = [4, 1, 2, 4, 1, 4, 2, 4] if mode == "steps" else [3, 1, 2, 3, 1, 3, 2, 3]
    assert units.tolist() == expected_units
    for k in sorted(set(expected_units)):  # everyone trained k units together
        gen.set_state(state)
        together, k_loss, _ = ctx.local_sgd(start, clients, work_of(k), prox_grad(w, 0.1))
        for c in torch.nonzero(units == k).flatten().tolist():
            assert torch.equal(params[c], together[c]), f"client {c} ({k} of {total})"
            assert torch.equal(loss[c], k_loss[c])  # its loss over its own steps only
        if k == total:  # the minibatches drawn are those of full work
            assert torch.equal(gen.get_state(), after)
        else:
            assert not torch.equal(params[units > k], together[units > k])
    alone = _lone_runs(exp, start, work, partial, state, w, 0.1)
    for c in range(n):
        if mode == "steps":
            assert torch.equal(params[c], alone[c]), f"client {c} ({int(units[c])} of {total})"
        else:
            assert torch.allclose(params[c], alone[c], atol=1e-7, rtol=0), c
    if mode == "steps":
        assert steps.tolist() == units.tolist()
    else:
        per_epoch = (ctx.fed.train.counts[clients] + 63) // 64
        assert steps.tolist() == (per_epoch * units).tolist()
    assert bool((loss > 0).all())


def _round_zero(*overrides: str) -> tuple[Any, Any]:
    exp = experiment(*overrides)
    faults = exp.ctx.begin_round(0)
    assert faults is not None
    return exp, faults


def test_fedprox_keeps_its_stragglers_with_their_shares_and_fedavg_drops_them() -> None:
    exp, faults = _round_zero("algorithm.name=fedprox", *PARTIAL)
    state = exp.algorithm.init_state(exp.model.init_params(0))
    task = exp.algorithm.plan(state, 0)
    stragglers = torch.nonzero(faults.straggler).flatten()
    assert len(stragglers) > 0
    assert torch.equal(task.clients, torch.nonzero(~faults.dropped).flatten())
    share = task.per_client[PARTIAL_WORK]
    is_straggler = faults.straggler[task.clients]
    assert torch.equal(share[is_straggler], faults.work[task.clients][is_straggler])
    assert bool((share[~is_straggler] == 1).all())
    part = exp.ctx.participation
    assert part.round_stragglers is None and torch.equal(part.round_partial, stragglers)

    exp, faults = _round_zero("algorithm.name=fedavg", *PARTIAL)
    task = exp.algorithm.plan(exp.algorithm.init_state(exp.model.init_params(0)), 0)
    assert torch.equal(task.clients, torch.nonzero(faults.available).flatten())
    assert PARTIAL_WORK not in task.per_client
    assert torch.equal(exp.ctx.participation.round_stragglers, stragglers)

    exp, faults = _round_zero("algorithm.name=fedprox", "faults.straggler=0.5")  # drop: default
    task = exp.algorithm.plan(exp.algorithm.init_state(exp.model.init_params(0)), 0)
    assert torch.equal(task.clients, torch.nonzero(faults.available).flatten())
    assert PARTIAL_WORK not in task.per_client


def test_a_fedprox_round_averages_the_partial_solutions() -> None:
    """The round's global model is the mean of every client's own run: E steps, or a
    straggler's k, on the round's minibatches; in client chunks smaller than the round."""
    exp, faults = _round_zero(
        "algorithm.name=fedprox", "algorithm.mu=0.5", "engine.clients_per_chunk=3", *PARTIAL
    )
    algo, ctx = exp.algorithm, exp.ctx
    state = algo.init_state(exp.model.init_params(0))
    w = state["global"].clone()
    gen_state = ctx.sampler.generator.get_state()  # plan() draws nothing: every client sampled
    algo.run_round(state, 0)
    clients = torch.nonzero(~faults.dropped).flatten()
    late = faults.straggler[clients]
    assert bool(late.any()) and bool((~late).any())
    partial = torch.where(late, faults.work[clients], torch.ones(len(clients), dtype=torch.float64))
    work = algo.options.work()
    rows = []
    for i, c in enumerate(clients.tolist()):
        k = int(partial_units(partial[i : i + 1], work.steps)[0])
        ctx.sampler.generator.set_state(gen_state)
        batches = ctx.sampler.steps(clients, work.batch_size, work.steps)  # the round's
        params, _, _ = ctx.local_sgd(
            w.unsqueeze(0),
            torch.tensor([c]),
            LocalWork(work.lr, work.batch_size, k),
            prox_grad(w, 0.5),
            drawn=batches[:k, i : i + 1],
        )
        rows.append(params[0])
    solutions = torch.stack(rows)
    expected = weighted_mean(solutions, ctx.client_weights(clients))
    assert torch.allclose(state["global"], expected, atol=1e-6, rtol=0)
    dropped = weighted_mean(solutions[~late], ctx.client_weights(clients[~late]))
    assert not torch.allclose(state["global"], dropped, atol=1e-4)


def _comm(*overrides: str) -> dict[str, Any]:
    return run_experiment(experiment(*overrides, "rounds=1"), None)["communication"]


def test_the_ledger_bills_what_stragglers_receive_and_fedprox_uploads() -> None:
    f = experiment("algorithm.name=fedavg", *PARTIAL).ctx.participation.faults.draw(0)
    available, stragglers = int(f.available.sum()), int(f.straggler.sum())
    assert available > 0 and stragglers > 0
    prox = _comm("algorithm.name=fedprox", *PARTIAL)
    assert prox["messages_client_cloud_up"] == available + stragglers
    assert prox["messages_client_cloud_down"] == available + stragglers
    avg = _comm("algorithm.name=fedavg", *PARTIAL)
    assert avg["messages_client_cloud_up"] == available
    assert avg["messages_client_cloud_down"] == available + stragglers


def _run(out: Path, *overrides: str, resume: bool = False) -> dict[str, Any]:
    cfg = resolve_config(None, [*FAST, "eval_every=1", *overrides], refuse_unread=False)
    return run_experiment(build_experiment(cfg), out, resume=resume)


def test_fedavg_under_partial_is_fedavg_under_drop_byte_for_byte(tmp_path: Path) -> None:
    """FedAvg drops its stragglers' updates whatever ``straggler_work`` says; FedProx under
    ``partial`` with (almost) no straggler is FedProx under ``drop``."""
    base = ["algorithm.name=fedavg", "faults.straggler=0.5", "rounds=3"]
    _run(tmp_path / "drop", *base)
    _run(tmp_path / "partial", *base, "faults.straggler_work=partial")
    for name in ("metrics.csv", "per_client.csv", "final_state.pt"):
        assert (tmp_path / "drop" / name).read_bytes() == (tmp_path / "partial" / name).read_bytes()
    prox = ["algorithm.name=fedprox", "faults.client_dropout=0.2", "faults.straggler=1e-9"]
    _run(tmp_path / "p-drop", *prox)
    _run(tmp_path / "p-partial", *prox, "faults.straggler_work=partial")
    assert (tmp_path / "p-partial" / "metrics.csv").read_text().count("\n") == 3
    for name in ("metrics.csv", "final_state.pt"):
        a, b = tmp_path / "p-drop" / name, tmp_path / "p-partial" / name
        assert a.read_bytes() == b.read_bytes()


def test_fedprox_keeping_partial_work_differs_from_dropping_and_mu_zero_from_fedavg(
    tmp_path: Path,
) -> None:
    def final(name: str, *extra: str) -> torch.Tensor:
        _run(tmp_path / name, "faults.straggler=0.5", "rounds=2", *extra)
        saved = torch.load(tmp_path / name / "final_state.pt", weights_only=True)
        return saved["state"]["global"]

    kept = final(
        "kept", "algorithm.name=fedprox", "algorithm.mu=0", "faults.straggler_work=partial"
    )
    dropped = final("dropped", "algorithm.name=fedprox", "algorithm.mu=0")
    fedavg = final("fedavg", "algorithm.name=fedavg", "faults.straggler_work=partial")
    assert torch.equal(dropped, fedavg)  # μ = 0 FedProx dropping stragglers is FedAvg
    assert not torch.allclose(kept, fedavg, atol=1e-5)


def test_partial_work_resumes_exactly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.engine.test_checkpoint import kill_before_round, same_results

    extra = ["algorithm.name=fedprox", *PARTIAL, "rounds=5", "checkpoint_every=2"]
    _run(tmp_path / "ref", *extra)
    exp = build_experiment(resolve_config(None, [*FAST, "eval_every=1", *extra]))
    kill_before_round(exp, tmp_path / "killed", 3, monkeypatch)
    torch.manual_seed(4321)
    _run(tmp_path / "killed", *extra, resume=True)
    same_results(tmp_path / "ref", tmp_path / "killed")


@pytest.mark.parametrize(
    ("argv", "text"),
    [
        (["faults.straggler_work=sometimes"], "faults.straggler_work"),
        (
            ["algorithm.name=fedprox", "algorithm.local_steps=1", *PARTIAL],
            "faults.straggler_work: partial work needs at least 2",
        ),
        (
            ["algorithm.name=fedprox", "algorithm.local_epochs=1", *PARTIAL],
            "algorithm.local_epochs is 1",
        ),
    ],
)
def test_bad_values_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], text: str
) -> None:
    out = tmp_path / "run"
    assert (
        main(["run", "--out", str(out), "progress=false", "rounds=1", "model.name=mlr", *argv]) == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and text in err and "Traceback" not in err, err


def test_one_local_step_is_fine_where_nobody_keeps_partial_work() -> None:
    experiment("algorithm.name=fedavg", "algorithm.local_steps=1", *PARTIAL)
    experiment("algorithm.name=fedprox", "algorithm.local_steps=1", "faults.straggler=0.5")
    with pytest.raises(ConfigError):
        experiment("algorithm.name=fedprox", "algorithm.local_steps=1", *PARTIAL)


@pytest.mark.parametrize("mode", ["steps", "epochs"])
def test_a_round_of_stragglers_only_draws_the_minibatches_of_full_work(mode: str) -> None:
    """Every client stops early (the steps after the last budget are not taken), yet the
    generator moves on as for full work: the next round's minibatches do not depend on who
    straggled."""
    exp = experiment("algorithm.name=fedprox")
    ctx, gen = exp.ctx, exp.ctx.sampler.generator
    clients = torch.arange(6)
    work = LocalWork(0.05, 5, 5) if mode == "steps" else LocalWork(0.05, 64, 1, 5)
    w = exp.model.init_params(0)
    start = w.expand(6, -1)
    state = gen.get_state()
    partial = torch.tensor([0.0, 0.3, 0.1, 0.2, 0.0, 0.4], dtype=torch.float64)  # 1 or 2 of 5
    before = exp.model.trained_samples
    short, _, steps = ctx.local_sgd(start, clients, work, partial=partial)
    after = gen.get_state()
    if mode == "steps":  # a straggler's samples count up to its budget (training FLOPs)
        assert exp.model.trained_samples - before == 5 * int(steps.sum()) == 5 * 8
    gen.set_state(state)
    ctx.local_sgd(start, clients, work)
    assert torch.equal(gen.get_state(), after)
    gen.set_state(state)
    two = LocalWork(0.05, 5, 2) if mode == "steps" else LocalWork(0.05, 64, 1, 2)
    together, _, _ = ctx.local_sgd(start, clients, two)
    assert torch.equal(short[partial >= 0.25], together[partial >= 0.25])
    assert int(steps.max()) < (5 if mode == "steps" else 5 * 4)


def test_a_done_straggler_keeps_its_batchnorm_statistics() -> None:
    """With BatchNorm running statistics (updated in place by every step), a straggler's
    parameters and statistics stop at its budget: those of the clients trained k steps."""
    exp = experiment(
        "algorithm.name=fedprox", "model.name=vgg", "model.cfg=[4,M,8,M]", "model.batch_norm=true"
    )
    ctx, gen, model = exp.ctx, exp.ctx.sampler.generator, exp.model
    clients, work = torch.arange(4), LocalWork(0.05, 5, 3)
    w = model.init_params(0)
    start, bufs = w.expand(4, -1), model.init_buffers().expand(4, -1)
    partial = torch.tensor([0.0, 1.0, 0.6, 1.0], dtype=torch.float64)  # 1, 3, 2, 3 of 3 steps
    state = gen.get_state()
    mine = bufs.clone()
    params, _, steps = ctx.local_sgd(start, clients, work, buffers=mine, partial=partial)
    assert steps.tolist() == [1, 3, 2, 3]
    for k, c in ((1, 0), (2, 2), (3, 1), (3, 3)):
        gen.set_state(state)
        theirs = bufs.clone()
        together, _, _ = ctx.local_sgd(start, clients, LocalWork(0.05, 5, k), buffers=theirs)
        assert torch.equal(params[c], together[c]) and torch.equal(mine[c], theirs[c]), (k, c)
    assert not torch.equal(mine[0], mine[1])
