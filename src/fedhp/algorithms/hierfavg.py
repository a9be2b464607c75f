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
    bills_stragglers = True  # a straggler receives its edge's model in each of the kappa2 rounds

    def init_state(self, init_params: torch.Tensor) -> State:
        return {"global": init_params.clone()}

    def plan(self, state: State, rnd: int) -> Task:
        ctx = self.ctx
        edges = ctx.sample_edges()
        clients, _ = ctx.clients_of_edges(edges)
        sent = ctx.send("edge_cloud", "down", state["global"].expand(len(edges), -1), edges)
        stragglers = ctx.round_stragglers_under(edges)
        return Task(clients, edges, broadcast={"global": sent[0]}, stragglers=stragglers)

    def train(self, state: State, task: Task) -> Update:
        ctx, opt = self.ctx, self.options
        clients, edges = task.clients, task.edges
        assert edges is not None
        seg = ctx.edge_positions(clients, edges)
        ids = ctx.global_clients(clients)
        edge_models = task.broadcast["global"].expand(len(edges), -1)
        weights = ctx.client_weights(clients)
        late = task.stragglers if task.stragglers is not None else clients[:0]
        late_seg, late_ids = ctx.edge_positions(late, edges), ctx.global_clients(late)
        losses = []
        for _ in range(opt.kappa2):
            start = ctx.send("client_edge", "down", edge_models[seg], ids)
            if len(late):  # stragglers receive the edge model too; their replies never arrive
                ctx.send("client_edge", "down", edge_models[late_seg], late_ids)
            params, loss_sum = ctx.local_sgd(start, clients, opt.kappa1, opt.batch_size, opt.lr)
            params = ctx.send("client_edge", "up", params, ids)
            edge_models = segment_mean(params, seg, weights, len(edges))
            losses.append(loss_sum)
        return Update(per_edge={"model": edge_models}, losses=torch.stack(losses))

    def aggregate(self, state: State, task: Task, update: Update) -> dict[str, float]:
        ctx, opt = self.ctx, self.options
        edges = task.edges
        assert edges is not None and update.losses is not None
        edge_models = ctx.send("edge_cloud", "up", update.per_edge["model"], edges)
        state["global"] = weighted_mean(edge_models, ctx.edge_weights(edges))
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

    def gradient_evaluations(self) -> int:
        return self.kappa1 * self.kappa2

    def build(self, ctx: RunContext) -> Algorithm:
        return HierFAVG(self, ctx)
