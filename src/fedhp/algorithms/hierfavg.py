"""HierFAVG (Liu et al., ICC 2020): client–edge–cloud FedAvg."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pydantic
import torch

from fedhp.algorithms.base import Algorithm, State
from fedhp.algorithms.options import (
    ALGORITHMS,
    AlgorithmOptions,
    client_momentum_field,
    derived_steps,
)
from fedhp.algorithms.task import Task, Update
from fedhp.engine.context import RunContext
from fedhp.engine.ops import LocalWork, weighted_mean
from fedhp.engine.uplink import CENTRE_KEYS, MOMENTUM_KEY, Uplink

if TYPE_CHECKING:
    from fedhp.config import RunConfig


class HierFAVG(Algorithm):
    """Each client runs ``kappa1`` SGD steps, its edge averages its clients; after ``kappa2`` edge
    aggregations the cloud averages the edges. One global round = one cloud aggregation."""

    options: HierFAVGOptions
    edge_outputs = ("model",)
    edge_buffer_outputs = ("buffers",)
    bills_stragglers = True  # a straggler receives its edge's model in each of the kappa2 rounds

    def init_state(self, init_params: torch.Tensor) -> State:
        return {
            "global": init_params.clone(),
            **self.buffers.init_state(init_params.device),
            **self.uplink_state(init_params),
        }

    def plan(self, state: State, rnd: int) -> Task:
        ctx = self.ctx
        edges = ctx.participation.sample_edges()
        clients, _ = ctx.participation.clients_of_edges(edges)
        down = self.downlink(state, len(edges))
        assert down is not None
        stragglers = ctx.participation.stragglers_under(edges)
        broadcast = self.received_broadcast(ctx.send("edge_cloud", "down", down, edges).first())
        return Task(clients, edges, broadcast=broadcast, stragglers=stragglers)

    def train(self, state: State, task: Task) -> Update:
        """The kappa2 edge rounds. Each edge round trains the clients in cache-sized parts (on
        the minibatches the whole round would draw, drawn ahead) and adds each part's uploads
        into its edges' sums in client order (``segment_mean``'s additions), so no more than a
        part of the client models is held, and the result is that of the whole round, bit for
        bit. Each edge's model is counted once and billed to each of its receivers. Under
        ``client_momentum`` every edge round advances each trained client's momentum once (its
        update from the edge model it received), and it uploads the edge model plus its
        momentum."""
        ctx, opt = self.ctx, self.options
        clients, edges = task.clients, task.edges
        assert edges is not None
        n, num_edges = len(clients), len(edges)
        seg = ctx.edge_positions(clients, edges)
        ids = ctx.global_clients(clients)
        edge_models = task.broadcast["global"].expand(num_edges, -1)
        sent = task.broadcast.get("global_buffers")
        edge_bufs = None if sent is None else sent.expand(num_edges, -1)
        weights = ctx.client_weights(clients)
        dtype = edge_models.dtype
        totals = torch.zeros(num_edges, dtype=dtype, device=weights.device)
        totals = totals.index_add_(0, seg, weights.to(dtype)).clamp(min=torch.finfo(dtype).tiny)
        late = task.stragglers if task.stragglers is not None else clients[:0]
        late_seg, late_ids = ctx.edge_positions(late, edges), ctx.global_clients(late)
        chunk = ctx.policy.chunk(edge_models.shape[1] + self.buffers.width, n)
        if ctx.fed.train.noise_std is not None:
            chunk = n  # per-access noise is drawn while gathering: keep the whole round's order
        uplink = ctx.edge_uplink
        momenta, centres = state.get(MOMENTUM_KEY), state.get(CENTRE_KEYS["edge"])
        if ctx.whole_rounds:
            chunk = n  # the edges' rule (or the attack) reads all of an edge's uploads at once
        parts = [slice(a, min(a + chunk, n)) for a in range(0, n, chunk)]
        losses = []
        for _ in range(opt.kappa2):
            sent_bufs = None if edge_bufs is None or self.buffers.local else edge_bufs
            message = ctx.multicast(
                "client_edge", "down", self.with_buffers(edge_models, sent_bufs), seg, ids
            )
            if len(late):  # stragglers receive the edge model too; their replies never arrive
                ctx.multicast("client_edge", "down", message, late_seg, late_ids)
            down = message.rows()
            drawn = (
                None if len(parts) == 1 else ctx.sampler.steps(clients, opt.batch_size, opt.kappa1)
            )
            model_sum = torch.zeros_like(edge_models)
            buf_sum = None
            loss_sum = torch.empty(n, device=weights.device)
            for rows in parts:
                received = message.like(down[seg[rows]])
                start, recv_bufs = received["model"], received.get("buffers")
                bufs = self.buffers.start(state, clients[rows], recv_bufs)
                params, loss_sum[rows], _ = ctx.local_sgd(
                    start,
                    clients[rows],
                    LocalWork(opt.lr, opt.batch_size, opt.kappa1),
                    buffers=bufs,
                    drawn=None if drawn is None else drawn[:, rows],
                )
                params = uplink.accumulate(params, start, momenta, clients[rows])
                params = uplink.forge(params, ids[rows], start)
                up = ctx.send("client_edge", "up", self.with_buffers(params, bufs), ids[rows])
                params, bufs = up["model"], up.get("buffers")
                w = weights[rows].to(dtype).unsqueeze(1)
                if not uplink.folds:  # (one part: the whole round)
                    sent_models = message.like(down)["model"]
                    model_sum = self.edge_aggregates(
                        uplink, params, weights, seg, sent_models, edges, centres
                    )
                else:
                    model_sum.index_add_(0, seg[rows], params * w)
                if bufs is not None:  # uploaded in both modes: the global model is evaluated
                    self.buffers.keep(state, clients[rows], bufs)  # with them
                    if buf_sum is None:
                        buf_sum = torch.zeros(
                            num_edges, bufs.shape[1], dtype=dtype, device=w.device
                        )
                    buf_sum.index_add_(0, seg[rows], bufs * w)
            edge_models = model_sum if not uplink.folds else model_sum / totals.unsqueeze(1)
            if buf_sum is not None:
                edge_bufs = buf_sum / totals.unsqueeze(1)
            losses.append(loss_sum)
        per_edge = {"model": edge_models}
        if edge_bufs is not None:
            per_edge["buffers"] = edge_bufs
        return Update(per_edge=per_edge, losses=torch.stack(losses))

    def edge_aggregates(
        self,
        uplink: Uplink,
        params: torch.Tensor,
        weights: torch.Tensor,
        seg: torch.Tensor,
        sent: torch.Tensor,
        edges: torch.Tensor,
        centres: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Each edge's ``uplink`` (robust rule, DP) over its clients' uploads ``params [n, P]`` with
        their ``weights`` (``seg``: each row's position in ``edges``), from the model it sent
        them (``sent [E', P]``); a centred rule (``cclip``) from each edge's previous aggregate
        update, its row of ``centres [E, P]``, which is then replaced by this one's."""
        ctx = self.ctx
        out = torch.empty_like(sent)
        sizes = torch.bincount(ctx.topology.edge_of_client.cpu(), minlength=ctx.topology.num_edges)
        for e, edge in enumerate(edges.tolist()):
            mine = seg == e
            centre = None if centres is None else centres[edge]
            out[e] = uplink.aggregate(
                params[mine], weights[mine], sent[e], int(sizes[edge]), centre
            )
            if centres is not None:
                centres[edge] = out[e] - sent[e]
        return out

    def aggregate(self, state: State, task: Task, update: Update) -> dict[str, float]:
        ctx, opt = self.ctx, self.options
        edges = task.edges
        assert edges is not None and update.losses is not None
        edge_bufs = update.per_edge.get("buffers")
        message = self.with_buffers(update.per_edge["model"], edge_bufs)
        up = ctx.send("edge_cloud", "up", message, edges)
        edge_models, edge_bufs = up["model"], up.get("buffers")
        weights = ctx.edge_weights(edges)
        start, centre = state["global"], state.get(CENTRE_KEYS["cloud"])
        state["global"] = ctx.cloud_uplink.aggregate(edge_models, weights, start, centre=centre)
        if centre is not None:  # the next round's centre: this aggregate's update
            state[CENTRE_KEYS["cloud"]] = state["global"] - start
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
    client_momentum: float = client_momentum_field()

    hierarchical = True
    supports_buffers = True
    uploads = {"edge": "model", "cloud": "model"}
    keeps_centres = frozenset({"edge", "cloud"})

    def gradient_evaluations(self) -> int:
        return self.kappa1 * self.kappa2

    def unread(self, run: RunConfig) -> dict[str, str]:
        """``local_steps``: kappa1 and kappa2 set the local work."""
        return {"local_steps": derived_steps("hierfavg", "kappa1", "kappa2")}

    def privacy_releases(self) -> int:
        """DP at the edges: each of the kappa2 edge aggregations is sent back to the clients."""
        return self.kappa2

    def build(self, ctx: RunContext) -> Algorithm:
        return HierFAVG(self, ctx)
