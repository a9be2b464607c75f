"""Pólya-Gamma PG(1, c) draws in torch (pFedGP's Gibbs sampler; ``pypolyagamma`` does not install
reliably, spec ``specs/pfedgp.md``).

PG(1, c) is the infinite sum (1/2π²) Σ_{k≥1} g_k / ((k − ½)² + c²/(4π²)) with g_k ~ Exp(1)
(Polson, Scott & Windle 2013). :func:`sample_pg1` keeps the first ``terms`` summands, vectorized
over any shape of ``c``, and adds the exact mean of the rest — the closed-form mean
tanh(c/2)/(2c) minus the kept terms' mean — so every draw has the exact expectation; what is lost
is the tail's variance, below about 1/(12π⁴ terms³) (≈ 1e-10 at 200 terms, against a total
variance of at least 5e-4 for |c| ≤ 10).
"""

from __future__ import annotations

import math

import torch


def pg1_mean(c: torch.Tensor) -> torch.Tensor:
    """E[PG(1, c)] = tanh(c/2)/(2c) (1/4 at c = 0)."""
    c = c.abs()
    small = c < 1e-6
    safe = torch.where(small, torch.ones_like(c), c)
    return torch.where(small, torch.full_like(c, 0.25), torch.tanh(safe / 2) / (2 * safe))


def sample_pg1(
    c: torch.Tensor, generator: torch.Generator | None = None, terms: int = 200
) -> torch.Tensor:
    """One PG(1, c) draw per entry of ``c`` (any shape; float64 inside, returned in c's dtype)."""
    cd = c.detach().double().reshape(-1, 1)
    k = torch.arange(1, terms + 1, dtype=torch.float64, device=c.device)
    denom = (k - 0.5) ** 2 + cd**2 / (4 * math.pi**2)  # [N, terms]
    if generator is None or generator.device == denom.device:
        g = torch.empty_like(denom).exponential_(1.0, generator=generator)
    else:  # a generator on another device (the host's for CUDA data): draw there, then move
        g = torch.empty(denom.shape, dtype=denom.dtype, device=generator.device)
        g = g.exponential_(1.0, generator=generator).to(denom.device)
    kept = (g / denom).sum(1) / (2 * math.pi**2)
    kept_mean = (1 / denom).sum(1) / (2 * math.pi**2)
    tail = pg1_mean(cd[:, 0]) - kept_mean
    return (kept + tail).reshape(c.shape).to(c.dtype)
