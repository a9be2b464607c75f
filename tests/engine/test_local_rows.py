"""The engine's run level for local SGD (:mod:`fedhp.engine.local_rows`): in a lockstep sweep
batch the runs' ``ctx.local_sgd`` calls meet and train as one, and every run writes, byte for
byte, what it writes alone — whatever the method, a user's plugin included; a crossing of μ,
centre, rows or data between runs is caught; the calls the level does not cover train alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from fedhp.engine import local_rows, run_rows
from fedhp.engine.local_rows import LocalCall, local_sgd_key
from fedhp.engine.ops import LocalWork, ProxGrad
from fedhp.sweep.execute import BatchReport, run_batch
from fedhp.sweep.grid import parse_grid, points_of
from fedhp.sweep.plan import plan_runs
from tests.algorithms.stacked_runs import TINY, run_files, start

BASE = [*TINY, "rounds=2", "eval_every=1", "checkpoint_every=1"]

# method -> (its options, the grid of a float it varies; two seeds each)
METHODS: dict[str, tuple[list[str], str]] = {
    "fedavg": (["algorithm.local_steps=3"], "algorithm.lr=0.05"),
    "fedprox": (["algorithm.local_steps=3"], "algorithm.mu=0.01,20.0"),  # (lr·μ = 1: on w)
    "scaffold": (["algorithm.local_steps=3"], "algorithm.server_lr=1.0,0.5"),
    "ditto": (["algorithm.local_steps=2"], "algorithm.lam=0.1,1.0"),
    "local": (["algorithm.local_steps=2"], "algorithm.lr=0.05"),
    "heurfedamp": (["algorithm.local_steps=2"], "algorithm.lam=1.0,2.0"),
    "fedper": (["algorithm.local_steps=2"], "algorithm.lr=0.05"),
}


def _batch(
    options: list[str], grid: str, folder: Path, mode: str, seeds: tuple[int, ...] = (0, 1)
) -> BatchReport:
    runs = plan_runs([*BASE, *options], points_of(parse_grid([grid])), list(seeds), folder)
    return run_batch(runs, mode, log=lambda _: None)


def _same_files(options: list[str], grid: str, folder: Path) -> BatchReport:
    """The batch run one after another and in lockstep: every run's files the same; the
    lockstep report."""
    one = _batch(options, grid, folder / "alone", "sequential")
    two = _batch(options, grid, folder / "fused", "lockstep")
    assert one.batching == "sequential" and two.batching == "lockstep"
    a, b = run_files(folder / "alone"), run_files(folder / "fused")
    assert len(a) >= 4 and a.keys() == b.keys()
    for name in a:
        assert a[name] == b[name], name
    return two


def _differ(options: list[str], grid: str, folder: Path) -> None:
    """Some run's files differ between the batch run one after another and in lockstep."""
    _batch(options, grid, folder / "alone", "sequential")
    report = _batch(options, grid, folder / "fused", "lockstep")
    assert report.stacked_rounds > 0
    a, b = run_files(folder / "alone"), run_files(folder / "fused")
    assert any(a[name] != b[name] for name in a)


@pytest.mark.parametrize("method", list(METHODS))
def test_every_method_through_local_sgd_stacks_with_no_code_of_its_own(
    method: str, tmp_path: Path
) -> None:
    options, grid = METHODS[method]
    report = _same_files([f"algorithm.name={method}", *options], grid, tmp_path)
    assert report.stacked_rounds > 0


EXTRAS = [
    ["federation.weighting=samples"],  # per-client upload weights
    ["federation.client_fraction=0.5"],  # each run its own clients
    ["engine.clients_per_chunk=4"],  # the round in parts; stacked parts span two runs
    ["engine.clients_per_chunk=4", "federation.sampling=with_replacement"],  # (drawn ahead)
    ["comm.zero_threshold=0.001"],  # truncation on the links
    ["faults.client_dropout=0.3"],  # blocks of unequal sizes
    ["faults.attack.name=sign_flip", "faults.attack.fraction=0.2"],
    ["algorithm.client_momentum=0.5"],  # (the uploads' momentum: after the local SGD)
    ["robust.cloud.name=median"],  # (a whole-round rule: after the local SGD)
]


@pytest.mark.parametrize("extra", EXTRAS, ids=lambda e: e[-1])
def test_fedprox_stacks_under_every_round_shape(extra: list[str], tmp_path: Path) -> None:
    options = ["algorithm.name=fedprox", "algorithm.local_steps=3", *extra]
    _same_files(options, "algorithm.mu=0.01,0.1", tmp_path)


@pytest.mark.parametrize("method", ["fedprox", "scaffold", "heurfedamp"])
def test_the_gpu_form_gathers_the_same_values(
    method: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GPU's form (every run's centres or corrections stacked, one pull per layer with
    per-row weights) computes the bits of the CPU's run-by-run pull."""
    monkeypatch.setattr(local_rows, "gathers", lambda device: True)
    options, grid = METHODS[method]
    for i, extra in enumerate(([], ["engine.clients_per_chunk=4"])):
        _same_files([f"algorithm.name={method}", *options, *extra], grid, tmp_path / str(i))


def test_the_docs_plugin_stacks_with_no_code_of_its_own(tmp_path: Path) -> None:
    """The tutorial's FedAvgM (docs/extending.md): its rounds stack through FedAvg's ``train``,
    each run's files those it writes alone."""
    from fedhp.plugins import load_plugin
    from tests.test_plugins import tutorial_code

    path = tmp_path / "fedavgm.py"
    path.write_text(tutorial_code())
    load_plugin(str(path))
    options = [f"plugins=[{path}]", "algorithm.name=fedavgm", "algorithm.local_steps=2"]
    report = _same_files(options, "algorithm.momentum=0.5,0.9", tmp_path)
    assert report.stacked_rounds > 0


PROX = ["algorithm.name=fedprox", "algorithm.local_steps=3"]


@pytest.mark.parametrize("gather", [False, True], ids=["cpu", "gpu"])
def test_a_crossing_of_mu_or_centre_is_caught(
    gather: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plant crossings in the stacked pull: each run given the next run's μ, or the next run's
    centre. The runs' files must differ from the runs alone."""
    monkeypatch.setattr(local_rows, "gathers", lambda device: gather)
    real = local_rows.prox_pulls

    def next_runs_mu(blocks: Any, lr: float) -> list[tuple[torch.Tensor, float]]:
        pulls = real(blocks, lr)
        weights = [w for _, w in pulls]
        return [(c, w) for (c, _), w in zip(pulls, weights[1:] + weights[:1], strict=True)]

    def next_runs_centre(blocks: Any, lr: float) -> list[tuple[torch.Tensor, float]]:
        pulls = real(blocks, lr)
        centres = [c for c, _ in pulls]
        return [(c, w) for (_, w), c in zip(pulls, centres[1:] + centres[:1], strict=True)]

    for name, crossed in (("mu", next_runs_mu), ("centre", next_runs_centre)):
        monkeypatch.setattr(local_rows, "prox_pulls", crossed)
        if not gather:  # (the CPU's form pulls each run by its own term: cross the terms)
            monkeypatch.setattr(local_rows, "_pulls", _crossed_terms(name))
        _differ(PROX, "algorithm.mu=0.01,0.1", tmp_path / name)


def _crossed_terms(what: str) -> Any:
    """``_pulls`` with each run's prox term carrying the next run's μ or centre (the calls'
    terms replaced: each call serves one local SGD)."""
    real = local_rows._pulls

    def pulls(blocks: Any, theta: torch.Tensor, lr: float) -> Any:
        terms = [b.call.extra_grad for b in blocks]
        moved = terms[1:] + terms[:1]
        for block, term, other in zip(blocks, terms, moved, strict=True):
            mu = other.mu if what == "mu" else term.mu
            centre = other.center if what == "centre" else term.center
            block.call.extra_grad = ProxGrad(centre, mu)
        return real(blocks, theta, lr)

    return pulls


def test_a_crossing_of_rows_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Plant a crossing: each run handed the next run's rows back. Caught."""
    real = local_rows._trained

    def next_runs_rows(block: Any, theta: torch.Tensor, losses: torch.Tensor) -> Any:
        c = block.stop - block.start
        begin = block.stop % theta.shape[0]
        moved = local_rows._Block(block.call, begin, begin + c)
        return real(moved, theta, losses)

    monkeypatch.setattr(local_rows, "_trained", next_runs_rows)
    _differ(["algorithm.name=fedavg", "algorithm.local_steps=3"], "algorithm.lr=0.05", tmp_path)


@pytest.mark.parametrize("extra", [[], ["engine.clients_per_chunk=4"]], ids=["fresh", "ahead"])
def test_a_draw_from_another_runs_data_is_caught(
    extra: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plant a crossing in the stacked draw (each run's samples read from the next run's data),
    drawn as the steps go or gathered from the indices drawn ahead: caught."""
    real = run_rows.StackedData.of

    def shifted(contexts: Any) -> run_rows.StackedData:
        data = real(contexts)
        return run_rows.StackedData(data.x, data.y, data.starts[1:] + data.starts[:1])

    monkeypatch.setattr(run_rows.StackedData, "of", shifted)
    monkeypatch.setattr(run_rows, "_LAST", [])
    options = ["algorithm.name=fedavg", "algorithm.local_steps=3", *extra]
    _differ(options, "algorithm.lr=0.05", tmp_path)


def _call(overrides: list[str], work: LocalWork | None = None, **kw: Any) -> LocalCall:
    exp, state, task = start([*TINY, *overrides])
    w = task.broadcast["global"].expand(len(task.clients), -1)
    return LocalCall(exp.ctx, w, task.clients, work or exp.algorithm.options.work(), **kw)


@pytest.mark.parametrize(
    "overrides",
    [
        ["algorithm.name=fedavg", "algorithm.local_epochs=1"],
        ["algorithm.name=fedavg", "algorithm.momentum=0.9"],
        ["algorithm.name=fedprox", "algorithm.weight_decay=0.001"],
        ["algorithm.name=fedavg", "algorithm.clip_grad_norm=1.0"],
    ],
    ids=["epochs", "momentum", "decay", "clip"],
)
def test_calls_it_does_not_cover_train_alone(overrides: list[str]) -> None:
    """Local epochs, momentum or weight decay, a clipped model: no key (the call trains as it
    does outside a batch)."""
    assert local_sgd_key(_call(overrides)) is None


def test_calls_of_other_local_work_do_not_meet() -> None:
    """Another step size, step count, minibatch size or term: another key; another seed, μ or
    centre: the same."""
    base = ["algorithm.name=fedavg", "algorithm.local_steps=3"]
    one = _call(base)
    w = one.params[0]
    keys = [
        local_sgd_key(one),
        local_sgd_key(_call([*base, "seed=1"])),
        local_sgd_key(_call(base, LocalWork(0.07, 20, 3))),
        local_sgd_key(_call(base, LocalWork(0.05, 20, 2))),
        local_sgd_key(_call(base, LocalWork(0.05, 10, 3))),
        local_sgd_key(_call(base, extra_grad=ProxGrad(w, 0.1))),
        local_sgd_key(_call(base, extra_grad=ProxGrad(torch.zeros_like(w), 1.0))),
    ]
    assert None not in keys
    assert keys[0] == keys[1] and keys[5] == keys[6]
    assert len({keys[0], keys[2], keys[3], keys[4], keys[5]}) == 5


class _Recorder:
    """A batch that records what reaches it and trains each call alone."""

    def __init__(self) -> None:
        self.calls: list[LocalCall] = []

    def local_sgd(self, call: LocalCall) -> local_rows.Trained:
        self.calls.append(call)
        return local_rows.stacked_local_sgd([call])[0]


def test_only_covered_calls_reach_the_batch() -> None:
    """``ctx.local_sgd`` hands the batch the calls it covers (plain, prox, shift terms) and
    trains the others alone: a mask, BatchNorm buffers, a method's own loss, partial work."""
    exp, state, task = start([*TINY, "algorithm.name=fedavg", "algorithm.local_steps=2"])
    ctx, work = exp.ctx, exp.algorithm.options.work()
    recorder = _Recorder()
    ctx.batch = recorder
    w = task.broadcast["global"].expand(len(task.clients), -1)
    alone = ctx.local_sgd(w, task.clients, work, alone=True)
    assert recorder.calls == []
    mask = torch.ones_like(w)
    ctx.local_sgd(w, task.clients, work, mask=mask)
    assert recorder.calls == []
    ctx.local_sgd(w, task.clients, work)
    assert len(recorder.calls) == 1 and recorder.calls[0].work == work
    assert alone[0].shape == w.shape
