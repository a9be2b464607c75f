"""Algorithms, found by name through :data:`ALGORITHMS`. Importing this package registers them."""

from fedhp.algorithms import fedavg, hierfavg  # noqa: F401  (registration side effects)
from fedhp.algorithms.base import ALGORITHMS, Algorithm, AlgorithmOptions, State

__all__ = ["ALGORITHMS", "Algorithm", "AlgorithmOptions", "State"]
