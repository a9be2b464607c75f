"""Robust rules and attacks wired into the methods' aggregation levels (issue 20): a rule equal
to the mean by construction gives the mean's round; an attack changes the round, and a robust
rule at the attacked level resists it."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from fedhp.algorithms.base import Algorithm
from fedhp.algorithms.fedavg import FedAvgOptions
from fedhp.algorithms.fedht import FedHTOptions
from fedhp.algorithms.hierfavg import HierFAVGOptions
from fedhp.algorithms.perfedavg import PerFedAvgOptions
from fedhp.algorithms.pfedme import PFedMeOptions
from fedhp.algorithms.scaffold import ScaffoldOptions
from fedhp.algorithms.sfedhp import SFedHPOptions
from fedhp.config import AttackConfig
from fedhp.engine.aggregation import LevelRule
from fedhp.engine.attacks import Attack
from fedhp.engine.context import RunContext
from fedhp.robust import RobustOptions
from tests.algorithms.tiny import init_params, tiny_context

EDGES = (4, 3)
BUILDERS: dict[str, Callable[[RunContext], Algorithm]] = {
    "fedavg": lambda ctx: FedAvgOptions(local_steps=3, lr=0.2, batch_size=6).build(ctx),
    "fedht": lambda ctx: FedHTOptions(local_steps=3, lr=0.2, batch_size=6, tau=4).build(ctx),
    "perfedavg": lambda ctx: PerFedAvgOptions(local_steps=3, batch_size=6, beta=0.2).build(ctx),
    "hierfavg": lambda ctx: HierFAVGOptions(kappa1=2, kappa2=2, lr=0.2, batch_size=6).build(ctx),
    "pfedme": lambda ctx: PFedMeOptions(R=2, K=2, batch_size=6).build(ctx),
    "scaffold": lambda ctx: ScaffoldOptions(local_steps=3, lr=0.2, batch_size=6).build(ctx),
    "sfedhp": lambda ctx: SFedHPOptions(R=2, K=2, batch_size=6, lam=5.0).build(ctx),
}
FIRST_LEVEL = {"hierfavg": "edge", "sfedhp": "edge"}


def rounds(
    name: str, rules: dict[str, RobustOptions], attack: AttackConfig | None = None
) -> dict[str, torch.Tensor]:
    """Two rounds of method ``name`` on the tiny federation with ``rules`` per level."""
    ctx = tiny_context(EDGES)
    for level, options in rules.items():
        setattr(ctx, f"{level}_rule", LevelRule(options, f"robust.{level}"))
    if attack is not None:
        bad = torch.zeros(sum(EDGES), dtype=torch.bool)
        bad[[1, 5]] = True  # one malicious client under each edge
        ctx.attack = Attack(attack, bad, seed=0)
    algo = BUILDERS[name](ctx)
    state = algo.init_state(init_params(seed=3))
    for rnd in range(2):
        ctx.begin_round(rnd)
        algo.run_round(state, rnd)
    return state


MEAN_LIKE = RobustOptions(name="trimmed_mean", beta=0.0)  # trims nothing
ALL_KEPT = RobustOptions(name="multi_krum", f=0)  # keeps m = n - f = n rows


@pytest.mark.parametrize(
    ("name", "levels"),
    [
        ("fedavg", {"cloud": MEAN_LIKE}),
        ("fedavg", {"cloud": ALL_KEPT}),
        ("fedht", {"cloud": MEAN_LIKE}),
        ("perfedavg", {"cloud": ALL_KEPT}),
        ("pfedme", {"cloud": MEAN_LIKE}),
        ("scaffold", {"cloud": ALL_KEPT}),
        ("pfedme", {"cloud": ALL_KEPT}),
        ("hierfavg", {"edge": MEAN_LIKE, "cloud": MEAN_LIKE}),
        ("hierfavg", {"edge": ALL_KEPT}),
        ("sfedhp", {"edge": MEAN_LIKE, "cloud": MEAN_LIKE}),
        ("sfedhp", {"edge": ALL_KEPT}),
    ],
)
def test_rules_equal_to_the_mean_give_the_mean_round(
    name: str, levels: dict[str, RobustOptions]
) -> None:
    plain = rounds(name, {})
    robust = rounds(name, levels)
    torch.testing.assert_close(robust["global"], plain["global"], rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_sign_flip_changes_the_round_and_median_limits_it(name: str) -> None:
    plain = rounds(name, {})
    flip = AttackConfig(name="sign_flip", fraction=0.3, sign_scale=20.0)
    attacked = rounds(name, {}, flip)
    defended = rounds(name, {FIRST_LEVEL.get(name, "cloud"): RobustOptions(name="median")}, flip)
    moved = (attacked["global"] - plain["global"]).norm()
    kept = (defended["global"] - plain["global"]).norm()
    assert moved > 0.1  # the boosted flip drags the mean away
    assert kept < moved / 4, (float(kept), float(moved))
