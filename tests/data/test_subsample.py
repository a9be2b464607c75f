"""``subsample``: class-stratified, seeded, disjoint-preserving subsets before D_pub/partition."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedhp.data.subsample import stratified_indices, subsample
from fedhp.data.types import DatasetArrays
from fedhp.errors import DatasetError


def _data(n_train: int = 600, n_test: int = 300) -> DatasetArrays:
    g = torch.Generator().manual_seed(0)
    # unbalanced classes: class k has weight k + 1
    p = torch.arange(1, 11, dtype=torch.float32)
    return DatasetArrays(
        name="fake",
        train_x=torch.arange(n_train, dtype=torch.float32).view(-1, 1),
        train_y=torch.multinomial(p, n_train, replacement=True, generator=g),
        test_x=-torch.arange(1, n_test + 1, dtype=torch.float32).view(-1, 1),
        test_y=torch.multinomial(p, n_test, replacement=True, generator=g),
        num_classes=10,
    )


def test_keeps_each_class_share_and_rows_match_labels() -> None:
    data = _data()
    out = subsample(data, 200, 90, seed=3)
    assert out.train_y.shape == (200,) and out.test_y.shape == (90,)
    full = np.bincount(data.train_y.numpy(), minlength=10) / 600
    kept = np.bincount(out.train_y.numpy(), minlength=10)
    assert np.all(np.abs(kept - 200 * full) < 1.0)  # largest remainder: within one sample
    rows = out.train_x[:, 0].long()
    assert torch.equal(data.train_y[rows], out.train_y)  # features travel with their labels
    assert len(set(rows.tolist())) == 200
    test_rows = (-out.test_x[:, 0]).long() - 1
    assert torch.equal(data.test_y[test_rows], out.test_y)


def test_seeded_and_none_keeps_everything() -> None:
    data = _data()
    a, b, c = (
        subsample(data, 100, None, 1),
        subsample(data, 100, None, 1),
        subsample(data, 100, None, 2),
    )
    assert torch.equal(a.train_x, b.train_x) and not torch.equal(a.train_x, c.train_x)
    assert a.test_x is data.test_x
    assert subsample(data, None, None, 0) is data


def test_regression_targets_and_too_large() -> None:
    y = torch.rand(50)
    idx = stratified_indices(y, 20, np.random.default_rng(0))
    assert len(set(idx.tolist())) == 20 and idx.max() < 50
    with pytest.raises(DatasetError, match="subsample: 60 samples asked, the pool holds 50"):
        stratified_indices(y, 60, np.random.default_rng(0))


def test_run_config_applies_it_before_public_and_partition() -> None:
    from fedhp.build import partition_data
    from fedhp.config import resolve_config

    cfg = resolve_config(
        None,
        [
            "dataset.name=synthetic",
            "partition.name=dirichlet",
            "federation.num_clients=4",
            "federation.num_edges=1",
            "subsample.train=400",
            "subsample.test=100",
            "public.per_class=2",
        ],
    )
    data, clients, public = partition_data(cfg)
    assert public is not None and len(public.y) == 2 * data.num_classes
    assert sum(c.num_train for c in clients) + len(public.y) == 400
    assert sum(int(c.test_y.shape[0]) for c in clients) <= 100
