"""A run ready to start (:class:`Experiment`), as :mod:`fedhp.build` makes it from a configuration,
and the seed offsets of the run's random streams."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from fedhp.config import RunConfig
from fedhp.engine.context import RunContext
from fedhp.engine.protocol import AlgorithmLike, AlgorithmOptionsLike
from fedhp.models.base import BatchedModel

# Offsets that give each random stream its own seed derived from the run's one seed.
MODEL_SEED_OFFSET = 0
ENGINE_SEED_OFFSET = 1_000_003

AlgorithmT = TypeVar("AlgorithmT", bound=AlgorithmLike, covariant=True)
OptionsT = TypeVar("OptionsT", bound=AlgorithmOptionsLike, covariant=True)


@dataclass
class Experiment(Generic[AlgorithmT, OptionsT]):
    """A run ready to start: data resident, model and algorithm built."""

    cfg: RunConfig
    model: BatchedModel
    options: OptionsT
    algorithm: AlgorithmT
    ctx: RunContext


EngineExperiment = Experiment[AlgorithmLike, AlgorithmOptionsLike]
"""An experiment as the engine sees it: its algorithm and options only through the protocols of
:mod:`fedhp.engine.protocol` (what the engine may call on them)."""
