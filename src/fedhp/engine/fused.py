"""Fused, allocation-free helpers for the non-gradient work of the personalized methods (sFedHP,
pFedMe): wire truncation in place, fast per-row non-zero counts, the edge -> client broadcast
without gathering the edge rows per client, and sending rows with the fused truncation and count.

Every helper computes exactly what the straightforward formula computes, value for value (the
tests in ``tests/engine/test_fused.py`` compare them bit for bit): they only avoid temporaries,
extra passes over ``[C, P]`` and host syncs inside the local-round loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from fedhp.comm import count_nonzero
from fedhp.engine.context import RunContext


def truncate_(
    x: torch.Tensor, zero_threshold: float, out: torch.Tensor | None = None
) -> torch.Tensor:
    """:func:`fedhp.comm.truncate` into ``out`` (default: ``x`` itself), one pass.

    ``hardshrink`` zeroes exactly the entries with ``-eps <= x <= eps`` (as +0.0) and keeps the
    rest (NaN included), as ``x.masked_fill(x.abs() <= eps, 0.0)`` does. With a zero threshold
    of 0 nothing changes (``out``, if given, receives a copy)."""
    target = x if out is None else out
    if zero_threshold <= 0:
        return target if out is None else target.copy_(x)
    return torch.hardshrink(x, zero_threshold, out=target)


def count_sent(
    x: torch.Tensor,
    zero_threshold: float,
    scratch: torch.Tensor,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Non-zeros of each row of ``x [M, P]`` as :func:`fedhp.comm.count_nonzero` counts them
    (``x != 0``, or ``|x| > eps`` with a positive zero threshold), as float32 ``[M]`` (into
    ``out`` if given).

    ``scratch``: a float tensor of ``x``'s shape, overwritten (``x`` itself where its values are
    no longer needed); see :func:`~fedhp.comm.count_nonzero`."""
    counts = count_nonzero(x, zero_threshold, scratch).to(torch.float32)
    return counts if out is None else out.copy_(counts)


Parts = list[tuple[torch.Tensor, ...]]


@dataclass(frozen=True)
class EdgeRows:
    """How a round's client rows ``[C, P]`` (sorted clients) map to their edges' rows ``[n, P]``
    (``seg [C]``: each client's edge position), so an edge's model can act on its clients' rows
    without first being copied into every one of them.

    ``width > 0``: the clients of edge e are rows ``e*width .. (e+1)*width - 1`` (equal edges, all
    present): one broadcast view. Otherwise ``runs`` lists ``(start, stop, edge)`` for contiguous
    clients of one edge, or is None (clients not grouped by edge): the edge rows are gathered."""

    seg: torch.Tensor
    num_edges: int
    runs: tuple[tuple[int, int, int], ...] | None
    width: int

    @classmethod
    def of(cls, seg: torch.Tensor, num_edges: int) -> EdgeRows:
        """The layout of ``seg`` (one host read of it, once per round)."""
        edge_of = seg.tolist()
        runs: list[tuple[int, int, int]] = []
        for row, edge in enumerate(edge_of):
            if runs and runs[-1][2] == edge:
                start, _, _ = runs[-1]
                runs[-1] = (start, row + 1, edge)
            else:
                runs.append((row, row + 1, edge))
        if len({edge for _, _, edge in runs}) != len(runs):  # an edge's clients are split
            return cls(seg, num_edges, None, 0)
        sizes = {stop - start for start, stop, _ in runs}
        ordered = [edge for _, _, edge in runs] == list(range(num_edges))
        width = sizes.pop() if ordered and len(sizes) == 1 else 0
        return cls(seg, num_edges, tuple(runs), width)

    def receive(self, edge_rows: torch.Tensor, buffer: torch.Tensor) -> Received:
        """What the clients receive from their edges, ``edge_rows [n, P]``; ``buffer [C, P]`` is
        written only when the rows must be gathered (ungrouped clients)."""
        if self.runs is None:
            torch.index_select(edge_rows, 0, self.seg, out=buffer)
            return Received(self, buffer, gathered=True)
        return Received(self, edge_rows, gathered=False)


@dataclass(frozen=True)
class Received:
    """Edge rows as the clients see them: :meth:`parts` pairs each edge's row (a broadcastable
    view) with the rows of its clients in any ``[C, P]`` tensors."""

    rows: EdgeRows
    edge_rows: torch.Tensor
    gathered: bool

    def parts(self, *client_rows: torch.Tensor) -> Parts:
        """``(edge part, client parts...)`` tuples covering every client once: the edge part
        broadcasts against the client parts (client tensors must be contiguous)."""
        rows, edge = self.rows, self.edge_rows
        if self.gathered:
            return [(edge, *client_rows)]
        if rows.width:
            shape = (rows.num_edges, rows.width, edge.shape[-1])
            return [(edge.unsqueeze(1), *(t.view(shape) for t in client_rows))]
        assert rows.runs is not None
        return [(edge[e], *(t[a:b] for t in client_rows)) for a, b, e in rows.runs]

    def columns(self, lo: int, hi: int) -> Received:
        """The same rows restricted to columns ``lo .. hi - 1`` (pair it with client rows sliced
        alike)."""
        return Received(self.rows, self.edge_rows[:, lo:hi], self.gathered)

    def apply(self, fn: Callable[..., object], *client_rows: torch.Tensor) -> None:
        """``fn(edge part, client parts...)`` for every part (in-place work on client rows)."""
        for part in self.parts(*client_rows):
            fn(*part)

    def spread(self, out: torch.Tensor) -> torch.Tensor:
        """Each client's received row copied into ``out [C, P]`` (``edge_rows[seg]``)."""
        self.apply(lambda edge, rows: rows.copy_(edge), out)
        return out


def send_rows(
    ctx: RunContext, link: str, direction: str, messages: torch.Tensor, nodes: torch.Tensor
) -> torch.Tensor:
    """:meth:`RunContext.send <fedhp.engine.context.RunContext.send>` of the rows of
    ``messages [M, P]`` (one per node of ``nodes``), with the fused truncation and count: bills
    them and returns what the receivers get, the values truncated at the zero threshold."""
    eps = ctx.zero_threshold
    sent = messages if eps <= 0 else truncate_(messages, eps, out=torch.empty_like(messages))
    nnz = count_sent(sent, eps, torch.empty_like(sent))
    ctx.ledger.record_counts(link, direction, nnz.to(torch.int64), sent.shape[-1], nodes=nodes)
    return sent
