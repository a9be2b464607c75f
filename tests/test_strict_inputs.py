"""Inputs that were accepted silently or failed without naming the fix (issue 42): each is now
one line naming the field and the fix (exit 2), checked before any data is loaded or any
folder is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedhp.cli import main

FAST = ["progress=false", "checkpoint_every=0"]
ONE = ["rounds=1", "model.name=mlr"]


@pytest.mark.parametrize(
    ("argv", "text"),
    [
        (["rounds=true"], "rounds: true is not an integer"),
        (["eval_every=false"], "eval_every: false is not an integer"),
        (["algorithm.lr=true"], "algorithm.lr: true is not a number"),
        (["federation.num_clients=true"], "federation.num_clients: true is not an integer"),
        (["dataset.name=shakespeare", "model.name=dnn"], "use model.name=lstm"),
        (["dataset.name=shakespeare", "model.name=mlr"], "the models that do: lstm"),
        (["dataset.name=synthetic"], "partition.name=natural federation.num_clients=30"),
        (
            ["dataset.name=synthetic", "partition.name=natural"],
            "set federation.num_clients=30",
        ),
    ],
)
def test_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], text: str
) -> None:
    out = tmp_path / "run"
    assert main(["run", "--out", str(out), *FAST, *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and text in err and "Traceback" not in err, err
    assert not out.exists()  # nothing blocks the re-run


def test_bools_stay_accepted_where_a_bool_is_meant(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--check", *FAST, "tensorboard=false", "progress=true"]) == 0


def test_empty_out_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--out", "", *FAST]) == 2
    assert "--out: an empty folder name" in capsys.readouterr().err
    assert main(["run", "--resume", " "]) == 2
    assert "--resume: an empty folder name" in capsys.readouterr().err


def test_compare_out_honours_the_extension(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    assert main(["run", "--out", str(run), *FAST, *ONE]) == 0
    starts = {"png": b"\x89PNG", "pdf": b"%PDF", "svg": b"<?xml"}
    for kind, magic in starts.items():
        fig = tmp_path / f"fig.{kind}"
        assert main(["compare", str(run), "--out", str(fig)]) == 0
        assert fig.read_bytes().startswith(magic), kind
    capsys.readouterr()
    for bad in ("fig.txt", "fig", "fig.jpg"):
        assert main(["compare", str(run), "--out", str(tmp_path / bad)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and ".png, .pdf, .svg" in err
        assert not (tmp_path / bad).exists()
