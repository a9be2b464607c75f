"""The Fed-HT paper's simulations (I: linear, II: logistic) and the noiseless Gaussian data."""

from __future__ import annotations

import numpy as np
import torch

from fedhp.data import load_dataset, split_dataset


def test_simulation_one_recipe() -> None:
    cfg = {"name": "fedht_sim", "num_clients": 4, "samples": 20, "dim": 50, "support": 10}
    data = load_dataset(cfg)
    assert data.train_x.shape == (80, 50) and data.train_y.dtype == torch.float32
    assert data.num_classes == 1 and data.test_x.shape == (40, 50)
    assert data.true_support is not None and data.true_params is not None
    assert data.true_support.tolist() == [True] * 10 + [False] * 40
    assert bool((data.true_params[10:] == 0).all()) and bool((data.true_params[:10] != 0).all())
    # the covariance Σ_jj = j^-1.2: late coordinates vary less around their client mean
    spread = torch.stack([data.train_x[i * 20 : (i + 1) * 20].std(0) for i in range(4)]).mean(0)
    assert spread[:5].mean() > 2 * spread[-5:].mean()
    clients = split_dataset(data, {"name": "natural"}, 4, 0)
    assert [c.num_train for c in clients] == [20] * 4
    again = load_dataset({**cfg, "seed": 1})
    assert not torch.equal(again.train_x, data.train_x)


def test_simulation_two_labels_top_hundred_per_client() -> None:
    data = load_dataset(
        {
            "name": "fedht_sim",
            "task": "logistic",
            "num_clients": 3,
            "samples": 400,
            "test_samples": 40,
            "dim": 30,
            "support": 5,
            "positives": 100,
            "alpha": 1,
            "beta": 1,
        }
    )
    assert data.num_classes == 2 and data.train_y.dtype == torch.int64
    per_client = data.train_y.view(3, 400).sum(1)
    assert per_client.tolist() == [100, 100, 100]
    assert data.test_y.view(3, 40).sum(1).tolist() == [10, 10, 10]


def test_gaussian_sparse_is_noiseless() -> None:
    data = load_dataset(
        {"name": "gaussian_sparse", "num_clients": 2, "samples": 30, "dim": 40, "support": 4}
    )
    assert data.true_params is not None and data.true_support is not None
    assert int(data.true_support.sum()) == 4
    assert abs(float(data.true_params.norm()) - 1.0) < 1e-6
    residual = data.train_y - data.train_x.double().matmul(data.true_params.double()).float()
    assert float(residual.abs().max()) < 1e-5


def first_written_recipe(
    num_clients: int, samples: int, test_samples: int, dim: int, support: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Simulation I's features and targets (train, test) as the generator first computed them:
    float64 arrays, z = v + normal · Σ^½, concatenated, then converted to float32."""
    rng = np.random.default_rng(seed)
    cov_sqrt = np.power(np.arange(1, dim + 1, dtype=np.float64), -1.2) ** 0.5
    parts = []
    for _ in range(num_clients):
        u, b_shift = rng.normal(0.1, 0.1), rng.normal(0, 0.1)
        v = rng.normal(b_shift, 1, dim)
        x_i = np.zeros(dim)
        x_i[:support] = rng.normal(u, 1, support)
        b = rng.normal(u, 1)
        z = v + rng.standard_normal((samples + test_samples, dim)) * cov_sqrt
        parts.append((z, z @ x_i + b))
    train_x = np.concatenate([z[:samples] for z, _ in parts]).astype(np.float32)
    test_x = np.concatenate([z[samples:] for z, _ in parts]).astype(np.float32)
    train_y = np.concatenate([y[:samples] for _, y in parts]).astype(np.float32)
    return torch.from_numpy(train_x), torch.from_numpy(test_x), torch.from_numpy(train_y)


def test_in_place_float32_generation_gives_the_first_written_values() -> None:
    """The generator builds z in place and keeps each client's part as float32 (half the memory,
    less than half the time on Simulation II): bit for bit the values of the first recipe."""
    cfg = {"name": "fedht_sim", "num_clients": 5, "samples": 40, "test_samples": 10, "dim": 30}
    data = load_dataset({**cfg, "support": 8, "seed": 3})
    train_x, test_x, train_y = first_written_recipe(5, 40, 10, 30, 8, 3)
    assert torch.equal(data.train_x, train_x) and torch.equal(data.test_x, test_x)
    assert torch.equal(data.train_y, train_y)
