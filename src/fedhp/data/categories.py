"""The Fed-HT paper's non-IID split: 10 categories (the label, or K-means clusters of the
features), each category's samples cut into parts, every client takes 2 parts of 2 different
categories, each part used once (100 clients: 10 categories × 20 parts)."""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from pydantic import Field

from fedhp.data.partition import PARTITIONERS, _build, _carve_val, _labels, _WithValFraction
from fedhp.data.types import ClientData, DatasetArrays
from fedhp.errors import ConfigError, DatasetError


def _matrix(x: torch.Tensor) -> torch.Tensor:
    """Features as a 2-D matrix ``[N, d]`` (sparse COO stays sparse)."""
    return x.double() if x.is_sparse else x.reshape(x.shape[0], -1).double()


def _sq_dist(x: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """Squared distances ``[N, k]`` of the rows of ``x`` (dense or sparse) to ``centroids``."""
    sq = torch.sparse.sum(x.pow(2), 1).to_dense() if x.is_sparse else x.pow(2).sum(1)
    cross = torch.sparse.mm(x, centroids.T) if x.is_sparse else x @ centroids.T
    return sq.double().unsqueeze(1) - 2 * cross.double() + centroids.double().pow(2).sum(1)


def _row(m: torch.Tensor, i: int) -> torch.Tensor:
    pick = torch.tensor([i])
    return (m.index_select(0, pick).to_dense() if m.is_sparse else m[pick]).double()


def _plus_plus(m: torch.Tensor, k: int, rng: np.random.Generator) -> torch.Tensor:
    """k-means++ seeding: each next centre drawn with probability ∝ squared distance."""
    centroids = _row(m, int(rng.integers(m.shape[0])))
    for _ in range(1, k):
        d2 = _sq_dist(m, centroids).min(1).values.clamp(min=0).numpy()
        total = d2.sum()
        i = int(rng.choice(len(d2), p=d2 / total)) if total > 0 else int(rng.integers(len(d2)))
        centroids = torch.cat((centroids, _row(m, i)))
    return centroids


def kmeans(x: torch.Tensor, k: int, seed: int, iters: int = 30) -> tuple[np.ndarray, torch.Tensor]:
    """Lloyd's K-means on the rows of ``x`` (dense, or sparse COO without densifying it), seeded
    by k-means++; returns each row's cluster and the centroids ``[k, d]``."""
    m = _matrix(x)
    n = m.shape[0]
    if n < k:
        raise DatasetError(f"partition.num_categories: {k} clusters need at least {k} samples")
    centroids = _plus_plus(m, k, np.random.default_rng(seed))
    labels = torch.zeros(n, dtype=torch.long)
    for _ in range(iters):
        labels = _sq_dist(m, centroids).argmin(1)
        onehot = torch.zeros(n, k, dtype=torch.float64)
        onehot[torch.arange(n), labels] = 1.0
        sums = (torch.sparse.mm(m.t(), onehot) if m.is_sparse else m.T @ onehot).T
        counts = onehot.sum(0)
        filled = counts > 0  # an empty cluster keeps its centroid
        new = centroids.clone()
        new[filled] = sums[filled] / counts[filled].unsqueeze(1)
        if torch.equal(new, centroids):
            break
        centroids = new
    return labels.numpy(), centroids


def _parts(cats: np.ndarray, k: int, per_cat: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Category-major list of ``k·per_cat`` parts: each category's rows shuffled and cut evenly."""
    out = []
    for c in range(k):
        rows = rng.permutation(np.flatnonzero(cats == c))
        out += list(np.array_split(rows, per_cat))
    return out


@PARTITIONERS.register("categories")
class CategoriesPartitioner(_WithValFraction):
    """Each client gets 2 parts of 2 different categories (label or K-means cluster), each part
    once: 2·num_clients parts, num_clients·2/num_categories per category; the test set is split
    the same way (K-means: test rows go to the nearest training centroid)."""

    category: Literal["label", "kmeans"] = "label"
    num_categories: int = Field(10, ge=2)
    kmeans_iters: int = Field(30, gt=0)

    def unread(self, run: object) -> dict[str, str]:
        """``kmeans_iters`` with label categories."""
        if self.category == "kmeans":
            return super().unread(run)
        why = "categories are the labels; set partition.category=kmeans"
        return {**super().unread(run), "kmeans_iters": why}

    def split(self, data: DatasetArrays, num_clients: int, seed: int) -> list[ClientData]:
        """Parts sorted by category; client i takes part i (a category < k/2) and part
        N + σ(i) (a category ≥ k/2), σ a random permutation, then clients are shuffled."""
        k = self.num_categories
        if (2 * num_clients) % k or k % 2:
            raise ConfigError(
                f"partition.num_categories: {k} must be even and divide 2·num_clients = "
                f"{2 * num_clients}"
            )
        per_cat = 2 * num_clients // k
        rng = np.random.default_rng(seed)
        if self.category == "label":
            if data.num_classes != k:
                raise ConfigError(
                    f"partition.num_categories: {k} differs from the {data.num_classes} labels; "
                    "set it to the number of labels or use category=kmeans"
                )
            train_cat, test_cat = _labels(data.train_y), _labels(data.test_y)
        else:
            train_cat, centroids = kmeans(data.train_x, k, seed, self.kmeans_iters)
            test_cat = _sq_dist(_matrix(data.test_x), centroids).argmin(1).numpy()
        sigma = rng.permutation(num_clients)
        order = rng.permutation(num_clients)
        split: dict[str, list[np.ndarray]] = {}
        for name, cats in (("train", train_cat), ("test", test_cat)):
            parts = _parts(cats, k, per_cat, rng)
            clients = [
                np.sort(np.concatenate((parts[i], parts[num_clients + sigma[i]])))
                for i in range(num_clients)
            ]
            split[name] = [clients[i] for i in order]
        empty = [i for i, rows in enumerate(split["train"]) if len(rows) == 0]
        if empty:
            raise DatasetError(
                f"partition: clients {empty[:5]} got no training samples (categories too small); "
                "use fewer clients or fewer categories"
            )
        train, val = _carve_val(split["train"], self.val_fraction, rng)
        return _build(data, train, split["test"], val)
