"""FedNova (Wang et al., NeurIPS 2020): normalized averaging of clients that take different
numbers of local steps.

Client i runs τ_i local SGD steps from x (under ``local_epochs``: ⌈n_i / B⌉ per epoch, its
own count) to y_i. Its normalized update is d_i = (x − y_i) / a_i with a_i = ‖a_i‖₁ of its
accumulation vector: τ_i for plain SGD, and with local momentum ρ

    a_i = [τ_i − ρ (1 − ρ^τ_i) / (1 − ρ)] / (1 − ρ)                  (:func:`momentum_norm`)

The cloud steps x ← x − τ_eff Σ_i p_i d_i with τ_eff = Σ_i p_i a_i (p_i the aggregation
weights, normalized). With equal step counts this is FedAvg. ρ is the ``momentum`` option of
the local SGD (0: a_i = τ_i); weight decay counts as part of the gradient, as in FedNova's code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedhp.algorithms.base import State
from fedhp.algorithms.fedavg import FedAvg, FedAvgOptions
from fedhp.algorithms.options import ALGORITHMS
from fedhp.algorithms.task import Task
from fedhp.engine.uplink import Combine, Summed


def momentum_norm(steps: torch.Tensor, momentum: float = 0.0) -> torch.Tensor:
    """FedNova's a_i for ``steps [n]`` local steps of SGD with heavy-ball ``momentum`` ρ (the
    total weight each step's gradient receives in the final displacement, summed)."""
    tau = steps.to(torch.float64)
    if momentum == 0.0:
        return tau
    rho = momentum
    return (tau - rho * (1 - rho**tau) / (1 - rho)) / (1 - rho)


def normalized_average(
    x: torch.Tensor, y: torch.Tensor, a: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """FedNova's new global model from ``x [P]``, the clients' ``y [n, P]``, their ``a [n]`` and
    aggregation ``weights [n]``."""
    tau_eff, coef = step_weights(a, weights, y.dtype)
    return x - tau_eff * normalized_sum(x, y, coef)


def step_weights(
    a: torch.Tensor, weights: torch.Tensor, dtype: torch.dtype
) -> tuple[float, torch.Tensor]:
    """``τ_eff = Σ p_i a_i`` and the clients' ``p_i / a_i`` (``p``: the normalized weights)."""
    p = (weights / weights.sum()).to(torch.float64)
    a = a.to(torch.float64)
    tau_eff = float((p * a).sum())
    return tau_eff, (p / a.clamp(min=1e-12)).to(dtype)


def normalized_sum(x: torch.Tensor, y: torch.Tensor, coef: torch.Tensor) -> torch.Tensor:
    """``Σ_i coef_i (x − y_i)`` over the rows of ``y [n, P]``."""
    return (coef.unsqueeze(1) * (x - y)).sum(0)


@dataclass(frozen=True)
class NormalizedStep(Summed):
    """FedNova's aggregation of one round, :func:`normalized_average` as a sum over the clients
    (the engine may fold it part by part): ``share`` = :func:`normalized_sum` of the clients'
    ``y`` with their ``coef = p_i / a_i``, ``finish`` = ``x − τ_eff ·`` the total."""

    x: torch.Tensor
    coef: torch.Tensor
    tau_eff: float

    def share(self, rows: torch.Tensor, first: int) -> torch.Tensor:
        return normalized_sum(self.x, rows, self.coef[first : first + rows.shape[0]])

    def finish(self, total: torch.Tensor) -> torch.Tensor:
        return self.x - self.tau_eff * total


class FedNova(FedAvg):
    """FedAvg's local work; the cloud's aggregation of the clients' models is their normalized
    average (:class:`NormalizedStep`, built each round from the clients' step counts, known
    before they train: their sample counts under ``local_epochs``); their BatchNorm statistics
    are averaged as FedAvg's."""

    options: FedNovaOptions

    def round_combine(self, state: State, task: Task) -> dict[str, Combine]:
        opt, ctx, x = self.options, self.ctx, state["global"]
        steps = opt.step_counts(ctx.fed.train.counts[task.clients])
        a = momentum_norm(steps.to(x.device), opt.momentum)
        tau_eff, coef = step_weights(a, ctx.client_weights(task.clients), x.dtype)
        return {"global": NormalizedStep(x, coef, tau_eff)}


@ALGORITHMS.register("fednova")
class FedNovaOptions(FedAvgOptions):
    """FedNova: FedAvg's local SGD (``local_steps`` or ``local_epochs``), then normalized
    averaging by each client's real step count (plain SGD: a_i = τ_i)."""

    uploads = {"cloud": "own"}  # normalized steps: no rule, attack or DP derived for them
    keeps_centres = frozenset()
    folds_uploads = True
    algorithm_class = FedNova
