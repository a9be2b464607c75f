"""Client-level DP accounting with ``dp-accounting`` (:mod:`fedhp.privacy`): the run's ε
(:class:`PrivacyAccountant`) and the noise multiplier that reaches a target ε
(:func:`calibrate_noise`)."""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from fedhp.privacy.options import AccountantKind, PrivacyOptions, Sampling

STATE_FORMAT = "fedhp-privacy-accountant"
STATE_VERSION = 1


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
