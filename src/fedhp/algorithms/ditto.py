"""Ditto (Li, Hu, Beirami, Smith, ICML 2021): FedAvg for the global model plus a personal model
per client, regularized toward the global one.

A selected client k receives w^t and does two things with the same local budget
(``local_steps`` or ``local_epochs``, batch ``batch_size``):

* the global update: FedAvg's local SGD from w^t (its result goes up and is averaged);
* the personal update: SGD on F_k(v_k) + λ/2 ‖v_k − w^t‖² from its stored v_k, step size
  ``personal_lr`` (default: ``lr``), so ∇ = ∇F_k(v_k) + λ(v_k − w^t).

v_k starts at the initial model and stays on the client; the personalized accuracy is each
client's v_k on its own test data. λ = 0 gives FedAvg + independent local models; λ → ∞ pulls v_k
onto the global model. BatchNorm models are not supported.
"""

from __future__ import annotations

import pydantic
import torch

from fedhp.algorithms.base import State
from fedhp.algorithms.fedavg import FedAvg, FedAvgOptions
from fedhp.algorithms.options import ALGORITHMS
from fedhp.algorithms.task import Task, Update
from fedhp.engine.ops import LocalWork, prox_grad


class Ditto(FedAvg):
    """FedAvg's global rounds; the sampled clients also train their personal models."""

    options: DittoOptions

    def init_state(self, init_params: torch.Tensor) -> State:
        state = super().init_state(init_params)
        state["personal"] = init_params.expand(self.ctx.num_clients, -1).clone()
        return state

    def train(self, state: State, task: Task) -> Update:
        update = super().train(state, task)
        opt, ctx = self.options, self.ctx
        w = task.broadcast["global"]
        clients = task.clients
        start = state["personal"][clients]
        reg = prox_grad(w, opt.lam)
        lr = opt.personal_lr if opt.personal_lr is not None else opt.lr
        work = LocalWork(lr, opt.batch_size, opt.local_steps, opt.local_epochs)
        params, _, _ = ctx.local_sgd(start, clients, work, reg)
        state["personal"][clients] = params
        return update

    def round_samples(self, clients: torch.Tensor) -> torch.Tensor:
        """FedAvg's samples twice: the personal update has the same budget."""
        return 2 * super().round_samples(clients)

    def personal_models(self, state: State) -> torch.Tensor | None:
        return state["personal"]


@ALGORITHMS.register("ditto")
class DittoOptions(FedAvgOptions):
    """Ditto: FedAvg + personal models trained on F_k + λ/2‖v − w‖² (docs/algorithms.md)."""

    penalty_weights = {"lam": "λ"}
    lam: float = pydantic.Field(0.1, ge=0, description="λ: pull of the personal models to w")
    personal_lr: float | None = pydantic.Field(
        None, gt=0, description="step size of the personal update (default: lr)"
    )

    supports_buffers = False
    node_keys = {"personal": "client"}
    folds_uploads = False  # the personal models' minibatches are drawn after the global ones
    personal_on_node = True

    def gradient_evaluations(self) -> int:
        return 2 * self.local_steps

    algorithm_class = Ditto
