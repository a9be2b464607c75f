"""Simulated failures: client dropout, edge-server failure and stragglers, per round.

Each round's failures come from their own random stream, seeded by ``(seed + FAULT_SEED_OFFSET +
faults.seed_offset, round)``. They are therefore reproducible, independent of how much randomness
the algorithm consumed, and need no state in a checkpoint (a resumed run draws the same failures).
Every round draws one uniform number per client for dropout, one per client for straggling and one
per edge for failure, whatever the probabilities, so raising one probability only adds failures
(the failure sets are nested) and never reshuffles the others.

Semantics (what :class:`~fedhp.engine.context.RunContext` does with a :class:`RoundFaults`):

* a **dropped** client is offline: it is not trained, sends and receives nothing;
* a **straggler** receives the round's model but its update misses the deadline: it is not
  aggregated and its state is unchanged; the runner charges the model it received to the downlink;
* a **failed** edge server takes no part in the round, so none of its clients does either.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedhp.config import FaultsConfig

FAULT_SEED_OFFSET = 2_000_029


class RoundSkipped(Exception):
    """Raised by the participant helpers when no client can take part in the round."""


@dataclass(frozen=True)
class RoundFaults:
    """The failures of one round (boolean masks on the CPU)."""

    dropped: torch.Tensor  # [C] client offline
    straggler: torch.Tensor  # [C] client misses the deadline (never also dropped)
    edge_failed: torch.Tensor  # [E] edge server down

    @property
    def available(self) -> torch.Tensor:
        """[C] clients that can contribute an update (neither dropped nor straggling)."""
        return ~(self.dropped | self.straggler)

    @staticmethod
    def none(num_clients: int, num_edges: int) -> RoundFaults:
        no_c = torch.zeros(num_clients, dtype=torch.bool)
        return RoundFaults(no_c, no_c.clone(), torch.zeros(num_edges, dtype=torch.bool))


class FaultModel:
    """Draws :class:`RoundFaults` for any round from ``cfg`` and the run's seed."""

    def __init__(self, cfg: FaultsConfig, seed: int, num_clients: int, num_edges: int) -> None:
        self.cfg = cfg
        self.base_seed = seed + FAULT_SEED_OFFSET + cfg.seed_offset
        self.num_clients = num_clients
        self.num_edges = num_edges

    @property
    def enabled(self) -> bool:
        return self.cfg.enabled

    def draw(self, rnd: int) -> RoundFaults:
        """The failures of round ``rnd`` (0-based); the same for the same seed and round."""
        if not self.enabled:
            return RoundFaults.none(self.num_clients, self.num_edges)
        rng = np.random.default_rng([self.base_seed, rnd])
        u_drop = rng.random(self.num_clients)
        u_strag = rng.random(self.num_clients)
        u_edge = rng.random(self.num_edges)
        dropped = u_drop < self.cfg.client_dropout
        straggler = ~dropped & (u_strag < self.cfg.straggler)
        failed = u_edge < self.cfg.edge_failure
        return RoundFaults(
            torch.from_numpy(dropped), torch.from_numpy(straggler), torch.from_numpy(failed)
        )
