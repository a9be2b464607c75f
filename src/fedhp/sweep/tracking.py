"""A sweep in MLflow (``mlflow.enabled=true`` in its base configuration): one parent run, opened
before the sweep's runs start so that each logs as its child (:mod:`fedhp.mlflow_tracking`), and
given the sweep's tables, figures, manifest and log as artifacts at the end; the runs that had
finished before the sweep logged to MLflow are logged then, from their files, as children too.
Its params: the base configuration less the seed and the grid's keys (what every run shares);
its tags: the grid, the seeds, the selection and the selected point (what may change as a sweep
grows)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedhp.mlflow_tracking import SweepTracker, log_finished_run

if TYPE_CHECKING:
    from fedhp.sweep.run import SweepSpec

__all__ = ["SweepRun", "open_sweep_tracking"]


class SweepRun:
    """The MLflow parent run of a sweep (:func:`open_sweep_tracking`)."""

    def __init__(self, tracker: SweepTracker, spec: SweepSpec) -> None:
        self.tracker, self.spec = tracker, spec

    def finish(self, manifest: Mapping[str, Any], written: Sequence[Path]) -> None:
        """The report's files, the manifest and the log as artifacts; the selected point as
        tags; the parent run ended."""
        out = self.spec.out
        for entry in manifest.get("runs") or []:  # runs finished before MLflow was switched on
            log_finished_run(out / str(entry.get("out_dir")))
        files = [*written, out / "sweep.json", out / "sweep.log"]
        tags = _tags(self.spec)
        selected = manifest.get("selected")
        if isinstance(selected, Mapping):
            tags["fedhp.selected"] = str(selected.get("point"))
            tags["fedhp.selected_score"] = str(selected.get("score"))
        self.tracker.finish(files, tags)

    def end(self, killed: bool = False) -> None:
        """The sweep stopped early (see :meth:`SweepTracker.end`)."""
        self.tracker.end(killed)


def _tags(spec: SweepSpec) -> dict[str, str]:
    return {
        "fedhp.kind": "sweep",
        "fedhp.grid": json.dumps(spec.grid, default=str),
        "fedhp.seeds": json.dumps(spec.seeds),
        "fedhp.select": str(spec.select or ""),
        "fedhp.base": " ".join(spec.base),
    }


def open_sweep_tracking(spec: SweepSpec) -> SweepRun | None:
    """The sweep's parent run in MLflow, where its base configuration sets ``mlflow.enabled``
    (None otherwise, or where MLflow cannot be used: one warning, and the runs do not try)."""
    from fedhp.config import config_to_dict, resolve_config

    cfg = resolve_config(None, list(spec.base), plugins=spec.plugins)
    if not cfg.mlflow.enabled:
        return None
    settings = {"tracking_uri": cfg.mlflow.tracking_uri, "experiment": cfg.mlflow.experiment}
    shared = {k: v for k, v in config_to_dict(cfg).items() if k not in ("seed", "mlflow")}
    from fedhp.mlflow_tracking import flat_params

    params = {k: v for k, v in flat_params(shared).items() if k not in spec.grid}
    tracker = SweepTracker.open(settings, spec.out, params, _tags(spec))
    return None if tracker is None else SweepRun(tracker, spec)
