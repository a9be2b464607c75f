"""pFedGP's binary GP node: the Gibbs posterior of a tiny GP against the exact posterior by grid
quadrature, the predictive mean/variance by hand, Gauss–Hermite against a dense grid, kernels on
normalized embeddings, and the Cholesky jitter schedule's one clear error."""

from __future__ import annotations

import math

import pytest
import torch

from fedhp.algorithms.gp import (
    GibbsState,
    NotPositiveDefinite,
    expected_sigmoid,
    gibbs,
    linear_kernel,
    predictive,
    rbf_kernel,
    safe_cholesky,
)

K3 = torch.tensor([[2.0, 0.8, 0.5], [0.8, 1.5, 0.3], [0.5, 0.3, 1.2]], dtype=torch.float64)
MEAN = 0.3
LABELS = torch.tensor([1, 0])


def _exact_posterior() -> tuple[torch.Tensor, torch.Tensor, float]:
    """E[f], Var[f] of the two training latents and E[σ(f₃)] of the test latent under
    p(f | y) ∝ N(f; μ, K) σ(f₁)(1 − σ(f₂)), by quadrature on a 600 × 600 grid (f₃ | f₁, f₂ is
    Gaussian: its E[σ] by 40-node Gauss–Hermite)."""
    g = torch.linspace(-9, 9, 600, dtype=torch.float64)
    f1, f2 = torch.meshgrid(g, g, indexing="ij")
    f = torch.stack([f1, f2], -1) - MEAN
    k = K3[:2, :2]
    quad = (f @ torch.linalg.inv(k) * f).sum(-1)
    w = torch.exp(-quad / 2) * torch.sigmoid(f1) * torch.sigmoid(-f2)
    w = w / w.sum()
    mean = torch.stack([(w * f1).sum(), (w * f2).sum()])
    var = torch.stack([(w * f1**2).sum(), (w * f2**2).sum()]) - mean**2
    gain = K3[2, :2] @ torch.linalg.inv(k)
    cond_mu = MEAN + (f @ gain)
    cond_var = K3[2, 2] - gain @ K3[:2, 2]
    prob = (w * expected_sigmoid(cond_mu, cond_var.expand_as(cond_mu), 40)).sum()
    return mean, var, float(prob)


def test_gibbs_posterior_and_predictive_match_the_exact_ones() -> None:
    gen = torch.Generator().manual_seed(0)
    state = gibbs(K3[:2, :2], LABELS, MEAN, steps=30, chains=4000, generator=gen)
    mean, var, prob = _exact_posterior()
    se = (var / 4000).sqrt()  # chains are independent: the Monte Carlo standard error
    assert bool(((state.f.mean(0) - mean).abs() < 4 * se).all()), (state.f.mean(0), mean)
    assert bool(((state.f.var(0) / var - 1).abs() < 0.1).all()), (state.f.var(0), var)
    mu, v = predictive(K3[:2, :2], K3[:2, 2:], K3[2:, 2], LABELS, state, MEAN)
    gibbs_prob = float(expected_sigmoid(mu, v).mean())
    assert gibbs_prob == pytest.approx(prob, abs=0.01)


def test_predictive_by_hand_for_fixed_omega() -> None:
    k = torch.tensor([[1.0, 0.5], [0.5, 2.0]], dtype=torch.float64)
    cross = torch.tensor([[0.4], [0.1]], dtype=torch.float64)
    omega = torch.tensor([[0.2, 0.5]], dtype=torch.float64)
    state = GibbsState(omega, torch.zeros_like(omega))
    mu, var = predictive(k, cross, torch.tensor([1.5], dtype=torch.float64), LABELS, state, 0.1)
    a = k + torch.diag(1 / omega[0])  # [[6, .5], [.5, 4]]
    det = 6 * 4 - 0.25
    a_inv = torch.tensor([[4.0, -0.5], [-0.5, 6.0]], dtype=torch.float64) / det
    assert torch.allclose(a @ a_inv, torch.eye(2, dtype=torch.float64))
    z = torch.tensor([0.5 / 0.2, -0.5 / 0.5], dtype=torch.float64) - 0.1
    assert float(mu[0, 0]) == pytest.approx(0.1 + float(cross[:, 0] @ a_inv @ z))
    assert float(var[0, 0]) == pytest.approx(1.5 - float(cross[:, 0] @ a_inv @ cross[:, 0]))


def test_expected_sigmoid_against_a_dense_grid() -> None:
    mu = torch.tensor([-2.0, 0.0, 1.5], dtype=torch.float64)
    var = torch.tensor([0.5, 4.0, 9.0], dtype=torch.float64)
    grid = torch.linspace(-40, 40, 200001, dtype=torch.float64)
    default, fine = expected_sigmoid(mu, var), expected_sigmoid(mu, var, 100)
    low = expected_sigmoid(mu, var, code=True)
    for i, (m, v) in enumerate(zip(mu, var, strict=True)):
        density = torch.exp(-((grid - m) ** 2) / (2 * v)) / math.sqrt(2 * math.pi * v)
        exact = float((torch.sigmoid(grid) * density).sum() * (grid[1] - grid[0]))
        assert float(default[i]) == pytest.approx(exact, abs=5e-4)  # 20 nodes
        assert float(fine[i]) == pytest.approx(exact, abs=1e-6)
        assert float(low[i]) < exact  # the code's exp(E[log σ]) is a lower bound (Jensen)


def test_kernels_see_only_directions() -> None:
    x = torch.tensor([[3.0, 4.0], [0.0, 2.0]])
    assert torch.allclose(rbf_kernel(x, 10 * x), rbf_kernel(x, x))
    assert float(rbf_kernel(x, x)[0, 0]) == pytest.approx(8.0)  # outputscale on the diagonal
    assert float(rbf_kernel(x, x)[0, 1]) == pytest.approx(8 * math.exp(-((0.6**2 + 0.2**2) / 2)))
    assert float(linear_kernel(x, x)[0, 1]) == pytest.approx(0.8)


def test_cholesky_jitter_then_one_clear_error() -> None:
    singular = torch.ones(3, 3, dtype=torch.float64)  # rank 1: needs jitter
    factor = safe_cholesky(singular)
    assert torch.allclose(factor @ factor.T, singular, atol=1e-4)
    with pytest.raises(NotPositiveDefinite, match="kernel matrix is not positive definite"):
        safe_cholesky(-torch.eye(2, dtype=torch.float64))


def test_marginal_log_likelihood_is_the_gaussian_of_the_pseudo_observations() -> None:
    from fedhp.algorithms.gp import marginal_log_likelihood

    k = K3[:2, :2]
    omega = torch.tensor([[0.3, 0.7], [1.1, 0.2]], dtype=torch.float64)
    state = GibbsState(omega, torch.zeros_like(omega))
    got = marginal_log_likelihood(k, LABELS, state, MEAN)
    kappa = LABELS.double() - 0.5
    for c in range(2):
        dist = torch.distributions.MultivariateNormal(
            torch.full((2,), MEAN, dtype=torch.float64), k + torch.diag(1 / omega[c])
        )
        assert float(got[c]) == pytest.approx(float(dist.log_prob(kappa / omega[c])))
