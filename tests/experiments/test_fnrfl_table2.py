"""``fedhp reproduce fnrfl-table2``: its configurations, result lines, κ/ρ and the leak mode,
end to end on fabricated CIFAR-10 batches (tiny: a subsample, one round)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fedhp.cli import main
from fedhp.config import resolve_config
from fedhp.errors import ConfigError
from fedhp.experiments import fnrfl
from fedhp.experiments.common import ReproOptions
from tests.experiments.test_reproduce import write_cifar

LINE = re.compile(r"^fnrfl (\S+) (\S+) acc=([0-9.]+) traffic_mb=([0-9.]+) time_s=([0-9.]+)$")
TINY = ["subsample.train=200", "subsample.test=100", "public.per_class=2"]


def _cli(tmp_path: Path, out: str, *extra: str) -> int:
    return main(
        [
            "reproduce",
            "fnrfl-table2",
            *TINY,
            "--dataset",
            "cifar10",
            "--data-dir",
            str(tmp_path / "cifar"),
            "--quick",
            "--rounds",
            "1",
            "--out",
            str(tmp_path / out),
            *extra,
        ]
    )


def test_every_row_resolves_for_every_skew_and_the_paper_setup() -> None:
    for leak in (False, True):
        opts = ReproOptions(dataset="fmnist", leak=leak)
        for skew in fnrfl.SKEWS:
            for method in fnrfl.METHODS:
                cfg = resolve_config(None, fnrfl.run_overrides(opts, skew, method, 0))
                algo = cfg.algorithm
                assert cfg.federation.num_clients == 10 and cfg.rounds == 10
                assert algo["lr"] == 0.1 and algo["batch_size"] == 64
                assert algo["local_epochs"] == 10 and cfg.federation.weighting == "samples"
                assert cfg.model["name"] == "resnet18"
                assert cfg.public.source == ("test" if leak else "holdout")
                if method.endswith("fnrfl"):
                    assert algo["refine_epochs"] == 5 and algo["refine_batch"] == 32
                    assert algo.get("allow_test_leak", False) is leak
    feature = fnrfl.skew_overrides("feature", "fmnist")
    assert "partition.noise=0.283286" in feature and "partition.resample=true" in feature
    with pytest.raises(ConfigError, match="--skews: unknown 'nope'"):
        fnrfl.skew_overrides("nope", "fmnist")


def test_base_options_reach_the_wrapped_method() -> None:
    opts = ReproOptions(dataset="fmnist", quick=True)
    cfg = resolve_config(None, fnrfl.run_overrides(opts, "label", "moon+fnrfl", 0))
    assert cfg.algorithm["base"] == "moon"
    assert cfg.algorithm["base_options"] == {"mu": 1.0, "temperature": 0.5}
    cfg = resolve_config(None, fnrfl.run_overrides(opts, "label", "fedprox", 0))
    assert cfg.algorithm["mu"] == 0.01 and cfg.subsample.train == 2000


def test_row_kappa_rho_and_the_paper_traffic_convention() -> None:
    summaries = [
        {
            "final_global_balanced_acc": acc,
            "best_global_balanced_acc": acc + 0.1,
            "final_global_acc": acc,
            "communication": {"bytes_total": 2e6},
            "seconds": 50.0,
            "num_params": 11_173_962,
            "rounds": 10,
            "folder": "x",
        }
        for acc in (0.4, 0.6)
    ]
    row = fnrfl.row_of("label", "scaffold", summaries)
    assert row["acc"]["mean"] == pytest.approx(0.5)
    assert row["kappa"]["mean"] == pytest.approx(0.5 * 1e4 / 50)
    assert row["rho"]["mean"] == pytest.approx(0.5 * 1e4 / 2.0)
    assert row["paper_acc"] == {"resnet18": 0.9077, "vgg11": 0.8657}
    # Table 3: 8,920 MB = 2 × 10 clients × 10 rounds × 44.6 MB (SCAFFOLD × 1.5: 13,380)
    assert row["paper_convention_traffic_mb"] == pytest.approx(1.5 * 8939.2, rel=1e-4)
    assert fnrfl.row_of("label", "scaffold+fnrfl", summaries)["paper_acc"] is None


@pytest.mark.slow
def test_end_to_end_on_fabricated_cifar(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_cifar(tmp_path / "cifar", per_class=30)
    methods = "fnrfl,fedavg,scaffold+fnrfl"
    assert _cli(tmp_path, "h", "--skews", "feature", "--methods", methods) == 0
    lines = [m.groups() for m in map(LINE.match, capsys.readouterr().out.splitlines()) if m]
    assert [(s, m) for s, m, *_ in lines] == [("feature", m) for m in methods.split(",")]
    table = json.loads((tmp_path / "h" / "table.json").read_text())
    rows = {(r["skew"], r["method"]): r for r in table["rows"]}
    # the refined clients upload a second time: FNR-FL moves more than FedAvg
    assert (
        rows[("feature", "fnrfl")]["traffic_mb"]["mean"]
        > rows[("feature", "fedavg")]["traffic_mb"]["mean"]
    )
    assert not any(r["test_leak"] for r in table["rows"])
    assert (tmp_path / "h" / "acc-feature.png").stat().st_size > 1000
    assert "paper CIFAR-10" in (tmp_path / "h" / "table.md").read_text()


def test_leak_mode_marks_the_rows(tmp_path: Path) -> None:
    write_cifar(tmp_path / "cifar", per_class=30)
    assert _cli(tmp_path, "l", "--leak", "--skews", "label", "--methods", "fnrfl") == 0
    table = json.loads((tmp_path / "l" / "table.json").read_text())
    assert table["leak"] and all(r["test_leak"] for r in table["rows"])
    assert "⚠ test leak" in (tmp_path / "l" / "table.md").read_text()


def test_paper_columns_only_beside_cifar10_rows() -> None:
    """The paper ran CIFAR-10 only: a Fashion-MNIST table carries no paper accuracy or time."""
    stat = {"mean": 0.8, "std": 0.0}
    row = {
        "skew": "feature",
        "method": "fedavg",
        "label": "FedAvg",
        "test_leak": False,
        "acc": stat,
        "best_acc": stat,
        "paper_acc": {"resnet18": 0.6001, "vgg11": 0.5},
        "traffic_mb": stat,
        "paper_convention_traffic_mb": 79.1,
        "time_s": stat,
        "kappa": stat,
        "rho": stat,
    }
    fmnist = fnrfl.markdown([row], "vgg", "fmnist")
    assert "paper CIFAR-10" not in fmnist and "0.6001" not in fmnist and "paper time" not in fmnist
    cifar = fnrfl.markdown([row], "resnet18", "cifar10")
    assert "paper CIFAR-10 resnet18" in cifar and "| 0.6001 |" in cifar
