"""Vectorized building blocks the algorithms compose: batched loss/gradients, local SGD,
weighted (segment) averages and broadcasts over the client dimension."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import torch

from fedhp.engine.federation import slice_rows
from fedhp.models.base import BatchedModel

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
        return model.loss_and_grad(params.detach(), x, y)
    return model.loss_and_grad(params.detach(), x, y, buffers=buffers)


def sgd_steps(
    model: BatchedModel,
    params: torch.Tensor,
    batch: Callable[[], tuple[torch.Tensor, torch.Tensor]],
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
    client per step, in step order (no sample weights).

    Trained whole, ``batch()`` is called step by step; in client chunks (the run's policy), or
    with per-client step budgets ``until`` (stragglers' partial work, which may end a chunk's
    steps early), every step's minibatch is drawn first, in the same order, and each chunk takes
    its rows of them, so the result does not depend on the chunking and every step's minibatch
    is drawn whoever stops early."""
    num_clients = params.shape[0]
    if num_clients == 0:  # no clients: the minibatches are still drawn, as the steps would
        for _ in range(steps):
            batch()
        return params.detach().clone(), torch.zeros(0, device=params.device)
    whole = _whole(extra_grad, loss_grad)
    chunk = num_clients if whole else model.policy.chunk(params.shape[1], num_clients)
    if chunk >= num_clients and until is None:

        def lazily(step: int, rows: slice) -> tuple[torch.Tensor, torch.Tensor, None]:
            x, y = batch()
            return x, y, None

        rows_of: WeightedBatch = lazily
    else:
        drawn = [batch() for _ in range(steps)]

        def ahead(step: int, rows: slice) -> tuple[torch.Tensor, torch.Tensor, None]:
            x, y = drawn[step]
            return slice_rows(x, rows.start, rows.stop), y[rows], None

        rows_of = ahead
    return weighted_sgd_steps(
        model,
        params,
        rows_of,
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


WeightedBatch = Callable[[int, slice], tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]
"""``(step, rows) -> (x [c',B,..], y [c',B], weight [c',B] or None)``: step ``step``'s minibatch of
the clients in ``rows`` (a slice of the client dimension), with optional per-sample weights."""


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
    unequal size), optionally on masked sub-models.

    Each client's loss is the weighted mean over its minibatch; a client whose weights are all
    zero at a step is frozen for that step (its whole update, ``extra_grad`` included, is
    masked). ``mask [C, P]`` (0/1, e.g. :func:`fedhp.models.masks.param_mask`): the parameters
    start masked and every gradient is masked, so masked entries stay exactly zero — applied
    outside the model's forward. Returns the new parameters and the per-client loss summed over
    its steps (a tensor, no host sync). The clients are trained in chunks of the run's policy
    (:meth:`~fedhp.engine.policy.ExecutionPolicy.chunk`: cache-resident rows on the CPU, a
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
    parts = []
    for start in range(0, num_clients, chunk):
        stop = min(start + chunk, num_clients)
        rows = slice(start, stop)
        term = extra_grad if extra_grad is None or whole else _rows(extra_grad, start, stop)
        part = params[rows]
        loss_sum = _train_rows(
            model,
            part,
            batch,
            rows,
            steps,
            lr,
            term,
            mask,
            active,
            buffers,
            loss_grad,
            optimizer,
            until,
        )
        parts.append((part, loss_sum))
    if not parts:  # no clients
        return params, torch.zeros(0, device=params.device)
    if len(parts) == 1:
        return parts[0]
    return torch.cat([p for p, _ in parts]), torch.cat([loss for _, loss in parts])


def _rows(term: ExtraGrad, start: int, stop: int) -> ExtraGrad:
    assert isinstance(term, StepTerm)  # the clients are chunked only for these
    return term.rows(start, stop)


def _train_rows(
    model: BatchedModel,
    part: torch.Tensor,
    batch: WeightedBatch,
    rows: slice,
    steps: int,
    lr: float,
    term: ExtraGrad | None,
    mask: torch.Tensor | None,
    active: torch.Tensor | None,
    buffers: torch.Tensor | None,
    loss_grad: LossGrad | None,
    optimizer: LocalOptimizer | None,
    until: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`weighted_sgd_steps`' ``steps`` steps of the clients in ``rows``, in place on their
    parameters ``part``; their losses summed over the steps (a client's up to its ``until``)."""
    loss_and_grad = model.loss_and_grad if loss_grad is None else loss_grad
    plain = (term is None or isinstance(term, StepTerm)) and loss_grad is None and buffers is None
    plain = plain and (optimizer is None or optimizer.plain)
    pull = term.pull(part, lr) if isinstance(term, StepTerm) else None
    velocity = _velocity(part, optimizer)
    loss_sum = torch.zeros(part.shape[0], device=part.device)
    limit, first_done, last_done = _budgets(until, rows, steps, part.device)
    on_host = None if until is None else until[rows]
    for step in range(steps):
        if step >= last_done:  # every client of the chunk has used up its steps
            break
        if active is not None and not bool(active[step, rows].any()):
            continue
        # the clients whose budget is used up: their rows are put back after the step
        done = None if limit is None or step < first_done else limit <= step
        saved = None if done is None else _save_rows(part, buffers, rows)
        x, y, weight = batch(step, rows)
        model.count_trained(x)
        if done is not None and on_host is not None:  # a done straggler's rows are no work
            model.trained_samples -= int((on_host <= step).sum()) * int(x.shape[1])
        if plain and weight is None:  # the model steps inside its backward pass, then the mask
            loss = model.sgd_step(part, x, y, lr, pull)
            if mask is not None:
                part.mul_(mask[rows])
            loss_sum += loss if done is None else _put_back(part, buffers, rows, saved, done, loss)
            continue
        if buffers is None:
            loss, grad = loss_and_grad(part, x, y, weight=weight)
        else:
            bufs = buffers[rows]
            # a frozen client's statistics are restored after the step (torch.where: no
            # boolean indexing, which would wait for the device)
            kept = None if weight is None else bufs.clone()
            kw = {"buffers": bufs}  # BatchNorm models' keyword (see BatchedModel)
            loss, grad = loss_and_grad(part, x, y, weight=weight, **kw)
            if weight is not None and kept is not None:
                idle = (weight.sum(1) == 0).unsqueeze(1)
                bufs.copy_(torch.where(idle, kept, bufs))
        if term is not None:
            grad.add_(term(part))
        live = None if weight is None else weight.sum(1) > 0
        if optimizer is not None and not optimizer.plain:
            grad = optimizer.direction(part, grad, velocity, live)
        if live is not None:
            grad.mul_(live.to(grad.dtype).unsqueeze(1))
        if mask is not None:
            grad.mul_(mask[rows])
        part.add_(grad, alpha=-lr)
        loss_sum += loss if done is None else _put_back(part, buffers, rows, saved, done, loss)
    return loss_sum


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
    """An :data:`ExtraGrad` that :func:`sgd_steps` can fold into the model's own step: with a
    plain optimizer, ``p - lr (grad + term(p))`` is taken as the model's
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
