"""A hierarchical round's edge level as rows: which edge each client's row belongs to, for one
run or a batch of runs (the run level of the tree: run s's clients a block of the round's client
rows, its sampled edges a block of the edge rows), and each run's client–edge messages billed to
its own ledger."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from fedhp.comm.ledger import CommLedger
from fedhp.engine.context import RunContext
from fedhp.engine.run_rows import RunBlocks, cat_runs


class EdgeRound(Protocol):
    """What a hierarchical round's plan names: its clients, sampled edges and stragglers."""

    clients: Tensor
    edges: Tensor | None
    stragglers: Tensor | None


def edge_members(seg: Tensor, num_edges: int) -> list[slice | Tensor]:
    """The rows of each edge's clients in a round (``seg [n]``: each client's edge position):
    a slice where they are contiguous (a view, no copy), else their indices; one host read."""
    rows: list[list[int]] = [[] for _ in range(num_edges)]
    for row, e in enumerate(seg.tolist()):
        rows[e].append(row)
    out: list[slice | Tensor] = []
    for mine in rows:
        if not mine or mine[-1] - mine[0] == len(mine) - 1:
            out.append(slice(mine[0], mine[-1] + 1) if mine else slice(0, 0))
        else:
            out.append(torch.tensor(mine, dtype=torch.long, device=seg.device))
    return out


@dataclass(frozen=True)
class EdgeBatch:
    """The clients and sampled edges of the ``rounds`` of a batch's runs (``(ctx, plan)`` each;
    a run alone: one) as rows: run s's clients are rows ``clients.of_run(s)`` of the round's
    client rows, its edges rows ``edges.of_run(s)`` of the edge rows, ``edge_of [ΣC]`` each
    client's edge row; and each run's receivers of its edges' models (its clients, then its
    stragglers, who never reply): their edge positions among its edges and their global ids."""

    clients: RunBlocks
    edges: RunBlocks
    edge_of: Tensor
    receivers: list[tuple[Tensor, Tensor]]

    @classmethod
    def of(cls, rounds: Sequence[tuple[RunContext, EdgeRound]]) -> EdgeBatch:
        receivers, rows, edge_counts = [], [], list[int]()
        for ctx, plan in rounds:
            edges = plan.edges
            assert edges is not None
            late = plan.stragglers if plan.stragglers is not None else plan.clients[:0]
            seg = ctx.edge_positions(plan.clients, edges)
            ids = ctx.global_clients(plan.clients)
            recv = torch.cat((seg, ctx.edge_positions(late, edges)))
            receivers.append((recv, torch.cat((ids, ctx.global_clients(late)))))
            e0 = sum(edge_counts)
            rows.append(seg if e0 == 0 else seg + e0)
            edge_counts.append(len(edges))
        clients = RunBlocks.of([len(plan.clients) for _, plan in rounds])
        return cls(clients, RunBlocks.of(edge_counts), cat_runs(rows), receivers)

    def ids(self, s: int) -> Tensor:
        """Run ``s``'s clients' global ids."""
        rows = self.clients.of_run(s)
        return self.receivers[s][1][: rows.stop - rows.start]

    def bill(
        self, s: int, ledger: CommLedger, counts: tuple[Tensor, Tensor], widths: tuple[int, int]
    ) -> None:
        """Bill run ``s``'s client-edge messages of a round to its ``ledger``: ``counts =
        (down [..., ΣE], up [..., ΣC])``, the non-zeros of each edge row's message to its
        receivers and of each client's upload (every message of the round at once: the ledger
        sums integers, as message by message), of ``widths`` values."""
        seg, ids = self.receivers[s]
        down = counts[0][..., self.edges.of_run(s)][..., seg].to(torch.int64)
        ledger.record_counts("client_edge", "down", down, widths[0], ids.expand_as(down))
        up = counts[1][..., self.clients.of_run(s)].to(torch.int64)
        ledger.record_counts("client_edge", "up", up, widths[1], self.ids(s).expand_as(up))
