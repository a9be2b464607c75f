"""Reference "algorithm": centralized training on the union of all clients' data.

The ceiling for the global model. No communication. The gradient budget matches the federated
methods: each of the ``local_steps`` steps per round draws ``batch_size × num_clients`` samples
uniformly (without replacement within a step) from the union of the clients' training sets, so one
round costs exactly as many per-sample gradient evaluations as ``num_clients`` clients taking
``local_steps`` minibatch steps of ``batch_size`` each (for the sFedHP tables: R·K = 100 steps of
20 × 20 = 400 samples). The union's empirical risk weights every training sample equally.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, cast

import torch

from fedhp.algorithms import centralized_stacked
from fedhp.algorithms.base import Algorithm, State
from fedhp.algorithms.buffers import BufferPolicy
from fedhp.algorithms.options import ALGORITHMS, AlgorithmOptions
from fedhp.algorithms.task import Task, Update
from fedhp.engine.context import RunContext
from fedhp.engine.ops import batched_loss_grad

if TYPE_CHECKING:
    from fedhp.config import RunConfig


class Centralized(Algorithm):
    """One model trained by minibatch SGD on the pooled training data (global model only)."""

    options: CentralizedOptions

    def init_state(self, init_params: torch.Tensor) -> State:
        p = init_params.to(self.ctx.device)
        return {"global": p.clone(), **self.buffers.init_state(p.device)}

    def buffer_policy(self) -> BufferPolicy:  # one model: the pooled batches' statistics
        return BufferPolicy.of_run(self.ctx, "average")

    def plan(self, state: State, rnd: int) -> Task:
        """No one is sampled: the round's task holds no clients (the one model trains on the
        pooled data)."""
        return Task(torch.zeros(0, dtype=torch.int64, device=self.ctx.device))

    def train(self, state: State, task: Task) -> Update:
        """The round's ``local_steps`` SGD steps on the pooled data, in place on ``state``
        (``task`` holds no clients: the round is not federated; :meth:`run_round` calls it, and a
        lockstep batch stacks it); the steps' summed loss ``[1, 1]`` (float64)."""
        ctx, opt = self.ctx, self.options
        train = ctx.fed.train
        params = state["global"].unsqueeze(0).clone()
        bufs = state["global_buffers"].unsqueeze(0).clone() if self.buffers.width else None
        indices = self.draw_indices()
        loss_total = torch.zeros((), dtype=torch.float64, device=params.device)
        for idx in indices:
            x, y = train.x[idx].unsqueeze(0), train.y[idx].unsqueeze(0)
            loss, grad = batched_loss_grad(ctx.model, params, x, y, buffers=bufs)
            params.add_(grad, alpha=-opt.lr)
            loss_total += loss[0].double()
        state["global"] = params[0]
        if bufs is not None:
            state["global_buffers"] = bufs[0]
        return Update(losses=loss_total.reshape(1, 1))

    def draw_indices(self) -> torch.Tensor:
        """The round's minibatches ``[local_steps, batch_size × num_clients]``: every step's
        indices into the pooled data drawn ahead on the host generator (the same draws in the
        same order as step by step) and moved to the device once: no host sync inside the loop."""
        ctx, opt = self.ctx, self.options
        n = int(ctx.fed.train.y.shape[0])
        batch = opt.batch_size * ctx.num_clients
        drawn = [
            torch.randperm(n, generator=ctx.generator)[:batch]
            if batch <= n
            else torch.randint(n, (batch,), generator=ctx.generator)
            for _ in range(opt.local_steps)
        ]
        return torch.stack(drawn).to(ctx.fed.train.x.device)

    def stack_key(self, state: State, task: Task) -> Hashable | None:
        """Runs as rows: :func:`fedhp.algorithms.centralized_stacked.stack_key`."""
        return centralized_stacked.stack_key(self, state, task)

    @staticmethod
    def stacked_train(items: Sequence[tuple[Algorithm, State, Task]]) -> list[Update]:
        """S runs' rounds as one (:mod:`fedhp.algorithms.centralized_stacked`)."""
        return centralized_stacked.stacked_train(
            [(cast(Centralized, a), s, t) for a, s, t in items]
        )

    def aggregate(self, state: State, task: Task, update: Update) -> dict[str, float]:
        raise NotImplementedError("centralized is not federated: nothing to aggregate")

    def run_round(self, state: State, rnd: int) -> dict[str, float]:
        """The round: :meth:`train` on the pooled data (no clients, no aggregation)."""
        update = self.trained(state, self.plan(state, rnd))
        assert update.losses is not None
        return {"local_loss": float(update.losses) / self.options.local_steps}


@ALGORITHMS.register("centralized")
class CentralizedOptions(AlgorithmOptions):
    """Centralized reference: SGD on the union of the clients' data (GM ceiling, no communication).

    Each round: ``local_steps`` steps of ``batch_size × num_clients`` samples from the union, the
    same sample-gradient budget as every client taking ``local_steps`` steps of ``batch_size``.
    One model: BatchNorm statistics are the pooled batches' (``buffers`` has no effect)."""

    supports_buffers = True
    federated = False

    def unread(self, run: RunConfig) -> dict[str, str]:
        """``buffers``: one model, whose BatchNorm statistics are the pooled batches'."""
        return {
            "buffers": "centralized trains one model, so there are no clients' BatchNorm "
            "statistics to average or keep; drop it"
        }

    def build(self, ctx: RunContext) -> Algorithm:
        return Centralized(self, ctx)
