"""FedAvg (McMahan et al. 2017) and FedProx (Li et al. 2018): flat client–cloud FL."""

from __future__ import annotations

import pydantic
import torch

from fedhp.algorithms.base import (
    ALGORITHMS,
    Algorithm,
    AlgorithmOptions,
    CapabilityMode,
    DenseDeviceCost,
    LocalWorkOptions,
    State,
    Task,
    Update,
    UploadFold,
    capabilities_field,
)
from fedhp.engine.context import RunContext
from fedhp.engine.ops import ExtraGrad, LossGrad, prox_grad


class FedAvg(DenseDeviceCost, Algorithm):
    """Sampled clients run local SGD from the global model; the cloud averages their models.
    ``capabilities: fix|dyn``: FedLPS's device model and simulated time
    (:class:`DenseDeviceCost`)."""

    options: FedAvgOptions
    folds_uploads = True
    client_outputs = ("params",)
    client_buffer_outputs = ("buffers",)

    def __init__(self, options: AlgorithmOptions, ctx: RunContext) -> None:
        super().__init__(options, ctx)
        self.init_device_cost(options)

    def init_state(self, init_params: torch.Tensor) -> State:
        return {
            "global": init_params.clone(),
            **self.init_buffer_state(init_params.device),
            **self.device_cost_state(),
        }

    def round_samples(self, clients: torch.Tensor) -> torch.Tensor:
        """Samples of the local work: all of a client's data per epoch, or ``batch_size`` per
        step."""
        return self.options.sample_counts(self.ctx.fed.train.counts[clients])

    def local_extra_grad(self, w: torch.Tensor) -> ExtraGrad | None:
        """Additive gradient term of the local objective around the global model ``w`` (none
        for FedAvg)."""
        return None

    def local_loss_grad(self, state: State, task: Task) -> LossGrad | None:
        """The clients' own local objective replacing the model's loss (none for FedAvg)."""
        return None

    def plan(self, state: State, rnd: int) -> Task:
        self.refresh_device_cost(state, rnd)
        return self.plan_broadcast_global(state)

    def train(self, state: State, task: Task) -> Update:
        w = task.broadcast["global"]
        n = len(task.clients)
        start = w.expand(n, -1)
        sent = task.broadcast.get("global_buffers")
        bufs = self.start_buffers(state, task.clients, None if sent is None else sent.expand(n, -1))
        params, loss_sum, steps = self.local_update(
            start,
            task.clients,
            self.local_extra_grad(w),
            buffers=bufs,
            loss_grad=self.local_loss_grad(state, task),
            batches=task.batches,
        )
        per_client = {"params": params}
        if bufs is not None:  # uploaded in both modes: the global model is evaluated with them
            self.keep_buffers(state, task.clients, bufs)
            per_client["buffers"] = bufs
        return Update(per_client=per_client, losses=loss_sum.unsqueeze(0), steps=steps)

    def aggregate(self, state: State, task: Task, update: Update) -> dict[str, float]:
        fold = self.open_fold(state, task)
        self.fold_in(state, fold, task, update)
        return self.close_fold(state, task, fold)

    def open_fold(self, state: State, task: Task) -> UploadFold:
        """The round's means, or the cloud's rule (robust, DP) over the uploaded models."""
        ctx = self.ctx
        start = {"global": task.broadcast["global"]}
        denominator = ctx.dp_denominator(len(task.clients), ctx.num_clients)
        return UploadFold(ctx.client_weights(task.clients), ctx.cloud_rule, start, denominator)

    def fold_in(self, state: State, fold: UploadFold, part: Task, update: Update) -> None:
        """Bill the part's uploads and add them to the sample- or uniformly-weighted means."""
        bufs = update.per_client.get("buffers")
        start = part.broadcast["global"]
        params = self.ctx.upload(update.per_client["params"], part.clients, start)
        message = self.wire(params, bufs)
        up = self.ctx.send("client_cloud", "up", message, part.clients)
        params, bufs = self.unwire(up, bufs is not None)
        fold.add({"global": params, "global_buffers": bufs}, update)

    def close_fold(self, state: State, task: Task, fold: UploadFold) -> dict[str, float]:
        state.update(fold.result())
        stats = self.local_work_stats(task, fold.update())
        stats.update(self.account_device_cost(state, task.clients))
        return stats


@ALGORITHMS.register("fedavg")
class FedAvgOptions(LocalWorkOptions):
    """FedAvg: ``local_steps`` SGD steps (or ``local_epochs`` epochs) per round, then (uniform or
    sample-weighted) averaging."""

    capabilities: CapabilityMode = capabilities_field()

    supports_buffers = True
    robust_levels = frozenset({"cloud"})
    attack_ready = True
    private_levels = frozenset({"cloud"})

    def build(self, ctx: RunContext) -> Algorithm:
        return FedAvg(self, ctx)


class FedProx(FedAvg):
    """FedAvg whose local objective adds ``mu/2 ||w - w_global||^2``."""

    options: FedProxOptions  # type: ignore[assignment]

    def local_extra_grad(self, w: torch.Tensor) -> ExtraGrad | None:
        return prox_grad(w, self.options.mu)


@ALGORITHMS.register("fedprox")
class FedProxOptions(LocalWorkOptions):
    """FedProx; the sFedHP paper's grid is mu in {0.001, 0.01, 0.1, 1}."""

    mu: float = pydantic.Field(0.01, ge=0)
    capabilities: CapabilityMode = capabilities_field()

    supports_buffers = True
    robust_levels = frozenset({"cloud"})
    attack_ready = True
    private_levels = frozenset({"cloud"})

    def build(self, ctx: RunContext) -> Algorithm:
        return FedProx(self, ctx)
