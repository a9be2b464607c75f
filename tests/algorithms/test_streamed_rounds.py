"""Rounds trained in parts of the clients (``Algorithm.round_parts``) give the whole round's
result: the same model, the same bill, the same statistics, with no part above the chunk."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from fedhp.algorithms.base import State, Task, Update
from fedhp.algorithms.ditto import Ditto, DittoOptions
from fedhp.algorithms.fedavg import FedAvg, FedAvgOptions, FedProx, FedProxOptions
from fedhp.algorithms.fednova import FedNova, FedNovaOptions
from fedhp.algorithms.moon import Moon, MoonOptions
from fedhp.engine.aggregation import LevelRule
from fedhp.errors import FedhpWarning
from fedhp.robust import RobustOptions
from tests.algorithms.tiny import tiny_context
from tests.policies import use_policy

# MLR on 4 features and 3 classes: 15 parameters; 30 floats -> parts of 2 clients.
SMALL_CACHE = 30


def run_rounds(
    options: Any,
    monkeypatch: pytest.MonkeyPatch,
    cache: int,
    rule: RobustOptions | None = None,
    momentum: float = 0.0,
    **ctx_kw: Any,
) -> tuple[State, list[dict[str, float]], Any, list[int]]:
    """Three rounds of ``options`` on the tiny federation with client chunks of ``cache``
    floats (the cloud's robust ``rule`` and client ``momentum`` where given): the state, each
    round's statistics, the ledger and the sizes of the trained parts."""
    ctx = tiny_context(edge_sizes=(3, 2, 2), **ctx_kw)
    if rule is not None:
        ctx.cloud_rule = LevelRule(rule, "robust.cloud")
    ctx.client_momentum = momentum
    use_policy(ctx.model, cache_floats=cache)
    algo = options.build(ctx)
    sizes: list[int] = []
    train = algo.train

    def spy(state: State, task: Task) -> Update:
        sizes.append(len(task.clients))
        return train(state, task)

    algo.train = spy  # type: ignore[method-assign]
    state = algo.init_state(ctx.model.init_params(0))
    stats = []
    for rnd in range(3):
        ctx.cloud_uplink.begin_round(rnd)
        stats.append(algo.run_round(state, rnd))
        ctx.ledger.end_round()
    return state, stats, ctx.ledger, sizes


CASES = {
    "fedavg steps": (FedAvgOptions(local_steps=3, batch_size=2, lr=0.3), {}),
    "fedavg epochs, samples": (
        FedAvgOptions(local_epochs=2, batch_size=2, lr=0.3),
        {"n_train": (3, 5, 2, 6, 4, 1, 5), "weighting": "samples"},
    ),
    "fedprox": (FedProxOptions(local_steps=2, batch_size=3, lr=0.2, mu=0.5), {}),
    "fedavg momentum, device cost": (
        FedAvgOptions(local_steps=2, batch_size=2, lr=0.2, momentum=0.9, capabilities="fix"),
        {},
    ),
    "moon": (MoonOptions(local_steps=2, batch_size=2, lr=0.2, mu=1.0), {}),
    "fednova epochs, momentum": (
        FedNovaOptions(local_epochs=2, batch_size=2, lr=0.2, momentum=0.5),
        {"n_train": (3, 5, 2, 6, 4, 1, 5), "weighting": "samples"},
    ),
    "fedavg zero threshold": (
        FedAvgOptions(local_steps=2, batch_size=2, lr=0.3),
        {"zero_threshold": 0.05},
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_round_in_parts_equals_the_whole_round(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    options, ctx_kw = CASES[name]
    whole, whole_stats, whole_ledger, whole_sizes = run_rounds(
        options, monkeypatch, 10**9, **ctx_kw
    )
    parts, part_stats, part_ledger, part_sizes = run_rounds(
        options, monkeypatch, SMALL_CACHE, **ctx_kw
    )
    assert whole_sizes == [7, 7, 7]  # one part: the whole round
    assert part_sizes == [2, 2, 2, 1] * 3  # never more than a chunk of clients at once
    assert whole.keys() == parts.keys()
    for key in whole:
        # the weighted sum is added part by part: equal up to float summation order
        torch.testing.assert_close(parts[key], whole[key], rtol=1e-6, atol=1e-7, msg=key)
    assert part_ledger.totals() == whole_ledger.totals()
    assert part_ledger.node_totals("client_cloud") == whole_ledger.node_totals("client_cloud")
    for a, b in zip(part_stats, whole_stats, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert a[key] == pytest.approx(b[key], rel=1e-6), key


def test_one_part_is_the_plain_aggregate(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the round fits one chunk it is ``aggregate(train(plan))``: bit for bit the weighted
    mean of the uploaded models."""
    ctx = tiny_context(weighting="samples", n_train=(3, 5, 2, 6, 4))
    use_policy(ctx.model, cache_floats=10**9)
    algo = FedAvgOptions(local_steps=2, batch_size=2, lr=0.3).build(ctx)
    state = algo.init_state(ctx.model.init_params(0))
    task = algo.plan(state, 0)
    assert algo.round_parts(task) == [task]
    update = algo.train(state, task)
    algo.aggregate(state, task, update)
    weights = ctx.fed.train.counts.float()
    expected = (weights / weights.sum()) @ update.per_client["model"]
    assert torch.equal(state["global"], expected)


def test_folding_is_declared_by_each_options_class_itself() -> None:
    """``folds_uploads`` is read from the options class's own body (:meth:`Algorithm.folds`),
    never inherited and never changed: an options subclass that does not declare it (its
    algorithm overriding ``aggregate`` or ``train``: a plugin's own training may draw minibatches
    of its own) is trained whole, one that declares it folds, and an algorithm class of the
    surface up to 9d240f0 that sets it in its own body is read, with one warning."""
    ctx = tiny_context()

    class Custom(FedAvg):
        def aggregate(self, state: State, task: Task, update: Update) -> dict[str, float]:
            return {}

    class CustomOptions(FedAvgOptions):
        pass

    class DeclaredOptions(FedAvgOptions):
        folds_uploads = True

    with pytest.warns(FedhpWarning, match="OldSurface: behaviour flags .folds_uploads."):

        class OldSurface(FedAvg):
            folds_uploads = True

    assert not Custom(CustomOptions(), ctx).folds() and Custom(DeclaredOptions(), ctx).folds()
    assert OldSurface(CustomOptions(), ctx).folds()
    assert CustomOptions.folds_uploads  # (inherited as a value, not read, not flipped)
    built = {
        name: cls(ctx).folds()
        for name, cls in {
            "fedavg": lambda c: FedAvg(FedAvgOptions(), c),
            "fedprox": lambda c: FedProx(FedProxOptions(), c),
            "fednova": lambda c: FedNova(FedNovaOptions(), c),
            "moon": lambda c: Moon(MoonOptions(), c),
            "ditto": lambda c: Ditto(DittoOptions(), c),
        }.items()
    }
    assert built == {"fedavg": True, "fedprox": True, "fednova": True, "moon": True, "ditto": False}


def test_flags_are_read_from_the_options_class() -> None:
    """An algorithm reads the behaviour flags its options class declares (one place per
    method), e.g. FedAvg's uploads and sFedHP's node-held rows."""
    ctx = tiny_context()
    algo = FedAvg(FedAvgOptions(), ctx)
    assert algo.client_outputs == FedAvgOptions.client_outputs == ("model",)
    assert "client_outputs" not in vars(FedAvg) and algo.node_keys == {}


def test_a_combine_that_does_not_fold_sees_the_whole_round() -> None:
    """A FedAvg subclass with its own aggregation (not declared ``foldable``) gets the rows of
    every part of a streamed round at once, through the cloud's uplink."""
    seen: list[int] = []

    def first_row(rows: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        seen.append(rows.shape[0])
        return rows[0]

    class FirstRow(FedAvg):
        combine = staticmethod(first_row)

    ctx = tiny_context(weighting="samples", n_train=(3, 5, 2, 6, 4))
    use_policy(ctx.model, cache_floats=SMALL_CACHE)
    algo = FirstRow(FedAvgOptions(local_steps=2, batch_size=2, lr=0.3), ctx)
    state = algo.init_state(ctx.model.init_params(0))
    task = algo.plan(state, 0)
    parts = algo.round_parts(task)
    assert len(parts) > 1
    fold = algo.open_fold(state, task)
    first = None
    for part in parts:
        update = algo.train(state, part)
        first = update.per_client["model"][0] if first is None else first
        algo.fold_in(state, fold, part, update)
    algo.close_fold(state, task, fold)
    assert seen == [len(task.clients)]
    assert first is not None and torch.equal(state["global"], first)


ROBUST = {
    "median": RobustOptions(name="median"),
    "cclip, buckets of 2": RobustOptions(name="cclip", tau=0.5, bucket=2),
    "geomed": RobustOptions(name="geomed"),
    "multi_krum": RobustOptions(name="multi_krum", f=1),
}


@pytest.mark.parametrize("momentum", [0.0, 0.9])
@pytest.mark.parametrize("name", sorted(ROBUST))
def test_a_robust_round_in_parts_equals_the_whole_round_bit_for_bit(
    name: str, momentum: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A robust rule keeps every part's uploaded rows (``UploadFold``) and aggregates them once:
    the round trains in cache-sized parts and the rule sees the same rows as the whole round's."""
    options = FedAvgOptions(local_steps=3, batch_size=2, lr=0.3)
    whole, _, _, whole_sizes = run_rounds(options, monkeypatch, 10**9, ROBUST[name], momentum)
    parts, _, _, part_sizes = run_rounds(options, monkeypatch, SMALL_CACHE, ROBUST[name], momentum)
    assert whole_sizes == [7, 7, 7]
    assert part_sizes == [2, 2, 2, 1] * 3
    assert whole.keys() == parts.keys()
    for key in whole:
        assert torch.equal(parts[key], whole[key]), key
