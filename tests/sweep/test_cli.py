"""``fedhp sweep`` end to end, in-process (``fedhp.cli.main``): one run folder per (grid point,
seed) that ``fedhp.load_run`` opens, each the run ``fedhp run`` writes (metrics.csv byte for
byte), the report files, grid products and structural batches, one-line errors for bad grids,
resume (finished runs kept, an interrupted run continued bit-exactly), ``--select val``, the
YAML ``sweep:`` section and lockstep batching. Tiny runs: MLR, 2 rounds, 6 clients."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

import fedhp
import fedhp.engine.runner as runner
from fedhp.cli import main

TINY = [
    "model.name=mlr",
    "rounds=2",
    "eval_every=1",
    "threads=1",
    "subsample.train=600",
    "subsample.test=300",
    "partition.train_per_class=30",
    "partition.test_per_class=15",
    "federation.num_clients=6",
    "federation.num_edges=2",
]
SFEDHP = [*TINY, "algorithm.name=sfedhp", "algorithm.K=1", "algorithm.R=2"]
POINTS = ("algorithm.lam=15", "algorithm.lam=20")
SEEDS = (0, 1)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def sweep(out: Path, *args: str) -> int:
    return main(["sweep", "--out", str(out), *args])


def metrics(folder: Path) -> dict[str, bytes]:
    """Every run's metrics.csv under ``folder``, by path relative to it."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("metrics.csv"))}


def log_lines(out: Path) -> list[str]:
    """sweep.log without its timestamps."""
    return [line.split(" ", 2)[2] for line in (out / "sweep.log").read_text().splitlines()]


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``fedhp sweep --grid algorithm.lam=15,20 --seeds 0,1`` (sFedHP, tiny): 4 runs."""
    out = tmp_path_factory.mktemp("sweep") / "lam"
    assert sweep(out, "--grid", "algorithm.lam=15,20", "--seeds", "0,1", *SFEDHP) == 0
    return out


def test_grid_x_seeds_writes_a_run_folder_per_run_and_the_report(swept: Path) -> None:
    for point in POINTS:
        for seed in SEEDS:
            result = fedhp.load_run(swept / "runs" / point / f"seed{seed}")
            assert result.config["seed"] == seed
            assert result.config["algorithm"]["lam"] == float(point.split("=")[1])
            assert [row["round"] for row in result.metrics] == [1, 2]
            assert result.summary["rounds"] == 2
    manifest = json.loads((swept / "sweep.json").read_text())
    assert len(manifest["runs"]) == 4 and manifest["grid"] == {"algorithm.lam": [15, 20]}
    assert manifest["seeds"] == [0, 1] and manifest["selected"] is None
    assert (swept / "curves.png").read_bytes().startswith(PNG_MAGIC)
    with (swept / "table.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["point"] for r in rows] == list(POINTS) and [r["n"] for r in rows] == ["2", "2"]
    table = (swept / "table.md").read_text()
    assert "| algorithm.lam | n |" in table and "| 15 | 2 |" in table and "| 20 | 2 |" in table


def test_each_run_is_the_run_fedhp_run_writes(swept: Path, tmp_path: Path) -> None:
    alone = tmp_path / "alone"
    assert main(["run", "--out", str(alone), *SFEDHP, "algorithm.lam=20", "seed=1"]) == 0
    run = swept / "runs" / "algorithm.lam=20" / "seed1"
    for name in ("metrics.csv", "per_client.csv", "config.yaml"):
        assert (run / name).read_bytes() == (alone / name).read_bytes(), name


def test_lockstep_writes_the_bytes_of_sequential(swept: Path, tmp_path: Path) -> None:
    out = tmp_path / "lockstep"
    args = ["--grid", "algorithm.lam=15,20", "--seeds", "0,1", "--batching", "lockstep"]
    assert sweep(out, *args, *SFEDHP) == 0
    assert any("in lockstep (" in line for line in log_lines(out))
    assert any("one after another" in line for line in log_lines(swept))  # auto on the CPU
    lock, seq = metrics(out / "runs"), metrics(swept / "runs")
    assert len(seq) == 4 and lock == seq


def test_two_axes_make_their_product_and_a_structural_axis_splits_batches(
    tmp_path: Path,
) -> None:
    out = tmp_path / "product"
    grid = ["--grid", "algorithm.R=1,2", "--grid", "algorithm.lam=15,20"]
    assert sweep(out, *grid, *SFEDHP) == 0
    folders = sorted(p.name for p in (out / "runs").iterdir())
    assert folders == [
        "algorithm.R=1,algorithm.lam=15",
        "algorithm.R=1,algorithm.lam=20",
        "algorithm.R=2,algorithm.lam=15",
        "algorithm.R=2,algorithm.lam=20",
    ]
    for folder in folders:
        assert fedhp.load_run(out / "runs" / folder / "seed0").summary["rounds"] == 2
    lines = log_lines(out)
    assert lines[0] == "4 grid points x 1 seeds = 4 runs"
    batches = [line for line in lines if line.startswith("batch ")]
    assert len(batches) == 2
    assert all(line.startswith(("batch 1/2: 2 runs", "batch 2/2: 2 runs")) for line in batches)
    assert len((out / "table.csv").read_text().splitlines()) == 1 + 4


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--grid", "algorithm.nope=1,2"], "nope"),
        (["--grid", "algorithm.lam="], "--grid algorithm.lam: no values"),
        (["--grid", "algorithm.lam=-1"], "grid point algorithm.lam=-1"),
        (["--grid", "lam"], "expected KEY=V1,V2"),
        (["--grid", "algorithm.lam=15", "--grid", "algorithm.lam=20"], "given twice"),
        (["--seeds", "0,1,0"], "a seed is repeated"),
        (["--seeds", "x"], "--seeds 'x': expected integers"),
        (["--runs-per-batch", "0"], "--runs-per-batch 0"),
        (["--select", "val"], "no validation data; set partition.val_per_class"),
    ],
    ids=[
        "unknown-key",
        "empty",
        "refused-value",
        "no-equals",
        "twice",
        "seed-twice",
        "seeds-x",
        "runs-per-batch-0",
        "select-val-without-val-data",
    ],
)
def test_bad_grids_are_one_line_errors(
    args: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bad"
    assert sweep(out, *args, *SFEDHP) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedhp: error: ") and err.count("\n") == 1, err
    assert says in err and "Traceback" not in err
    assert not out.exists()  # checked before anything is written


def test_another_sweep_into_the_same_folder_is_a_one_line_error(
    swept: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another option outside the grid: one line naming it and both values (growing a sweep,
    tests/sweep/test_grow.py)."""
    before = metrics(swept)
    args = ["--grid", "algorithm.lam=15,25", "--seeds", "0,1", *SFEDHP, "max_loss=500"]
    assert sweep(swept, *args) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedhp: error: ") and err.count("\n") == 1
    assert "holds a sweep with max_loss=1000.0; this command gives max_loss=500.0" in err
    assert metrics(swept) == before


def test_the_same_command_again_keeps_the_finished_runs(swept: Path) -> None:
    files = [p for p in sorted((swept / "runs").rglob("*")) if p.is_file()]
    stamps = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in files}
    table = (swept / "table.csv").read_bytes()
    assert sweep(swept, "--grid", "algorithm.lam=15,20", "--seeds", "0,1", *SFEDHP) == 0
    assert [p for p in sorted((swept / "runs").rglob("*")) if p.is_file()] == files
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in files} == stamps
    assert "batch 1/1: 4 runs all finished before: kept" in log_lines(swept)[-2]
    assert (swept / "table.csv").read_bytes() == table


def test_an_interrupted_sweep_resumes_its_run_bit_exactly(
    swept: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while seed 1 writes its last checkpoint: seed 0 is finished, seed 1 has the
    checkpoint of round 1 and metrics rows of rounds 1-2, no summary. The same command again
    keeps seed 0 and resumes seed 1 to the metrics of an uninterrupted run."""
    out = tmp_path / "cut"
    args = ["--grid", "algorithm.lam=20", "--seeds", "0,1", *SFEDHP, "checkpoint_every=1"]
    real = runner.save_checkpoint

    def interrupted(path: Path, snap: Any, config: dict[str, Any]) -> None:
        if config["seed"] == 1 and snap.round == 2:
            raise KeyboardInterrupt
        real(path, snap, config)

    monkeypatch.setattr(runner, "save_checkpoint", interrupted)
    assert sweep(out, *args) == 130
    monkeypatch.undo()
    assert log_lines(out)[-1].startswith("interrupted: the same command resumes")
    seed0, seed1 = (out / "runs" / "algorithm.lam=20" / f"seed{s}" for s in SEEDS)
    assert (seed0 / "summary.json").is_file() and not (seed1 / "summary.json").exists()
    assert json.loads((seed1 / "checkpoint_time.json").read_text())["round"] == 1
    kept = seed0.joinpath("metrics.csv").stat().st_mtime_ns
    assert sweep(out, *args) == 0
    assert seed0.joinpath("metrics.csv").stat().st_mtime_ns == kept
    assert "; 1 kept (finished before), 1 resumed from its checkpoint, " in log_lines(out)[-2]
    assert (seed1 / "summary.json").is_file()
    lam20 = swept / "runs" / "algorithm.lam=20"
    for seed in SEEDS:
        a = (out / "runs" / "algorithm.lam=20" / f"seed{seed}" / "metrics.csv").read_bytes()
        assert a == (lam20 / f"seed{seed}" / "metrics.csv").read_bytes()


def test_select_val_runs_the_best_point_on_the_test_split(tmp_path: Path) -> None:
    out = tmp_path / "select"
    args = ["--grid", "algorithm.lam=15,20", "--select", "val", "partition.val_per_class=5"]
    assert sweep(out, *args, *SFEDHP) == 0
    val = {
        point: fedhp.load_run(out / "val" / point / "seed0")
        for point in ("algorithm.lam=15", "algorithm.lam=20")
    }
    assert all(r.config["eval_split"] == "val" for r in val.values())
    scores = {p: r.summary["final_global_acc"] for p, r in val.items()}
    best = max(scores, key=lambda p: (scores[p], p == "algorithm.lam=15"))  # ties: the first
    manifest = json.loads((out / "sweep.json").read_text())
    assert manifest["selected"]["point"] == best
    assert [p.name for p in (out / "test").iterdir()] == [best]
    test = fedhp.load_run(out / "test" / best / "seed0")
    assert test.config["eval_split"] == "test"
    assert not (out / "runs").exists()
    assert (out / "val_table.md").is_file() and (out / "val_curves.png").is_file()
    table = (out / "table.md").read_text()
    assert f"**{best}**" in table and "reports that point's test runs" in table
    with (out / "table.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["point"], r["selected"]) for r in rows] == [(best, "1")]
    assert float(rows[0]["final_global_acc_mean"]) == test.summary["final_global_acc"]


def test_the_yaml_sweep_section_and_flags_over_it(
    swept: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config: dict[str, Any] = {}
    for item in SFEDHP:
        key, value = item.split("=")
        *parents, leaf = key.split(".")
        node = config
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(value)
    config["sweep"] = {"grid": {"algorithm.lam": [15, 20]}, "seeds": [0, 1], "out": "from-yaml"}
    (tmp_path / "lam.yaml").write_text(yaml.safe_dump(config))
    assert main(["sweep", "lam.yaml", "--seeds", "1", "--grid", "algorithm.lam=20"]) == 0
    runs = tmp_path / "from-yaml" / "runs"
    assert [str(p.relative_to(runs)) for p in runs.glob("*/*")] == [
        os.path.join("algorithm.lam=20", "seed1")
    ]
    ours = (runs / "algorithm.lam=20" / "seed1" / "metrics.csv").read_bytes()
    assert ours == (swept / "runs" / "algorithm.lam=20" / "seed1" / "metrics.csv").read_bytes()
    manifest = json.loads((tmp_path / "from-yaml" / "sweep.json").read_text())
    assert manifest["grid"] == {"algorithm.lam": [20]} and manifest["seeds"] == [1]
    # --out over the section's out, and the section's seeds where no flag is given
    assert main(["sweep", "lam.yaml", "--out", "flagged", "--grid", "algorithm.lam=15"]) == 0
    flagged = tmp_path / "flagged" / "runs" / "algorithm.lam=15"
    assert sorted(p.name for p in flagged.iterdir()) == ["seed0", "seed1"]
    assert not (tmp_path / "from-yaml" / "runs" / "algorithm.lam=15").exists()
