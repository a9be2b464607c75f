"""pFedMe's round for S runs at once — runs as rows (issue 40, ``fedhp sweep``).

S runs of one sweep batch (same model, R, K, minibatch size, θ step size; their own seeds, λ and
local-model step) train their R local rounds as ONE round: run s's clients are a block of rows
of one ``theta [ΣC, P]`` and one ``w_loc [ΣC, P]``, and each local round's work is one pass over
all of them, written as the fused round writes it for one run
(:mod:`fedhp.algorithms.pfedme`)::

    w_loc = theta = cat(w_s for each run s)      # each run's received global model, its rows
    for r in range(R):
        x, y = cat(draw_s() for each run s)      # each run's own generator, as alone
        K times: theta <- lerp(theta, w_loc, plr * lam[row]) - plr grad
        w_loc <- lerp(w_loc, theta, lr[row] * lam[row])

Nothing crosses a run's block: every operation is per row, each run's λ (and local-model step
``lr``) enters as its rows' value, and each run draws its minibatches from its own generator,
counts its own trained samples and gets its own :class:`~fedhp.algorithms.task.Update` — what
:func:`~fedhp.algorithms.pfedme.fused_train` gives it alone, bit for bit on the CPU
(``tests/algorithms/test_pfedme_stacked.py``; ``tests/sweep/test_lockstep.py`` on whole runs).
What one run does alone S times (launches, Python work per local round) is done once.

The runs meet through :class:`~fedhp.sweep.lockstep.Lockstep` (:meth:`PFedMe.stack_key`). A run
whose round this module does not cover — the hidden L2 on θ, the reference round, an attack, a
robust or momentum uplink, partial work or minibatches drawn ahead — trains alone
(:func:`stack_key` returns None).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from fedhp.algorithms import stacked_theta as stacked
from fedhp.algorithms.base import State
from fedhp.algorithms.task import Task, Update
from fedhp.engine.run_rows import gathers, per_row

if TYPE_CHECKING:
    from collections.abc import Callable

    from fedhp.algorithms.pfedme import PFedMe


def stack_key(algo: PFedMe, state: State, task: Task) -> Hashable | None:
    """What runs must share to train this round stacked (None: this round trains alone): the
    round's shapes, the θ step size, the model, the device and the zero threshold."""
    opt, ctx = algo.options, algo.ctx
    uplink = ctx.cloud_uplink
    plain = opt.l2 == 0 and not task.per_client and task.batches is None and task.edges is None
    honest = ctx.attack is None and uplink.attack is None
    if not (plain and honest and uplink.folds and not uplink.momentum):
        return None
    steps = (opt.R, opt.K, opt.batch_size, opt.personal_lr, opt.theta_init)
    return stacked.theta_stack_key("pfedme", algo, task, steps)


@dataclass
class _Run(stacked.StackedRun["PFedMe"]):
    """One run's share of the stacked round, with its step weights."""

    @property
    def pull(self) -> float:
        """``personal_lr * lam``: how far one θ step moves towards ``w_loc``."""
        return self.algo.options.personal_lr * self.algo.options.lam

    @property
    def mix(self) -> float:
        """``lr * lam``: how far a local round moves ``w_loc`` towards θ."""
        return self.algo.options.lr * self.algo.options.lam


def stacked_train(items: Sequence[tuple[PFedMe, State, Task]]) -> list[Update]:
    """The R local rounds (K θ steps, then the ``w_loc`` step) of every run of ``items`` (each
    ``(algorithm, state, task)``, all with the same :func:`stack_key`) as one round; each run's
    update, as :func:`~fedhp.algorithms.pfedme.fused_train` gives it alone."""
    lead = items[0][0]
    opt = lead.options
    runs, received = stacked.flat_runs(items, opt.batch_size, _Run)
    c0 = received.shape[0]
    local = received.clone()
    theta = stacked.warm_theta(runs) if opt.theta_init == "warm" else received.clone()
    steps = _Steps.of(runs, theta)
    bounds = stacked.part_bounds(lead.ctx.policy.chunk(2 * local.shape[1], c0), c0)
    losses = torch.empty(opt.R, c0, device=local.device)
    draw = stacked.one_draw_of(runs, opt.batch_size)
    k_steps = (opt.K, opt.personal_lr)
    for r in range(opt.R):
        if opt.theta_init == "reset" and r > 0:  # (round 0 starts from it already)
            theta.copy_(received)
        x, y = draw()
        for a, b in bounds:  # cache-sized parts: K θ steps, then the w_loc step
            pull = steps.pull(theta, local, a, b)
            losses[r, a:b] = stacked.theta_steps(runs, theta, (x, y), (a, b), k_steps, pull)
            steps.local_step(local, theta, a, b)
    return [_finish(run, theta, local, losses) for run in runs]


def _finish(run: _Run, theta: torch.Tensor, local: torch.Tensor, losses: torch.Tensor) -> Update:
    """Run ``run``'s share of the stacked round: its state written, its update (as
    :func:`~fedhp.algorithms.pfedme.fused_train` returns it)."""
    run.state["theta"][run.task.clients] = theta[run.rows]
    return Update(per_client={"local": local[run.rows].clone()}, losses=losses[:, run.rows].clone())


@dataclass
class _Steps:
    """The θ steps and ``w_loc`` steps of the stacked clients: the model's ``sgd_step`` on a
    part's rows with each run's pull towards ``w_loc`` applied to each layer's columns inside it
    (the fused round's ``towards_local``). On the CPU each run's rows are pulled with its own
    scalar weight (as alone); on a GPU every row of a part in one launch, with per-row weights."""

    runs: Sequence[_Run]
    pull_rows: torch.Tensor | float  # each row's run's pull (per-row form)
    mix_rows: torch.Tensor | float  # each row's run's w_loc step (per-row form)
    gather: bool

    @classmethod
    def of(cls, runs: Sequence[_Run], theta: torch.Tensor) -> _Steps:
        sizes = [r.rows.stop - r.rows.start for r in runs]
        pull_rows = per_row([r.pull for r in runs], sizes, theta)
        mix_rows = per_row([r.mix for r in runs], sizes, theta)
        return cls(runs, pull_rows, mix_rows, gathers(theta.device))

    def local_step(self, local: torch.Tensor, theta: torch.Tensor, a: int, b: int) -> None:
        """``w_loc <- lerp(w_loc, theta, lr lam)`` on rows ``a .. b - 1``, in place."""
        if self.gather:
            local[a:b].lerp_(theta[a:b], stacked.rows_of(self.mix_rows, a, b))
            return
        for s, t, run in stacked.blocks(self.runs, a, b):
            local[s:t].lerp_(theta[s:t], run.mix)

    def pull(
        self, theta: torch.Tensor, local: torch.Tensor, a: int, b: int
    ) -> Callable[[int, int], None]:
        """The θ steps' prox pull of rows ``a .. b - 1`` towards their ``w_loc``."""
        if self.gather:
            return self._one_launch(theta, local, a, b)
        return self._by_run(theta, local, stacked.blocks(self.runs, a, b))

    @staticmethod
    def _by_run(
        theta: torch.Tensor, local: torch.Tensor, parts_of: list[tuple[int, int, _Run]]
    ) -> Callable[[int, int], None]:
        """Each run's rows pulled towards their ``w_loc`` with the run's own weight, in place."""
        parts = [(s, t, run.pull) for s, t, run in parts_of]

        def towards_local(lo: int, hi: int) -> None:
            for s, t, pull in parts:
                theta[s:t, lo:hi].lerp_(local[s:t, lo:hi], pull)

        return towards_local

    def _one_launch(
        self, theta: torch.Tensor, local: torch.Tensor, a: int, b: int
    ) -> Callable[[int, int], None]:
        """Every row of the part pulled in one launch per layer, with per-row weights."""
        rows, centre = theta[a:b], local[a:b]
        pull = stacked.rows_of(self.pull_rows, a, b)

        def towards_local(lo: int, hi: int) -> None:
            rows[:, lo:hi].lerp_(centre[:, lo:hi], pull)

        return towards_local
