"""sFedHP's round for S runs at once — runs as rows (issue 40, ``fedhp sweep``).

S runs of one sweep batch (same model, R, K, minibatch size, step sizes; their own seeds and λ)
train their R local rounds as ONE round: run s's clients are a block of rows of one
``theta [ΣC, P]``, its edges a block of one ``[ΣE, P]``, and each local round's work is one
pass over all of them, written as the fused round writes it for one run
(:mod:`fedhp.algorithms.sfedhp`)::

    for r in range(R):
        phi_sent, w_sent = truncate(phi_edge), truncate(w_edge)       # every run's edges
        x, y = cat(draw_s() for each run s)          # each run's own generator, as alone
        theta = phi_sent[edge_of]                    # at r = 0 (theta_init round)
        K times: theta <- lerp(theta, phi_sent[edge_of], lr * lam1[row]) - lr grad
        phi_ij = lerp(w_sent[edge_of], theta, lam1 / (lam1 + lam2)[row])    # the uploads
        phi_edge = segment_mean(phi_ij, edge_of)     # edge rows never mix runs
        w_edge -= eta1 * lam2[edge] * (w_edge - phi_edge)

Nothing crosses a run's block: every operation is per row (or per edge, whose clients are all of
one run), each run's λ enters as its rows' value, and each run draws its minibatches from its own
generator, bills its own ledger and gets its own :class:`~fedhp.algorithms.task.Update` — what
:func:`~fedhp.algorithms.sfedhp.fused_train` gives it alone, bit for bit on the CPU
(``tests/algorithms/test_sfedhp_stacked.py``; ``tests/sweep/test_lockstep.py`` on whole runs).
What one run does alone S times (launches, Python work per local round) is done once.

The runs meet through :class:`~fedhp.sweep.lockstep.Lockstep` (:meth:`SFedHP.stack_key`). A run
whose round this module does not cover — sparse penalties (γ > 0), the Nesterov inner solver, an
attack on the uploads or a robust rule at the edges — trains alone
(:func:`stack_key` returns None).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from fedhp.algorithms import stacked_theta as stacked
from fedhp.algorithms.base import State
from fedhp.algorithms.fused import count_sent, truncate_
from fedhp.algorithms.penalties import truncate
from fedhp.algorithms.task import Task, Update
from fedhp.data.rows import slice_rows
from fedhp.engine.graphs import StepGraphs
from fedhp.engine.ops import model_steps
from fedhp.engine.run_rows import gathers, per_row

if TYPE_CHECKING:
    from collections.abc import Callable

    from fedhp.algorithms.sfedhp import SFedHP


def stack_key(algo: SFedHP, state: State, task: Task) -> Hashable | None:
    """What runs must share to train this round stacked (None: this round trains alone): the
    round's shapes and step sizes, the model, the device and the zero threshold."""
    opt, ctx = algo.options, algo.ctx
    uplink = ctx.edge_uplink
    forges = uplink.attack is not None and uplink.attack.on_uploads
    plain = opt.inner == "gd" and not task.scalars["gamma1"] and not task.scalars["gamma2"]
    if not (plain and uplink.folds and not forges and not uplink.momentum):
        return None
    steps = (opt.R, opt.K, opt.batch_size, opt.lr, opt.edge_lr, opt.theta_init)
    return stacked.theta_stack_key("sfedhp", algo, task, steps)


@dataclass
class _Run(stacked.EdgeRun["SFedHP"]):
    """One run's share of the stacked round (:class:`~fedhp.algorithms.stacked_theta.EdgeRun`),
    with its step weights."""

    @property
    def pull(self) -> float:
        """``lr * lam1``: how far one θ step moves towards the received centre."""
        opt = self.algo.options
        return opt.lr * opt.lam1_value

    @property
    def mix_weight(self) -> float:
        """``lam1 / (lam1 + lam2)``: the upload as a lerp from ``w_i`` towards θ."""
        opt = self.algo.options
        return opt.lam1_value / (opt.lam1_value + opt.lam2_value)


def stacked_train(items: Sequence[tuple[SFedHP, State, Task]]) -> list[Update]:
    """The R local rounds of every run of ``items`` (each ``(algorithm, state, task)`` of one
    run, all with the same :func:`stack_key`) as one round; each run's update, as alone."""
    lead = items[0][0]
    opt, eps = lead.options, lead.ctx.zero_threshold
    runs, c0, e0 = stacked.edge_runs(items, opt.batch_size, _Run)
    edge_of = stacked.edge_rows_of(runs)
    w_edge = torch.cat([r.task.broadcast["global"].expand(len(r.task.edges), -1) for r in runs])  # type: ignore[arg-type]
    p, dtype, dev = w_edge.shape[1], w_edge.dtype, w_edge.device
    phi_edge, phi_sum = w_edge.clone(), torch.empty_like(w_edge)
    w_sent = w_edge if eps <= 0 else torch.empty_like(w_edge)
    scratch = torch.empty_like(w_edge)
    theta = stacked.warm_theta(runs) if opt.theta_init == "warm" else w_edge.new_empty(c0, p)
    weights = torch.cat([r.algo.ctx.client_weights(r.task.clients) for r in runs]).to(dtype)
    uniform = bool((weights == 1).all())
    totals = torch.zeros(e0, dtype=dtype, device=dev).index_add_(0, edge_of, weights)
    denominator = totals.clamp(min=torch.finfo(dtype).tiny).unsqueeze(1)
    edge_sizes = [r.edge_rows.stop - r.edge_rows.start for r in runs]
    lam2 = per_row([r.algo.options.lam2_value for r in runs], edge_sizes, w_edge)
    steps = _ThetaSteps.of(runs, edge_of, theta)
    chunk = lead.ctx.policy.chunk(p, c0)
    bounds = stacked.part_bounds(chunk, c0)
    buffer = theta.new_empty(min(chunk, c0), p)
    part_scratch = buffer if uniform else torch.empty_like(buffer)
    down_counts, up_counts = theta.new_empty(opt.R, 2, e0), theta.new_empty(opt.R, c0)
    start_theta = opt.theta_init == "reset"
    draw = stacked.one_draw_of(runs, opt.batch_size)
    k_steps = (opt.K, opt.lr)
    losses = []
    for r in range(opt.R):
        phi_sent = truncate_(phi_edge, eps)
        w_sent = w_sent if eps <= 0 else truncate_(w_edge, eps, out=w_sent)
        count_sent(phi_sent, eps, scratch, out=down_counts[r, 0])
        count_sent(w_sent, eps, scratch, out=down_counts[r, 1])
        x, y = draw()
        loss = torch.empty(c0, device=dev)
        phi_sum.zero_()
        for a, b in bounds:  # cache-sized parts, each trained K steps and uploaded in one pass
            if start_theta or (opt.theta_init == "round" and r == 0):
                torch.index_select(phi_sent, 0, edge_of[a:b], out=theta[a:b])
            loss[a:b] = steps.train(lead.ctx.graphs, theta, phi_sent, (x, y), (a, b), k_steps)
            mixed = steps.uploads(w_sent, theta, a, b, buffer[: b - a])
            truncate_(mixed, eps)
            if uniform:  # count last, on the values themselves
                phi_sum.index_add_(0, edge_of[a:b], mixed)
                count_sent(mixed, eps, mixed, out=up_counts[r, a:b])
            else:
                count_sent(mixed, eps, part_scratch[: b - a], out=up_counts[r, a:b])
                mixed.mul_(weights[a:b].unsqueeze(1))
                phi_sum.index_add_(0, edge_of[a:b], mixed)
        losses.append(loss)
        phi_edge, phi_sum = phi_sum.div_(denominator), phi_edge
        step = torch.sub(w_edge, phi_edge, out=scratch).mul_(lam2)
        w_edge.sub_(step, alpha=opt.edge_lr)
    loss_rows = torch.stack(losses)
    return [_finish(run, theta, w_edge, down_counts, up_counts, loss_rows) for run in runs]


def _finish(
    run: _Run,
    theta: torch.Tensor,
    w_edge: torch.Tensor,
    down_counts: torch.Tensor,
    up_counts: torch.Tensor,
    losses: torch.Tensor,
) -> Update:
    """Run ``run``'s share of the stacked round: its messages billed to its ledger, its state
    written, its update (as :func:`~fedhp.algorithms.sfedhp.fused_train` returns it)."""
    ctx, task, p = run.algo.ctx, run.task, theta.shape[1]
    edges, agg = task.edges, task.up_edges
    assert edges is not None and agg is not None
    down = down_counts[:, :, run.edge_rows][:, :, run.recv_seg]  # [R, 2, receivers]
    nodes = run.recv_ids.expand_as(down)
    ctx.ledger.record_counts("client_edge", "down", down.to(torch.int64), p, nodes=nodes)
    up = up_counts[:, run.rows]
    ctx.ledger.record_counts(
        "client_edge", "up", up.to(torch.int64), p, nodes=run.ids.expand_as(up)
    )
    mine = w_edge[run.edge_rows]
    run.state["theta"][task.clients] = theta[run.rows]
    run.state["edge"][edges] = mine
    sent_up = truncate(mine[torch.searchsorted(edges, agg)], ctx.zero_threshold)
    return Update(per_edge={"w": sent_up}, losses=losses[:, run.rows].clone())


@dataclass
class _ThetaSteps:
    """The K θ steps of the stacked clients: the model's ``sgd_step`` on a part's rows, with each
    run's pull towards its received centre applied to each layer's columns inside it (the
    ``_prox_steps`` of the fused round). On the CPU each edge's clients are pulled towards the
    edge's row in place (as alone); on a GPU the centres are gathered and pulled in one launch."""

    runs: Sequence[_Run]
    edge_of: torch.Tensor
    segments: list[tuple[int, int, int, _Run]]  # (first row, end row, edge row, its run)
    pull_rows: torch.Tensor | float  # each row's run's pull (GPU path)
    mix_rows: torch.Tensor | float  # each row's run's upload mix weight (GPU path)
    lands: torch.Tensor | None  # [rows, 1]: the run's pull is exactly 1 (the step lands on c)
    gather: bool

    @classmethod
    def of(cls, runs: Sequence[_Run], edge_of: torch.Tensor, theta: torch.Tensor) -> _ThetaSteps:
        segments: list[tuple[int, int, int, _Run]] = []
        for run in runs:
            for row, edge in enumerate(edge_of[run.rows].tolist(), start=run.rows.start):
                if segments and segments[-1][2] == edge and segments[-1][1] == row:
                    a, _, e, _ = segments[-1]
                    segments[-1] = (a, row + 1, e, run)
                else:
                    segments.append((row, row + 1, edge, run))
        sizes = [r.rows.stop - r.rows.start for r in runs]
        landing = [float(r.pull == 1.0) for r in runs]
        column = per_row(landing, sizes, theta)  # (None where no run, or every run, lands)
        lands = column.bool() if isinstance(column, torch.Tensor) else None
        pull_rows = per_row([r.pull for r in runs], sizes, theta)
        mix_rows = per_row([r.mix_weight for r in runs], sizes, theta)
        gather = gathers(theta.device)
        return cls(runs, edge_of, segments, pull_rows, mix_rows, lands, gather)

    def _segments(self, a: int, b: int) -> list[tuple[int, int, int, _Run]]:
        """The edge segments of rows ``a .. b - 1`` (cut at the part's ends)."""
        return [(max(s, a), min(t, b), e, r) for s, t, e, r in self.segments if s < b and t > a]

    def uploads(
        self, w_sent: torch.Tensor, theta: torch.Tensor, a: int, b: int, out: torch.Tensor
    ) -> torch.Tensor:
        """Rows ``a .. b - 1``'s uploads ``lerp(w_i, theta, lam1 / (lam1 + lam2))`` into ``out``:
        edge by edge from the edge's row (CPU), or from the gathered rows in one launch (GPU)."""
        if self.gather:
            torch.index_select(w_sent, 0, self.edge_of[a:b], out=out)
            return torch.lerp(out, theta[a:b], stacked.rows_of(self.mix_rows, a, b), out=out)
        for s, t, e, run in self._segments(a, b):
            torch.lerp(w_sent[e], theta[s:t], run.mix_weight, out=out[s - a : t - a])
        return out

    def train(
        self,
        graphs: StepGraphs,
        theta: torch.Tensor,
        centres: torch.Tensor,
        batch: tuple[torch.Tensor, torch.Tensor],
        part: tuple[int, int],
        k_steps: tuple[int, float],
    ) -> torch.Tensor:
        """The K θ steps of rows ``part = (a, b)`` with their prox pull towards their edge's
        centre (``centres [edges, P]``); the data loss. The GPU form (gathered centres) replays
        as one CUDA graph per shape where the batch asks for graphs (``graphs``, stacked)."""
        if not self.gather:
            pull = self._by_edge(centres, theta, *part)
            return stacked.theta_steps(self.runs, theta, batch, part, k_steps, pull)
        (a, b), (x, y) = part, batch
        stacked.count_steps(self.runs, x, part, k_steps[0])
        pull_rows = stacked.rows_of(self.pull_rows, a, b)
        args = {"theta": theta[a:b], "centres": centres, "edge_of": self.edge_of[a:b]}
        args |= {"x": slice_rows(x, a, b), "y": y[a:b]}
        if isinstance(pull_rows, torch.Tensor):
            args["pull"] = pull_rows
        if self.lands is not None:
            args["lands"] = self.lands[a:b]
        names, fixed = tuple(args), pull_rows if isinstance(pull_rows, float) else None
        model = self.runs[0].algo.ctx.model

        def steps(*tensors: torch.Tensor) -> torch.Tensor:
            t = dict(zip(names, tensors, strict=True))
            pull = gathered_pull(
                t["centres"], t["theta"], t["edge_of"], t.get("pull", fixed), t.get("lands")
            )
            return model_steps(model, t["theta"], t["x"], t["y"], k_steps, pull)

        key = ("sfedhp stacked θ steps", *k_steps, names, fixed)
        loss = graphs.run(key, steps, tuple(args.values()), writes=(0,), stacked=True)
        assert loss is not None
        return loss

    def _by_edge(
        self, centres: torch.Tensor, theta: torch.Tensor, a: int, b: int
    ) -> Callable[[int, int], None]:
        """Each edge's clients (rows of ``a .. b - 1``) pulled towards its row, in place."""
        parts = [(s, t, e, run.pull) for s, t, e, run in self._segments(a, b)]

        def towards_centre(lo: int, hi: int) -> None:
            for s, t, e, pull in parts:
                rows, centre = theta[s:t, lo:hi], centres[e, lo:hi]
                if pull == 1.0:
                    rows.copy_(centre)  # lerp with weight 1 is the centre itself
                else:
                    rows.lerp_(centre, pull)

        return towards_centre


def gathered_pull(
    centres: torch.Tensor,
    rows: torch.Tensor,
    edge_of: torch.Tensor,
    pull: torch.Tensor | float | None,
    lands: torch.Tensor | None,
) -> Callable[[int, int], None]:
    """The GPU form of the θ steps' prox pull: the centres of ``rows``' edges (``edge_of``)
    gathered once, every row pulled by its run's ``pull`` (a ``[rows, 1]`` column, or one value)
    in one launch per layer; ``lands`` (``[rows, 1]``, or None) marks the rows whose pull is
    exactly 1, which copy their centre."""
    mine = centres.index_select(0, edge_of)
    assert pull is not None

    def towards_centre(lo: int, hi: int) -> None:
        own, centre = rows[:, lo:hi], mine[:, lo:hi]
        if isinstance(pull, float) and pull == 1.0:
            own.copy_(centre)
        elif lands is None:
            own.lerp_(centre, pull)
        else:  # (a lerp with weight 1 may flip the sign of a zero: those rows copy)
            torch.where(lands, centre, own.lerp_(centre, pull), out=own)

    return towards_centre
