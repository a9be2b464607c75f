"""FLOP counts of a reference module, as PyTorch's ``FlopCounterMode`` counts them."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode


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


def forward_flops(module: nn.Module, feature_shape: tuple[int, ...]) -> int:
    """Forward FLOPs of one sample for ``module`` in eval mode (FlopCounterMode's count)."""
    x = torch.zeros(1, *feature_shape)
    counter = FlopCounterMode(display=False)
    clone = copy.deepcopy(module).eval()
    with counter, torch.no_grad():
        clone(x)
    return int(counter.get_total_flops())
