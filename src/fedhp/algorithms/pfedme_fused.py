"""pFedMe's fused round (the fast path of :class:`~fedhp.algorithms.pfedme.PFedMe`): the R
local rounds in place on two ``[C, P]`` buffers, computing exactly what the readable
:meth:`~fedhp.algorithms.pfedme.PFedMe.reference_train` computes (``tests/algorithms/
test_pfedme.py`` compares them bit for bit)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from fedhp.algorithms.base import State
from fedhp.algorithms.stacked_theta import model_steps
from fedhp.algorithms.task import Task, Update
from fedhp.engine.ops import batched_loss_grad

if TYPE_CHECKING:
    from fedhp.algorithms.pfedme import PFedMe


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
