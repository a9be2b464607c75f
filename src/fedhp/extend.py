"""The plugin surface: every name a plugin may use, in one place (docs/extending.md).

A plugin (``fedhp run --plugin my_alg.py``, docs/extending.md) imports what it needs from here::

    from fedhp.extend import ALGORITHMS, AlgorithmOptions, FedAvg, RunContext, State, Task, Update

These names are stable: they keep their meaning through refactors of the modules that define
them, and any change to them (a name added, an argument renamed, a name withdrawn with its
replacement) is recorded in CHANGELOG.md. A plugin written against an older surface stops with
one line naming the replacement (:mod:`fedhp.plugins`), never a traceback. Their members that a
plugin may use (``ctx.local_sgd``, ``update.per_client["model"]``, …) are listed in
docs/extending.md, "The plugin surface"; anything else in fedhp is internal and may change
without notice.

Importing this module loads torch and registers the built-in components.
"""

from __future__ import annotations

from fedhp.algorithms import ALGORITHMS, Algorithm, AlgorithmOptions, State, Task, Update
from fedhp.algorithms.base import LocalWorkOptions
from fedhp.algorithms.fedavg import FedAvg, FedProx
from fedhp.config import RunConfig
from fedhp.data import DATASETS, PARTITIONERS, DatasetArrays, DatasetSource, Partitioner
from fedhp.engine.context import RunContext
from fedhp.engine.ops import (
    ExtraGrad,
    LocalOptimizer,
    LocalWork,
    LossGrad,
    prox_grad,
    weighted_mean,
)
from fedhp.errors import ConfigError, FedhpError
from fedhp.models import MODELS, BatchedModel, ModelOptions

__all__ = [
    # registries: register a component under a name
    "ALGORITHMS",
    "DATASETS",
    "MODELS",
    "PARTITIONERS",
    # options base classes
    "AlgorithmOptions",
    "LocalWorkOptions",
    "DatasetSource",
    "Partitioner",
    "ModelOptions",
    "RunConfig",
    # an algorithm and its round
    "Algorithm",
    "FedAvg",
    "FedProx",
    "State",
    "Task",
    "Update",
    # what the run gives an algorithm
    "RunContext",
    # the clients' local work
    "LocalWork",
    "LocalOptimizer",
    "ExtraGrad",
    "LossGrad",
    "prox_grad",
    # aggregation
    "weighted_mean",
    # data and models
    "DatasetArrays",
    "BatchedModel",
    # errors a plugin raises to stop a run with one line
    "ConfigError",
    "FedhpError",
]
