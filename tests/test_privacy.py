"""Client-level DP (DP-FedAvg): clipping, the noised sum and its denominators, the accountant
(against Opacus's RDP accountant), its checkpoint form, and the options' one-line errors."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedhp.errors import ConfigError
from fedhp.privacy.accountant import PrivacyAccountant, calibrate_noise
from fedhp.privacy.mechanism import (
    clip_factors,
    clip_updates,
    expected_clients,
    noised_mean,
    noised_sum,
)
from fedhp.privacy.options import AccountantKind, PrivacyOptions, Sampling, privacy_options
from tests.conftest import require_module

DELTA = 1e-5
# (q, σ, rounds): the three settings for the comparison with Opacus.
SETTINGS = [(0.01, 1.0, 1000), (0.1, 1.1, 100), (0.05, 0.8, 500)]


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ----------------------------------------------------------------------------- clipping

FLOATS = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, width=32)


@settings(max_examples=200, deadline=None)
@given(
    rows=st.integers(1, 5).flatmap(
        lambda p: st.lists(st.lists(FLOATS, min_size=p, max_size=p), min_size=1, max_size=6)
    ),
    clip=st.floats(min_value=1e-3, max_value=1e3),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_clipping_never_raises_a_norm_and_caps_at_s(
    rows: list[list[float]], clip: float, dtype: torch.dtype
) -> None:
    x = torch.tensor(rows, dtype=dtype)
    y = clip_updates(x, clip)
    assert y.shape == x.shape and y.dtype == x.dtype
    # No entry's magnitude grows, so no norm grows, whatever the rounding.
    assert bool((y.abs() <= x.abs()).all())
    before = torch.linalg.vector_norm(x.double(), dim=1)
    after = torch.linalg.vector_norm(y.double(), dim=1)
    assert bool((after <= before).all())
    eps = torch.finfo(dtype).eps
    assert bool((after <= clip * (1 + 4 * eps)).all())
    # Rows within the bound are untouched; rows beyond it end at norm S (to rounding) and keep
    # their direction.
    inside = before <= clip
    assert torch.equal(y[inside], x[inside])
    if bool((~inside).any()):
        torch.testing.assert_close(
            after[~inside], torch.full_like(after[~inside], clip), rtol=8 * eps, atol=0
        )
        scale = clip / before[~inside]
        torch.testing.assert_close(
            y[~inside].double(),
            x[~inside].double() * scale.unsqueeze(1),
            rtol=4 * eps,
            atol=torch.finfo(dtype).tiny,  # subnormal results lose relative precision
        )


def test_clip_hand_computed() -> None:
    x = torch.tensor([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0], [-6.0, 8.0]])
    y = clip_updates(x, 1.0)
    expected = torch.tensor([[0.6, 0.8], [0.3, 0.4], [0.0, 0.0], [-0.6, 0.8]])
    torch.testing.assert_close(y, expected, rtol=1e-7, atol=0)
    assert clip_factors(x, 1.0).tolist() == pytest.approx([0.2, 1.0, 1.0, 0.1])


def test_infinite_clip_and_zero_noise_are_plain_summation_bit_for_bit() -> None:
    x = torch.randn(7, 1000, generator=_gen(3)) * 5
    clipped = clip_updates(x, math.inf)
    assert clipped is x  # not even copied
    gen = _gen(11)
    state = gen.get_state()
    total = noised_sum(clipped, 0.0, math.inf, gen)
    assert torch.equal(total, x.sum(0))
    assert torch.equal(gen.get_state(), state), "σ = 0 must not draw from the generator"
    mean = noised_mean(clip_updates(x, math.inf), 0.0, math.inf, gen, sampling="fixed")
    assert torch.equal(mean, x.sum(0) / 7)
    assert torch.equal(gen.get_state(), state)


def test_clip_rejects_a_non_positive_norm() -> None:
    x = torch.ones(2, 3)
    for bad in (0.0, -1.0, math.nan, -math.inf):
        with pytest.raises(ValueError, match="clip_norm must be > 0"):
            clip_updates(x, bad)


# ----------------------------------------------------------------------------- the noise


def test_noise_has_std_sigma_times_s_and_comes_from_the_generator() -> None:
    sigma, clip, n, p = 1.3, 0.7, 4, 200_000
    updates = torch.zeros(n, p)
    noise = noised_sum(updates, sigma, clip, _gen(5))
    std = sigma * clip
    # 200,000 draws: the sample std is within ~0.5 % of the truth with overwhelming probability.
    assert float(noise.std()) == pytest.approx(std, rel=0.02)
    assert abs(float(noise.mean())) < 5 * std / math.sqrt(p)
    # The same seed gives the same noise, another seed other noise.
    assert torch.equal(noise, noised_sum(updates, sigma, clip, _gen(5)))
    assert not torch.equal(noise, noised_sum(updates, sigma, clip, _gen(6)))
    # The noise is added to the sum of the rows.
    x = torch.randn(n, p, generator=_gen(1))
    torch.testing.assert_close(noised_sum(x, sigma, clip, _gen(5)), x.sum(0) + noise)


def test_noise_needs_a_finite_clip_norm() -> None:
    with pytest.raises(ValueError, match="finite clip_norm"):
        noised_sum(torch.ones(2, 3), 1.0, math.inf, _gen())


def test_denominators() -> None:
    x = torch.randn(5, 10, generator=_gen(2))
    # Poisson: the expected number of clients q·N, whatever the number of rows this round.
    d = expected_clients("poisson", population=100, sample_rate=0.04)
    assert d == pytest.approx(4.0)
    torch.testing.assert_close(
        noised_mean(x, 0.0, 1.0, _gen(), sampling="poisson", denominator=d), x.sum(0) / 4.0
    )
    with pytest.raises(ValueError, match="expected number of clients"):
        noised_mean(x, 0.0, 1.0, _gen(), sampling="poisson")
    # No participant: the noise alone, still over q·N.
    empty = noised_mean(torch.zeros(0, 10), 1.0, 2.0, _gen(9), sampling="poisson", denominator=d)
    torch.testing.assert_close(empty, noised_sum(torch.zeros(0, 10), 1.0, 2.0, _gen(9)) / 4.0)
    # Fixed: the sample size m (the rows by default).
    assert expected_clients("fixed", population=100, sample_size=5) == 5.0
    assert torch.equal(noised_mean(x, 0.0, 1.0, _gen(), sampling="fixed"), x.sum(0) / 5)
    with pytest.raises(ValueError, match="sample_size"):
        expected_clients("fixed", population=4, sample_size=5)


# ----------------------------------------------------------------------------- the accountant


@pytest.mark.parametrize(("q", "sigma", "rounds"), SETTINGS)
def test_epsilon_matches_opacus_rdp_within_2_percent(q: float, sigma: float, rounds: int) -> None:
    require_module("dp_accounting")
    opacus_accountants = require_module("opacus.accountants")
    ours = PrivacyAccountant(1000, sampling="poisson", accountant="rdp")
    for _ in range(rounds):
        ours.record_round(sigma, sample_rate=q)
    theirs = opacus_accountants.RDPAccountant()
    for _ in range(rounds):
        theirs.step(noise_multiplier=sigma, sample_rate=q)
    eps, ref = ours.epsilon(DELTA), theirs.get_epsilon(DELTA)
    assert 0 < eps < math.inf
    assert eps == pytest.approx(ref, rel=0.02)


def test_fixed_sampling_of_everyone_is_the_replace_one_gaussian() -> None:
    """m = N: no amplification; replace-one sensitivity 2S, so ε is the Gaussian mechanism's at
    multiplier σ/2 (Opacus at q = 1 is exactly that mechanism, independently computed)."""
    require_module("dp_accounting")
    opacus_accountants = require_module("opacus.accountants")
    ours = PrivacyAccountant(50, sampling="fixed")
    ours.record_round(4.0, sample_size=50, rounds=20)
    theirs = opacus_accountants.RDPAccountant()
    theirs.history = [(2.0, 1.0, 20)]
    assert ours.epsilon(DELTA) == pytest.approx(theirs.get_epsilon(DELTA), rel=0.02)


def test_fixed_sampling_amplifies_and_is_more_conservative_than_poisson() -> None:
    require_module("dp_accounting")
    eps = {}
    for population in (100, 1000):
        acc = PrivacyAccountant(population, sampling="fixed")
        acc.record_round(1.0, sample_size=10, rounds=50)
        eps[population] = acc.epsilon(DELTA)
    assert 0 < eps[1000] < eps[100] < math.inf
    poisson = PrivacyAccountant(1000, sampling="poisson")
    poisson.record_round(1.0, sample_rate=0.01, rounds=50)
    # Replace-one with sensitivity 2S costs more than add/remove-one at the same q and σ.
    assert poisson.epsilon(DELTA) < eps[1000]


def test_pld_is_tighter_than_rdp_but_close() -> None:
    require_module("dp_accounting")
    rdp = PrivacyAccountant(1000, accountant="rdp")
    pld = PrivacyAccountant(1000, accountant="pld")
    for acc in (rdp, pld):
        acc.record_round(1.1, sample_rate=0.1, rounds=100)
    assert 0.7 * rdp.epsilon(DELTA) < pld.epsilon(DELTA) <= rdp.epsilon(DELTA)
    with pytest.raises(ValueError, match="PLD"):
        PrivacyAccountant(1000, sampling="fixed", accountant="pld")


def test_epsilon_grows_with_rounds_and_without_noise_is_infinite() -> None:
    require_module("dp_accounting")
    acc = PrivacyAccountant(1000)
    assert acc.epsilon(DELTA) == 0.0
    acc.record_round(1.0, sample_rate=0.05, rounds=10)
    first = acc.epsilon(DELTA)
    acc.record_round(1.0, sample_rate=0.05, rounds=10)
    assert acc.rounds == 20
    assert acc.epsilon(DELTA) > first > 0
    assert acc.epsilon(1e-3) < acc.epsilon(DELTA)
    acc.record_round(0.0, sample_rate=0.05)
    assert acc.epsilon(DELTA) == math.inf


def test_releases_on_one_sample_compose_as_one_gaussian() -> None:
    require_module("dp_accounting")
    four = PrivacyAccountant(1000)
    four.record_round(2.0, sample_rate=0.1, releases=4, rounds=30)
    one = PrivacyAccountant(1000)
    one.record_round(1.0, sample_rate=0.1, rounds=30)
    assert four.epsilon(DELTA) == pytest.approx(one.epsilon(DELTA), rel=1e-12)
    looser = PrivacyAccountant(1000)
    looser.record_round(2.0, sample_rate=0.1, rounds=30)
    assert looser.epsilon(DELTA) < four.epsilon(DELTA)


@pytest.mark.parametrize(
    ("sampling", "kind"), [("poisson", "rdp"), ("fixed", "rdp"), ("poisson", "pld")]
)
def test_checkpoint_round_trip(sampling: Sampling, kind: AccountantKind) -> None:
    require_module("dp_accounting")

    def record(acc: PrivacyAccountant, rounds: range) -> None:
        for r in rounds:
            sigma = 1.0 if r < 15 else 1.5
            if sampling == "poisson":
                acc.record_round(sigma, sample_rate=0.05)
            else:
                acc.record_round(sigma, sample_size=10)

    straight = PrivacyAccountant(200, sampling=sampling, accountant=kind)
    record(straight, range(40))
    half = PrivacyAccountant(200, sampling=sampling, accountant=kind)
    record(half, range(20))
    half.epsilon(DELTA)  # composed (and cached) before the checkpoint
    state = json.loads(json.dumps(half.state_dict()))
    assert len(state["runs"]) == 2  # run-length encoded: small whatever the number of rounds
    restored = PrivacyAccountant.from_state_dict(state)
    assert restored.state_dict() == half.state_dict()
    assert restored.epsilon(DELTA) == half.epsilon(DELTA)
    record(restored, range(20, 40))
    assert restored.rounds == straight.rounds == 40
    assert restored.state_dict() == straight.state_dict()
    assert restored.epsilon(DELTA) == pytest.approx(straight.epsilon(DELTA), rel=1e-9)


def test_checkpoint_form_is_checked() -> None:
    with pytest.raises(ValueError, match="not a fedhp-privacy-accountant state"):
        PrivacyAccountant.from_state_dict({"format": "something else", "version": 1})


def test_record_round_checks_its_arguments() -> None:
    acc = PrivacyAccountant(100, sampling="fixed")
    with pytest.raises(ValueError, match="sample_size"):
        acc.record_round(1.0, sample_rate=0.1)
    with pytest.raises(ValueError, match=r"\[1, 100\]"):
        acc.record_round(1.0, sample_size=101)
    with pytest.raises(ValueError, match="noise_multiplier"):
        acc.record_round(-1.0, sample_size=10)
    poisson = PrivacyAccountant(100)
    with pytest.raises(ValueError, match="sample_rate"):
        poisson.record_round(1.0, sample_rate=0.0)
    assert acc.rounds == poisson.rounds == 0


# ----------------------------------------------------------------------------- the options


def test_options_defaults_and_accepted_values() -> None:
    opts = privacy_options({})
    assert opts == PrivacyOptions()
    assert not opts.enabled and opts.sampling == "fixed" and opts.where == "cloud"
    off = privacy_options({"enabled": True, "clip_norm": math.inf, "noise_multiplier": 0})
    assert math.isinf(off.clip_norm)
    yaml_inf = privacy_options({"clip_norm": "inf", "noise_multiplier": 0})
    assert math.isinf(yaml_inf.clip_norm)
    on = privacy_options(
        {"enabled": True, "sampling": "poisson", "accountant": "pld", "where": "edge"}
    )
    acc = PrivacyAccountant.from_options(on, population=1000)
    assert (acc.sampling, acc.kind) == ("poisson", "pld")


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"clip_norm": 0}, "privacy.clip_norm: Value error, must be > 0 (the L2 bound S"),
        ({"clip_norm": -1.5}, "use .inf for no clipping"),
        ({"clip_norm": math.nan}, "privacy.clip_norm: Value error, must be > 0"),
        ({"noise_multiplier": -0.1}, "privacy.noise_multiplier: Input should be greater than"),
        ({"delta": 0}, "privacy.delta: Input should be greater than 0"),
        ({"delta": 1}, "privacy.delta: Input should be less than 1"),
        ({"sampling": "shuffle"}, "privacy.sampling: Input should be 'poisson' or 'fixed'"),
        ({"where": "client"}, "privacy.where: Input should be 'cloud' or 'edge'"),
        ({"accountant": "moments"}, "privacy.accountant: Input should be 'rdp' or 'pld'"),
        ({"accountant": "pld", "sampling": "fixed"}, "use accountant=rdp, or sampling=poisson"),
        ({"clip_norm": math.inf}, "noise needs a finite clip_norm"),
        ({"clip": 1.0}, "privacy.clip: unknown key"),
        ({"noise_multiplier": math.inf}, "privacy.noise_multiplier"),
    ],
)
def test_options_errors_are_one_line(data: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        privacy_options(data)
    message = str(err.value)
    assert "\n" not in message
    assert needle in message


# ----------------------------------------------------------------------------- calibration

CALIBRATIONS = [
    # (target ε, rounds, sampling, the record_round keywords, accountant)
    (8.0, 100, "poisson", {"sample_rate": 0.1}, "rdp"),
    (1.0, 50, "poisson", {"sample_rate": 0.1}, "rdp"),
    (4.0, 30, "fixed", {"sample_size": 1000, "releases": 4}, "rdp"),
]


@pytest.mark.parametrize(("target", "rounds", "sampling", "kwargs", "kind"), CALIBRATIONS)
def test_calibrated_noise_meets_the_target_epsilon(
    target: float, rounds: int, sampling: Sampling, kwargs: dict[str, float], kind: AccountantKind
) -> None:
    """ε at the calibrated σ is at most the target and within 1 % of it; 1 % less noise
    exceeds the target (σ is the smallest that meets it, up to that)."""
    require_module("dp_accounting")

    def epsilon(sigma: float) -> float:
        acc = PrivacyAccountant(1000, sampling=sampling, accountant=kind)
        acc.record_round(sigma, rounds=rounds, **kwargs)
        return acc.epsilon(DELTA)

    sigma = calibrate_noise(
        target, DELTA, rounds, population=1000, sampling=sampling, accountant=kind, **kwargs
    )
    assert 0 < sigma < math.inf
    assert target * 0.99 <= epsilon(sigma) <= target
    assert epsilon(sigma * 0.99) > target


def test_calibration_rejects_what_it_cannot_meet() -> None:
    with pytest.raises(ValueError, match="target_epsilon"):
        calibrate_noise(math.inf, DELTA, 10, population=100, sample_rate=0.1)
    with pytest.raises(ValueError, match="rounds"):
        calibrate_noise(1.0, DELTA, 0, population=100, sample_rate=0.1)
