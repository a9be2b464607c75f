"""Tests for fedhp.comm.codec: byte model vs real encoding, Remark 1 bits, non-zero counting."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fedhp.comm.codec as comm
from fedhp.comm import count_nonzero, decode_sparse, encode_sparse, message_cost

finite = st.floats(-1e6, 1e6, allow_nan=False, width=32)


@st.composite
def sparse_vectors(draw: st.DrawFn) -> torch.Tensor:
    p = draw(st.integers(1, 70))
    values = draw(st.lists(finite, min_size=p, max_size=p))
    density = draw(st.sampled_from([0.0, 0.05, 0.2, 0.5, 1.0]))
    keep = draw(st.lists(st.floats(0, 1), min_size=p, max_size=p))
    vec = torch.tensor(values, dtype=torch.float32)
    return torch.where(torch.tensor(keep) < density, vec, torch.zeros_like(vec))


@settings(max_examples=150, deadline=None)
@given(vec=sparse_vectors(), threshold=st.sampled_from([0.0, 1e-3, 1.0, 100.0]))
def test_roundtrip_and_byte_model_agree(vec: torch.Tensor, threshold: float) -> None:
    data = encode_sparse(vec, threshold)
    cost = message_cost(vec[None], threshold)
    assert len(data) == cost.wire_bytes + 1
    expected = torch.where(vec.abs() > threshold, vec, torch.zeros_like(vec))
    decoded = decode_sparse(data, vec.numel())
    assert decoded.dtype == torch.float32
    assert torch.equal(decoded, expected)
    assert cost.nnz == int(torch.count_nonzero(expected))
    tag = data[0]
    assert cost.encodings[("dense", "bitmap", "index")[tag]] == 1


@settings(max_examples=60, deadline=None)
@given(vecs=st.lists(sparse_vectors(), min_size=1, max_size=6), threshold=st.just(0.5))
def test_batch_cost_is_sum_of_single_costs(vecs: list[torch.Tensor], threshold: float) -> None:
    p = vecs[0].numel()
    batch = torch.stack([torch.nn.functional.pad(v[:p], (0, p - v[:p].numel())) for v in vecs])
    total = message_cost(batch, threshold)
    singles = [message_cost(row[None], threshold) for row in batch]
    assert total.wire_bytes == sum(c.wire_bytes for c in singles)
    assert total.remark1_bits == sum(c.remark1_bits for c in singles)
    assert total.wire_bytes == sum(len(encode_sparse(row, threshold)) - 1 for row in batch)
    assert total.messages == len(vecs)
    assert total.params == len(vecs) * p
    assert total.dense_bytes == 4 * p * len(vecs)
    assert sum(total.encodings.values()) == len(vecs)


def test_hand_examples() -> None:
    p = 10
    one_nz = torch.zeros(p)
    one_nz[3] = 2.5
    dense = torch.arange(1.0, p + 1)
    half = torch.tensor([1.0, 0, 2, 0, 3, 0, 4, 0, 5, 0])
    # one non-zero: dense 40, bitmap 2 + 4 = 6, index 8 -> bitmap 6 bytes; 64 + 9 + 10 = 83 bits
    c = message_cost(one_nz[None])
    assert (c.wire_bytes, c.remark1_bits, c.nnz) == (6, 83, 1)
    assert c.encodings == {"dense": 0, "bitmap": 1, "index": 0}
    # no zeros: dense 40 bytes, 64 * 10 = 640 bits
    c = message_cost(dense[None])
    assert (c.wire_bytes, c.remark1_bits, c.encodings["dense"]) == (40, 640, 1)
    # five non-zeros: bitmap 2 + 20 = 22 < index 40 < dense 40; 320 + 5 + 10 = 335 bits
    c = message_cost(half[None])
    assert (c.wire_bytes, c.remark1_bits) == (22, 335)
    # all zeros: index 0 bytes; 0 + 10 + 10 = 20 bits
    c = message_cost(torch.zeros(1, p))
    assert (c.wire_bytes, c.remark1_bits, c.encodings["index"]) == (0, 20, 1)
    assert len(encode_sparse(torch.zeros(p))) == 1
    # batch of all four
    c = message_cost(torch.stack([one_nz, dense, half, torch.zeros(p)]))
    assert (c.wire_bytes, c.remark1_bits, c.nnz, c.params) == (68, 1078, 16, 40)
    assert c.dense_bytes == 160


def test_index_encoding_wins_when_very_sparse() -> None:
    p = 1000  # bitmap 125 + 4 = 129 bytes, index 8 bytes
    v = torch.zeros(p)
    v[999] = -7.0
    data = encode_sparse(v)
    assert data[0] == 2 and len(data) == 9
    assert torch.equal(decode_sparse(data, p), v)


def test_threshold_counts_small_entries_as_zero() -> None:
    v = torch.tensor([[1e-5, -1e-5, 0.5, 1e-3]])
    assert message_cost(v, zero_threshold=1e-3).nnz == 1
    assert message_cost(v, zero_threshold=0.0).nnz == 4


def test_decode_rejects_garbage() -> None:
    with pytest.raises(ValueError):
        decode_sparse(b"", 3)
    with pytest.raises(ValueError):
        decode_sparse(bytes([9]), 3)
    with pytest.raises(ValueError):
        decode_sparse(bytes([0, 1, 2]), 3)


def test_large_message_counts_stay_exact() -> None:
    # 79,510-parameter DNN, 20 clients: all dense -> 64 * P bits per message
    p = 79_510
    c = message_cost(torch.ones(20, p))
    assert c.remark1_bits == 20 * 64 * p
    assert c.wire_bytes == 20 * 4 * p
    assert math.isclose(c.wire_bytes / 1e6, 6.3608)


def test_unit_mask_bitmap_round_trips_and_has_the_modelled_size() -> None:
    from fedhp.comm import decode_unit_mask, encode_unit_mask, unit_mask_bytes

    for units in (1, 8, 9, 608):
        mask = torch.rand(units, generator=torch.Generator().manual_seed(units)) < 0.5
        data = encode_unit_mask(mask)
        assert len(data) == unit_mask_bytes(units) == -(-units // 8)
        assert torch.equal(decode_unit_mask(data, units), mask)
    with pytest.raises(ValueError, match="expected 2 for 9 units"):
        decode_unit_mask(b"\x00", 9)


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("rows", [1, 7, 300])
@pytest.mark.parametrize("eps", [0.0, 0.3])
def test_count_nonzero_float_sum_and_reduction_agree(
    rows: int, eps: float, wide: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Float sums of 0/1 marks, or (rows too wide for them) PyTorch's per-row count: the same
    counts as counting by hand."""
    if wide:
        monkeypatch.setattr(comm, "EXACT_FLOAT_COUNT", 50)
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 50, generator=g)
    x[x.abs() < 0.5] = 0.0
    x[0, 0] = float("nan")  # non-zero for a count of exact zeros, not above a threshold
    kept = (lambda v: abs(v) > eps) if eps > 0 else (lambda v: v != 0)
    expected = torch.tensor([sum(1 for v in r if kept(v)) for r in x.tolist()])
    assert torch.equal(count_nonzero(x, eps), expected)


def test_count_nonzero_half_precision_rows_wider_than_2048() -> None:
    """Half-precision sums of 0/1 stop being exact at 2048: such rows are counted exactly."""
    x = torch.ones(2, 5000, dtype=torch.float16)
    x[0, :10] = 0
    assert count_nonzero(x).tolist() == [4990, 5000]
