"""Per-node communication counters of one (link, direction), as a dense table."""

from __future__ import annotations

import torch

NODE_STATS: tuple[str, ...] = ("bytes", "dense_bytes", "remark1_bits", "nnz", "messages")
"""Per-node counters (per direction), a subset of the ledger's per-link counters."""


class NodeTable:
    """Per-node counters of one (link, direction): ``stats [n, len(NODE_STATS)]`` (int64, on the
    host) indexed by node id, and ``seen [n]``, the ids billed at least once. Node ids are
    non-negative client or edge indices, so a dense table is at most one row per node (at 10⁵
    clients a round's ``index_add_`` replaces 10⁵ dict updates per stat)."""

    def __init__(self) -> None:
        self.stats = torch.zeros(0, len(NODE_STATS), dtype=torch.int64)
        self.seen = torch.zeros(0, dtype=torch.bool)

    def _fit(self, size: int) -> None:
        if size > self.seen.shape[0]:
            grow = size - self.seen.shape[0]
            self.stats = torch.cat((self.stats, self.stats.new_zeros(grow, len(NODE_STATS))))
            self.seen = torch.cat((self.seen, self.seen.new_zeros(grow)))

    def add(self, ids: torch.Tensor, values: torch.Tensor) -> None:
        """Add ``values [M, len(NODE_STATS)]`` to the rows of ``ids [M]`` (repeats summed)."""
        if ids.numel() == 0:
            return
        self._fit(int(ids.max()) + 1)
        self.stats.index_add_(0, ids, values)
        self.seen[ids] = True

    def add_table(self, other: NodeTable) -> None:
        self._fit(other.seen.shape[0])
        n = other.seen.shape[0]
        self.stats[:n] += other.stats
        self.seen[:n] |= other.seen

    def column(self, ids: torch.Tensor, stat: str) -> torch.Tensor:
        """``stat`` of each of ``ids`` (0 where never billed), int64."""
        out = torch.zeros(ids.shape[0], dtype=torch.int64)
        inside = ids < self.seen.shape[0]
        out[inside] = self.stats[ids[inside], NODE_STATS.index(stat)]
        return out

    def rows(self) -> dict[int, dict[str, int]]:
        """``{node: {stat: value}}`` of the billed nodes, in id order."""
        nodes = torch.nonzero(self.seen).flatten()
        values = self.stats[nodes].tolist()
        return {
            node: dict(zip(NODE_STATS, row, strict=True))
            for node, row in zip(nodes.tolist(), values, strict=True)
        }

    @classmethod
    def of(cls, rows: dict[int, dict[str, int]]) -> NodeTable:
        """The table of ``{node: {stat: value}}`` (missing stats 0)."""
        table = cls()
        if rows:
            ids = torch.tensor(list(rows), dtype=torch.int64)
            values = [[int(stats.get(s, 0)) for s in NODE_STATS] for stats in rows.values()]
            table.add(ids, torch.tensor(values, dtype=torch.int64))
        return table
