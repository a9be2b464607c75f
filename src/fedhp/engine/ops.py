"""Vectorized building blocks the algorithms compose: batched loss/gradients, local SGD,
weighted (segment) averages and broadcasts over the client dimension."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
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


def momentum_norm(steps: torch.Tensor, momentum: float = 0.0) -> torch.Tensor:
    """FedNova's a_i for ``steps [n]`` local steps of SGD with heavy-ball ``momentum`` ρ (the
    total weight each step's gradient receives in the final displacement, summed)."""
    tau = steps.to(torch.float64)
    if momentum == 0.0:
        return tau
    rho = momentum
    return (tau - rho * (1 - rho**tau) / (1 - rho)) / (1 - rho)


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """``steps`` SGD steps for all clients at once; ``batch()`` yields each step's ``(x, y)``
    (``optimizer``: momentum / weight decay, :class:`LocalOptimizer`).

    Returns the new parameters and the per-client loss summed over steps (a tensor, no host sync).
    ``buffers [C, B]`` (BatchNorm running statistics; a writable tensor, not an expanded view)
    are updated in place, one update per step.
    Without a non-foldable ``extra_grad`` term the clients are trained in chunks of the run's
    policy (:meth:`~fedhp.engine.policy.ExecutionPolicy.chunk`: cache-resident rows on the CPU,
    a memory budget on CUDA); the minibatches are drawn first, in
    the same order, so the result does not depend on the chunking.
    """
    params = params.detach().clone()
    num_clients = params.shape[0]
    foldable = extra_grad is None or isinstance(extra_grad, StepTerm)
    whole = not foldable or loss_grad is not None
    chunk = num_clients if whole else model.policy.chunk(params.shape[1], num_clients)
    if chunk >= num_clients:
        drawn = (batch() for _ in range(steps))
        return _sgd_loop(model, params, drawn, lr, extra_grad, buffers, loss_grad, optimizer)
    batches = [batch() for _ in range(steps)]
    parts = [
        _sgd_loop(
            model,
            params[s : s + chunk],
            ((slice_rows(x, s, s + chunk), y[s : s + chunk]) for x, y in batches),
            lr,
            None if extra_grad is None else _rows(extra_grad, s, s + chunk),
            None if buffers is None else buffers[s : s + chunk],
            None,
            optimizer,
        )
        for s in range(0, num_clients, chunk)
    ]
    return torch.cat([p for p, _ in parts]), torch.cat([loss for _, loss in parts])


def _rows(term: ExtraGrad, start: int, stop: int) -> ExtraGrad:
    assert isinstance(term, StepTerm)  # sgd_steps chunks clients only for these
    return term.rows(start, stop)


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """``steps`` SGD steps for all clients at once on minibatches with per-sample weights (local
    epochs: a partial last batch, clients of unequal size), optionally on masked sub-models.

    Each client's loss is the weighted mean over its minibatch; a client whose weights are all
    zero at a step is frozen for that step (its whole update, ``extra_grad`` included, is
    masked). ``mask [C, P]`` (0/1, e.g. :func:`fedhp.models.masks.param_mask`): the parameters
    start masked and every gradient is masked, so masked entries stay exactly zero — applied
    outside the model's forward. Returns the new parameters and the per-client loss summed over
    its steps. Chunked over clients like :func:`sgd_steps`; the minibatches are gathered per
    chunk, so the result does not depend on the chunking. ``active [steps, C]`` (bool, on the
    host; optional): which clients have a real sample at each step — a chunk none of whose
    clients is active skips the step (exactly: their updates would be masked anyway).
    ``buffers [C, B]`` (BatchNorm running statistics, writable) are passed to the model's
    ``loss_and_grad`` chunk by chunk and updated in place, except a frozen client's, which are
    restored after the step. ``loss_grad`` replaces the model's ``loss_and_grad`` (all clients in
    one chunk then). ``optimizer``: momentum / weight decay (a frozen client's velocity waits).
    """
    params = params.detach().clone() if mask is None else params.detach() * mask
    num_clients = params.shape[0]
    foldable = extra_grad is None or isinstance(extra_grad, StepTerm)
    whole = not foldable or loss_grad is not None
    chunk = num_clients if whole else model.policy.chunk(params.shape[1], num_clients)
    loss_and_grad = model.loss_and_grad if loss_grad is None else loss_grad
    plain = foldable and loss_grad is None and buffers is None
    plain = plain and (optimizer is None or optimizer.plain)
    parts = []
    for start in range(0, num_clients, chunk):
        stop = min(start + chunk, num_clients)
        rows = slice(start, stop)
        part = params[rows]
        term = extra_grad if extra_grad is None or whole else _rows(extra_grad, start, stop)
        pull = term.pull(part, lr) if isinstance(term, StepTerm) else None
        velocity = _velocity(part, optimizer)
        loss_sum = torch.zeros(part.shape[0], device=params.device)
        for step in range(steps):
            if active is not None and not bool(active[step, rows].any()):
                continue
            x, y, weight = batch(step, rows)
            model.count_trained(x)
            if plain and weight is None:  # the fused step, then the sub-models' mask
                loss_sum += model.sgd_step(part, x, y, lr, pull)
                if mask is not None:
                    part.mul_(mask[rows])
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
            loss_sum += loss
        parts.append((part, loss_sum))
    if not parts:  # no clients
        return params, torch.zeros(0, device=params.device)
    return torch.cat([p for p, _ in parts]), torch.cat([loss for _, loss in parts])


def _sgd_loop(
    model: BatchedModel,
    params: torch.Tensor,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    lr: float,
    extra_grad: ExtraGrad | None,
    buffers: torch.Tensor | None = None,
    loss_grad: LossGrad | None = None,
    optimizer: LocalOptimizer | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    loss_sum = torch.zeros(params.shape[0], device=params.device)
    velocity = _velocity(params, optimizer)
    plain = loss_grad is None and buffers is None and (optimizer is None or optimizer.plain)
    pull = extra_grad.pull(params, lr) if isinstance(extra_grad, StepTerm) else None
    plain = plain and (extra_grad is None or pull is not None)
    for x, y in batches:
        if plain:  # the model steps inside its backward pass (BatchedModel.sgd_step)
            model.count_trained(x)
            loss_sum += model.sgd_step(params, x, y, lr, pull)
            continue
        if loss_grad is None:
            loss, grad = batched_loss_grad(model, params, x, y, buffers=buffers)
        else:
            kw = {} if buffers is None else {"buffers": buffers}
            model.count_trained(x)
            loss, grad = loss_grad(params.detach(), x, y, **kw)
        if extra_grad is not None:
            grad.add_(extra_grad(params))
        if optimizer is not None and not optimizer.plain:
            grad = optimizer.direction(params, grad, velocity)
        params.add_(grad, alpha=-lr)
        loss_sum += loss
    return params, loss_sum


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


def held_mean(
    previous: torch.Tensor, params: torch.Tensor, held: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """Entry-wise weighted mean over the clients holding each entry (HeteroFL's aggregation):
    ``sum_c w_c h_c x_c / sum_c w_c h_c`` for ``params``, ``held [C, P]`` (0/1), ``weights [C]``;
    an entry nobody holds keeps its ``previous [P]`` value."""
    w = weights.to(params.dtype).unsqueeze(1) * held.to(params.dtype)
    total = w.sum(0)
    mean = (w * params).sum(0) / total.clamp(min=torch.finfo(params.dtype).tiny)
    return torch.where(total > 0, mean, previous)


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


def hard_threshold(params: torch.Tensor, tau: int, groups: int = 1) -> torch.Tensor:
    """H_τ: keep the ``tau`` entries of largest ``|x|`` in each row of ``params [.., P]`` (in each
    of its ``groups`` contiguous blocks of P/groups, e.g. a softmax model's class columns), zero
    the rest. Ties are broken deterministically: the lowest index wins (as a stable sort would;
    computed in linear time with ``kthvalue``)."""
    lead, p = params.shape[:-1], params.shape[-1]
    blocks = params.reshape(*lead, groups, p // groups)
    if tau >= blocks.shape[-1]:
        return params.clone()
    size = blocks.abs()
    # the τ-th largest |x| per block, then everything above it plus the lowest-index ties
    kth = size.kthvalue(size.shape[-1] - tau + 1, dim=-1, keepdim=True).values
    mask = size >= kth
    tied = mask.sum(-1) != tau  # blocks where ties straddle the τ-th place (or NaN)
    if bool(tied.any()):
        mask[tied] = _lowest_ties(size[tied], kth[tied], tau)
    return torch.where(mask, blocks, 0.0).reshape(params.shape)


def _lowest_ties(size: torch.Tensor, kth: torch.Tensor, tau: int) -> torch.Tensor:
    """H_τ's mask of the blocks ``size [n, m]`` (τ-th largest ``kth [n, 1]``): the entries above
    ``kth`` plus, of those equal to it, the lowest-index ones up to ``tau`` per block. Only the
    blocks whose ``size >= kth`` does not hold exactly τ entries need it
    (:func:`hard_threshold`)."""
    above, tied = size > kth, size == kth
    need = tau - above.sum(-1, keepdim=True)
    return above | (tied & (tied.cumsum(-1) <= need))
