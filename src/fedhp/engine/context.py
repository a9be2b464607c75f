"""What an algorithm sees of the run: model, data, topology, RNG, accounting, who takes part
(:mod:`fedhp.engine.participation`), the uplink pipelines (:mod:`fedhp.engine.uplink`)."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

import torch

from fedhp.comm import CommLedger, Message, count_nonzero, truncate
from fedhp.engine.aggregation import LevelRule
from fedhp.engine.attacks import Attack
from fedhp.engine.faults import RoundFaults, partial_units
from fedhp.engine.federation import Federation
from fedhp.engine.graphs import StepGraphs
from fedhp.engine.local_rows import LocalCall, Trained, local_sgd_key
from fedhp.engine.ops import (
    ExtraGrad,
    LocalWork,
    LossGrad,
    StepBatches,
    WeightedBatch,
    weighted_sgd_steps,
)
from fedhp.engine.participation import Participation
from fedhp.engine.sampler import BatchSampler, EpochBatches
from fedhp.engine.uplink import Uplink
from fedhp.errors import ConfigError
from fedhp.models.base import BatchedModel
from fedhp.models.policy import ExecutionPolicy
from fedhp.topology import Topology

Weighting = Literal["uniform", "samples"]
Sent = TypeVar("Sent", torch.Tensor, Message)
"""What a send carries: rows ``[M, P]`` (one ``[P]`` for a broadcast), or a keyed
:class:`~fedhp.comm.Message`; the receivers get the same kind back."""


class RunBatch(Protocol):
    """The batch of runs a run trains in (a sweep's lockstep batch, :mod:`fedhp.sweep.lockstep`):
    the run level of the tree, where the runs' local SGD (:mod:`fedhp.engine.local_rows`) and
    their methods' rounds (:meth:`RunContext.together`) meet."""

    def local_sgd(self, call: LocalCall) -> Trained:
        """Run ``call`` with the other runs' calls of the same key, as one; this run's result."""
        ...

    def train(self, algorithm: Any, state: Any, task: Any) -> Any:
        """Run ``algorithm``'s round below the cloud (``train(state, task)``), noting whether
        any of it met the other runs'."""
        ...

    def together(self, round_fn: Callable[[list[Any]], list[Any]], key: Hashable, item: Any) -> Any:
        """``round_fn([item])[0]``, as ONE ``round_fn(items)`` with the other runs' calls of the
        same ``round_fn`` and ``key``; this run's result."""
        ...


Item = TypeVar("Item")
Result = TypeVar("Result")


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
    # The steps replayed as CUDA graphs (``engine.cuda_graphs``); disabled: every call eager.
    graphs: StepGraphs = field(default_factory=StepGraphs)
    # The batch of runs this run trains in (None: alone): its local SGD and rounds meet there.
    batch: RunBatch | None = None

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
        return self._uplink("cloud", self.cloud_rule)

    @property
    def edge_uplink(self) -> Uplink:
        """The pipeline of what the edges receive: the clients' momentum and the run's attack on
        client uploads, the edges' rule."""
        return self._uplink("edge", self.edge_rule)

    def _uplink(self, level: str, rule: LevelRule | None) -> Uplink:
        momentum = self.client_momentum if self.client_level == level else 0.0
        return Uplink(level, rule, self.attack, self.participation.poisson_rate(), momentum)

    @property
    def whole_rounds(self) -> bool:
        """Whether an aggregation's uploads must arrive at once at some level (a robust or
        private rule, or an attack reading the round's benign updates): no streamed parts."""
        return self.cloud_uplink.whole_rounds or self.edge_uplink.whole_rounds

    def send(
        self, link: str, direction: str, messages: Sent, nodes: torch.Tensor | None = None
    ) -> Sent:
        """Bill ``messages`` (rows, or a keyed :class:`~fedhp.comm.Message`: one message per
        receiver of all its fields) on ``link`` and return what the receiver gets: the values
        truncated at the zero threshold (``|x| <= eps`` sent as 0), i.e. exactly what was
        billed (the same fields for a :class:`~fedhp.comm.Message`)."""
        return self._transmit(link, direction, messages, nodes)

    def broadcast(self, link: str, direction: str, message: Sent, nodes: torch.Tensor) -> Sent:
        """Bill one copy of ``message [P]`` (or of a keyed :class:`~fedhp.comm.Message` of
        fields ``[w_k]``) per node of ``nodes`` (the same model sent to each) and return what
        each receives, once: like :meth:`send` with ``message`` repeated, but its non-zeros are
        counted once, not once per copy."""
        return self._transmit(link, direction, message, nodes, lambda nnz: nnz.expand(len(nodes)))

    def multicast(
        self, link: str, direction: str, rows: Sent, row_of: torch.Tensor, nodes: torch.Tensor
    ) -> Sent:
        """Bill each of ``nodes`` the row ``row_of`` names of ``rows [S, P]`` (one per sender,
        e.g. each edge's model to its clients) and return the rows as sent, once per sender:
        like :meth:`broadcast` per sender, each row's non-zeros counted once."""
        return self._transmit(link, direction, rows, nodes, lambda nnz: nnz[row_of])

    def _transmit(
        self,
        link: str,
        direction: str,
        messages: Sent,
        nodes: torch.Tensor | None,
        per_receiver: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ) -> Sent:
        """The one send: ``messages`` truncated at the zero threshold (what the receivers get),
        billed on ``link`` — each row's non-zeros once per receiver (``per_receiver``: the
        receivers' counts from the rows', for copies of a row; None: one receiver per row)."""
        sent, nnz = self.arrived(messages)
        counts = nnz if per_receiver is None else per_receiver(nnz)
        width = sum(sent.widths()) if isinstance(sent, Message) else sent.shape[-1]
        self.ledger.record_counts(link, direction, counts, width, nodes)
        return sent

    def arrived(self, messages: Sent) -> tuple[Sent, torch.Tensor]:
        """What the receivers of ``messages`` get, unbilled: the values truncated at the zero
        threshold, and each message's non-zeros ``[M]`` (a round that bills its messages once at
        its end, ``ledger.record_counts``, bills these)."""
        rows = messages.rows() if isinstance(messages, Message) else messages
        sent = truncate(rows, self.zero_threshold)
        nnz = count_nonzero(sent, self.zero_threshold)
        return (messages.like(sent) if isinstance(messages, Message) else sent), nnz

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

    def together(
        self,
        round_fn: Callable[[list[Item]], list[Result]],
        key: Hashable | None,
        item: Item,
    ) -> Result:
        """``round_fn([item])[0]``: a method's round written over a list of runs' items (one for
        a run alone). In a batch of runs (:attr:`batch`) with a ``key`` (None: it trains alone),
        the calls of the batch's runs with the same ``round_fn`` and ``key`` run as ONE call
        ``round_fn(items)``, each run getting its own result: the key holds what the runs must
        share for that (shapes, step sizes a kernel takes as a scalar, the model and policy)."""
        if self.batch is None or key is None:
            return round_fn([item])[0]
        result: Result = self.batch.together(round_fn, key, item)
        return result

    def local_sgd(
        self,
        params: torch.Tensor,
        clients: torch.Tensor,
        work: LocalWork,
        extra_grad: ExtraGrad | None = None,
        *old_surface: object,
        mask: torch.Tensor | None = None,
        buffers: torch.Tensor | None = None,
        loss_grad: LossGrad | None = None,
        drawn: torch.Tensor | EpochBatches | None = None,
        partial: torch.Tensor | None = None,
        alone: bool = False,
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
        The steps are :func:`~fedhp.engine.ops.weighted_sgd_steps`'. In a batch of runs
        (:attr:`batch`) a call the batch covers (:func:`~fedhp.engine.local_rows.local_sgd_key`)
        trains with the other runs' as one, unless ``alone`` (what the batch itself asks for a
        call that met no other).

        Under ``epochs`` client c takes ``ceil(n_c / batch_size)`` steps per epoch on a fresh
        permutation of its data (the last minibatch partial); clients of unequal size step
        together, the ones that have finished frozen. The old surface's call
        ``local_sgd(params, clients, steps, batch, lr, extra)`` stops with a one-line
        :class:`~fedhp.errors.ConfigError` naming this one.
        """
        if old_surface or isinstance(work, int):  # steps, batch, lr, ...: the old surface
            raise ConfigError(OLD_LOCAL_SGD)
        plain = mask is None and buffers is None and loss_grad is None and partial is None
        if self.batch is not None and plain and not alone and not isinstance(drawn, EpochBatches):
            call = LocalCall(self, params, clients, work, extra_grad, drawn)
            if local_sgd_key(call) is not None:  # the batch's runs' local SGD as one
                return self.batch.local_sgd(call)
        units = None
        if partial is not None:  # stragglers' partial work: their first units (epochs or steps)
            total = work.epochs if work.epochs is not None else work.steps
            units = partial_units(partial.cpu(), total)
        active = None
        if work.epochs is not None:
            plan = drawn if isinstance(drawn, EpochBatches) else None
            if plan is None:
                plan = self.sampler.epochs(clients, work.batch_size, work.epochs)
            batch = self._gathered(clients, plan.index, plan.weight)
            steps, until, counts = plan.num_steps, None, plan.steps
            if units is not None:  # epoch e is batched steps e S' .. (e + 1) S' - 1
                until = units * (plan.num_steps // work.epochs)
                counts = plan.steps // work.epochs * units.to(plan.steps.device)
            active = (plan.weight.sum(2) > 0).cpu()
        else:
            batch = self._step_batches(clients, work, drawn, mask)
            steps, until = work.steps, units
            counts = torch.full((len(clients),), steps, dtype=torch.int64, device=self.device)
            if units is not None:
                counts = units.to(self.device)
        params, loss_sum = weighted_sgd_steps(
            self.model,
            params,
            batch,
            steps,
            work.lr,
            extra_grad,
            mask=mask,
            active=active,
            buffers=buffers,
            loss_grad=loss_grad,
            optimizer=work.optimizer,
            until=until,
        )
        return params, loss_sum, counts

    def _step_batches(
        self,
        clients: torch.Tensor,
        work: LocalWork,
        drawn: torch.Tensor | EpochBatches | None,
        mask: torch.Tensor | None,
    ) -> WeightedBatch:
        """The minibatches of ``work``'s steps: gathered whole as the steps go (or all first,
        for client chunks: :class:`~fedhp.engine.ops.StepBatches`); on masked sub-models, the
        same minibatches, their indices drawn first and gathered chunk by chunk."""
        ahead = drawn if isinstance(drawn, torch.Tensor) else None
        if mask is None:
            return StepBatches(self.batches(clients, work.batch_size, ahead), work.steps)
        index: Sequence[torch.Tensor] | torch.Tensor
        if ahead is not None:
            index = ahead
        else:
            index = [self.sampler.draw(clients, work.batch_size) for _ in range(work.steps)]
        return self._gathered(clients, index)

    def _gathered(
        self,
        clients: torch.Tensor,
        index: Sequence[torch.Tensor] | torch.Tensor,
        weight: torch.Tensor | None = None,
    ) -> WeightedBatch:
        """Step ``step``'s minibatch of the ``clients`` in ``rows`` gathered from the indices
        ``index [S][C', B]`` drawn ahead (with per-sample weights ``weight [S, C', B]``)."""
        gather = self.fed.train.gather

        def rows_of(
            step: int, rows: slice
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
            x, y = gather(clients[rows], index[step][rows], self.generator)
            return x, y, None if weight is None else weight[step, rows]

        return rows_of


OLD_LOCAL_SGD = (
    "ctx.local_sgd(params, clients, steps, batch, lr, extra) is the old surface: call "
    "ctx.local_sgd(start, clients, LocalWork(lr, batch, steps), extra) "
    "(fedhp.engine.ops.LocalWork; CHANGELOG.md)"
)
"""The one line a call of the old surface of :meth:`RunContext.local_sgd` stops with."""
