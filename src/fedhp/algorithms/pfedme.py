"""pFedMe (Dinh, Tran, Nguyen, NeurIPS 2020): personalized FL with Moreau envelopes (flat).

Per local round each client draws ONE minibatch and takes ``K`` steps
``theta <- theta - plr (grad f(theta; D) + lam (theta - w_loc) [+ l2 theta])``, then
``w_loc <- w_loc - lr lam (w_loc - theta)``; ``w_loc`` and, by default (``theta_init=round``, as
the reference code's ``set_parameters``), ``theta`` start from the received global model every
global round, ``theta`` staying warm across that round's local rounds. After ``R`` local rounds
the cloud sets ``w <- (1 - beta) w + beta mean(w_loc)`` over the sampled clients. The personalized
model is ``theta`` (the reference code's reported "personalized" accuracy evaluates ``w_loc``; we
do not).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import pydantic
import torch

from fedhp.algorithms.base import (
    ALGORITHMS,
    Algorithm,
    AlgorithmOptions,
    RowKind,
    State,
    Task,
    ThetaInit,
    Update,
    theta_init_field,
)
from fedhp.engine.context import RunContext
from fedhp.engine.fused import send_rows
from fedhp.engine.ops import batched_loss_grad, mean_group_loss


class PFedMe(Algorithm):
    """pFedMe; global model ``w``, personalized models ``theta``."""

    options: PFedMeOptions
    client_outputs = ("local",)
    node_keys: ClassVar[dict[str, RowKind]] = {"theta": "client"}
    personal_on_node = True

    def init_state(self, init_params: torch.Tensor) -> State:
        p = init_params.to(self.ctx.device)
        return {"global": p.clone(), "theta": p.expand(self.ctx.num_clients, -1).clone()}

    def plan(self, state: State, rnd: int) -> Task:
        return self.plan_broadcast_global(state)

    def train(self, state: State, task: Task) -> Update:
        """The R local rounds in place on two ``[C, P]`` buffers (``theta``, ``w_loc``), in
        cache-sized parts of the clients: a part runs all its R local rounds before the next
        starts (its rows stay in cache), on the minibatches the whole round would draw (drawn
        ahead, so the parts do not change them); per step the prox pull towards ``w_loc`` and
        the gradient step in one pass, per local round the ``w_loc`` step; no copies and no host
        syncs inside the loop."""
        ctx, opt = self.ctx, self.options
        clients = task.clients
        n = len(clients)
        received = task.broadcast["global"].expand(n, -1)
        local = received.clone()
        # (advanced indexing already copies the state's rows)
        theta = state["theta"][clients] if opt.theta_init == "warm" else received.clone()
        chunk = ctx.policy.chunk(2 * local.shape[1], n)
        if chunk < n and ctx.fed.train.noise_std is not None:
            chunk = n  # per-access noise is drawn while gathering: keep the whole round's order
        drawn = ctx.sampler.steps(clients, opt.batch_size, opt.R) if chunk < n else None
        losses = torch.empty(opt.R, n, device=local.device)
        for a in range(0, n, chunk):
            rows = slice(a, min(a + chunk, n))
            ahead = None if drawn is None else drawn[:, rows]
            draw = ctx.batches(clients[rows], opt.batch_size, ahead)
            self._local_rounds(theta[rows], local[rows], received[rows], draw, losses[:, rows])
        state["theta"][clients] = theta
        return Update(per_client={"local": local}, losses=losses)

    def _local_rounds(
        self,
        theta: torch.Tensor,
        local: torch.Tensor,
        received: torch.Tensor,
        draw: Callable[[], tuple[torch.Tensor, torch.Tensor]],
        losses: torch.Tensor,
    ) -> None:
        """The R local rounds of some clients' rows (in place), their losses into ``losses``."""
        ctx, opt = self.ctx, self.options
        model = ctx.model
        pull, plr = opt.personal_lr * opt.lam, opt.personal_lr

        def towards_local(lo: int, hi: int) -> None:
            theta[:, lo:hi].lerp_(local[:, lo:hi], pull)

        for r in range(opt.R):
            if opt.theta_init == "reset" and r > 0:  # (round 0 starts from it already)
                theta.copy_(received)
            x, y = draw()
            for _ in range(opt.K):
                if opt.l2 == 0:  # the pull inside the model's step: one pass
                    model.count_trained(x)
                    loss = model.sgd_step(theta, x, y, plr, towards_local)
                    continue
                loss, grad = batched_loss_grad(model, theta, x, y)
                grad.add_(theta, alpha=opt.l2)
                # theta - plr (grad + lam (theta - local)), fused: no temporaries.
                theta.lerp_(local, pull).add_(grad, alpha=-plr)
            losses[r] = loss
            local.lerp_(theta, opt.lr * opt.lam)  # local - lr lam (local - theta)

    def aggregate(self, state: State, task: Task, update: Update) -> dict[str, float]:
        ctx, opt = self.ctx, self.options
        clients = task.clients
        assert update.losses is not None
        start = task.broadcast["global"]
        local = ctx.upload(update.per_client["local"], clients, start)
        local = send_rows(ctx, "client_cloud", "up", local, clients)
        mean = ctx.cloud_mean(local, ctx.client_weights(clients), start)
        state["global"] = (1 - opt.beta) * state["global"] + opt.beta * mean
        return {"local_loss": mean_group_loss(update.losses, opt.R)}

    def personal_models(self, state: State) -> torch.Tensor | None:
        return state["theta"]

    def round_local_keys(self) -> frozenset[str]:
        """theta, where every round restarts it for every client."""
        ctx = self.ctx
        every = ctx.samples_every_client() and not ctx.simulates_failures()
        return frozenset({"theta"}) if every and self.options.theta_init != "warm" else frozenset()


@ALGORITHMS.register("pfedme")
class PFedMeOptions(AlgorithmOptions):
    """pFedMe. ``lr`` is the local-model step (eta), ``personal_lr`` the theta step.

    ``local_steps`` is unused; the gradient evaluations per round are ``R * K``."""

    lam: float = pydantic.Field(15.0, gt=0, description="Moreau-envelope weight lambda")
    K: int = pydantic.Field(5, gt=0, description="theta steps per local round")
    R: int = pydantic.Field(20, gt=0, description="local rounds per global round")
    personal_lr: float = pydantic.Field(0.05, gt=0, description="theta step size")
    beta: float = pydantic.Field(1.0, gt=0, le=2, description="server mixing weight")
    l2: float = pydantic.Field(0.0, ge=0, description="the reference's hidden L2 on theta")
    theta_init: ThetaInit = theta_init_field("the global model w received this round")

    def gradient_evaluations(self) -> int:
        return self.R * self.K

    robust_levels = frozenset({"cloud"})
    attack_ready = True

    def build(self, ctx: RunContext) -> Algorithm:
        return PFedMe(self, ctx)
