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
(it returns the network unchanged). Not supported yet: the inducing-points variant, learnable
kernel hyperparameters, the marginal-likelihood objective, BatchNorm models, Flower.
"""

from __future__ import annotations

from functools import partial
from typing import Literal

import pydantic
import torch

from fedhp.algorithms.base import ALGORITHMS, Algorithm, AlgorithmOptions, State, Task, Update
from fedhp.algorithms.gp import linear_kernel, rbf_kernel
from fedhp.algorithms.gp_tree import GPSettings, class_probabilities, client_tree, tree_loss
from fedhp.engine.context import RunContext
from fedhp.engine.evaluate import ClientEval
from fedhp.engine.federation import ClientTensors
from fedhp.engine.ops import weighted_mean

EVAL_SEED = 0x9F6  # the private evaluation generator's seed (fixed: every evaluation alike)


class PFedGP(Algorithm):
    """Averaged feature extractor; per-client GP trees for training and prediction."""

    options: PFedGPOptions
    client_outputs = ("params",)

    def __init__(self, options: PFedGPOptions, ctx: RunContext) -> None:
        super().__init__(options, ctx)
        opt = options
        kernel = (
            partial(rbf_kernel, outputscale=opt.outputscale, lengthscale=opt.lengthscale)
            if opt.kernel == "rbf"
            else partial(linear_kernel, outputscale=opt.outputscale)
        )
        self.gp = GPSettings(kernel, opt.mean, opt.gibbs_steps, opt.chains)

    def init_state(self, init_params: torch.Tensor) -> State:
        seed = int(torch.randint(2**62, (1,), generator=self.ctx.generator))
        return {
            "global": init_params.clone(),
            "gibbs_rng": torch.Generator().manual_seed(seed).get_state(),
        }

    def global_model(self, state: State) -> torch.Tensor | None:
        return None  # the network alone classifies nothing

    def downlink(self, state: State, count: int) -> torch.Tensor | None:
        return state["global"].expand(count, -1)

    def plan(self, state: State, rnd: int) -> Task:
        return self.plan_broadcast_global(state)

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
        out, losses = [], []
        for c in task.clients.tolist():
            x, y = self._client_data(self.ctx.fed.train, c)
            p = w.detach().clone().requires_grad_(True)
            sgd = torch.optim.SGD([p], lr=opt.lr, momentum=opt.momentum, weight_decay=opt.wd)
            total = 0.0
            for _ in range(opt.inner_steps):
                emb = self.embed(p, x)
                loss = tree_loss(emb, y, client_tree(emb.detach(), y), self.gp, gen)
                if loss is None:  # one class (or too few samples): nothing to fit
                    break
                sgd.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_([p], opt.clip)
                sgd.step()
                total += float(loss.detach())
            out.append(p.detach())
            losses.append(total / opt.inner_steps)
        state["gibbs_rng"] = gen.get_state()
        return Update(
            per_client={"params": torch.stack(out)},
            losses=torch.tensor([losses], dtype=torch.float64),
        )

    def aggregate(self, state: State, task: Task, update: Update) -> dict[str, float]:
        ctx = self.ctx
        params = ctx.send("client_cloud", "up", update.per_client["params"], task.clients)
        state["global"] = weighted_mean(params, ctx.client_weights(task.clients))
        assert update.losses is not None
        return {"local_loss": float(update.losses.mean())}

    def personal_evaluation(self, state: State, split: ClientTensors) -> ClientEval:
        fed, model = self.ctx.fed, self.ctx.model
        gen = torch.Generator().manual_seed(EVAL_SEED)
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
                probs = class_probabilities(
                    emb_tr,
                    y_tr,
                    emb_te,
                    tree,
                    model.num_classes,
                    self.gp,
                    self.options.test_chains,
                    gen,
                )
                correct[c] = float((probs.argmax(1) == y_te).sum())
                truth = probs[torch.arange(len(y_te)), y_te]
                loss_sum[c] = float(-torch.log(truth.clamp(min=1e-12)).sum())
        return ClientEval(correct, loss_sum, split.counts.double().cpu())


@ALGORITHMS.register("pfedgp")
class PFedGPOptions(AlgorithmOptions):
    """pFedGP: averaged feature extractor + per-client GP trees (docs/algorithms.md)."""

    lr: float = pydantic.Field(0.05, gt=0, description="client SGD step size")
    momentum: float = pydantic.Field(0.9, ge=0, lt=1)
    wd: float = pydantic.Field(1e-3, ge=0, description="client SGD weight decay")
    clip: float = pydantic.Field(50.0, gt=0, description="gradient norm clipping")
    inner_steps: int = pydantic.Field(1, gt=0, description="full-batch steps per round")
    embedding: Literal["logits", "features"] = "logits"
    kernel: Literal["rbf", "linear"] = "rbf"
    outputscale: float = pydantic.Field(8.0, gt=0)
    lengthscale: float = pydantic.Field(1.0, ge=0.01)
    mean: float = pydantic.Field(0.0, description="the GPs' constant prior mean")
    gibbs_steps: int = pydantic.Field(5, gt=0)
    chains: int = pydantic.Field(20, gt=0, description="parallel Gibbs chains in training")
    test_chains: int = pydantic.Field(30, gt=0, description="parallel Gibbs chains at test")

    def gradient_evaluations(self) -> int:
        return self.inner_steps

    def build(self, ctx: RunContext) -> Algorithm:
        return PFedGP(self, ctx)
