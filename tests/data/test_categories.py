"""The Fed-HT paper's split: 10 categories × 20 parts, 2 parts of 2 categories per client; K-means
categories on dense and sparse features."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedhp.data import split_dataset
from fedhp.data.categories import kmeans
from fedhp.data.types import DatasetArrays
from fedhp.errors import ConfigError


def labelled(n_per_class: int, classes: int = 10) -> DatasetArrays:
    y = torch.arange(classes).repeat_interleave(n_per_class)
    ids = torch.arange(len(y), dtype=torch.float32)
    x = torch.stack([ids, y.float()], 1)  # column 0: the row id, column 1: the label
    return DatasetArrays("toy", x, y, x[::2], y[::2], classes)  # test: every other row


def test_each_client_gets_two_parts_of_two_categories_once() -> None:
    data = labelled(40)  # 10 categories × 20 parts of 2 samples
    clients = split_dataset(data, {"name": "categories"}, 100, seed=3)
    seen: list[int] = []
    for c in clients:
        labels = sorted(set(c.train_y.tolist()))
        assert len(labels) == 2 and c.num_train == 4
        assert torch.equal(c.train_x[:, 1].long(), c.train_y)
        assert sorted(set(c.test_y.tolist())) == labels  # test parts from the same categories
        seen += c.train_x[:, 0].long().tolist()
    assert sorted(seen) == list(range(400))  # every part used exactly once
    other = split_dataset(data, {"name": "categories"}, 100, seed=4)
    assert [c.train_x[:, 0].tolist() for c in other] != [c.train_x[:, 0].tolist() for c in clients]


def test_mnist_like_counts_and_errors() -> None:
    clients = split_dataset(labelled(600), {"name": "categories"}, 100, seed=0)
    assert {c.num_train for c in clients} == {60}  # MNIST: 60,000 / 100 = 600 (here 6,000)
    with pytest.raises(ConfigError, match="num_categories"):
        split_dataset(labelled(40), {"name": "categories", "num_categories": 7}, 100, seed=0)
    with pytest.raises(ConfigError, match="differs from the 10 labels"):
        split_dataset(labelled(40), {"name": "categories", "num_categories": 4}, 100, seed=0)


def test_kmeans_dense_and_sparse_agree_and_find_the_clusters() -> None:
    rng = np.random.default_rng(0)
    centers = rng.normal(0, 10, (4, 30)) * (rng.random((4, 30)) < 0.3)
    truth = np.repeat(np.arange(4), 25)
    x = centers[truth] + rng.normal(0, 0.1, (100, 30)) * (centers[truth] != 0)
    dense = torch.tensor(x, dtype=torch.float32)
    labels_dense, _ = kmeans(dense, 4, seed=1)
    labels_sparse, cents = kmeans(dense.to_sparse(), 4, seed=1)
    assert (labels_dense == labels_sparse).all() and cents.shape == (4, 30)
    # the clusters are the true groups up to a relabelling
    pairs = {(int(a), int(b)) for a, b in zip(truth, labels_dense, strict=True)}
    assert len(pairs) == 4
