"""The client→edge rounds below the cloud of a hierarchy whose edges aggregate their clients'
models: :func:`plan_edges` (the cloud's side), :class:`EdgeRounds` (below it), and a
level's aggregate through its uplink, :func:`level_aggregate`.

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
an edge's uploads at once makes the round one part, and ``combine`` (or the rule) runs on it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedhp.algorithms.base import Algorithm, State, Task
from fedhp.comm import Message
from fedhp.engine.ops import LocalWork, weighted_mean
from fedhp.engine.sampler import EpochBatches
from fedhp.engine.uplink import CENTRE_KEYS, MOMENTUM_KEY, Combine, Uplink, folds_in_parts


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


def level_aggregate(
    uplink: Uplink,
    state: State,
    rows: Tensor,
    weights: Tensor,
    start: Tensor,
    *,
    edge: int = 0,
    population: int | None = None,
    combine: Combine = weighted_mean,
) -> Tensor:
    """``uplink``'s aggregate ``[P]`` (at the cloud, or at edge ``edge``) of the ``rows [n, P]``
    that arrived with their ``weights [n]`` from senders who received ``start [P]``: its rule
    (``population``: the clients the senders were drawn from, for DP's Poisson denominator),
    else the method's ``combine``. A centred rule (``cclip``) measures from the level's previous
    aggregate update, kept in ``state`` (:data:`~fedhp.engine.uplink.CENTRE_KEYS`: ``[P]`` at
    the cloud, row ``edge`` of ``[E, P]`` at the edges), which this one's replaces."""
    key = CENTRE_KEYS[uplink.level]
    centres = state.get(key) if uplink.centred else None
    if centres is None:
        return uplink.aggregate(rows, weights, start, population, combine=combine)
    at_edge = uplink.level == "edge"
    centre = centres[edge] if at_edge else centres
    out = uplink.aggregate(rows, weights, start, population, centre, combine=combine)
    if at_edge:  # the next aggregation's centre: this one's update
        centres[edge] = out - start
    else:
        state[key] = out - start
    return out


def edge_members(seg: Tensor, num_edges: int) -> list[slice | Tensor]:
    """The rows of each edge's clients in a round (``seg [n]``: each client's edge position):
    a slice where they are contiguous (a view, no copy), else their indices; one host read."""
    rows: list[list[int]] = [[] for _ in range(num_edges)]
    for row, e in enumerate(seg.tolist()):
        rows[e].append(row)
    out: list[slice | Tensor] = []
    for mine in rows:
        if not mine or mine[-1] - mine[0] == len(mine) - 1:
            out.append(slice(mine[0], mine[-1] + 1) if mine else slice(0, 0))
        else:
            out.append(torch.tensor(mine, dtype=torch.long, device=seg.device))
    return out


class EdgeRounds:
    """The edge rounds of ``task`` (a hierarchical round of ``algo``), from the models the
    edges received from the cloud; ``work``: each client's local SGD per edge round. After each
    :meth:`step`, :attr:`models` ``[E', P]`` and :attr:`stats` ``[E', B]`` (or None) are the
    edges'; ``combine``: the method's edge aggregation (where the edges have no rule), streamed
    in parts only where declared :func:`~fedhp.engine.uplink.foldable`."""

    def __init__(
        self, algo: Algorithm, state: State, task: Task, work: LocalWork, combine: Combine
    ) -> None:
        ctx = algo.ctx
        clients, edges = task.clients, task.edges
        assert edges is not None
        self.algo, self.ctx, self.state, self.work, self.clients = algo, ctx, state, work, clients
        self.combine = combine
        self.seg, self.ids = ctx.edge_positions(clients, edges), ctx.global_clients(clients)
        late = task.stragglers if task.stragglers is not None else clients[:0]
        self.late_seg, self.late_ids = ctx.edge_positions(late, edges), ctx.global_clients(late)
        self.models = task.broadcast["global"].expand(len(edges), -1)
        sent = task.broadcast.get("global_buffers")
        self.stats = None if sent is None else sent.expand(len(edges), -1)
        self.weights = ctx.client_weights(clients)
        dtype = self.models.dtype
        totals = torch.zeros(len(edges), dtype=dtype, device=self.weights.device)
        totals.index_add_(0, self.seg, self.weights.to(dtype))
        self.totals = totals.clamp(min=torch.finfo(dtype).tiny).unsqueeze(1)
        self.uplink = ctx.edge_uplink
        self.momenta = state.get(MOMENTUM_KEY)
        n = len(clients)
        chunk = ctx.policy.chunk(self.models.shape[1] + algo.buffers.width, n)
        if ctx.fed.train.noise_std is not None or ctx.whole_rounds or not folds_in_parts(combine):
            chunk = n  # per-access noise is drawn while gathering; a rule reads whole edges
        self.parts = [slice(a, min(a + chunk, n)) for a in range(0, n, chunk)]
        self.edge_ids = edges.tolist() if len(self.parts) == 1 else []
        self.members = edge_members(self.seg, len(edges)) if len(self.parts) == 1 else []
        sizes = torch.bincount(ctx.topology.edge_of_client.cpu(), minlength=ctx.topology.num_edges)
        self.sizes = sizes.tolist()  # every client under each edge (DP's population)

    def step(self) -> Tensor:
        """One edge round; the clients' losses summed over their steps ``[n]``."""
        message = self.send_down()
        whole = len(self.parts) == 1
        drawn = None if whole else self.ctx.draw_ahead(self.clients, self.work)
        loss = torch.empty(len(self.clients), device=self.weights.device)
        down, model_sum, stat_sum = message.rows(), torch.zeros_like(self.models), None
        for rows in self.parts:
            params, stats, loss[rows] = self.train_part(
                message.like(down[self.seg[rows]]), rows, drawn
            )
            w = self.weights[rows].to(self.models.dtype).unsqueeze(1)
            if whole:
                model_sum = self.aggregate(params, message["model"])
            else:  # the fold: the edges' weighted sums in client order
                model_sum.index_add_(0, self.seg[rows], params * w)
            if stats is not None:
                self.algo.buffers.keep(self.state, self.clients[rows], stats)
                if stat_sum is None:
                    stat_sum = w.new_zeros(len(self.models), stats.shape[1])
                stat_sum.index_add_(0, self.seg[rows], stats * w)
        self.models = model_sum if whole else model_sum / self.totals
        if stat_sum is not None:
            self.stats = stat_sum / self.totals
        return loss

    def per_edge(self) -> dict[str, Tensor]:
        """The edges' rows as ``Update.per_edge``: ``model`` and, with BatchNorm, ``buffers``."""
        out = {"model": self.models}
        if self.stats is not None:
            out["buffers"] = self.stats
        return out

    def send_down(self) -> Message:
        """The edges' models (and statistics, unless the clients keep their own) to their
        clients and stragglers, billed to each; the message as the clients receive it."""
        ctx, algo = self.ctx, self.algo
        stats = None if self.stats is None or algo.buffers.local else self.stats
        message = ctx.multicast(
            "client_edge", "down", algo.with_buffers(self.models, stats), self.seg, self.ids
        )
        if len(self.late_ids):  # the stragglers receive it too; their replies never arrive
            ctx.multicast("client_edge", "down", message, self.late_seg, self.late_ids)
        return message

    def train_part(
        self, received: Message, rows: slice, drawn: Tensor | EpochBatches | None
    ) -> tuple[Tensor, Tensor | None, Tensor]:
        """The local SGD of the clients in ``rows`` from the edge models they ``received``, on
        their ``drawn`` minibatches (None: drawn as they go); their uploads (models, trained
        statistics) as the edges receive them, and their summed losses."""
        ctx, algo, clients = self.ctx, self.algo, self.clients[rows]
        start = received["model"]
        stats = algo.buffers.start(self.state, clients, received.get("buffers"))
        if drawn is not None:
            drawn = drawn.part(rows) if isinstance(drawn, EpochBatches) else drawn[:, rows]
        params, loss, _ = ctx.local_sgd(start, clients, self.work, buffers=stats, drawn=drawn)
        params = self.uplink.accumulate(params, start, self.momenta, clients)
        params = self.uplink.forge(params, self.ids[rows], start)
        up = ctx.send("client_edge", "up", algo.with_buffers(params, stats), self.ids[rows])
        return up["model"], up.get("buffers"), loss

    def aggregate(self, params: Tensor, sent: Tensor) -> Tensor:
        """Every edge's :func:`level_aggregate` of the whole round's uploads ``params [n, P]``,
        from the model it sent (``sent [E', P]``)."""
        out = torch.empty_like(sent)
        for e, (edge, mine) in enumerate(zip(self.edge_ids, self.members, strict=True)):
            out[e] = level_aggregate(
                self.uplink,
                self.state,
                params[mine],
                self.weights[mine],
                sent[e],
                edge=edge,
                population=self.sizes[edge],
                combine=self.combine,
            )
        return out
