"""The shared reproduction runner: a list of jobs (named configurations) run sequentially over
seeds, each in its own results folder, with mean ± std of the final- and best-round accuracy.

A run whose folder already holds a ``summary.json`` written by the same configuration is reused,
not rerun, so reproductions that share runs (Table I and the λ sweep, say) can share a
``--runs`` folder, and an interrupted reproduction continues where it stopped. "The same"
ignores the options of :data:`COSMETIC_OPTIONS` (what a run prints and how often it saves, not
what it computes): a run made by ``fedhp sweep`` or ``fedhp run`` with another
``checkpoint_every`` or with ``progress`` on is reused as it is.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from fedhp.errors import ConfigError
from fedhp.tables import markdown_table as markdown_table  # (the reproductions' tables)
from fedhp.tables import mean_std as mean_std

# (train, test) samples per class of the paper's two settings.
SETTINGS: dict[tuple[str, int], tuple[int, int]] = {
    ("mnist", 1): (200, 800),
    ("mnist", 2): (900, 300),
    ("fmnist", 1): (200, 800),
    ("fmnist", 2): (900, 300),
    ("cifar10", 1): (100, 400),
    ("cifar10", 2): (450, 150),
}

# --model values: name -> overrides.
MODELS: dict[str, list[str]] = {
    "dnn": ["model.name=dnn", "model.hidden=[100]"],  # 784-100-10, 79,510 parameters
    "dnn-500-200": ["model.name=dnn", "model.hidden=[500,200]"],  # 784-500-200-10, 494,710
    "mlr": ["model.name=mlr"],
    "cnn": ["model.name=cnn"],
    "vgg": ["model.name=vgg"],
}
MODEL_TEXT = {
    "dnn": "DNN 784-100-10 (79,510 parameters)",
    "dnn-500-200": "DNN 784-500-200-10 (494,710 parameters)",
    "mlr": "MLR 784-10",
    "cnn": "CNN (McMahan et al.)",
    "vgg": "VGG [16,M,32,M,64,M,128,M,128,M]",
}

# The paper's shared hyperparameters (|D| = 20, K = 5, R = 20, η1 = η2 = 0.05, β = 1) and the
# equal gradient budget: every method takes R·K = 100 minibatch gradient steps per client per round.
BATCH, K, R, LR = 20, 5, 20, 0.05
BUDGET = R * K
METHOD_OVERRIDES: dict[str, list[str]] = {
    "fedavg": ["algorithm.name=fedavg", f"algorithm.local_steps={BUDGET}"],
    "fedprox": ["algorithm.name=fedprox", f"algorithm.local_steps={BUDGET}"],
    "hierfavg": ["algorithm.name=hierfavg", f"algorithm.kappa1={K}", f"algorithm.kappa2={R}"],
    "pfedme": [
        "algorithm.name=pfedme",
        f"algorithm.K={K}",
        f"algorithm.R={R}",
        f"algorithm.personal_lr={LR}",
        "algorithm.beta=1.0",
    ],
    "sfedhp": [
        "algorithm.name=sfedhp",
        f"algorithm.K={K}",
        f"algorithm.R={R}",
        f"algorithm.edge_lr={LR}",
        "algorithm.beta=1.0",
    ],
    "heurfedamp": ["algorithm.name=heurfedamp", f"algorithm.local_steps={BUDGET}"],
    "perfedavg": ["algorithm.name=perfedavg", f"algorithm.local_steps={BUDGET // 2}"],
    "pfedgp": ["algorithm.name=pfedgp"],  # the authors' full-batch step(s) (docs/algorithms.md)
    "centralized": ["algorithm.name=centralized", f"algorithm.local_steps={BUDGET}"],
    "local": ["algorithm.name=local", f"algorithm.local_steps={BUDGET}"],
}
LABELS = {
    "fedavg": "FedAvg",
    "fedprox": "FedProx",
    "hierfavg": "HierFAVG",
    "pfedme": "pFedMe",
    "sfedhp": "sFedHP",
    "heurfedamp": "HeurFedAMP",
    "perfedavg": "Per-FedAvg",
    "pfedgp": "pFedGP",
    "centralized": "Centralized (union of data)",
    "local": "Local only",
}
ACC_KEYS = ("final_global_acc", "best_global_acc", "final_personal_acc", "best_personal_acc")


@dataclass
class ReproOptions:
    """Command-line options shared by every reproduction."""

    dataset: str = "mnist"
    setting: int = 1
    rounds: int = 800
    seeds: int = 1
    model: str | None = None
    out: Path | None = None
    runs: Path | None = None
    eval_every: int = 10
    threads: int = 1
    tuned: Path | None = None
    methods: list[str] | None = None
    data_dir: str | None = None
    extra: list[str] = field(default_factory=list)
    quiet: bool = False
    jobs: int = 1
    path: str | None = None  # fedht-libsvm: the user's LibSVM file
    rounds_given: bool = False  # --rounds was given (the fedht experiments have their own)
    gamma: float | None = None  # fedht-*: a common step size instead of the tuned choice
    quick: bool = False  # fnrfl-table2: a short CPU run (subset of the data, fewer epochs)
    leak: bool = False  # fnrfl-table2: the authors' train-on-test protocol
    skews: list[str] | None = None  # fnrfl-table2: which NIID-Bench skews

    @property
    def key(self) -> tuple[str, int]:
        return (self.dataset, self.setting)

    @property
    def model_name(self) -> str:
        if self.model is not None:
            return self.model
        return "vgg" if self.dataset == "cifar10" else "dnn"

    def out_dir(self, name: str) -> Path:
        if self.out is not None:
            return self.out
        return Path("runs") / "reproduce" / f"{name}-{self.dataset}-s{self.setting}"

    def runs_dir(self, name: str) -> Path:
        return self.runs if self.runs is not None else self.out_dir(name) / "runs"

    def folders(self, name: str) -> tuple[Path, Path]:
        """The output folder (``--out``, else ``runs/reproduce/NAME``) and the runs folder
        (``--runs``, else ``OUT/runs``)."""
        out = self.out or Path("runs") / "reproduce" / name
        return out, self.runs or out / "runs"

    def chosen_methods(
        self, default: Sequence[str], allowed: Sequence[str] | None = None
    ) -> list[str]:
        """``--methods``, else ``default``; each must be one of ``allowed`` (default:
        ``default``)."""
        allowed = default if allowed is None else allowed
        methods = self.methods or list(default)
        for m in methods:
            if m not in allowed:
                raise ConfigError(f"--methods: unknown {m!r}; choose from {', '.join(allowed)}")
        return methods

    def base_overrides(self, model: str | None = None) -> list[str]:
        """Dataset, setting, model, rounds and evaluation overrides common to every job."""
        if self.key not in SETTINGS:
            raise ConfigError(f"--dataset/--setting: no preset for {self.dataset} {self.setting}")
        model = model or self.model_name
        if model not in MODELS:
            raise ConfigError(f"--model: unknown {model!r}; choose from {', '.join(MODELS)}")
        train, test = SETTINGS[self.key]
        out = [
            f"dataset.name={self.dataset}",
            "partition.name=labels",
            "partition.labels_per_client=5",
            f"partition.train_per_class={train}",
            f"partition.test_per_class={test}",
            "federation.num_clients=20",
            "federation.num_edges=4",
            f"algorithm.batch_size={BATCH}",
            f"algorithm.lr={LR}",
            *MODELS[model],
            f"rounds={self.rounds}",
            f"eval_every={self.eval_every}",
            f"threads={self.threads}",
            "progress=false",
            "checkpoint_every=100",
        ]
        if self.data_dir is not None:
            out.append(f"dataset.data_dir={self.data_dir}")
        return out

    def tuned_values(self) -> dict[str, dict[str, Any]]:
        """Chosen hyperparameters for this dataset/setting from ``--tuned`` (empty if none)."""
        if self.tuned is None:
            return {}
        if not self.tuned.is_file():
            raise ConfigError(f"--tuned {self.tuned}: not found (write it with sfedhp-tune)")
        data = json.loads(self.tuned.read_text())
        entry = data.get(f"{self.dataset}-s{self.setting}", {})
        choices = entry.get("choices", {})
        assert isinstance(choices, dict)
        return choices


@dataclass
class Job:
    """One configuration of a reproduction: ``key`` names its folder, ``method`` the algorithm."""

    key: str
    method: str
    overrides: list[str]
    params: dict[str, Any] = field(default_factory=dict)
    model: str | None = None


def method_job(method: str, key: str | None = None, model: str | None = None, **params: Any) -> Job:
    """A job running ``method`` with the paper's shared settings and ``algorithm.<p>=<v>``."""
    overrides = list(METHOD_OVERRIDES[method])
    for name, value in params.items():
        overrides.append(f"{name}={value}" if "." in name else f"algorithm.{name}={value}")
    if key is None:
        key = method + "".join(f"-{k.split('.')[-1]}{v}" for k, v in params.items())
    return Job(key, method, overrides, dict(params), model)


def stat(values: Sequence[float]) -> dict[str, float]:
    """``{"mean", "std"}`` of ``values`` (:func:`mean_std`)."""
    m, sd = mean_std(values)
    return {"mean": m, "std": sd}


def stat_cell(entry: Mapping[str, float] | None, fmt: str = ".4f") -> str:
    """A :func:`stat` as ``mean ± std`` in ``fmt`` (the mean alone without a spread; ``—``
    without a mean)."""
    if entry is None or math.isnan(entry["mean"]):
        return "—"
    text = format(entry["mean"], fmt)
    return (
        text if entry["std"] == 0 or math.isnan(entry["std"]) else f"{text} ± {entry['std']:{fmt}}"
    )


def seed_stats(summaries: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> dict[str, Any]:
    """Per key: mean, std and the values over the seeds' summaries that have a number there
    (empty where none has one); ``stopped`` (as strings) where a seed stopped."""
    out: dict[str, Any] = {}
    for key in keys:
        values = [float(s[key]) for s in summaries if isinstance(s.get(key), int | float)]
        out[key] = {**stat(values), "values": values}
    stopped = [str(s["stopped"]) for s in summaries if s.get("stopped")]
    if stopped:
        out["stopped"] = stopped
    return out


def aggregate(summaries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """mean ± std over seeds of every accuracy key present, plus time and divergence notes."""
    stats = seed_stats(summaries, (*ACC_KEYS, "seconds", "seconds_per_round"))
    out: dict[str, Any] = {"seeds": len(summaries)}
    out.update((k, v) for k, v in stats.items() if k == "stopped" or v["values"])
    for key in ("gradient_evaluations_per_round", "num_params", "rounds"):
        if summaries and key in summaries[0]:
            out[key] = summaries[0][key]
    return out


def log(opts: ReproOptions, text: str) -> None:
    """``text`` on stderr unless ``--quiet``."""
    if not opts.quiet:
        print(text, file=sys.stderr, flush=True)


COSMETIC_OPTIONS: tuple[str, ...] = ("progress", "checkpoint_every")
"""Top-level options that change what a run prints or how often it saves a checkpoint, never
what it computes: a finished run that differs from the asked-for configuration only in these is
reused (:func:`same_run`). Checked, not assumed: every Table I method gives byte-identical
metrics.csv, per_client.csv and final state under ``checkpoint_every`` 0, 1, 3 and ``progress``
on/off (``tests/experiments/test_table1_paper_model.py``). ``threads`` is not among them: the
number of intra-op threads may change the order of a float sum, and with it the last bits of a
result; ``eval_every`` is not either (it decides which rounds the best-round columns see)."""

RESUME_IGNORES: tuple[str, ...] = ("progress",)
"""What may differ between an interrupted run's checkpoint and its continuation: the engine's
restore refuses any other difference (:data:`fedhp.engine.checkpoint.RESUMABLE_KEYS` less
``rounds``, which a reproduction never changes on its runs)."""


def without(config: Mapping[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """``config`` without its top-level ``keys``."""
    return {k: v for k, v in config.items() if k not in keys}


def same_run(
    saved: Mapping[str, Any], current: Mapping[str, Any], ignore: Sequence[str] = COSMETIC_OPTIONS
) -> bool:
    """Whether a configuration written earlier (a config.yaml's contents, put in today's form by
    :func:`fedhp.config.normalized_config`) computes the same run as ``current`` (a resolved
    configuration, :func:`fedhp.config.config_to_dict`), the top-level options of ``ignore``
    (default :data:`COSMETIC_OPTIONS`) aside."""
    from fedhp.config import normalized_config

    return without(normalized_config(saved), ignore) == without(current, ignore)


def saved_config(folder: Path) -> dict[str, Any] | None:
    """``folder/config.yaml`` as data (None where absent or unreadable)."""
    path = folder / "config.yaml"
    if not path.is_file():
        return None
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None
    return data if isinstance(data, dict) else None


def finished_summary(overrides: list[str], folder: Path) -> dict[str, Any] | None:
    """The ``summary.json`` of a finished run in ``folder`` that computed the configuration of
    ``overrides`` (:func:`same_run`: cosmetic options aside), marked ``reused``; None where the
    folder holds no finished run of it."""
    from fedhp.config import config_to_dict, resolve_config

    summary_path = folder / "summary.json"
    saved = saved_config(folder)
    if saved is None or not summary_path.is_file():
        return None
    if not same_run(saved, config_to_dict(resolve_config(None, overrides))):
        return None
    summary: dict[str, Any] = json.loads(summary_path.read_text())
    summary["reused"] = True
    return summary


def run_config(overrides: list[str], folder: Path) -> dict[str, Any]:
    """Run one configuration into ``folder`` (reusing a finished run of the same configuration,
    cosmetic options aside: :func:`finished_summary`; resuming an interrupted one from its
    checkpoint); besides the runner's files, writes ``nodes.json`` (:func:`write_nodes`)."""
    from fedhp.api import prepare, run_built
    from fedhp.config import config_to_dict, resolve_config
    from fedhp.errors import DivergenceError

    done = finished_summary(overrides, folder)
    if done is not None:
        return done
    cfg = resolve_config(None, overrides)
    config = config_to_dict(cfg)
    summary_path = folder / "summary.json"
    exp = prepare(cfg)
    from fedhp.engine.checkpoint import resumable

    saved = saved_config(folder)
    resume = saved is not None and resumable(folder, fall_back=True)
    if resume and saved is not None and not same_run(saved, config, RESUME_IGNORES):
        resume = False
    try:
        summary = run_built(exp, folder, resume=resume, progress=False)
    except DivergenceError as err:
        summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
        summary["stopped"] = str(err)
    write_nodes(folder, exp)
    return summary


_RUN_CONFIG = run_config


def _die_with_parent() -> None:
    """Worker initializer: on Linux the kernel sends the worker SIGTERM when the process that
    started it exits, so a killed ``fedhp reproduce --jobs N`` leaves no orphan runs behind
    (PR_SET_PDEATHSIG; elsewhere a no-op)."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def map_runs(
    tasks: Sequence[tuple[list[str], Path]], jobs: int, run: Callable[..., Any] = run_config
) -> Iterator[tuple[Path, Any, float]]:
    """Run ``run(overrides, folder)`` for every task; yields ``(folder, result, seconds)`` as
    runs finish. Sequential with ``jobs <= 1``, else that many at once in spawned worker
    processes (``seconds`` then counts from the start of the batch)."""
    if jobs > 1 and len(tasks) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        start = time.perf_counter()
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(
            max_workers=jobs, mp_context=ctx, initializer=_die_with_parent
        ) as pool:
            futures = {pool.submit(run, ov, folder): folder for ov, folder in tasks}
            for fut in as_completed(futures):
                yield futures[fut], fut.result(), time.perf_counter() - start
        return
    if run is _RUN_CONFIG:  # (not a stand-in: tests replace run_config)
        yield from _batched_runs(tasks)
        return
    for overrides, folder in tasks:
        start = time.perf_counter()
        result = run(overrides, folder)
        yield folder, result, time.perf_counter() - start


def write_nodes(folder: Path, exp: Any) -> None:
    """``folder/nodes.json``: the accumulated traffic per node of every link
    (:meth:`fedhp.comm.CommLedger.node_totals`)."""
    from fedhp.comm import LINKS
    from fedhp.reporting import write_json_atomic

    nodes = {link: exp.ctx.ledger.node_totals(link) for link in LINKS}
    write_json_atomic(folder / "nodes.json", {k: v for k, v in nodes.items() if v})


def _batched_runs(
    tasks: Sequence[tuple[list[str], Path]],
) -> Iterator[tuple[Path, dict[str, Any], float]]:
    """The runs of :func:`map_runs` through ``fedhp sweep``'s batches (:mod:`fedhp.sweep`):
    runs of one structure (seeds, float hyperparameters) share a batch — in lockstep on a GPU,
    one after another on the CPU —, finished runs are kept (cosmetic options aside:
    :func:`finished_summary`, checked here before the sweep's own, exact check) and interrupted
    ones resumed."""
    from fedhp.sweep.execute import run_batch
    from fedhp.sweep.plan import make_batches, spec_of
    from fedhp.sweep.plan import run_config as run_config_of
    from fedhp.sweep.run import runs_per_batch_of

    left = []
    for overrides, folder in tasks:
        done = finished_summary(overrides, folder)
        if done is None:
            left.append((overrides, folder))
        else:
            yield folder, done, 0.0
    specs = [spec_of(overrides, folder) for overrides, folder in left]
    gpu = bool(specs) and str(run_config_of(specs[0]).device).startswith("cuda")
    per_batch = runs_per_batch_of(specs[0]) if gpu and len(specs) > 1 else None
    for batch in make_batches(specs, per_batch):
        start = time.perf_counter()
        report = run_batch(batch, "auto", after=lambda spec, exp: write_nodes(spec.folder, exp))
        seconds = (time.perf_counter() - start) / len(batch)
        for spec, summary, status in zip(batch, report.summaries, report.statuses, strict=True):
            if status == "finished":
                summary["reused"] = True
            yield spec.folder, summary, seconds


Key = TypeVar("Key")


def run_keyed(
    opts: ReproOptions,
    tasks: Sequence[tuple[Key, list[str], Path]],
    label: Callable[[Key], str],
    accuracy: Callable[[Path, dict[str, Any]], float] | None = None,
) -> dict[Key, dict[str, Any]]:
    """Run (or reuse) every ``(key, overrides, folder)`` task with ``opts.jobs`` at once; one
    progress line per run on stderr (``[i/n] label: acc=... 12s|reused``; ``accuracy`` of a
    run: its final global accuracy unless given). Returns the summaries (each with its
    ``folder``) by key."""
    where = {folder: key for key, _, folder in tasks}
    done: dict[Key, dict[str, Any]] = {}
    for folder, summary, sec in map_runs([(ov, f) for _, ov, f in tasks], opts.jobs, run_config):
        summary["folder"] = str(folder)
        key = where[folder]
        done[key] = summary
        acc = (
            accuracy(folder, summary)
            if accuracy is not None
            else summary.get("final_global_acc", math.nan)
        )
        how = "reused" if summary.get("reused") else f"{sec:.0f}s"
        log(opts, f"[{len(done)}/{len(tasks)}] {label(key)}: acc={acc:.4f} {how}")
    return done


def run_seeds(
    opts: ReproOptions,
    keys: Sequence[Key],
    overrides: Callable[[Key, int], list[str]],
    folder: Callable[[Key], Path],
    label: Callable[[Key], str],
    accuracy: Callable[[Path, dict[str, Any]], float] | None = None,
    seeds: Sequence[int] | None = None,
    seed_major: bool = False,
) -> dict[Key, list[dict[str, Any]]]:
    """:func:`run_keyed` over every key × seed (``seeds``: 0..opts.seeds-1 unless given;
    ``seed_major``: every key of a seed before the next seed), run in ``folder(key)/seed<seed>``
    with ``overrides(key, seed)``; each key's summaries in seed order."""
    seeds = range(opts.seeds) if seeds is None else seeds
    pairs = (
        [(k, s) for s in seeds for k in keys]
        if seed_major
        else [(k, s) for k in keys for s in seeds]
    )
    tasks = [((k, s), overrides(k, s), folder(k) / f"seed{s}") for k, s in pairs]
    done = run_keyed(opts, tasks, lambda ks: f"{label(ks[0])} seed {ks[1]}", accuracy)
    return {k: [done[(k, s)] for s in seeds] for k in keys}


def job_tasks(
    jobs: Sequence[Job], opts: ReproOptions, runs_dir: Path
) -> list[tuple[str, int, list[str], Path]]:
    """``(job key, seed, overrides, folder)`` of every run of ``jobs`` (seeds 0..opts.seeds-1):
    the shared options the job's method reads, its own, the user's it reads, the seed; the
    folder ``runs_dir/<job key>/seed<seed>``."""
    from fedhp.unread import read_overrides

    tasks = []
    extras = user_overrides_read(jobs, opts)
    for job in jobs:
        own = [*job.overrides, *extras[job.key]]
        # (the shared options the method reads: Per-FedAvg does not read algorithm.lr)
        shared = read_overrides(opts.base_overrides(job.model), own)
        for seed in range(opts.seeds):
            overrides = [*shared, *own, f"seed={seed}"]
            tasks.append((job.key, seed, overrides, runs_dir / job.key / f"seed{seed}"))
    return tasks


def run_jobs(
    jobs: Sequence[Job], opts: ReproOptions, runs_dir: Path, run: Callable[..., Any] = run_config
) -> dict[str, dict[str, Any]]:
    """Run every job for seeds 0..opts.seeds-1 (``opts.jobs`` at once: :func:`map_runs`); job
    key -> aggregate over seeds."""
    tasks = job_tasks(jobs, opts, runs_dir)
    done: dict[tuple[str, int], dict[str, Any]] = {}
    by_folder = {folder: (key, seed) for key, seed, _, folder in tasks}
    for folder, summary, sec in map_runs([(ov, f) for _, _, ov, f in tasks], opts.jobs, run):
        key, seed = by_folder[folder]
        summary["folder"] = str(folder)
        done[(key, seed)] = summary
        accs = " ".join(
            f"{k}={summary[k]:.4f}" for k in ACC_KEYS if isinstance(summary.get(k), float)
        )
        run_sec = summary.get("seconds")
        how = f"{run_sec if isinstance(run_sec, int | float) else sec:.0f}s"
        how = "reused" if summary.get("reused") else how
        log(opts, f"[{len(done)}/{len(tasks)}] {key} seed {seed}: {how} {accs}")
    results: dict[str, dict[str, Any]] = {}
    for job in jobs:
        summaries = [done[(job.key, seed)] for seed in range(opts.seeds)]
        agg = aggregate(summaries)
        agg.update(method=job.method, params=job.params, folders=[s["folder"] for s in summaries])
        results[job.key] = agg
    return results


def user_overrides_read(jobs: Sequence[Job], opts: ReproOptions) -> dict[str, list[str]]:
    """Each job's share of the user's ``key=value`` overrides (``opts.extra``): those its run
    reads, so that one option of one method (``algorithm.mu=0.1``, ``engine.cuda_graphs=true``)
    applies to the methods that read it, and one line says which methods leave it out. An
    override no job reads is kept for every job: the runs then refuse it in one line, as
    ``fedhp run`` does."""
    from fedhp.build import check_components
    from fedhp.config import RunConfig, resolve_config
    from fedhp.unread import unread_options

    def resolved(job: Job, items: Sequence[str]) -> RunConfig | None:
        overrides = [*opts.base_overrides(job.model), *job.overrides, *items]
        try:
            cfg = resolve_config(None, overrides, refuse_unread=False)
            check_components(cfg)
        except ConfigError:  # not an option of this method (or not a value it takes)
            return None
        return cfg

    def read_by(job: Job) -> list[str]:
        valid = [item for item in opts.extra if resolved(job, [item]) is not None]
        cfg = resolved(job, valid)  # (together: whether one is read may follow from another)
        unread = set() if cfg is None else set(unread_options(cfg))
        return [item for item in valid if item.partition("=")[0].strip() not in unread]

    reads = {job.key: read_by(job) for job in jobs}
    out: dict[str, list[str]] = {job.key: [] for job in jobs}
    for item in opts.extra:
        takers = [job for job in jobs if item in reads[job.key]] or list(jobs)  # none: refused
        if len(takers) < len(jobs):
            left = ", ".join(job.key for job in jobs if job not in takers)
            key = item.partition("=")[0].strip()
            log(opts, f"{key} is not read by {left}; applied to the other methods")
        for job in takers:
            out[job.key].append(item)
    return out


def pct(stat: Any) -> str:
    """``mean ± std`` in percent from an aggregate entry (``—`` when absent)."""
    if not isinstance(stat, dict):
        return "—"
    return f"{100 * stat['mean']:.2f} ± {100 * stat['std']:.2f}"


def paper_cell(value: float | tuple[float, float] | list[float] | None) -> str:
    if value is None:
        return "—"
    if isinstance(value, tuple | list):
        if len(value) == 1:  # a Table II–VII value: no spread published
            return f"{value[0]:.2f}"
        return f"{value[0]:.2f} ± {value[1]:.2f}"
    return f"{value:.2f}"


NORMALIZED = ("mnist", "fmnist")  # the datasets with a ``dataset.normalize`` option


def last_override(extra: Sequence[str], key: str, default: str) -> str:
    """The value of the last ``key=value`` among ``extra`` (stripped), else ``default``."""
    value = default
    for item in extra:
        name, _, val = item.partition("=")
        if name.strip() == key:
            value = val.strip()
    return value


def normalization_of(dataset: str, extra: Sequence[str]) -> str | None:
    """The ``dataset.normalize`` a reproduction's runs use (the last override among ``extra``,
    else ``global``); None for a dataset without the option."""
    return last_override(extra, "dataset.normalize", "global") if dataset in NORMALIZED else None


def inputs_text(dataset: str, extra: Sequence[str]) -> str:
    """One sentence saying how the images were normalized (for every table header)."""
    mode = normalization_of(dataset, extra)
    if mode is None:
        if dataset == "cifar10":
            return "Inputs: CIFAR-10 standardized per channel (the usual mean/std)."
        return ""
    if mode == "per_pixel":
        return (
            "Inputs: `dataset.normalize=per_pixel`, each pixel j standardized over all 70,000 "
            "images, (x − μ_j)/(σ_j + 0.001) (the pFedMe/sFedHP reference generator's)."
        )
    if mode == "unit":
        return "Inputs: `dataset.normalize=unit`, pixels in [0, 1]."
    return (
        f"Inputs: `dataset.normalize={mode}`, one mean/std for every pixel (the dataset's "
        "standard values)."
    )


def overrides_text(extra: Sequence[str]) -> str:
    """`` Overrides given to every run (they win over the settings above): ...`` or ''."""
    if not extra:
        return ""
    listed = ", ".join(f"`{e}`" for e in extra)
    return f" Overrides given to every run (they win over the settings above): {listed}."


def machine() -> str:
    """``machine: <n> CPUs, torch <version>``, for the descriptions."""
    import torch

    return f"machine: {os.cpu_count()} CPUs, torch {torch.__version__}"


def run_tail(opts: ReproOptions, seed: int, checkpoint_every: int, *more: str) -> list[str]:
    """The overrides that close a study's run: threads, no progress bar, the checkpoint interval,
    ``more``, the seed and the user's own overrides (last, so they win)."""
    return [
        f"threads={opts.threads}",
        "progress=false",
        f"checkpoint_every={checkpoint_every}",
        *more,
        f"seed={seed}",
        *opts.extra,
    ]


def describe(opts: ReproOptions) -> str:
    """One paragraph naming what was run."""
    train, test = SETTINGS[opts.key]
    return (
        f"{opts.dataset} Setting {opts.setting} ({train} train / {test} test samples per class, "
        f"20 clients with 5 labels each, 4 edges of 5 clients); model "
        f"{MODEL_TEXT.get(opts.model_name, opts.model_name)}; T = {opts.rounds} rounds, "
        f"evaluated every {opts.eval_every}; seeds 0..{opts.seeds - 1}; |D| = {BATCH}, K = {K}, "
        f"R = {R}, η1 = η2 = {LR}, β = 1; torch threads = {opts.threads} ({machine()}). "
        f"Every method gets {BUDGET} minibatch gradient steps of |D| = {BATCH} per client per "
        f"round (Per-FedAvg: {BUDGET // 2} meta-steps of 2 gradients each; centralized: {BUDGET} "
        f"steps of {BATCH}×20 samples from the union). {inputs_text(opts.dataset, opts.extra)}"
        f"{overrides_text(opts.extra)}"
    ).rstrip()


def table_result(opts: ReproOptions, rows: list[dict[str, Any]], text: str) -> dict[str, Any]:
    """A reproduced table as data: its settings, rows and markdown."""
    return {
        "dataset": opts.dataset,
        "setting": opts.setting,
        "rounds": opts.rounds,
        "seeds": opts.seeds,
        "model": opts.model_name,
        "description": describe(opts),
        "normalize": normalization_of(opts.dataset, opts.extra),
        "rows": rows,
        "markdown": text,
    }


def write_table(out: Path, table: dict[str, Any]) -> None:
    """``out/table.md`` and ``out/table.json`` (atomic), and the markdown on stdout."""
    from fedhp.reporting import write_json_atomic

    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(table["markdown"])
    write_json_atomic(out / "table.json", {k: v for k, v in table.items() if k != "markdown"})
    print(table["markdown"])


def write_study(
    opts: ReproOptions, out: Path, head: str, text: str, result: dict[str, Any]
) -> dict[str, Any]:
    """What a study (``dp``, ``robust``, ``fedlps-*``, ...) leaves in its output folder:
    ``out/table.md`` (``head``, a blank line, the tables ``text``) and ``out/table.json``
    (``result``); ``text`` on stderr unless ``--quiet``. Returns ``result``."""
    from fedhp.reporting import write_json_atomic

    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(f"{head}\n\n{text}")
    write_json_atomic(out / "table.json", result)
    if not opts.quiet:
        print(text, file=sys.stderr)
    return result


def print_result(words: str, row: Mapping[str, Any], formats: Mapping[str, str]) -> None:
    """Print one result line, flushed: ``words``, then ``key=<mean over seeds>`` for each key of
    ``formats`` (``row[key]["mean"]`` in that key's format spec)."""
    means = " ".join(f"{key}={row[key]['mean']:{spec}}" for key, spec in formats.items())
    print(f"{words} {means}", flush=True)


def reproduce_table(
    opts: ReproOptions,
    name: str,
    jobs: Callable[[ReproOptions], list[Job]],
    build: Callable[[ReproOptions, dict[str, dict[str, Any]]], dict[str, Any]],
) -> dict[str, Any]:
    """Run ``jobs(opts)`` into ``opts.runs_dir(name)``, build the table from their results and
    write it into ``opts.out_dir(name)`` (:func:`write_table`); the table."""
    out = opts.out_dir(name)
    results = run_jobs(jobs(opts), opts, opts.runs_dir(name))
    table = build(opts, results)
    write_table(out, table)
    return table
