"""sFedHP's round below the cloud written out formula by formula (Algorithm 1 of the paper, as
the module docstring of :mod:`fedhp.algorithms.sfedhp` writes it): the readable reference the
fused round that runs (:meth:`~fedhp.algorithms.sfedhp.SFedHP.train`) is checked against, bit for
bit (``tests/algorithms/test_sfedhp.py``). It has no attacks or robust edge rules."""

from __future__ import annotations

import torch

from fedhp.algorithms.base import State
from fedhp.algorithms.penalties import smooth_l1_grad, truncate
from fedhp.algorithms.sfedhp import SFedHP
from fedhp.algorithms.task import Task, Update
from fedhp.engine.ops import batched_loss_grad, segment_mean


def reference_train(self: SFedHP, state: State, task: Task) -> Update:
    """Algorithm 1 below the cloud, as the module docstring writes it: one tensor per formula,
    each edge's rows gathered per client, every message batch billed as it is sent."""
    ctx, opt = self.ctx, self.options
    eps, lam1, lam2, lr = ctx.zero_threshold, opt.lam1_value, opt.lam2_value, opt.lr
    gamma1, gamma2 = task.scalars["gamma1"], task.scalars["gamma2"]
    clients, edges, agg = task.clients, task.edges, task.up_edges
    assert edges is not None and agg is not None
    seg = ctx.edge_positions(clients, edges)  # each client's edge (position in edges)
    ids = ctx.global_clients(clients)
    stragglers = task.stragglers if task.stragglers is not None else clients[:0]
    recv_seg = torch.cat((seg, ctx.edge_positions(stragglers, edges)))  # who receives
    recv_ids = torch.cat((ids, ctx.global_clients(stragglers)))
    weights = ctx.client_weights(clients)
    w_edge = task.broadcast["global"].expand(len(edges), -1).clone()  # w_i = w
    phi_edge = w_edge.clone()  # phi_i = w
    theta = state["theta"][clients]
    draw = ctx.batches(clients, opt.batch_size)
    losses = []
    for r in range(opt.R):
        # edges -> clients: phi_i and w_i, truncated
        phi_sent = ctx.multicast("client_edge", "down", phi_edge, recv_seg, recv_ids)
        w_sent = ctx.multicast("client_edge", "down", w_edge, recv_seg, recv_ids)
        phi_recv, w_recv = phi_sent[seg], w_sent[seg]
        if opt.theta_init == "reset" or (opt.theta_init == "round" and r == 0):
            theta = phi_recv.clone()
        # K steps on l(theta; D) + gamma1 phi_rho(theta) + lam1/2 ||theta - phi_i||^2
        x, y = draw()
        theta = theta.clone()
        velocity = torch.zeros_like(theta) if opt.inner == "nesterov" else None
        for _ in range(opt.K):
            loss, grad = batched_loss_grad(ctx.model, theta, x, y)
            if gamma1 > 0:
                grad.add_(smooth_l1_grad(theta, opt.rho), alpha=gamma1)
            if velocity is None:  # theta - lr (grad + lam1 (theta - phi_i))
                theta.lerp_(phi_recv, lr * lam1).add_(grad, alpha=-lr)
            else:  # PyTorch's Nesterov SGD, momentum reset every local round
                grad.add_(theta - phi_recv, alpha=lam1)
                velocity.mul_(opt.momentum).add_(grad)
                theta.add_(grad.add(velocity, alpha=opt.momentum), alpha=-lr)
        losses.append(loss)
        # clients -> edges: phi_ij = (lam1 theta + lam2 w_i) / (lam1 + lam2), truncated
        phi_local = truncate(torch.lerp(w_recv, theta, lam1 / (lam1 + lam2)), eps)
        ctx.ledger.record("client_edge", "up", phi_local, eps, nodes=ids)
        # the edge: phi_i = the weighted mean of its phi_ij, then
        # w_i <- w_i - eta1 [lam2 (w_i - phi_i) + gamma2 tanh(w_i / rho)]
        phi_edge = segment_mean(phi_local, seg, weights, len(edges))
        step = (w_edge - phi_edge).mul_(lam2)
        if gamma2 > 0:
            step.add_(smooth_l1_grad(w_edge, opt.rho), alpha=gamma2)
        w_edge = w_edge.sub(step, alpha=opt.edge_lr)
    state["theta"][clients] = theta
    state["edge"][edges] = w_edge
    sent_up = truncate(w_edge[torch.searchsorted(edges, agg)], eps)  # edges -> cloud: w_i
    return Update(per_edge={"w": sent_up}, losses=torch.stack(losses))
