"""Sweep benchmark (issue 40): a λ sweep of sFedHP as 15 ``fedhp run`` processes, as one
``fedhp sweep`` process (its runs one after another), and as one ``fedhp sweep`` in lockstep.

The runs: ``fedhp run``'s defaults (sFedHP, MNIST, 20 clients under 4 edges, DNN-100), λ
(``algorithm.lam``) ∈ {15, 20, 25, 30, 35} × seeds {0, 1, 2}, ``--rounds`` rounds (20),
``--threads`` torch threads per run (1), everything else the same for every variant
(``progress=false`` everywhere). Measured in ONE invocation, the variants alternating (ABC, then
CBA, ... over ``--repeats``) so that the drift of a shared machine hits them alike:

* **end to end**: the wall time of the 15 ``fedhp run`` processes one after another (start-up,
  imports, data loading paid 15 times) against one ``fedhp sweep --grid algorithm.lam=...
  --seeds 0,1,2 --batching sequential`` process and the same with ``--batching lockstep``;
* **training**: the round loops — the sum of the runs' summary.json ``seconds`` for the
  sequential sweep against the lockstep sweep's, whose runs' loops overlap (the longest
  ``seconds`` of its runs); and the batch's wall time from sweep.log (``batch 1/1: ..., X s``:
  preparing every run's experiment included, for both);
* **peak memory**: the maximum resident set of each sweep process against one ``fedhp run``
  process's (the median of the 15), read with ``os.wait4`` per child. The benchmark itself imports
  neither torch nor fedhp in this mode: Linux carries the parent's resident memory into a child's
  peak across fork and exec.

``--inprocess``: the GPU form (benchmarks/gpu_check.py ``--issue 40``): in THIS process, start-up
excluded, one warm-up batch (2 runs, 1 round, lockstep), then the batch of the 15 runs through
``fedhp.sweep.execute.run_batch`` sequentially and in lockstep (alternating over ``--repeats``);
``speedup`` is the sequential batch's wall time over the lockstep batch's (every run's
experiment prepared in both), ``train_speedup`` the same for the round loops.

Usage: python benchmarks/bench_sweep.py [--device cpu|cuda] [--runs 15] [--rounds 20]
  [--threads 1] [--repeats 1] [--json PATH] [--work DIR] [--inprocess]
  [--method sfedhp --key algorithm.lam --lams 15,20,25,30,35] (another method's sweep: e.g.
  ``--method hierfavg --key algorithm.lr --lams 0.02,0.03,0.05,0.07,0.1``)
``--runs N`` takes the first N runs of the grid (1, 2, or a multiple of 3 up to 15: N/3 λ values ×
3 seeds), e.g. ``--runs 2 --rounds 1`` for a smoke test.
Output: a table (machine facts, each variant's times and memory, the ratios against the issue's
targets) and one line ``bench sweep key=value ...`` (``bench sweep-inprocess ...`` with
``--inprocess``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

LAMS = (15, 20, 25, 30, 35)
SEEDS = (0, 1, 2)
VARIANTS = ("runs", "sequential", "lockstep")
LABELS = {
    "runs": "N x fedhp run (processes)",
    "sequential": "fedhp sweep --batching sequential",
    "lockstep": "fedhp sweep --batching lockstep",
}
# (what, key of the ratios, target, "<=" or ">="): the CPU must-shows
TARGETS = [
    ("end to end: N runs / sweep (sequential)", "end_to_end_sequential", 2.5, ">="),
    ("end to end: N runs / sweep (lockstep)", "end_to_end_lockstep", 2.5, ">="),
    ("training (round loops): sequential / lockstep", "train_loops", 1.5, ">="),
    ("training (batch, experiments prepared): sequential / lockstep", "train_batch", 1.5, ">="),
    ("peak memory: sweep (sequential) / one run", "memory_sequential", 2.0, "<="),
    ("peak memory: sweep (lockstep) / one run", "memory_lockstep", 2.0, "<="),
]
BATCH_LINE = re.compile(r"batch \d+/\d+: \d+ runs (.*), ([0-9.]+)s$")


def grid_of(runs: int, lams: Sequence[float] = LAMS) -> tuple[list[float], list[int]]:
    """The λ values and seeds of the first ``runs`` runs of the ``lams`` × 3 seeds grid."""
    seeds = min(runs, len(SEEDS))
    top = len(lams) * len(SEEDS)
    if not 1 <= runs <= top or runs % seeds:
        raise ValueError(f"--runs {runs}: 1, 2, or a multiple of 3 up to {top}")
    return list(lams[: runs // seeds]), list(SEEDS[:seeds])


def base_overrides(args: argparse.Namespace) -> list[str]:
    """What every run of every variant gets besides its grid value and seed."""
    method = [] if args.method == "sfedhp" else [f"algorithm.name={args.method}"]
    return [
        *method,
        f"rounds={args.rounds}",
        f"threads={args.threads}",
        f"device={args.device}",
        "progress=false",
        *args.set,
    ]


def fedhp_command() -> list[str]:
    """The ``fedhp`` console script beside this interpreter, else ``python -m fedhp.cli``."""
    script = Path(sys.executable).with_name("fedhp")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "fedhp.cli"]


DIVERGED = 3
"""``fedhp run``'s exit status for a run that diverged (its summary.json says ``stopped``): a
result of the grid (λ = 35 at the default lr: λ·η = 1.75), not a failure of the benchmark."""


def run_child(cmd: Sequence[str], log: Path) -> tuple[float, float]:
    """Run ``cmd`` (output into ``log``); its wall seconds and peak resident memory (MB, its own
    and its waited-for children's, from ``wait4``). A failure raises with the log's tail (a
    diverged run does not)."""
    start = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(list(cmd), stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)  # (reaped here, not by Popen)
    if proc.returncode not in (0, DIVERGED):
        tail = "\n".join(log.read_text().splitlines()[-15:])
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{tail}")
    return wall, usage.ru_maxrss / 1024  # Linux: KiB


def summaries(folder: Path) -> list[dict[str, Any]]:
    """The summary.json of every run under ``folder``."""
    return [json.loads(p.read_text()) for p in sorted(folder.rglob("summary.json"))]


def parse_sweep_log(text: str) -> dict[str, Any]:
    """sweep.log's batch lines: their seconds (summed) and how the batches ran."""
    seconds, how = 0.0, []
    for line in text.splitlines():
        match = BATCH_LINE.search(line.strip())
        if match:
            how.append(match.group(1))
            seconds += float(match.group(2))
    return {
        "batch_s": seconds,
        "how": how,
        "lockstep": bool(how) and all("lockstep" in h for h in how),
    }


def measure_runs(
    args: argparse.Namespace, lams: list[float], seeds: list[int], folder: Path
) -> dict[str, Any]:
    """The runs as ``fedhp run`` processes one after another."""
    walls, peaks = [], []
    for lam in lams:
        for seed in seeds:
            out = folder / f"lam{lam}-seed{seed}"
            cmd = [
                *fedhp_command(),
                "run",
                f"{args.key}={lam}",
                f"seed={seed}",
                *base_overrides(args),
                "--out",
                str(out),
            ]
            wall, peak = run_child(cmd, folder / f"lam{lam}-seed{seed}.log")
            walls.append(wall)
            peaks.append(peak)
    runs = summaries(folder)
    loops = [float(s.get("seconds") or 0.0) for s in runs]
    return {
        "wall_s": sum(walls),
        "diverged": sum(1 for s in runs if s.get("stopped")),
        "train_s": sum(loops),
        "rss_mb": statistics.median(peaks),
        "rss_max_mb": max(peaks),
        "run_walls_s": walls,
        "run_seconds": loops,
        "threads": _threads(runs),
    }


def measure_sweep(
    args: argparse.Namespace, lams: list[float], seeds: list[int], folder: Path, batching: str
) -> dict[str, Any]:
    """One ``fedhp sweep`` process over the runs, batched ``batching``."""
    cmd = [
        *fedhp_command(),
        "sweep",
        "--grid",
        f"{args.key}=" + ",".join(str(v) for v in lams),
        "--seeds",
        ",".join(str(s) for s in seeds),
        "--out",
        str(folder),
        "--batching",
        batching,
        *base_overrides(args),
    ]
    wall, peak = run_child(cmd, folder.with_suffix(".log"))
    runs = summaries(folder / "runs")
    loops = [float(s.get("seconds") or 0.0) for s in runs]
    log = parse_sweep_log((folder / "sweep.log").read_text())
    return {
        "wall_s": wall,
        # one after another: the loops add up; in lockstep they overlap (the longest spans them)
        "train_s": sum(loops) if batching == "sequential" else max(loops),
        "batch_s": log["batch_s"],
        "batches": log["how"],
        "ran_in_lockstep": log["lockstep"],
        "diverged": sum(1 for s in runs if s.get("stopped")),
        "rss_mb": peak,
        "run_seconds": loops,
        "threads": _threads(runs),
    }


def _threads(runs: list[dict[str, Any]]) -> int | None:
    values = {s.get("torch_threads") for s in runs}
    return values.pop() if len(values) == 1 else None


def machine_facts(device: str) -> dict[str, Any]:
    """Cores, load, CPU model; torch's version and the GPU (asked of a child process, so that
    this one stays small: see the module's docstring)."""
    query = (
        "import json, torch; cuda = torch.cuda.is_available(); print(json.dumps({"
        "'torch': torch.__version__, 'cuda': cuda, "
        "'gpu': torch.cuda.get_device_name(0) if cuda else None}))"
    )
    done = subprocess.run([sys.executable, "-c", query], capture_output=True, text=True, check=True)
    facts: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    facts.update(
        cores=os.cpu_count(),
        cores_usable=len(os.sched_getaffinity(0)),
        cpu=cpu,
        device=device,
        python=sys.version.split()[0],
    )
    return facts


def ratios(med: dict[str, dict[str, float]]) -> dict[str, float]:
    """The issue's ratios from the variants' medians (missing variants left out)."""
    out: dict[str, float] = {}
    runs, seq, lock = med.get("runs"), med.get("sequential"), med.get("lockstep")
    if runs and seq:
        out["end_to_end_sequential"] = runs["wall_s"] / seq["wall_s"]
        out["memory_sequential"] = seq["rss_mb"] / runs["rss_mb"]
    if runs and lock:
        out["end_to_end_lockstep"] = runs["wall_s"] / lock["wall_s"]
        out["memory_lockstep"] = lock["rss_mb"] / runs["rss_mb"]
    if seq and lock:
        out["train_loops"] = seq["train_s"] / max(lock["train_s"], 1e-9)
        out["train_batch"] = seq["batch_s"] / max(lock["batch_s"], 0.05)  # (0.1 s resolution)
    return out


def medians(repeats: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """Each variant's numbers, the median over repeats."""
    keys = ("wall_s", "train_s", "batch_s", "rss_mb", "rss_max_mb")
    out: dict[str, dict[str, float]] = {}
    for variant in VARIANTS:
        rows = [r[variant] for r in repeats if variant in r]
        if rows:
            out[variant] = {
                k: statistics.median(float(r[k]) for r in rows) for k in keys if k in rows[0]
            }
    return out


def met(value: float, target: float, op: str) -> str:
    return "yes" if (value >= target if op == ">=" else value <= target) else "NO"


def report(
    args: argparse.Namespace,
    facts: dict[str, Any],
    repeats: list[dict[str, dict[str, Any]]],
    load: tuple[float, float],
) -> dict[str, Any]:
    """Print the table and the ``bench sweep`` line; the JSON-ready results."""
    med, rat = medians(repeats), ratios(medians(repeats))
    n = args.runs
    threads = sorted({int(t) for r in repeats for v in r if (t := r[v].get("threads"))})
    lines = [
        f"# bench_sweep: {n} runs (fedhp run's defaults: {args.method}, MNIST, 20 clients, "
        f"DNN-100; {args.key} in {args.lams} x seeds), rounds={args.rounds}, "
        f"threads={args.threads}, device={args.device}, repeats={args.repeats} (variants "
        "alternating; medians)",
        f"# machine: {facts['cores']} cores ({facts['cores_usable']} usable) {facts['cpu']}; "
        f"torch {facts['torch']}"
        + (f", GPU {facts['gpu']}" if facts.get("gpu") else "")
        + f"; torch threads per run {threads or '?'}; python {facts['python']}; "
        f"load average {load[0]:.2f} at start, {load[1]:.2f} at end",
        "",
        "| variant | wall s | training s (round loops) | batch s (sweep.log) | peak RSS MB |",
        "|---|---|---|---|---|",
    ]
    for variant in VARIANTS:
        if variant not in med:
            continue
        m = med[variant]
        loops = "sum" if variant != "lockstep" else "overlapped"
        batch = f"{m['batch_s']:.1f}" if "batch_s" in m else "—"
        rss = f"{m['rss_mb']:.0f}" + (
            f" (median of {n}; max {m['rss_max_mb']:.0f})" if "rss_max_mb" in m else ""
        )
        label = LABELS[variant].replace("N x", f"{n} x")
        lines.append(
            f"| {label} | {m['wall_s']:.1f} | {m['train_s']:.1f} ({loops}) | {batch} | {rss} |"
        )
    if "runs" in med:
        per_run = (med["runs"]["wall_s"] - med["runs"]["train_s"]) / n
        lines.append(f"\nfedhp run outside its round loop: {per_run:.1f} s per process")
    diverged = {v: [r[v].get("diverged", 0) for r in repeats] for v in VARIANTS if v in med}
    if any(any(d) for d in diverged.values()):
        text = ", ".join(f"{v} {'/'.join(str(x) for x in d)}" for v, d in diverged.items())
        lines.append(f"runs that diverged (summary.json `stopped`; per repeat): {text}")
    for r in repeats:
        if "lockstep" in r and not r["lockstep"]["ran_in_lockstep"]:
            lines.append(
                f"NOTE: the lockstep sweep did not run in lockstep: {r['lockstep']['batches']}"
            )
            break
    lines += ["", "| must-show | measured | target | met |", "|---|---|---|---|"]
    for what, key, target, op in TARGETS:
        if key in rat:
            what = what.replace("N runs", f"{n} runs")
            lines.append(
                f"| {what} | {rat[key]:.2f}x | {op} {target:g}x | {met(rat[key], target, op)} |"
            )
    for line in lines:
        print(line, flush=True)
    flat = {f"{v}_{k}": round(x, 3) for v, m in med.items() for k, x in m.items()}
    flat.update({k: round(v, 3) for k, v in rat.items()})
    kv = " ".join(f"{k}={v}" for k, v in flat.items())
    print(
        f"bench sweep {kv} runs={n} rounds={args.rounds} threads={args.threads} "
        f"repeats={args.repeats} device={args.device}",
        flush=True,
    )
    return {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "options": {k: v for k, v in vars(args).items() if k not in ("json", "work")},
        "machine": facts,
        "load_average": {"start": load[0], "end": load[1]},
        "repeats": repeats,
        "medians": med,
        "ratios": rat,
        "targets": {key: f"{op} {target}" for _, key, target, op in TARGETS},
        "table": "\n".join(lines),
    }


def end_to_end(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The three variants as processes, alternating over the repeats."""
    lams, seeds = grid_of(args.runs, args.lams)
    facts = machine_facts(args.device)
    load0 = os.getloadavg()[0]
    repeats: list[dict[str, dict[str, Any]]] = []
    for r in range(args.repeats):
        order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
        done: dict[str, dict[str, Any]] = {}
        for variant in order:
            folder = work / f"r{r}-{variant}"
            folder.mkdir(parents=True, exist_ok=True)
            if variant == "runs":
                done[variant] = measure_runs(args, lams, seeds, folder)
            else:
                done[variant] = measure_sweep(args, lams, seeds, folder / "sweep", variant)
            print(
                f"# repeat {r + 1}/{args.repeats} {variant}: wall {done[variant]['wall_s']:.1f} s",
                file=sys.stderr,
                flush=True,
            )
        repeats.append(done)
    return report(args, facts, repeats, (load0, os.getloadavg()[0]))


def inprocess(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The batch sequentially and in lockstep in this process (start-up excluded)."""
    import torch

    from fedhp.sweep.execute import run_batch
    from fedhp.sweep.grid import points_of
    from fedhp.sweep.plan import plan_runs

    lams, seeds = grid_of(args.runs, args.lams)
    base = base_overrides(args)
    points = points_of({args.key: lams})
    cuda = args.device.startswith("cuda")

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    start = time.perf_counter()
    warm = plan_runs([*base, "rounds=1"], points[:1], [0, 1], work / "warm-up")
    run_batch(warm, "lockstep")
    sync()
    print(f"bench sweep-inprocess warmup_s={time.perf_counter() - start:.2f}", flush=True)
    results: dict[str, list[dict[str, float]]] = {"sequential": [], "lockstep": []}
    for r in range(args.repeats):
        order = ("sequential", "lockstep") if r % 2 == 0 else ("lockstep", "sequential")
        for batching in order:
            runs = plan_runs(base, points, seeds, work / f"r{r}-{batching}")
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            sync()
            t0 = time.perf_counter()
            rep = run_batch(runs, batching)
            sync()
            wall = time.perf_counter() - t0
            loops = [float(s["seconds"]) for s in rep.summaries]
            row = {
                "s": wall,
                "train_s": sum(loops) if batching == "sequential" else max(loops),
                "fused_calls": float(rep.fused_calls),
                "ran": 1.0 if rep.batching == batching else 0.0,
            }
            if cuda:
                row["gpu_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
            results[batching].append(row)
            kv = " ".join(f"{batching}_{k}={v:.4g}" for k, v in row.items())
            print(f"bench sweep-inprocess {kv} repeat={r + 1}", flush=True)
    med = {
        b: {k: statistics.median(row[k] for row in rows) for k in rows[0]}
        for b, rows in results.items()
    }
    seq, lock = med["sequential"], med["lockstep"]
    out = {
        "speedup": seq["s"] / lock["s"],
        "train_speedup": seq["train_s"] / max(lock["train_s"], 1e-9),
        "sequential_s": seq["s"],
        "lockstep_s": lock["s"],
        "sequential_train_s": seq["train_s"],
        "lockstep_train_s": lock["train_s"],
        "fused_calls": lock["fused_calls"],
    }
    print(
        "bench sweep-inprocess "
        + " ".join(f"{k}={v:.4g}" for k, v in out.items())
        + f" runs={args.runs} rounds={args.rounds} threads={torch.get_num_threads()} "
        f"repeats={args.repeats} torch={torch.__version__} device={args.device}",
        flush=True,
    )
    return {"options": vars(args) | {"json": None, "work": None}, "repeats": results, **out}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda (every run on it)")
    ap.add_argument("--runs", type=int, default=15, help="runs of the 5 x 3 grid (15)")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument(
        "--lams",
        type=lambda text: [float(v) if "." in v else int(v) for v in text.split(",")],
        default=list(LAMS),
        help="the grid's values of --key (15,20,25,30,35: sFedHP's λ)",
    )
    ap.add_argument("--method", default="sfedhp", help="algorithm.name of every run (sfedhp)")
    ap.add_argument("--key", default="algorithm.lam", help="the grid's key (algorithm.lam)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per run (1)")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="one more option for every run of every variant (repeatable), e.g. "
        "engine.cuda_graphs=true",
    )
    ap.add_argument("--repeats", type=int, default=1, help="alternating repeats (medians)")
    ap.add_argument("--json", type=Path, help="write the numbers here")
    ap.add_argument("--work", type=Path, help="keep the runs here (default: a temporary folder)")
    ap.add_argument(
        "--inprocess",
        action="store_true",
        help="sequential vs lockstep batch in this process, start-up excluded (the GPU check)",
    )
    args = ap.parse_args(argv)
    try:
        grid_of(args.runs, args.lams)
    except ValueError as err:
        ap.error(str(err))
    tmp = None if args.work else tempfile.mkdtemp(prefix="bench-sweep-")
    work = args.work or Path(str(tmp))
    if args.work and work.exists() and any(work.iterdir()):
        ap.error(f"--work {work}: not empty")
    try:
        results = inprocess(args, work) if args.inprocess else end_to_end(args, work)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1, default=str) + "\n")
    return results


if __name__ == "__main__":
    main()
