"""LSTM benchmark: the batched character LSTM (all clients through the engine's local steps,
:func:`fedhp.engine.ops.sgd_steps`) vs the per-client reference loop (one ``nn.Module`` per client
with ``nn.LSTM`` and ``torch.optim.SGD``, :func:`fedhp.engine.reference.reference_local_sgd`).

Same work for both, measured in the same run (the machine is shared and noisy): ``--clients``
clients, LEAF's model (embedding 8 → 2-layer LSTM → linear, ``--hidden`` units), sequences of
``--seq-len`` random character indices (81 symbols: LEAF's 80 and the unknown one; the timings do
not depend on the values), batch ``--batch``, ``--steps`` SGD steps per client on identical
minibatches. Timings are the median of interleaved repeats. ``gflops`` is the arithmetic the engine
computed per second (the model's training FLOPs per sample × the samples); ``chunk`` the clients
the engine trains at once (the run's :class:`~fedhp.models.policy.ExecutionPolicy`).

Two sizes by default (``--sizes CLIENTSxHIDDEN ...``): LEAF's (20 clients × 256 units) and a
small model for many clients (100 × 16), where the per-client loop's fixed cost per step dominates.
The reference's ``nn.LSTM`` runs PyTorch's oneDNN LSTM kernel on the CPU (``mkldnn_rnn_layer``:
gate math fused, weights packed once per sequence), a strong baseline at LEAF's size; from
``FUSED_MIN_HIDDEN`` (64) hidden units on the engine runs each client's layers through the same
kernel (``path=fused``), below it batched over clients (``path=bmm``). The line also times the
engine's other form (``bmm_s_per_step`` / ``fused_s_per_step``), interleaved with the two others.

``--device cuda``: both sides on the GPU (the reference loop then runs cuDNN's LSTM per client; the
engine the batched ``bmm`` recurrence), timed with the device synchronized.

Usage: python benchmarks/bench_lstm.py [--sizes 20x256 100x16] [--seq-len 80] [--batch 10]
  [--steps 3] [--repeats 3] [--threads N] [--device cpu|cuda]
Output: one line per size,
  bench lstm batched_s_per_step=… reference_s_per_step=… speedup=… gflops=… threads=… ...
  path=… bmm_s_per_step=… (or fused_s_per_step=…; on the CPU only) device=…
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from fedhp.engine.ops import sgd_steps
from fedhp.engine.reference import reference_local_sgd
from fedhp.models import lstm
from fedhp.models.lstm import LSTMOptions
from fedhp.models.policy import build_policy

VOCAB = 81


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=["20x256", "100x16"], help="CLIENTSxHIDDEN")
    ap.add_argument("--seq-len", type=int, default=80)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (both sides on it)")
    args = ap.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    for size in args.sizes:
        clients, hidden = (int(v) for v in size.split("x"))
        bench(args, clients, hidden)


def bench(args: argparse.Namespace, clients: int, hidden: int) -> None:
    """Time one size and print its line."""
    device = torch.device(args.device)
    model = LSTMOptions(hidden=hidden).build((args.seq_len,), VOCAB)
    assert isinstance(model, lstm.BatchedLSTM)
    model.policy = build_policy(device, model.reference, (args.seq_len,), batch_size=args.batch)
    gen = torch.Generator().manual_seed(0)
    c, b = clients, args.batch
    batches = [
        (
            torch.randint(0, VOCAB, (c, b, args.seq_len), dtype=torch.uint8, generator=gen).to(
                device
            ),
            torch.randint(0, VOCAB, (c, b), generator=gen).to(device),
        )
        for _ in range(args.steps)
    ]
    start = model.init_params(0).to(device).expand(c, -1)
    lr = 0.5

    def batched() -> torch.Tensor:
        it = iter(batches)
        return sgd_steps(model, start, lambda: next(it), args.steps, lr)[0]

    def reference() -> torch.Tensor:
        return reference_local_sgd(model, start, batches, lr)

    fused = model.fused(device)
    threshold = lstm.FUSED_MIN_HIDDEN
    on_cpu = device.type == "cpu"

    def other() -> torch.Tensor:  # the engine's other CPU form, for the record
        lstm.FUSED_MIN_HIDDEN = 10**9 if fused else 1
        try:
            return batched()
        finally:
            lstm.FUSED_MIN_HIDDEN = threshold

    diff = (batched() - reference()).abs().max().item()  # warm-up and agreement
    fns = {"batched": batched, "reference": reference}
    other_diff = float("nan")
    if on_cpu:  # the other form exists on the CPU only (off the CPU the engine is always bmm)
        other_diff = (other() - reference()).abs().max().item()
        fns["other"] = other
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(args.repeats):
        for name, fn in fns.items():
            synchronize(device)
            t0 = time.perf_counter()
            fn()
            synchronize(device)
            times[name].append((time.perf_counter() - t0) / args.steps)
    bat = statistics.median(times["batched"])
    ref = statistics.median(times["reference"])
    oth = statistics.median(times["other"]) if on_cpu else float("nan")
    flops = model.train_flops_per_sample() * c * b
    print(
        f"bench lstm batched_s_per_step={bat:.4f} reference_s_per_step={ref:.4f} "
        f"speedup={ref / bat:.2f} gflops={flops / bat / 1e9:.2f} "
        f"reference_gflops={flops / ref / 1e9:.2f} threads={torch.get_num_threads()} "
        f"clients={c} hidden={hidden} seq_len={args.seq_len} batch={b} "
        f"chunk={model.policy.chunk(model.num_params, c)} max_abs_diff={diff:.1e} "
        f"path={'fused' if fused else 'bmm'} {'bmm' if fused else 'fused'}_s_per_step={oth:.4f} "
        f"{'bmm' if fused else 'fused'}_max_abs_diff={other_diff:.1e} device={device.type}",
        flush=True,
    )


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a timing boundary); nothing on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


if __name__ == "__main__":
    main()
