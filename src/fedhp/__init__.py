"""fedhp: personalized, hierarchical and sparse federated learning, vectorized over clients.

The Python API (docs/api.md)::

    import fedhp

    result = fedhp.run("my.yaml", rounds=50, algorithm__lr=0.1)   # like `fedhp run`
    result.metrics, result.summary, result.state, result.out_dir
    fedhp.load_run("runs/a")                                      # a finished run's results
    fedhp.sweep(grid={"algorithm.lam": [15, 20]}, seeds=[0, 1], out="sweeps/lam")  # fedhp sweep
    fedhp.ALGORITHMS.names()          # the registries: ALGORITHMS, DATASETS, MODELS, PARTITIONERS

``import fedhp`` is light: torch and the components load on first use of these names.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fedhp.errors import ConfigError, FedhpError
from fedhp.version import __version__

_LAZY = {
    "run": "fedhp.api",
    "load_run": "fedhp.api",
    "resolve": "fedhp.api",
    "Result": "fedhp.api",
    "load_plugins": "fedhp.plugins",
    "ALGORITHMS": "fedhp.algorithms",
    "DATASETS": "fedhp.data",
    "PARTITIONERS": "fedhp.data",
    "MODELS": "fedhp.models",
}

__all__ = [
    "ALGORITHMS",
    "DATASETS",
    "MODELS",
    "PARTITIONERS",
    "ConfigError",
    "FedhpError",
    "Result",
    "__version__",
    "load_plugins",
    "load_run",
    "resolve",
    "run",
    "sweep",
]

if TYPE_CHECKING:
    from fedhp.algorithms import ALGORITHMS
    from fedhp.api import Result, load_run, resolve, run
    from fedhp.data import DATASETS, PARTITIONERS
    from fedhp.models import MODELS
    from fedhp.plugins import load_plugins
    from fedhp.sweep.api import sweep  # (at run time the callable package fedhp.sweep)


def __getattr__(name: str) -> Any:
    if name == "sweep":  # the package fedhp.sweep is callable: fedhp.sweep(...) runs a sweep
        return importlib.import_module("fedhp.sweep")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'fedhp' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
