"""The sparse-learning simulations of "Federated Nonconvex Sparse Learning" (natively federated,
with the true model exposed), and the noiseless Gaussian recovery check.

``fedht_sim`` (``task=linear``: Simulation I, ``task=logistic``: Simulation II), per client i:
u_i ~ N(0.1, α), B_i ~ N(0, β) (α, β standard deviations, as FedProx's generator); v_i ~ N(B_i, 1)
elementwise; x_i: the first ``support`` coordinates ~ N(u_i, 1), the rest 0 (a support shared by
all clients); b ~ N(u_i, 1) per client; z ~ N(v_i, Σ), Σ_jj = j^-1.2. Linear: y = zᵀx_i + b.
Logistic: y' = sigmoid(zᵀx_i + b), label 1 for the client's ``positives`` largest y', else 0.
``true_params`` is the clients' mean generating model (1/N) Σ_i x_i, ``true_support`` the shared
support.

``gaussian_sparse``: z ~ N(0, I), x* with ``support`` non-zeros N(0, 1) at random coordinates,
scaled to ‖x*‖ = 1, y = zᵀx* (no noise), split evenly among the clients. (The engine computes in
float32, whose iterates stall about 5e-7·‖x*‖ from x*: hence the unit norm.)
"""

from __future__ import annotations

import functools
from typing import Literal

import numpy as np
from pydantic import Field

from fedhp.data.sources import DATASETS, DatasetSource, owned_arrays
from fedhp.data.types import DatasetArrays


@functools.lru_cache(maxsize=4)
def _make_sim(
    task: str,
    num_clients: int,
    samples: int,
    test_samples: int,
    dim: int,
    support: int,
    positives: int,
    alpha: float,
    beta: float,
    seed: int,
) -> DatasetArrays:
    rng = np.random.default_rng(seed)
    cov_sqrt = np.power(np.arange(1, dim + 1, dtype=np.float64), -1.2) ** 0.5
    n = samples + test_samples
    parts, models = [], []
    for _ in range(num_clients):
        u, b_shift = rng.normal(0.1, alpha), rng.normal(0, beta)
        v = rng.normal(b_shift, 1, dim)
        x_i = np.zeros(dim)
        x_i[:support] = rng.normal(u, 1, support)
        b = rng.normal(u, 1)
        z = rng.standard_normal((n, dim))
        z *= cov_sqrt  # in place: the values of v + normal * cov_sqrt, without two temporaries
        z += v
        s = z @ x_i + b
        if task == "linear":
            y = s
        else:  # the top `positives` of sigmoid(s) (monotone in s) of each split are label 1
            y = np.zeros(n, dtype=np.int64)
            for lo, hi, k in (
                (0, samples, positives),
                (samples, n, positives * test_samples // samples),
            ):
                y[lo + np.argsort(-s[lo:hi], kind="stable")[:k]] = 1
        parts.append((z.astype(np.float32), y))  # float32 now, as kept: half the memory
        models.append(x_i)
    mask = np.zeros(dim, dtype=bool)
    mask[:support] = True
    classes = 1 if task == "linear" else 2
    x_true = np.mean(models, 0).astype(np.float32)
    return owned_arrays(f"fedht_sim:{task}", parts, [samples] * num_clients, classes, x_true, mask)


@DATASETS.register("fedht_sim")
class FedHTSimSource(DatasetSource):
    """The Fed-HT paper's Simulation I (``task=linear``) / II (``task=logistic``, use samples=1000,
    alpha=beta=1), natively federated (partition ``natural``), with x* and its support."""

    task: Literal["linear", "logistic"] = "linear"
    num_clients: int = Field(100, gt=0)
    samples: int = Field(100, gt=0, description="training samples per client")
    test_samples: int = Field(10, ge=1, description="extra held-out samples per client")
    dim: int = Field(1000, gt=0)
    support: int = Field(100, gt=0, description="size of the shared support")
    positives: int = Field(100, ge=1, description="logistic: label-1 samples per client")
    alpha: float = Field(0.1, ge=0)
    beta: float = Field(0.1, ge=0)
    seed: int = 0

    def load(self) -> DatasetArrays:
        """Generate (and cache) the dataset."""
        support, positives = min(self.support, self.dim), min(self.positives, self.samples)
        return _make_sim(**{**self.options(), "support": support, "positives": positives})


@functools.lru_cache(maxsize=4)
def _make_gaussian(
    num_clients: int, samples: int, test_samples: int, dim: int, support: int, seed: int
) -> DatasetArrays:
    rng = np.random.default_rng(seed)
    x_true = np.zeros(dim)
    where = np.sort(rng.choice(dim, support, replace=False))
    values = rng.normal(0, 1, support)
    x_true[where] = (values / np.linalg.norm(values)).astype(np.float32)  # ‖x*‖ = 1
    parts = []
    for _ in range(num_clients):  # y from the float32 design itself: noiseless up to y's rounding
        z = rng.standard_normal((samples + test_samples, dim)).astype(np.float32).astype(np.float64)
        parts.append((z, z @ x_true))
    n_train = [samples] * num_clients
    return owned_arrays(
        "gaussian_sparse", parts, n_train, 1, x_true.astype(np.float32), x_true != 0
    )


@DATASETS.register("gaussian_sparse")
class GaussianSparseSource(DatasetSource):
    """Noiseless sparse recovery: z ~ N(0, I), y = zᵀx*, ``support`` random non-zeros, ‖x*‖ = 1."""

    num_clients: int = Field(10, gt=0)
    samples: int = Field(100, gt=0)
    test_samples: int = Field(10, ge=1)
    dim: int = Field(1000, gt=0)
    support: int = Field(10, gt=0)
    seed: int = 0

    def load(self) -> DatasetArrays:
        """Generate (and cache) the dataset."""
        return _make_gaussian(**{**self.options(), "support": min(self.support, self.dim)})
