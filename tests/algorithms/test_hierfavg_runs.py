"""HierFAVG's edge rounds over a batch of runs (runs as rows, :class:`EdgeRounds` with several
items): S runs trained as one give each run, bit for bit, what its ``train`` gives it alone —
the edges' models, losses, ledger, trained samples, the generator's state after its draws — and
nothing crosses a run's rows (planted crossings are caught); a lockstep sweep batch stacks its
rounds and writes what the runs write one after another."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from fedhp.algorithms import edge_rounds
from fedhp.algorithms.edge_rounds import EdgeRounds
from fedhp.engine import local_rows
from fedhp.engine.edges import EdgeBatch
from fedhp.engine.local_rows import RunRows
from tests.algorithms.stacked_runs import (
    TINY,
    alone,
    lockstep_writes_the_sequential_files,
    same,
    stacked,
    start,
)

BASE = [*TINY, "algorithm.name=hierfavg", "algorithm.kappa1=2", "algorithm.kappa2=3"]

# An lr grid over seeds: runs 0 and 1 share lr (one model call for both), run 2 has its own.
RUNS = [
    ["seed=0", "algorithm.lr=0.05"],
    ["seed=1", "algorithm.lr=0.05"],
    ["seed=2", "algorithm.lr=0.1"],
]
# Each run its own lr (a crossing of values shows).
APART = [["seed=0", "algorithm.lr=0.03"], ["seed=1", "algorithm.lr=0.1"]]


def _outcome(exp: Any, state: dict[str, torch.Tensor], update: Any) -> dict[str, Any]:
    return {
        "model": update.per_edge["model"].clone(),
        "losses": update.losses,
        "ledger": exp.ctx.ledger.totals(),
        "trained": exp.model.trained_samples,
        "generator": exp.ctx.sampler.generator.get_state(),
    }


CNN = ["model.name=vgg", "model.cfg=[4,M,8,M]"]  # a model whose step is the generic autograd's


def _runs(runs: list[list[str]], extra: list[str]) -> list[list[str]]:
    other_model = any(o.startswith("model.name") for o in extra)
    other_split = any(o.startswith("partition.name") for o in extra)
    base = [o for o in BASE if not (other_model and o.startswith("model.hidden"))]
    base = [o for o in base if not (other_split and o.startswith("partition."))]
    return [[*base, *r, *extra] for r in runs]


def _same_all(one: list[dict[str, Any]], both: list[dict[str, Any]]) -> None:
    for a, b in zip(one, both, strict=True):
        same(a, b)


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["federation.weighting=samples"],  # per-client upload weights
        ["comm.zero_threshold=0.001"],  # truncation on both client-edge links
        ["federation.num_edges=3", "federation.edges_per_round=2"],  # edges sampled per run
        ["engine.clients_per_chunk=4"],  # parts that span two runs, drawn ahead
        ["federation.sampling=with_replacement"],  # each run draws alone
        ["faults.straggler=0.3", "faults.client_dropout=0.2"],  # stragglers only receive
        ["robust.cloud.name=median"],  # a cloud rule: alone a whole round, in a batch the fold
        # noise drawn at every access (while gathering): each run draws alone
        ["partition.name=feature_noise", "partition.noise=0.1", "partition.resample=true"],
        CNN,
    ],
)
def test_each_run_of_a_stack_gets_what_it_gets_alone(extra: list[str]) -> None:
    _same_all(alone(_runs(RUNS, extra), _outcome), stacked(_runs(RUNS, extra), _outcome))


def test_runs_sharing_lr_make_one_model_call() -> None:
    """Consecutive runs of one lr are one group of rows (one model call per part and step)."""
    runs = [
        RunRows(exp.ctx, 6 * s, 6 * s + 6, exp.algorithm.options.lr)
        for s, (exp, _, _) in enumerate(start(r) for r in _runs(RUNS, []))
    ]
    assert local_rows.lr_groups(runs, 0, 18) == [(0, 12, 0.05), (12, 18, 0.1)]
    assert local_rows.lr_groups(runs, 8, 14) == [(8, 12, 0.05), (12, 14, 0.1)]


def test_a_crossing_between_runs_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plant crossings: each run's rows stepped at the next run's lr, its clients aggregated
    into the next run's edges, or the next run's edges handed back. The comparison above must
    see each."""
    runs = _runs(APART, [])
    one = alone(runs, _outcome)
    real_groups, real_batch, real_updates = (
        local_rows.lr_groups,
        edge_rounds.edge_batch,
        EdgeRounds.updates,
    )

    def next_runs_lr(stack: Any, a: int, b: int) -> list[tuple[int, int, float]]:
        groups = real_groups(stack, a, b)
        lrs = [lr for _, _, lr in groups]
        return [(lo, hi, lr) for (lo, hi, _), lr in zip(groups, lrs[1:] + lrs[:1], strict=True)]

    def next_runs_edges(items: Any) -> EdgeBatch:
        batch = real_batch(items)
        bounds = batch.edges.bounds
        return dataclasses.replace(batch, edge_of=(batch.edge_of + bounds[1]) % bounds[-1])

    def next_runs_model(rounds: EdgeRounds, losses: torch.Tensor) -> Any:
        updates = real_updates(rounds, losses)
        models = [u.per_edge["model"] for u in updates]
        for update, model in zip(updates, models[1:] + models[:1], strict=True):
            update.per_edge["model"] = model
        return updates

    for module, name, crossed in [
        (local_rows, "lr_groups", next_runs_lr),
        (edge_rounds, "edge_batch", next_runs_edges),
        (EdgeRounds, "updates", next_runs_model),
    ]:
        monkeypatch.setattr(module, name, crossed)
        with pytest.raises(AssertionError):
            _same_all(one, stacked(runs, _outcome))
        monkeypatch.undo()
    _same_all(one, stacked(runs, _outcome))  # (and without them, equal)


@pytest.mark.parametrize(
    "extra",
    [
        ["faults.attack.name=sign_flip", "faults.attack.fraction=0.2"],
        ["robust.edge.name=median"],
        ["privacy.enabled=true", "privacy.where=edge", "privacy.clip_norm=0.5"],
        ["algorithm.client_momentum=0.5"],
        [*CNN, "model.batch_norm=true"],
    ],
)
def test_rounds_it_does_not_cover_train_alone(extra: list[str]) -> None:
    """An attack, a robust or DP rule at the edges, client momentum, BatchNorm statistics: no
    stack key."""
    exp, state, task = start(_runs([[]], extra)[0])
    assert exp.algorithm.round_key(task) is None


def test_a_lockstep_batch_stacks_its_rounds_and_writes_the_sequential_files(
    tmp_path: Path,
) -> None:
    """2 lr × 2 seeds of HierFAVG in lockstep: the rounds meet whole (stacked) and every run's
    files are byte for byte those of the runs one after another."""
    base = [*BASE, "rounds=2", "eval_every=1", "checkpoint_every=1"]
    report = lockstep_writes_the_sequential_files(base, "algorithm.lr=0.05,0.1", [0, 1], tmp_path)
    assert report.stacked_rounds > 0
