"""HeteroFL (Diao, Ding, Tarokh, ICLR 2021): every client trains the sub-model its device can
afford — the first max(1, round(z·J)) units of each hidden layer for capability z (ordered,
nested sub-models) — and the cloud averages each parameter entry over the clients holding it.

Per round, for each selected client k of capability z_k (FedLPS's levels and cost model,
:mod:`fedhp.algorithms.device_cost`; ``capabilities``: drawn once or every round):

* it receives the sub-model ω^r ⊙ h_k, where h_k holds the kept units' weight rows, biases and
  BatchNorm entries and, in the next layer, only the columns of kept inputs
  (:func:`fedhp.models.masks.held_entries`); the output layer keeps every class;
* it trains it with the local budget (masked SGD: entries outside h_k stay zero) and sends it up;
* the cloud sets every entry to the (uniform or sample-weighted) mean over the clients that hold
  it; an entry nobody held this round keeps its value (:func:`held_mean`).

The personalized model of a client is its last trained sub-model (the initial model before it
first trains), evaluated on its own test data — FedLPS's protocol for every baseline.
Deviations from the HeteroFL paper: no "scaler" (outputs are not divided by z while training),
no masked classifier for label-skewed clients, and round(z·J) rather than ceil(z·J) units.
Training FLOPs count what the physically pruned sub-model computes
(:func:`fedhp.models.masks.masked_flops`). FedRolex (:mod:`fedhp.algorithms.fedrolex`) differs
only in which units a sub-model holds.
"""

from __future__ import annotations

import torch

from fedhp.algorithms.base import Algorithm, State
from fedhp.algorithms.device_cost import DrawnCapabilities, SizedCostModel, cost_state
from fedhp.algorithms.options import ALGORITHMS, LocalWorkOptions
from fedhp.algorithms.task import Task, Update
from fedhp.engine.context import RunContext
from fedhp.models.masks import (
    held_entries,
    masked_flops,
    param_mask,
    require_hidden_units,
    window_unit_mask,
)


def held_mean(
    previous: torch.Tensor, params: torch.Tensor, held: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """Entry-wise weighted mean over the clients holding each entry (HeteroFL's aggregation):
    ``sum_c w_c h_c x_c / sum_c w_c h_c`` for ``params``, ``held [C, P]`` (0/1), ``weights [C]``;
    an entry nobody holds keeps its ``previous [P]`` value."""
    w = weights.to(params.dtype).unsqueeze(1) * held.to(params.dtype)
    total = w.sum(0)
    mean = (w * params).sum(0) / total.clamp(min=torch.finfo(params.dtype).tiny)
    return torch.where(total > 0, mean, previous)


class HeteroFL(Algorithm):
    """Capability-sized nested sub-models, aggregated entry by entry over their holders."""

    options: HeteroFLOptions

    def __init__(self, options: HeteroFLOptions, ctx: RunContext) -> None:
        name = type(self).__name__.lower()
        require_hidden_units(ctx.model, name, "sizes sub-models by shrinking hidden layers")
        super().__init__(options, ctx)
        self.sizes = SizedCostModel(ctx)  # FedLPS's device model: z sizes the sub-models

    def window_offset(self, rnd: int) -> int:
        """Where each layer's kept units start in round ``rnd`` (HeteroFL: always unit 0)."""
        return 0

    def held(self, ratio: torch.Tensor, offset: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The kept units ``[C, U]`` and the held entries ``[C, P]`` of sub-models of ``ratio``."""
        model = self.ctx.model
        units = window_unit_mask(model, ratio, offset)
        return units, held_entries(model, param_mask(model, units, structural=True))

    def init_state(self, init_params: torch.Tensor) -> State:
        ctx = self.ctx
        return {
            "global": init_params.clone(),
            "capability": self.sizes.initial(init_params.device),
            "personal": init_params.expand(ctx.num_clients, -1).clone(),
            **cost_state(),
        }

    def plan(self, state: State, rnd: int) -> Task:
        ctx, opt = self.ctx, self.options
        self.sizes.redraw(state, rnd, opt.capabilities)
        clients = ctx.participation.sample_clients()
        caps = state["capability"][clients].cpu().double()
        offset = self.window_offset(rnd)
        _, held = self.held(caps, offset)
        sub = state["global"] * held.to(state["global"].device)
        start = ctx.send("client_cloud", "down", sub, clients)
        return Task(
            clients,
            per_client={
                "start": start,
                "capability": caps,
                "offset": torch.full((len(clients),), offset, dtype=torch.int64),
            },
        )

    def train(self, state: State, task: Task) -> Update:
        clients = task.clients
        caps = task.per_client["capability"]
        _, held = self.held(caps, int(task.per_client["offset"][0]) if len(clients) else 0)
        held = held.to(task.per_client["start"].device)
        params, loss_sum, steps = self.ctx.local_sgd(
            task.per_client["start"], clients, self.options.work(), mask=held
        )
        state["personal"][clients] = params
        return Update(per_client={"model": params}, losses=loss_sum.unsqueeze(0), steps=steps)

    def aggregate(self, state: State, task: Task, update: Update) -> dict[str, float]:
        ctx, opt = self.ctx, self.options
        clients = task.clients
        caps = task.per_client["capability"]
        units, held = self.held(caps, int(task.per_client["offset"][0]) if len(clients) else 0)
        params = ctx.send("client_cloud", "up", update.per_client["model"], clients)
        held = held.to(params.device)
        weights, w = ctx.client_weights(clients), state["global"]  # the uplink (uploads: own)
        state["global"] = ctx.cloud_uplink.aggregate(
            params, weights, w, combine=lambda rows, p: held_mean(w, rows, held, p)
        )
        size = 4.0 * held.sum(1).double().cpu()  # the sub-model, both ways
        fwd = masked_flops(ctx.model, units, structural=True).double()
        flops = 3.0 * fwd * opt.sample_counts(ctx.fed.train.counts[clients])
        _, cost = self.sizes.account(state, flops, caps, size, size)
        stats = self.local_work_stats(task, update)
        stats.update(cost, mean_keep_ratio=float(caps.mean()))
        return stats

    def personal_models(self, state: State) -> torch.Tensor | None:
        return state["personal"]


@ALGORITHMS.register("heterofl")
class HeteroFLOptions(LocalWorkOptions):
    """HeteroFL: ordered sub-models of width s = z per client (FedLPS's capability levels),
    entry-wise averaging over the holders (docs/fedlps.md)."""

    lr: float = 0.1
    capabilities: DrawnCapabilities = "dyn"

    client_outputs = ("model",)
    node_keys = {"personal": "client"}
    personal_on_node = True
    algorithm_class = HeteroFL
