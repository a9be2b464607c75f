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

The round below the cloud that runs is :func:`fused_train`, below the algorithm: the same values
as these formulas, bit for bit, in a fraction of the time and memory; ``tests/algorithms/
sfedhp_reference.py`` writes them out one tensor per formula, and ``tests/algorithms/
test_sfedhp.py`` compares the two.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

import pydantic
import torch
from torch import Tensor

from fedhp.algorithms.base import Algorithm, RowKind, State
from fedhp.algorithms.edge_rounds import edge_batch
from fedhp.algorithms.options import (
    ALGORITHMS,
    AlgorithmOptions,
    ThetaInit,
    derived_steps,
    theta_init_field,
)
from fedhp.algorithms.penalties import smooth_l1_grad, truncate
from fedhp.algorithms.task import Task, Update
from fedhp.engine.context import RunContext
from fedhp.engine.edges import EdgeBatch
from fedhp.engine.evaluate import density
from fedhp.engine.federation import slice_rows
from fedhp.engine.fused import EdgeRows, Received, count_sent, truncate_
from fedhp.engine.ops import batched_loss_grad, graph_steps, mean_group_loss
from fedhp.engine.run_rows import Draw, RunBlocks, cat_runs, gathers, one_draw, rows_key
from fedhp.engine.uplink import CENTRE_KEYS, Uplink, level_aggregate
from fedhp.models.base import ColumnHook

if TYPE_CHECKING:
    from fedhp.config import RunConfig


class SFedHP(Algorithm):
    """sFedHP; the global model is ``w``, the personalized models are the clients' ``theta``."""

    options: SFedHPOptions

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
        """The R local rounds of every training edge and its clients (below the cloud):
        :func:`fused_train`, with a batch's other runs of one :func:`round_key` as one."""
        return self.ctx.together(fused_train, round_key(self, task), (self, state, task))

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


# ---------------------------------------------------------------- the round below the cloud, fused
# Algorithm 1's R local rounds below the cloud as the runs take them, computing exactly what the
# formulas of the module docstring give (tests/algorithms/sfedhp_reference.py writes them out one
# tensor per formula; tests/algorithms/test_sfedhp.py compares the two bit for bit): buffers
# allocated once per round, the edges' models read in place by their clients, the clients in
# cache-sized parts, the uploads mixed, truncated, counted and averaged edge by edge, and the
# messages counted on the device and billed once at the end, so the loop never waits on the host.
# It also runs the edges' robust rules (cclip from each edge's kept centre) and the update
# attacks.
#
# One round for one run and for a batch of runs (``fedhp sweep``'s lockstep: the run level of
# the tree): run s's clients are a block of rows of theta, its edges a block of the edge rows,
# each run's λ its rows' and edges' values (:class:`_PerRun`), and nothing crosses a block
# (every operation is per row, or per edge, whose clients are all of one run). Each run draws
# from its own generator, counts its own trained samples and bills its own ledger.

Item = tuple["SFedHP", State, Task]


def round_key(algo: SFedHP, task: Task) -> Hashable | None:
    """What runs must share to train their rounds as one (None: this round trains alone): the
    round's shapes and step sizes, the model, the device and the zero threshold. Sparse
    penalties, the Nesterov solver, an attack on the uploads, uplink momentum and a robust rule
    at the edges train alone."""
    opt, ctx = algo.options, algo.ctx
    uplink = ctx.edge_uplink
    plain = opt.inner == "gd" and not task.scalars["gamma1"] and not task.scalars["gamma2"]
    if not (plain and uplink.folds and not uplink.forges and not uplink.momentum):
        return None
    steps = (opt.R, opt.K, opt.batch_size, opt.lr, opt.edge_lr, opt.theta_init)
    return rows_key("sfedhp", ctx, task.broadcast["global"], steps)


def fused_train(items: Sequence[Item]) -> list[Update]:
    """The R local rounds of every training edge and its clients, fused, for every run of
    ``items`` (one ``(algorithm, state, task)``, or a batch's with one :func:`round_key`):
    buffers allocated once per round, the edges' models read in place by their clients (not
    copied into every client row), the uploads mixed, truncated, counted and averaged edge by
    edge in a cache-sized buffer, and the messages counted on the device and billed once at the
    end, so the loop never waits on the host. Computes exactly what the per-message formulas in
    the module docstring give (up to the sign of a zero, see :func:`solve_theta`)."""
    opt = items[0][0].options
    run = _EdgeRound.start(items)
    draw = run.draw()
    start_theta = opt.theta_init == "reset"
    losses = []
    for r in range(opt.R):
        phi_sent, w_sent = run.send_down(r)
        x, y = draw()
        loss = torch.empty(run.theta.shape[0], device=run.theta.device)
        run.phi_sum.zero_()
        for part in run.parts:  # cache-sized runs of clients, each in one pass
            a, b = part.start, part.stop
            theta = run.theta[a:b]
            phi_recv = part.rows.receive(phi_sent, run.center[: b - a])
            if start_theta or (opt.theta_init == "round" and r == 0):
                phi_recv.spread(theta)  # the received model: the edge's phi_i (w at r = 0)
            batch = slice_rows(x, a, b), y[a:b]
            loss[a:b] = solve_theta(run, part, theta, phi_recv, *batch)
            run.send_up(part, w_sent, r)
        losses.append(loss)
        run.end_up()
        run.edge_step()
    rows = torch.stack(losses)
    return [run.finish(s, rows) for s in range(len(items))]


def solve_theta(
    run: _EdgeRound,
    part: _Part,
    theta: torch.Tensor,
    center: Received,
    x: torch.Tensor,
    y: torch.Tensor,
) -> torch.Tensor:
    """K steps, in place on ``theta [C, P]`` (the rows of ``part``), on
    ``l(theta; x, y) + gamma1 phi_rho(theta) + lam1/2 ||theta - center||^2`` where ``center``
    is each client's received ``phi_i`` (read from the edge rows, not copied per client).
    Returns the data loss at the last step's start point.

    Where ``lr * lam1 == 1`` the step is ``center - lr grad``, one pass: the values of the
    lerp then the step, bit for bit, but for the sign of a zero (``lerp(theta, c, 1)`` may
    turn a centre entry of -0.0 into +0.0) and for entries where theta is not finite."""
    algo, gamma1 = run.algo, run.gamma1
    opt = algo.options
    if opt.inner == "gd" and gamma1 == 0:
        return _prox_steps(run, part, theta, center, x, y)
    # (a run alone: sparse penalties and the Nesterov solver have no stack key)
    lam1, lr = opt.lam1_value, opt.lr
    scratch = run.scratch[: theta.shape[0]]
    velocity = torch.zeros_like(theta) if opt.inner == "nesterov" else None
    loss = torch.zeros(theta.shape[0], device=theta.device)
    for _ in range(opt.K):
        loss, grad = batched_loss_grad(algo.ctx.model, theta, x, y)
        if gamma1 > 0:
            grad.add_(smooth_l1_grad(theta, opt.rho, out=scratch), alpha=gamma1)
        if velocity is None and lr * lam1 == 1.0:
            # theta - lr (grad + lam1 (theta - center)) = center - lr grad: the pull lands
            # on the centre (the paper's lr = 0.05, lam1 = 20), so one pass does the step.
            step = grad.contiguous()  # (split like theta: a no-op for the zoo's models)
            center.apply(lambda c, th, g: torch.add(c, g, alpha=-lr, out=th), theta, step)
        elif velocity is None:
            # the same, in general: a lerp towards the centre, then the gradient step.
            center.apply(lambda c, th: th.lerp_(c, lr * lam1), theta)
            theta.add_(grad, alpha=-lr)
        else:  # PyTorch's Nesterov SGD form, momentum reset every local round
            center.apply(lambda c, th, out: torch.sub(th, c, out=out), theta, scratch)
            grad.add_(scratch, alpha=lam1)
            velocity.mul_(opt.momentum).add_(grad)
            theta.add_(grad.add_(velocity, alpha=opt.momentum), alpha=-lr)
    return loss


def _prox_steps(
    run: _EdgeRound, part: _Part, theta: Tensor, center: Received, x: Tensor, y: Tensor
) -> Tensor:
    """:func:`solve_theta` without a penalty or momentum: K steps ``theta <- lerp(theta,
    centre, lr lam1) - lr grad``, each the model's :meth:`~fedhp.models.base.BatchedModel.
    sgd_step` with the pull applied to each layer's columns inside it (one pass; the MLPs update
    inside their backward pass). Replayed as one CUDA graph per shape where the run asks for
    graphs (``engine.cuda_graphs``; the graph reads the edge rows, the minibatch, θ and the
    rows' pulls, and writes θ and the loss)."""
    opt, ctx = run.algo.options, run.algo.ctx
    a, b = part.start, part.stop
    for lo, hi, s in run.runs.within(a, b):
        for _ in range(opt.K):  # (a Python counter: kept outside the graph)
            run.items[s][0].ctx.model.count_trained(slice_rows(x, lo - a, hi - a))
    rows, gathered, pull = center.rows, center.gathered, run.pull
    tensors = [center.edge_rows]
    if pull.uniform is None and gathered:  # each row's pull (and where it lands) as tensors
        tensors += [t[a:b] for t in (pull.rows, pull.lands) if isinstance(t, torch.Tensor)]

    def towards_centre(theta: Tensor, edge_rows: Tensor, *own: Tensor) -> ColumnHook:
        received = Received(rows, edge_rows, gathered)
        return lambda lo, hi: pull.move(received.columns(lo, hi), theta[:, lo:hi], *own)

    values = pull.uniform if pull.uniform is not None or gathered else tuple(pull.of_edge)
    key = ("sfedhp θ steps", values, (rows.num_edges, rows.runs, rows.width), gathered)
    batch, stacked = (ctx.model, theta, x, y), len(run.items) > 1
    return graph_steps(ctx.graphs, key, batch, (opt.K, opt.lr), towards_centre, tensors, stacked)


@dataclass(frozen=True)
class _PerRun:
    """A value of each run (from its λ): each edge row's (its run's) and each client row's
    (``rows``: a ``[C, 1]`` column, or the float where every run has the same); ``uniform``:
    that one value, or None."""

    of_edge: list[float]
    rows: torch.Tensor | float
    lands: torch.Tensor | None  # [C, 1] bool: the row's value is exactly 1 (None: no such mix)
    uniform: float | None

    @classmethod
    def of(
        cls,
        values: list[float],
        runs: RunBlocks,
        edges: list[int],
        like: torch.Tensor,
        landing: bool = False,
    ) -> _PerRun:
        """``values[s]`` for run s, whose edges are ``edges[s]`` many (``landing``: mark the
        rows whose value is exactly 1)."""
        of_edge = [v for v, n in zip(values, edges, strict=True) for _ in range(n)]
        uniform = values[0] if len(set(values)) == 1 else None
        lands = runs.column([float(v == 1.0) for v in values], like) if landing else None
        mixed = lands.bool() if isinstance(lands, torch.Tensor) else None
        return cls(of_edge, runs.column(values, like), mixed, uniform)

    def move(self, received: Received, theta: torch.Tensor, *own: torch.Tensor) -> None:
        """The θ pull ``theta <- lerp(theta, centre, pull)`` of rows ``theta`` towards what they
        ``received``, in place; a pull of exactly 1 copies the centre (``lerp`` with weight 1
        is the centre itself: one read less). ``own``: a gathered part's per-row pulls and
        landings, where the runs' pulls differ."""
        if self.uniform is not None:
            received.apply(_pull(self.uniform), theta)
        elif received.gathered:
            pull, centre = own[0], received.edge_rows
            if len(own) == 1:  # (no row lands, or every row)
                theta.lerp_(centre, pull)
            else:  # (a lerp with weight 1 may flip the sign of a zero: those rows copy)
                torch.where(own[1], centre, theta.lerp_(centre, pull), out=theta)
        else:
            assert received.rows.runs is not None
            for (_, _, e), (edge, rows) in zip(
                received.rows.runs, received.parts(theta), strict=True
            ):
                _pull(self.of_edge[e])(edge, rows)


def _pull(weight: float) -> Callable[[torch.Tensor, torch.Tensor], object]:
    """``rows <- lerp(rows, centre, weight)`` in place (a copy at weight 1)."""
    if weight == 1.0:
        return lambda centre, rows: rows.copy_(centre)
    return lambda centre, rows: rows.lerp_(centre, weight)


@dataclass(frozen=True)
class _Part:
    """Clients ``start .. stop - 1`` of a round (a cache-sized run) and their edge layout."""

    start: int
    stop: int
    rows: EdgeRows


@dataclass
class _EdgeRound:
    """One global round's edge and client state below the cloud, for every run of ``items``
    (run s's clients a block of rows, its edges a block of edge rows), in buffers reused by
    every local round: the clients' ``theta [C, P]``, the edges' ``phi_i`` and ``w_i``
    ``[n, P]`` (``w_sent``: ``w_i`` as sent, truncated; ``phi_sum``: the uploads' weighted sums,
    the next ``phi_i``), the clients in cache-sized ``parts`` (each trained K steps and uploaded
    in one pass, so a part's rows stay in cache), ``mix`` for the uploads of one edge of a part
    at a time, part-sized scratch space, and the round's message counts (``down_counts [R, 2,
    n]``: ``phi_i``, ``w_i`` per edge; ``up_counts [R, C]``)."""

    items: Sequence[Item]
    runs: RunBlocks  # each run's client rows
    batch: EdgeBatch  # its edge rows, its receivers
    uplink: Uplink  # the edges' pipeline (forging; robust rule unless it folds)
    parts: list[_Part]
    gamma1: float
    gamma2: float
    pull: _PerRun  # lr lam1: how far a θ step moves towards the centre
    mix_weight: _PerRun  # lam1 / (lam1 + lam2): the upload as a lerp from w_i towards θ
    lam2: torch.Tensor | float  # each edge row's lam2 ([n, 1], or the float)
    theta: torch.Tensor
    mix: torch.Tensor
    scratch: torch.Tensor
    center: torch.Tensor  # [part, P] where a part's rows must be gathered, else empty
    phi_edge: torch.Tensor
    phi_sum: torch.Tensor
    w_edge: torch.Tensor
    w_sent: torch.Tensor
    step: torch.Tensor
    edge_scratch: torch.Tensor
    weights: torch.Tensor | None  # [C, 1] upload weights; None: all 1
    denominator: torch.Tensor  # [n, 1] the edges' total weights (clamped)
    firsts: torch.Tensor  # zeros: index_add_'s index summing rows into one edge row
    down_counts: torch.Tensor
    up_counts: torch.Tensor
    edge_ids: list[int]  # the training edges (global ids; a run alone)

    @classmethod
    def start(cls, items: Sequence[Item]) -> _EdgeRound:
        """Buffers and bookkeeping for the rounds of ``items``: every edge starts from
        ``phi_i = w_i = w`` as sent (its run's ``w``), theta from the state where it starts
        warm."""
        algo = items[0][0]
        ctx, opt = algo.ctx, algo.options
        batch = edge_batch(items)  # who receives what: the clients and the stragglers
        sizes = [len(t.edges) for _, _, t in items if t.edges is not None]
        pairs = zip(items, sizes, strict=True)
        sent = [t.broadcast["global"].expand(n, -1) for (_, _, t), n in pairs]
        seg, sent_w = batch.edge_of, cat_runs(sent)
        n, c, (p, dtype) = sent_w.shape[0], seg.shape[0], (sent_w.shape[1], sent_w.dtype)
        alone = len(items) == 1
        whole = ctx.whole_rounds  # a rule (or ALIE) reads whole edges (a run alone)
        chunk = c if whole else ctx.policy.chunk(p, c)
        runs = batch.clients
        lam1 = [a.options.lam1_value for a, _, _ in items]
        lam2 = [a.options.lam2_value for a, _, _ in items]
        pull = _PerRun.of([opt.lr * v for v in lam1], runs, sizes, sent_w, landing=True)
        mix_weight = _PerRun.of(
            [v / (v + w) for v, w in zip(lam1, lam2, strict=True)], runs, sizes, sent_w
        )
        gather = not alone and gathers(sent_w.device)  # a batch on a GPU: one launch per part
        parts = [
            _Part(a, min(a + chunk, c), _layout(seg[a : a + chunk], n, gather, pull, mix_weight))
            for a in range(0, c, chunk)
        ]
        size = max((part.stop - part.start for part in parts), default=0)
        layouts = [part.rows.runs for part in parts]
        gathered = any(r is None for r in layouts)
        group = max((b - a for r in layouts if r is not None for a, b, _ in r), default=0)
        weights = cat_runs([a.ctx.client_weights(task.clients) for a, _, task in items]).to(dtype)
        totals = torch.zeros(n, dtype=dtype, device=sent_w.device).index_add_(0, seg, weights)
        uniform = bool((weights == 1).all())  # (segment_mean's product by 1 changes nothing)
        w_edge = sent_w.clone() if alone else sent_w  # (a batch's rows: a new tensor already)
        warm = opt.theta_init == "warm"  # else theta starts from the first phi_i received
        task = items[0][2]
        theta = cat_runs([st["theta"][t.clients] for _, st, t in items]) if warm else None
        return cls(
            items=items,
            runs=runs,
            batch=batch,
            uplink=ctx.edge_uplink,
            parts=parts,
            gamma1=task.scalars["gamma1"],
            gamma2=task.scalars["gamma2"],
            pull=pull,
            mix_weight=mix_weight,
            lam2=batch.edges.column(lam2, sent_w),
            theta=sent_w.new_empty(c, p) if theta is None else theta,
            mix=sent_w.new_empty(size if gathered else group, p),
            scratch=sent_w.new_empty(size, p),
            center=sent_w.new_empty(size if gathered else 0, p),
            phi_edge=sent_w.clone(),
            phi_sum=torch.empty_like(w_edge),
            w_edge=w_edge,
            w_sent=w_edge if ctx.zero_threshold <= 0 else torch.empty_like(w_edge),
            step=torch.empty_like(w_edge),
            edge_scratch=torch.empty_like(w_edge),
            weights=None if uniform else weights.unsqueeze(1),
            denominator=totals.clamp(min=torch.finfo(dtype).tiny).unsqueeze(1),
            firsts=torch.zeros(max(group, size), dtype=torch.long, device=sent_w.device),
            down_counts=sent_w.new_empty(opt.R, 2, n),
            up_counts=sent_w.new_empty(opt.R, c),
            edge_ids=task.edges.tolist() if alone and task.edges is not None else [],
        )

    @property
    def algo(self) -> SFedHP:
        return self.items[0][0]

    @property
    def eps(self) -> float:
        return self.algo.ctx.zero_threshold

    def draw(self) -> Draw:
        """Every run's minibatches of a local round (drawn as one where the runs allow it)."""
        bs = self.algo.options.batch_size
        contexts = [a.ctx for a, _, _ in self.items]
        clients = [task.clients for _, _, task in self.items]
        own = [ctx.batches(cl, bs) for ctx, cl in zip(contexts, clients, strict=True)]
        return one_draw(contexts, clients, bs, own)

    def send_down(self, r: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Edges -> clients in local round ``r``: ``phi_i`` (the prox centre) and ``w_i``,
        truncated (``phi_i`` in place: its untruncated value is not read again) and counted once
        per edge. Returns both edge rows ``[n, P]`` as sent."""
        eps = self.eps
        phi_sent = truncate_(self.phi_edge, eps)
        w_sent = self.w_sent if eps <= 0 else truncate_(self.w_edge, eps, out=self.w_sent)
        count_sent(phi_sent, eps, self.edge_scratch, out=self.down_counts[r, 0])
        count_sent(w_sent, eps, self.edge_scratch, out=self.down_counts[r, 1])
        return phi_sent, w_sent

    def send_up(self, part: _Part, w_sent: torch.Tensor, r: int) -> None:
        """The uploads of ``part``'s clients in local round ``r``: ``phi_ij = (lam1 theta + lam2
        w_i) / (lam1 + lam2)`` (one lerp; the malicious clients' forged by the run's attack),
        truncated and counted, added into their edges' rows of ``phi_sum`` in client order
        (segment_mean's sums, whatever the parts), or aggregated by the edges' robust rule (one
        part then: every edge's uploads at once)."""
        runs = part.rows.runs
        if runs is None:
            self._send_up_gathered(part, w_sent, r)
            return
        eps, phi, off = self.eps, self.phi_sum, part.start
        for a, b, e in runs:
            a, b = a + off, b + off
            mixed = self.mix[: b - a]
            torch.lerp(w_sent[e], self.theta[a:b], self.mix_weight.of_edge[e], out=mixed)
            mixed = self.upload(mixed, a, b, w_sent[e])
            truncate_(mixed, eps)
            if not self.uplink.folds:
                count_sent(mixed, eps, self.scratch[: b - a], out=self.up_counts[r, a:b])
                phi[e] = self.edge_aggregate(mixed, slice(a, b), w_sent[e], e)
            elif self.weights is None:  # count last, on the values themselves
                phi[e : e + 1].index_add_(0, self.firsts[: b - a], mixed)
                count_sent(mixed, eps, mixed, out=self.up_counts[r, a:b])
            else:
                count_sent(mixed, eps, self.scratch[: b - a], out=self.up_counts[r, a:b])
                mixed.mul_(self.weights[a:b])
                phi[e : e + 1].index_add_(0, self.firsts[: b - a], mixed)

    def upload(self, mixed: torch.Tensor, a: int, b: int, start: torch.Tensor) -> torch.Tensor:
        """Clients ``a .. b - 1``'s uploads as sent (the run's attack; ``start``: their
        ``w_i``; a run alone: forging has no stack key)."""
        return self.uplink.forge(mixed, self.batch.ids(0)[a:b], start)

    def edge_aggregate(
        self, rows: torch.Tensor, clients: slice | torch.Tensor, sent: torch.Tensor, e: int
    ) -> torch.Tensor:
        """Edge ``e``'s (position in the round's edges) robust rule over the uploads ``rows`` of
        its ``clients`` (round rows), which received ``sent`` (its ``w_i``):
        :func:`~fedhp.engine.uplink.level_aggregate` (a centred rule, ``cclip``, from
        the edge's previous aggregate update ``phi_i - w_i``, kept in the state)."""
        weights = torch.ones(rows.shape[0], dtype=rows.dtype, device=rows.device)
        if self.weights is not None:
            weights = self.weights[clients, 0]
        state = self.items[0][1]  # (the edges' centres of a centred rule, cclip: a run alone)
        return level_aggregate(self.uplink, state, rows, weights, sent, edge=self.edge_ids[e])

    def _send_up_gathered(self, part: _Part, w_sent: torch.Tensor, r: int) -> None:
        """:meth:`send_up` for a part whose clients are not grouped by edge (or a batch's part
        on a GPU): all at once, on their gathered ``w_i`` rows."""
        a, b, eps = part.start, part.stop, self.eps
        mixed = self.mix[: b - a]
        w_recv = part.rows.receive(w_sent, mixed)  # the clients' w_i rows, gathered into mix
        weight = self.mix_weight.rows
        weight = weight if isinstance(weight, float) else weight[a:b]
        torch.lerp(w_recv.edge_rows, self.theta[a:b], weight, out=mixed)
        seg = part.rows.seg
        if self.uplink.forges:  # (their w_i gathered again: the lerp wrote over them)
            mixed = self.upload(mixed, a, b, w_sent[seg])
        truncate_(mixed, eps)
        count_sent(mixed, eps, self.scratch[: b - a], out=self.up_counts[r, a:b])
        if not self.uplink.folds:
            for e in torch.unique(seg).tolist():
                mine = torch.nonzero(seg == e).flatten()
                self.phi_sum[e] = self.edge_aggregate(mixed[mine], mine + a, w_sent[e], e)
            return
        if self.weights is not None:
            mixed.mul_(self.weights[a:b])
        self.phi_sum.index_add_(0, part.rows.seg, mixed)

    def end_up(self) -> None:
        """The local round's uploads are all in: ``phi_i`` is their weighted mean per edge (or
        the edges' rule's aggregate, already in place)."""
        if self.uplink.folds:
            self.phi_sum.div_(self.denominator)
        self.phi_edge, self.phi_sum = self.phi_sum, self.phi_edge

    def edge_step(self) -> None:
        """``w_i <- w_i - eta1 [lam2 (w_i - phi_i) + gamma2 tanh(w_i / rho)]``, in place."""
        opt = self.algo.options
        step = torch.sub(self.w_edge, self.phi_edge, out=self.step).mul_(self.lam2)
        if self.gamma2 > 0:
            tanh = smooth_l1_grad(self.w_edge, opt.rho, out=self.edge_scratch)
            step.add_(tanh, alpha=self.gamma2)
        self.w_edge.sub_(step, alpha=opt.edge_lr)

    def finish(self, s: int, losses: torch.Tensor) -> Update:
        """Run ``s``'s share of the round: its client-edge messages billed (each edge's two
        broadcasts per local round to each receiver, its clients and stragglers, and each
        client's upload: one ledger call per direction gives the totals of one call per message
        batch, the ledger sums integers), its state written, its update."""
        algo, state, task = self.items[s]
        ctx, p = algo.ctx, self.theta.shape[1]
        edges, agg = task.edges, task.up_edges
        assert edges is not None and agg is not None
        rows, edge_rows = self.runs.of_run(s), self.batch.edges.of_run(s)
        self.batch.bill(s, ctx.ledger, (self.down_counts, self.up_counts), (p, p))
        mine = self.w_edge[edge_rows]
        state["theta"][task.clients] = self.theta[rows]
        state["edge"][edges] = mine
        sent_up = truncate(mine[torch.searchsorted(edges, agg)], ctx.zero_threshold)
        return Update(per_edge={"w": sent_up}, losses=self.runs.own(losses, s, dim=1))


def _layout(seg: torch.Tensor, n: int, gather: bool, *values: _PerRun) -> EdgeRows:
    """A part's edge layout (:class:`~fedhp.engine.fused.EdgeRows`): gathered where asked;
    edge by edge where the runs' ``values`` differ (one broadcast view needs one value)."""
    if gather:
        return EdgeRows(seg, n, None, 0)
    rows = EdgeRows.of(seg, n)
    if rows.width and any(v.uniform is None for v in values):
        return EdgeRows(seg, n, rows.runs, 0)
    return rows


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
        CUDA graph (:func:`fedhp.algorithms.sfedhp._prox_steps`)."""
        return self.inner == "gd" and self.gamma1 == 0

    # cclip's previous aggregate update: w's at the cloud, each edge's phi_i - w_i at the edges
    # (one per local round: the fused round's edge rule reads and replaces its edge's row)

    def build(self, ctx: RunContext) -> Algorithm:
        return SFedHP(self, ctx)
