"""``fedhp sweep --backend ray``: a sweep's batches spread over a Ray cluster, one task per batch.

Each batch is one Ray task running :func:`fedhp.sweep.execute.run_batch` in a worker, so a run's
numbers are those of the in-process sweep (the same code on the same inputs; its folder gets the
same files). A task takes one GPU where its runs use a CUDA device, else ``threads`` CPUs (the
runs' option, default 1). Without an address (and without ``RAY_ADDRESS``) a local Ray is
started and shut down at the end; with one, fedhp joins that cluster and leaves it running.
Run folders are written by the workers: on a cluster of several machines ``--out`` must be on a
file system all of them share, at the same path (docs/sweep.md, "Spreading a sweep over machines
with Ray").
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fedhp.errors import ConfigError, FedhpError, FedhpWarning
from fedhp.flower.processes import Watchdog
from fedhp.sweep.execute import BatchReport
from fedhp.sweep.plan import RunSpec, run_config

__all__ = ["run_batches_ray"]

RAY_MISSING = "--backend ray: Ray is not installed; pip install 'fedhp[ray]' (or flwr[simulation])"
RAY_OBJECT_STORE_BYTES = 256 * 2**20
"""A local Ray's object store: tasks return a few small summaries, keep its footprint small."""


@dataclass
class _Outcome:
    """What a worker sends back: the batch's report, or its error; fedhp's lines and warnings."""

    report: BatchReport | None = None
    error_class: type[FedhpError] | None = None
    error: str = ""
    traceback: str = ""
    lines: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _fedhp_class(err: FedhpError) -> type[FedhpError]:
    """The nearest class of ``err`` defined in fedhp itself (a plugin's own subclass cannot be
    assumed importable in the caller)."""
    for cls in type(err).__mro__:
        if cls.__module__.startswith("fedhp.") and issubclass(cls, FedhpError):
            return cls
    return FedhpError


def _work(batch: Sequence[RunSpec], batching: str) -> _Outcome:
    """The Ray task: one batch, in the worker. Never raises for the batch's own errors: they
    travel back as data, so the caller re-raises fedhp's one-line errors as they were."""
    import traceback

    from fedhp.sweep.execute import run_batch

    out = _Outcome()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FedhpWarning)
        try:
            out.report = run_batch(batch, batching, None, out.lines.append)
        except FedhpError as err:
            out.error_class, out.error = _fedhp_class(err), str(err)
        except Exception as err:  # noqa: BLE001 (re-raised in the caller, naming the batch)
            out.error = f"{type(err).__name__}: {err}"
            out.traceback = traceback.format_exc()
    for item in caught:
        text = str(item.message)
        if issubclass(item.category, FedhpWarning) and text not in out.warnings:
            out.warnings.append(text)
    return out


def _how(report: BatchReport) -> str:
    if report.batching == "lockstep":
        return f"{report.lockstep_line()}{report.carried()}"
    how = {"kept": "all finished before: kept", "sequential": "one after another"}.get(
        report.batching, report.batching
    )
    return how + report.carried()


def _describe(i: int, batches: Sequence[Sequence[RunSpec]]) -> str:
    batch = batches[i]
    more = f" and {len(batch) - 1} more run(s)" if len(batch) > 1 else ""
    return f"batch {i + 1}/{len(batches)} ({batch[0].out_dir}{more})"


def _absolute(spec: RunSpec) -> RunSpec:
    """``spec`` with its folder made absolute here (a worker's working directory may differ)."""
    return replace(spec, out_dir=str(Path(spec.out_dir).absolute()))


def _demand(batch: Sequence[RunSpec]) -> tuple[bool, int]:
    """(whether the batch's runs use a CUDA device, the most ``threads`` any of them asks)."""
    cfgs = [run_config(spec) for spec in batch]
    gpu = any(str(cfg.device).startswith("cuda") for cfg in cfgs)
    return gpu, max(cfg.threads or 1 for cfg in cfgs)


def run_batches_ray(
    batches: Sequence[Sequence[RunSpec]],
    batching: str = "auto",
    address: str | None = None,
    progress: Callable[[int], None] | None = None,
    log: Callable[[str], None] | None = None,
    num_cpus: int | None = None,
) -> list[BatchReport]:
    """Run every batch as one Ray task (``run_batch(batch, batching)`` in a worker); their
    reports in the batches' order.

    ``address``: join that cluster (``host:port``, ``ray://host:10001``, ``auto``) and leave it
    running (only this driver disconnects at the end); None: the cluster of ``RAY_ADDRESS``
    where that is set, else a local Ray with ``num_cpus`` CPUs (None: all), shut down at the
    end. A Ray this process had already initialized is used as it is and left connected.
    ``progress(n)`` is called with the rounds of a batch's runs as the batch finishes (runs
    kept from an earlier sweep included).
    A fedhp error in a worker is raised here as it was (the same class, its one line); any other
    error names the batch and carries the worker's traceback.
    """
    try:
        import ray
        from ray.exceptions import RayError
    except ImportError:
        raise ConfigError(RAY_MISSING) from None

    say = log or (lambda text: None)
    if not batches:
        return []
    batches = [[_absolute(spec) for spec in batch] for batch in batches]
    demands = [_demand(batch) for batch in batches]
    if address is None and os.environ.get("RAY_ADDRESS"):
        address = os.environ["RAY_ADDRESS"]
    main = threading.current_thread() is threading.main_thread()
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    started = connected = False
    pending: list[Any] = []
    dog: Watchdog | None = None
    try:
        if not ray.is_initialized():
            if address is None:  # a local Ray ends with this process, however it ends
                dog = Watchdog.start()
                with dog.marking():
                    _connect(ray, address, num_cpus)
            else:
                _connect(ray, address, num_cpus)
            connected, started = True, address is None
        options = _task_options(ray, demands, local=started)
        say(_cluster_line(ray, address, started, options))
        start = time.perf_counter()
        task = ray.remote(max_retries=0)(_work)
        refs = [
            task.options(**opts).remote(batch, batching)
            for batch, opts in zip(batches, options, strict=True)
        ]
        index = {ref: i for i, ref in enumerate(refs)}
        outcomes: dict[int, _Outcome] = {}
        pending = list(refs)
        shared_checked = False
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            i = index[done[0]]
            try:
                outcome = ray.get(done[0])
            except RayError as err:
                cause = " ".join(str(err).split())[:300]
                raise FedhpError(
                    f"--backend ray: {_describe(i, batches)} failed in Ray ({cause}); runs "
                    "finished or checkpointed so far are kept: run the sweep again to resume"
                ) from None
            for line in outcome.lines:
                say(line)
            for text in outcome.warnings:
                warnings.warn(text, FedhpWarning, stacklevel=2)
            if outcome.error_class is not None:
                raise outcome.error_class(outcome.error)
            if outcome.report is None:
                raise RuntimeError(
                    f"--backend ray: {_describe(i, batches)} failed in its Ray worker: "
                    f"{outcome.error}\n--- the worker's traceback ---\n{outcome.traceback}"
                )
            if not shared_checked and address is not None:
                shared_checked = True
                if not (batches[i][0].folder / "summary.json").is_file():
                    say(
                        f"ray: warning: {batches[i][0].folder} is not visible here: the runs' "
                        "folders are on the worker machines; put --out on a shared file system"
                    )
            outcomes[i] = outcome
            say(
                f"batch {i + 1}/{len(batches)}: {len(batches[i])} runs "
                f"{_how(outcome.report)}; done "
                f"{time.perf_counter() - start:.1f}s after the start"
            )
            if progress is not None:
                progress(sum(spec.rounds for spec in batches[i]))
        reports = [outcomes[i].report for i in range(len(batches))]
        return [report for report in reports if report is not None]
    finally:
        if pending and ray.is_initialized():
            for ref in pending:  # an error or Ctrl-C: the other batches stop (checkpoints stay)
                with contextlib.suppress(Exception):  # already finished or gone
                    ray.cancel(ref, force=True)
        if connected and ray.is_initialized():
            ray.shutdown()  # a local Ray ends; a cluster joined stays up (this driver leaves it)
        if dog is not None:
            dog.close()  # (and what of the local Ray outlived its shutdown: Ray's agents)
        if main:
            for sig, handler in handlers.items():
                if handler is not None:
                    signal.signal(sig, handler)


def _connect(ray: Any, address: str | None, num_cpus: int | None) -> None:
    """``ray.init``, quiet: no dashboard, the workers' output not forwarded, errors only."""
    quiet: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.ERROR}
    if address is None:
        args: dict[str, Any] = {
            "address": "local",  # never a cluster some `ray start` left on this machine
            "num_cpus": num_cpus,
            "include_dashboard": False,
            "object_store_memory": RAY_OBJECT_STORE_BYTES,
        }
    else:
        args = {"address": address}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            ray.init(**args, **quiet)
        except (ConnectionError, RuntimeError, ValueError) as err:
            where = f"the Ray cluster at {address}" if address else "a local Ray"
            cause = " ".join(str(err).split())[:300]
            raise ConfigError(f"--backend ray: could not start or join {where} ({cause})") from None


def _nodes(ray: Any) -> list[dict[str, float]]:
    return [node["Resources"] for node in ray.nodes() if node.get("Alive")]


def _task_options(ray: Any, demands: list[tuple[bool, int]], local: bool) -> list[dict[str, Any]]:
    """Each task's resources: one GPU for a batch of CUDA runs (the cluster must have GPUs),
    else ``threads`` CPUs (no more than the largest node has, on a cluster fedhp started)."""
    gpus = ray.cluster_resources().get("GPU", 0)
    most_cpus = max((node.get("CPU", 0) for node in _nodes(ray)), default=0)
    options = []
    for gpu, threads in demands:
        if gpu:
            if gpus <= 0:
                raise ConfigError(
                    "--backend ray: the runs use device=cuda but the Ray cluster has no GPUs; "
                    "use device=cpu or join a cluster with GPUs (--address)"
                )
            options.append({"num_gpus": 1, "num_cpus": 1})
            continue
        if threads > most_cpus and local:
            raise ConfigError(
                f"--backend ray: threads={threads} needs {threads} CPUs per task but the local "
                f"Ray has {most_cpus:g}; lower threads or raise the CPUs Ray may use"
            )
        options.append({"num_cpus": threads})
    return options


def _cluster_line(
    ray: Any, address: str | None, started: bool, options: list[dict[str, Any]]
) -> str:
    res = ray.cluster_resources()
    where = "a local Ray" if started else f"the Ray cluster at {address or 'this process'}"
    gpus = f", {res.get('GPU', 0):g} GPU(s)" if res.get("GPU", 0) else ""
    kinds = sorted({"1 GPU" if o.get("num_gpus") else f"{o['num_cpus']} CPU(s)" for o in options})
    return (
        f"ray: {where} ({len(_nodes(ray))} node(s), {res.get('CPU', 0):g} CPU(s){gpus}); "
        f"one task per batch, {' or '.join(kinds)} each"
    )
