"""pFedGP's binary GP classifier at one tree node (Achituve et al., NeurIPS 2021; spec
``specs/pfedgp.md``): a kernel on L2-normalized embeddings, Pólya-Gamma-augmented Gibbs sampling
of the logistic likelihood, and the predictive probability of the left child.

Model: f ~ N(μ·1, K), p(y = 1 | f) = σ(f) (y = 1: the left child), κ = y − ½. With
ω_i ~ PG(1, f_i) the likelihood becomes Gaussian in f: given ω, the pseudo-observations
z = κ / ω have noise variance Ω⁻¹, so f | ω ~ N(μ + K A⁻¹ (z − μ), K − K A⁻¹ K) with
A = K + Ω⁻¹ (the authors' ``pFedGP_full_data.py``). Gibbs alternates ω | f ~ PG(1, f) and
f | ω from the prior draw of f, in ``chains`` parallel chains. A test point's latent
f* | ω ~ N(μ + K*ᵀ A⁻¹ (z − μ), k** − K*ᵀ A⁻¹ K*) and its probability is E[σ(f*)] by Gauss–Hermite
quadrature, averaged over chains (``exp(E[log σ])``, the code's lower bound, is ``code=True``).
Every Cholesky factorization goes through :func:`safe_cholesky` (a jitter schedule, then one clear
error).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from fedhp.algorithms.polya_gamma import sample_pg1

JITTERS = (0.0, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2)
PG_TERMS = 20
"""Gamma terms of each PG(1, c) draw: the tail's mean is added exactly, its variance (below
1/(12π⁴·20³) ≈ 1e-7, against at least 5e-4 for |c| ≤ 10) is what is dropped."""


class NotPositiveDefinite(ValueError):
    """A kernel matrix stayed indefinite through the whole jitter schedule."""


def safe_cholesky(matrix: torch.Tensor, what: str = "kernel matrix") -> torch.Tensor:
    """Lower Cholesky factor of (a batch of) symmetric matrices, adding jitter × mean diagonal
    from :data:`JITTERS` until it succeeds; :class:`NotPositiveDefinite` naming ``what`` if none
    does."""
    eye = torch.eye(matrix.shape[-1], dtype=matrix.dtype, device=matrix.device)
    scale = matrix.diagonal(dim1=-2, dim2=-1).abs().mean(-1, keepdim=True).clamp(min=1e-12)
    for jitter in JITTERS:
        factor, info = torch.linalg.cholesky_ex(matrix + jitter * scale.unsqueeze(-1) * eye)
        if not bool(info.any()):
            return factor
    raise NotPositiveDefinite(
        f"{what} is not positive definite even with jitter {JITTERS[-1]:g} × its mean diagonal"
    )


def rbf_kernel(
    x1: torch.Tensor,
    x2: torch.Tensor,
    outputscale: float | torch.Tensor = 8.0,
    lengthscale: float | torch.Tensor = 1.0,
) -> torch.Tensor:
    """outputscale · exp(−‖a − b‖² / (2ℓ²)) between the L2-normalized rows of ``x1 [n, d]`` and
    ``x2 [m, d]`` (the authors' kernel; defaults their fixed hyperparameters)."""
    a = torch.nn.functional.normalize(x1, dim=-1)
    b = torch.nn.functional.normalize(x2, dim=-1)
    sq = (a.unsqueeze(-2) - b.unsqueeze(-3)).pow(2).sum(-1)
    return outputscale * torch.exp(-sq / (2 * lengthscale**2))


def linear_kernel(
    x1: torch.Tensor, x2: torch.Tensor, outputscale: float | torch.Tensor = 1.0
) -> torch.Tensor:
    """outputscale · ⟨a, b⟩ between the L2-normalized rows of ``x1`` and ``x2``."""
    a = torch.nn.functional.normalize(x1, dim=-1)
    b = torch.nn.functional.normalize(x2, dim=-1)
    return outputscale * a @ b.transpose(-1, -2)


@dataclass
class GibbsState:
    """The last Gibbs draw of every chain: ω ``[chains, n]`` and f ``[chains, n]``."""

    omega: torch.Tensor
    f: torch.Tensor


def gibbs(
    kernel: torch.Tensor,
    labels: torch.Tensor,
    mean: float,
    steps: int,
    chains: int,
    generator: torch.Generator,
) -> GibbsState:
    """``steps`` Gibbs sweeps (ω | f, then f | ω) of ``chains`` parallel chains for binary
    ``labels [n]`` (1 = left) under the prior N(mean, ``kernel [n, n]``), f starting from a prior
    draw. No gradient flows through the draws."""
    n = kernel.shape[0]
    dtype = kernel.dtype
    with torch.no_grad():
        k = kernel.detach()
        prior = safe_cholesky(k)
        # Draws from ``generator`` on its own device (the host for pFedGP's), then moved: a
        # run on CUDA draws the same numbers as on the CPU.
        eps = torch.randn(chains, n, generator=generator, dtype=dtype, device=generator.device)
        f = mean + eps.to(k.device) @ prior.T
        omega = torch.empty_like(f)
        for _ in range(steps):
            omega = sample_pg1(f, generator, PG_TERMS)
            mu, cov = _posterior(k, labels, omega, mean)
            chol = safe_cholesky(cov, "the Gibbs posterior covariance")
            eps = torch.randn(
                chains, n, 1, generator=generator, dtype=dtype, device=generator.device
            )
            f = mu + (chol @ eps.to(k.device)).squeeze(-1)
    return GibbsState(omega, f)


def _posterior(
    kernel: torch.Tensor, labels: torch.Tensor, omega: torch.Tensor, mean: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """f | ω: mean ``[chains, n]`` and covariance ``[chains, n, n]``."""
    a_chol, _, alpha = _solved(kernel, labels, omega, mean)
    mu = mean + (kernel @ alpha).squeeze(-1)
    v = torch.cholesky_solve(kernel.expand(len(omega), -1, -1), a_chol)  # A⁻¹ K
    cov = kernel - kernel @ v
    return mu, (cov + cov.transpose(-1, -2)) / 2


def _solved(
    kernel: torch.Tensor, labels: torch.Tensor, omega: torch.Tensor, mean: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per chain, the Cholesky factor ``[chains, n, n]`` of A = K + Ω⁻¹, z − μ = κ/ω − μ
    ``[chains, n, 1]`` and A⁻¹ (z − μ)."""
    kappa = labels.to(kernel.dtype) - 0.5
    a_chol = safe_cholesky(kernel + torch.diag_embed(1 / omega), "K + Ω⁻¹")
    z = (kappa / omega - mean).unsqueeze(-1)
    return a_chol, z, torch.cholesky_solve(z, a_chol)


def predictive(
    kernel: torch.Tensor,
    cross: torch.Tensor,
    test_diag: torch.Tensor,
    labels: torch.Tensor,
    state: GibbsState,
    mean: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per chain, the mean and variance ``[chains, m]`` of f* at ``m`` test points given the
    training ``kernel [n, n]``, ``cross [n, m]`` (K*) and the test points' prior variances
    ``test_diag [m]`` (differentiable in the kernels; ω is a constant)."""
    omega = state.omega.detach()
    a_chol, _, alpha = _solved(kernel, labels, omega, mean)
    mu = mean + (cross.transpose(-1, -2) @ alpha).squeeze(-1)
    v = torch.cholesky_solve(cross.expand(len(omega), -1, -1), a_chol)  # A⁻¹ K*
    var = test_diag - (cross * v).sum(-2)
    return mu, var.clamp(min=1e-10)


def expected_sigmoid(
    mu: torch.Tensor, var: torch.Tensor, points: int = 20, code: bool = False
) -> torch.Tensor:
    """E[σ(f)] for f ~ N(mu, var) by ``points``-node Gauss–Hermite quadrature (elementwise);
    ``code=True``: exp(E[log σ(f)]), the authors' lower bound."""
    nodes, weights = np.polynomial.hermite.hermgauss(points)
    x = torch.as_tensor(nodes, dtype=mu.dtype, device=mu.device)
    w = torch.as_tensor(weights / math.sqrt(math.pi), dtype=mu.dtype, device=mu.device)
    f = mu.unsqueeze(-1) + torch.sqrt(2 * var).unsqueeze(-1) * x
    if code:
        return torch.exp((torch.nn.functional.logsigmoid(f) * w).sum(-1))
    return (torch.sigmoid(f) * w).sum(-1)


def marginal_log_likelihood(
    kernel: torch.Tensor, labels: torch.Tensor, state: GibbsState, mean: float
) -> torch.Tensor:
    """The augmented marginal likelihood's data term per chain ``[chains]``:
    log N(κ/ω | μ, K + Ω⁻¹) (the terms that depend only on ω carry no gradient and are left out),
    differentiable in ``kernel``."""
    a_chol, z, alpha = _solved(kernel, labels, state.omega.detach(), mean)
    n = kernel.shape[0]
    logdet = 2 * torch.log(a_chol.diagonal(dim1=-2, dim2=-1)).sum(-1)
    quad = (z * alpha).sum((-2, -1))
    return -0.5 * (quad + logdet + n * math.log(2 * math.pi))
