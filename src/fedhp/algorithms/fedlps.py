"""FedLPS (Xue et al.): learnable personalized sparsification with P-UCBV sparse ratios.

Per round, for each selected client k with server ratio s_k and capability z_k (spec
``specs/fedlps.md``; the paper is the target where the authors' code differs):

* s = min(s_k, z_k); every local step keeps, per layer, the max(1, round(s·J)) units with the
  highest scores Q_k (:func:`fedhp.models.masks.unit_mask_from_scores`; the output layer is never
  masked) and takes one SGD step of L = CE(ω ⊙ m) + μ‖ω − ω^r‖² + λ‖Q − sg(sigmoid(|ω|_J))‖²:
  ω ← ω − η·m ⊙ ∇_ω L (dropped units keep their values), Q ← Q − η·∇_Q L. The hard mask gives Q
  no gradient from CE; ``ste`` (default on) passes it straight through: ∂CE/∂m_j = Σ ω·g over
  unit j (:func:`fedhp.models.masks.unit_mask_grad`). Q persists across rounds (Q⁰ =
  sigmoid(|ω⁰|_J), or the code's ordered ``sort(randn)`` with ``score_init=ordered``).
* The client keeps its personal sparse model ω ⊙ m (evaluated on its own test data) and uploads
  Δ_k = (ω^r − ω) ⊙ m (its non-zeros + a unit bitmap); the cloud steps
  ω^{r+1} = ω^r − Σ_k p_k Δ_k (Eq. 13, no per-coordinate renormalization).
* Cost (Eq. 14, :mod:`fedhp.algorithms.device_cost`): T_k = 3 × forward FLOPs of the masked model
  (:func:`fedhp.models.masks.masked_flops`) × samples processed / (z_k · 727 GFLOP/s) + bytes
  up / 14 MB/s + bytes down / 110.6 MB/s; the round lasts its slowest client's T_k.
* Ratios: ``pucbv`` (a bandit per client, :mod:`fedhp.algorithms.pucbv`, credited with the
  client's training accuracy of the round — the mean over its local minibatches — and T_k),
  ``fixed`` (FLST: ``fixed_ratio`` for everyone) or ``capability`` (RCR: s = z);
  ``capabilities``: ``fix`` (drawn once) or ``dyn`` (drawn again every round).
"""

from __future__ import annotations

from functools import partial
from typing import Annotated, Any, Literal

import pydantic
import torch

from fedhp.algorithms.base import Algorithm, State
from fedhp.algorithms.device_cost import (
    CAPABILITY_LEVELS,
    DrawnCapabilities,
    SizedCostModel,
    cost_state,
)
from fedhp.algorithms.options import ALGORITHMS, LocalWorkOptions
from fedhp.algorithms.pucbv import PUCBV, exploration_xi
from fedhp.algorithms.task import Task, Update
from fedhp.comm import count_nonzero, unit_mask_bytes
from fedhp.engine.context import RunContext
from fedhp.engine.ops import LossGrad
from fedhp.models.masks import (
    masked_flops,
    num_units,
    param_mask,
    require_hidden_units,
    unit_mask_from_scores,
    unit_mask_grad,
    unit_weight_norms,
)

RatioPolicy = Literal["pucbv", "fixed", "capability"]


def fedlps_loss_grad(
    algo: FedLPS, global_params: torch.Tensor, scores: torch.Tensor, ratio: torch.Tensor
) -> tuple[LossGrad, dict[str, torch.Tensor]]:
    """The clients' FedLPS step (rows align with ``scores [n, U]``, updated in place) and the
    running training-accuracy counters it fills (``correct``, ``seen``: ``[n]``)."""
    model, opt = algo.ctx.model, algo.options
    ratio = ratio.to(scores.device)  # once per round, not a host copy at every step
    seen = torch.zeros(scores.shape[0], dtype=torch.float64, device=scores.device)
    tally = {"correct": torch.zeros_like(seen), "seen": seen}

    def loss_grad(
        params: torch.Tensor, x: torch.Tensor, y: torch.Tensor, *, weight: Any = None, **_: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        units = unit_mask_from_scores(model, scores, ratio)
        pm = param_mask(model, units, opt.structural)
        masked = params * pm
        loss, grad, correct = model.loss_grad_correct(masked, x, y, weight=weight)
        with torch.no_grad():
            hits = correct.double()
            w = torch.ones_like(hits) if weight is None else weight.double()
            tally["correct"] += (hits * w).sum(1)
            tally["seen"] += w.sum(1)
        q_grad = 2 * opt.lam * (scores - torch.sigmoid(unit_weight_norms(model, params)))
        if opt.ste:
            q_grad = q_grad + unit_mask_grad(model, params, grad, opt.structural)
        if weight is None:
            live = torch.ones(len(scores), dtype=torch.bool, device=scores.device)
        else:
            live = weight.sum(1) > 0
        scores.sub_(opt.score_step * q_grad * live.unsqueeze(1).to(q_grad.dtype))
        # pm * (grad + 2 mu (params - global)), in place: the same roundings, no [C, P] temporaries
        pull = torch.sub(params, global_params).mul_(2 * opt.mu)
        return loss, grad.add_(pull).mul_(pm)

    return loss_grad, tally


def eq13(w: torch.Tensor, deltas: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """FedLPS's aggregation (Eq. 13): ``ω^{r+1} = ω^r − Σ_k p_k Δ_k`` from ``w = ω^r [P]``, the
    clients' sparse updates ``deltas [n, P]`` and ``weights [n]`` (``p = weights / Σ weights``;
    no per-coordinate renormalization)."""
    weights = weights.to(deltas.dtype)
    p = weights / weights.sum()
    return w - (p.unsqueeze(1) * deltas).sum(0)


class FedLPS(Algorithm):
    """FedLPS's rounds: masked personalized local training, Eq. 13, per-client ratios."""

    options: FedLPSOptions

    def __init__(self, options: FedLPSOptions, ctx: RunContext) -> None:
        require_hidden_units(ctx.model, "fedlps", "prunes the units of hidden layers")
        super().__init__(options, ctx)
        self.sizes = SizedCostModel(ctx, tuple(options.capability_levels))  # z sizes the masks
        self.num_units = num_units(ctx.model)
        if options.personal_keep_above > 0:  # which clients hold a personal model: node rows
            self.held_keys["has_personal"] = "client"

    # ------------------------------------------------------------------ state
    def init_state(self, init_params: torch.Tensor) -> State:
        ctx, opt = self.ctx, self.options
        k = ctx.num_clients
        model = ctx.model
        if opt.score_init == "magnitude":
            scores = self.initial_scores(init_params, k)
        else:  # the code's sorted random scores: keeps the first units, in index order
            scores = torch.randn(k, self.num_units, generator=ctx.generator)
            scores = scores.sort(dim=1, descending=True).values
        caps = self.sizes.initial(init_params.device)
        state: State = {
            "global": init_params.clone(),
            "scores": scores.to(init_params.device),
            "capability": caps,
            "ratio": torch.full((k,), opt.fixed_ratio, dtype=torch.float64),
            **cost_state(),
        }
        init_units = unit_mask_from_scores(model, state["scores"], state["ratio"])
        state["personal"] = init_params * param_mask(model, init_units, opt.structural)
        if opt.personal_keep_above > 0:
            state["has_personal"] = init_params.new_zeros(k, 1)
        if opt.ratio == "pucbv":
            self._init_bandits(state, init_params)
        return state

    def initial_scores(self, params: torch.Tensor, count: int) -> torch.Tensor:
        """``count`` clients' initial Q for the model ``params [P]``: sigmoid(|ω|_J)
        (``score_init=magnitude``), or scores decreasing with the unit index (``ordered``: the
        same masks as the code's sorted random scores, which keep each layer's first units)."""
        if self.options.score_init == "magnitude":
            norms = unit_weight_norms(self.ctx.model, params.unsqueeze(0))
            return torch.sigmoid(norms).expand(count, -1).clone()
        order = -torch.arange(self.num_units, dtype=params.dtype, device=params.device)
        return order.expand(count, -1).clone()

    def _init_bandits(self, state: State, init_params: torch.Tensor) -> None:
        ctx, opt = self.ctx, self.options
        k = ctx.num_clients
        max_arms = opt.arms + opt.rounds + 1
        arms = torch.empty(k, max_arms, 5, dtype=torch.float64)
        scalars = torch.empty(k, 4, dtype=torch.float64)
        # a^{-1}: the initial global model's accuracy on each client's training data
        acc0 = self._train_accuracy(init_params.expand(k, -1))
        u = torch.rand(k, 2, generator=ctx.generator, dtype=torch.float64)
        for c in range(k):
            bandit = self._bandit(float(u[c, 0]), float(u[c, 1]))
            bandit.accuracy = float(acc0[c])
            arms[c], scalars[c] = bandit.to_rows(max_arms)
            state["ratio"][c] = bandit.ratio
        state["bandit_arms"], state["bandit_scalars"] = arms, scalars

    def _bandit(self, u_arm: float = 0.0, u_point: float = 0.0) -> PUCBV:
        ctx, opt = self.ctx, self.options
        xi = exploration_xi(opt.rounds, ctx.num_clients, ctx.participation.client_fraction)
        return PUCBV.create(
            xi,
            u_arm,
            u_point,
            num_arms=opt.arms,
            low=opt.arms_low,
            rho=opt.rho,
            delta_points=opt.delta_points,
            floor=opt.floor,
        )

    def _train_accuracy(self, params: torch.Tensor) -> torch.Tensor:
        """Each client's model ``params [K, P]`` on its own training data (eval mode)."""
        from fedhp.engine.evaluate import evaluate_personal

        result = evaluate_personal(self.ctx.model, params, self.ctx.fed.train)
        return result.correct / result.count.clamp(min=1)

    def client_widths(self) -> dict[str, int]:
        return {"delta": self.ctx.model.num_params, "units": self.num_units, "train_acc": 1}

    def row_width(self, key: str) -> int:
        widths = {"scores": self.num_units, "has_personal": 1}
        return widths[key] if key in widths else super().row_width(key)

    @property
    def evaluation_needs_global(self) -> bool:
        """With ``personal_keep_above``, a client with no stored model is evaluated on the
        global one (sent along)."""
        return self.options.personal_keep_above > 0 or super().evaluation_needs_global

    def personal_models(self, state: State) -> torch.Tensor | None:
        """Each client's personal sparse model; with ``personal_keep_above`` > 0, the global
        model for a client that has not stored one yet (the authors' evaluation)."""
        if "has_personal" not in state:
            return state["personal"]
        return torch.where(state["has_personal"] > 0, state["personal"], state["global"])

    # ------------------------------------------------------------------ round
    def plan(self, state: State, rnd: int) -> Task:
        opt = self.options
        self.sizes.redraw(state, rnd, opt.capabilities)
        task = self.plan_broadcast_global(state)
        decided = state["ratio"][task.clients.cpu()]
        caps = state["capability"][task.clients].cpu().double()
        if opt.ratio == "capability":
            decided = caps.clone()
        elif opt.ratio == "fixed":
            decided = torch.full_like(caps, opt.fixed_ratio)
        task.per_client["ratio"] = torch.minimum(decided, caps)
        task.per_client["capability"] = caps
        return task

    def train(self, state: State, task: Task) -> Update:
        ctx, opt = self.ctx, self.options
        model = ctx.model
        w = task.broadcast["global"]
        clients = task.clients
        if opt.score_reset:
            scores = self.initial_scores(w, len(clients))
        else:
            scores = state["scores"][clients].clone()
        ratio = task.per_client["ratio"]
        loss_grad, tally = fedlps_loss_grad(self, w, scores, ratio)
        params, loss_sum, steps = self.ctx.local_sgd(
            w.expand(len(clients), -1), clients, opt.work(), loss_grad=loss_grad
        )
        state["scores"][clients] = scores
        units = unit_mask_from_scores(model, scores, ratio)
        pm = param_mask(model, units, opt.structural)
        self._store_personal(state, clients, params * pm, ratio)
        acc = tally["correct"] / tally["seen"].clamp(min=1)
        return Update(
            per_client={
                "delta": (w - params) * pm,
                "units": units.to(torch.float32),
                "train_acc": acc.float().unsqueeze(1),
            },
            losses=loss_sum.unsqueeze(0),
            steps=steps,
        )

    def _store_personal(
        self, state: State, clients: torch.Tensor, personal: torch.Tensor, ratio: torch.Tensor
    ) -> None:
        """Keep the round's personal sparse models: every one (the paper), or with
        ``personal_keep_above`` only those trained at a keep ratio above it (the code)."""
        threshold = self.options.personal_keep_above
        if threshold <= 0:
            state["personal"][clients] = personal
            return
        kept = (ratio > threshold).to(clients.device)
        state["personal"][clients[kept]] = personal[kept]
        state["has_personal"][clients[kept]] = 1.0

    def aggregate(self, state: State, task: Task, update: Update) -> dict[str, float]:
        ctx, opt = self.ctx, self.options
        clients, w = task.clients, state["global"]
        delta = ctx.send("client_cloud", "up", update.per_client["delta"], clients)
        ctx.ledger.record_masks("client_cloud", "up", self.num_units, len(clients), clients)
        weights = ctx.client_weights(clients)  # Eq. 13 through the cloud's uplink (uploads: own)
        state["global"] = ctx.cloud_uplink.aggregate(delta, weights, w, combine=partial(eq13, w))
        # Eq. 14: each client's simulated time from its FLOPs and the bytes it moved
        nnz = count_nonzero(delta, ctx.zero_threshold).double().cpu()
        up = nnz * 4 + unit_mask_bytes(self.num_units)
        down = torch.full_like(up, 4.0 * state["global"].numel())
        units = update.per_client["units"] > 0.5
        fwd = masked_flops(ctx.model, units, opt.structural).double()
        flops = 3.0 * fwd * opt.sample_counts(ctx.fed.train.counts[clients])
        acc = update.per_client["train_acc"][:, 0].double().cpu()
        caps = task.per_client["capability"]
        seconds, cost = self.sizes.account(state, flops, caps, up, down)
        if opt.ratio == "pucbv":
            self._update_bandits(state, clients, acc, seconds)
        stats = self.local_work_stats(task, update)
        stats.update(
            cost,
            mean_keep_ratio=float(task.per_client["ratio"].mean()),
            mean_train_acc=float(acc.mean()),
        )
        return stats

    def _update_bandits(
        self, state: State, clients: torch.Tensor, acc: torch.Tensor, seconds: torch.Tensor
    ) -> None:
        arms, scalars = state["bandit_arms"], state["bandit_scalars"]
        u = torch.rand(len(clients), generator=self.ctx.generator, dtype=torch.float64)
        for i, c in enumerate(clients.tolist()):
            bandit = self._bandit()  # (its arms and scalars loaded from the state)
            bandit.load_rows(arms[c], scalars[c])
            state["ratio"][c] = bandit.update(float(acc[i]), float(seconds[i]), float(u[i]))
            arms[c], scalars[c] = bandit.to_rows(arms.shape[1])


@ALGORITHMS.register("fedlps")
class FedLPSOptions(LocalWorkOptions):
    """FedLPS: learnable per-client unit masks (scores Q) and sparse ratios (P-UCBV, fixed or
    capability-bound); Eq. 13 aggregation; FedLPS's device cost model (docs/fedlps.md)."""

    lr: float = pydantic.Field(0.1, gt=0, description="step size of ω (and of Q by default)")
    score_lr: float | None = pydantic.Field(
        None,
        gt=0,
        description="step size of the scores Q (None: lr, the paper's one η for ω and Q); a "
        "large ω step (the LSTM's 0.8) moves Q by as much and reshuffles the masks every step",
    )
    mu: float = pydantic.Field(1.0, ge=0, description="weight of ‖ω − ω^r‖² (code: 0)")
    lam: float = pydantic.Field(1.0, ge=0, description="weight of ‖Q − sigmoid(|ω|_J)‖²")
    ste: bool = pydantic.Field(True, description="straight-through CE gradient for Q")
    structural: bool = pydantic.Field(
        False, description="also zero a dropped unit's bias/BatchNorm (false: weight rows, code)"
    )
    score_init: Literal["magnitude", "ordered"] = "magnitude"
    score_reset: bool = pydantic.Field(
        False,
        description="re-initialize a client's Q at the start of each round it takes part in "
        "(the authors' code, initialize_mask): score_init's scores again, sigmoid(|ω^r|_J) of "
        "the received model for magnitude; false: Q persists across rounds (the paper)",
    )
    personal_keep_above: float = pydantic.Field(
        0.0,
        ge=0,
        lt=1,
        description="store a client's personal model only from rounds it trains at a keep ratio "
        "s above this, evaluating a client with none stored on the global model (the authors' "
        "code: 0.25); 0: every round's (the paper)",
    )
    ratio: RatioPolicy = "pucbv"
    fixed_ratio: float = pydantic.Field(0.5, gt=0, le=1, description="FLST's s (ratio=fixed)")
    capabilities: DrawnCapabilities = "dyn"
    capability_levels: list[Annotated[float, pydantic.Field(gt=0, le=1)]] = pydantic.Field(
        default_factory=lambda: list(CAPABILITY_LEVELS),
        min_length=1,
        description="z drawn uniformly from these (the paper's 1, ½, ¼, ⅛, 1/16)",
    )
    rounds: int = pydantic.Field(100, gt=0, description="R in P-UCBV's ξ = R/(K·ε_sel)")
    arms: int = pydantic.Field(5, gt=0, description="P-UCBV's initial arms")
    arms_low: float = pydantic.Field(0.0, ge=0, lt=1, description="arms cover [arms_low, 1)")
    rho: float = pydantic.Field(0.5, gt=0)
    delta_points: float = pydantic.Field(-5.0, description="arm elimination Δ (accuracy points)")
    floor: float = pydantic.Field(1 / 16, gt=0, le=1, description="lowest ratio decided")

    penalty_weights = {"lam": "λ", "mu": "μ"}
    client_outputs = ("delta", "units", "train_acc")
    node_keys = {"scores": "client", "personal": "client"}
    personal_on_node = True

    @property
    def score_step(self) -> float:
        """Q's step size: ``score_lr``, else ``lr``."""
        return self.lr if self.score_lr is None else self.score_lr

    algorithm_class = FedLPS
