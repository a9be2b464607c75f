"""The client→edge rounds (fedhp.algorithms.edge_rounds): the whole round runs the method's own
edge aggregation (a planted wrong weight changes it), the streamed parts fold to the same edge
models bit for bit."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from fedhp.algorithms.base import Algorithm, State, Task
from fedhp.algorithms.edge_rounds import EdgeRounds
from fedhp.algorithms.hierfavg import HierFAVGOptions, edge_mean
from fedhp.engine.edges import edge_members
from fedhp.engine.ops import LocalWork, segment_mean
from fedhp.engine.uplink import Combine
from tests.algorithms.tiny import init_params, tiny_context
from tests.policies import use_policy

EDGES = (3, 2, 2)
WORK = LocalWork(lr=0.3, batch_size=2, steps=2)


def rounds_of(algo: Algorithm, state: State, task: Task, combine: Combine) -> EdgeRounds:
    """The edge rounds of one run's round, ``WORK`` each."""
    return EdgeRounds([(algo, state, task)], [WORK], combine)


def one_round(cache: int | None = None) -> tuple[Algorithm, State, Task]:
    """A HierFAVG round's algorithm, state and task on the tiny federation (sample weights;
    ``cache``: the policy's cache in floats, so the clients train in parts)."""
    ctx = tiny_context(EDGES, n_train=(3, 6, 2, 6, 3, 4, 5), weighting="samples")
    if cache is not None:
        use_policy(ctx.model, cache_floats=cache)
    algo = HierFAVGOptions(kappa1=2, kappa2=2, lr=0.3, batch_size=2).build(ctx)
    state = algo.init_state(init_params())
    return algo, state, algo.plan(state, 0)


def test_edge_mean_is_the_segment_mean_of_its_rows_bit_for_bit() -> None:
    """Each edge's :func:`edge_mean` of its rows is its row of the segment mean over all the
    clients (edges not contiguous): what the streamed fold sums, part by part."""
    g = torch.Generator().manual_seed(0)
    rows, weights = torch.randn(9, 37, generator=g), torch.rand(9, generator=g) + 0.5
    seg = torch.tensor([2, 0, 1, 0, 2, 2, 1, 0, 1])
    members = edge_members(seg, 3)
    assert all(isinstance(m, Tensor) for m in members)  # (not contiguous: their indices)
    together = segment_mean(rows, seg, weights, 3)
    for e, mine in enumerate(members):
        assert torch.equal(edge_mean(rows[mine], weights[mine]), together[e])


def test_the_whole_round_runs_the_methods_combine_on_each_edge() -> None:
    """One part: every edge's uploads with their clients' weights go to ``combine``, whose
    results are the edges' models; a planted wrong weight changes them."""
    algo, state, task = one_round()
    seen: list[tuple[Tensor, Tensor]] = []

    def spy(rows: Tensor, weights: Tensor) -> Tensor:
        seen.append((rows.clone(), weights.clone()))
        return edge_mean(rows, weights)

    rounds = rounds_of(algo, state, task, spy)
    assert len(rounds.parts) == 1
    rounds.step()
    weights = algo.ctx.client_weights(task.clients)
    assert task.edges is not None
    seg = algo.ctx.edge_positions(task.clients, task.edges)
    assert len(seen) == len(EDGES)
    for e, (rows, w) in enumerate(seen):
        assert torch.equal(w, weights[seg == e]) and rows.shape[0] == EDGES[e]
        assert torch.equal(rounds.models[e], edge_mean(rows, w))

    def planted(rows: Tensor, weights: Tensor) -> Tensor:
        wrong = weights.clone()
        wrong[0] *= 2  # one client counted twice
        return edge_mean(rows, wrong)

    algo, state, task = one_round()
    right = rounds_of(algo, state, task, edge_mean)
    right.step()
    algo, state, task = one_round()
    wrong = rounds_of(algo, state, task, planted)
    wrong.step()
    assert not torch.equal(right.models, wrong.models)


def test_only_a_foldable_combine_is_streamed_in_parts() -> None:
    """Under a cache that holds two clients, :func:`edge_mean` (declared foldable) trains in
    parts; any other ``combine`` gets the whole round, and runs on it."""
    algo, state, task = one_round(cache=30)
    assert len(rounds_of(algo, state, task, edge_mean).parts) == 4
    calls: list[int] = []

    def other(rows: Tensor, weights: Tensor) -> Tensor:
        calls.append(rows.shape[0])
        return rows.median(dim=0).values

    rounds = rounds_of(algo, state, task, other)
    assert len(rounds.parts) == 1
    rounds.step()
    assert calls == list(EDGES)


@pytest.mark.parametrize("eps", [0.0, 0.05])
def test_parts_fold_to_the_whole_rounds_edge_models_bit_for_bit(eps: float) -> None:
    """Clients trained in parts of two (an edge's clients span parts) on the minibatches drawn
    ahead: the edge models, the losses and the bill of the whole round, exactly, round after
    round."""
    results = []
    for cache in (None, 30):
        algo, state, task = one_round(cache)
        algo.ctx.zero_threshold = eps
        rounds = rounds_of(algo, state, task, edge_mean)
        assert len(rounds.parts) == (1 if cache is None else 4)
        losses = torch.stack([rounds.step() for _ in range(3)])
        (update,) = rounds.updates(losses)
        results.append((update.per_edge["model"], losses, algo.ctx.ledger.state_dict()))
    (whole, whole_loss, whole_bill), (parts, part_loss, part_bill) = results
    assert torch.equal(whole, parts) and torch.equal(whole_loss, part_loss)
    assert whole_bill == part_bill and whole_bill["round"]


def test_the_fold_is_each_edges_combine_bit_for_bit() -> None:
    """The fold (one part, :func:`edge_mean` declared foldable) gives what the whole round's
    edge-by-edge ``combine`` gives (the same mean, not declared foldable): the edge models, the
    losses and the bill, round after round."""

    def unfolded(rows: Tensor, weights: Tensor) -> Tensor:
        return edge_mean(rows, weights)

    results = []
    for combine in (edge_mean, unfolded):
        algo, state, task = one_round()
        rounds = rounds_of(algo, state, task, combine)
        assert rounds.whole == (combine is unfolded)
        losses = torch.stack([rounds.step() for _ in range(3)])
        (update,) = rounds.updates(losses)
        results.append((update.per_edge["model"], losses, algo.ctx.ledger.state_dict()))
    (fold, fold_loss, fold_bill), (whole, whole_loss, whole_bill) = results
    assert torch.equal(fold, whole) and torch.equal(fold_loss, whole_loss)
    assert fold_bill == whole_bill
