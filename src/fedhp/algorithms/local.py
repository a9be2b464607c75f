"""Reference "algorithm": every client trains alone on its own data, never communicating.

The floor for personalized models: ``local_steps`` minibatch SGD steps of ``batch_size`` per client
per round (the same budget as the federated methods), no aggregation, no global model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch

from fedhp.algorithms.base import Algorithm, RowKind, State
from fedhp.algorithms.buffers import BufferPolicy
from fedhp.algorithms.options import ALGORITHMS, LocalWorkOptions
from fedhp.algorithms.task import Task, Update

if TYPE_CHECKING:
    from fedhp.config import RunConfig


class LocalOnly(Algorithm):
    """Independent local SGD per client; the personalized models are the clients' own models."""

    options: LocalOptions

    def buffer_policy(self) -> BufferPolicy:  # the clients' own, in either mode; no global model
        return BufferPolicy.of_run(self.ctx, "local", own_key="theta_buffers", shared=False)

    def init_state(self, init_params: torch.Tensor) -> State:
        p = init_params.to(self.ctx.device)
        state = {"theta": p.expand(self.ctx.num_clients, -1).clone()}
        return {**state, **self.buffers.init_state(self.ctx.device)}

    def plan(self, state: State, rnd: int) -> Task:
        return Task(self.ctx.all_clients)

    def train(self, state: State, task: Task) -> Update:
        clients = task.clients
        bufs = self.buffers.start(state, clients, None)
        params, loss_sum, steps = self.ctx.local_sgd(
            state["theta"][clients], clients, self.options.work(), buffers=bufs
        )
        state["theta"][clients] = params  # kept as the clients' own, with their statistics
        self.buffers.keep(state, clients, bufs)
        return Update(losses=loss_sum.unsqueeze(0), steps=steps)

    def aggregate(self, state: State, task: Task, update: Update) -> dict[str, float]:
        return self.local_work_stats(task, update)

    def global_model(self, state: State) -> torch.Tensor | None:
        return None

    def personal_models(self, state: State) -> torch.Tensor | None:
        return state["theta"]

    def personal_buffers(self, state: State) -> torch.Tensor | None:
        return self.buffers.own(state)


@ALGORITHMS.register("local")
class LocalOptions(LocalWorkOptions):
    """Local-only reference: each client trains alone on its own data (PM floor, no communication).

    ``local_steps`` SGD steps (or ``local_epochs`` epochs) of ``batch_size`` per client per round,
    as the federated methods. BatchNorm statistics are always the client's own (``buffers`` has no
    effect)."""

    supports_buffers = True
    node_keys: ClassVar[dict[str, RowKind]] = {"theta": "client"}
    personal_on_node = True

    def unread(self, run: RunConfig) -> dict[str, str]:
        """``buffers``: nothing is averaged, BatchNorm statistics stay each client's."""
        out = super().unread(run)
        out["buffers"] = (
            "local averages nothing, so BatchNorm statistics stay each client's; drop it"
        )
        return out

    algorithm_class = LocalOnly
