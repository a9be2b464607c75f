"""``benchmarks/run_rows_ops.py`` at a tiny size: it counts what S runs launch alone and
stacked, and the stacked round launches fewer kernels than the runs alone."""

from __future__ import annotations

from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def test_stacked_rounds_launch_fewer_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import run_rows_ops

    from fedhp.engine import run_rows

    tiny = ["federation.num_clients=4", "federation.num_edges=2"]
    for method, work in [
        ("sfedhp", ["algorithm.R=2", "algorithm.K=1"]),
        ("pfedme", ["algorithm.R=2", "algorithm.K=1"]),
        ("fedprox", ["algorithm.local_steps=2"]),
        ("scaffold", ["algorithm.local_steps=2"]),
        ("local", ["algorithm.local_steps=2"]),
        ("ditto", ["algorithm.local_steps=2"]),
    ]:
        argv = ["--method", method, "--values", "0.1,0.2", "--seeds", "0,1", *tiny, *work]
        out = run_rows_ops.main(argv)
        assert out["runs"] == (2 if method == "local" else 4), method
        assert 0 < out["train_stacked"] < out["train_alone"], method
        assert out["round_ratio"] > 1 and out["evaluation"] > 0, method
    assert not run_rows.GATHER_ON_CPU  # (put back)


@pytest.mark.parametrize(
    ("method", "steps"),
    [
        ("sfedhp", "algorithm.R"),
        ("pfedme", "algorithm.R"),
        ("fedprox", "algorithm.local_steps"),
        ("hierfavg", "algorithm.kappa2"),  # (and alone: billed once, at the round's end)
        ("perfedavg", "algorithm.local_steps"),
        ("heurfedamp", "algorithm.local_steps"),
    ],
)
def test_a_stacked_round_reads_nothing_back_per_local_step(
    monkeypatch: pytest.MonkeyPatch, method: str, steps: str
) -> None:
    """A stacked round's host syncs (a device value read on the host: ``.item()``, ``bool``) do
    not grow with its local steps: none inside the batch's local-step loop."""
    monkeypatch.syspath_prepend(str(BENCH))
    import run_rows_ops

    tiny = ["federation.num_clients=4", "federation.num_edges=2", "algorithm.K=2"]
    tiny = tiny if method in ("sfedhp", "pfedme") else tiny[:2]
    syncs, alone = [], []
    for n in (2, 5):
        argv = ["--method", method, "--values", "0.1,0.2", "--seeds", "0,1", *tiny, f"{steps}={n}"]
        out = run_rows_ops.main(argv)
        syncs.append(out["train_syncs_stacked"])
        alone.append(out["train_syncs_alone"])
    assert syncs[0] == syncs[1], syncs
    if method == "hierfavg":  # its round alone reads nothing back per edge round either
        assert alone[0] == alone[1] > 0, alone


def test_graphs_count_fewer_launches_for_the_stacked_round(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--graphs``: sFedHP's stacked round with its θ steps replayed (one launch per replay)
    launches fewer kernels than without."""
    monkeypatch.syspath_prepend(str(BENCH))
    import run_rows_ops

    tiny = ["federation.num_clients=4", "federation.num_edges=2", "algorithm.R=2"]
    argv = ["--method", "sfedhp", "--values", "15,25", "--seeds", "0,1", "--graphs", *tiny]
    out = run_rows_ops.main(argv)
    assert 0 < out["train_stacked_graphs"] < out["train_stacked"]
    assert 0 < out["train_alone_graphs"] < out["train_alone"]
    assert out["round_ratio_vs_plain"] > out["round_ratio"]
