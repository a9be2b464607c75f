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

``--device cuda`` (``make bench DEVICE=cuda``) runs the same configurations on the GPU (every
timing synchronizes the device; the matmul rate is measured on the device). Every line also has
``launches`` (kernel launches of one round, counted by ``torch.profiler``: CUDA's
``cudaLaunchKernel`` calls on a GPU, operator calls on the CPU), ``gflops`` (achieved),
``copy_gbs`` (measured same-device copy bandwidth), ``roofline_s`` = max(FLOPs / matmul rate,
minimum bytes / copy bandwidth) and ``roofline_ratio`` = ``s_per_round / roofline_s``
(benchmarks/roofline.py); ``limit_s`` and ``ratio`` keep their earlier, FLOPs-only meaning.
``--smoke``: 8 clients, one local step, 1 timed round, no anchor (checks that the script runs).

Usage: python benchmarks/bench_scale.py [--threads N] [--rounds R] [--only NAME ...] [--no-anchor]
  [--device cpu|cuda] [--precision fp32|tf32|bf16] [--smoke]
Output: one line per configuration,
  scale <alg> <model> clients=<n> per_round=<n> s_per_round=<f> limit_s=<f> ratio=<f>
        peak_rss_gb=<f> data_rss_gb=<f> launches=<n> gflops=<f> copy_gbs=<f> roofline_s=<f>
        roofline_ratio=<f> device=<cpu|cuda> precision=<p>
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

from roofline import copy_gbs, count_launches, matmul_gflops, min_round_bytes, roofline_s, timed

SMOKE_CLIENTS = 8
SMOKE = ["algorithm.local_steps=1", "algorithm.R=1", "algorithm.K=1"]  # applied to its algorithm

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


def run_one(
    name: str,
    threads: int,
    rounds: int,
    device: str = "cpu",
    precision: str = "fp32",
    smoke: bool = False,
) -> dict[str, Any]:
    """Build, warm up and time one configuration (in this process)."""
    import torch

    from fedhp.build import build_experiment
    from fedhp.config import resolve_config

    torch.set_num_threads(threads)
    alg, model_name, clients, fraction, overrides = CONFIGS[name]
    if smoke:
        clients = min(clients, SMOKE_CLIENTS)
        keep = ("algorithm.R", "algorithm.K") if alg == "sfedhp" else ("algorithm.local_steps",)
        overrides = [*overrides, *(o for o in SMOKE if o.startswith(keep))]
    if alg == "sfedhp":
        topology = [f"federation.num_edges={min(50, clients)}"]
    else:
        topology = ["federation.num_edges=1", f"federation.client_fraction={fraction}"]
    cfg = resolve_config(
        None,
        [
            "progress=false",
            f"threads={threads}",
            f"device={device}",
            f"precision={precision}",
            f"federation.num_clients={clients}",
            *([f"dataset.num_clients={clients}"] if "dataset.name=synthetic" in overrides else []),
            *topology,
            *overrides,
        ],
    )
    exp = build_experiment(cfg)
    data_rss = rss_gb()
    model, algo = exp.model, exp.algorithm
    dev = exp.ctx.device
    state = algo.init_state(model.init_params(0).to(dev))  # as the runner does
    algo.run_round(state, 0)  # warm-up
    model.trained_samples = 0
    per_round = [timed(lambda r=r: algo.run_round(state, r), dev) for r in range(1, rounds + 1)]
    trained = model.trained_samples / rounds
    launches = count_launches(lambda: algo.run_round(state, rounds + 1), dev)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    with model.policy.autocast():  # tf32: the matmul rate under TF32
        peak = max(matmul_gflops(dev, dtype=dtype), 1e-9)
    bandwidth = copy_gbs(dev, mib=8 if smoke else 256)
    flops = trained * model.train_flops_per_sample()
    limit = flops / (peak * 1e9)
    s = sorted(per_round)[len(per_round) // 2]
    batch = int(exp.options.batch_size)  # type: ignore[attr-defined]
    rows = 2 if alg == "sfedhp" else 1  # sFedHP's theta and w_loc
    features = int(torch.Size(model.feature_shape).numel())
    per = max(1, round(fraction * clients))
    nbytes = min_round_bytes(trained / batch, rows, model.num_params, trained, features, per)
    roof = roofline_s(flops, nbytes, peak, bandwidth)
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
        "launches": launches,
        "gflops": flops / s / 1e9,
        "copy_gbs": bandwidth,
        "roofline_s": roof,
        "roofline_ratio": s / roof,
        "device": dev.type,
        "precision": precision,
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
        f"peak_rss_gb={r['peak_rss_gb']:.2f} data_rss_gb={r['data_rss_gb']:.2f} "
        f"launches={r['launches']} gflops={r['gflops']:.1f} copy_gbs={r['copy_gbs']:.1f} "
        f"roofline_s={r['roofline_s']:.4f} roofline_ratio={r['roofline_ratio']:.1f} "
        f"device={r['device']} precision={r['precision']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (median reported)")
    parser.add_argument("--only", nargs="*", choices=sorted(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--no-anchor", action="store_true", help="skip the FLUTE anchor line")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: does it run?")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per configuration")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # run one configuration, print JSON
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.no_anchor = 1, True
    if args.one:
        result = run_one(
            args.one, args.threads, args.rounds, args.device, args.precision, args.smoke
        )
        print(json.dumps(result))
        return
    import torch

    print(
        f"# torch {torch.__version__}, threads={args.threads}, {args.rounds} timed rounds, "
        f"device={args.device}, precision={args.precision}"
    )
    for name in args.only:
        cmd = [sys.executable, __file__, "--one", name, "--threads", str(args.threads)]
        cmd += ["--device", args.device, "--precision", args.precision]
        cmd += ["--smoke"] if args.smoke else []
        try:
            done = subprocess.run(
                [*cmd, "--rounds", str(args.rounds)],
                capture_output=True,
                text=True,
                check=False,
                timeout=args.timeout,
            )
        except subprocess.TimeoutExpired:
            print(f"scale {name} failed: timed out after {args.timeout:.0f} s", flush=True)
            continue
        if done.returncode != 0:
            tail = (done.stderr.strip().splitlines() or ["?"])[-1]
            print(f"scale {name} failed: {tail}", flush=True)
            continue
        print(line(json.loads(done.stdout.strip().splitlines()[-1])), flush=True)
    if not args.no_anchor:
        print(flute_anchor(args.threads), flush=True)


if __name__ == "__main__":
    main()
