"""FedAvg (McMahan et al. 2017) and FedProx (Li et al. 2018): flat client–cloud FL.

A round: the sampled clients S receive w and run local SGD from it on their own objective,

    FedAvg   w_i = SGD(w; F_i)                          (F_i: client i's loss)
    FedProx  w_i = SGD(w; F_i + mu/2 ||. - w||^2)       (each step's gradient + mu (w_i - w))

and the cloud averages them, :func:`average`: w <- Σ_{i∈S} p_i w_i (p_i uniform or by samples),
inside the cloud's uplink pipeline (client momentum, attacks, and a robust or DP rule instead of
the average where configured: :mod:`fedhp.engine.uplink`). Under ``faults.straggler_work:
partial`` (FedProx's systems heterogeneity, Li et al. 2020) a straggler does 1 .. E-1 of its E
local epochs (or steps): FedAvg drops its update, FedProx aggregates its partial solution
(``keeps_partial_work``).

The plumbing below the math (the broadcast, billing, the uploads folded part by part when the
policy streams a round, BatchNorm statistics, FedLPS's device model as a component) is shared by
FedAvg's family: FedProx, MOON, FedNova and Ditto subclass :class:`FedAvg`. In a lockstep sweep
batch the runs' local SGD trains as one, each run's clients a block of rows: the engine's run
level (:mod:`fedhp.engine.local_rows`), with no code here.
"""

from __future__ import annotations

import pydantic
import torch

from fedhp.algorithms.base import (
    ALGORITHMS,
    PARTIAL_WORK,
    Algorithm,
    LocalWorkOptions,
    State,
    Task,
    Update,
    UploadFold,
)
from fedhp.algorithms.device_cost import CapabilityMode, DenseCostModel, capabilities_field
from fedhp.algorithms.options import AlgorithmOptions, client_momentum_field
from fedhp.engine.context import RunContext
from fedhp.engine.ops import ExtraGrad, LossGrad, prox_grad
from fedhp.engine.uplink import CENTRE_KEYS, MOMENTUM_KEY, Combine, foldable


@foldable
def average(models: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """FedAvg's aggregation of the clients' ``models [n, P]``: ``Σ_i p_i w_i`` with
    ``p_i = weights_i / Σ_j weights_j`` (``weights [n]``: 1 each, or their sample counts)."""
    p = weights / weights.sum()
    return p.to(models.dtype) @ models


class FedAvg(Algorithm):
    """Sampled clients run local SGD from the global model; the cloud averages their models."""

    options: FedAvgOptions

    def train(self, state: State, task: Task) -> Update:
        w, bufs = task.broadcast["global"], self.buffers.received(state, task)
        start, work = w.expand(len(task.clients), -1), self.options.work()
        extra, own = self.local_extra_grad(w), self.local_loss_grad(state, task)
        partial = task.per_client.get(PARTIAL_WORK)  # stragglers kept with partial work
        trained = self.ctx.local_sgd(
            start,
            task.clients,
            work,
            extra,
            buffers=bufs,
            loss_grad=own,
            drawn=task.batches,
            partial=partial,
        )
        return self.client_update(state, task, trained, bufs)

    def local_extra_grad(self, w: torch.Tensor) -> ExtraGrad | None:
        """Additive gradient term of the local objective around ``w`` (none for FedAvg)."""
        return None

    def local_loss_grad(self, state: State, task: Task) -> LossGrad | None:
        """The clients' own local objective replacing the model's loss (none for FedAvg)."""
        return None

    combine = staticmethod(average)
    """The cloud's aggregation of the uploaded models (and BatchNorm statistics), a pure
    function ``(rows [n, W], weights [n]) -> [W]``; the uplink's robust or DP rule replaces it
    where configured."""

    # ------------------------------------------------------------------ the flat round's plumbing
    def __init__(self, options: AlgorithmOptions, ctx: RunContext) -> None:
        super().__init__(options, ctx)
        self.cost_model = DenseCostModel(options, ctx)
        self.capability_generator = self.cost_model.generator  # (checkpointed by this name)

    def init_state(self, init_params: torch.Tensor) -> State:
        return {
            "global": init_params.clone(),
            **self.buffers.init_state(init_params.device),
            **self.cost_model.state(),
            **self.uplink_state(init_params),
        }

    def round_samples(self, clients: torch.Tensor) -> torch.Tensor:
        """Samples of the local work (the device model's count): all of a client's data per
        epoch, or ``batch_size`` per step (:meth:`LocalWorkOptions.sample_counts`)."""
        return self.options.sample_counts(self.ctx.fed.train.counts[clients])

    def plan(self, state: State, rnd: int) -> Task:
        """The sampled clients receive the global model (and, under ``buffers=average``, its
        running statistics), billed as one broadcast."""
        self.cost_model.refresh(state, rnd)
        return self.plan_broadcast_global(state)

    def aggregate(self, state: State, task: Task, update: Update) -> dict[str, float]:
        """The uploads through the cloud's uplink into :attr:`combine` (one fold of the whole
        round)."""
        fold = self.open_fold(state, task)
        self.fold_in(state, fold, task, update)
        return self.close_fold(state, task, fold)

    def open_fold(self, state: State, task: Task) -> UploadFold:
        """The round's :attr:`combine` folded part by part, or the cloud's uplink (robust rule,
        DP) over the uploaded models (a centred rule from its previous aggregate, kept in the
        state)."""
        ctx = self.ctx
        start = {"global": task.broadcast["global"]}
        weights = ctx.client_weights(task.clients)
        centre = state.get(CENTRE_KEYS["cloud"])
        centres = {"global": centre} if centre is not None else None
        combine = self.round_combine(state, task)
        return UploadFold(
            weights, ctx.cloud_uplink, start, ctx.num_clients, centres, combine=combine
        )

    def round_combine(self, state: State, task: Task) -> Combine | dict[str, Combine]:
        """This round's aggregation of the uploads: :attr:`combine` (of the models and their
        BatchNorm statistics; a method whose aggregation depends on the round returns it built
        for the round, by key)."""
        return self.combine

    def fold_in(self, state: State, fold: UploadFold, part: Task, update: Update) -> None:
        """Bill the part's uploads (with client momentum: ``start`` + the clients' momenta) and
        fold them in."""
        start = part.broadcast["global"]
        up = self.send_up(update, part.clients, start, momenta=state.get(MOMENTUM_KEY))
        fold.add({"global": up["model"], "global_buffers": up.get("buffers")}, update)

    def close_fold(self, state: State, task: Task, fold: UploadFold) -> dict[str, float]:
        state.update(fold.result())
        stats = self.local_work_stats(task, fold.update())
        stats.update(self.cost_model.account(state, task.clients, self.round_samples))
        return stats


class FedProx(FedAvg):
    """FedAvg whose local objective adds ``mu/2 ||w - w_global||^2`` and which keeps its
    stragglers' partial work (the module docstring)."""

    options: FedProxOptions

    def local_extra_grad(self, w: torch.Tensor) -> ExtraGrad | None:
        """FedProx's term: each local step's gradient + μ (w_i − w), the gradient of
        μ/2 ‖w_i − w‖² (:class:`~fedhp.engine.ops.ProxGrad`, shared with Ditto and HeurFedAMP;
        the one step path, ``ops._step``, takes it as a lerp of w_i towards w inside the
        model's own step)."""
        return prox_grad(w, self.options.mu)


@ALGORITHMS.register("fedavg")
class FedAvgOptions(LocalWorkOptions):
    """FedAvg: ``local_steps`` SGD steps (or ``local_epochs`` epochs), then the average."""

    capabilities: CapabilityMode = capabilities_field()
    client_momentum: float = client_momentum_field()

    supports_buffers = True
    uploads = {"cloud": "model"}
    keeps_centres = frozenset({"cloud"})
    folds_uploads = True
    client_outputs = ("model",)
    client_buffer_outputs = ("buffers",)
    algorithm_class = FedAvg


@ALGORITHMS.register("fedprox")
class FedProxOptions(FedAvgOptions):
    """FedProx; the sFedHP paper's grid is mu in {0.001, 0.01, 0.1, 1}."""

    penalty_weights = {"mu": "μ"}
    keeps_partial_work = True  # (its algorithm's flag; faults.straggler_work is read)
    mu: float = pydantic.Field(0.01, ge=0)

    folds_uploads = True
    algorithm_class = FedProx
