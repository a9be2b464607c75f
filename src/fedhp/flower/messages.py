"""Flower message content for fedhp rounds: encoding, decoding and validation.

Every message holds two records: ``fedhp.arrays`` (an :class:`~flwr.app.ArrayRecord` of tensors,
stored by Flower as NumPy ``.npy`` bytes) and ``fedhp.meta`` (a :class:`~flwr.app.ConfigRecord`).

Cloud → node, ``train``: ``clients``/``edges``/``agg`` (global indices of the node's part of the
task), ``b.<name>`` broadcast tensors, ``c.<name>`` per-client rows, ``gen`` (the engine generator's
state, so every node draws the minibatches the in-process engine draws); meta: ``round``,
``shard``, ``s.<name>`` scalars and, the first time a node is addressed, ``config`` (the resolved
fedhp configuration as YAML, for nodes whose run config lacks ``fedhp-config``).
Node → cloud, ``train``: ``clients``, ``edges`` (the edges whose rows follow), ``c.<k>``,
``e.<k>``, ``losses`` ``[S, clients]``, ``gen`` (state after the round), ``nnz.<key>`` (non-zero
count of every row of node-held state); meta: ``ledger`` (JSON of the node's round ledger).
Cloud → node, ``evaluate``: ``b.global`` where the method has a global model.
Node → cloud, ``evaluate``: ``clients``, ``test.correct``/``test.loss``/``test.count``, the same
for ``train.``, and ``nnz`` (non-zeros of each personalized model).

In a round that is evaluated, for methods whose personalized models are node state alone (sFedHP,
pFedMe, local), the ``train`` message carries meta ``evaluate_after=1`` and the node appends its
``evaluate`` reply's arrays, prefixed ``v.``, to the ``train`` reply: the cloud's aggregation does
not touch node state, so these are the numbers a separate ``evaluate`` message would get, one
message exchange sooner.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from fedhp.comm import DIRECTIONS, LINKS

ARRAYS = "fedhp.arrays"
META = "fedhp.meta"
EVALUATE_AFTER = "evaluate_after"
EVAL_PREFIX = "v."


class MalformedReply(Exception):
    """A node's reply that must not be aggregated (wrong keys, shapes, dtypes, NaN/Inf)."""


def to_record(arrays: dict[str, torch.Tensor], meta: dict[str, Any]) -> RecordDict:
    """A message content from tensors and meta values (int, float, str, bool)."""
    record = ArrayRecord()
    for key, tensor in arrays.items():
        record[key] = Array.from_numpy_ndarray(tensor.detach().cpu().contiguous().numpy())
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
    for key, array in arrays.items():
        try:
            value = np.array(array.numpy(), copy=True)
        except Exception as err:  # noqa: BLE001  (any undecodable array is malformed)
            raise MalformedReply(f"array {key!r} cannot be decoded ({err})") from None
        if value.dtype.kind not in "fiub" or not value.dtype.isnative:
            raise MalformedReply(f"array {key!r} has unsupported dtype {value.dtype}")
        out.arrays[key] = torch.from_numpy(value)
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


def generator_state(gen: torch.Generator) -> torch.Tensor:
    return gen.get_state()


def ledger_json(state: dict[str, object]) -> str:
    return json.dumps(state)


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


def finite_float(meta: dict[str, Any], key: str) -> float:
    value = meta.get(key)
    if not isinstance(value, int | float) or not math.isfinite(value):
        raise MalformedReply(f"meta {key!r} missing or not finite")
    return float(value)
