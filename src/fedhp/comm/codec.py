"""The wire encodings of a message and their sizes.

Three encodings exist for one message (a flat vector of P parameters); every message is sent in
whichever is smallest (ties go to the earlier one in this list):

``dense``   tag 0, P little-endian fp32 values                         -> 4·P bytes
``bitmap``  tag 1, ceil(P/8)-byte position mask (LSB first), nnz fp32   -> ceil(P/8) + 4·nnz bytes
``index``   tag 2, nnz little-endian int32 indices, then nnz fp32       -> 8·nnz bytes

``message_cost`` models these sizes without building bytes (vectorized over a batch of messages);
``encode_sparse`` / ``decode_sparse`` build the real bytes (one extra tag byte), and the tests check
that both agree. Entries with ``|x| <= zero_threshold`` count as zero and are sent as zero
(:func:`truncate`; :func:`count_nonzero` counts what is sent).

The sFedHP paper's Remark 1 convention is reported beside the real size: a message without zeros
costs 64·P bits; one with zeros costs 64 bits per non-zero, 1 bit per zero, plus a P-bit mask.

A per-client *unit mask* (which neurons / channels a sparse sub-model keeps; see
``fedhp.models.masks``) travels beside its message as a bitmap over the U units:
``unit_mask_bytes(U) = ceil(U/8)`` bytes (``encode_unit_mask`` / ``decode_unit_mask``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

ENCODINGS: tuple[str, ...] = ("dense", "bitmap", "index")

_F32 = np.dtype("<f4")
_I32 = np.dtype("<i4")


@dataclass(frozen=True)
class MessageCost:
    """Cost of a batch of messages, summed over the messages (python ints).

    ``encodings`` maps each encoding name to how many messages picked it.
    """

    messages: int
    params: int
    nnz: int
    dense_bytes: int
    wire_bytes: int
    remark1_bits: int
    encodings: dict[str, int] = field(default_factory=dict)


def _as_batch(messages: torch.Tensor) -> torch.Tensor:
    if not isinstance(messages, torch.Tensor):
        raise TypeError(f"messages must be a torch.Tensor, got {type(messages).__name__}")
    if messages.dim() == 1:
        return messages.unsqueeze(0)
    if messages.dim() != 2:
        raise ValueError(
            f"messages must be [M, P] (or one [P] vector), got {tuple(messages.shape)}"
        )
    return messages


def _encoding_sizes(p: int, nnz: torch.Tensor) -> torch.Tensor:
    """Payload bytes of each encoding, shape [..., 3] in ENCODINGS order (int64)."""
    dense = torch.full_like(nnz, 4 * p)
    bitmap = (p + 7) // 8 + 4 * nnz
    index = 8 * nnz
    return torch.stack((dense, bitmap, index), dim=-1)


@dataclass(frozen=True)
class PerMessage:
    """Per-message int64 tensors of one batch (length M) plus P."""

    p: int
    nnz: torch.Tensor
    wire: torch.Tensor
    choice: torch.Tensor
    remark1: torch.Tensor

    def total(self) -> MessageCost:
        m = int(self.nnz.shape[0])
        counts = torch.bincount(self.choice, minlength=len(ENCODINGS)).tolist()
        nnz, wire, remark1 = torch.stack((self.nnz, self.wire, self.remark1)).sum(dim=1).tolist()
        return MessageCost(
            messages=m,
            params=m * self.p,
            nnz=int(nnz),
            dense_bytes=4 * self.p * m,
            wire_bytes=int(wire),
            remark1_bits=int(remark1),
            encodings=dict(zip(ENCODINGS, (int(c) for c in counts), strict=True)),
        )


EXACT_FLOAT_COUNT = 1 << 24
"""Rows narrower than this are counted as float32 sums of 0/1 marks (exact up to 2**24)."""


def count_nonzero(
    messages: torch.Tensor, zero_threshold: float = 0.0, scratch: torch.Tensor | None = None
) -> torch.Tensor:
    """Entries with ``|x| > zero_threshold`` (``x != 0`` with a zero threshold of 0; NaN counts
    there) in each message ``[M, P]`` → int64 ``[M]``.

    Float rows narrower than :data:`EXACT_FLOAT_COUNT` are counted as a vectorized float sum of
    0/1 marks written into ``scratch`` (a float tensor of the messages' shape, overwritten; a
    fresh one if not given): 8–20× faster on CPU than PyTorch's per-row ``count_nonzero``."""
    batch = _as_batch(messages).detach()
    exact = batch.dtype in (torch.float32, torch.float64)  # (half sums stop being exact at 2048)
    if exact and batch.shape[1] < EXACT_FLOAT_COUNT:
        marks = torch.empty_like(batch) if scratch is None else scratch.view_as(batch)
        if zero_threshold <= 0:
            torch.ne(batch, 0, out=marks)
        else:
            torch.abs(batch, out=marks).gt_(zero_threshold)
        return marks.sum(-1).to(torch.int64)
    if zero_threshold <= 0:
        return torch.count_nonzero(batch, dim=1)
    return torch.count_nonzero(batch.abs() > zero_threshold, dim=1)


def truncate(x: torch.Tensor, zero_threshold: float) -> torch.Tensor:
    """What the receiver gets: entries with ``|x| <= zero_threshold`` sent as exact zeros.

    With a zero threshold of 0 only exact zeros are zero, so ``x`` is returned unchanged.
    """
    if zero_threshold <= 0:
        return x
    return x.masked_fill(x.abs() <= zero_threshold, 0.0)


def _per_message(messages: torch.Tensor, zero_threshold: float) -> PerMessage:
    p = int(_as_batch(messages).shape[1])
    return per_message_from_nnz(count_nonzero(messages, zero_threshold), p)


def per_message_from_nnz(nnz: torch.Tensor, p: int) -> PerMessage:
    nnz = nnz.to(torch.int64)
    wire, choice = _encoding_sizes(p, nnz).min(dim=-1)  # ties: first minimum (dense<bitmap<index)
    remark1 = torch.where(nnz == p, torch.full_like(nnz, 64 * p), 64 * nnz + (p - nnz) + p)
    return PerMessage(p, nnz, wire, choice, remark1)


def message_cost(messages: torch.Tensor, zero_threshold: float = 0.0) -> MessageCost:
    """Model the cost of ``messages`` ([M, P] floats, or one [P] vector), vectorized.

    Entries with ``|x| <= zero_threshold`` count as zero. See the module docstring for the
    encodings and the Remark 1 convention.
    """
    return _per_message(messages, zero_threshold).total()


def encode_sparse(vec: torch.Tensor, zero_threshold: float = 0.0) -> bytes:
    """Encode one vector in its smallest encoding: a 1-byte tag followed by the payload.

    ``len(encode_sparse(v, eps)) == message_cost(v[None], eps).wire_bytes + 1``.
    """
    if vec.dim() != 1:
        raise ValueError(f"encode_sparse expects one [P] vector, got shape {tuple(vec.shape)}")
    values = vec.detach().to(device="cpu", dtype=torch.float32)
    mask = values.abs() > zero_threshold
    p = int(values.numel())
    nnz = int(mask.sum())
    tag = int(_encoding_sizes(p, torch.tensor(nnz)).argmin())
    if tag == 0:
        payload = torch.where(mask, values, torch.zeros_like(values)).numpy().astype(_F32)
        return bytes([0]) + payload.tobytes()
    kept = values[mask].numpy().astype(_F32).tobytes()
    if tag == 1:
        bits = np.packbits(mask.numpy(), bitorder="little")
        return bytes([1]) + bits.tobytes() + kept
    idx = torch.nonzero(mask, as_tuple=False).flatten().numpy().astype(_I32)
    return bytes([2]) + idx.tobytes() + kept


def decode_sparse(data: bytes, P: int) -> torch.Tensor:
    """Decode bytes from :func:`encode_sparse` into a float32 vector of length ``P``."""
    if not data:
        raise ValueError("cannot decode an empty message")
    tag, body = data[0], memoryview(data)[1:]
    if tag == 0:
        if len(body) != 4 * P:
            raise ValueError(f"dense message has {len(body)} payload bytes, expected {4 * P}")
        return torch.from_numpy(np.frombuffer(body, dtype=_F32).astype(np.float32))
    out = np.zeros(P, dtype=np.float32)
    if tag == 1:
        nbits = (P + 7) // 8
        if len(body) < nbits or (len(body) - nbits) % 4:
            raise ValueError(f"bitmap message of {len(body)} payload bytes is malformed for P={P}")
        mask = np.unpackbits(
            np.frombuffer(body[:nbits], dtype=np.uint8), count=P, bitorder="little"
        )
        vals = np.frombuffer(body[nbits:], dtype=_F32)
        if int(mask.sum()) != vals.size:
            raise ValueError("bitmap message: mask and value count disagree")
        out[mask.astype(bool)] = vals
    elif tag == 2:
        if len(body) % 8:
            raise ValueError(f"index message of {len(body)} payload bytes is malformed")
        n = len(body) // 8
        idx = np.frombuffer(body[: 4 * n], dtype=_I32)
        if n and (idx.min() < 0 or idx.max() >= P):
            raise ValueError(f"index message has indices outside [0, {P})")
        out[idx] = np.frombuffer(body[4 * n :], dtype=_F32)
    else:
        raise ValueError(f"unknown encoding tag {tag}")
    return torch.from_numpy(out)


def unit_mask_bytes(num_units: int) -> int:
    """Wire size of one unit mask: a bitmap over ``num_units`` units, ``ceil(U/8)`` bytes."""
    return (int(num_units) + 7) // 8


def encode_unit_mask(mask: torch.Tensor) -> bytes:
    """One unit mask ``[U]`` (bool or 0/1) as a little-endian bitmap of ``unit_mask_bytes(U)``."""
    if mask.dim() != 1:
        raise ValueError(f"encode_unit_mask expects one [U] mask, got shape {tuple(mask.shape)}")
    bits = mask.detach().to(device="cpu").bool().numpy()
    return np.packbits(bits, bitorder="little").tobytes()


def decode_unit_mask(data: bytes, num_units: int) -> torch.Tensor:
    """Bool ``[U]`` mask from :func:`encode_unit_mask` bytes."""
    if len(data) != unit_mask_bytes(num_units):
        raise ValueError(
            f"unit mask of {len(data)} bytes, expected {unit_mask_bytes(num_units)} for "
            f"{num_units} units"
        )
    bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8), count=num_units, bitorder="little")
    return torch.from_numpy(bits.astype(bool))
