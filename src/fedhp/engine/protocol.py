"""What the engine needs of an algorithm and of its options: small protocols the algorithms
(:mod:`fedhp.algorithms`) satisfy, so that the engine imports none of them.

The runner, the checkpoints and the evaluation call only the members listed here; an algorithm
class built on :class:`fedhp.algorithms.base.Algorithm` has them all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import torch

from fedhp.comm import Message
from fedhp.engine.evaluate import ClientEval
from fedhp.engine.federation import ClientTensors

State = dict[str, torch.Tensor]
"""An algorithm's state: named tensors (``[P]`` global rows, ``[C, P]`` per-client rows, ...)."""

Row = dict[str, Any]
"""One row of results (metrics.csv, per_client.csv, summary.json)."""


class AlgorithmOptionsLike(Protocol):
    """The members of an algorithm's options the engine reads."""

    @property
    def hierarchical(self) -> bool:
        """Whether clients talk to edges, and edges to the cloud (else clients to the cloud)."""

    @property
    def penalty_weights(self) -> Mapping[str, str]:
        """The option fields that weigh a quadratic penalty, with the symbol to print (``{"mu":
        "μ"}``): a divergence message names the one whose ``weight · lr`` is too large."""

    def gradient_evaluations(self) -> int:
        """Minibatch gradient evaluations per client per global round."""

    def privacy_releases(self) -> int:
        """Noised aggregates one round's sampled clients feed at the DP level."""


@runtime_checkable
class LocalWorkOptionsLike(Protocol):
    """Options whose local work is ``local_steps`` steps or ``local_epochs`` passes over each
    client's data (:class:`fedhp.algorithms.base.LocalWorkOptions`; the work itself, what
    ``local_sgd`` runs, is :class:`fedhp.engine.ops.LocalWork`)."""

    local_epochs: int | None

    def local_work(self) -> str:
        """``"local_epochs=E"`` or ``"local_steps=S"``: the budget in use."""

    def step_counts(self, counts: torch.Tensor) -> torch.Tensor:
        """Real minibatch steps per client per round (int64) for training-set sizes ``counts``."""


class AlgorithmLike(Protocol):
    """The members of an algorithm object the runner, the checkpoints and the evaluation call
    (the Flower backend calls more: it knows :class:`fedhp.algorithms.base.Algorithm`)."""

    @property
    def held_keys(self) -> Mapping[str, str]:
        """Per-row state entries by the level that holds them (``"client"`` or ``"edge"``)."""

    @property
    def bills_stragglers(self) -> bool:
        """Whether the algorithm bills what the round's stragglers received itself."""

    @property
    def evaluation_needs_global(self) -> bool:
        """Whether an evaluated round sends the global model to every client."""

    def init_state(self, init_params: torch.Tensor) -> State:
        """State before round 0 from the initial flat parameters ``[P]``."""

    def run_round(self, state: State, rnd: int) -> dict[str, float]:
        """Run global round ``rnd`` in place on ``state``; returns scalar round statistics."""

    def round_local_keys(self) -> frozenset[str]:
        """State entries no round reads before rebuilding them (left out of checkpoints)."""

    def downlink(self, state: State, count: int) -> Message | None:
        """``count`` copies of the keyed message carrying the global model down (None: none)."""

    def global_model(self, state: State) -> torch.Tensor | None:
        """The global model ``[P]`` (None where the method has none)."""

    def global_buffers(self, state: State) -> torch.Tensor | None:
        """The global model's BatchNorm statistics ``[B]`` (None without BatchNorm)."""

    def personal_models(self, state: State) -> torch.Tensor | None:
        """Each client's personalized model ``[C, P]`` (None where the method has none)."""

    def personal_buffers(self, state: State) -> torch.Tensor | None:
        """The personalized models' BatchNorm statistics ``[C, B]`` (None: none)."""

    def personal_evaluation(self, state: State, split: ClientTensors) -> ClientEval | None:
        """Personalized predictions not made by a parameter vector (None: evaluate
        :meth:`personal_models`)."""

    def extra_metrics(self, state: State) -> dict[str, float]:
        """Method-specific values logged at evaluation rounds."""

    def summary_notes(self) -> dict[str, Any]:
        """Method-specific entries for summary.json."""
