"""The plain per-client reference path: one ``nn.Module`` per client, trained in a Python loop
with ``torch.optim.SGD`` — how most FL simulators train. Tests check the vectorized engine against
it; the benchmark measures the speedup over it."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from fedhp.models.base import BatchedModel


def reference_local_sgd(
    model: BatchedModel,
    params: torch.Tensor,
    batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    lr: float,
    *,
    buffers: torch.Tensor | None = None,
) -> torch.Tensor:
    """Client by client: SGD on ``batches[s] = (x [C,B,..], y [C,B])``; returns ``[C, P]``.

    The modules train in training mode; ``buffers [C, B]`` (BatchNorm running statistics), if
    given, start each client's module and receive its final ones (in place)."""
    out = []
    for c in range(params.shape[0]):
        module = model.make_module(params[c], None if buffers is None else buffers[c])
        module.train()
        opt = torch.optim.SGD(module.parameters(), lr=lr)
        for x, y in batches:
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(module(x[c]), y[c]).backward()
            opt.step()
        out.append(model.layout.flatten_module(module))
        if buffers is not None:
            buffers[c] = model.buffer_layout.flatten_module(module)
    return torch.stack(out)


def reference_fedavg_round(
    model: BatchedModel,
    global_params: torch.Tensor,
    batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    lr: float,
    weights: torch.Tensor,
) -> torch.Tensor:
    """One FedAvg round on the reference path: local SGD per client, then a weighted average."""
    num_clients = batches[0][1].shape[0]
    local = reference_local_sgd(model, global_params.expand(num_clients, -1), batches, lr)
    return (weights / weights.sum()) @ local


def reference_client_sgd(
    model: BatchedModel,
    params: torch.Tensor,
    batches: Sequence[Sequence[tuple[torch.Tensor, torch.Tensor]]],
    lr: float,
    *,
    buffers: torch.Tensor | None = None,
) -> torch.Tensor:
    """Client by client: SGD on client c's own minibatches ``batches[c]`` (any number, any
    sizes: e.g. local epochs with a partial last batch); returns ``[C, P]``. ``buffers [C, B]``
    (BatchNorm running statistics), if given, start each module in training mode and receive its
    final ones (in place)."""
    out = []
    for c in range(params.shape[0]):
        module = model.make_module(params[c], None if buffers is None else buffers[c])
        module.train()
        opt = torch.optim.SGD(module.parameters(), lr=lr)
        for x, y in batches[c]:
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(module(x), y).backward()
            opt.step()
        out.append(model.layout.flatten_module(module))
        if buffers is not None:
            buffers[c] = model.buffer_layout.flatten_module(module)
    return torch.stack(out)
