"""HeurFedAMP (Huang et al., AAAI 2021): attentive message passing with the heuristic,
cosine-similarity attention (flat, personalized models only).

The cloud keeps every client's last uploaded model ``w_j`` and builds, for each sampled client,
``u_i = sum_j xi_ij w_j`` with ``xi_ii = alpha`` and ``xi_ij ∝ exp(sigma cos(w_i, w_j))`` for
``j != i``, normalized so that row i sums to one. Client i then runs ``local_steps`` SGD steps on
``F_i(w) + lam / (2 alpha_k) ||w - u_i||^2`` starting from ``u_i`` and uploads ``w_i``.
"""

from __future__ import annotations

import pydantic
import torch

from fedhp.algorithms.base import Algorithm, State
from fedhp.algorithms.options import ALGORITHMS, LocalWorkOptions
from fedhp.algorithms.task import Task, Update
from fedhp.engine.ops import prox_grad


def attention_weights(
    models: torch.Tensor, rows: torch.Tensor, alpha: float, sigma: float
) -> torch.Tensor:
    """HeurFedAMP's ``xi [len(rows), C]`` for clients ``rows`` over all ``models [C, P]``.

    Diagonal entries (``xi[r, rows[r]]``) are ``alpha``; the others are a softmax of
    ``sigma * cos(w_i, w_j)`` scaled to sum to ``1 - alpha`` (a lone client gets weight 1).
    """
    unit = torch.nn.functional.normalize(models, dim=1)
    logits = sigma * (unit[rows] @ unit.T)
    self_mask = torch.zeros_like(logits, dtype=torch.bool)
    self_mask[torch.arange(len(rows), device=models.device), rows] = True
    if models.shape[0] == 1:
        return torch.ones_like(logits)
    others = torch.softmax(logits.masked_fill(self_mask, float("-inf")), dim=1)
    return torch.where(self_mask, torch.full_like(logits, alpha), (1 - alpha) * others)


class HeurFedAMP(Algorithm):
    """HeurFedAMP; the personalized models are the clients' ``w_i``; there is no global model."""

    options: HeurFedAMPOptions

    def init_state(self, init_params: torch.Tensor) -> State:
        p = init_params.to(self.ctx.device)
        return {"personal": p.expand(self.ctx.num_clients, -1).clone()}

    def global_model(self, state: State) -> torch.Tensor | None:
        return None

    def plan(self, state: State, rnd: int) -> Task:
        ctx, opt = self.ctx, self.options
        clients = ctx.participation.sample_clients()
        xi = attention_weights(state["personal"], clients, opt.alpha, opt.sigma)
        cloud = ctx.send("client_cloud", "down", xi @ state["personal"], clients)
        return Task(clients, per_client={"u": cloud})

    def train(self, state: State, task: Task) -> Update:
        opt = self.options
        cloud = task.per_client["u"]
        params, loss_sum, steps = self.ctx.local_sgd(
            cloud, task.clients, opt.work(), prox_grad(cloud, opt.lam / opt.alpha_k)
        )
        return Update(per_client={"model": params}, losses=loss_sum.unsqueeze(0), steps=steps)

    def aggregate(self, state: State, task: Task, update: Update) -> dict[str, float]:
        ctx = self.ctx
        clients = task.clients
        state["personal"][clients] = ctx.send(
            "client_cloud", "up", update.per_client["model"], clients
        )
        return self.local_work_stats(task, update)

    def personal_models(self, state: State) -> torch.Tensor | None:
        return state["personal"]


@ALGORITHMS.register("heurfedamp")
class HeurFedAMPOptions(LocalWorkOptions):
    """HeurFedAMP; the sFedHP paper's grid is alpha in {0.1, 0.5}."""

    alpha: float = pydantic.Field(0.5, ge=0, le=1, description="self-attention weight xi_ii")
    sigma: float = pydantic.Field(10.0, gt=0, description="scale of the cosine similarity")
    lam: float = pydantic.Field(1.0, ge=0, description="proximal weight lambda")
    alpha_k: float = pydantic.Field(1.0, gt=0, description="step size alpha_k in lam/(2 alpha_k)")

    penalty_weights = {"lam": "λ"}
    client_outputs = ("model",)
    algorithm_class = HeurFedAMP
