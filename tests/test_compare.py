"""``fedhp compare``: runs grouped by configuration minus seed, one line (mean ± std band) per
group, a Markdown table of final/best values; one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedhp.cli import main
from fedhp.compare import make_groups, read_run
from fedhp.experiments.common import mean_std
from fedhp.reporting import read_rows

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FAST = [
    "progress=false",
    "threads=2",
    "model.name=mlr",
    "eval_every=1",
    "algorithm.local_steps=2",
    "rounds=2",
    "checkpoint_every=0",
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """FedAvg with seeds 0 and 1, and FedProx with seed 0."""
    root = tmp_path_factory.mktemp("runs")
    specs = {
        "fedavg-s0": ["algorithm.name=fedavg", "seed=0"],
        "fedavg-s1": ["algorithm.name=fedavg", "seed=1"],
        "fedprox": ["algorithm.name=fedprox", "algorithm.mu=0.1"],
    }
    for name, extra in specs.items():
        assert main(["run", "--out", str(root / name), *FAST, *extra]) == 0
    return [root / name for name in specs]


def test_compare_three_runs_writes_png_and_table(
    runs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    out = tmp_path / "fig.png"
    assert main(["compare", *map(str, runs), "--metric", "global_acc", "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == PNG_MAGIC
    table = (tmp_path / "fig.md").read_text()
    assert table in capsys.readouterr().out
    lines = table.splitlines()
    assert lines[0].startswith("| run | seeds | final global_acc (%) | best global_acc (%) |")
    assert len(lines) == 4  # header, rule, two groups
    finals = [read_rows(r / "metrics.csv")[-1]["global_acc"] for r in runs]
    mean, sd = mean_std([100 * float(finals[0]), 100 * float(finals[1])])
    assert lines[2].startswith("| algorithm=fedavg (2 seeds, mean ± std) | 2 | ")
    assert f"{mean:.2f} ± {sd:.2f}" in lines[2]
    assert (
        lines[3].startswith("| algorithm=fedprox | 1 | ") and f"{100 * finals[2]:.2f}" in lines[3]
    )


def test_groups_and_band(runs: list[Path]) -> None:
    from fedhp.compare import group_curve

    groups = make_groups([read_run(r) for r in runs])
    assert [len(g.runs) for g in groups] == [2, 1]
    band = group_curve(groups[0], "global_acc", "round")
    rows = [read_rows(r / "metrics.csv") for r in runs[:2]]
    assert band.x == [1.0, 2.0]
    assert band.y[-1] == pytest.approx((rows[0][-1]["global_acc"] + rows[1][-1]["global_acc"]) / 2)
    assert band.std is not None and band.std[-1] > 0  # the seeds differ
    single = group_curve(groups[1], "global_acc", "bytes")
    assert single.std is None
    assert single.x[-1] == pytest.approx(
        read_rows(runs[2] / "metrics.csv")[-1]["cum_bytes_total"] / 1e6
    )


def test_compare_errors_are_one_line(
    runs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "x.png")
    cases = [
        (["--x", "sim_time"], "--x sim_time: none of these runs records simulated time"),
        (["--metric", "nope"], "--metric nope: no run has this metrics.csv column; try one of:"),
    ]
    capsys.readouterr()
    for extra, message in cases:
        assert main(["compare", *map(str, runs), *extra, "--out", out]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err
    assert main(["compare", str(tmp_path), "--out", out]) == 2
    assert "not a fedhp run folder" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_broken_and_repeated_runs_are_left_out_with_a_line(
    runs: list[Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run whose metrics.csv is damaged, and a copy of a run (same configuration and seed),
    are left out with one warning line each; the seed count comes from the configurations."""
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(runs[0], broken)
    (broken / "metrics.csv").write_text("\x00garbage\n")
    copy = tmp_path / "copy"
    shutil.copytree(runs[0], copy)
    out = tmp_path / "fig.png"
    capsys.readouterr()
    argv = ["compare", str(runs[0]), str(copy), str(broken), str(runs[2]), "--out", str(out)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    warnings = captured.err.strip().splitlines()
    assert len(warnings) == 2 and all(w.startswith("fedhp: warning: ") for w in warnings)
    assert "broken/metrics.csv" in warnings[0] and "left out" in warnings[0]
    assert "copy" in warnings[1] and "same configuration and seed" in warnings[1]
    lines = (tmp_path / "fig.md").read_text().splitlines()
    assert len(lines) == 4 and "seeds" not in lines[2] and lines[2].split("|")[2].strip() == "1"


def test_a_default_given_or_not_is_one_group(runs: list[Path], tmp_path: Path) -> None:
    """config.yaml is compared in its resolved form: lr left at its default and lr=0.05 given
    are the same configuration (older folders list only the options given)."""
    import shutil

    import yaml

    old = tmp_path / "old"
    shutil.copytree(runs[1], old)
    config = yaml.safe_load((old / "config.yaml").read_text())
    config["algorithm"] = {"name": "fedavg", "local_steps": 2}  # as written before issue 34
    (old / "config.yaml").write_text(yaml.safe_dump(config))
    groups = make_groups([read_run(runs[0]), read_run(old)])
    assert len(groups) == 1 and "2 seeds" in groups[0].label
