"""Partitioner invariants: disjointness, exact counts, determinism, label sets."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from fedhp.data import DATASETS, PARTITIONERS, split_dataset
from fedhp.data.partition import apportion, rows_by_owner
from fedhp.errors import ConfigError, DatasetError

ALL_SCHEMES = [
    {"name": "labels", "train_per_class": 60, "test_per_class": 30, "val_per_class": 20},
    {
        "name": "labels",
        "labels_per_client": 3,
        "train_per_class": 90,
        "test_per_class": 40,
        "train_fraction": 0.75,
    },
    {"name": "shards", "val_fraction": 0.1},
    {"name": "shards", "shards_per_client": 3, "shard_size": 20, "test_per_client": 12},
    {"name": "dirichlet", "alpha": 0.5, "min_samples": 5, "val_fraction": 0.2},
    {"name": "quantity", "beta": 0.5, "min_samples": 5},
    {"name": "quantity", "distribution": "lognormal", "sigma": 1.0, "test_per_client": 10},
    {"name": "feature_noise", "noise": 0.0, "val_fraction": 0.1},
    {"name": "mixed", "alpha": 0.5, "min_samples": 5},
    {"name": "shards", "val_fraction": 0.1, "val_stratified": True, "test_mix": "equal"},
    {"name": "labels", "train_per_class": 60, "test_per_class": 30, "val_fraction": 0.1},
    {
        "name": "labels",
        "train_per_class": 90,
        "test_per_class": 40,
        "train_fraction": 0.75,
        "val_fraction": 0.2,
        "val_stratified": True,
    },
]


def test_registry_names() -> None:
    assert set(PARTITIONERS.names()) == {
        "labels", "shards", "dirichlet", "quantity", "feature_noise", "mixed", "natural",
        "categories", "label_sorted",
    }  # fmt: skip


@pytest.mark.parametrize("cfg", ALL_SCHEMES, ids=lambda c: c["name"])
def test_disjoint_and_deterministic(cfg, small, dh) -> None:
    a = split_dataset(small, cfg, 10, seed=1)
    assert len(a) == 10
    dh.assert_disjoint(a, pooled="train_fraction" in cfg)
    assert dh.signature(split_dataset(small, cfg, 10, seed=1)) == dh.signature(a)
    assert dh.signature(split_dataset(small, cfg, 10, seed=2)) != dh.signature(a)
    for c in a:
        assert c.train_x.dtype == torch.float32 and c.train_y.dtype == torch.int64
        assert c.val_x.shape[1:] == c.train_x.shape[1:] == c.test_x.shape[1:]


def test_unknown_option_is_config_error() -> None:
    with pytest.raises(ConfigError, match=r"partition\.alfa: unknown key"):
        PARTITIONERS.build({"name": "dirichlet", "alfa": 1}, "partition")
    with pytest.raises(ConfigError, match=r"partition\.alpha"):
        PARTITIONERS.build({"name": "dirichlet", "alpha": 0}, "partition")


# ---------------------------------------------------------------------------------------- labels


def test_labels_setting1_counts_and_label_sets(setting1, dh) -> None:
    clients = split_dataset(setting1, {"name": "labels"}, 20, seed=0)
    dh.assert_disjoint(clients)
    for u, c in enumerate(clients):
        assert c.num_train == 100 and len(c.test_y) == 400 and len(c.val_y) == 0
        want = {(u + j) % 10 for j in range(5)}  # client u holds labels (u + j) mod K, j < L
        assert Counter(c.train_y.tolist()) == {k: 20 for k in want}
        assert Counter(c.test_y.tolist()) == {k: 80 for k in want}


def test_labels_setting2_counts(setting1) -> None:
    cfg = {"name": "labels", "train_per_class": 270, "test_per_class": 90}
    clients = split_dataset(setting1, cfg, 20, seed=0)
    assert {c.num_train for c in clients} == {135} and {len(c.test_y) for c in clients} == {45}


def test_labels_validation_has_label_mix_and_is_unused_train(setting1, dh) -> None:
    cfg = {"name": "labels", "val_per_class": 50}
    clients = split_dataset(setting1, cfg, 20, seed=3)
    dh.assert_disjoint(clients)
    for u, c in enumerate(clients):
        assert Counter(c.val_y.tolist()) == {(u + j) % 10: 5 for j in range(5)}
        assert c.num_train == 100


def test_labels_remainder_goes_to_first_holders(small) -> None:
    cfg = {"name": "labels", "labels_per_client": 2, "train_per_class": 7, "test_per_class": 3}
    clients = split_dataset(small, cfg, 10, seed=0)
    # class k is held by clients k-1 (lower id first unless wrapping) and k
    assert Counter(clients[0].train_y.tolist()) == {0: 4, 1: 4}  # first holder of 0 and 1
    assert Counter(clients[9].train_y.tolist()) == {9: 3, 0: 3}


def test_labels_train_fraction_pools_train_and_test(setting1, dh) -> None:
    cfg = {"name": "labels", "train_fraction": 0.75}
    clients = split_dataset(setting1, cfg, 20, seed=0)
    ids_all = []
    for c in clients:
        assert c.num_train == 375 and len(c.test_y) == 125
        assert Counter(c.train_y.tolist()) == {k: 75 for k in set(c.train_y.tolist())}
        tr, te = dh.ids(c.train_x), dh.ids(c.test_x)
        assert any(i < 0 for i in tr)  # pooled: some test-pool samples train
        ids_all += tr + te
    assert len(ids_all) == len(set(ids_all))


def test_labels_errors(small) -> None:
    with pytest.raises(ConfigError, match=r"partition\.labels_per_client: 11 exceeds the 10"):
        split_dataset(small, {"name": "labels", "labels_per_client": 11}, 5, 0)
    with pytest.raises(DatasetError, match=r"partition\.train_per_class: class 0 .* has 100"):
        split_dataset(small, {"name": "labels"}, 20, 0)
    with pytest.raises(DatasetError, match=r"partition\.val_per_class: .*has 100"):
        cfg = {"name": "labels", "train_per_class": 90, "val_per_class": 20}
        split_dataset(small, cfg, 20, 0)
    with pytest.raises(DatasetError, match=r"partition\.test_per_class: class 0 .* has 50"):
        split_dataset(small, {"name": "labels", "train_per_class": 10}, 20, 0)
    with pytest.raises(ConfigError, match="num_clients"):
        split_dataset(small, {"name": "labels"}, 0, 0)


# ---------------------------------------------------------------------------------------- shards


def test_shards_two_labels_each_and_matching_test(small, dh) -> None:
    clients = split_dataset(small, {"name": "shards", "test_per_client": 20}, 10, seed=0)
    dh.assert_disjoint(clients)
    for c in clients:
        assert c.num_train == 100  # 20 shards of 50; every shard is a single class
        labels = set(c.train_y.tolist())
        assert 1 <= len(labels) <= 2
        assert len(c.test_y) == 20 and set(c.test_y.tolist()) <= labels
        train_share = Counter(c.train_y.tolist())
        assert Counter(c.test_y.tolist()) == {k: v // 5 for k, v in train_share.items()}


def test_shards_too_many_is_error(small) -> None:
    with pytest.raises(DatasetError, match="partition.shard_size"):
        split_dataset(small, {"name": "shards", "shard_size": 60}, 10, 0)


# ------------------------------------------------------------------------------ dirichlet/mixed


def test_dirichlet_min_samples_and_test_follows_labels(small) -> None:
    clients = split_dataset(small, {"name": "dirichlet", "alpha": 0.3}, 10, seed=4)
    assert sum(c.num_train for c in clients) == 1000
    assert sum(len(c.test_y) for c in clients) == 500
    for c in clients:
        assert c.num_train >= 10
        assert set(c.test_y.tolist()) <= set(c.train_y.tolist())


def test_dirichlet_impossible_min_samples(small) -> None:
    with pytest.raises(DatasetError, match=r"partition\.min_samples: .* 3 tries"):
        split_dataset(small, {"name": "dirichlet", "min_samples": 200, "max_retries": 3}, 10, 0)


def test_mixed_two_classes_two_owners(small) -> None:
    clients = split_dataset(small, {"name": "mixed", "min_samples": 5}, 10, seed=5)
    owners: Counter[int] = Counter()
    for i, c in enumerate(clients):
        labels = set(c.train_y.tolist())
        assert i % 10 in labels and len(labels) <= 2
        owners.update(labels)
    assert sum(c.num_train for c in clients) == 1000
    assert all(v <= 2 for v in owners.values())


def test_mixed_many_clients_terminates(small) -> None:
    clients = split_dataset(small, {"name": "mixed", "min_samples": 1}, 40, seed=0)
    assert sum(c.num_train for c in clients) == 1000
    assert all(1 <= len(set(c.train_y.tolist())) <= 2 for c in clients)


# ------------------------------------------------------------------------- quantity/feature noise


def test_quantity_sizes_skewed_labels_iid(small) -> None:
    clients = split_dataset(small, {"name": "quantity", "beta": 0.5}, 10, seed=0)
    sizes = [c.num_train for c in clients]
    assert sum(sizes) == 1000 and min(sizes) >= 10 and max(sizes) > 2 * min(sizes)
    assert sum(len(c.test_y) for c in clients) == 500


def zero_features(dh):  # type: ignore[no-untyped-def]
    """400 samples per class of 200 all-zero features: any nonzero value is noise."""
    data = dh.make_data(400, 10)
    return type(data)(
        name="wide",
        train_x=torch.zeros(len(data.train_y), 200),
        train_y=data.train_y,
        test_x=torch.zeros(len(data.test_y), 200),
        test_y=data.test_y,
        num_classes=10,
    )


def test_feature_noise_scale(dh) -> None:
    data = zero_features(dh)
    clients = split_dataset(data, {"name": "feature_noise", "noise": 0.5}, 5, seed=0)
    for i, c in enumerate(clients):
        assert float(c.train_x.std()) == pytest.approx(0.5 * i / 5, abs=0.01)
        assert float(c.test_x.std()) == pytest.approx(0.5 * i / 5, abs=0.03)
        assert c.num_train == 800
    cfg = {"name": "feature_noise", "noise": 0.5, "scale_by": "num_clients_minus_1"}
    cfg["noisy_test"] = False
    clients = split_dataset(data, cfg, 5, seed=0)
    assert float(clients[4].train_x.std()) == pytest.approx(0.5, abs=0.01)
    assert float(clients[4].test_x.abs().max()) == 0.0


def test_resampled_noise_is_fresh_at_every_access_and_never_evaluated(dh) -> None:
    """NIID-Bench feature skew: stored features stay clean; every gather of the same training
    rows adds new noise of client i's std σ·i/(n−1); evaluation windows see clean data."""
    from fedhp.engine.federation import Federation

    data = zero_features(dh)
    cfg = {"name": "feature_noise", "noise": 0.5, "resample": True}
    cfg["scale_by"] = "num_clients_minus_1"
    clients = split_dataset(data, cfg, 5, seed=0)
    assert [c.train_noise_std for c in clients] == pytest.approx([0.5 * i / 4 for i in range(5)])
    assert all(float(c.train_x.abs().max()) == 0.0 for c in clients)  # stored clean
    fed = Federation.from_clients(clients, 10)
    g = torch.Generator().manual_seed(0)
    idx = torch.arange(50).expand(5, -1)
    first, _ = fed.train.gather(torch.arange(5), idx, g)
    second, _ = fed.train.gather(torch.arange(5), idx, g)
    assert float(first[0].abs().max()) == 0.0  # client 0 is clean
    for i in range(1, 5):
        assert float(first[i].std()) == pytest.approx(0.5 * i / 4, rel=0.05)
        assert not torch.equal(first[i], second[i])  # fresh noise at every access
    x, _, _ = fed.train.windows(0, 10)  # what evaluation reads
    assert float(x.abs().max()) == 0.0
    with pytest.raises(ValueError, match="generator"):
        fed.train.gather(torch.arange(5), idx)


def test_label_skew_with_resampled_noise(small) -> None:
    plain = split_dataset(small, {"name": "dirichlet", "alpha": 0.5}, 10, seed=2)
    noisy = split_dataset(small, {"name": "dirichlet", "alpha": 0.5, "noise": 0.1}, 10, seed=2)
    for i, (a, b) in enumerate(zip(plain, noisy, strict=True)):
        assert torch.equal(a.train_y, b.train_y) and torch.equal(a.train_x, b.train_x)
        assert b.train_noise_std == pytest.approx(0.1 * i / 9) and a.train_noise_std == 0.0


# --------------------------------------------------------------------------------------- natural


def test_natural_uses_owners(small) -> None:
    data = DATASETS.build({"name": "synthetic", "num_clients": 8, "seed": 3}, "dataset").load()
    assert data.train_owner is not None and data.test_owner is not None
    clients = split_dataset(data, {"name": "natural"}, 8, seed=0)
    for i, c in enumerate(clients):
        assert c.num_train == int((data.train_owner == i).sum())
        assert len(c.test_y) == int((data.test_owner == i).sum())
        assert torch.equal(c.train_x, data.train_x[data.train_owner == i])  # rows, in order
        assert torch.equal(c.test_y, data.test_y[data.test_owner == i])
    with pytest.raises(ConfigError, match="num_clients: 5 does not match the 8"):
        split_dataset(data, {"name": "natural"}, 5, seed=0)
    with pytest.raises(ConfigError, match="natively federated"):
        split_dataset(small, {"name": "natural"}, 5, seed=0)


def testrows_by_owner_keeps_each_owners_rows_in_order() -> None:
    owner = np.array([2, 0, 2, 3, 0, 2])
    rows = rows_by_owner(owner, 5)  # owners 1 and 4 have no rows
    assert [r.tolist() for r in rows] == [[1, 4], [], [0, 2, 5], [3], []]


def test_val_fraction_carves_train(small) -> None:
    clients = split_dataset(small, {"name": "feature_noise", "val_fraction": 0.1}, 10, seed=0)
    assert all(c.num_train == 90 and len(c.val_y) == 10 for c in clients)


@given(
    st.integers(0, 10_000),
    st.lists(st.floats(0, 100, allow_nan=False), min_size=1, max_size=30).filter(
        lambda w: sum(w) > 0
    ),
)
def test_apportion_sums_and_is_close(total: int, weights: list[float]) -> None:
    sizes = apportion(total, np.array(weights))
    assert sizes.sum() == total and (sizes >= 0).all()
    quota = total * np.array(weights) / sum(weights)
    assert np.all(np.abs(sizes - quota) < 1 + 1e-9)


def test_stratified_val_fraction_keeps_each_clients_label_mix(small) -> None:
    cfg = {"name": "dirichlet", "min_samples": 5, "val_fraction": 0.1, "val_stratified": True}
    plain = split_dataset(small, {**cfg, "val_stratified": False}, 10, seed=0)
    clients = split_dataset(small, cfg, 10, seed=0)
    for c, p in zip(clients, plain, strict=True):
        both = Counter(c.train_y.tolist()) + Counter(c.val_y.tolist())
        n = sum(both.values())
        assert len(c.val_y) == round(0.1 * n) == len(p.val_y)  # the same 90/10 sizes
        classes = sorted(both)
        want = apportion(round(0.1 * n), np.array([both[k] for k in classes]))
        assert [Counter(c.val_y.tolist())[k] for k in classes] == want.tolist()


def test_labels_val_fraction_carves_each_clients_train(small, dh) -> None:
    cfg = {"name": "labels", "train_per_class": 60, "test_per_class": 30}
    whole = split_dataset(small, cfg, 10, seed=0)
    carved = split_dataset(small, {**cfg, "val_fraction": 0.1, "val_stratified": True}, 10, 0)
    for w, c in zip(whole, carved, strict=True):
        assert sorted(dh.ids(c.train_x) + dh.ids(c.val_x)) == sorted(dh.ids(w.train_x))
        assert len(c.val_y) == round(0.1 * w.num_train)
        assert torch.equal(c.test_x, w.test_x)
    with pytest.raises(ConfigError, match="partition.val_fraction: set val_fraction or"):
        split_dataset(small, {**cfg, "val_fraction": 0.1, "val_per_class": 5}, 10, seed=0)


def test_equal_test_mix_gives_each_held_class_the_same_count(small) -> None:
    for per_client in (None, 20):
        cfg = {"name": "dirichlet", "min_samples": 5, "test_mix": "equal"}
        if per_client is not None:
            cfg["test_per_client"] = per_client
        clients = split_dataset(small, cfg, 10, seed=3)
        for c in clients:
            held = set(c.train_y.tolist())
            test = Counter(c.test_y.tolist())
            assert set(test) <= held
            if per_client is not None:  # the same number for each of its classes (±1)
                assert len(c.test_y) == per_client and set(test) == held
                assert max(test.values()) - min(test.values()) <= 1
        if per_client is None:  # each class's whole pool, split equally among its holders
            for k in range(10):
                shares = [
                    int((c.test_y == k).sum()) for c in clients if k in set(c.train_y.tolist())
                ]
                assert sum(shares) == int((small.test_y == k).sum())
                assert max(shares) - min(shares) <= 1
