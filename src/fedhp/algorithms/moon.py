"""MOON (Li, He, Song, CVPR 2021): model-contrastive federated learning.

FedAvg whose local objective adds a contrastive term on the model's representation z (fedhp's
feature tap: the penultimate features, ``forward_with_features``; MOON's networks end their
representation with a projection head, fedhp uses the model's own last hidden layer):

    ℓ = CE(w; x, y) + μ · ℓ_con,
    ℓ_con = −log( exp(sim(z, z_glob)/τ) / (exp(sim(z, z_glob)/τ) + exp(sim(z, z_prev)/τ)) ),

sim the cosine similarity, z_glob the representation of x under the received global model,
z_prev under the client's own model from the last round it took part in (``prev``, client state;
the initial global model before that). Both are fixed (no gradient) and run in eval mode, as in
MOON's code: BatchNorm models normalize z_glob with the global running statistics (under
``buffers=local``: the client's own) and z_prev with the client's statistics from that round;
the trained model uses its batch statistics (padding excluded) and updates the client's. ``mu``
is MOON's own option (the reference code shares FedProx's ``--mu``); ``temperature`` is τ.
"""

from __future__ import annotations

from typing import Any, Literal

import pydantic
import torch
import torch.nn.functional as F

from fedhp.algorithms.base import RowKind, State
from fedhp.algorithms.fedavg import FedAvg, FedAvgOptions
from fedhp.algorithms.options import ALGORITHMS
from fedhp.algorithms.task import Task, Update
from fedhp.engine.ops import LossGrad
from fedhp.models.base import BatchedModel
from fedhp.models.client_mean import weighted_client_mean
from fedhp.models.clip import clip_like


def contrastive_loss(
    z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor, temperature: float
) -> torch.Tensor:
    """MOON's per-sample ℓ_con ``[..]`` from representations ``[.., H]``."""
    pos = F.cosine_similarity(z, z_glob, dim=-1) / temperature
    neg = F.cosine_similarity(z, z_prev, dim=-1) / temperature
    return -torch.log_softmax(torch.stack((pos, neg), dim=-1), dim=-1)[..., 0]


def moon_loss_grad(
    model: BatchedModel,
    global_params: torch.Tensor,
    prev: torch.Tensor,
    mu: float,
    temperature: float,
    global_buffers: torch.Tensor | None = None,
    prev_buffers: torch.Tensor | None = None,
) -> LossGrad:
    """The clients' MOON objective and its gradient (rows align with ``prev [n, P]``);
    ``global_buffers`` (``[B]`` or ``[n, B]``) and ``prev_buffers [n, B]``: the fixed models'
    BatchNorm statistics (BatchNorm models)."""

    def loss_grad(
        params: torch.Tensor,
        x: torch.Tensor,
        y: torch.Tensor,
        *,
        weight: Any = None,
        buffers: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = params.shape[0]
        glob_bufs = None if global_buffers is None else global_buffers.expand(n, -1)
        with torch.no_grad():
            _lg, z_glob = model.forward_with_features(
                global_params.expand(n, -1), x, buffers=glob_bufs
            )
            _lp, z_prev = model.forward_with_features(prev, x, buffers=prev_buffers)
        flat = params.detach().clone().requires_grad_(True)
        logits, z = model.forward_with_features(flat, x, buffers=buffers, train=True, weight=weight)
        k = logits.shape[-1]
        ce = F.cross_entropy(logits.reshape(-1, k), y.reshape(-1), reduction="none").view(y.shape)
        per_sample = ce + mu * contrastive_loss(z, z_glob, z_prev, temperature)
        per_client = weighted_client_mean(per_sample, weight)
        (grad,) = torch.autograd.grad(per_client.sum(), flat)
        return per_client.detach(), clip_like(model, grad)  # algorithm.clip_grad_norm

    return loss_grad


class Moon(FedAvg):
    """MOON: FedAvg's rounds with the model-contrastive local objective."""

    options: MoonOptions

    def buffer_node_keys(self) -> dict[str, RowKind]:
        return {**self.buffers.node_keys(), "prev_buffers": "client"}

    def init_state(self, init_params: torch.Tensor) -> State:
        state = super().init_state(init_params)
        state["prev"] = init_params.expand(self.ctx.num_clients, -1).clone()
        if self.buffers.width:
            state["prev_buffers"] = self.buffers.fresh_rows(init_params.device)
        return state

    def local_loss_grad(self, state: State, task: Task) -> LossGrad | None:
        opt = self.options
        clients = task.clients
        prev_bufs = state["prev_buffers"][clients] if "prev_buffers" in state else None
        # the global model's statistics; under buffers=local none are sent: the client's own
        glob_bufs = task.broadcast.get("global_buffers", prev_bufs)
        return moon_loss_grad(
            self.ctx.model,
            task.broadcast["global"],
            state["prev"][clients],
            opt.mu,
            opt.temperature,
            glob_bufs,
            prev_bufs,
        )

    def train(self, state: State, task: Task) -> Update:
        update = super().train(state, task)
        state["prev"][task.clients] = update.per_client["model"]
        if "prev_buffers" in state:
            state["prev_buffers"][task.clients] = update.per_client["buffers"]
        return update


@ALGORITHMS.register("moon")
class MoonOptions(FedAvgOptions):
    """MOON: FedAvg + mu * model-contrastive loss on the penultimate features (temperature tau)."""

    penalty_weights = {"mu": "μ"}
    mu: float = pydantic.Field(1.0, ge=0, description="weight of the contrastive term (MOON's own)")
    temperature: float = pydantic.Field(0.5, gt=0, description="contrastive temperature tau")
    capabilities: Literal["off"] = pydantic.Field(
        "off",
        description="FedAvg's device model is not offered: MOON's two extra forwards per sample "
        "are outside its 3 × forward FLOPs",
    )

    supports_buffers = True
    node_keys = {"prev": "client"}
    folds_uploads = True  # its train touches only the part's rows of prev
    algorithm_class = Moon
