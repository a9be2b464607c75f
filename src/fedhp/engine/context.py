"""What an algorithm sees of the run: model, data, topology, RNG, accounting, who takes part
(:mod:`fedhp.engine.participation`), the uplink pipelines (:mod:`fedhp.engine.uplink`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, overload

import torch

from fedhp.comm import CommLedger, Message, count_nonzero, truncate
from fedhp.engine.aggregation import LevelRule
from fedhp.engine.attacks import Attack
from fedhp.engine.faults import RoundFaults, partial_units
from fedhp.engine.federation import Federation
from fedhp.engine.ops import (
    ExtraGrad,
    LocalWork,
    LossGrad,
    sgd_steps,
    weighted_sgd_steps,
)
from fedhp.engine.participation import Participation
from fedhp.engine.policy import ExecutionPolicy
from fedhp.engine.sampler import BatchSampler, EpochBatches
from fedhp.engine.uplink import Uplink
from fedhp.models.base import BatchedModel
from fedhp.topology import Topology

Weighting = Literal["uniform", "samples"]


@dataclass
class RunContext:
    """Shared services for one run. Algorithms keep their own state in a dict of tensors."""

    model: BatchedModel
    fed: Federation
    topology: Topology
    ledger: CommLedger
    generator: torch.Generator
    sampler: BatchSampler
    weighting: Weighting = "uniform"
    zero_threshold: float = 0.0
    # Who takes part in each round (sampling, failures); not given: every client and edge of
    # ``topology`` each round, no failures.
    participation: Participation = None  # type: ignore[assignment]
    attack: Attack | None = None  # malicious clients (None: all honest)
    # The rules of the cloud's and the edges' uplink pipelines (robust rules, DP;
    # :attr:`cloud_uplink`, :attr:`edge_uplink`); None: the weighted mean.
    cloud_rule: LevelRule | None = None
    edge_rule: LevelRule | None = None
    # β of the clients' momentum (``algorithm.client_momentum``, step 0 of the pipeline of
    # ``client_level``, where the clients upload: ``"cloud"`` for flat methods, ``"edge"``).
    client_momentum: float = 0.0
    client_level: str = "cloud"
    # Global indices of this context's clients and edges where it holds only part of the
    # federation (a Flower node); None: it holds all of it and local indices are global.
    client_ids: torch.Tensor | None = None
    edge_ids: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.participation is None:
            self.participation = Participation(
                self.topology, self.generator, self.fed.num_clients, self.device
            )

    @property
    def device(self) -> torch.device:
        return self.fed.train.x.device

    @property
    def policy(self) -> ExecutionPolicy:
        """The run's execution policy (client chunks, evaluation rows, precision), held with
        the model it was built for (``model.policy``, set by ``build_experiment``)."""
        return self.model.policy

    @property
    def num_clients(self) -> int:
        return self.fed.num_clients

    @property
    def all_clients(self) -> torch.Tensor:
        return torch.arange(self.num_clients, device=self.device)

    def global_clients(self, clients: torch.Tensor) -> torch.Tensor:
        """Global indices of local ``clients`` (for ledger node ids and messages)."""
        return clients if self.client_ids is None else self.client_ids.to(self.device)[clients]

    def global_edges(self, edges: torch.Tensor) -> torch.Tensor:
        """Global indices of local ``edges``."""
        return edges if self.edge_ids is None else self.edge_ids.to(self.device)[edges]

    def edge_positions(self, clients: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
        """For each of ``clients``, the position of its edge in the sorted ``edges``."""
        return torch.searchsorted(edges, self.topology.edge_of_client.to(self.device)[clients])

    def begin_round(self, rnd: int) -> RoundFaults | None:
        """Start round ``rnd`` (called by the runner before ``run_round``): the seeded attack
        and rules draw for it, :attr:`participation` its failures (returned)."""
        for seeded in (self.attack, self.cloud_rule, self.edge_rule):
            if seeded is not None:
                seeded.begin_round(rnd)
        return self.participation.begin_round(rnd)

    def client_weights(self, clients: torch.Tensor) -> torch.Tensor:
        """Aggregation weights of ``clients``: 1 each, or their training-sample counts."""
        if self.weighting == "samples":
            return self.fed.train.counts[clients].to(torch.float32)
        return torch.ones(len(clients), device=self.device)

    def edge_weights(self, edges: torch.Tensor) -> torch.Tensor:
        """Aggregation weights of ``edges``: 1 each, or the training samples under each edge."""
        if self.weighting == "samples":
            per_edge = torch.zeros(self.topology.num_edges, device=self.device)
            counts = self.fed.train.counts.float()
            available = self.participation.available()
            if available is not None:  # only the samples of clients that took part
                counts = counts * available
            per_edge.index_add_(0, self.topology.edge_of_client.to(self.device), counts)
            return per_edge[edges]
        return torch.ones(len(edges), device=self.device)

    @property
    def cloud_uplink(self) -> Uplink:
        """The pipeline of what the cloud receives: the clients' momentum and the run's attack on
        client uploads, the cloud's rule (:mod:`fedhp.engine.uplink`)."""
        return Uplink(
            "cloud",
            self.cloud_rule,
            self.attack,
            self.participation.poisson_rate(),
            self.client_momentum if self.client_level == "cloud" else 0.0,
        )

    @property
    def edge_uplink(self) -> Uplink:
        """The pipeline of what the edges receive: the clients' momentum and the run's attack on
        client uploads, the edges' rule."""
        return Uplink(
            "edge",
            self.edge_rule,
            self.attack,
            self.participation.poisson_rate(),
            self.client_momentum if self.client_level == "edge" else 0.0,
        )

    @property
    def whole_rounds(self) -> bool:
        """Whether an aggregation's uploads must arrive at once at some level (a robust or
        private rule, or an attack reading the round's benign updates): no streamed parts."""
        return self.cloud_uplink.whole_rounds or self.edge_uplink.whole_rounds

    @overload
    def send(
        self, link: str, direction: str, messages: Message, nodes: torch.Tensor | None = None
    ) -> Message: ...

    @overload
    def send(
        self, link: str, direction: str, messages: torch.Tensor, nodes: torch.Tensor | None = None
    ) -> torch.Tensor: ...

    def send(
        self,
        link: str,
        direction: str,
        messages: torch.Tensor | Message,
        nodes: torch.Tensor | None = None,
    ) -> torch.Tensor | Message:
        """Bill ``messages`` (rows, or a keyed :class:`~fedhp.comm.Message`: one message per
        receiver of all its fields) on ``link`` and return what the receiver gets: the values
        truncated at the zero threshold (``|x| <= eps`` sent as 0), i.e. exactly what was
        billed (the same fields for a :class:`~fedhp.comm.Message`)."""
        rows = messages.rows() if isinstance(messages, Message) else messages
        sent = truncate(rows, self.zero_threshold)
        self.ledger.record(link, direction, sent, self.zero_threshold, nodes=nodes)
        return messages.like(sent) if isinstance(messages, Message) else sent

    @overload
    def broadcast(
        self, link: str, direction: str, message: Message, nodes: torch.Tensor
    ) -> Message: ...

    @overload
    def broadcast(
        self, link: str, direction: str, message: torch.Tensor, nodes: torch.Tensor
    ) -> torch.Tensor: ...

    def broadcast(
        self, link: str, direction: str, message: torch.Tensor | Message, nodes: torch.Tensor
    ) -> torch.Tensor | Message:
        """Bill one copy of ``message [P]`` (or of a keyed :class:`~fedhp.comm.Message` of
        fields ``[w_k]``) per node of ``nodes`` (the same model sent to each) and return what
        each receives, once: like :meth:`send` with ``message`` repeated, but its non-zeros are
        counted once, not once per copy."""
        row = message.rows() if isinstance(message, Message) else message
        sent = truncate(row, self.zero_threshold)
        nnz = count_nonzero(sent, self.zero_threshold)
        self.ledger.record_counts(link, direction, nnz.expand(len(nodes)), sent.shape[-1], nodes)
        return message.like(sent) if isinstance(message, Message) else sent

    @overload
    def multicast(
        self, link: str, direction: str, rows: Message, row_of: torch.Tensor, nodes: torch.Tensor
    ) -> Message: ...

    @overload
    def multicast(
        self,
        link: str,
        direction: str,
        rows: torch.Tensor,
        row_of: torch.Tensor,
        nodes: torch.Tensor,
    ) -> torch.Tensor: ...

    def multicast(
        self,
        link: str,
        direction: str,
        rows: torch.Tensor | Message,
        row_of: torch.Tensor,
        nodes: torch.Tensor,
    ) -> torch.Tensor | Message:
        """Bill each of ``nodes`` the row ``row_of`` names of ``rows [S, P]`` (one per sender,
        e.g. each edge's model to its clients) and return the rows as sent, once per sender:
        like :meth:`broadcast` per sender, each row's non-zeros counted once."""
        flat = rows.rows() if isinstance(rows, Message) else rows
        sent = truncate(flat, self.zero_threshold)
        nnz = count_nonzero(sent, self.zero_threshold)
        self.ledger.record_counts(link, direction, nnz[row_of], sent.shape[-1], nodes)
        return rows.like(sent) if isinstance(rows, Message) else sent

    def batches(
        self, clients: torch.Tensor, batch_size: int, drawn: torch.Tensor | None = None
    ) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
        """A callable yielding a fresh minibatch ``(x [C',B,..], y [C',B])`` of ``clients``;
        from the indices ``drawn [S, C', B]`` (drawn ahead, :meth:`BatchSampler.steps`) in turn
        where given."""
        ahead = None if drawn is None else iter(drawn)

        def draw() -> tuple[torch.Tensor, torch.Tensor]:
            idx = self.sampler.draw(clients, batch_size) if ahead is None else next(ahead)
            x, y = self.fed.train.gather(clients, idx, self.generator)
            return x, y

        return draw

    def draw_ahead(self, clients: torch.Tensor, work: LocalWork) -> torch.Tensor | EpochBatches:
        """The minibatch indices of ``clients`` for the whole of ``work``, drawn now in the order
        :meth:`local_sgd` would draw them (:meth:`BatchSampler.steps` or
        :meth:`BatchSampler.epochs`)."""
        if work.epochs is not None:
            return self.sampler.epochs(clients, work.batch_size, work.epochs)
        return self.sampler.steps(clients, work.batch_size, work.steps)

    def local_sgd(
        self,
        params: torch.Tensor,
        clients: torch.Tensor,
        work: LocalWork,
        extra_grad: ExtraGrad | None = None,
        *,
        mask: torch.Tensor | None = None,
        buffers: torch.Tensor | None = None,
        loss_grad: LossGrad | None = None,
        drawn: torch.Tensor | EpochBatches | None = None,
        partial: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The local SGD of ``clients`` from ``params`` (their rows), all at once: ``work``'s
        steps or epochs (:class:`~fedhp.engine.ops.LocalWork`), each step's gradient plus
        ``extra_grad``'s term (prox, SCAFFOLD's correction) or of the method's own objective
        ``loss_grad`` (:data:`~fedhp.engine.ops.LossGrad`); ``mask [C', P]``: on the masked
        sub-models (:mod:`fedhp.models.masks`); ``buffers [C', B]``: BatchNorm running
        statistics, updated in place; ``drawn``: the minibatches, drawn ahead
        (:meth:`draw_ahead`; else drawn as the steps go); ``partial [C']`` (float64;
        :meth:`~fedhp.engine.participation.Participation.partial_work`): each straggler's draw
        of its share of the work — it does :func:`~fedhp.engine.faults.partial_units` of the
        ``epochs`` (or ``steps``), the first ones, and stops (a draw of 1: all of them); the
        minibatches are drawn as for full work, so nobody else's change. Returns the new
        parameters, each client's loss summed over its steps and its step count ``[C']`` (int64).

        Under ``epochs`` client c takes ``ceil(n_c / batch_size)`` steps per epoch on a fresh
        permutation of its data (the last minibatch partial); clients of unequal size step
        together, the ones that have finished frozen (:func:`~fedhp.engine.ops.weighted_sgd_steps`).
        """
        gather, opt = self.fed.train.gather, work.optimizer
        units = None
        if partial is not None:  # stragglers' partial work: their first units (epochs or steps)
            total = work.epochs if work.epochs is not None else work.steps
            units = partial_units(partial.cpu(), total)
        if work.epochs is not None:
            plan = drawn if isinstance(drawn, EpochBatches) else None
            if plan is None:
                plan = self.sampler.epochs(clients, work.batch_size, work.epochs)
            index, weight = plan.index, plan.weight
            until, counts = None, plan.steps
            if units is not None:  # epoch e is batched steps e S' .. (e + 1) S' - 1
                until = units * (plan.num_steps // work.epochs)
                counts = plan.steps // work.epochs * units.to(plan.steps.device)

            def epoch_batch(
                step: int, rows: slice
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
                x, y = gather(clients[rows], index[step, rows], self.generator)
                return x, y, weight[step, rows]

            active = (weight.sum(2) > 0).cpu()
            params, loss_sum = weighted_sgd_steps(
                self.model,
                params,
                epoch_batch,
                plan.num_steps,
                work.lr,
                extra_grad,
                mask=mask,
                active=active,
                buffers=buffers,
                loss_grad=loss_grad,
                optimizer=opt,
                until=until,
            )
            return params, loss_sum, counts
        ahead = drawn if isinstance(drawn, torch.Tensor) else None
        if mask is None:
            params, loss_sum = sgd_steps(
                self.model,
                params,
                self.batches(clients, work.batch_size, ahead),
                work.steps,
                work.lr,
                extra_grad,
                buffers=buffers,
                loss_grad=loss_grad,
                optimizer=opt,
                until=units,
            )
        else:  # the same minibatches, their indices drawn first and gathered chunk by chunk
            steps: Sequence[torch.Tensor] | torch.Tensor
            if ahead is not None:
                steps = ahead
            else:
                steps = [self.sampler.draw(clients, work.batch_size) for _ in range(work.steps)]

            def step_batch(step: int, rows: slice) -> tuple[torch.Tensor, torch.Tensor, None]:
                x, y = gather(clients[rows], steps[step][rows], self.generator)
                return x, y, None

            params, loss_sum = weighted_sgd_steps(
                self.model,
                params,
                step_batch,
                work.steps,
                work.lr,
                extra_grad,
                mask=mask,
                buffers=buffers,
                loss_grad=loss_grad,
                optimizer=opt,
                until=units,
            )
        if units is not None:
            return params, loss_sum, units.to(self.device)
        counts = torch.full((len(clients),), work.steps, dtype=torch.int64, device=self.device)
        return params, loss_sum, counts
