"""A start that fails before its first round leaves no folder that blocks the re-run
(``fedhp run --out D`` and ``fedhp.run(out=D)``); a run that got further, or diverged, is kept."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import fedhp
from fedhp.cli import main
from fedhp.engine import runner
from fedhp.errors import DatasetError, FedhpError

FAST = ["model.name=mlr", "rounds=2", "progress=false", "threads=1"]


def fail_in_round(monkeypatch: pytest.MonkeyPatch, at: int, error: BaseException) -> None:
    """Make round ``at`` (0-based) raise ``error`` (rounds before it finish normally)."""
    real = runner._charge_evaluation

    def charge(exp: Any, state: Any, rnd: int) -> None:
        if rnd == at:
            raise error
        real(exp, state, rnd)

    monkeypatch.setattr(runner, "_charge_evaluation", charge)


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_error_in_the_first_round_removes_the_folder_it_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "new" / "run"  # both folders made by the start
    command = ["run", *FAST, "--out", str(out)]
    fail_in_round(monkeypatch, 0, FedhpError("model.name: boom; use another model"))
    assert main(command) == 2
    assert one_error_line(capsys) == "fedhp: error: model.name: boom; use another model"
    assert not (tmp_path / "new").exists()
    monkeypatch.undo()  # the cause fixed: the same command works
    assert main(command) == 0
    assert (out / "summary.json").is_file()


def test_crash_in_the_first_round_removes_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    fail_in_round(monkeypatch, 0, RuntimeError("a bug"))
    with pytest.raises(RuntimeError, match="a bug"):
        main(["run", *FAST, "--out", str(out)])
    assert not out.exists()


def test_interrupt_in_the_first_round_removes_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    fail_in_round(monkeypatch, 0, KeyboardInterrupt())
    assert main(["run", *FAST, "--out", str(out)]) == 130
    assert "before the first round finished; nothing kept" in one_error_line(capsys)
    assert not out.exists()


def test_an_empty_folder_given_is_emptied_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "empty"
    out.mkdir()
    fail_in_round(monkeypatch, 0, FedhpError("boom"))
    assert main(["run", *FAST, "--out", str(out)]) == 2
    one_error_line(capsys)
    assert out.is_dir() and not any(out.iterdir())


def test_a_folder_that_held_files_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    fail_in_round(monkeypatch, 0, FedhpError("boom"))
    assert main(["run", *FAST, "--out", str(out), "--overwrite"]) == 2
    one_error_line(capsys)
    assert (out / "notes.txt").read_text() == "keep me" and (out / "config.yaml").is_file()


def test_a_run_past_its_first_round_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    fail_in_round(monkeypatch, 1, FedhpError("boom"))
    assert main(["run", *FAST, "eval_every=1", "--out", str(out)]) == 2
    one_error_line(capsys)
    assert (out / "config.yaml").is_file() and (out / "metrics.csv").is_file()


def test_a_divergence_in_the_first_round_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    monkeypatch.setattr(runner, "divergence_problem", lambda *args: "loss is nan")
    assert main(["run", *FAST, "--out", str(out)]) == 3
    capsys.readouterr()
    assert (out / "summary.json").is_file()  # its results (and why) are kept


def test_api_bad_data_leaves_no_folder(tmp_path: Path) -> None:
    out = tmp_path / "run"
    bad = {"name": "mnist", "data_dir": str(tmp_path / "nowhere")}
    with pytest.raises(DatasetError, match="does not exist"):
        fedhp.run(out=out, dataset=bad, rounds=1, model__name="mlr", progress=False)
    assert not out.exists()


def test_api_failed_first_round_leaves_no_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "run"
    fail_in_round(monkeypatch, 0, FedhpError("boom"))
    with pytest.raises(FedhpError, match="boom"):
        fedhp.run(out=out, rounds=1, model__name="mlr", progress=False, threads=1)
    assert not out.exists()
