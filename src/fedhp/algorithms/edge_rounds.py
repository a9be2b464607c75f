"""The client→edge rounds below the cloud of a hierarchy whose edges aggregate their clients'
models: :func:`plan_edges` (the cloud's side), :class:`EdgeRounds` (below it, for one run or a
batch of runs; the rows of its edges: :class:`~fedhp.engine.edges.EdgeBatch`), each edge
aggregating through its uplink (:func:`~fedhp.engine.uplink.level_aggregate`).

One edge round: every training edge sends its model (with its BatchNorm statistics under
``buffers=average``) to its clients and its stragglers (who receive but never reply), billed;
the clients run the method's local SGD from it, and each uploads its model through the edges'
pipeline (:attr:`~fedhp.engine.context.RunContext.edge_uplink`: client momentum, then the
attack forging the malicious uploads), billed as sent; every edge then turns its clients'
uploads into its next model by its uplink: the edges' robust rule or DP where one is set, else
the method's own ``combine`` (a pure function of the uploads and their weights). The statistics
are the edges' weighted means of the clients' (who keep their own under ``buffers=local``).

The clients train in cache-sized parts (the policy's chunk) on the minibatches the whole round
would draw, drawn ahead, so no more than a part of the client models is held at once. With
several parts each part's uploads are added into their edges' weighted sums in client order
(the fold): the edges' weighted means of the whole round, bit for bit where ``combine`` is that
mean summed in client order (as ``segment_mean`` sums) and declared
:func:`~fedhp.engine.uplink.foldable`; any other ``combine``, a rule, DP or an attack that reads
an edge's uploads at once makes the round one part, and ``combine`` (or the rule) runs on it,
edge by edge. The messages are counted on the device as they go and billed once, at the end.

A batch of runs (``fedhp sweep``'s lockstep: the run level of the tree) is one federation: run
s's clients are a block of rows of the round's ``[ΣC, P]`` client rows, its sampled edges a
block of the ``[ΣE, P]`` edge rows, and each edge round is one pass over all of them::

    w_edge = cat(w_s.expand(E_s, P) for each run s)      # each edge from its run's global model
    for t in range(kappa2):
        sent = truncate(w_edge)                           # down to the clients, counted
        y = sent[edge_of]                                 # each client from its own edge
        kappa1 times:                                     # the engine's train_rows
            x, b = cat(draw_s() for each run s)           # each run's own generator, as alone
            y[rows_s] -= lr_s * grad(y[rows_s]; x, b)     # one model call per group of runs
        up = truncate(y)                                  # the uploads, counted
        w_edge = index_add(edge_of, p * up) / index_add(edge_of, p)              (the fold)

``edge_of`` maps each client to its run's edge row, so every edge sums its own run's clients
only, in client order. Nothing crosses a run's block: every other operation is per row, each
run draws from its own generator, counts its own trained samples, bills its own ledger and gets
its own :class:`~fedhp.algorithms.task.Update`, bit for bit what it gets alone on the CPU
(``tests/algorithms/test_hierfavg_runs.py``). A batch takes only rounds that need none of what
a run alone may have (a rule, DP, an attack, client momentum, BatchNorm statistics, minibatches
drawn by the cloud: the method's ``round_key``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from fedhp.algorithms.base import Algorithm, State, Task
from fedhp.algorithms.task import Update
from fedhp.comm import Message
from fedhp.engine.edges import EdgeBatch, edge_members
from fedhp.engine.local_rows import RunRows, StepDraw, drawn_ahead, part_bounds, train_rows
from fedhp.engine.ops import LocalWork
from fedhp.engine.run_rows import cat_runs, one_draw
from fedhp.engine.sampler import EpochBatches
from fedhp.engine.uplink import MOMENTUM_KEY, Combine, folds_in_parts, level_aggregate

Item = tuple[Algorithm, State, Task]


def plan_edges(algo: Algorithm, state: State) -> Task:
    """A hierarchical round's plan: the sampled edges receive the global model (with its
    statistics under ``buffers=average``), billed; the clients under them train and their
    stragglers only receive."""
    ctx = algo.ctx
    edges = ctx.participation.sample_edges()
    clients, _ = ctx.participation.clients_of_edges(edges)
    down = algo.downlink(state, len(edges))
    assert down is not None
    stragglers = ctx.participation.stragglers_under(edges)
    broadcast = algo.received_broadcast(ctx.send("edge_cloud", "down", down, edges).first())
    return Task(clients, edges, broadcast=broadcast, stragglers=stragglers)


class EdgeRounds:
    """The edge rounds of the runs of ``items`` (a hierarchical round's ``(algorithm, state,
    task)`` of one run, or a batch's, all with one stack key), from the models the edges
    received from the cloud; ``works``: each run's local SGD per edge round. After each
    :meth:`step`, :attr:`models` ``[ΣE, P]`` and :attr:`stats` ``[E, B]`` (or None) are the
    edges'; ``combine``: the method's edge aggregation (where the edges have no rule), streamed
    in parts only where declared :func:`~fedhp.engine.uplink.foldable`. :meth:`updates` bills
    each run's messages and gives its update."""

    def __init__(self, items: Sequence[Item], works: Sequence[LocalWork], combine: Combine) -> None:
        self.items, self.works, self.combine = list(items), list(works), combine
        algo, state, task = self.items[0]
        ctx = algo.ctx
        self.algo, self.ctx, self.state = algo, ctx, state
        tasks = [t for _, _, t in self.items]
        self.batch = edge_batch(self.items)
        self.blocks, self.edge_of = self.batch.clients, self.batch.edge_of
        self.models = cat_runs([t.broadcast["global"].expand(len(_edges(t)), -1) for t in tasks])
        sent = task.broadcast.get("global_buffers")  # (a run alone: a batch has none)
        self.stats = None if sent is None else sent.expand(len(_edges(task)), -1)
        self.weights = cat_runs([a.ctx.client_weights(t.clients) for a, _, t in self.items])
        self.uniform = all(a.ctx.weighting != "samples" for a, _, _ in self.items)
        dtype, n = self.models.dtype, self.blocks.rows
        totals = torch.zeros(self.batch.edges.rows, dtype=dtype, device=self.weights.device)
        totals.index_add_(0, self.edge_of, self.weights.to(dtype))
        self.totals = totals.clamp(min=torch.finfo(dtype).tiny).unsqueeze(1)
        self.uplink = ctx.edge_uplink
        self.momenta = state.get(MOMENTUM_KEY)
        chunk = ctx.policy.chunk(self.models.shape[1] + algo.buffers.width, n)
        noisy = ctx.fed.train.noise_std is not None  # (drawn while gathering)
        whole = noisy or ctx.whole_rounds or not folds_in_parts(combine)
        # A rule reads whole edges: a run alone's round in one part, aggregated edge by edge
        # (a batch's stack key has the edges fold: the fold gives the edges' combine, bit for bit).
        self.whole = whole and len(self.items) == 1
        if self.whole:
            chunk = n
        self.parts = part_bounds(chunk, n, ctx.model if len(self.items) > 1 else None)
        self.runs = [
            RunRows(a.ctx, lo, hi, w.lr)
            for (a, _, _), w, lo, hi in zip(
                self.items, self.works, self.blocks.bounds, self.blocks.bounds[1:], strict=False
            )
        ]
        self.draw = None
        if len(self.items) > 1:  # the batch's minibatches, drawn as one where the runs allow
            contexts, clients = [a.ctx for a, _, _ in self.items], [t.clients for t in tasks]
            pairs = zip(contexts, clients, works, strict=True)
            own = [c.batches(k, w.batch_size) for c, k, w in pairs]
            self.draw = one_draw(contexts, clients, works[0].batch_size, own)
        self.down: list[Tensor] = []  # each edge round's non-zeros, billed by :meth:`updates`
        self.up: list[Tensor] = []
        self.widths = (0, 0)

    def step(self) -> Tensor:
        """One edge round; the clients' losses summed over their steps ``[ΣC]``."""
        message = self.send_down()
        down = message.rows()
        batch = self.batches()
        loss = torch.empty(self.blocks.rows, device=self.weights.device)
        model_sum, stat_sum, ups = torch.zeros_like(self.models), None, []
        for a, b in self.parts:
            received = message.like(down[self.edge_of[a:b]])
            trained, trained_stats, loss[a:b] = self.train_part(received, a, b, batch)
            up, nnz = self.ctx.arrived(self.algo.with_buffers(trained, trained_stats))
            ups.append(nnz)
            self.widths = (self.widths[0], sum(up.widths()))
            params, stats = up["model"], up.get("buffers")
            w = self.weights[a:b].to(self.models.dtype).unsqueeze(1)
            if self.whole:
                model_sum = self.aggregate(params, message["model"])
            else:  # the fold: the edges' weighted sums in client order
                model_sum.index_add_(0, self.edge_of[a:b], params if self.uniform else params * w)
            if stats is not None:
                self.algo.buffers.keep(self.state, self.items[0][2].clients[a:b], stats)
                if stat_sum is None:
                    stat_sum = w.new_zeros(len(self.models), stats.shape[1])
                stat_sum.index_add_(0, self.edge_of[a:b], stats * w)
        self.up.append(cat_runs(ups) if ups else self.weights.new_zeros(0, dtype=torch.int64))
        self.models = model_sum if self.whole and self.parts else model_sum.div_(self.totals)
        if stat_sum is not None:
            self.stats = stat_sum / self.totals
        return loss

    def send_down(self) -> Message:
        """The edges' models (and statistics, unless the clients keep their own) as their
        clients and stragglers receive them, counted (:meth:`updates` bills them)."""
        stats = None if self.stats is None or self.algo.buffers.local else self.stats
        message, nnz = self.ctx.arrived(self.algo.with_buffers(self.models, stats))
        self.down.append(nnz)
        self.widths = (sum(message.widths()), self.widths[1])
        return message

    def batches(self) -> StepDraw | Tensor | EpochBatches | None:
        """This edge round's minibatches: a batch's by step (every step's first where the
        round trains in parts); a run alone's drawn ahead in parts (None: as the steps go)."""
        if self.draw is not None:
            draw = self.draw

            def batch(step: int) -> tuple[Tensor, Tensor]:
                return draw()

            return drawn_ahead(batch, self.works[0].steps) if len(self.parts) > 1 else batch
        if len(self.parts) == 1:
            return None
        return self.ctx.draw_ahead(self.items[0][2].clients, self.works[0])

    def train_part(
        self, received: Message, a: int, b: int, batch: StepDraw | Tensor | EpochBatches | None
    ) -> tuple[Tensor, Tensor | None, Tensor]:
        """The local SGD of the clients of rows ``a .. b - 1`` from the edge models they
        ``received``: a batch's rows as one (the engine's :func:`train_rows`), a run alone's
        through ``ctx.local_sgd`` (with all it may have: BatchNorm statistics, client momentum,
        an attack). What they upload (models, trained statistics) and their summed losses."""
        start, stats = received["model"], None
        if self.draw is not None:
            assert callable(batch)
            loss = train_rows(self.runs, start, (a, b), batch, self.works[0].steps)
            params = start
        else:
            ctx, algo, clients = self.ctx, self.algo, self.items[0][2].clients[a:b]
            stats = algo.buffers.start(self.state, clients, received.get("buffers"))
            drawn = batch
            if isinstance(drawn, EpochBatches):
                drawn = drawn.part(slice(a, b))
            elif drawn is not None:
                assert isinstance(drawn, Tensor)
                drawn = drawn[:, a:b]
            work = self.works[0]
            params, loss, _ = ctx.local_sgd(start, clients, work, buffers=stats, drawn=drawn)
            params = self.uplink.accumulate(params, start, self.momenta, clients)
            params = self.uplink.forge(params, self.batch.ids(0)[a:b], start)
        return params, stats, loss

    def aggregate(self, params: Tensor, sent: Tensor) -> Tensor:
        """Every edge's :func:`~fedhp.engine.uplink.level_aggregate` of the whole round's uploads
        ``params [n, P]``, from the model it sent (``sent [E, P]``): a run alone's."""
        topology, edges = self.ctx.topology, _edges(self.items[0][2])
        members = edge_members(self.edge_of, len(edges))
        sizes = torch.bincount(topology.edge_of_client.cpu(), minlength=topology.num_edges)
        population = sizes.tolist()  # every client under each edge (DP's population)
        out = torch.empty_like(sent)
        for e, (edge, mine) in enumerate(zip(edges.tolist(), members, strict=True)):
            out[e] = level_aggregate(
                self.uplink,
                self.state,
                params[mine],
                self.weights[mine],
                sent[e],
                edge=edge,
                population=population[edge],
                combine=self.combine,
            )
        return out

    def updates(self, losses: Tensor) -> list[Update]:
        """Each run's update: its edges' rows (``model``, with BatchNorm ``buffers``) and its
        clients' ``losses [κ2, C]`` of the rounds' ``[κ2, ΣC]``, its messages billed to its
        ledger (the edges' models to its clients and stragglers, its clients' uploads: every
        edge round's counts at once, integers summed as round by round)."""
        counts = (torch.stack(self.down), torch.stack(self.up))
        out = []
        for s, (algo, _, _) in enumerate(self.items):
            self.batch.bill(s, algo.ctx.ledger, counts, self.widths)
            edge_rows = self.batch.edges.of_run(s)
            per_edge = {"model": self.models[edge_rows]}
            if self.stats is not None:
                per_edge["buffers"] = self.stats
            out.append(Update(per_edge=per_edge, losses=self.blocks.own(losses, s, dim=1)))
        return out


def _edges(task: Task) -> Tensor:
    assert task.edges is not None
    return task.edges


def edge_batch(items: Sequence[Item]) -> EdgeBatch:
    """:meth:`EdgeBatch.of` the rounds of ``items`` (their rows: planted crossings replace it)."""
    return EdgeBatch.of([(algo.ctx, task) for algo, _, task in items])
