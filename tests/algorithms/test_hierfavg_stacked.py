"""HierFAVG's stacked edge rounds (runs as rows): S runs trained as one give each run, bit for
bit, what its ``train`` gives it alone — the edges' models, losses, ledger, trained samples, the
generator's state after its draws — and nothing crosses a run's rows (planted crossings are
caught); a lockstep sweep batch stacks its rounds and writes what the runs write one after
another."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from fedhp.algorithms import hierfavg_stacked
from fedhp.algorithms.hierfavg_stacked import stack_key
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
    base = [o for o in BASE if not (other_model and o.startswith("model.hidden"))]
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
        CNN,
    ],
)
def test_each_run_of_a_stack_gets_what_it_gets_alone(extra: list[str]) -> None:
    _same_all(alone(_runs(RUNS, extra), _outcome), stacked(_runs(RUNS, extra), _outcome))


def test_runs_sharing_lr_make_one_model_call() -> None:
    """Consecutive runs of one lr are one group of rows (one model call per part and step)."""
    runs = [
        SimpleNamespace(algo=start(r)[0].algorithm, rows=slice(6 * s, 6 * s + 6))
        for s, r in enumerate(_runs(RUNS, []))
    ]
    assert hierfavg_stacked.lr_groups(runs) == [(0, 12, 0.05), (12, 18, 0.1)]  # type: ignore[arg-type]


def test_a_crossing_between_runs_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plant crossings: each run's rows stepped at the next run's lr, its clients aggregated
    into the next run's edges, or the next run's edges handed back. The comparison above must
    see each."""
    runs = _runs(APART, [])
    one = alone(runs, _outcome)
    real_groups, real_edges, real_finish = (
        hierfavg_stacked.lr_groups,
        hierfavg_stacked.edge_rows_of,
        hierfavg_stacked._finish,
    )

    def next_runs_lr(stack: Any) -> list[tuple[int, int, float]]:
        groups = real_groups(stack)
        lrs = [lr for _, _, lr in groups]
        return [(a, b, lr) for (a, b, _), lr in zip(groups, lrs[1:] + lrs[:1], strict=True)]

    def next_runs_edges(stack: Any) -> torch.Tensor:
        edges = sum(r.edge_rows.stop - r.edge_rows.start for r in stack)
        return (real_edges(stack) + stack[0].edge_rows.stop) % edges

    def next_runs_model(run: Any, w_edge: torch.Tensor, *rest: Any) -> Any:
        n = run.edge_rows.stop - run.edge_rows.start
        begin = (run.edge_rows.start + n) % w_edge.shape[0]
        run.edge_rows = slice(begin, begin + n)
        return real_finish(run, w_edge, *rest)

    for module, name, crossed in [
        (hierfavg_stacked, "lr_groups", next_runs_lr),
        (hierfavg_stacked, "edge_rows_of", next_runs_edges),
        (hierfavg_stacked, "_finish", next_runs_model),
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
    assert stack_key(exp.algorithm, state, task) is None
    assert exp.algorithm.stack_key(state, task) is None


def test_a_lockstep_batch_stacks_its_rounds_and_writes_the_sequential_files(
    tmp_path: Path,
) -> None:
    """2 lr × 2 seeds of HierFAVG in lockstep: the rounds meet whole (stacked) and every run's
    files are byte for byte those of the runs one after another."""
    base = [*BASE, "rounds=2", "eval_every=1", "checkpoint_every=1"]
    report = lockstep_writes_the_sequential_files(base, "algorithm.lr=0.05,0.1", [0, 1], tmp_path)
    assert report.stacked_rounds > 0
