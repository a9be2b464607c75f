"""The algorithm interface: typed options plus round logic over a dict of tensors.

A round is split where the cloud's link is (see docs/flower.md):

* :meth:`Algorithm.plan` (cloud): sampling and what is sent down — a :class:`Task`;
* :meth:`Algorithm.train` (below the cloud: the edges and their clients, or a shard of clients):
  the local work, on the state rows it holds — an :class:`Update`;
* :meth:`Algorithm.aggregate` (cloud): what came up is recorded and aggregated.

The in-process engine runs the three on one process (:meth:`Algorithm.run_round`); the Flower
backend runs ``train`` on every node, on the node's part of the task, and merges the updates.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import pydantic
import torch

from fedhp.comm import count_nonzero
from fedhp.engine.context import RunContext
from fedhp.engine.evaluate import density
from fedhp.registry import Registry

State = dict[str, torch.Tensor]
RowKind = Literal["client", "edge"]
NNZ_PREFIX = "nnz."
"""Where a node-held state key is absent (the Flower cloud), ``state[NNZ_PREFIX + key]`` holds
its non-zero count per row, reported by the nodes, so densities can still be computed."""


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

ThetaInit = Literal["round", "warm", "reset"]
"""Where a personalized model theta starts (pFedMe, sFedHP); see :func:`theta_init_field`."""


def theta_init_field(received: str) -> Any:
    """The ``theta_init`` option; ``received`` names the model a client receives."""
    return pydantic.Field(
        "round",
        description=f"where theta starts, from the received model ({received}): round: <- it at "
        "the start of every global round, warm across its local rounds (pFedMe's reference "
        "code); warm: kept across global rounds; reset: <- it at every local round",
    )


@dataclass
class Task:
    """What the cloud sends below it for one round, in the receiver's client/edge indices.

    ``broadcast`` tensors go to everyone; ``per_client`` rows align with ``clients``."""

    clients: torch.Tensor  # sorted clients taking part
    edges: torch.Tensor | None = None  # sorted edges that train (hierarchical)
    agg_edges: torch.Tensor | None = None  # sorted edges whose models go up (default: edges)
    broadcast: dict[str, torch.Tensor] = field(default_factory=dict)
    per_client: dict[str, torch.Tensor] = field(default_factory=dict)
    scalars: dict[str, float] = field(default_factory=dict)

    @property
    def up_edges(self) -> torch.Tensor | None:
        return self.agg_edges if self.agg_edges is not None else self.edges


@dataclass
class Update:
    """What comes up to the cloud: rows per client of ``task.clients``, rows per edge of
    ``task.up_edges``, and the per-client training losses ``[S, len(clients)]`` (one row per
    local loss group, e.g. per local round)."""

    per_client: dict[str, torch.Tensor] = field(default_factory=dict)
    per_edge: dict[str, torch.Tensor] = field(default_factory=dict)
    losses: torch.Tensor | None = None


class Algorithm(ABC):
    """One federated algorithm. State is a flat dict of tensors (checkpointable as is).

    ``node_keys`` names the state entries kept below the cloud (per-client or per-edge rows, e.g.
    personalized models); under Flower they live on the nodes, the rest on the cloud.
    ``personal_on_node``: the personalized models are computed from node state (evaluated there).
    ``personal_needs_global``: computing them needs the global model too (sent along).
    ``client_outputs`` / ``edge_outputs``: the keys of :class:`Update` rows ``train`` returns.
    """

    node_keys: ClassVar[dict[str, RowKind]] = {}
    personal_on_node: ClassVar[bool] = False
    personal_needs_global: ClassVar[bool] = False
    client_outputs: ClassVar[tuple[str, ...]] = ()
    edge_outputs: ClassVar[tuple[str, ...]] = ()

    def __init__(self, options: AlgorithmOptions, ctx: RunContext) -> None:
        self.options = options
        self.ctx = ctx

    @abstractmethod
    def init_state(self, init_params: torch.Tensor) -> State:
        """State before round 0 from the initial flat parameters ``[P]``."""

    @abstractmethod
    def plan(self, state: State, rnd: int) -> Task:
        """Cloud: sample who takes part in round ``rnd``, record and return what is sent down."""

    def plan_broadcast_global(self, state: State) -> Task:
        """The flat methods' plan: sample clients and send each the global model."""
        ctx = self.ctx
        clients = ctx.sample_clients()
        sent = state["global"].expand(len(clients), -1)
        ctx.ledger.record("client_cloud", "down", sent, ctx.zero_threshold, nodes=clients)
        return Task(clients, broadcast={"global": state["global"]})

    @abstractmethod
    def train(self, state: State, task: Task) -> Update:
        """Below the cloud: the round's local work on the rows of ``state`` this process holds."""

    @abstractmethod
    def aggregate(self, state: State, task: Task, update: Update) -> dict[str, float]:
        """Cloud: record what came up and aggregate it into ``state``; returns round statistics."""

    def run_round(self, state: State, rnd: int) -> dict[str, float]:
        """Run global round ``rnd`` in place on ``state``; returns scalar round statistics."""
        task = self.plan(state, rnd)
        return self.aggregate(state, task, self.train(state, task))

    def global_model(self, state: State) -> torch.Tensor | None:
        """The global model ``[P]`` (None where the method has none)."""
        return state.get("global")

    def personal_models(self, state: State) -> torch.Tensor | None:
        """Each client's personalized model ``[C, P]`` (None where the method has none)."""
        return None

    def round_local_keys(self) -> frozenset[str]:
        """Node-held state entries no round reads before rebuilding them (e.g. a theta restarted
        every round while every client takes part in every round): checkpoints leave them out
        and a resumed run does not send them to the Flower nodes. Default: none."""
        return frozenset()

    def extra_metrics(self, state: State) -> dict[str, float]:
        """Method-specific values logged at evaluation rounds (e.g. densities)."""
        return {}

    def state_density(self, state: State, key: str) -> float:
        """Density of ``state[key]``, or from the non-zero counts the nodes reported."""
        if key in state:
            return density(state[key], self.ctx.zero_threshold)
        nnz = state[NNZ_PREFIX + key]
        return float(nnz.sum()) / (nnz.numel() * self.ctx.model.num_params)

    def row_nonzeros(self, state: State, key: str) -> torch.Tensor:
        """Non-zero count of each row of node-held ``state[key]`` (int64)."""
        return count_nonzero(state[key], self.ctx.zero_threshold).to(torch.int64)
