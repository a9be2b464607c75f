"""Reference "algorithm": every client trains alone on its own data, never communicating.

The floor for personalized models: ``local_steps`` minibatch SGD steps of ``batch_size`` per client
per round (the same budget as the federated methods), no aggregation, no global model.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from fedhp.algorithms.base import (
    ALGORITHMS,
    Algorithm,
    LocalWorkOptions,
    RowKind,
    State,
    Task,
    Update,
)
from fedhp.engine.context import RunContext


class LocalOnly(Algorithm):
    """Independent local SGD per client; the personalized models are the clients' own models."""

    options: LocalOptions
    node_keys: ClassVar[dict[str, RowKind]] = {"theta": "client"}
    personal_on_node = True

    def init_state(self, init_params: torch.Tensor) -> State:
        p = init_params.to(self.ctx.device)
        return {"theta": p.expand(self.ctx.num_clients, -1).clone()}

    def plan(self, state: State, rnd: int) -> Task:
        return Task(self.ctx.all_clients)

    def train(self, state: State, task: Task) -> Update:
        clients = task.clients
        params, loss_sum, steps = self.local_update(state["theta"][clients], clients)
        state["theta"][clients] = params
        return Update(losses=loss_sum.unsqueeze(0), steps=steps)

    def aggregate(self, state: State, task: Task, update: Update) -> dict[str, float]:
        return self.local_work_stats(task, update)

    def global_model(self, state: State) -> torch.Tensor | None:
        return None

    def personal_models(self, state: State) -> torch.Tensor | None:
        return state["theta"]


@ALGORITHMS.register("local")
class LocalOptions(LocalWorkOptions):
    """Local-only reference: each client trains alone on its own data (PM floor, no communication).

    ``local_steps`` SGD steps (or ``local_epochs`` epochs) of ``batch_size`` per client per round,
    as the federated methods."""

    def build(self, ctx: RunContext) -> Algorithm:
        return LocalOnly(self, ctx)
