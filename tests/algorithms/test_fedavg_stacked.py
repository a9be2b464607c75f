"""FedAvg's and FedProx's stacked round (runs as rows): S runs trained as one local SGD give each
run, bit for bit, what its ``train`` gives it alone — update, trained samples, the generator's
state after its draws — part by part, and nothing crosses a run's rows (a planted crossing is
caught); a lockstep sweep batch of FedProx runs stacks its rounds and writes what the runs write
one after another."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from fedhp.algorithms import fedavg_stacked
from fedhp.engine import run_rows
from tests.algorithms.stacked_runs import (
    TINY,
    lockstep_writes_the_sequential_files,
    next_runs_rows,
    same,
    start,
)

BASE = [*TINY, "algorithm.local_steps=3"]

FEDAVG = [["algorithm.name=fedavg", f"seed={s}"] for s in range(3)]
# FedProx across seeds × μ (μ = 20 with lr 0.05 makes lr·μ = 1: the pull lands on the centre)
FEDPROX = [
    ["algorithm.name=fedprox", f"seed={s}", f"algorithm.mu={mu}"]
    for s in range(2)
    for mu in (0.01, 0.1, 20.0)
]
SAME_MU = [["algorithm.name=fedprox", f"seed={s}", "algorithm.mu=0.1"] for s in range(3)]

Started = tuple[Any, dict[str, torch.Tensor], list[Any]]  # (its task in parts)


def _start(overrides: list[str]) -> Started:
    """A run's experiment, initial state and the parts of its first round's task (one, or
    several under ``engine.clients_per_chunk``, their minibatches drawn ahead)."""
    keys = {o.split("=")[0] for o in overrides}
    dropped = {"algorithm.local_steps"} if "algorithm.local_epochs" in keys else set()
    dropped |= {"model.hidden"} if "model.name" in keys else set()
    base = [o for o in BASE if o.split("=")[0] not in dropped]
    exp, state, task = start([*base, *overrides])
    return exp, state, exp.algorithm.round_parts(task)


def _outcome(exp: Any, updates: list[Any]) -> dict[str, Any]:
    return {
        "model": torch.cat([u.per_client["model"] for u in updates]),
        "losses": torch.cat([u.losses for u in updates], 1),
        "steps": torch.cat([u.steps for u in updates]),
        "trained": exp.model.trained_samples,
        "generator": exp.ctx.sampler.generator.get_state(),
        "ledger": exp.ctx.ledger.totals(),
    }


def _alone(runs: list[list[str]], extra: list[str]) -> list[dict[str, Any]]:
    out = []
    for overrides in runs:
        exp, state, parts = _start([*overrides, *extra])
        out.append(_outcome(exp, [exp.algorithm.train(state, part) for part in parts]))
    return out


def _stacked(runs: list[list[str]], extra: list[str]) -> list[dict[str, Any]]:
    started = [_start([*overrides, *extra]) for overrides in runs]
    counts = {len(parts) for _, _, parts in started}
    assert len(counts) == 1
    updates: list[list[Any]] = [[] for _ in started]
    for k in range(counts.pop()):  # each run's k-th part meets the others' k-th
        items = [(exp.algorithm, state, parts[k]) for exp, state, parts in started]
        keys = {algo.stack_key(state, task) for algo, state, task in items}
        assert len(keys) == 1 and None not in keys
        for mine, update in zip(updates, type(items[0][0]).stacked_train(items), strict=True):
            mine.append(update)
    return [_outcome(exp, u) for (exp, _, _), u in zip(started, updates, strict=True)]


_same = same


EXTRAS = [
    [],
    ["federation.weighting=samples"],  # per-client upload weights
    ["federation.client_fraction=0.5"],  # each run its own clients
    ["engine.clients_per_chunk=4"],  # the round in parts; stacked parts that span two runs
    ["engine.clients_per_chunk=4", "federation.sampling=with_replacement"],  # (drawn ahead)
    ["federation.sampling=with_replacement"],  # each run draws alone
    ["comm.zero_threshold=0.001"],  # truncation on the links
    ["faults.client_dropout=0.3"],  # blocks of unequal sizes
    ["faults.attack.name=sign_flip", "faults.attack.fraction=0.2"],  # (forged at the cloud)
]


@pytest.mark.parametrize("extra", EXTRAS)
@pytest.mark.parametrize("runs", [FEDAVG, FEDPROX], ids=["fedavg", "fedprox"])
def test_each_run_of_a_stack_gets_what_it_gets_alone(
    runs: list[list[str]], extra: list[str]
) -> None:
    for alone, stacked in zip(_alone(runs, extra), _stacked(runs, extra), strict=True):
        _same(alone, stacked)


def test_the_round_is_trained_in_parts_where_asked() -> None:
    """(The premise of the ``clients_per_chunk`` cases above: the round comes in parts.)"""
    _, _, parts = _start([*FEDAVG[0], "engine.clients_per_chunk=4"])
    assert len(parts) == 2 and isinstance(parts[0].batches, torch.Tensor)


@pytest.mark.parametrize("runs", [FEDPROX, SAME_MU], ids=["mu-per-run", "one-mu"])
def test_the_gpu_form_gathers_the_same_values(
    runs: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GPU's form (each part's centres gathered, one pull per layer with per-row weights)
    computes the same bits as the CPU's run-by-run pull."""
    real = fedavg_stacked._Pull.of

    def gathered(*args: Any) -> fedavg_stacked._Pull:
        pull = real(*args)
        pull.gather = True
        return pull

    monkeypatch.setattr(fedavg_stacked._Pull, "of", gathered)
    for extra in ([], ["engine.clients_per_chunk=4"]):
        for alone, stacked in zip(_alone(runs, extra), _stacked(runs, extra), strict=True):
            _same(alone, stacked)


def _caught(runs: list[list[str]], extra: list[str] | None = None) -> None:
    alone = _alone(runs, extra or [])
    with pytest.raises(AssertionError):
        for a, b in zip(alone, _stacked(runs, extra or []), strict=True):
            _same(a, b)


@pytest.mark.parametrize("gather", [False, True])
def test_a_crossing_of_mu_or_centre_is_caught(
    gather: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plant crossings in FedProx's pull: each run given the next run's μ, or the next run's
    centre (CPU and GPU forms). The comparison above must see them."""
    real_of = fedavg_stacked._Pull.of

    def form(*args: Any) -> fedavg_stacked._Pull:
        pull = real_of(*args)
        pull.gather = gather
        return pull

    monkeypatch.setattr(fedavg_stacked._Pull, "of", form)
    real = fedavg_stacked.prox_pulls

    def next_runs_mu(runs: Any, lr: float) -> list[tuple[torch.Tensor, float]]:
        pulls = real(runs, lr)
        weights = [w for _, w in pulls]
        return [(c, w) for (c, _), w in zip(pulls, weights[1:] + weights[:1], strict=True)]

    monkeypatch.setattr(fedavg_stacked, "prox_pulls", next_runs_mu)
    _caught(FEDPROX)

    def next_runs_centre(runs: Any, lr: float) -> list[tuple[torch.Tensor, float]]:
        pulls = real(runs, lr)
        centres = [c for c, _ in pulls]
        return [(c, w) for (_, w), c in zip(pulls, centres[1:] + centres[:1], strict=True)]

    monkeypatch.setattr(fedavg_stacked, "prox_pulls", next_runs_centre)
    _caught(FEDPROX)


def test_a_crossing_of_rows_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plant a crossing: each run handed the next run's rows back. Caught."""
    real = fedavg_stacked._finish

    monkeypatch.setattr(fedavg_stacked, "_finish", next_runs_rows(real))
    _caught(FEDAVG)


@pytest.mark.parametrize("extra", [[], ["engine.clients_per_chunk=4"]], ids=["fresh", "ahead"])
def test_a_draw_from_another_runs_data_is_caught(
    extra: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plant a crossing in the stacked draw (each run's samples read from the next run's data),
    drawn as the steps go or gathered from the indices drawn ahead: caught."""
    real = run_rows.StackedData.of

    def shifted(contexts: Any) -> run_rows.StackedData:
        data = real(contexts)
        return run_rows.StackedData(data.x, data.y, data.starts[1:] + data.starts[:1])

    monkeypatch.setattr(run_rows.StackedData, "of", shifted)
    monkeypatch.setattr(run_rows, "_LAST", [])
    _caught(FEDAVG, extra)


@pytest.mark.parametrize(
    "extra",
    [
        ["algorithm.name=fedavg", "algorithm.local_epochs=1"],
        ["algorithm.name=fedavg", "algorithm.momentum=0.9"],
        ["algorithm.name=fedprox", "algorithm.weight_decay=0.001"],
        ["algorithm.name=fedavg", "algorithm.clip_grad_norm=1.0"],
        ["algorithm.name=fedavg", "algorithm.client_momentum=0.5"],
        ["algorithm.name=fedavg", "robust.cloud.name=median"],
        ["algorithm.name=fedavg", "model.name=vgg", "model.cfg=[4,M,8,M]", "model.batch_norm=true"],
        ["algorithm.name=moon"],
        ["algorithm.name=fednova"],
    ],
)
def test_rounds_it_does_not_cover_train_alone(extra: list[str]) -> None:
    """Local epochs, momentum or weight decay, clipping, client momentum, a robust cloud rule,
    BatchNorm, or a subclass's own local work: no stack key (the run trains alone)."""
    exp, state, parts = _start(extra)
    assert exp.algorithm.stack_key(state, parts[0]) is None


def test_partial_work_trains_alone() -> None:
    """FedProx keeps its stragglers' partial work: such rounds train alone."""
    exp, state, parts = _start(
        [
            "algorithm.name=fedprox",
            "faults.straggler=0.5",
            "faults.straggler_work=partial",
        ]
    )
    assert "partial_work" in parts[0].per_client
    assert exp.algorithm.stack_key(state, parts[0]) is None


def test_runs_of_other_local_work_do_not_meet() -> None:
    """Another lr, local step count or minibatch size: another key (the runs meet no one)."""
    keys = [_start(["algorithm.name=fedprox", *o]) for o in ([], ["algorithm.lr=0.07"])] + [
        _start(["algorithm.name=fedprox", "algorithm.local_steps=2"])
    ]
    found = {exp.algorithm.stack_key(state, parts[0]) for exp, state, parts in keys}
    assert len(found) == 3 and None not in found


def test_a_lockstep_batch_of_fedprox_stacks_its_rounds(tmp_path: Path) -> None:
    """FedProx μ ∈ {0.01, 0.1} × 2 seeds in lockstep: the rounds train stacked, and every run
    writes what it writes in the batch run one after another."""
    base = [
        *(o for o in BASE if o != "algorithm.local_steps=3"),
        "rounds=2",
        "eval_every=1",
        "checkpoint_every=1",
        "algorithm.name=fedprox",
        "algorithm.local_steps=3",
    ]
    report = lockstep_writes_the_sequential_files(base, "algorithm.mu=0.01,0.1", [0, 1], tmp_path)
    assert report.stacked_rounds > 0
