"""Per-FedAvg's round for S runs at once — runs as rows (issue 40, ``fedhp sweep``).

S runs of one sweep batch (same model, variant, local steps and minibatch size; their own seeds,
clients sampled, α and β) train their clients' meta-steps as ONE: run s's clients are a block of
rows of one ``w [ΣC, P]``, and every step is one pass over all of them, written as
:meth:`PerFedAvg.meta_step <fedhp.algorithms.perfedavg.PerFedAvg.meta_step>` writes it for one
run::

    w = cat(w_s.expand(C_s, P) for each run s)    # every client starts from its run's model
    for step in range(local_steps):
        x1, y1 = cat(draw_s() for each run s)     # each run's own generator, as alone
        loss, g1 = grad f(w; x1, y1)
        x2, y2 = cat(draw_s() for each run s)
        g = grad f(w - alpha[row] * g1; x2, y2)
        HF: x3, y3 = cat(draw_s() for each run s)
            g = g - alpha[row] * H(w; x3, y3) g   # the Hessian-vector product, row by row
        w = w - beta[row] * g
    update_s = (w[rows_s], the D1 losses of rows_s)

Nothing crosses a run's block: the model's gradients and Hessian-vector products are per row
(clients share no parameters), each run's α and β enter as its rows' values
(:func:`~fedhp.engine.run_rows.per_row`: a ``[ΣC, 1]`` column, or the scalar itself where every
run has the same; a float32 product either way, as alone), each run draws its minibatches from its
own generator (as one draw where the runs' draws allow it, :mod:`fedhp.engine.run_rows`), counts
its own trained samples and gets its own :class:`~fedhp.algorithms.task.Update` — what
:meth:`PerFedAvg.train <fedhp.algorithms.perfedavg.PerFedAvg.train>` gives it alone, bit for bit
on the CPU (``tests/algorithms/test_perfedavg_stacked.py``; ``tests/sweep/test_lockstep.py`` on
whole runs). Its steps are out of place alone, so the stacked form is the same on the CPU and on
a GPU: one launch per operation for every row. Aggregation stays each run's own ``aggregate``.

The runs meet through :class:`~fedhp.sweep.lockstep.Lockstep` (:meth:`PerFedAvg.stack_key
<fedhp.algorithms.perfedavg.PerFedAvg.stack_key>`). Per-FedAvg trains its round whole (it folds
no parts) and its ``train`` reads nothing of the round but the clients and the received model:
attacks and robust rules act in ``aggregate``, label flips in the run's data, the device model
outside ``train``; data drawn in another way (with replacement, feature noise, sparse features)
is drawn run by run and trained stacked. Only a round without clients (or with minibatches drawn
ahead, which Per-FedAvg never draws) trains alone (:func:`stack_key` returns None).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from fedhp.algorithms.base import State
from fedhp.algorithms.stacked_theta import (
    StackedRun,
    blocks,
    flat_runs,
    one_draw_of,
    theta_stack_key,
)
from fedhp.algorithms.task import Task, Update
from fedhp.data.rows import slice_rows
from fedhp.engine.run_rows import per_row

if TYPE_CHECKING:
    from fedhp.algorithms.perfedavg import PerFedAvg


def stack_key(algo: PerFedAvg, state: State, task: Task) -> Hashable | None:
    """What runs must share to train this round stacked (None: this round trains alone): the
    variant, the local steps, the minibatch size, the model and its execution policy, the
    received model's size, dtype and device (and the zero threshold). Seeds, clients, α and β
    may differ."""
    opt, ctx = algo.options, algo.ctx
    if len(task.clients) == 0 or task.batches is not None:
        return None
    steps = (opt.variant, opt.local_steps, opt.batch_size, ctx.policy)
    return theta_stack_key("perfedavg", algo, task, steps)


@dataclass
class _Run(StackedRun["PerFedAvg"]):
    """One run's share of the stacked round (its rows, its own draw)."""


def stacked_train(items: Sequence[tuple[PerFedAvg, State, Task]]) -> list[Update]:
    """The ``local_steps`` meta-steps of every run of ``items`` (each ``(algorithm, state,
    task)``, all with the same :func:`stack_key`) as one; each run's update, as its ``train``
    gives it alone."""
    from fedhp.algorithms.perfedavg import batched_hvp  # (perfedavg imports this module)

    lead = items[0][0]
    opt = lead.options
    runs, params = flat_runs(items, opt.batch_size, _Run)
    sizes = [r.rows.stop - r.rows.start for r in runs]
    alpha = per_row([r.algo.options.alpha for r in runs], sizes, params)
    beta = per_row([r.algo.options.beta for r in runs], sizes, params)
    draw = one_draw_of(runs, opt.batch_size)
    model = lead.ctx.model
    losses = []
    for _ in range(opt.local_steps):  # PerFedAvg.meta_step on every run's rows
        x1, y1 = draw()
        loss, g1 = _loss_grad(runs, params, x1, y1)
        x2, y2 = draw()
        _, g = _loss_grad(runs, params - alpha * g1, x2, y2)
        if opt.variant == "hf":
            x3, y3 = draw()
            g = g - alpha * batched_hvp(model, params, x3, y3, g)
        params = params - beta * g
        losses.append(loss)
    return [_finish(run, params, torch.stack(losses)) for run in runs]


def _loss_grad(
    runs: Sequence[_Run], params: torch.Tensor, x: torch.Tensor, y: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`~fedhp.engine.ops.batched_loss_grad` on every run's rows at once, each run's own
    counter of trained samples kept."""
    for lo, hi, run in blocks(runs, 0, params.shape[0]):
        run.algo.ctx.model.count_trained(slice_rows(x, lo, hi))
    return runs[0].algo.ctx.model.loss_and_grad(params.detach(), x, y)


def _finish(run: _Run, params: torch.Tensor, losses: torch.Tensor) -> Update:
    """Run ``run``'s update from its rows (as :meth:`PerFedAvg.train
    <fedhp.algorithms.perfedavg.PerFedAvg.train>` returns it)."""
    return Update(
        per_client={"model": params[run.rows].clone()}, losses=losses[:, run.rows].clone()
    )
