"""benchmarks/bench_sweep.py (issue 40's CPU must-show): the grid it shrinks to, what it reads
from sweep.log, its ratios and table; the whole benchmark at tiny sizes (marked slow: it starts
four processes)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(autouse=True)
def _benchmarks_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))


def test_runs_shrink_the_grid_lambda_by_lambda() -> None:
    import bench_sweep

    assert bench_sweep.grid_of(15) == ([15, 20, 25, 30, 35], [0, 1, 2])
    assert bench_sweep.grid_of(6) == ([15, 20], [0, 1, 2])
    assert bench_sweep.grid_of(2) == ([15], [0, 1])
    for bad in (0, 4, 16):
        with pytest.raises(ValueError, match="--runs"):
            bench_sweep.grid_of(bad)


def test_sweep_log_batches_are_read() -> None:
    import bench_sweep

    log = (
        "2026-11-27 10:07:31 5 grid points x 3 seeds = 15 runs\n"
        "2026-11-27 10:07:34 batch 1/2: 8 runs in lockstep (100 fused model calls), 2.6s\n"
        "2026-11-27 10:07:39 batch 2/2: 7 runs in lockstep (90 fused model calls), 4.4s\n"
    )
    read = bench_sweep.parse_sweep_log(log)
    assert read["batch_s"] == pytest.approx(7.0) and read["lockstep"]
    one = "2026-11-27 10:07:34 batch 1/1: 15 runs one after another (their kernels ...), 9.5s"
    assert bench_sweep.parse_sweep_log(one) == {
        "batch_s": 9.5,
        "how": ["one after another (their kernels ...)"],
        "lockstep": False,
    }


def test_ratios_and_table(capsys: pytest.CaptureFixture[str]) -> None:
    import bench_sweep

    runs = {"wall_s": 150.0, "train_s": 90.0, "rss_mb": 800.0, "rss_max_mb": 820.0}
    seq = {"wall_s": 100.0, "train_s": 88.0, "batch_s": 93.0, "rss_mb": 900.0}
    lock = {"wall_s": 60.0, "train_s": 44.0, "batch_s": 46.5, "rss_mb": 1700.0}
    extra = {"threads": 1, "ran_in_lockstep": True, "batches": []}
    repeats = [
        {"runs": {**runs, **extra}, "sequential": {**seq, **extra}, "lockstep": {**lock, **extra}}
    ]
    rat = bench_sweep.ratios(bench_sweep.medians(repeats))
    assert rat["end_to_end_sequential"] == 1.5 and rat["end_to_end_lockstep"] == 2.5
    assert rat["train_loops"] == 2.0 and rat["train_batch"] == 2.0
    assert rat["memory_sequential"] == 900 / 800 and rat["memory_lockstep"] == 1700 / 800
    args = argparse.Namespace(
        runs=15,
        rounds=20,
        threads=1,
        device="cpu",
        repeats=1,
        lams=[15, 20, 25, 30, 35],
        method="sfedhp",
        key="algorithm.lam",
    )
    facts = {"cores": 2, "cores_usable": 2, "cpu": "x", "torch": "2", "python": "3"}
    bench_sweep.report(args, facts, repeats, (1.0, 1.5))
    out = capsys.readouterr().out
    assert "| end to end: 15 runs / sweep (sequential) | 1.50x | >= 2.5x | NO |" in out
    assert "| end to end: 15 runs / sweep (lockstep) | 2.50x | >= 2.5x | yes |" in out
    assert "| peak memory: sweep (lockstep) / one run | 2.12x | <= 2x | NO |" in out
    assert "| 15 x fedhp run (processes) | 150.0 | 90.0 (sum) | — | 800 (median" in out
    assert out.strip().splitlines()[-1].startswith("bench sweep runs_wall_s=150.0 ")


@pytest.mark.slow
def test_the_benchmark_runs_at_tiny_sizes(tmp_path: Path) -> None:
    """Two runs of one round, each variant once: every number there, the JSON written."""
    import bench_sweep

    path = tmp_path / "out.json"
    results = bench_sweep.main(["--runs", "2", "--rounds", "1", "--json", str(path)])
    saved = json.loads(path.read_text())
    assert set(saved["medians"]) == {"runs", "sequential", "lockstep"}
    assert set(saved["ratios"]) == set(results["ratios"]) and len(results["ratios"]) == 6
    (rep,) = saved["repeats"]
    assert len(rep["runs"]["run_walls_s"]) == 2 and rep["lockstep"]["ran_in_lockstep"]
    assert all(rep[v]["rss_mb"] > 50 and rep[v]["train_s"] > 0 for v in rep)
    assert saved["machine"]["cores"] >= 1 and saved["machine"]["torch"]
