"""Helpers of the runs-as-rows tests (``test_*_stacked.py``): a tiny MNIST federation, runs
started at round 0, the comparison of runs trained alone and stacked, and a lockstep sweep batch
checked against the same batch run one after another."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from fedhp.build import build_experiment
from fedhp.config import resolve_config
from fedhp.engine.experiment import MODEL_SEED_OFFSET
from fedhp.sweep.execute import BatchReport, run_batch
from fedhp.sweep.grid import parse_grid, points_of
from fedhp.sweep.lockstep import train_together
from fedhp.sweep.plan import plan_runs

TINY = [
    "progress=false",
    "threads=1",
    "subsample.train=600",
    "subsample.test=300",
    "partition.train_per_class=30",
    "partition.test_per_class=15",
    "federation.num_clients=6",
    "federation.num_edges=2",
    "model.name=dnn",
    "model.hidden=[12]",
]
"""6 clients under 2 edges, a DNN 784-12-10 on 600 MNIST images: a round in milliseconds."""

Started = tuple[Any, dict[str, torch.Tensor], Any]
Outcome = Callable[[Any, dict[str, torch.Tensor], Any], dict[str, Any]]


def start(overrides: Sequence[str]) -> Started:
    """A run's experiment, initial state and first round's task."""
    exp = build_experiment(resolve_config(None, list(overrides)))
    init = exp.model.init_params(exp.cfg.seed + MODEL_SEED_OFFSET)
    state = exp.algorithm.init_state(init)
    exp.ctx.begin_round(0)
    return exp, state, exp.algorithm.plan(state, 0)


Begin = Callable[[Sequence[str]], Started]
"""How a run is brought to the round compared (default :func:`start`: its first round)."""


def alone(
    runs: Sequence[Sequence[str]], outcome: Outcome, begin: Begin = start
) -> list[dict[str, Any]]:
    """Each run's round trained by its own ``train``."""
    out = []
    for overrides in runs:
        exp, state, task = begin(overrides)
        out.append(outcome(exp, state, exp.algorithm.train(state, task)))
    return out


def stacked(
    runs: Sequence[Sequence[str]], outcome: Outcome, begin: Begin = start
) -> list[dict[str, Any]]:
    """The runs' rounds trained as one: each run's own ``train`` in one lockstep batch, where
    they must meet as ONE call of their method's round (``ctx.together``, equal keys)."""
    started = [begin(overrides) for overrides in runs]
    items = [(exp.algorithm, state, task) for exp, state, task in started]
    updates, batch = train_together(items)
    assert batch.stacked_rounds == 1 and batch.single_calls == 0, "the rounds did not meet"
    return [
        outcome(exp, state, update)
        for (exp, state, _), update in zip(started, updates, strict=True)
    ]


def same(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Two outcomes equal bit for bit (tensors by ``torch.equal``, the rest by ``==``)."""
    assert a.keys() == b.keys()
    for key, value in a.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, b[key]), key
        else:
            assert value == b[key], key


def run_files(folder: Path) -> dict[str, bytes]:
    """Every run's metrics.csv and per_client.csv under ``folder``, by relative path."""
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.name in ("metrics.csv", "per_client.csv")
    }


def lockstep_writes_the_sequential_files(
    base: list[str], grid: str, seeds: list[int], folder: Path
) -> BatchReport:
    """The batch of ``grid`` × ``seeds`` run one after another and in lockstep: every run's
    files byte for byte the same; the lockstep report."""
    points = points_of(parse_grid([grid]))
    one = run_batch(plan_runs(base, points, seeds, folder / "alone"), "sequential")
    two = run_batch(plan_runs(base, points, seeds, folder / "fused"), "lockstep")
    assert one.batching == "sequential" and two.batching == "lockstep"
    a, b = run_files(folder / "alone"), run_files(folder / "fused")
    assert len(a) >= 2 * len(points) * len(seeds) and a.keys() == b.keys()
    for name in a:
        assert a[name] == b[name], name
    return two


def next_runs_rows(finish: Callable[..., Any]) -> Callable[..., Any]:
    """A planted crossing: a stacked module's ``_finish(run, theta, ...)`` handed the block of
    rows of the NEXT run (the last run the first's)."""

    def crossed(run: Any, theta: torch.Tensor, *rest: Any) -> Any:
        c = run.rows.stop - run.rows.start
        begin = (run.rows.start + c) % theta.shape[0]
        run.rows = slice(begin, begin + c)
        return finish(run, theta, *rest)

    return crossed
