"""Minibatch index sampling for all clients at once, from one seeded generator."""

from __future__ import annotations

import torch


class BatchSampler:
    """Draws per-client minibatch indices ``[C', B]`` within each client's sample count.

    ``without_replacement`` (default): each minibatch holds distinct samples (a fresh random
    permutation per draw, as a shuffled DataLoader's batch would); clients with fewer than ``B``
    samples repeat samples cyclically. ``with_replacement``: i.i.d. uniform indices (cheaper for
    very large clients).
    """

    def __init__(self, counts: torch.Tensor, generator: torch.Generator, replacement: bool = False):
        self.counts = counts
        self.generator = generator
        self.replacement = replacement
        self.max_count = int(counts.max().item())
        self.min_count = int(counts.min().item())

    def draw(self, clients: torch.Tensor, batch_size: int) -> torch.Tensor:
        """Indices for one minibatch of each client in ``clients``."""
        counts = self.counts[clients]
        device = counts.device
        if self.replacement:
            u = torch.rand(len(clients), batch_size, generator=self.generator, device=device)
            return (u * counts.unsqueeze(1)).long()
        keys = torch.rand(len(clients), self.max_count, generator=self.generator, device=device)
        pos = torch.arange(self.max_count, device=device)
        keys = keys.masked_fill(pos.unsqueeze(0) >= counts.unsqueeze(1), 2.0)
        width = min(batch_size, self.max_count)
        if batch_size <= self.min_count:
            return torch.topk(keys, width, dim=1, largest=False, sorted=False).indices
        perm = torch.argsort(keys, dim=1)
        cyc = torch.arange(batch_size, device=device).unsqueeze(0) % counts.unsqueeze(1)
        return perm.gather(1, cyc)
