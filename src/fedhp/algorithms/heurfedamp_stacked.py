"""HeurFedAMP's round below the cloud for S runs at once — runs as rows (issue 40, ``fedhp sweep``).

S runs of one sweep batch (same model, local steps, minibatch size and step size; their own
seeds, clients and personalized cloud models, and their own λ / α_k) train their clients' local
SGD as ONE local SGD: run s's sampled clients are a block of rows of one ``theta [ΣC, P]``, each
starting from, and pulled towards, its own cloud model ``u_i`` (the attention over its run's
models, built per run in ``plan``)::

    theta = cat(u_s for each run s)                      # client i of run s starts at u_i
    loss = zeros(ΣC)
    for step in range(local_steps):
        x, y = cat(draw_s() for each run s)              # each run's own minibatches, as alone
        theta = lerp(theta, u[row], lr * lam_s / alpha_k_s) - lr * grad(theta; x, y)
        loss += the step's loss at its start point
    update_s = {"model": theta[rows_s]}, loss[rows_s], local_steps

The line is HeurFedAMP's step alone (``prox_grad(u, lam / alpha_k)`` folded into the model's
:meth:`~fedhp.models.base.BatchedModel.sgd_step`, the pull ``lerp(p, u_i, lr mu)`` applied to each
layer's columns inside the step), every row with its own centre ``u_i`` and its run's weight.
Nothing crosses a run's block: every operation is per row, each run draws its minibatches from its
own generator (gathered from the runs' data stacked once, :mod:`fedhp.engine.run_rows`, where
their draws allow it), counts its own trained samples and gets its own
:class:`~fedhp.algorithms.task.Update` — what :meth:`HeurFedAMP.train
<fedhp.algorithms.heurfedamp.HeurFedAMP.train>` gives it alone, bit for bit on the CPU
(``tests/algorithms/test_heurfedamp_stacked.py``). The attention and the aggregation stay each
run's own, in its ``plan`` and ``aggregate``.

The round enters and leaves through FedAvg's stacked local SGD's pieces
(:mod:`fedhp.algorithms.fedavg_stacked`: the key, the draws, each run's finish); only the pull
differs: each row's centre is its own client's row, not its run's one model. A round this module
does not cover trains alone (:func:`stack_key` returns None): local epochs, momentum or weight
decay in the local optimizer, gradient clipping, client momentum, a rule or attack that needs the
whole round at once, a round without clients, and, on a model that may compute one row apart
from several (``BatchedModel.rows_independent`` false: the vmap'ed
convolutions), a run whose clients alone come in a part of one row (one sampled client, or a
chunk leaving one over; stacked parts never leave one over). The step size ``lr`` must be shared
(it enters the model's fused step); λ and α_k may differ.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch

from fedhp.algorithms import fedavg_stacked
from fedhp.algorithms.base import Algorithm, State
from fedhp.algorithms.fedavg_stacked import _Run
from fedhp.algorithms.stacked_theta import rows_of
from fedhp.algorithms.task import Task, Trained, Update
from fedhp.engine.ops import ProxGrad, prox_grad
from fedhp.engine.run_rows import gathers, per_row

if TYPE_CHECKING:
    from fedhp.algorithms.heurfedamp import HeurFedAMP


class _CloudRows(fedavg_stacked.LocalRows):
    """HeurFedAMP's round in the stacked local SGD: each client from its cloud model ``u_i``,
    pulled towards it with ``lam / alpha_k``, its trained model uploaded — what
    :meth:`~fedhp.algorithms.heurfedamp.HeurFedAMP.train` does."""

    name = "heurfedamp"

    def like(self, algo: Algorithm, state: State, task: Task) -> torch.Tensor:
        return task.per_client["u"]

    def kind(self, algo: Algorithm, state: State, task: Task) -> str | None:
        return "prox-rows"

    def term(self, algo: Algorithm, state: State, task: Task) -> fedavg_stacked.Term:
        opt = cast("HeurFedAMP", algo).options
        term = prox_grad(task.per_client["u"], opt.lam / opt.alpha_k)
        assert isinstance(term, ProxGrad)
        return term

    def start(self, algo: Algorithm, state: State, task: Task) -> torch.Tensor:
        return task.per_client["u"]

    def finish(self, algo: Algorithm, state: State, task: Task, trained: Trained) -> Update:
        params, loss_sum, steps = trained
        return Update(per_client={"model": params}, losses=loss_sum.unsqueeze(0), steps=steps)

    def pull(self, runs: Sequence[_Run], theta: torch.Tensor, lr: float) -> RowPull:
        return RowPull.of(runs, theta, lr)


CLOUD_ROWS = _CloudRows()


def stack_key(algo: HeurFedAMP, state: State, task: Task) -> Hashable | None:
    """What runs must share to train this round stacked (None: it trains alone):
    :func:`fedhp.algorithms.fedavg_stacked.stack_key` under HeurFedAMP's rows (the local work,
    the step size, the model, its policy, dtype and device)."""
    return fedavg_stacked.stack_key(algo, state, task, CLOUD_ROWS)


def stacked_train(items: Sequence[tuple[HeurFedAMP, State, Task]]) -> list[Update]:
    """The local SGD of every run of ``items`` (each ``(algorithm, state, task)`` of one run, all
    with the same :func:`stack_key`) as one; each run's update, as its ``train`` alone."""
    return fedavg_stacked.stacked_train(items, CLOUD_ROWS)


@dataclass
class RowPull:
    """The pull of the stacked rows towards their own centres, ``lerp(theta_i, u_i, lr mu_s)`` on
    each layer's columns inside the model's step (``ProxGrad.pull`` with one centre row per
    client). On the CPU each run's rows are pulled as alone (its centre rows, its scalar weight),
    in place; on a GPU the centres are stacked once per round and each part's rows pulled in one
    launch per layer, with per-row weights where the runs' differ."""

    runs: Sequence[_Run]
    pulls: list[tuple[torch.Tensor, float]]
    centres: torch.Tensor | None  # the GPU's form: every run's centres, run after run
    weights: float | torch.Tensor

    @classmethod
    def of(cls, runs: Sequence[_Run], theta: torch.Tensor, lr: float) -> RowPull:
        pulls = fedavg_stacked.prox_pulls(runs, lr)
        sizes = [r.rows.stop - r.rows.start for r in runs]
        weights = per_row([w for _, w in pulls], sizes, theta)
        centres = torch.cat([u for u, _ in pulls]) if gathers(theta.device) else None
        return cls(runs, pulls, centres, weights)

    def hook(self, theta: torch.Tensor, a: int, b: int) -> Callable[[int, int], None]:
        """The column hook of the part of rows ``a .. b - 1``."""
        if self.centres is not None:
            rows, mine, weight = theta[a:b], self.centres[a:b], rows_of(self.weights, a, b)

            def towards_all(lo: int, hi: int) -> None:
                rows[:, lo:hi].lerp_(mine[:, lo:hi], weight)

            return towards_all
        parts = []
        for run, (centre, weight) in zip(self.runs, self.pulls, strict=True):
            lo, hi, first = max(a, run.rows.start), min(b, run.rows.stop), run.rows.start
            if lo < hi:
                parts.append((theta[lo:hi], centre[lo - first : hi - first], weight))

        def towards_centres(lo: int, hi: int) -> None:
            for rows, centre, weight in parts:
                rows[:, lo:hi].lerp_(centre[:, lo:hi], weight)

        return towards_centres
