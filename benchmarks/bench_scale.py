"""Scale benchmark: rounds of thousands to 100,000 clients on one machine, against the
arithmetic limit measured in the same run.

Each configuration runs in its own subprocess (so its peak memory is its own): the experiment is
built, one warm-up round is run, then ``--rounds`` timed rounds of the algorithm's
``run_round`` (training, aggregation and the ledger; evaluation is not part of a round). The
round's real FLOPs are counted, not estimated: the engine counts the samples of every gradient
evaluation it runs (``BatchedModel.trained_samples``), and one sample's training FLOPs are what
PyTorch's FlopCounterMode counts for a forward and backward pass of the plain reference module
(``BatchedModel.train_flops_per_sample``: parameters need gradients, the input does not — so the
first layer's input gradient, which the engine never computes, is not counted either); the same
count as summary.json's ``train_flops``. ``limit_s`` is those FLOPs at the best fp32 matmul speed
measured in the same subprocess; ``ratio = s_per_round / limit_s``. ``peak_rss_gb`` is the
subprocess's peak resident memory, ``data_rss_gb`` the same right after the data were loaded.

Usage: python benchmarks/bench_scale.py [--threads N] [--rounds R] [--only NAME ...] [--no-anchor]
Output: one line per configuration,
  scale <alg> <model> clients=<n> per_round=<n> s_per_round=<f> limit_s=<f> ratio=<f>
        peak_rss_gb=<f> data_rss_gb=<f>
and the public anchor (FLUTE's lr_mnist workload, end to end with ``fedhp run``),
  anchor flute-lr-mnist clients=1000 per_round=10 rounds=100 fedhp_wall_s=<f> fedhp_acc=<f> ...
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench_engine import matmul_peak_gflops  # same directory: run as a script

MNIST_SHARDS = ["dataset.name=mnist", "partition.name=shards", "partition.shard_size=3"]
# 100,000 natively federated clients: FedProx's Synthetic(1, 1) at dimension 20 (the default 60
# would hold ~11 GB of features: its client sizes are lognormal(4, 2) + min_samples, mean ~450).
SYNTHETIC = ["dataset.name=synthetic", "dataset.dim=20", "partition.name=natural"]
FEDAVG = ["algorithm.name=fedavg", "algorithm.local_steps=5", "algorithm.batch_size=5"]
SFEDHP = ["algorithm.name=sfedhp", "algorithm.batch_size=5"]
DNN100 = ["model.name=dnn", "model.hidden=[100]"]
MLR = ["model.name=mlr"]

# name -> (algorithm, model, clients, fraction per round, overrides)
CONFIGS: dict[str, tuple[str, str, int, float, list[str]]] = {
    "fedavg-dnn100-1k": ("fedavg", "dnn100", 1000, 1.0, [*MNIST_SHARDS, *FEDAVG, *DNN100]),
    "fedavg-mlr-1k": ("fedavg", "mlr", 1000, 1.0, [*MNIST_SHARDS, *FEDAVG, *MLR]),
    "fedavg-dnn100-10k-0.1": ("fedavg", "dnn100", 10000, 0.1, [*MNIST_SHARDS, *FEDAVG, *DNN100]),
    "fedavg-dnn100-10k": ("fedavg", "dnn100", 10000, 1.0, [*MNIST_SHARDS, *FEDAVG, *DNN100]),
    "fedavg-mlr-10k": ("fedavg", "mlr", 10000, 1.0, [*MNIST_SHARDS, *FEDAVG, *MLR]),
    "sfedhp-dnn100-1k": ("sfedhp", "dnn100", 1000, 1.0, [*MNIST_SHARDS, *SFEDHP, *DNN100]),
    "fedavg-mlr-100k-0.01": ("fedavg", "mlr", 100000, 0.01, [*SYNTHETIC, *FEDAVG, *MLR]),
    "fedavg-mlr-100k": ("fedavg", "mlr", 100000, 1.0, [*SYNTHETIC, *FEDAVG, *MLR]),
}


def rss_gb() -> float:
    """Peak resident memory of this process image so far (VmHWM; ``ru_maxrss`` would include
    the parent's peak, which Linux carries across execve)."""
    status = Path("/proc/self/status").read_text().split("VmHWM:")[1]
    return int(status.split()[0]) / 2**20


def run_one(name: str, threads: int, rounds: int) -> dict[str, Any]:
    """Build, warm up and time one configuration (in this process)."""
    import torch

    from fedhp.config import resolve_config
    from fedhp.engine.build import build_experiment

    torch.set_num_threads(threads)
    alg, model_name, clients, fraction, overrides = CONFIGS[name]
    if alg == "sfedhp":
        topology = ["federation.num_edges=50"]
    else:
        topology = ["federation.num_edges=1", f"federation.client_fraction={fraction}"]
    cfg = resolve_config(
        None,
        [
            "progress=false",
            f"threads={threads}",
            f"federation.num_clients={clients}",
            *([f"dataset.num_clients={clients}"] if "dataset.name=synthetic" in overrides else []),
            *topology,
            *overrides,
        ],
    )
    exp = build_experiment(cfg)
    data_rss = rss_gb()
    model, algo = exp.model, exp.algorithm
    state = algo.init_state(model.init_params(0))
    algo.run_round(state, 0)  # warm-up
    model.trained_samples = 0
    per_round = []
    for r in range(1, rounds + 1):
        start = time.perf_counter()
        algo.run_round(state, r)
        per_round.append(time.perf_counter() - start)
    peak = max(matmul_peak_gflops(), 1e-9)
    flops = model.train_flops / rounds
    limit = flops / (peak * 1e9)
    s = sorted(per_round)[len(per_round) // 2]
    return {
        "alg": alg,
        "model": model_name,
        "clients": clients,
        "per_round": max(1, round(fraction * clients)),
        "s_per_round": s,
        "limit_s": limit,
        "ratio": s / limit if limit > 0 else float("inf"),
        "peak_rss_gb": rss_gb(),
        "data_rss_gb": data_rss,
        "gflop_per_round": flops / 1e9,
        "peak_gflops": peak,
    }


# FLUTE's published CPU comparison (its README, "Flower Comparison", task lr_mnist): logistic
# regression on MNIST, 1,000 clients, 10 per round, batch 10, SGD lr 0.03, 1 local epoch, 100
# rounds, test every 20: FLUTE 3 min 20 s, Flower 1.0.0 30 min 14 s (accuracy ~80 for both).
FLUTE_S, FLOWER_S = 200.0, 1814.0
FLUTE_LR_MNIST = [
    "dataset.name=mnist",
    "partition.name=shards",
    "federation.num_clients=1000",
    "federation.num_edges=1",
    "federation.client_fraction=0.01",
    "model.name=mlr",
    "algorithm.name=fedavg",
    "algorithm.local_epochs=1",
    "algorithm.batch_size=10",
    "algorithm.lr=0.03",
    "rounds=100",
    "eval_every=20",
    "checkpoint_every=0",
    "progress=false",
]


def flute_anchor(threads: int) -> str:
    """FLUTE's lr_mnist workload run end to end by ``fedhp run`` (data loading, evaluation and
    writing the run folder included): one ``anchor`` line with fedhp's total wall time beside
    FLUTE's and Flower's published CPU times."""
    import tempfile

    with tempfile.TemporaryDirectory() as out:
        start = time.perf_counter()
        fedhp = str(Path(sys.executable).with_name("fedhp"))
        cmd = [fedhp, "run", *FLUTE_LR_MNIST, f"threads={threads}"]
        done = subprocess.run([*cmd, "--out", out], capture_output=True, text=True, check=False)
        wall = time.perf_counter() - start
        if done.returncode != 0:
            tail = (done.stderr.strip().splitlines() or ["?"])[-1]
            return f"anchor flute-lr-mnist failed: {tail}"
        summary = json.loads((Path(out) / "summary.json").read_text())
    acc = float(summary.get("final_global_acc", float("nan")))
    return (
        f"anchor flute-lr-mnist clients=1000 per_round=10 rounds=100 fedhp_wall_s={wall:.1f} "
        f"fedhp_acc={acc:.4f} flute_cpu_s={FLUTE_S:.0f} flower_cpu_s={FLOWER_S:.0f} "
        f"vs_flute={FLUTE_S / wall:.1f}x vs_flower={FLOWER_S / wall:.1f}x"
    )


def line(r: dict[str, Any]) -> str:
    return (
        f"scale {r['alg']} {r['model']} clients={r['clients']} per_round={r['per_round']} "
        f"s_per_round={r['s_per_round']:.3f} limit_s={r['limit_s']:.4f} ratio={r['ratio']:.1f} "
        f"peak_rss_gb={r['peak_rss_gb']:.2f} data_rss_gb={r['data_rss_gb']:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (median reported)")
    parser.add_argument("--only", nargs="*", choices=sorted(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--no-anchor", action="store_true", help="skip the FLUTE anchor line")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # run one configuration, print JSON
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, args.threads, args.rounds)))
        return
    import torch

    print(f"# torch {torch.__version__}, threads={args.threads}, {args.rounds} timed rounds")
    for name in args.only:
        cmd = [sys.executable, __file__, "--one", name, "--threads", str(args.threads)]
        done = subprocess.run(
            [*cmd, "--rounds", str(args.rounds)], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            tail = (done.stderr.strip().splitlines() or ["?"])[-1]
            print(f"scale {name} failed: {tail}", flush=True)
            continue
        print(line(json.loads(done.stdout.strip().splitlines()[-1])), flush=True)
    if not args.no_anchor:
        print(flute_anchor(args.threads), flush=True)


if __name__ == "__main__":
    main()
