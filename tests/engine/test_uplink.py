"""The uplink pipeline (fedhp.engine.uplink): attack -> robust rule -> DP in that order, the plain
weighted mean when nothing is configured, and where each safeguard can act given what a method
uploads."""

from __future__ import annotations

import pytest
import torch

from fedhp.algorithms import ALGORITHMS
from fedhp.build import safeguards_of
from fedhp.config import AttackConfig, resolve_config
from fedhp.engine.aggregation import LevelRule
from fedhp.engine.attacks import Attack
from fedhp.engine.ops import weighted_mean
from fedhp.engine.uplink import CENTRE_KEYS, Uplink, level_aggregate, safeguards
from fedhp.errors import ConfigError
from fedhp.privacy.mechanism import clip_updates
from fedhp.privacy.options import PrivacyOptions
from fedhp.robust import RobustOptions
from tests.algorithms.tiny import tiny_context

START = torch.tensor([1.0, -2.0, 0.5])
ROWS = START + torch.tensor(
    [[0.1, 0.2, -0.3], [0.4, -0.1, 0.0], [0.2, 0.0, 0.1], [-0.5, 0.3, 0.2], [3.0, 0.1, 0.4]]
)
BAD = torch.tensor([False, True, False, True, False])
SENDERS = torch.arange(5)
WEIGHTS = torch.tensor([1.0, 2.0, 1.0, 1.0, 3.0])


def flip() -> Attack:
    return Attack(AttackConfig(name="sign_flip", fraction=0.4, sign_scale=2.0), BAD, seed=0)


def test_nothing_configured_is_the_weighted_mean_bit_for_bit() -> None:
    uplink = Uplink("cloud")
    assert uplink.folds and not uplink.whole_rounds
    assert uplink.forge(ROWS, SENDERS, START) is ROWS
    assert torch.equal(uplink(ROWS, SENDERS, WEIGHTS, START), weighted_mean(ROWS, WEIGHTS))


def test_the_methods_combine_runs_where_the_level_has_no_rule() -> None:
    """``combine``: the method's own aggregation (a pure function of the rows and weights) is
    what a level without a robust or DP rule returns; a robust rule replaces it."""

    def last(rows: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return rows[-1] * weights[-1]

    expected = ROWS[-1] * WEIGHTS[-1]
    plain, mean = Uplink("cloud"), Uplink("cloud", LevelRule(RobustOptions(), "robust.cloud"))
    for uplink in (plain, mean):
        assert torch.equal(uplink.aggregate(ROWS, WEIGHTS, START, combine=last), expected)
        assert torch.equal(uplink(ROWS, SENDERS, WEIGHTS, START, combine=last), expected)
    median = Uplink("cloud", LevelRule(RobustOptions(name="median"), "robust.cloud"))
    out = median.aggregate(ROWS, WEIGHTS, START, combine=last)
    assert torch.equal(out, median.aggregate(ROWS, WEIGHTS, START))


def test_the_attack_forges_before_the_send_and_the_rule_sees_what_arrived() -> None:
    rule = LevelRule(RobustOptions(name="median"), "robust.cloud")
    uplink = Uplink("cloud", rule, flip())
    assert not uplink.folds and uplink.whole_rounds
    sent: list[torch.Tensor] = []

    def send(rows: torch.Tensor) -> torch.Tensor:
        sent.append(rows)
        return rows.round(decimals=1)  # what the receiver gets differs from what was sent

    out = uplink(ROWS, SENDERS, WEIGHTS, START, send=send)
    forged = ROWS.clone()
    forged[BAD] = START - 2.0 * (ROWS[BAD] - START)
    assert torch.equal(sent[0], forged)
    assert torch.equal(out, uplink.aggregate(forged.round(decimals=1), WEIGHTS, START))


def test_dp_clips_then_noises_with_the_poisson_denominator() -> None:
    privacy = PrivacyOptions(enabled=True, noise_multiplier=0.0, clip_norm=1.0)
    uplink = Uplink("cloud", LevelRule(RobustOptions(), "robust.cloud", privacy), None, 0.5)
    uplink.begin_round(0)
    out = uplink.aggregate(ROWS, torch.ones(5), START, population=8)
    assert torch.equal(out, START + clip_updates(ROWS - START, 1.0).sum(0) / 4.0)  # q·N = 4
    fixed = Uplink("cloud", uplink.rule)
    assert torch.equal(
        fixed.aggregate(ROWS, torch.ones(5), START, population=8),
        START + clip_updates(ROWS - START, 1.0).sum(0) / 5.0,  # the number of rows
    )


def test_alie_alone_makes_rounds_whole() -> None:
    alie = Attack(AttackConfig(name="alie", fraction=0.4), BAD, seed=0)
    assert Uplink("cloud", None, alie).whole_rounds
    assert not Uplink("cloud", None, flip()).whole_rounds


def test_what_a_method_uploads_says_where_each_safeguard_acts() -> None:
    flat = safeguards({"cloud": "model"}, hierarchical=False)
    assert flat == {"attack": {"cloud"}, "robust": {"cloud"}, "privacy": {"cloud"}}
    tree = safeguards({"edge": "model", "cloud": "model"}, hierarchical=True)
    assert tree == {"attack": {"edge"}, "robust": {"edge", "cloud"}, "privacy": {"edge"}}
    mixed = safeguards({"edge": "estimate", "cloud": "model"}, hierarchical=True)
    assert mixed == {"attack": {"edge"}, "robust": {"edge", "cloud"}, "privacy": set()}
    assert safeguards({"cloud": "own"}, hierarchical=False) == {
        "attack": set(),
        "robust": set(),
        "privacy": set(),
    }
    with pytest.raises(ValueError, match="upload kind"):
        safeguards({"cloud": "models"}, hierarchical=False)


def test_the_registered_methods_declare_the_safeguards_they_support() -> None:
    acts = {name: safeguards_of(ALGORITHMS.get(name)) for name in ALGORITHMS.names()}
    assert {n for n, a in acts.items() if a["privacy"]} == {
        "fedavg",
        "fedprox",
        "moon",
        "ditto",
        "hierfavg",
    }
    assert acts["sfedhp"]["attack"] == {"edge"} and acts["fednova"]["robust"] == set()
    assert acts["scaffold"]["robust"] == {"cloud"} and not acts["scaffold"]["privacy"]


def test_a_refused_safeguard_is_a_one_line_error() -> None:
    from fedhp.build import check_components

    cfg = resolve_config(None, ["algorithm.name=scaffold", "privacy.enabled=true"])
    with pytest.raises(ConfigError, match="privacy.where: scaffold cannot add DP noise"):
        check_components(cfg)


@pytest.mark.parametrize("level", ["cloud", "edge"])
def test_a_centred_rule_keeps_its_previous_update_in_the_state(level: str) -> None:
    """``cclip`` at a level measures from the level's kept update (the cloud's ``[P]``, an
    edge's row of ``[E, P]``), which the aggregate's update then replaces."""
    ctx = tiny_context((3, 2, 2))
    setattr(ctx, f"{level}_rule", LevelRule(RobustOptions(name="cclip", tau=0.5), level))
    uplink = ctx.cloud_uplink if level == "cloud" else ctx.edge_uplink
    g = torch.Generator().manual_seed(1)
    start, rows = torch.randn(5, generator=g), torch.randn(4, 5, generator=g)
    weights = torch.ones(4)
    previous = torch.randn(5, generator=g)
    kept = previous.clone() if level == "cloud" else torch.zeros(3, 5)
    if level == "edge":
        kept[1] = previous
    state = {CENTRE_KEYS[level]: kept}
    out = level_aggregate(uplink, state, rows, weights, start, edge=1)
    assert torch.equal(out, uplink.aggregate(rows, weights, start, centre=previous))
    now = state[CENTRE_KEYS[level]]
    assert torch.equal(now if level == "cloud" else now[1], out - start)
    if level == "edge":
        assert not now[0].any() and not now[2].any()  # the other edges' rows untouched
