"""The algorithm interface: typed options plus round logic over a dict of tensors.

A round is split where the cloud's link is (see docs/flower.md):

* :meth:`Algorithm.plan` (cloud): sampling and what is sent down — a :class:`Task`;
* :meth:`Algorithm.train` (below the cloud: the edges and their clients, or a shard of clients):
  the local work, on the state rows it holds — an :class:`Update`;
* :meth:`Algorithm.aggregate` (cloud): what came up is recorded and aggregated.

The in-process engine runs the three on one process (:meth:`Algorithm.run_round`); the Flower
backend runs ``train`` on every node, on the node's part of the task, and merges the updates.

The options are :mod:`fedhp.algorithms.options`', the round's messages (:class:`Task`,
:class:`Update`, :class:`UploadFold`) :mod:`fedhp.algorithms.task`'s, the keyed messages and
uploads :mod:`fedhp.algorithms.messages`' (found here too), and who owns the BatchNorm running
statistics the algorithm's :class:`~fedhp.algorithms.buffers.BufferPolicy` (``self.buffers``).
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from types import SimpleNamespace
from typing import Any

import torch

from fedhp.algorithms.buffers import BufferPolicy
from fedhp.algorithms.declarations import FLAGS, Declared, declared_flags, set_in_body
from fedhp.algorithms.messages import MessageRows
from fedhp.algorithms.options import (
    ALGORITHMS,
    AlgorithmOptions,
    LocalWorkOptions,
    RowKind,
    ThetaInit,
    local_epochs_of,
    theta_init_field,
)
from fedhp.algorithms.task import Task, Update, UploadFold
from fedhp.comm import count_nonzero
from fedhp.engine.context import RunContext
from fedhp.engine.evaluate import ClientEval, density
from fedhp.engine.faults import check_partial_work, partial_units
from fedhp.engine.federation import ClientTensors
from fedhp.engine.protocol import State
from fedhp.engine.sampler import EpochBatches
from fedhp.errors import ConfigError, FedhpWarning
from fedhp.models.clip import clip_gradients

__all__ = [  # the options and round types, found here as well as in their own modules
    "ALGORITHMS",
    "Algorithm",
    "AlgorithmOptions",
    "LocalWorkOptions",
    "NNZ_PREFIX",
    "PARTIAL_WORK",
    "RowKind",
    "State",
    "Task",
    "ThetaInit",
    "Update",
    "UploadFold",
    "local_epochs_of",
    "theta_init_field",
]

PARTIAL_WORK = "partial_work"
"""``Task.per_client`` key of the clients' shares of the local work where stragglers do partial
work ([C'] float64, :meth:`~fedhp.engine.participation.Participation.partial_work`)."""
NNZ_PREFIX = "nnz."
"""Where a node-held state key is absent (the Flower cloud), ``state[NNZ_PREFIX + key]`` holds
its non-zero count per row, reported by the nodes, so densities can still be computed."""


class Algorithm(MessageRows, ABC):
    """One federated algorithm. State is a flat dict of tensors (checkpointable as is). Its
    behaviour flags are declared by its options class and read as its own attributes
    (:class:`Declared`, :mod:`fedhp.algorithms.declarations`)."""

    node_keys: Declared[dict[str, RowKind]] = Declared()
    personal_on_node: Declared[bool] = Declared()
    personal_needs_global: Declared[bool] = Declared()
    client_outputs: Declared[tuple[str, ...]] = Declared()
    edge_outputs: Declared[tuple[str, ...]] = Declared()
    client_buffer_outputs: Declared[tuple[str, ...]] = Declared()
    edge_buffer_outputs: Declared[tuple[str, ...]] = Declared()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """An algorithm class that sets a flag in its own body (the surface up to 9d240f0) keeps
        it, said once: the flag belongs on its options class."""
        super().__init_subclass__(**kwargs)
        moved = [k for k in (*FLAGS, "folds_uploads") if set_in_body(cls, k)]
        if moved:
            warnings.warn(
                f"{cls.__name__}: behaviour flags ({', '.join(moved)}) are declared on the "
                "options class now; read from the algorithm class for this plugin "
                "(docs/extending.md, section 8)",
                FedhpWarning,
                stacklevel=3,
            )

    @property
    def bills_stragglers(self) -> bool:  # (a property: the engine's AlgorithmLike reads it)
        """``train`` bills what this round's stragglers received (declared by the options)."""
        return bool(self.declarations.bills_stragglers)

    @property
    def declarations(self) -> SimpleNamespace:
        """This algorithm's round flags, as its options class declares them
        (:func:`~fedhp.algorithms.declarations.declared_flags`; a method that runs another's
        rounds, FNR-FL, returns that one's)."""
        return declared_flags(type(self), type(self.options))

    def __init__(self, options: AlgorithmOptions, ctx: RunContext) -> None:
        self.options = options
        self.ctx = ctx
        self.buffers = self.buffer_policy()
        """Who owns the BatchNorm running statistics, and how they move."""
        if options.clip_grad_norm is not None:  # every step through the model is clipped
            clip_gradients(ctx.model, options.clip_grad_norm)
        if self.buffers.width and not options.supports_buffers:
            raise ConfigError(
                f"model: {type(self).__name__} does not support BatchNorm running statistics; "
                "use a model without BatchNorm (e.g. model.batch_norm=false) or "
                "fedavg/fedprox/hierfavg/local/centralized"
            )
        faults = ctx.participation.faults
        if self.keeps_partial_work and faults is not None and isinstance(options, LocalWorkOptions):
            work = options.work()  # a straggler does 1 .. E-1 of E: E >= 2
            if work.epochs is not None:
                check_partial_work(faults.cfg, work.epochs, "algorithm.local_epochs")
            else:
                check_partial_work(faults.cfg, work.steps, "algorithm.local_steps")
        self.held_keys: dict[str, RowKind] = dict(self.node_keys)
        """The state entries held below the cloud: ``node_keys`` plus buffer rows."""
        if self.buffers.width:
            self.held_keys.update(self.buffer_node_keys())
        self.held_keys.update(self.uplink_node_keys())

    def buffer_policy(self) -> BufferPolicy:
        """The run's :class:`BufferPolicy`: the options' ``buffers`` mode over the model's
        statistics (a method whose statistics live elsewhere returns its own)."""
        return BufferPolicy.of_run(self.ctx, self.options.buffers)

    @property
    def keeps_partial_work(self) -> bool:
        """The options class's ``keeps_partial_work``: :meth:`plan_broadcast_global` keeps the
        stragglers with their shares (:data:`PARTIAL_WORK`), which ``train`` must pass to
        :meth:`RunContext.local_sgd`; otherwise (FedAvg) a straggler's update is dropped."""
        return bool(getattr(self.options, "keeps_partial_work", False))

    @property
    def evaluates_on_nodes(self) -> bool:
        """The personalized models are evaluated where their node state lives (Flower nodes)."""
        return self.personal_on_node or self.personal_from_buffers

    @property
    def evaluation_needs_global(self) -> bool:
        """Evaluating the personalized models needs the global model sent to every client."""
        return self.personal_needs_global or self.personal_from_buffers

    @abstractmethod
    def init_state(self, init_params: torch.Tensor) -> State:
        """State before round 0 from the initial flat parameters ``[P]``."""

    @abstractmethod
    def plan(self, state: State, rnd: int) -> Task:
        """Cloud: sample who takes part in round ``rnd``, record and return what is sent down."""

    def plan_broadcast_global(self, state: State) -> Task:
        """The flat methods' plan: sample clients and send each the global model (with
        :attr:`keeps_partial_work`, the stragglers doing partial work among them, and their
        shares of the work in ``per_client[PARTIAL_WORK]``)."""
        ctx = self.ctx
        clients = ctx.participation.sample_clients(keep_partial=self.keeps_partial_work)
        down = self.downlink(state, 1)
        assert down is not None
        received = ctx.broadcast("client_cloud", "down", down.first(), clients)
        task = Task(clients, broadcast=self.received_broadcast(received))
        partial = ctx.participation.partial_work(clients) if self.keeps_partial_work else None
        if partial is not None:
            task.per_client[PARTIAL_WORK] = partial
        return task

    @abstractmethod
    def train(self, state: State, task: Task) -> Update:
        """Below the cloud: the round's local work on the rows of ``state`` this process holds.
        A round written over a batch of runs' items goes through ``self.ctx.together``."""

    @abstractmethod
    def aggregate(self, state: State, task: Task, update: Update) -> dict[str, float]:
        """Cloud: record what came up and aggregate it into ``state``; returns round statistics."""

    def local_work_stats(self, task: Task, update: Update) -> dict[str, float]:
        """The round's mean local loss (per client: its summed loss over its steps) and, under
        ``local_epochs``, the clients' step counts (mean, min, max)."""
        opt = self.options
        assert update.losses is not None
        partial = task.per_client.get(PARTIAL_WORK)  # stragglers doing part of their work
        if not isinstance(opt, LocalWorkOptions) or opt.local_epochs is None:
            if partial is not None:  # each client's mean over its own steps
                units = partial_units(partial, opt.local_steps).to(update.losses.device)
                return {"local_loss": float((update.losses[0] / units).mean())}
            return {"local_loss": float(update.losses[0].mean()) / opt.local_steps}
        steps = update.steps
        if steps is None:  # not carried (Flower): a function of the clients' sample counts
            steps = opt.step_counts(self.ctx.fed.train.counts[task.clients])
            if partial is not None:  # a straggler's first epochs
                units = partial_units(partial, opt.local_epochs).to(steps.device)
                steps = steps // opt.local_epochs * units
        steps = steps.to(update.losses.device)
        per_client = update.losses[0] / steps.clamp(min=1)
        return {
            "local_loss": float(per_client.mean()),
            "local_steps_mean": float(steps.double().mean()),
            "local_steps_min": float(steps.min()),
            "local_steps_max": float(steps.max()),
        }

    def folds(self) -> bool:
        """Whether this round folds its uploads part by part: ``folds_uploads`` from the options
        class's own body (never inherited: :class:`AlgorithmOptions`), or the algorithm's."""
        own = type(self).__dict__.get("folds_uploads")
        if own is not None:
            return bool(own)
        return bool(type(self.options).__dict__.get("folds_uploads", False))

    def run_round(self, state: State, rnd: int) -> dict[str, float]:
        """Run global round ``rnd`` in place on ``state``; returns scalar round statistics.

        A method that declares :attr:`folds_uploads` runs it in parts of the clients sized to the
        cache (:meth:`round_parts`): each part is trained from the broadcast and its uploads
        folded into the aggregate before the next starts, so no more than a part of the client
        models is ever held."""
        task = self.plan(state, rnd)
        parts = self.round_parts(task)
        if len(parts) == 1:
            return self.aggregate(state, task, self.trained(state, task))
        fold = self.open_fold(state, task)
        for part in parts:
            self.fold_in(state, fold, part, self.trained(state, part))
        return self.close_fold(state, task, fold)

    def trained(self, state: State, task: Task) -> Update:
        """:meth:`train`, alone or, in a batch of runs (``ctx.batch``), through the batch: the
        run level of the tree (:class:`~fedhp.engine.context.RunBatch`)."""
        batch = self.ctx.batch
        if batch is None:
            return self.train(state, task)
        update: Update = batch.train(self, state, task)
        return update

    def round_parts(self, task: Task) -> list[Task]:
        """The parts of a flat ``task`` trained one after another: ``task`` itself, or (for a
        method that :attr:`folds_uploads`) runs of the policy's
        :meth:`~fedhp.models.policy.ExecutionPolicy.chunk`
        clients with the round's minibatches drawn ahead for all of them in the order the whole
        round would draw them, so the result does not depend on the parts. Data with per-access
        feature noise (drawn while gathering) is trained whole."""
        ctx = self.ctx
        n = len(task.clients)
        if not self.folds() or task.edges is not None or ctx.fed.train.noise_std is not None:
            return [task]
        if ctx.cloud_uplink.forges_from_whole_round:  # ALIE, IPM read all uploads at once
            return [task]  # (a robust or private rule gets the parts' rows kept: UploadFold)
        chunk = ctx.policy.chunk(ctx.model.num_params + self.buffers.width, n)
        if chunk >= n:
            return [task]
        task.batches = self.draw_batches(task.clients)
        return [task.part(slice(s, s + chunk)) for s in range(0, n, chunk)]

    def draw_batches(self, clients: torch.Tensor) -> torch.Tensor | EpochBatches:
        """The round's minibatch indices of ``clients`` under the options' local work, drawn
        ahead (:meth:`RunContext.draw_ahead`)."""
        return self.ctx.draw_ahead(clients, self.options.work())

    def open_fold(self, state: State, task: Task) -> UploadFold:
        """Start folding ``task``'s uploads (methods that :attr:`folds_uploads`)."""
        raise NotImplementedError

    def fold_in(self, state: State, fold: UploadFold, part: Task, update: Update) -> None:
        """Record and fold in the uploads of ``part``'s clients."""
        raise NotImplementedError

    def close_fold(self, state: State, task: Task, fold: UploadFold) -> dict[str, float]:
        """Write the folded aggregate into ``state``; the round's statistics."""
        raise NotImplementedError

    def global_model(self, state: State) -> torch.Tensor | None:
        """The global model ``[P]`` (None where the method has none)."""
        return state.get("global")

    def personal_models(self, state: State) -> torch.Tensor | None:
        """Each client's personalized model ``[C, P]`` (None where the method has none; the
        global model for every client under :attr:`personal_from_buffers`)."""
        w = self.global_model(state) if self.personal_from_buffers else None
        return None if w is None else w.expand(self.ctx.num_clients, -1)

    def personal_evaluation(self, state: State, split: ClientTensors) -> ClientEval | None:
        """Each client's personalized predictions on its own samples of ``split``, for methods
        whose personalization is not a parameter vector (pFedGP's GPs); None (default): the
        runner evaluates :meth:`personal_models`."""
        return None

    def round_local_keys(self) -> frozenset[str]:
        """Node-held state entries no round reads before rebuilding them (e.g. a theta restarted
        every round while every client takes part in every round): checkpoints leave them out
        and a resumed run does not send them to the Flower nodes. Default: none."""
        return frozenset()

    def summary_notes(self) -> dict[str, Any]:
        """Method-specific entries for summary.json (e.g. a warning flag). Default: none."""
        return {}

    def extra_metrics(self, state: State) -> dict[str, float]:
        """Method-specific values logged at evaluation rounds (e.g. densities)."""
        return {}

    def state_density(self, state: State, key: str) -> float:
        """Density of ``state[key]``, or from the non-zero counts the nodes reported."""
        if key in state:
            return density(state[key], self.ctx.zero_threshold)
        nnz = state[NNZ_PREFIX + key]
        return float(nnz.sum()) / (nnz.numel() * self.row_width(key))

    def row_nonzeros(self, state: State, key: str) -> torch.Tensor:
        """Non-zero count of each row of node-held ``state[key]`` (int64)."""
        return count_nonzero(state[key], self.ctx.zero_threshold).to(torch.int64)
