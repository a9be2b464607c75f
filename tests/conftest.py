"""Shared fixtures: a small real federation (MNIST, the sFedHP paper's Setting 1)."""

from __future__ import annotations

import importlib
import os
import shutil
import tempfile
from types import ModuleType

import pytest
import torch

from fedhp.build import build_experiment
from fedhp.config import resolve_config
from fedhp.engine.experiment import Experiment


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


def in_ci() -> bool:
    """CI runs with ``CI`` set (``CI=true``): there a missing dependency or dataset is a
    failure, never a silent skip."""
    return bool(os.environ.get("CI"))


def require_module(name: str) -> ModuleType:
    """Import ``name`` for a test module: skip the module with a reason where it is missing,
    except under CI, where that fails loudly."""
    if not in_ci():
        return pytest.importorskip(name, reason=f"{name} is not installed (make test installs it)")
    try:
        return importlib.import_module(name)
    except ImportError as err:
        pytest.fail(f"CI is set but {name} cannot be imported ({err}); CI must run these tests")


def skip_unless_ci(condition: bool, reason: str) -> pytest.MarkDecorator:
    """``skipif(condition)`` locally; under CI the test runs (and fails if it cannot)."""
    return pytest.mark.skipif(condition and not in_ci(), reason=reason)


def small_experiment(*overrides: str) -> Experiment:
    """MNIST Setting 1 (20 clients, 4 edges), FedAvg unless overridden, with ``key=value``."""
    base = ["progress=false", "algorithm.name=fedavg", "eval_every=1"]
    return build_experiment(resolve_config(None, [*base, *overrides]))
