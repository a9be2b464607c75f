"""The interface of a batched multi-client model over a flat parameter tensor.

Every model's parameters live in ONE flat tensor ``[C, P]`` (a leading client dimension ``C``);
layers are views into it. Aggregation, sparsification, hard thresholding and byte accounting then
act on plain ``[C, P]`` tensors, and autograd returns gradients in the same ``[C, P]`` shape.

Models with BatchNorm also have per-client *buffers* (the running means and variances), the rows
of a ``[C, B]`` tensor beside the parameters (:class:`~fedhp.models.layout.BufferLayout`); models
without have ``B = 0``. In training mode every client normalizes with its own batch's statistics
and updates its own row of the buffers in place; in eval mode each client normalizes with the row
it is given.

Each model also exposes a plain ``torch.nn.Module`` (its *reference* form) with the same parameter
and buffer names and order; the reference path and the tests use it to check the batched
forward/backward.

The parts it is built from have their own modules: the flat layouts (:mod:`fedhp.models.layout`),
vmap BatchNorm (:mod:`fedhp.models.batchnorm`), FLOP counting (:mod:`fedhp.models.flops`); the
generic ``vmap`` implementation is :class:`fedhp.models.vmap.VmapModel`.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

import torch
import torch.nn.functional as F
from torch import nn

from fedhp.models.batchnorm import batch_norm_weight
from fedhp.models.client_mean import weighted_client_mean
from fedhp.models.flops import forward_flops, training_flops
from fedhp.models.layout import BufferLayout, ParamLayout
from fedhp.models.policy import CPU_POLICY, ExecutionPolicy, widened

if TYPE_CHECKING:
    from typing_extensions import Unpack

ColumnHook = Callable[[int, int], None]
"""``(lo, hi)``: act in place on columns ``lo .. hi - 1`` of a step's flat rows
(:meth:`BatchedModel.sgd_step`)."""

Params = dict[str, torch.Tensor]
"""Per-parameter tensors ``name -> [C, *shape]`` (:meth:`BatchedModel.forward_params`)."""


class ForwardOptions(TypedDict, total=False):
    """The keyword options of :meth:`BatchedModel.forward` (all optional)."""

    buffers: torch.Tensor | None
    """``[C, B]``: each client's BatchNorm running statistics (absent or None: the initial ones)."""
    train: bool
    """Normalize with the batch's statistics and update ``buffers`` in place (default False)."""


class FeatureOptions(ForwardOptions, total=False):
    """The keyword options of :meth:`BatchedModel.forward_with_features` and
    :meth:`BatchedModel.forward_params`."""

    weight: torch.Tensor | None
    """``[C, B]`` (training mode): per-sample weights of the BatchNorm batch statistics (padding
    has weight 0); models without BatchNorm ignore it."""


class LossOptions(TypedDict, total=False):
    """The keyword options of :meth:`BatchedModel.loss_and_grad` and
    :meth:`BatchedModel.loss_grad_correct` (all optional)."""

    buffers: torch.Tensor | None
    """``[C, B]``: updated in place with the batches' statistics (training mode)."""
    weight: torch.Tensor | None
    """``[C, B]``: per-sample weights; each client's loss is then the weighted mean over its
    samples (0 for padding, e.g. a partial last batch; a row of zeros gives loss 0 and gradient
    0)."""


class KernelMeeting(Protocol):
    """Where the model calls of the runs of a batch meet (a run's seat in
    :class:`fedhp.sweep.lockstep.Lockstep`)."""

    def meet(self, model: BatchedModel, kernel: str, *args: Any, **opts: Any) -> Any:
        """``model``'s method ``kernel`` (``"sgd_step"``, ``"loss_and_grad"``) on ``args`` and
        ``opts``, as one call with the other runs'; what the model's own call returns."""


def sgd_step(
    model: BatchedModel,
    flat: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    lr: float,
    before: ColumnHook | None = None,
) -> torch.Tensor:
    """``model.sgd_step(flat, x, y, lr, before)``, as one call with the other runs' where the
    model's run is in a batch (``model.meeting``): how the engine steps a model."""
    if model.meeting is None:
        return model.sgd_step(flat, x, y, lr, before)
    loss: torch.Tensor = model.meeting.meet(model, "sgd_step", flat, x, y, lr, before)
    return loss


def loss_and_grad(
    model: BatchedModel, flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor, **opts: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """``model.loss_and_grad(flat, x, y, **opts)``, as one call with the other runs' where the
    model's run is in a batch (``model.meeting``): how the engine differentiates a model."""
    if model.meeting is None:
        return model.loss_and_grad(flat, x, y, **opts)
    out: tuple[torch.Tensor, torch.Tensor] = model.meeting.meet(
        model, "loss_and_grad", flat, x, y, **opts
    )
    return out


class BatchedModel(ABC):
    """A model evaluated for many clients at once: ``forward(flat [C,P], x [C,B,...])``.

    ``reports_objective``: evaluation also logs the training objective (sparse-learning losses,
    :mod:`fedhp.models.linear`); ``sparsity_groups``: blocks of P thresholded separately by H_τ;
    ``rows_independent``: a row's result is bit for bit the same whatever other rows share the
    call (the hand-batched models, one ``bmm`` per layer); otherwise (``torch.func.vmap`` over a
    convolution) a call of ONE row may run other kernels than a call of several, 1e-8 .. 4e-5
    apart on the CPU, so runs sharing a call must never leave a row alone (runs as rows)."""

    reports_objective: bool = False
    sparsity_groups: int = 1
    rows_independent: bool = False
    meeting: KernelMeeting | None = None
    """Where this run's model calls meet a batch's other runs' (set by ``fedhp sweep``'s
    lockstep; None: alone). The engine calls the model through :func:`sgd_step` and
    :func:`loss_and_grad`, which read it."""

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
        self, flat: torch.Tensor, x: torch.Tensor, **opts: Unpack[ForwardOptions]
    ) -> torch.Tensor:
        """Logits ``[C, B, K]`` for parameters ``[C, P]`` and inputs ``[C, B, *feature_shape]``
        (options: :class:`ForwardOptions`)."""

    @abstractmethod
    def forward_with_features(
        self, flat: torch.Tensor, x: torch.Tensor, **opts: Unpack[FeatureOptions]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits ``[C, B, K]`` and the penultimate features ``[C, B, H]`` (the head's input) in
        one differentiable forward, e.g. for feature-norm penalties or representations (options:
        :class:`FeatureOptions`)."""

    def loss_and_grad(
        self, flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor, **opts: Unpack[LossOptions]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-client mean cross-entropy ``[C]`` and its gradient ``[C, P]`` in training mode
        (options: :class:`LossOptions`).

        Autograd over per-layer leaf copies (not over slices of the flat tensor, whose backward
        would materialize a zero-filled ``[C, P]`` buffer per parameter). The clients' losses are
        summed before differentiation; as clients share no parameters, row c of the gradient is
        exactly the gradient of client c's own loss.
        """
        loss, grad, _ = self._autograd_loss(flat, x, y, opts.get("buffers"), opts.get("weight"))
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
        self, flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor, **opts: Unpack[LossOptions]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`loss_and_grad` plus each sample's correctness ``[C, B]`` (bool) under the same
        training-mode forward (no second forward on the generic autograd path; models with their
        own ``loss_and_grad`` add an evaluation forward)."""
        buffers = opts.get("buffers")
        if type(self).loss_and_grad is BatchedModel.loss_and_grad:
            loss, grad, logits = self._autograd_loss(flat, x, y, buffers, opts.get("weight"))
            return loss, grad, self.correct(logits, y)
        loss, grad = self.loss_and_grad(flat, x, y, **opts)
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
        self, params: Params, x: torch.Tensor, **opts: Unpack[FeatureOptions]
    ) -> torch.Tensor:
        """Like :meth:`forward`, from per-parameter tensors ``name -> [C, *shape]``.

        ``weight``: see :class:`FeatureOptions`; this generic form has no BatchNorm and ignores
        it."""
        flat = torch.cat([params[s.name].reshape(x.shape[0], -1) for s in self.layout.specs], 1)
        return self.forward(flat, x, buffers=opts.get("buffers"), train=opts.get("train", False))

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
        """Forward FLOPs for one sample (:func:`~fedhp.models.flops.forward_flops` of the reference
        module)."""
        return forward_flops(self.reference, self.feature_shape)

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
