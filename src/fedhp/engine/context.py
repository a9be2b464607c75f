"""What an algorithm sees of the run: model, data, topology, RNG, accounting, sampling."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from fedhp.comm import CommLedger
from fedhp.engine.federation import Federation
from fedhp.engine.ops import ExtraGrad, sgd_steps
from fedhp.engine.sampler import BatchSampler
from fedhp.models.base import BatchedModel
from fedhp.topology import Topology

Weighting = Literal["uniform", "samples"]


@dataclass
class RunContext:
    """Shared services for one run. Algorithms keep their own state in a dict of tensors."""

    model: BatchedModel
    fed: Federation
    topology: Topology
    ledger: CommLedger
    generator: torch.Generator
    sampler: BatchSampler
    weighting: Weighting = "uniform"
    client_fraction: float = 1.0
    edges_per_round: int | None = None
    zero_threshold: float = 0.0

    @property
    def device(self) -> torch.device:
        return self.fed.train.x.device

    @property
    def num_clients(self) -> int:
        return self.fed.num_clients

    @property
    def all_clients(self) -> torch.Tensor:
        return torch.arange(self.num_clients, device=self.device)

    def client_weights(self, clients: torch.Tensor) -> torch.Tensor:
        """Aggregation weights of ``clients``: 1 each, or their training-sample counts."""
        if self.weighting == "samples":
            return self.fed.train.counts[clients].to(torch.float32)
        return torch.ones(len(clients), device=self.device)

    def edge_weights(self, edges: torch.Tensor) -> torch.Tensor:
        """Aggregation weights of ``edges``: 1 each, or the training samples under each edge."""
        if self.weighting == "samples":
            per_edge = torch.zeros(self.topology.num_edges, device=self.device)
            per_edge.index_add_(
                0, self.topology.edge_of_client.to(self.device), self.fed.train.counts.float()
            )
            return per_edge[edges]
        return torch.ones(len(edges), device=self.device)

    def sample_clients(self) -> torch.Tensor:
        """Sorted client indices taking part this round (``client_fraction`` of all, at least 1)."""
        n = self.num_clients
        k = max(1, round(self.client_fraction * n))
        if k >= n:
            return self.all_clients
        return torch.randperm(n, generator=self.generator)[:k].sort().values.to(self.device)

    def sample_edges(self) -> torch.Tensor:
        """Sorted edge indices aggregated this round (``edges_per_round`` of all)."""
        n = self.topology.num_edges
        s = self.edges_per_round or n
        if s >= n:
            return torch.arange(n, device=self.device)
        return torch.randperm(n, generator=self.generator)[:s].sort().values.to(self.device)

    def clients_of_edges(self, edges: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Clients under ``edges`` (sorted) and, for each, the position of its edge in ``edges``."""
        edge_of = self.topology.edge_of_client.to(self.device)
        clients = self.all_clients[(edge_of.unsqueeze(1) == edges.unsqueeze(0)).any(1)]
        return clients, torch.searchsorted(edges, edge_of[clients])

    def batches(
        self, clients: torch.Tensor, batch_size: int
    ) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
        """A callable yielding a fresh minibatch ``(x [C',B,..], y [C',B])`` of ``clients``."""

        def draw() -> tuple[torch.Tensor, torch.Tensor]:
            idx = self.sampler.draw(clients, batch_size)
            x, y = self.fed.train.gather(clients, idx)
            return x, y

        return draw

    def local_sgd(
        self,
        params: torch.Tensor,
        clients: torch.Tensor,
        steps: int,
        batch_size: int,
        lr: float,
        extra_grad: ExtraGrad | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``steps`` minibatch SGD steps of ``clients`` (rows of ``params``), all at once."""
        return sgd_steps(
            self.model, params, self.batches(clients, batch_size), steps, lr, extra_grad
        )
