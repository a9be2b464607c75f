"""Tests for fedhp.reporting: atomic writers, metrics.csv resume, plots."""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path

import pytest
import yaml
from matplotlib.figure import Figure

from fedhp.reporting import (
    Line,
    MetricsWriter,
    column_label,
    draw_lines,
    plot_curves,
    plot_lines,
    plot_run,
    read_rows,
    run_figure,
    write_json_atomic,
    write_text_atomic,
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


def test_throttled_writer_holds_rows_until_flush_and_writes_the_same_bytes(
    tmp_path: Path,
) -> None:
    """With ``min_interval`` the file is rewritten at most that often (the first append at once);
    :meth:`flush` writes what is held back; the final bytes equal an unthrottled writer's, new
    columns and quoted cells included."""
    rows: list[dict[str, float | int | str]] = [
        {"round": 1, "loss": 0.5},
        {"round": 2, "loss": 1 / 3, "note": 'a "quoted", cell'},
        {"round": 3, "loss": float("nan"), "acc": 0.25},
    ]
    plain, held = MetricsWriter(tmp_path / "plain.csv"), MetricsWriter(tmp_path / "held.csv", 1e9)
    plain.append(rows[0])
    held.append(rows[0])
    assert (tmp_path / "held.csv").read_bytes() == (tmp_path / "plain.csv").read_bytes()
    for row in rows[1:]:
        plain.append(row)
        held.extend([row])
    assert [r["round"] for r in _read_csv(tmp_path / "held.csv")[1]] == ["1"]  # held back
    held.flush()
    assert (tmp_path / "held.csv").read_bytes() == (tmp_path / "plain.csv").read_bytes()
    assert _read_csv(tmp_path / "held.csv")[0] == ["round", "loss", "note", "acc"]
    held.append({"round": 4, "loss": 0.1})
    resumed = MetricsWriter.resume(tmp_path / "held.csv", round=10, min_interval=1e9)
    assert [r["round"] for r in resumed.rows] == [1, 2, 3]  # round 4 never reached the file
    assert (tmp_path / "held.csv").read_bytes() == (tmp_path / "plain.csv").read_bytes()
    assert _no_tmp_files(tmp_path)


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


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_result_files_respect_the_umask(tmp_path: Path, umask: int) -> None:
    """Files are created like any other file of the user: 0666 minus the umask (not 0600)."""
    old = os.umask(umask)
    try:
        write_json_atomic(tmp_path / "a.json", {"x": 1})
        MetricsWriter(tmp_path).append({"round": 1, "acc": 0.5})
        plot_curves({"a": ([0, 1], [0.1, 0.2])}, tmp_path / "p.png", "x", "y", "t")
    finally:
        os.umask(old)
    for name in ("a.json", "metrics.csv", "p.png"):
        assert (tmp_path / name).stat().st_mode & 0o777 == 0o666 & ~umask, name
    assert _no_tmp_files(tmp_path)


def _run_rows(edges: int = 4) -> list[dict[str, float | int]]:
    rows = []
    for r in range(1, 6):
        row: dict[str, float | int] = {
            "round": r,
            "global_acc": 0.5 + r / 20,
            "personal_acc": 0.6 + r / 20,
            "train_loss": 1 / r,
            "local_loss": 1.2 / r,
            "cum_bytes_client_edge": 3e7 * r,
            "cum_bytes_edge_cloud": 6e5 * r,  # 50x smaller: invisible on a linear axis
            "cum_bytes_total": 3.06e7 * r,
        }
        for e in range(edges):
            row[f"edge{e}_global_acc"] = 0.5 + r / 20 + e / 100
            row[f"edge{e}_personal_acc"] = 0.6 + r / 20 - e / 100
        rows.append(row)
    return rows


def test_run_figure_panels() -> None:
    """Accuracy: global/personalized bold, per-edge thin (optional); communication: one line per
    link on a log axis; losses in their own panel."""
    fig = run_figure(_run_rows(), "t")
    acc, comm, loss = fig.axes
    widths = {line.get_label(): line.get_linewidth() for line in acc.get_lines()}
    bold = [w for label, w in widths.items() if label.endswith("all clients")]
    assert len(acc.get_lines()) == 2 + 2 * 4 and len(bold) == 2
    thin = [line.get_linewidth() for line in acc.get_lines() if line.get_linewidth() < 1]
    assert len(thin) == 8 and min(bold) > 2 * max(thin)
    assert comm.get_yscale() == "log"
    assert sorted(line.get_label() for line in comm.get_lines()) == [
        "client ↔ edge",
        "edge ↔ cloud",
    ]
    assert sorted(line.get_label() for line in loss.get_lines()) == [
        "clients' minibatches during the round",
        "global model, training data",
    ]
    without_edges = run_figure(_run_rows(), "t", per_edge=False).axes[0]
    assert len(without_edges.get_lines()) == 2


def test_round_axes_have_integer_ticks() -> None:
    """Two rounds: ticks at 1 and 2 only (matplotlib alone puts ticks at 1.25, 1.5, 1.75)."""
    rows = _run_rows()[:2]
    for ax in run_figure(rows, "t").axes:
        ticks = [t for t in ax.get_xticks() if 1 <= t <= 2]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks
    fig = Figure()
    ax = fig.subplots()
    draw_lines(ax, [Line("a", [0.5, 0.75, 1.0], [1, 2, 3])], "MB", "acc")  # not rounds
    assert any(not float(t).is_integer() for t in ax.get_xticks())


def test_columns_in_words() -> None:
    assert column_label("global_acc") == "global model, test accuracy"
    assert column_label("edge2_personal_acc") == (
        "personalized models, test accuracy on edge 2's clients"
    )
    assert column_label("cum_remark1_bits_client_edge_up") == (
        "bits (Remark 1) accumulated, client ↔ edge, uplink"
    )
    assert column_label("round_bytes_total") == "bytes this round, all links"
    assert column_label("something_new") == "something_new"


def test_plot_lines_band_and_read_rows(tmp_path: Path) -> None:
    lines = [Line("a", [1, 2, 3], [0.1, 0.2, 0.3], std=[0.01, 0.02, 0.0]), Line("b", [1], [0.5])]
    plot_lines(lines, tmp_path / "l.png", "round", "acc", "title")
    assert (tmp_path / "l.png").read_bytes()[:8] == PNG_MAGIC
    write_text_atomic(tmp_path / "m.csv", "round,acc,name\n1,0.5,x\n2,,y\n")
    assert read_rows(tmp_path / "m.csv") == [
        {"round": 1, "acc": 0.5, "name": "x"},
        {"round": 2, "name": "y"},
    ]
