"""HeurFedAMP's stacked round (runs as rows): S runs trained as one local SGD, each client from
and towards its own cloud model u_i, give each run, bit for bit, what its ``train`` gives it
alone — uploads, losses, step counts, trained samples, the generator's state after its draws,
the ledger — and nothing crosses a run's rows (planted crossings of centres, weights or rows are
caught); a lockstep sweep batch of HeurFedAMP runs stacks its rounds and writes what the runs
write one after another."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from fedhp.algorithms import fedavg_stacked, heurfedamp_stacked
from tests.algorithms.stacked_runs import (
    TINY,
    alone,
    lockstep_writes_the_sequential_files,
    next_runs_rows,
    same,
    stacked,
    start,
)

BASE = [*TINY, "algorithm.name=heurfedamp", "algorithm.local_steps=3"]

# seeds × λ (λ = 20 with lr 0.05 makes lr·λ/α_k = 1: the pull lands on the centre), α_k per run
RUNS = [
    [f"seed={s}", f"algorithm.lam={lam}", f"algorithm.alpha_k={ak}"]
    for s in range(2)
    for lam, ak in ((1.0, 1.0), (0.3, 2.0), (20.0, 1.0))
]
SAME_LAM = [[f"seed={s}"] for s in range(3)]
CONV = ["model.name=vgg", "model.cfg=[4,M,8,M]"]

Started = tuple[Any, dict[str, torch.Tensor], Any]


def _start(overrides: list[str]) -> Started:
    """A run's experiment, state and task of its SECOND round: round 0 trained and aggregated
    alone, so that the clients' models, and so their cloud models u_i, differ."""
    keys = {o.split("=")[0] for o in overrides}
    base = [o for o in BASE if not ("model.name" in keys and o.startswith("model.hidden"))]
    exp, state, task = start([*base, *overrides])
    algo = exp.algorithm
    algo.aggregate(state, task, algo.train(state, task))
    exp.ctx.begin_round(1)
    return exp, state, algo.plan(state, 1)


def _outcome(exp: Any, state: dict[str, torch.Tensor], update: Any) -> dict[str, Any]:
    return {
        "model": update.per_client["model"],
        "losses": update.losses,
        "steps": update.steps,
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
    ["federation.client_fraction=0.5"],  # each run its own clients
    ["engine.clients_per_chunk=4"],  # stacked parts that span two runs
    ["federation.sampling=with_replacement"],  # each run draws alone
    ["comm.zero_threshold=0.001"],  # truncation on the links (u as received)
    ["faults.client_dropout=0.3"],  # blocks of unequal sizes
    # a vmap'ed convolution, parts of 4 + 3 alone; stacked, 21 rows: 4 × 4 + 5 (no lone row)
    [*CONV, "federation.num_clients=7", "engine.clients_per_chunk=4"],
]


@pytest.mark.parametrize("extra", EXTRAS)
@pytest.mark.parametrize("runs", [RUNS, SAME_LAM], ids=["lam-per-run", "one-lam"])
def test_each_run_of_a_stack_gets_what_it_gets_alone(
    runs: list[list[str]], extra: list[str]
) -> None:
    for one, both in zip(_alone(runs, extra), _stacked(runs, extra), strict=True):
        same(one, both)


def test_the_centres_differ_by_run_and_client() -> None:
    """(The premise of the comparisons: the second round's cloud models differ from client to
    client and from run to run.)"""
    centres = []
    for overrides in RUNS[:2]:
        _, _, task = _start(overrides)
        u = task.per_client["u"]
        assert not torch.equal(u[0], u[1])
        centres.append(u)
    assert not torch.equal(centres[0], centres[1])


def _gpu_form(monkeypatch: pytest.MonkeyPatch, on: bool) -> None:
    monkeypatch.setattr(heurfedamp_stacked, "gathers", lambda device: on)


@pytest.mark.parametrize("extra", [[], ["engine.clients_per_chunk=4"]], ids=["whole", "chunked"])
@pytest.mark.parametrize("runs", [RUNS, SAME_LAM], ids=["lam-per-run", "one-lam"])
def test_the_gpu_form_pulls_by_the_same_values(
    runs: list[list[str]], extra: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GPU's form (the runs' centres stacked, one pull per layer over each part's rows with
    per-row weights) computes the same bits as the CPU's run-by-run pull."""
    _gpu_form(monkeypatch, True)
    for one, both in zip(_alone(runs, extra), _stacked(runs, extra), strict=True):
        same(one, both)


def _caught(extra: list[str] | None = None) -> None:
    alone = _alone(RUNS, extra or [])
    with pytest.raises(AssertionError):
        for a, b in zip(alone, _stacked(RUNS, extra or []), strict=True):
            same(a, b)


@pytest.mark.parametrize("gather", [False, True])
def test_a_crossing_of_centres_is_caught(gather: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Plant a crossing: each run's rows pulled towards the next run's centres, with the next
    run's weight (CPU and GPU forms). Caught."""
    _gpu_form(monkeypatch, gather)
    real = fedavg_stacked.prox_pulls

    def next_runs(runs: Any, lr: float) -> list[tuple[torch.Tensor, float]]:
        pulls = real(runs, lr)
        return pulls[1:] + pulls[:1]

    monkeypatch.setattr(fedavg_stacked, "prox_pulls", next_runs)
    _caught()


def test_a_crossing_of_weights_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plant a crossing: each run's rows pulled towards its own centres with the next run's
    weight lr·λ/α_k. Caught."""
    real = fedavg_stacked.prox_pulls

    def next_weights(runs: Any, lr: float) -> list[tuple[torch.Tensor, float]]:
        pulls = real(runs, lr)
        weights = [w for _, w in pulls]
        return [(u, w) for (u, _), w in zip(pulls, weights[1:] + weights[:1], strict=True)]

    monkeypatch.setattr(fedavg_stacked, "prox_pulls", next_weights)
    _caught()


def test_a_crossing_of_rows_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plant a crossing: each run handed the next run's rows back. Caught."""
    monkeypatch.setattr(fedavg_stacked, "_finish", next_runs_rows(fedavg_stacked._finish))
    _caught()


@pytest.mark.parametrize(
    "extra",
    [
        ["algorithm.local_steps=1", "algorithm.local_epochs=1"],
        ["algorithm.momentum=0.9"],
        ["algorithm.weight_decay=0.001"],
        ["algorithm.clip_grad_norm=1.0"],
    ],
)
def test_rounds_it_does_not_cover_train_alone(extra: list[str]) -> None:
    """Local epochs, momentum or weight decay, clipping: no stack key (the run trains alone)."""
    keys = {o.split("=")[0] for o in extra}
    dropped = {"algorithm.local_steps"} if "algorithm.local_epochs" in keys else set()
    base = [o for o in BASE if o.split("=")[0] not in dropped]
    extra = [o for o in extra if o != "algorithm.local_steps=1"]
    exp, state, task = start([*base, *extra])
    assert exp.algorithm.stack_key(state, task) is None


@pytest.mark.parametrize(
    "extra",
    [["engine.clients_per_chunk=5"], ["federation.client_fraction=0.1"]],
    ids=["a-chunk-of-one-over", "one-client"],
)
def test_a_run_with_a_lone_row_on_a_vmapped_conv_trains_alone(extra: list[str]) -> None:
    """On a vmap'ed convolution (one row computed apart from several), a run whose clients come
    in a part of one row alone (6 clients in parts of 5: 5 + 1; one sampled client): no stack
    key. The same on a DNN (rows computed alike): a key."""
    for model, has_key in ((CONV, False), ([], True)):
        exp, state, task = _start([*model, *extra])
        assert (exp.algorithm.stack_key(state, task) is not None) == has_key


def test_runs_of_other_local_work_or_methods_do_not_meet() -> None:
    """Another lr or local step count: another key; FedProx's key is not HeurFedAMP's; λ, α_k,
    α and σ do not split the key."""
    found = set()
    for extra in ([], ["algorithm.lr=0.07"], ["algorithm.local_steps=2"]):
        exp, state, task = start([*BASE, *extra])
        found.add(exp.algorithm.stack_key(state, task))
    exp, state, task = start([*BASE, "algorithm.name=fedprox"])
    found.add(exp.algorithm.stack_key(state, task))
    assert len(found) == 4 and None not in found
    floats = ["algorithm.lam=3.0", "algorithm.alpha_k=2.0", "algorithm.alpha=0.1"]
    exp, state, task = start([*BASE, *floats, "algorithm.sigma=2.0", "seed=5"])
    assert exp.algorithm.stack_key(state, task) in found


def test_a_lockstep_batch_of_heurfedamp_stacks_its_rounds(tmp_path: Path) -> None:
    """HeurFedAMP λ ∈ {1.0, 0.3} × 2 seeds in lockstep: the rounds train stacked, and every run
    writes what it writes in the batch run one after another."""
    base = [*TINY, "rounds=3", "eval_every=1", "checkpoint_every=1", *BASE[len(TINY) :]]
    report = lockstep_writes_the_sequential_files(base, "algorithm.lam=1.0,0.3", [0, 1], tmp_path)
    assert report.stacked_rounds > 0
