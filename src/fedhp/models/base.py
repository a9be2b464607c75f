"""Batched multi-client models over a flat parameter tensor.

Every model's parameters live in ONE flat tensor ``[C, P]`` (a leading client dimension ``C``);
layers are views into it. Aggregation, sparsification, hard thresholding and byte accounting then
act on plain ``[C, P]`` tensors, and autograd returns gradients in the same ``[C, P]`` shape.

Models with BatchNorm also have per-client *buffers* (the running means and variances), the rows
of a ``[C, B]`` tensor beside the parameters (:class:`BufferLayout`); models without have
``B = 0``. In training mode every client normalizes with its own batch's statistics and updates
its own row of the buffers in place; in eval mode each client normalizes with the row it is given.

Each model also exposes a plain ``torch.nn.Module`` (its *reference* form) with the same parameter
and buffer names and order; the reference path and the tests use it to check the batched
forward/backward.
"""

from __future__ import annotations

import contextlib
import copy
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from math import prod

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from fedhp.engine.policy import CPU_POLICY, ExecutionPolicy, widened

ColumnHook = Callable[[int, int], None]
"""``(lo, hi)``: act in place on columns ``lo .. hi - 1`` of a step's flat rows
(:meth:`BatchedModel.sgd_step`)."""


@dataclass(frozen=True)
class ParamSpec:
    """One named tensor: its shape and where it sits in the flat vector."""

    name: str
    shape: tuple[int, ...]
    offset: int

    @property
    def numel(self) -> int:
        return prod(self.shape)


class FlatLayout:
    """The order and shapes of named tensors inside a flat ``[.., N]`` vector."""

    def __init__(self, named: list[tuple[str, torch.Tensor]]) -> None:
        specs: list[ParamSpec] = []
        offset = 0
        for name, p in named:
            specs.append(ParamSpec(name, tuple(p.shape), offset))
            offset += p.numel()
        self.specs = tuple(specs)
        self.size = offset

    def view(self, flat: torch.Tensor, spec: ParamSpec) -> torch.Tensor:
        """View of one tensor for every client: ``[C, *shape]`` (or ``shape`` for 1-D flat)."""
        lead = flat.shape[:-1]
        return flat[..., spec.offset : spec.offset + spec.numel].reshape(*lead, *spec.shape)

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Name → view, for ``torch.func.functional_call``."""
        return {s.name: self.view(flat, s) for s in self.specs}

    def _tensors(self, module: nn.Module) -> list[torch.Tensor]:
        raise NotImplementedError

    def flatten_module(self, module: nn.Module) -> torch.Tensor:
        """A module's tensors as one flat ``[N]`` tensor (copied)."""
        tensors = self._tensors(module)
        if not tensors:
            return torch.zeros(0)
        return torch.cat([t.detach().reshape(-1) for t in tensors])

    def load_into(self, module: nn.Module, flat: torch.Tensor) -> None:
        """Copy a flat ``[N]`` vector into a module's tensors (in place)."""
        with torch.no_grad():
            for spec, t in zip(self.specs, self._tensors(module), strict=True):
                t.copy_(self.view(flat, spec))


class ParamLayout(FlatLayout):
    """The order and shapes of a module's parameters inside the flat ``[.., P]`` vector."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__(list(module.named_parameters()))

    def _tensors(self, module: nn.Module) -> list[torch.Tensor]:
        return list(module.parameters())


class BufferLayout(FlatLayout):
    """A module's floating-point buffers (BatchNorm running means and variances) inside the flat
    ``[.., B]`` buffer vector.

    BatchNorm's integer ``num_batches_tracked`` counters are left out: they only matter with
    ``momentum=None`` (a cumulative average), which is refused here; with a fixed momentum they
    are never read."""

    def __init__(self, module: nn.Module) -> None:
        for name, m in module.named_modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.momentum is None:
                raise ValueError(f"{name}: BatchNorm with momentum=None is not supported")
        super().__init__([(n, b) for n, b in module.named_buffers() if b.is_floating_point()])

    def _tensors(self, module: nn.Module) -> list[torch.Tensor]:
        return [b for b in module.buffers() if b.is_floating_point()]


class _VmapBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm whose running-statistics update works under ``torch.func.vmap`` (the built-in
    one's batching rule does not write the update back into batched buffers). Normalization is
    ``F.batch_norm``'s; the update is PyTorch's: ``r <- (1 - m) r + m stat`` with the unbiased
    batch variance. Swapped in for ``BatchNorm1d/2d`` on the vectorized path only.

    ``sample_weight [N]`` (set by :func:`sample_weights` for one call): training-mode statistics
    over the samples weighted by it, so that padding (weight 0, e.g. a partial last batch) is
    left out exactly as a smaller batch would leave it out."""

    sample_weight: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training and self.track_running_stats:
            return F.batch_norm(
                x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps
            )
        if self.sample_weight is not None:
            return self._weighted(x, self.sample_weight)
        if self.track_running_stats and self.running_mean is not None:
            assert self.running_var is not None and self.momentum is not None
            dims = [0, *range(2, x.dim())]
            n = x.numel() // x.shape[1]
            with torch.no_grad():
                var, mean = torch.var_mean(x, dims, correction=1 if n > 1 else 0)
                self._update_running(mean, var)
        return F.batch_norm(x, None, None, self.weight, self.bias, True, 0.0, self.eps)

    def _update_running(self, mean: torch.Tensor, unbiased_var: torch.Tensor) -> None:
        assert self.running_mean is not None and self.running_var is not None
        assert self.momentum is not None
        self.running_mean.mul_(1 - self.momentum).add_(mean, alpha=self.momentum)
        self.running_var.mul_(1 - self.momentum).add_(unbiased_var, alpha=self.momentum)

    def _weighted(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """Batch normalization with statistics weighted by ``w [N]`` (per sample; spatial
        positions share their sample's weight)."""
        dims = [0, *range(2, x.dim())]
        shape = (1, -1, *[1] * (x.dim() - 2))
        wx = w.reshape(-1, *[1] * (x.dim() - 1)).to(x.dtype)
        total = (w.sum() * (x[0, 0].numel())).clamp(min=torch.finfo(x.dtype).tiny)
        mean = (x * wx).sum(dims) / total
        centred = x - mean.reshape(shape)
        var = (centred.square() * wx).sum(dims) / total
        if self.track_running_stats and self.running_mean is not None:
            with torch.no_grad():
                unbiased = torch.where(total > 1, var * total / (total - 1).clamp(min=1e-12), var)
                self._update_running(mean, unbiased)
        out = centred * torch.rsqrt(var + self.eps).reshape(shape)
        if self.weight is not None and self.bias is not None:
            out = out * self.weight.reshape(shape) + self.bias.reshape(shape)
        return out


@contextlib.contextmanager
def sample_weights(module: nn.Module, weight: torch.Tensor | None) -> Iterator[None]:
    """Within the block, the :class:`_VmapBatchNorm` layers of ``module`` take their training
    statistics over the samples weighted by ``weight [N]`` (None: every sample counts)."""
    layers = [m for m in module.modules() if isinstance(m, _VmapBatchNorm)]
    for m in layers:
        m.sample_weight = weight
    try:
        yield
    finally:
        for m in layers:
            m.sample_weight = None


def vmappable(module: nn.Module) -> nn.Module:
    """``module`` itself if it has no BatchNorm, else a copy whose BatchNorm layers update their
    running statistics under ``vmap`` (same parameter and buffer names)."""
    if not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules()):
        return module
    out = copy.deepcopy(module)
    for m in out.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.__class__ = type(f"Vmap{type(m).__name__}", (_VmapBatchNorm, type(m)), {})
    return out


class FeatureNet(nn.Module):
    """A network split into a feature extractor and a linear head: ``forward(x)`` is
    ``head(embed(x))``; ``forward(x, features=True)`` also returns the penultimate features."""

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Penultimate features ``[B, H]``."""
        raise NotImplementedError

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, K]`` from features."""
        raise NotImplementedError

    def forward(
        self, x: torch.Tensor, features: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        h = self.embed(x)
        out = self.head(h)
        return (out, h) if features else out


def batch_norm_weight(weight: torch.Tensor | None) -> torch.Tensor | None:
    """``weight [C, B]`` as BatchNorm's per-sample statistic weights, or None when every sample
    counts fully (all ones: PyTorch's own fused batch norm is then used, bit for bit)."""
    if weight is None or bool((weight == 1).all()):
        return None
    return weight


def weighted_client_mean(losses: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    """Per-client mean ``[C]`` of per-sample values ``[C, B]``, weighted by ``weight [C, B]``
    (plain mean without weights; rows of zero total weight give 0)."""
    if weight is None:
        return losses.mean(1)
    return (losses * weight).sum(1) / sample_weight_totals(weight)


def sample_weight_totals(weight: torch.Tensor) -> torch.Tensor:
    """Per-client total weight ``[C]`` of ``weight [C, B]``, kept away from zero."""
    return weight.sum(1).clamp(min=torch.finfo(weight.dtype).tiny)


def training_flops(module: nn.Module, feature_shape: tuple[int, ...], batch: int = 2) -> int:
    """Training FLOPs of one sample for ``module``: a forward pass and the backward pass of the
    cross-entropy loss with respect to the parameters only, as PyTorch's FlopCounterMode counts
    them (2 per multiply-add of matrix products and convolutions; bias additions, activations,
    normalization and the loss are not counted).

    The input does not need a gradient, so the first layer's input gradient, which no training
    step needs and the engine never computes, is not counted: the first layer's backward pass
    costs its forward FLOPs once (the weight gradient), every later layer's twice (weight and
    input gradients). The count runs on the meta device (no arithmetic, no memory; on the
    CPU if an operation has no meta kernel) in training mode, over ``batch`` samples (the
    counts are linear in the batch; 2 keeps BatchNorm's training statistics defined)."""
    try:
        return _training_flops(module, feature_shape, batch, torch.device("meta"))
    except (NotImplementedError, RuntimeError):  # an operation without a meta kernel
        return _training_flops(module, feature_shape, batch, torch.device("cpu"))


def _training_flops(
    module: nn.Module, feature_shape: tuple[int, ...], batch: int, device: torch.device
) -> int:
    clone = copy.deepcopy(module).to(device).train()
    x = torch.zeros(batch, *feature_shape, device=device)
    y = torch.zeros(batch, dtype=torch.long, device=device)
    counter = FlopCounterMode(display=False)
    with counter:
        F.cross_entropy(clone(x), y).backward()
    total = int(counter.get_total_flops())
    if total % batch:
        raise AssertionError(f"training FLOPs {total} not a multiple of the batch {batch}")
    return total // batch


class BatchedModel(ABC):
    """A model evaluated for many clients at once: ``forward(flat [C,P], x [C,B,...])``.

    ``reports_objective``: evaluation also logs the training objective (sparse-learning losses,
    :mod:`fedhp.models.linear`); ``sparsity_groups``: blocks of P thresholded separately by H_τ."""

    reports_objective: bool = False
    sparsity_groups: int = 1

    def __init__(self, reference: nn.Module, feature_shape: tuple[int, ...], num_classes: int):
        self.reference = reference
        self.feature_shape = feature_shape
        self.num_classes = num_classes
        self.layout = ParamLayout(reference)
        self.buffer_layout = BufferLayout(reference)
        self._flops: int | None = None
        self._train_flops: int | None = None
        self._batch_norm = any(
            isinstance(m, nn.modules.batchnorm._BatchNorm) for m in reference.modules()
        )
        self.trained_samples = 0
        """Samples of every gradient evaluation the engine ran (:meth:`count_trained`)."""
        self.policy: ExecutionPolicy = CPU_POLICY
        """How the engine batches this model's work on its device (the run's policy, set by
        :func:`fedhp.build.build_experiment`; the CPU's otherwise)."""

    @property
    def num_params(self) -> int:
        return self.layout.size

    @property
    def num_buffers(self) -> int:
        """``B``: running-statistics values per client (0 without BatchNorm)."""
        return self.buffer_layout.size

    def statistic_weight(self, weight: torch.Tensor | None) -> torch.Tensor | None:
        """``weight [C, B]`` as BatchNorm's per-sample statistic weights
        (:func:`batch_norm_weight`); None for a model without BatchNorm layers, whose forward
        ignores them: its training steps then skip the all-ones check, a host sync on CUDA."""
        return batch_norm_weight(weight) if self._batch_norm else None

    def init_params(self, seed: int) -> torch.Tensor:
        """Initial flat ``[P]`` parameters: PyTorch's default init of the reference module."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for m in self.reference.modules():
                reset = getattr(m, "reset_parameters", None)
                if m is not self.reference and callable(reset):
                    reset()
            return self.layout.flatten_module(self.reference).clone()

    def init_buffers(self) -> torch.Tensor:
        """Initial flat ``[B]`` buffers (running means 0, variances 1; empty without BatchNorm)."""
        module = copy.deepcopy(self.reference)
        for m in module.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.reset_running_stats()
        return self.buffer_layout.flatten_module(module).clone()

    def _buffers_for(self, flat: torch.Tensor, buffers: torch.Tensor | None) -> torch.Tensor:
        """``buffers``, or fresh initial ones ``[C, B]`` (discarded after the call)."""
        if buffers is not None:
            return buffers
        return self.init_buffers().to(flat.device).expand(flat.shape[0], -1).clone()

    @abstractmethod
    def forward(
        self,
        flat: torch.Tensor,
        x: torch.Tensor,
        *,
        buffers: torch.Tensor | None = None,
        train: bool = False,
    ) -> torch.Tensor:
        """Logits ``[C, B, K]`` for parameters ``[C, P]`` and inputs ``[C, B, *feature_shape]``.

        ``buffers [C, B]``: each client's BatchNorm running statistics (None: the initial ones);
        ``train``: normalize with the batch's statistics and update ``buffers`` in place."""

    @abstractmethod
    def forward_with_features(
        self,
        flat: torch.Tensor,
        x: torch.Tensor,
        *,
        buffers: torch.Tensor | None = None,
        train: bool = False,
        weight: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits ``[C, B, K]`` and the penultimate features ``[C, B, H]`` (the head's input) in
        one differentiable forward, e.g. for feature-norm penalties or representations.

        ``weight [C, B]`` (optional, training mode): per-sample weights of the BatchNorm batch
        statistics (padding has weight 0); models without BatchNorm ignore it."""

    def loss_and_grad(
        self,
        flat: torch.Tensor,
        x: torch.Tensor,
        y: torch.Tensor,
        *,
        buffers: torch.Tensor | None = None,
        weight: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-client mean cross-entropy ``[C]`` and its gradient ``[C, P]`` (training mode:
        ``buffers [C, B]``, if given, are updated in place with the batches' statistics).

        ``weight [C, B]`` (optional): per-sample weights; each client's loss is then the weighted
        mean over its samples (0 for padding, e.g. a partial last batch; a row of zeros gives
        loss 0 and gradient 0).

        Autograd over per-layer leaf copies (not over slices of the flat tensor, whose backward
        would materialize a zero-filled ``[C, P]`` buffer per parameter). The clients' losses are
        summed before differentiation; as clients share no parameters, row c of the gradient is
        exactly the gradient of client c's own loss.
        """
        loss, grad, _ = self._autograd_loss(flat, x, y, buffers, weight)
        return loss, grad

    def sgd_step(
        self,
        flat: torch.Tensor,
        x: torch.Tensor,
        y: torch.Tensor,
        lr: float,
        before: ColumnHook | None = None,
    ) -> torch.Tensor:
        """One SGD step of every client's rows of ``flat [C, P]`` in place on its minibatch
        ``x, y`` (``flat -= lr * grad`` of its mean cross-entropy); returns the losses ``[C]``
        at the start point. ``before(lo, hi)``, if given, is called for every parameter's
        columns ``lo .. hi - 1`` once the gradient no longer reads their old values and before
        their gradient step: a method's own in-place change of the rows (e.g. a proximal pull,
        ``rows.lerp_(centre, a)``), so ``before`` then the step is one pass. Models that can
        update the parameters inside their backward pass (:class:`~fedhp.models.zoo.BatchedMLP`)
        override it to skip the ``[C, P]`` gradient."""
        loss, grad = self.loss_and_grad(flat, x, y)
        if before is not None:
            for spec in self.layout.specs:
                before(spec.offset, spec.offset + spec.numel)
        flat.add_(grad, alpha=-lr)
        return loss

    def _autograd_loss(
        self,
        flat: torch.Tensor,
        x: torch.Tensor,
        y: torch.Tensor,
        buffers: torch.Tensor | None,
        weight: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The generic :meth:`loss_and_grad` and the forward's logits (detached)."""
        leaves = [
            self.layout.view(flat, s).detach().contiguous().requires_grad_(True)
            for s in self.layout.specs
        ]
        params = {s.name: leaf for s, leaf in zip(self.layout.specs, leaves, strict=True)}
        with self.policy.autocast():  # bf16: a lower-precision forward, float32 leaves
            logits = self.forward_params(
                params, x, buffers=buffers, train=True, weight=self.statistic_weight(weight)
            )
        logits = widened(logits)
        c, b = logits.shape[0], logits.shape[1]
        losses = F.cross_entropy(logits.reshape(c * b, -1), y.reshape(-1), reduction="none")
        per_client = weighted_client_mean(losses.view(c, b), weight)
        grads = torch.autograd.grad(per_client.sum(), leaves)
        grad = torch.cat([g.reshape(c, -1) for g in grads], dim=1)
        return per_client.detach(), grad, logits.detach()

    def loss_grad_correct(
        self,
        flat: torch.Tensor,
        x: torch.Tensor,
        y: torch.Tensor,
        *,
        buffers: torch.Tensor | None = None,
        weight: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`loss_and_grad` plus each sample's correctness ``[C, B]`` (bool) under the same
        training-mode forward (no second forward on the generic autograd path; models with their
        own ``loss_and_grad`` add an evaluation forward)."""
        if type(self).loss_and_grad is BatchedModel.loss_and_grad:
            loss, grad, logits = self._autograd_loss(flat, x, y, buffers, weight)
            return loss, grad, self.correct(logits, y)
        loss, grad = self.loss_and_grad(flat, x, y, buffers=buffers, weight=weight)
        with torch.no_grad():
            return loss, grad, self.correct(self.forward(flat, x, buffers=buffers), y)

    def sample_losses(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Per-sample loss (shape of ``y``) from logits ``[..., K]``: cross-entropy."""
        k = logits.shape[-1]
        return F.cross_entropy(logits.reshape(-1, k), y.reshape(-1), reduction="none").view(y.shape)

    def correct(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Per-sample correctness (bool, shape of ``y``): the top logit is the label."""
        return logits.argmax(-1) == y

    def regularizer(self, flat: torch.Tensor) -> torch.Tensor:
        """Regularization term of each row of ``flat [.., P]`` added to the objective (none)."""
        return torch.zeros(flat.shape[:-1], dtype=flat.dtype, device=flat.device)

    def forward_params(
        self,
        params: dict[str, torch.Tensor],
        x: torch.Tensor,
        *,
        buffers: torch.Tensor | None = None,
        train: bool = False,
        weight: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Like :meth:`forward`, from per-parameter tensors ``name -> [C, *shape]``.

        ``weight [C, B]``: per-sample weights of BatchNorm's batch statistics (see
        :meth:`forward_with_features`); this generic form has no BatchNorm and ignores them."""
        flat = torch.cat([params[s.name].reshape(x.shape[0], -1) for s in self.layout.specs], 1)
        return self.forward(flat, x, buffers=buffers, train=train)

    def make_module(self, flat: torch.Tensor, buffers: torch.Tensor | None = None) -> nn.Module:
        """A fresh plain ``nn.Module`` holding the flat ``[P]`` parameters and ``[B]`` buffers
        (reference path)."""
        module = copy.deepcopy(self.reference)
        self.layout.load_into(module, flat)
        if buffers is not None:
            self.buffer_layout.load_into(module, buffers)
        return module

    @property
    def forward_flops(self) -> int:
        """:meth:`flops_per_sample`, counted once, then cached."""
        if self._flops is None:
            self._flops = self.flops_per_sample()
        return self._flops

    def flops_per_sample(self) -> int:
        """Forward FLOPs for one sample (counted by PyTorch's FlopCounterMode)."""
        x = torch.zeros(1, *self.feature_shape)
        counter = FlopCounterMode(display=False)
        module = copy.deepcopy(self.reference).eval()
        with counter, torch.no_grad():
            module(x)
        return int(counter.get_total_flops())

    def train_flops_per_sample(self) -> int:
        """Training FLOPs of one sample, as the engine computes them (:func:`training_flops` of
        the reference module; counted once, then cached)."""
        if self._train_flops is None:
            self._train_flops = training_flops(self.reference, self.feature_shape)
        return self._train_flops

    def count_trained(self, x: torch.Tensor) -> None:
        """Add the samples of one gradient evaluation on ``x [C, B, ...]`` to
        :attr:`trained_samples`: all ``C * B`` rows, padding (weight 0) included, since the kernels
        compute those rows too. Reads only the shape: no host sync."""
        self.trained_samples += int(x.shape[0]) * int(x.shape[1])

    @property
    def train_flops(self) -> int:
        """Training FLOPs of the gradient evaluations counted so far: :attr:`trained_samples`
        times :meth:`train_flops_per_sample`."""
        return self.trained_samples * self.train_flops_per_sample()


class VmapModel(BatchedModel):
    """Generic batched form of any module, via ``torch.func.vmap`` over ``functional_call``.

    One client of a large model (:meth:`~fedhp.engine.policy.ExecutionPolicy.direct`: at least
    2.5 M parameters; the CPU trains such models client by client) is run by a plain
    ``functional_call`` of the reference module instead: vmap's batched-weight convolutions cost
    about twice a plain loop's for VGG-11 (docs/benchmarks.md). Feature taps need a
    :class:`FeatureNet` reference."""

    def __init__(self, reference: nn.Module, feature_shape: tuple[int, ...], num_classes: int):
        super().__init__(reference, feature_shape, num_classes)
        self.functional = vmappable(reference)

    def forward(
        self,
        flat: torch.Tensor,
        x: torch.Tensor,
        *,
        buffers: torch.Tensor | None = None,
        train: bool = False,
    ) -> torch.Tensor:
        return self.forward_params(self.layout.unflatten(flat), x, buffers=buffers, train=train)

    def forward_params(
        self,
        params: dict[str, torch.Tensor],
        x: torch.Tensor,
        *,
        buffers: torch.Tensor | None = None,
        train: bool = False,
        weight: torch.Tensor | None = None,
    ) -> torch.Tensor:
        out = self._call(params, x, buffers, train, False, weight)
        assert isinstance(out, torch.Tensor)
        return out

    def forward_with_features(
        self,
        flat: torch.Tensor,
        x: torch.Tensor,
        *,
        buffers: torch.Tensor | None = None,
        train: bool = False,
        weight: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not isinstance(self.reference, FeatureNet):
            raise TypeError(f"{type(self.reference).__name__} has no features/head split")
        out = self._call(
            self.layout.unflatten(flat), x, buffers, train, True, self.statistic_weight(weight)
        )
        assert isinstance(out, tuple)
        return out

    def _call(
        self,
        params: dict[str, torch.Tensor],
        x: torch.Tensor,
        buffers: torch.Tensor | None,
        train: bool,
        features: bool,
        weight: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        kwargs = {"features": True} if features else {}
        x = self.policy.arrange(x)
        if weight is not None and self.num_buffers and train:
            return self._call_weighted(params, x, buffers, weight, kwargs)
        if self.policy.direct(x.shape[0], self.num_params):
            return self._call_one(params, x, buffers, train, kwargs)
        module = self.functional
        module.train(train)
        if self.num_buffers == 0:

            def one(p: dict[str, torch.Tensor], xb: torch.Tensor) -> torch.Tensor:
                return torch.func.functional_call(module, p, (xb,), kwargs)

            return torch.func.vmap(one, randomness="different")(params, x)
        bufs = self.buffer_layout.unflatten(self._buffers_for(x, buffers))

        def one_bn(
            p: dict[str, torch.Tensor], b: dict[str, torch.Tensor], xb: torch.Tensor
        ) -> torch.Tensor:
            return torch.func.functional_call(module, {**p, **b}, (xb,), kwargs)

        return torch.func.vmap(one_bn, randomness="different")(params, bufs, x)

    def _call_weighted(
        self,
        params: dict[str, torch.Tensor],
        x: torch.Tensor,
        buffers: torch.Tensor | None,
        weight: torch.Tensor,
        kwargs: dict[str, bool],
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Training-mode forward whose BatchNorm statistics weight each client's samples by
        ``weight [C, B]`` (one client without vmap, as in :meth:`_call_one`)."""
        module = self.functional
        module.train(True)
        bufs = self.buffer_layout.unflatten(self._buffers_for(x, buffers))

        def one(
            p: dict[str, torch.Tensor],
            b: dict[str, torch.Tensor],
            xb: torch.Tensor,
            wb: torch.Tensor,
        ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
            with sample_weights(module, wb):
                out = torch.func.functional_call(module, {**p, **b}, (xb,), kwargs)
            return out

        if self.policy.direct(x.shape[0], self.num_params):
            out = one(
                {k: v[0] for k, v in params.items()},
                {k: v[0] for k, v in bufs.items()},
                x[0],
                weight[0],
            )
            if isinstance(out, tuple):
                return out[0].unsqueeze(0), out[1].unsqueeze(0)
            return out.unsqueeze(0)
        return torch.func.vmap(one, randomness="different")(params, bufs, x, weight)

    def _call_one(
        self,
        params: dict[str, torch.Tensor],
        x: torch.Tensor,
        buffers: torch.Tensor | None,
        train: bool,
        kwargs: dict[str, bool],
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """One client (``x [1, B, ...]``) without vmap; BatchNorm updates ``buffers`` in place."""
        tensors = {k: v[0] for k, v in params.items()}
        if self.num_buffers:
            bufs = self.buffer_layout.unflatten(self._buffers_for(x, buffers))
            tensors.update({k: v[0] for k, v in bufs.items()})
        module = self.reference
        module.train(train)
        out = torch.func.functional_call(module, tensors, (x[0],), kwargs)
        if isinstance(out, tuple):
            return out[0].unsqueeze(0), out[1].unsqueeze(0)
        return out.unsqueeze(0)
