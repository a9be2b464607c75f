"""FedNova (Wang et al., NeurIPS 2020): normalized averaging of clients that take different
numbers of local steps.

Client i runs τ_i local SGD steps from x (under ``local_epochs``: ⌈n_i / B⌉ per epoch, its
own count) to y_i. Its normalized update is d_i = (x − y_i) / a_i with a_i = ‖a_i‖₁ of its
accumulation vector: τ_i for plain SGD, and with local momentum ρ

    a_i = [τ_i − ρ (1 − ρ^τ_i) / (1 − ρ)] / (1 − ρ)                  (:func:`momentum_norm`)

The cloud steps x ← x − τ_eff Σ_i p_i d_i with τ_eff = Σ_i p_i a_i (p_i the aggregation
weights, normalized). With equal step counts this is FedAvg. ρ is the ``momentum`` option of
the local SGD (0: a_i = τ_i); weight decay counts as part of the gradient, as in FedNova's code.
"""

from __future__ import annotations

import torch

from fedhp.algorithms.base import ALGORITHMS, Algorithm, State, Task, Update
from fedhp.algorithms.fedavg import FedAvg, FedAvgOptions
from fedhp.engine.context import RunContext
from fedhp.engine.ops import momentum_norm, weighted_mean


def normalized_average(
    x: torch.Tensor, y: torch.Tensor, a: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """FedNova's new global model from ``x [P]``, the clients' ``y [n, P]``, their ``a [n]`` and
    aggregation ``weights [n]``."""
    p = (weights / weights.sum()).to(torch.float64)
    a = a.to(torch.float64)
    tau_eff = float((p * a).sum())
    coef = (p / a.clamp(min=1e-12)).to(y.dtype)  # p_i / a_i
    return x - tau_eff * (coef.unsqueeze(1) * (x - y)).sum(0)


class FedNova(FedAvg):
    """FedAvg's local work; the cloud averages the clients' step-normalized updates."""

    options: FedNovaOptions

    def aggregate(self, state: State, task: Task, update: Update) -> dict[str, float]:
        ctx, opt = self.ctx, self.options
        clients = task.clients
        bufs = update.per_client.get("buffers")
        up = ctx.send("client_cloud", "up", self.wire(update.per_client["params"], bufs), clients)
        y, bufs = self.unwire(up, bufs is not None)
        steps = update.steps
        if steps is None:  # not carried (Flower): a function of the clients' sample counts
            steps = opt.step_counts(ctx.fed.train.counts[clients])
        weights = ctx.client_weights(clients)
        a = momentum_norm(steps.to(y.device), opt.momentum)
        state["global"] = normalized_average(state["global"], y, a, weights)
        if bufs is not None:
            state["global_buffers"] = weighted_mean(bufs, weights)
        stats = self.local_work_stats(task, update)
        stats.update(self.account_device_cost(state, clients))
        return stats


@ALGORITHMS.register("fednova")
class FedNovaOptions(FedAvgOptions):
    """FedNova: FedAvg's local SGD (``local_steps`` or ``local_epochs``), then normalized
    averaging by each client's real step count (plain SGD: a_i = τ_i)."""

    def build(self, ctx: RunContext) -> Algorithm:
        return FedNova(self, ctx)
