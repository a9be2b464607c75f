"""HierFAVG (Liu et al., ICC 2020): client–edge–cloud FedAvg.

The cloud holds the global model w. A round samples edges; every client under them trains (a
straggler only receives). Each edge ℓ starts from w_ℓ = w and runs κ2 edge rounds: it sends w_ℓ
to its clients, each client i takes κ1 SGD steps from it to y_i and uploads y_i, and the edge sets

    w_ℓ ← Σ_{i∈ℓ} p_i y_i / Σ_{i∈ℓ} p_i                                        (edge_mean)

then the edges upload their w_ℓ and the cloud sets

    w ← Σ_ℓ q_ℓ w_ℓ / Σ_ℓ q_ℓ                                                  (cloud_mean)

p_i the clients' weights, q_ℓ the edges' (their samples, or 1); each mean runs in its level's
uplink (a robust rule or DP, where set, in its place), BatchNorm statistics are averaged alike.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, cast

import pydantic
import torch
from torch import Tensor

from fedhp.algorithms.base import ALGORITHMS, Algorithm, AlgorithmOptions, State, Task, Update
from fedhp.algorithms.edge_rounds import EdgeRounds, plan_edges
from fedhp.algorithms.options import client_momentum_field, derived_steps
from fedhp.engine.context import RunContext
from fedhp.engine.local_rows import lone_part
from fedhp.engine.ops import LocalWork, segment_mean, weighted_mean
from fedhp.engine.run_rows import rows_key
from fedhp.engine.uplink import foldable, level_aggregate

if TYPE_CHECKING:
    from fedhp.config import RunConfig


@foldable
def edge_mean(uploads: Tensor, weights: Tensor) -> Tensor:
    """An edge's model: its clients' uploads ``[n, P]`` averaged with their weights, in order."""
    return segment_mean(uploads, torch.zeros_like(weights, dtype=torch.long), weights, 1)[0]


def cloud_mean(uploads: Tensor, weights: Tensor) -> Tensor:
    """The global model ``[P]``: the edges' models ``[E, P]`` averaged with their weights."""
    return weighted_mean(uploads, weights)


def edge_rounds(items: Sequence[tuple[Algorithm, State, Task]]) -> list[Update]:
    """The κ2 edge rounds of κ1 local steps of every run of ``items`` (one ``(algorithm,
    state, task)``, or a batch's with one stack key) as one (:class:`EdgeRounds`)."""
    opt = cast(HierFAVGOptions, items[0][0].options)
    works = [LocalWork(a.options.lr, opt.batch_size, opt.kappa1) for a, _, _ in items]
    rounds = EdgeRounds(items, works, combine=edge_mean)
    return rounds.updates(torch.stack([rounds.step() for _ in range(opt.kappa2)]))


class HierFAVG(Algorithm):
    """HierFAVG; the global model is ``global``. One global round = one cloud aggregation."""

    options: HierFAVGOptions

    def init_state(self, init_params: Tensor) -> State:
        state = {"global": init_params.clone(), **self.buffers.init_state(init_params.device)}
        return {**state, **self.uplink_state(init_params)}

    def plan(self, state: State, rnd: int) -> Task:  # w down to the sampled edges
        return plan_edges(self, state)

    def train(self, state: State, task: Task) -> Update:
        """The κ2 edge rounds of κ1 local steps, each closed by :func:`edge_mean` (with a batch's
        other runs of one :meth:`round_key` as one)."""
        return self.ctx.together(edge_rounds, self.round_key(task), (self, state, task))

    def round_key(self, task: Task) -> Hashable | None:
        """What runs must share to train their rounds as one (None: this round trains alone):
        κ1, κ2, the minibatch size, the model and its execution policy, the received model's
        size, type and device, and the zero threshold; their seeds, edges, clients and lr may
        differ. A rule, DP or an attack at the edges, client momentum, BatchNorm statistics,
        minibatches drawn by the cloud or no clients: alone."""
        opt, ctx = self.options, self.ctx
        uplink = ctx.edge_uplink
        honest = ctx.attack is None and uplink.attack is None
        plain = uplink.folds and not uplink.momentum and not self.buffers.width
        plain = plain and "global_buffers" not in task.broadcast and task.batches is None
        if not (honest and plain and len(task.clients) > 0):
            return None
        if lone_part(ctx.model, ctx.model.num_params, len(task.clients)):
            return None
        steps = (opt.kappa1, opt.kappa2, opt.batch_size, ctx.policy)
        return rows_key("hierfavg", ctx, task.broadcast["global"], steps)

    def aggregate(self, state: State, task: Task, update: Update) -> dict[str, float]:
        """The edges' models up; w by the cloud's uplink (:func:`cloud_mean` without a rule)."""
        ctx, opt, edges, losses = self.ctx, self.options, task.edges, update.losses
        assert edges is not None and losses is not None
        message = self.with_buffers(update.per_edge["model"], update.per_edge.get("buffers"))
        up, weights = ctx.send("edge_cloud", "up", message, edges), ctx.edge_weights(edges)
        cloud, w = ctx.cloud_uplink, state["global"]
        state["global"] = level_aggregate(cloud, state, up["model"], weights, w, combine=cloud_mean)
        if "buffers" in up:
            state["global_buffers"] = cloud_mean(up["buffers"], weights)
        return {"local_loss": sum(float(s.mean()) / opt.kappa1 for s in losses) / opt.kappa2}


@ALGORITHMS.register("hierfavg")
class HierFAVGOptions(AlgorithmOptions):
    """HierFAVG: kappa1 local steps per edge round, kappa2 edge rounds per global round."""

    kappa1: int = pydantic.Field(5, gt=0, description="local SGD steps per edge aggregation")
    kappa2: int = pydantic.Field(4, gt=0, description="edge aggregations per cloud aggregation")
    client_momentum: float = client_momentum_field()

    hierarchical = True
    supports_buffers = True
    uploads = {"edge": "model", "cloud": "model"}
    keeps_centres = frozenset({"edge", "cloud"})
    edge_outputs = ("model",)
    edge_buffer_outputs = ("buffers",)
    bills_stragglers = True  # a straggler receives its edge's model in each of the κ2 rounds

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
