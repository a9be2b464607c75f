"""HierFAVG (Liu et al., ICC 2020): client–edge–cloud FedAvg."""

from __future__ import annotations

import pydantic
import torch

from fedhp.algorithms.base import ALGORITHMS, Algorithm, AlgorithmOptions, State, Task, Update
from fedhp.engine.context import RunContext
from fedhp.engine.ops import segment_mean, weighted_mean


class HierFAVG(Algorithm):
    """Each client runs ``kappa1`` SGD steps, its edge averages its clients; after ``kappa2`` edge
    aggregations the cloud averages the edges. One global round = one cloud aggregation."""

    options: HierFAVGOptions
    edge_outputs = ("model",)
    edge_buffer_outputs = ("buffers",)

    def init_state(self, init_params: torch.Tensor) -> State:
        return {"global": init_params.clone(), **self.init_buffer_state(init_params.device)}

    def plan(self, state: State, rnd: int) -> Task:
        ctx = self.ctx
        edges = ctx.sample_edges()
        clients, _ = ctx.clients_of_edges(edges)
        edge_models = self.downlink(state, len(edges))
        assert edge_models is not None
        ctx.ledger.record("edge_cloud", "down", edge_models, ctx.zero_threshold, nodes=edges)
        broadcast = {"global": state["global"], **self.sent_buffers(state)}
        return Task(clients, edges, broadcast=broadcast)

    def train(self, state: State, task: Task) -> Update:
        ctx, opt = self.ctx, self.options
        clients, edges = task.clients, task.edges
        assert edges is not None
        seg = ctx.edge_positions(clients, edges)
        ids = ctx.global_clients(clients)
        edge_models = task.broadcast["global"].expand(len(edges), -1)
        sent = task.broadcast.get("global_buffers")
        edge_bufs = None if sent is None else sent.expand(len(edges), -1)
        weights = ctx.client_weights(clients)
        losses = []
        for _ in range(opt.kappa2):
            start = edge_models[seg]
            bufs = self.start_buffers(state, clients, None if edge_bufs is None else edge_bufs[seg])
            down = self.wire(start, None if self.buffers_local else bufs)
            ctx.ledger.record("client_edge", "down", down, ctx.zero_threshold, nodes=ids)
            params, loss_sum = ctx.local_sgd(
                start, clients, opt.kappa1, opt.batch_size, opt.lr, buffers=bufs
            )
            up = self.wire(params, bufs)
            ctx.ledger.record("client_edge", "up", up, ctx.zero_threshold, nodes=ids)
            edge_models = segment_mean(params, seg, weights, len(edges))
            if bufs is not None:  # uploaded in both modes: the global model is evaluated with them
                self.keep_buffers(state, clients, bufs)
                edge_bufs = segment_mean(bufs, seg, weights, len(edges))
            losses.append(loss_sum)
        per_edge = {"model": edge_models}
        if edge_bufs is not None:
            per_edge["buffers"] = edge_bufs
        return Update(per_edge=per_edge, losses=torch.stack(losses))

    def aggregate(self, state: State, task: Task, update: Update) -> dict[str, float]:
        ctx, opt = self.ctx, self.options
        edges, edge_models = task.edges, update.per_edge["model"]
        assert edges is not None and update.losses is not None
        edge_bufs = update.per_edge.get("buffers")
        up = self.wire(edge_models, edge_bufs)
        ctx.ledger.record("edge_cloud", "up", up, ctx.zero_threshold, nodes=edges)
        weights = ctx.edge_weights(edges)
        state["global"] = weighted_mean(edge_models, weights)
        if edge_bufs is not None:
            state["global_buffers"] = weighted_mean(edge_bufs, weights)
        loss_total = 0.0
        for loss_sum in update.losses:
            loss_total += float(loss_sum.mean()) / opt.kappa1
        return {"local_loss": loss_total / opt.kappa2}


@ALGORITHMS.register("hierfavg")
class HierFAVGOptions(AlgorithmOptions):
    """HierFAVG: kappa1 local steps per edge aggregation, kappa2 edge aggregations per round.

    ``local_steps`` is derived (kappa1 * kappa2) and only reported."""

    kappa1: int = pydantic.Field(5, gt=0, description="local SGD steps per edge aggregation")
    kappa2: int = pydantic.Field(4, gt=0, description="edge aggregations per cloud aggregation")

    hierarchical = True
    supports_buffers = True

    def gradient_evaluations(self) -> int:
        return self.kappa1 * self.kappa2

    def build(self, ctx: RunContext) -> Algorithm:
        return HierFAVG(self, ctx)
