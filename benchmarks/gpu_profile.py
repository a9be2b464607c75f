"""Where a small run's round goes on a device: the default ``fedhp run`` experiment (sFedHP,
20 clients under 4 edges, DNN-100) profiled round by round.

Prints one ``profile key=value ...`` line: the median seconds of a round (``--rounds`` timed
rounds after a warm-up), and over ``--profile-rounds`` more rounds under ``torch.profiler`` per
round: kernel launches, host-to-device / device-to-host copies, stream/device synchronizations,
the device's busy seconds (the kernels' own time: ``busy`` is busy / wall, the fraction of the
round the GPU computes) and the host's seconds in operators. With ``--sync-sites`` on CUDA (torch's
sync debug mode, one round), then the source lines that made the host wait, most frequent first
(``sync-site count file:line``): the places a round without host syncs must change.

Usage: python benchmarks/gpu_profile.py [--device cuda] [--rounds 5] [--profile-rounds 2]
  [--sync-sites] [key=value ...]   (overrides of the experiment, as ``fedhp run`` takes them)
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections import Counter
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

LAUNCHES = {"cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx"}
SYNCS = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"}
COPIES = {"cudaMemcpyAsync", "cudaMemcpy"}


def sync(device: torch.device) -> None:
    """Wait for the device's queued work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_default(device: str, overrides: list[str]) -> Any:
    """The default ``fedhp run`` experiment on ``device``, with ``overrides``."""
    from fedhp.build import build_experiment
    from fedhp.config import resolve_config

    cfg = resolve_config(
        None, ["progress=false", "checkpoint_every=0", f"device={device}", *overrides]
    )
    return build_experiment(cfg)


def build(device: str, overrides: list[str]) -> tuple[Any, Any, torch.device]:
    """The default experiment on ``device``: its algorithm, a started state and the device."""
    exp = build_default(device, overrides)
    dev = exp.ctx.device
    state = exp.algorithm.init_state(exp.model.init_params(0).to(dev))
    return exp.algorithm, state, dev


def profile_rounds(
    algo: Any, state: Any, first: int, rounds: int, dev: torch.device
) -> dict[str, float]:
    """Per-round counts of ``rounds`` rounds from round ``first`` under the profiler."""
    activities = [ProfilerActivity.CPU]
    if dev.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    sync(dev)
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        for r in range(first, first + rounds):
            algo.run_round(state, r)
        sync(dev)
    wall = time.perf_counter() - start
    events = prof.key_averages()
    count: Counter[str] = Counter()
    busy_us = 0.0
    host_us = 0.0
    for e in events:
        if e.key in LAUNCHES:
            count["launches"] += e.count
        elif e.key in SYNCS:
            count["syncs"] += e.count
        elif e.key in COPIES:
            count["copies"] += e.count
        if e.key.startswith("aten::"):
            host_us += e.self_cpu_time_total
        busy_us += getattr(e, "self_device_time_total", 0.0) or 0.0
    per = {k: v / rounds for k, v in count.items()}
    if dev.type != "cuda":  # no device events: the operator calls stand in for launches
        per["launches"] = sum(e.count for e in events if e.key.startswith("aten::")) / rounds
    busy = busy_us / 1e6 / rounds
    return {
        **{k: per.get(k, 0.0) for k in ("launches", "syncs", "copies")},
        "profiled_round_s": wall / rounds,
        "device_busy_s": busy,
        "busy": busy / (wall / rounds),
        "host_op_s": host_us / 1e6 / rounds,
    }


def sync_sites(algo: Any, state: Any, rnd: int) -> list[tuple[str, int]]:
    """The Python lines that synchronized the host with the device in one round (CUDA only)."""
    sites: Counter[str] = Counter()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            algo.run_round(state, rnd)
        for w in caught:
            if "synchroniz" in str(w.message):
                sites[f"{w.filename}:{w.lineno}"] += 1
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return sites.most_common(25)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile-rounds", type=int, default=2)
    parser.add_argument("--sync-sites", action="store_true")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    algo, state, dev = build(args.device, args.overrides)
    algo.run_round(state, 0)  # warm-up
    times = []
    for r in range(1, args.rounds + 1):
        sync(dev)
        start = time.perf_counter()
        algo.run_round(state, r)
        sync(dev)
        times.append(time.perf_counter() - start)
    first = args.rounds + 1
    values = {"round_s": statistics.median(times)}
    values.update(profile_rounds(algo, state, first, args.profile_rounds, dev))
    line = " ".join(f"{k}={v:.6g}" for k, v in values.items())
    print(f"profile device={dev.type} torch={torch.__version__} {line}", flush=True)
    if args.sync_sites and dev.type == "cuda":
        for site, n in sync_sites(algo, state, first + args.profile_rounds):
            print(f"sync-site {n} {site}", flush=True)


if __name__ == "__main__":
    main()
