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
another local objective (MOON, FedNova: subclasses), or a round without clients. Ditto
stacks its global round here and its personal round with its own :class:`LocalRows`
(:mod:`fedhp.algorithms.ditto`).

Other methods whose round is this plain local SGD with another start, another additive term or
another ending say so with their own :class:`LocalRows`: SCAFFOLD (:mod:`fedhp.algorithms.
scaffold`: each client's correction ``c - c_i`` added to every step, ``theta -= lr * (c - c_i)``
on its rows inside the model's step, as :class:`~fedhp.engine.ops.ConstantGrad` shifts them
alone; its control variates set after) and LocalOnly (:mod:`fedhp.algorithms.local`: each client
from its own model, kept in the state).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, cast

import torch

from fedhp.algorithms.base import PARTIAL_WORK, Algorithm, State
from fedhp.algorithms.stacked_theta import lone_part, part_bounds
from fedhp.algorithms.task import Task, Trained, Update
from fedhp.data.rows import slice_rows, take_rows
from fedhp.engine.ops import ConstantGrad, ProxGrad
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


Term = ProxGrad | ConstantGrad | None
"""A run's additive term of the local gradient: FedProx's pull towards its centre, SCAFFOLD's
constant correction, or none."""


class Pull(Protocol):
    """A stacked round's term inside the model's step (:meth:`LocalRows.pull`)."""

    def hook(self, theta: torch.Tensor, a: int, b: int) -> Callable[[int, int], None]:
        """The column hook of the part of rows ``a .. b - 1``."""
        ...


class LocalRows:
    """How a method's plain round enters and leaves the stacked local SGD. This one is FedAvg's
    and FedProx's: every client starts from the broadcast global model, steps with the method's
    :meth:`~fedhp.algorithms.fedavg.FedAvg.local_extra_grad` and uploads its
    :meth:`~fedhp.algorithms.messages.MessageRows.client_update`. Another method's round (its
    ``train`` the same local SGD from other rows, with another term, or another ending)
    overrides what differs; each method must do exactly what its ``train`` does."""

    name = "fedavg"

    def like(self, algo: Algorithm, state: State, task: Task) -> torch.Tensor:
        """A tensor of the rows' width, dtype and device (for the key; not copied)."""
        return task.broadcast["global"]

    def kind(self, algo: Algorithm, state: State, task: Task) -> str | None:
        """The kind of the round's local objective (runs of one kind meet); None: not covered."""
        fedavg = cast("FedAvg", algo)
        term = fedavg.local_extra_grad(task.broadcast["global"])
        if fedavg.local_loss_grad(state, task) is not None:
            return None
        if term is None:
            return "plain"
        return "prox" if isinstance(term, ProxGrad) and term.center.dim() == 1 else None

    def term(self, algo: Algorithm, state: State, task: Task) -> Term:
        """The run's additive gradient term, as its ``train`` passes it to its local SGD."""
        term = cast("FedAvg", algo).local_extra_grad(task.broadcast["global"])
        assert term is None or isinstance(term, ProxGrad)
        return term

    def start(self, algo: Algorithm, state: State, task: Task) -> torch.Tensor:
        """The clients' start rows ``[C, P]`` (read, not written)."""
        return task.broadcast["global"].expand(len(task.clients), -1)

    def pull(self, runs: Sequence[_Run], theta: torch.Tensor, lr: float) -> Pull | None:
        """The stacked rows' term inside the model's step: FedProx's pull towards each run's
        centre, SCAFFOLD's shift by its correction, or none."""
        if isinstance(runs[0].term, ProxGrad):
            return _Pull.of(runs, theta, lr)
        if isinstance(runs[0].term, ConstantGrad):
            return _Shift.of(runs, theta, lr)
        return None

    def finish(self, algo: Algorithm, state: State, task: Task, trained: Trained) -> Update:
        """The run's update from its local SGD's ``trained`` (parameters, summed losses, step
        counts, as :meth:`~fedhp.engine.context.RunContext.local_sgd` returns them)."""
        return algo.client_update(state, task, trained, None)


FEDAVG = LocalRows()


def stack_key(
    algo: Algorithm, state: State, task: Task, method: LocalRows = FEDAVG
) -> Hashable | None:
    """What runs must share to train this round stacked (None: this round trains alone): the
    method, the local work (steps, minibatch size, step size), the kind of local objective
    (:meth:`LocalRows.kind`: FedAvg's, FedProx's prox term, SCAFFOLD's correction), the model,
    its execution policy, dtype and device. The runs' clients, centres, μ and corrections may
    differ."""
    opt, ctx = algo.options, algo.ctx
    work = opt.work()
    uplink = ctx.cloud_uplink
    plain = work.epochs is None and work.optimizer is None and opt.clip_grad_norm is None
    plain = plain and not algo.buffers.width and "global_buffers" not in task.broadcast
    plain = plain and PARTIAL_WORK not in task.per_client and len(task.clients) > 0
    plain = plain and not uplink.momentum and not ctx.whole_rounds
    plain = plain and (task.batches is None or isinstance(task.batches, torch.Tensor))
    objective = method.kind(algo, state, task) if plain else None
    if objective is None or lone_part(ctx.model, ctx.model.num_params, len(task.clients)):
        return None
    w = method.like(algo, state, task)
    model = (type(ctx.model).__qualname__, ctx.model.num_params, ctx.policy)
    steps = (work.steps, work.batch_size, work.lr)
    return (method.name, objective, steps, model, w.shape[-1], w.dtype, str(w.device))


@dataclass
class _Run:
    """One run's share of the stacked round: its clients ``rows`` (a slice of the stacked rows),
    its local objective's additive term (None: FedAvg's) and its method's :class:`LocalRows`."""

    algo: Algorithm
    state: State
    task: Task
    rows: slice
    term: Term
    method: LocalRows = FEDAVG


def prox_pulls(runs: Sequence[_Run], lr: float) -> list[tuple[torch.Tensor, float]]:
    """Each run's prox centre ``w_s [P]`` and pull ``lr * mu_s`` (as its ``ProxGrad.pull``
    computes it), run after run."""
    out = []
    for run in runs:
        assert isinstance(run.term, ProxGrad)
        out.append((run.term.center, lr * run.term.mu))
    return out


def _shifts(runs: Sequence[_Run]) -> list[torch.Tensor]:
    """Each run's constant correction (SCAFFOLD's ``c - c_i``: ``[C_s, P]``, or ``[P]`` / ``[1,
    P]`` shared by its clients), run after run."""
    out = []
    for run in runs:
        assert isinstance(run.term, ConstantGrad)
        out.append(run.term.term)
    return out


def stacked_train(
    items: Sequence[tuple[Algorithm, State, Task]],
    method: LocalRows = FEDAVG,
    lr: float | None = None,
) -> list[Update]:
    """The local SGD of every run of ``items`` (each ``(algorithm, state, task)`` of one run,
    all with the same :func:`stack_key` under ``method``) as one; each run's update, as its
    ``train`` alone. ``lr``: the step size, where not the options' (Ditto's personal step)."""
    lead = items[0][0]
    work, model = lead.options.work(), lead.ctx.model
    if lr is not None:
        work = dataclasses.replace(work, lr=lr)
    runs, c0 = [], 0
    for algo, state, task in items:
        c = len(task.clients)
        term = method.term(algo, state, task)
        runs.append(_Run(algo, state, task, slice(c0, c0 + c), term, method))
        c0 += c
    theta = torch.cat([r.method.start(r.algo, r.state, r.task) for r in runs])
    p = theta.shape[1]
    pull = method.pull(runs, theta, work.lr)
    bounds = part_bounds(model.policy.chunk(p, c0), c0, model)
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
    """Run ``run``'s update from its rows (:meth:`LocalRows.finish`, as its ``train`` makes
    it)."""
    ctx = run.algo.ctx
    counts = torch.full((len(run.task.clients),), steps, dtype=torch.int64, device=ctx.device)
    trained = (theta[run.rows], losses[run.rows].clone(), counts)
    return run.method.finish(run.algo, run.state, run.task, trained)


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
        pulls = prox_pulls(runs, lr)
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


@dataclass
class _Shift:
    """SCAFFOLD's correction of the stacked rows, ``theta -= lr * (c - c_i)`` on each layer's
    columns inside the model's step (``ConstantGrad.pull``, the same ``add_`` with the same
    ``alpha``: every element as alone). On the CPU each run's rows are shifted by its own
    correction rows, in place; on a GPU the runs' corrections are stacked once per round and each
    part's rows shifted in one launch per layer."""

    runs: Sequence[_Run]
    terms: list[torch.Tensor]
    lr: float
    stacked: torch.Tensor | None

    @classmethod
    def of(cls, runs: Sequence[_Run], theta: torch.Tensor, lr: float) -> _Shift:
        terms = _shifts(runs)
        stacked = None
        if gathers(theta.device):
            sizes = [r.rows.stop - r.rows.start for r in runs]
            stacked = torch.cat([t.expand(n, -1) for t, n in zip(terms, sizes, strict=True)])
        return cls(runs, terms, lr, stacked)

    def hook(self, theta: torch.Tensor, a: int, b: int) -> Callable[[int, int], None]:
        """The column hook of the part of rows ``a .. b - 1``."""
        alpha = -self.lr
        if self.stacked is not None:
            rows, term = theta[a:b], self.stacked[a:b]

            def shift_all(lo: int, hi: int) -> None:
                rows[:, lo:hi].add_(term[:, lo:hi], alpha=alpha)

            return shift_all
        parts = []
        for run, term in zip(self.runs, self.terms, strict=True):
            lo, hi = max(a, run.rows.start), min(b, run.rows.stop)
            if lo < hi:
                mine = (
                    term
                    if term.dim() == 1 or term.shape[0] == 1
                    else term[lo - run.rows.start : hi - run.rows.start]
                )
                parts.append((theta[lo:hi], mine))

        def shift(lo: int, hi: int) -> None:
            for rows, mine in parts:
                rows[:, lo:hi].add_(mine[..., lo:hi], alpha=alpha)

        return shift
