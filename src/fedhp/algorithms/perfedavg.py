"""Per-FedAvg (Fallah, Mokhtari, Ozdaglar 2020): MAML-style personalized FedAvg (flat).

Each local step of a client, on fresh minibatches D1, D2 (and D3 for HF):
``w' = w - alpha grad f(w; D1)``, ``g = grad f(w'; D2)``; HF corrects ``g <- g - alpha H(w; D3) g``
with a Hessian-vector product; then ``w <- w - beta g``. The cloud averages the clients' models.
The personalized model of a client is the global model after ONE ``alpha`` step on a minibatch of
its TRAINING data (drawn from a generator of its own, so evaluation never shifts training's
random stream); test data are never used for adaptation.

One round for one run and for a batch of runs (``fedhp sweep``'s lockstep): run s's clients are a
block of rows of one ``[ΣC, P]`` tensor, its α and β its rows' values; nothing crosses a block
(the model's gradients and Hessian-vector products are per row).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Literal

import pydantic
import torch
import torch.nn.functional as F

from fedhp.algorithms.base import Algorithm, State
from fedhp.algorithms.device_cost import CapabilityMode, DenseDeviceCost, capabilities_field
from fedhp.algorithms.options import ALGORITHMS, AlgorithmOptions
from fedhp.algorithms.task import Task, Update
from fedhp.comm import truncate
from fedhp.data.rows import slice_rows
from fedhp.engine.context import RunContext
from fedhp.engine.ops import batched_loss_grad, mean_group_loss
from fedhp.engine.run_rows import RunBlocks, one_draw, rows_key
from fedhp.models.base import BatchedModel, loss_and_grad

if TYPE_CHECKING:
    from fedhp.config import RunConfig

EVAL_SEED = 7_777_777


def batched_hvp(
    model: BatchedModel, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor, v: torch.Tensor
) -> torch.Tensor:
    """Row c: the Hessian of client c's mean loss at ``params[c]`` times ``v[c]`` (double backward;
    exact per client because clients share no parameters)."""
    p = params.detach().requires_grad_(True)
    logits = model.forward(p, x)
    c, b = logits.shape[0], logits.shape[1]
    losses = F.cross_entropy(logits.reshape(c * b, -1), y.reshape(-1), reduction="none")
    (grad,) = torch.autograd.grad(losses.view(c, b).mean(1).sum(), p, create_graph=True)
    (hv,) = torch.autograd.grad((grad * v.detach()).sum(), p)
    return hv


class PerFedAvg(DenseDeviceCost):
    """Per-FedAvg (FO or HF); global model ``w``, personalized = ``w`` adapted by one step.
    ``capabilities: fix|dyn``: FedLPS's device model (:class:`DenseDeviceCost`)."""

    options: PerFedAvgOptions

    def __init__(self, options: PerFedAvgOptions, ctx: RunContext) -> None:
        super().__init__(options, ctx)
        counts = ctx.fed.train.counts
        gen = torch.Generator(device=counts.device)
        self.eval_generator = gen
        self.eval_sampler = ctx.sampler.with_generator(gen)

    def init_state(self, init_params: torch.Tensor) -> State:
        return {"global": init_params.to(self.ctx.device).clone(), **self.device_cost_state()}

    def round_samples(self, clients: torch.Tensor) -> torch.Tensor:
        """Every minibatch of a meta-step: 2 (FO) or 3 (HF; the Hessian-vector product's batch
        counted as one gradient evaluation) per step."""
        opt = self.options
        per_client = float(opt.gradient_evaluations() * opt.batch_size)
        return torch.full((len(clients),), per_client, dtype=torch.float64)

    def plan(self, state: State, rnd: int) -> Task:
        self.refresh_device_cost(state, rnd)
        return self.plan_broadcast_global(state)

    def train(self, state: State, task: Task) -> Update:
        """The round's meta-steps: :func:`fused_train` (with a batch's other runs of one
        :meth:`round_key` as one)."""
        return self.ctx.together(fused_train, self.round_key(task), (self, state, task))

    def round_key(self, task: Task) -> Hashable | None:
        """What runs must share to train their rounds as one (None: this round trains alone):
        the variant, the local steps, the minibatch size, the model and its execution policy,
        the received model's size, dtype and device, the zero threshold. A round without
        clients or with minibatches drawn ahead trains alone."""
        opt, ctx = self.options, self.ctx
        if len(task.clients) == 0 or task.batches is not None:
            return None
        steps = (opt.variant, opt.local_steps, opt.batch_size, ctx.policy)
        return rows_key("perfedavg", ctx, task.broadcast["global"], steps)

    def aggregate(self, state: State, task: Task, update: Update) -> dict[str, float]:
        ctx, clients, start = self.ctx, task.clients, task.broadcast["global"]
        assert update.losses is not None
        params = self.send_up(update, clients, start)["model"]
        state["global"] = ctx.cloud_uplink.aggregate(params, ctx.client_weights(clients), start)
        stats = {"local_loss": mean_group_loss(update.losses, self.options.local_steps)}
        stats.update(self.account_device_cost(state, clients))
        return stats

    def adapt(self, w: torch.Tensor, clients: torch.Tensor) -> torch.Tensor:
        """Each client's copy of ``w`` after one ``alpha`` step on a training minibatch."""
        self.eval_generator.manual_seed(EVAL_SEED)
        idx = self.eval_sampler.draw(clients, self.options.batch_size)
        x, y = self.ctx.fed.train.gather(clients, idx, self.ctx.generator)
        start = w.expand(len(clients), -1)
        with torch.enable_grad():  # evaluation may run under no_grad
            _, grad = batched_loss_grad(self.ctx.model, start, x, y)
        return start - self.options.alpha * grad

    def personal_models(self, state: State) -> torch.Tensor | None:
        """Every client adapts the global model as it receives it (truncated at the zero
        threshold; the runner bills that message on the ``client_cloud_eval`` link)."""
        return self.adapt(truncate(state["global"], self.ctx.zero_threshold), self.ctx.all_clients)


def fused_train(items: Sequence[tuple[PerFedAvg, State, Task]]) -> list[Update]:
    """The ``local_steps`` meta-steps of every run of ``items`` (one ``(algorithm, state, task)``,
    or a batch's with one :meth:`~PerFedAvg.round_key`) on its clients' rows, each run drawing its
    own minibatches (as one draw where the runs' draws allow it)."""
    opt, model = items[0][0].options, items[0][0].ctx.model
    contexts = [algo.ctx for algo, _, _ in items]
    clients = [task.clients for _, _, task in items]
    runs = RunBlocks.of([len(c) for c in clients])
    params = torch.cat([t.broadcast["global"].expand(len(t.clients), -1) for _, _, t in items])
    alpha = runs.column([algo.options.alpha for algo, _, _ in items], params)
    beta = runs.column([algo.options.beta for algo, _, _ in items], params)
    own = [ctx.batches(c, opt.batch_size) for ctx, c in zip(contexts, clients, strict=True)]
    draw = one_draw(contexts, clients, opt.batch_size, own)

    def loss_grad(
        w: torch.Tensor, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`batched_loss_grad` on every run's rows, each run's samples on its counter."""
        for lo, hi, s in runs.within(0, runs.rows):
            contexts[s].model.count_trained(x if runs.runs == 1 else slice_rows(x, lo, hi))
        return loss_and_grad(model, w.detach(), x, y)

    losses = []
    for _ in range(opt.local_steps):
        x1, y1 = draw()
        loss, g1 = loss_grad(params, x1, y1)
        x2, y2 = draw()
        _, g = loss_grad(params - alpha * g1, x2, y2)
        if opt.variant == "hf":
            x3, y3 = draw()
            g = g - alpha * batched_hvp(model, params, x3, y3, g)
        params = params - beta * g
        losses.append(loss)
    each = torch.stack(losses)
    return [
        Update(per_client={"model": runs.own(params, s)}, losses=runs.own(each, s, dim=1))
        for s in range(runs.runs)
    ]


@ALGORITHMS.register("perfedavg")
class PerFedAvgOptions(AlgorithmOptions):
    """Per-FedAvg. ``alpha`` is the personalization (inner) step, ``beta`` the meta (outer) step;
    ``lr`` is unused. Each of ``local_steps`` steps uses 2 minibatches (FO) or 3 (HF)."""

    variant: Literal["fo", "hf"] = "fo"
    alpha: float = pydantic.Field(0.05, gt=0, description="inner (personalization) step size")
    beta: float = pydantic.Field(0.001, gt=0, description="outer (meta) step size")
    capabilities: CapabilityMode = capabilities_field()

    client_outputs = ("model",)
    personal_on_node = True
    personal_needs_global = True
    uploads = {"cloud": "estimate"}  # the clients' meta-models

    def unread(self, run: RunConfig) -> dict[str, str]:
        """``lr``: the steps are ``alpha`` (inner) and ``beta`` (outer)."""
        return {
            "lr": "perfedavg steps by alpha (inner) and beta (outer); set algorithm.alpha "
            "and algorithm.beta instead"
        }

    def gradient_evaluations(self) -> int:
        return self.local_steps * (3 if self.variant == "hf" else 2)

    def build(self, ctx: RunContext) -> Algorithm:
        return PerFedAvg(self, ctx)
