"""Penalties and wire truncation shared by the sparse algorithms.

``smooth_l1`` is the sFedHP paper's approximated l1-norm ``phi_rho(x) = rho * sum log cosh(x/rho)``,
computed stably; its gradient is ``tanh(x/rho)``.
"""

from __future__ import annotations

import math

import torch

from fedhp.comm import truncate

__all__ = ["smooth_l1", "smooth_l1_grad", "truncate"]

_LOG2 = math.log(2.0)


def smooth_l1(x: torch.Tensor, rho: float) -> torch.Tensor:
    """``rho * sum(log cosh(x/rho))`` over the last dimension (a scalar for 1-D ``x``).

    Uses ``log cosh(z) = |z| + log1p(exp(-2|z|)) - log 2``, finite for any finite ``x``.
    """
    z = (x / rho).abs()
    return rho * (z + torch.log1p(torch.exp(-2.0 * z)) - _LOG2).sum(-1)


def smooth_l1_grad(x: torch.Tensor, rho: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """Gradient of :func:`smooth_l1`: ``tanh(x/rho)`` elementwise (written into ``out``, a
    tensor of ``x``'s shape, if given: no temporaries)."""
    if out is None:
        return torch.tanh(x / rho)
    return torch.div(x, rho, out=out).tanh_()
