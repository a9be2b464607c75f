"""``partition.val_tail``: the natural partition's validation set as the last rows of each
client's training rows, after a gap (issue 43: leak-free validation windows for Shakespeare)."""

from __future__ import annotations

import torch

from fedhp.data.partition import split_dataset
from fedhp.data.types import DatasetArrays


def _owned(counts: list[int]) -> DatasetArrays:
    """Row ``i`` holds feature ``i`` (so rows can be traced), owners in blocks of ``counts``."""
    n = sum(counts)
    owner = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
    return DatasetArrays(
        name="toy",
        train_x=torch.arange(n, dtype=torch.float32).unsqueeze(1),
        train_y=torch.zeros(n, dtype=torch.int64),
        test_x=torch.zeros(len(counts), 1),
        test_y=torch.zeros(len(counts), dtype=torch.int64),
        num_classes=2,
        train_owner=owner,
        test_owner=torch.arange(len(counts)),
    )


def test_val_tail_takes_the_last_rows_after_the_gap() -> None:
    data = _owned([100, 30])
    cfg = {"name": "natural", "val_fraction": 0.1, "val_tail": True, "val_gap": 5}
    first, second = split_dataset(data, cfg, 2, seed=0)
    assert first.val_x.squeeze(1).tolist() == [float(i) for i in range(90, 100)]
    assert first.train_x.squeeze(1).tolist() == [float(i) for i in range(85)]  # 85..89: the gap
    # 30 rows: 3 validation rows after a gap of 5 leave 22 training rows
    assert second.val_x.squeeze(1).tolist() == [127.0, 128.0, 129.0]
    assert second.train_x.squeeze(1).tolist() == [float(i) for i in range(100, 122)]


def test_val_tail_skips_a_client_too_small_for_the_gap() -> None:
    data = _owned([100, 12])
    cfg = {"name": "natural", "val_fraction": 0.1, "val_tail": True, "val_gap": 20}
    _, small = split_dataset(data, cfg, 2, seed=0)
    assert small.val_x.shape[0] == 0 and small.train_x.shape[0] == 12


def test_random_carve_is_unchanged_without_val_tail() -> None:
    data = _owned([100, 30])
    cfg = {"name": "natural", "val_fraction": 0.1}
    first, _ = split_dataset(data, cfg, 2, seed=0)
    rows = first.val_x.squeeze(1).tolist()
    assert len(rows) == 10 and rows != [float(i) for i in range(90, 100)]
