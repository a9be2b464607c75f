"""sFedHP's stacked round (runs as rows): S runs trained as one round give each run, bit for bit,
what its fused round gives it alone — state, update, ledger, trained samples — and nothing
crosses a run's rows (a planted crossing is caught)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from fedhp.algorithms import sfedhp_stacked
from fedhp.algorithms.sfedhp_stacked import stack_key, stacked_train
from fedhp.build import build_experiment
from fedhp.config import resolve_config
from fedhp.engine import run_rows
from fedhp.engine.experiment import MODEL_SEED_OFFSET

BASE = [
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
    "algorithm.name=sfedhp",
    "algorithm.K=2",
    "algorithm.R=3",
]

# Each run: its seed and its λ (λ = 20 with lr 0.05 makes lr·λ1 = 1: the step lands on the
# centre, the fused round's copy path); run 3 has λ1 ≠ λ2 (another upload mix weight).
RUNS = [
    ["seed=0", "algorithm.lam=15"],
    ["seed=1", "algorithm.lam=20"],
    ["seed=2", "algorithm.lam=25"],
]
MIXED = [["seed=3", "algorithm.lam1=10", "algorithm.lam2=30"]]


def _start(overrides: list[str]) -> tuple[Any, dict[str, torch.Tensor], Any]:
    """A run's experiment, initial state and first round's task."""
    exp = build_experiment(resolve_config(None, [*BASE, *overrides]))
    init = exp.model.init_params(exp.cfg.seed + MODEL_SEED_OFFSET)
    state = exp.algorithm.init_state(init)
    exp.ctx.begin_round(0)
    return exp, state, exp.algorithm.plan(state, 0)


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
    out = []
    for overrides in runs:
        exp, state, task = _start([*overrides, *extra])
        out.append(_outcome(exp, state, exp.algorithm.train(state, task)))
    return out


def _stacked(runs: list[list[str]], extra: list[str]) -> list[dict[str, Any]]:
    started = [_start([*overrides, *extra]) for overrides in runs]
    keys = {stack_key(exp.algorithm, state, task) for exp, state, task in started}
    assert len(keys) == 1 and None not in keys
    updates = stacked_train([(exp.algorithm, state, task) for exp, state, task in started])
    return [
        _outcome(exp, state, update)
        for (exp, state, _), update in zip(started, updates, strict=True)
    ]


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    for key in ("theta", "edge", "w", "losses"):
        assert torch.equal(a[key], b[key]), key
    assert a["ledger"] == b["ledger"] and a["trained"] == b["trained"]


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
    for alone, stacked in zip(
        _alone(RUNS + MIXED, extra), _stacked(RUNS + MIXED, extra), strict=True
    ):
        _same(alone, stacked)


def test_the_gpu_form_gathers_the_same_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU's form (each part's centres gathered, one pull per layer with per-row weights)
    computes the same bits as the CPU's edge-by-edge pull."""
    real = sfedhp_stacked._ThetaSteps.of

    def gathered(*args: Any) -> sfedhp_stacked._ThetaSteps:
        steps = real(*args)
        steps.gather = True
        return steps

    monkeypatch.setattr(sfedhp_stacked._ThetaSteps, "of", gathered)
    for alone, stacked in zip(_alone(RUNS, []), _stacked(RUNS, []), strict=True):
        _same(alone, stacked)


def test_a_crossing_between_runs_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plant crossings: each run given the next run's λ, or the next run's rows back. The
    comparison above must see them."""
    alone = _alone(RUNS, [])
    real_rows = sfedhp_stacked.per_row

    def next_runs_values(values: list[float], sizes: list[int], like: torch.Tensor) -> Any:
        return real_rows(values[1:] + values[:1], sizes, like)

    monkeypatch.setattr(sfedhp_stacked, "per_row", next_runs_values)
    with pytest.raises(AssertionError):
        for a, b in zip(alone, _stacked(RUNS, []), strict=True):
            _same(a, b)
    monkeypatch.undo()
    real_finish = sfedhp_stacked._finish

    def next_runs_rows(run: Any, theta: torch.Tensor, *rest: Any) -> Any:
        c = run.rows.stop - run.rows.start
        run.rows = slice(
            (run.rows.start + c) % theta.shape[0], (run.rows.start + c) % theta.shape[0] + c
        )
        return real_finish(run, theta, *rest)

    monkeypatch.setattr(sfedhp_stacked, "_finish", next_runs_rows)
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
    assert stack_key(exp.algorithm, state, task) is None
    assert exp.algorithm.stack_key(state, task) is None


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
