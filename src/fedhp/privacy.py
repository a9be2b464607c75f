"""Client-level differential privacy: DP-FedAvg (McMahan et al., ICLR 2018, "Learning
Differentially Private Recurrent Language Models") as standalone pieces, and its accounting.

The mechanism, at the aggregator that receives the clients' updates (the cloud, or each edge):

1. each client's update ``Δ_k`` (its model minus the model it started from) is clipped to L2 norm
   at most ``S``: ``Δ_k · min(1, S / ‖Δ_k‖)`` (:func:`clip_updates`);
2. the clipped updates are summed and Gaussian noise ``N(0, σ² S² I)`` is added to the sum
   (:func:`noised_sum`); one client changes the sum by at most ``S`` (add/remove one client) or
   ``2S`` (replace one client), so ``σ`` is the noise multiplier of a Gaussian mechanism;
3. the noised sum is divided by a denominator that does not depend on who took part
   (:func:`noised_mean`):

   - ``"poisson"`` sampling (each of the ``N`` clients takes part independently with probability
     ``q``): the *expected* number of participants ``q·N``. This is McMahan et al.'s
     fixed-denominator estimator ``f̃_f = Σ_k w_k Δ_k / (q W)`` with ``w_k = 1`` (``W = N``), the
     one their DP-FedAvg uses for its privacy analysis (its noise std on the average is
     ``z S / (q W)``, i.e. ``z S`` on the sum). Dividing by the realized count would reveal it,
     and the realized count is itself data about who took part.
   - ``"fixed"`` sampling (exactly ``m`` of the ``N`` clients, uniformly without replacement, the
     engine's ``sample_clients``): the sample size ``m``. This is what Flower's central-DP
     wrappers do: they add noise of std ``σ S / m`` to the average of the ``m`` sampled clients
     (``num_sampled_clients``), the same as ``σ S`` on the sum divided by ``m``.

Accounting (:class:`PrivacyAccountant`) uses the maintained ``dp-accounting`` library:

- ``"poisson"``: ``PoissonSampledDpEvent(q, GaussianDpEvent(σ))`` under the add-or-remove-one
  neighbouring relation (sensitivity ``S``), with the RDP accountant (``RdpAccountant``, the
  subsampled-Gaussian analysis of Mironov et al. 2019, the same as Opacus's ``RDPAccountant``)
  or the PLD accountant (``PLDAccountant``, tighter);
- ``"fixed"``: ``SampledWithoutReplacementDpEvent(N, m, GaussianDpEvent(σ / 2))`` under the
  replace-one relation, RDP only (Wang, Balle & Kasiviswanathan 2019, Theorem 27;
  ``dp-accounting``'s PLD accountant has no event for sampling without replacement). Replacing one
  client moves the sum of clipped updates by up to ``2S``, so the Gaussian's multiplier relative
  to that sensitivity is ``σ S / (2S) = σ / 2``. (Accounting fixed-size sampling as if it were
  Poisson with ``q = m / N`` is a common approximation, not a guarantee; it is not done here.)

Disabled DP or ``S = ∞`` with ``σ = 0`` leaves every number bit for bit as plain summation:
:func:`clip_updates` returns its input as is and :func:`noised_sum` draws nothing.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import pydantic
import torch

from fedhp.registry import validate

Sampling = Literal["poisson", "fixed"]
AccountantKind = Literal["rdp", "pld"]

STATE_FORMAT = "fedhp-privacy-accountant"
STATE_VERSION = 1


# ----------------------------------------------------------------------------- the mechanism


def clip_factors(updates: torch.Tensor, clip_norm: float) -> torch.Tensor:
    """The factor ``min(1, S / ‖row‖)`` of each row of ``updates [n, P]`` → ``[n]`` (float64).

    Norms are taken in float64 so that a clipped row's norm is ``S`` to float64 accuracy before
    the cast back; a zero row gets factor 1. For the integrator who holds the clients' models
    rather than their updates: ``torch.where(f < 1, start + f·Δ, model)`` touches only the rows
    that are actually clipped, so unclipped clients stay bit for bit."""
    if updates.dim() != 2:
        raise ValueError(f"clip_factors expects updates [n, P], got shape {tuple(updates.shape)}")
    if not clip_norm > 0:
        raise ValueError(f"clip_norm must be > 0, got {clip_norm!r}")
    norms = torch.linalg.vector_norm(updates, dim=1, dtype=torch.float64)
    if math.isinf(clip_norm):
        return torch.ones_like(norms)
    return (clip_norm / norms).clamp(max=1.0)  # S / 0 = inf → 1


def clip_updates(updates: torch.Tensor, clip_norm: float) -> torch.Tensor:
    """Each row of ``updates [n, P]`` scaled by ``min(1, S / ‖row‖)`` → ``[n, P]``.

    A row's norm never grows (each entry is multiplied by a factor ≤ 1, so no entry's magnitude
    grows) and a clipped row's norm is ``S`` up to one rounding of the update's dtype. Rows with
    norm ≤ ``S`` are multiplied by exactly 1 (unchanged). ``S = inf`` returns ``updates`` itself,
    not a copy. Rows must be finite (an infinite row would become NaN)."""
    if math.isinf(clip_norm) and clip_norm > 0:
        if updates.dim() != 2:
            raise ValueError(f"clip_updates expects [n, P], got shape {tuple(updates.shape)}")
        return updates
    factors = clip_factors(updates, clip_norm).to(updates.dtype)
    return updates * factors.unsqueeze(1)


def noise_std(noise_multiplier: float, clip_norm: float) -> float:
    """The standard deviation ``σ·S`` of the Gaussian noise added to each coordinate of the sum."""
    return noise_multiplier * clip_norm


def noised_sum(
    clipped: torch.Tensor,
    noise_multiplier: float,
    clip_norm: float,
    generator: torch.Generator,
) -> torch.Tensor:
    """``Σ_k clipped_k + N(0, σ² S² I)`` → ``[P]``, the noise drawn from ``generator`` (which must
    live on ``clipped``'s device) in ``clipped``'s dtype.

    ``σ = 0`` draws nothing (the generator is not advanced) and returns ``clipped.sum(0)``, bit
    for bit the plain sum. ``σ > 0`` needs a finite ``S``. The sum is *not* divided by anything:
    :func:`noised_mean` does that with a participation-independent denominator."""
    if clipped.dim() != 2:
        raise ValueError(f"noised_sum expects clipped updates [n, P], got {tuple(clipped.shape)}")
    if not noise_multiplier >= 0:
        raise ValueError(f"noise_multiplier must be >= 0, got {noise_multiplier!r}")
    total = clipped.sum(0)
    if noise_multiplier == 0:
        return total
    std = noise_std(noise_multiplier, clip_norm)
    if not math.isfinite(std):
        raise ValueError(f"noise of std sigma*S needs a finite clip_norm S, got {clip_norm!r}")
    noise = torch.randn(total.shape, generator=generator, dtype=total.dtype, device=total.device)
    return total.add_(noise, alpha=std)


def expected_clients(
    sampling: Sampling,
    *,
    population: int,
    sample_rate: float | None = None,
    sample_size: int | None = None,
) -> float:
    """The fixed denominator of the DP average: ``q·N`` for Poisson sampling at rate ``q`` of
    ``N`` clients (McMahan et al.'s ``qW`` with unit weights), ``m`` for fixed-size sampling of
    ``m`` clients."""
    if population <= 0:
        raise ValueError(f"population must be > 0, got {population}")
    if sampling == "poisson":
        if sample_rate is None or not 0 < sample_rate <= 1:
            raise ValueError(f"poisson sampling needs a sample_rate in (0, 1], got {sample_rate}")
        return sample_rate * population
    if sample_size is None or not 0 < sample_size <= population:
        raise ValueError(
            f"fixed sampling needs a sample_size in [1, population={population}], got {sample_size}"
        )
    return float(sample_size)


def noised_mean(
    clipped: torch.Tensor,
    noise_multiplier: float,
    clip_norm: float,
    generator: torch.Generator,
    *,
    sampling: Sampling,
    denominator: float | None = None,
) -> torch.Tensor:
    """The DP-FedAvg average update ``noised_sum(...) / D`` → ``[P]``.

    ``sampling="poisson"``: ``D = denominator``, required, the expected number of participants
    ``q·N`` (:func:`expected_clients`), whatever the number of rows this round (it may even be 0
    rows of ``[0, P]``). ``sampling="fixed"``: ``D = denominator`` if given (the sample size
    ``m``), else the number of rows ``n``; with ``σ = 0`` and ``S = ∞`` this is
    ``updates.sum(0) / n`` bit for bit."""
    if sampling == "poisson":
        if denominator is None:
            raise ValueError(
                "poisson sampling divides by the expected number of clients q*N: "
                "pass denominator=expected_clients('poisson', ...)"
            )
        d = denominator
    else:
        d = float(clipped.shape[0]) if denominator is None else denominator
    if not d > 0:
        raise ValueError(f"the denominator must be > 0, got {d!r}")
    return noised_sum(clipped, noise_multiplier, clip_norm, generator).div_(d)


# ----------------------------------------------------------------------------- the options


class PrivacyOptions(pydantic.BaseModel):
    """Client-level DP (DP-FedAvg): clip each client's update to norm ``clip_norm`` and add
    Gaussian noise of std ``noise_multiplier * clip_norm`` to the sum at the aggregator; ε at
    ``delta`` reported every evaluated round."""

    model_config = pydantic.ConfigDict(extra="forbid", allow_inf_nan=False)

    enabled: bool = False
    clip_norm: float = pydantic.Field(
        1.0,
        allow_inf_nan=True,
        description="L2 bound S on each client's update (.inf: no clipping)",
    )
    noise_multiplier: float = pydantic.Field(
        1.0, ge=0, description="σ: the noise std on the sum is σ·S (0: no noise, ε = ∞)"
    )
    delta: float = pydantic.Field(1e-5, gt=0, lt=1, description="δ at which ε is reported")
    sampling: Sampling = pydantic.Field(
        "fixed",
        description="how clients are drawn: poisson (each with probability q) or fixed "
        "(m of N without replacement)",
    )
    where: Literal["cloud", "edge"] = pydantic.Field(
        "cloud",
        description="who clips and adds noise: the cloud (central DP) or each edge (trusted edges)",
    )
    accountant: AccountantKind = pydantic.Field(
        "rdp", description="dp-accounting's RDP accountant or its PLD accountant (poisson only)"
    )

    @pydantic.field_validator("clip_norm")
    @classmethod
    def _positive_clip(cls, value: float) -> float:
        if not value > 0:  # also NaN
            raise ValueError(
                "must be > 0 (the L2 bound S on each update; use .inf for no clipping)"
            )
        return value

    @pydantic.model_validator(mode="after")
    def _supported(self) -> PrivacyOptions:
        if self.accountant == "pld" and self.sampling == "fixed":
            raise ValueError(
                "accountant=pld supports only sampling=poisson "
                "(use accountant=rdp, or sampling=poisson)"
            )
        if self.noise_multiplier > 0 and math.isinf(self.clip_norm):
            raise ValueError(
                "noise needs a finite clip_norm (set clip_norm, or noise_multiplier=0)"
            )
        return self


def privacy_options(data: Mapping[str, Any], prefix: str = "privacy") -> PrivacyOptions:
    """:class:`PrivacyOptions` from a mapping, or a one-line :class:`fedhp.errors.ConfigError`
    naming the field (``privacy.clip_norm: ...``) and the fix."""
    return validate(PrivacyOptions, data, prefix)


# ----------------------------------------------------------------------------- the accountant


@dataclass
class _Run:
    """``rounds`` consecutive rounds with the same sampling and noise."""

    noise_multiplier: float
    sample: float  # poisson: the rate q; fixed: the sample size m
    releases: int
    rounds: int

    def same_mechanism(self, other: _Run) -> bool:
        return (self.noise_multiplier, self.sample, self.releases) == (
            other.noise_multiplier,
            other.sample,
            other.releases,
        )


@contextlib.contextmanager
def _quiet_absl() -> Iterator[None]:
    """Silence dp-accounting's (absl) warnings that a fractional RDP order did not converge: such
    an order is excluded from the minimum, which only makes ε larger (never unsound)."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


class PrivacyAccountant:
    """ε of DP-FedAvg so far, from ``dp-accounting``: told each round's sampling and noise
    multiplier, reports ε at a given δ; checkpointable as a small plain-data state (the rounds
    composed so far, run-length encoded) with :meth:`state_dict` / :meth:`from_state_dict`.

    ``population``: the number ``N`` of clients that can be sampled. ``sampling``: ``"poisson"``
    (tell :meth:`record_round` the rate ``q``) or ``"fixed"`` (tell it the sample size ``m``).
    ``accountant``: ``"rdp"`` (both samplings) or ``"pld"`` (Poisson only).

    ``releases``: how many noised aggregates one sample of clients contributes to (e.g. ``κ``
    edge aggregations of the same sampled clients within one HierFAVG cloud round, each noised
    with multiplier σ and each seen by someone untrusted); ``k`` Gaussian releases of multiplier
    σ on the same sample are exactly one Gaussian of multiplier ``σ / √k``."""

    def __init__(
        self,
        population: int,
        *,
        sampling: Sampling = "poisson",
        accountant: AccountantKind = "rdp",
    ) -> None:
        if population <= 0:
            raise ValueError(f"population must be > 0, got {population}")
        if sampling not in ("poisson", "fixed"):
            raise ValueError(f"unknown sampling {sampling!r}; expected 'poisson' or 'fixed'")
        if accountant not in ("rdp", "pld"):
            raise ValueError(f"unknown accountant {accountant!r}; expected 'rdp' or 'pld'")
        if accountant == "pld" and sampling == "fixed":
            raise ValueError(
                "dp-accounting's PLD accountant has no fixed-size sampling event; "
                "use accountant='rdp' or sampling='poisson'"
            )
        self.population = population
        self.sampling: Sampling = sampling
        self.kind: AccountantKind = accountant
        self._runs: list[_Run] = []
        self._impl: Any = None  # the dp-accounting accountant of the rounds so far (lazily)
        self._cache: dict[float, float] = {}

    @classmethod
    def from_options(cls, options: PrivacyOptions, population: int) -> PrivacyAccountant:
        return cls(population, sampling=options.sampling, accountant=options.accountant)

    @property
    def rounds(self) -> int:
        """Rounds composed so far."""
        return sum(run.rounds for run in self._runs)

    def record_round(
        self,
        noise_multiplier: float,
        *,
        sample_rate: float | None = None,
        sample_size: int | None = None,
        releases: int = 1,
        rounds: int = 1,
    ) -> None:
        """Compose ``rounds`` rounds of noise multiplier ``σ`` with Poisson rate ``sample_rate``
        (``sampling="poisson"``) or ``sample_size`` clients of ``population``
        (``sampling="fixed"``)."""
        if not noise_multiplier >= 0 or math.isinf(noise_multiplier):
            raise ValueError(f"noise_multiplier must be finite and >= 0, got {noise_multiplier!r}")
        if releases < 1 or rounds < 0:
            raise ValueError(f"releases must be >= 1 and rounds >= 0, got {releases}, {rounds}")
        sample: float
        if self.sampling == "poisson":
            if sample_size is not None or sample_rate is None or not 0 < sample_rate <= 1:
                raise ValueError(f"poisson sampling: pass sample_rate in (0, 1], got {sample_rate}")
            sample = float(sample_rate)
        else:
            if sample_rate is not None or sample_size is None:
                raise ValueError("fixed sampling: pass sample_size (the clients per round)")
            if not 0 < sample_size <= self.population:
                raise ValueError(
                    f"sample_size must be in [1, {self.population}], got {sample_size}"
                )
            sample = float(sample_size)
        if rounds == 0:
            return
        run = _Run(float(noise_multiplier), sample, int(releases), int(rounds))
        if self._runs and self._runs[-1].same_mechanism(run):
            self._runs[-1].rounds += run.rounds
        else:
            self._runs.append(run)
        self._impl = None
        self._cache.clear()

    def _event(self, run: _Run) -> Any:
        import dp_accounting

        sigma = run.noise_multiplier / math.sqrt(run.releases)
        if self.sampling == "poisson":
            return dp_accounting.PoissonSampledDpEvent(
                run.sample, dp_accounting.GaussianDpEvent(sigma)
            )
        # Replace-one neighbours: the sum of S-clipped updates moves by up to 2S, so the noise
        # std σS is σ/2 times the sensitivity.
        return dp_accounting.SampledWithoutReplacementDpEvent(
            self.population, int(run.sample), dp_accounting.GaussianDpEvent(sigma / 2)
        )

    def _new_impl(self) -> Any:
        import dp_accounting
        from dp_accounting.pld import PLDAccountant
        from dp_accounting.rdp import RdpAccountant

        relation = dp_accounting.NeighboringRelation
        if self.kind == "pld":
            return PLDAccountant(relation.ADD_OR_REMOVE_ONE)
        if self.sampling == "poisson":
            return RdpAccountant(neighboring_relation=relation.ADD_OR_REMOVE_ONE)
        return RdpAccountant(neighboring_relation=relation.REPLACE_ONE)

    def dp_event(self) -> Any:
        """The ``dp-accounting`` event of every round recorded so far (a composition of one
        self-composed event per run of equal rounds; rounds without noise are
        ``NonPrivateDpEvent``)."""
        import dp_accounting

        events = [
            dp_accounting.SelfComposedDpEvent(
                dp_accounting.NonPrivateDpEvent()
                if run.noise_multiplier == 0
                else self._event(run),
                run.rounds,
            )
            for run in self._runs
        ]
        return dp_accounting.ComposedDpEvent(events)

    def _composed(self) -> Any:
        """A fresh dp-accounting accountant with every recorded round composed, run by run
        (:meth:`dp_event`). Always from scratch: ε is then a function of the recorded rounds
        alone, bit for bit, however often it was asked for in between (so a run resumed from
        a checkpoint reports the same ε as the uninterrupted one; composing increments as they
        come would round differently)."""
        if self._impl is None:
            impl = self._new_impl()
            with _quiet_absl():
                impl.compose(self.dp_event())
            self._impl = impl
        return self._impl

    def epsilon(self, delta: float) -> float:
        """ε at ``delta`` for all rounds recorded so far (0 before any; ∞ once a round had no
        noise)."""
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta!r}")
        if not self._runs:
            return 0.0
        if delta not in self._cache:
            impl = self._composed()
            with _quiet_absl():
                self._cache[delta] = float(impl.get_epsilon(delta))
        return self._cache[delta]

    def state_dict(self) -> dict[str, Any]:
        """Plain data (str, int, float, lists, dicts) for a checkpoint or JSON."""
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "population": self.population,
            "sampling": self.sampling,
            "accountant": self.kind,
            "runs": [
                {
                    "noise_multiplier": run.noise_multiplier,
                    "sample": run.sample,
                    "releases": run.releases,
                    "rounds": run.rounds,
                }
                for run in self._runs
            ],
        }

    @classmethod
    def from_state_dict(cls, state: Mapping[str, Any]) -> PrivacyAccountant:
        """The accountant :meth:`state_dict` described (ε is recomputed from the runs)."""
        if state.get("format") != STATE_FORMAT or state.get("version") != STATE_VERSION:
            raise ValueError(
                f"not a {STATE_FORMAT} state of version {STATE_VERSION}: "
                f"format={state.get('format')!r}, version={state.get('version')!r}"
            )
        acc = cls(
            int(state["population"]), sampling=state["sampling"], accountant=state["accountant"]
        )
        for run in state["runs"]:
            sample = run["sample"]
            acc.record_round(
                float(run["noise_multiplier"]),
                sample_rate=float(sample) if acc.sampling == "poisson" else None,
                sample_size=int(sample) if acc.sampling == "fixed" else None,
                releases=int(run["releases"]),
                rounds=int(run["rounds"]),
            )
        return acc


# ----------------------------------------------------------------------------- calibration


def calibrate_noise(
    target_epsilon: float,
    delta: float,
    rounds: int,
    *,
    population: int,
    sampling: Sampling = "poisson",
    sample_rate: float | None = None,
    sample_size: int | None = None,
    accountant: AccountantKind = "rdp",
    releases: int = 1,
) -> float:
    """The smallest noise multiplier σ whose ε at ``delta`` after ``rounds`` rounds (sampled as
    :meth:`PrivacyAccountant.record_round` is told) is at most ``target_epsilon``.

    The search is ``dp-accounting``'s ``mechanism_calibration.calibrate_dp_mechanism`` (Brent's
    method, then a check that ε does not exceed the target) on the same events and accountant
    as :class:`PrivacyAccountant`, in a bracket found by doubling/halving σ from 1. σ is found to
    within ``1e-6 · σ`` (so ε is within a small fraction of a percent of the target)."""
    from dp_accounting import mechanism_calibration as mc

    if not target_epsilon > 0 or math.isinf(target_epsilon):
        raise ValueError(f"target_epsilon must be finite and > 0, got {target_epsilon!r}")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")

    def accountant_at(sigma: float) -> PrivacyAccountant:
        acc = PrivacyAccountant(population, sampling=sampling, accountant=accountant)
        acc.record_round(
            sigma,
            sample_rate=sample_rate,
            sample_size=sample_size,
            releases=releases,
            rounds=rounds,
        )
        return acc

    def epsilon(sigma: float) -> float:
        return accountant_at(sigma).epsilon(delta)

    low, high = 1.0, 1.0
    while epsilon(high) > target_epsilon:
        low, high = high, 2 * high
        if high > 2**20:
            raise ValueError(f"no noise multiplier up to 2^20 reaches epsilon={target_epsilon}")
    while epsilon(low) <= target_epsilon:
        low, high = low / 2, low
        if low < 2**-20:
            return high  # (practically no noise needed)
    fresh = PrivacyAccountant(population, sampling=sampling, accountant=accountant)
    with _quiet_absl():
        sigma = mc.calibrate_dp_mechanism(
            fresh._new_impl,
            lambda s: accountant_at(s).dp_event(),
            target_epsilon,
            delta,
            bracket_interval=mc.ExplicitBracketInterval(low, high),
            tol=1e-6 * high,
        )
    return float(sigma)


__all__ = [
    "PrivacyAccountant",
    "PrivacyOptions",
    "calibrate_noise",
    "clip_factors",
    "clip_updates",
    "expected_clients",
    "noise_std",
    "noised_mean",
    "noised_sum",
    "privacy_options",
]
