"""Simulated failures: client dropout, edge-server failure and stragglers, per round.

Each round's failures come from their own random stream, seeded by ``(seed + FAULT_SEED_OFFSET +
faults.seed_offset, round)``. They are therefore reproducible, independent of how much randomness
the algorithm consumed, and need no state in a checkpoint (a resumed run draws the same failures).
Every round draws one uniform number per client for dropout, one per client for straggling, one
per edge for failure and then one per client for a straggler's share of its local work, whatever
the probabilities, so raising one probability only adds failures (the failure sets are nested) and
never reshuffles the others, and the share was added without moving the earlier draws.

Semantics (what :class:`~fedhp.engine.context.RunContext` does with a :class:`RoundFaults`):

* a **dropped** client is offline: it is not trained, sends and receives nothing;
* a **straggler** receives the round's model but its update misses the deadline: it is not
  aggregated and its state is unchanged; the runner charges the model it received to the downlink
  (``faults.straggler_work: drop``, the default, for every method);
* under ``faults.straggler_work: partial`` (FedProx's systems heterogeneity, Li et al. 2020) a
  straggler does only part of its local work: :func:`partial_units` of its ``E`` local epochs (or
  steps, where the method counts steps), ``1 + floor(u (E - 1))`` for its uniform draw ``u`` of
  :attr:`RoundFaults.work` — FedProx's ``randint(1, E)``. A method that keeps partial work
  (``Algorithm.keeps_partial_work``: FedProx) trains and aggregates it like any participant (it
  receives the model and uploads its partial solution); the others drop it as under ``drop``;
* a **failed** edge server takes no part in the round, so none of its clients does either.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedhp.config import FaultsConfig
from fedhp.errors import ConfigError

FAULT_SEED_OFFSET = 2_000_029


class RoundSkipped(Exception):
    """Raised by the participant helpers when no client can take part in the round."""


@dataclass(frozen=True)
class RoundFaults:
    """The failures of one round (boolean masks on the CPU)."""

    dropped: torch.Tensor  # [C] client offline
    straggler: torch.Tensor  # [C] client misses the deadline (never also dropped)
    edge_failed: torch.Tensor  # [E] edge server down
    # [C] float64 in [0, 1): each client's draw for its share of the local work, used where a
    # straggler's partial work is kept (:func:`partial_units`); None: not drawn (no faults)
    work: torch.Tensor | None = None

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
        u_work = rng.random(self.num_clients)  # after the others: they are as before it came
        dropped = u_drop < self.cfg.client_dropout
        straggler = ~dropped & (u_strag < self.cfg.straggler)
        failed = u_edge < self.cfg.edge_failure
        return RoundFaults(
            torch.from_numpy(dropped),
            torch.from_numpy(straggler),
            torch.from_numpy(failed),
            torch.from_numpy(u_work),
        )


def partial_units(draw: torch.Tensor, total: int) -> torch.Tensor:
    """The units of local work (epochs or steps) of each client, of ``total``: a straggler's
    ``draw`` ``u`` in [0, 1) gives ``1 + floor(u (total - 1))`` — uniform on ``1 .. total - 1``,
    FedProx's ``np.random.randint(1, total)`` — and a draw of 1 or more (a client doing all its
    work) gives ``total``. int64, on ``draw``'s device."""
    share = (1 + torch.floor(draw * (total - 1))).to(torch.int64)
    return torch.where(draw < 1, share, torch.full_like(share, total))


def check_partial_work(cfg: FaultsConfig, units: int, field: str) -> None:
    """A one-line :class:`~fedhp.errors.ConfigError` where stragglers would do partial work of a
    method that keeps it but ``units`` (its local epochs or steps, named ``field``) leave no
    partial share: FedProx's stragglers do 1 .. E - 1 of E, so E must be at least 2."""
    if cfg.straggler > 0 and cfg.straggler_work == "partial" and units < 2:
        raise ConfigError(
            f"faults.straggler_work: partial work needs at least 2 local units (a straggler does "
            f"1 .. E-1 of E); {field} is {units} (use straggler_work=drop or more local work)"
        )
