"""Run one batch of a sweep in this process: finished runs kept, interrupted ones resumed from
their checkpoint, the rest started; one after another (``sequential``) or in lockstep threads
whose model kernels are fused (``lockstep``, :mod:`fedhp.sweep.lockstep`)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fedhp.sweep.plan import RunSpec, run_config

__all__ = ["BatchReport", "choose_batching", "run_batch", "run_status"]

Progress = Callable[[int], None]
"""Called with 1 after every finished round of any run (the sweep's one progress bar)."""

BATCHINGS = ("auto", "lockstep", "sequential")


RUN_FILES = ("metrics.csv", "per_client.csv", "timings.csv", "summary.json")
"""Files every finished run holds (and final_state.pt unless it diverged, plot.png once it has
a metrics row); summary.json is the last one a run writes."""


def run_complete(folder: Path) -> bool:
    """Whether every file of a finished run is in ``folder`` (a run killed while writing them,
    or one a file was deleted from, is not finished: it resumes from its checkpoint, which
    rewrites them)."""
    if not all((folder / name).is_file() for name in RUN_FILES):
        return False
    try:
        stopped = "stopped" in json.loads((folder / "summary.json").read_text())
        with (folder / "metrics.csv").open(encoding="utf-8") as fh:
            has_rows = len(fh.readlines()) > 1
    except (OSError, ValueError):
        return False
    if not stopped and not (folder / "final_state.pt").is_file():
        return False
    return not has_rows or (folder / "plot.png").is_file()


def run_status(spec: RunSpec) -> str:
    """``finished`` (every file of a run of the same config, :func:`run_complete`), ``resume``
    (a checkpoint of the same config, and the result files it cannot rebuild are whole) or
    ``new``."""
    from fedhp.config import config_to_dict, normalized_config

    folder = spec.folder
    config_path = folder / "config.yaml"
    if not config_path.is_file():
        return "new"
    try:
        old = normalized_config(yaml.safe_load(config_path.read_text()))
    except (OSError, yaml.YAMLError):
        return "new"
    if old != config_to_dict(run_config(spec)):
        return "new"
    if run_complete(folder):
        return "finished"
    from fedhp.engine.checkpoint import resumable, resumable_files

    if not resumable(folder, fall_back=True):
        return "new"
    return "resume" if resumable_files(folder) else "new"


def choose_batching(batching: str, device: str) -> str:
    """``auto``: lockstep on a GPU (its kernels are launch-bound for small federations),
    sequential on the CPU (its kernels already run at the core's peak: fusing only adds the
    copies of the rows; docs/benchmarks.md)."""
    if batching != "auto":
        return batching
    return "lockstep" if device.startswith("cuda") else "sequential"


@dataclass
class BatchReport:
    """What a batch did: each run's summary (in the batch's order), how it ran, fused calls."""

    summaries: list[dict[str, Any]]
    batching: str
    fused_calls: int = 0
    single_calls: int = 0
    stacked_rounds: int = 0  # rounds of several runs trained as one (runs as rows)
    statuses: list[str] = field(default_factory=list)  # finished / resume / new, before it ran
    graphs_stacked: bool = False  # engine.cuda_graphs: in lockstep, for stacked rounds only
    alone_rounds: dict[str, int] = field(default_factory=dict)  # by method: rounds that met none

    def lockstep_line(self) -> str:
        """How a lockstep batch ran, for its log line: also the rounds that trained alone (no
        stack key, no local SGD met), by method."""
        stacked = f", {self.stacked_rounds} rounds stacked" if self.stacked_rounds else ""
        graphs = "; CUDA graphs in stacked rounds only" if self.graphs_stacked else ""
        alone = ", ".join(f"{n} of {name}" for name, n in sorted(self.alone_rounds.items()))
        if alone:
            alone = (
                f"; rounds trained alone: {alone} (their options give the round no stack key "
                "and its local SGD met no other run's; only their model kernels met)"
            )
        return f"in lockstep ({self.fused_calls} fused model calls{stacked}){graphs}{alone}"

    def carried(self) -> str:
        """What the batch took over from an earlier, interrupted sweep, for its log line:
        ``"; 1 kept (finished before), 1 resumed from its checkpoint"`` ("" if nothing, or if
        every run was kept: the log line says that already)."""
        if self.batching == "kept":
            return ""
        kept, resumed = self.statuses.count("finished"), self.statuses.count("resume")
        parts = [f"{kept} kept (finished before)"] if kept else []
        if resumed:
            where = "its checkpoint" if resumed == 1 else "their checkpoints"
            parts.append(f"{resumed} resumed from {where}")
        return f"; {', '.join(parts)}" if parts else ""


def _summary_of(folder: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((folder / "summary.json").read_text())
    return data


After = Callable[[RunSpec, Any], None]
"""Called with a run and its experiment after the run (e.g. to write the ledger's per-node
totals, ``fedhp reproduce``'s nodes.json)."""


def _run_one(
    spec: RunSpec, exp: Any, resume: bool, progress: Progress | None, after: After | None
) -> dict[str, Any]:
    """Run a built experiment into its folder; a diverged run's summary says ``stopped``."""
    from fedhp.api import run_built
    from fedhp.errors import DivergenceError

    on_round = None if progress is None else (lambda _: progress(1))
    try:
        if exp.cfg.backend != "inprocess":
            summary = run_built(exp, spec.folder, resume=resume, progress=False)
        else:
            from fedhp.engine.runner import run_experiment

            summary = run_experiment(
                exp, spec.folder, progress=False, resume=resume, on_round=on_round
            )
    except DivergenceError as err:
        path = spec.folder / "summary.json"
        summary = json.loads(path.read_text()) if path.is_file() else {}
        summary["stopped"] = str(err)
    if after is not None:
        after(spec, exp)
    return summary


def lockstep_refusal(cfg: Any) -> str | None:
    """Why the runs of ``cfg``'s batch cannot train in lockstep (None: they can): a model that
    draws from torch's global generator (dropout) would draw from it in the threads' order."""
    if cfg.backend != "inprocess":
        return f"backend {cfg.backend} runs its own rounds"
    if float(cfg.model.get("dropout", 0) or 0) > 0:
        return "the model's dropout draws from torch's global generator"
    return None


def run_batch(
    runs: Sequence[RunSpec],
    batching: str = "auto",
    progress: Progress | None = None,
    log: Callable[[str], None] | None = None,
    after: After | None = None,
) -> BatchReport:
    """Run (or keep, or resume) every run of one batch; returns their summaries."""
    from fedhp.api import prepare

    statuses = [run_status(spec) for spec in runs]
    summaries: dict[int, dict[str, Any]] = {}
    todo = []
    for i, (spec, status) in enumerate(zip(runs, statuses, strict=True)):
        if status == "finished":
            summaries[i] = _summary_of(spec.folder)
            if progress is not None:
                progress(spec.rounds)
        else:
            todo.append(i)
    if not todo:
        return BatchReport([summaries[i] for i in range(len(runs))], "kept", statuses=statuses)
    first = run_config(runs[todo[0]])
    mode = choose_batching(batching, first.device)
    # (every run's: a float grid over model.dropout shares a batch with dropout-free runs)
    refusals = (lockstep_refusal(run_config(runs[i])) for i in todo)
    refusal = next((why for why in refusals if why is not None), None)
    if mode == "lockstep" and refusal is not None:
        if log is not None:
            log(f"not in lockstep ({refusal}): one after another")
        mode = "sequential"
    if mode == "lockstep" and len(todo) == 1:
        mode = "sequential"
    report = BatchReport([], mode, statuses=statuses)
    if mode == "sequential":
        for i in todo:
            spec = runs[i]
            exp = prepare(run_config(spec))
            resume = statuses[i] == "resume"
            if resume and progress is not None:
                progress(_rounds_done(spec))
            spec.folder.mkdir(parents=True, exist_ok=True)
            summaries[i] = _run_one(spec, exp, resume, progress, after)
    else:
        _lockstep(runs, todo, statuses, summaries, progress, report, after)
    report.summaries = [summaries[i] for i in range(len(runs))]
    return report


def _rounds_done(spec: RunSpec) -> int:
    """Rounds a resumed run had finished (its checkpoint's, from checkpoint_time.json; 0 if
    unknown): where the progress bar starts."""
    try:
        done = json.loads((spec.folder / "checkpoint_time.json").read_text()).get("round", 0)
        return int(done)
    except (OSError, ValueError, TypeError, AttributeError):
        return 0


def _lockstep(
    runs: Sequence[RunSpec],
    todo: list[int],
    statuses: list[str],
    summaries: dict[int, dict[str, Any]],
    progress: Progress | None,
    report: BatchReport,
    after: After | None,
) -> None:
    """The runs ``todo`` in threads whose model kernels meet (:class:`Lockstep`)."""
    from fedhp.api import prepare
    from fedhp.sweep.lockstep import Lockstep

    exps = {i: prepare(run_config(runs[i])) for i in todo}
    step = Lockstep(len(todo))
    for slot, i in enumerate(todo):
        seat = step.seat(slot)  # its rounds, local SGD and model calls meet the others'
        exps[i].ctx.batch = exps[i].model.meeting = seat
        report.graphs_stacked |= exps[i].ctx.graphs.enabled
        exps[i].ctx.graphs.stacked_only()  # (its model calls meet the other runs')
    errors: dict[int, BaseException] = {}
    lock = threading.Lock()

    def tick(n: int) -> None:
        if progress is not None:
            with lock:
                progress(n)

    import torch

    torch_threads = torch.get_num_threads()

    def work(slot: int, i: int) -> None:
        spec = runs[i]
        # A new thread starts with OpenMP's and MKL's default thread count, whatever
        # torch.get_num_threads() says: set it here, or its kernels may split their sums
        # otherwise than the run alone (seen: an evaluation's loss in the last bits).
        torch.set_num_threads(torch_threads)
        step.wait_turn(slot)  # (one run thread at a time: the turn passes at model calls)
        try:
            resume = statuses[i] == "resume"
            if resume:
                tick(_rounds_done(spec))
            spec.folder.mkdir(parents=True, exist_ok=True)
            summaries[i] = _run_one(spec, exps[i], resume, tick, after)
        except BaseException as err:  # noqa: BLE001 (re-raised below, in the caller's thread)
            errors[i] = err
        finally:
            step.finish(slot)

    threads = [
        threading.Thread(target=work, args=(slot, i), name=f"fedhp-run-{i}", daemon=True)
        for slot, i in enumerate(todo)
    ]
    for thread in threads:
        thread.start()
    step.begin()
    for thread in threads:
        thread.join()
    report.fused_calls, report.single_calls = step.fused_calls, step.single_calls
    report.stacked_rounds, report.alone_rounds = step.stacked_rounds, dict(step.alone)
    if errors:
        raise errors[min(errors)]
