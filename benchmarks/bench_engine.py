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
(``chunk`` clients at a time: the run's :class:`~fedhp.models.policy.ExecutionPolicy`).

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
  [--rounds METHOD ...] [--round-repeats N] [--device cpu|cuda] [--precision P] [--table]
  [--rows ROW ...] [--smoke]
Output: one line per model,
  bench <model> vectorized_s=… reference_s=… speedup=… train_gflops=… peak_gflops=…
(the MLPs add gemm_floor_s=… ceiling_speedup=…: the same run's time of the engine's matrix
products alone, :func:`mlp_gemms_only`, and the reference time over it, the best speedup those
kernels allow)
then one line per method of ``--rounds`` (default fedavg sfedhp pfedme fedprox scaffold;
none: ``--rounds``),
  bench round <method> s_per_round=… ratio_to_fedavg=… threads=… train_s=… eval_s=…

The device table (``--device cuda`` runs it instead of the CPU lines above; ``--table`` adds it
on the CPU): the engine against the per-client loop on the same device (one module per client,
loaded from the client's row, trained with ``torch.optim.SGD`` — how PFLlib, FL-bench and Flower
simulations train — the same precision and minibatches) for DNN-100 at 1,000 clients (5 steps of
batch 5) and cnn2 / VGG-11-BN / ResNet-18 at 10 clients (Fashion-MNIST's 1x28x28, one epoch of
6,000 samples in batch 64 = 94 steps; random inputs: the timings do not depend on the values),
then whole ``run_round`` rounds of sFedHP DNN-100 (1,000 clients, 50 edges) and FedAvg DNN-100
(10,000 clients) as ``bench_scale.py`` runs them, one line each (a local row: two, its times
first, then its kernel launches, profiled on 4 steps and 10 loop clients and scaled):
  device <row> s_per_round=… reference_s=… speedup=… gflops=… roofline_s=… ratio=… precision=…
  device <row> launches=… reference_launches=…
(``ratio`` = s_per_round / roofline_s, benchmarks/roofline.py). ``--smoke``: tiny sizes (2 to
8 clients, 1-2 steps), to check that the script runs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from fedhp.build import build_experiment
from fedhp.config import resolve_config
from fedhp.engine.experiment import MODEL_SEED_OFFSET, Experiment
from fedhp.engine.ops import LocalSteps, _train_rows, sgd_steps, weighted_mean
from fedhp.engine.reference import reference_fedavg_round, reference_local_sgd
from fedhp.engine.runner import evaluate_state
from fedhp.models import MODELS as ZOO
from fedhp.models.base import BatchedModel
from fedhp.models.policy import build_policy
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
    the engine's chunks (the model's policy), as ``sgd_steps`` trains them."""
    chunk = model.policy.chunk(flat.shape[1], flat.shape[0])
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

    def vmap_all() -> torch.Tensor:  # every client in one vmap: one part of all the rows
        params, it = w0.clone(), iter(batches)

        def batch(step: int, rows: slice) -> tuple[torch.Tensor, torch.Tensor, None]:
            x, y = next(it)
            return x, y, None

        rows, bufs = slice(0, CONV_CLIENTS), b0.clone()
        _train_rows(LocalSteps(model, batch, steps, 0.05, buffers=bufs), params, rows, None)
        return params

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
    chunk = model.policy.chunk(model.num_params, CONV_CLIENTS)
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


# The device table (see the module docstring): row -> (model options, clients, steps, batch)
TABLE_LOCAL: dict[str, tuple[dict[str, object], int, int, int]] = {
    "dnn100-1k": ({"name": "dnn", "hidden": [100]}, 1000, 5, 5),
    "cnn2-10": ({"name": "cnn2"}, 10, 94, 64),
    "vgg11-bn-10": ({"name": "vgg", "cfg": "vgg11", "batch_norm": True}, 10, 94, 64),
    "resnet18-10": ({"name": "resnet18"}, 10, 94, 64),
}
LAUNCH_STEPS, LAUNCH_CLIENTS = 4, 10  # launches: profiled on this many steps / loop clients
SMOKE_LOCAL = (2, 2, 4)  # clients, steps, batch under --smoke (DNN-100: 8 clients)
TABLE_ROUNDS = {"sfedhp-dnn100-1k": "sfedhp-dnn100-1k", "fedavg-dnn100-10k": "fedavg-dnn100-10k"}
FMNIST = (1, 28, 28)


def loop_reference(
    model: BatchedModel,
    params: torch.Tensor,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    lr: float,
    buffers: torch.Tensor | None = None,
) -> torch.Tensor:
    """The per-client loop on ``params``' device: one module (built once, on the device), each
    client's row loaded into it, ``torch.optim.SGD`` steps under the model's precision
    (``policy.autocast``), the trained row read back."""
    module = model.make_module(params[0].cpu()).to(params.device)
    module.train()
    out = []
    for c in range(params.shape[0]):
        model.layout.load_into(module, params[c])
        if buffers is not None:
            model.buffer_layout.load_into(module, buffers[c])
        opt = torch.optim.SGD(module.parameters(), lr=lr)
        for x, y in batches:
            opt.zero_grad(set_to_none=True)
            with model.policy.autocast():
                logits = module(x[c])
            torch.nn.functional.cross_entropy(logits.float(), y[c]).backward()
            opt.step()
        out.append(model.layout.flatten_module(module))
        if buffers is not None:
            buffers[c] = model.buffer_layout.flatten_module(module)
    return torch.stack(out)


def device_context(
    device: torch.device, precision: str, smoke: bool = False
) -> tuple[float, float]:
    """The device's matmul rate (GFLOP/s, at ``precision``) and copy bandwidth (GB/s); small
    probes under ``smoke``."""
    from roofline import copy_gbs, matmul_gflops

    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    try:
        rate = matmul_gflops(device, n=256 if smoke else 2048, dtype=dtype)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    return rate, copy_gbs(device, mib=4 if smoke else 256)


def table_local(
    row: str, device: torch.device, precision: str, repeats: int, smoke: bool, rates: tuple
) -> str:
    """One local-training row of the device table: the engine (``sgd_steps`` and the mean)
    against :func:`loop_reference`, same minibatches, same precision. Prints the times; returns
    the launches line."""
    from roofline import count_launches, min_round_bytes, roofline_s, timed

    options, clients, steps, batch = TABLE_LOCAL[row]
    shape = FMNIST
    if smoke:
        clients, steps, batch = SMOKE_LOCAL
        clients = 8 if row == "dnn100-1k" else clients
    model = ZOO.build(options, "model").build(shape, 10)
    model.policy = build_policy(
        device, model.reference, shape, batch_size=batch, precision=precision
    )  # type: ignore[arg-type]
    g = torch.Generator().manual_seed(0)
    batches = [
        (
            torch.randn(clients, batch, *shape, generator=g).to(device),
            torch.randint(0, 10, (clients, batch), generator=g).to(device),
        )
        for _ in range(steps)
    ]
    w0 = model.init_params(0).to(device).expand(clients, -1)
    b0 = model.init_buffers().to(device).expand(clients, -1) if model.num_buffers else None
    weights = torch.ones(clients, device=device)

    def engine(n: int = steps) -> torch.Tensor:
        it = iter(batches)
        bufs = None if b0 is None else b0.clone()
        local, _ = sgd_steps(model, w0, lambda: next(it), n, 0.05, buffers=bufs)
        return weighted_mean(local, weights)

    def reference(upto: int = clients) -> torch.Tensor:
        bufs = None if b0 is None else b0[:upto].clone()
        return weighted_mean(loop_reference(model, w0[:upto], batches, 0.05, bufs), weights[:upto])

    drift = (engine() - reference()).abs().max().item()  # also warms both up
    model.trained_samples = 0
    eng = statistics.median(timed(engine, device) for _ in range(repeats))
    flops = train_flops_per_call(model, repeats)
    ref = statistics.median(timed(reference, device) for _ in range(repeats))
    features = int(torch.Size(shape).numel())
    samples = clients * batch * steps
    nbytes = min_round_bytes(clients * steps, 1, model.num_params, samples, features, clients)
    roof = roofline_s(flops, nbytes, *rates)
    # the times first: a profile that outlasts a time box must not take them with it
    print(
        f"device {row} s_per_round={eng:.4f} reference_s={ref:.4f} speedup={ref / eng:.2f} "
        f"gflops={flops / eng / 1e9:.1f} roofline_s={roof:.4f} ratio={eng / roof:.1f} "
        f"max_param_diff={drift:.1e} chunk={model.policy.chunk(model.num_params, clients)} "
        f"clients={clients} steps={steps} batch={batch} device={device.type} "
        f"precision={precision}",
        flush=True,
    )
    # Launches, profiled on a short run and scaled (every step launches the same kernels, every
    # loop client the same steps): a profile of a whole conv-net round or of 1,000 loop clients
    # outlasts its time box on a GPU (seen on an H100, 2026-11-26).
    few = min(steps, LAUNCH_STEPS)
    once = count_launches(lambda: engine(1), device)
    launches = once + (count_launches(lambda: engine(few), device) - once) * (steps - 1) // max(
        few - 1, 1
    )
    upto = min(clients, LAUNCH_CLIENTS)
    ref_launches = count_launches(lambda: reference(upto), device) * clients // upto
    return f"device {row} launches={launches} reference_launches={ref_launches}"


def table_round(row: str, device: torch.device, precision: str, smoke: bool) -> str:
    """One whole-round row of the device table, as ``bench_scale.py`` measures it."""
    from bench_scale import run_one

    r = run_one(
        TABLE_ROUNDS[row], torch.get_num_threads(), 1 if smoke else 3, str(device), precision, smoke
    )
    return (
        f"device {row} s_per_round={r['s_per_round']:.4f} launches={r['launches']} "
        f"gflops={r['gflops']:.1f} roofline_s={r['roofline_s']:.4f} "
        f"ratio={r['roofline_ratio']:.1f} clients={r['clients']} device={r['device']} "
        f"precision={precision}"
    )


def device_table(
    device: torch.device, precision: str, rows: list[str], repeats: int, smoke: bool
) -> None:
    """Print the device table's ``rows``; a row that fails prints its one-line error."""
    rates = device_context(device, precision, smoke)
    print(
        f"# device table: {device}, precision={precision}, matmul_gflops={rates[0]:.0f}, "
        f"copy_gbs={rates[1]:.0f}, repeats={repeats}",
        flush=True,
    )
    for row in rows:
        try:
            if row in TABLE_LOCAL:
                line = table_local(row, device, precision, repeats, smoke, rates)
            else:
                line = table_round(row, device, precision, smoke)
        except Exception as err:  # one failing row must not hide the others
            line = f"device {row} failed: {type(err).__name__}: {str(err).splitlines()[0][:200]}"
        print(line, flush=True)


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
    parser.add_argument("--device", default="cpu", help="cpu (default: the CPU lines) or cuda")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"])
    parser.add_argument("--table", action="store_true", help="also the device table on the CPU")
    parser.add_argument(
        "--rows",
        nargs="*",
        default=[*TABLE_LOCAL, *TABLE_ROUNDS],
        choices=[*TABLE_LOCAL, *TABLE_ROUNDS],
        help="rows of the device table",
    )
    parser.add_argument("--table-repeats", type=int, default=3, help="timed calls per row")
    parser.add_argument("--smoke", action="store_true", help="device table at tiny sizes")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type != "cpu" or args.table or args.smoke:
        repeats = 1 if args.smoke else args.table_repeats
        device_table(device, args.precision, args.rows, repeats, args.smoke)
        return
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
