"""SCAFFOLD (Karimireddy et al., ICML 2020): stochastic controlled averaging, option II.

The cloud holds the global model x and the control variate c; each client i its own c_i (node
state under Flower), all starting at ZERO. A sampled client receives (x, c) in one message, takes
its K_i local steps (local epochs: its own count) on the corrected gradient g_i(y) − c_i + c
(BatchNorm statistics untouched), then sets

    c_i⁺ = c_i − c + (x − y_i) / (K_i · η_l)                          (option II)

(with local momentum ρ, K_i becomes FedNova's a_i = [K − ρ(1 − ρ^K)/(1 − ρ)]/(1 − ρ), the total
weight of the gradients in the displacement, so (x − y_i)/(a_i η_l) is still their mean: the
paper has no momentum, and with K_i the variates are ~1/(1 − ρ) too large and diverge) and
uploads (y_i, c_i⁺ − c_i) in one message. The cloud sets

    x ← x + η_g · Σ_i p_i (y_i − x),     c ← c + (|S| / N) · Σ_i p_i (c_i⁺ − c_i),

p_i the sampled clients' weights (uniform: the paper's 1/|S|). Every message is 2P values (plus
BatchNorm buffers), billed.
"""

from __future__ import annotations

import pydantic
import torch
from torch import Tensor

from fedhp.algorithms.base import ALGORITHMS, Algorithm, LocalWorkOptions, State, Task, Update
from fedhp.algorithms.fednova import momentum_norm
from fedhp.engine.ops import ConstantGrad, weighted_mean


def option_two(c_local: Tensor, c: Tensor, x: Tensor, y: Tensor, a: Tensor, lr: float) -> Tensor:
    """SCAFFOLD's option-II client control variates ``c_i⁺ [n, P]`` after local steps of size
    ``lr`` from ``x [P]`` to ``y [n, P]`` of total weight ``a [n]`` (their step counts; with
    momentum FedNova's a_i, :func:`~fedhp.algorithms.fednova.momentum_norm`)."""
    scale = 1.0 / (a.to(y.dtype).clamp(min=1) * lr)
    return c_local - c + (x - y) * scale.unsqueeze(1)


def server_update(
    x: Tensor, c: Tensor, mean: Tensor, dc: Tensor, weights: Tensor, fraction: float, lr: float
) -> tuple[Tensor, Tensor]:
    """SCAFFOLD's cloud step from the global model ``x [P]`` and control variate ``c [P]``:
    ``x ← x + η_g (mean − x)`` (``mean``: the uploaded models' aggregate, ``Σ_i p_i y_i``),
    ``c ← c + (|S| / N) Σ_i p_i dc_i`` (``dc [n, P]``: the uploaded ``c_i⁺ − c_i``, ``weights
    [n]``, ``fraction = |S| / N``, ``lr = η_g``)."""
    x_new = mean if lr == 1.0 else x + lr * (mean - x)
    return x_new, c + fraction * weighted_mean(dc, weights)


class Scaffold(Algorithm):
    """SCAFFOLD; the global model is ``global``, the server control variate ``c``."""

    options: ScaffoldOptions

    def init_state(self, init_params: torch.Tensor) -> State:
        p, c = init_params.clone(), torch.zeros_like(init_params)
        c_local = torch.zeros(self.ctx.num_clients, p.numel(), device=p.device)
        return {"global": p, "c": c, "c_local": c_local, **self.buffers.init_state(p.device)}

    def plan(self, state: State, rnd: int) -> Task:  # (x, c) down in one message per client
        ctx, clients = self.ctx, self.ctx.participation.sample_clients()
        down = self.downlink(state, len(clients))
        assert down is not None  # (+ the control variate c)
        down["control"] = state["c"].unsqueeze(0)
        got = ctx.send("client_cloud", "down", down, clients).first()
        return Task(clients, broadcast={**self.received_broadcast(got), "c": got["control"]})

    def train(self, state: State, task: Task) -> Update:
        """Local steps from x; the option-II c_i⁺ set after, (y, c_i⁺ - c_i) uploaded."""
        opt, clients = self.options, task.clients
        x, c, c_local = task.broadcast["global"], task.broadcast["c"], state["c_local"][clients]
        bufs, start = self.buffers.received(state, task), x.expand(len(clients), -1)
        shift = ConstantGrad(c - c_local)  # the corrected gradient: g_i(y) - c_i + c
        trained = self.ctx.local_sgd(start, clients, opt.work(), shift, buffers=bufs)
        y, _, steps = trained
        c_new = option_two(c_local, c, x, y, momentum_norm(steps, opt.momentum), opt.lr)
        state["c_local"][clients] = c_new
        return self.client_update(state, task, trained, bufs, dc=c_new - c_local)

    def aggregate(self, state: State, task: Task, update: Update) -> dict[str, float]:
        ctx, opt, x, clients = self.ctx, self.options, state["global"], task.clients
        up = self.send_up(update, clients, task.broadcast["global"], "dc")  # (y, c_i⁺ - c_i)
        y, bufs, dc = up["model"], up.get("buffers"), up["dc"]
        weights = ctx.client_weights(clients)
        mean = ctx.cloud_uplink.aggregate(y, weights, task.broadcast["global"])  # (dc: own)
        fraction = len(clients) / ctx.num_clients
        update_c = (mean, dc, weights, fraction, opt.server_lr)
        state["global"], state["c"] = server_update(x, state["c"], *update_c)
        if bufs is not None:
            state["global_buffers"] = weighted_mean(bufs, weights)
        return self.local_work_stats(task, update)


@ALGORITHMS.register("scaffold")
class ScaffoldOptions(LocalWorkOptions):
    """SCAFFOLD (option II control variates, zero-initialized); ``server_lr`` is the global step
    size η_g (1: the cloud takes the clients' average)."""

    server_lr: float = pydantic.Field(1.0, gt=0, description="global step size eta_g")

    supports_buffers = True
    uploads = {"cloud": "estimate"}  # y (the control variates dc: the plain mean)
    node_keys = {"c_local": "client"}
    client_outputs = ("model", "dc")
    client_buffer_outputs = ("buffers",)
    algorithm_class = Scaffold
