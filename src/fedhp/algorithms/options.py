"""The algorithms' typed options: what every method takes (:class:`AlgorithmOptions`), the local
work of the methods that offer steps or epochs (:class:`LocalWorkOptions`), and the registry
that finds a method's options by name (:data:`ALGORITHMS`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

import pydantic
import torch

from fedhp.engine.ops import LocalOptimizer, LocalWork
from fedhp.registry import Registry

if TYPE_CHECKING:
    from fedhp.algorithms.base import Algorithm
    from fedhp.config import RunConfig
    from fedhp.engine.context import RunContext

BufferMode = Literal["average", "local"]
RowKind = Literal["client", "edge"]
"""Whose rows a node-held state entry has: one per client, or one per edge."""


class AlgorithmOptions(pydantic.BaseModel):
    """Options shared by every algorithm. Local work is explicit: ``local_steps`` minibatch
    gradient steps of ``batch_size`` samples per client per round (see ``gradient_evaluations``).
    The class variables are the method's behaviour flags, declared on its options class only
    (the round's are read by its algorithm: :mod:`fedhp.algorithms.declarations`)."""

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
    federated: ClassVar[bool] = True  # False: a non-federated reference row (centralized)
    flower_ready: ClassVar[bool] = True  # runs on the Flower backends
    penalty_weights: ClassVar[dict[str, str]] = {}
    supports_buffers: ClassVar[bool] = False
    """Whether the method handles models with BatchNorm running statistics (buffers)."""
    uploads: ClassVar[dict[str, str]] = {}
    """What each level (``"edge"``, ``"cloud"``) receives and passes through its uplink pipeline
    (:data:`fedhp.engine.uplink.UPLOAD_KINDS`: ``"model"``, ``"estimate"``, ``"own"``; a level
    not named: ``"own"``). Where the run's attack, robust rules and DP can act follows from it
    (:func:`fedhp.engine.uplink.safeguards`)."""
    keeps_partial_work: ClassVar[bool] = False
    """Whether the method keeps its stragglers' partial work under ``faults.straggler_work:
    partial`` (as its algorithm's ``keeps_partial_work``); other methods do not read that
    option (issue 42)."""
    keeps_centres: ClassVar[frozenset[str]] = frozenset()
    """The levels at which the method keeps a centred rule's previous aggregate in its state and
    passes it to the uplink (``cclip``; :data:`fedhp.engine.uplink.CENTRE_KEYS`)."""

    # What its round does (read as ``algorithm.<flag>``):
    node_keys: ClassVar[dict[str, RowKind]] = {}
    """The state entries kept below the cloud (per-client or per-edge rows, e.g. personalized
    models); under Flower they live on the nodes, the rest on the cloud."""
    personal_on_node: ClassVar[bool] = False
    """The personalized models are computed from node state (evaluated there)."""
    personal_needs_global: ClassVar[bool] = False
    """Computing the personalized models needs the global model too (sent along)."""
    client_outputs: ClassVar[tuple[str, ...]] = ()
    """The keys of the per-client :class:`~fedhp.algorithms.task.Update` rows ``train``
    returns."""
    edge_outputs: ClassVar[tuple[str, ...]] = ()
    """The keys of the per-edge :class:`~fedhp.algorithms.task.Update` rows ``train`` returns."""
    client_buffer_outputs: ClassVar[tuple[str, ...]] = ()
    """With BatchNorm (B > 0 buffers per model): the per-client keys holding buffer rows
    ``[n, B]``."""
    edge_buffer_outputs: ClassVar[tuple[str, ...]] = ()
    """With BatchNorm: the per-edge keys holding buffer rows ``[n, B]``."""
    bills_stragglers: ClassVar[bool] = False
    """``train`` bills every message this round's stragglers received (from
    ``Task.stragglers``); otherwise the runner bills each straggler one global model."""
    folds_uploads: ClassVar[bool] = False
    """The algorithm this class builds aggregates by ``open_fold``, ``fold_in`` of the whole
    update, ``close_fold``, and its ``train`` of a part of the clients (``Task.part``) touches
    only their rows and draws no minibatches beyond ``Task.batches``: a round is then trained
    and aggregated in parts of its clients (``Algorithm.round_parts``). A promise about one
    algorithm's own code, so it is read from this class's own body, not inherited
    (``Algorithm.folds``): an options subclass whose algorithm trains or aggregates its own way
    folds where it says so itself."""

    algorithm_class: ClassVar[type[Algorithm] | None] = None
    """The class :meth:`build` makes (None: the options class defines :meth:`build`)."""

    def build(self, ctx: RunContext) -> Algorithm:
        """The algorithm object for one run."""
        if self.algorithm_class is None:
            raise NotImplementedError
        return self.algorithm_class(self, ctx)

    def unread(self, run: RunConfig) -> dict[str, str]:
        """The options (field → why nothing reads it and what to set instead, one line) this
        method leaves unread in ``run`` (issue 42: a key the user set among them is refused,
        and config.yaml omits them). Override to declare a method's own; tests/test_unread.py
        checks the declarations against the options a run reads."""
        return {}

    def graph_steps(self) -> bool:
        """Whether this configuration's local steps have a form ``engine.cuda_graphs`` replays
        as CUDA graphs (:mod:`fedhp.engine.graphs`; elsewhere that option is refused as unread)."""
        return False

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


def client_momentum_field() -> Any:
    """The ``client_momentum`` option (issue 41) of the methods whose clients upload the models
    they trained (FedAvg's family, HierFAVG): step 0 of the uplink pipeline."""
    return pydantic.Field(
        0.0,
        ge=0,
        lt=1,
        description="beta of each client's momentum of its updates, m <- beta m + (1 - beta) "
        "(upload - start), kept across rounds; the robust rule, the attack and DP then act on "
        "start + m (0: off; not the local optimizer's momentum)",
    )


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


def derived_steps(name: str, *fields: str) -> str:
    """Why ``local_steps`` is unread by a method whose local work is ``fields``."""
    given = " and ".join(f"algorithm.{f}" for f in fields)
    return f"{name} derives its local work from {' and '.join(fields)}; set {given} instead"


def local_epochs_of(options: AlgorithmOptions) -> int | None:
    """The ``local_epochs`` budget of options that offer one (plugins may subclass the plain
    :class:`AlgorithmOptions`: ``local_steps`` only)."""
    return options.local_epochs if isinstance(options, LocalWorkOptions) else None
