"""Fed-HT, FedIter-HT (Tong et al., "Federated Nonconvex Sparse Learning") and Distributed-IHT.

From x₀ = 0, each round every client (or a ``client_fraction`` sample) runs K SGD steps of
constant size γ from the global model and sends its K-th iterate; the cloud keeps
``x_{t+1} = H_τ(Σ_i p_i x_i)``. Fed-HT's local steps are plain SGD (dense uplink); FedIter-HT
thresholds after EVERY local step, ``x ← H_τ(x − γ∇f_I(x))`` (τ-sparse uplink). Distributed-IHT
is Fed-HT with one local step. H_τ is per class column for softmax (``sparsity_groups``).
"""

from __future__ import annotations

import warnings
from typing import Literal

import pydantic
import torch

from fedhp.algorithms.base import Algorithm, State
from fedhp.algorithms.options import ALGORITHMS, AlgorithmOptions
from fedhp.algorithms.task import Task, Update
from fedhp.engine.context import RunContext
from fedhp.engine.federation import Federation
from fedhp.engine.ops import LocalWork
from fedhp.errors import FedhpWarning
from fedhp.models.base import BatchedModel


def hard_threshold(params: torch.Tensor, tau: int, groups: int = 1) -> torch.Tensor:
    """H_τ: keep the ``tau`` entries of largest ``|x|`` in each row of ``params [.., P]`` (in each
    of its ``groups`` contiguous blocks of P/groups, e.g. a softmax model's class columns), zero
    the rest. Ties are broken deterministically: the lowest index wins (as a stable sort would;
    computed in linear time with ``kthvalue``)."""
    lead, p = params.shape[:-1], params.shape[-1]
    blocks = params.reshape(*lead, groups, p // groups)
    if tau >= blocks.shape[-1]:
        return params.clone()
    size = blocks.abs()
    # the τ-th largest |x| per block, then everything above it plus the lowest-index ties
    kth = size.kthvalue(size.shape[-1] - tau + 1, dim=-1, keepdim=True).values
    mask = size >= kth
    tied = mask.sum(-1) != tau  # blocks where ties straddle the τ-th place (or NaN)
    if bool(tied.any()):
        mask[tied] = _lowest_ties(size[tied], kth[tied], tau)
    return torch.where(mask, blocks, 0.0).reshape(params.shape)


def _lowest_ties(size: torch.Tensor, kth: torch.Tensor, tau: int) -> torch.Tensor:
    """H_τ's mask of the blocks ``size [n, m]`` (τ-th largest ``kth [n, 1]``): the entries above
    ``kth`` plus, of those equal to it, the lowest-index ones up to ``tau`` per block. Only the
    blocks whose ``size >= kth`` does not hold exactly τ entries need it
    (:func:`hard_threshold`)."""
    above, tied = size > kth, size == kth
    need = tau - above.sum(-1, keepdim=True)
    return above | (tied & (tied.cumsum(-1) <= need))


def client_smoothness(model: BatchedModel, fed: Federation, iters: int = 50) -> torch.Tensor:
    """Each client's smoothness bound l_i = curvature · λmax(Z_iᵀZ_i / n_i) + λ ``[C]`` for the
    linear models (:mod:`fedhp.models.linear`); λmax by power iteration, sparse data stay sparse."""
    from fedhp.data.rows import slice_rows

    curvature = float(getattr(model, "curvature", 1.0))
    lam = float(getattr(model, "lam", 0.0))
    out = []
    gen = torch.Generator().manual_seed(0)
    for c in range(fed.num_clients):
        lo, hi = int(fed.train.offsets[c]), int(fed.train.offsets[c + 1])
        z = slice_rows(fed.train.x, lo, hi)
        z = z if z.is_sparse else z.reshape(hi - lo, -1)
        v = torch.randn(z.shape[1], 1, generator=gen).to(z.device)
        top = 0.0
        for _ in range(iters):
            w = torch.mm(z.t(), torch.mm(z, v)) / max(hi - lo, 1)
            top = float(torch.linalg.vector_norm(w))
            if top == 0.0:
                break
            v = w / top
        out.append(curvature * top + lam)
    return torch.tensor(out)


def weighted_layers(model: BatchedModel) -> int:
    """How many modules of ``model``'s reference hold parameters themselves (1: a linear model)."""
    return sum(
        1 for m in model.reference.modules() if next(m.parameters(recurse=False), None) is not None
    )


class FedHT(Algorithm):
    """Fed-HT: dense local SGD, the cloud thresholds the average."""

    options: FedHTOptions

    def __init__(self, options: FedHTOptions, ctx: RunContext) -> None:
        super().__init__(options, ctx)
        if options.lr == "auto":  # Thm 3.1 / 4.1: γ = 1/(6 l), l the clients' largest smoothness
            self.gamma = 1.0 / (6.0 * float(client_smoothness(ctx.model, ctx.fed).max()))
        else:
            self.gamma = float(options.lr)

    def threshold(self, params: torch.Tensor) -> torch.Tensor:
        """H_τ of every row (per class column where the model has several)."""
        return hard_threshold(params, self.options.tau, self.ctx.model.sparsity_groups)

    def init_state(self, init_params: torch.Tensor) -> State:
        """x₀ = 0 (the paper's start, for its linear models); a multi-layer model starts from its
        initialization instead (from zeros every hidden unit stays alike and the run cannot
        learn), with one warning line."""
        layers = weighted_layers(self.ctx.model)
        if layers <= 1:
            return {"global": torch.zeros_like(init_params)}  # x₀ = 0
        kind = type(self.options)
        name = next((n for n in ALGORITHMS.names() if ALGORITHMS.get(n) is kind), "fedht")
        warnings.warn(
            f"algorithm.name={name}: the model has {layers} layers, and from x0 = 0 (the paper's "
            "start, for linear models) their units stay alike and it cannot learn; starting from "
            "the model's initialization instead (docs/fedht.md)",
            FedhpWarning,
            stacklevel=2,
        )
        return {"global": init_params.clone()}

    def plan(self, state: State, rnd: int) -> Task:
        return self.plan_broadcast_global(state)

    def local_steps(
        self, params: torch.Tensor, clients: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """K minibatch SGD steps of step size γ; returns the K-th iterates and summed losses."""
        opt = self.options
        work = LocalWork(self.gamma, opt.batch_size, opt.local_steps)
        return self.ctx.local_sgd(params, clients, work)[:2]

    def train(self, state: State, task: Task) -> Update:
        start = task.broadcast["global"].expand(len(task.clients), -1)
        params, loss_sum = self.local_steps(start, task.clients)
        return Update(per_client={"model": params}, losses=loss_sum.unsqueeze(0))

    def extra_metrics(self, state: State) -> dict[str, float]:
        return {"gamma": self.gamma}

    def aggregate(self, state: State, task: Task, update: Update) -> dict[str, float]:
        ctx = self.ctx
        start, clients = task.broadcast["global"], task.clients
        uplink = ctx.cloud_uplink
        params = uplink.forge(update.per_client["model"], ctx.global_clients(clients), start)
        ctx.ledger.record("client_cloud", "up", params, ctx.zero_threshold, nodes=clients)
        state["global"] = self.threshold(
            uplink.aggregate(params, ctx.client_weights(clients), start)
        )
        assert update.losses is not None
        return {"local_loss": float(update.losses[0].mean()) / self.options.local_steps}


class FedIterHT(FedHT):
    """FedIter-HT: every local SGD step is followed by H_τ on the client."""

    def local_steps(
        self, params: torch.Tensor, clients: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        opt = self.options
        loss_sum = torch.zeros(len(clients), device=params.device)
        one_step = LocalWork(self.gamma, opt.batch_size, 1)
        for _ in range(opt.local_steps):
            params, loss, _ = self.ctx.local_sgd(params, clients, one_step)
            params = self.threshold(params)
            loss_sum += loss
        return params, loss_sum


@ALGORITHMS.register("fedht")
class FedHTOptions(AlgorithmOptions):
    """Fed-HT: K = ``local_steps`` SGD steps of constant ``lr`` (γ); the cloud keeps H_τ(mean)."""

    lr: float | Literal["auto"] = pydantic.Field(  # type: ignore[assignment]
        1e-3, description="constant local step size γ > 0, or auto: 1/(6·max_i l_i) (Thm 3.1)"
    )
    batch_size: int = pydantic.Field(32, gt=0)
    local_steps: int = pydantic.Field(5, gt=0, description="K local steps per round")
    tau: int = pydantic.Field(200, gt=0, description="sparsity τ (per class column for softmax)")

    client_outputs = ("model",)
    uploads = {"cloud": "estimate"}  # models whose mean is thresholded

    @pydantic.field_validator("lr")
    @classmethod
    def _positive(cls, value: float | str) -> float | str:
        if not isinstance(value, str) and value <= 0:
            raise ValueError("must be > 0 or 'auto'")
        return value

    algorithm_class = FedHT


@ALGORITHMS.register("fediterht")
class FedIterHTOptions(FedHTOptions):
    """FedIter-HT: H_τ after every local step (τ-sparse uplink) and at the cloud."""

    algorithm_class = FedIterHT


@ALGORITHMS.register("diht")
class DIHTOptions(FedHTOptions):
    """Distributed-IHT: Fed-HT with one local step per round (not FedIter-HT with one step)."""

    local_steps: int = pydantic.Field(1, ge=1, le=1, description="always 1")
