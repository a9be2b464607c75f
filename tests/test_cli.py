"""The command line: one-line errors for bad input, listing, and a real run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from fedhp.cli import main

BAD = [
    (["algorithm.name=nosuch"], "algorithm.name"),
    (["algorithm.lr=-0.1"], "algorithm.lr"),
    (["partition.labels_per_client=11"], "labels_per_client"),
    (["rounds=0"], "rounds"),
    (["federation.edges_per_round=9"], "edges_per_round"),
    (["model.name=resnet999"], "model.name"),
    (["dataset.name=imagenet"], "dataset.name"),
    (["no_such_key=1"], "no_such_key"),
    (["algorithm.lr=fast"], "algorithm.lr"),
    (["oops"], "config file oops"),
]


@pytest.mark.parametrize(("args", "field"), BAD, ids=[b[1] for b in BAD])
def test_bad_config_is_one_line_error(
    args: list[str], field: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(
        ["run", *args, "rounds=1" if "rounds" not in field else "seed=0", "--out", str(tmp_path)]
    )
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert field in lines[0] and "Traceback" not in err


def test_bad_config_in_subprocess_has_no_traceback(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fedhp.cli", "run", "algorithm.lr=-1", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "algorithm.lr" in proc.stderr


def test_list_shows_every_registry(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for word in (
        "fedavg",
        "fedprox",
        "hierfavg",
        "mnist",
        "fmnist",
        "cifar10",
        "dnn",
        "vgg",
        "labels",
        "dirichlet",
    ):
        assert word in out
    assert out.count("theta_init (round|warm|reset): where theta starts") == 2  # pFedMe, sFedHP


def test_yaml_config_and_overrides(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "exp.yaml"
    cfg.write_text("rounds: 2\nmodel: {name: mlr}\nalgorithm: {name: fedprox, mu: 0.1}\n")
    out = tmp_path / "out"
    assert (
        main(["run", str(cfg), "algorithm.local_steps=2", "progress=false", "--out", str(out)]) == 0
    )
    resolved = (out / "config.yaml").read_text()
    assert "fedprox" in resolved and "mu: 0.1" in resolved and "local_steps: 2" in resolved
    assert "results:" in capsys.readouterr().out


def test_override_order_does_not_drop_options() -> None:
    from fedhp.config import resolve_config

    a = resolve_config(None, ["algorithm.lr=0.2", "algorithm.name=fedavg"])
    b = resolve_config(None, ["algorithm.name=fedavg", "algorithm.lr=0.2"])
    assert a == b and a.algorithm == {"name": "fedavg", "lr": 0.2}
    default = resolve_config(None, [])
    assert default.algorithm["name"] == "sfedhp" and "lam" in default.algorithm
