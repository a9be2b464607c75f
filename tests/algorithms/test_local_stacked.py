"""LocalOnly's stacked round (runs as rows): S runs trained as one local SGD, every client from its
own model, give each run, bit for bit, what its ``train`` gives it alone — the clients' models
kept, losses, trained samples, the generator's state after its draws — and nothing crosses a
run's rows (planted crossings caught); a lockstep sweep batch of LocalOnly runs stacks its rounds
and writes what the runs write one after another."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from fedhp.algorithms import fedavg_stacked
from fedhp.engine import run_rows
from tests.algorithms.stacked_runs import (
    TINY,
    alone,
    lockstep_writes_the_sequential_files,
    next_runs_rows,
    same,
    stacked,
    start,
)

BASE = [*TINY, "algorithm.name=local", "algorithm.local_steps=3"]

RUNS = [[f"seed={s}"] for s in range(3)]

Started = tuple[Any, dict[str, torch.Tensor], Any]


def _start(overrides: list[str]) -> Started:
    """A run's experiment, state and task of its SECOND round (round 0 trained alone: every
    client's own model now differs from the others')."""
    exp, state, task = start([*BASE, *overrides])
    algo = exp.algorithm
    algo.aggregate(state, task, algo.train(state, task))
    exp.ctx.begin_round(1)
    return exp, state, algo.plan(state, 1)


def _outcome(exp: Any, state: dict[str, torch.Tensor], update: Any) -> dict[str, Any]:
    return {
        "theta": state["theta"].clone(),
        "losses": update.losses,
        "steps": update.steps,
        "trained": exp.model.trained_samples,
        "generator": exp.ctx.sampler.generator.get_state(),
    }


def _alone(runs: list[list[str]], extra: list[str]) -> list[dict[str, Any]]:
    return alone([[*r, *extra] for r in runs], _outcome, _start)


def _stacked(runs: list[list[str]], extra: list[str]) -> list[dict[str, Any]]:
    return stacked([[*r, *extra] for r in runs], _outcome, _start)


EXTRAS = [
    [],
    ["engine.clients_per_chunk=4"],  # stacked parts that span two runs
    ["federation.sampling=with_replacement"],  # each run draws alone
]


@pytest.mark.parametrize("extra", EXTRAS)
def test_each_run_of_a_stack_gets_what_it_gets_alone(extra: list[str]) -> None:
    for one, both in zip(_alone(RUNS, extra), _stacked(RUNS, extra), strict=True):
        same(one, both)


def _caught(extra: list[str] | None = None) -> None:
    alone = _alone(RUNS, extra or [])
    with pytest.raises(AssertionError):
        for a, b in zip(alone, _stacked(RUNS, extra or []), strict=True):
            same(a, b)


def test_a_crossing_of_rows_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plant a crossing: each run handed the next run's rows back. Caught."""
    real = fedavg_stacked._finish

    monkeypatch.setattr(fedavg_stacked, "_finish", next_runs_rows(real))
    _caught()


def test_a_draw_from_another_runs_data_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plant a crossing in the stacked draw (each run's samples read from the next run's data):
    caught."""
    real = run_rows.StackedData.of

    def shifted(contexts: Any) -> run_rows.StackedData:
        data = real(contexts)
        return run_rows.StackedData(data.x, data.y, data.starts[1:] + data.starts[:1])

    monkeypatch.setattr(run_rows.StackedData, "of", shifted)
    monkeypatch.setattr(run_rows, "_LAST", [])
    _caught()


@pytest.mark.parametrize(
    "extra",
    [
        ["algorithm.local_steps=1", "algorithm.local_epochs=1"],
        ["algorithm.momentum=0.9"],
        ["algorithm.clip_grad_norm=1.0"],
        ["model.name=vgg", "model.cfg=[4,M,8,M]", "model.batch_norm=true"],
    ],
)
def test_rounds_it_does_not_cover_train_alone(extra: list[str]) -> None:
    """Local epochs, momentum, clipping, BatchNorm: no stack key (the run trains alone)."""
    keys = {o.split("=")[0] for o in extra}
    dropped = {"algorithm.local_steps"} if "algorithm.local_epochs" in keys else set()
    dropped |= {"model.hidden"} if "model.name" in keys else set()
    base = [o for o in BASE if o.split("=")[0] not in dropped]
    extra = [o for o in extra if o != "algorithm.local_steps=1"]
    exp, state, task = start([*base, *extra])
    assert exp.algorithm.stack_key(state, task) is None


def test_a_lockstep_batch_of_local_stacks_its_rounds(tmp_path: Path) -> None:
    """LocalOnly × 2 seeds in lockstep: the rounds train stacked, and every run writes what it
    writes in the batch run one after another."""
    base = [*TINY, "rounds=2", "eval_every=1", "checkpoint_every=1", *BASE[len(TINY) :]]
    report = lockstep_writes_the_sequential_files(base, "algorithm.lr=0.05", [0, 1], tmp_path)
    assert report.stacked_rounds > 0
