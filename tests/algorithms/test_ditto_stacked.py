"""Ditto's stacked round (runs as rows): S runs' global local SGD trained as one, then their
personal models' prox local SGD as one, give each run, bit for bit, what its ``train`` gives it
alone — update, personal models, trained samples, the generator's state after its draws; a
planted crossing of rows is caught; rounds it does not cover train alone; a lockstep sweep batch
of Ditto runs stacks its rounds and writes what the runs write one after another."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.algorithms.stacked_runs import (
    TINY,
    alone,
    lockstep_writes_the_sequential_files,
    same,
    stacked,
    start,
)

BASE = [*TINY, "algorithm.name=ditto", "algorithm.local_steps=3"]

# seeds × λ, neighbours of different seeds (their models differ: a crossing shows)
RUNS = [[*BASE, f"seed={s}", f"algorithm.lam={lam}"] for lam in (0.1, 0.5) for s in range(2)]


def _outcome(exp: Any, state: dict[str, torch.Tensor], update: Any) -> dict[str, Any]:
    return {
        "model": update.per_client["model"],
        "losses": update.losses,
        "steps": update.steps,
        "personal": state["personal"].clone(),
        "trained": exp.model.trained_samples,
        "generator": exp.ctx.sampler.generator.get_state(),
    }


EXTRAS = [
    [],
    ["federation.client_fraction=0.5"],  # each run its own clients
    ["engine.clients_per_chunk=4"],  # stacked parts that span two runs
    ["algorithm.personal_lr=0.03"],
]


@pytest.mark.parametrize("extra", EXTRAS)
def test_each_run_of_a_stack_gets_what_it_gets_alone(extra: list[str]) -> None:
    runs = [[*r, *extra] for r in RUNS]
    for a, b in zip(alone(runs, _outcome), stacked(runs, _outcome), strict=True):
        same(a, b)


def test_a_crossing_of_rows_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each run's personal rows started from its neighbour's: the outcomes differ."""
    from fedhp.algorithms import ditto

    real = ditto._PersonalRows.start
    seen: list[torch.Tensor] = []

    def crossed(self: Any, algo: Any, state: Any, task: Any) -> torch.Tensor:
        seen.append(real(self, algo, state, task))
        return seen[-2] if len(seen) > 1 else seen[-1]

    monkeypatch.setattr(ditto._PersonalRows, "start", crossed)
    got = stacked(RUNS, _outcome)
    monkeypatch.undo()
    want = alone(RUNS, _outcome)
    with pytest.raises(AssertionError):
        for a, b in zip(want, got, strict=True):
            same(a, b)


@pytest.mark.parametrize(
    "extra", [["algorithm.local_epochs=1", "algorithm.local_steps=1"], ["algorithm.momentum=0.9"]]
)
def test_rounds_it_does_not_cover_train_alone(extra: list[str]) -> None:
    keys = {o.split("=")[0] for o in extra}
    base = [o for o in BASE if not ("algorithm.local_epochs" in keys and "local_steps" in o)]
    extra = [o for o in extra if o != "algorithm.local_steps=1"]
    exp, state, task = start([*base, *extra])
    assert exp.algorithm.stack_key(state, task) is None


def test_runs_of_other_local_work_or_methods_do_not_meet() -> None:
    found = set()
    for extra in ([], ["algorithm.personal_lr=0.03"], ["algorithm.local_steps=2"]):
        exp, state, task = start([*BASE, *extra])
        found.add(exp.algorithm.stack_key(state, task))
    exp, state, task = start([*BASE, "algorithm.name=fedavg"])
    found.add(exp.algorithm.stack_key(state, task))
    assert len(found) == 4 and None not in found


def test_a_lockstep_batch_of_ditto_stacks_its_rounds(tmp_path: Path) -> None:
    base = [*TINY, "rounds=3", "eval_every=1", "checkpoint_every=1", *BASE[len(TINY) :]]
    report = lockstep_writes_the_sequential_files(base, "algorithm.lam=0.1,0.5", [0, 1], tmp_path)
    assert report.stacked_rounds > 0
