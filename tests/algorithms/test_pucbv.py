"""P-UCBV on a hand-worked sequence: split, elimination, ψ/ε schedule, rewards and scores."""

from __future__ import annotations

import math

import pytest
import torch

from fedhp.algorithms.pucbv import PUCBV, exploration_xi, utility


def test_utility_by_hand() -> None:
    assert utility(0.0) == 0.0
    assert utility(0.3) == pytest.approx(10 - 20 / (1 + math.exp(0.105)))
    assert utility(100.0) == pytest.approx(10.0, abs=1e-9)  # percent scale: saturated


def _bandit() -> PUCBV:
    xi = exploration_xi(rounds=100, num_clients=100, fraction=0.1)
    assert xi == 10.0
    bandit = PUCBV.create(xi, u_arm=0.45, u_point=0.5)  # arm 2 = [0.4, 0.6), midpoint
    assert bandit.ratio == pytest.approx(0.5)
    assert [x for a in bandit.arms for x in (a.low, a.high)] == pytest.approx(
        [0.0, 0.2, 0.2, 0.4, 0.4, 0.6, 0.6, 0.8, 0.8, 1.0]
    )
    assert bandit.psi == pytest.approx(10 / 25)
    bandit.accuracy = 0.10  # a^{-1}: the initial model on the client's data
    return bandit


def test_split_reward_scores_and_choice() -> None:
    bandit = _bandit()
    # round 1: a = 0.30 at T = 2 s; +20 points: split [0.4,0.6) at 0.5, nothing deleted
    s = bandit.update(0.30, 2.0, u=0.5)
    g = (utility(0.30) - utility(0.10)) / 2.0
    assert g == pytest.approx(0.1748, abs=1e-4)
    lows = [a.low for a in bandit.arms]
    assert lows == pytest.approx([0.0, 0.2, 0.4, 0.5, 0.6, 0.8])
    assert bandit.epsilon == 0.5 and bandit.psi == pytest.approx(10 / 36)
    log_term = math.log(10 * (10 / 36) * 0.5)
    pulled = g + math.sqrt(0.5 * 2 * log_term / (4 * 2))
    unpulled = math.sqrt(0.5 * 2 * log_term / (4 * 1))
    assert bandit.score(bandit.arms[2]) == pytest.approx(pulled)
    assert bandit.score(bandit.arms[0]) == pytest.approx(unpulled)
    assert pulled > unpulled
    # the two children tie: the lower interval [0.4, 0.5) wins, s at u = 0.5 inside it
    assert s == pytest.approx(0.45)


def test_elimination_and_greedy_phase() -> None:
    bandit = _bandit()
    bandit.update(0.30, 2.0, u=0.5)  # s = 0.45
    # round 2: a = 0.20 (−10 points < Δ = −5): [0.4,0.5) splits at 0.45, [0.4,0.45) is deleted
    s = bandit.update(0.20, 4.0, u=0.0)
    lows = [x for a in bandit.arms for x in (a.low, a.high)]
    assert lows == pytest.approx([0.0, 0.2, 0.2, 0.4, 0.45, 0.5, 0.5, 0.6, 0.6, 0.8, 0.8, 1.0])
    assert bandit.epsilon == 0.25 and bandit.psi == pytest.approx(10 / 36)
    assert math.log(10 * (10 / 36) * 0.25) < 0  # exploration term clamped: greedy from here
    g1 = (utility(0.30) - utility(0.10)) / 2.0
    g2 = (utility(0.20) - utility(0.30)) / 4.0
    child = bandit.arms[2]
    # inherited statistics + the new reward
    assert (child.pulls, child.total, child.total_sq) == pytest.approx((2, g1 + g2, g1**2 + g2**2))
    assert bandit.score(child) == pytest.approx((g1 + g2) / 2)
    assert bandit.score(bandit.arms[3]) == pytest.approx(g1)  # [0.5, 0.6): untouched, best
    assert s == pytest.approx(0.5)


def test_floor_state_round_trip_and_bad_input() -> None:
    bandit = PUCBV.create(10.0, u_arm=0.0, u_point=0.0)  # arm [0, 0.2) at its bottom
    assert bandit.ratio == pytest.approx(1 / 16)
    with pytest.raises(ValueError, match="initial accuracy"):
        bandit.update(0.5, 1.0, u=0.5)
    bandit.accuracy = 0.1
    with pytest.raises(ValueError, match="cost must be > 0"):
        bandit.update(0.5, 0.0, u=0.5)
    bandit.update(0.5, 1.0, u=0.3)
    copy = PUCBV.create(10.0, u_arm=0.9, u_point=0.9)
    copy.load_rows(*bandit.to_rows(8))
    assert copy.update(0.6, 1.0, u=0.7) == bandit.update(0.6, 1.0, u=0.7)
    for a, b in zip(copy.to_rows(8), bandit.to_rows(8), strict=True):
        torch.testing.assert_close(a, b, equal_nan=True, atol=0, rtol=0)
    with pytest.raises(ValueError, match="exceed"):
        bandit.to_rows(2)


def test_code_preset_arms_over_upper_half() -> None:
    bandit = PUCBV.create(10.0, u_arm=0.0, u_point=0.0, low=0.5, high=1.0)
    assert [x for a in bandit.arms for x in (a.low, a.high)] == pytest.approx(
        [0.5, 0.6, 0.6, 0.7, 0.7, 0.8, 0.8, 0.9, 0.9, 1.0]
    )
    assert bandit.ratio == pytest.approx(0.5)
