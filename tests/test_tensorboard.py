"""``tensorboard: true``: the scalars of every evaluated round, or — without the optional
tensorboard package — a one-line error before the run starts."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from fedhp.cli import main
from fedhp.reporting import read_rows
from fedhp.tensorboard import tag

ARGS = [
    "progress=false",
    "threads=2",
    "model.name=mlr",
    "eval_every=1",
    "algorithm.name=fedavg",
    "algorithm.local_steps=2",
    "rounds=3",
    "tensorboard=true",
]
HAVE_TENSORBOARD = importlib.util.find_spec("tensorboard") is not None


def test_tags() -> None:
    assert tag("global_acc") == "accuracy/global_acc"
    assert tag("edge2_personal_acc") == "accuracy/edge2_personal_acc"
    assert tag("personal_train_loss") == "loss/personal_train_loss"
    assert tag("cum_bytes_edge_cloud") == "communication/MB_edge_cloud"
    assert tag("round") is None and tag("round_bytes_total") is None


def test_scalars_match_metrics_csv(tmp_path: Path) -> None:
    if not HAVE_TENSORBOARD:  # the Makefile installs the extra: CI must run this, never skip it
        if os.environ.get("CI"):
            pytest.fail("the tensorboard extra is not installed in CI")
        pytest.skip("the optional tensorboard package is absent")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    assert main(["run", "--out", str(out), *ARGS]) == 0
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    rows = read_rows(out / "metrics.csv")
    acc = [(e.step, e.value) for e in events.Scalars("accuracy/global_acc")]
    assert acc == [(r["round"], pytest.approx(r["global_acc"], abs=1e-6)) for r in rows]
    mb = events.Scalars("communication/MB_total")[-1].value
    assert mb == pytest.approx(rows[-1]["cum_bytes_total"] / 1e6, rel=1e-6)


def test_without_tensorboard_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Hide the package whether or not it is installed (None in sys.modules fails the import).
    for name in ("tensorboard", "torch.utils.tensorboard"):
        monkeypatch.setitem(sys.modules, name, None)
    assert main(["run", "--out", str(tmp_path / "run"), *ARGS]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "tensorboard: true needs the tensorboard package" in err
    assert "pip install 'fedhp[tensorboard]'" in err
    assert not (tmp_path / "run").exists()  # stopped before anything was written
