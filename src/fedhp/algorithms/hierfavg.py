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
    bills_stragglers = True  # a straggler receives its edge's model in each of the kappa2 rounds

    def init_state(self, init_params: torch.Tensor) -> State:
        return {"global": init_params.clone(), **self.init_buffer_state(init_params.device)}

    def plan(self, state: State, rnd: int) -> Task:
        ctx = self.ctx
        edges = ctx.sample_edges()
        clients, _ = ctx.clients_of_edges(edges)
        down = self.downlink(state, len(edges))
        assert down is not None
        stragglers = ctx.round_stragglers_under(edges)
        broadcast = self.received_broadcast(ctx.send("edge_cloud", "down", down, edges)[0])
        return Task(clients, edges, broadcast=broadcast, stragglers=stragglers)

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
        late = task.stragglers if task.stragglers is not None else clients[:0]
        late_seg, late_ids = ctx.edge_positions(late, edges), ctx.global_clients(late)
        losses = []
        for _ in range(opt.kappa2):
            sent_bufs = None if edge_bufs is None or self.buffers_local else edge_bufs
            down = self.wire(edge_models, sent_bufs)
            received = ctx.send("client_edge", "down", down[seg], ids)
            if len(late):  # stragglers receive the edge model too; their replies never arrive
                ctx.send("client_edge", "down", down[late_seg], late_ids)
            start, recv_bufs = self.unwire(received, sent_bufs is not None)
            bufs = self.start_buffers(state, clients, recv_bufs)
            params, loss_sum = ctx.local_sgd(
                start, clients, opt.kappa1, opt.batch_size, opt.lr, buffers=bufs
            )
            params, bufs = self.unwire(
                ctx.send("client_edge", "up", self.wire(params, bufs), ids), bufs is not None
            )
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
        edges = task.edges
        assert edges is not None and update.losses is not None
        edge_bufs = update.per_edge.get("buffers")
        up = ctx.send("edge_cloud", "up", self.wire(update.per_edge["model"], edge_bufs), edges)
        edge_models, edge_bufs = self.unwire(up, edge_bufs is not None)
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
