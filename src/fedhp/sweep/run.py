"""The sweep: plan the runs (grid points × seeds), group them into batches, run the batches
(in this process or on Ray), select a grid point on the validation split if asked, and write
the manifest, the table and the figure. An interrupted sweep resumes when started again with the
same arguments: finished runs are kept, interrupted ones continue from their checkpoints."""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from fedhp.errors import ConfigError
from fedhp.sweep.execute import BATCHINGS, BatchReport, run_batch
from fedhp.sweep.grid import GridPoint, check_grid, points_of
from fedhp.sweep.plan import MANIFEST, RunSpec, make_batches, plan_runs, read_manifest, run_config

__all__ = ["SweepSpec", "runs_per_batch_of", "run_sweep"]

BACKENDS = ("inprocess", "ray")
SELECTS = (None, "val")
STATE_COPIES = 8
"""Per-client ``[P]`` rows a run holds at once in the worst case (its state, the trained rows,
a gradient, the fused call's copies): the memory estimate behind the default runs per batch."""


@dataclass
class SweepSpec:
    """What ``fedhp sweep`` was asked: the base config (``base`` overrides, ``plugins``), the
    grid, the seeds, the folder, the selection and how to run the batches."""

    out: Path
    grid: dict[str, list[Any]] = field(default_factory=dict)
    seeds: list[int] = field(default_factory=lambda: [0])
    base: list[str] = field(default_factory=list)
    plugins: list[str] = field(default_factory=list)
    select: str | None = None
    metric: str | None = None
    runs_per_batch: int | None = None
    backend: str = "inprocess"
    address: str | None = None
    batching: str = "auto"
    progress: bool = True
    quiet: bool = False
    formats: list[str] = field(default_factory=lambda: ["png"])  # the figures' (--format)

    def check(self) -> None:
        """One-line errors for options out of range."""
        self.grid = check_grid(self.grid)
        if self.select not in SELECTS:
            raise ConfigError(f"--select {self.select}: choose val (or leave it out)")
        if self.backend not in BACKENDS:
            raise ConfigError(f"--backend {self.backend}: choose {' or '.join(BACKENDS)}")
        if self.batching not in BATCHINGS:
            raise ConfigError(f"--batching {self.batching}: choose {', '.join(BATCHINGS)}")
        if self.runs_per_batch is not None and self.runs_per_batch < 1:
            raise ConfigError(f"--runs-per-batch {self.runs_per_batch}: must be 1 or more")
        if str(self.out) in ("", "."):
            raise ConfigError("--out: name a folder for the sweep (e.g. --out sweeps/lam)")

    def identity(self) -> dict[str, Any]:
        """What must match for a folder's sweep to be resumed by this one."""
        return {
            "base": self.base,
            "plugins": self.plugins,
            "grid": self.grid,
            "seeds": self.seeds,
            "select": self.select,
        }


def runs_per_batch_of(spec: RunSpec) -> int:
    """Runs that fit one batch: the execution policy's memory budget (CUDA: ``memory_fraction``
    of the free device memory; CPU: a quarter of the machine's memory) over one run's
    per-client rows (``STATE_COPIES`` rows of P parameters per client)."""
    import os

    import torch

    from fedhp.api import prepare

    exp = prepare(run_config(spec))
    per_run = exp.ctx.num_clients * exp.model.num_params * 4 * STATE_COPIES
    device = exp.ctx.device
    if device.type == "cuda":
        from fedhp.models.policy import free_device_bytes

        budget = free_device_bytes(device) * exp.cfg.engine.memory_fraction
    else:
        budget = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 4
    del exp
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return max(1, int(budget // max(per_run, 1)))


class _Log:
    """Lines to stderr (above the progress bar) and to ``sweep.log``."""

    def __init__(self, path: Path, quiet: bool) -> None:
        self.path, self.quiet = path, quiet

    def __call__(self, text: str, echo: bool = True) -> None:
        with self.path.open("a") as f:
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n")
        if echo and not self.quiet:
            tqdm.write(f"fedhp sweep: {text}", file=sys.stderr)


def _check_folder(spec: SweepSpec) -> None:
    """The sweep folder: new, empty, or this same sweep's (resumed); else a one-line error."""
    old = read_manifest(spec.out)
    if old is not None:
        same = {k: old.get(k) for k in spec.identity()} == json.loads(json.dumps(spec.identity()))
        if not same:
            raise ConfigError(
                f"--out {spec.out}: holds another sweep (other config, grid, seeds or select); "
                "name another folder, or delete it to start over"
            )
        return
    if spec.out.is_file():
        raise ConfigError(f"--out {spec.out}: is a file; name a folder for the sweep")
    if spec.out.is_dir() and any(spec.out.iterdir()):
        raise ConfigError(f"--out {spec.out}: is not empty and holds no sweep; name a new folder")


def _manifest(
    spec: SweepSpec, runs: Sequence[RunSpec], metric: str, selected: dict[str, Any] | None
) -> dict[str, Any]:
    entries = []
    for run in runs:
        entry = run.as_dict()
        entry["out_dir"] = str(Path(run.out_dir).relative_to(spec.out))
        entries.append(entry)
    return {
        "version": 1,
        **json.loads(json.dumps(spec.identity())),
        "metric": metric,
        "runs": entries,
        "selected": selected,
    }


def _write_manifest(spec: SweepSpec, manifest: dict[str, Any]) -> None:
    from fedhp.reporting import write_json_atomic

    write_json_atomic(spec.out / MANIFEST, manifest)


def _default_metric(summaries: Sequence[dict[str, Any]]) -> str:
    """The global model's final accuracy where the method has one, else the personalized."""
    for key in ("final_global_acc", "final_personal_acc"):
        if any(isinstance(s.get(key), float) for s in summaries):
            return key
    raise ConfigError("--select val: the runs report no final accuracy; name one with --metric")


def select_point(
    points: Sequence[GridPoint],
    runs: Sequence[RunSpec],
    summaries: Sequence[dict[str, Any]],
    metric: str,
) -> tuple[GridPoint, float]:
    """The grid point with the best mean of ``metric`` over its seeds (a diverged or missing
    value counts as −inf; ties go to the earlier point)."""
    scores: dict[str, list[float]] = {p.id: [] for p in points}
    for run, summary in zip(runs, summaries, strict=True):
        value = summary.get(metric)
        ok = isinstance(value, int | float) and math.isfinite(value) and "stopped" not in summary
        scores[run.point].append(float(value) if ok else -math.inf)  # type: ignore[arg-type]
    best, best_score = points[0], -math.inf
    for point in points:
        values = scores[point.id]
        score = statistics.fmean(values) if values else -math.inf
        if score > best_score:
            best, best_score = point, score
    return best, best_score


def _execute(
    spec: SweepSpec, runs: list[RunSpec], log: _Log, bar: Callable[[int], None]
) -> list[dict[str, Any]]:
    """Run ``runs`` in batches; their summaries in order."""
    per_batch = spec.runs_per_batch
    if per_batch is None and spec.backend == "ray" and run_config(runs[0]).device == "cpu":
        per_batch = 1  # CPU runs gain nothing from sharing a batch: spread them over the workers
    elif per_batch is None and runs and len(runs) > 1:
        per_batch = runs_per_batch_of(runs[0])
    batches = make_batches(runs, per_batch)
    reports: list[BatchReport]
    if spec.backend == "ray":
        from fedhp.sweep.ray_backend import run_batches_ray

        reports = run_batches_ray(batches, spec.batching, spec.address, bar, log)
    else:
        reports = []
        for i, batch in enumerate(batches):
            start = time.perf_counter()
            report = run_batch(batch, spec.batching, bar, log)
            reports.append(report)
            how = {
                "kept": "all finished before: kept",
                "lockstep": report.lockstep_line(),
                "sequential": "one after another (their kernels are not fused)",
            }[report.batching]
            log(
                f"batch {i + 1}/{len(batches)}: {len(batch)} runs {how}{report.carried()}, "
                f"{time.perf_counter() - start:.1f}s"
            )
    by_dir: dict[str, dict[str, Any]] = {}
    for batch, report in zip(batches, reports, strict=True):
        for run, summary in zip(batch, report.summaries, strict=True):
            by_dir[run.out_dir] = summary
    return [by_dir[run.out_dir] for run in runs]


def run_sweep(spec: SweepSpec) -> dict[str, Any]:
    """Run the sweep ``spec`` (resuming its folder); returns the manifest written."""
    spec.check()
    _check_folder(spec)
    points = points_of(spec.grid)
    if spec.select == "val":
        runs = plan_runs(spec.base, points, spec.seeds, spec.out / "val", "val", spec.plugins)
    else:
        runs = plan_runs(
            spec.base, points, spec.seeds, spec.out / "runs", "test", spec.plugins, False
        )
    spec.out.mkdir(parents=True, exist_ok=True)
    log = _Log(spec.out / "sweep.log", spec.quiet)
    from fedhp.sweep.tracking import open_sweep_tracking

    tracking = open_sweep_tracking(spec)  # MLflow's parent run (None: mlflow.enabled is not set)
    metric = spec.metric or "final_global_acc"
    _write_manifest(spec, _manifest(spec, runs, metric, None))
    total = sum(r.rounds for r in runs) * (1 + (spec.select == "val") / max(len(points), 1))
    bar = tqdm(total=int(total), desc="sweep", unit="round", disable=not spec.progress)
    try:
        log(f"{len(points)} grid points x {len(spec.seeds)} seeds = {len(runs)} runs")
        summaries = _execute(spec, runs, log, bar.update)
        selected = None
        all_runs = list(runs)
        if spec.select == "val":
            metric = spec.metric or _default_metric(summaries)
            point, score = select_point(points, runs, summaries, metric)
            selected = {"point": point.id, "values": point.values, "score": score}
            log(f"selected on val: {point.id} (mean {metric} {score:.4f}); its test runs next")
            tests = plan_runs(
                spec.base, [point], spec.seeds, spec.out / "test", "test", spec.plugins
            )
            all_runs += tests
            _write_manifest(spec, _manifest(spec, all_runs, metric, selected))
            _execute(spec, tests, log, bar.update)
        manifest = _manifest(spec, all_runs, metric, selected)
        _write_manifest(spec, manifest)
    except KeyboardInterrupt:
        if tracking is not None:
            tracking.end(killed=True)
        # (in the log only: `fedhp sweep` says it on stderr)
        log("interrupted: the same command resumes (finished runs kept, the others go on)", False)
        raise
    finally:
        bar.close()
    from fedhp.sweep.report import write_report

    written = write_report(spec.out, manifest, list(dict.fromkeys(spec.formats)))
    log(f"wrote {', '.join(p.name for p in written)}")
    if tracking is not None:
        tracking.finish(manifest, written)
    return manifest
