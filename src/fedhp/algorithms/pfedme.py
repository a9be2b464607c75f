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

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

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
from fedhp.algorithms.task import Task, Update
from fedhp.engine.context import RunContext
from fedhp.engine.federation import slice_rows
from fedhp.engine.fused import send_rows
from fedhp.engine.local_rows import part_bounds
from fedhp.engine.ops import batched_loss_grad, graph_steps, mean_group_loss, model_steps
from fedhp.engine.run_rows import RunBlocks, cat_runs, gathers, one_draw, rows_key, rows_of
from fedhp.models.base import ColumnHook

if TYPE_CHECKING:
    from fedhp.config import RunConfig


class PFedMe(Algorithm):
    """pFedMe; global model ``w``, personalized models ``theta``."""

    options: PFedMeOptions

    def __init__(self, options: PFedMeOptions, ctx: RunContext) -> None:
        super().__init__(options, ctx)
        if options.personal == "local":  # each client's last w_loc, kept as its PM
            self.held_keys["local"] = "client"

    def init_state(self, init_params: torch.Tensor) -> State:
        p = init_params.to(self.ctx.device)
        rows = {"theta": p.expand(self.ctx.num_clients, -1).clone()}
        if self.options.personal == "local":
            rows["local"] = rows["theta"].clone()
        return {"global": p.clone(), **rows}

    def plan(self, state: State, rnd: int) -> Task:
        return self.plan_broadcast_global(state)

    def train(self, state: State, task: Task) -> Update:
        """The R local rounds of the task's clients: :func:`fused_train`, with a batch's other
        runs of one :func:`round_key` as one."""
        return self.ctx.together(fused_train, round_key(self, task), (self, state, task))

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
        """θ; w_loc under ``personal: local`` (what the reference code reports)."""
        return state["local" if self.options.personal == "local" else "theta"]

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
# cache-sized parts of the clients. One round for one run and for a batch of runs (``fedhp
# sweep``'s lockstep, the run level of the tree): run s's clients are a block of rows, its λ and
# lr its rows' values, and nothing crosses a block (every operation is per row).

Item = tuple["PFedMe", State, Task]


def round_key(algo: PFedMe, task: Task) -> Hashable | None:
    """What runs must share to train their rounds as one (None: this round trains alone): the
    round's shapes, the θ step size, the model, the device and the zero threshold. The hidden L2
    on θ, partial work, minibatches drawn ahead, an attack and a robust or momentum uplink train
    alone."""
    opt, ctx = algo.options, algo.ctx
    uplink = ctx.cloud_uplink
    plain = opt.l2 == 0 and not task.per_client and task.batches is None and task.edges is None
    honest = ctx.attack is None and uplink.attack is None
    if not (plain and honest and uplink.folds and not uplink.momentum):
        return None
    steps = (opt.R, opt.K, opt.batch_size, opt.personal_lr, opt.theta_init)
    return rows_key("pfedme", ctx, task.broadcast["global"], steps)


def fused_train(items: Sequence[Item]) -> list[Update]:
    """The R local rounds of every run of ``items`` (one ``(algorithm, state, task)``, or a
    batch's with one :func:`round_key`) in place on two ``[ΣC, P]`` buffers (``theta``,
    ``w_loc``), in cache-sized parts of the rows: per step the prox pull towards ``w_loc`` and
    the gradient step in one pass, per local round the ``w_loc`` step; no copies and no host
    syncs inside the loop. A run alone with several parts runs each part's R local rounds
    before the next (its rows stay in cache) on the minibatches the whole round would draw
    (drawn ahead); a batch draws each local round's minibatches of every run at once."""
    lead, _, _ = items[0]
    ctx, opt = lead.ctx, lead.options
    alone = len(items) == 1
    rounds = _Rounds.start(items)
    n, p = rounds.local.shape
    chunk = ctx.policy.chunk(2 * p, n)
    if alone and chunk < n and ctx.fed.train.noise_std is not None:
        chunk = n  # per-access noise is drawn while gathering: keep the whole round's order
    parts = part_bounds(chunk, n)
    if alone and len(parts) > 1:
        clients = items[0][2].clients
        drawn = ctx.sampler.steps(clients, opt.batch_size, opt.R)
        for a, b in parts:
            draw = ctx.batches(clients[a:b], opt.batch_size, drawn[:, a:b])
            for r in range(opt.R):
                rounds.local_round(r, draw(), a, b)
    else:
        contexts = [algo.ctx for algo, _, _ in items]
        clients_of = [task.clients for _, _, task in items]
        own = [c.batches(cl, opt.batch_size) for c, cl in zip(contexts, clients_of, strict=True)]
        draw = one_draw(contexts, clients_of, opt.batch_size, own)
        for r in range(opt.R):
            x, y = draw()
            for a, b in parts:
                rounds.local_round(r, (slice_rows(x, a, b), y[a:b]), a, b)
    return [rounds.finish(s) for s in range(len(items))]


@dataclass
class _Rounds:
    """The local rounds' rows: every run's ``theta`` and ``w_loc`` (``local``), the received
    models, the losses; each run's θ pull ``personal_lr λ`` and ``w_loc`` step ``lr λ`` (a
    scalar per run block on the CPU; on a GPU a per-row column, one launch per part)."""

    items: Sequence[Item]
    runs: RunBlocks
    theta: torch.Tensor
    local: torch.Tensor
    received: torch.Tensor
    losses: torch.Tensor
    pulls: list[float]
    mixes: list[float]
    pull_rows: torch.Tensor | float  # the pulls as a per-row column (one value: a float)
    mix_rows: torch.Tensor | float

    @classmethod
    def start(cls, items: Sequence[Item]) -> _Rounds:
        opt = items[0][0].options
        received = cat_runs([t.broadcast["global"].expand(len(t.clients), -1) for _, _, t in items])
        warm = opt.theta_init == "warm"  # (advanced indexing already copies the state's rows)
        theta = cat_runs([s["theta"][t.clients] for _, s, t in items]) if warm else received.clone()
        runs = RunBlocks.of([len(t.clients) for _, _, t in items])
        pulls = [a.options.personal_lr * a.options.lam for a, _, _ in items]
        mixes = [a.options.lr * a.options.lam for a, _, _ in items]
        return cls(
            items=items,
            runs=runs,
            theta=theta,
            local=received.clone(),
            received=received,
            losses=received.new_empty(opt.R, received.shape[0]),
            pulls=pulls,
            mixes=mixes,
            pull_rows=runs.column(pulls, received),
            mix_rows=runs.column(mixes, received),
        )

    def local_round(self, r: int, batch: tuple[torch.Tensor, torch.Tensor], a: int, b: int) -> None:
        """Local round ``r`` of rows ``a .. b - 1`` on their minibatch ``batch``: K θ steps,
        then the ``w_loc`` step."""
        opt = self.items[0][0].options
        theta, local = self.theta[a:b], self.local[a:b]
        if opt.theta_init == "reset" and r > 0:  # (round 0 starts from it already)
            theta.copy_(self.received[a:b])
        x, y = batch
        if opt.l2 == 0:  # the pull inside the model's step: one pass
            self.losses[r, a:b] = self._pulled_steps(theta, local, x, y, a)
        else:  # (a run alone: the hidden L2 has no stack key)
            algo = self.items[0][0]
            for _ in range(opt.K):
                loss, grad = batched_loss_grad(algo.ctx.model, theta, x, y)
                grad.add_(theta, alpha=opt.l2)
                # theta - plr (grad + lam (theta - local)), fused: no temporaries.
                theta.lerp_(local, self.pulls[0]).add_(grad, alpha=-opt.personal_lr)
            self.losses[r, a:b] = loss
        self._lerp(local, theta, (self.mixes, self.mix_rows), a)  # local - lr lam (local - theta)

    def _lerp(
        self,
        rows: torch.Tensor,
        to: torch.Tensor,
        weights: tuple[list[float], torch.Tensor | float],
        a: int,
    ) -> None:
        """``rows <- lerp(rows, to, weight)`` in place, each row with its run's weight
        (``weights``: per run, and as a per-row column; ``rows`` and ``to`` start at row ``a``):
        run block by run block on the CPU, one launch on a GPU."""
        b = a + rows.shape[0]
        if gathers(rows.device):
            rows.lerp_(to, rows_of(weights[1], a, b))
            return
        for lo, hi, s in self.runs.within(a, b):
            rows[lo - a : hi - a].lerp_(to[lo - a : hi - a], weights[0][s])

    def _pulled_steps(
        self, theta: torch.Tensor, local: torch.Tensor, x: torch.Tensor, y: torch.Tensor, a: int
    ) -> torch.Tensor:
        """K steps of θ (rows from ``a``) on ``(x, y)`` in place, each the model's ``sgd_step``
        with the pull ``theta <- lerp(theta, local, personal_lr lam)`` applied to each layer's
        columns inside it; the data loss at the last step's start point. A run alone replays
        them as one CUDA graph per shape where it asks for graphs (``engine.cuda_graphs``)."""
        lead = self.items[0][0]
        opt, ctx = lead.options, lead.ctx
        for lo, hi, s in self.runs.within(a, a + theta.shape[0]):
            for _ in range(opt.K):  # (a Python counter: kept outside the graph)
                self.items[s][0].ctx.model.count_trained(slice_rows(x, lo - a, hi - a))
        steps, pulls = (opt.K, opt.personal_lr), (self.pulls, self.pull_rows)

        def towards_local(theta: torch.Tensor, local: torch.Tensor) -> ColumnHook:
            return lambda lo, hi: self._lerp(theta[:, lo:hi], local[:, lo:hi], pulls, a)

        if len(self.items) > 1:
            return model_steps(ctx.model, theta, x, y, steps, towards_local(theta, local))
        key = ("pfedme θ steps", self.pulls[0])
        return graph_steps(ctx.graphs, key, (ctx.model, theta, x, y), steps, towards_local, [local])

    def finish(self, s: int) -> Update:
        """Run ``s``'s share: its clients' θ written into its state, its update."""
        algo, state, task = self.items[s]
        rows = self.runs.of_run(s)
        state["theta"][task.clients] = self.theta[rows]
        if algo.options.personal == "local":
            state["local"][task.clients] = self.local[rows]
        own = {"local": self.runs.own(self.local, s)}
        return Update(per_client=own, losses=self.runs.own(self.losses, s, dim=1))


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
    personal: Literal["theta", "local"] = pydantic.Field(
        "theta",
        description="the personalized model evaluated: theta (the paper's), or each client's "
        "last w_loc (what pFedMe's reference code reports, through a parameter aliasing)",
    )

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
