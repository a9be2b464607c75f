"""Engine benchmark: vectorized multi-client training vs the per-client reference loop.

Same work for both paths, measured in the same run (this machine is shared and noisy): 20 clients
of MNIST Setting 1, batch 20, 100 local gradient steps per client per round, identical minibatch
indices. Timings are the median of interleaved repeats. GFLOP/s counts training as 3x the forward
FLOPs (forward + backward); the peak is the best 2048x2048 fp32 matmul measured right before and
right after each model's timings (the higher of the two), since the machine's speed drifts.

Usage: python benchmarks/bench_engine.py [--threads N] [--repeats R] [--steps S]
Output: one line per model,
  bench <model> vectorized_s=… reference_s=… speedup=… gflops=… peak_gflops=…
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from fedhp.config import resolve_config
from fedhp.engine.build import build_experiment
from fedhp.engine.ops import sgd_steps, weighted_mean
from fedhp.engine.reference import reference_fedavg_round

MODELS = {
    "mlr": ["model.name=mlr"],
    "dnn100": ["model.name=dnn", "model.hidden=[100]"],
    "dnn500_200": ["model.name=dnn", "model.hidden=[500,200]"],
}


def matmul_peak_gflops(n: int = 2048, repeats: int = 5) -> float:
    """Best fp32 GFLOP/s of an n x n matmul."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def bench_model(name: str, steps: int, repeats: int, peak_before: float) -> str:
    exp = build_experiment(resolve_config(None, ["progress=false", *MODELS[name]]))
    ctx, model = exp.ctx, exp.model
    clients = ctx.all_clients
    weights = ctx.client_weights(clients)
    draw = ctx.batches(clients, 20)
    batches = [draw() for _ in range(steps)]
    w0 = model.init_params(0)

    def vectorized() -> torch.Tensor:
        it = iter(batches)
        local, _ = sgd_steps(model, w0.expand(len(clients), -1), lambda: next(it), steps, 0.05)
        return weighted_mean(local, weights)

    def reference() -> torch.Tensor:
        return reference_fedavg_round(model, w0, batches, 0.05, weights)

    drift = (vectorized() - reference()).abs().max().item()  # also warms both paths up
    vec_times, ref_times = [], []
    for _ in range(repeats):
        for fn, times in ((reference, ref_times), (vectorized, vec_times)):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    vec, ref = statistics.median(vec_times), statistics.median(ref_times)
    # The peak right before and right after this model's timings; the higher one is reported
    # (conservative for the share of peak). Measuring it between repeats would evict the caches
    # the small models live in and slow them ~2x.
    peak = max(peak_before, matmul_peak_gflops())
    flops = 3 * model.flops_per_sample() * 20 * len(clients) * steps
    return (
        f"bench {name} vectorized_s={vec:.4f} reference_s={ref:.4f} speedup={ref / vec:.2f} "
        f"gflops={flops / vec / 1e9:.1f} peak_gflops={peak:.1f} max_param_diff={drift:.1e}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"# torch {torch.__version__}, threads={torch.get_num_threads()}, 20 clients, batch 20, "
        f"{args.steps} local steps per round; median of {args.repeats} interleaved repeats",
        flush=True,
    )
    for name in args.models:
        print(bench_model(name, args.steps, args.repeats, matmul_peak_gflops()), flush=True)


if __name__ == "__main__":
    main()
