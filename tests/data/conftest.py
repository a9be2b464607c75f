"""Small in-memory datasets whose features identify each sample (for partition invariants)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fedhp.data import ClientData, DatasetArrays, shakespeare
from tests.data.shakespeare_play import write_plays


def make_data(train_per_class: int, test_per_class: int, num_classes: int = 10) -> DatasetArrays:
    """Column 0 of x is the sample id: ``i`` for train row i, ``-(i + 1)`` for test row i."""
    rng = np.random.default_rng(123)
    ytr = rng.permutation(np.repeat(np.arange(num_classes), train_per_class))
    yte = rng.permutation(np.repeat(np.arange(num_classes), test_per_class))
    xtr = np.stack([np.arange(len(ytr)), ytr], axis=1).astype(np.float32)
    xte = np.stack([-(np.arange(len(yte)) + 1), yte], axis=1).astype(np.float32)
    return DatasetArrays(
        name="fake",
        train_x=torch.from_numpy(xtr),
        train_y=torch.from_numpy(ytr.astype(np.int64)),
        test_x=torch.from_numpy(xte),
        test_y=torch.from_numpy(yte.astype(np.int64)),
        num_classes=num_classes,
    )


def ids(x: torch.Tensor) -> list[int]:
    return [int(v) for v in x[:, 0].tolist()]


def assert_disjoint(clients: list[ClientData], pooled: bool = False) -> None:
    """No sample used twice anywhere (train, val, test of all clients); ids match labels.

    Unless ``pooled``, train/val samples come from the train pool and test ones from the test pool.
    """
    train_val: list[int] = []
    test: list[int] = []
    for c in clients:
        train_val += ids(c.train_x) + ids(c.val_x)
        test += ids(c.test_x)
        for x, y in ((c.train_x, c.train_y), (c.test_x, c.test_y), (c.val_x, c.val_y)):
            assert torch.equal(x[:, 1].long(), y)
    if not pooled:
        assert all(i >= 0 for i in train_val)
        assert all(i < 0 for i in test)
    everything = train_val + test
    assert len(everything) == len(set(everything))


def signature(clients: list[ClientData]) -> list[tuple[list[int], list[int], list[int]]]:
    return [(ids(c.train_x), ids(c.test_x), ids(c.val_x)) for c in clients]


@pytest.fixture(scope="session")
def small() -> DatasetArrays:
    return make_data(100, 50)


@pytest.fixture(scope="session")
def setting1() -> DatasetArrays:
    return make_data(300, 900)


@pytest.fixture(scope="session")
def dh() -> SimpleNamespace:
    """Helpers for partition tests (a fixture, so no test module imports ``conftest``)."""
    return SimpleNamespace(
        make_data=make_data, ids=ids, assert_disjoint=assert_disjoint, signature=signature
    )


@pytest.fixture()
def plays(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, dict]:
    """Two fabricated plays in a folder (Shakespeare tests); the parse cache in a fresh folder."""
    monkeypatch.setenv("FEDHP_CACHE_DIR", str(tmp_path / "cache"))
    shakespeare._load.cache_clear()
    return tmp_path / "texts", write_plays(tmp_path / "texts", count=2)
