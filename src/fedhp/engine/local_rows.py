"""The run level of the engine for local SGD: the local SGD of S runs of a batch as ONE.

A batch of runs is one more level of the federation's tree (run → cloud → edge → client). Each
run calls its own round, and its round calls :meth:`RunContext.local_sgd
<fedhp.engine.context.RunContext.local_sgd>` as it does alone; where the run belongs to a batch
(``ctx.batch``, :class:`~fedhp.engine.context.RunBatch`), the batch collects the calls of its
runs that agree in :func:`local_sgd_key` and trains them here as one local SGD, each run's
clients a block of rows of one ``theta [ΣC, P]``::

    theta = cat(start_s for each run s)                 # each run's clients' start rows
    for step in range(steps):
        x, y = cat(draw_s() for each run s)             # each run's own minibatches, as alone
        theta = theta - lr * (grad(theta; x, y) + term_s(theta))   # term_s on run s's rows only
        loss += the step's loss at its start point
    trained_s = (theta[rows_s], loss[rows_s], steps)    # what run s's local_sgd returns alone

``term_s`` is the run's own additive gradient term as its round passed it (FedProx's and Ditto's
pull towards a centre, :class:`~fedhp.engine.ops.ProxGrad`, with the run's own μ; SCAFFOLD's
correction, :class:`~fedhp.engine.ops.ConstantGrad`), applied inside the model's step to the run's
own rows, so a float that differs between runs (μ, λ) is a per-run value, never a shared one.
Nothing crosses a run's block: every operation is per row, each run draws its minibatches from
its own generator (gathered from the runs' data stacked once, :mod:`fedhp.engine.run_rows`, where
the draws allow it) and counts its own trained samples. So every method whose round trains through
``ctx.local_sgd`` — FedAvg, FedProx, SCAFFOLD, Ditto, Local only, FedPer, FedHT, FedNova, a
user's plugin — batches with no code of its own, each run getting the bits it gets alone
(``tests/engine/test_local_rows.py``; ``tests/sweep/test_lockstep.py`` on whole runs).

A call this level does not cover (:func:`local_sgd_key` None) trains alone, as it would outside a
batch: local epochs, momentum or weight decay, a clipped model, BatchNorm statistics, masks,
stragglers' partial work, a method's own loss (MOON), a gradient term other than the two
above, no clients, or a lone row of a model whose rows are not independent.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from fedhp.data.rows import slice_rows, take_rows
from fedhp.engine.ops import ConstantGrad, ExtraGrad, LocalWork, ProxGrad, StepTerm
from fedhp.engine.run_rows import (
    Draw,
    StackedData,
    gathers,
    one_draw,
    per_row,
    stacked_data,
    stacks,
)
from fedhp.models.base import BatchedModel, sgd_step

if TYPE_CHECKING:
    from fedhp.engine.context import RunContext

Trained = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""What :meth:`RunContext.local_sgd` returns: the parameters ``[C, P]``, each client's loss
summed over its steps ``[C]`` and its step count ``[C]`` (int64)."""

StepDraw = Callable[[int], tuple[torch.Tensor, torch.Tensor]]
"""``draw(step)``: every run's minibatch of local step ``step``, run after run."""

ColumnHook = Callable[[int, int], None]


@dataclass
class LocalCall:
    """One run's call of :meth:`RunContext.local_sgd` (the arguments this level covers)."""

    ctx: RunContext
    params: torch.Tensor
    clients: torch.Tensor
    work: LocalWork
    extra_grad: ExtraGrad | None = None
    drawn: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return len(self.clients)


def _term_kind(term: ExtraGrad | None) -> str | None:
    if term is None:
        return "plain"
    if isinstance(term, ProxGrad):
        return f"prox{term.center.dim()}"
    if isinstance(term, ConstantGrad):
        return "shift"
    return None


def local_sgd_key(call: LocalCall) -> Hashable | None:
    """What the runs' calls must share to train as one (None: the call trains alone): the
    local work (steps, minibatch size, step size), the kind of gradient term, the model, its
    execution policy, the rows' width, dtype and device. The runs' clients, start rows,
    centres, μ and corrections may differ."""
    work, model = call.work, call.ctx.model
    kind = _term_kind(call.extra_grad)
    plain = work.epochs is None and work.optimizer is None and kind is not None
    plain = plain and getattr(model, "clip_grad_norm", None) is None and call.size > 0
    plain = plain and (call.drawn is None or isinstance(call.drawn, torch.Tensor))
    if not plain or lone_part(model, model.num_params, call.size):
        return None
    p = call.params
    model_key = (type(model).__qualname__, model.num_params, model.policy)
    steps = (work.steps, work.batch_size, work.lr)
    return ("local_sgd", kind, steps, model_key, p.shape[-1], p.dtype, str(p.device))


def part_bounds(chunk: int, rows: int, model: BatchedModel | None = None) -> list[tuple[int, int]]:
    """The cache-sized parts ``(a, b)`` of ``rows`` rows, ``chunk`` rows each (the last fewer);
    on a ``model`` whose rows are not independent (``BatchedModel.rows_independent``), a last
    part of one row joined to the one before: no row alone in a call, as no row of a run alone
    is (:func:`lone_part`)."""
    bounds = [(a, min(a + chunk, rows)) for a in range(0, rows, chunk)]
    apart = model is not None and not model.rows_independent
    if apart and chunk > 1 and len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] == 1:
        bounds[-2:] = [(bounds[-2][0], rows)]
    return bounds


def lone_part(model: BatchedModel, width: int, rows: int) -> bool:
    """Whether a run of ``rows`` clients trains, alone, a part of ONE row of ``width`` columns
    where parts may hold several, on a model that computes one row apart from several
    (``BatchedModel.rows_independent`` false: a vmap'ed convolution); stacked, that row would
    share a call and come out different in the last bits, so the call trains alone."""
    if model.rows_independent or model.policy.chunk(width, 2) == 1:
        return False  # (every part of every run one row, alone and stacked)
    return rows == 1 or rows % model.policy.chunk(width, rows) == 1


@dataclass
class _Block:
    """One run's share of the stacked rows: its call and its rows ``start .. stop - 1``."""

    call: LocalCall
    start: int
    stop: int


def stacked_local_sgd(calls: Sequence[LocalCall]) -> list[Trained]:
    """The local SGD of every call (one per run, all with the same :func:`local_sgd_key`) as
    one; each run's result, as its ``local_sgd`` returns it alone."""
    lead = calls[0]
    work, model = lead.work, lead.ctx.model
    blocks, c0 = [], 0
    for call in calls:
        blocks.append(_Block(call, c0, c0 + call.size))
        c0 += call.size
    theta = torch.cat([call.params.expand(call.size, -1) for call in calls])
    pulls = _pulls(blocks, theta, work.lr)
    bounds = part_bounds(model.policy.chunk(theta.shape[1], c0), c0, model)
    batch = _draws(blocks, work.batch_size)  # drawn as the steps go (as a run trained whole)
    if len(bounds) > 1:  # every step's minibatches first, each part its rows (a chunked run)
        batch = drawn_ahead(batch, work.steps)
    losses = torch.empty(c0, device=theta.device)  # (each part's sums, as alone: float32)
    runs = [RunRows(block.call.ctx, block.start, block.stop, work.lr) for block in blocks]
    for a, b in bounds:  # cache-sized parts, each trained all its steps before the next
        hook = None if pulls is None else pulls(a, b)
        losses[a:b] = train_rows(runs, theta[a:b], (a, b), batch, work.steps, hook)
    return [_trained(block, theta, losses) for block in blocks]


@dataclass(frozen=True)
class RunRows:
    """One run's block of a batch's stacked client rows, ``start .. stop - 1``, trained at its
    step size ``lr`` (its model, ``ctx.model``, counts its trained samples)."""

    ctx: RunContext
    start: int
    stop: int
    lr: float


def lr_groups(runs: Sequence[RunRows], a: int, b: int) -> list[tuple[int, int, float]]:
    """The rows ``(first, end, lr)`` among ``a .. b - 1`` of each group of consecutive runs
    sharing lr: one model call each (a step size is the scalar the model's kernels take; a
    per-row column would round the step otherwise)."""
    out: list[tuple[int, int, float]] = []
    for run in runs:
        lo, hi = max(a, run.start), min(b, run.stop)
        if lo >= hi:
            continue
        if out and out[-1][2] == run.lr:
            out[-1] = (out[-1][0], hi, run.lr)
        else:
            out.append((lo, hi, run.lr))
    return out


def train_rows(
    runs: Sequence[RunRows],
    rows: torch.Tensor,
    part: tuple[int, int],
    batch: StepDraw,
    steps: int,
    hook: ColumnHook | None = None,
) -> torch.Tensor:
    """``steps`` SGD steps of the stacked rows ``part = (a, b)`` (``rows [b - a, P]``, in
    place) of the batch's ``runs``, on each step's minibatches ``batch(step)`` (every run's,
    run after run): each run's samples counted by its own model, one model call per group of
    runs sharing lr (:func:`lr_groups`; ``hook``: the model step's column hook, for one group).
    Each row's loss summed over the steps."""
    a, b = part
    model = runs[0].ctx.model
    mine = [(max(a, r.start), min(b, r.stop), r) for r in runs if r.start < b and r.stop > a]
    groups = lr_groups(runs, a, b)
    assert hook is None or len(groups) == 1
    loss_sum = torch.zeros(b - a, device=rows.device)
    for step in range(steps):
        x, y = batch(step)
        for lo, hi, run in mine:  # each run's own trained samples
            run.ctx.model.count_trained(slice_rows(x, lo, hi))
        for lo, hi, lr in groups:
            own = slice(lo - a, hi - a)
            loss = sgd_step(model, rows[own], slice_rows(x, lo, hi), y[lo:hi], lr, hook)
            loss_sum[own].add_(loss)
    return loss_sum


def drawn_ahead(batch: StepDraw, steps: int) -> StepDraw:
    """``batch``'s minibatches of every step drawn now, in order (a round trained in parts:
    each part takes its rows of the same draws)."""
    drawn = [batch(step) for step in range(steps)]
    return drawn.__getitem__


def _trained(block: _Block, theta: torch.Tensor, losses: torch.Tensor) -> Trained:
    """Run ``block``'s result from its rows of the stacked ones."""
    call = block.call
    rows = slice(block.start, block.stop)
    counts = torch.full((call.size,), call.work.steps, dtype=torch.int64, device=call.ctx.device)
    return theta[rows], losses[rows].clone(), counts


def _within(blocks: Sequence[_Block], a: int, b: int) -> list[tuple[int, int, _Block]]:
    """Each run's rows among ``a .. b - 1``: ``(first, end, block)``."""
    out = []
    for block in blocks:
        lo, hi = max(a, block.start), min(b, block.stop)
        if lo < hi:
            out.append((lo, hi, block))
    return out


def _pulls(
    blocks: Sequence[_Block], theta: torch.Tensor, lr: float
) -> Callable[[int, int], ColumnHook] | None:
    """The stacked rows' gradient terms inside the model's step: ``pulls(a, b)``, the column
    hook of the part of rows ``a .. b - 1`` (None: no term). On the CPU each run's rows are
    moved by its own term (:meth:`StepTerm.pull` on its rows, as alone); on a GPU the runs'
    centres (or corrections) are stacked once and every row of a part moved in one launch per
    layer, each run's weight on its own rows."""
    if blocks[0].call.extra_grad is None:
        return None
    if gathers(theta.device):
        return _gathered(blocks, theta, lr)

    def per_run(a: int, b: int) -> ColumnHook:
        hooks = [
            _step_term(block.call.extra_grad)
            .rows(lo - block.start, hi - block.start)
            .pull(theta[lo:hi], lr)
            for lo, hi, block in _within(blocks, a, b)
        ]

        def each(lo: int, hi: int) -> None:
            for hook in hooks:
                hook(lo, hi)

        return each

    return per_run


def _step_term(term: ExtraGrad | None) -> StepTerm:
    assert isinstance(term, StepTerm)
    return term


def prox_pulls(blocks: Sequence[_Block], lr: float) -> list[tuple[torch.Tensor, float]]:
    """Each run's prox centre and pull ``lr * mu_s`` (as its ``ProxGrad.pull`` computes it),
    run after run."""
    out = []
    for block in blocks:
        term = block.call.extra_grad
        assert isinstance(term, ProxGrad)
        out.append((term.center, lr * term.mu))
    return out


def _gathered(
    blocks: Sequence[_Block], theta: torch.Tensor, lr: float
) -> Callable[[int, int], ColumnHook]:
    """The GPU's form of :func:`_pulls`: each part's rows moved in one launch per layer."""
    sizes = [block.stop - block.start for block in blocks]
    if isinstance(blocks[0].call.extra_grad, ProxGrad):
        pulls = prox_pulls(blocks, lr)
        centres = torch.cat(
            [c.expand(n, -1) for (c, _), n in zip(pulls, sizes, strict=True)]
        )  # (a [P] centre: a view per run; [C_s, P] centres: the run's own rows)
        weights = per_row([w for _, w in pulls], sizes, theta)

        def towards_centres(a: int, b: int) -> ColumnHook:
            rows, mine = theta[a:b], centres[a:b]
            weight = weights if isinstance(weights, float) else weights[a:b]

            def pull(lo: int, hi: int) -> None:
                rows[:, lo:hi].lerp_(mine[:, lo:hi], weight)

            return pull

        return towards_centres
    corrections = []
    for block, n in zip(blocks, sizes, strict=True):
        term = block.call.extra_grad
        assert isinstance(term, ConstantGrad)
        corrections.append(term.term.expand(n, -1))
    stacked = torch.cat(corrections)

    def shifted(a: int, b: int) -> ColumnHook:
        rows, term = theta[a:b], stacked[a:b]

        def shift(lo: int, hi: int) -> None:
            rows[:, lo:hi].add_(term[:, lo:hi], alpha=-lr)

        return shift

    return shifted


def _draws(blocks: Sequence[_Block], batch_size: int) -> StepDraw:
    """Every run's minibatches of a step (``draw(step)``), run after run: drawn (or gathered
    from the indices drawn ahead) as one where the runs' draws allow it
    (:mod:`fedhp.engine.run_rows`), else each run's own draw."""
    contexts = [block.call.ctx for block in blocks]
    clients = [block.call.clients for block in blocks]
    ahead = [block.call.drawn for block in blocks]
    if (
        len(blocks) > 1
        and stacks(contexts, batch_size)
        and all(isinstance(a, torch.Tensor) for a in ahead)
    ):
        return _gather_ahead(blocks, stacked_data(contexts))
    own: list[Draw] = [
        block.call.ctx.batches(block.call.clients, batch_size, block.call.drawn) for block in blocks
    ]
    if any(a is not None for a in ahead):  # (drawn ahead by some runs only: each its own)
        contexts, clients = contexts[:1], clients[:1]
    fresh = one_draw(contexts, clients, batch_size, own)
    return lambda step: fresh()


def _gather_ahead(blocks: Sequence[_Block], data: StackedData) -> StepDraw:
    """Step ``step``'s minibatches from every run's indices drawn ahead (``[steps, C', B]``,
    within each client), gathered as one from the stacked data."""
    firsts = []
    for block, start in zip(blocks, data.starts, strict=True):
        train = block.call.ctx.fed.train
        firsts.append((train.offsets[block.call.clients] + start).unsqueeze(1))
    first = torch.cat(firsts)

    def gather(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.cat([_ahead(block)[step] for block in blocks])
        rows = first.to(idx.device) + idx
        return take_rows(data.x, rows), data.y[rows]

    return gather


def _ahead(block: _Block) -> torch.Tensor:
    drawn = block.call.drawn
    assert drawn is not None
    return drawn
