"""Per-FedAvg's round on a batch of runs (runs as rows): S runs trained as one round of meta-steps
give each run, bit for bit, what the round gives it alone — update, losses, state, ledger, trained
samples, the generator's state after its draws — for the first-order and the Hessian-free
variant, and nothing crosses a run's rows (planted crossings are caught); a lockstep sweep batch
stacks its rounds and writes what its runs write one after another."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from fedhp.engine import run_rows
from fedhp.engine.run_rows import RunBlocks
from fedhp.sweep.execute import run_batch
from fedhp.sweep.grid import parse_grid, points_of
from fedhp.sweep.plan import plan_runs
from tests.algorithms.stacked_runs import (
    TINY,
    alone,
    lockstep_writes_the_sequential_files,
    run_files,
    same,
    stacked,
    start,
)

BASE = [*TINY, "algorithm.name=perfedavg", "algorithm.local_steps=2"]

# Each run: its seed, α and β (Per-FedAvg refuses an lr: it steps by α and β).
RUNS = [
    ["seed=0", "algorithm.alpha=0.05", "algorithm.beta=0.001"],
    ["seed=1", "algorithm.alpha=0.02", "algorithm.beta=0.01"],
    ["seed=2", "algorithm.alpha=0.1", "algorithm.beta=0.005"],
]
SAME = [[f"seed={s}", "algorithm.alpha=0.03", "algorithm.beta=0.002"] for s in range(2)]
VARIANTS = [["algorithm.variant=fo"], ["algorithm.variant=hf"]]


def _outcome(exp: Any, state: dict[str, torch.Tensor], update: Any) -> dict[str, Any]:
    return {
        "global": state["global"].clone(),
        "model": update.per_client["model"],
        "losses": update.losses,
        "ledger": exp.ctx.ledger.totals(),
        "trained": exp.model.trained_samples,
        "generator": exp.ctx.sampler.generator.get_state(),
    }


def _runs(runs: list[list[str]], extra: list[str]) -> list[list[str]]:
    return [[*BASE, *r, *extra] for r in runs]


def _equal(runs: list[list[str]], extra: list[str]) -> None:
    one, both = alone(_runs(runs, extra), _outcome), stacked(_runs(runs, extra), _outcome)
    assert len(one) == len(both) == len(runs)
    for a, b in zip(one, both, strict=True):
        same(a, b)


def _caught(runs: list[list[str]], extra: list[str]) -> None:
    one = alone(_runs(runs, extra), _outcome)
    with pytest.raises(AssertionError):
        for a, b in zip(one, stacked(_runs(runs, extra), _outcome), strict=True):
            same(a, b)


EXTRAS = [
    [],
    ["federation.client_fraction=0.5"],  # each run its own clients
    ["faults.client_dropout=0.3"],  # blocks of unequal sizes
    ["engine.clients_per_chunk=4"],  # the model's parts span two runs
    ["federation.sampling=with_replacement"],  # each run draws alone
    ["comm.zero_threshold=0.001"],  # truncation on the links
    ["faults.attack.name=label_flip", "faults.attack.fraction=0.3"],  # (in each run's data)
    ["algorithm.capabilities=dyn"],  # FedLPS's device model (outside train)
]


@pytest.mark.parametrize("extra", EXTRAS)
@pytest.mark.parametrize("variant", VARIANTS, ids=["fo", "hf"])
def test_each_run_of_a_stack_gets_what_it_gets_alone(variant: list[str], extra: list[str]) -> None:
    _equal(RUNS, [*variant, *extra])


@pytest.mark.parametrize("variant", VARIANTS, ids=["fo", "hf"])
def test_runs_of_one_alpha_and_beta_get_what_they_get_alone(variant: list[str]) -> None:
    """(The scalar form of :meth:`~fedhp.engine.run_rows.RunBlocks.column`: every run the same
    α, β.)"""
    _equal(SAME, variant)


NOISY = [
    "partition.name=feature_noise",
    "partition.resample=true",
    "partition.noise=0.1",
]


def test_runs_with_feature_noise_get_what_they_get_alone() -> None:
    """Fresh Gaussian feature noise at every access (drawn while gathering): each run draws
    alone, the steps are stacked."""
    runs = [[*r, *NOISY] for r in RUNS]
    base = [o for o in BASE if not o.startswith("partition.")]
    one = alone([[*base, *r] for r in runs], _outcome)
    both = stacked([[*base, *r] for r in runs], _outcome)
    for a, b in zip(one, both, strict=True):
        same(a, b)


def _next_runs_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """A planted crossing: each run's rows given the next run's value (α and β)."""
    real = RunBlocks.column

    def next_runs(self: RunBlocks, values: list[float], like: torch.Tensor) -> Any:
        return real(self, values[1:] + values[:1], like)

    monkeypatch.setattr(RunBlocks, "column", next_runs)


@pytest.mark.parametrize("variant", VARIANTS, ids=["fo", "hf"])
def test_a_crossing_of_alpha_or_beta_is_caught(
    variant: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plant a crossing: each run given the next run's α and β. Caught (and with α alone
    differing between the runs, the next run's α alone)."""
    _next_runs_values(monkeypatch)
    _caught(RUNS, variant)
    alphas = [[f"seed={s}", f"algorithm.alpha={a}"] for s, a in ((0, 0.05), (1, 0.2))]
    _caught(alphas, variant)


def test_a_crossing_of_rows_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plant a crossing: each run handed the next run's rows back. Caught."""
    real = RunBlocks.of_run

    def next_runs_rows(self: RunBlocks, s: int) -> slice:
        return real(self, (s + 1) % self.runs)

    monkeypatch.setattr(RunBlocks, "of_run", next_runs_rows)
    _caught(SAME, [])


def test_a_crossing_of_the_trained_samples_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plant a crossing: each run's trained samples counted on the next run's model. Caught
    (runs of unequal blocks)."""
    real = RunBlocks.within

    def next_runs(self: RunBlocks, a: int, b: int) -> list[tuple[int, int, int]]:
        return [(lo, hi, (s + 1) % self.runs) for lo, hi, s in real(self, a, b)]

    monkeypatch.setattr(RunBlocks, "within", next_runs)
    _caught(RUNS, ["faults.client_dropout=0.3"])


def test_a_draw_from_another_runs_data_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plant a crossing in the stacked draw (each run's samples read from the next run's
    data): caught."""
    real = run_rows.StackedData.of

    def shifted(contexts: Any) -> run_rows.StackedData:
        data = real(contexts)
        return run_rows.StackedData(data.x, data.y, data.starts[1:] + data.starts[:1])

    monkeypatch.setattr(run_rows.StackedData, "of", shifted)
    monkeypatch.setattr(run_rows, "_LAST", [])
    _caught(SAME, [])


def test_runs_of_other_local_work_do_not_meet() -> None:
    """Another variant, local step count or minibatch size: another key. Another α or β: the
    same key."""
    overrides = [
        [],
        ["algorithm.variant=hf"],
        ["algorithm.local_steps=3"],
        ["algorithm.batch_size=8"],
    ]
    keys = [start(_runs([["seed=0"]], o)[0]) for o in overrides]
    found = {exp.algorithm.round_key(task) for exp, state, task in keys}
    assert len(found) == len(overrides) and None not in found
    floats = [start(run) for run in _runs(RUNS, [])]
    assert len({exp.algorithm.round_key(task) for exp, state, task in floats}) == 1


def test_a_round_without_clients_trains_alone() -> None:
    exp, state, task = start(_runs([["seed=0"]], [])[0])
    task.clients = task.clients[:0]
    assert exp.algorithm.round_key(task) is None


LOCKSTEP = ["rounds=2", "eval_every=1", "checkpoint_every=1"]


@pytest.mark.parametrize("variant", VARIANTS, ids=["fo", "hf"])
def test_a_lockstep_batch_stacks_its_rounds_and_writes_what_each_run_writes(
    variant: list[str], tmp_path: Path
) -> None:
    """2 β × 2 seeds of Per-FedAvg in lockstep: the rounds meet whole (stacked) and every run's
    files are byte for byte those of the runs one after another."""
    base = [*BASE, *LOCKSTEP, *variant]
    report = lockstep_writes_the_sequential_files(base, "algorithm.beta=0.05,0.1", [0, 1], tmp_path)
    assert report.stacked_rounds > 0


def test_a_lockstep_batch_whose_stacked_round_mixes_runs_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plant a crossing in the stacked rounds of a lockstep batch (each run stepped with the next
    run's α and β): the runs' files must differ from the runs one after another."""
    base = [*BASE, *LOCKSTEP]
    points = points_of(parse_grid(["algorithm.beta=0.05,0.1"]))
    run_batch(plan_runs(base, points, [0], tmp_path / "alone"), "sequential", log=lambda _: None)
    _next_runs_values(monkeypatch)
    crossed = run_batch(
        plan_runs(base, points, [0], tmp_path / "crossed"), "lockstep", log=lambda _: None
    )
    assert crossed.stacked_rounds > 0
    a, b = run_files(tmp_path / "alone"), run_files(tmp_path / "crossed")
    assert a.keys() == b.keys() and any(a[name] != b[name] for name in a)
