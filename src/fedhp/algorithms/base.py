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
from fedhp.engine.aggregation import LevelRule
from fedhp.engine.context import RunContext
from fedhp.engine.evaluate import ClientEval, density
from fedhp.engine.federation import ClientTensors
from fedhp.engine.ops import LocalOptimizer, LocalWork, normalized
from fedhp.engine.sampler import EpochBatches
from fedhp.errors import ConfigError
from fedhp.models.clip import clip_gradients
from fedhp.registry import Registry

State = dict[str, torch.Tensor]
RowKind = Literal["client", "edge"]
BufferMode = Literal["average", "local"]
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
    buffers: BufferMode = pydantic.Field(
        "average",
        description="BatchNorm running statistics: average them like the parameters (FedAvg) "
        "or keep each client's own (local, FedBN-style); models without BatchNorm ignore it",
    )
    clip_grad_norm: float | None = pydantic.Field(
        None,
        gt=0,
        description="clip each client's minibatch-loss gradient to this norm before its step "
        "(torch.nn.utils.clip_grad_norm_ per client; docs/engine.md); None: no clipping",
    )

    hierarchical: ClassVar[bool] = False
    supports_buffers: ClassVar[bool] = False
    # Issue 20: the levels ("edge", "cloud") whose weighted mean the config's robust rule may
    # replace, whether uploads pass RunContext.upload (update attacks act on them), and the
    # level where client-level DP can clip and add noise.
    robust_levels: ClassVar[frozenset[str]] = frozenset()
    attack_ready: ClassVar[bool] = False
    private_levels: ClassVar[frozenset[str]] = frozenset()
    """Whether the method handles models with BatchNorm running statistics (buffers)."""

    def build(self, ctx: RunContext) -> Algorithm:
        """The algorithm object for one run."""
        raise NotImplementedError

    def gradient_evaluations(self) -> int:
        """Minibatch gradient evaluations per client per global round."""
        return self.local_steps

    def work(self) -> LocalWork:
        """The clients' local SGD (:meth:`RunContext.local_sgd`): ``local_steps`` plain steps of
        ``batch_size`` samples and step size ``lr``."""
        return LocalWork(self.lr, self.batch_size, self.local_steps)

    def privacy_releases(self) -> int:
        """Noised aggregates one round's sampled clients feed at the DP level (issue 20), each
        seen by someone untrusted: 1 by default (one noised mean per round)."""
        return 1


class LocalWorkOptions(AlgorithmOptions):
    """Options of the methods whose local work is either ``local_steps`` minibatch steps or
    ``local_epochs`` passes over each client's own data (set at most one of the two).

    Under ``local_epochs`` a client takes ``ceil(n_c / batch_size)`` steps per epoch (the last
    minibatch partial) on a fresh permutation of its data each epoch; see
    :meth:`RunContext.local_sgd`."""

    local_epochs: int | None = pydantic.Field(
        None, gt=0, description="local epochs per round instead of local_steps"
    )
    momentum: float = pydantic.Field(
        0.0, ge=0, lt=1, description="local SGD momentum (PyTorch's; velocity reset each round)"
    )
    weight_decay: float = pydantic.Field(
        0.0, ge=0, description="local SGD weight decay (PyTorch's: added to the gradient)"
    )

    @pydantic.model_validator(mode="after")
    def _one_budget(self) -> LocalWorkOptions:
        if self.local_epochs is not None and "local_steps" in self.model_fields_set:
            raise ValueError("set local_steps or local_epochs, not both; drop one of them")
        return self

    def work(self) -> LocalWork:
        """``local_steps`` or ``local_epochs`` of SGD with the options' momentum and weight
        decay."""
        optimizer = None
        if self.momentum or self.weight_decay:
            optimizer = LocalOptimizer(self.momentum, self.weight_decay)
        return LocalWork(self.lr, self.batch_size, self.local_steps, self.local_epochs, optimizer)

    def local_work(self) -> str:
        """``"local_epochs=E"`` or ``"local_steps=S"``: the budget in use."""
        if self.local_epochs is not None:
            return f"local_epochs={self.local_epochs}"
        return f"local_steps={self.local_steps}"

    def step_counts(self, counts: torch.Tensor) -> torch.Tensor:
        """Real minibatch steps per client per round (int64) for training-set sizes ``counts``."""
        if self.local_epochs is None:
            return torch.full_like(counts, self.local_steps, dtype=torch.int64)
        per_epoch = (counts.to(torch.int64) + self.batch_size - 1) // self.batch_size
        return per_epoch * self.local_epochs

    def sample_counts(self, counts: torch.Tensor) -> torch.Tensor:
        """Training samples each client processes per round (float64) for training-set sizes
        ``counts``: all its data per epoch, or ``batch_size`` per step."""
        if self.local_epochs is not None:
            return counts.double().cpu() * self.local_epochs
        return self.step_counts(counts).double().cpu() * self.batch_size


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


def local_epochs_of(options: AlgorithmOptions) -> int | None:
    """The ``local_epochs`` budget of options that offer one (plugins may subclass the plain
    :class:`AlgorithmOptions`: ``local_steps`` only)."""
    return options.local_epochs if isinstance(options, LocalWorkOptions) else None


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
    # Clients that receive the round's messages but do not train (stragglers), for algorithms
    # that bill them themselves (``Algorithm.bills_stragglers``); sorted, may be empty.
    stragglers: torch.Tensor | None = None
    # The clients' minibatch indices for the round, drawn ahead when it is trained in parts
    # (:meth:`Algorithm.round_parts`): ``[steps, C', B]`` or local epochs' batches; None: the
    # local work draws them itself.
    batches: torch.Tensor | EpochBatches | None = None

    @property
    def up_edges(self) -> torch.Tensor | None:
        return self.agg_edges if self.agg_edges is not None else self.edges

    def part(self, rows: slice) -> Task:
        """The task of the clients in ``rows`` (a slice of ``clients``) of a flat round."""
        batches = self.batches
        if isinstance(batches, EpochBatches):
            batches = batches.part(rows)
        elif batches is not None:
            batches = batches[:, rows]
        return Task(
            self.clients[rows],
            broadcast=self.broadcast,
            per_client={k: v[rows] for k, v in self.per_client.items()},
            scalars=self.scalars,
            batches=batches,
        )


class UploadFold:
    """A round's client uploads folded into weighted means part by part, so that no more than a
    part of the clients' models is ever held: rows ``[c, W]`` of the next ``c`` clients are
    added with their share of ``weights`` (normalized over all the round's clients), and their
    losses and step counts kept for the round's statistics.

    With a cloud ``rule`` that is not the weighted mean (a robust rule, DP;
    :class:`~fedhp.engine.aggregation.LevelRule`), the rows of the keys in ``start`` (the model
    the clients started from, by key) are kept instead and aggregated by the rule in
    :meth:`result` (the rounds are then not streamed: ``RunContext.whole_rounds``); the other
    keys (BatchNorm statistics) are still averaged."""

    def __init__(
        self,
        weights: torch.Tensor,
        rule: LevelRule | None = None,
        start: dict[str, torch.Tensor] | None = None,
        denominator: float | None = None,
    ) -> None:
        self.raw_weights = weights
        self.weights = normalized(weights)
        self.sums: dict[str, torch.Tensor] = {}
        self.own: dict[str, Any] = {}  # a method's own per-round values (e.g. FedNova's τ_eff)
        self.done = 0
        self._losses: list[torch.Tensor] = []
        self._steps: list[torch.Tensor] = []
        self.rule = None if rule is None or rule.folds else rule
        self.start = start if self.rule is not None and start is not None else {}
        self.denominator = denominator
        self._kept: dict[str, list[torch.Tensor]] = {key: [] for key in self.start}

    def add(
        self, rows: dict[str, torch.Tensor | None], update: Update, count: int | None = None
    ) -> None:
        """Fold in the next ``count`` clients' uploaded ``rows`` (by key; None: absent; the
        count is their row count unless given) and their ``update``'s losses and steps."""
        present = {k: v for k, v in rows.items() if v is not None}
        if count is None:
            count = next(iter(present.values())).shape[0]
        weights = self.weights[self.done : self.done + count]
        for key, value in present.items():
            if key in self._kept:
                self._kept[key].append(value)
                continue
            share = weights.to(value.dtype) @ value
            self.sums[key] = share if key not in self.sums else self.sums[key].add_(share)
        if update.losses is not None:
            self._losses.append(update.losses)
        if update.steps is not None:
            self._steps.append(update.steps)
        self.done += count

    def result(self) -> dict[str, torch.Tensor]:
        """The round's aggregates by key: the folded means, and the rule's aggregates of the
        kept keys."""
        out = dict(self.sums)
        for key, parts in self._kept.items():
            if parts:
                assert self.rule is not None
                rows = torch.cat(parts)
                weights = self.raw_weights.to(rows.dtype)
                out[key] = self.rule(rows, weights, self.start[key], self.denominator)
        return out

    def update(self) -> Update:
        """The folded clients' losses ``[S, n]`` and steps ``[n]`` (as one :class:`Update`)."""
        losses = torch.cat(self._losses, dim=1) if self._losses else None
        steps = torch.cat(self._steps) if len(self._steps) == len(self._losses) else None
        return Update(losses=losses, steps=steps)


@dataclass
class Update:
    """What comes up to the cloud: rows per client of ``task.clients``, rows per edge of
    ``task.up_edges``, and the per-client training losses ``[S, len(clients)]`` (one row per
    local loss group, e.g. per local round)."""

    per_client: dict[str, torch.Tensor] = field(default_factory=dict)
    per_edge: dict[str, torch.Tensor] = field(default_factory=dict)
    losses: torch.Tensor | None = None
    steps: torch.Tensor | None = None  # [len(clients)] int64 local steps taken (see local_update)


class Algorithm(ABC):
    """One federated algorithm. State is a flat dict of tensors (checkpointable as is).

    ``node_keys`` names the state entries kept below the cloud (per-client or per-edge rows, e.g.
    personalized models); under Flower they live on the nodes, the rest on the cloud.
    ``personal_on_node``: the personalized models are computed from node state (evaluated there).
    ``personal_needs_global``: computing them needs the global model too (sent along).
    ``client_outputs`` / ``edge_outputs``: the keys of :class:`Update` rows ``train`` returns.
    ``bills_stragglers``: ``train`` bills every message this round's stragglers received (from
    ``Task.stragglers``); otherwise the runner bills each straggler one global model.
    """

    node_keys: ClassVar[dict[str, RowKind]] = {}
    personal_on_node: ClassVar[bool] = False
    personal_needs_global: ClassVar[bool] = False
    client_outputs: ClassVar[tuple[str, ...]] = ()
    edge_outputs: ClassVar[tuple[str, ...]] = ()
    bills_stragglers: ClassVar[bool] = False
    # With BatchNorm (B > 0 buffers per model): the Update keys holding buffer rows [n, B].
    client_buffer_outputs: ClassVar[tuple[str, ...]] = ()
    edge_buffer_outputs: ClassVar[tuple[str, ...]] = ()

    def __init__(self, options: AlgorithmOptions, ctx: RunContext) -> None:
        self.options = options
        self.ctx = ctx
        self.num_buffers = ctx.model.num_buffers
        if options.clip_grad_norm is not None:  # every step through the model is clipped
            clip_gradients(ctx.model, options.clip_grad_norm)
        if self.num_buffers and not options.supports_buffers:
            raise ConfigError(
                f"model: {type(self).__name__} does not support BatchNorm running statistics; "
                "use a model without BatchNorm (e.g. model.batch_norm=false) or "
                "fedavg/fedprox/hierfavg/local/centralized"
            )
        self.held_keys: dict[str, RowKind] = dict(self.node_keys)
        """The state entries held below the cloud: ``node_keys`` plus buffer rows."""
        if self.num_buffers:
            self.held_keys.update(self.buffer_node_keys())

    # -- BatchNorm buffers (running statistics, ``[.., B]`` beside the ``[.., P]`` parameters) --

    @property
    def buffers_local(self) -> bool:
        """Each client keeps its own running statistics (``buffers=local``) on a BN model."""
        return self.num_buffers > 0 and self.options.buffers == "local"

    def buffer_node_keys(self) -> dict[str, RowKind]:
        """Node-held buffer entries of the state (used only when the model has buffers)."""
        return {"client_buffers": "client"} if self.options.buffers == "local" else {}

    def init_buffer_state(self, device: torch.device) -> State:
        """Buffer entries of the initial state: ``global_buffers [B]`` and, with
        ``buffers=local``, every client's own ``client_buffers [C, B]`` (none without BN)."""
        if not self.num_buffers:
            return {}
        init = self.ctx.model.init_buffers().to(device)
        state = {"global_buffers": init}
        if self.buffers_local:
            state["client_buffers"] = init.expand(self.ctx.num_clients, -1).clone()
        return state

    def start_buffers(
        self, state: State, clients: torch.Tensor, sent: torch.Tensor | None
    ) -> torch.Tensor | None:
        """Writable running statistics ``[len(clients), B]`` that ``clients`` train from: their
        own (``local``) or the ``sent [n, B]`` rows (``average``); None without buffers."""
        if not self.num_buffers:
            return None
        if self.buffers_local:
            return state["client_buffers"][clients].clone()
        assert sent is not None
        return sent.clone()

    def keep_buffers(self, state: State, clients: torch.Tensor, bufs: torch.Tensor | None) -> None:
        """With ``buffers=local``, store the clients' trained running statistics."""
        if self.buffers_local and bufs is not None:
            state["client_buffers"][clients] = bufs

    def received_buffers(self, state: State, task: Task) -> torch.Tensor | None:
        """Writable running statistics ``[n, B]`` the task's clients train from: their own, or
        the broadcast ``global_buffers`` (:meth:`start_buffers`); None without buffers."""
        sent = task.broadcast.get("global_buffers")
        n = len(task.clients)
        return self.start_buffers(state, task.clients, None if sent is None else sent.expand(n, -1))

    def client_update(
        self,
        state: State,
        task: Task,
        trained: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        buffers: torch.Tensor | None,
        **rows: torch.Tensor,
    ) -> Update:
        """The :class:`Update` of the task's clients from their local SGD's ``trained``
        (:meth:`RunContext.local_sgd`: parameters, summed losses, steps): their ``params``, the
        method's own ``rows`` and their trained ``buffers`` (uploaded in both modes: the global
        model is evaluated with them; kept by the clients under ``buffers=local``)."""
        params, loss_sum, steps = trained
        per_client = {"params": params, **rows}
        if buffers is not None:
            self.keep_buffers(state, task.clients, buffers)
            per_client["buffers"] = buffers
        return Update(per_client=per_client, losses=loss_sum.unsqueeze(0), steps=steps)

    def send_up(
        self, update: Update, clients: torch.Tensor, start: torch.Tensor, *extra: str
    ) -> tuple[torch.Tensor, torch.Tensor | None, list[torch.Tensor]]:
        """The uploads of ``clients`` (an :meth:`client_update`'s rows) as the cloud receives
        them: one message per client of its ``params`` (forged where malicious,
        :meth:`RunContext.upload`; ``start``: the model they started from), its buffers where
        present and its ``extra`` rows (``[n, P]`` each), billed on the client-cloud uplink.
        Returns the parameters, the buffers (None if absent) and the ``extra`` rows."""
        ctx = self.ctx
        bufs = update.per_client.get("buffers")
        message = self.wire(ctx.upload(update.per_client["params"], clients, start), bufs)
        if extra:
            message = torch.cat((message, *(update.per_client[k] for k in extra)), 1)
        up = ctx.send("client_cloud", "up", message, clients)
        width = up.shape[1] - len(extra) * ctx.model.num_params
        params, bufs = self.unwire(up[:, :width] if extra else up, bufs is not None)
        p = ctx.model.num_params
        return params, bufs, [up[:, width + i * p : width + (i + 1) * p] for i in range(len(extra))]

    def sent_buffers(self, state: State) -> dict[str, torch.Tensor]:
        """What goes down beside the global model: ``global_buffers`` when averaged."""
        if self.buffers_travel_down:
            return {"global_buffers": state["global_buffers"]}
        return {}

    @staticmethod
    def wire(params: torch.Tensor, buffers: torch.Tensor | None) -> torch.Tensor:
        """One message per row: the parameters, followed by the buffers when they travel."""
        if buffers is None:
            return params
        return torch.cat((params, buffers.expand(params.shape[0], -1)), dim=-1)

    def unwire(
        self, rows: torch.Tensor, with_buffers: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Split message rows made by :meth:`wire` into parameters and buffers (None if absent)."""
        if not with_buffers:
            return rows, None
        p = self.ctx.model.num_params
        return rows[..., :p], rows[..., p:]

    def received_broadcast(self, row: torch.Tensor) -> dict[str, torch.Tensor]:
        """What a receiver of one :meth:`downlink` message row gets: ``global`` and, where they
        travel, ``global_buffers`` (the billed, truncated values)."""
        params, bufs = self.unwire(row, self.buffers_travel_down)
        return {"global": params} if bufs is None else {"global": params, "global_buffers": bufs}

    @property
    def buffers_travel_down(self) -> bool:
        """The global running statistics travel down with the global model (``average``)."""
        return bool(self.num_buffers) and not self.buffers_local

    def downlink(self, state: State, count: int) -> torch.Tensor | None:
        """``count`` copies of the message carrying the global model down (None: none)."""
        w = self.global_model(state)
        if w is None:
            return None
        sent = self.sent_buffers(state).get("global_buffers")
        return self.wire(w.expand(count, -1), None if sent is None else sent.unsqueeze(0))

    def client_widths(self) -> dict[str, int]:
        """Keys of ``Update.per_client`` and their row widths (P, or B for buffers)."""
        out = {k: self.ctx.model.num_params for k in self.client_outputs}
        if self.num_buffers:
            out.update({k: self.num_buffers for k in self.client_buffer_outputs})
        return out

    def edge_widths(self) -> dict[str, int]:
        """Keys of ``Update.per_edge`` and their row widths (P, or B for buffers)."""
        out = {k: self.ctx.model.num_params for k in self.edge_outputs}
        if self.num_buffers:
            out.update({k: self.num_buffers for k in self.edge_buffer_outputs})
        return out

    def row_width(self, key: str) -> int:
        """Width of the rows of held state ``key`` (P, or B for buffer rows)."""
        return self.num_buffers if key in self.buffer_node_keys() else self.ctx.model.num_params

    def global_buffers(self, state: State) -> torch.Tensor | None:
        """The global model's running statistics ``[B]`` (None without BatchNorm)."""
        return state.get("global_buffers")

    def personal_buffers(self, state: State) -> torch.Tensor | None:
        """Running statistics ``[C, B]`` of the personalized models (None without BatchNorm);
        FedBN-style (:attr:`personal_from_buffers`): each client's own."""
        return state.get("client_buffers") if self.personal_from_buffers else None

    @property
    def personal_from_buffers(self) -> bool:
        """FedBN-style evaluation: with ``buffers=local`` a flat method's personalized model of
        client c is the global model normalized with c's own running statistics."""
        return self.buffers_local and "client_buffers" in self.buffer_node_keys()

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
        """The flat methods' plan: sample clients and send each the global model."""
        ctx = self.ctx
        clients = ctx.sample_clients()
        down = self.downlink(state, 1)
        assert down is not None
        received = ctx.broadcast("client_cloud", "down", down[0], clients)
        return Task(clients, broadcast=self.received_broadcast(received))

    @abstractmethod
    def train(self, state: State, task: Task) -> Update:
        """Below the cloud: the round's local work on the rows of ``state`` this process holds."""

    @abstractmethod
    def aggregate(self, state: State, task: Task, update: Update) -> dict[str, float]:
        """Cloud: record what came up and aggregate it into ``state``; returns round statistics."""

    def local_work_stats(self, task: Task, update: Update) -> dict[str, float]:
        """The round's mean local loss (per client: its summed loss over its steps) and, under
        ``local_epochs``, the clients' step counts (mean, min, max)."""
        opt = self.options
        assert update.losses is not None
        if not isinstance(opt, LocalWorkOptions) or opt.local_epochs is None:
            return {"local_loss": float(update.losses[0].mean()) / opt.local_steps}
        steps = update.steps
        if steps is None:  # not carried (Flower): a function of the clients' sample counts
            steps = opt.step_counts(self.ctx.fed.train.counts[task.clients])
        steps = steps.to(update.losses.device)
        per_client = update.losses[0] / steps.clamp(min=1)
        return {
            "local_loss": float(per_client.mean()),
            "local_steps_mean": float(steps.double().mean()),
            "local_steps_min": float(steps.min()),
            "local_steps_max": float(steps.max()),
        }

    folds_uploads: ClassVar[bool] = False
    """The method's :meth:`aggregate` is :meth:`open_fold`, :meth:`fold_in` of the whole update,
    :meth:`close_fold`, and its ``train`` of a part of the clients (:meth:`Task.part`) touches
    only their rows and draws no minibatches beyond ``Task.batches``: a round is then trained
    and aggregated in parts of its clients (:meth:`round_parts`). A subclass that overrides
    ``aggregate`` or ``train`` without saying so again is not streamed."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        overrides = "aggregate" in cls.__dict__ or "train" in cls.__dict__
        if overrides and "folds_uploads" not in cls.__dict__:
            cls.folds_uploads = False

    def run_round(self, state: State, rnd: int) -> dict[str, float]:
        """Run global round ``rnd`` in place on ``state``; returns scalar round statistics.

        A method that :attr:`folds_uploads` runs it in parts of the clients sized to the cache
        (:meth:`round_parts`): each part is trained from the broadcast and its uploads folded into
        the aggregate before the next starts, so no more than a part of the client models is
        ever held."""
        task = self.plan(state, rnd)
        parts = self.round_parts(task)
        if len(parts) == 1:
            return self.aggregate(state, task, self.train(state, task))
        fold = self.open_fold(state, task)
        for part in parts:
            self.fold_in(state, fold, part, self.train(state, part))
        return self.close_fold(state, task, fold)

    def round_parts(self, task: Task) -> list[Task]:
        """The parts of a flat ``task`` trained one after another: ``task`` itself, or (for a
        method that :attr:`folds_uploads`) runs of the policy's
        :meth:`~fedhp.engine.policy.ExecutionPolicy.chunk`
        clients with the round's minibatches drawn ahead for all of them in the order the whole
        round would draw them, so the result does not depend on the parts. Data with per-access
        feature noise (drawn while gathering) is trained whole."""
        ctx = self.ctx
        n = len(task.clients)
        if not self.folds_uploads or task.edges is not None or ctx.fed.train.noise_std is not None:
            return [task]
        if ctx.whole_rounds:  # the cloud's rule (or the attack) reads all uploads at once
            return [task]
        chunk = ctx.policy.chunk(ctx.model.num_params + self.num_buffers, n)
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
