"""Runs in lockstep (their model kernels fused) write what each run writes alone, and a batch
whose fused call mixed rows across runs is caught."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedhp.sweep import lockstep
from fedhp.sweep.execute import run_batch
from fedhp.sweep.grid import parse_grid, points_of
from fedhp.sweep.plan import plan_runs
from tests.algorithms.stacked_runs import TINY, run_files

BASE = ["rounds=2", "eval_every=1", *TINY, "checkpoint_every=1"]

# method -> (its options, a float option the two grid points differ in)
METHODS: dict[str, tuple[list[str], str]] = {
    "fedavg": (["algorithm.local_steps=3"], "algorithm.lr=0.05"),  # (one point: seeds differ)
    "fedavg-decay": (
        ["algorithm.name=fedavg", "algorithm.local_steps=3"],
        "algorithm.weight_decay=0.0,0.001",
    ),
    "fedprox": (["algorithm.local_steps=3"], "algorithm.mu=0.01,0.1"),
    "hierfavg": (["algorithm.kappa1=2", "algorithm.kappa2=2"], "algorithm.lr=0.05"),
    "pfedme": (["algorithm.K=2", "algorithm.R=2"], "algorithm.lam=15.0,20.0"),
    "perfedavg": (["algorithm.local_steps=2"], "algorithm.beta=0.05,0.1"),
    "heurfedamp": (["algorithm.local_steps=2"], "algorithm.alpha=0.1,0.5"),
    "fednova": (["algorithm.local_steps=3"], "algorithm.lr=0.05"),
    "sfedhp": (["algorithm.K=2", "algorithm.R=2"], "algorithm.lam=15.0,20.0"),
    "sfedhp-sparse": (
        [
            "algorithm.name=sfedhp",
            "algorithm.K=2",
            "algorithm.R=2",
            "algorithm.gamma1=0.001",
            "algorithm.gamma2=0.001",
        ],
        "algorithm.lam=15.0,20.0",
    ),
    "bf16-sfedhp": (  # (precision=bf16: the model's step under autocast, stacked the same)
        ["algorithm.name=sfedhp", "algorithm.K=2", "algorithm.R=2", "precision=bf16"],
        "algorithm.lam=15.0,20.0",
    ),
    "scaffold": (["algorithm.local_steps=3"], "algorithm.server_lr=1.0,0.5"),
    "ditto": (["algorithm.local_steps=2"], "algorithm.lam=0.1,1.0"),
    "centralized": (["algorithm.local_steps=2"], "algorithm.lr=0.05"),
}


def _runs(method: str, folder: Path) -> list:
    options, grid = METHODS[method]
    name = (
        []
        if any(o.startswith("algorithm.name=") for o in options)
        else [f"algorithm.name={method}"]
    )
    points = points_of(parse_grid([grid]))
    return plan_runs([*BASE, *name, *options], points, [0, 1], folder)


_files = run_files


@pytest.mark.parametrize("method", list(METHODS))
def test_lockstep_writes_what_each_run_writes_alone(method: str, tmp_path: Path) -> None:
    alone = run_batch(_runs(method, tmp_path / "alone"), "sequential", log=lambda _: None)
    fused = run_batch(_runs(method, tmp_path / "fused"), "lockstep", log=lambda _: None)
    assert alone.batching == "sequential" and fused.batching == "lockstep"
    assert fused.fused_calls > 0  # the kernels did meet
    # sFedHP's plain rounds meet whole (runs as rows); its sparse ones fuse kernels only, and
    # the batch's log line says so
    if method.startswith("sfedhp"):
        assert (fused.stacked_rounds > 0) == (method == "sfedhp"), fused.stacked_rounds
        alone_line = "rounds trained alone: " in fused.lockstep_line()
        assert alone_line == (method == "sfedhp-sparse"), fused.lockstep_line()
        assert (fused.alone_rounds == {}) == (method == "sfedhp"), fused.alone_rounds
    a, b = _files(tmp_path / "alone"), _files(tmp_path / "fused")
    assert len(a) >= 4 and a.keys() == b.keys()
    for name in a:
        assert a[name] == b[name], name
    assert [
        s["final_global_acc" if "final_global_acc" in s else "final_personal_acc"]
        for s in alone.summaries
    ] == [
        s["final_global_acc" if "final_global_acc" in s else "final_personal_acc"]
        for s in fused.summaries
    ]


def test_a_fused_call_that_mixes_runs_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plant a crossing: the fused model call hands each run the results of the NEXT run. The
    equality check above must then fail (the runs' files differ from the runs alone). (Sparse
    sFedHP: its rounds do not stack, only its model kernels meet. The stacked local SGD is
    checked in tests/engine/test_local_rows.py, the stacked rounds in
    tests/algorithms/test_*_stacked.py and below.)"""
    real = lockstep._fused

    def crossed(group: list) -> None:
        real(group)
        if len(group) > 1 and group[0].kind in ("sgd_step", "loss_and_grad"):
            results = [c.result for c in group]
            for call, other in zip(group, results[1:] + results[:1], strict=True):
                call.result = other

    alone = run_batch(_runs("sfedhp-sparse", tmp_path / "alone"), "sequential", log=lambda _: None)
    monkeypatch.setattr(lockstep, "_fused", crossed)
    fused = run_batch(_runs("sfedhp-sparse", tmp_path / "fused"), "lockstep", log=lambda _: None)
    assert fused.fused_calls > 0 and fused.stacked_rounds == 0
    a, b = _files(tmp_path / "alone"), _files(tmp_path / "fused")
    assert any(a[name] != b[name] for name in a)
    assert alone.summaries


def test_a_stacked_round_that_mixes_runs_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plant a crossing in sFedHP's stacked round (each run handed the next run's λ): the runs'
    files must differ from the runs alone."""
    from fedhp.engine.run_rows import RunBlocks

    real = RunBlocks.column

    def crossed(self: RunBlocks, values: list[float], like: torch.Tensor) -> object:
        return real(self, values[1:] + values[:1], like)

    alone = run_batch(_runs("sfedhp", tmp_path / "alone"), "sequential", log=lambda _: None)
    monkeypatch.setattr(RunBlocks, "column", crossed)
    fused = run_batch(_runs("sfedhp", tmp_path / "fused"), "lockstep", log=lambda _: None)
    assert fused.stacked_rounds > 0
    a, b = _files(tmp_path / "alone"), _files(tmp_path / "fused")
    assert any(a[name] != b[name] for name in a)
    assert alone.summaries


def test_a_diverged_run_stops_alone(tmp_path: Path) -> None:
    """A run whose lr blows up stops (its summary says so); its partner in the batch goes on to
    the last round."""
    runs = plan_runs(
        [*BASE, "rounds=4", "algorithm.name=fedavg", "algorithm.local_steps=3", "max_loss=50"],
        points_of(parse_grid(["algorithm.lr=0.05,80.0"])),
        [0],
        tmp_path,
    )
    report = run_batch(runs, "lockstep", log=lambda _: None)
    ok, bad = report.summaries
    assert "stopped" not in ok and ok["rounds"] == 4
    assert "stopped" in bad and bad["rounds"] < 4


def test_a_diverged_run_of_a_stack_stops_alone(tmp_path: Path) -> None:
    """sFedHP's stacked rounds: the run whose λ makes its θ steps overshoot (lr·λ1 = 4) stops
    on its own; its partner goes on to the last round and writes what it writes alone."""
    base = [*BASE, "rounds=4", "algorithm.name=sfedhp", "algorithm.K=2", "algorithm.R=2"]
    grid = points_of(parse_grid(["algorithm.lam=20.0,80.0"]))
    report = run_batch(plan_runs(base, grid, [0], tmp_path / "b"), "lockstep", log=lambda _: None)
    ok, bad = report.summaries
    assert report.stacked_rounds > 0
    assert "stopped" not in ok and ok["rounds"] == 4
    assert "stopped" in bad and bad["rounds"] < 4
    alone = run_batch(plan_runs(base, grid[:1], [0], tmp_path / "a"), "sequential")
    run = plan_runs(base, grid[:1], [0], tmp_path / "a")[0].folder.relative_to(tmp_path / "a")
    name = f"{run}/metrics.csv"
    timing = ("seconds", "seconds_per_round")
    assert {k: v for k, v in alone.summaries[0].items() if k not in timing} == {
        k: v for k, v in ok.items() if k not in timing
    }
    assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_resume_of_a_batch_is_bit_exact(tmp_path: Path) -> None:
    """Interrupted after 2 of 4 rounds (the checkpoint of round 2 kept, the rest removed), the
    batch resumes and writes the metrics of an uninterrupted batch."""
    whole = plan_runs(
        [*BASE, "rounds=4", "algorithm.name=sfedhp", "algorithm.K=2", "algorithm.R=2"],
        points_of(parse_grid(["algorithm.lam=15.0,20.0"])),
        [0],
        tmp_path / "whole",
    )
    run_batch(whole, "lockstep", log=lambda _: None)
    part = plan_runs(
        [*BASE, "rounds=2", "algorithm.name=sfedhp", "algorithm.K=2", "algorithm.R=2"],
        points_of(parse_grid(["algorithm.lam=15.0,20.0"])),
        [0],
        tmp_path / "cut",
    )
    run_batch(part, "lockstep", log=lambda _: None)
    rest = plan_runs(
        [*BASE, "rounds=4", "algorithm.name=sfedhp", "algorithm.K=2", "algorithm.R=2"],
        points_of(parse_grid(["algorithm.lam=15.0,20.0"])),
        [0],
        tmp_path / "cut",
    )
    import yaml

    for spec in rest:  # what an interrupted 4-round run leaves: its config and checkpoint
        cfg = yaml.safe_load((spec.folder / "config.yaml").read_text())
        cfg["rounds"] = 4
        (spec.folder / "config.yaml").write_text(yaml.safe_dump(cfg))
        (spec.folder / "summary.json").unlink()
    report = run_batch(rest, "lockstep", log=lambda _: None)
    assert report.batching == "lockstep"
    for a, b in zip(whole, rest, strict=True):
        assert (a.folder / "metrics.csv").read_bytes() == (b.folder / "metrics.csv").read_bytes()


def test_fused_rows_equal_each_call_alone() -> None:
    """The kernel-level fact the design rests on: row c of a fused step is row c of its run's
    own step (bit for bit), for the MLP's fused SGD step and its loss_and_grad."""
    from fedhp.build import build_experiment
    from fedhp.config import resolve_config

    exp = build_experiment(resolve_config(None, [*BASE, "algorithm.name=fedavg"]))
    model = exp.model
    g = torch.Generator().manual_seed(0)
    p = [torch.randn(3, model.num_params, generator=g) * 0.1 for _ in range(2)]
    x = [torch.rand(3, 5, 784, generator=g) for _ in range(2)]
    y = [torch.randint(0, 10, (3, 5), generator=g) for _ in range(2)]
    both = torch.cat(p)
    loss_both = model.sgd_step(both, torch.cat(x), torch.cat(y), 0.1)
    for i in range(2):
        loss = model.sgd_step(p[i], x[i], y[i], 0.1)
        assert torch.equal(p[i], both[3 * i : 3 * i + 3])
        assert torch.equal(loss, loss_both[3 * i : 3 * i + 3])


CNN2 = [
    *(o for o in BASE if not o.startswith("model.")),
    *["model.name=cnn2", "algorithm.name=fedavg", "algorithm.local_steps=2", "rounds=1"],
]


def test_a_model_whose_step_calls_its_loss_and_grad_runs_in_lockstep(tmp_path: Path) -> None:
    """The generic ``sgd_step`` (conv models) calls ``self.loss_and_grad``, routed too: inside
    the fused call it must run directly, not wait for partners again (it deadlocked)."""
    import threading

    reports = {}

    def run(mode: str) -> None:
        grid = points_of(parse_grid(["algorithm.lr=0.05"]))
        reports[mode] = run_batch(plan_runs(CNN2, grid, [0, 1], tmp_path / mode), mode)

    for mode in ("sequential", "lockstep"):
        worker = threading.Thread(target=run, args=(mode,), daemon=True)
        worker.start()
        worker.join(timeout=300)
        assert not worker.is_alive(), f"{mode}: the batch hangs"
    assert reports["lockstep"].batching == "lockstep" and reports["lockstep"].fused_calls > 0
    a, b = _files(tmp_path / "sequential"), _files(tmp_path / "lockstep")
    assert len(a) == 4 and a == b


def test_a_dropout_grid_is_not_run_in_lockstep(tmp_path: Path) -> None:
    """A grid ``model.dropout=0.0,0.5`` shares one batch (floats); its first run has no dropout
    but the second draws from torch's global generator: the whole batch runs one after
    another."""
    said: list[str] = []
    grid = points_of(parse_grid(["model.dropout=0.0,0.5"]))
    report = run_batch(plan_runs(CNN2, grid, [0], tmp_path), "lockstep", log=said.append)
    assert report.batching == "sequential"
    assert said == [
        "not in lockstep (the model's dropout draws from torch's global generator): "
        "one after another"
    ]


def test_one_row_calls_on_a_vmapped_convolution_run_alone(tmp_path: Path) -> None:
    """Centralized runs on a CNN (``torch.func.vmap`` over a convolution: a call of ONE row runs
    other kernels than a call of several, ``BatchedModel.rows_independent`` false): lockstep
    runs each run's one-row calls alone, so every file is what the run writes alone (fused,
    they differ in the last bits)."""
    base = [o for o in BASE if not o.startswith("model.")]
    options = ["algorithm.name=centralized", "model.name=cnn", "algorithm.local_steps=2"]
    points = points_of(parse_grid(["algorithm.lr=0.05"]))

    def runs(folder: Path) -> list:
        return plan_runs([*base, *options], points, [0, 1], folder)

    run_batch(runs(tmp_path / "alone"), "sequential", log=lambda _: None)
    fused = run_batch(runs(tmp_path / "fused"), "lockstep", log=lambda _: None)
    assert fused.batching == "lockstep" and fused.fused_calls == 0 and fused.single_calls > 0
    a, b = _files(tmp_path / "alone"), _files(tmp_path / "fused")
    assert len(a) >= 4 and a == b


def test_a_subclass_that_overrides_train_runs_its_own_round(tmp_path: Path) -> None:
    """A plugin's pFedMe whose own ``train`` changes the round (doubles the reported losses)
    runs its own round in a lockstep batch: the pFedMe round inside it (``super().train``)
    meets the other runs', and each run writes what it writes alone."""
    from fedhp.algorithms import ALGORITHMS, Algorithm
    from fedhp.algorithms.pfedme import PFedMe, PFedMeOptions
    from fedhp.engine.context import RunContext

    class DoubledLoss(PFedMe):
        def train(self, state, task):  # type: ignore[no-untyped-def]
            update = super().train(state, task)
            assert update.losses is not None
            update.losses = update.losses * 2
            return update

    @ALGORITHMS.register("pfedme_doubled_loss")
    class DoubledLossOptions(PFedMeOptions):
        def build(self, ctx: RunContext) -> Algorithm:
            return DoubledLoss(self, ctx)

    options = ["algorithm.name=pfedme_doubled_loss", "algorithm.K=2", "algorithm.R=2"]
    points = points_of(parse_grid(["algorithm.lam=15.0,20.0"]))

    def runs(folder: Path) -> list:
        return plan_runs([*BASE, *options], points, [0, 1], folder)

    alone = run_batch(runs(tmp_path / "alone"), "sequential", log=lambda _: None)
    fused = run_batch(runs(tmp_path / "fused"), "lockstep", log=lambda _: None)
    assert fused.stacked_rounds > 0 and fused.alone_rounds == {}
    a, b = _files(tmp_path / "alone"), _files(tmp_path / "fused")
    assert len(a) >= 4 and a.keys() == b.keys()
    for name in a:
        assert a[name] == b[name], name
    assert alone.summaries
