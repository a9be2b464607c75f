"""Tests for fedhp.reporting: atomic writers, metrics.csv resume, plots."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import yaml

from fedhp.reporting import (
    MetricsWriter,
    plot_curves,
    plot_run,
    write_json_atomic,
    write_yaml_atomic,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames or []), list(reader)


def _no_tmp_files(folder: Path) -> bool:
    return not any(p.name.endswith(".tmp") for p in folder.iterdir())


def test_header_is_union_with_round_first(tmp_path: Path) -> None:
    w = MetricsWriter(tmp_path)
    w.append({"global_acc": 0.5, "round": 0})
    w.append({"round": 1, "global_acc": 0.6, "personal_acc": 0.7, "phase": "train"})
    header, rows = _read_csv(tmp_path / "metrics.csv")
    assert header == ["round", "global_acc", "personal_acc", "phase"]
    assert rows[0] == {"round": "0", "global_acc": "0.5", "personal_acc": "", "phase": ""}
    assert rows[1]["phase"] == "train"
    assert _no_tmp_files(tmp_path)


def test_resume_drops_later_rows_and_keeps_types(tmp_path: Path) -> None:
    path = tmp_path / "run" / "metrics.csv"
    w = MetricsWriter(path)
    for r in range(5):
        w.append({"round": r, "loss": 1.0 / (r + 1), "cum_bytes_total": 100 * r})
    w.append({"round": 5, "loss": float("nan")})
    resumed = MetricsWriter.resume(path, round=2)
    assert [row["round"] for row in resumed.rows] == [0, 1, 2]
    assert resumed.rows[1]["loss"] == 0.5 and resumed.rows[2]["cum_bytes_total"] == 200
    # the file is trimmed on resume, before any new row
    assert [row["round"] for row in _read_csv(path)[1]] == ["0", "1", "2"]
    resumed.append({"round": 3, "loss": 0.1})
    header, rows = _read_csv(path)
    assert [row["round"] for row in rows] == ["0", "1", "2", "3"]
    assert header == ["round", "loss", "cum_bytes_total"]
    assert rows[3]["cum_bytes_total"] == ""


def test_resume_missing_file_and_nan(tmp_path: Path) -> None:
    w = MetricsWriter.resume(tmp_path / "metrics.csv", round=10)
    assert w.rows == []
    w.append({"round": 0, "x": float("nan")})
    again = MetricsWriter.resume(tmp_path / "metrics.csv", round=10)
    assert math.isnan(float(again.rows[0]["x"]))


def test_failed_write_keeps_old_file(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    write_json_atomic(path, {"ok": 1})
    with pytest.raises(TypeError):
        write_json_atomic(path, {"bad": object()})
    assert json.loads(path.read_text()) == {"ok": 1}
    assert _no_tmp_files(tmp_path)


def test_json_and_yaml_roundtrip(tmp_path: Path) -> None:
    import numpy as np
    import torch

    obj = {"b": 1, "a": [1.5, "x"], "arr": np.arange(3), "t": torch.tensor(2.0), "p": tmp_path}
    write_json_atomic(tmp_path / "out" / "s.json", obj)
    loaded = json.loads((tmp_path / "out" / "s.json").read_text())
    assert loaded == {"b": 1, "a": [1.5, "x"], "arr": [0, 1, 2], "t": 2.0, "p": str(tmp_path)}
    cfg = {"z": 1, "a": {"lr": 0.05, "name": "sfedhp"}}
    write_yaml_atomic(tmp_path / "config.yaml", cfg)
    text = (tmp_path / "config.yaml").read_text()
    assert yaml.safe_load(text) == cfg
    assert text.index("z:") < text.index("a:")  # insertion order kept


def test_plot_run_with_missing_and_nan(tmp_path: Path) -> None:
    rows: list[dict[str, float | int | str]] = [
        {"round": 0, "global_acc": 0.1, "personal_acc": float("nan"), "cum_bytes_total": 1e6},
        {"round": 1, "global_acc": 0.5, "cum_bytes_total": 2e6, "cum_bytes_edge_cloud": ""},
        {"round": 2, "global_acc": 0.7, "personal_acc": 0.8, "cum_bytes_total": 3e6},
    ]
    out = tmp_path / "plots" / "run.png"
    plot_run(rows, out, "test run")
    assert out.read_bytes()[:8] == PNG_MAGIC
    plot_run([], tmp_path / "empty.png", "empty")
    assert (tmp_path / "empty.png").read_bytes()[:8] == PNG_MAGIC
    # rows read back from a csv (strings) also work
    w = MetricsWriter(tmp_path)
    for row in rows:
        w.append(row)
    plot_run(MetricsWriter.resume(tmp_path, round=99).rows, tmp_path / "again.png", "csv")
    assert (tmp_path / "again.png").stat().st_size > 1000


def test_plot_curves(tmp_path: Path) -> None:
    out = tmp_path / "fig.png"
    plot_curves(
        {"sFedHP": ([0, 1, 2], [0.5, 0.7, 0.9]), "pFedMe": ([0, 1, 2], [0.4, 0.6, 0.8])},
        out,
        xlabel="round",
        ylabel="accuracy",
        title="MNIST",
    )
    assert out.read_bytes()[:8] == PNG_MAGIC
    assert _no_tmp_files(tmp_path)
