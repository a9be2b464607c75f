"""Per-client gradient-norm clipping (``algorithm.clip_grad_norm``).

Each client's gradient row ``g`` is scaled by ``min(1, c / (‖g‖ + 1e-6))`` before its step:
``torch.nn.utils.clip_grad_norm_`` on that client's module (same formula, same 1e-6). It acts on
the gradient of the minibatch loss the model computes (``loss_and_grad``, ``loss_grad_correct``,
``sgd_step``), before a method's own gradient terms (FedProx's proximal pull, SCAFFOLD's
correction, pFedMe's and Ditto's pulls), weight decay and momentum — the order of a PyTorch
training loop that clips after ``backward()`` and lets the optimizer add those terms. Methods whose
local objective is computed outside the model (MOON) clip their whole gradient with
:func:`clip_like`.

:func:`clip_gradients` turns clipping on for one model object (what every algorithm does in its
constructor when the option is set): its class becomes a subclass with clipping, so every code
path that takes a step through the model is clipped, and the fused steps
(``BatchedMLP.sgd_step``) fall back to the plain gradient-then-step path. Without the option
nothing changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from fedhp.models.base import BatchedModel, LossOptions

if TYPE_CHECKING:
    from typing_extensions import Unpack

EPS = 1e-6
"""What ``torch.nn.utils.clip_grad_norm_`` adds to the norm."""


def clip_rows_(grad: torch.Tensor, max_norm: float) -> torch.Tensor:
    """Scale each row of ``grad [C, P]`` in place to norm at most ``max_norm`` (PyTorch's
    formula); returns ``grad``."""
    norm = torch.linalg.vector_norm(grad, dim=1, keepdim=True)
    return grad.mul_((max_norm / (norm + EPS)).clamp_(max=1.0))


class ClippedGradients(BatchedModel):
    """The mixin :func:`clip_gradients` puts in front of a model's class."""

    clip_grad_norm: float
    _unclipped: type[BatchedModel]
    _nested: bool = False

    def _clip(self, grad: torch.Tensor) -> torch.Tensor:
        return grad if self._nested else clip_rows_(grad, self.clip_grad_norm)

    def loss_and_grad(
        self, flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor, **opts: Unpack[LossOptions]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        loss, grad = super().loss_and_grad(flat, x, y, **opts)
        return loss, self._clip(grad)

    def loss_grad_correct(
        self, flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor, **opts: Unpack[LossOptions]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self._unclipped.loss_and_grad is BatchedModel.loss_and_grad:  # one forward
            buffers, weight = opts.get("buffers"), opts.get("weight")
            loss, grad, logits = self._autograd_loss(flat, x, y, buffers, weight)
            return loss, self._clip(grad), self.correct(logits, y)
        self._nested = True  # the model's own loss_and_grad inside: clip once, here
        try:
            loss, grad, correct = super().loss_grad_correct(flat, x, y, **opts)
        finally:
            self._nested = False
        return loss, self._clip(grad), correct

    sgd_step = BatchedModel.sgd_step
    """The plain step (no fused update inside the backward): clipped gradient, ``before`` on every
    parameter's columns, then ``flat -= lr * grad``."""


_CLASSES: dict[type, type] = {}


def clip_gradients(model: BatchedModel, max_norm: float) -> None:
    """Clip every client's gradient of ``model`` to norm ``max_norm`` from now on (in place:
    the object's class becomes a clipping subclass of its own; calling again changes the norm)."""
    if not max_norm > 0:
        raise ValueError(f"clip_grad_norm must be positive, got {max_norm}")
    cls = type(model)
    if not issubclass(cls, ClippedGradients):
        if cls not in _CLASSES:
            name = f"Clipped{cls.__name__}"
            attrs: dict[str, Any] = {"_unclipped": cls, "__module__": cls.__module__}
            _CLASSES[cls] = type(name, (ClippedGradients, cls), attrs)
        model.__class__ = _CLASSES[cls]
    model.clip_grad_norm = float(max_norm)  # type: ignore[attr-defined]


def clip_like(model: BatchedModel, grad: torch.Tensor) -> torch.Tensor:
    """``grad [C, P]`` clipped in place as ``model`` clips its own gradients (unchanged where
    clipping is off): for a method's own local objective computed outside the model."""
    if isinstance(model, ClippedGradients):
        return clip_rows_(grad, model.clip_grad_norm)
    return grad
