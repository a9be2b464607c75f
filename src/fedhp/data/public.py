"""D_pub: a class-balanced public dataset for server-side methods (FNR-FL), carved out of the
training pool before partitioning (so no client holds it and no evaluation set contains it), or
taken from the test pool (the FNR-FL authors' train-on-test protocol, marked as a leak)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from fedhp.data.types import DatasetArrays
from fedhp.errors import DatasetError

PUBLIC_SEED_OFFSET = 7_919


@dataclass(frozen=True)
class PublicData:
    """D_pub: features ``x [N, ...]``, labels ``y [N]`` and where they came from."""

    x: torch.Tensor
    y: torch.Tensor
    source: Literal["holdout", "test"]

    @property
    def overlaps_evaluation(self) -> bool:
        """Whether D_pub shares samples with the evaluation data (the test pool)."""
        return self.source == "test"


def _balanced(
    y: torch.Tensor, per_class: int, classes: int, rng: np.random.Generator
) -> np.ndarray:
    labels = y.numpy()
    picked = []
    for k in range(classes):
        pool = np.flatnonzero(labels == k)
        if len(pool) < per_class:
            raise DatasetError(
                f"public.per_class: class {k} has {len(pool)} samples, fewer than {per_class}; "
                "lower public.per_class"
            )
        picked.append(rng.choice(pool, per_class, replace=False))
    return np.sort(np.concatenate(picked))


def carve_public(
    data: DatasetArrays, per_class: int, source: Literal["holdout", "test"], seed: int
) -> tuple[DatasetArrays, PublicData | None]:
    """``data`` without the D_pub samples (``holdout``) and D_pub itself (None if
    ``per_class`` is 0). ``test``: D_pub is drawn from the test pool, which stays whole."""
    if per_class == 0:
        return data, None
    if data.train_y.is_floating_point():
        raise DatasetError("public.per_class: D_pub needs class labels; this dataset is regression")
    rng = np.random.default_rng(seed + PUBLIC_SEED_OFFSET)
    if source == "test":
        idx = torch.from_numpy(_balanced(data.test_y, per_class, data.num_classes, rng))
        return data, PublicData(data.test_x[idx], data.test_y[idx], "test")
    idx = torch.from_numpy(_balanced(data.train_y, per_class, data.num_classes, rng))
    keep = torch.ones(len(data.train_y), dtype=torch.bool)
    keep[idx] = False
    owner = None if data.train_owner is None else data.train_owner[keep]
    rest = dataclasses.replace(
        data, train_x=data.train_x[keep], train_y=data.train_y[keep], train_owner=owner
    )
    return rest, PublicData(data.train_x[idx], data.train_y[idx], "holdout")
