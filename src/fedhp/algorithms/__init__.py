"""Algorithms, found by name through :data:`ALGORITHMS`. Importing this package registers them."""

from fedhp.algorithms import (  # noqa: F401  (registration side effects)
    centralized,
    ditto,
    fedavg,
    fedht,
    fedlps,
    fednova,
    fedper,
    fedrolex,
    fnrfl,
    heterofl,
    heurfedamp,
    hierfavg,
    local,
    lotteryfl,
    moon,
    perfedavg,
    pfedgp,
    pfedme,
    scaffold,
    sfedhp,
)
from fedhp.algorithms.base import ALGORITHMS, Algorithm, AlgorithmOptions, State, Task, Update

__all__ = ["ALGORITHMS", "Algorithm", "AlgorithmOptions", "State", "Task", "Update"]
