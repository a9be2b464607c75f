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


def warm_theta(runs: Sequence[StackedRun[Any]]) -> torch.Tensor:
    """Every run's clients' θ kept from the last round, run after run."""
    return torch.cat([r.state["theta"][r.task.clients] for r in runs])


def one_draw_of(runs: Sequence[StackedRun[Any]], batch_size: int) -> Draw:
    """Every run's minibatches as one draw where the runs allow it (:mod:`fedhp.engine.run_rows`),
    else each run's own."""
    contexts, clients = [r.algo.ctx for r in runs], [r.task.clients for r in runs]
    return one_draw(contexts, clients, batch_size, [r.draw for r in runs])


def part_bounds(chunk: int, rows: int) -> list[tuple[int, int]]:
    """The cache-sized parts ``(a, b)`` of ``rows`` rows, ``chunk`` rows each (the last fewer)."""
    return [(a, min(a + chunk, rows)) for a in range(0, rows, chunk)]


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
    (a, b), (k, lr), (x, y) = part, steps, batch
    model = runs[0].algo.ctx.model
    rows, xa, ya = theta[a:b], slice_rows(x, a, b), y[a:b]
    parts = blocks(runs, a, b)
    loss = torch.zeros(b - a, device=theta.device)
    for _ in range(k):
        for lo, hi, run in parts:  # each run's own counter of trained samples
            run.algo.ctx.model.count_trained(slice_rows(x, lo, hi))
        loss = model.sgd_step(rows, xa, ya, lr, pull)
    return loss
