"""Wire encodings and per-link communication accounting.

Three encodings exist for one message (a flat vector of P parameters); every message is sent in
whichever is smallest (ties go to the earlier one in this list):

``dense``   tag 0, P little-endian fp32 values                         -> 4·P bytes
``bitmap``  tag 1, ceil(P/8)-byte position mask (LSB first), nnz fp32   -> ceil(P/8) + 4·nnz bytes
``index``   tag 2, nnz little-endian int32 indices, then nnz fp32       -> 8·nnz bytes

``message_cost`` models these sizes without building bytes (vectorized over a batch of messages);
``encode_sparse`` / ``decode_sparse`` build the real bytes (one extra tag byte), and the tests check
that both agree. Entries with ``|x| <= zero_threshold`` count as zero and are sent as zero.

The sFedHP paper's Remark 1 convention is reported beside the real size: a message without zeros
costs 64·P bits; one with zeros costs 64 bits per non-zero, 1 bit per zero, plus a P-bit mask.

A per-client *unit mask* (which neurons / channels a sparse sub-model keeps; see
``fedhp.models.masks``) travels beside its message as a bitmap over the U units:
``unit_mask_bytes(U) = ceil(U/8)`` bytes (``encode_unit_mask`` / ``decode_unit_mask``), recorded
with ``CommLedger.record_masks``.

``CommLedger`` accumulates these costs per (link, direction) and, optionally, per node, so the
accumulated traffic of one cloud-facing node (an edge server, or a client in flat FL) can be
reported as the paper does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

LINKS: tuple[str, ...] = ("client_edge", "edge_cloud", "client_cloud", "client_cloud_eval")
"""``client_cloud_eval``: evaluation-only traffic a deployment would send (the global model each
client adapts for Per-FedAvg's personalized evaluation), on a line of its own."""
DIRECTIONS: tuple[str, ...] = ("up", "down")
ENCODINGS: tuple[str, ...] = ("dense", "bitmap", "index")

# Per (link, direction) counters, in the order they appear in reports.
_STATS: tuple[str, ...] = (
    "bytes",
    "dense_bytes",
    "remark1_bits",
    "nnz",
    "params",
    "messages",
    "enc_dense",
    "enc_bitmap",
    "enc_index",
)
# Per-node counters (per direction), a subset of _STATS.
_NODE_STATS: tuple[str, ...] = ("bytes", "dense_bytes", "remark1_bits", "nnz", "messages")

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


def _check_link(link: str, direction: str) -> None:
    if link not in LINKS:
        raise ValueError(f"unknown link {link!r}; expected one of {', '.join(LINKS)}")
    if direction not in DIRECTIONS:
        raise ValueError(f"unknown direction {direction!r}; expected 'up' or 'down'")


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
class _PerMessage:
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


def _per_message(messages: torch.Tensor, zero_threshold: float) -> _PerMessage:
    p = int(_as_batch(messages).shape[1])
    return _per_message_from_nnz(count_nonzero(messages, zero_threshold), p)


def _per_message_from_nnz(nnz: torch.Tensor, p: int) -> _PerMessage:
    nnz = nnz.to(torch.int64)
    wire, choice = _encoding_sizes(p, nnz).min(dim=-1)  # ties: first minimum (dense<bitmap<index)
    remark1 = torch.where(nnz == p, torch.full_like(nnz, 64 * p), 64 * nnz + (p - nnz) + p)
    return _PerMessage(p, nnz, wire, choice, remark1)


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


def _zero_stats(names: tuple[str, ...]) -> dict[str, int]:
    return dict.fromkeys(names, 0)


class _NodeTable:
    """Per-node counters of one (link, direction): ``stats [n, len(_NODE_STATS)]`` (int64, on the
    host) indexed by node id, and ``seen [n]``, the ids billed at least once. Node ids are
    non-negative client or edge indices, so a dense table is at most one row per node (at 10⁵
    clients a round's ``index_add_`` replaces 10⁵ dict updates per stat)."""

    def __init__(self) -> None:
        self.stats = torch.zeros(0, len(_NODE_STATS), dtype=torch.int64)
        self.seen = torch.zeros(0, dtype=torch.bool)

    def _fit(self, size: int) -> None:
        if size > self.seen.shape[0]:
            grow = size - self.seen.shape[0]
            self.stats = torch.cat((self.stats, self.stats.new_zeros(grow, len(_NODE_STATS))))
            self.seen = torch.cat((self.seen, self.seen.new_zeros(grow)))

    def add(self, ids: torch.Tensor, values: torch.Tensor) -> None:
        """Add ``values [M, len(_NODE_STATS)]`` to the rows of ``ids [M]`` (repeats summed)."""
        if ids.numel() == 0:
            return
        self._fit(int(ids.max()) + 1)
        self.stats.index_add_(0, ids, values)
        self.seen[ids] = True

    def add_table(self, other: _NodeTable) -> None:
        self._fit(other.seen.shape[0])
        n = other.seen.shape[0]
        self.stats[:n] += other.stats
        self.seen[:n] |= other.seen

    def column(self, ids: torch.Tensor, stat: str) -> torch.Tensor:
        """``stat`` of each of ``ids`` (0 where never billed), int64."""
        out = torch.zeros(ids.shape[0], dtype=torch.int64)
        inside = ids < self.seen.shape[0]
        out[inside] = self.stats[ids[inside], _NODE_STATS.index(stat)]
        return out

    def rows(self) -> dict[int, dict[str, int]]:
        """``{node: {stat: value}}`` of the billed nodes, in id order."""
        nodes = torch.nonzero(self.seen).flatten()
        values = self.stats[nodes].tolist()
        return {
            node: dict(zip(_NODE_STATS, row, strict=True))
            for node, row in zip(nodes.tolist(), values, strict=True)
        }

    @classmethod
    def of(cls, rows: dict[int, dict[str, int]]) -> _NodeTable:
        """The table of ``{node: {stat: value}}`` (missing stats 0)."""
        table = cls()
        if rows:
            ids = torch.tensor(list(rows), dtype=torch.int64)
            values = [[int(stats.get(s, 0)) for s in _NODE_STATS] for stats in rows.values()]
            table.add(ids, torch.tensor(values, dtype=torch.int64))
        return table


class CommLedger:
    """Accumulates communication cost per (link, direction), per round and in total.

    Counters are keyed ``{stat}_{link}_{direction}`` with stat one of ``bytes`` (real wire size),
    ``dense_bytes``, ``remark1_bits``, ``nnz``, ``params``, ``messages``, ``enc_dense``,
    ``enc_bitmap``, ``enc_index``; plus per-link sums ``bytes_{link}`` / ``remark1_bits_{link}``
    (up + down) and ``bytes_total`` / ``dense_bytes_total`` / ``remark1_bits_total``. Only links
    that have been recorded at least once appear, so flat FL has no edge columns.

    ``totals()`` and ``node_totals()`` cover the rounds closed by ``end_round()``.

    Unit masks recorded with :meth:`record_masks` add their bitmap bytes to ``bytes`` (the wire
    size; not to ``dense_bytes``, ``remark1_bits`` or ``messages``: a mask rides with its model
    message) and appear as ``mask_bytes_{link}_{direction}`` (only once any were recorded).
    """

    def __init__(self) -> None:
        self._round: dict[tuple[str, str], dict[str, int]] = {}
        self._total: dict[tuple[str, str], dict[str, int]] = {}
        # (link, direction) -> per-node stats
        self._node_round: dict[tuple[str, str], _NodeTable] = {}
        self._node_total: dict[tuple[str, str], _NodeTable] = {}
        # (link, direction) -> unit-mask bytes (already included in "bytes")
        self._mask_round: dict[tuple[str, str], int] = {}
        self._mask_total: dict[tuple[str, str], int] = {}
        self.rounds = 0

    def record(
        self,
        link: str,
        direction: str,
        messages: torch.Tensor,
        zero_threshold: float = 0.0,
        nodes: torch.Tensor | None = None,
    ) -> MessageCost:
        """Record a batch of messages ([M, P]) sent over ``link`` in ``direction``.

        ``nodes`` optionally gives, for each message, the int id of the node on the cloud-facing
        (or client) side that sent or received it, for :meth:`node_totals`.
        """
        return self.record_counts(
            link, direction, count_nonzero(messages, zero_threshold), messages.shape[-1], nodes
        )

    def record_counts(
        self,
        link: str,
        direction: str,
        nnz: torch.Tensor,
        num_params: int,
        nodes: torch.Tensor | None = None,
    ) -> MessageCost:
        """Like :meth:`record`, from each message's non-zero count ``nnz [M]`` of ``num_params``.

        For broadcasts: count a model's non-zeros once, then index the counts per receiver.
        """
        _check_link(link, direction)
        per = _per_message_from_nnz(nnz.flatten(), int(num_params))
        cost = per.total()
        acc = self._round.setdefault((link, direction), _zero_stats(_STATS))
        acc["bytes"] += cost.wire_bytes
        acc["dense_bytes"] += cost.dense_bytes
        acc["remark1_bits"] += cost.remark1_bits
        acc["nnz"] += cost.nnz
        acc["params"] += cost.params
        acc["messages"] += cost.messages
        for name, count in cost.encodings.items():
            acc[f"enc_{name}"] += count
        self._total.setdefault((link, direction), _zero_stats(_STATS))
        if nodes is not None:
            self._record_nodes(link, direction, nodes, per)
        return cost

    def record_masks(
        self,
        link: str,
        direction: str,
        num_units: int,
        messages: int,
        nodes: torch.Tensor | None = None,
    ) -> int:
        """Record ``messages`` unit masks over ``num_units`` units sent over ``link`` (each beside
        a model message already recorded with :meth:`record`); ``nodes``: one id per mask, as in
        :meth:`record`. Returns the bytes added."""
        _check_link(link, direction)
        each = unit_mask_bytes(num_units)
        added = each * int(messages)
        key = (link, direction)
        self._round.setdefault(key, _zero_stats(_STATS))["bytes"] += added
        self._total.setdefault(key, _zero_stats(_STATS))
        self._mask_round[key] = self._mask_round.get(key, 0) + added
        self._mask_total.setdefault(key, 0)
        if nodes is not None:
            ids = torch.as_tensor(nodes).detach().flatten().to("cpu", torch.int64)
            if ids.numel() != int(messages):
                raise ValueError(f"nodes has {ids.numel()} entries but there are {messages} masks")
            values = torch.zeros(ids.numel(), len(_NODE_STATS), dtype=torch.int64)
            values[:, _NODE_STATS.index("bytes")] = each
            self._node_round.setdefault(key, _NodeTable()).add(ids, values)
        return added

    def _with_masks(self, out: dict[str, float], masks: dict[tuple[str, str], int]) -> None:
        for (lk, d), value in masks.items():
            out[f"mask_bytes_{lk}_{d}"] = float(value)

    def _record_nodes(
        self,
        link: str,
        direction: str,
        nodes: torch.Tensor,
        per: _PerMessage,
    ) -> None:
        nnz = per.nnz
        ids = torch.as_tensor(nodes).detach().to(device=nnz.device).flatten()
        if ids.numel() != nnz.numel():
            raise ValueError(
                f"nodes has {ids.numel()} entries but there are {nnz.numel()} messages"
            )
        if ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise ValueError("nodes must be integer node ids")
        if ids.numel() == 0:
            return
        if int(ids.min()) < 0:
            raise ValueError("nodes must be non-negative node ids")
        columns = {
            "bytes": per.wire,
            "dense_bytes": torch.full_like(nnz, 4 * per.p),
            "remark1_bits": per.remark1,
            "nnz": nnz,
            "messages": torch.ones_like(nnz),
        }
        values = torch.stack([columns[k].to(torch.int64) for k in _NODE_STATS], dim=1)
        table = self._node_round.setdefault((link, direction), _NodeTable())
        table.add(ids.to("cpu", torch.int64), values.cpu())

    @staticmethod
    def _flatten(table: dict[tuple[str, str], dict[str, int]]) -> dict[str, float]:
        out: dict[str, float] = {}
        links_seen = [lk for lk in LINKS if any((lk, d) in table for d in DIRECTIONS)]
        for lk in links_seen:
            for d in DIRECTIONS:
                stats = table.get((lk, d), _zero_stats(_STATS))
                for s in _STATS:
                    out[f"{s}_{lk}_{d}"] = float(stats[s])
        for lk in links_seen:
            for s in ("bytes", "remark1_bits"):
                out[f"{s}_{lk}"] = out[f"{s}_{lk}_up"] + out[f"{s}_{lk}_down"]
        for s in ("bytes", "dense_bytes", "remark1_bits"):
            out[f"{s}_total"] = float(sum(v[s] for v in table.values()))
        return out

    def current(self) -> dict[str, float]:
        """Counters of the round in progress (not yet closed by :meth:`end_round`)."""
        out = self._flatten({k: self._round.get(k, _zero_stats(_STATS)) for k in self._total})
        self._with_masks(out, {k: self._mask_round.get(k, 0) for k in self._mask_total})
        return out

    def round_node_bytes(self, link: str, direction: str, nodes: torch.Tensor) -> torch.Tensor:
        """Wire bytes (float64 ``[len(nodes)]``, unit masks included) billed so far in the open
        round to each of ``nodes`` (ids as given to :meth:`record`) on ``link`` in
        ``direction``; 0 for a node with no message."""
        _check_link(link, direction)
        table = self._node_round.get((link, direction), _NodeTable())
        ids = torch.as_tensor(nodes).detach().flatten().to("cpu", torch.int64)
        return table.column(ids, "bytes").to(torch.float64)

    def end_round(self) -> dict[str, float]:
        """Close the round: return its counters and add them to the accumulated totals."""
        out = self.current()
        for key, stats in self._round.items():
            tot = self._total[key]
            for s, v in stats.items():
                tot[s] += v
        for key, table in self._node_round.items():
            self._node_total.setdefault(key, _NodeTable()).add_table(table)
        for key, value in self._mask_round.items():
            self._mask_total[key] = self._mask_total.get(key, 0) + value
        self._round = {}
        self._node_round = {}
        self._mask_round = {}
        self.rounds += 1
        return out

    def totals(self) -> dict[str, float]:
        """Counters accumulated over all closed rounds (same keys as :meth:`end_round`)."""
        out = self._flatten(self._total)
        self._with_masks(out, self._mask_total)
        return out

    def node_totals(self, link: str) -> dict[int, dict[str, float]]:
        """Accumulated cost per node on ``link`` over closed rounds.

        Each node maps to ``{stat}_up``, ``{stat}_down`` and ``{stat}`` (up + down) for stat in
        ``bytes``, ``dense_bytes``, ``remark1_bits``, ``nnz``, ``messages``.
        """
        _check_link(link, "up")
        tables = {d: self._node_total.get((link, d), _NodeTable()).rows() for d in DIRECTIONS}
        nodes: set[int] = set()
        for rows in tables.values():
            nodes.update(rows)
        out: dict[int, dict[str, float]] = {}
        for node in sorted(nodes):
            row: dict[str, float] = {}
            for d in DIRECTIONS:
                stats = tables[d].get(node, _zero_stats(_NODE_STATS))
                for s in _NODE_STATS:
                    row[f"{s}_{d}"] = float(stats[s])
            for s in _NODE_STATS:
                row[s] = row[f"{s}_up"] + row[f"{s}_down"]
            out[node] = row
        return out

    def state_dict(self) -> dict[str, object]:
        """Plain, JSON-safe snapshot (strings, lists and ints) for checkpoints."""

        def pairs(table: dict[tuple[str, str], dict[str, int]]) -> list[list[object]]:
            return [[lk, d, dict(stats)] for (lk, d), stats in table.items()]

        def node_pairs(table: dict[tuple[str, str], _NodeTable]) -> list[list[object]]:
            return [
                [lk, d, node, stats]
                for (lk, d), nodes in table.items()
                for node, stats in nodes.rows().items()
            ]

        out: dict[str, object] = {
            "rounds": self.rounds,
            "round": pairs(self._round),
            "total": pairs(self._total),
            "node_round": node_pairs(self._node_round),
            "node_total": node_pairs(self._node_total),
        }
        if self._mask_total or self._mask_round:  # absent without masks (unchanged snapshots)
            out["mask_round"] = [[lk, d, v] for (lk, d), v in self._mask_round.items()]
            out["mask_total"] = [[lk, d, v] for (lk, d), v in self._mask_total.items()]
        return out

    def load_state_dict(self, state: dict[str, object]) -> None:
        """Restore from :meth:`state_dict` output (e.g. after a JSON round trip)."""

        def pairs(items: object, names: tuple[str, ...]) -> dict[tuple[str, str], dict[str, int]]:
            out: dict[tuple[str, str], dict[str, int]] = {}
            for lk, d, stats in items:  # type: ignore[attr-defined]
                _check_link(lk, d)
                out[(lk, d)] = {s: int(stats.get(s, 0)) for s in names}
            return out

        def node_pairs(items: object) -> dict[tuple[str, str], _NodeTable]:
            return {key: _NodeTable.of(rows) for key, rows in _node_rows(items).items()}

        self.rounds = int(state["rounds"])  # type: ignore[call-overload]
        self._round = pairs(state["round"], _STATS)
        self._total = pairs(state["total"], _STATS)
        for key in self._round:
            self._total.setdefault(key, _zero_stats(_STATS))
        self._node_round = node_pairs(state["node_round"])
        self._node_total = node_pairs(state["node_total"])
        self._mask_round = _mask_pairs(state.get("mask_round", []))
        self._mask_total = _mask_pairs(state.get("mask_total", []))
        for key in self._mask_round:
            self._mask_total.setdefault(key, 0)

    def merge_round(self, other: dict[str, object]) -> None:
        """Add the open round of another ledger (its :meth:`state_dict`) to this open round.

        A Flower node records its client↔edge traffic in a ledger of its own and sends the
        state back with its reply; the cloud merges it here."""
        for lk, d, stats in other["round"]:  # type: ignore[attr-defined]
            _check_link(lk, d)
            acc = self._round.setdefault((lk, d), _zero_stats(_STATS))
            for s in _STATS:
                acc[s] += int(stats.get(s, 0))
            self._total.setdefault((lk, d), _zero_stats(_STATS))
        for key, rows in _node_rows(other["node_round"]).items():
            self._node_round.setdefault(key, _NodeTable()).add_table(_NodeTable.of(rows))
        for (lk, d), value in _mask_pairs(other.get("mask_round", [])).items():
            self._mask_round[(lk, d)] = self._mask_round.get((lk, d), 0) + value
            self._mask_total.setdefault((lk, d), 0)


def _node_rows(items: object) -> dict[tuple[str, str], dict[int, dict[str, int]]]:
    """``[[link, direction, node, stats], ...]`` (a snapshot's per-node rows) by (link,
    direction), a node's repeated rows summed."""
    out: dict[tuple[str, str], dict[int, dict[str, int]]] = {}
    for lk, d, node, stats in items:  # type: ignore[attr-defined]
        _check_link(lk, d)
        acc = out.setdefault((lk, d), {}).setdefault(int(node), _zero_stats(_NODE_STATS))
        for s in _NODE_STATS:
            acc[s] += int(stats.get(s, 0))
    return out


def _mask_pairs(items: object) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for lk, d, value in items:  # type: ignore[attr-defined]
        _check_link(lk, d)
        out[(lk, d)] = int(value)
    return out
