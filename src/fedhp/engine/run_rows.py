"""Runs as rows: the minibatches of several runs' clients drawn and gathered as one.

Run s draws exactly what it draws alone — the random keys from its own generator, its own clients'
rows of them — but the rest of a draw (masking past each client's count, the top-k, the gather
of the samples) is one operation over every run's clients, from the runs' training data stacked
once. Used by a method's round over a batch of runs (``RunContext.together``) so that S runs
cost one draw's launches, not S; where the runs' draws differ in kind (with replacement, a
minibatch larger than a client, per-access feature noise, sparse features, another key
width), each run draws alone.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from fedhp.data.rows import take_rows
from fedhp.engine.sampler import MAX_KEYS

if TYPE_CHECKING:
    from fedhp.engine.context import RunContext

Draw = Callable[[], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class StackedData:
    """The training samples of several runs in one tensor: run s's sample i is row
    ``starts[s] + i``."""

    x: torch.Tensor
    y: torch.Tensor
    starts: list[int]

    @classmethod
    def of(cls, contexts: Sequence[RunContext]) -> StackedData:
        trains = [ctx.fed.train for ctx in contexts]
        sizes = [int(t.x.shape[0]) for t in trains]
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        return cls(torch.cat([t.x for t in trains]), torch.cat([t.y for t in trains]), starts)


GATHER_ON_CPU = False
"""Whether stacked rounds take their GPU form on the CPU too (set by tests and
``benchmarks/run_rows_ops.py``, which count the launches the GPU form makes)."""


def gathers(device: torch.device) -> bool:
    """Whether a stacked round gathers each part's per-run rows and acts on all of them in one
    launch (the GPU form: launches are what a small federation's round costs there) rather than
    run by run or edge by edge in place (the CPU form: no copies)."""
    return device.type == "cuda" or GATHER_ON_CPU


_LAST: list[tuple[list[weakref.ref[object]], StackedData]] = []


def stacked_data(contexts: Sequence[RunContext]) -> StackedData:
    """:meth:`StackedData.of` the runs' training data, kept for the next call on the same runs
    (a batch's rounds: the data is stacked once per batch, not per round)."""
    trains = [ctx.fed.train for ctx in contexts]
    if _LAST:
        refs, data = _LAST[0]
        if len(refs) == len(trains) and all(r() is t for r, t in zip(refs, trains, strict=True)):
            return data
    data = StackedData.of(contexts)
    _LAST[:] = [([weakref.ref(t) for t in trains], data)]
    return data


def stacks(contexts: Sequence[RunContext], batch_size: int) -> bool:
    """Whether the runs' draws can be made as one: each draws its minibatches by one top-k over a
    key per sample (without replacement, every client holding at least ``batch_size``), all with
    the same key width, from dense features without per-access noise."""
    first = contexts[0]
    for ctx in contexts:
        sampler, train = ctx.sampler, ctx.fed.train
        if sampler.replacement or batch_size > sampler.min_count:
            return False
        if sampler.total * sampler.max_count > MAX_KEYS or sampler.rows is not None:
            return False
        if train.noise_std is not None or train.x.is_sparse:
            return False
        same = sampler.max_count == first.sampler.max_count
        if not same or train.x.shape[1:] != first.fed.train.x.shape[1:]:
            return False
        if train.x.dtype != first.fed.train.x.dtype or train.x.device != first.fed.train.x.device:
            return False
    return True


def stacked_draw(
    contexts: Sequence[RunContext],
    clients: Sequence[torch.Tensor],
    batch_size: int,
    data: StackedData,
) -> Draw:
    """A callable yielding one minibatch of every run's ``clients`` (run s's rows follow run
    s - 1's), each run's indices drawn as its :meth:`BatchSampler.draw
    <fedhp.engine.sampler.BatchSampler.draw>` draws them (requires :func:`stacks`)."""
    device = contexts[0].sampler.counts.device
    counts = torch.cat([ctx.sampler.counts[c] for ctx, c in zip(contexts, clients, strict=True)])
    first_rows = torch.cat(
        [
            ctx.fed.train.offsets[c].to(device) + start
            for ctx, c, start in zip(contexts, clients, data.starts, strict=True)
        ]
    ).unsqueeze(1)
    width = contexts[0].sampler.max_count
    keys_of = [(ctx.sampler.total, ctx.sampler.generator) for ctx in contexts]
    beyond = torch.arange(width, device=device).unsqueeze(0) >= counts.unsqueeze(1)

    def draw() -> tuple[torch.Tensor, torch.Tensor]:
        keys = torch.cat(
            [
                torch.rand(total, width, generator=gen, device=device)[c]
                for (total, gen), c in zip(keys_of, clients, strict=True)
            ]
        )
        keys = keys.masked_fill(beyond, 2.0)
        idx = torch.topk(keys, batch_size, dim=1, largest=False, sorted=False).indices
        rows = first_rows.to(idx.device) + idx
        return take_rows(data.x, rows), data.y[rows]

    return draw


@dataclass(frozen=True)
class RunBlocks:
    """The clients of a batch of runs as rows, one block per run (run s's rows follow run
    s - 1's; a run alone is one block): where a method's round finds each row's run."""

    bounds: tuple[int, ...]  # run s's rows: bounds[s] .. bounds[s + 1] - 1

    @classmethod
    def of(cls, sizes: Sequence[int]) -> RunBlocks:
        """The blocks of runs of ``sizes`` rows each."""
        return cls(tuple(sum(sizes[:i]) for i in range(len(sizes) + 1)))

    @property
    def runs(self) -> int:
        return len(self.bounds) - 1

    @property
    def rows(self) -> int:
        return self.bounds[-1]

    def of_run(self, s: int) -> slice:
        """Run ``s``'s rows."""
        return slice(self.bounds[s], self.bounds[s + 1])

    def own(self, rows: torch.Tensor, s: int, dim: int = 0) -> torch.Tensor:
        """Run ``s``'s block of ``rows`` (along ``dim``): ``rows`` itself for a run alone, else
        a copy (each run's update owns its storage)."""
        if self.runs == 1:
            return rows
        return rows[(slice(None),) * dim + (self.of_run(s),)].clone()

    def within(self, a: int, b: int) -> list[tuple[int, int, int]]:
        """Each run's rows among ``a .. b - 1``: ``(first, end, run)``."""
        out = []
        for s in range(self.runs):
            lo, hi = max(a, self.bounds[s]), min(b, self.bounds[s + 1])
            if lo < hi:
                out.append((lo, hi, s))
        return out

    def column(self, values: Sequence[float], like: torch.Tensor) -> float | torch.Tensor:
        """One value per run as a per-row column (:func:`per_row`), or the value itself where
        every run has the same."""
        sizes = [b - a for a, b in zip(self.bounds, self.bounds[1:], strict=False)]
        return per_row(values, sizes, like)


def cat_runs(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The runs' rows, run after run (a run alone: its own tensor, not a copy)."""
    return tensors[0] if len(tensors) == 1 else torch.cat(list(tensors))


def rows_of(values: torch.Tensor | float, a: int, b: int) -> torch.Tensor | float:
    """Rows ``a .. b - 1`` of a per-row value (a float: the same for every row)."""
    return values if isinstance(values, float) else values[a:b]


def rows_key(name: str, ctx: RunContext, received: torch.Tensor, steps: Hashable) -> Hashable:
    """The key under which runs' rounds of method ``name`` train as one: the round's ``steps``
    (counts, step sizes: what a kernel or a branch reads), the model, the received model's size,
    type and device, and the zero threshold."""
    model = (type(ctx.model).__qualname__, ctx.model.num_params)
    w = received
    return (name, steps, model, w.shape[-1], w.dtype, str(w.device), ctx.zero_threshold)


def per_row(
    values: Sequence[float], sizes: Sequence[int], like: torch.Tensor
) -> float | torch.Tensor:
    """One value per run as a ``[rows, 1]`` column of ``like``'s dtype and device (run s's value on
    its ``sizes[s]`` rows), or the value itself where every run has the same (the scalar form a
    run alone uses)."""
    if len(set(values)) == 1:
        return values[0]
    column = torch.tensor(list(values), dtype=like.dtype).repeat_interleave(torch.tensor(sizes))
    return column.to(like.device).unsqueeze(1)


def one_draw(
    contexts: Sequence[RunContext],
    clients: Sequence[torch.Tensor],
    batch_size: int,
    own: Sequence[Draw],
) -> Draw:
    """Every run's minibatches of a step, run after run: drawn as one where the runs' draws
    allow it (:func:`stacks`), else each run's ``own`` draw, concatenated."""
    if len(contexts) > 1 and stacks(contexts, batch_size):
        return stacked_draw(contexts, clients, batch_size, stacked_data(contexts))

    def each() -> tuple[torch.Tensor, torch.Tensor]:
        drawn = [d() for d in own]
        if len(drawn) == 1:
            return drawn[0]
        return torch.cat([d[0] for d in drawn]), torch.cat([d[1] for d in drawn])

    return each
