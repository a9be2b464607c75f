"""Shared fixtures: a small real federation (MNIST, the sFedHP paper's Setting 1)."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
import torch

from fedhp.config import resolve_config
from fedhp.engine.build import Experiment, build_experiment


@pytest.fixture(autouse=True)
def _torch_threads() -> None:
    torch.set_num_threads(2)


_CACHE: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    """Caches written by the code under test (Flower nodes' data) go to a throwaway folder, not
    the user's ~/.cache; subprocesses inherit it."""
    if "FEDHP_CACHE_DIR" not in os.environ:
        _CACHE.append(tempfile.mkdtemp(prefix="fedhp-test-cache-"))
        os.environ["FEDHP_CACHE_DIR"] = _CACHE[0]


def pytest_unconfigure(config: pytest.Config) -> None:
    for path in _CACHE:
        shutil.rmtree(path, ignore_errors=True)


def small_experiment(*overrides: str) -> Experiment:
    """MNIST Setting 1 (20 clients, 4 edges), FedAvg unless overridden, with ``key=value``."""
    base = ["progress=false", "algorithm.name=fedavg", "eval_every=1"]
    return build_experiment(resolve_config(None, [*base, *overrides]))
