"""Fed-HT, FedIter-HT (Tong et al., "Federated Nonconvex Sparse Learning") and Distributed-IHT.

From x₀ = 0, each round every client (or a ``client_fraction`` sample) runs K SGD steps of
constant size γ from the global model and sends its K-th iterate; the cloud keeps
``x_{t+1} = H_τ(Σ_i p_i x_i)``. Fed-HT's local steps are plain SGD (dense uplink); FedIter-HT
thresholds after EVERY local step, ``x ← H_τ(x − γ∇f_I(x))`` (τ-sparse uplink). Distributed-IHT
is Fed-HT with one local step. H_τ is per class column for softmax (``sparsity_groups``).
"""

from __future__ import annotations

from typing import Literal

import pydantic
import torch

from fedhp.algorithms.base import ALGORITHMS, Algorithm, AlgorithmOptions, State, Task, Update
from fedhp.engine.context import RunContext
from fedhp.engine.objective import client_smoothness
from fedhp.engine.ops import hard_threshold


class FedHT(Algorithm):
    """Fed-HT: dense local SGD, the cloud thresholds the average."""

    options: FedHTOptions
    client_outputs = ("params",)

    def __init__(self, options: FedHTOptions, ctx: RunContext) -> None:
        super().__init__(options, ctx)
        if options.lr == "auto":  # Thm 3.1 / 4.1: γ = 1/(6 l), l the clients' largest smoothness
            self.gamma = 1.0 / (6.0 * float(client_smoothness(ctx.model, ctx.fed).max()))
        else:
            self.gamma = float(options.lr)

    def threshold(self, params: torch.Tensor) -> torch.Tensor:
        """H_τ of every row (per class column where the model has several)."""
        return hard_threshold(params, self.options.tau, self.ctx.model.sparsity_groups)

    def init_state(self, init_params: torch.Tensor) -> State:
        return {"global": torch.zeros_like(init_params)}  # x₀ = 0

    def plan(self, state: State, rnd: int) -> Task:
        return self.plan_broadcast_global(state)

    def local_steps(
        self, params: torch.Tensor, clients: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """K minibatch SGD steps of step size γ; returns the K-th iterates and summed losses."""
        opt = self.options
        return self.ctx.local_sgd(params, clients, opt.local_steps, opt.batch_size, self.gamma)

    def train(self, state: State, task: Task) -> Update:
        start = task.broadcast["global"].expand(len(task.clients), -1)
        params, loss_sum = self.local_steps(start, task.clients)
        return Update(per_client={"params": params}, losses=loss_sum.unsqueeze(0))

    def extra_metrics(self, state: State) -> dict[str, float]:
        return {"gamma": self.gamma}

    def aggregate(self, state: State, task: Task, update: Update) -> dict[str, float]:
        ctx = self.ctx
        start, clients = task.broadcast["global"], task.clients
        params = ctx.upload(update.per_client["params"], clients, start)
        ctx.ledger.record("client_cloud", "up", params, ctx.zero_threshold, nodes=clients)
        state["global"] = self.threshold(ctx.cloud_mean(params, ctx.client_weights(clients), start))
        assert update.losses is not None
        return {"local_loss": float(update.losses[0].mean()) / self.options.local_steps}


class FedIterHT(FedHT):
    """FedIter-HT: every local SGD step is followed by H_τ on the client."""

    def local_steps(
        self, params: torch.Tensor, clients: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        opt = self.options
        loss_sum = torch.zeros(len(clients), device=params.device)
        for _ in range(opt.local_steps):
            params, loss = self.ctx.local_sgd(params, clients, 1, opt.batch_size, self.gamma)
            params = self.threshold(params)
            loss_sum += loss
        return params, loss_sum


@ALGORITHMS.register("fedht")
class FedHTOptions(AlgorithmOptions):
    """Fed-HT: K = ``local_steps`` SGD steps of constant ``lr`` (γ); the cloud keeps H_τ(mean)."""

    lr: float | Literal["auto"] = pydantic.Field(  # type: ignore[assignment]
        1e-3, description="constant local step size γ > 0, or auto: 1/(6·max_i l_i) (Thm 3.1)"
    )
    batch_size: int = pydantic.Field(32, gt=0)
    local_steps: int = pydantic.Field(5, gt=0, description="K local steps per round")
    tau: int = pydantic.Field(200, gt=0, description="sparsity τ (per class column for softmax)")

    @pydantic.field_validator("lr")
    @classmethod
    def _positive(cls, value: float | str) -> float | str:
        if not isinstance(value, str) and value <= 0:
            raise ValueError("must be > 0 or 'auto'")
        return value

    robust_levels = frozenset({"cloud"})
    attack_ready = True

    def build(self, ctx: RunContext) -> Algorithm:
        return FedHT(self, ctx)


@ALGORITHMS.register("fediterht")
class FedIterHTOptions(FedHTOptions):
    """FedIter-HT: H_τ after every local step (τ-sparse uplink) and at the cloud."""

    def build(self, ctx: RunContext) -> Algorithm:
        return FedIterHT(self, ctx)


@ALGORITHMS.register("diht")
class DIHTOptions(FedHTOptions):
    """Distributed-IHT: Fed-HT with one local step per round (not FedIter-HT with one step)."""

    local_steps: int = pydantic.Field(1, ge=1, le=1, description="always 1")
