"""Every number table.md prints — mean and standard error in %, n, the best round, the selected
point and a tie — against a computation written here, on hand-made run folders whose values are
known (the report reads only summary.json and metrics.csv)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from fedhp.sweep.report import write_report
from fedhp.sweep.selection import point_score, tie_line

# point -> seed -> (final global acc, best global acc, best round)
TEST = {"algorithm.lam=15": {0: (0.61, 0.70, 4), 1: (0.65, 0.72, 6), 2: (0.66, 0.66, 10)}}
VAL = {
    "algorithm.lam=15": {0: (0.50, 0.5, 10), 1: (0.70, 0.7, 10)},  # mean 0.60
    "algorithm.lam=20": {0: (0.60, 0.6, 10), 1: (0.60, 0.6, 10)},  # mean 0.60: a tie
    "algorithm.lam=25": {0: (0.90, 0.9, 10), 1: (0.30, 0.3, 4)},  # seed 1 diverged: -inf
}


DIVERGED = ("algorithm.lam=25", 1)


def _run(folder: Path, final: float, best: float, best_round: int, stopped: bool) -> None:
    folder.mkdir(parents=True)
    rows = ["round,global_acc,cum_bytes_total", f"{best_round},{best!r},1000000.0"]
    (folder / "metrics.csv").write_text("\n".join(rows) + "\n")
    summary: dict[str, Any] = {
        "rounds": 10,
        "seconds": 1.0,
        "final_global_acc": final,
        "best_global_acc": best,
        "best_global_acc_round": best_round,
    }
    if stopped:
        summary["stopped"] = "diverged"
    (folder / "summary.json").write_text(json.dumps(summary))


def _sweep(tmp_path: Path, selected: str) -> dict[str, Any]:
    runs = []
    for split, sub, points in (
        ("val", "val", VAL),
        ("test", "test", {selected: TEST[next(iter(TEST))]}),
    ):
        for point, seeds in points.items():
            for seed, (final, best, at) in seeds.items():
                out_dir = f"{sub}/{point}/seed{seed}"
                _run(tmp_path / out_dir, final, best, at, (point, seed) == DIVERGED)
                lam = int(point.split("=")[1])
                runs.append(
                    {
                        "point": point,
                        "values": {"algorithm.lam": lam},
                        "seed": seed,
                        "split": split,
                        "overrides": [],
                        "out_dir": out_dir,
                        "rounds": 10,
                    }
                )
    manifest = {
        "version": 1,
        "base": [],
        "plugins": [],
        "grid": {"algorithm.lam": [15, 20, 25]},
        "seeds": [0, 1, 2],
        "select": "val",
        "metric": "final_global_acc",
        "runs": runs,
        "selected": {"point": selected, "values": {}, "score": 0.6},
    }
    (tmp_path / "sweep.json").write_text(json.dumps(manifest))
    return manifest


def _cells(md: str) -> list[list[str]]:
    rows = [line for line in md.splitlines() if line.startswith("| ")]
    return [[c.strip() for c in row.strip("|").split("|")] for row in rows]


def test_the_printed_numbers_are_the_known_runs_numbers(tmp_path: Path) -> None:
    manifest = _sweep(tmp_path, "algorithm.lam=15")
    write_report(tmp_path, manifest)
    header, row = _cells((tmp_path / "table.md").read_text())
    cell = dict(zip(header, row, strict=True))
    finals = [v[0] for v in TEST["algorithm.lam=15"].values()]
    bests = [v[1] for v in TEST["algorithm.lam=15"].values()]
    mean = sum(finals) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in finals) / 2)
    assert cell["n"] == "3" and cell["selected"] == "✓" and cell["algorithm.lam"] == "15"
    assert cell["final_global_acc (%)"] == f"{100 * mean:.2f} ± {100 * sd / math.sqrt(3):.2f}"
    best_mean = sum(bests) / 3
    best_sd = math.sqrt(sum((x - best_mean) ** 2 for x in bests) / 2)
    assert (
        cell["best_global_acc (%)"] == f"{100 * best_mean:.2f} ± {100 * best_sd / math.sqrt(3):.2f}"
    )
    assert cell["best_global_acc round"] == f"{(4 + 6 + 10) / 3:.1f}"
    assert cell["stopped"] == "0"


def test_the_val_table_counts_the_diverged_run_and_states_the_tie(tmp_path: Path) -> None:
    manifest = _sweep(tmp_path, "algorithm.lam=15")
    write_report(tmp_path, manifest)
    val = (tmp_path / "val_table.md").read_text()
    header, *cells = _cells(val)
    rows = {r[1]: dict(zip(header, r, strict=True)) for r in cells}
    assert [r["selected"] for r in rows.values()] == ["✓", "", ""]
    # the diverged run counts in n with its results up to its last good round, and in stopped
    assert rows["25"]["n"] == "2" and rows["25"]["stopped"] == "1"
    sd = math.sqrt(((0.9 - 0.6) ** 2 + (0.3 - 0.6) ** 2) / 1)
    assert rows["25"]["final_global_acc (%)"] == f"{60:.2f} ± {100 * sd / math.sqrt(2):.2f}"
    assert rows["25"]["best_global_acc round"] == "7"
    tie = [line for line in val.splitlines() if line.startswith("- tie:")]
    assert tie == [
        "- tie: **algorithm.lam=15**, **algorithm.lam=20** have the same mean `final_global_acc` "
        "(60.00 %); the earliest point in the grid's order is selected: **algorithm.lam=15**"
    ]
    assert tie[0] in (tmp_path / "table.md").read_text()


def test_scores_and_ties_by_hand() -> None:
    summaries: dict[str, list[dict[str, Any]]] = {
        p: [{"final_global_acc": v[0]} for v in s.values()] for p, s in VAL.items()
    }
    summaries["algorithm.lam=25"][1]["stopped"] = "diverged"
    scores = {p: point_score(s, "final_global_acc") for p, s in summaries.items()}
    assert scores["algorithm.lam=15"] == (0.5 + 0.7) / 2 == scores["algorithm.lam=20"]
    assert scores["algorithm.lam=25"] == -math.inf
    assert tie_line(scores, "algorithm.lam=20", "final_global_acc") is not None
    assert tie_line({"a": 0.5, "b": 0.4}, "a", "final_global_acc") is None
    none = tie_line({"a": -math.inf, "b": -math.inf}, "a", "final_global_acc")
    assert none is not None and "no point has a score" in none
