"""``subsample``: a seeded, class-stratified subset of a dataset's training and test pools, taken
before D_pub is carved and the clients are partitioned (quick runs of large models on a CPU)."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from fedhp.data.partition import apportion
from fedhp.data.types import DatasetArrays
from fedhp.errors import DatasetError

SUBSAMPLE_SEED_OFFSET = 104_729


def stratified_indices(y: torch.Tensor, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` sorted row indices of ``y``, every class keeping its share (largest remainder);
    regression targets (float ``y``) give a plain random subset."""
    n = int(y.shape[0])
    if size > n:
        raise DatasetError(f"subsample: {size} samples asked, the pool holds {n}; lower it")
    if y.is_floating_point():
        return np.sort(rng.choice(n, size, replace=False))
    labels = y.numpy()
    classes, counts = np.unique(labels, return_counts=True)
    picked = [
        rng.choice(np.flatnonzero(labels == k), int(m), replace=False)
        for k, m in zip(classes, apportion(size, counts.astype(np.float64)), strict=True)
    ]
    return np.sort(np.concatenate(picked))


def _rows(t: torch.Tensor | None, idx: torch.Tensor) -> torch.Tensor | None:
    return None if t is None else t.index_select(0, idx)


def subsample(data: DatasetArrays, train: int | None, test: int | None, seed: int) -> DatasetArrays:
    """``data`` keeping ``train`` training and ``test`` test samples (None: all of that pool)."""
    if train is None and test is None:
        return data
    rng = np.random.default_rng(seed + SUBSAMPLE_SEED_OFFSET)
    out = data
    for split, size in (("train", train), ("test", test)):
        if size is None:
            continue
        y: torch.Tensor = getattr(data, f"{split}_y")
        idx = torch.from_numpy(stratified_indices(y, size, rng))
        rows = {
            f"{split}_x": getattr(data, f"{split}_x").index_select(0, idx),
            f"{split}_y": y[idx],
            f"{split}_owner": _rows(getattr(data, f"{split}_owner"), idx),
        }
        out = dataclasses.replace(out, **rows)
    return out
