"""What a CUDA graph would give a small run (issue 40, Deliver 4), measured before building it.

The default ``fedhp run`` experiment (sFedHP, 20 clients, DNN-100) spends its round launching
kernels (docs/gpu.md, "Measured on an H200": 4,160 launches and 0.024 s of kernels in a 0.070 s
round). This probe takes the work that fills a round — one θ subproblem: ``K`` gradient steps of
every client's rows on its own minibatch with sFedHP's proximal pull,
``θ ← lerp(θ, w, η2 λ) − η2 ∇f(θ)`` (its fused round's step without a sparsity penalty) — and
runs it

* **eager**: as the engine does today, kernel by kernel (the minibatches copied into place first);
* **graph**: the same ``K`` steps captured once with ``torch.cuda.graph`` and replayed, the
  minibatches copied into the captured (static) input buffers before each replay.

Both start from the same rows and read the same minibatches; ``max_abs_diff`` compares their
results (a replay runs the captured kernels, so it should be 0). ``speedup`` is eager / graph per
θ subproblem; ``round_s_eager`` / ``round_s_graph`` scale one subproblem to the round's ``R``
(the edges' steps, the uplink and the ledger are not in the probe: a lower bound of what is left).
On the CPU only the eager half runs (``graph=skipped``).

Usage: python benchmarks/gpu_graph_probe.py [--device cuda] [--repeats 20] [key=value ...]
Prints one line ``graph-probe key=value ...``; a capture that fails prints ``graph=failed`` and
the error (e.g. a host sync inside the step), which is itself the answer to "can it be captured".
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from gpu_profile import build_default, sync


def build(device: str, overrides: list[str]) -> tuple[Any, Any, torch.device]:
    """The default experiment on ``device``: it, its algorithm's options and the device."""
    exp = build_default(device, overrides)
    return exp, exp.options, exp.ctx.device


def minibatches(exp: Any, clients: int, steps: int, batch: int, sets: int) -> list[tuple]:
    """``sets`` draws of ``steps`` minibatches ``x [steps, C, B, ...]``, ``y [steps, C, B]``."""
    train, dev = exp.ctx.fed.train, exp.ctx.device
    ids = torch.arange(clients, device=dev)
    sizes = (train.offsets[1 : clients + 1] - train.offsets[:clients]).min().item()
    gen = torch.Generator(device="cpu").manual_seed(0)
    out = []
    for _ in range(sets):
        xs, ys = [], []
        for _ in range(steps):
            idx = torch.randint(0, int(sizes), (clients, batch), generator=gen).to(dev)
            x, y = train.gather(ids, idx)
            xs.append(x)
            ys.append(y)
        out.append((torch.stack(xs), torch.stack(ys)))
    return out


def theta_steps(model: Any, lr: float, lam: float) -> Callable[..., None]:
    """``K`` proximal gradient steps of ``theta [C, P]`` towards ``w [C, P]`` in place, as
    sFedHP's fused round takes them without a sparsity penalty
    (:func:`fedhp.algorithms.sfedhp._prox_steps`): the model's ``sgd_step`` with the pull
    ``theta <- lerp(theta, w, lr lam)`` applied to each layer's columns inside the step."""

    def run(theta: torch.Tensor, w: torch.Tensor, xs: torch.Tensor, ys: torch.Tensor) -> None:
        def pull(lo: int, hi: int) -> None:
            theta[:, lo:hi].lerp_(w[:, lo:hi], lr * lam)

        for k in range(xs.shape[0]):
            model.sgd_step(theta, xs[k], ys[k], lr, pull)

    return run


def timed(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Median seconds of ``fn`` over ``repeats`` calls (the device synchronized around each)."""
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    exp, opt, dev = build(args.device, args.overrides)
    model, clients = exp.model, exp.ctx.topology.num_clients
    K, R, lr, lam = int(opt.K), int(opt.R), float(opt.lr), float(opt.lam1_value)
    batch = int(opt.batch_size)
    w = model.init_params(0).to(dev).expand(clients, -1).clone()
    data = minibatches(exp, clients, K, batch, sets=4)
    step = theta_steps(model, lr, lam)
    values: dict[str, float] = {"clients": clients, "K": K, "R": R}

    theta = w.clone()
    turn = iter(range(10**9))

    def eager() -> None:
        xs, ys = data[next(turn) % len(data)]
        step(theta, w, xs.clone(), ys.clone())  # the copies a replay's refill costs too

    step(theta, w, *data[0])  # warm-up
    values["eager_s"] = timed(eager, dev, args.repeats)
    values["round_s_eager"] = values["eager_s"] * R
    line = " ".join(f"{k}={v:.6g}" for k, v in values.items())
    if dev.type != "cuda":
        print(f"graph-probe device={dev.type} {line} graph=skipped", flush=True)
        return
    static_theta, static_x, static_y = w.clone(), data[0][0].clone(), data[0][1].clone()
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graph asks
            for _ in range(3):
                step(static_theta, w, static_x, static_y)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step(static_theta, w, static_x, static_y)
    except Exception as err:  # noqa: BLE001 - the failure is the finding
        msg = str(err).splitlines()[0][:200]
        print(f"graph-probe device=cuda {line} graph=failed error={msg!r}", flush=True)
        return

    def replay() -> None:
        xs, ys = data[next(turn) % len(data)]
        static_x.copy_(xs)
        static_y.copy_(ys)
        graph.replay()

    values["graph_s"] = timed(replay, dev, args.repeats)
    values["round_s_graph"] = values["graph_s"] * R
    values["speedup"] = values["eager_s"] / values["graph_s"]
    # the same start and minibatches through both: the replay must compute what eager does
    a, b = w.clone(), w.clone()
    step(a, w, *data[1])
    static_theta.copy_(b)
    static_x.copy_(data[1][0])
    static_y.copy_(data[1][1])
    graph.replay()
    sync(dev)
    values["max_abs_diff"] = float((a - static_theta).abs().max())
    line = " ".join(f"{k}={v:.6g}" for k, v in values.items())
    print(f"graph-probe device=cuda torch={torch.__version__} {line} graph=ok", flush=True)


if __name__ == "__main__":
    main()
