"""``mlflow.enabled=true`` (issue 55; :mod:`fedhp.mlflow_tracking`), checked with MLflow's own
client reading back what was logged: a run's config as params, every metrics.csv column at every
round as a metric (step = round) equal to metrics.csv, its files as artifacts; a resumed run
continues the same MLflow run without logging a round twice; a sweep is a parent run with its
runs as children and its table and figures as artifacts; an unreachable MLflow is one warning
and the run goes on; bad options are one-line errors."""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedhp.cli import main

if importlib.util.find_spec("mlflow") is None:  # (CI installs it: make installs fedhp[mlflow])
    pytest.skip("the optional mlflow package is absent", allow_module_level=True)

import mlflow
from mlflow import MlflowClient

FAST = [
    "progress=false",
    "threads=1",
    "model.name=mlr",
    "eval_train=false",
    "eval_every=1",
    "algorithm.name=fedavg",
    "algorithm.local_steps=1",
    "algorithm.batch_size=8",
    "federation.num_clients=4",
    "federation.num_edges=2",
    "subsample.train=400",
    "subsample.test=200",
    "partition.train_per_class=8",
    "partition.test_per_class=4",
]


def _uri(folder: Path) -> str:
    return f"sqlite:///{folder / 'mlflow.db'}"


def _runs(uri: str) -> list[Any]:
    """Every run in the store's ``fedhp`` experiment, through ``mlflow.search_runs``."""
    mlflow.set_tracking_uri(uri)
    try:
        return list(mlflow.search_runs(experiment_names=["fedhp"], output_format="list"))
    finally:
        mlflow.set_tracking_uri(None)


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def _assert_metrics_equal_csv(client: MlflowClient, run_id: str, folder: Path) -> None:
    """Every metrics.csv column at every round: exactly one MLflow value at that step, equal to
    the CSV's (and no step the CSV lacks)."""
    rows = _csv(folder / "metrics.csv")
    assert rows
    for column in rows[0]:
        history = client.get_metric_history(run_id, column)
        steps = [m.step for m in history]
        assert len(steps) == len(set(steps)), f"{column}: a round logged twice"
        logged = {m.step: m.value for m in history}
        expected = {int(r["round"]): float(r[column]) for r in rows if r[column] != ""}
        assert logged == expected, column


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``fedhp run --out <tmp>/runs/a ... mlflow.enabled=true``: the run folder."""
    root = tmp_path_factory.mktemp("mlflow")
    folder = root / "runs" / "a"
    argv = ["run", "--out", str(folder), *FAST, "rounds=3", "mlflow.enabled=true"]
    assert main(argv) == 0
    return folder


def test_a_run_in_mlflow(logged_run: Path) -> None:
    """The default store is runs/mlflow.db beside the run folder; the run is FINISHED, named
    after its folder, its params the resolved config.yaml, its metrics metrics.csv, its files
    the results but the checkpoints."""
    (run,) = _runs(_uri(logged_run.parent))
    client = MlflowClient(_uri(logged_run.parent))
    assert run.info.status == "FINISHED" and run.info.run_name == "a"
    assert json.loads((logged_run / "mlflow.json").read_text())["run_id"] == run.info.run_id
    config = yaml.safe_load((logged_run / "config.yaml").read_text())
    expected = {k: v if isinstance(v, str) else json.dumps(v) for k, v in _flat(config).items()}
    assert run.data.params == expected
    _assert_metrics_equal_csv(client, run.info.run_id, logged_run)
    summary = json.loads((logged_run / "summary.json").read_text())
    assert run.data.metrics["summary/final_global_acc"] == summary["final_global_acc"]
    artifacts = sorted(a.path for a in client.list_artifacts(run.info.run_id))
    assert artifacts == [
        "config.yaml",
        "metrics.csv",
        "per_client.csv",
        "plot.png",
        "summary.json",
        "timings.csv",
    ]
    assert run.info.artifact_uri.startswith(str(logged_run.parent / "mlartifacts"))


def test_resume_continues_the_same_mlflow_run(tmp_path: Path) -> None:
    """A run stopped after round 3 (checkpoint at 2), then resumed to round 5 with
    ``fedhp run --resume``: one MLflow run, FINISHED, each round logged once and equal to
    metrics.csv; the raised rounds noted as a tag (MLflow params are fixed)."""
    from fedhp.api import prepare, run_built
    from fedhp.config import resolve_config

    folder = tmp_path / "runs" / "r"
    cfg = resolve_config(None, [*FAST, "rounds=4", "checkpoint_every=2", "mlflow.enabled=true"])

    def stop(done: int) -> None:
        if done == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_built(prepare(cfg), folder, on_round=stop)
    (killed,) = _runs(_uri(folder.parent))
    assert killed.info.status == "KILLED"
    assert main(["run", "--resume", str(folder), "rounds=5"]) == 0
    (run,) = _runs(_uri(folder.parent))
    assert run.info.run_id == killed.info.run_id and run.info.status == "FINISHED"
    client = MlflowClient(_uri(folder.parent))
    _assert_metrics_equal_csv(client, run.info.run_id, folder)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "round")] == [1, 2, 3, 4, 5]
    assert run.data.params["rounds"] == "4" and run.data.tags["fedhp.resumed.rounds"] == "5"


def test_a_sweep_is_a_parent_run_with_its_runs_as_children(tmp_path: Path) -> None:
    out = tmp_path / "sweeps" / "lr"
    argv = [
        "sweep",
        *FAST,
        "rounds=2",
        "mlflow.enabled=true",
        "--grid",
        "algorithm.lr=0.05,0.1",
        "--seeds",
        "0,1",
        "--out",
        str(out),
        "--format",
        "pdf",
    ]
    assert main(argv) == 0
    runs = _runs(_uri(out.parent))
    client = MlflowClient(_uri(out.parent))
    (parent,) = [r for r in runs if r.data.tags.get("fedhp.kind") == "sweep"]
    children = [r for r in runs if r is not parent]
    assert parent.info.status == "FINISHED" and parent.info.run_name == "lr"
    assert parent.data.tags["fedhp.grid"] == json.dumps({"algorithm.lr": [0.05, 0.1]})
    assert "algorithm.lr" not in parent.data.params and "seed" not in parent.data.params
    assert parent.data.params["rounds"] == "2"
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"table.md", "table.csv", "curves.png", "curves.pdf", "sweep.json"} <= artifacts
    manifest = json.loads((out / "sweep.json").read_text())
    assert sorted(r.info.run_name for r in children) == sorted(
        e["out_dir"] for e in manifest["runs"]
    )
    for child in children:
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert child.info.status == "FINISHED"
        folder = out / child.info.run_name
        assert child.data.params["algorithm.lr"] == str(
            yaml.safe_load((folder / "config.yaml").read_text())["algorithm"]["lr"]
        )
        _assert_metrics_equal_csv(client, child.info.run_id, folder)


def test_a_finished_sweep_started_again_with_mlflow_logs_its_runs_from_their_files(
    tmp_path: Path,
) -> None:
    """``mlflow`` changes no run: the same sweep started again with ``mlflow.enabled=true``
    runs nothing again, and its parent run gets the runs finished before as children, logged
    from their files (metrics equal to metrics.csv)."""
    out = tmp_path / "sweeps" / "s"
    argv = ["sweep", *FAST, "rounds=2", "--seeds", "0,1", "--out", str(out)]
    assert main(argv) == 0
    before = {p: p.stat().st_mtime_ns for p in out.glob("runs/*/seed*/metrics.csv")}
    assert len(before) == 2 and not (out / "mlflow.json").exists()
    assert main([*argv, "mlflow.enabled=true"]) == 0
    assert {p: p.stat().st_mtime_ns for p in out.glob("runs/*/seed*/metrics.csv")} == before
    runs = _runs(_uri(out.parent))
    client = MlflowClient(_uri(out.parent))
    (parent,) = [r for r in runs if r.data.tags.get("fedhp.kind") == "sweep"]
    children = [r for r in runs if r is not parent]
    assert len(children) == 2
    for child in children:
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert child.info.status == "FINISHED"
        _assert_metrics_equal_csv(client, child.info.run_id, out / child.info.run_name)
    assert main([*argv, "mlflow.enabled=true"]) == 0  # again: nothing logged twice
    assert len(_runs(_uri(out.parent))) == 3


def test_unreachable_mlflow_is_one_warning_and_the_run_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No server at the URI: one ``fedhp: warning:`` line, for a run and for a whole sweep;
    the results are written as without MLflow."""
    dead = ["mlflow.enabled=true", "mlflow.tracking_uri=http://127.0.0.1:9"]
    capsys.readouterr()
    assert main(["run", "--out", str(tmp_path / "run"), *FAST, "rounds=2", *dead]) == 0
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if "mlflow" in x]
    assert len(lines) == 1 and lines[0].startswith("fedhp: warning: mlflow: http://127.0.0.1:9")
    assert "the run goes on without MLflow" in lines[0]
    assert len(_csv(tmp_path / "run" / "metrics.csv")) == 2
    out = tmp_path / "sweep"
    argv = ["sweep", *FAST, "rounds=2", *dead, "--seeds", "0,1", "--out", str(out)]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert len([x for x in err.splitlines() if "mlflow" in x]) == 1
    assert (out / "table.md").is_file()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("mlflow.tracking_uri=runs/x.db", "mlflow.tracking_uri"),
        ("mlflow.artifacts=some", "mlflow.artifacts"),
        ("mlflow.experiment=", "mlflow.experiment"),
        ("mlflow.enabled=maybe", "mlflow.enabled"),
    ],
)
def test_bad_options_are_one_line_errors(
    override: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    enabled = [] if override.startswith("mlflow.enabled") else ["mlflow.enabled=true"]
    argv = ["run", "--check", *FAST, *enabled, override]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_options_without_enabled_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["run", "--check", *FAST, "mlflow.experiment=mine"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "mlflow.experiment is not read by this run" in err and "mlflow.enabled=true" in err


def test_without_the_package_a_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from fedhp.errors import ConfigError
    from fedhp.mlflow_tracking import require

    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(ConfigError, match=r"pip install 'fedhp\[mlflow\]'"):
        require()
