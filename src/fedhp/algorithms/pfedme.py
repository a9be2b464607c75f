"""pFedMe (Dinh, Tran, Nguyen, NeurIPS 2020): personalized FL with Moreau envelopes (flat).

Per local round each client draws ONE minibatch and takes ``K`` steps
``theta <- theta - plr (grad f(theta; D) + lam (theta - w_loc) [+ l2 theta])``, then
``w_loc <- w_loc - lr lam (w_loc - theta)``; ``w_loc`` and, by default (``theta_init=round``, as
the reference code's ``set_parameters``), ``theta`` start from the received global model every
global round, ``theta`` staying warm across that round's local rounds. After ``R`` local rounds
the cloud sets ``w <- (1 - beta) w + beta mean(w_loc)`` over the sampled clients. The personalized
model is ``theta`` (the reference code's reported "personalized" accuracy evaluates ``w_loc``; we
do not).

:meth:`PFedMe.reference_train` writes the local rounds out formula by formula; the runs take the
fused round of :mod:`fedhp.algorithms.pfedme_fused` (the same values, bit for bit, in place and in
cache-sized parts of the clients; :attr:`PFedMe.fused` picks).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, ClassVar, cast

import pydantic
import torch

from fedhp.algorithms.base import Algorithm, RowKind, State
from fedhp.algorithms.fused import send_rows
from fedhp.algorithms.options import (
    ALGORITHMS,
    AlgorithmOptions,
    ThetaInit,
    derived_steps,
    theta_init_field,
)
from fedhp.algorithms.pfedme_fused import fused_train
from fedhp.algorithms.pfedme_stacked import stack_key, stacked_train
from fedhp.algorithms.task import Task, Update
from fedhp.engine.context import RunContext
from fedhp.engine.ops import batched_loss_grad, mean_group_loss

if TYPE_CHECKING:
    from fedhp.config import RunConfig


class PFedMe(Algorithm):
    """pFedMe; global model ``w``, personalized models ``theta``."""

    options: PFedMeOptions

    def init_state(self, init_params: torch.Tensor) -> State:
        p = init_params.to(self.ctx.device)
        return {"global": p.clone(), "theta": p.expand(self.ctx.num_clients, -1).clone()}

    def plan(self, state: State, rnd: int) -> Task:
        return self.plan_broadcast_global(state)

    fused = True  # train: the fused round (pfedme_fused); False: reference_train

    def train(self, state: State, task: Task) -> Update:
        """The R local rounds of the task's clients."""
        return fused_train(self, state, task) if self.fused else self.reference_train(state, task)

    def stack_key(self, state: State, task: Task) -> Hashable | None:
        """Runs as rows: :func:`fedhp.algorithms.pfedme_stacked.stack_key`."""
        return stack_key(self, state, task)

    @staticmethod
    def stacked_train(items: Sequence[tuple[Algorithm, State, Task]]) -> list[Update]:
        """S runs' rounds as one (:mod:`fedhp.algorithms.pfedme_stacked`)."""
        return stacked_train([(cast(PFedMe, a), s, t) for a, s, t in items])

    def reference_train(self, state: State, task: Task) -> Update:
        """The local rounds as the module docstring writes them, one tensor per formula."""
        ctx, opt = self.ctx, self.options
        clients = task.clients
        received = task.broadcast["global"].expand(len(clients), -1)
        local = received.clone()  # w_loc <- w
        theta = state["theta"][clients].clone() if opt.theta_init == "warm" else received.clone()
        draw = ctx.batches(clients, opt.batch_size)
        losses = []
        for _ in range(opt.R):
            if opt.theta_init == "reset":
                theta = received.clone()
            x, y = draw()  # ONE minibatch per local round
            for _ in range(opt.K):  # theta - plr (grad f + lam (theta - w_loc) [+ l2 theta])
                loss, grad = batched_loss_grad(ctx.model, theta, x, y)
                if opt.l2 > 0:
                    grad.add_(theta, alpha=opt.l2)
                theta.lerp_(local, opt.personal_lr * opt.lam).add_(grad, alpha=-opt.personal_lr)
            losses.append(loss)
            local.lerp_(theta, opt.lr * opt.lam)  # w_loc - lr lam (w_loc - theta)
        state["theta"][clients] = theta
        return Update(per_client={"local": local}, losses=torch.stack(losses))

    def aggregate(self, state: State, task: Task, update: Update) -> dict[str, float]:
        ctx, opt = self.ctx, self.options
        clients = task.clients
        assert update.losses is not None
        start = task.broadcast["global"]
        mean = ctx.cloud_uplink(
            update.per_client["local"],
            ctx.global_clients(clients),
            ctx.client_weights(clients),
            start,
            send=lambda local: send_rows(ctx, "client_cloud", "up", local, clients),
        )
        state["global"] = (1 - opt.beta) * state["global"] + opt.beta * mean
        return {"local_loss": mean_group_loss(update.losses, opt.R)}

    def personal_models(self, state: State) -> torch.Tensor | None:
        return state["theta"]

    def round_local_keys(self) -> frozenset[str]:
        """theta, where every round restarts it for every client."""
        ctx = self.ctx
        every = (
            ctx.participation.samples_every_client() and not ctx.participation.simulates_failures()
        )
        return frozenset({"theta"}) if every and self.options.theta_init != "warm" else frozenset()


@ALGORITHMS.register("pfedme")
class PFedMeOptions(AlgorithmOptions):
    """pFedMe. ``lr`` is the local-model step (eta), ``personal_lr`` the theta step.

    ``local_steps`` is unused; the gradient evaluations per round are ``R * K``."""

    penalty_weights = {"lam": "λ"}
    lam: float = pydantic.Field(15.0, gt=0, description="Moreau-envelope weight lambda")
    K: int = pydantic.Field(5, gt=0, description="theta steps per local round")
    R: int = pydantic.Field(20, gt=0, description="local rounds per global round")
    personal_lr: float = pydantic.Field(0.05, gt=0, description="theta step size")
    beta: float = pydantic.Field(1.0, gt=0, le=2, description="server mixing weight")
    l2: float = pydantic.Field(0.0, ge=0, description="the reference's hidden L2 on theta")
    theta_init: ThetaInit = theta_init_field("the global model w received this round")

    client_outputs = ("local",)
    node_keys: ClassVar[dict[str, RowKind]] = {"theta": "client"}
    personal_on_node = True
    uploads = {"cloud": "estimate"}  # local models, mixed by beta into the global one

    def gradient_evaluations(self) -> int:
        return self.R * self.K

    def unread(self, run: RunConfig) -> dict[str, str]:
        """``local_steps``: R and K set the local work."""
        return {"local_steps": derived_steps("pfedme", "K", "R")}

    def graph_steps(self) -> bool:
        """The θ subproblem's K steps (without the hidden L2) replay as one CUDA graph
        (:func:`fedhp.algorithms.pfedme_fused._pulled_steps`)."""
        return self.l2 == 0

    def build(self, ctx: RunContext) -> Algorithm:
        return PFedMe(self, ctx)
