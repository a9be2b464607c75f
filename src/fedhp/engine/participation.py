"""Who takes part in a round: the clients and edges sampled (``client_fraction`` of the clients,
fixed-size or Poisson; ``edges_per_round`` of the edges), minus the round's failures (dropped and
straggling clients, failed edges; :mod:`fedhp.engine.faults`), and who took part so far.

Under ``faults.straggler_work: partial`` a method that keeps partial work asks
:meth:`Participation.sample_clients` with ``keep_partial=True``: its stragglers then stay among the
clients (as participants, not stragglers) and :meth:`Participation.partial_work` gives each its
draw of the share of its local work it does."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from fedhp.engine.faults import FaultModel, RoundFaults, RoundSkipped
from fedhp.topology import Topology


@dataclass
class Participation:
    """The run's sampling of clients and edges, drawn from ``generator``, and the current
    round's failures (:meth:`begin_round`)."""

    topology: Topology
    generator: torch.Generator
    num_clients: int
    device: torch.device
    client_fraction: float = 1.0
    edges_per_round: int | None = None
    sampling: Literal["fixed", "poisson"] = "fixed"  # poisson: each with client_fraction
    faults: FaultModel | None = None
    # The current round's failures (set by begin_round) and who took part so far this round.
    round_faults: RoundFaults | None = field(default=None, init=False, repr=False)
    round_participants: torch.Tensor | None = field(default=None, init=False, repr=False)
    round_stragglers: torch.Tensor | None = field(default=None, init=False, repr=False)
    # This round's stragglers kept with partial work (sorted; None: none so far).
    round_partial: torch.Tensor | None = field(default=None, init=False, repr=False)

    @property
    def all_clients(self) -> torch.Tensor:
        return torch.arange(self.num_clients, device=self.device)

    def simulates_failures(self) -> bool:
        """Failures (dropouts, stragglers, edge failures) are drawn each round."""
        return self.faults is not None and self.faults.enabled

    def samples_every_client(self) -> bool:
        """:meth:`sample_clients` samples all clients (before failures)."""
        return max(1, round(self.client_fraction * self.num_clients)) >= self.num_clients

    def samples_every_edge(self) -> bool:
        """:meth:`sample_edges` samples all edges (before failures)."""
        n = self.topology.num_edges
        return (self.edges_per_round or n) >= n

    def poisson_rate(self) -> float | None:
        """``q`` where clients are drawn by Poisson sampling with ``q < 1`` (else None)."""
        if self.sampling == "poisson" and self.client_fraction < 1:
            return self.client_fraction
        return None

    def begin_round(self, rnd: int) -> RoundFaults | None:
        """Draw round ``rnd``'s failures.

        Until the next call, :meth:`sample_clients`, :meth:`sample_edges` and
        :meth:`clients_of_edges` leave out dropped and straggling clients and failed edges; if
        nobody is left they raise :class:`~fedhp.engine.faults.RoundSkipped`."""
        self.round_participants = None
        self.round_stragglers = None
        self.round_partial = None
        if self.faults is None or not self.faults.enabled:
            self.round_faults = None
        else:
            self.round_faults = self.faults.draw(rnd)
        return self.round_faults

    def available(self) -> torch.Tensor | None:
        """[C] bool on the device: clients able to contribute this round (None: no faults)."""
        if self.round_faults is None:
            return None
        return self.round_faults.available.to(self.device)

    def keeps_partial(self, keep_partial: bool) -> bool:
        """Whether this round's stragglers stay, with partial work, for a method that keeps
        partial work (``keep_partial``): ``faults.straggler_work`` is ``partial``."""
        faults = self.faults
        if not keep_partial or faults is None or faults.cfg.straggler == 0:
            return False
        return faults.cfg.straggler_work == "partial"

    def _survivors(self, clients: torch.Tensor, keep_partial: bool = False) -> torch.Tensor:
        """``clients`` minus this round's dropped and straggling ones (the stragglers kept where
        :meth:`keeps_partial`); records who took part."""
        faults = self.round_faults
        if faults is None:
            return clients
        is_straggler = faults.straggler.to(self.device)[clients]
        straggling = clients[is_straggler]
        if self.keeps_partial(keep_partial):
            kept = clients[~faults.dropped.to(self.device)[clients]]
            self.round_partial = _union(self.round_partial, straggling)
        else:
            kept = clients[faults.available.to(self.device)[clients]]
            self.round_stragglers = _union(self.round_stragglers, straggling)
        self.round_participants = _union(self.round_participants, kept)
        return kept

    def partial_work(self, clients: torch.Tensor) -> torch.Tensor | None:
        """[C'] float64 on the device: for each of ``clients``, its draw ``u`` in [0, 1) of the
        share of its local work where it is a straggler kept with partial work this round
        (:func:`~fedhp.engine.faults.partial_units`), 1.0 where it does all its work; None where
        none of ``clients`` is such a straggler (no cost)."""
        faults, partial = self.round_faults, self.round_partial
        if faults is None or faults.work is None or partial is None or len(partial) == 0:
            return None
        clients = clients.cpu()
        short = torch.isin(clients, partial.cpu())
        if not bool(short.any()):
            return None
        draw = faults.work[clients]
        return torch.where(short, draw, torch.ones_like(draw)).to(self.device)

    def sample_clients(self, keep_partial: bool = False) -> torch.Tensor:
        """Sorted client indices taking part this round (``client_fraction`` of all, at least 1,
        or under Poisson sampling each client with probability ``client_fraction``), minus this
        round's dropped and straggling clients (``keep_partial``: the stragglers stay where they
        do partial work, :meth:`keeps_partial`; :meth:`partial_work` gives their shares)."""
        n = self.num_clients
        k = max(1, round(self.client_fraction * n))
        if self.sampling == "poisson" and self.client_fraction < 1:
            drawn = torch.rand(n, generator=self.generator) < self.client_fraction
            sampled = torch.nonzero(drawn).flatten().to(self.device)
        elif k >= n:
            sampled = self.all_clients
        else:
            sampled = torch.randperm(n, generator=self.generator)[:k].sort().values.to(self.device)
        kept = self._survivors(sampled, keep_partial)
        if len(kept) == 0:
            raise RoundSkipped("every sampled client dropped out or straggled")
        return kept

    def sample_edges(self) -> torch.Tensor:
        """Sorted edge indices aggregated this round (``edges_per_round`` of all, minus failed
        edges and edges none of whose clients can take part this round)."""
        n = self.topology.num_edges
        s = self.edges_per_round or n
        if s >= n:
            sampled = torch.arange(n, device=self.device)
        else:
            sampled = torch.randperm(n, generator=self.generator)[:s].sort().values.to(self.device)
        faults = self.round_faults
        if faults is None:
            return sampled
        edge_of = self.topology.edge_of_client.to(self.device)
        has_clients = torch.zeros(n, dtype=torch.bool, device=self.device)
        has_clients[edge_of[faults.available.to(self.device)]] = True
        kept = sampled[(~faults.edge_failed.to(self.device) & has_clients)[sampled]]
        if len(kept) == 0:
            raise RoundSkipped("every sampled edge failed or lost all its clients")
        # The stragglers under the kept edges received the model: record them (and who took part).
        self._survivors(self.all_clients[torch.isin(edge_of, kept)])
        return kept

    def clients_of_edges(self, edges: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Clients under ``edges`` (sorted) and, for each, the position of its edge in ``edges``.

        This round's dropped and straggling clients, and clients of failed edges, are left out."""
        edge_of = self.topology.edge_of_client.to(self.device)
        under = (edge_of.unsqueeze(1) == edges.unsqueeze(0)).any(1)
        if self.round_faults is not None:  # a failed edge server reaches none of its clients
            under &= ~self.round_faults.edge_failed.to(self.device)[edge_of]
        clients = self._survivors(self.all_clients[under])
        return clients, torch.searchsorted(edges, edge_of[clients])

    def stragglers_under(self, edges: torch.Tensor) -> torch.Tensor:
        """This round's stragglers whose edge is one of ``edges`` (sorted; empty: none)."""
        stragglers = self.round_stragglers
        if stragglers is None:
            return torch.zeros(0, dtype=torch.long, device=self.device)
        stragglers = stragglers.to(self.device)
        edge_of = self.topology.edge_of_client.to(self.device)
        return stragglers[torch.isin(edge_of[stragglers], edges)]


def _union(a: torch.Tensor | None, b: torch.Tensor) -> torch.Tensor:
    """Sorted distinct indices of ``a`` and ``b``."""
    return b.unique() if a is None else torch.cat((a, b)).unique()
