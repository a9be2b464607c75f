"""The sweep's report (:mod:`fedhp.sweep.report`) on hand-made sweep folders: mean ± standard
error over seeds per grid point in the manifest's order, unfinished and diverged runs, the
selected point's marker, the validation table, the curves and :func:`load_table`."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from fedhp.errors import ConfigError
from fedhp.sweep.report import load_table, table_rows, write_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
BASE = ["rounds=10", "eval_every=5"]


def _se(values: Sequence[float]) -> float:
    return statistics.stdev(values) / math.sqrt(len(values))


def _write_run(
    folder: Path,
    accs: Sequence[float] | None,
    *,
    personal: bool = True,
    rounds: Sequence[int] = (5, 10),
    stopped: bool = False,
    seconds: float = 2.0,
    mb_per_round: float = 1.0,
) -> None:
    """A run folder: config.yaml, metrics.csv (global_acc, personal_acc = global + 0.05,
    cum_bytes_total) and, unless ``accs`` is None (unfinished), summary.json. ``accs``: the
    global accuracy at each of ``rounds``."""
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text("rounds: 10\n")
    values = list(accs) if accs is not None else [0.5 for _ in rounds]
    cols = ["round", "global_acc", *(["personal_acc"] if personal else []), "cum_bytes_total"]
    lines = [",".join(cols)]
    for r, acc in zip(rounds, values, strict=True):
        cells = [str(r), repr(acc), *([repr(acc + 0.05)] if personal else [])]
        lines.append(",".join([*cells, repr(r * mb_per_round * 1e6)]))
    (folder / "metrics.csv").write_text("\n".join(lines) + "\n")
    if accs is None:
        return
    best = max(range(len(values)), key=lambda i: values[i])
    summary: dict[str, Any] = {
        "algorithm": "sfedhp",
        "rounds": rounds[-1],
        "seconds": seconds,
        "final_global_acc": values[-1],
        "best_global_acc": values[best],
        "best_global_acc_round": rounds[best],
    }
    if personal:
        summary.update(
            final_personal_acc=values[-1] + 0.05,
            best_personal_acc=values[best] + 0.05,
            best_personal_acc_round=rounds[best],
        )
    if stopped:
        summary["stopped"] = "diverged: loss is NaN at round 7"
    (folder / "summary.json").write_text(json.dumps(summary))


def _entry(point: str, values: dict[str, Any], seed: int, split: str, sub: str) -> dict[str, Any]:
    return {
        "point": point,
        "values": values,
        "seed": seed,
        "split": split,
        "overrides": [*BASE, f"seed={seed}", f"eval_split={split}"],
        "out_dir": f"{sub}/{point}/seed{seed}",
        "rounds": 10,
        "plugins": [],
    }


def _manifest(
    runs: list[dict[str, Any]],
    grid: dict[str, list[Any]],
    seeds: Sequence[int] = (0, 1, 2),
    select: str | None = None,
    selected: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "version": 1,
        "base": BASE,
        "plugins": [],
        "grid": grid,
        "seeds": list(seeds),
        "select": select,
        "metric": "final_global_acc",
        "runs": runs,
        "selected": selected,
    }


LAM15 = {0: [0.70, 0.80], 1: [0.74, 0.82], 2: [0.72, 0.87]}


@pytest.fixture
def plain(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """Grid algorithm.lam = 20, 15 (20 first: the manifest's order, not sorted): λ=15 has three
    finished seeds; λ=20 one finished, one diverged after round 5, one unfinished."""
    runs = []
    for seed in (0, 1, 2):
        runs.append(_entry("algorithm.lam=20", {"algorithm.lam": 20}, seed, "test", "runs"))
    for seed in (0, 1, 2):
        runs.append(_entry("algorithm.lam=15", {"algorithm.lam": 15}, seed, "test", "runs"))
    for seed, accs in LAM15.items():
        _write_run(tmp_path / f"runs/algorithm.lam=15/seed{seed}", accs, seconds=2.0 + seed)
    _write_run(tmp_path / "runs/algorithm.lam=20/seed0", [0.6, 0.9], mb_per_round=2.0)
    _write_run(tmp_path / "runs/algorithm.lam=20/seed1", [0.5], rounds=(5,), stopped=True)
    _write_run(tmp_path / "runs/algorithm.lam=20/seed2", None)
    manifest = _manifest(runs, {"algorithm.lam": [20, 15]})
    (tmp_path / "sweep.json").write_text(json.dumps(manifest))
    return tmp_path, manifest


def test_means_ses_order_and_files(plain: tuple[Path, dict[str, Any]]) -> None:
    folder, manifest = plain
    written = write_report(folder, manifest)
    assert [p.name for p in written] == ["table.md", "table.csv", "curves.png"]
    assert (folder / "curves.png").read_bytes()[:8] == PNG_MAGIC
    assert not (folder / "val_table.md").exists()

    rows = load_table(folder)
    assert rows == table_rows(folder, manifest)  # the CSV holds the computed rows exactly
    assert [r["point"] for r in rows] == ["algorithm.lam=20", "algorithm.lam=15"]
    assert [r["algorithm.lam"] for r in rows] == [20, 15]
    lam20, lam15 = rows

    finals = [a[-1] for a in LAM15.values()]
    assert lam15["n"] == 3 and lam15["runs"] == 3 and lam15["stopped"] == 0
    assert lam15["final_global_acc_mean"] == pytest.approx(statistics.fmean(finals))
    assert lam15["final_global_acc_se"] == pytest.approx(_se(finals))
    assert lam15["final_personal_acc_mean"] == pytest.approx(statistics.fmean(finals) + 0.05)
    assert lam15["best_global_acc_round"] == 10
    assert lam15["mb_total"] == pytest.approx(10.0)  # the last row's cum_bytes_total, in MB
    assert lam15["seconds"] == pytest.approx(3.0)
    assert lam15["selected"] is False

    # λ=20: seed 0 finished, seed 1 diverged (counted, flagged), seed 2 unfinished (left out).
    assert lam20["n"] == 2 and lam20["runs"] == 3 and lam20["stopped"] == 1
    assert lam20["final_global_acc_mean"] == pytest.approx(0.7)
    assert lam20["final_global_acc_se"] == pytest.approx(_se([0.9, 0.5]))
    assert lam20["best_global_acc_round"] == pytest.approx(7.5)  # rounds 10 and 5
    assert lam20["mb_total"] == pytest.approx((20.0 + 5.0) / 2)

    md = (folder / "table.md").read_text()
    assert "`rounds=10` `eval_every=5`" in md
    assert "seeds: 0, 1, 2" in md
    assert "unfinished: 1 run" in md
    assert "selected" not in md and "✓" not in md  # no selection in this sweep
    table = [line for line in md.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| algorithm.lam | n | final_global_acc (%)")
    assert table[1].startswith("| 20 | 2/3 | 70.00 ± 20.00 |")
    mean15, se15 = 100 * statistics.fmean(finals), 100 * _se(finals)
    assert table[2].startswith(f"| 15 | 3 | {mean15:.2f} ± {se15:.2f} |")
    assert table[1].endswith("| 1 |") and table[2].endswith("| 0 |")  # stopped


def test_selected_point_and_val_table(tmp_path: Path) -> None:
    """select=val: every point on val, the selected point's test runs; both tables mark it."""
    grid = {"algorithm.lr": [0.01, 1e-05], "model.hidden": [[100], [50, 50]]}
    points = [
        ({"algorithm.lr": lr, "model.hidden": h}, f"algorithm.lr={lr},model.hidden={json.dumps(h)}")
        for lr in grid["algorithm.lr"]
        for h in grid["model.hidden"]
    ]
    runs = []
    for i, (values, pid) in enumerate(points):
        for seed in (0, 1):
            runs.append(_entry(pid, values, seed, "val", "val"))
            _write_run(tmp_path / f"val/{pid}/seed{seed}", [0.5, 0.6 + 0.05 * i + 0.01 * seed])
    chosen_values, chosen = points[3]
    for seed in (0, 1):
        runs.append(_entry(chosen, chosen_values, seed, "test", "test"))
        _write_run(tmp_path / f"test/{chosen}/seed{seed}", [0.5, 0.8 + 0.02 * seed])
    selected = {"point": chosen, "values": chosen_values, "score": 0.755}
    manifest = _manifest(runs, grid, seeds=(0, 1), select="val", selected=selected)
    (tmp_path / "sweep.json").write_text(json.dumps(manifest))

    written = write_report(tmp_path, manifest)
    assert [p.name for p in written] == [
        "table.md",
        "table.csv",
        "curves.png",
        "val_table.md",
        "val_table.csv",
        "val_curves.png",
    ]
    for png in ("curves.png", "val_curves.png"):
        assert (tmp_path / png).read_bytes()[:8] == PNG_MAGIC

    rows = load_table(tmp_path)
    assert len(rows) == 1
    assert rows[0]["point"] == chosen and rows[0]["selected"] is True
    assert rows[0]["algorithm.lr"] == 1e-05 and rows[0]["model.hidden"] == [50, 50]
    assert rows[0]["final_global_acc_mean"] == pytest.approx(0.81)
    assert rows[0]["final_global_acc_se"] == pytest.approx(0.01)

    md = (tmp_path / "table.md").read_text()
    assert (
        f"selected on the validation split by the mean `final_global_acc` over seeds: **{chosen}**"
        in md
    )
    assert "score 75.50 %" in md and "reports that point's test runs" in md
    assert "| ✓ | 1e-05 | [50,50] | 2 | 81.00 ± 1.00 |" in md

    val_rows = table_rows(tmp_path, manifest, "val")
    assert [r["point"] for r in val_rows] == [pid for _, pid in points]
    assert [r["selected"] for r in val_rows] == [False, False, False, True]
    assert val_rows[2]["final_global_acc_mean"] == pytest.approx(0.705)
    val_md = (tmp_path / "val_table.md").read_text()
    assert "selection metric: `final_global_acc`" in val_md
    marked = [line for line in val_md.splitlines() if line.startswith("| ✓ |")]
    assert len(marked) == 1 and "| 1e-05 | [50,50] |" in marked[0]
    assert sum(line.startswith("|  | ") for line in val_md.splitlines()) == 3


def test_one_seed_no_personal_and_empty_grid(tmp_path: Path) -> None:
    """An empty grid (one point, "base"), one seed, a method without personalized models: SE 0
    with a note, no personal columns, the point id as the row's name."""
    runs = [_entry("base", {}, 0, "test", "runs")]
    _write_run(tmp_path / "runs/base/seed0", [0.4, 0.5], personal=False)
    manifest = _manifest(runs, {}, seeds=(0,))
    write_report(tmp_path, manifest)
    (row,) = load_table(tmp_path)
    assert row["n"] == 1 and row["final_global_acc_se"] == 0.0
    assert "final_personal_acc_mean" not in row
    md = (tmp_path / "table.md").read_text()
    assert "| base | 1 | 50.00 ± 0.00 |" in md
    assert "the standard error needs 2 seeds" in md
    assert "personal" not in md.split("| point")[1]


def test_nothing_finished_yet(tmp_path: Path) -> None:
    """Only unfinished runs: rows with n = 0 and empty cells; the figure says there is no data."""
    runs = [_entry("algorithm.lam=15", {"algorithm.lam": 15}, 0, "test", "runs")]
    _write_run(tmp_path / "runs/algorithm.lam=15/seed0", None)
    manifest = _manifest(runs, {"algorithm.lam": [15]}, seeds=(0,))
    write_report(tmp_path, manifest)
    (row,) = load_table(tmp_path)
    assert row["n"] == 0 and row["runs"] == 1 and row["mb_total"] is None
    assert "| 15 | 0/1 |" in (tmp_path / "table.md").read_text()
    assert (tmp_path / "curves.png").read_bytes()[:8] == PNG_MAGIC


def test_load_table_without_a_report(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no table.csv"):
        load_table(tmp_path)
