"""Divergence guard: stop at the first bad round, one line, last good state kept."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch

from fedhp.algorithms import ALGORITHMS
from fedhp.build import build_experiment
from fedhp.cli import main
from fedhp.config import resolve_config
from fedhp.engine.checkpoint import CHECKPOINT_FILE, load_checkpoint
from fedhp.engine.runner import run_experiment
from fedhp.errors import DivergenceError

FAST = [
    "progress=false",
    "threads=2",
    "model.name=mlr",
    "rounds=3",
    "eval_every=1",
    "algorithm.name=fedavg",
]
# (algorithm overrides, text the message must contain); sfedhp runs once it is registered.
DIVERGING = {
    "sfedhp": (
        ["algorithm.name=sfedhp", "algorithm.lam=1e4", "algorithm.R=2", "algorithm.K=2"],
        "λ·η",
    ),
    "fedprox": (
        ["algorithm.name=fedprox", "algorithm.mu=1e4", "algorithm.lr=1", "algorithm.local_steps=2"],
        "μ·η",
    ),
}


@pytest.mark.parametrize("name", sorted(DIVERGING))
def test_huge_penalty_stops_with_one_line(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert name in ALGORITHMS.names(), f"{name} is not registered"
    overrides, cause = DIVERGING[name]
    out = tmp_path / "run"
    base = [a for a in FAST if not a.startswith("algorithm.name=")]  # (given twice: a warning)
    code = main(["run", "--out", str(out), *base, *overrides])
    err = capsys.readouterr().err
    assert code == DivergenceError.exit_code != 0
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"fedhp: error: round 1: {name} diverged") and cause in err, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 0 and "diverged" in summary["stopped"]
    ckpt = load_checkpoint(out / CHECKPOINT_FILE)
    assert ckpt["round"] == 0
    assert all(bool(torch.isfinite(v).all()) for v in ckpt["state"].values())
    assert not (out / "final_state.pt").exists()


def test_divergence_mid_run_keeps_rounds_before_it(tmp_path: Path) -> None:
    exp = build_experiment(resolve_config(None, [*FAST, "rounds=5", "checkpoint_every=10"]))
    original = exp.algorithm.run_round

    def poisoned(state: dict[str, torch.Tensor], rnd: int) -> dict[str, float]:
        stats = original(state, rnd)
        if rnd == 2:
            state["global"][0] = math.nan
        return stats

    exp.algorithm.run_round = poisoned  # type: ignore[method-assign]
    with pytest.raises(DivergenceError, match=r"^round 3: fedavg diverged \(non-finite"):
        run_experiment(exp, tmp_path)
    with (tmp_path / "metrics.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [r["round"] for r in rows] == ["1", "2"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["rounds"] == 2 and summary["final_global_acc"] == float(rows[-1]["global_acc"])
    assert summary["communication"]["messages_client_cloud_up"] == 2 * 20  # not the bad round's
    ckpt = load_checkpoint(tmp_path / CHECKPOINT_FILE)
    assert ckpt["round"] == 2 and bool(torch.isfinite(ckpt["state"]["global"]).all())


def test_loss_above_max_loss_counts_as_divergence() -> None:
    exp = build_experiment(resolve_config(None, [*FAST, "rounds=1", "max_loss=1e-3"]))
    with pytest.raises(DivergenceError, match="max_loss"):
        run_experiment(exp, None)


def test_the_hint_blames_a_penalty_only_when_it_is_stiff() -> None:
    from types import SimpleNamespace

    from fedhp.engine.divergence import likely_cause

    weights = {"lam": "λ", "mu": "μ"}  # what the options declare (``penalty_weights``)
    hint = likely_cause(SimpleNamespace(lr=0.1, mu=0.01, penalty_weights=weights))
    assert hint.startswith("learning rate too large")
    hint = likely_cause(SimpleNamespace(lr=0.05, lam=15.0, penalty_weights=weights))
    assert hint.startswith("λ·η = 0.75 too large")
    assert "algorithm.lr=0.1" in likely_cause(SimpleNamespace(lr=0.1, lam=0.1))
