"""benchmarks/bench_robust.py (issue 41's cost must-show): the rule options it builds, its FLOP
counts, and the rule alone against the mean on rows whose aggregates are known."""

from __future__ import annotations

from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(autouse=True)
def _benchmarks_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))


def test_multi_krum_assumes_a_fifth_of_the_rows_within_what_it_can_take() -> None:
    import bench_robust

    assert bench_robust.rule_options("multi_krum", 100) == ["name=multi_krum", "f=20"]
    assert bench_robust.rule_options("multi_krum", 10) == ["name=multi_krum", "f=2"]
    assert bench_robust.rule_options("multi_krum", 6) == ["name=multi_krum", "f=1"]  # n > 2f+2
    assert bench_robust.rule_options("cclip-bucket2", 50) == ["name=cclip", "bucket=2"]


def test_flop_counts_follow_each_rule_s_algorithm() -> None:
    import bench_robust

    n, p = 100, 1000
    assert bench_robust.rule_gflop("mean", n, p) == pytest.approx(2 * n * p / 1e9)
    assert bench_robust.rule_gflop("multi_krum", n, p) == pytest.approx(
        (1.5 * n * n * p + 2 * n * p) / 1e9
    )
    assert bench_robust.rule_gflop("cclip-bucket2", n, p) == bench_robust.rule_gflop("cclip", n, p)
    # Multi-Krum's Gram matrix grows with n², the others with n
    ratio = bench_robust.rule_gflop("multi_krum", 10 * n, p) / bench_robust.rule_gflop(
        "multi_krum", n, p
    )
    assert ratio > 90


def test_every_rule_times_on_small_rows() -> None:
    import bench_robust

    for rule in bench_robust.RULES:
        assert bench_robust.aggregate_seconds(rule, 12, 50, repeats=1) > 0
