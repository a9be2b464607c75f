"""A tiny fabricated federation (MLR on 4 features, 3 classes) and per-client loss helpers."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedhp.comm import CommLedger
from fedhp.data.types import ClientData
from fedhp.engine.context import RunContext, Weighting
from fedhp.engine.federation import Federation
from fedhp.engine.sampler import BatchSampler
from fedhp.models.zoo import MLROptions
from fedhp.topology import Topology

FEATURES, CLASSES = 4, 3


def tiny_context(
    edge_sizes: tuple[int, ...] = (3, 2),
    n_train: int | tuple[int, ...] = 6,
    n_test: int | tuple[int, ...] = 5,
    zero_threshold: float = 0.0,
    nan_test: bool = False,
    seed: int = 0,
    weighting: Weighting = "uniform",
) -> RunContext:
    """Clients with ``n_train`` training samples each (one count, or one per client). A
    minibatch of ``max(n_train)`` samples covers each client's data a whole number of times when
    every count divides it, so its mean gradient is the client's full-data gradient."""
    g = torch.Generator().manual_seed(seed)
    num = sum(edge_sizes)
    trains = (n_train,) * num if isinstance(n_train, int) else n_train
    tests = (n_test,) * num if isinstance(n_test, int) else n_test
    clients = []
    for c in range(num):
        x = torch.randn(trains[c], FEATURES, generator=g) + c * 0.3
        y = torch.randint(0, CLASSES, (trains[c],), generator=g)
        tx = torch.randn(tests[c], FEATURES, generator=g)
        if nan_test:
            tx = torch.full_like(tx, float("nan"))
        ty = torch.randint(0, CLASSES, (tests[c],), generator=g)
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
        weighting=weighting,
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


def client_test(ctx: RunContext, c: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Client ``c``'s test set."""
    lo, hi = int(ctx.fed.test.offsets[c]), int(ctx.fed.test.offsets[c + 1])
    return ctx.fed.test.x[lo:hi], ctx.fed.test.y[lo:hi]


def tr(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Truncation at ``eps``, written out: what a receiver gets over a link."""
    return x.clone() if eps == 0 else torch.where(x.abs() > eps, x, torch.zeros_like(x))


def wire_bytes(message: torch.Tensor, eps: float) -> int:
    """The smallest of dense (4P), bitmap (ceil(P/8) + 4 nnz) and index (8 nnz) bytes."""
    p, nnz = message.numel(), int((message.abs() > eps).sum())
    return min(4 * p, (p + 7) // 8 + 4 * nnz, 8 * nnz)


def init_params(seed: int = 3) -> torch.Tensor:
    return torch.randn(FEATURES * CLASSES + CLASSES, generator=torch.Generator().manual_seed(seed))
