"""sFedHP's round on a batch of runs (runs as rows): S runs trained as one round give each run,
bit for bit, what the round gives it alone — state, update, ledger, trained samples — and nothing
crosses a run's rows (a planted crossing is caught)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from fedhp.algorithms.sfedhp import round_key
from fedhp.engine import run_rows
from fedhp.engine.graphs import Rerun, StepGraphs
from fedhp.engine.run_rows import RunBlocks
from tests.algorithms.stacked_runs import TINY, Started, alone, same, stacked, start

BASE = [*TINY, "algorithm.name=sfedhp", "algorithm.K=2", "algorithm.R=3"]

# Each run: its seed and its λ (λ = 20 with lr 0.05 makes lr·λ1 = 1: the step lands on the
# centre, the fused round's copy path); run 3 has λ1 ≠ λ2 (another upload mix weight).
RUNS = [
    ["seed=0", "algorithm.lam=15"],
    ["seed=1", "algorithm.lam=20"],
    ["seed=2", "algorithm.lam=25"],
]
MIXED = [["seed=3", "algorithm.lam1=10", "algorithm.lam2=30"]]


def _start(overrides: list[str]) -> Started:
    return start([*BASE, *overrides])


def _outcome(exp: Any, state: dict[str, torch.Tensor], update: Any) -> dict[str, Any]:
    return {
        "theta": state["theta"].clone(),
        "edge": state["edge"].clone(),
        "w": update.per_edge["w"],
        "losses": update.losses,
        "ledger": exp.ctx.ledger.totals(),
        "trained": exp.model.trained_samples,
    }


def _alone(runs: list[list[str]], extra: list[str]) -> list[dict[str, Any]]:
    return alone([[*BASE, *r, *extra] for r in runs], _outcome)


def _stacked(runs: list[list[str]], extra: list[str]) -> list[dict[str, Any]]:
    return stacked([[*BASE, *r, *extra] for r in runs], _outcome)


_same = same


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["federation.weighting=samples"],  # per-client upload weights
        ["comm.zero_threshold=0.001"],  # truncation on every link
        ["algorithm.theta_init=warm"],
        ["algorithm.theta_init=reset"],
        ["federation.num_edges=3", "federation.edges_per_round=2"],  # edges sampled per run
        ["engine.clients_per_chunk=4"],  # parts that span two runs
        ["federation.sampling=with_replacement"],  # each run draws alone
    ],
)
def test_each_run_of_a_stack_gets_what_it_gets_alone(extra: list[str]) -> None:
    for one, both in zip(_alone(RUNS + MIXED, extra), _stacked(RUNS + MIXED, extra), strict=True):
        _same(one, both)


@pytest.mark.parametrize("extra", [[], ["engine.clients_per_chunk=4"]])
def test_the_gpu_form_gathers_the_same_values(
    extra: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GPU's form (each part's centres gathered, one pull per layer with per-row weights)
    computes the same bits as the CPU's edge-by-edge pull."""
    monkeypatch.setattr(run_rows, "GATHER_ON_CPU", True)
    for one, both in zip(_alone(RUNS + MIXED, extra), _stacked(RUNS + MIXED, extra), strict=True):
        _same(one, both)


def plant_next_runs_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """A planted crossing: each run's per-row and per-edge values (λ) are the next run's."""
    real = RunBlocks.column

    def next_runs_values(self: RunBlocks, values: list[float], like: torch.Tensor) -> Any:
        return real(self, values[1:] + values[:1], like)

    monkeypatch.setattr(RunBlocks, "column", next_runs_values)


def test_a_crossing_between_runs_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plant crossings: each run given the next run's λ (in the CPU's and the GPU's form), or
    the next run's rows back. The comparison above must see them."""
    alone = _alone(RUNS, [])
    for gather in (False, True):
        plant_next_runs_values(monkeypatch)
        monkeypatch.setattr(run_rows, "GATHER_ON_CPU", gather)
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
        ["algorithm.gamma1=0.001"],
        ["algorithm.inner=nesterov"],
        ["faults.attack.name=sign_flip", "faults.attack.fraction=0.2"],
        ["robust.edge.name=median"],
    ],
)
def test_rounds_it_does_not_cover_train_alone(extra: list[str]) -> None:
    """Sparse penalties, the Nesterov solver, an attack on the uploads or a robust edge rule:
    no stack key (the run trains alone)."""
    exp, state, task = _start(extra)
    assert round_key(exp.algorithm, task) is None


def test_the_runs_draw_their_minibatches_as_one_where_they_can() -> None:
    """Without replacement and with every client holding a minibatch, the runs' draws are one
    (:mod:`fedhp.engine.run_rows`); with replacement each run draws alone."""
    together = [_start(overrides)[0].ctx for overrides in RUNS]
    assert run_rows.stacks(together, 20)
    assert not run_rows.stacks(together, 10_000)  # a minibatch larger than a client
    apart = [_start([*o, "federation.sampling=with_replacement"])[0].ctx for o in RUNS]
    assert not run_rows.stacks(apart, 20)


def test_a_draw_from_another_runs_data_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plant a crossing in the stacked draw (each run's samples read from the next run's
    data): the comparison with the runs alone must see it."""
    alone = _alone(RUNS, [])
    real = run_rows.StackedData.of

    def shifted(contexts: Any) -> run_rows.StackedData:
        data = real(contexts)
        return run_rows.StackedData(data.x, data.y, data.starts[1:] + data.starts[:1])

    monkeypatch.setattr(run_rows.StackedData, "of", shifted)
    monkeypatch.setattr(run_rows, "_LAST", [])
    with pytest.raises(AssertionError):
        for a, b in zip(alone, _stacked(RUNS, []), strict=True):
            _same(a, b)


def test_the_gpu_form_replayed_from_graphs_gives_each_run_its_bits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The GPU form's θ steps through the CUDA-graph bookkeeping (``engine.cuda_graphs`` in a
    lockstep batch: every argument copied into the graph's static tensors, θ and the loss
    copied back; replayed with :class:`~fedhp.engine.graphs.Rerun`, which computes what a
    replay computes) give each run what it gets alone, bit for bit, including parts that span
    two runs; one capture for every part of the same shapes, replayed for each part of every
    local round after."""
    monkeypatch.setattr(run_rows, "GATHER_ON_CPU", True)
    made: list[Rerun] = []

    def make() -> Rerun:
        made.append(Rerun())
        return made[-1]

    graphs = StepGraphs(stacked=True, make=make)

    def begin(overrides: Any) -> Started:
        exp, state, task = start(overrides)
        exp.ctx.graphs = graphs
        return exp, state, task

    for extra, parts in (([], 1), (["engine.clients_per_chunk=4"], 6)):  # 24 rows
        made.clear()
        graphs.graphs.clear()
        graphs.replays = 0
        runs = [[*BASE, *r, *extra] for r in RUNS + MIXED]
        for one, both in zip(alone(runs, _outcome), stacked(runs, _outcome, begin), strict=True):
            _same(one, both)
        assert len(made) == 1 and not graphs.eager
        assert graphs.replays == 3 * parts  # R = 3 local rounds
