"""pFedMe (Dinh, Tran, Nguyen, NeurIPS 2020): personalized FL with Moreau envelopes (flat).

Per local round each client draws ONE minibatch and takes ``K`` steps
``theta <- theta - plr (grad f(theta; D) + lam (theta - w_loc) [+ l2 theta])``, then
``w_loc <- w_loc - lr lam (w_loc - theta)``; ``w_loc`` and, by default (``theta_init=round``, as
the reference code's ``set_parameters``), ``theta`` start from the received global model every
global round, ``theta`` staying warm across that round's local rounds. After ``R`` local rounds
the cloud sets ``w <- (1 - beta) w + beta mean(w_loc)`` over the sampled clients. The personalized
model is ``theta`` (the reference code's reported "personalized" accuracy evaluates ``w_loc``; we
do not).

The local rounds that run are :func:`fused_train`, below the algorithm: the values of these
formulas, bit for bit, in place and in cache-sized parts of the clients
(``tests/algorithms/pfedme_reference.py`` writes them out one tensor per formula;
``tests/algorithms/test_pfedme.py`` compares the two).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
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
from fedhp.algorithms.pfedme_stacked import stack_key, stacked_train
from fedhp.algorithms.task import Task, Update
from fedhp.engine.context import RunContext
from fedhp.engine.ops import batched_loss_grad, mean_group_loss, model_steps

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

    def train(self, state: State, task: Task) -> Update:
        """The R local rounds of the task's clients: :func:`fused_train`."""
        return fused_train(self, state, task)

    def stack_key(self, state: State, task: Task) -> Hashable | None:
        """Runs as rows: :func:`fedhp.algorithms.pfedme_stacked.stack_key`."""
        return stack_key(self, state, task)

    @staticmethod
    def stacked_train(items: Sequence[tuple[Algorithm, State, Task]]) -> list[Update]:
        """S runs' rounds as one (:mod:`fedhp.algorithms.pfedme_stacked`)."""
        return stacked_train([(cast(PFedMe, a), s, t) for a, s, t in items])

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


# ---------------------------------------------------------------- the local rounds, fused
# The R local rounds as the runs take them: the formulas of the module docstring, bit for bit
# (tests/algorithms/pfedme_reference.py writes them one tensor per formula), in place and in
# cache-sized parts of the clients.


def fused_train(algo: PFedMe, state: State, task: Task) -> Update:
    """The R local rounds in place on two ``[C, P]`` buffers (``theta``, ``w_loc``), in
    cache-sized parts of the clients: a part runs all its R local rounds before the next
    starts (its rows stay in cache), on the minibatches the whole round would draw (drawn
    ahead, so the parts do not change them); per step the prox pull towards ``w_loc`` and
    the gradient step in one pass, per local round the ``w_loc`` step; no copies and no host
    syncs inside the loop."""
    ctx, opt = algo.ctx, algo.options
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
        _local_rounds(algo, theta[rows], local[rows], received[rows], draw, losses[:, rows])
    state["theta"][clients] = theta
    return Update(per_client={"local": local}, losses=losses)


def _local_rounds(
    algo: PFedMe,
    theta: torch.Tensor,
    local: torch.Tensor,
    received: torch.Tensor,
    draw: Callable[[], tuple[torch.Tensor, torch.Tensor]],
    losses: torch.Tensor,
) -> None:
    """The R local rounds of some clients' rows (in place), their losses into ``losses``."""
    ctx, opt = algo.ctx, algo.options
    model = ctx.model
    pull, plr = opt.personal_lr * opt.lam, opt.personal_lr
    for r in range(opt.R):
        if opt.theta_init == "reset" and r > 0:  # (round 0 starts from it already)
            theta.copy_(received)
        x, y = draw()
        if opt.l2 == 0:  # the pull inside the model's step: one pass
            losses[r] = _pulled_steps(algo, theta, local, x, y)
            local.lerp_(theta, opt.lr * opt.lam)  # local - lr lam (local - theta)
            continue
        for _ in range(opt.K):
            loss, grad = batched_loss_grad(model, theta, x, y)
            grad.add_(theta, alpha=opt.l2)
            # theta - plr (grad + lam (theta - local)), fused: no temporaries.
            theta.lerp_(local, pull).add_(grad, alpha=-plr)
        losses[r] = loss
        local.lerp_(theta, opt.lr * opt.lam)  # local - lr lam (local - theta)


def _pulled_steps(
    algo: PFedMe, theta: torch.Tensor, local: torch.Tensor, x: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    """K steps of θ on ``(x, y)`` in place, each the model's ``sgd_step`` with the pull
    ``theta <- lerp(theta, local, personal_lr lam)`` applied to each layer's columns inside it;
    the data loss at the last step's start point. Replayed as one CUDA graph per shape where the
    run asks for graphs (``engine.cuda_graphs``)."""
    opt, ctx = algo.options, algo.ctx
    for _ in range(opt.K):
        ctx.model.count_trained(x)  # (a Python counter: kept outside the graph)
    pull, steps = opt.personal_lr * opt.lam, (opt.K, opt.personal_lr)

    def kernels(
        theta: torch.Tensor, local: torch.Tensor, x: torch.Tensor, y: torch.Tensor
    ) -> torch.Tensor:
        def towards_local(lo: int, hi: int) -> None:
            theta[:, lo:hi].lerp_(local[:, lo:hi], pull)

        return model_steps(ctx.model, theta, x, y, steps, towards_local)

    key = ("pfedme θ steps", *steps, pull)
    loss = ctx.graphs.run(key, kernels, (theta, local, x, y), writes=(0,))
    assert loss is not None
    return loss


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
        (:func:`fedhp.algorithms.pfedme._pulled_steps`)."""
        return self.l2 == 0

    def build(self, ctx: RunContext) -> Algorithm:
        return PFedMe(self, ctx)
