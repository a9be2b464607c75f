"""The most any run axis can save in training time on this machine (issue 40's CPU ratio rows).

S runs of the default experiment (sFedHP, 20 clients under 4 edges, DNN-100) stacked as rows do
the arithmetic of ONE federation of ``S × 20`` clients under ``S × 4`` edges: the same model
steps, θ pulls, uploads and edge steps over ``S`` times the rows, and nothing else. That one big
run is the cheapest arrangement of the batch's work (no per-run values, no per-run bookkeeping):
its round time against ``S`` rounds of one small run bounds what stacking the runs can gain.

In one process, alternating small and big (``--repeats`` pairs), it times ``--rounds`` rounds
below and at the cloud (``Algorithm.run_round``, no evaluation, after one warm-up round) of

* **small**: the default experiment (``federation.num_clients=20``, ``num_edges=4``);
* **big**: the same with ``num_clients = 20 S`` and ``num_edges = 4 S`` (every edge 5 clients, as
  in each small run);

and prints ``ceiling = S × small / big`` (median round times): the training-time speed-up of an
ideal run axis. Both use ``partition.train_per_class=3000`` so that 300 clients hold full
minibatches (the data's size does not enter a step's cost). 1 torch thread unless ``--threads``.

Usage: python benchmarks/bench_rows_ceiling.py [--runs 15] [--rounds 3] [--repeats 3]
[--threads 1] [--device cpu] [key=value ...]
Prints one line ``rows-ceiling key=value ...``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from gpu_profile import build_default, sync

CLIENTS, EDGES = 20, 4
"""The default experiment's federation (``src/fedhp/defaults.yaml``)."""


def experiment(device: str, runs: int, overrides: list[str]) -> tuple[Any, Any]:
    """The default experiment with ``runs`` runs' worth of clients and edges: its algorithm and
    a started state."""
    exp = build_default(
        device,
        [
            f"federation.num_clients={CLIENTS * runs}",
            f"federation.num_edges={EDGES * runs}",
            "partition.train_per_class=3000",
            "partition.test_per_class=100",
            *overrides,
        ],
    )
    state = exp.algorithm.init_state(exp.model.init_params(0).to(exp.ctx.device))
    exp.algorithm.run_round(state, 0)  # warm-up
    return exp, state


def round_seconds(exp: Any, state: Any, first: int, rounds: int) -> list[float]:
    """Seconds of each of ``rounds`` rounds from round ``first``."""
    times = []
    for r in range(first, first + rounds):
        sync(exp.ctx.device)
        start = time.perf_counter()
        exp.algorithm.run_round(state, r)
        sync(exp.ctx.device)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    extra = [f"threads={args.threads}", *args.overrides]
    small, big = experiment(args.device, 1, extra), experiment(args.device, args.runs, extra)
    times: dict[str, list[float]] = {"small": [], "big": []}
    for k in range(args.repeats):  # alternated: small, big, small, big, ...
        first = 1 + k * args.rounds
        times["small"] += round_seconds(*small, first, args.rounds)
        times["big"] += round_seconds(*big, first, args.rounds)
    small_s, big_s = statistics.median(times["small"]), statistics.median(times["big"])
    opt = small[0].options
    steps = int(opt.K) * int(opt.R)  # model steps per client per round (sFedHP)
    values = {
        "runs": args.runs,
        "threads": args.threads,
        "small_round_s": small_s,
        "big_round_s": big_s,
        "small_us_per_client_step": small_s / (steps * CLIENTS) * 1e6,
        "big_us_per_client_step": big_s / (steps * CLIENTS * args.runs) * 1e6,
        "ceiling": args.runs * small_s / big_s,
    }
    line = " ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items()
    )
    print(f"rows-ceiling device={args.device} {line}", flush=True)


if __name__ == "__main__":
    main()
