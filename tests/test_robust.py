"""Tests for fedhp.robust: hand computations, identities with the mean, clipping properties,
a sign-flip attack, and the one-line configuration errors."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fedhp.engine.robust_rules as robust
from fedhp.engine.ops import weighted_mean
from fedhp.engine.robust_rules import (
    aggregate,
    bucketed,
    clip_updates,
    clipped_mean,
    krum,
    krum_scores,
    median,
    multi_krum,
    trim_count,
    trimmed_mean,
)
from fedhp.errors import ConfigError
from fedhp.registry import validate
from fedhp.robust import RobustOptions


def t(values: Any) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def ones(n: int) -> torch.Tensor:
    return torch.ones(n)


# The Krum example: n = 5 rows in the plane, f = 1, so each row's score sums its
# n - f - 2 = 2 smallest squared distances to the others.
#   squared distances  A-B 1, A-C 4, A-D 8, A-E 162, B-C 5, B-D 5, B-E 145, C-D 4, C-E 202,
#                      D-E 170
#   scores             A 1+4=5, B 1+5=6, C 4+4=8, D 4+5=9, E 145+162=307
KRUM_ROWS = [[0.0, 0.0], [1.0, 0.0], [0.0, 2.0], [2.0, 2.0], [9.0, -9.0]]
KRUM_SCORES = [5.0, 6.0, 8.0, 9.0, 307.0]


def test_median_odd_n_is_the_middle_value_of_each_column() -> None:
    rows = t([[1, 5], [3, -1], [2, 0]])
    assert torch.equal(median(rows), t([2, 0]))


def test_median_even_n_is_the_mean_of_the_two_middle_values() -> None:
    rows = t([[1, 10], [4, 0], [2, 3], [8, -2]])
    # column 0 sorted 1 2 4 8 -> (2 + 4) / 2; column 1 sorted -2 0 3 10 -> (0 + 3) / 2
    assert torch.equal(median(rows), t([3, 1.5]))
    # not torch.median's lower median
    assert not torch.equal(median(rows), rows.median(dim=0).values)


def test_median_ignores_weights() -> None:
    rows = t([[1.0], [2.0], [30.0]])
    options = RobustOptions(name="median")
    assert torch.equal(aggregate(options, rows, t([100, 1, 1])), t([2.0]))


def test_median_of_one_row_is_the_row() -> None:
    assert torch.equal(median(t([[1.5, -2.0]])), t([1.5, -2.0]))


def test_median_of_huge_even_pair_does_not_overflow() -> None:
    big = torch.finfo(torch.float32).max
    assert torch.equal(median(t([[big], [big]])), t([big]))


@pytest.mark.parametrize(
    ("beta", "n", "k"),
    [(0.0, 10, 0), (0.1, 5, 0), (0.2, 5, 1), (0.29, 100, 29), (0.49, 2, 0), (0.4999, 10, 4)],
)
def test_trim_count_is_floor_beta_n(beta: float, n: int, k: int) -> None:
    assert trim_count(beta, n) == k


def test_trimmed_mean_drops_the_extremes_of_each_column() -> None:
    # column 0: drop 1 (row 0) and 100 (row 4), keep rows 1-3 -> (2 + 3 + 4) / 3 = 3
    # column 1: drop -5 (row 1) and 100 (row 0), keep rows 2-4 -> (0 + 1 + 2) / 3 = 1
    rows = t([[1, 100], [2, -5], [3, 0], [4, 1], [100, 2]])
    assert torch.allclose(trimmed_mean(rows, ones(5), 0.2), t([3, 1]))


def test_trimmed_mean_weights_the_kept_rows_of_each_column() -> None:
    rows = t([[1, 100], [2, -5], [3, 0], [4, 1], [100, 2]])
    weights = t([1, 2, 1, 1, 1])
    # column 0 keeps rows 1, 2, 3 (weights 2, 1, 1): (2*2 + 3 + 4) / 4 = 2.75
    # column 1 keeps rows 2, 3, 4 (weights 1, 1, 1): (0 + 1 + 2) / 3 = 1
    assert torch.allclose(trimmed_mean(rows, weights, 0.2), t([2.75, 1]))


def test_trimmed_mean_with_beta_zero_is_the_weighted_mean() -> None:
    gen = torch.Generator().manual_seed(0)
    rows = torch.randn(7, 33, generator=gen)
    weights = torch.rand(7, generator=gen) + 0.1
    got = trimmed_mean(rows, weights, 0.0)
    assert torch.allclose(got, weighted_mean(rows, weights), atol=1e-6)
    assert not torch.allclose(got, rows.mean(0), atol=1e-3)  # the weights are used


@pytest.mark.parametrize("rule", ["median", "trimmed_mean"])
def test_column_blocks_give_the_same_result(rule: str, monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(1)
    rows = torch.randn(6, 101, generator=gen)
    weights = torch.rand(6, generator=gen) + 0.1
    options = RobustOptions(name=rule, beta=0.2)
    whole = aggregate(options, rows, weights)
    monkeypatch.setattr(robust, "COLUMN_CHUNK", 6 * 7)  # blocks of 7 columns, the last of 3
    assert torch.equal(aggregate(options, rows, weights), whole)


def test_krum_scores_by_hand() -> None:
    assert torch.allclose(krum_scores(t(KRUM_ROWS), 1), t(KRUM_SCORES))


def test_krum_picks_the_row_with_the_lowest_score() -> None:
    assert torch.equal(krum(t(KRUM_ROWS), 1), t([0, 0]))


def test_multi_krum_averages_the_m_best_rows_with_their_weights() -> None:
    rows, weights = t(KRUM_ROWS), t([1, 2, 1, 1, 1])
    # the three best are A, B, C: (1*[0,0] + 2*[1,0] + 1*[0,2]) / 4
    assert torch.allclose(multi_krum(rows, weights, 1, 3), t([0.5, 0.5]))
    assert torch.allclose(multi_krum(rows, ones(5), 1, 3), t([1 / 3, 2 / 3]))


def test_multi_krum_with_m_one_is_krum() -> None:
    rows = t(KRUM_ROWS)
    assert torch.equal(multi_krum(rows, t([1, 2, 3, 4, 5]), 1, 1), krum(rows, 1))


def test_krum_ties_go_to_the_lowest_index() -> None:
    # f = 1: scores 0: 1+4, 1: 1+1, 2: 1+1, 3: 1+1, 4: 1+4 -> rows 1, 2, 3 tie
    rows = t([[0.0], [1.0], [2.0], [3.0], [4.0]])
    assert torch.allclose(krum_scores(rows, 1), t([5, 2, 2, 2, 5]))
    assert torch.equal(krum(rows, 1), t([1.0]))
    assert torch.equal(multi_krum(rows, ones(5), 1, 2), t([1.5]))


def test_krum_scores_match_a_plain_loop() -> None:
    gen = torch.Generator().manual_seed(2)
    rows = torch.randn(9, 13, generator=gen, dtype=torch.float64) * 3 + 5
    f = 2
    expected = []
    for i in range(9):
        dists = sorted(float(((rows[i] - rows[j]) ** 2).sum()) for j in range(9) if j != i)
        expected.append(sum(dists[: 9 - f - 2]))
    assert torch.allclose(krum_scores(rows, f), torch.tensor(expected, dtype=torch.float64))


def test_multi_krum_with_m_n_is_the_weighted_mean_bit_for_bit() -> None:
    gen = torch.Generator().manual_seed(3)
    rows = torch.randn(8, 21, generator=gen)
    weights = torch.rand(8, generator=gen) + 0.1
    assert torch.equal(multi_krum(rows, weights, 2, 8), weighted_mean(rows, weights))


def test_multi_krum_keeps_n_minus_f_rows_by_default() -> None:
    options = RobustOptions(name="multi_krum", f=1)
    assert options.keep(5) == 4
    rows = t(KRUM_ROWS)
    assert torch.allclose(aggregate(options, rows, ones(5)), t([0.75, 1.0]))  # mean of A B C D


def test_mean_is_fedavgs_weighted_mean_bit_for_bit() -> None:
    gen = torch.Generator().manual_seed(4)
    rows = torch.randn(5, 17, generator=gen)
    weights = torch.rand(5, generator=gen) + 0.1
    got = aggregate(RobustOptions(), rows, weights)
    assert torch.equal(got, weighted_mean(rows, weights))


def test_clip_by_hand_with_and_without_a_reference() -> None:
    updates = t([[3.0, 4.0], [0.3, 0.4]])  # norms 5 and 0.5
    assert torch.allclose(clip_updates(updates, 1.0), t([[0.6, 0.8], [0.3, 0.4]]))
    assert torch.allclose(clipped_mean(updates, ones(2), 1.0), t([0.45, 0.6]))
    reference = t([1.0, -1.0])
    options = RobustOptions(name="clip", clip_norm=1.0)
    got = aggregate(options, updates + reference, t([1.0, 3.0]), reference)
    # (1*[0.6, 0.8] + 3*[0.3, 0.4]) / 4 + reference
    assert torch.allclose(got, t([0.375 + 1.0, 0.5 - 1.0]))


def test_clip_with_every_row_under_s_is_the_weighted_mean_bit_for_bit() -> None:
    gen = torch.Generator().manual_seed(5)
    rows = torch.randn(6, 9, generator=gen)
    weights = torch.rand(6, generator=gen) + 0.1
    assert torch.equal(clipped_mean(rows, weights, 1e6), weighted_mean(rows, weights))


finite = st.floats(-1e6, 1e6, allow_nan=False, width=32)


@st.composite
def update_matrices(draw: st.DrawFn) -> torch.Tensor:
    n, p = draw(st.integers(1, 6)), draw(st.integers(1, 8))
    values = draw(st.lists(finite, min_size=n * p, max_size=n * p))
    return torch.tensor(values, dtype=torch.float32).reshape(n, p)


@settings(max_examples=200, deadline=None)
@given(updates=update_matrices(), clip_norm=st.floats(1e-3, 1e4))
def test_clipping_never_raises_a_norm(updates: torch.Tensor, clip_norm: float) -> None:
    clipped = clip_updates(updates, clip_norm)
    before = torch.linalg.vector_norm(updates, dim=1)
    after = torch.linalg.vector_norm(clipped, dim=1)
    assert bool((after <= before).all())
    assert bool((after <= clip_norm * (1 + 1e-5)).all())
    under = before <= clip_norm
    assert torch.equal(clipped[under], updates[under])  # rows under S are left alone
    mean_update = clipped_mean(updates, torch.ones(updates.shape[0]), clip_norm)
    assert float(torch.linalg.vector_norm(mean_update)) <= clip_norm * (1 + 1e-5)


def sign_flip_round() -> tuple[torch.Tensor, torch.Tensor]:
    """8 honest updates around 1 (std 0.05) and 2 attackers uploading -4x the honest mean."""
    gen = torch.Generator().manual_seed(6)
    honest = 1.0 + 0.05 * torch.randn(8, 50, generator=gen)
    attackers = (-4 * honest.mean(0)).expand(2, 50)
    return torch.cat([honest, attackers]), honest.mean(0)


@pytest.mark.parametrize(
    "options",
    [
        RobustOptions(name="median"),
        RobustOptions(name="trimmed_mean", beta=0.2),
        RobustOptions(name="krum", f=2),
        RobustOptions(name="multi_krum", f=2),
    ],
    ids=["median", "trimmed_mean", "krum", "multi_krum"],
)
def test_sign_flipped_minority_moves_the_mean_but_not_robust_rules(
    options: RobustOptions,
) -> None:
    rows, honest_mean = sign_flip_round()
    weights = torch.ones(10)
    mean_error = float(torch.linalg.vector_norm(weighted_mean(rows, weights) - honest_mean))
    robust_error = float(torch.linalg.vector_norm(aggregate(options, rows, weights) - honest_mean))
    assert mean_error > 6.0  # every coordinate moves by ~1: sqrt(50) ~ 7.1
    assert robust_error < 0.5  # within the honest spread (one honest row is ~0.35 away)


def test_krum_picks_an_honest_row_under_sign_flip() -> None:
    rows, _ = sign_flip_round()
    assert int(torch.argmin(krum_scores(rows, 2))) < 8


def test_clipping_bounds_the_attackers_pull() -> None:
    rows, honest_mean = sign_flip_round()
    weights = torch.ones(10)
    clip = RobustOptions(name="clip", clip_norm=math.sqrt(50) * 1.2)
    mean_error = float(torch.linalg.vector_norm(weighted_mean(rows, weights) - honest_mean))
    clip_error = float(torch.linalg.vector_norm(aggregate(clip, rows, weights) - honest_mean))
    assert clip_error < mean_error / 2


def config_error(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        validate(RobustOptions, data, "robust")
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("beta", [0.5, 0.7])
def test_beta_of_half_or_more_is_a_one_line_error(beta: float) -> None:
    message = config_error({"name": "trimmed_mean", "beta": beta})
    assert message.startswith("robust.beta: ")
    assert "trims every row; use a value below 0.5" in message


def test_negative_beta_is_an_error() -> None:
    assert config_error({"beta": -0.1}).startswith("robust.beta: ")


@pytest.mark.parametrize("clip_norm", [0.0, -1.0])
def test_clip_norm_of_zero_or_less_is_a_one_line_error(clip_norm: float) -> None:
    message = config_error({"name": "clip", "clip_norm": clip_norm})
    assert message.startswith("robust.clip_norm: ")
    assert "use a positive value" in message


def test_clip_without_a_norm_is_an_error() -> None:
    message = config_error({"name": "clip"})
    assert message.startswith("robust.clip_norm: ")
    assert "set clip_norm" in message


def test_infinite_clip_norm_and_unknown_keys_are_errors() -> None:
    assert config_error({"name": "clip", "clip_norm": math.inf}).startswith("robust.clip_norm")
    assert config_error({"name": "median", "betta": 0.1}).startswith("robust.betta: unknown key")
    assert config_error({"name": "bulyan"}).startswith("robust.name: ")


def test_valid_options_pass() -> None:
    options = validate(RobustOptions, {"name": "trimmed_mean", "beta": 0.49}, "robust")
    assert options.beta == 0.49
    assert validate(RobustOptions, {}, "robust").name == "mean"


def test_krum_with_f_too_large_is_a_one_line_error() -> None:
    options = RobustOptions(name="krum", f=1)
    options.check(5)  # 5 > 2*1 + 2
    with pytest.raises(ConfigError, match=r"^robust\.f: krum with f=1 needs more than") as info:
        options.check(4)
    assert "use f <= 0" in str(info.value)
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match=r"^robust\.edge\.f: .*use another rule"):
        aggregate(options, torch.zeros(2, 3), torch.ones(2), field="robust.edge")


def test_multi_krum_m_above_n_is_an_error() -> None:
    options = RobustOptions(name="multi_krum", f=0, m=6)
    options.check(6)
    with pytest.raises(ConfigError, match=r"^robust\.m: multi_krum keeps m=6 of 5 rows"):
        options.check(5)
    assert config_error({"name": "multi_krum", "m": 0}).startswith("robust.m: ")


def test_rules_that_need_no_n_accept_any_rows() -> None:
    for name in ("mean", "median", "trimmed_mean"):
        RobustOptions(name=name, f=10).check(1)


def test_bad_shapes_and_weights_are_value_errors() -> None:
    rows = torch.zeros(3, 4)
    with pytest.raises(ValueError, match="weights must be"):
        aggregate(RobustOptions(), rows, torch.ones(2))
    with pytest.raises(ValueError, match="positive"):
        aggregate(RobustOptions(), rows, t([1.0, 0.0, 1.0]))
    with pytest.raises(ValueError, match="reference must be"):
        aggregate(RobustOptions(name="clip", clip_norm=1.0), rows, torch.ones(3), torch.zeros(3))
    with pytest.raises(ValueError, match="rows must be"):
        median(torch.zeros(4))


def test_bucketing_averages_random_buckets_of_the_rows() -> None:
    """s-bucketing: the rows in the generator's random order, cut into buckets of s (the last
    one smaller), each bucket's weighted mean with its total weight."""
    rows = torch.arange(10.0).reshape(5, 2)
    weights = torch.tensor([1.0, 2.0, 1.0, 1.0, 3.0])
    out, totals = bucketed(rows, weights, 2, torch.Generator().manual_seed(7))
    order = torch.randperm(5, generator=torch.Generator().manual_seed(7))
    groups = [order[0:2], order[2:4], order[4:5]]
    for b, members in enumerate(groups):
        w = weights[members]
        torch.testing.assert_close(out[b], (w @ rows[members]) / w.sum())
        assert float(totals[b]) == float(w.sum())
    # the weighted total is preserved, and buckets of one row are the rows themselves
    torch.testing.assert_close(totals @ out, weights @ rows)
    same, _ = bucketed(rows, weights, 1, torch.Generator().manual_seed(7))
    assert sorted(same[:, 0].tolist()) == rows[:, 0].tolist()
