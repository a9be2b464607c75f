"""Issue 41's rules and attack, by hand: centered clipping (``cclip``), the geometric median
(``geomed``, smoothed Weiszfeld) and inner-product manipulation (``ipm``), with their options'
one-line errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from fedhp.config import AttackConfig
from fedhp.engine.aggregation import LevelRule
from fedhp.engine.attacks import Attack
from fedhp.engine.robust_rules import (
    aggregate,
    centered_clip,
    clipped_mean,
    geometric_median,
    weighted_mean,
)
from fedhp.errors import ConfigError
from fedhp.registry import validate
from fedhp.robust import RobustOptions

D = torch.float64


# --- centered clipping ------------------------------------------------------------------------


def test_cclip_with_infinite_radius_is_the_weighted_mean() -> None:
    rows = torch.randn(7, 5, generator=torch.Generator().manual_seed(0), dtype=D)
    w = torch.tensor([1.0, 2.0, 3.0, 1.0, 1.0, 0.5, 4.0], dtype=D)
    centre = torch.randn(5, generator=torch.Generator().manual_seed(1), dtype=D)
    for iterations in (1, 3):
        got = centered_clip(rows, w, math.inf, iterations, centre)
        torch.testing.assert_close(got, weighted_mean(rows, w), rtol=0, atol=1e-12)


def test_cclip_two_iterations_by_hand() -> None:
    """u = (3, 0), (0, 4), (0, 0), uniform weights, τ = 1, centre 0, L = 2."""
    ref = torch.tensor([10.0, -2.0], dtype=D)
    u = torch.tensor([[3.0, 0.0], [0.0, 4.0], [0.0, 0.0]], dtype=D)
    w = torch.ones(3, dtype=D)
    # iteration 1: clipped (1, 0), (0, 1), (0, 0) -> v1 = (1/3, 1/3)
    v1 = torch.tensor([1 / 3, 1 / 3], dtype=D)
    one = centered_clip(ref + u, w, 1.0, 1, None, ref)
    torch.testing.assert_close(one, ref + v1, rtol=0, atol=1e-14)
    # iteration 2: u - v1 = (8/3, -1/3) (norm √65/3 > 1: to (8, -1)/√65),
    # (-1/3, 11/3) (norm √122/3 > 1: to (-1, 11)/√122), (-1/3, -1/3) (norm √2/3 < 1: kept)
    step = (
        torch.tensor([8.0, -1.0], dtype=D) / math.sqrt(65)
        + torch.tensor([-1.0, 11.0], dtype=D) / math.sqrt(122)
        + torch.tensor([-1 / 3, -1 / 3], dtype=D)
    ) / 3
    two = centered_clip(ref + u, w, 1.0, 2, None, ref)
    torch.testing.assert_close(two, ref + v1 + step, rtol=0, atol=1e-14)
    # from a centre: one iteration around v0 = (3, 0) clips (0, 4) - v0 = (-3, 4) to (-0.6, 0.8)
    # and (0, 0) - v0 to (-1, 0); the first row is at the centre
    v0 = torch.tensor([3.0, 0.0], dtype=D)
    centred = centered_clip(ref + u, w, 1.0, 1, v0, ref)
    expected = v0 + torch.tensor([-1.6, 0.8], dtype=D) / 3
    torch.testing.assert_close(centred, ref + expected, rtol=0, atol=1e-14)


def test_cclip_one_iteration_from_zero_is_clip() -> None:
    """``clip`` is centered clipping's L = 1 case with the centre at the round's start."""
    g = torch.Generator().manual_seed(3)
    ref = torch.randn(6, generator=g, dtype=D)
    rows = ref + torch.randn(9, 6, generator=g, dtype=D)
    w = torch.rand(9, generator=g, dtype=D) + 0.1
    torch.testing.assert_close(
        centered_clip(rows, w, 0.7, 1, None, ref),
        clipped_mean(rows, w, 0.7, ref),
        rtol=0,
        atol=1e-12,
    )


def test_cclip_through_aggregate_uses_options_and_centre() -> None:
    opts = RobustOptions(name="cclip", tau=1.0, clip_iters=2)
    u = torch.tensor([[3.0, 0.0], [0.0, 4.0], [0.0, 0.0]], dtype=D)
    w = torch.ones(3, dtype=D)
    centre = torch.tensor([0.5, 0.0], dtype=D)
    torch.testing.assert_close(
        aggregate(opts, u, w, centre=centre), centered_clip(u, w, 1.0, 2, centre)
    )
    rule = LevelRule(opts, "robust.cloud")
    torch.testing.assert_close(rule(u, w, None, None, centre), centered_clip(u, w, 1.0, 2, centre))


# --- geometric median -------------------------------------------------------------------------


def brute_force_median(points: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    def objective(z: np.ndarray) -> float:
        return float(alpha @ np.linalg.norm(points - z, axis=1))

    best = min(points, key=objective)  # a start that is not the mean
    return np.asarray(
        minimize(objective, best, method="Nelder-Mead", options={"xatol": 1e-10, "fatol": 1e-12}).x
    )


def test_geomed_equals_the_brute_force_minimizer() -> None:
    points = np.array([[0.0, 0.0], [4.0, 0.0], [1.0, 3.0], [2.0, 1.0], [9.0, 7.0]])
    alpha = np.array([1.0, 2.0, 1.0, 1.5, 0.5])
    expected = brute_force_median(points, alpha / alpha.sum())
    got = geometric_median(
        torch.tensor(points, dtype=D), torch.tensor(alpha, dtype=D), 500, 1e-12, 0.0
    )
    np.testing.assert_allclose(got.numpy(), expected, atol=1e-6)
    # the objective is minimal: no better than the brute-force optimum by more than rounding
    obj = lambda z: float(alpha @ np.linalg.norm(points - z, axis=1))  # noqa: E731
    assert obj(got.numpy()) <= obj(expected) + 1e-9


def test_geomed_of_a_square_is_its_centre_and_translation_equivariant() -> None:
    square = torch.tensor([[0.0, 0.0], [2.0, 0.0], [0.0, 2.0], [2.0, 2.0]], dtype=D)
    w = torch.ones(4, dtype=D)
    torch.testing.assert_close(
        geometric_median(square, w, 4, 1e-5, 1e-6), torch.tensor([1.0, 1.0], dtype=D)
    )
    ref = torch.tensor([100.0, -50.0], dtype=D)
    torch.testing.assert_close(
        geometric_median(square + ref, w, 4, 1e-5, 1e-6, ref), ref + 1.0, rtol=0, atol=1e-12
    )


def test_geomed_with_an_outlier_stays_near_the_inliers() -> None:
    g = torch.Generator().manual_seed(0)
    inliers = 0.1 * torch.randn(9, 20, generator=g)
    w = torch.ones(10)
    centre = inliers.mean(0)
    opts = RobustOptions(name="geomed")  # RFA's defaults: 4 iterations, ν = 1e-5, tol 1e-6
    for far in (10.0, 100.0):
        rows = torch.cat([inliers, torch.full((1, 20), far)])
        got = aggregate(opts, rows, w)
        assert float((got - centre).norm()) < 0.06  # the inliers' spread is ~0.45 per row
        assert float((weighted_mean(rows, w) - centre).norm()) > 4
    # an outlier 10^7 times the inliers' spread away needs more than RFA's 4 iterations from
    # the mean: each iteration shrinks its pull by a factor of ~10 here (docs/robustness.md)
    rows = torch.cat([inliers, torch.full((1, 20), 1e6)])
    capped = aggregate(opts, rows, w)
    assert 1 < float((capped - centre).norm()) < 1e-3 * float(rows.mean(0).norm())
    more = aggregate(RobustOptions(name="geomed", max_iter=10), rows, w)
    assert float((more - centre).norm()) < 0.06


def test_geomed_weights_count() -> None:
    rows = torch.tensor([[0.0], [1.0], [5.0]], dtype=D)
    # in 1-D the weighted geometric median is the weighted median: weight 3 on 1.0 holds it there
    got = geometric_median(rows, torch.tensor([1.0, 3.0, 1.0], dtype=D), 200, 1e-12, 0.0)
    torch.testing.assert_close(got, torch.tensor([1.0], dtype=D), rtol=0, atol=1e-6)


# --- IPM --------------------------------------------------------------------------------------


def test_ipm_forges_minus_epsilon_times_the_benign_mean() -> None:
    cfg = AttackConfig(name="ipm", fraction=0.4, epsilon=0.5)
    malicious = torch.tensor([False, True, False, True, False])
    attack = Attack(cfg, malicious, seed=0)
    assert attack.on_uploads and attack.needs_whole_rounds
    start = torch.tensor([1.0, -1.0, 2.0])
    updates = torch.tensor(
        [[1.0, 2.0, 3.0], [9.0, 9.0, 9.0], [3.0, 0.0, -3.0], [7.0, 7.0, 7.0], [2.0, 4.0, 6.0]]
    )
    senders = torch.tensor([0, 1, 2, 3, 4])
    out = attack.apply(start + updates, senders, start)
    benign_mean = torch.tensor([2.0, 2.0, 2.0])  # of rows 0, 2, 4
    forged = start - 0.5 * benign_mean
    for i in (1, 3):
        torch.testing.assert_close(out[i], forged, rtol=0, atol=1e-6)
    for i in (0, 2, 4):
        assert torch.equal(out[i], start + updates[i])
    # only the senders present count (a subset of the clients: 0, 1 and 4)
    part = attack.apply((start + updates)[[0, 1, 4]], torch.tensor([0, 1, 4]), start)
    torch.testing.assert_close(part[1], start - 0.5 * torch.tensor([1.5, 3.0, 4.5]))


# --- options ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"name": "cclip", "tau": 0}, "robust.cloud.tau"),
        ({"name": "cclip", "tau": -1.0}, "robust.cloud.tau"),
        ({"name": "cclip", "clip_iters": 0}, "robust.cloud.clip_iters"),
        ({"name": "geomed", "max_iter": 0}, "robust.cloud.max_iter"),
        ({"name": "geomed", "nu": 0}, "robust.cloud.nu"),
        ({"name": "geomed", "tol": -1e-3}, "robust.cloud.tol"),
    ],
)
def test_bad_rule_options_are_one_line_errors(data: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        validate(RobustOptions, data, "robust.cloud")
    text = str(err.value)
    assert text.startswith(field + ":") and "\n" not in text, text


def test_bad_epsilon_is_one_line_error() -> None:
    with pytest.raises(ConfigError) as err:
        validate(AttackConfig, {"name": "ipm", "fraction": 0.2, "epsilon": 0}, "faults.attack")
    assert str(err.value).startswith("faults.attack.epsilon:")
