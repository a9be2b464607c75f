"""Engine benchmark: vectorized multi-client training vs the per-client reference loop.

Same work for both paths, measured in the same run (this machine is shared and noisy): 20 clients
of MNIST Setting 1, batch 20, 100 local gradient steps per client per round, identical minibatch
indices. Timings are the median of interleaved repeats. ``train_gflops`` is the arithmetic the
engine really computed per second: the samples of its gradient evaluations, from its own counter
(``BatchedModel.trained_samples``), times the training FLOPs of one sample
(``BatchedModel.train_flops_per_sample``: FlopCounterMode's forward + backward of the reference
module, without the first layer's input gradient, which the engine never computes). Until issue 15
the line's ``gflops`` counted training as 3x the forward FLOPs, i.e. it also counted that input
gradient: 1.50x the real figure for MLR, 1.49x for DNN 784-100-10, 1.36x for 784-500-200-10,
1.11x for cnn2, 1.004x for VGG-11-BN and 1.001x for ResNet-18. The peak is the best 2048x2048
fp32 matmul measured right before and right after each model's timings (the higher of the two),
since the machine's speed drifts.

The conv models (``cnn2``, ``vgg11-bn``, ``resnet18``) run one local epoch of a fixed number of
steps for 10 clients, batch 20, on random inputs of their datasets' shape (1x28x28 for cnn2,
3x32x32 for the others: CIFAR-10 cannot be downloaded here, and the timings do not depend on the
values); their line adds ``vmap_all_s``, all clients in one vmap, beside the engine's choice
(``chunk`` clients at a time, see ``fedhp.engine.ops.client_chunk``).

Then one line per method for whole rounds of the runner (``--rounds``, issue 15): a FedAvg round
of 100 local steps, a sFedHP round (R = 20 local rounds of K = 5 steps), a pFedMe round
(R = 20, K = 5), a FedProx round (100 local steps, its default mu) and a SCAFFOLD round (100
local steps), i.e. 100 gradient steps per client each, MNIST Setting 1, DNN 784-100-10, 20
clients, every run's defaults otherwise. A round is timed as the runner's ``seconds_per_round``
counts it with ``eval_every=1``: ``run_round``, the ledger's round close and the runner's
evaluation (``evaluate_state``: global and, for the personalized methods, personalized models,
on test and train). The methods' rounds are interleaved, each continuing its own run;
``s_per_round`` is the median, split into ``train_s`` and ``eval_s`` (medians of their own), and
``ratio_to_fedavg`` divides it by the FedAvg round's median of the same run.

Usage: python benchmarks/bench_engine.py [--threads N] [--repeats R] [--steps S] [--models ...]
  [--rounds METHOD ...] [--round-repeats N]
Output: one line per model,
  bench <model> vectorized_s=… reference_s=… speedup=… train_gflops=… peak_gflops=…
(the MLPs add gemm_floor_s=… ceiling_speedup=…: the same run's time of the engine's matrix
products alone, :func:`mlp_gemms_only`, and the reference time over it, the best speedup those
kernels allow)
then one line per method of ``--rounds`` (default fedavg sfedhp pfedme fedprox scaffold;
none: ``--rounds``),
  bench round <method> s_per_round=… ratio_to_fedavg=… threads=… train_s=… eval_s=…
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from fedhp.config import resolve_config
from fedhp.engine.build import MODEL_SEED_OFFSET, Experiment, build_experiment
from fedhp.engine.ops import _sgd_loop, client_chunk, sgd_steps, weighted_mean
from fedhp.engine.reference import reference_fedavg_round, reference_local_sgd
from fedhp.engine.runner import evaluate_state
from fedhp.models import MODELS as ZOO
from fedhp.models.base import BatchedModel
from fedhp.models.zoo import BatchedMLP, weight_step_

MODELS = {
    "mlr": ["model.name=mlr"],
    "dnn100": ["model.name=dnn", "model.hidden=[100]"],
    "dnn500_200": ["model.name=dnn", "model.hidden=[500,200]"],
}


# name -> (model options, input shape, local steps = one epoch of fixed length)
CONV_MODELS: dict[str, tuple[dict[str, object], tuple[int, ...], int]] = {
    "cnn2": ({"name": "cnn2"}, (1, 28, 28), 30),  # FedLPS: 600 samples per client = 30 steps
    "vgg11-bn": ({"name": "vgg", "cfg": "vgg11", "batch_norm": True}, (3, 32, 32), 2),
    "resnet18": ({"name": "resnet18"}, (3, 32, 32), 1),
}
CONV_CLIENTS = 10


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
    paths: list[tuple[Callable[[], object], list[float]]] = [(reference, []), (vectorized, [])]
    if isinstance(model, BatchedMLP):
        start = w0.expand(len(clients), -1)

        def floor() -> None:
            mlp_gemms_only(model, start.clone(), batches)

        floor()
        paths.append((floor, []))
    model.trained_samples = 0
    for _ in range(repeats):
        for fn, times in paths:
            _timed(fn, times)
    ref, vec, *rest = (statistics.median(times) for _, times in paths)
    flops = train_flops_per_call(model, repeats)
    # The peak right before and right after this model's timings; the higher one is reported
    # (conservative for the share of peak). Measuring it between repeats would evict the caches
    # the small models live in and slow them ~2x.
    peak = max(peak_before, matmul_peak_gflops())
    ceiling = f" gemm_floor_s={rest[0]:.4f} ceiling_speedup={ref / rest[0]:.2f}" if rest else ""
    return (
        f"bench {name} vectorized_s={vec:.4f} reference_s={ref:.4f} speedup={ref / vec:.2f} "
        f"train_gflops={flops / vec / 1e9:.1f} peak_gflops={peak:.1f} max_param_diff={drift:.1e}"
        + ceiling
    )


def mlp_gemms_only(
    model: BatchedMLP, flat: torch.Tensor, batches: list[tuple[torch.Tensor, torch.Tensor]]
) -> None:
    """The matrix products of the engine's MLP steps and nothing else, on the same batches and
    shapes, with the same kernels (``BatchedMLP.sgd_step``'s forward ``baddbmm``, its input
    gradients and its weight updates) but no bias, activation, loss or softmax work and no
    per-step Python logic: a floor on the vectorized path's time with these kernels. Clients in
    the engine's chunks (:func:`~fedhp.engine.ops.client_chunk`), as ``sgd_steps`` trains them."""
    chunk = client_chunk(flat.shape[1], flat.shape[0])
    for start in range(0, flat.shape[0], chunk):
        rows = slice(start, start + chunk)
        _mlp_gemms(model, flat[rows], [(x[rows], y) for x, y in batches])


def _mlp_gemms(
    model: BatchedMLP, flat: torch.Tensor, batches: list[tuple[torch.Tensor, torch.Tensor]]
) -> None:
    layers = model._layers(flat)
    with torch.no_grad():
        for x, _ in batches:
            h = x.reshape(x.shape[0], x.shape[1], -1)
            acts = [h]
            for w, b in layers:
                h = torch.baddbmm(b.unsqueeze(1), h, w.transpose(1, 2))
                acts.append(h)
            delta = acts[-1].mul_(1e-6)  # any values: the timings do not depend on them
            for i in reversed(range(len(layers))):
                w = layers[i][0]
                below = torch.bmm(delta, w) if i > 0 else delta
                weight_step_(w, delta, acts[i], 1e-6)
                delta = below


def train_flops_per_call(model: BatchedModel, calls: int) -> float:
    """Training FLOPs of one call of the engine path, from the engine's own count of the samples
    it trained (``model.trained_samples``, reset before the ``calls`` timed calls; the reference
    path does not count)."""
    return model.trained_samples / calls * model.train_flops_per_sample()


def _timed(fn: object, times: list[float]) -> None:
    t = time.perf_counter()
    fn()  # type: ignore[operator]
    times.append(time.perf_counter() - t)


def bench_conv(name: str, repeats: int, peak_before: float) -> str:
    """One epoch of a fixed number of steps, 10 clients, batch 20: the engine (its own client
    chunking), all clients in one vmap, and the per-client reference loop."""
    options, shape, steps = CONV_MODELS[name]
    model = ZOO.build(options, "model").build(shape, 10)
    g = torch.Generator().manual_seed(0)
    batches = [
        (
            torch.randn(CONV_CLIENTS, 20, *shape, generator=g),
            torch.randint(0, 10, (CONV_CLIENTS, 20), generator=g),
        )
        for _ in range(steps)
    ]
    w0 = model.init_params(0).expand(CONV_CLIENTS, -1)
    b0 = model.init_buffers().expand(CONV_CLIENTS, -1)

    def vectorized() -> torch.Tensor:
        it = iter(batches)
        bufs = b0.clone()
        return sgd_steps(model, w0, lambda: next(it), steps, 0.05, buffers=bufs)[0]

    def vmap_all() -> torch.Tensor:
        return _sgd_loop(model, w0.clone(), iter(batches), 0.05, None, b0.clone())[0]

    def reference() -> torch.Tensor:
        return reference_local_sgd(model, w0, batches, 0.05, buffers=b0.clone())

    drift = (vectorized() - reference()).abs().max().item()  # also warms both paths up
    vec_times: list[float] = []
    all_times: list[float] = []
    ref_times: list[float] = []
    model.trained_samples = 0
    for _ in range(repeats):
        _timed(reference, ref_times)
        _timed(vectorized, vec_times)
        _timed(vmap_all, all_times)
    vec, ref = statistics.median(vec_times), statistics.median(ref_times)
    # vectorized and vmap_all both train through the engine: 2 counted calls per repeat
    flops = train_flops_per_call(model, 2 * repeats)
    peak = max(peak_before, matmul_peak_gflops())
    chunk = client_chunk(model.num_params, CONV_CLIENTS)
    return (
        f"bench {name} vectorized_s={vec:.4f} reference_s={ref:.4f} speedup={ref / vec:.2f} "
        f"train_gflops={flops / vec / 1e9:.1f} peak_gflops={peak:.1f} "
        f"max_param_diff={drift:.1e} vmap_all_s={statistics.median(all_times):.4f} "
        f"chunk={chunk} steps={steps}"
    )


# method -> its overrides: 100 gradient steps per client per round each (MNIST Setting 1,
# DNN 784-100-10, 20 clients: the defaults)
ROUND_METHODS: dict[str, list[str]] = {
    "fedavg": ["algorithm.name=fedavg", "algorithm.local_steps=100"],
    "sfedhp": ["algorithm.name=sfedhp", "algorithm.R=20", "algorithm.K=5"],
    "pfedme": ["algorithm.name=pfedme", "algorithm.R=20", "algorithm.K=5"],
    "fedprox": ["algorithm.name=fedprox", "algorithm.local_steps=100"],
    "scaffold": ["algorithm.name=scaffold", "algorithm.local_steps=100"],
}


class RoundTimer:
    """One method's run, a round at a time: ``run_round``, the ledger's round close and the
    runner's evaluation, as ``seconds_per_round`` counts a round under ``eval_every=1``."""

    def __init__(self, method: str) -> None:
        self.exp: Experiment = build_experiment(
            resolve_config(None, ["progress=false", "checkpoint_every=0", *ROUND_METHODS[method]])
        )
        seed = self.exp.cfg.seed + MODEL_SEED_OFFSET
        self.state = self.exp.algorithm.init_state(self.exp.model.init_params(seed))
        self.rnd = 0
        self.train_s: list[float] = []
        self.eval_s: list[float] = []
        self.grad_evals = self.exp.options.gradient_evaluations()

    def round(self) -> None:
        """Run and evaluate the next round, keeping its two timings."""
        exp = self.exp
        start = time.perf_counter()
        exp.ctx.begin_round(self.rnd)
        exp.algorithm.run_round(self.state, self.rnd)
        exp.ctx.ledger.end_round()
        trained = time.perf_counter()
        evaluate_state(exp, self.state)
        self.eval_s.append(time.perf_counter() - trained)
        self.train_s.append(trained - start)
        self.rnd += 1

    @property
    def seconds(self) -> float:
        """The median round, evaluation included."""
        return statistics.median(t + e for t, e in zip(self.train_s, self.eval_s, strict=True))


def bench_rounds(methods: list[str], repeats: int) -> list[str]:
    """``repeats`` interleaved rounds of each method (after one warm-up round each); FedAvg's
    round is always timed, as the ratios' denominator."""
    names = ["fedavg", *(m for m in methods if m != "fedavg")]
    timers = {name: RoundTimer(name) for name in names}
    for timer in timers.values():  # warm-up
        timer.round()
        timer.train_s.clear()
        timer.eval_s.clear()
    for _ in range(repeats):
        for timer in timers.values():
            timer.round()
    base = timers["fedavg"].seconds
    return [
        f"bench round {name} s_per_round={timers[name].seconds:.4f} "
        f"ratio_to_fedavg={timers[name].seconds / base:.2f} threads={torch.get_num_threads()} "
        f"train_s={statistics.median(timers[name].train_s):.4f} "
        f"eval_s={statistics.median(timers[name].eval_s):.4f} "
        f"grad_evals={timers[name].grad_evals}"
        for name in methods
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--models", nargs="*", default=[*MODELS, *CONV_MODELS])
    parser.add_argument("--conv-repeats", type=int, default=1, help="repeats of the conv models")
    parser.add_argument(
        "--rounds",
        nargs="*",
        default=list(ROUND_METHODS),
        choices=list(ROUND_METHODS),
        help="methods whose whole rounds are timed against FedAvg's (none: skip)",
    )
    parser.add_argument("--round-repeats", type=int, default=9, help="timed rounds per method")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"# torch {torch.__version__}, threads={torch.get_num_threads()}, 20 clients, batch 20, "
        f"{args.steps} local steps per round; median of {args.repeats} interleaved repeats "
        f"(conv models: {CONV_CLIENTS} clients, batch 20, the line's steps, "
        f"{args.conv_repeats} repeat(s))",
        flush=True,
    )
    for name in args.models:
        if name in CONV_MODELS:
            line = bench_conv(name, args.conv_repeats, matmul_peak_gflops())
        else:
            line = bench_model(name, args.steps, args.repeats, matmul_peak_gflops())
        print(line, flush=True)
    if args.rounds:
        for line in bench_rounds(args.rounds, args.round_repeats):
            print(line, flush=True)


if __name__ == "__main__":
    main()
