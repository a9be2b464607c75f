"""Minibatch index sampling for all clients at once, from one seeded generator."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedhp.errors import DatasetError

MAX_KEYS = 1 << 24
"""Above this many random keys per draw (``total * max_count``), :meth:`BatchSampler.draw` draws
without a key per sample (:meth:`BatchSampler._partial_shuffle`)."""


class BatchSampler:
    """Draws per-client minibatch indices ``[C', B]`` within each client's sample count.

    ``without_replacement`` (default): each minibatch holds distinct samples (a fresh random
    permutation per draw, as a shuffled DataLoader's batch would); clients with fewer than ``B``
    samples repeat samples cyclically. ``with_replacement``: i.i.d. uniform indices (cheaper for
    very large clients).

    Every draw consumes the generator as if for ALL ``total`` clients of the federation (one row
    of random keys per client) and keeps the rows of the requested clients. So a client's
    minibatches do not depend on who else takes part, and a process that holds only some clients
    (a Flower node: ``rows`` maps its local clients to their global indices, ``max_count`` /
    ``min_count`` are the federation's) draws exactly the rows the in-process engine draws.
    """

    def __init__(
        self,
        counts: torch.Tensor,
        generator: torch.Generator,
        replacement: bool = False,
        *,
        rows: torch.Tensor | None = None,
        total: int | None = None,
        max_count: int | None = None,
        min_count: int | None = None,
    ):
        check_counts(counts, rows)
        self.counts = counts
        self.generator = generator
        self.replacement = replacement
        self.rows = rows
        self.total = int(counts.shape[0]) if total is None else total
        self.max_count = int(counts.max().item()) if max_count is None else max_count
        self.min_count = int(counts.min().item()) if min_count is None else min_count

    def with_generator(self, generator: torch.Generator) -> BatchSampler:
        """The same sampler (same rows and counts) drawing from ``generator``."""
        return BatchSampler(
            self.counts,
            generator,
            self.replacement,
            rows=self.rows,
            total=self.total,
            max_count=self.max_count,
            min_count=self.min_count,
        )

    def draw(self, clients: torch.Tensor, batch_size: int) -> torch.Tensor:
        """Indices for one minibatch of each client in ``clients``."""
        counts = self.counts[clients]
        device = counts.device
        rows = clients if self.rows is None else self.rows.to(device)[clients]
        if self.replacement:
            u = torch.rand(self.total, batch_size, generator=self.generator, device=device)[rows]
            return (u * counts.unsqueeze(1)).long()
        if batch_size <= self.min_count and self.total * self.max_count > MAX_KEYS:
            return self._partial_shuffle(clients, rows, batch_size)
        keys = torch.rand(self.total, self.max_count, generator=self.generator, device=device)
        keys = keys[rows]
        pos = torch.arange(self.max_count, device=device)
        keys = keys.masked_fill(pos.unsqueeze(0) >= counts.unsqueeze(1), 2.0)
        width = min(batch_size, self.max_count)
        if batch_size <= self.min_count:
            return torch.topk(keys, width, dim=1, largest=False, sorted=False).indices
        perm = torch.argsort(keys, dim=1)
        cyc = torch.arange(batch_size, device=device).unsqueeze(0) % counts.unsqueeze(1)
        return perm.gather(1, cyc)

    def _partial_shuffle(
        self, clients: torch.Tensor, rows: torch.Tensor, batch_size: int
    ) -> torch.Tensor:
        """:meth:`draw` for federations too large for a key per sample (``total * max_count``
        above :data:`MAX_KEYS`, e.g. 100,000 natively federated clients, some with 10^5
        samples): the first ``batch_size`` places of a Fisher–Yates shuffle of each client's
        ``0 .. n_c - 1`` (place j swaps with a uniform one of j .. n_c - 1), from ``batch_size``
        uniforms per client of the federation — ``B`` distinct indices, every ordered B-subset
        equally likely, in O(C B^2)."""
        counts = self.counts[clients]
        device = counts.device
        u = torch.rand(self.total, batch_size, generator=self.generator, device=device)[rows]
        moved = torch.empty(len(clients), batch_size, dtype=torch.long, device=device)
        target = torch.empty_like(moved)
        picks = torch.empty_like(moved)
        for j in range(batch_size):
            r = j + (u[:, j] * (counts - j)).long().clamp(max=counts - 1 - j)
            # A place holds its own index until a swap moved a value there (the latest wins).
            at_j = torch.full_like(r, j)
            at_r = r.clone()
            for k in range(j):
                at_j = torch.where(target[:, k] == j, moved[:, k], at_j)
                at_r = torch.where(target[:, k] == r, moved[:, k], at_r)
            moved[:, j], target[:, j], picks[:, j] = at_j, r, at_r
        return picks

    def steps(self, clients: torch.Tensor, batch_size: int, steps: int) -> torch.Tensor:
        """The indices ``[steps, C', B]`` of ``steps`` consecutive :meth:`draw` calls (drawn
        ahead, e.g. for a round trained in parts of its clients)."""
        if steps == 0:
            return torch.zeros(0, len(clients), batch_size, dtype=torch.long)
        return torch.stack([self.draw(clients, batch_size) for _ in range(steps)])

    def epochs(self, clients: torch.Tensor, batch_size: int, epochs: int) -> EpochBatches:
        """Every minibatch of ``epochs`` passes of ``clients`` over their own shuffled data.

        Each epoch draws a fresh permutation per client (consuming the generator for all
        ``total`` clients, as :meth:`draw` does) and cuts it into ``ceil(n_c / batch_size)``
        minibatches; the last one is partial. Clients step together: an epoch lasts as many steps
        as its participants' longest, and a client that has finished its epoch idles (weight 0)
        until the next one starts. Padded positions hold index 0 and weight 0.
        """
        counts = self.counts[clients]
        device = counts.device
        rows = clients if self.rows is None else self.rows.to(device)[clients]
        steps = (counts + batch_size - 1) // batch_size  # per client and epoch
        width = int(steps.max().item()) * batch_size if len(clients) else 0
        pos = torch.arange(width, device=device)
        valid = pos.unsqueeze(0) < counts.unsqueeze(1)
        at = pos.clamp(max=self.max_count - 1).expand(len(clients), -1)
        index, weight = [], []
        for _ in range(epochs):
            keys = torch.rand(self.total, self.max_count, generator=self.generator, device=device)
            keys = keys[rows].masked_fill(
                torch.arange(self.max_count, device=device) >= counts.unsqueeze(1), 2.0
            )
            perm = torch.argsort(keys, dim=1).gather(1, at).masked_fill(~valid, 0)
            shape = (len(clients), width // batch_size, batch_size)
            index.append(perm.view(shape).transpose(0, 1))
            weight.append(valid.view(shape).transpose(0, 1))
        return EpochBatches(
            torch.cat(index).contiguous(), torch.cat(weight).float().contiguous(), steps * epochs
        )


def check_counts(counts: torch.Tensor, rows: torch.Tensor | None = None) -> None:
    """A one-line :class:`DatasetError` if some client has no training samples (a minibatch of
    it cannot be drawn): more clients than the partition can give data to. ``rows``: the
    clients' global indices (a Flower node's)."""
    empty = torch.nonzero(counts <= 0).flatten().cpu()
    if len(empty) == 0:
        return
    ids = empty if rows is None else rows.cpu()[empty]
    shown = ", ".join(str(int(c)) for c in ids[:5]) + (", ..." if len(ids) > 5 else "")
    raise DatasetError(
        f"federation.num_clients: {len(ids)} of {len(counts)} clients get no training samples "
        f"(clients {shown}; {int(counts.sum())} samples in all); use fewer clients or give the "
        "partition more data (e.g. partition.train_per_class)"
    )


@dataclass(frozen=True)
class EpochBatches:
    """The minibatches of some local epochs of ``C'`` clients, stepped together.

    ``index [S, C', B]``: sample positions within each client; ``weight [S, C', B]``: 1 for a
    real sample, 0 for padding (a partial last batch, or a client whose epoch is over);
    ``steps [C']``: the real steps (non-empty minibatches) each client takes.
    """

    index: torch.Tensor
    weight: torch.Tensor
    steps: torch.Tensor

    @property
    def num_steps(self) -> int:
        """Batched steps ``S`` (the longest client's, epoch by epoch)."""
        return int(self.index.shape[0])

    def part(self, rows: slice) -> EpochBatches:
        """The minibatches of the clients in ``rows`` (a slice of the client dimension)."""
        return EpochBatches(self.index[:, rows], self.weight[:, rows], self.steps[rows])
