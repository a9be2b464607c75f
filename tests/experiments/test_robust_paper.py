"""``fedhp reproduce robust-paper``: the 2022 bucketing paper's setting (every run's overrides,
its label-sorted split with IID Byzantine workers), the result lines and tables (runs faked),
one-line errors, and a tiny real run."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

import fedhp.experiments.robust_paper as rp
from fedhp.build import check_components
from fedhp.cli import main
from fedhp.config import resolve_config
from fedhp.data.partition import split_dataset
from fedhp.data.types import DatasetArrays
from fedhp.engine.attacks import malicious_clients
from fedhp.experiments import REPRODUCTIONS, common
from fedhp.experiments.common import ReproOptions

LINE = re.compile(
    r"^robust-paper (none|BF|LF|IPM|ALIE|BF-scaled) (Mean|Krum|CM|RFA|CClip) s=(0|2) beta=(0|0\.9) "
    r"acc=([0-9.]+) last5=([0-9.]+|nan)( ▼)?( diverged)?$"
)


def test_every_run_is_the_papers_setting() -> None:
    opts = ReproOptions(dataset="mnist")
    cells = rp.cells(opts)
    # β = 0: the mean attack-free and under 4 attacks, 4 rules × 4 attacks × 2 s; β = 0.9: the
    # same with the scaled sign flip as a fifth attack
    assert len(cells) == (5 + 4 * 4 * 2) + (6 + 4 * 5 * 2)
    for cell in cells:
        cfg = resolve_config(None, rp.run_overrides(opts, cell, 0))
        check_components(cfg)
        assert cfg.federation.num_clients == 25 and cfg.federation.weighting == "uniform"
        assert cfg.partition == {"name": "label_sorted", "iid_clients": 5}
        algo = cfg.algorithm
        assert algo["name"] == "fedavg" and algo["local_steps"] == 1 and algo["batch_size"] == 32
        # fedhp's damped momentum with lr / (1 − β) takes their undamped buffer's steps
        assert algo["lr"] == pytest.approx(0.01 / (1 - cell.beta))
        assert algo["client_momentum"] == cell.beta
        assert cfg.rounds == 600 and cfg.eval_every == 30
        cloud = cfg.robust.cloud
        assert cloud.bucket == (cell.s or 1)
        expected = {"Mean": "mean", "Krum": "krum", "CM": "median", "RFA": "geomed"}
        assert cloud.name == expected.get(cell.rule, "cclip")
        if cell.rule == "CClip":
            assert (cloud.tau, cloud.clip_iters) == (pytest.approx(0.1), 3)
        if cell.rule == "RFA":
            assert (cloud.max_iter, cloud.nu, cloud.tol) == (8, pytest.approx(0.001), 0)
        if cell.rule == "Krum":
            assert cloud.f == 5
        attack = cfg.faults.attack
        if cell.attack == "none":
            assert attack.name == "none"
            continue
        assert attack.fraction == 0.2 and attack.placement == "concentrated"
        names = {"BF": "sign_flip", "LF": "label_flip", "IPM": "ipm", "ALIE": "alie"}
        assert attack.name == names.get(cell.attack, "sign_flip")
        if attack.name == "sign_flip":  # BF-scaled: their plain −g beside undamped momenta
            scale = 1.0 - cell.beta if cell.attack == "BF-scaled" else 1.0
            assert attack.sign_scale == pytest.approx(scale) and (cell.beta > 0 or scale == 1)
        if cell.attack == "ALIE":
            assert attack.z == pytest.approx(0.2533, abs=1e-4)
        # one edge: the concentrated attackers are the first 5 clients, the IID ones
        bad = malicious_clients(attack, 0, torch.zeros(25, dtype=torch.long))
        assert bad.nonzero().flatten().tolist() == [0, 1, 2, 3, 4]
    quick = rp.cells(ReproOptions(dataset="mnist", quick=True))
    assert {c.rule for c in quick} == {"Mean", "CM", "CClip"}
    assert len(quick) == 2 * 3 + 2 * 2 * 2 * 2
    quick_cfg = resolve_config(None, rp.run_overrides(ReproOptions(quick=True), quick[0], 0))
    assert quick_cfg.rounds == 40 and quick_cfg.eval_every == 10


def toy(n: int = 200, classes: int = 4) -> DatasetArrays:
    """Row ``i`` holds feature ``i``; labels in shuffled order, ``n // classes`` each."""
    gen = torch.Generator().manual_seed(0)
    y = torch.arange(n) % classes
    y = y[torch.randperm(n, generator=gen)]
    return DatasetArrays(
        name="toy",
        train_x=torch.arange(n, dtype=torch.float32).unsqueeze(1),
        train_y=y,
        test_x=torch.arange(40, dtype=torch.float32).unsqueeze(1),
        test_y=torch.arange(40) % classes,
        num_classes=classes,
    )


def test_label_sorted_split() -> None:
    data = toy()
    clients = split_dataset(data, {"name": "label_sorted", "iid_clients": 2}, 6, seed=3)
    good = clients[2:]
    # 4 sorted chunks of 50 = the whole training set, each chunk one label (sorted order)
    rows = torch.cat([c.train_x.squeeze(1) for c in good]).long()
    assert sorted(rows.tolist()) == list(range(200))
    assert [sorted(set(c.train_y.tolist())) for c in good] == [[0], [1], [2], [3]]
    for c in clients[:2]:  # IID draws of the same size from the whole set, distinct rows
        assert len(c.train_y) == 50 and len(set(c.train_x.squeeze(1).tolist())) == 50
        assert len(set(c.train_y.tolist())) > 1
    # the test set dealt over every client, each image once
    test = torch.cat([c.test_x.squeeze(1) for c in clients]).long()
    assert sorted(test.tolist()) == list(range(40))
    again = split_dataset(data, {"name": "label_sorted", "iid_clients": 2}, 6, seed=3)
    assert torch.equal(again[0].train_x, clients[0].train_x)


def test_label_sorted_bad_option_is_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "run",
        "dataset.name=mnist",
        "partition.name=label_sorted",
        "partition.iid_clients=25",
        "federation.num_clients=25",
        "--check",
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "partition.iid_clients" in err


def fake_run(overrides: list[str], folder: Path) -> dict[str, Any]:
    """90 % attack-free; CM under BF falls to 5 %; every other attacked run 80 % (85 % with
    buckets of 2)."""
    text = " ".join(overrides)
    acc = 0.9
    if "robust.cloud.name=median" in text and "sign_flip" in text:
        acc = 0.05
    elif "faults.attack" in text:
        acc = 0.8 + (0.05 if "bucket=2" in text else 0.0)
    return {"final_global_acc": acc, "seconds": 0.1}


def test_reproduce_lines_and_tables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(common, "run_config", fake_run)
    assert "robust-paper" in REPRODUCTIONS
    out = tmp_path / "out"
    assert main(["reproduce", "robust-paper", "--quick", "--out", str(out), "--seeds", "2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "robust-paper trivial baseline (majority class) acc=0.1135"
    body = lines[1:]
    assert len(body) == 22 and all(LINE.match(x) for x in body), body[:3]
    assert "robust-paper BF CM s=0 beta=0.9 acc=0.0500 last5=nan ▼" in body
    assert "robust-paper ALIE CClip s=2 beta=0 acc=0.8500 last5=nan" in body
    table = (out / "table.md").read_text()
    assert "### β = 0.9" in table and "| CM | none |  | 5.0 ± 0.0 (nan) ▼ |" in table
    data = json.loads((out / "table.json").read_text())
    assert data["seeds"] == 2 and len(data["results"]) == 22 and data["trivial"] == 0.1135
    assert sum(r["trivial"] for r in data["results"]) == 4  # CM under BF: 2 s × 2 β


def test_bad_options_are_one_line_errors(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, text in (
        (["--dataset", "fmnist"], "--dataset"),
        (["--model", "vgg"], "--model"),
        (["--methods", "CM"], "--methods"),
    ):
        assert main(["reproduce", "robust-paper", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and text in err


def test_tiny_real_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Real runs through the CLI, cut to the mean (attack-free and under ALIE) and CClip under
    ALIE at β = 0.9 (3 runs of 2 rounds)."""
    monkeypatch.setattr(rp, "MOMENTA", (0.9,))
    monkeypatch.setattr(rp, "BUCKETS", (2,))
    monkeypatch.setattr(rp, "QUICK_RULES", ("CClip",))
    monkeypatch.setattr(rp, "QUICK_ATTACKS", ("ALIE",))
    out = tmp_path / "tiny"
    argv = ["reproduce", "robust-paper", "--quick", "--rounds", "2", "--out", str(out)]
    assert main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4 and all(LINE.match(x) for x in lines[1:]), lines
    data = json.loads((out / "table.json").read_text())
    assert all(0.0 < r["acc"] <= 1.0 and r["last5"] == r["last5"] for r in data["results"])
    config = (out / "runs/CClip-ALIE-s2-m0.9/seed0/config.yaml").read_text()
    assert "label_sorted" in config and "bucket: 2" in config and "local_steps: 1" in config
