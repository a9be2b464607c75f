"""Which clients and edges each Flower node hosts.

Hierarchical algorithms: a node hosts whole edges (with their clients), the edges split into
``flower.nodes`` contiguous blocks (default: one edge per node). Flat algorithms: a node hosts a
contiguous shard of clients (``flower.nodes`` shards; default: one per edge; ``nodes =
num_clients`` is the cross-device case of one client per node).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from fedhp.config import RunConfig
from fedhp.errors import ConfigError
from fedhp.topology import Topology


class FlowerOptions(Protocol):
    """What the Flower checks read of an algorithm's options (its class says it)."""

    @property
    def hierarchical(self) -> bool:
        """Clients under edges under the cloud (a node hosts whole edges)."""

    @property
    def federated(self) -> bool:
        """False for a non-federated reference row (all data in one place)."""

    @property
    def flower_ready(self) -> bool:
        """Whether the method runs on the Flower backends."""


@dataclass(frozen=True)
class Shard:
    """Global indices (sorted) of the clients and edges one node hosts."""

    index: int
    clients: torch.Tensor
    edges: torch.Tensor


def node_count(cfg: RunConfig, hierarchical: bool) -> int:
    """``flower.nodes``, defaulted and checked against the topology (one-line errors)."""
    fed = cfg.federation
    limit, what = (fed.num_edges, "num_edges") if hierarchical else (fed.num_clients, "num_clients")
    nodes = cfg.flower.nodes if cfg.flower.nodes is not None else min(fed.num_edges, limit)
    if nodes > limit:
        kind = "edges" if hierarchical else "clients"
        raise ConfigError(
            f"flower.nodes: {nodes} nodes for {limit} {kind}; a node hosts at least one of "
            f"them, so use at most federation.{what}={limit}"
        )
    return nodes


def make_shards(topology: Topology, nodes: int, hierarchical: bool) -> list[Shard]:
    """``nodes`` contiguous shards: of edges (hierarchical) or of clients (flat)."""
    edge_of = topology.edge_of_client.cpu()
    shards = []
    if hierarchical:
        for i, edges in enumerate(torch.arange(topology.num_edges).tensor_split(nodes)):
            clients = torch.nonzero(torch.isin(edge_of, edges)).flatten()
            shards.append(Shard(i, clients, edges))
    else:
        for i, clients in enumerate(torch.arange(topology.num_clients).tensor_split(nodes)):
            shards.append(Shard(i, clients, edge_of[clients].unique()))
    return shards


def check_flower_config(cfg: RunConfig, options: FlowerOptions) -> None:
    """One-line errors for configurations the Flower backends cannot run (``options``: the
    algorithm's)."""
    name = cfg.algorithm.get("name")
    if not options.federated:
        raise ConfigError(
            f"backend: {name} is a non-federated reference row and cannot run on "
            f"{cfg.backend}; use backend=inprocess"
        )
    if not options.flower_ready:
        raise ConfigError(
            f"backend: {name} does not run on {cfg.backend} yet; use backend=inprocess"
        )
    if cfg.device != "cpu":
        raise ConfigError(f"device: backend={cfg.backend} runs on the CPU; use device=cpu")
    node_count(cfg, options.hierarchical)
