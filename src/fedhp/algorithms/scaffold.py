"""SCAFFOLD (Karimireddy et al., ICML 2020): stochastic controlled averaging, option II.

The cloud holds the global model x and the server control variate c; each client i holds its
own control variate c_i between the rounds it takes part in (node state under Flower). Both
start at ZERO. A sampled client receives (x, c) in one message, runs its local steps with the
corrected gradient g_i(y) − c_i + c (an additive term on the gradient only: BatchNorm running
statistics are never touched), then, with K_i the number of steps it really took (local
epochs: its own count),

    c_i⁺ = c_i − c + (x − y_i) / (K_i · η_l)                          (option II)

(with local momentum ρ, K_i is replaced by the total weight the K_i gradients receive in the
displacement, FedNova's a_i = [K − ρ(1 − ρ^K)/(1 − ρ)]/(1 − ρ), so (x − y_i)/(a_i η_l) is still the
mean corrected gradient — the paper has no momentum, and with K_i the variates come out ~1/(1 − ρ)
times too large and the correction diverges)

and uploads (y_i, c_i⁺ − c_i) in one message. The cloud sets

    x ← x + η_g · Σ_i p_i (y_i − x),     c ← c + (|S| / N) · Σ_i p_i (c_i⁺ − c_i),

p_i the aggregation weights of the sampled clients (uniform: the paper's 1/|S|). The control
variates travel both ways, so every message is 2P values (plus BatchNorm buffers) and the ledger
bills them.
"""

from __future__ import annotations

import pydantic
import torch

from fedhp.algorithms.base import ALGORITHMS, Algorithm, LocalWorkOptions, State, Task, Update
from fedhp.engine.context import RunContext
from fedhp.engine.ops import ConstantGrad, momentum_norm, weighted_mean


def option_two(
    c_local: torch.Tensor,
    c: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    steps: torch.Tensor,
    lr: float,
) -> torch.Tensor:
    """SCAFFOLD's option-II client control variates ``c_i⁺ [n, P]`` after ``steps [n]`` real
    local steps of size ``lr`` from ``x [P]`` to ``y [n, P]`` (with momentum: their a_i,
    :func:`fedhp.engine.ops.momentum_norm`)."""
    scale = 1.0 / (steps.to(y.dtype).clamp(min=1) * lr)
    return c_local - c + (x - y) * scale.unsqueeze(1)


class Scaffold(Algorithm):
    """SCAFFOLD; the global model is ``global``, the server control variate ``c``."""

    options: ScaffoldOptions
    node_keys = {"c_local": "client"}
    client_outputs = ("params", "dc")
    client_buffer_outputs = ("buffers",)

    def init_state(self, init_params: torch.Tensor) -> State:
        p = init_params.clone()
        return {
            "global": p,
            "c": torch.zeros_like(p),
            "c_local": torch.zeros(self.ctx.num_clients, p.numel(), device=p.device),
            **self.init_buffer_state(p.device),
        }

    def plan(self, state: State, rnd: int) -> Task:
        ctx = self.ctx
        clients = ctx.sample_clients()
        n, p = len(clients), ctx.model.num_params
        down = self.downlink(state, n)
        assert down is not None
        message = torch.cat((down, state["c"].expand(n, -1)), dim=1)
        received = ctx.send("client_cloud", "down", message, clients)
        broadcast = self.received_broadcast(received[0, :-p])
        broadcast["c"] = received[0, -p:]
        return Task(clients, broadcast=broadcast)

    def train(self, state: State, task: Task) -> Update:
        opt = self.options
        x, c = task.broadcast["global"], task.broadcast["c"]
        n = len(task.clients)
        c_local = state["c_local"][task.clients]
        correction = c - c_local  # added to every local gradient
        sent = task.broadcast.get("global_buffers")
        bufs = self.start_buffers(state, task.clients, None if sent is None else sent.expand(n, -1))
        y, loss_sum, steps = self.local_update(
            x.expand(n, -1), task.clients, ConstantGrad(correction), buffers=bufs
        )
        c_new = option_two(c_local, c, x, y, momentum_norm(steps, opt.momentum), opt.lr)
        state["c_local"][task.clients] = c_new
        per_client = {"params": y, "dc": c_new - c_local}
        if bufs is not None:
            self.keep_buffers(state, task.clients, bufs)
            per_client["buffers"] = bufs
        return Update(per_client=per_client, losses=loss_sum.unsqueeze(0), steps=steps)

    def aggregate(self, state: State, task: Task, update: Update) -> dict[str, float]:
        ctx, opt = self.ctx, self.options
        clients = task.clients
        p = ctx.model.num_params
        bufs = update.per_client.get("buffers")
        x = state["global"]
        y = ctx.upload(update.per_client["params"], clients, task.broadcast["global"])
        rows = torch.cat((self.wire(y, bufs), update.per_client["dc"]), 1)
        up = ctx.send("client_cloud", "up", rows, clients)
        y, bufs = self.unwire(up[:, :-p], bufs is not None)
        dc = up[:, -p:]
        weights = ctx.client_weights(clients)
        mean = ctx.cloud_mean(y, weights, task.broadcast["global"])  # (dc: the plain mean)
        state["global"] = mean if opt.server_lr == 1.0 else x + opt.server_lr * (mean - x)
        state["c"] = state["c"] + (len(clients) / ctx.num_clients) * weighted_mean(dc, weights)
        if bufs is not None:
            state["global_buffers"] = weighted_mean(bufs, weights)
        return self.local_work_stats(task, update)


@ALGORITHMS.register("scaffold")
class ScaffoldOptions(LocalWorkOptions):
    """SCAFFOLD (option II control variates, zero-initialized); ``server_lr`` is the global step
    size η_g (1: the cloud takes the clients' average)."""

    server_lr: float = pydantic.Field(1.0, gt=0, description="global step size eta_g")

    supports_buffers = True
    robust_levels = frozenset({"cloud"})
    attack_ready = True

    def build(self, ctx: RunContext) -> Algorithm:
        return Scaffold(self, ctx)
