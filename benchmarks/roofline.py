"""Device measurements the benchmarks share: the matmul rate, the device-to-device copy
bandwidth, kernel launches per call, and the roofline limit of a round.

``roofline limit = max(real FLOPs / measured matmul rate, minimum bytes / measured copy
bandwidth)``; the minimum bytes (:func:`min_round_bytes`) are what a round must move at least:
every client's parameter rows read and written once per local step, the minibatches read once,
and the aggregate (every uploaded row read once, the result written once). ``ratio`` = round
time / limit. On CUDA every timing synchronizes the device first and last.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

CUDA_LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")


def sync(device: torch.device) -> None:
    """Wait for ``device``'s queued work (CUDA); nothing on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds of one call of ``fn``, the device synchronized before and after."""
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def matmul_gflops(
    device: torch.device, n: int = 2048, repeats: int = 5, dtype: torch.dtype = torch.float32
) -> float:
    """Best GFLOP/s of an ``n x n`` matmul of ``dtype`` on ``device`` (CUDA: under the current
    TF32 flags)."""
    if device.type == "cuda" and n >= 2048:
        n = 8192  # a GPU needs a larger product to reach its rate
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    a @ b
    best = min(timed(lambda: a @ b, device) for _ in range(repeats))
    return 2 * n**3 / best / 1e9


def copy_gbs(device: torch.device, mib: int = 256, repeats: int = 5) -> float:
    """Best GB/s of a same-device copy of ``mib`` MiB (bytes read + bytes written)."""
    src = torch.ones(mib * 2**18, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = min(timed(lambda: dst.copy_(src), device) for _ in range(repeats))
    return 2 * src.numel() * 4 / best / 1e9


def count_launches(fn: Callable[[], object], device: torch.device) -> int:
    """Kernel launches of one call of ``fn``: CUDA ``cudaLaunchKernel``-family calls on a GPU;
    on the CPU the operator calls (``aten::`` events, nested ones included)."""
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        fn()
        sync(device)
    events = prof.key_averages()
    if device.type == "cuda":
        return sum(e.count for e in events if e.key in CUDA_LAUNCHES)
    return sum(e.count for e in events if e.key.startswith("aten::"))


def min_round_bytes(
    step_rows: float,
    rows_per_client: int,
    num_params: int,
    samples: float,
    features: int,
    clients: int,
) -> float:
    """The bytes a round must move at least (float32): ``step_rows`` client-steps each reading
    and writing ``rows_per_client`` rows of ``num_params``; ``samples`` minibatch samples of
    ``features`` floats read once; ``clients`` uploaded rows read and one aggregate written."""
    rows = 2.0 * step_rows * rows_per_client * num_params
    return 4.0 * (rows + samples * features + (clients + 1) * num_params)


def roofline_s(flops: float, nbytes: float, gflops: float, gbs: float) -> float:
    """The round's lower bound: arithmetic at the matmul rate or traffic at the copy rate."""
    return max(flops / (gflops * 1e9), nbytes / (gbs * 1e9))
