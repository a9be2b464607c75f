"""pFedGP (Achituve et al., NeurIPS 2021): a shared feature extractor averaged like FedAvg and,
on every client, a GP classifier over the embeddings of its own training data (a binary tree of
Pólya-Gamma-augmented GPs, :mod:`fedhp.algorithms.gp_tree`).

Per round, each sampled client receives the network, takes ``inner_steps`` full-batch steps of a
fresh SGD optimizer (momentum, weight decay, gradient clipping: the authors' ``trainer.py``) on
the tree's predictive objective — the tree rebuilt from the current embeddings at every step —
and sends the network back; the cloud takes the (uniform or sample-weighted) mean. The embedding
is the model's output layer read as a linear embedding head (``embedding: logits``, the spec's
linear head after the last hidden layer; the classifier's logits are never used as class scores)
or its penultimate features (``features``). Personalized accuracy: each client's GP tree
conditioned on all of its training data predicts its own test samples (a class outside the
client's classes has probability 0); there is no global classifier, so no global accuracy.

Gibbs draws come from the method's own generator (``gibbs_rng`` in the state, checkpointed);
evaluation uses a private generator re-seeded at every evaluation, so evaluating does not change
training. A client with a single class has no tree: it predicts that class and does not train
(it returns the network unchanged).

``inducing=true`` is pFedGP-IP in its "IP-data" form: learned inducing points X̄ ``[classes, M,
d]`` in embedding space (randn · 0.01 at the start, sent down with the network), each node's GP
fitted on the X̄ of its classes and scoring all of the client's samples (class-balanced
cross-entropy); the cloud averages each class's X̄ over the clients holding that class. Test:
the GPs are fitted on the real training data plus X̄. ``objective: marginal`` trains on minus the
augmented marginal log-likelihood instead of the predictive objective. Not supported yet: the
FITC ("IP-compute") form, BatchNorm models, Flower. ``learn_kernel: true`` learns the kernel's
log outputscale and log lengthscale with the network (averaged by the cloud like it); the code
keeps them fixed.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Literal

import pydantic
import torch

from fedhp.algorithms.base import Algorithm, State
from fedhp.algorithms.gp import linear_kernel, rbf_kernel
from fedhp.algorithms.gp_tree import (
    GPSettings,
    class_probabilities,
    client_tree,
    inducing_tree_loss,
    tree_loss,
)
from fedhp.algorithms.heterofl import held_mean
from fedhp.algorithms.options import ALGORITHMS, AlgorithmOptions, derived_steps
from fedhp.algorithms.task import Task, Update
from fedhp.comm import Message
from fedhp.engine.context import RunContext
from fedhp.engine.evaluate import ClientEval
from fedhp.engine.federation import ClientTensors
from fedhp.engine.ops import weighted_mean

if TYPE_CHECKING:
    from fedhp.config import RunConfig

EVAL_SEED = 0x9F6  # the private evaluation generator's seed (fixed: every evaluation alike)


class PFedGP(Algorithm):
    """Averaged feature extractor; per-client GP trees for training and prediction."""

    options: PFedGPOptions

    def __init__(self, options: PFedGPOptions, ctx: RunContext) -> None:
        super().__init__(options, ctx)
        self.gp = self.settings(options.outputscale, options.lengthscale)
        probe = torch.zeros(ctx.model.num_params, device=ctx.device)
        self.dim = self.embed(probe, ctx.fed.train.x[:1]).shape[-1]  # embedding size d

    def settings(self, scale: float | torch.Tensor, length: float | torch.Tensor) -> GPSettings:
        """The node GPs' settings with the kernel's outputscale and lengthscale (tensors: learned,
        differentiable)."""
        opt = self.options
        kernel = (
            partial(rbf_kernel, outputscale=scale, lengthscale=length)
            if opt.kernel == "rbf"
            else partial(linear_kernel, outputscale=scale)
        )
        return GPSettings(kernel, opt.mean, opt.gibbs_steps, opt.chains, objective=opt.objective)

    def learned(self, log_hyper: torch.Tensor) -> GPSettings:
        """The settings from learned (log outputscale, log lengthscale) ``log_hyper [2]``
        (lengthscale ≥ 0.01, as the code's constraint)."""
        return self.settings(log_hyper[0].exp(), log_hyper[1].exp().clamp(min=0.01))

    def init_state(self, init_params: torch.Tensor) -> State:
        ctx, opt = self.ctx, self.options
        seed = int(torch.randint(2**62, (1,), generator=ctx.generator))
        state = {
            "global": init_params.clone(),
            "gibbs_rng": torch.Generator().manual_seed(seed).get_state(),
        }
        device = init_params.device
        if opt.learn_kernel:  # (log outputscale, log lengthscale), averaged like the network
            hyper = torch.tensor([opt.outputscale, opt.lengthscale], device=device)
            state["kernel"] = hyper.log()
        if opt.inducing:  # X̄ [classes, M, d] in embedding space, randn · 0.01 (the code's)
            shape = (ctx.model.num_classes, opt.inducing_points, self.dim)
            drawn = torch.randn(shape, generator=ctx.generator)  # on the host generator
            state["inducing"] = 0.01 * drawn.flatten().to(device)
        return state

    def client_widths(self) -> dict[str, int]:
        widths = {"model": self.ctx.model.num_params}
        if self.options.inducing:
            k = self.ctx.model.num_classes
            widths.update(inducing=k * self.options.inducing_points * self.dim, inducing_held=k)
        if self.options.learn_kernel:
            widths["kernel"] = 2
        return widths

    def global_model(self, state: State) -> torch.Tensor | None:
        return None  # the network alone classifies nothing

    def downlink(self, state: State, count: int) -> Message | None:
        return Message(model=state["global"].expand(count, -1))

    def plan(self, state: State, rnd: int) -> Task:
        task = self.plan_broadcast_global(state)
        for key in ("inducing", "kernel"):  # X̄ and the kernel's (log) hyperparameters, if learned
            if key in state:
                down = state[key].expand(len(task.clients), -1)
                task.broadcast[key] = self.ctx.send("client_cloud", "down", down, task.clients)[0]
        return task

    def _points(
        self, rows: torch.Tensor, classes: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The inducing points ``[len(classes)·M, d]`` held in ``rows [len(classes), M·d]`` (one
        row per class of ``classes``) and their labels."""
        m = self.options.inducing_points
        return rows.reshape(len(classes) * m, -1).double(), classes.repeat_interleave(m)

    def embed(self, params: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Embeddings ``[n, d]`` of inputs ``x [n, ...]`` under one network ``params [P]``."""
        logits, features = self.ctx.model.forward_with_features(params[None], x[None])
        return (logits if self.options.embedding == "logits" else features)[0].double()

    def _client_data(self, split: ClientTensors, c: int) -> tuple[torch.Tensor, torch.Tensor]:
        lo, hi = int(split.offsets[c]), int(split.offsets[c + 1])
        return split.x[lo:hi], split.y[lo:hi]

    def train(self, state: State, task: Task) -> Update:
        opt = self.options
        gen = torch.Generator()
        gen.set_state(state["gibbs_rng"])
        w = task.broadcast["global"]
        out: dict[str, list[torch.Tensor]] = {k: [] for k in self.client_widths()}
        losses = []
        for c in task.clients.tolist():
            x, y = self._client_data(self.ctx.fed.train, c)
            p = w.detach().clone().requires_grad_(True)
            leaves = [p]
            classes = torch.unique(y)
            if opt.inducing:
                flat = task.broadcast["inducing"].view(self.ctx.model.num_classes, -1)
                xbar = flat[classes].detach().clone().double().requires_grad_(True)
                leaves.append(xbar)
            gp = self.gp
            if opt.learn_kernel:
                hyper = task.broadcast["kernel"].detach().clone().double().requires_grad_(True)
                leaves.append(hyper)
                gp = self.learned(hyper)
            sgd = torch.optim.SGD(leaves, lr=opt.lr, momentum=opt.momentum, weight_decay=opt.wd)
            total = 0.0
            for _ in range(opt.inner_steps):
                emb = self.embed(p, x)
                tree = client_tree(emb.detach(), y)
                if opt.inducing:
                    ind, ind_y = self._points(xbar, classes)
                    loss = inducing_tree_loss(emb, y, ind, ind_y, tree, gp, gen)
                else:
                    loss = tree_loss(emb, y, tree, gp, gen)
                if loss is None:  # one class (or too few samples): nothing to fit
                    break
                self.ctx.model.count_trained(x.unsqueeze(0))  # a full-batch gradient evaluation
                sgd.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(leaves, opt.clip)
                sgd.step()
                total += float(loss.detach())
            out["model"].append(p.detach())
            if opt.inducing:
                rows = torch.zeros_like(task.broadcast["inducing"]).view(len(flat), -1)
                rows[classes] = xbar.detach().to(rows.dtype)
                held = torch.zeros(len(flat), device=flat.device)
                held[classes] = 1.0
                out["inducing"].append(rows.flatten())
                out["inducing_held"].append(held)
            if opt.learn_kernel:
                out["kernel"].append(hyper.detach().float())
            losses.append(total / opt.inner_steps)
        state["gibbs_rng"] = gen.get_state()
        return Update(
            per_client={k: torch.stack(v) for k, v in out.items()},
            losses=torch.tensor([losses], dtype=torch.float64),
        )

    def aggregate(self, state: State, task: Task, update: Update) -> dict[str, float]:
        ctx = self.ctx
        params = ctx.send("client_cloud", "up", update.per_client["model"], task.clients)
        weights = ctx.client_weights(task.clients)
        state["global"] = weighted_mean(params, weights)
        if self.options.inducing:  # each class's X̄: the mean over the clients holding it
            points = ctx.send("client_cloud", "up", update.per_client["inducing"], task.clients)
            held = update.per_client["inducing_held"].repeat_interleave(
                points.shape[1] // self.ctx.model.num_classes, dim=1
            )
            state["inducing"] = held_mean(state["inducing"], points, held, weights)
        if self.options.learn_kernel:
            hyper = ctx.send("client_cloud", "up", update.per_client["kernel"], task.clients)
            state["kernel"] = weighted_mean(hyper, weights)
        assert update.losses is not None
        return {"local_loss": float(update.losses.mean())}

    def personal_evaluation(self, state: State, split: ClientTensors) -> ClientEval:
        fed, model = self.ctx.fed, self.ctx.model
        gen = torch.Generator().manual_seed(EVAL_SEED)
        gp = self.learned(state["kernel"].double()) if self.options.learn_kernel else self.gp
        n = fed.num_clients
        correct = torch.zeros(n, dtype=torch.float64)
        loss_sum = torch.zeros(n, dtype=torch.float64)
        with torch.no_grad():
            for c in range(n):
                x_tr, y_tr = self._client_data(fed.train, c)
                x_te, y_te = self._client_data(split, c)
                if len(y_te) == 0 or len(y_tr) == 0:
                    continue
                emb_tr = self.embed(state["global"], x_tr)
                emb_te = self.embed(state["global"], x_te)
                tree = client_tree(emb_tr, y_tr)
                fit_x, fit_y = emb_tr, y_tr
                if self.options.inducing:  # the real data plus the classes' inducing points
                    classes = torch.unique(y_tr)
                    rows = state["inducing"].view(model.num_classes, -1)[classes]
                    ind, ind_y = self._points(rows, classes)
                    fit_x, fit_y = torch.cat([emb_tr, ind]), torch.cat([y_tr, ind_y])
                probs = class_probabilities(
                    fit_x, fit_y, emb_te, tree, model.num_classes, gp, self.options.test_chains, gen
                )
                correct[c] = float((probs.argmax(1) == y_te).sum())
                truth = probs[torch.arange(len(y_te), device=probs.device), y_te]
                loss_sum[c] = float(-torch.log(truth.clamp(min=1e-12)).sum())
        return ClientEval(correct, loss_sum, split.counts.double().cpu())


@ALGORITHMS.register("pfedgp")
class PFedGPOptions(AlgorithmOptions):
    """pFedGP: averaged feature extractor + per-client GP trees (docs/algorithms.md)."""

    flower_ready = False

    lr: float = pydantic.Field(0.05, gt=0, description="client SGD step size")
    momentum: float = pydantic.Field(0.9, ge=0, lt=1)
    wd: float = pydantic.Field(1e-3, ge=0, description="client SGD weight decay")
    clip: float = pydantic.Field(50.0, gt=0, description="gradient norm clipping")
    inner_steps: int = pydantic.Field(1, gt=0, description="full-batch steps per round")
    embedding: Literal["logits", "features"] = "logits"
    kernel: Literal["rbf", "linear"] = "rbf"
    outputscale: float = pydantic.Field(8.0, gt=0)
    lengthscale: float = pydantic.Field(1.0, ge=0.01)
    learn_kernel: bool = pydantic.Field(
        False, description="learn outputscale and lengthscale (the code keeps them fixed)"
    )
    mean: float = pydantic.Field(0.0, description="the GPs' constant prior mean")
    gibbs_steps: int = pydantic.Field(5, gt=0)
    chains: int = pydantic.Field(20, gt=0, description="parallel Gibbs chains in training")
    test_chains: int = pydantic.Field(30, gt=0, description="parallel Gibbs chains at test")
    objective: Literal["predictive", "marginal"] = pydantic.Field(
        "predictive", description="training objective of the node GPs"
    )
    inducing: bool = pydantic.Field(
        False, description="pFedGP-IP: node GPs fitted on learned inducing points (IP-data)"
    )
    inducing_points: int = pydantic.Field(100, gt=0, description="inducing points per class")

    client_outputs = ("model", "inducing", "inducing_held", "kernel")

    def gradient_evaluations(self) -> int:
        return self.inner_steps

    def unread(self, run: RunConfig) -> dict[str, str]:
        """``local_steps`` (full-batch ``inner_steps``); ``inducing_points`` without
        ``inducing``."""
        out = {"local_steps": derived_steps("pfedgp", "inner_steps")}
        if not self.inducing:
            out["inducing_points"] = "pFedGP-IP is off; set algorithm.inducing=true"
        return out

    algorithm_class = PFedGP
