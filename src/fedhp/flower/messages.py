"""Flower message content for fedhp rounds: encoding, decoding and validation.

Every message holds two records: ``fedhp.arrays`` (an :class:`~flwr.app.ArrayRecord` of tensors,
stored by Flower as NumPy ``.npy`` bytes) and ``fedhp.meta`` (a :class:`~flwr.app.ConfigRecord`).

Cloud → node, ``train``: ``clients``/``edges``/``agg`` (global indices of the node's part of the
task), ``stragglers`` (where the algorithm bills its stragglers: clients that receive the
round's messages but do not train), ``b.<name>`` broadcast tensors, ``c.<name>`` per-client
rows, ``gen`` (the engine generator's state, so every node draws the minibatches the in-process
engine draws); meta: ``round``,
``shard``, ``s.<name>`` scalars and, the first time a node is addressed, ``config`` (the resolved
fedhp configuration as YAML, for nodes whose run config lacks ``fedhp-config``).
Node → cloud, ``train``: ``clients``, ``edges`` (the edges whose rows follow), ``c.<k>``,
``e.<k>``, ``losses`` ``[S, clients]``, ``gen`` (state after the round), ``nnz.<key>`` (non-zero
count of every row of node-held state); meta: ``ledger`` (JSON of the node's round ledger).
Cloud → node, ``evaluate``: ``b.global`` where the method has a global model.
Node → cloud, ``evaluate``: ``clients``, ``test.correct``/``test.loss``/``test.count``, the same
for ``train.``, and ``nnz`` (non-zeros of each personalized model).

Cloud → node, ``query``: nothing; node → cloud: ``n.<key>``, the node's rows of every node-held
state entry (for a checkpoint). After a resume, the first message to each node also carries
``r.<key>``: its rows of the checkpoint, which replace whatever state it holds.

Model rows travel in fedhp's wire encoding (:func:`fedhp.comm.encode_sparse`: each row in the
smallest of dense / bitmap / index, lossless) unless ``flower.sparse_wire`` is off: a float32
array of 1 or 2 dimensions whose rows have at least :data:`SPARSE_MIN_WIDTH` values is sent as
``<key>#enc`` (the rows' encodings, concatenated, uint8), ``<key>#len`` (bytes per row) and
``<key>#shape``; :func:`from_record` decodes them back to ``<key>``. Plain arrays are accepted
too, so the encoding is the sender's choice; arrays holding NaN/Inf are always sent plain (the
receiver must see them to reject them).

In a round that is evaluated, for methods whose personalized models are node state alone (sFedHP,
pFedMe, local), the ``train`` message carries meta ``evaluate_after=1`` and the node appends its
``evaluate`` reply's arrays, prefixed ``v.``, to the ``train`` reply: the cloud's aggregation does
not touch node state, so these are the numbers a separate ``evaluate`` message would get, one
message exchange sooner.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from fedhp.comm import DIRECTIONS, LINKS, decode_sparse, encode_sparse

ARRAYS = "fedhp.arrays"
META = "fedhp.meta"
EVALUATE_AFTER = "evaluate_after"
EVAL_PREFIX = "v."
RESTORE_PREFIX = "r."
STATE_PREFIX = "n."
QUERY_KEYS = "keys"  # a query's comma-separated node-held state keys to return (absent: all)
SPARSE_MIN_WIDTH = 64
MAX_DECODED_VALUES = 2**30  # a claimed shape beyond this (4 GiB of fp32) is malformed
ENC, LEN, SHAPE = "#enc", "#len", "#shape"


class MalformedReply(Exception):
    """A node's reply that must not be aggregated (wrong keys, shapes, dtypes, NaN/Inf)."""


def _encodable(tensor: torch.Tensor) -> bool:
    """Model rows, all finite (NaN/Inf travel plain, so the receiver sees and rejects them: the
    encoding treats NaN as zero)."""
    return (
        tensor.dtype == torch.float32
        and tensor.dim() in (1, 2)
        and tensor.shape[-1] >= SPARSE_MIN_WIDTH
        and bool(torch.isfinite(tensor).all())
    )


def _encode_rows(tensor: torch.Tensor) -> dict[str, np.ndarray]:
    """Each row of a [P] or [n, P] float32 tensor in its smallest lossless encoding."""
    rows = [encode_sparse(row) for row in tensor.reshape(-1, tensor.shape[-1])]
    return {
        ENC: np.frombuffer(b"".join(rows), dtype=np.uint8),
        LEN: np.array([len(r) for r in rows], dtype=np.int64),
        SHAPE: np.array(tuple(tensor.shape), dtype=np.int64),
    }


def _decode_rows(key: str, enc: np.ndarray, lengths: np.ndarray, shape: np.ndarray) -> np.ndarray:
    """Inverse of :func:`_encode_rows`; :class:`MalformedReply` on anything inconsistent."""
    if enc.dtype != np.uint8 or enc.ndim != 1 or lengths.dtype != np.int64 or lengths.ndim != 1:
        raise MalformedReply(f"encoded array {key!r} has wrong dtypes")
    if shape.dtype != np.int64 or shape.ndim != 1 or len(shape) not in (1, 2) or shape.min() < 0:
        raise MalformedReply(f"encoded array {key!r} has an invalid shape")
    width, count = int(shape[-1]), int(np.prod(shape[:-1])) if len(shape) == 2 else 1
    if count * width > MAX_DECODED_VALUES:
        raise MalformedReply(f"encoded array {key!r} claims {count}x{width} values")
    if len(lengths) != count or lengths.min(initial=1) < 1 or int(lengths.sum()) != len(enc):
        raise MalformedReply(f"encoded array {key!r}: row lengths do not add up")
    out = np.empty((count, width), dtype=np.float32)
    data, start = enc.tobytes(), 0
    for i, n in enumerate(lengths.tolist()):
        try:
            out[i] = decode_sparse(data[start : start + n], width).numpy()
        except ValueError as err:
            raise MalformedReply(f"encoded array {key!r}, row {i}: {err}") from None
        start += n
    return out.reshape(tuple(int(d) for d in shape))


def to_record(
    arrays: dict[str, torch.Tensor], meta: dict[str, Any], sparse: bool = True
) -> RecordDict:
    """A message content from tensors and meta values (int, float, str, bool); with ``sparse``,
    model rows in fedhp's wire encoding (see the module docstring)."""
    record = ArrayRecord()
    for key, tensor in arrays.items():
        value = tensor.detach().cpu().contiguous()
        if sparse and _encodable(value):
            for suffix, part in _encode_rows(value).items():
                record[key + suffix] = Array.from_numpy_ndarray(part)
        else:
            record[key] = Array.from_numpy_ndarray(value.numpy())
    return RecordDict({ARRAYS: record, META: ConfigRecord(dict(meta))})


@dataclass
class Content:
    """A decoded message content."""

    arrays: dict[str, torch.Tensor] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


def from_record(content: RecordDict) -> Content:
    """Decode :func:`to_record`'s layout; :class:`MalformedReply` if it is not that."""
    try:
        arrays = content.array_records[ARRAYS]
        meta = content.config_records[META]
    except KeyError as err:
        raise MalformedReply(f"missing record {err}") from None
    out = Content(meta=dict(meta))
    raw: dict[str, np.ndarray] = {}
    for key, array in arrays.items():
        try:
            value = np.array(array.numpy(), copy=True)
        except Exception as err:  # noqa: BLE001  (any undecodable array is malformed)
            raise MalformedReply(f"array {key!r} cannot be decoded ({err})") from None
        if value.dtype.kind not in "fiub" or not value.dtype.isnative:
            raise MalformedReply(f"array {key!r} has unsupported dtype {value.dtype}")
        raw[key] = value
    for key in [k[: -len(ENC)] for k in raw if k.endswith(ENC)]:
        parts = [raw.pop(key + suffix, None) for suffix in (ENC, LEN, SHAPE)]
        if any(p is None for p in parts) or key in raw:
            raise MalformedReply(f"encoded array {key!r} is incomplete or also sent plain")
        enc, lengths, shape = (p for p in parts if p is not None)
        raw[key] = _decode_rows(key, enc, lengths, shape)
    if any(k.endswith((LEN, SHAPE)) for k in raw):
        raise MalformedReply("encoded array parts without their data")
    out.arrays = {key: torch.from_numpy(value) for key, value in raw.items()}
    return out


def payload_bytes(content: RecordDict) -> int:
    """Flower's own count of the content's bytes (``count_bytes`` of every record)."""
    total = sum(r.count_bytes() for r in content.array_records.values())
    total += sum(r.count_bytes() for r in content.config_records.values())
    return total + sum(r.count_bytes() for r in content.metric_records.values())


def serialized_bytes(content: RecordDict) -> int:
    """Bytes of the content as Flower serializes it for transport: the deflated object tree
    (each distinct object once, as Flower's object store does)."""
    seen: set[str] = set()
    total = 0
    stack: list[Any] = [content]
    while stack:
        obj = stack.pop()
        oid = obj.object_id
        if oid in seen:
            continue
        seen.add(oid)
        total += len(obj.deflate())
        children = obj.children
        if children:
            stack.extend(children.values())
    return total


def parse_ledger(text: object) -> dict[str, object]:
    """A node's ledger state (validated enough to merge safely)."""
    if not isinstance(text, str):
        raise MalformedReply("meta 'ledger' is not a string")
    try:
        data = json.loads(text)
        ok = isinstance(data, dict) and isinstance(data.get("round"), list)
        ok = ok and isinstance(data.get("node_round"), list)
    except ValueError:
        ok = False
    if not ok:
        raise MalformedReply("meta 'ledger' is not a ledger state")
    for width, items in ((3, data["round"]), (4, data["node_round"])):
        for item in items:
            ok = isinstance(item, list) and len(item) == width
            ok = ok and item[0] in LINKS and item[1] in DIRECTIONS and isinstance(item[-1], dict)
            if ok and width == 4:
                ok = isinstance(item[2], int) and item[2] >= 0
            if not ok or any(not isinstance(v, int) or v < 0 for v in item[-1].values()):
                raise MalformedReply("meta 'ledger' has invalid entries")
    return dict(data)


def expect_keys(arrays: dict[str, torch.Tensor], keys: set[str]) -> None:
    """Exactly ``keys`` must be present."""
    if set(arrays) != keys:
        missing, extra = sorted(keys - set(arrays)), sorted(set(arrays) - keys)
        raise MalformedReply(f"arrays: missing {missing}, unexpected {extra}")


def expect(
    arrays: dict[str, torch.Tensor],
    key: str,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    finite: bool = True,
) -> torch.Tensor:
    """``arrays[key]`` with the given shape and dtype (and only finite values)."""
    value = arrays[key]
    if tuple(value.shape) != shape:
        raise MalformedReply(f"{key!r} has shape {tuple(value.shape)}, expected {shape}")
    if value.dtype != dtype:
        raise MalformedReply(f"{key!r} has dtype {value.dtype}, expected {dtype}")
    if finite and value.is_floating_point() and not bool(torch.isfinite(value).all()):
        raise MalformedReply(f"{key!r} holds NaN or Inf")
    return value


def expect_ids(arrays: dict[str, torch.Tensor], key: str, ids: torch.Tensor) -> None:
    """``arrays[key]`` must equal the expected index list ``ids``."""
    value = expect(arrays, key, (len(ids),), torch.int64)
    if not torch.equal(value, ids.cpu()):
        raise MalformedReply(f"{key!r} does not list the clients/edges the node was sent")
