"""HierFAVG's edge rounds for S runs at once — runs as rows (issue 40, ``fedhp sweep``).

S runs of one sweep batch (same model, κ1, κ2, minibatch size; their own seeds, sampled edges
and step sizes lr_s) train their κ2 edge rounds as ONE: run s's clients are a block of rows of
one ``[ΣC, P]`` tensor, its sampled edges a block of one ``w_edge [ΣE, P]``, and each edge round
is one pass over all of them, as :class:`~fedhp.algorithms.edge_rounds.EdgeRounds` makes it for
one run::

    w_edge = cat(w_s.expand(E_s, P) for each run s)      # each edge from its run's global model
    for t in range(kappa2):
        sent = truncate(w_edge)                           # down to the clients, billed per run
        y = sent[edge_of]                                 # each client from its own edge
        kappa1 times:
            x, b = cat(draw_s() for each run s)           # each run's own generator, as alone
            y[rows_s] -= lr_s * grad(y[rows_s]; x, b)     # one model call per group of runs
        up = truncate(y)                                  # the uploads, billed per run
        w_edge = index_add(edge_of, p * up) / index_add(edge_of, p)              (edge_mean)

``edge_of`` maps each client to its run's edge row (run s's edges follow run s − 1's), so every
edge sums its own run's clients only, in client order: each run's
:func:`~fedhp.algorithms.hierfavg.edge_mean`, folded part by part as ``EdgeRounds`` folds it
(bit for bit its whole-round form). Nothing crosses a run's block: every other operation is per
row, each run draws its minibatches from its own generator (one draw for all where
:mod:`fedhp.engine.run_rows` allows it), counts its own trained samples, bills its own ledger
and gets its own :class:`~fedhp.algorithms.task.Update` — what :meth:`HierFAVG.train
<fedhp.algorithms.hierfavg.HierFAVG.train>` gives it alone, bit for bit on the CPU
(``tests/algorithms/test_hierfavg_stacked.py``; with a model through the generic autograd
step, a CNN, too: where alone a part of ONE client would be trained, whose call rounds otherwise
than among others, the round trains alone, :func:`~fedhp.engine.local_rows.lone_part`). The step
size enters the model's step as the scalar its kernels take (a per-row column would round the
step otherwise), so the model is called once per part for each group of consecutive runs sharing
lr: once for a batch of seeds, once per value of an lr grid (a sweep lists its runs point by
point).

The runs meet through :class:`~fedhp.sweep.lockstep.Lockstep` (``HierFAVG.stack_key``). A
round this module does not cover trains alone (:func:`stack_key` returns None): a robust or DP
rule at the edges, any attack, client momentum, BatchNorm statistics (``buffers``), minibatches
drawn ahead by the cloud, or a round without clients. Stragglers (they only receive) and failed
edges or clients stack.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from fedhp.algorithms.base import State
from fedhp.algorithms.task import Task, Update
from fedhp.comm.codec import count_nonzero, truncate
from fedhp.data.rows import slice_rows
from fedhp.engine.local_rows import lone_part, part_bounds
from fedhp.engine.run_rows import Draw, one_draw, rows_key

if TYPE_CHECKING:
    from fedhp.algorithms.hierfavg import HierFAVG


def stack_key(algo: HierFAVG, state: State, task: Task) -> Hashable | None:
    """What runs must share to train this round stacked (None: this round trains alone): κ1,
    κ2, the minibatch size, the model and its execution policy, the received model's size, type
    and device, and the zero threshold. Their seeds, edges, clients and lr may differ."""
    opt, ctx = algo.options, algo.ctx
    uplink = ctx.edge_uplink
    honest = ctx.attack is None and uplink.attack is None
    plain = uplink.folds and not uplink.momentum and not algo.buffers.width
    plain = plain and "global_buffers" not in task.broadcast and task.batches is None
    if not (honest and plain and len(task.clients) > 0):
        return None
    if lone_part(ctx.model, ctx.model.num_params, len(task.clients)):
        return None
    steps = (opt.kappa1, opt.kappa2, opt.batch_size, ctx.policy)
    return rows_key("hierfavg", ctx, task.broadcast["global"], steps)


@dataclass
class EdgeRun:
    """One run's share of the stacked round: its clients ``rows`` and sampled edges
    ``edge_rows`` (slices of the stacked tensors), its own draw, and whom it bills."""

    algo: HierFAVG
    task: Task
    rows: slice
    draw: Draw
    edge_rows: slice
    ids: torch.Tensor  # the clients' global ids (ledger)
    recv_seg: torch.Tensor  # receivers of the edges' models (clients, stragglers): edge pos.
    recv_ids: torch.Tensor


def edge_runs(items: Sequence[tuple[HierFAVG, State, Task]]) -> tuple[list[EdgeRun], int, int]:
    """Each run's share of the stacked round (:class:`EdgeRun`), and the stacked clients' and
    edges' counts."""
    runs, c0, e0 = [], 0, 0
    for algo, _, task in items:
        ctx, edges = algo.ctx, task.edges
        assert edges is not None
        c, n = len(task.clients), len(edges)
        late = task.stragglers if task.stragglers is not None else task.clients[:0]
        ids = ctx.global_clients(task.clients)
        recv_seg = torch.cat(
            (ctx.edge_positions(task.clients, edges), ctx.edge_positions(late, edges))
        )
        draw = ctx.batches(task.clients, algo.options.batch_size)
        recv_ids = torch.cat((ids, ctx.global_clients(late)))
        runs.append(
            EdgeRun(algo, task, slice(c0, c0 + c), draw, slice(e0, e0 + n), ids, recv_seg, recv_ids)
        )
        c0, e0 = c0 + c, e0 + n
    return runs, c0, e0


def edge_rows_of(runs: Sequence[EdgeRun]) -> torch.Tensor:
    """Each stacked client's edge as a row of the stacked edges ``[ΣC]`` (run s's edges follow
    run s - 1's)."""
    return torch.cat([r.recv_seg[: len(r.task.clients)] + r.edge_rows.start for r in runs])


def blocks(runs: Sequence[EdgeRun], a: int, b: int) -> list[tuple[int, int, EdgeRun]]:
    """Each run's rows among ``a .. b - 1``: ``(first, end, run)``."""
    out = []
    for run in runs:
        lo, hi = max(a, run.rows.start), min(b, run.rows.stop)
        if lo < hi:
            out.append((lo, hi, run))
    return out


def lr_groups(runs: Sequence[EdgeRun]) -> list[tuple[int, int, float]]:
    """The stacked rows ``(first, end, lr)`` of each group of consecutive runs sharing lr."""
    out: list[tuple[int, int, float]] = []
    for run in runs:
        lr = run.algo.options.lr
        if out and out[-1][2] == lr:
            out[-1] = (out[-1][0], run.rows.stop, lr)
        else:
            out.append((run.rows.start, run.rows.stop, lr))
    return out


def stacked_train(items: Sequence[tuple[HierFAVG, State, Task]]) -> list[Update]:
    """The κ2 edge rounds of every run of ``items`` (each ``(algorithm, state, task)`` of one
    run, all with the same :func:`stack_key`) as one; each run's update, as alone."""
    lead = items[0][0]
    opt, eps = lead.options, lead.ctx.zero_threshold
    runs, c0, e0 = edge_runs(items)
    edge_of = edge_rows_of(runs)
    w_edge = torch.cat([r.task.broadcast["global"].expand(len(r.task.edges), -1) for r in runs])  # type: ignore[arg-type]
    p, dtype = w_edge.shape[1], w_edge.dtype
    weights = torch.cat([r.algo.ctx.client_weights(r.task.clients) for r in runs]).to(dtype)
    uniform = bool((weights == 1).all())
    totals = torch.zeros(e0, dtype=dtype, device=w_edge.device).index_add_(0, edge_of, weights)
    denominator = totals.clamp(min=torch.finfo(dtype).tiny).unsqueeze(1)
    chunk = lead.ctx.policy.chunk(p, c0)
    bounds = part_bounds(chunk, c0, lead.ctx.model)
    groups = lr_groups(runs)
    buffer = w_edge.new_empty(min(chunk, c0), p)
    down_counts = torch.empty(opt.kappa2, e0, dtype=torch.int64, device=w_edge.device)
    up_counts = torch.empty(opt.kappa2, c0, dtype=torch.int64, device=w_edge.device)
    losses = torch.empty(opt.kappa2, c0, device=w_edge.device)
    contexts, clients = [r.algo.ctx for r in runs], [r.task.clients for r in runs]
    draw = one_draw(contexts, clients, opt.batch_size, [r.draw for r in runs])
    for t in range(opt.kappa2):
        sent = truncate(w_edge, eps)
        down_counts[t] = count_nonzero(sent, eps)
        batch = _batches(draw, opt.kappa1, len(bounds) > 1)
        edge_sum = torch.zeros_like(w_edge)
        for a, b in bounds:  # cache-sized parts, each trained κ1 steps, then uploaded
            trained = torch.index_select(sent, 0, edge_of[a:b], out=buffer[: b - a])
            losses[t, a:b] = _local_steps(runs, groups, trained, (a, b), batch, opt.kappa1)
            up = truncate(trained, eps)
            up_counts[t, a:b] = count_nonzero(up, eps)
            if not uniform:
                up = up.mul(weights[a:b].unsqueeze(1))
            edge_sum.index_add_(0, edge_of[a:b], up)
        w_edge = edge_sum.div_(denominator)
    return [_finish(run, w_edge, down_counts, up_counts, losses) for run in runs]


def _batches(
    draw: Callable[[], tuple[torch.Tensor, torch.Tensor]], steps: int, ahead: bool
) -> Callable[[int], tuple[torch.Tensor, torch.Tensor]]:
    """An edge round's minibatches by step: drawn as the steps go (one part), or every step's
    first (several parts, each its rows), in each run's order alone."""
    if not ahead:
        return lambda step: draw()
    drawn = [draw() for _ in range(steps)]
    return drawn.__getitem__


def _local_steps(
    runs: Sequence[EdgeRun],
    groups: Sequence[tuple[int, int, float]],
    rows: torch.Tensor,
    part: tuple[int, int],
    batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
    steps: int,
) -> torch.Tensor:
    """``steps`` SGD steps of the stacked rows ``part = (a, b)`` (``rows``, in place), each
    group of runs at its own lr, every run's own counter of trained samples kept; each row's
    loss summed over the steps."""
    a, b = part
    model = runs[0].algo.ctx.model
    mine = [(max(lo, a), min(hi, b), lr) for lo, hi, lr in groups if lo < b and hi > a]
    mine_runs = blocks(runs, a, b)
    loss_sum = torch.zeros(b - a, device=rows.device)
    for step in range(steps):
        x, y = batch(step)
        for lo, hi, run in mine_runs:
            run.algo.ctx.model.count_trained(slice_rows(x, lo, hi))
        for lo, hi, lr in mine:
            own = slice(lo - a, hi - a)
            loss_sum[own] += model.sgd_step(rows[own], slice_rows(x, lo, hi), y[lo:hi], lr)
    return loss_sum


def _finish(
    run: EdgeRun,
    w_edge: torch.Tensor,
    down_counts: torch.Tensor,
    up_counts: torch.Tensor,
    losses: torch.Tensor,
) -> Update:
    """Run ``run``'s share of the stacked round: its messages billed to its ledger (the edges'
    models to its clients and its stragglers, its clients' uploads: every edge round's counts at
    once, integers summed as alone sums them round by round) and its update, as
    :meth:`HierFAVG.train <fedhp.algorithms.hierfavg.HierFAVG.train>` returns it."""
    ledger, p = run.algo.ctx.ledger, w_edge.shape[1]
    down = down_counts[:, run.edge_rows][:, run.recv_seg]  # [κ2, receivers]
    ledger.record_counts("client_edge", "down", down, p, run.recv_ids.expand_as(down))
    up = up_counts[:, run.rows]
    ledger.record_counts("client_edge", "up", up, p, run.ids.expand_as(up))
    return Update(per_edge={"model": w_edge[run.edge_rows]}, losses=losses[:, run.rows].clone())
