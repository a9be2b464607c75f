"""What runs as rows save a GPU, counted on any machine (issue 40): the kernels S runs launch.

A small federation on a GPU is launch-bound (docs/gpu.md, "Measured on an H200": the default
sFedHP run's round is 4,160 launches and 0.024 s of kernels in 0.070 s). Every torch operation
that is not a view launches (at least) one kernel there, so counting the operations dispatched
— here, on the CPU, with a ``TorchDispatchMode`` — counts the launches a GPU would make, without
one. For S runs of sFedHP (the default ``fedhp run`` experiment, seeds × λ), it counts

* ``train_alone``: one round below the cloud (``train``: the R local rounds), every run alone;
* ``train_stacked``: the same S rounds, each run's own ``train`` in a lockstep batch where
  they meet as one (the method's round over the batch's runs, ``ctx.together``, or their local
  SGD, :mod:`fedhp.engine.local_rows`; in the GPU's form: per-run rows gathered and acted on in
  one launch, the minibatches drawn as one);
* ``outside_train``: what one run's round launches besides ``train`` (plan, the cloud's
  aggregate, the ledger), paid per run in lockstep too;
* ``evaluation``: one evaluation of one run (and its host syncs), every ``eval_every`` rounds;

and prints the ratio of launches per round, alone / stacked, evaluation amortized, and the
host syncs of the round below the cloud (``train_syncs_*``: per round, not per local step);
with ``--graphs`` (sFedHP) also the stacked round whose θ steps replay as CUDA graphs
(``train_*_graphs``: each replay one launch, its copies in and out counted). It is a
count, not a time: the GPU check (``benchmarks/gpu_check.py --issue 40``, ``sweep-lam``) times it.

Usage: python benchmarks/run_rows_ops.py [--method M] [--values 15,20,25,30,35] [--seeds 0,1,2]
[key=value ...], M one of :data:`GRID_KEY` (FedAvg, Local only: seeds only; FedProx:
μ values; SCAFFOLD: η_g values; Per-FedAvg: β values; HierFAVG, centralized: lr values;
HeurFedAMP: λ values)
Prints one line ``run-rows-ops key=value ...``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

VIEWS = frozenset(
    "aten." + name
    for name in (
        "slice.Tensor", "view.default", "unsqueeze.default", "transpose.int", "select.int",
        "expand.default", "t.default", "alias.default", "as_strided.default", "permute.default",
        "detach.default", "_unsafe_view.default", "squeeze.dim", "split.Tensor", "unbind.int",
    )
)  # fmt: skip
"""Operations that make a view (no kernel)."""


class CountLaunches(TorchDispatchMode):
    """Counts the operations dispatched that are not views (kernel launches on a GPU), and the
    host syncs among them (``_local_scalar_dense``: a tensor read as a Python number)."""

    def __init__(self) -> None:
        super().__init__()
        self.launches = 0
        self.syncs = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = str(func)
        if name not in VIEWS:
            self.launches += 1
            self.syncs += name == "aten._local_scalar_dense.default"
        return func(*args, **(kwargs or {}))


def count(work: Callable[[], object]) -> CountLaunches:
    """The launches of ``work()``."""
    with CountLaunches() as counter:
        work()
    return counter


class ReplayCount:
    """A :class:`~fedhp.engine.graphs.Rerun` factory whose replays count the launches they
    stand for (``inside``: what the recorded function dispatches, which one graph launch
    replaces on a GPU) and themselves (``replays``)."""

    def __init__(self) -> None:
        self.inside = 0
        self.replays = 0

    def __call__(self) -> Any:
        from fedhp.engine.graphs import Rerun

        counts = self

        class Counted(Rerun):
            def replay(self) -> None:
                with CountLaunches() as inner:
                    super().replay()
                counts.inside += inner.launches
                counts.replays += 1

        return Counted()


def in_lockstep(items: list[Any]) -> CountLaunches:
    """The launches of ``items``' rounds, each run's own ``train`` in a thread of one lockstep
    batch where their rounds (``ctx.together``) or their local SGD
    (:mod:`fedhp.engine.local_rows`) meet: the sum of every thread's count (a dispatch mode
    counts its own thread; the stacked call counts once, in the thread that runs it)."""
    from fedhp.sweep.lockstep import train_together

    counts = [CountLaunches() for _ in items]
    _, step = train_together(items, around=counts.__getitem__)
    if step.stacked_rounds == 0:
        raise SystemExit("run-rows-ops: the runs' rounds did not meet")
    total = CountLaunches()
    total.launches = sum(c.launches for c in counts)
    total.syncs = sum(c.syncs for c in counts)
    return total


def with_graphs(items: list[Any], stack: bool) -> int:
    """The launches of ``items``' rounds (one stacked round, else each run's own) with
    ``engine.cuda_graphs``' θ steps replayed: captured in a first round, counted in a second on
    the same rows, each replay one launch for what it replays."""
    from fedhp.engine.graphs import StepGraphs

    replays = ReplayCount()
    for algo, _, _ in items:
        algo.ctx.graphs = StepGraphs(enabled=True, stacked=True, make=replays)

    def rounds() -> int:
        if stack:
            return in_lockstep(items).launches
        return count(lambda: [algo.train(state, task) for algo, state, task in items]).launches

    rounds()  # captures
    replays.inside = replays.replays = 0
    launches = rounds()
    return launches - replays.inside + replays.replays


GRID_KEY = {
    "sfedhp": "lam",
    "pfedme": "lam",
    "fedprox": "mu",
    "fedavg": None,
    "scaffold": "server_lr",
    "local": None,
    "ditto": "lam",
    "perfedavg": "beta",
    "hierfavg": "lr",
    "heurfedamp": "lam",
    "centralized": "lr",
}
"""The float option each method's sweep varies (FedAvg, Local only: the seeds alone)."""


def start(
    method: str, seed: int, value: float | None, overrides: list[str]
) -> tuple[Any, dict[str, Any], Any]:
    """One run of the default experiment under ``method`` at round 0: its experiment, state and
    round's task."""
    from fedhp.build import build_experiment
    from fedhp.config import resolve_config
    from fedhp.engine.experiment import MODEL_SEED_OFFSET

    key = GRID_KEY[method]
    grid = [] if key is None or value is None else [f"algorithm.{key}={value}"]
    cfg = resolve_config(
        None,
        ["progress=false", "threads=1", f"seed={seed}", f"algorithm.name={method}", *grid,
         *overrides],
    )  # fmt: skip
    exp = build_experiment(cfg)
    state = exp.algorithm.init_state(exp.model.init_params(seed + MODEL_SEED_OFFSET))
    exp.ctx.begin_round(0)
    return exp, state, exp.algorithm.plan(state, 0)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--method", choices=sorted(GRID_KEY), default="sfedhp")
    parser.add_argument("--values", default="15,20,25,30,35", help="the grid (λ, μ; not FedAvg)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument(
        "--graphs",
        action="store_true",
        help="also count the stacked round with its θ steps replayed as CUDA graphs (sFedHP)",
    )
    parser.add_argument("overrides", nargs="*", help="key=value for every run")
    args = parser.parse_args(argv)
    from fedhp.engine import run_rows
    from fedhp.engine.metrics import evaluate_state

    torch.set_num_threads(1)
    method = args.method
    values: list[float | None] = [float(v) for v in args.values.split(",")]
    if GRID_KEY[method] is None:
        values = [None]
    seeds = [int(v) for v in args.seeds.split(",")]
    pairs = [(s, v) for v in values for s in seeds]
    run_rows.GATHER_ON_CPU = True  # the GPU's form: per-run rows gathered, one launch each
    overrides = ["engine.clients_per_chunk=100000", *args.overrides]  # (one part: the GPU's)
    try:

        def restart() -> list[Any]:
            return [start(method, s, v, overrides) for s, v in pairs]

        runs = restart()
        alone = count(lambda: [exp.algorithm.train(st, task) for exp, st, task in runs])
        runs = restart()
        items = [(exp.algorithm, st, task) for exp, st, task in runs]
        stacked = in_lockstep(items)  # (their rounds, or their local SGD, as one)
        graphed = None
        if args.graphs:
            graphed = tuple(
                with_graphs([(e.algorithm, st, t) for e, st, t in restart()], stack)
                for stack in (False, True)
            )
        exp, state, _ = start(method, seeds[0], values[0], overrides)
        whole = count(lambda: exp.algorithm.run_round(state, 0))
        train_one = count(lambda: exp.algorithm.train(state, exp.algorithm.plan(state, 1)))
        evaluation = count(lambda: evaluate_state(exp, state))
    finally:
        run_rows.GATHER_ON_CPU = False
    n, every = len(runs), exp.cfg.eval_every
    outside = whole.launches - train_one.launches
    per_eval = evaluation.launches / every
    per_run_alone = alone.launches / n + outside + per_eval
    per_run_stacked = stacked.launches / n + outside + per_eval
    out = {
        "method": method,
        "runs": n,
        "train_alone": alone.launches,
        "train_stacked": stacked.launches,
        "train_ratio": alone.launches / stacked.launches,
        "train_syncs_alone": alone.syncs,
        "train_syncs_stacked": stacked.syncs,
        "outside_train": outside,
        "evaluation": evaluation.launches,
        "evaluation_syncs": evaluation.syncs,
        "eval_every": every,
        "per_run_round_alone": per_run_alone,
        "per_run_round_stacked": per_run_stacked,
        "round_ratio": per_run_alone / per_run_stacked,
    }
    if graphed is not None:
        out["train_alone_graphs"], out["train_stacked_graphs"] = graphed
        alone_graphs = graphed[0] / n + outside + per_eval
        stacked_graphs = graphed[1] / n + outside + per_eval
        out["per_run_round_alone_graphs"] = alone_graphs
        out["per_run_round_stacked_graphs"] = stacked_graphs
        out["round_ratio_graphs"] = alone_graphs / stacked_graphs  # both with graphs
        out["round_ratio_vs_plain"] = per_run_alone / stacked_graphs  # alone without
    fields = " ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in out.items()
    )
    print(f"run-rows-ops {fields}")
    return out


if __name__ == "__main__":
    main()
