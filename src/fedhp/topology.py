"""The client → edge → cloud tree. Flat FL is the one-edge case (all clients talk to the cloud)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedhp.errors import ConfigError


@dataclass(frozen=True)
class Topology:
    """Which edge server each client belongs to. Edges may be of uneven size."""

    edge_of_client: torch.Tensor  # int64 [C]
    num_edges: int

    @property
    def num_clients(self) -> int:
        return int(self.edge_of_client.shape[0])

    @property
    def edge_sizes(self) -> list[int]:
        return torch.bincount(self.edge_of_client, minlength=self.num_edges).tolist()

    def clients_of(self, edge: int) -> torch.Tensor:
        """Indices of the clients attached to ``edge``."""
        return torch.nonzero(self.edge_of_client == edge).flatten()

    @staticmethod
    def build(num_clients: int, num_edges: int, edge_sizes: list[int] | None = None) -> Topology:
        """Contiguous edges: edge i holds clients ``sum(sizes[:i]) .. sum(sizes[:i+1])-1``.

        Without ``edge_sizes`` the clients are split as evenly as possible (the paper's edge i =
        clients iJ..iJ+J-1 when J divides the client count).
        """
        if num_edges < 1:
            raise ConfigError(f"federation.num_edges: must be >= 1 (got {num_edges})")
        if edge_sizes is None:
            if num_edges > num_clients:
                raise ConfigError(
                    f"federation.num_edges: {num_edges} edges for {num_clients} clients; "
                    "use at most as many edges as clients"
                )
            base, extra = divmod(num_clients, num_edges)
            edge_sizes = [base + (1 if i < extra else 0) for i in range(num_edges)]
        if len(edge_sizes) != num_edges or sum(edge_sizes) != num_clients or min(edge_sizes) < 1:
            raise ConfigError(
                f"federation.edge_sizes: {edge_sizes} must list {num_edges} positive sizes "
                f"summing to num_clients={num_clients}"
            )
        edge_of = torch.repeat_interleave(
            torch.arange(num_edges), torch.tensor(edge_sizes, dtype=torch.long)
        )
        return Topology(edge_of, num_edges)
