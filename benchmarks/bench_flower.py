"""Seconds per round of sFedHP on MNIST Setting 1: in-process engine vs Flower simulation (Ray)
vs Flower deployment on loopback (``--deploy``: a SuperLink and 4 SuperNodes as processes on
127.0.0.1, TLS and node authentication on, as ``fedhp flower deploy`` starts them).

Same work on every path: the default configuration (sFedHP, DNN 784-100-10, 20 clients in 4
edges, R=20 local rounds of K=5 steps, batch 20), the same seed, ``eval_every=1`` (personalized
evaluation included every round), torch threads fixed (``--threads``, default 1; the Flower nodes
use the same count). The first round of a Flower run includes starting the nodes (Ray actors, or
the first ClientApp processes, importing torch and loading their data) and is reported apart; the
steady-state figure is the median of rounds 2..N, from each run's timings.csv. The three runs
produce the same metrics.csv (checked by the tests); the benchmark checks they finished.

Usage: python benchmarks/bench_flower.py [--rounds N] [--threads T] [--ray-cpus C] [--deploy]
Output: bench sfedhp-mnist-s1 inprocess_s=… flower_sim_s=… flower_sim_first_round_s=…
        [flower_deploy_s=… flower_deploy_first_round_s=…] threads=T ray_cpus=C
"""

from __future__ import annotations

import argparse
import csv
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path

from fedhp.build import build_experiment
from fedhp.config import resolve_config
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


def bench_deploy(args: list[str], folder: Path) -> dict[str, float]:
    """The loopback deployment's seconds per round (first, steady) for the same configuration."""
    from fedhp.flower.deploy import LoopbackFederation
    from fedhp.flower.deploy_cli import resolve_run_config
    from fedhp.flower.packaging import write_app

    out = folder / "flower-deploy"
    _, run_config, nodes = resolve_run_config(args, str(out))
    with LoopbackFederation(folder / "deploy-work", nodes=nodes) as fed:
        result = fed.run(write_app(folder / "deploy-work" / "app", run_config), timeout=3600)
    if not result.ok:
        raise SystemExit(f"bench: the deployment run ended {result.status}; see {result.log}")
    first, steady = seconds_per_round(out)
    return {"flower_deploy_s": steady, "flower_deploy_first_round_s": first}


def bench(
    rounds: int, threads: int, ray_cpus: int, folder: Path, deploy: bool = False
) -> dict[str, float]:
    args = overrides(rounds, threads)
    run_experiment(build_experiment(resolve_config(None, args)), folder / "inprocess")
    from fedhp.flower.simulation import run_flower_sim

    sim = [*args, "backend=flower-sim", f"flower.ray_cpus={ray_cpus}", "flower.num_cpus=1"]
    run_flower_sim(build_experiment(resolve_config(None, sim)), folder / "flower-sim")
    _, inprocess = seconds_per_round(folder / "inprocess")
    first, flower = seconds_per_round(folder / "flower-sim")
    result = {"inprocess_s": inprocess, "flower_sim_s": flower, "flower_sim_first_round_s": first}
    if deploy:
        result.update(bench_deploy(args, folder))
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--ray-cpus", type=int, default=1, help="CPUs Ray may use (nodes at once)")
    parser.add_argument("--deploy", action="store_true", help="also the loopback deployment")
    parser.add_argument("--out", help="keep the runs here (default: a temporary folder)")
    a = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        result = bench(a.rounds, a.threads, a.ray_cpus, Path(a.out or tmp), a.deploy)
    values = " ".join(f"{k}={v:.3f}" for k, v in result.items())
    print(f"bench sfedhp-mnist-s1 {values} threads={a.threads} ray_cpus={a.ray_cpus}")


if __name__ == "__main__":
    main()
