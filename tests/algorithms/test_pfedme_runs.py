"""pFedMe's round on a batch of runs (runs as rows): S runs trained as one round give each run,
bit for bit, what the round gives it alone — state, update, ledger, trained samples — and nothing
crosses a run's rows (a planted crossing is caught); whole runs in a lockstep batch write what
they write one after another."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from fedhp.algorithms import pfedme
from fedhp.algorithms.pfedme import round_key
from fedhp.engine.run_rows import RunBlocks
from fedhp.sweep.execute import run_batch
from fedhp.sweep.grid import parse_grid, points_of
from fedhp.sweep.plan import plan_runs
from tests.algorithms.stacked_runs import (
    TINY,
    Started,
    alone,
    lockstep_writes_the_sequential_files,
    run_files,
    same,
    stacked,
    start,
)

BASE = [*TINY, "algorithm.name=pfedme", "algorithm.K=2", "algorithm.R=3"]

# Each run: its seed and its λ (λ = 20 with personal_lr 0.05 makes the θ pull a lerp of weight
# 1); run 3 has another local-model step lr (another w_loc step per row).
RUNS = [
    ["seed=0", "algorithm.lam=15"],
    ["seed=1", "algorithm.lam=20"],
    ["seed=2", "algorithm.lam=25"],
]
MIXED = [["seed=3", "algorithm.lam=10", "algorithm.lr=0.02"]]


def _start(overrides: list[str], base: list[str] = BASE) -> Started:
    return start([*base, *overrides])


def _outcome(exp: Any, state: dict[str, torch.Tensor], update: Any) -> dict[str, Any]:
    return {
        "theta": state["theta"].clone(),
        "local": update.per_client["local"],
        "losses": update.losses,
        "ledger": exp.ctx.ledger.totals(),
        "trained": exp.model.trained_samples,
    }


def _alone(runs: list[list[str]], extra: list[str], base: list[str] = BASE) -> list[dict[str, Any]]:
    return alone([[*base, *r, *extra] for r in runs], _outcome)


def _stacked(
    runs: list[list[str]], extra: list[str], base: list[str] = BASE
) -> list[dict[str, Any]]:
    return stacked([[*base, *r, *extra] for r in runs], _outcome)


_same = same


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["federation.weighting=samples"],
        ["comm.zero_threshold=0.001"],
        ["algorithm.theta_init=warm"],
        ["algorithm.theta_init=reset"],
        ["federation.client_fraction=0.5"],  # clients sampled per run
        ["engine.clients_per_chunk=4"],  # parts that span two runs (and parts alone)
        ["federation.sampling=with_replacement"],  # each run draws alone
    ],
)
def test_each_run_of_a_stack_gets_what_it_gets_alone(extra: list[str]) -> None:
    for one, both in zip(_alone(RUNS + MIXED, extra), _stacked(RUNS + MIXED, extra), strict=True):
        _same(one, both)


# Fresh Gaussian feature noise at every access (drawn while gathering): each run draws alone.
NOISY = [
    *(o for o in BASE if not o.startswith("partition.")),
    "partition.name=feature_noise",
    "partition.resample=true",
    "partition.noise=0.1",
]


@pytest.mark.parametrize("extra", [[], ["engine.clients_per_chunk=4"]])
def test_runs_with_feature_noise_get_what_they_get_alone(extra: list[str]) -> None:
    exp = _start([], NOISY)[0]
    assert exp.ctx.fed.train.noise_std is not None
    for one, both in zip(
        _alone(RUNS + MIXED, extra, NOISY), _stacked(RUNS + MIXED, extra, NOISY), strict=True
    ):
        _same(one, both)


@pytest.mark.parametrize("extra", [[], ["engine.clients_per_chunk=4"]])
def test_the_gpu_form_computes_the_same_values(
    extra: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GPU's form (one pull per layer and one w_loc step per part, per-row weights) computes
    the same bits as the CPU's run-by-run form."""
    monkeypatch.setattr(pfedme, "gathers", lambda device: True)
    for one, both in zip(_alone(RUNS + MIXED, extra), _stacked(RUNS + MIXED, extra), strict=True):
        _same(one, both)


def plant_next_runs_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A planted crossing: each run's rows of a part read as the next run's (its pull, its
    ``w_loc`` step, its counter of trained samples)."""
    real_within = RunBlocks.within

    def next_runs(self: RunBlocks, a: int, b: int) -> list[tuple[int, int, int]]:
        return [(lo, hi, (s + 1) % self.runs) for lo, hi, s in real_within(self, a, b)]

    monkeypatch.setattr(RunBlocks, "within", next_runs)


def test_a_crossing_between_runs_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plant crossings: each run given the next run's λ (in the per-row form), its rows read as
    the next run's (CPU form), or the next run's rows handed back. The comparison above must
    see them."""
    alone = _alone(RUNS, [])
    real_column = RunBlocks.column

    def next_runs_values(self: RunBlocks, values: list[float], like: torch.Tensor) -> Any:
        return real_column(self, values[1:] + values[:1], like)

    monkeypatch.setattr(RunBlocks, "column", next_runs_values)
    monkeypatch.setattr(pfedme, "gathers", lambda device: True)
    with pytest.raises(AssertionError):
        for a, b in zip(alone, _stacked(RUNS, []), strict=True):
            _same(a, b)
    monkeypatch.undo()

    plant_next_runs_blocks(monkeypatch)  # (CPU form)
    with pytest.raises(AssertionError):
        for a, b in zip(alone, _stacked(RUNS, []), strict=True):
            _same(a, b)
    monkeypatch.undo()
    real_of_run = RunBlocks.of_run

    def next_runs_rows(self: RunBlocks, s: int) -> slice:
        return real_of_run(self, (s + 1) % self.runs)

    monkeypatch.setattr(RunBlocks, "of_run", next_runs_rows)
    with pytest.raises(AssertionError):
        for a, b in zip(alone, _stacked(RUNS, []), strict=True):
            _same(a, b)


@pytest.mark.parametrize(
    "extra",
    [
        ["algorithm.l2=0.001"],
        ["faults.attack.name=sign_flip", "faults.attack.fraction=0.2"],
        ["faults.attack.name=label_flip", "faults.attack.fraction=0.2"],
        ["robust.cloud.name=median"],
    ],
)
def test_rounds_it_does_not_cover_train_alone(extra: list[str]) -> None:
    """The hidden L2 on θ, an attack (on the uploads or the labels) or a robust rule at the
    cloud: no stack key (the run trains alone)."""
    exp, state, task = _start(extra)
    assert round_key(exp.algorithm, task) is None


def test_a_lockstep_batch_stacks_its_rounds_and_writes_what_each_run_writes(
    tmp_path: Path,
) -> None:
    """2 λ × 2 seeds of pFedMe in lockstep: the rounds meet whole (stacked) and every run's
    files are byte for byte those of the runs one after another."""
    base = [*BASE, "rounds=2", "eval_every=1", "checkpoint_every=1", "algorithm.R=2"]
    report = lockstep_writes_the_sequential_files(base, "algorithm.lam=15.0,20.0", [0, 1], tmp_path)
    assert report.stacked_rounds > 0


def test_a_lockstep_batch_whose_stacked_round_mixes_runs_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plant a crossing in the stacked rounds of a lockstep batch (each run's θ pulled with the
    next run's λ): the runs' files must differ from the runs one after another."""
    base = [*BASE, "rounds=2", "eval_every=1", "algorithm.R=2"]
    points = points_of(parse_grid(["algorithm.lam=15.0,20.0"]))
    run_batch(plan_runs(base, points, [0], tmp_path / "alone"), "sequential", log=lambda _: None)
    plant_next_runs_blocks(monkeypatch)
    crossed = run_batch(
        plan_runs(base, points, [0], tmp_path / "crossed"), "lockstep", log=lambda _: None
    )
    assert crossed.stacked_rounds > 0
    a, b = run_files(tmp_path / "alone"), run_files(tmp_path / "crossed")
    assert a.keys() == b.keys() and any(a[name] != b[name] for name in a)
