"""Robust rules' cost: a FedAvg round under each rule against the same round under the mean,
measured in the same process, at 100 and at 1,000 clients (issue 41).

Two measurements per (rule, clients, model):

* ``round``: the median over ``--rounds`` timed rounds of the algorithm's ``run_round``
  (training, the uplink with its rule, the ledger) after one warm-up round, MNIST on label
  shards, every client in every round, 10 local SGD steps of batch 20 (the setting of
  ``fedhp reproduce robust --heterogeneity``); ``ratio`` = the rule's round / the mean's round.
* ``aggregate``: the rule alone (:func:`fedhp.engine.robust_rules.aggregate`) on ``[n, P]``
  random rows, median of ``--repeats`` calls, beside the floor of an aggregate, one read of the
  ``n × P`` float32 rows at the copy bandwidth measured in the same run (``floor_s``), and the
  rule's arithmetic in FLOPs (``flops``, counted from its algorithm: mean 2nP; median and trimmed
  mean a sort of n per coordinate ~ nP log2 n comparisons; Multi-Krum the n² pairwise distances
  3n²P/2 (one Gram matrix, symmetric); cclip 4LnP; geomed ~5nP per Weiszfeld step, at most
  max_iter + 1).

The rules run with their defaults (trimmed mean β = 0.1, Multi-Krum f = 20 % of the rows, cclip
τ = 10 and L = 3, geomed at most 4 Weiszfeld steps); ``bucket2`` rows are the same rule after
2-bucketing. Every line states the threads and the device.

Usage: python benchmarks/bench_robust.py [--threads N] [--rounds R] [--repeats K]
  [--clients 100,1000] [--models mlr,dnn] [--smoke]
Output: one line per measurement,
  robust-round <rule> clients=<n> model=<m> s_per_round=<f> mean_s=<f> ratio=<f> threads=<t>
  robust-aggregate <rule> rows=<n> params=<P> s=<f> mean_s=<f> ratio=<f> floor_s=<f>
  gflop=<f> threads=<t> device=cpu
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable

import torch

from fedhp.build import build_experiment
from fedhp.config import resolve_config
from fedhp.engine.robust_rules import aggregate
from fedhp.robust import RobustOptions

RULES: dict[str, list[str]] = {
    "mean": [],
    "median": ["name=median"],
    "trimmed_mean": ["name=trimmed_mean"],
    "multi_krum": ["name=multi_krum"],  # f set from the row count below
    "cclip": ["name=cclip"],
    "geomed": ["name=geomed"],
    "cclip-bucket2": ["name=cclip", "bucket=2"],
    "median-bucket2": ["name=median", "bucket=2"],
}
MODELS = {"mlr": ["model.name=mlr"], "dnn": ["model.name=dnn", "model.hidden=[100]"]}
PARAMS = {"mlr": 7850, "dnn": 79510}


def rule_options(rule: str, rows: int) -> list[str]:
    """The rule's ``key=value`` pairs (without the ``robust.cloud.`` prefix) for ``rows`` rows:
    Multi-Krum assumes f = 20 % of them (at most what it can take)."""
    opts = list(RULES[rule])
    if rule.startswith("multi_krum"):
        opts.append(f"f={min(rows // 5, (rows - 3) // 2)}")
    return opts


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    """The median wall time of ``repeats`` calls of ``fn``."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def round_seconds(rule: str, clients: int, model: str, rounds: int, threads: int) -> float:
    """Median seconds of one FedAvg round under ``rule`` (after a warm-up round)."""
    bucket = 2 if rule.endswith("bucket2") else 1
    rows = math.ceil(clients / bucket)
    cfg = resolve_config(
        None,
        [
            "progress=false",
            f"threads={threads}",
            "dataset.name=mnist",
            "partition.name=shards",
            "partition.shard_size=3",
            f"federation.num_clients={clients}",
            "federation.num_edges=1",
            "algorithm.name=fedavg",
            "algorithm.local_steps=10",
            "algorithm.batch_size=20",
            "algorithm.lr=0.05",
            *MODELS[model],
            *(f"robust.cloud.{opt}" for opt in rule_options(rule, rows)),
        ],
    )
    exp = build_experiment(cfg)
    algo, dev = exp.algorithm, exp.ctx.device
    state = algo.init_state(exp.model.init_params(0).to(dev))
    algo.run_round(state, 0)
    times = []
    for r in range(1, rounds + 1):
        start = time.perf_counter()
        algo.run_round(state, r)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def rule_gflop(rule: str, n: int, p: int) -> float:
    """The rule's arithmetic in GFLOP (see the module docstring) for ``n`` rows of ``p``."""
    name = rule.split("-")[0]
    counts = {
        "mean": 2 * n * p,
        "median": n * p * max(1.0, math.log2(n)),
        "trimmed_mean": n * p * max(1.0, math.log2(n)) + 2 * n * p,
        "multi_krum": 1.5 * n * n * p + 2 * n * p,
        "cclip": 4 * 3 * n * p,
        "geomed": 5 * 5 * n * p,
    }
    return counts[name] / 1e9


def copy_gbs(nbytes: int, repeats: int = 5) -> float:
    """Best GB/s of copying ``nbytes`` of float32 (read + write counted)."""
    src = torch.randn(nbytes // 4)
    dst = torch.empty_like(src)
    best = min(median_seconds(lambda: dst.copy_(src), 1) for _ in range(repeats))
    return 2 * nbytes / best / 1e9


def aggregate_seconds(rule: str, n: int, p: int, repeats: int) -> float:
    """Median seconds of the rule alone on ``[n, p]`` random rows (bucketing included)."""
    gen = torch.Generator().manual_seed(0)
    rows = torch.randn(n, p, generator=gen)
    weights = torch.ones(n)
    reference = torch.zeros(p)
    bucket = 2 if rule.endswith("bucket2") else 1
    pairs = dict(opt.split("=") for opt in rule_options(rule, math.ceil(n / bucket)))
    options = RobustOptions.model_validate(pairs)

    def call() -> torch.Tensor:
        if options.bucket > 1:
            bucket_rows, bucket_w = bucketed_rows(rows, weights, options.bucket)
            return aggregate(options, bucket_rows, bucket_w, reference)
        return aggregate(options, rows, weights, reference)

    call()
    return median_seconds(call, repeats)


def bucketed_rows(
    rows: torch.Tensor, weights: torch.Tensor, size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The engine's s-bucketing with a fixed generator."""
    from fedhp.engine.robust_rules import bucketed

    return bucketed(rows, weights, size, torch.Generator().manual_seed(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--clients", default="100,1000")
    parser.add_argument("--models", default="mlr,dnn")
    parser.add_argument("--smoke", action="store_true", help="10 clients, mlr, 1 round")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clients = [10] if args.smoke else [int(c) for c in args.clients.split(",")]
    models = ["mlr"] if args.smoke else args.models.split(",")
    rounds = 1 if args.smoke else args.rounds
    rules = [r for r in RULES if not (args.smoke and r.startswith("multi_krum"))]
    for model in models:
        for n in clients:
            p = PARAMS[model]
            floor = n * p * 4 / (copy_gbs(n * p * 4) * 1e9 / 2)  # one read of the rows
            mean_s = aggregate_seconds("mean", n, p, args.repeats)
            for rule in rules:
                s = mean_s if rule == "mean" else aggregate_seconds(rule, n, p, args.repeats)
                print(
                    f"robust-aggregate {rule} rows={n} params={p} s={s:.5f} mean_s={mean_s:.5f} "
                    f"ratio={s / mean_s:.2f} floor_s={floor:.5f} "
                    f"gflop={rule_gflop(rule, n, p):.3f} threads={args.threads} device=cpu",
                    flush=True,
                )
    for model in models:
        for n in clients:
            mean_round = round_seconds("mean", n, model, rounds, args.threads)
            for rule in rules:
                s = (
                    mean_round
                    if rule == "mean"
                    else round_seconds(rule, n, model, rounds, args.threads)
                )
                print(
                    f"robust-round {rule} clients={n} model={model} s_per_round={s:.4f} "
                    f"mean_s={mean_round:.4f} ratio={s / mean_round:.2f} "
                    f"threads={args.threads} device=cpu",
                    flush=True,
                )


if __name__ == "__main__":
    main()
