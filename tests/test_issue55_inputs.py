"""Inputs issue 55 found silent or unclear, each now one line (exit 2) or the right behaviour:
reproduce flags a reproduction does not read, a ``--tuned`` file without choices, ``--out`` /
``--runs`` that are files, both commands' ``--seeds`` on their help lines, a YAML file with a
``sweep:`` section given to ``fedhp run``, and the ``results:`` line naming only the files
written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedhp.cli import RESULTS, main

TINY = [
    "model.name=mlr",
    "rounds=3",
    "eval_every=1",
    "threads=1",
    "progress=false",
    "subsample.train=600",
    "subsample.test=300",
    "partition.train_per_class=30",
    "partition.test_per_class=15",
    "federation.num_clients=6",
    "federation.num_edges=2",
    "algorithm.name=fedavg",
    "algorithm.local_steps=2",
]


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.startswith("fedhp: error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["sfedhp-table1", "--quick"], "--quick: sfedhp-table1 does not read it (read by fnrfl"),
        (["sfedhp-table1", "--leak"], "--leak: sfedhp-table1 does not read it (read by fnrfl-"),
        (["sfedhp-table1", "--gamma", "0.1"], "--gamma: sfedhp-table1 does not read it"),
        (["fnrfl-table2", "--gamma", "0.1"], "--gamma: fnrfl-table2 does not read it"),
        (["sfedhp-lambda", "--skews", "label"], "--skews: sfedhp-lambda does not read it"),
        (["fedht-sim1", "--path", "x.svm"], "--path: fedht-sim1 does not read it"),
        (["dp", "--tuned", "t.json"], "--tuned: dp does not read it"),
    ],
    ids=["quick", "leak", "gamma", "gamma-fnrfl", "skews", "path", "tuned"],
)
def test_a_flag_the_reproduction_does_not_read_is_refused(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["reproduce", *argv, "--out", str(tmp_path / "o")]) == 2
    assert says in one_line(capsys)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("content", ["{}", '{"fmnist-s1": {"choices": {"sfedhp": {}}}}', "x"])
def test_a_tuned_file_without_choices_for_the_setting_is_refused(
    content: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    tuned = tmp_path / "tuned.json"
    tuned.write_text(content)
    argv = ["reproduce", "sfedhp-table1", "--tuned", str(tuned), "--out", str(tmp_path / "o")]
    assert main(argv) == 2
    err = one_line(capsys)
    assert f"--tuned {tuned}: " in err and "fedhp reproduce sfedhp-tune --dataset mnist" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("flag", ["--out", "--runs"])
def test_out_and_runs_that_are_files_name_the_flag(
    flag: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    assert main(["reproduce", "sfedhp-table1", flag, str(afile)]) == 2
    assert f"{flag} {afile}: is a file; name a folder" in one_line(capsys)


def test_seeds_are_documented_on_both_help_lines(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("reproduce", "sweep"):
        assert main([command, "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "how many seeds: N runs seeds 0..N-1, so --seeds 3 is seeds 0, 1, 2" in text
    assert "the seeds themselves, e.g. 0,1,2 or 0-4; --seeds 3 is seed 3 alone" in text


def test_run_points_a_sweep_file_to_fedhp_sweep(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "lam.yaml"
    path.write_text("rounds: 2\nsweep:\n  grid:\n    algorithm.lam: [15, 20]\n")
    assert main(["run", str(path), "--out", str(tmp_path / "o")]) == 2
    assert f"run it with `fedhp sweep {path}`" in one_line(capsys)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("every", [0, 1])
def test_the_results_line_names_the_files_written(
    every: int, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out = tmp_path / "run"
    assert main(["run", *TINY, f"checkpoint_every={every}", "--out", str(out)]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    named = line.split("(", 1)[1].split(";")[0].split(", ")
    assert named == [n for n in RESULTS.split(", ") if (out / n).is_file()]
    assert ("checkpoint.prev.pt" in named) == (every == 1)  # none under checkpoint_every=0
    assert json.loads((out / "summary.json").read_text())["rounds"] == 3
