"""Partitioners: split a :class:`DatasetArrays` into per-client :class:`ClientData`.

Every partitioner is seeded and deterministic (``numpy.random.default_rng(seed)``, never global
RNG state). Training samples are never shared between clients, and a client's train / validation
/ test sets are disjoint. Test sets are drawn without replacement from the dataset's test pool.
Except where noted, a client's test set follows its training label mix: by default each class's
test pool is divided among the clients in proportion to their training counts of that class;
with ``test_per_client`` every client gets exactly that many test samples in its label mix.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from fedhp.data.rows import take_rows
from fedhp.data.types import ClientData, DatasetArrays
from fedhp.errors import ConfigError, DatasetError
from fedhp.registry import Registry


class Partitioner(BaseModel):
    """Base class of partitioners; the fields are the scheme's options."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    def split(self, data: DatasetArrays, num_clients: int, seed: int) -> list[ClientData]:
        """Split ``data`` into ``num_clients`` clients, deterministically for ``seed``."""
        raise NotImplementedError  # pragma: no cover - every partitioner overrides it


PARTITIONERS: Registry[Partitioner] = Registry("partition")


# --------------------------------------------------------------------------------------- helpers


def apportion(total: int, weights: np.ndarray) -> np.ndarray:
    """Integer sizes summing to ``total`` proportional to ``weights`` (largest remainder).

    Ties in the remainders go to the lower index, so equal weights give the remainder to the first
    entries. All-zero weights give all zeros (``total`` must then be 0).
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.sum() <= 0:
        return np.zeros(len(w), dtype=np.int64)
    quota = total * w / w.sum()
    sizes = np.floor(quota).astype(np.int64)
    rest = total - int(sizes.sum())
    order = np.argsort(-(quota - sizes), kind="stable")
    sizes[order[:rest]] += 1
    return sizes


def _cut(idx: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
    return np.split(idx, np.cumsum(sizes)[:-1])


def _check_num_clients(num_clients: int, available: int) -> None:
    if not isinstance(num_clients, int) or num_clients <= 0:
        raise ConfigError(f"num_clients: must be a positive integer (got {num_clients!r})")
    if num_clients > available:
        raise DatasetError(
            f"num_clients: {num_clients} clients but only {available} training samples"
        )


def _labels(y: torch.Tensor) -> np.ndarray:
    return y.detach().cpu().numpy().astype(np.int64)


def _test_by_label_mix(
    test_y: np.ndarray,
    counts: np.ndarray,
    per_client: int | None,
    rng: np.random.Generator,
    equal: bool = False,
) -> list[np.ndarray]:
    """Test indices per client following each client's training label counts ``[n, K]``; with
    ``equal``, the same number for every class the client holds (its classes, equally)."""
    n, k_classes = counts.shape
    if equal:
        counts = (counts > 0).astype(np.int64)
    if per_client is None:
        want = np.stack(
            [apportion(int((test_y == k).sum()), counts[:, k]) for k in range(k_classes)], axis=1
        )
    else:
        want = np.stack([apportion(per_client, counts[i]) for i in range(n)])
    out: list[list[np.ndarray]] = [[] for _ in range(n)]
    for k in range(k_classes):
        need = int(want[:, k].sum())
        if need == 0:
            continue
        pool = np.flatnonzero(test_y == k)
        if need > len(pool):
            raise DatasetError(
                f"partition.test_per_client: {per_client} per client needs {need} test samples "
                f"of class {k}, only {len(pool)} available"
            )
        for i, part in enumerate(_cut(rng.permutation(pool)[:need], want[:, k])):
            out[i].append(part)
    return [np.sort(np.concatenate(p)) if p else np.zeros(0, np.int64) for p in out]


def _test_iid(
    num_test: int, weights: np.ndarray, per_client: int | None, rng: np.random.Generator
) -> list[np.ndarray]:
    """IID test indices: ``per_client`` each, or the whole pool split proportionally to weights."""
    n = len(weights)
    if per_client is None:
        sizes = apportion(num_test, weights)
    else:
        if n * per_client > num_test:
            raise DatasetError(
                f"partition.test_per_client: {per_client} × {n} clients exceeds the "
                f"{num_test} test samples"
            )
        sizes = np.full(n, per_client, dtype=np.int64)
    return _cut(rng.permutation(num_test)[: int(sizes.sum())], sizes)


def _carve_val(
    train: list[np.ndarray],
    fraction: float,
    rng: np.random.Generator,
    labels: np.ndarray | None = None,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Move a random ``fraction`` of each client's training indices to its validation set.

    With ``labels`` (of the indexed samples) the carve-out is stratified: ``round(fraction·n)``
    samples apportioned over the client's classes in proportion to its class counts."""
    if fraction <= 0:
        return train, [np.zeros(0, np.int64) for _ in train]
    tr, va = [], []
    for idx in train:
        n_val = int(round(fraction * len(idx)))
        if labels is None:
            perm = rng.permutation(idx)
            va.append(np.sort(perm[:n_val]))
            tr.append(np.sort(perm[n_val:]))
            continue
        classes, inverse = np.unique(labels[idx], return_inverse=True)
        take = apportion(n_val, np.bincount(inverse, minlength=len(classes)))
        picked = [rng.permutation(idx[inverse == k])[: take[k]] for k in range(len(classes))]
        val = np.sort(np.concatenate(picked)) if picked else np.zeros(0, np.int64)
        va.append(val)
        tr.append(np.setdiff1d(idx, val))
    return tr, va


def _take(data: DatasetArrays, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``idx`` of train ∪ test, where indices ≥ N_train address the test set."""
    ntr = int(data.train_y.shape[0])
    t = torch.from_numpy(np.asarray(idx, dtype=np.int64))
    is_train = t < ntr
    if bool(is_train.all()):
        return take_rows(data.train_x, t), data.train_y[t]
    if not bool(is_train.any()):
        return take_rows(data.test_x, t - ntr), data.test_y[t - ntr]
    x = torch.empty((len(t), *data.train_x.shape[1:]), dtype=data.train_x.dtype)
    y = torch.empty(len(t), dtype=data.train_y.dtype)
    x[is_train], y[is_train] = data.train_x[t[is_train]], data.train_y[t[is_train]]
    x[~is_train] = data.test_x[t[~is_train] - ntr]
    y[~is_train] = data.test_y[t[~is_train] - ntr]
    return x, y


def _build(
    data: DatasetArrays,
    train: list[np.ndarray],
    test: list[np.ndarray],
    val: list[np.ndarray],
    test_offset: bool = True,
) -> list[ClientData]:
    """Gather clients; ``test`` indices address the test set (offset into train ∪ test here)."""
    ntr = int(data.train_y.shape[0]) if test_offset else 0
    clients = []
    for tr, te, va in zip(train, test, val, strict=True):
        trx, try_ = _take(data, tr)
        tex, tey = _take(data, np.asarray(te, dtype=np.int64) + ntr)
        vax, vay = _take(data, va)
        clients.append(ClientData(trx, try_, tex, tey, vax, vay))
    return clients


def _even(total: int, parts: int) -> np.ndarray:
    """``total`` split into ``parts`` near-equal sizes, the remainder to the first ones."""
    return total // parts + (np.arange(parts) < total % parts).astype(np.int64)


def _proportional_split(idx: np.ndarray, proportions: np.ndarray) -> list[np.ndarray]:
    """NIID-Bench style cut of ``idx`` at ``cumsum(proportions) * len``."""
    cuts = (np.cumsum(proportions) * len(idx)).astype(np.int64)[:-1]
    return np.split(idx, cuts)


def _draw_until_filled(
    draw: Callable[[], list[list[np.ndarray]]], min_samples: int, max_retries: int, what: str
) -> list[np.ndarray]:
    """Each client's sorted train indices from the first of at most ``max_retries`` calls of
    ``draw`` (each client's index parts) that gives every client ≥ ``min_samples`` samples;
    ``what`` names the draw in the error otherwise."""
    for _ in range(max_retries):
        parts = draw()
        if min(sum(len(q) for q in p) for p in parts) >= min_samples:
            return [np.sort(np.concatenate(p)) for p in parts]
    raise DatasetError(
        f"partition.min_samples: no {what} draw gave every one of {len(parts)} clients "
        f"≥ {min_samples} samples in {max_retries} tries"
    )


class _WithValFraction(Partitioner):
    val_fraction: float = Field(0.0, ge=0, lt=1)
    """Fraction of each client's training samples moved to its validation set."""
    val_stratified: bool = False
    """Carve the validation set per class, in the client's label mix (needs class labels)."""

    def unread(self, run: object) -> dict[str, str]:
        """``val_stratified`` without a ``val_fraction`` (issue 42: refused when set)."""
        if self.val_fraction > 0:
            return {}
        return {"val_stratified": "no validation fraction is carved; set partition.val_fraction"}

    def _carve(
        self, data: DatasetArrays, train: list[np.ndarray], rng: np.random.Generator
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Each client's validation carve-out (indices ≥ N_train address the test set)."""
        labels = None
        if self.val_fraction > 0 and self.val_stratified:
            labels = np.concatenate([_labels(data.train_y), _labels(data.test_y)])
        return _carve_val(train, self.val_fraction, rng, labels)


class _WithTest(_WithValFraction):
    test_per_client: int | None = Field(None, gt=0)
    """Test samples per client (default: the whole test pool, divided proportionally)."""


class _WithLabelMixTest(_WithTest):
    test_mix: Literal["proportional", "equal"] = "proportional"
    """Each client's test classes are its training classes: in proportion to its training counts
    (default) or ``equal``: the same number for each class it holds (FedLPS / FedRep)."""

    def _finish_by_label_mix(
        self,
        data: DatasetArrays,
        y: np.ndarray,
        train: list[np.ndarray],
        num_classes: int,
        rng: np.random.Generator,
    ) -> list[ClientData]:
        """Test sets in each client's training label mix, a validation carve-out, the result."""
        counts = np.stack([np.bincount(y[p], minlength=num_classes) for p in train])
        equal = self.test_mix == "equal"
        test = _test_by_label_mix(_labels(data.test_y), counts, self.test_per_client, rng, equal)
        train, val = self._carve(data, train, rng)
        return _build(data, train, test, val)


# ---------------------------------------------------------------------------------------- labels


@PARTITIONERS.register("labels")
class LabelsPartitioner(_WithValFraction):
    """sFedHP's label-skew scheme: client u holds labels ``(u + j) mod K`` for ``j < L``.

    Each class contributes ``train_per_class`` training and ``test_per_class`` test samples (drawn
    without replacement from that class's pools), split evenly among the clients holding the class
    (remainder to the lowest client ids). ``val_per_class`` further training samples per class,
    disjoint from the training split, form the validation sets the same way. With
    ``train_fraction`` each client's per-class train and test shares are pooled and re-split
    ``train_fraction`` / rest (the paper's Section V-B "3/4 for training" variant).
    ``val_fraction`` (instead of ``val_per_class``) moves that fraction of each client's training
    samples to its validation set (``val_stratified``: per class). Setting 1 is
    the default (20 clients → 100 train / 400 test each); Setting 2 is ``train_per_class=900,
    test_per_class=300``.
    """

    labels_per_client: int = Field(5, gt=0)
    train_per_class: int = Field(200, gt=0)
    test_per_class: int = Field(800, ge=0)
    val_per_class: int = Field(0, ge=0)
    train_fraction: float | None = Field(None, gt=0, lt=1)

    def split(self, data: DatasetArrays, num_clients: int, seed: int) -> list[ClientData]:
        """Split by the rotating label assignment."""
        _check_num_clients(num_clients, int(data.train_y.shape[0]))
        if self.val_fraction > 0 and self.val_per_class > 0:
            raise ConfigError(
                "partition.val_fraction: set val_fraction or val_per_class, not both; drop one"
            )
        k_classes = data.num_classes
        if self.labels_per_client > k_classes:
            raise ConfigError(
                f"partition.labels_per_client: {self.labels_per_client} exceeds the "
                f"{k_classes} classes of {data.name}"
            )
        rng = np.random.default_rng(seed)
        ytr, yte = _labels(data.train_y), _labels(data.test_y)
        ntr = len(ytr)
        train: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        test: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        val: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for k in range(k_classes):
            holders = [
                u for u in range(num_clients) if (k - u) % k_classes < self.labels_per_client
            ]
            if not holders:
                continue
            pool = np.flatnonzero(ytr == k)
            need = self.train_per_class + self.val_per_class
            if need > len(pool):
                field = "train_per_class" if self.val_per_class == 0 else "val_per_class"
                raise DatasetError(
                    f"partition.{field}: class {k} of {data.name} has {len(pool)} training "
                    f"samples, {need} requested (train_per_class + val_per_class)"
                    f"{_natural_hint(data)}"
                )
            test_pool = np.flatnonzero(yte == k)
            if self.test_per_class > len(test_pool):
                raise DatasetError(
                    f"partition.test_per_class: class {k} of {data.name} has {len(test_pool)} "
                    f"test samples, {self.test_per_class} requested{_natural_hint(data)}"
                )
            pool = rng.permutation(pool)
            test_pool = rng.permutation(test_pool)[: self.test_per_class] + ntr
            h = len(holders)
            parts = zip(
                _cut(pool[: self.train_per_class], _even(self.train_per_class, h)),
                _cut(pool[self.train_per_class : need], _even(self.val_per_class, h)),
                _cut(test_pool, _even(self.test_per_class, h)),
                strict=True,
            )
            for u, (tr, va, te) in zip(holders, parts, strict=True):
                if self.train_fraction is not None:
                    both = rng.permutation(np.concatenate([tr, te]))
                    n_train = int(round(self.train_fraction * len(both)))
                    tr, te = both[:n_train], both[n_train:]
                train[u].append(tr)
                val[u].append(va)
                test[u].append(te)
        flat = [
            [np.sort(np.concatenate(p)) if p else np.zeros(0, np.int64) for p in lists]
            for lists in (train, test, val)
        ]
        if self.val_fraction > 0:
            flat[0], flat[2] = self._carve(data, flat[0], rng)
        return _build(data, flat[0], flat[1], flat[2], test_offset=False)


# ---------------------------------------------------------------------------------------- shards


@PARTITIONERS.register("shards")
class ShardsPartitioner(_WithLabelMixTest):
    """FedAvg's pathological non-IID split: sort by label, cut into shards, deal them randomly.

    The training set (shuffled within each label) is sorted by label and cut into
    ``num_clients * shards_per_client`` shards of ``shard_size`` samples (default
    ``N // shards``; any tail is unused); each client receives ``shards_per_client`` random shards.
    """

    shards_per_client: int = Field(2, gt=0)
    shard_size: int | None = Field(None, gt=0)

    def split(self, data: DatasetArrays, num_clients: int, seed: int) -> list[ClientData]:
        """Deal label-sorted shards."""
        y = _labels(data.train_y)
        _check_num_clients(num_clients, len(y))
        rng = np.random.default_rng(seed)
        num_shards = num_clients * self.shards_per_client
        size = self.shard_size or len(y) // num_shards
        if size == 0 or size * num_shards > len(y):
            raise DatasetError(
                f"partition.shard_size: {num_shards} shards of {size} samples do not fit in "
                f"{len(y)} training samples"
            )
        perm = rng.permutation(len(y))
        order = perm[np.argsort(y[perm], kind="stable")]
        shards = order[: size * num_shards].reshape(num_shards, size)
        deal = rng.permutation(num_shards).reshape(num_clients, self.shards_per_client)
        train = [np.sort(shards[d].ravel()) for d in deal]
        return self._finish_by_label_mix(data, y, train, data.num_classes, rng)


# ------------------------------------------------------------------------------------- dirichlet


@PARTITIONERS.register("dirichlet")
class DirichletPartitioner(_WithLabelMixTest):
    """NIID-Bench label skew: each class is split by proportions ~ Dir_n(alpha).

    A client stops receiving once it holds ≥ N/n samples; the draw is repeated until every client
    has ≥ ``min_samples`` (at most ``max_retries`` times).
    """

    alpha: float = Field(0.5, gt=0)
    min_samples: int = Field(10, ge=0)
    max_retries: int = Field(1000, gt=0)
    noise: float = Field(
        0.0,
        ge=0,
        description="label + feature skew: client i's training features get fresh Gaussian "
        "noise of std noise·i/(n−1) at every access (NIID-Bench); 0: none",
    )

    def split(self, data: DatasetArrays, num_clients: int, seed: int) -> list[ClientData]:
        """Dirichlet label-skew split (plus resampled feature noise with ``noise`` > 0)."""
        y = _labels(data.train_y)
        _check_num_clients(num_clients, len(y))
        rng = np.random.default_rng(seed)
        cap = len(y) / num_clients

        def draw() -> list[list[np.ndarray]]:
            parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
            sizes = np.zeros(num_clients, dtype=np.int64)
            for k in range(data.num_classes):
                idx = rng.permutation(np.flatnonzero(y == k))
                p = rng.dirichlet(np.full(num_clients, self.alpha)) * (sizes < cap)
                p = p / p.sum() if p.sum() > 0 else np.full(num_clients, 1 / num_clients)
                for i, part in enumerate(_proportional_split(idx, p)):
                    parts[i].append(part)
                    sizes[i] += len(part)
            return parts

        what = f"Dirichlet(alpha={self.alpha})"
        train = _draw_until_filled(draw, self.min_samples, self.max_retries, what)
        clients = self._finish_by_label_mix(data, y, train, data.num_classes, rng)
        if self.noise > 0:
            return with_resampled_noise(clients, self.noise, max(num_clients - 1, 1))
        return clients


# -------------------------------------------------------------------------------------- quantity


@PARTITIONERS.register("quantity")
class QuantityPartitioner(_WithTest):
    """Quantity skew, IID labels: client sizes ∝ Dir_n(beta) (NIID-Bench) or lognormal(0, sigma).

    Sizes are redrawn until every client has ≥ ``min_samples``; a random permutation of the
    training set is cut accordingly. Test sets are IID, sized proportionally to the training sets
    (or ``test_per_client`` each). Labels are not used, so regression data works too.
    """

    distribution: Literal["dirichlet", "lognormal"] = "dirichlet"
    beta: float = Field(0.5, gt=0)
    sigma: float = Field(1.0, gt=0)
    min_samples: int = Field(10, ge=0)
    max_retries: int = Field(1000, gt=0)

    def unread(self, run: object) -> dict[str, str]:
        """The other distribution's parameter."""
        other = {"dirichlet": ("sigma", "lognormal"), "lognormal": ("beta", "dirichlet")}
        key, name = other[self.distribution]
        return {
            **super().unread(run),
            key: f"only distribution={name} reads it; set partition.distribution={name}",
        }

    def split(self, data: DatasetArrays, num_clients: int, seed: int) -> list[ClientData]:
        """Quantity-skew split."""
        n_train = int(data.train_y.shape[0])
        _check_num_clients(num_clients, n_train)
        rng = np.random.default_rng(seed)
        for _ in range(self.max_retries):
            if self.distribution == "dirichlet":
                p = rng.dirichlet(np.full(num_clients, self.beta))
            else:
                p = rng.lognormal(0.0, self.sigma, num_clients)
                p = p / p.sum()
            if (p * n_train).min() >= self.min_samples:
                break
        else:
            raise DatasetError(
                f"partition.min_samples: no {self.distribution} size draw gave every one of "
                f"{num_clients} clients ≥ {self.min_samples} samples in {self.max_retries} tries"
            )
        train = [np.sort(t) for t in _proportional_split(rng.permutation(n_train), p)]
        sizes = np.array([len(t) for t in train])
        test = _test_iid(int(data.test_y.shape[0]), sizes, self.test_per_client, rng)
        train, val = self._carve(data, train, rng)
        return _build(data, train, [np.sort(t) for t in test], val)


# --------------------------------------------------------------------------------- feature noise


def with_resampled_noise(clients: list[ClientData], noise: float, denom: int) -> list[ClientData]:
    """``clients`` whose training features get fresh Gaussian noise of std ``noise·i/denom``
    (client i) at every access (NIID-Bench's feature skew; clean validation and test sets)."""
    return [
        dataclasses.replace(c, train_noise_std=noise * i / denom) for i, c in enumerate(clients)
    ]


@PARTITIONERS.register("feature_noise")
class FeatureNoisePartitioner(_WithTest):
    """IID split where client i's features get fixed Gaussian noise of std ``noise·i/D``.

    ``D`` is ``num_clients`` (FedLab convention, default) or ``num_clients - 1`` (NIID-Bench), so
    client 0 is clean. Noise is drawn once (seeded) and added in the dataset's stored (normalized)
    feature space to the client's train and validation features, and to its test features unless
    ``noisy_test`` is false. Training sets are near-equal random parts.
    """

    noise: float = Field(0.1, ge=0)
    scale_by: Literal["num_clients", "num_clients_minus_1"] = "num_clients"
    noisy_test: bool = True
    resample: bool = Field(
        False,
        description="NIID-Bench / FNR-FL: fresh noise at every access of a training sample "
        "(validation and test stay clean); false: noise drawn once",
    )

    def split(self, data: DatasetArrays, num_clients: int, seed: int) -> list[ClientData]:
        """IID split plus per-client noise."""
        n_train = int(data.train_y.shape[0])
        _check_num_clients(num_clients, n_train)
        rng = np.random.default_rng(seed)
        train = [np.sort(p) for p in _cut(rng.permutation(n_train), _even(n_train, num_clients))]
        weights = np.ones(num_clients)
        test = _test_iid(int(data.test_y.shape[0]), weights, self.test_per_client, rng)
        train, val = self._carve(data, train, rng)
        clients = _build(data, train, [np.sort(t) for t in test], val)
        denom = num_clients if self.scale_by == "num_clients" else max(num_clients - 1, 1)
        if self.resample:
            return with_resampled_noise(clients, self.noise, denom)
        gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
        noisy = []
        for i, c in enumerate(clients):
            std = self.noise * i / denom

            def add(x: torch.Tensor, std: float = std) -> torch.Tensor:
                if std == 0 or x.numel() == 0:
                    return x
                return x + std * torch.randn(x.shape, generator=gen, dtype=x.dtype)

            test_x = add(c.test_x) if self.noisy_test else c.test_x
            noisy.append(
                ClientData(add(c.train_x), c.train_y, test_x, c.test_y, add(c.val_x), c.val_y)
            )
        return noisy


# ----------------------------------------------------------------------------------------- mixed


def _second_labels(first: np.ndarray, rng: np.random.Generator, max_retries: int) -> np.ndarray:
    """A random rearrangement of ``first`` with ``second[i] != first[i]`` for every client."""
    second = rng.permutation(first)
    n = len(first)
    for _ in range(max_retries * max(n, 1)):
        bad = np.flatnonzero(second == first)
        if bad.size == 0:
            return second
        i = int(bad[0])
        j = int(rng.integers(n))
        if second[j] != first[i] and second[i] != first[j]:
            second[i], second[j] = second[j], second[i]
    raise DatasetError("partition: could not give every client a second, different class")


@PARTITIONERS.register("mixed")
class MixedPartitioner(_WithLabelMixTest):
    """FNR-FL's label + quantity skew: client i holds class ``i mod K`` plus one other class.

    The second classes are a random rearrangement of the first ones (never equal to the client's
    first class), so with ``num_clients == K`` every class has exactly 2 owners (in general, twice
    as many owners as first-owners). Each class's training samples are split among its owners by
    proportions ~ Dir(alpha); redrawn until every client has ≥ ``min_samples`` (bounded by
    ``max_retries``, unlike the reference loop that can hang).
    """

    alpha: float = Field(0.5, gt=0)
    min_samples: int = Field(10, ge=0)
    max_retries: int = Field(1000, gt=0)

    def split(self, data: DatasetArrays, num_clients: int, seed: int) -> list[ClientData]:
        """Mixed label + quantity split."""
        y = _labels(data.train_y)
        _check_num_clients(num_clients, len(y))
        k_classes = data.num_classes
        if k_classes < 2 or num_clients < 2:
            raise ConfigError("partition: 'mixed' needs at least 2 classes and 2 clients")
        rng = np.random.default_rng(seed)
        first = np.arange(num_clients) % k_classes
        second = _second_labels(first, rng, self.max_retries)
        owners = [np.flatnonzero((first == k) | (second == k)) for k in range(k_classes)]
        pools = [np.flatnonzero(y == k) for k in range(k_classes)]

        def draw() -> list[list[np.ndarray]]:
            parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
            for k in range(k_classes):
                if owners[k].size == 0:
                    continue
                p = rng.dirichlet(np.full(len(owners[k]), self.alpha))
                for u, part in zip(
                    owners[k], _proportional_split(rng.permutation(pools[k]), p), strict=True
                ):
                    parts[u].append(part)
            return parts

        what = f"Dir(alpha={self.alpha})"
        train = _draw_until_filled(draw, self.min_samples, self.max_retries, what)
        return self._finish_by_label_mix(data, y, train, k_classes, rng)


def _natural_hint(data: DatasetArrays) -> str:
    """For a dataset that brings its own clients (owners), the partition that uses them."""
    if data.train_owner is None or data.test_owner is None:
        return ""
    clients = int(max(data.train_owner.max(), data.test_owner.max())) + 1
    return (
        f"; or use {data.name}'s own clients: partition.name=natural "
        f"federation.num_clients={clients}"
    )


# --------------------------------------------------------------------------------------- natural


@PARTITIONERS.register("natural")
class NaturalPartitioner(_WithValFraction):
    """The dataset's own clients (``train_owner`` / ``test_owner``, e.g. ``synthetic``).

    ``val_tail``: the validation set is the *last* ``val_fraction`` of each client's training
    rows in their stored order (for Shakespeare: text order, also after ``subsample``), with
    ``val_gap`` rows dropped between the training rows and it, instead of a random carve-out. For
    overlapping windows (Shakespeare's consecutive windows share all but one character) a random
    carve-out leaks near-copies of validation windows into training; ``val_gap`` ≥ ``seq_len``
    leaves no character of a validation window in a training window."""

    val_tail: bool = False
    val_gap: int = Field(0, ge=0)

    def unread(self, run: object) -> dict[str, str]:
        """``val_gap`` without ``val_tail``; ``val_stratified`` with it."""
        if self.val_tail:
            return {
                "val_stratified": "val_tail takes each client's last rows, not a per-class "
                "carve-out; drop one of the two"
            }
        return {
            **super().unread(run),
            "val_gap": "only val_tail reads it; set partition.val_tail=true",
        }

    def split(self, data: DatasetArrays, num_clients: int, seed: int) -> list[ClientData]:
        """One client per owner id; ``num_clients`` must equal the number of owners."""
        if data.train_owner is None or data.test_owner is None:
            raise ConfigError(
                f"partition.name: 'natural' needs a natively federated dataset (such as "
                f"synthetic); {data.name} has no client owners"
            )
        owner_tr = _labels(data.train_owner)
        owner_te = _labels(data.test_owner)
        found = int(max(owner_tr.max(initial=-1), owner_te.max(initial=-1))) + 1
        if num_clients != found:
            raise ConfigError(
                f"federation.num_clients: {num_clients} does not match the {found} clients of "
                f"{data.name}; set federation.num_clients={found}"
            )
        rng = np.random.default_rng(seed)
        train, test = rows_by_owner(owner_tr, num_clients), rows_by_owner(owner_te, num_clients)
        train, val = self._tail(train) if self.val_tail else self._carve(data, train, rng)
        return _build(data, train, test, val)

    def _tail(self, train: list[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Each client's last ``round(val_fraction · n)`` rows as validation, ``val_gap`` rows
        before them dropped. A client with fewer than ``val_gap`` + 2 · that many rows (or
        ``val_fraction`` 0) gives no validation rows and keeps all its training rows."""
        tr, va = [], []
        for idx in train:
            n_val = int(round(self.val_fraction * len(idx)))
            keep = len(idx) - n_val - self.val_gap
            if n_val == 0 or keep < n_val:
                tr.append(idx)
                va.append(np.zeros(0, np.int64))
                continue
            tr.append(idx[:keep])
            va.append(idx[len(idx) - n_val :])
        return tr, va


def rows_by_owner(owner: np.ndarray, num_clients: int) -> list[np.ndarray]:
    """The (increasing) row indices of each owner ``0 .. num_clients - 1``, in O(N log N)."""
    order = np.argsort(owner, kind="stable")
    bounds = np.cumsum(np.bincount(owner, minlength=num_clients))[:-1]
    return np.split(order, bounds)


@PARTITIONERS.register("label_sorted")
class LabelSortedPartitioner(Partitioner):
    """The label-sorted split of the Byzantine-robustness papers (Karimireddy, He and Jaggi,
    ICLR 2022; ``fedhp reproduce robust-paper``): the last ``num_clients − iid_clients`` clients
    hold the training set sorted by label (dataset order within a label) in equal contiguous
    chunks; the first ``iid_clients`` hold as many samples each, drawn at random from the whole
    training set (so they repeat good clients' samples, as their Byzantine workers' do). The test
    set is dealt evenly at random over all clients."""

    iid_clients: int = Field(0, ge=0)

    def split(self, data: DatasetArrays, num_clients: int, seed: int) -> list[ClientData]:
        """The sorted chunks, the IID draws and the dealt test set."""
        good = num_clients - self.iid_clients
        if good < 1:
            raise ConfigError(
                f"partition.iid_clients: {self.iid_clients} leaves no sorted client of "
                f"{num_clients}"
            )
        y = _labels(data.train_y)
        size = math.ceil(len(y) / good)
        if size > len(y):
            raise DatasetError(f"partition: {len(y)} training samples for {good} clients")
        rng = np.random.default_rng(seed)
        order = np.argsort(y, kind="stable")
        order = np.concatenate([order, order[: size * good - len(order)]])  # theirs: wrap
        sorted_part = [order[i * size : (i + 1) * size] for i in range(good)]
        iid = [np.sort(rng.choice(len(y), size, replace=False)) for _ in range(self.iid_clients)]
        test = np.array_split(rng.permutation(int(data.test_y.shape[0])), num_clients)
        empty = [np.zeros(0, np.int64)] * num_clients
        return _build(data, [*iid, *sorted_part], [np.sort(t) for t in test], empty)


def split_dataset(
    data: DatasetArrays,
    cfg: dict[str, object],
    num_clients: int,
    seed: int,
    prefix: str = "partition",
) -> list[ClientData]:
    """Build the partitioner named by ``cfg['name']`` and split ``data``."""
    return PARTITIONERS.build(cfg, prefix).split(data, num_clients, seed)
