"""``fedhp.sweep(...)``: the package is callable, runs the sweep ``fedhp sweep`` runs and returns
a :class:`~fedhp.sweep.api.SweepResult` whose table is table.csv and whose run folders exist."""

from __future__ import annotations

import csv
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import fedhp
from fedhp.cli import main
from fedhp.sweep.api import SweepResult
from fedhp.sweep.report import load_table, table_rows

TINY: dict[str, Any] = {
    "model": {"name": "mlr"},
    "rounds": 2,
    "eval_every": 1,
    "threads": 1,
    "subsample": {"train": 600, "test": 300},
    "partition": {"train_per_class": 30, "test_per_class": 15},
    "federation": {"num_clients": 6, "num_edges": 2},
}
FEDAVG: dict[str, Any] = {"name": "fedavg", "local_steps": 2}


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> SweepResult:
    """FedAvg, lr ∈ {0.05, 0.1} × seeds {0, 1}."""
    out = tmp_path_factory.mktemp("api") / "lr"
    res = fedhp.sweep(
        grid={"algorithm.lr": [0.05, 0.1]},
        seeds=[0, 1],
        out=out,
        progress=False,
        algorithm=FEDAVG,
        **TINY,
    )
    assert isinstance(res, SweepResult)
    return res


def test_fedhp_sweep_is_the_callable_package() -> None:
    import fedhp.sweep.plan as plan

    package = sys.modules["fedhp.sweep"]
    assert fedhp.sweep is package and callable(package)
    assert package.plan is plan  # its parts stay importable


def test_the_result_table_is_table_csv(result: SweepResult) -> None:
    assert result.selected is None
    assert result.table == load_table(result.out_dir)
    with (result.out_dir / "table.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["point"] for r in result.table] == [r["point"] for r in rows]
    assert [r["point"] for r in result.table] == ["algorithm.lr=0.05", "algorithm.lr=0.1"]
    assert [r["algorithm.lr"] for r in result.table] == [0.05, 0.1]
    computed = table_rows(result.out_dir, result.manifest)
    for row, csv_row, again in zip(result.table, rows, computed, strict=True):
        assert row["n"] == row["runs"] == 2 and row["stopped"] == 0 and not row["selected"]
        assert row["final_global_acc_mean"] == float(csv_row["final_global_acc_mean"])
        for key, value in again.items():  # the CSV keeps every float exactly
            assert row[key] == value or (value is None and row[key] is None), key


def test_the_run_dirs_exist_and_the_table_is_their_mean(result: SweepResult) -> None:
    dirs = result.run_dirs()
    assert [d.relative_to(result.out_dir).as_posix() for d in dirs] == [
        f"runs/algorithm.lr={lr}/seed{s}" for lr in (0.05, 0.1) for s in (0, 1)
    ]
    for row, pair in zip(result.table, (dirs[:2], dirs[2:]), strict=True):
        accs = [fedhp.load_run(d).summary["final_global_acc"] for d in pair]
        assert math.isclose(row["final_global_acc_mean"], statistics.fmean(accs))
        assert math.isclose(row["final_global_acc_se"], statistics.stdev(accs) / math.sqrt(2))
    assert json.loads((result.out_dir / "sweep.json").read_text()) == result.manifest


def test_a_run_is_the_run_fedhp_run_writes(result: SweepResult, tmp_path: Path) -> None:
    alone = fedhp.run(out=tmp_path / "alone", seed=1, algorithm={**FEDAVG, "lr": 0.1}, **TINY)
    run = result.out_dir / "runs" / "algorithm.lr=0.1" / "seed1"
    assert alone.out_dir == tmp_path / "alone"
    assert (run / "metrics.csv").read_bytes() == (tmp_path / "alone" / "metrics.csv").read_bytes()


def test_a_yaml_file_with_a_sweep_section_and_arguments_over_it(
    result: SweepResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file gives the base config, the grid and the seeds; ``seeds=`` wins over its
    seeds, ``out=`` over its out; the run is the same as the CLI's (``fedhp sweep FILE``)."""
    monkeypatch.chdir(tmp_path)
    config = {
        **TINY,
        "algorithm": FEDAVG,
        "sweep": {"grid": {"algorithm.lr": [0.1]}, "seeds": [0, 1], "out": "ignored"},
    }
    (tmp_path / "lr.yaml").write_text(yaml.safe_dump(config))
    res = fedhp.sweep("lr.yaml", seeds=[1], out="from-python", progress=False)
    assert not Path("ignored").exists()
    assert [d.relative_to(res.out_dir).as_posix() for d in res.run_dirs()] == [
        "runs/algorithm.lr=0.1/seed1"
    ]
    ours = (res.run_dirs()[0] / "metrics.csv").read_bytes()
    assert ours == (result.run_dirs()[3] / "metrics.csv").read_bytes()
    assert main(["sweep", "lr.yaml", "--seeds", "1", "--out", "from-cli"]) == 0
    cli = load_table(Path("from-cli"))
    assert [{k: v for k, v in row.items() if k != "seconds"} for row in cli] == [
        {k: v for k, v in row.items() if k != "seconds"} for row in res.table
    ]


def test_bad_grids_raise_config_errors(tmp_path: Path) -> None:
    with pytest.raises(fedhp.ConfigError, match="grid algorithm.lr: no values"):
        fedhp.sweep(grid={"algorithm.lr": []}, out=tmp_path / "a", progress=False, **TINY)
    with pytest.raises(fedhp.ConfigError, match="give seeds with"):
        fedhp.sweep(grid={"seed": [0, 1]}, out=tmp_path / "b", progress=False, **TINY)
    with pytest.raises(fedhp.ConfigError, match="a seed is repeated"):
        fedhp.sweep(seeds=[0, 0], out=tmp_path / "c", progress=False, **TINY)
    assert not any(tmp_path.iterdir())


def test_a_base_on_the_validation_split_is_honoured_without_select(tmp_path: Path) -> None:
    """``eval_split=val`` in the sweep's base (no ``--select``): every run evaluates on the
    validation split (not silently on test), and the table says so."""
    out = tmp_path / "val"
    base = {**TINY, "partition": {**TINY["partition"], "val_fraction": 0.2}}
    fedhp.sweep(
        grid={"algorithm.lr": [0.05]},
        seeds=[0],
        out=out,
        progress=False,
        algorithm=FEDAVG,
        eval_split="val",
        **{k: v for k, v in base.items() if k != "eval_split"},
    )
    configs = list(out.glob("runs/*/seed0/config.yaml"))
    assert len(configs) == 1
    assert yaml.safe_load(configs[0].read_text())["eval_split"] == "val"
    table = (out / "table.md").read_text()
    assert table.startswith("# Sweep: validation split")
    assert "every run evaluates on the validation split" in table
