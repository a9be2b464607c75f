"""How one level of the hierarchy (the edges, or the cloud) turns its rows into one (issue 20).

A :class:`LevelRule` is the level's robust rule (:mod:`fedhp.robust`; ``mean`` by default) and,
at the level that adds the noise, client-level DP (DP-FedAvg, :mod:`fedhp.privacy`): the
clients' updates ``row − start`` clipped to norm ``S``, summed, noised with ``N(0, σ²S²)``,
divided by a denominator that does not depend on who took part (``q·N`` under Poisson sampling,
the sample size under fixed-size sampling), added back to ``start``. The plain weighted mean
(no robust rule, no noise and no clipping) is :func:`fedhp.engine.ops.weighted_mean` itself, so
methods that fold their uploads part by part keep doing so (:attr:`LevelRule.folds`).

A robust rule may first average the rows in random buckets (``bucket``, s-bucketing). The noise
and the buckets' shuffle come from a stream seeded by ``(seed, round)``, like the failures: a
resumed run draws the same and a checkpoint needs no state for it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from fedhp.engine.ops import weighted_mean
from fedhp.engine.robust_rules import aggregate, bucketed
from fedhp.privacy.mechanism import clip_updates, noised_mean
from fedhp.privacy.options import PrivacyOptions
from fedhp.robust import RobustOptions

NOISE_SEED_OFFSET = 4_000_037


@dataclass
class LevelRule:
    """The aggregation of one level: ``robust`` (named ``label`` in errors) and, where this
    level adds DP noise, ``privacy`` (None elsewhere)."""

    robust: RobustOptions
    label: str
    privacy: PrivacyOptions | None = None
    seed: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    generator: torch.Generator = field(init=False)

    def __post_init__(self) -> None:
        self.generator = torch.Generator(device=self.device)

    @property
    def private(self) -> bool:
        """Whether this level clips or adds noise (DP with ``σ = 0`` and ``S = ∞`` does
        neither: it is the plain mean, bit for bit)."""
        p = self.privacy
        return p is not None and (p.noise_multiplier > 0 or math.isfinite(p.clip_norm))

    @property
    def centred(self) -> bool:
        """Whether the level's rule measures from the previous aggregate (``cclip``; not with
        DP, which is refused beside a robust rule anyway)."""
        return self.robust.centred and not self.private

    @property
    def folds(self) -> bool:
        """Whether the level's aggregate is the weighted mean (can be folded part by part)."""
        return self.robust.name == "mean" and not self.private

    def begin_round(self, rnd: int) -> None:
        """Re-seed the level's stream (DP noise, the buckets' shuffle) for round ``rnd``."""
        seed = np.random.default_rng([self.seed + NOISE_SEED_OFFSET, rnd]).integers(2**62)
        self.generator.manual_seed(int(seed))

    def __call__(
        self,
        rows: torch.Tensor,
        weights: torch.Tensor,
        start: torch.Tensor | None = None,
        denominator: float | None = None,
        centre: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The aggregate ``[W]`` of ``rows [n, W]`` with ``weights [n]``; ``start`` (``[W]``):
        the model the rows' senders started from (the DP, ``clip``, ``cclip`` and ``geomed``
        rules measure updates from it); ``denominator``: the DP average's (see the module;
        default: ``n``); ``centre`` (``[W]``, an update): ``cclip``'s, the level's previous
        aggregate update (None: 0)."""
        if self.folds:
            return weighted_mean(rows, weights)
        if not self.private:
            if self.robust.bucket > 1:
                rows, weights = bucketed(rows, weights, self.robust.bucket, self.generator)
            return aggregate(
                self.robust, rows, weights, reference=start, field=self.label, centre=centre
            )
        p = self.privacy
        assert p is not None
        if start is None:
            raise ValueError("a private level needs the model its clients started from")
        clipped = clip_updates(rows - start, p.clip_norm)
        d = float(rows.shape[0]) if denominator is None else denominator
        sigma, gen = p.noise_multiplier, self.generator
        return start + noised_mean(
            clipped, sigma, p.clip_norm, gen, sampling="fixed", denominator=d
        )
