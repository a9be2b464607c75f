"""A run's client-level DP budget (issue 20): which rounds released a noised aggregate, and ε.

One :class:`RunPrivacy` per run with ``privacy.enabled``. The runner calls :meth:`record_round`
after every completed round (a skipped round released nothing), writes :meth:`epsilon` into
metrics.csv on every evaluated round and :meth:`summary` into summary.json, and keeps
:meth:`state_dict` in the checkpoint. How a round's clients are drawn (:func:`round_sampling`):

- ``privacy.sampling=poisson`` (flat methods): each client with probability
  ``q = federation.client_fraction``;
- ``fixed``, flat methods: ``m = max(1, round(client_fraction · N))`` of the ``N`` clients
  (``Participation.sample_clients``);
- ``fixed``, hierarchical methods (DP at the edges): ``m = N``, no amplification by sampling.
  HierFAVG trains every client under the sampled edges, and sampling edges
  (``federation.edges_per_round``) is not accounted for: counting every client in every round
  is a valid upper bound on ε, never an underestimate.

``releases``: :meth:`fedhp.algorithms.base.AlgorithmOptions.privacy_releases` (HierFAVG: its
``kappa2`` noised edge aggregations per round).
"""

from __future__ import annotations

import math
from typing import Any

from fedhp.config import RunConfig
from fedhp.engine.protocol import AlgorithmOptionsLike
from fedhp.privacy.accountant import PrivacyAccountant
from fedhp.privacy.options import PrivacyOptions


def round_sampling(cfg: RunConfig, options: AlgorithmOptionsLike) -> dict[str, Any]:
    """The keyword arguments of :meth:`PrivacyAccountant.record_round` (and of
    :func:`fedhp.privacy.accountant.calibrate_noise`) for one round of this run: ``sample_rate`` or
    ``sample_size``, and ``releases``."""
    fed = cfg.federation
    n = fed.num_clients
    out: dict[str, Any] = {"releases": options.privacy_releases()}
    if cfg.privacy.sampling == "poisson":
        out["sample_rate"] = fed.client_fraction
    elif options.hierarchical:
        out["sample_size"] = n
    else:
        out["sample_size"] = min(n, max(1, round(fed.client_fraction * n)))
    return out


class RunPrivacy:
    """The accountant of one run and how each of its rounds is recorded."""

    def __init__(self, cfg: RunConfig, options: AlgorithmOptionsLike) -> None:
        self.options: PrivacyOptions = cfg.privacy
        self.accountant = PrivacyAccountant.from_options(cfg.privacy, cfg.federation.num_clients)
        self.sampling = round_sampling(cfg, options)

    @classmethod
    def of(cls, cfg: RunConfig, options: AlgorithmOptionsLike) -> RunPrivacy | None:
        """The run's budget (None without ``privacy.enabled``)."""
        return cls(cfg, options) if cfg.privacy.enabled else None

    def record_round(self) -> None:
        """One more round that released noised aggregate(s) (``σ = 0``: ε becomes ∞)."""
        self.accountant.record_round(self.options.noise_multiplier, **self.sampling)

    def epsilon(self) -> float:
        """ε at ``privacy.delta`` so far (``inf`` without noise, 0 before any round)."""
        return self.accountant.epsilon(self.options.delta)

    def state_dict(self) -> dict[str, Any]:
        return self.accountant.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.accountant = PrivacyAccountant.from_state_dict(state)

    def summary(self) -> dict[str, Any]:
        """summary.json's ``privacy`` entry (``epsilon: null``: ε = ∞, no noise;
        ``clip_norm: null``: S = ∞, no clipping)."""
        p, eps = self.options, self.epsilon()
        return {
            "epsilon": eps if math.isfinite(eps) else None,
            "delta": p.delta,
            "noise_multiplier": p.noise_multiplier,
            "clip_norm": p.clip_norm if math.isfinite(p.clip_norm) else None,
            "sampling": p.sampling,
            **{k: v for k, v in self.sampling.items()},
            "accountant": p.accountant,
            "where": p.where,
            "rounds": self.accountant.rounds,
        }
