"""FNR-FL (Hu, Qiu, Tang: "Feature Norm Regularized Federated Learning"), as settled by
``specs/fnr-fl.md``: a wrapper around a flat base algorithm X (FedAvg by default; "X+FNR-FL").

Per round, after X's local update of the sampled clients (their models w_i), the cloud, which
holds the public dataset D_pub (``public`` config section):

1. F_i = ClassAvgNorms(w_i, D_pub): per class present, the mean ‖penultimate feature‖₂ of its
   D_pub samples (eval mode); A_i = accuracy of w_i on D_pub;
2. S_re = the ⌊n·p⌋ clients with the lowest A_i (ties → lower client id);
3. each j ∈ S_re refines w_j for ``refine_epochs`` epochs over D_pub (batch ``refine_batch``) on
   Φ = CE + λ·R_j with R_j either the paper's (``regularizer: paper``:
   Σ_{l∈B} (#(y=l)/|B|)·Δ_j[l], Δ_j[l] = Σ_m (F_m[l] − F_j[l]) precomputed — a constant, so its
   gradient is exactly zero and λ has no effect) or the spec's differentiable variant
   (``differentiable``: Σ_{l∈B} ρ_l·(mean_{b: y_b=l} ‖z_b‖ − mean_m F_m[l])², ρ_l = #(y=l)/|B|);
   the sums over m run over S \\ S_re (``delta_sum: paper``) or every m ≠ j that has class l
   (``delta_sum: code``); optimizer SGD (default, lr = ``lr``) or Adam (``refine_optimizer``);
4. X aggregates as usual, with the refined models in place of the S_re clients' ones (X's own
   state, e.g. SCAFFOLD's control variates or FedNova's step counts, untouched by the
   refinement). Traffic: Δ_j (or the target norms) goes down to each refined client (K values)
   and its refined w_j comes up a second time (P values), both billed.

D_pub drawn from the test pool (``public.source=test``) is refused unless ``allow_test_leak``
(the authors' protocol), which logs a warning and marks summary.json.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Literal

import pydantic
import torch
import torch.nn.functional as F

from fedhp.algorithms.base import Algorithm, State
from fedhp.algorithms.options import ALGORITHMS, LocalWorkOptions
from fedhp.algorithms.task import Task, Update
from fedhp.engine.context import RunContext
from fedhp.errors import ConfigError
from fedhp.models.base import BatchedModel

if TYPE_CHECKING:
    from fedhp.config import RunConfig

EVAL_ROWS = 256
LOCAL_WORK_KEYS = (
    "lr",
    "batch_size",
    "local_steps",
    "local_epochs",
    "buffers",
    "momentum",
    "weight_decay",
)


@torch.no_grad()
def class_avg_norms(
    model: BatchedModel,
    params: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    num_classes: int,
    buffers: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ClassAvgNorms and accuracy of every row of ``params [n, P]`` on ``(x, y)``: the mean
    feature norm per class ``[n, K]`` (NaN for a class absent from ``y``) and ``[n]``."""
    n = params.shape[0]
    sums = torch.zeros(n, num_classes, dtype=torch.float64)
    correct = torch.zeros(n, dtype=torch.float64)
    for start in range(0, len(y), EVAL_ROWS):
        xb, yb = x[start : start + EVAL_ROWS], y[start : start + EVAL_ROWS]
        xs = xb.to(params.device).unsqueeze(0).expand(n, *xb.shape)
        logits, feats = model.forward_with_features(params, xs, buffers=buffers)
        norms = feats.norm(dim=-1).double().cpu()  # [n, b]
        sums.index_add_(1, yb.cpu(), norms)
        correct += (logits.argmax(-1).cpu() == yb.cpu()).double().sum(1)
    counts = torch.bincount(y.cpu(), minlength=num_classes).double()
    norms = sums / counts.clamp(min=1)
    norms[:, counts == 0] = float("nan")
    return norms, correct / max(len(y), 1)


def refine_set(accuracy: torch.Tensor, count: int) -> torch.Tensor:
    """Positions of the ``count`` lowest accuracies (ties → lower position), sorted."""
    order = sorted(range(len(accuracy)), key=lambda i: (float(accuracy[i]), i))
    return torch.tensor(sorted(order[:count]), dtype=torch.long)


def reference_norms(
    norms: torch.Tensor, refined: torch.Tensor, mode: Literal["paper", "code"]
) -> tuple[torch.Tensor, torch.Tensor]:
    """For each refined row j: the sum ``Δ [n_re, K]`` of F_m − F_j and the mean F_m ``[n_re, K]``
    over the reference clients m (S \\ S_re, or every m ≠ j), skipping classes a client lacks
    (NaN where no reference client has the class)."""
    n = norms.shape[0]
    is_refined = torch.zeros(n, dtype=torch.bool)
    is_refined[refined] = True
    deltas, means = [], []
    for j in refined.tolist():
        ref = ~is_refined if mode == "paper" else torch.arange(n) != j
        f = norms[ref]
        have = ~torch.isnan(f)
        cnt = have.sum(0).double()
        total = torch.where(have, f, torch.zeros_like(f)).sum(0)
        deltas.append(total - cnt * norms[j])
        means.append(torch.where(cnt > 0, total / cnt.clamp(min=1), torch.nan))
    return torch.stack(deltas), torch.stack(means)


def refine_loss(
    model: BatchedModel,
    params: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    lam: float,
    regularizer: Literal["paper", "differentiable"],
    delta: torch.Tensor,
    target: torch.Tensor,
    buffers: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-row Φ ``[n]`` on one D_pub minibatch ``(x [B, ...], y [B])`` shared by the rows."""
    n, k = params.shape[0], delta.shape[1]
    xs = x.unsqueeze(0).expand(n, *x.shape)
    logits, feats = model.forward_with_features(params, xs, buffers=buffers, train=True)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.repeat(n), reduction="none")
    loss = ce.view(n, -1).mean(1)
    # one-hot labels [B, K] and class counts without bincount / one_hot (host syncs on CUDA)
    onehot = (y.unsqueeze(1) == torch.arange(k, device=y.device)).to(loss.dtype)
    counts = onehot.sum(0)
    rho = counts / len(y)
    if regularizer == "paper":  # a constant of the weights: contributes no gradient
        reg = (rho * torch.nan_to_num(delta.to(loss.dtype))).sum(1)
    else:
        norms = feats.norm(dim=-1)  # [n, B]
        batch_mean = norms @ onehot / counts.clamp(min=1)  # [n, K]
        want = target.to(loss.dtype)
        use = (counts > 0) & ~torch.isnan(want)
        gap = torch.where(use, batch_mean - torch.nan_to_num(want), torch.zeros_like(batch_mean))
        reg = (rho * gap.square()).sum(1)
    return loss + lam * reg


class FnrFl(Algorithm):
    """X+FNR-FL: the base algorithm X's rounds with FNR-FL's refinement before aggregation."""

    options: FnrFlOptions

    @property
    def declarations(self) -> SimpleNamespace:
        """X's behaviour flags: FNR-FL runs X's rounds."""
        return self.base.declarations

    def __init__(self, options: FnrFlOptions, ctx: RunContext) -> None:
        base_opts = ALGORITHMS.build(options.base_config(), "algorithm.base_options")
        if base_opts.hierarchical:
            raise ConfigError("algorithm.base: FNR-FL wraps a flat method (fedavg, fedprox, ...)")
        self.base = base_opts.build(ctx)
        super().__init__(options, ctx)
        public = ctx.fed.public
        if public is None:
            raise ConfigError("public.per_class: FNR-FL needs a public dataset D_pub; set it > 0")
        if public.overlaps_evaluation and not options.allow_test_leak:
            raise ConfigError(
                "public.source: D_pub drawn from the test set overlaps the evaluation data; "
                "use public.source=holdout, or algorithm.allow_test_leak=true to reproduce the "
                "paper's leak"
            )
        if public.overlaps_evaluation:
            print("WARNING: FNR-FL with D_pub from the TEST set: test accuracy is leaked")

    def init_state(self, init_params: torch.Tensor) -> State:
        return self.base.init_state(init_params)

    def plan(self, state: State, rnd: int) -> Task:
        return self.base.plan(state, rnd)

    def train(self, state: State, task: Task) -> Update:
        return self.base.train(state, task)

    def aggregate(self, state: State, task: Task, update: Update) -> dict[str, float]:
        stats = self.refine(task, update)
        stats.update(self.base.aggregate(state, task, update))
        return stats

    def refine(self, task: Task, update: Update) -> dict[str, float]:
        """Steps 1–3 on the uploaded models (in place in ``update``); round statistics."""
        ctx, opt = self.ctx, self.options
        public = ctx.fed.public
        assert public is not None
        params = update.per_client["model"]
        bufs = update.per_client.get("buffers")
        n, k = params.shape[0], ctx.fed.num_classes
        count = int(n * opt.p)
        norms, acc = class_avg_norms(ctx.model, params, public.x, public.y, k, bufs)
        stats = {"fnr_public_acc_mean": float(acc.mean()), "fnr_refined": float(count)}
        if count == 0:
            return stats
        rows = refine_set(acc, count)
        delta, target = reference_norms(norms, rows, opt.delta_sum)
        clients = task.clients[rows.to(task.clients.device)]
        down = torch.nan_to_num(delta if opt.regularizer == "paper" else target).float()
        ctx.send("client_cloud", "down", down.to(params.device), clients)  # Δ_j or targets
        sub_bufs = None if bufs is None else bufs[rows].clone()
        refined = self._refine_models(params[rows], delta, target, sub_bufs)
        up = self.with_buffers(refined, sub_bufs)
        sent = ctx.send("client_cloud", "up", up, clients)  # the refined models, a second time
        params[rows], new_bufs = sent["model"], sent.get("buffers")
        if bufs is not None and new_bufs is not None:
            bufs[rows] = new_bufs
        return stats

    def _refine_models(
        self,
        start: torch.Tensor,
        delta: torch.Tensor,
        target: torch.Tensor,
        buffers: torch.Tensor | None,
    ) -> torch.Tensor:
        ctx, opt = self.ctx, self.options
        public = ctx.fed.public
        assert public is not None
        w = start.detach().clone().requires_grad_(True)
        delta, target = delta.to(w.device), target.to(w.device)  # computed on the host
        optim: torch.optim.Optimizer = (
            torch.optim.SGD([w], lr=opt.lr)
            if opt.refine_optimizer == "sgd"
            else torch.optim.Adam([w], lr=opt.refine_lr)
        )
        n_pub = len(public.y)
        for _ in range(opt.refine_epochs):
            order = torch.randperm(n_pub, generator=ctx.generator).to(public.x.device)
            for s in range(0, n_pub, opt.refine_batch):
                idx = order[s : s + opt.refine_batch]
                x, y = public.x[idx].to(w.device), public.y[idx].to(w.device)
                loss = refine_loss(
                    ctx.model, w, x, y, opt.lam, opt.regularizer, delta, target, buffers
                )
                optim.zero_grad(set_to_none=True)
                loss.sum().backward()  # rows are independent: row j's gradient is its own
                optim.step()
        return w.detach()

    def global_model(self, state: State) -> torch.Tensor | None:
        return self.base.global_model(state)

    def summary_notes(self) -> dict[str, Any]:
        public = self.ctx.fed.public
        return {"test_leak": bool(public is not None and public.overlaps_evaluation)}


@ALGORITHMS.register("fnrfl")
class FnrFlOptions(LocalWorkOptions):
    """FNR-FL around the flat method ``base`` (its options in ``base_options``): refine the
    ⌊n·p⌋ sampled clients with the lowest D_pub accuracy toward the others' class-average feature
    norms before aggregating (needs ``public.per_class`` > 0; docs/fnrfl.md)."""

    base: str = "fedavg"
    base_options: dict[str, Any] = pydantic.Field(default_factory=dict)
    p: float = pydantic.Field(0.5, ge=0, le=1, description="fraction of clients refined")
    penalty_weights = {"lam": "λ"}
    lam: float = pydantic.Field(0.1, ge=0, description="regularizer weight lambda")
    regularizer: Literal["paper", "differentiable"] = "differentiable"
    delta_sum: Literal["paper", "code"] = "paper"
    refine_epochs: int = pydantic.Field(5, ge=0, description="E_re")
    refine_batch: int = pydantic.Field(32, gt=0)
    refine_optimizer: Literal["sgd", "adam"] = "sgd"
    refine_lr: float = pydantic.Field(0.001, gt=0, description="Adam's step size (sgd uses lr)")
    allow_test_leak: bool = False

    supports_buffers = True
    algorithm_class = FnrFl

    def base_config(self) -> dict[str, Any]:
        """The base method's section: the local-work options given here (lr, batch_size,
        local_steps / local_epochs), then ``base_options`` on top."""
        given = {k: getattr(self, k) for k in LOCAL_WORK_KEYS if k in self.model_fields_set}
        return {"name": self.base, **given, **self.base_options}

    def gradient_evaluations(self) -> int:
        return ALGORITHMS.build(self.base_config(), "algorithm.base").gradient_evaluations()

    def unread(self, run: RunConfig) -> dict[str, str]:
        """``refine_lr`` with SGD refinement; ``allow_test_leak`` with D_pub held out; the base
        method's momentum and weight decay where not given (the base's own apply)."""
        out: dict[str, str] = {}
        if self.refine_optimizer != "adam":
            out["refine_lr"] = "SGD refinement steps by lr; set algorithm.refine_optimizer=adam"
        elif "lr" not in self.model_fields_set:  # (Adam steps by refine_lr; the base by its own)
            out["lr"] = "Adam refinement steps by refine_lr, the base method by its own lr"
        if run.public.source != "test":
            out["allow_test_leak"] = "D_pub is held out, not drawn from the test pool"
        for key in ("momentum", "weight_decay"):
            if key not in self.model_fields_set:
                out[key] = "passed to the base method only when set"
        return out
