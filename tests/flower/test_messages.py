"""Flower message content: model rows travel in fedhp's lossless wire encoding (dense / bitmap /
index per row, the smallest), are decoded exactly, cost what fedhp's ledger bills (plus a tag
byte per row and a few hundred bytes of framing per array), and broken encodings are malformed
replies."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Array

from fedhp.comm import message_cost
from fedhp.flower.messages import (
    ARRAYS,
    ENC,
    LEN,
    SHAPE,
    MalformedReply,
    from_record,
    payload_bytes,
    to_record,
)

P = 7850


def _sparse_rows(n: int, density: float, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(n, P, generator=g)
    return values * (torch.rand(n, P, generator=g) < density)


def test_round_trip_is_exact_and_small_arrays_stay_plain() -> None:
    arrays = {
        "c.model": _sparse_rows(5, 0.2),
        "b.global": torch.randn(P),  # dense: sent dense
        "e.model": _sparse_rows(0, 0.2),  # no rows
        "losses": torch.rand(3, 5),  # narrow rows: plain
        "clients": torch.arange(5),
    }
    record = to_record(arrays, {"round": 1})
    keys = set(record.array_records[ARRAYS])
    assert {"c.model" + ENC, "b.global" + ENC, "losses", "clients"} <= keys
    assert "c.model" not in keys
    back = from_record(record).arrays
    assert set(back) == set(arrays)
    for key, value in arrays.items():
        assert back[key].dtype == value.dtype and torch.equal(back[key], value), key


def test_encoded_size_is_what_the_ledger_bills() -> None:
    rows = _sparse_rows(4, 0.2)
    sparse = payload_bytes(to_record({"e.model": rows}, {}))
    dense = payload_bytes(to_record({"e.model": rows}, {}, sparse=False))
    ledger = message_cost(rows).wire_bytes
    assert ledger < 0.3 * 4 * rows.numel()  # bitmap: P/8 + 4 nnz per row
    # Over the ledger: a tag byte per row, the length and shape arrays, and Flower's .npy header
    # (~128 B) for each of the three arrays.
    assert ledger <= sparse <= ledger + 600
    assert dense >= 4 * rows.numel()


def test_nan_rows_travel_plain_so_the_receiver_sees_them() -> None:
    rows = _sparse_rows(2, 0.2)
    rows[1, 3] = float("nan")
    record = to_record({"e.model": rows}, {})
    assert "e.model" in record.array_records[ARRAYS]
    assert torch.isnan(from_record(record).arrays["e.model"][1, 3])


def _broken(kind: str) -> dict[str, np.ndarray]:
    parts = {
        k: v.numpy()
        for k, v in to_record({"m": _sparse_rows(2, 0.2)}, {}).array_records[ARRAYS].items()
    }
    if kind == "truncated":
        parts["m" + ENC] = parts["m" + ENC][:-3]
    elif kind == "lengths":
        parts["m" + LEN] = parts["m" + LEN][::-1] + np.array([5, -5])
    elif kind == "shape":
        parts["m" + SHAPE] = np.array([3, P], dtype=np.int64)
    elif kind == "huge":
        parts["m" + SHAPE] = np.array([2, 2**40], dtype=np.int64)
    elif kind == "missing_len":
        del parts["m" + LEN]
    elif kind == "also_plain":
        parts["m"] = np.zeros((2, P), dtype=np.float32)
    elif kind == "tag":
        enc = parts["m" + ENC].copy()
        enc[0] = 9
        parts["m" + ENC] = enc
    elif kind == "orphan":
        parts = {"m" + SHAPE: parts["m" + SHAPE]}
    return parts


@pytest.mark.parametrize(
    "kind", ["truncated", "lengths", "shape", "huge", "missing_len", "also_plain", "tag", "orphan"]
)
def test_broken_encoding_is_malformed(kind: str) -> None:
    record = to_record({}, {})
    for key, value in _broken(kind).items():
        record.array_records[ARRAYS][key] = Array.from_numpy_ndarray(value)
    with pytest.raises(MalformedReply):
        from_record(record)
