"""Vectorized building blocks the algorithms compose: batched loss/gradients, local SGD,
weighted (segment) averages and broadcasts over the client dimension."""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from fedhp.engine.federation import slice_rows
from fedhp.engine.graphs import StepGraphs
from fedhp.models.base import BatchedModel, ColumnHook, loss_and_grad, sgd_step

ExtraGrad = Callable[[torch.Tensor], torch.Tensor]
"""Maps parameters ``[C, P]`` to an additive gradient term ``[C, P]`` (prox, penalties)."""

LossGrad = Callable[..., tuple[torch.Tensor, torch.Tensor]]
"""A replacement for the model's ``loss_and_grad(params [C, P], x, y, *, buffers=, weight=)``:
per-client loss ``[C]`` and gradient ``[C, P]`` of a method's own local objective (e.g. MOON's
contrastive term). Always called with all the call's clients at once (no client chunking)."""


@dataclass(frozen=True)
class LocalOptimizer:
    """PyTorch's SGD beyond the plain step: heavy-ball ``momentum`` (dampening 0, no Nesterov;
    the velocity starts at zero every round) and L2 ``weight_decay`` added to the gradient. The
    methods' own gradient terms (prox, SCAFFOLD's correction) are part of the gradient, so the
    momentum and the decay act on them as ``torch.optim.SGD`` would."""

    momentum: float = 0.0
    weight_decay: float = 0.0

    @property
    def plain(self) -> bool:
        return self.momentum == 0.0 and self.weight_decay == 0.0

    def direction(
        self,
        params: torch.Tensor,
        grad: torch.Tensor,
        velocity: torch.Tensor | None,
        live: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The step direction from ``grad`` (modified in place), updating ``velocity`` in place;
        ``live [C]`` (bool): rows that take this step (the others keep their velocity)."""
        if self.weight_decay:
            grad.add_(params, alpha=self.weight_decay)
        if velocity is None or not self.momentum:
            return grad
        new = velocity.mul(self.momentum).add_(grad)
        if live is None:
            velocity.copy_(new)
        else:
            velocity.copy_(torch.where(live.unsqueeze(1), new, velocity))
        return velocity.clone()


@dataclass(frozen=True)
class LocalWork:
    """A round's local SGD, as a method asks :meth:`RunContext.local_sgd
    <fedhp.engine.context.RunContext.local_sgd>` for it: ``steps`` minibatch steps of
    ``batch_size`` samples, or (``epochs`` set) that many passes over each client's own data, of
    step size ``lr``, with ``optimizer``'s momentum / weight decay (None: plain SGD)."""

    lr: float
    batch_size: int
    steps: int = 1
    epochs: int | None = None
    optimizer: LocalOptimizer | None = None


def _velocity(params: torch.Tensor, optimizer: LocalOptimizer | None) -> torch.Tensor | None:
    return torch.zeros_like(params) if optimizer is not None and optimizer.momentum else None


def batched_loss_grad(
    model: BatchedModel,
    params: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    buffers: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-client mean cross-entropy ``[C]`` and its gradient ``[C, P]`` in one backward pass.

    The clients' losses are summed before differentiation; since clients share no parameters, the
    gradient's row c is exactly the gradient of client c's own mean loss. ``buffers [C, B]``
    (BatchNorm running statistics), if given, are updated in place. Counts the samples
    (:meth:`~fedhp.models.base.BatchedModel.count_trained`).
    """
    model.count_trained(x)
    if buffers is None:
        return loss_and_grad(model, params.detach(), x, y)
    return loss_and_grad(model, params.detach(), x, y, buffers=buffers)


XY = tuple[torch.Tensor, torch.Tensor]
"""A minibatch ``(x [C',B,..], y [C',B])`` of every client."""

WeightedBatch = Callable[[int, slice], tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]
"""``(step, rows) -> (x [c',B,..], y [c',B], weight [c',B] or None)``: step ``step``'s minibatch of
the clients in ``rows`` (a slice of the client dimension), with optional per-sample weights."""


class StepBatches:
    """A :data:`WeightedBatch` over ``draw()``, one ``(x, y)`` of every client per step, in step
    order (no sample weights). Trained whole, ``draw()`` is called step by step; in client chunks
    (the run's policy), or with per-client step budgets (stragglers' partial work, which may end
    a chunk's steps early), :func:`weighted_sgd_steps` has every step's minibatch drawn first
    (:meth:`draw_all`), in the same order, and each chunk takes its rows of them, so the result
    does not depend on the chunking and every step's minibatch is drawn whoever stops early."""

    def __init__(self, draw: Callable[[], XY], steps: int) -> None:
        self.draw, self.steps = draw, steps
        self.drawn: list[XY] | None = None

    def draw_all(self) -> None:
        """Draw every step's minibatch now."""
        self.drawn = [self.draw() for _ in range(self.steps)]

    def __call__(self, step: int, rows: slice) -> tuple[torch.Tensor, torch.Tensor, None]:
        if self.drawn is None:
            x, y = self.draw()
            return x, y, None
        x, y = self.drawn[step]
        return slice_rows(x, rows.start, rows.stop), y[rows], None


def sgd_steps(
    model: BatchedModel,
    params: torch.Tensor,
    batch: Callable[[], XY],
    steps: int,
    lr: float,
    extra_grad: ExtraGrad | None = None,
    *,
    buffers: torch.Tensor | None = None,
    loss_grad: LossGrad | None = None,
    optimizer: LocalOptimizer | None = None,
    until: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`weighted_sgd_steps` on the minibatches ``batch()`` yields, one ``(x, y)`` of every
    client per step, in step order (no sample weights; :class:`StepBatches`)."""
    return weighted_sgd_steps(
        model,
        params,
        StepBatches(batch, steps),
        steps,
        lr,
        extra_grad,
        buffers=buffers,
        loss_grad=loss_grad,
        optimizer=optimizer,
        until=until,
    )


def _whole(extra_grad: ExtraGrad | None, loss_grad: LossGrad | None) -> bool:
    """Whether the clients are trained all at once, not in the policy's chunks: a gradient term
    that cannot be cut into rows (not a :class:`StepTerm`) or a method's own ``loss_grad``."""
    foldable = extra_grad is None or isinstance(extra_grad, StepTerm)
    return not foldable or loss_grad is not None


def weighted_sgd_steps(
    model: BatchedModel,
    params: torch.Tensor,
    batch: WeightedBatch,
    steps: int,
    lr: float,
    extra_grad: ExtraGrad | None = None,
    *,
    mask: torch.Tensor | None = None,
    active: torch.Tensor | None = None,
    buffers: torch.Tensor | None = None,
    loss_grad: LossGrad | None = None,
    optimizer: LocalOptimizer | None = None,
    until: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``steps`` SGD steps for all clients at once (the one local-SGD loop of the engine), on
    minibatches with optional per-sample weights (local epochs: a partial last batch, clients of
    unequal size), optionally on masked sub-models. Each step is :func:`_step`.

    Each client's loss is the weighted mean over its minibatch; a client whose weights are all
    zero at a step is frozen for that step (its whole update, ``extra_grad`` included, is
    masked). ``mask [C, P]`` (0/1, e.g. :func:`fedhp.models.masks.param_mask`): the parameters
    start masked and every gradient is masked, so masked entries stay exactly zero — applied
    outside the model's forward. Returns the new parameters and the per-client loss summed over
    its steps (a tensor, no host sync). The clients are trained in chunks of the run's policy
    (:meth:`~fedhp.models.policy.ExecutionPolicy.chunk`: cache-resident rows on the CPU, a
    memory budget on CUDA; all at once with a non-:class:`StepTerm` ``extra_grad`` or a
    ``loss_grad``), each chunk all its steps before the next. ``active [steps, C]`` (bool, on
    the host; optional): which clients have a real sample at each step — a chunk none of whose
    clients is active skips the step (exactly: their updates would be masked anyway).
    ``buffers [C, B]`` (BatchNorm running statistics, writable) are passed to the model's
    ``loss_and_grad`` chunk by chunk and updated in place, except a frozen client's, which are
    restored after the step. ``loss_grad`` replaces the model's ``loss_and_grad``.
    ``optimizer``: momentum / weight decay (a frozen client's velocity waits).
    ``until [C]`` (int64, on the host; optional): client c takes only the steps
    ``0 .. until_c - 1`` (a straggler's partial work, :mod:`fedhp.engine.faults`): from then on
    its parameters and BatchNorm statistics are put back after every step its chunk takes, and
    neither its loss nor its rows' samples (``count_trained``) are counted, so it ends exactly
    where it would have alone after ``until_c`` steps; a chunk all of whose clients are done
    stops. Without it nothing of this runs (no cost).
    """
    params = params.detach().clone() if mask is None else params.detach() * mask
    num_clients = params.shape[0]
    whole = _whole(extra_grad, loss_grad)
    chunk = num_clients if whole else model.policy.chunk(params.shape[1], num_clients)
    ahead = num_clients == 0 or chunk < num_clients or until is not None
    if isinstance(batch, StepBatches) and ahead:  # (no clients: still drawn, as steps would)
        batch.draw_all()
    if num_clients == 0:
        return params, torch.zeros(0, device=params.device)
    run = LocalSteps(model, batch, steps, lr, mask, active, buffers, loss_grad, optimizer, until)
    parts = []
    for start in range(0, num_clients, chunk):
        stop = min(start + chunk, num_clients)
        term = extra_grad if extra_grad is None or whole else _rows(extra_grad, start, stop)
        part = params[start:stop]
        parts.append((part, _train_rows(run, part, slice(start, stop), term)))
    if len(parts) == 1:
        return parts[0]
    return torch.cat([p for p, _ in parts]), torch.cat([loss for _, loss in parts])


def _rows(term: ExtraGrad, start: int, stop: int) -> ExtraGrad:
    assert isinstance(term, StepTerm)  # the clients are chunked only for these
    return term.rows(start, stop)


@dataclass(frozen=True)
class LocalSteps:
    """What every client chunk of one :func:`weighted_sgd_steps` call shares (its arguments)."""

    model: BatchedModel
    batch: WeightedBatch
    steps: int
    lr: float
    mask: torch.Tensor | None = None
    active: torch.Tensor | None = None
    buffers: torch.Tensor | None = None
    loss_grad: LossGrad | None = None
    optimizer: LocalOptimizer | None = None
    until: torch.Tensor | None = None

    def fuses(self, term: ExtraGrad | None) -> bool:
        """Whether a step without sample weights is the model's own
        :meth:`~fedhp.models.base.BatchedModel.sgd_step` (``term`` a :class:`StepTerm` or none,
        plain SGD, the model's loss, no BatchNorm statistics)."""
        plain = (term is None or isinstance(term, StepTerm)) and self.loss_grad is None
        return plain and self.buffers is None and (self.optimizer is None or self.optimizer.plain)


def _train_rows(
    run: LocalSteps, part: torch.Tensor, rows: slice, term: ExtraGrad | None
) -> torch.Tensor:
    """``run``'s steps of the clients in ``rows``, in place on their parameters ``part`` (their
    gradient term ``term``): the step budgets and skipped steps around :func:`_step`; their
    losses summed over the steps (a client's up to its ``until``)."""
    model, buffers = run.model, run.buffers
    velocity = _velocity(part, run.optimizer)
    loss_sum = torch.zeros(part.shape[0], device=part.device)
    limit, first_done, last_done = _budgets(run.until, rows, run.steps, part.device)
    on_host = None if run.until is None else run.until[rows]
    for step in range(run.steps):
        if step >= last_done:  # every client of the chunk has used up its steps
            break
        if run.active is not None and not bool(run.active[step, rows].any()):
            continue
        # the clients whose budget is used up: their rows are put back after the step
        done = None if limit is None or step < first_done else limit <= step
        saved = None if done is None else _save_rows(part, buffers, rows)
        x, y, weight = run.batch(step, rows)
        model.count_trained(x)
        if done is not None and on_host is not None:  # a done straggler's rows are no work
            model.trained_samples -= int((on_host <= step).sum()) * int(x.shape[1])
        loss = _step(run, part, rows, term, velocity, (x, y, weight))
        loss_sum += loss if done is None else _put_back(part, buffers, rows, saved, done, loss)
    return loss_sum


def _step(
    run: LocalSteps,
    part: torch.Tensor,
    rows: slice,
    term: ExtraGrad | None,
    velocity: torch.Tensor | None,
    batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None],
) -> torch.Tensor:
    """One local SGD step of the clients in ``rows``, in place on their parameters ``part``:

        p <- p - lr d,   d = direction(grad F_i(p) + term(p))

    ``grad F_i``: the gradient of the (weighted) mean loss of the minibatch ``batch``;
    ``term``: the method's additive gradient term (FedProx's ``mu (p - w)``, SCAFFOLD's
    ``c - c_i``); ``direction``: ``run.optimizer``'s momentum and weight decay (plain SGD: the
    gradient itself). Returns the step's losses ``[c']`` at the start point."""
    x, y, weight = batch
    mask = None if run.mask is None else run.mask[rows]
    if weight is not None or not run.fuses(term):
        loss, grad = _loss_grad(run, part, rows, x, y, weight)
        if term is not None:
            grad.add_(term(part))
        live = None if weight is None else weight.sum(1) > 0
        if run.optimizer is not None and not run.optimizer.plain:
            grad = run.optimizer.direction(part, grad, velocity, live)
        if live is not None:
            grad.mul_(live.to(grad.dtype).unsqueeze(1))
        if mask is not None:
            grad.mul_(mask)
        part.add_(grad, alpha=-run.lr)
        return loss
    # plain SGD: the same step inside the model's backward pass (no [C, P] gradient), the term's
    # ``- lr term(p)`` moving each layer's columns just before their gradient step
    pull = term.pull(part, run.lr) if isinstance(term, StepTerm) else None
    loss = sgd_step(run.model, part, x, y, run.lr, pull)
    if mask is not None:
        part.mul_(mask)
    return loss


def _loss_grad(
    run: LocalSteps,
    part: torch.Tensor,
    rows: slice,
    x: torch.Tensor,
    y: torch.Tensor,
    weight: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The losses ``[c']`` and gradient ``[c', P]`` of the rows' objective (the model's, or the
    method's own ``loss_grad``), their BatchNorm statistics updated in place (a frozen client's
    restored)."""
    objective = run.loss_grad
    if objective is None:
        objective = functools.partial(loss_and_grad, run.model)
    if run.buffers is None:
        return objective(part, x, y, weight=weight)
    bufs = run.buffers[rows]
    # a frozen client's statistics are restored after the step (torch.where: no boolean
    # indexing, which would wait for the device)
    kept = None if weight is None else bufs.clone()
    kw = {"buffers": bufs}  # BatchNorm models' keyword (see BatchedModel)
    loss, grad = objective(part, x, y, weight=weight, **kw)
    if weight is not None and kept is not None:
        idle = (weight.sum(1) == 0).unsqueeze(1)
        bufs.copy_(torch.where(idle, kept, bufs))
    return loss, grad


def _budgets(
    until: torch.Tensor | None, rows: slice, steps: int, device: torch.device
) -> tuple[torch.Tensor | None, int, int]:
    """The step budgets of the clients in ``rows`` (on ``device``; None: every client takes all
    ``steps``), the first step at which one of them is done and the step at which all are."""
    if until is None:
        return None, steps, steps
    limit = until[rows]
    if len(limit) == 0:
        return None, steps, steps
    return limit.to(device), min(int(limit.min()), steps), min(int(limit.max()), steps)


_Saved = tuple[torch.Tensor, torch.Tensor | None]


def _save_rows(part: torch.Tensor, buffers: torch.Tensor | None, rows: slice) -> _Saved:
    """Copies of the chunk's parameters and BatchNorm statistics before a step."""
    return part.clone(), None if buffers is None else buffers[rows].clone()


def _put_back(
    part: torch.Tensor,
    buffers: torch.Tensor | None,
    rows: slice,
    saved: _Saved | None,
    done: torch.Tensor,
    loss: torch.Tensor,
) -> torch.Tensor:
    """Put the ``done`` clients' parameters and statistics back as ``saved`` before the step
    (the others keep the step); the step's ``loss`` with theirs zeroed."""
    assert saved is not None
    gone = done.unsqueeze(1)
    part.copy_(torch.where(gone, saved[0], part))
    if buffers is not None and saved[1] is not None:
        bufs = buffers[rows]
        bufs.copy_(torch.where(gone, saved[1], bufs))
    return loss.masked_fill(done, 0.0)


class StepTerm(ABC):
    """An :data:`ExtraGrad` that the local step (:func:`_step`) can fold into the model's own:
    with a plain optimizer, ``p - lr (grad + term(p))`` is taken as the model's
    :meth:`~fedhp.models.base.BatchedModel.sgd_step` with :meth:`pull` as its column hook (one
    pass over the rows, no ``[C, P]`` gradient or term temporaries; the same values up to
    rounding)."""

    @abstractmethod
    def __call__(self, p: torch.Tensor) -> torch.Tensor:
        """The term's gradient at ``p [C, P]`` (broadcastable against it; read, not written)."""

    @abstractmethod
    def pull(self, params: torch.Tensor, lr: float) -> Callable[[int, int], None]:
        """The hook that moves the columns ``lo .. hi - 1`` of ``params`` by ``-lr`` times the
        term (read at the old values)."""

    @abstractmethod
    def rows(self, start: int, stop: int) -> StepTerm:
        """The term of clients ``start .. stop - 1`` (for client chunks)."""


def _row_slice(t: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Rows ``start .. stop - 1`` of a per-client ``[C, P]`` tensor; a shared ``[P]`` (or a
    broadcast ``[1, P]``) as is."""
    return t if t.dim() == 1 or t.shape[0] == 1 else t[start:stop]


@dataclass(frozen=True)
class ProxGrad(StepTerm):
    """Gradient of ``mu/2 ||p - center||^2`` (``center`` ``[P]`` or one row per client): the
    step ``p - lr (grad + mu (p - center))`` is ``lerp(p, center, lr mu) - lr grad``."""

    center: torch.Tensor
    mu: float

    def __call__(self, p: torch.Tensor) -> torch.Tensor:
        return (p - self.center).mul_(self.mu)

    def pull(self, params: torch.Tensor, lr: float) -> Callable[[int, int], None]:
        weight = lr * self.mu

        def towards_center(lo: int, hi: int) -> None:
            params[:, lo:hi].lerp_(self.center[..., lo:hi], weight)

        return towards_center

    def rows(self, start: int, stop: int) -> ProxGrad:
        return ProxGrad(_row_slice(self.center, start, stop), self.mu)


@dataclass(frozen=True)
class ConstantGrad(StepTerm):
    """A gradient term that does not depend on the parameters (SCAFFOLD's correction
    ``c - c_i``, ``[P]`` or one row per client): the step is ``p - lr term - lr grad``."""

    term: torch.Tensor

    def __call__(self, p: torch.Tensor) -> torch.Tensor:
        return self.term

    def pull(self, params: torch.Tensor, lr: float) -> Callable[[int, int], None]:
        def shift(lo: int, hi: int) -> None:
            params[:, lo:hi].add_(self.term[..., lo:hi], alpha=-lr)

        return shift

    def rows(self, start: int, stop: int) -> ConstantGrad:
        return ConstantGrad(_row_slice(self.term, start, stop))


def prox_grad(center: torch.Tensor, mu: float) -> ExtraGrad:
    """Gradient of ``mu/2 ||p - center||^2``; ``center`` broadcasts against ``p``."""
    return ProxGrad(center, mu)


def normalized(weights: torch.Tensor) -> torch.Tensor:
    """Weights scaled to sum to one."""
    return weights / weights.sum()


def mean_group_loss(losses: torch.Tensor, groups: int) -> float:
    """The round's mean training loss from per-step losses ``[S, clients]``: the clients' mean of
    each step, summed in step order, over ``groups``."""
    total = torch.zeros((), device=losses.device)
    for loss in losses:
        total += loss.mean()
    return float(total) / groups


def weighted_mean(params: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``sum_c w_c params_c / sum_c w_c`` → ``[P]``."""
    return normalized(weights.to(params.dtype)) @ params


def segment_mean(
    params: torch.Tensor, segment: torch.Tensor, weights: torch.Tensor, num_segments: int
) -> torch.Tensor:
    """Weighted mean of the rows of ``params [C, P]`` within each segment → ``[S, P]``.

    Segments with zero total weight get zero rows.
    """
    w = weights.to(params.dtype)
    totals = torch.zeros(num_segments, dtype=params.dtype, device=params.device)
    totals.index_add_(0, segment, w)
    out = torch.zeros(num_segments, params.shape[1], dtype=params.dtype, device=params.device)
    out.index_add_(0, segment, params * w.unsqueeze(1))
    return out / totals.clamp(min=torch.finfo(params.dtype).tiny).unsqueeze(1)


def model_steps(
    model: BatchedModel,
    rows: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    steps: tuple[int, float],
    pull: Callable[[int, int], None],
) -> torch.Tensor:
    """``steps = (K, lr)``: the model's K ``sgd_step`` calls on ``rows`` with the ``pull`` hook;
    the data loss at the last step's start point. Kernels only (what a CUDA graph records)."""
    k, lr = steps
    loss = torch.zeros(rows.shape[0], device=rows.device)
    for _ in range(k):
        loss = sgd_step(model, rows, x, y, lr, pull)
    return loss


def graph_steps(
    graphs: StepGraphs,
    key: Hashable,
    batch: tuple[BatchedModel, torch.Tensor, torch.Tensor, torch.Tensor],
    steps: tuple[int, float],
    pull_of: Callable[..., ColumnHook],
    tensors: Sequence[torch.Tensor] = (),
    stacked: bool = False,
) -> torch.Tensor:
    """:func:`model_steps` of ``batch = (model, rows, x, y)`` (``rows`` stepped in place) with
    the column hook ``pull_of(rows, *tensors)``, replayed from one CUDA graph per ``key``,
    ``steps`` and argument shapes where the run asks for graphs
    (:class:`~fedhp.engine.graphs.StepGraphs`; ``stacked``: a batch of runs' steps): the graph
    reads ``rows``, ``x``, ``y`` and ``tensors`` and writes ``rows`` and the loss. The one place
    the engine captures a method's local steps (sFedHP's and pFedMe's θ steps)."""
    model, rows, x, y = batch

    def kernels(rows: Tensor, x: Tensor, y: Tensor, *own: Tensor) -> Tensor:
        return model_steps(model, rows, x, y, steps, pull_of(rows, *own))

    args = [rows, x, y, *tensors]
    loss = graphs.run((key, *steps), kernels, args, writes=(0,), stacked=stacked)
    assert loss is not None
    return loss
