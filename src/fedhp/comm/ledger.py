"""Per-link communication accounting: :class:`CommLedger` bills every message of a round.

``CommLedger`` accumulates the costs of :mod:`fedhp.comm.codec` per (link, direction) and,
optionally, per node, so the accumulated traffic of one cloud-facing node (an edge server, or a
client in flat FL) can be reported as the paper does. Unit masks are recorded with
``CommLedger.record_masks``.
"""

from __future__ import annotations

import torch

from fedhp.comm.codec import (
    MessageCost,
    PerMessage,
    count_nonzero,
    per_message_from_nnz,
    unit_mask_bytes,
)
from fedhp.comm.node_table import NODE_STATS, NodeTable

LINKS: tuple[str, ...] = ("client_edge", "edge_cloud", "client_cloud", "client_cloud_eval")
"""``client_cloud_eval``: evaluation-only traffic a deployment would send (the global model each
client adapts for Per-FedAvg's personalized evaluation), on a line of its own."""
DIRECTIONS: tuple[str, ...] = ("up", "down")

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


def _check_link(link: str, direction: str) -> None:
    if link not in LINKS:
        raise ValueError(f"unknown link {link!r}; expected one of {', '.join(LINKS)}")
    if direction not in DIRECTIONS:
        raise ValueError(f"unknown direction {direction!r}; expected 'up' or 'down'")


def _zero_stats(names: tuple[str, ...]) -> dict[str, int]:
    return dict.fromkeys(names, 0)


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
        self._node_round: dict[tuple[str, str], NodeTable] = {}
        self._node_total: dict[tuple[str, str], NodeTable] = {}
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
        per = per_message_from_nnz(nnz.flatten(), int(num_params))
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
            values = torch.zeros(ids.numel(), len(NODE_STATS), dtype=torch.int64)
            values[:, NODE_STATS.index("bytes")] = each
            self._node_round.setdefault(key, NodeTable()).add(ids, values)
        return added

    def _with_masks(self, out: dict[str, float], masks: dict[tuple[str, str], int]) -> None:
        for (lk, d), value in masks.items():
            out[f"mask_bytes_{lk}_{d}"] = float(value)

    def _record_nodes(
        self,
        link: str,
        direction: str,
        nodes: torch.Tensor,
        per: PerMessage,
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
        values = torch.stack([columns[k].to(torch.int64) for k in NODE_STATS], dim=1)
        table = self._node_round.setdefault((link, direction), NodeTable())
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
        table = self._node_round.get((link, direction), NodeTable())
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
            self._node_total.setdefault(key, NodeTable()).add_table(table)
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
        tables = {d: self._node_total.get((link, d), NodeTable()).rows() for d in DIRECTIONS}
        nodes: set[int] = set()
        for rows in tables.values():
            nodes.update(rows)
        out: dict[int, dict[str, float]] = {}
        for node in sorted(nodes):
            row: dict[str, float] = {}
            for d in DIRECTIONS:
                stats = tables[d].get(node, _zero_stats(NODE_STATS))
                for s in NODE_STATS:
                    row[f"{s}_{d}"] = float(stats[s])
            for s in NODE_STATS:
                row[s] = row[f"{s}_up"] + row[f"{s}_down"]
            out[node] = row
        return out

    def state_dict(self) -> dict[str, object]:
        """Plain, JSON-safe snapshot (strings, lists and ints) for checkpoints."""

        def pairs(table: dict[tuple[str, str], dict[str, int]]) -> list[list[object]]:
            return [[lk, d, dict(stats)] for (lk, d), stats in table.items()]

        def node_pairs(table: dict[tuple[str, str], NodeTable]) -> list[list[object]]:
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

        def node_pairs(items: object) -> dict[tuple[str, str], NodeTable]:
            return {key: NodeTable.of(rows) for key, rows in _node_rows(items).items()}

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
            self._node_round.setdefault(key, NodeTable()).add_table(NodeTable.of(rows))
        for (lk, d), value in _mask_pairs(other.get("mask_round", [])).items():
            self._mask_round[(lk, d)] = self._mask_round.get((lk, d), 0) + value
            self._mask_total.setdefault((lk, d), 0)


def _node_rows(items: object) -> dict[tuple[str, str], dict[int, dict[str, int]]]:
    """``[[link, direction, node, stats], ...]`` (a snapshot's per-node rows) by (link,
    direction), a node's repeated rows summed."""
    out: dict[tuple[str, str], dict[int, dict[str, int]]] = {}
    for lk, d, node, stats in items:  # type: ignore[attr-defined]
        _check_link(lk, d)
        acc = out.setdefault((lk, d), {}).setdefault(int(node), _zero_stats(NODE_STATS))
        for s in NODE_STATS:
            acc[s] += int(stats.get(s, 0))
    return out


def _mask_pairs(items: object) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for lk, d, value in items:  # type: ignore[attr-defined]
        _check_link(lk, d)
        out[(lk, d)] = int(value)
    return out
