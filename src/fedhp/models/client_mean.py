"""Per-client means of per-sample values under per-sample weights (padding has weight 0)."""

from __future__ import annotations

import torch


def weighted_client_mean(losses: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    """Per-client mean ``[C]`` of per-sample values ``[C, B]``, weighted by ``weight [C, B]``
    (plain mean without weights; rows of zero total weight give 0)."""
    if weight is None:
        return losses.mean(1)
    return (losses * weight).sum(1) / sample_weight_totals(weight)


def sample_weight_totals(weight: torch.Tensor) -> torch.Tensor:
    """Per-client total weight ``[C]`` of ``weight [C, B]``, kept away from zero."""
    return weight.sum(1).clamp(min=torch.finfo(weight.dtype).tiny)
