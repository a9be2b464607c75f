"""Seconds per round of sFedHP on MNIST Setting 1: in-process engine vs Flower simulation (Ray)
[vs Flower deployment on loopback, added by the deployment benchmark through the same hook].

Same work on every path: the default configuration (sFedHP, DNN 784-100-10, 20 clients in 4
edges, R=20 local rounds of K=5 steps, batch 20), the same seed, ``eval_every=1`` (personalized
evaluation included every round), torch threads fixed (``--threads``, default 1; the Flower nodes
use the same count). The first round of a Flower run includes starting the nodes (Ray actors
importing torch and loading their data) and is reported apart; the steady-state figure is the
median of rounds 2..N, from each run's timings.csv.

Usage: python benchmarks/bench_flower.py [--rounds N] [--threads T] [--ray-cpus C]
Output: bench sfedhp-mnist-s1 inprocess_s=… flower_sim_s=… flower_sim_first_round_s=… threads=T
"""

from __future__ import annotations

import argparse
import csv
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path

from fedhp.config import resolve_config
from fedhp.engine.build import build_experiment
from fedhp.engine.runner import run_experiment


def overrides(rounds: int, threads: int) -> list[str]:
    """The benchmark's configuration (also for the deployment path: pass it as fedhp-config)."""
    return [
        f"rounds={rounds}",
        "eval_every=1",
        f"threads={threads}",
        "progress=false",
        "checkpoint_every=0",
    ]


def seconds_per_round(folder: Path) -> tuple[float, float]:
    """(first round's seconds, median seconds of the later rounds) from ``folder/timings.csv``.

    The hook for other paths (e.g. a loopback deployment): run the same configuration into a
    folder, then call this on it."""
    with (folder / "timings.csv").open(newline="") as fh:
        cumulative = [float(r["seconds"]) for r in csv.DictReader(fh)]
    per_round = [b - a for a, b in zip([0.0, *cumulative], cumulative, strict=False)]
    return per_round[0], statistics.median(per_round[1:] or per_round)


def bench(rounds: int, threads: int, ray_cpus: int, folder: Path) -> dict[str, float]:
    args = overrides(rounds, threads)
    run_experiment(build_experiment(resolve_config(None, args)), folder / "inprocess")
    from fedhp.flower.simulation import run_flower_sim

    sim = [*args, "backend=flower-sim", f"flower.ray_cpus={ray_cpus}", "flower.num_cpus=1"]
    run_flower_sim(build_experiment(resolve_config(None, sim)), folder / "flower-sim")
    _, inprocess = seconds_per_round(folder / "inprocess")
    first, flower = seconds_per_round(folder / "flower-sim")
    return {"inprocess_s": inprocess, "flower_sim_s": flower, "flower_sim_first_round_s": first}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--ray-cpus", type=int, default=1, help="CPUs Ray may use (nodes at once)")
    parser.add_argument("--out", help="keep the runs here (default: a temporary folder)")
    a = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        result = bench(a.rounds, a.threads, a.ray_cpus, Path(a.out or tmp))
    values = " ".join(f"{k}={v:.3f}" for k, v in result.items())
    print(f"bench sfedhp-mnist-s1 {values} threads={a.threads} ray_cpus={a.ray_cpus}")


if __name__ == "__main__":
    main()
