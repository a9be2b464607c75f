"""The centralized reference's round for S runs at once — runs as rows (issue 40, ``fedhp sweep``).

S runs of one sweep batch (same model, local steps and pooled minibatch size; their own seeds,
so their own data, initial models and draws, and their own step sizes) train their one model each
as ONE batched model: run s's model is row s of ``w [S, P]``::

    w = cat(w_s for each run s)                          # [S, P]
    idx_s = run s's draws for every step, from its own generator, as alone
    for step in range(local_steps):
        x, y = stack(pooled_s[idx_s[step]] for each run s)   # [S, B, ...]: one gather
        loss, grad = loss_and_grad(w; x, y)              # row s: run s's loss and gradient
        w_s = w_s - lr_s * grad_s
        loss_total_s += loss_s                           # (float64, as alone)

Each row is what :meth:`Centralized.train <fedhp.algorithms.centralized.Centralized.train>`
computes alone: the model's rows share no parameters, each run draws its indices from its own
generator and reads its own pooled data (the runs' data stacked once, :mod:`fedhp.engine.
run_rows`), counts its own trained samples, and its step is its own row's ``add_`` with its own
step size. Bit for bit on the CPU (``tests/algorithms/test_centralized_stacked.py``).

A round this module does not cover trains alone (:func:`stack_key` returns None): gradient
clipping, sparse features, and a model that may compute one row with other kernels than several
(``BatchedModel.rows_independent`` false: every model but the hand-batched MLPs and linear models,
e.g. the vmap'ed convolutions — a run alone is one row), and so BatchNorm statistics.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

import torch

from fedhp.algorithms.base import State
from fedhp.algorithms.task import Task, Update
from fedhp.data.rows import take_rows
from fedhp.engine.run_rows import gathers, stacked_data

if TYPE_CHECKING:
    from fedhp.algorithms.centralized import Centralized


def stack_key(algo: Centralized, state: State, task: Task) -> Hashable | None:
    """What runs must share to train this round stacked (None: it trains alone): the steps, the
    pooled minibatch size, the model, its policy, the model's and the data's dtype, shape and
    device. Seeds and lr may differ."""
    ctx, opt = algo.ctx, algo.options
    train, model = ctx.fed.train, ctx.model
    if opt.clip_grad_norm is not None or train.x.is_sparse or algo.buffers.width:
        return None
    if not model.rows_independent:  # (a run alone is one row)
        return None
    w = state["global"]
    data = (tuple(train.x.shape[1:]), train.x.dtype, str(train.x.device))
    steps = (opt.local_steps, opt.batch_size * ctx.num_clients)
    arch = (type(model).__qualname__, model.num_params, ctx.policy)
    return ("centralized", steps, arch, w.dtype, str(w.device), data)


def stacked_train(items: Sequence[tuple[Centralized, State, Task]]) -> list[Update]:
    """The round of every run of ``items`` (each ``(algorithm, state, task)`` of one run, all with
    the same :func:`stack_key`) as one; each run's state written and its update returned, as its
    ``train`` alone."""
    algos = [algo for algo, _, _ in items]
    contexts = [algo.ctx for algo in algos]
    lead = algos[0]
    model = lead.ctx.model
    data = stacked_data(contexts)
    drawn = [algo.draw_indices() for algo in algos]  # [steps, B] each, its own generator
    device = drawn[0].device
    starts = torch.tensor(data.starts, device=device).view(-1, 1, 1)
    rows = torch.stack(drawn) + starts  # [S, steps, B] into the stacked data
    params = torch.stack([state["global"] for _, state, _ in items])
    lrs = [algo.options.lr for algo in algos]
    loss_total = torch.zeros(len(items), dtype=torch.float64, device=params.device)
    for step in range(lead.options.local_steps):
        at = rows[:, step]
        x, y = take_rows(data.x, at), data.y[at]
        for s, algo in enumerate(algos):  # each run's own counter of trained samples
            algo.ctx.model.count_trained(x[s : s + 1])
        loss, grad = model.loss_and_grad(params.detach(), x, y)
        _descend(params, grad, lrs)
        loss_total += loss.double()
    updates = []
    for s, (_, state, _) in enumerate(items):
        state["global"] = params[s].clone()  # (its own storage, as alone: checkpoints)
        updates.append(Update(losses=loss_total[s].reshape(1, 1)))
    return updates


def _descend(params: torch.Tensor, grad: torch.Tensor, lrs: list[float]) -> None:
    """``w_s -= lr_s grad_s`` on every row, as alone: on the CPU each row's own ``add_`` with its
    step size; on a GPU one ``add_`` per block of neighbouring runs of one step size (a grid's
    seeds)."""
    blocks = (
        _same_lr_blocks(lrs) if gathers(params.device) else [(s, s + 1) for s in range(len(lrs))]
    )
    for a, b in blocks:
        params[a:b].add_(grad[a:b], alpha=-lrs[a])


def _same_lr_blocks(lrs: list[float]) -> list[tuple[int, int]]:
    """The blocks ``(a, b)`` of neighbouring runs with one step size."""
    starts = [s for s in range(len(lrs)) if s == 0 or lrs[s] != lrs[s - 1]]
    return list(zip(starts, [*starts[1:], len(lrs)], strict=True))
