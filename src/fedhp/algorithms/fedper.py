"""FedPer (Arivazhagan et al., 2019): a shared body averaged by the cloud and a personal head
(the output layer, :func:`fedhp.models.masks.output_layer_mask`) kept by each client.

A sampled client receives the body, puts its own head on it, trains the whole model with FedAvg's
local budget, keeps the trained head and sends the body back; the cloud averages the bodies
(uniform or sample-weighted). The personalized model of client k is the current global body with
k's head, evaluated on k's test data; the heads start from the initial model's. Only the body
travels (billed at its size). BatchNorm models are not supported.
"""

from __future__ import annotations

import torch

from fedhp.algorithms.base import Algorithm, State
from fedhp.algorithms.device_cost import CapabilityMode, DenseCostModel, capabilities_field
from fedhp.algorithms.options import ALGORITHMS, LocalWorkOptions
from fedhp.algorithms.task import Task, Update
from fedhp.comm import Message
from fedhp.engine.context import RunContext
from fedhp.errors import ConfigError
from fedhp.models.masks import output_layer_mask


class FedPer(Algorithm):
    """Averaged body, per-client heads; ``capabilities: fix|dyn``: FedLPS's device model
    (:class:`DenseCostModel`)."""

    options: FedPerOptions

    def __init__(self, options: FedPerOptions, ctx: RunContext) -> None:
        super().__init__(options, ctx)
        self.cost_model = DenseCostModel(options, ctx)
        self.capability_generator = self.cost_model.generator  # (checkpointed by this name)
        head = output_layer_mask(ctx.model).to(ctx.device)
        self.head_idx = head.nonzero().flatten()
        self.body_idx = (~head).nonzero().flatten()
        if len(self.body_idx) == 0:
            raise ConfigError(
                "model: fedper needs a body below the output layer; this model is one layer "
                "(use e.g. model.name=dnn or cnn)"
            )

    def init_state(self, init_params: torch.Tensor) -> State:
        p = init_params.to(self.ctx.device)
        return {
            "global": p.clone(),
            "head": p[self.head_idx].expand(self.ctx.num_clients, -1).clone(),
            **self.cost_model.state(),
        }

    def round_samples(self, clients: torch.Tensor) -> torch.Tensor:
        return self.options.sample_counts(self.ctx.fed.train.counts[clients])

    def client_widths(self) -> dict[str, int]:
        return {"body": len(self.body_idx)}

    def row_width(self, key: str) -> int:
        return len(self.head_idx) if key == "head" else super().row_width(key)

    def downlink(self, state: State, count: int) -> Message | None:
        return Message(body=state["global"][self.body_idx].expand(count, -1))

    def received_broadcast(self, message: Message) -> dict[str, torch.Tensor]:
        return {"body": message["body"]}

    def plan(self, state: State, rnd: int) -> Task:
        self.cost_model.refresh(state, rnd)
        return self.plan_broadcast_global(state)

    def _models(self, body: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
        out = torch.empty(len(heads), self.ctx.model.num_params, device=heads.device)
        out[:, self.body_idx] = body
        out[:, self.head_idx] = heads
        return out

    def train(self, state: State, task: Task) -> Update:
        clients = task.clients
        start = self._models(task.broadcast["body"], state["head"][clients])
        params, loss_sum, steps = self.ctx.local_sgd(start, clients, self.options.work())
        state["head"][clients] = params[:, self.head_idx]
        return Update(
            per_client={"body": params[:, self.body_idx]}, losses=loss_sum.unsqueeze(0), steps=steps
        )

    def aggregate(self, state: State, task: Task, update: Update) -> dict[str, float]:
        ctx = self.ctx
        start = task.broadcast["body"]
        clients = task.clients
        state["global"][self.body_idx] = ctx.cloud_uplink(
            update.per_client["body"],
            ctx.global_clients(clients),
            ctx.client_weights(clients),
            start,
            send=lambda bodies: ctx.send("client_cloud", "up", bodies, clients),
        )
        stats = self.local_work_stats(task, update)
        stats.update(self.cost_model.account(state, task.clients, self.round_samples))
        return stats

    def personal_models(self, state: State) -> torch.Tensor | None:
        return self._models(state["global"][self.body_idx], state["head"])


@ALGORITHMS.register("fedper")
class FedPerOptions(LocalWorkOptions):
    """FedPer: averaged body, per-client head (the output layer) kept on the client."""

    capabilities: CapabilityMode = capabilities_field()

    uploads = {"cloud": "estimate"}  # the shared body
    client_outputs = ("body",)
    node_keys = {"head": "client"}
    personal_on_node = True
    personal_needs_global = True
    algorithm_class = FedPer
