"""A sweep folder is a set of runs identified by what they compute (issue 55): the same sweep
typed otherwise (options reordered, explicit defaults, cosmetic options) resumes with nothing
rerun; more seeds or grid values run only the new runs and the table is rewritten from all of
them; a grid value given twice (``15,15``, ``15,15.0``) or two points that resolve to one
configuration are one line; a real conflict names the option and both values; a sweep that fails
at its start leaves no folder; the selection's flags are checked; a large sweep says its size at
once. Tiny runs: MLR, 2 rounds, 6 clients."""

from __future__ import annotations

import csv
import json
import math
import statistics
from pathlib import Path
from typing import Any

import pytest

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
REORDERED = [
    *reversed(SFEDHP[:-1]),
    "progress=false",  # cosmetic
    "checkpoint_every=10",  # an explicit default
    "max_loss=1000",  # an explicit default
    SFEDHP[-1],
]


def sweep(out: Path, *args: str) -> int:
    return main(["sweep", "--out", str(out), *args])


def files(folder: Path) -> dict[str, tuple[int, bytes]]:
    """Every file under ``folder/runs``: its modification time and bytes."""
    return {
        str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.read_bytes())
        for p in sorted((folder / "runs").rglob("*"))
        if p.is_file()
    }


def run_dirs(folder: Path) -> set[str]:
    return {str(p.parent.relative_to(folder)) for p in folder.glob("runs/*/*/summary.json")}


def table(folder: Path) -> list[dict[str, str]]:
    with (folder / "table.csv").open(newline="") as fh:
        return list(csv.DictReader(fh))


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.startswith("fedhp: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


@pytest.fixture(scope="module")
def grown(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """lam ∈ {15, 20} × seeds {0, 1}; then seeds 0-2 (one new run per point); then the same
    sweep typed otherwise (nothing new); then lam 25 added (one new point, three runs)."""
    out = tmp_path_factory.mktemp("grow") / "lam"
    steps: dict[str, Any] = {"out": out}
    assert sweep(out, "--grid", "algorithm.lam=15,20", "--seeds", "0,1", *SFEDHP) == 0
    steps["two"] = files(out)
    assert sweep(out, "--grid", "algorithm.lam=15,20", "--seeds", "0-2", *SFEDHP) == 0
    steps["three"] = files(out)
    steps["three_table"] = table(out)
    steps["three_log"] = (out / "sweep.log").read_text().splitlines()
    args = ["--seeds", "0,1,2", *REORDERED, "threads=2", "--grid", "algorithm.lam=20,15.0"]
    assert sweep(out, *args) == 0
    steps["again"] = files(out)
    steps["again_log"] = (out / "sweep.log").read_text().splitlines()
    assert sweep(out, "--grid", "algorithm.lam=25", "--seeds", "0-2", *SFEDHP) == 0
    steps["grid"] = files(out)
    steps["grid_log"] = (out / "sweep.log").read_text().splitlines()
    return steps


def test_more_seeds_run_one_new_run_per_point_and_the_table_has_n_3(
    grown: dict[str, Any],
) -> None:
    two, three = grown["two"], grown["three"]
    assert {k: v for k, v in three.items() if k in two} == two  # the 4 runs untouched
    new = {str(Path(k).parent) for k in three if k not in two}
    assert new == {"runs/algorithm.lam=15/seed2", "runs/algorithm.lam=20/seed2"}
    line = grown["three_log"][-2]
    assert "6 runs one after another (their kernels are not fused); 4 kept" in line
    rows = grown["three_table"]
    assert [(r["point"], r["n"], r["runs"]) for r in rows] == [
        ("algorithm.lam=15", "3", "3"),
        ("algorithm.lam=20", "3", "3"),
    ]
    out: Path = grown["out"]
    for row in rows:  # mean and standard error against the three summaries, by hand
        accs = [
            json.loads((out / "runs" / row["point"] / f"seed{s}" / "summary.json").read_text())[
                "final_global_acc"
            ]
            for s in (0, 1, 2)
        ]
        assert float(row["final_global_acc_mean"]) == pytest.approx(sum(accs) / 3, abs=1e-15)
        se = statistics.stdev(accs) / math.sqrt(3)
        assert float(row["final_global_acc_se"]) == pytest.approx(se, abs=1e-15)


def test_the_same_sweep_typed_otherwise_reruns_nothing(grown: dict[str, Any]) -> None:
    """Options reordered, explicit defaults, progress/threads changed, the grid's values in
    another order and 15 written 15.0: every run kept, files untouched."""
    assert grown["again"] == grown["three"]
    assert "batch 1/1: 6 runs all finished before: kept" in grown["again_log"][-2]


def test_a_new_grid_value_runs_only_its_runs(grown: dict[str, Any]) -> None:
    three, after = grown["three"], grown["grid"]
    assert {k: v for k, v in after.items() if k in three} == three
    new = {str(Path(k).parent) for k in after if k not in three}
    assert new == {f"runs/algorithm.lam=25/seed{s}" for s in (0, 1, 2)}
    out: Path = grown["out"]
    assert [(r["point"], r["n"]) for r in table(out)] == [
        ("algorithm.lam=15", "3"),
        ("algorithm.lam=20", "3"),
        ("algorithm.lam=25", "3"),
    ]
    manifest = json.loads((out / "sweep.json").read_text())
    assert manifest["grid"] == {"algorithm.lam": [15, 20, 25]} and manifest["seeds"] == [0, 1, 2]
    assert len(manifest["runs"]) == 9 and len({r["identity"] for r in manifest["runs"]}) == 9


def test_a_real_conflict_names_the_option_and_both_values(
    grown: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    out: Path = grown["out"]
    before = (files(out), (out / "sweep.json").read_bytes())
    assert sweep(out, "--grid", "algorithm.lam=15", *SFEDHP, "algorithm.lr=0.01") == 2
    err = one_line_error(capsys)
    assert "holds a sweep with algorithm.lr=0.05; this command gives algorithm.lr=0.01" in err
    assert sweep(out, "--grid", "algorithm.lr=0.01", *SFEDHP) == 2
    assert "holds a sweep over algorithm.lam; this command's grid is over algorithm.lr" in (
        one_line_error(capsys)
    )
    args = ["--grid", "algorithm.lam=15", "--select", "val", "partition.val_per_class=5"]
    assert sweep(out, *args, *SFEDHP) == 2
    assert "holds a sweep with no --select; this command has --select val" in (
        one_line_error(capsys)
    )
    assert (files(out), (out / "sweep.json").read_bytes()) == before


@pytest.mark.parametrize(
    ("grid", "says"),
    [
        ("algorithm.lam=15,15", "--grid algorithm.lam: 15 given twice"),
        ("algorithm.lam=15,15.0", "--grid algorithm.lam: 15 and 15.0 given twice"),
        # YAML reads 1.5e1 as text, the option as 15.0: one configuration once resolved
        ("algorithm.lam=15,1.5e1", "algorithm.lam=15 and algorithm.lam=1.5e1 are one config"),
    ],
    ids=["15,15", "15,15.0", "15,1.5e1"],
)
def test_a_value_given_twice_is_one_line_and_no_folder(
    grid: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "dup"
    assert sweep(out, "--grid", grid, *SFEDHP) == 2
    assert says in one_line_error(capsys)
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ["--select", "val", "--metric", "nope", "partition.val_per_class=5"],
            "--metric nope: not a metric the runs report; choose from final_global_acc, "
            "best_global_acc, final_personal_acc",
        ),
        (["--metric", "best_global_acc"], "--metric best_global_acc: only --select val reads it"),
        (["--address", "auto"], "--address auto: only --backend ray reads it"),
        (["seed=3", "--seeds", "0,1"], "seed=3 beside --seeds: each run's seed comes from"),
    ],
    ids=["metric-nope", "metric-without-select", "address-without-ray", "seed-beside-seeds"],
)
def test_flags_that_name_nothing_or_would_be_ignored(
    args: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bad"
    assert sweep(out, *SFEDHP, *args) == 2
    assert says in one_line_error(capsys)
    assert not out.exists()


def test_a_base_seed_without_seeds_is_the_sweeps_seed(tmp_path: Path) -> None:
    out = tmp_path / "s3"
    assert sweep(out, *SFEDHP, "seed=3") == 0
    manifest = json.loads((out / "sweep.json").read_text())
    assert manifest["seeds"] == [3] and run_dirs(out) == {"runs/base/seed3"}
    config = (out / "runs/base/seed3/config.yaml").read_text()
    assert "\nseed: 3\n" in f"\n{config}"


def test_a_sweep_failing_at_its_start_leaves_no_folder_and_the_corrected_one_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """400 clients cannot share 300 samples: refused once the data is loaded (the config is
    valid). Nothing ran, so no folder stays; after a point that finished, the folder keeps it
    and the corrected command runs without the bad value."""
    out = tmp_path / "clients"
    base = [*TINY[:-2], "federation.num_edges=2"]
    assert sweep(out, "--grid", "federation.num_clients=400", *base) == 2
    assert "400 clients get no training samples" in capsys.readouterr().err
    assert not out.exists()
    assert sweep(out, "--grid", "federation.num_clients=6,400", *base) == 2
    assert run_dirs(out) == {"runs/federation.num_clients=6/seed0"}
    kept = files(out)
    assert sweep(out, "--grid", "federation.num_clients=6,4", *base) == 0
    assert [r["point"] for r in table(out)] == [
        "federation.num_clients=6",
        "federation.num_clients=4",
    ]
    assert {k: v for k, v in files(out).items() if k in kept} == kept


def test_a_large_sweep_says_its_size_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """100,001 runs: the size first, then its runs checked (a bar), then the sweep (stopped
    here by a Ctrl-C as it starts: nothing ran, so no folder stays)."""
    import fedhp.sweep.run as run

    def interrupted(spec: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(run, "run_sweep", interrupted)
    out = tmp_path / "big"
    assert sweep(out, "--seeds", "0-100000", *SFEDHP) == 130
    err = capsys.readouterr().err
    assert err.startswith(
        "fedhp sweep: 1 grid points x 100,001 seeds = 100,001 runs; checking their configurations"
    )
    assert not out.exists()
