"""``fedhp reproduce robust``: every run's configuration passes the strict checks, the rows and
attack settings of the grid, and the result lines / tables / figures (runs faked)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

import fedhp.experiments.robust as robust
from fedhp.build import check_components
from fedhp.cli import main
from fedhp.config import resolve_config
from fedhp.experiments import REPRODUCTIONS, common
from fedhp.experiments.common import ReproOptions

LINE = re.compile(
    r"^robust (\S+) (0|0\.[123]) (fedavg|hierfavg|fedavg-iid) (\S+) acc=([0-9.]+)( diverged)?$"
)


def grid(opts: ReproOptions) -> list[tuple[robust.Row, robust.Case]]:
    return [
        (row, case)
        for a in robust.ALGORITHMS
        for row in robust.rows_of(a)
        for case in robust.cases_of(opts, a, row.iid)
    ]


def test_every_run_passes_the_strict_checks() -> None:
    opts = ReproOptions(dataset="mnist")
    runs = grid(opts)
    # FedAvg: 6 rules × 16 settings (+ the IID control: 6 × 2); HierFAVG: 11 rows × (16 + sign
    # flip 20 % concentrated)
    assert len(runs) == 6 * 16 + 6 * 2 + 11 * 17
    for row, case in runs:
        cfg = resolve_config(None, robust.run_overrides(opts, row, case, 0))
        check_components(cfg)
        assert cfg.federation.num_clients == 100 and cfg.federation.num_edges == 10
        if row.iid:
            assert cfg.partition["name"] == "quantity" and case.attack in ("none", "sign_flip")
        else:
            assert cfg.partition["name"] == "shards" and cfg.partition["shards_per_client"] == 2
        assert cfg.rounds == 50 and cfg.federation.weighting == "uniform"
        assert cfg.faults.attack.fraction == case.fraction
        cloud, edge = cfg.robust.cloud, cfg.robust.edge
        if row.algorithm == "fedavg":
            assert cloud.name == row.rule and edge.name == "mean"
        else:
            assert edge.name == row.rule
            assert cloud.name == ("mean" if row.edge_only else row.rule)
        if row.rule == "trimmed_mean":
            assert max(robust.FRACTIONS) <= robust.BETA  # trims every attacker at 30 %
    quick = grid(ReproOptions(dataset="mnist", quick=True))
    assert {c.folder for _, c in quick} == {
        "none-0",
        "sign_flip-0.2",
        "alie-0.2",
        "sign_flip-concentrated-0.2",
    }


def test_reproduce_lines_tables_and_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fake_run(overrides: list[str], folder: Path) -> dict[str, Any]:
        text = " ".join(overrides)
        acc = 0.9 if "attack" not in text else 0.1 if "robust.cloud.name=mean" in text else 0.85
        stopped = {"stopped": "round 3: nan"} if "concentrated" in text else {}
        return {"final_global_acc": acc, "seconds": 0.5, **stopped}

    monkeypatch.setattr(common, "run_config", fake_run)
    assert "robust" in REPRODUCTIONS
    out = tmp_path / "out"
    code = main(["reproduce", "robust", "--quick", "--out", str(out), "--seeds", "2"])
    assert code == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 6 * 3 + 6 * 2 + 11 * 4 and all(LINE.match(x) for x in lines), lines[:3]
    assert "robust sign_flip-concentrated 0.2 hierfavg median-edge acc=0.8500 diverged" in lines
    assert "robust sign_flip 0.2 fedavg mean acc=0.1000" in lines
    assert "robust sign_flip 0.2 fedavg-iid median acc=0.8500" in lines
    table = (out / "table.md").read_text()
    assert "### sign_flip" in table and "### alie" in table and "must-show" in table
    data = json.loads((out / "table.json").read_text())
    assert data["seeds"] == 2 and len(data["results"]) == len(lines)
    for name in ("sign_flip-fedavg.png", "sign_flip-hierfavg.png"):
        assert (out / name).stat().st_size > 0


def test_unknown_method_or_dataset_is_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, text in (
        (["--methods", "fedprox"], "--methods"),
        (["--dataset", "cifar10"], "--dataset"),
    ):
        assert main(["reproduce", "robust", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and text in err
