"""What the stacked rounds of pFedMe and sFedHP share (:mod:`~fedhp.algorithms.pfedme_stacked`,
:mod:`~fedhp.algorithms.sfedhp_stacked`): each run's share of the stacked client rows, the key
the runs must share, their one draw, and the K θ steps on a cache-sized part of the rows."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch

from fedhp.algorithms.base import Algorithm, State
from fedhp.algorithms.task import Task
from fedhp.data.rows import slice_rows
from fedhp.engine.local_rows import lone_part as lone_part
from fedhp.engine.local_rows import part_bounds as part_bounds
from fedhp.engine.ops import model_steps
from fedhp.engine.run_rows import Draw, one_draw

A = TypeVar("A", bound=Algorithm)


@dataclass
class StackedRun(Generic[A]):
    """One run's share of the stacked round: its clients ``rows`` (a slice of the stacked
    tensors) and its own draw."""

    algo: A
    state: State
    task: Task
    rows: slice
    draw: Draw


R = TypeVar("R", bound=StackedRun[Any])


def theta_stack_key(name: str, algo: Algorithm, task: Task, steps: Hashable) -> Hashable:
    """The key of method ``name``'s stacked round: the round's ``steps`` (counts, step sizes),
    the model, the received model's size, type and device, and the zero threshold."""
    ctx = algo.ctx
    w = task.broadcast["global"]
    model = (type(ctx.model).__qualname__, ctx.model.num_params)
    return (name, steps, model, w.shape[-1], w.dtype, str(w.device), ctx.zero_threshold)


@dataclass
class EdgeRun(StackedRun[A]):
    """One run's share of a hierarchical stacked round: beside its clients ``rows``, its edges
    ``edge_rows`` (a slice of the stacked edges) and whom it bills."""

    edge_rows: slice
    ids: torch.Tensor  # the clients' global ids (ledger)
    recv_seg: torch.Tensor  # receivers of the edges' models (clients, stragglers): edge pos.
    recv_ids: torch.Tensor


def flat_runs(
    items: Sequence[tuple[Any, State, Task]], batch_size: int, make: Callable[..., R]
) -> tuple[list[R], torch.Tensor]:
    """Each run's share of a flat stacked round (``make(algo, state, task, rows, draw)``: its
    clients' rows, its own draw), and every run's received global model, a row per client."""
    runs, c0 = [], 0
    for algo, state, task in items:
        c = len(task.clients)
        draw = algo.ctx.batches(task.clients, batch_size)
        runs.append(make(algo, state, task, slice(c0, c0 + c), draw))
        c0 += c
    received = torch.cat(
        [r.task.broadcast["global"].expand(r.rows.stop - r.rows.start, -1) for r in runs]
    )
    return runs, received


E = TypeVar("E", bound=EdgeRun[Any])


def edge_runs(
    items: Sequence[tuple[Any, State, Task]], batch_size: int, make: Callable[..., E]
) -> tuple[list[E], int, int]:
    """Each run's share of a hierarchical stacked round (:class:`EdgeRun`): its clients' and
    sampled edges' rows, its own draw, the receivers of its edges' models (its clients, then its
    stragglers) with their ids; and the stacked clients' and edges' counts."""
    runs, c0, e0 = [], 0, 0
    for algo, state, task in items:
        ctx, edges = algo.ctx, task.edges
        assert edges is not None
        c, n = len(task.clients), len(edges)
        late = task.stragglers if task.stragglers is not None else task.clients[:0]
        ids = ctx.global_clients(task.clients)
        recv_seg = torch.cat(
            (ctx.edge_positions(task.clients, edges), ctx.edge_positions(late, edges))
        )
        runs.append(
            make(
                algo, state, task, slice(c0, c0 + c), ctx.batches(task.clients, batch_size),
                slice(e0, e0 + n), ids, recv_seg, torch.cat((ids, ctx.global_clients(late))),
            )
        )  # fmt: skip
        c0, e0 = c0 + c, e0 + n
    return runs, c0, e0


def edge_rows_of(runs: Sequence[EdgeRun[Any]]) -> torch.Tensor:
    """Each stacked client's edge as a row of the stacked edges ``[ΣC]`` (run s's edges follow
    run s - 1's)."""
    return torch.cat([r.recv_seg[: len(r.task.clients)] + r.edge_rows.start for r in runs])


def warm_theta(runs: Sequence[StackedRun[Any]]) -> torch.Tensor:
    """Every run's clients' θ kept from the last round, run after run."""
    return torch.cat([r.state["theta"][r.task.clients] for r in runs])


def one_draw_of(runs: Sequence[StackedRun[Any]], batch_size: int) -> Draw:
    """Every run's minibatches as one draw where the runs allow it (:mod:`fedhp.engine.run_rows`),
    else each run's own."""
    contexts, clients = [r.algo.ctx for r in runs], [r.task.clients for r in runs]
    return one_draw(contexts, clients, batch_size, [r.draw for r in runs])


def blocks(runs: Sequence[R], a: int, b: int) -> list[tuple[int, int, R]]:
    """Each run's rows among ``a .. b - 1``: ``(first, end, run)``."""
    out = []
    for run in runs:
        lo, hi = max(a, run.rows.start), min(b, run.rows.stop)
        if lo < hi:
            out.append((lo, hi, run))
    return out


def rows_of(values: torch.Tensor | float, a: int, b: int) -> torch.Tensor | float:
    """Rows ``a .. b - 1`` of a per-row value (a float: the same for every row)."""
    return values if isinstance(values, float) else values[a:b]


def theta_steps(
    runs: Sequence[StackedRun[Any]],
    theta: torch.Tensor,
    batch: tuple[torch.Tensor, torch.Tensor],
    part: tuple[int, int],
    steps: tuple[int, float],
    pull: Callable[[int, int], None],
) -> torch.Tensor:
    """``steps = (K, lr)``: K steps of size ``lr`` on rows ``part = (a, b)`` of ``theta``, in
    place, the prox ``pull`` applied inside each step (the model's ``sgd_step`` hook), every
    run's own counter of trained samples kept; the data loss at the last step's start point."""
    (a, b), (x, y) = part, batch
    count_steps(runs, x, part, steps[0])
    return model_steps(runs[0].algo.ctx.model, theta[a:b], slice_rows(x, a, b), y[a:b], steps, pull)


def count_steps(
    runs: Sequence[StackedRun[Any]], x: torch.Tensor, part: tuple[int, int], k: int
) -> None:
    """``k`` gradient evaluations of rows ``part = (a, b)`` on ``x``, on each run's own counter
    of trained samples."""
    for lo, hi, run in blocks(runs, *part):
        for _ in range(k):
            run.algo.ctx.model.count_trained(slice_rows(x, lo, hi))
