"""FedAvg's and FedProx's round for S runs at once — runs as rows (issue 40, ``fedhp sweep``).

S runs of one sweep batch (same model, local steps, minibatch size and step size; their own
seeds, and for FedProx their own μ) train their clients' local SGD as ONE local SGD: run s's
clients (or the clients of its part of the round, :meth:`~fedhp.algorithms.base.Algorithm.
round_parts`) are a block of rows of one ``theta [ΣC, P]``, and every step is one model step
over all of them::

    theta = cat(w_s.expand(C_s, P) for each run s)       # every client starts from its run's w
    loss = zeros(ΣC)
    for step in range(local_steps):
        x, y = cat(draw_s() for each run s)              # each run's own minibatches, as alone
        theta = lerp(theta, w_s[run_of_row], lr * mu_s[row]) - lr * grad(theta; x, y)  # FedProx
        theta = theta - lr * grad(theta; x, y)                                        # FedAvg
        loss += the step's loss at its start point
    update_s = client_update(state_s, task_s, (theta[rows_s], loss[rows_s], local_steps))

The FedProx line is FedProx's step alone (:class:`~fedhp.engine.ops.ProxGrad` folded into the
model's :meth:`~fedhp.models.base.BatchedModel.sgd_step`: ``p - lr (grad + mu (p - w))`` taken as
``lerp(p, w, lr mu) - lr grad``, the pull applied to each layer's columns inside the step), with
each run's own centre ``w_s`` and weight ``lr * mu_s`` on its own rows. Nothing crosses a run's
block: every operation is per row, each run draws its minibatches from its own generator
(gathered from the runs' data stacked once, :mod:`fedhp.engine.run_rows`, where their draws
allow it), counts its own trained samples and gets its own :class:`~fedhp.algorithms.task.Update`
— what :meth:`FedAvg.train <fedhp.algorithms.fedavg.FedAvg.train>` gives it alone, bit for bit on
the CPU (``tests/algorithms/test_fedavg_stacked.py``; ``tests/sweep/test_lockstep.py`` on whole
runs). What one run does alone S times (launches, Python work per step) is done once.

The runs meet through :class:`~fedhp.sweep.lockstep.Lockstep` (:meth:`FedAvg.stack_key`). A
round this module does not cover trains alone (:func:`stack_key` returns None): local epochs,
momentum or weight decay in the local optimizer, gradient clipping, BatchNorm statistics,
stragglers' partial work, client momentum, a rule or attack that needs the whole round at once,
another local objective (MOON, FedNova, Ditto: subclasses), or a round without clients.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from fedhp.algorithms.base import PARTIAL_WORK, State
from fedhp.algorithms.task import Task, Update
from fedhp.data.rows import slice_rows, take_rows
from fedhp.engine.ops import ProxGrad
from fedhp.engine.run_rows import (
    Draw,
    StackedData,
    gathers,
    one_draw,
    per_row,
    stacked_data,
    stacks,
)

if TYPE_CHECKING:
    from fedhp.algorithms.fedavg import FedAvg

StepDraw = Callable[[int], tuple[torch.Tensor, torch.Tensor]]
"""``draw(step)``: every run's minibatch of local step ``step``, run after run (called in step
order)."""


def stack_key(algo: FedAvg, state: State, task: Task) -> Hashable | None:
    """What runs must share to train this round stacked (None: this round trains alone): the
    local work (steps, minibatch size, step size), the kind of local objective (FedAvg's, or
    FedProx's prox term), the model, its execution policy, dtype and device. The runs' clients,
    centres and μ may differ."""
    opt, ctx = algo.options, algo.ctx
    work = opt.work()
    uplink = ctx.cloud_uplink
    w = task.broadcast["global"]
    term = algo.local_extra_grad(w)
    plain = work.epochs is None and work.optimizer is None and opt.clip_grad_norm is None
    plain = plain and not algo.buffers.width and "global_buffers" not in task.broadcast
    plain = plain and PARTIAL_WORK not in task.per_client and len(task.clients) > 0
    plain = plain and not uplink.momentum and not ctx.whole_rounds
    plain = plain and (task.batches is None or isinstance(task.batches, torch.Tensor))
    prox = isinstance(term, ProxGrad) and term.center.dim() == 1
    if not plain or not (term is None or prox) or algo.local_loss_grad(state, task) is not None:
        return None
    model = (type(ctx.model).__qualname__, ctx.model.num_params, ctx.policy)
    steps = (work.steps, work.batch_size, work.lr)
    objective = "prox" if prox else "plain"
    return ("fedavg", objective, steps, model, w.shape[-1], w.dtype, str(w.device))


@dataclass
class _Run:
    """One run's share of the stacked round: its clients ``rows`` (a slice of the stacked rows)
    and its local objective's prox term (None: FedAvg's)."""

    algo: FedAvg
    state: State
    task: Task
    rows: slice
    term: ProxGrad | None


def _pulls(runs: Sequence[_Run], lr: float) -> list[tuple[torch.Tensor, float]]:
    """Each run's prox centre ``w_s [P]`` and pull ``lr * mu_s`` (as its ``ProxGrad.pull``
    computes it), run after run."""
    out = []
    for run in runs:
        assert run.term is not None
        out.append((run.term.center, lr * run.term.mu))
    return out


def stacked_train(items: Sequence[tuple[FedAvg, State, Task]]) -> list[Update]:
    """The local SGD of every run of ``items`` (each ``(algorithm, state, task)`` of one run,
    all with the same :func:`stack_key`) as one; each run's update, as its ``train`` alone."""
    lead = items[0][0]
    work, model = lead.options.work(), lead.ctx.model
    runs, c0 = [], 0
    for algo, state, task in items:
        c = len(task.clients)
        term = algo.local_extra_grad(task.broadcast["global"])
        assert term is None or isinstance(term, ProxGrad)
        runs.append(_Run(algo, state, task, slice(c0, c0 + c), term))
        c0 += c
    theta = torch.cat([r.task.broadcast["global"].expand(len(r.task.clients), -1) for r in runs])
    p = theta.shape[1]
    pull = _Pull.of(runs, theta, work.lr) if runs[0].term is not None else None
    chunk = model.policy.chunk(p, c0)
    bounds = [(a, min(a + chunk, c0)) for a in range(0, c0, chunk)]
    batch = _draws(runs, work.batch_size)  # drawn as the steps go (as a run trained whole)
    if len(bounds) > 1:  # every step's minibatches first, each part its rows (a chunked run)
        drawn = [batch(step) for step in range(work.steps)]

        def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
            return drawn[step]

    losses = torch.empty(c0, device=theta.device)  # (each part's sums, as alone: float32)
    for a, b in bounds:  # cache-sized parts, each trained all its steps before the next
        rows = theta[a:b]
        hook = None if pull is None else pull.hook(theta, a, b)
        loss_sum = torch.zeros(b - a, device=theta.device)
        for step in range(work.steps):
            x, y = batch(step)
            for run in runs:  # each run's own counter of trained samples
                lo, hi = max(a, run.rows.start), min(b, run.rows.stop)
                if lo < hi:
                    run.algo.ctx.model.count_trained(slice_rows(x, lo, hi))
            loss_sum += model.sgd_step(rows, slice_rows(x, a, b), y[a:b], work.lr, hook)
        losses[a:b] = loss_sum
    return [_finish(run, theta, losses, work.steps) for run in runs]


def _finish(run: _Run, theta: torch.Tensor, losses: torch.Tensor, steps: int) -> Update:
    """Run ``run``'s update from its rows (:meth:`~fedhp.algorithms.messages.MessageRows.
    client_update`, as its ``train`` makes it)."""
    ctx = run.algo.ctx
    counts = torch.full((len(run.task.clients),), steps, dtype=torch.int64, device=ctx.device)
    trained = (theta[run.rows], losses[run.rows].clone(), counts)
    return run.algo.client_update(run.state, run.task, trained, None)


def _draws(runs: Sequence[_Run], batch_size: int) -> StepDraw:
    """Every run's minibatches of a step (``draw(step)``), run after run: drawn (or gathered
    from the indices drawn ahead, ``Task.batches``) as one where the runs' draws allow it
    (:mod:`fedhp.engine.run_rows`), else each run's own draw."""
    contexts = [run.algo.ctx for run in runs]
    clients = [run.task.clients for run in runs]
    ahead = [run.task.batches for run in runs]
    if (
        len(runs) > 1
        and stacks(contexts, batch_size)
        and all(isinstance(a, torch.Tensor) for a in ahead)
    ):
        return _gather_ahead(runs, stacked_data(contexts))
    own: list[Draw] = [
        run.algo.ctx.batches(run.task.clients, batch_size, run.task.batches)  # type: ignore[arg-type]
        for run in runs
    ]
    if any(a is not None for a in ahead):  # (drawn ahead by some runs only: each its own)
        contexts, clients = contexts[:1], clients[:1]
    fresh = one_draw(contexts, clients, batch_size, own)
    return lambda step: fresh()


def _gather_ahead(runs: Sequence[_Run], data: StackedData) -> StepDraw:
    """Step ``step``'s minibatches from every run's indices drawn ahead (``[steps, C', B]``,
    within each client), gathered as one from the stacked data."""
    firsts = []
    for run, start in zip(runs, data.starts, strict=True):
        train = run.algo.ctx.fed.train
        firsts.append((train.offsets[run.task.clients] + start).unsqueeze(1))
    first = torch.cat(firsts)

    def gather(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.cat([run.task.batches[step] for run in runs])  # type: ignore[index]
        rows = first.to(idx.device) + idx
        return take_rows(data.x, rows), data.y[rows]

    return gather


@dataclass
class _Pull:
    """FedProx's pull of the stacked rows towards their runs' centres, ``lerp(theta, w_s,
    lr mu_s)`` on each layer's columns inside the model's step (``ProxGrad.pull``). On the CPU
    each run's rows are pulled as alone (its centre, its scalar weight); on a GPU each part's
    centres are gathered and every row pulled in one launch per layer."""

    runs: Sequence[_Run]
    pulls: list[tuple[torch.Tensor, float]]
    run_of_row: torch.Tensor
    weight_rows: float | torch.Tensor
    gather: bool

    @classmethod
    def of(cls, runs: Sequence[_Run], theta: torch.Tensor, lr: float) -> _Pull:
        pulls = _pulls(runs, lr)
        sizes = [r.rows.stop - r.rows.start for r in runs]
        run_of_row = torch.arange(len(runs)).repeat_interleave(torch.tensor(sizes))
        weights = per_row([w for _, w in pulls], sizes, theta)
        gather = gathers(theta.device)
        return cls(runs, pulls, run_of_row.to(theta.device), weights, gather)

    def hook(self, theta: torch.Tensor, a: int, b: int) -> Callable[[int, int], None]:
        """The column hook of the part of rows ``a .. b - 1``."""
        if self.gather:
            return self._gathered(theta, a, b)
        parts = []
        for run, (centre, weight) in zip(self.runs, self.pulls, strict=True):
            lo, hi = max(a, run.rows.start), min(b, run.rows.stop)
            if lo < hi:
                parts.append((theta[lo:hi], centre, weight))

        def towards_centre(lo: int, hi: int) -> None:
            for rows, centre, weight in parts:
                rows[:, lo:hi].lerp_(centre[..., lo:hi], weight)

        return towards_centre

    def _gathered(self, theta: torch.Tensor, a: int, b: int) -> Callable[[int, int], None]:
        centres = torch.stack([centre for centre, _ in self.pulls])
        mine = centres.index_select(0, self.run_of_row[a:b])
        weight = self.weight_rows
        weight = weight if isinstance(weight, float) else weight[a:b]
        rows = theta[a:b]

        def towards_centre(lo: int, hi: int) -> None:
            rows[:, lo:hi].lerp_(mine[:, lo:hi], weight)

        return towards_centre
