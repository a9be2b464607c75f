"""FedAvg (McMahan et al. 2017) and FedProx (Li et al. 2018): flat client–cloud FL.

A round: the sampled clients S receive w and run local SGD from it on their own objective,

    FedAvg   w_i = SGD(w; F_i)                          (F_i: client i's loss)
    FedProx  w_i = SGD(w; F_i + mu/2 ||. - w||^2)       (each step's gradient + mu (w_i - w))

and the cloud averages them: w <- Σ_{i∈S} p_i w_i (p_i uniform or by samples; a robust or DP
rule where configured). Under ``faults.straggler_work: partial`` (FedProx's systems
heterogeneity, Li et al. 2020) a straggler does 1 .. E-1 of its E local epochs (or steps):
FedAvg drops its update, FedProx aggregates its partial solution (``keeps_partial_work``).
The plumbing (broadcast, billing, streamed folding of the uploads, BatchNorm statistics, the
device model) is :class:`~fedhp.algorithms.flat.FlatRounds`'. In a lockstep sweep batch the plain
rounds of several runs train as one local SGD, each run's clients a block of rows
(:mod:`fedhp.algorithms.fedavg_stacked`).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import cast

import pydantic
import torch

from fedhp.algorithms import fedavg_stacked
from fedhp.algorithms.base import (
    ALGORITHMS,
    PARTIAL_WORK,
    Algorithm,
    LocalWorkOptions,
    State,
    Task,
    Update,
)
from fedhp.algorithms.device_cost import CapabilityMode, capabilities_field
from fedhp.algorithms.flat import FlatRounds
from fedhp.algorithms.options import client_momentum_field
from fedhp.engine.context import RunContext
from fedhp.engine.ops import ExtraGrad, LossGrad, prox_grad


class FedAvg(FlatRounds):
    """Sampled clients run local SGD from the global model; the cloud averages their models."""

    options: FedAvgOptions
    folds_uploads = True

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

    def stack_key(self, state: State, task: Task) -> Hashable | None:
        """Runs as rows: :func:`fedhp.algorithms.fedavg_stacked.stack_key` for FedAvg and
        FedProx themselves (a subclass with its own local work — MOON, FedNova — trains alone;
        Ditto has its own)."""
        if type(self) not in (FedAvg, FedProx):
            return None
        return fedavg_stacked.stack_key(self, state, task)

    @staticmethod
    def stacked_train(items: Sequence[tuple[Algorithm, State, Task]]) -> list[Update]:
        """S runs' local SGD as one (:mod:`fedhp.algorithms.fedavg_stacked`)."""
        return fedavg_stacked.stacked_train([(cast(FedAvg, a), s, t) for a, s, t in items])

    def local_extra_grad(self, w: torch.Tensor) -> ExtraGrad | None:
        """Additive gradient term of the local objective around ``w`` (none for FedAvg)."""
        return None

    def local_loss_grad(self, state: State, task: Task) -> LossGrad | None:
        """The clients' own local objective replacing the model's loss (none for FedAvg)."""
        return None


class FedProx(FedAvg):
    """FedAvg whose local objective adds ``mu/2 ||w - w_global||^2``; under
    ``faults.straggler_work: partial`` it keeps its stragglers' partial work (the paper's systems
    heterogeneity: FedAvg drops those updates, FedProx aggregates them)."""

    options: FedProxOptions

    def local_extra_grad(self, w: torch.Tensor) -> ExtraGrad | None:
        return prox_grad(w, self.options.mu)


@ALGORITHMS.register("fedavg")
class FedAvgOptions(LocalWorkOptions):
    """FedAvg: ``local_steps`` SGD steps (or ``local_epochs`` epochs), then the average."""

    capabilities: CapabilityMode = capabilities_field()
    client_momentum: float = client_momentum_field()

    supports_buffers = True
    uploads = {"cloud": "model"}
    keeps_centres = frozenset({"cloud"})

    def build(self, ctx: RunContext) -> Algorithm:
        return FedAvg(self, ctx)


@ALGORITHMS.register("fedprox")
class FedProxOptions(FedAvgOptions):
    """FedProx; the sFedHP paper's grid is mu in {0.001, 0.01, 0.1, 1}."""

    penalty_weights = {"mu": "μ"}
    keeps_partial_work = True  # (its algorithm's flag; faults.straggler_work is read)
    mu: float = pydantic.Field(0.01, ge=0)

    def build(self, ctx: RunContext) -> Algorithm:
        return FedProx(self, ctx)
