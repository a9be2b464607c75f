"""A tiny fabricated federation (MLR on 4 features, 3 classes) and per-client loss helpers."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedhp.comm import CommLedger
from fedhp.data.types import ClientData
from fedhp.engine.context import RunContext
from fedhp.engine.federation import Federation
from fedhp.engine.sampler import BatchSampler
from fedhp.models.zoo import MLROptions
from fedhp.topology import Topology

FEATURES, CLASSES = 4, 3


def tiny_context(
    edge_sizes: tuple[int, ...] = (3, 2),
    n_train: int = 6,
    n_test: int = 5,
    zero_threshold: float = 0.0,
    nan_test: bool = False,
    seed: int = 0,
) -> RunContext:
    """Clients with ``n_train`` training samples each (a minibatch of that size is all of them)."""
    g = torch.Generator().manual_seed(seed)
    clients = []
    for c in range(sum(edge_sizes)):
        x = torch.randn(n_train, FEATURES, generator=g) + c * 0.3
        y = torch.randint(0, CLASSES, (n_train,), generator=g)
        tx = torch.randn(n_test, FEATURES, generator=g)
        if nan_test:
            tx = torch.full_like(tx, float("nan"))
        ty = torch.randint(0, CLASSES, (n_test,), generator=g)
        empty = torch.zeros(0, FEATURES)
        clients.append(ClientData(x, y, tx, ty, empty, torch.zeros(0, dtype=torch.long)))
    fed = Federation.from_clients(clients, CLASSES)
    topo = Topology.build(len(clients), len(edge_sizes), list(edge_sizes))
    gen = torch.Generator().manual_seed(seed + 1)
    return RunContext(
        model=MLROptions().build((FEATURES,), CLASSES),
        fed=fed,
        topology=topo,
        ledger=CommLedger(),
        generator=gen,
        sampler=BatchSampler(fed.train.counts, gen),
        zero_threshold=zero_threshold,
    )


def client_data(ctx: RunContext, c: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Client ``c``'s full training set."""
    lo, hi = int(ctx.fed.train.offsets[c]), int(ctx.fed.train.offsets[c + 1])
    return ctx.fed.train.x[lo:hi], ctx.fed.train.y[lo:hi]


def mlr_loss(p: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of MLR with flat parameters (weight [3, 4] then bias [3])."""
    w = p[: FEATURES * CLASSES].view(CLASSES, FEATURES)
    b = p[FEATURES * CLASSES :]
    return F.cross_entropy(x @ w.T + b, y)


def mlr_grad(p: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    q = p.detach().clone().requires_grad_(True)
    (g,) = torch.autograd.grad(mlr_loss(q, x, y), q)
    return g


def init_params(seed: int = 3) -> torch.Tensor:
    return torch.randn(FEATURES * CLASSES + CLASSES, generator=torch.Generator().manual_seed(seed))
