"""BatchNorm under ``torch.func.vmap``: each client normalizes with its own batch's statistics
and updates its own row of the running statistics; training statistics can weight the samples
(padding of a partial last batch has weight 0)."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn


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


def batch_norm_weight(weight: torch.Tensor | None) -> torch.Tensor | None:
    """``weight [C, B]`` as BatchNorm's per-sample statistic weights, or None when every sample
    counts fully (all ones: PyTorch's own fused batch norm is then used, bit for bit)."""
    if weight is None or bool((weight == 1).all()):
        return None
    return weight
