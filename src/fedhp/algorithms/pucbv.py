"""P-UCBV (FedLPS, Alg. 2): one bandit per client on the server choosing its sparse ratio s.

The ratio space is a set of disjoint intervals (arms). After every round the client takes part
in, with its training accuracy a^r (a fraction), the previous one a^{r−1} and its round cost T
(simulated seconds):

1. the arm holding the credited ratio s (the server's decision, before the client's capability
   clamp) is split at s into a lower child [low, s) and an upper child [s, high); both inherit the
   parent's reward list and pull count (the authors' code);
2. if 100·(a^r − a^{r−1}) < Δ (accuracy *points*, Δ = −5) the lower child is deleted;
3. ε ← ε/2, ψ = ξ / I² with I the number of arms and ξ = R/(K·ε_sel) (rounds over the expected
   clients per round: the selection fraction, not ε);
4. the reward G = (U(a^r) − U(a^{r−1})) / T, U(x) = 10 − 20/(1 + e^{0.35x}) with x the accuracy
   as a *fraction* (100·x would saturate U above ~15 %), is appended to both children (the
   deleted one excepted);
5. every arm's score ḡ + sqrt(ρ(v̄ + 2)·max(0, log(ξψε)) / (4(h + 1))) — ḡ, v̄ the mean and
   population variance of its rewards, h its pulls; an arm never pulled scores its exploration
   term alone (ḡ = v̄ = 0) — and the next s is drawn uniformly inside the best arm (ties: the
   lowest interval), then raised to ``floor``.

The initial arms split [low, high) equally (``[0, 1)``: the paper; ``[0.5, 1)``: the code's
preset), and s⁰ is drawn uniformly inside a random arm. All randomness comes in as uniform draws
``u ∈ [0, 1)`` from the caller's seeded generator; :meth:`to_rows` makes a bandit resumable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

UNUSED = -1.0  # marks unused arm rows and an unset accuracy in :meth:`PUCBV.to_rows`


def utility(accuracy: float) -> float:
    """FedLPS's U(x) = 10 − 20 / (1 + e^{0.35x})."""
    return 10.0 - 20.0 / (1.0 + math.exp(0.35 * accuracy))


@dataclass
class Arm:
    """An interval [low, high) of sparse ratios and its rewards' sufficient statistics: the
    pull count h, Σ G and Σ G² (mean and population variance need no more)."""

    low: float
    high: float
    pulls: int = 0
    total: float = 0.0
    total_sq: float = 0.0

    def add(self, reward: float) -> None:
        self.pulls += 1
        self.total += reward
        self.total_sq += reward * reward

    def mean(self) -> float:
        return self.total / self.pulls if self.pulls else 0.0

    def variance(self) -> float:
        if not self.pulls:
            return 0.0
        return max(0.0, self.total_sq / self.pulls - self.mean() ** 2)

    def contains(self, s: float) -> bool:
        return self.low <= s < self.high


@dataclass
class PUCBV:
    """One client's bandit; ``xi`` = R/(K·ε_sel) (:func:`exploration_xi`)."""

    xi: float
    rho: float = 0.5
    delta_points: float = -5.0
    floor: float = 1.0 / 16
    arms: list[Arm] = field(default_factory=list)
    epsilon: float = 1.0
    psi: float = 0.0
    ratio: float = 1.0  # the current decision s
    accuracy: float | None = None  # a^{r−1}: the last accuracy seen (None: not set yet)

    @classmethod
    def create(
        cls,
        xi: float,
        u_arm: float,
        u_point: float,
        *,
        num_arms: int = 5,
        low: float = 0.0,
        high: float = 1.0,
        **options: Any,
    ) -> PUCBV:
        """``num_arms`` equal arms over [low, high) and s⁰ drawn inside a random one."""
        width = (high - low) / num_arms
        arms = [Arm(low + i * width, low + (i + 1) * width) for i in range(num_arms)]
        arms[-1].high = high
        bandit = cls(xi=xi, arms=arms, psi=xi / num_arms**2, **options)
        bandit.ratio = bandit._sample(arms[min(int(u_arm * num_arms), num_arms - 1)], u_point)
        return bandit

    def _sample(self, arm: Arm, u: float) -> float:
        return max(self.floor, arm.low + u * (arm.high - arm.low))

    def score(self, arm: Arm) -> float:
        """ḡ + sqrt(ρ(v̄ + 2)·max(0, log(ξψε)) / (4(h + 1)))."""
        log_term = max(0.0, math.log(self.xi * self.psi * self.epsilon))
        bonus = math.sqrt(self.rho * (arm.variance() + 2.0) * log_term / (4.0 * (arm.pulls + 1)))
        return arm.mean() + bonus

    def update(self, accuracy: float, cost: float, u: float) -> float:
        """Credit the current ratio with ``accuracy`` (a fraction) at ``cost`` (seconds > 0) and
        return the next ratio (``u``: a uniform draw for the point inside the best arm)."""
        if self.accuracy is None:
            raise ValueError("P-UCBV: set the initial accuracy a^{-1} before the first update")
        if cost <= 0:
            raise ValueError(f"P-UCBV: the round cost must be > 0 seconds, got {cost}")
        s = self.ratio
        index = next((i for i, a in enumerate(self.arms) if a.contains(s)), None)
        if index is None:  # s at the top edge (s = high of the last arm): its arm
            index = max(range(len(self.arms)), key=lambda i: self.arms[i].high)
        parent = self.arms[index]
        children = [
            Arm(lo, hi, parent.pulls, parent.total, parent.total_sq)
            for lo, hi in ((parent.low, s), (s, parent.high))
        ]
        lower, upper = (c if c.high > c.low else None for c in children)
        if 100.0 * (accuracy - self.accuracy) < self.delta_points:
            lower = None  # accuracy-dominated arm elimination
        kept = [c for c in (lower, upper) if c is not None]
        self.arms[index : index + 1] = kept
        self.epsilon /= 2.0
        self.psi = self.xi / len(self.arms) ** 2
        reward = (utility(accuracy) - utility(self.accuracy)) / cost
        for child in kept:
            child.add(reward)
        self.accuracy = accuracy
        scores = [self.score(a) for a in self.arms]
        best = max(range(len(self.arms)), key=lambda i: (scores[i], -self.arms[i].low))
        self.ratio = self._sample(self.arms[best], u)
        return self.ratio

    def to_rows(self, max_arms: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The bandit as tensors (checkpointable algorithm state, all finite): arms
        ``[max_arms, 5]`` (low, high, h, ΣG, ΣG²; unused rows have low = −1) and
        ``[epsilon, psi, ratio, accuracy]`` (accuracy −1 when unset)."""
        if len(self.arms) > max_arms:
            raise ValueError(f"P-UCBV: {len(self.arms)} arms exceed the table's {max_arms}")
        arms = torch.full((max_arms, 5), UNUSED, dtype=torch.float64)
        for i, a in enumerate(self.arms):
            arms[i] = torch.tensor([a.low, a.high, a.pulls, a.total, a.total_sq])
        acc = UNUSED if self.accuracy is None else self.accuracy
        return arms, torch.tensor([self.epsilon, self.psi, self.ratio, acc], dtype=torch.float64)

    def load_rows(self, arms: torch.Tensor, scalars: torch.Tensor) -> None:
        """Inverse of :meth:`to_rows`."""
        rows = [r for r in arms.tolist() if r[0] != UNUSED]
        self.arms = [Arm(lo, hi, int(h), t, t2) for lo, hi, h, t, t2 in rows]
        epsilon, psi, ratio, acc = scalars.tolist()
        self.epsilon, self.psi, self.ratio = epsilon, psi, ratio
        self.accuracy = None if acc == UNUSED else acc


def exploration_xi(rounds: int, num_clients: int, fraction: float) -> float:
    """ξ = R / (K·ε_sel): rounds over the expected number of clients per round."""
    return rounds / (num_clients * fraction)
