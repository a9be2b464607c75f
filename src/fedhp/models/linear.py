"""Linear models with the losses of "Federated Nonconvex Sparse Learning" (App. B).

* ``linreg``  least squares: ``(1/B) ||y - Z x||²`` (the paper's, no ½, no regularizer);
* ``logreg``  binary logistic on {0, 1} labels: ``log(1 + exp(zᵀx)) - y zᵀx + (λ/2)||x||²``;
* ``softmax`` c-class cross-entropy ``+ Σ_r (λ/2)||x_r||²`` over the class columns x_r.

No bias (the paper's x ∈ R^d, or d×c for softmax). The flat parameters ``[C, P]`` hold one
client per row, class-major: class column x_r is the block ``r·d .. (r+1)·d - 1``, so H_τ applies
per column with ``sparsity_groups = c``. Inputs are dense ``[C, B, *features]`` or a sparse COO
``[C, B, d]`` (LibSVM data kept sparse: nothing is densified). Gradients are closed-form.
"""

from __future__ import annotations

from math import prod
from typing import TYPE_CHECKING

import pydantic
import torch
import torch.nn.functional as F
from torch import nn

from fedhp.errors import ConfigError
from fedhp.models.base import BatchedModel, FeatureOptions, ForwardOptions, LossOptions
from fedhp.models.client_mean import sample_weight_totals, weighted_client_mean
from fedhp.models.zoo import MODELS, ModelOptions

if TYPE_CHECKING:
    from typing_extensions import Unpack


def linear_logits(weights: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``x [C, B, d]`` (dense or sparse COO) times ``weights [C, out, d]`` → ``[C, B, out]``."""
    c, out, d = weights.shape
    b = x.shape[1]
    if not x.is_sparse:
        return torch.bmm(x.reshape(c, b, d), weights.transpose(1, 2))
    idx, val = x._indices(), x._values()
    contrib = weights.transpose(1, 2)[idx[0], idx[2]] * val.unsqueeze(1)  # [nnz, out]
    logits = torch.zeros(c * b, out, dtype=weights.dtype, device=weights.device)
    return logits.index_add_(0, idx[0] * b + idx[1], contrib).view(c, b, out)


def linear_weight_grad(delta: torch.Tensor, x: torch.Tensor, d: int) -> torch.Tensor:
    """``Σ_b delta[c,b,:] ⊗ x[c,b,:]`` → ``[C, out, d]`` (``delta [C, B, out]``, ``x`` as above)."""
    c, b, out = delta.shape
    if not x.is_sparse:
        return torch.bmm(delta.transpose(1, 2), x.reshape(c, b, d))
    idx, val = x._indices(), x._values()
    contrib = delta[idx[0], idx[1]] * val.unsqueeze(1)  # [nnz, out]
    grad = torch.zeros(c * d, out, dtype=delta.dtype, device=delta.device)
    return grad.index_add_(0, idx[0] * d + idx[2], contrib).view(c, d, out).transpose(1, 2)


class LinearModel(BatchedModel):
    """A linear model ``[C, out, d]`` with a per-sample loss and ``(λ/2)||x||²``.

    ``reports_objective``: the runner logs the paper's objective f(x) = Σ p_i f_i(x) (plus support
    recovery and ‖x − x*‖ where the data know x*) for it; ``curvature`` bounds the loss's second
    derivative in the logits (client smoothness l ≤ curvature·λmax(ZᵀZ/n) + λ)."""

    rows_independent = True

    reports_objective = True
    curvature = 1.0

    def __init__(
        self, d: int, out: int, num_classes: int, feature_shape: tuple[int, ...], lam: float
    ):
        super().__init__(nn.Linear(d, out, bias=False), feature_shape, num_classes)
        self.d, self.out, self.lam = d, out, lam
        self.sparsity_groups = out

    def forward(
        self, flat: torch.Tensor, x: torch.Tensor, **opts: Unpack[ForwardOptions]
    ) -> torch.Tensor:
        return linear_logits(flat.reshape(flat.shape[0], self.out, self.d), x)

    def forward_with_features(
        self, flat: torch.Tensor, x: torch.Tensor, **opts: Unpack[FeatureOptions]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits and the features the single linear layer reads: the (dense) inputs."""
        features = x.to_dense() if x.is_sparse else x
        return self.forward(flat, x), features.reshape(x.shape[0], x.shape[1], -1)

    def flops_per_sample(self) -> int:
        """Forward FLOPs of one sample, ``2·d·out`` (what FlopCounterMode counts for the product;
        the reference ``nn.Linear`` cannot take the unflattened ``feature_shape``)."""
        return 2 * self.d * self.out

    def train_flops_per_sample(self) -> int:
        """Training FLOPs of one sample, ``4·d·out``: the forward product and the weight gradient
        (no input gradient is computed). Dense features; CSR features cost in proportion to their
        stored entries instead, which this count does not see."""
        return 4 * self.d * self.out

    def dlogits(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Derivative of the per-sample loss in the logits ``[C, B, out]``."""
        raise NotImplementedError

    def regularizer(self, flat: torch.Tensor) -> torch.Tensor:
        """``(λ/2)||x||²`` of each row of ``flat [.., P]`` (= Σ_r (λ/2)||x_r||² for softmax)."""
        return 0.5 * self.lam * flat.pow(2).sum(-1)

    def loss_and_grad(
        self, flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor, **opts: Unpack[LossOptions]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-client objective (weighted mean loss over ``weight [C, B]`` if given, plus the
        regularizer) and its closed-form gradient; no buffers (no BatchNorm)."""
        with torch.no_grad():
            logits = self.forward(flat, x)
            samples = self.sample_losses(logits, y)
            weight = opts.get("weight")
            loss = weighted_client_mean(samples, weight) + self.regularizer(flat)
            if weight is None:
                delta = self.dlogits(logits, y) / y.shape[1]
            else:
                scale = weight / sample_weight_totals(weight).unsqueeze(1)
                delta = self.dlogits(logits, y) * scale.unsqueeze(-1)
            grad = linear_weight_grad(delta, x, self.d).reshape(flat.shape)
            if self.lam:
                grad.add_(flat, alpha=self.lam)
            return loss, grad


class LeastSquares(LinearModel):
    """``(y - zᵀx)²`` per sample; "correct" is never claimed (accuracy is not defined)."""

    curvature = 2.0

    def sample_losses(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (logits[..., 0] - y.to(logits.dtype)).pow(2)

    def dlogits(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return 2 * (logits - y.to(logits.dtype).unsqueeze(-1))

    def correct(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.zeros(y.shape, dtype=torch.bool, device=y.device)


class BinaryLogistic(LinearModel):
    """``log(1 + exp(s)) - y·s`` per sample, s = zᵀx, labels {0, 1}."""

    curvature = 0.25

    def sample_losses(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        s = logits[..., 0]
        return F.softplus(s) - y.to(s.dtype) * s

    def dlogits(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(logits) - y.to(logits.dtype).unsqueeze(-1)

    def correct(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (logits[..., 0] > 0) == (y > 0)


class Softmax(LinearModel):
    """c-class cross-entropy on logits ``zᵀx_r``."""

    curvature = 0.5

    def dlogits(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        delta = torch.softmax(logits, dim=-1)
        return delta.scatter_add_(-1, y.unsqueeze(-1), torch.full_like(delta[..., :1], -1.0))


@MODELS.register("linreg")
class LinRegOptions(ModelOptions):
    """Least squares without bias (the Fed-HT paper's linear loss, no ½)."""

    def build(self, feature_shape: tuple[int, ...], num_classes: int) -> BatchedModel:
        return LeastSquares(prod(feature_shape), 1, num_classes, feature_shape, 0.0)


@MODELS.register("logreg")
class LogRegOptions(ModelOptions):
    """Binary logistic regression without bias, {0, 1} labels, plus (lam/2)||x||²."""

    lam: float = pydantic.Field(1e-4, ge=0, description="ℓ2 weight λ (the paper does not state it)")

    def build(self, feature_shape: tuple[int, ...], num_classes: int) -> BatchedModel:
        if num_classes != 2:
            raise ConfigError(
                f"model.name: logreg needs 2 classes, the data have {num_classes}; use softmax"
            )
        return BinaryLogistic(prod(feature_shape), 1, num_classes, feature_shape, self.lam)


@MODELS.register("softmax")
class SoftmaxOptions(ModelOptions):
    """Multinomial logistic regression without bias plus (lam/2)||x_r||² per class column."""

    lam: float = pydantic.Field(1e-4, ge=0, description="ℓ2 weight λ (the paper does not state it)")

    def build(self, feature_shape: tuple[int, ...], num_classes: int) -> BatchedModel:
        d = prod(feature_shape)
        return Softmax(d, num_classes, num_classes, feature_shape, self.lam)
