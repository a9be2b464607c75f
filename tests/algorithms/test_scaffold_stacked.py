"""SCAFFOLD's stacked round (runs as rows): S runs trained as one local SGD, each client's steps
shifted by its own correction c - c_i, give each run, bit for bit, what its ``train`` gives it
alone — update, control variates, trained samples, the generator's state after its draws — and
nothing crosses a run's rows (planted crossings of corrections or rows are caught); a lockstep
sweep batch of SCAFFOLD runs stacks its rounds and writes what the runs write one after
another."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from fedhp.algorithms import fedavg_stacked
from tests.algorithms.stacked_runs import (
    TINY,
    alone,
    lockstep_writes_the_sequential_files,
    next_runs_rows,
    same,
    stacked,
    start,
)

BASE = [*TINY, "algorithm.name=scaffold", "algorithm.local_steps=3"]

# seeds × η_g, neighbours of different seeds (their corrections differ: a crossing shows)
RUNS = [[f"seed={s}", f"algorithm.server_lr={g}"] for g in (1.0, 0.5) for s in range(2)]

Started = tuple[Any, dict[str, torch.Tensor], Any]


def _start(overrides: list[str]) -> Started:
    """A run's experiment, state and task of its SECOND round: round 0 trained and aggregated
    alone, so that the control variates c and c_i are no longer zero (and differ by run)."""
    exp, state, task = start([*BASE, *overrides])
    algo = exp.algorithm
    algo.aggregate(state, task, algo.train(state, task))
    exp.ctx.begin_round(1)
    return exp, state, algo.plan(state, 1)


def _outcome(exp: Any, state: dict[str, torch.Tensor], update: Any) -> dict[str, Any]:
    return {
        "model": update.per_client["model"],
        "dc": update.per_client["dc"],
        "losses": update.losses,
        "steps": update.steps,
        "c_local": state["c_local"].clone(),
        "trained": exp.model.trained_samples,
        "generator": exp.ctx.sampler.generator.get_state(),
        "ledger": exp.ctx.ledger.totals(),
    }


def _alone(runs: list[list[str]], extra: list[str]) -> list[dict[str, Any]]:
    return alone([[*r, *extra] for r in runs], _outcome, _start)


def _stacked(runs: list[list[str]], extra: list[str]) -> list[dict[str, Any]]:
    return stacked([[*r, *extra] for r in runs], _outcome, _start)


EXTRAS = [
    [],
    ["federation.weighting=samples"],
    ["federation.client_fraction=0.5"],  # each run its own clients
    ["engine.clients_per_chunk=4"],  # stacked parts that span two runs
    ["federation.sampling=with_replacement"],  # each run draws alone
    ["comm.zero_threshold=0.001"],  # truncation on the links (c as received)
    ["faults.client_dropout=0.3"],  # blocks of unequal sizes
]


@pytest.mark.parametrize("extra", EXTRAS)
def test_each_run_of_a_stack_gets_what_it_gets_alone(extra: list[str]) -> None:
    for one, both in zip(_alone(RUNS, extra), _stacked(RUNS, extra), strict=True):
        same(one, both)


def test_the_corrections_differ_by_run_and_client() -> None:
    """(The premise of the comparisons: the second round's corrections are not zero, and differ
    from run to run.)"""
    terms = []
    for overrides in RUNS[:2]:
        exp, state, task = _start(overrides)
        term = exp.algorithm.correction(state, task).term
        assert term.shape == (len(task.clients), exp.model.num_params)
        assert bool((term != 0).any()) and not torch.equal(term[0], term[1])
        terms.append(term)
    assert not torch.equal(terms[0], terms[1])


def _gpu_form(monkeypatch: pytest.MonkeyPatch, on: bool) -> None:
    monkeypatch.setattr(fedavg_stacked, "gathers", lambda device: on)


@pytest.mark.parametrize("extra", [[], ["engine.clients_per_chunk=4"]], ids=["whole", "chunked"])
def test_the_gpu_form_shifts_by_the_same_values(
    extra: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GPU's form (the runs' corrections stacked, one shift per layer over each part's rows)
    computes the same bits as the CPU's run-by-run shift."""
    _gpu_form(monkeypatch, True)
    for one, both in zip(_alone(RUNS, extra), _stacked(RUNS, extra), strict=True):
        same(one, both)


def _caught(extra: list[str] | None = None) -> None:
    alone = _alone(RUNS, extra or [])
    with pytest.raises(AssertionError):
        for a, b in zip(alone, _stacked(RUNS, extra or []), strict=True):
            same(a, b)


@pytest.mark.parametrize("gather", [False, True])
def test_a_crossing_of_corrections_is_caught(gather: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Plant a crossing: each run's rows shifted by the next run's corrections (CPU and GPU
    forms). Caught."""
    _gpu_form(monkeypatch, gather)
    real = fedavg_stacked._shifts

    def next_runs(runs: Any) -> list[torch.Tensor]:
        terms = real(runs)
        return terms[1:] + terms[:1]

    monkeypatch.setattr(fedavg_stacked, "_shifts", next_runs)
    _caught()


def test_a_crossing_of_rows_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plant a crossing: each run handed the next run's rows back. Caught."""
    real = fedavg_stacked._finish

    monkeypatch.setattr(fedavg_stacked, "_finish", next_runs_rows(real))
    _caught()


@pytest.mark.parametrize(
    "extra",
    [
        ["algorithm.local_steps=1", "algorithm.local_epochs=1"],
        ["algorithm.momentum=0.9"],
        ["algorithm.weight_decay=0.001"],
        ["algorithm.clip_grad_norm=1.0"],
        ["robust.cloud.name=median"],
        ["model.name=vgg", "model.cfg=[4,M,8,M]", "model.batch_norm=true"],
    ],
)
def test_rounds_it_does_not_cover_train_alone(extra: list[str]) -> None:
    """Local epochs, momentum or weight decay, clipping, a robust cloud rule, BatchNorm: no
    stack key (the run trains alone)."""
    keys = {o.split("=")[0] for o in extra}
    dropped = {"algorithm.local_steps"} if "algorithm.local_epochs" in keys else set()
    dropped |= {"model.hidden"} if "model.name" in keys else set()
    base = [o for o in BASE if o.split("=")[0] not in dropped]
    extra = [o for o in extra if o != "algorithm.local_steps=1"]
    exp, state, task = start([*base, *extra])
    assert exp.algorithm.stack_key(state, task) is None


def test_runs_of_other_local_work_or_methods_do_not_meet() -> None:
    """Another lr or local step count: another key; FedAvg's key is not SCAFFOLD's."""
    found = set()
    for extra in ([], ["algorithm.lr=0.07"], ["algorithm.local_steps=2"]):
        exp, state, task = start([*BASE, *extra])
        found.add(exp.algorithm.stack_key(state, task))
    exp, state, task = start([*BASE, "algorithm.name=fedavg"])
    found.add(exp.algorithm.stack_key(state, task))
    assert len(found) == 4 and None not in found


def test_a_lockstep_batch_of_scaffold_stacks_its_rounds(tmp_path: Path) -> None:
    """SCAFFOLD server_lr ∈ {1.0, 0.5} × 2 seeds in lockstep: the rounds train stacked, and
    every run writes what it writes in the batch run one after another."""
    base = [*TINY, "rounds=3", "eval_every=1", "checkpoint_every=1", *BASE[len(TINY) :]]
    grid = "algorithm.server_lr=1.0,0.5"
    report = lockstep_writes_the_sequential_files(base, grid, [0, 1], tmp_path)
    assert report.stacked_rounds > 0
