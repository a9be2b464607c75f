"""``mlflow.enabled: true``: a run, or a sweep and its runs, in MLflow (docs/outputs.md).

A run is one MLflow run: its resolved configuration as params (dotted keys, ``algorithm.lam``),
every metrics.csv column of every evaluated round as a metric whose step is the round (sent in
batches, at most every :data:`FLUSH_EVERY_S` seconds, and at the end), summary.json's numbers as
``summary/<key>``, and at the end the run folder's files as artifacts (``artifacts: results``:
all but the checkpoints, ``final_state.pt`` and the disk-backed state; ``all``; ``none``). Its
MLflow run id is kept in ``<run>/mlflow.json``, so ``fedhp run --resume`` continues the same
MLflow run (the rounds already logged are not logged again). A sweep is a parent run
(:class:`SweepTracker`, its id in ``<sweep>/mlflow.json``); its runs, folders below the sweep's,
find it there and log as its children, into the same store.

The store: ``mlflow.tracking_uri``, else ``sqlite:///<the run folder's parent>/mlflow.db`` (a
sweep's: ``<the sweep folder's parent>/mlflow.db``), with the artifacts in ``mlartifacts/``
beside it; ``mlflow ui --backend-store-uri sqlite:///runs/mlflow.db`` opens it, no server to
start. An MLflow that cannot be reached or refuses a call is one ``fedhp: warning:`` line and
the run goes on without it. MLflow's telemetry is switched off and its HTTP retries kept short
(``MLFLOW_DISABLE_TELEMETRY``, ``MLFLOW_HTTP_REQUEST_MAX_RETRIES``/``_TIMEOUT``, unless set).
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fedhp.errors import ConfigError, FedhpWarning

__all__ = [
    "FILE",
    "SweepTracker",
    "Tracker",
    "default_uri",
    "flat_params",
    "log_finished_run",
    "require",
]

FILE = "mlflow.json"
"""In a run or sweep folder: the MLflow run it logs to (``run_id``, ``tracking_uri``, ...)."""
DB = "mlflow.db"
ARTIFACTS = "mlartifacts"
FLUSH_EVERY_S = 2.0
BATCH = 1000
"""Metrics per ``log_batch`` call (MLflow's limit)."""
PARAMS_PER_BATCH = 100
PARAM_CHARS = 6000
HEAVY = ("checkpoint.pt", "checkpoint.prev.pt", "checkpoint_time.json", "final_state.pt", "state")
"""What ``artifacts: results`` leaves out: the files a resume reads and the trained state."""
SWEEP_DEPTH = 4
"""How many folders up a run looks for its sweep's ``mlflow.json``."""
MISSING = (
    "mlflow.enabled: true needs the mlflow package; install it with "
    "pip install 'fedhp[mlflow]' (or set mlflow.enabled=false)"
)

_LOCK = threading.RLock()  # MLflow calls one at a time (a sweep's lockstep runs log from threads)
_CLIENTS: dict[str, Any] = {}


def require() -> None:
    """A one-line :class:`ConfigError` unless the ``mlflow`` package can be imported."""
    try:
        _mlflow()
    except ImportError:
        raise ConfigError(MISSING) from None


def _mlflow() -> Any:
    """The ``mlflow`` module, imported quietly (no telemetry, short HTTP retries, no INFO lines
    from its database setup)."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    import mlflow

    for name in ("mlflow.store.db.utils", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    return mlflow


def _client(uri: str) -> Any:
    """One MLflow client per tracking URI in this process."""
    if uri not in _CLIENTS:
        _CLIENTS[uri] = _mlflow().MlflowClient(tracking_uri=uri)
    return _CLIENTS[uri]


def default_uri(folder: Path) -> str:
    """The store beside ``folder``: ``sqlite:///<its parent>/mlflow.db``."""
    return f"sqlite:///{Path(folder).absolute().parent / DB}"


def _artifact_root(uri: str) -> str | None:
    """Where a new experiment keeps its artifacts: beside a SQLite store (``mlartifacts/``);
    elsewhere the store's own default (None)."""
    if not uri.startswith("sqlite:///"):
        return None
    db = Path(uri.removeprefix("sqlite:///"))
    return str((db.parent / ARTIFACTS).absolute())


def _absolute(uri: str) -> str:
    """A SQLite URI with an absolute path (a run in another process or folder finds it)."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return f"sqlite:///{Path(uri.removeprefix('sqlite:///')).absolute()}"
    return uri


def _warn(what: str, err: BaseException | str) -> None:
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    warnings.warn(
        f"mlflow: {what}: {text[:300]}; the run goes on without MLflow", FedhpWarning, stacklevel=3
    )


def flat_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A configuration as MLflow params: dotted keys, values as text (JSON for all but strings;
    at most :data:`PARAM_CHARS` characters)."""
    out: dict[str, str] = {}
    for key, value in config.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flat_params(value, f"{dotted}."))
            continue
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        out[dotted] = text if len(text) <= PARAM_CHARS else text[: PARAM_CHARS - 1] + "…"
    return out


def _reopened(
    client: Any, known: Mapping[str, Any] | None, uri: str, params: Mapping[str, Any]
) -> Any:
    """The MLflow run a folder's mlflow.json (``known``) names on ``uri``, set running again with
    the ``params`` it lacks logged; None where it names none there."""
    if known is None or known.get("tracking_uri") != uri or not known.get("run_id"):
        return None
    run = client.get_run(known["run_id"])
    client.update_run(run.info.run_id, status="RUNNING")
    _log_params(client, run.info.run_id, params, run.data.params)
    return run


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def _sweep_of(folder: Path) -> dict[str, Any] | None:
    """The ``mlflow.json`` of the sweep ``folder`` belongs to (a folder up to
    :data:`SWEEP_DEPTH` levels above it), or None."""
    here = Path(folder).absolute()
    for parent in list(here.parents)[:SWEEP_DEPTH]:
        data = _read_json(parent / FILE)
        if data is not None and data.get("role") == "sweep":
            return data
    return None


def _now_ms() -> int:
    return int(time.time() * 1000)


def _metric_value(value: Any) -> float | None:
    """A metrics.csv cell as an MLflow metric value (None: not a number)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _experiment_id(client: Any, name: str, uri: str) -> str:
    """The id of experiment ``name`` in the store, created (artifacts beside a SQLite store)
    if new."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        if found.lifecycle_stage == "deleted":
            client.restore_experiment(found.experiment_id)
        return str(found.experiment_id)
    return str(client.create_experiment(name, artifact_location=_artifact_root(uri)))


def _log_params(
    client: Any, run_id: str, params: Mapping[str, str], old: Mapping[str, str]
) -> None:
    """``params`` not yet on the run; a value that differs from the one logged (``rounds``
    raised on resume) goes to the tag ``fedhp.resumed.<key>`` (MLflow params are fixed)."""
    from mlflow.entities import Param, RunTag

    new = [Param(k, v) for k, v in params.items() if k not in old]
    changed = [
        RunTag(f"fedhp.resumed.{k}", v) for k, v in params.items() if k in old and old[k] != v
    ]
    for i in range(0, len(new), PARAMS_PER_BATCH):
        client.log_batch(run_id, params=new[i : i + PARAMS_PER_BATCH])
    if changed:
        client.log_batch(run_id, tags=changed)


class _Logged:
    """An MLflow run this process logs to; after a failed call it warns once and does nothing
    more (``client`` None)."""

    client: Any | None
    run_id: str
    kind = "run"

    def _fail(self, err: BaseException) -> None:
        """Warn once; nothing more goes to MLflow."""
        if self.client is not None:
            self.client = None
            _warn(f"{self.kind} {self.run_id}", err)

    def _terminate(
        self,
        status: str,
        files: Callable[[], Sequence[Path]] = list,
        metrics: Sequence[Any] = (),
        tags: Sequence[Any] = (),
    ) -> None:
        """``metrics`` and ``tags`` logged, ``files()`` (and folders) as artifacts, the run ended
        as ``status``."""
        if self.client is None:
            return
        try:
            with _LOCK:
                if metrics or tags:
                    self.client.log_batch(self.run_id, metrics=metrics, tags=tags)
                for path in files():
                    if path.is_dir():
                        self.client.log_artifacts(self.run_id, str(path), path.name)
                    else:
                        self.client.log_artifact(self.run_id, str(path))
                self.client.set_terminated(self.run_id, status)
        except Exception as err:
            self._fail(err)

    def end(self, killed: bool = False) -> None:
        """The run stopped early (``killed``: interrupted, else failed): ended as ``KILLED`` or
        ``FAILED`` (``--resume``, or starting the sweep again, reopens it)."""
        self._terminate("KILLED" if killed else "FAILED")


class Tracker(_Logged):
    """One fedhp run as one MLflow run: rows appended as the rounds go, sent in batches;
    :meth:`finish` sends the rest, the summary and the files and ends the MLflow run."""

    def __init__(
        self, client: Any, run_id: str, out_dir: Path, artifacts: str, logged_round: float
    ) -> None:
        self.client: Any | None = client
        self.run_id, self.out_dir, self.artifacts = run_id, Path(out_dir), artifacts
        self.logged_round = logged_round  # rounds up to here are in MLflow already
        self.pending: list[Any] = []
        self.last_flush = time.monotonic()

    @classmethod
    def open(
        cls,
        settings: Mapping[str, Any],
        out_dir: Path,
        config: Mapping[str, Any],
        resume: bool = False,
        rows: Iterable[Mapping[str, Any]] = (),
    ) -> Tracker | None:
        """The MLflow run of the fedhp run in ``out_dir`` (``settings``: its ``mlflow``
        options; ``config``: its resolved configuration): on ``resume`` the one its
        ``mlflow.json`` names, continued; else a new one (the child of its sweep's, if any).
        ``rows``: the rows the run already has (a resumed run's, up to its checkpoint), sent
        where MLflow lacks them. None (one warning) where MLflow cannot be used."""
        out_dir = Path(out_dir)
        sweep = _sweep_of(out_dir)
        if sweep is not None and sweep.get("disabled"):
            return None  # the sweep said why already
        uri = str(sweep["tracking_uri"]) if sweep else settings.get("tracking_uri")
        uri = _absolute(uri or default_uri(out_dir))
        try:
            with _LOCK:
                client = _client(uri)
                tracker = cls._start(client, uri, settings, out_dir, config, resume, sweep)
                tracker.extend(rows)
        except ImportError:
            raise ConfigError(MISSING) from None
        except Exception as err:  # MLflow's errors, an unreachable server, a locked database
            _warn(f"{uri}", err)
            return None
        return tracker

    @classmethod
    def _start(
        cls,
        client: Any,
        uri: str,
        settings: Mapping[str, Any],
        out_dir: Path,
        config: Mapping[str, Any],
        resume: bool,
        sweep: Mapping[str, Any] | None,
    ) -> Tracker:
        artifacts = str(settings.get("artifacts", "results"))
        params = flat_params(config)
        run = _reopened(client, _read_json(out_dir / FILE) if resume else None, uri, params)
        if run is not None:
            history = client.get_metric_history(run.info.run_id, "round")
            logged = max((m.step for m in history), default=0)
            return cls(client, run.info.run_id, out_dir, artifacts, logged)
        if sweep is not None:
            experiment = str(sweep["experiment_id"])
        else:
            experiment = _experiment_id(client, str(settings.get("experiment") or "fedhp"), uri)
        tags = {
            "fedhp.out_dir": str(out_dir.absolute()),
            "fedhp.algorithm": str((config.get("algorithm") or {}).get("name", "")),
            "fedhp.dataset": str((config.get("dataset") or {}).get("name", "")),
            "fedhp.seed": str(config.get("seed", "")),
        }
        if sweep is not None:
            tags["mlflow.parentRunId"] = str(sweep["run_id"])
            tags["fedhp.sweep"] = str(sweep.get("out_dir", ""))
        name = out_dir.name if sweep is None else _child_name(out_dir, sweep)
        run = client.create_run(experiment, tags=tags, run_name=name)
        run_id = run.info.run_id
        _log_params(client, run_id, params, {})
        _write_json(
            out_dir / FILE,
            {
                "run_id": run_id,
                "tracking_uri": uri,
                "experiment_id": experiment,
                "parent_run_id": sweep["run_id"] if sweep else None,
            },
        )
        return cls(client, run_id, out_dir, artifacts, 0)

    def append(self, row: Mapping[str, Any]) -> None:
        """One evaluated round's metrics.csv row (sent with the next batch)."""
        self.extend([row])

    def extend(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Rows to send (those of rounds MLflow has already skipped); a batch goes out once
        :data:`FLUSH_EVERY_S` seconds have passed since the last."""
        from mlflow.entities import Metric

        stamp = _now_ms()
        for row in rows:
            step = _metric_value(row.get("round"))
            if step is None or step <= self.logged_round:
                continue
            for key, value in row.items():
                number = _metric_value(value)
                if number is not None:
                    self.pending.append(Metric(str(key), number, stamp, int(step)))
        if self.pending and time.monotonic() - self.last_flush >= FLUSH_EVERY_S:
            self.flush()

    def flush(self) -> None:
        """Send the metrics held back."""
        pending, self.pending = self.pending, []
        self.last_flush = time.monotonic()
        if self.client is None or not pending:
            return
        try:
            with _LOCK:
                for i in range(0, len(pending), BATCH):
                    self.client.log_batch(self.run_id, metrics=pending[i : i + BATCH])
        except Exception as err:
            self._fail(err)

    def _files(self) -> list[Path]:
        """The run folder's files (and folders) logged as artifacts."""
        if self.artifacts == "none" or not self.out_dir.is_dir():
            return []
        skip = {FILE} | (set(HEAVY) if self.artifacts == "results" else set())
        entries = sorted(self.out_dir.iterdir())
        return [p for p in entries if p.name not in skip and not p.name.startswith(".")]

    def finish(self, summary: Mapping[str, Any] | None = None) -> None:
        """Send the rest, summary.json's numbers (``summary/<key>``) and the files; end the
        MLflow run (``FINISHED``; a diverged run's reason in the tag ``fedhp.stopped``)."""
        from mlflow.entities import Metric, RunTag

        self.flush()
        if self.client is None:
            return
        summary = summary or {}
        step = int(_metric_value(summary.get("rounds")) or 0)
        stamp = _now_ms()
        numbers = [
            Metric(f"summary/{k}", v, stamp, step)
            for k, value in summary.items()
            if (v := _metric_value(value)) is not None and math.isfinite(v)
        ]
        tags = [RunTag("fedhp.stopped", str(summary["stopped"]))] if "stopped" in summary else []
        self._terminate("FINISHED", self._files, numbers[:BATCH], tags)

    def end(self, killed: bool = False) -> None:
        """The run stopped early: what is held back sent, the MLflow run ended (see
        :meth:`_Logged.end`)."""
        self.flush()
        super().end(killed)


def _child_name(out_dir: Path, sweep: Mapping[str, Any]) -> str:
    """A sweep run's name: its folder below the sweep's (``runs/lam=15/seed0``)."""
    top = sweep.get("out_dir")
    if top:
        try:
            return str(Path(out_dir).absolute().relative_to(Path(str(top))))
        except ValueError:
            pass
    return Path(out_dir).name


def _read_metrics(path: Path) -> list[dict[str, Any]]:
    """metrics.csv's rows, numbers parsed (an empty cell left out)."""
    import csv

    rows = []
    with path.open(newline="", encoding="utf-8") as fh:
        for record in csv.DictReader(fh):
            row: dict[str, Any] = {}
            for key, text in record.items():
                if key is None or text in (None, ""):
                    continue
                try:
                    row[key] = int(text)
                except ValueError:
                    try:
                        row[key] = float(text)
                    except ValueError:
                        row[key] = text
            rows.append(row)
    return rows


def log_finished_run(folder: Path) -> bool:
    """A finished run folder of a sweep that has no MLflow run yet (it finished before the sweep
    logged to MLflow) logged from its files — ``config.yaml``, ``metrics.csv``,
    ``summary.json`` — as a child of the sweep's run; whether it was logged."""
    import yaml

    folder = Path(folder)
    sweep = _sweep_of(folder)
    known = _read_json(folder / FILE)
    if sweep is None or sweep.get("disabled") or not (folder / "summary.json").is_file():
        return False
    if known is not None and known.get("tracking_uri") == sweep.get("tracking_uri"):
        return False  # logged already
    try:
        config = yaml.safe_load((folder / "config.yaml").read_text()) or {}
        summary = json.loads((folder / "summary.json").read_text())
        rows = _read_metrics(folder / "metrics.csv")
    except (OSError, ValueError, yaml.YAMLError):
        return False
    section = config.get("mlflow")
    artifacts = section.get("artifacts") if isinstance(section, Mapping) else None
    settings = {"artifacts": artifacts or "results"}
    tracker = Tracker.open(settings, folder, config, False, rows)
    if tracker is None:
        return False
    tracker.finish(summary)
    return tracker.client is not None


class SweepTracker(_Logged):
    """A sweep as an MLflow parent run: created (or, for a sweep started again, reopened)
    before its runs start, so that they log as its children; :meth:`finish` adds the tables
    and figures and ends it."""

    kind = "sweep run"

    def __init__(self, client: Any | None, run_id: str, folder: Path) -> None:
        self.client, self.run_id, self.folder = client, run_id, Path(folder)

    @classmethod
    def open(
        cls,
        settings: Mapping[str, Any],
        folder: Path,
        params: Mapping[str, Any],
        tags: Mapping[str, str],
    ) -> SweepTracker | None:
        """The parent run of the sweep in ``folder`` (``params``: what does not change as the
        sweep grows, e.g. its base configuration; ``tags``: what may, e.g. its grid and
        seeds). None (one warning, and a note in ``mlflow.json`` that keeps its runs from
        trying) where MLflow cannot be used."""
        folder = Path(folder).absolute()
        uri = _absolute(settings.get("tracking_uri") or default_uri(folder))
        folder.mkdir(parents=True, exist_ok=True)
        try:
            with _LOCK:
                client = _client(uri)
                name = str(settings.get("experiment") or "fedhp")
                run_id, experiment = cls._open(client, uri, name, folder, params)
                client.log_batch(run_id, tags=_tags(tags))
        except ImportError:
            raise ConfigError(MISSING) from None
        except Exception as err:
            _warn(uri, err)
            _write_json(folder / FILE, {"role": "sweep", "disabled": str(err)[:300]})
            return None
        _write_json(
            folder / FILE,
            {
                "role": "sweep",
                "run_id": run_id,
                "tracking_uri": uri,
                "experiment_id": experiment,
                "out_dir": str(folder),
            },
        )
        return cls(client, run_id, folder)

    @staticmethod
    def _open(
        client: Any, uri: str, name: str, folder: Path, params: Mapping[str, Any]
    ) -> tuple[str, str]:
        """The sweep's parent run (the one ``folder``'s mlflow.json names, or a new one in
        experiment ``name``) and its experiment id."""
        known = _read_json(folder / FILE)
        flat = flat_params(params)
        run = _reopened(client, known, uri, flat)
        if run is not None and known is not None:
            return run.info.run_id, str(known["experiment_id"])
        experiment = _experiment_id(client, name, uri)
        tags = {"fedhp.out_dir": str(folder), "fedhp.kind": "sweep"}
        run = client.create_run(experiment, tags=tags, run_name=folder.name)
        _log_params(client, run.info.run_id, flat, {})
        return run.info.run_id, experiment

    def finish(self, files: Sequence[Path], tags: Mapping[str, str] | None = None) -> None:
        """``files`` (the tables, the figures, the manifest) as artifacts, ``tags`` (the
        selected point) set; the parent run ended as ``FINISHED``."""
        kept = [Path(path) for path in files if Path(path).is_file()]
        self._terminate("FINISHED", lambda: kept, tags=_tags(tags or {}))


def _tags(tags: Mapping[str, str]) -> list[Any]:
    from mlflow.entities import RunTag

    return [RunTag(k, str(v)[:PARAM_CHARS]) for k, v in tags.items()]
