"""The centralized reference's round on a batch of runs (runs as rows): S runs' models trained as S
rows of one batched model give each run, bit for bit, what the round gives it alone — its model,
summed loss, trained samples, its generator's state after its draws — each with its own step
size, and nothing crosses a run's row (planted crossings of step sizes, rows or data are caught);
a lockstep sweep batch of centralized runs stacks its rounds and writes what the runs write one
after another."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from fedhp.algorithms import centralized
from fedhp.algorithms.task import Task
from fedhp.build import build_experiment
from fedhp.config import resolve_config
from fedhp.engine import run_rows
from fedhp.engine.experiment import MODEL_SEED_OFFSET
from tests.algorithms.stacked_runs import (
    TINY,
    Started,
    alone,
    lockstep_writes_the_sequential_files,
    same,
    stacked,
)

BASE = [*TINY, "algorithm.name=centralized", "algorithm.local_steps=3"]

# a grid's order (its points, each over the seeds): the GPU form steps each point's block at once
RUNS = [[f"seed={s}", f"algorithm.lr={lr}"] for lr in (0.05, 0.02) for s in range(2)]
SAME_LR = [[f"seed={s}"] for s in range(3)]


def _start(overrides: Sequence[str]) -> Started:
    """A run's experiment, its state after round 0 trained alone, and its second round's (empty)
    task."""
    keys = {o.split("=")[0] for o in overrides}
    base = [o for o in BASE if not ("model.name" in keys and o.startswith("model.hidden"))]
    exp = build_experiment(resolve_config(None, [*base, *overrides]))
    state = exp.algorithm.init_state(exp.model.init_params(exp.cfg.seed + MODEL_SEED_OFFSET))
    exp.ctx.begin_round(0)
    exp.algorithm.run_round(state, 0)
    exp.ctx.begin_round(1)
    return exp, state, Task(torch.zeros(0, dtype=torch.int64))


def _outcome(exp: Any, state: dict[str, torch.Tensor], update: Any) -> dict[str, Any]:
    return {
        "global": state["global"].clone(),
        "losses": update.losses,
        "trained": exp.model.trained_samples,
        "generator": exp.ctx.generator.get_state(),
    }


def _alone(runs: list[list[str]], extra: list[str]) -> list[dict[str, Any]]:
    return alone([[*r, *extra] for r in runs], _outcome, _start)


def _stacked(runs: list[list[str]], extra: list[str]) -> list[dict[str, Any]]:
    return stacked([[*r, *extra] for r in runs], _outcome, _start)


EXTRAS = [
    [],
    ["partition.train_per_class=5"],  # a pooled minibatch larger than the data: with replacement
    ["federation.num_clients=5", "federation.num_edges=1"],  # another pooled minibatch size
    ["model.name=mlr"],  # a hand-batched linear model
]


@pytest.mark.parametrize("extra", EXTRAS, ids=["plain", "replacement", "5-clients", "mlr"])
@pytest.mark.parametrize("runs", [RUNS, SAME_LR], ids=["lr-per-run", "one-lr"])
@pytest.mark.parametrize("gather", [False, True], ids=["cpu-form", "gpu-form"])
def test_each_run_of_a_stack_gets_what_it_gets_alone(
    runs: list[list[str]], extra: list[str], gather: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(centralized, "gathers", lambda device: gather)
    for one, both in zip(_alone(runs, extra), _stacked(runs, extra), strict=True):
        same(one, both)


def test_the_runs_differ() -> None:
    """(The premise of the comparisons: the runs' models and data differ.)"""
    (a, sa, _), (b, sb, _) = [_start(r) for r in SAME_LR[:2]]
    assert not torch.equal(sa["global"], sb["global"])
    assert not torch.equal(a.ctx.fed.train.x, b.ctx.fed.train.x)


def _caught(runs: list[list[str]] | None = None) -> None:
    runs = runs or RUNS
    alone = _alone(runs, [])
    with pytest.raises(AssertionError):
        for a, b in zip(alone, _stacked(runs, []), strict=True):
            same(a, b)


@pytest.mark.parametrize("gather", [False, True])
def test_a_crossing_of_step_sizes_is_caught(gather: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Plant a crossing: each run's row stepped with the next run's lr. Caught."""
    monkeypatch.setattr(centralized, "gathers", lambda device: gather)
    real = centralized._descend

    def next_lr(params: torch.Tensor, grad: torch.Tensor, lrs: list[float]) -> None:
        real(params, grad, lrs[1:] + lrs[:1])

    monkeypatch.setattr(centralized, "_descend", next_lr)
    _caught()


def test_a_crossing_of_rows_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plant a crossing: each run handed the next run's row back. Caught."""
    real = centralized._descend

    def rolled(params: torch.Tensor, grad: torch.Tensor, lrs: list[float]) -> None:
        real(params, grad, lrs)
        params.copy_(params.roll(1, 0))

    monkeypatch.setattr(centralized, "_descend", rolled)
    _caught(SAME_LR)


def test_a_draw_from_another_runs_data_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plant a crossing in the stacked gather (each run's samples read from the next run's data):
    caught."""
    real = run_rows.StackedData.of

    def shifted(contexts: Any) -> run_rows.StackedData:
        data = real(contexts)
        return run_rows.StackedData(data.x, data.y, data.starts[1:] + data.starts[:1])

    monkeypatch.setattr(run_rows.StackedData, "of", shifted)
    monkeypatch.setattr(run_rows, "_LAST", [])
    _caught(SAME_LR)


@pytest.mark.parametrize(
    "extra",
    [
        ["algorithm.clip_grad_norm=1.0"],
        ["model.name=cnn"],
        ["model.name=vgg", "model.cfg=[4,M,8,M]", "model.batch_norm=true"],
    ],
    ids=["clipping", "vmapped-conv", "batchnorm"],
)
def test_rounds_it_does_not_cover_train_alone(extra: list[str]) -> None:
    """Gradient clipping, a model whose one row may compute apart from several (vmap'ed
    convolutions), BatchNorm: no stack key (the run trains alone)."""
    exp, state, task = _start(extra)
    assert exp.algorithm.round_key(state) is None


@pytest.mark.parametrize("extra", [["model.name=cnn"], ["model.name=cnn2"]])
def test_a_lone_row_of_a_vmapped_conv_model_is_apart(extra: list[str]) -> None:
    """(Why those train alone: a vmap'ed convolution computes one row with other kernels than
    several; stacked anyway, the runs come out apart.)"""
    started = [_start([*r, *extra]) for r in SAME_LR]
    items = [(exp.algorithm, state, task) for exp, state, task in started]
    centralized.fused_train(items)
    alone = _alone(SAME_LR, extra)
    assert any(
        not torch.equal(a["global"], state["global"])
        for a, (_, state, _) in zip(alone, started, strict=True)
    )


def test_runs_of_other_work_do_not_meet() -> None:
    """Another step count or pooled minibatch size: another key; lr and seed do not split it."""
    found = set()
    for extra in ([], ["algorithm.local_steps=2"], ["algorithm.batch_size=10"]):
        exp, state, task = _start(extra)
        found.add(exp.algorithm.round_key(state))
    assert len(found) == 3 and None not in found
    exp, state, task = _start(["algorithm.lr=0.3", "seed=4"])
    assert exp.algorithm.round_key(state) in found


def test_a_lockstep_batch_of_centralized_stacks_its_rounds(tmp_path: Path) -> None:
    """Centralized lr ∈ {0.05, 0.02} × 2 seeds in lockstep: the rounds train stacked, and every
    run writes what it writes in the batch run one after another."""
    base = [*TINY, "rounds=3", "eval_every=1", "checkpoint_every=1", *BASE[len(TINY) :]]
    report = lockstep_writes_the_sequential_files(base, "algorithm.lr=0.05,0.02", [0, 1], tmp_path)
    assert report.stacked_rounds > 0
