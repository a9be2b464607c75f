"""pFedMe's local rounds written out formula by formula (as the module docstring of
:mod:`fedhp.algorithms.pfedme` writes them, one tensor per formula): the readable reference the
fused round that runs (:meth:`~fedhp.algorithms.pfedme.PFedMe.train`) is checked against, bit for
bit (``tests/algorithms/test_pfedme.py``)."""

from __future__ import annotations

import torch

from fedhp.algorithms.base import State
from fedhp.algorithms.pfedme import PFedMe
from fedhp.algorithms.task import Task, Update
from fedhp.engine.ops import batched_loss_grad


def reference_train(self: PFedMe, state: State, task: Task) -> Update:
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
