"""Shared fixtures: a small real federation (MNIST, the sFedHP paper's Setting 1)."""

from __future__ import annotations

import pytest
import torch

from fedhp.config import resolve_config
from fedhp.engine.build import Experiment, build_experiment


@pytest.fixture(autouse=True)
def _torch_threads() -> None:
    torch.set_num_threads(2)


def small_experiment(*overrides: str) -> Experiment:
    """MNIST Setting 1 (20 clients, 4 edges), FedAvg unless overridden, with ``key=value``."""
    base = ["progress=false", "algorithm.name=fedavg", "eval_every=1"]
    return build_experiment(resolve_config(None, [*base, *overrides]))
