"""The algorithm interface: typed options plus round logic over a dict of tensors."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import pydantic
import torch

from fedhp.engine.context import RunContext
from fedhp.registry import Registry

State = dict[str, torch.Tensor]


class AlgorithmOptions(pydantic.BaseModel):
    """Options shared by every algorithm. Local work is explicit: ``local_steps`` minibatch
    gradient steps of ``batch_size`` samples per client per round (see ``gradient_evaluations``)."""

    model_config = pydantic.ConfigDict(extra="forbid", allow_inf_nan=False)

    lr: float = pydantic.Field(0.05, gt=0, description="client learning rate")
    batch_size: int = pydantic.Field(20, gt=0)
    local_steps: int = pydantic.Field(20, gt=0)

    hierarchical: ClassVar[bool] = False

    def build(self, ctx: RunContext) -> Algorithm:
        """The algorithm object for one run."""
        raise NotImplementedError

    def gradient_evaluations(self) -> int:
        """Minibatch gradient evaluations per client per global round."""
        return self.local_steps


ALGORITHMS: Registry[AlgorithmOptions] = Registry("algorithm")


class Algorithm(ABC):
    """One federated algorithm. State is a flat dict of tensors (checkpointable as is)."""

    def __init__(self, options: AlgorithmOptions, ctx: RunContext) -> None:
        self.options = options
        self.ctx = ctx

    @abstractmethod
    def init_state(self, init_params: torch.Tensor) -> State:
        """State before round 0 from the initial flat parameters ``[P]``."""

    @abstractmethod
    def run_round(self, state: State, rnd: int) -> dict[str, float]:
        """Run global round ``rnd`` in place on ``state``; returns scalar round statistics."""

    def global_model(self, state: State) -> torch.Tensor | None:
        """The global model ``[P]`` (None where the method has none)."""
        return state.get("global")

    def personal_models(self, state: State) -> torch.Tensor | None:
        """Each client's personalized model ``[C, P]`` (None where the method has none)."""
        return None

    def extra_metrics(self, state: State) -> dict[str, float]:
        """Method-specific values logged at evaluation rounds (e.g. densities)."""
        return {}
