"""The DP-FedAvg mechanism at an aggregator (:mod:`fedhp.privacy`): clip each client's update
(:func:`clip_updates`), add Gaussian noise to the sum (:func:`noised_sum`), divide by a
participation-independent denominator (:func:`noised_mean`)."""

from __future__ import annotations

import math

import torch

from fedhp.privacy.options import Sampling


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
