"""sFedHP (sparse FL with hierarchical personalized models): Algorithm 1 of the paper,
vectorized over all clients and edges.

One global round: every participating edge starts from ``phi_i = w_i = w``; for ``R`` local rounds
each client draws ONE minibatch and takes ``K`` gradient steps on
``l(theta; D) + gamma1 phi_rho(theta) + lam1/2 ||theta - phi_i||^2``, sends
``phi_ij = (lam1 theta + lam2 w_i) / (lam1 + lam2)``; the edge averages them into ``phi_i`` and
steps ``w_i <- w_i - eta1 [lam2 (w_i - phi_i) + gamma2 tanh(w_i / rho)]``. The cloud then
averages the ``w_i`` of ``S`` sampled edges: ``w <- (1 - beta) w + beta mean_i w_i``.

Everything sent over a link is truncated at the run's zero threshold first (``|x| <= eps`` is sent
as 0) and the receiver uses the truncated values.

:meth:`SFedHP.reference_train` is this round below the cloud written out formula by formula; the
runs take the fused round of :mod:`fedhp.algorithms.sfedhp_fused` (the same values, bit for bit,
in a fraction of the time and memory; :attr:`SFedHP.fused` picks).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, ClassVar, Literal, cast

import pydantic
import torch

from fedhp.algorithms.base import Algorithm, RowKind, State
from fedhp.algorithms.options import (
    ALGORITHMS,
    AlgorithmOptions,
    ThetaInit,
    derived_steps,
    theta_init_field,
)
from fedhp.algorithms.penalties import smooth_l1_grad, truncate
from fedhp.algorithms.sfedhp_fused import fused_train
from fedhp.algorithms.sfedhp_stacked import stack_key, stacked_train
from fedhp.algorithms.task import Task, Update
from fedhp.engine.context import RunContext
from fedhp.engine.evaluate import density
from fedhp.engine.ops import batched_loss_grad, mean_group_loss, segment_mean
from fedhp.engine.uplink import CENTRE_KEYS
from fedhp.errors import ConfigError

if TYPE_CHECKING:
    from fedhp.config import RunConfig


class SFedHP(Algorithm):
    """sFedHP; the global model is ``w``, the personalized models are the clients' ``theta``."""

    options: SFedHPOptions
    fused = True  # train: the fused round (edge rules and attacks too); False: reference_train

    def init_state(self, init_params: torch.Tensor) -> State:
        opt = self.options
        c, n = self.ctx.num_clients, self.ctx.topology.num_edges
        p = init_params.to(self.ctx.device)
        return {
            "global": p.clone(),
            "theta": p.expand(c, -1).clone(),
            "edge": p.expand(n, -1).clone(),
            # Current penalty weights (0-d tensors so a checkpoint keeps the schedule's state).
            "gamma1": torch.tensor(opt.gamma1, dtype=torch.float64, device=p.device),
            "gamma2": torch.tensor(opt.gamma2, dtype=torch.float64, device=p.device),
            **self.uplink_state(p),  # a centred rule's previous aggregate updates (cclip)
        }

    def update_gammas(self, state: State, rnd: int) -> None:
        """The paper's sparse schedule: gamma1 drops to tiny (for good) once the client models'
        density is below the target; gamma2 drops to tiny from round ``gamma2_switch_round`` on."""
        opt = self.options
        if not opt.sparse_schedule:
            return
        if float(state["gamma1"]) > opt.gamma_tiny and (
            self.state_density(state, "theta") < opt.density_target
        ):
            state["gamma1"].fill_(opt.gamma_tiny)
        if rnd >= opt.gamma2_switch_round:
            state["gamma2"].fill_(min(opt.gamma_tiny, opt.gamma2))

    def plan(self, state: State, rnd: int) -> Task:
        ctx, opt = self.ctx, self.options
        self.update_gammas(state, rnd)
        agg = ctx.participation.sample_edges()
        edges = agg
        if opt.all_edges_train:
            edges = torch.arange(ctx.topology.num_edges, device=ctx.device)
        clients, _ = ctx.participation.clients_of_edges(edges)
        w = ctx.broadcast("edge_cloud", "down", state["global"], edges)
        scalars = {"gamma1": float(state["gamma1"]), "gamma2": float(state["gamma2"])}
        late = ctx.participation.stragglers_under(edges)
        return Task(clients, edges, agg, {"global": w}, scalars=scalars, stragglers=late)

    def train(self, state: State, task: Task) -> Update:
        """The R local rounds of every training edge and its clients (below the cloud)."""
        if self.fused:
            return fused_train(self, state, task)
        ctx = self.ctx
        if ctx.attack is not None or not ctx.edge_uplink.folds:
            raise ConfigError("sfedhp: the reference round has no attacks or robust edge rules")
        return self.reference_train(state, task)

    def stack_key(self, state: State, task: Task) -> Hashable | None:
        """Runs as rows: :func:`fedhp.algorithms.sfedhp_stacked.stack_key`."""
        return stack_key(self, state, task)

    @staticmethod
    def stacked_train(items: Sequence[tuple[Algorithm, State, Task]]) -> list[Update]:
        """S runs' rounds as one (:mod:`fedhp.algorithms.sfedhp_stacked`)."""
        return stacked_train([(cast(SFedHP, a), s, t) for a, s, t in items])

    def reference_train(self, state: State, task: Task) -> Update:
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

    def aggregate(self, state: State, task: Task, update: Update) -> dict[str, float]:
        ctx, opt = self.ctx, self.options
        agg, sent_up = task.up_edges, update.per_edge["w"]
        assert agg is not None and update.losses is not None
        ctx.ledger.record("edge_cloud", "up", sent_up, ctx.zero_threshold, nodes=agg)
        start, centre = state["global"], state.get(CENTRE_KEYS["cloud"])
        mean = ctx.cloud_uplink.aggregate(sent_up, ctx.edge_weights(agg), start, centre=centre)
        if centre is not None:  # the next round's centre: this aggregate's update (before beta)
            state[CENTRE_KEYS["cloud"]] = mean - start
        state["global"] = (1 - opt.beta) * start + opt.beta * mean
        return {"local_loss": mean_group_loss(update.losses, opt.R)}

    def personal_models(self, state: State) -> torch.Tensor | None:
        return state["theta"]

    def round_local_keys(self) -> frozenset[str]:
        """theta, where every round restarts it for every client and the sparse schedule does not
        read its density before the next round."""
        opt, ctx = self.options, self.ctx
        every = (
            opt.all_edges_train or ctx.participation.samples_every_edge()
        ) and not ctx.participation.simulates_failures()
        if opt.theta_init == "warm" or opt.sparse_schedule or not every:
            return frozenset()
        return frozenset({"theta"})

    def extra_metrics(self, state: State) -> dict[str, float]:
        return {
            "density_client": self.state_density(state, "theta"),
            "density_edge": self.state_density(state, "edge"),
            "density_cloud": density(state["global"], self.ctx.zero_threshold),
            "gamma1": float(state["gamma1"]),
            "gamma2": float(state["gamma2"]),
        }


@ALGORITHMS.register("sfedhp")
class SFedHPOptions(AlgorithmOptions):
    """sFedHP (Algorithm 1). ``lr`` is eta2 (client steps), ``edge_lr`` is eta1 (edge steps).

    ``local_steps`` is unused; the gradient evaluations per round are ``R * K``."""

    penalty_weights = {"lam": "λ", "lam1": "λ1", "lam2": "λ2"}
    # λ1 multiplies the θ step η2 (lr), λ2 the edge step η1 (edge_lr): the edge step
    # w_i -= η1·λ2 (w_i - φ_i) overshoots from η1·λ2 = 4 on (φ_i is halfway to θ at λ1 = λ2)
    penalty_steps: ClassVar[dict[str, tuple[str, ...]]] = {
        "lam": ("lr", "edge_lr"),
        "lam1": ("lr",),
        "lam2": ("edge_lr",),
    }
    old_names: ClassVar[dict[str, str]] = {"global_lr": "edge_lr"}
    """Options renamed since (old → new): an old config still loads, with one warning line."""
    lam: float = pydantic.Field(15.0, gt=0, description="lambda1 = lambda2 unless set apart")
    lam1: float | None = pydantic.Field(None, gt=0, description="overrides lam for lambda1")
    lam2: float | None = pydantic.Field(None, gt=0, description="overrides lam for lambda2")
    K: int = pydantic.Field(5, gt=0, description="gradient steps per theta subproblem")
    R: int = pydantic.Field(20, gt=0, description="local (edge) rounds per global round")
    edge_lr: float = pydantic.Field(0.05, gt=0, description="eta1, edge-model step size")
    beta: float = pydantic.Field(1.0, gt=0, le=2, description="cloud mixing weight")
    rho: float = pydantic.Field(6e-5, gt=0, description="smoothing of the approximated l1-norm")
    gamma1: float = pydantic.Field(0.0, ge=0, description="sparsity weight on client models")
    gamma2: float = pydantic.Field(0.0, ge=0, description="sparsity weight on edge models")
    sparse_schedule: bool = pydantic.Field(
        False, description="gamma1 -> gamma_tiny below density_target; gamma2 -> tiny later"
    )
    gamma_tiny: float = pydantic.Field(1e-6, ge=0)
    density_target: float = pydantic.Field(0.2, gt=0, le=1)
    gamma2_switch_round: int = pydantic.Field(100, ge=0)
    inner: Literal["gd", "nesterov"] = "gd"
    momentum: float = pydantic.Field(0.9, ge=0, lt=1, description="Nesterov momentum (inner)")
    theta_init: ThetaInit = theta_init_field("the edge's phi_i, equal to w at a round's start")
    all_edges_train: bool = pydantic.Field(
        False,
        description="true: every edge trains and the cloud aggregates its S sampled edges "
        "(Algorithm 1 verbatim); false: only the S sampled edges train (same when S = N)",
    )

    hierarchical = True
    edge_outputs = ("w",)
    node_keys: ClassVar[dict[str, RowKind]] = {"theta": "client", "edge": "edge"}
    personal_on_node = True
    bills_stragglers = True  # a straggler receives its edge's phi_i and w_i every local round
    uploads = {"edge": "estimate", "cloud": "model"}  # phi_ij up to the edges, w_i to the cloud
    keeps_centres = frozenset({"edge", "cloud"})

    @property
    def lam1_value(self) -> float:
        return self.lam1 if self.lam1 is not None else self.lam

    @property
    def lam2_value(self) -> float:
        return self.lam2 if self.lam2 is not None else self.lam

    def gradient_evaluations(self) -> int:
        return self.R * self.K

    def unread(self, run: RunConfig) -> dict[str, str]:
        """``local_steps`` (R and K set the work); ``rho`` without sparsity; the schedule's
        options without ``sparse_schedule``; ``momentum`` under ``inner: gd``."""
        out = {"local_steps": derived_steps("sfedhp", "K", "R")}
        if self.gamma1 == 0 and self.gamma2 == 0:
            out["rho"] = "it smooths the l1 term, which is off; set algorithm.gamma1 or gamma2"
        if not self.sparse_schedule:
            for key in ("gamma_tiny", "density_target", "gamma2_switch_round"):
                out[key] = "the sparse schedule is off; set algorithm.sparse_schedule=true"
        if self.inner != "nesterov":
            out["momentum"] = "the inner solver is plain gd; set algorithm.inner=nesterov"
        return out

    def graph_steps(self) -> bool:
        """The θ subproblem's K plain steps (no client sparsity, ``inner: gd``) replay as one
        CUDA graph (:func:`fedhp.algorithms.sfedhp_fused._prox_steps`)."""
        return self.inner == "gd" and self.gamma1 == 0

    # cclip's previous aggregate update: w's at the cloud, each edge's phi_i - w_i at the edges
    # (one per local round: the fused round's edge rule reads and replaces its edge's row)

    def build(self, ctx: RunContext) -> Algorithm:
        return SFedHP(self, ctx)
