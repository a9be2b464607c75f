"""``benchmarks/run_rows_ops.py`` at a tiny size: it counts what S runs launch alone and
stacked, and the stacked round launches fewer kernels than the runs alone."""

from __future__ import annotations

from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def test_stacked_rounds_launch_fewer_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import run_rows_ops

    from fedhp.algorithms import sfedhp_stacked

    monkeypatch.setattr(sfedhp_stacked._ThetaSteps, "of", sfedhp_stacked._ThetaSteps.of)
    tiny = ["algorithm.R=2", "algorithm.K=1", "federation.num_clients=4", "federation.num_edges=2"]
    out = run_rows_ops.main(["--lams", "15,20", "--seeds", "0,1", *tiny])
    assert out["runs"] == 4
    assert 0 < out["train_stacked"] < out["train_alone"]
    assert out["round_ratio"] > 1 and out["evaluation"] > 0
