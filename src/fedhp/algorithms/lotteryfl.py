"""LotteryFL-style personalization (Li et al., 2021): each client keeps an unstructured magnitude
mask and trains, keeps and uploads only the weights under it.

Per round, each selected client k (as the FedLPS authors' ``LotteryFL.py``):

* receives the global model under its mask, ω^r ⊙ M_k;
* if that model's accuracy on the client's validation data (its training data when it has
  none) is ≥ ``acc_threshold`` (0.5) and its density is above ``target_density`` (0.5), prunes
  first: in every hidden Linear / Conv2d weight, the ``prune_step`` (10 %) fraction of its kept
  entries with the smallest |w| (ties: the lower index) leave M_k, never below
  ``target_density`` of the layer (the output layer and biases are never pruned);
* trains ω^r ⊙ M_k (masked SGD, the local budget); the result is its personal model (evaluated
  on its own test data);
* sends up its masked weights and the mask (a bitmap over the parameters, billed); the cloud sets
  each entry to the mean over the clients holding it (:func:`fedhp.algorithms.heterofl.held_mean`).

No rewinding of the kept weights to their initial values (the authors' code has none either);
pruning is per layer with a floor, and the output layer is kept dense. Training FLOPs: 3 × the
forward FLOPs of the non-zero weights the client trained
(:func:`fedhp.models.masks.sparse_flops`) × samples; the capability levels and cost model are
FedLPS's (:mod:`fedhp.algorithms.device_cost`), drawn every round or once (``capabilities``).
"""

from __future__ import annotations

import pydantic
import torch

from fedhp.algorithms.base import Algorithm, State
from fedhp.algorithms.device_cost import DrawnCapabilities, SizedCostModel, cost_state
from fedhp.algorithms.heterofl import held_mean
from fedhp.algorithms.options import ALGORITHMS, LocalWorkOptions
from fedhp.algorithms.task import Task, Update
from fedhp.engine.context import RunContext
from fedhp.engine.evaluate import evaluate_personal
from fedhp.models.masks import output_layer_mask, require_hidden_units, sparse_flops


def magnitude_prune(
    params: torch.Tensor, mask: torch.Tensor, blocks: list[slice], step: float, floor: float
) -> torch.Tensor:
    """The masks ``[C, P]`` after one pruning step: in each block (a layer's weight entries) of
    each row, the ``step`` fraction of the kept entries with the smallest |params| is dropped
    (round half up; ties: the lower index), keeping at least ``floor`` × the block's size."""
    out = mask.clone()
    for block in blocks:
        size = block.stop - block.start
        kept = mask[:, block] > 0
        count = kept.sum(1)
        keep = torch.maximum(
            torch.floor(count.double() * (1 - step) + 0.5),
            torch.full_like(count, max(1, int(floor * size + 0.5)), dtype=torch.float64),
        )
        keep = torch.minimum(keep, count.double()).long()
        key = torch.where(kept, params[:, block].abs(), torch.full_like(params[:, block], -1.0))
        order = torch.sort(key, dim=1, descending=True, stable=True).indices
        rank = torch.empty_like(order)
        rank.scatter_(1, order, torch.arange(size, device=mask.device).expand(len(mask), -1))
        out[:, block] = (rank < keep.unsqueeze(1)).to(mask.dtype)
    return out


class LotteryFL(Algorithm):
    """Per-client magnitude masks, masked local training, entry-wise averaging over holders."""

    options: LotteryFLOptions

    def __init__(self, options: LotteryFLOptions, ctx: RunContext) -> None:
        require_hidden_units(ctx.model, "lotteryfl", "prunes the layers below the output layer")
        super().__init__(options, ctx)
        self.sizes = SizedCostModel(ctx)  # FedLPS's device model: z sizes the sub-models
        model = ctx.model
        head = output_layer_mask(model)
        self.blocks = [
            slice(s.offset, s.offset + s.numel)
            for s in model.layout.specs
            if len(s.shape) >= 2 and not bool(head[s.offset])
        ]
        self.prunable = sum(b.stop - b.start for b in self.blocks)

    def init_state(self, init_params: torch.Tensor) -> State:
        ctx = self.ctx
        k = ctx.num_clients
        return {
            "global": init_params.clone(),
            "mask": torch.ones(k, init_params.numel(), device=init_params.device),
            "personal": init_params.expand(k, -1).clone(),
            "capability": self.sizes.initial(init_params.device),
            **cost_state(),
        }

    def client_widths(self) -> dict[str, int]:
        n = self.ctx.model.num_params
        return {"model": n, "mask": n}

    def plan(self, state: State, rnd: int) -> Task:
        ctx, opt = self.ctx, self.options
        self.sizes.redraw(state, rnd, opt.capabilities)
        clients = ctx.participation.sample_clients()
        sub = state["global"] * state["mask"][clients]
        start = ctx.send("client_cloud", "down", sub, clients)
        caps = state["capability"][clients].cpu().double()
        # the cloud keeps a copy of every mask (the clients upload them); it rides along with the
        # sub-model unbilled, since the client holds the same mask
        mask = state["mask"][clients]
        return Task(clients, per_client={"start": start, "mask": mask, "capability": caps})

    def train(self, state: State, task: Task) -> Update:
        ctx, opt = self.ctx, self.options
        clients = task.clients
        start, mask = task.per_client["start"], task.per_client["mask"]
        # the received model's accuracy on the client's validation data (training data if it
        # has none) decides whether the mask shrinks before this round's training
        split = ctx.fed.val if bool((ctx.fed.val.counts[clients] > 0).all()) else ctx.fed.train
        result = evaluate_personal(ctx.model, start, split.select(clients))
        acc = (result.correct / result.count.clamp(min=1)).to(mask.device)
        density = sum(mask[:, b].sum(1) for b in self.blocks) / self.prunable
        gate = (acc >= opt.acc_threshold) & (density > opt.target_density)
        pruned = magnitude_prune(start, mask, self.blocks, opt.prune_step, opt.target_density)
        mask = torch.where(gate.unsqueeze(1), pruned, mask)
        params, loss_sum, steps = ctx.local_sgd(start * mask, clients, opt.work(), mask=mask)
        state["personal"][clients] = params
        return Update(
            per_client={"model": params, "mask": mask}, losses=loss_sum.unsqueeze(0), steps=steps
        )

    def aggregate(self, state: State, task: Task, update: Update) -> dict[str, float]:
        ctx, opt = self.ctx, self.options
        clients = task.clients
        params = ctx.send("client_cloud", "up", update.per_client["model"], clients)
        mask = update.per_client["mask"]  # what the client trained with and now keeps
        bitmap = ctx.ledger.record_masks(
            "client_cloud", "up", ctx.model.num_params, len(clients), clients
        )
        weights, w = ctx.client_weights(clients), state["global"]  # the uplink (uploads: own)
        state["global"] = ctx.cloud_uplink.aggregate(
            params, weights, w, combine=lambda rows, p: held_mean(w, rows, mask, p)
        )
        fwd = sparse_flops(ctx.model, mask).double()
        flops = 3.0 * fwd * opt.sample_counts(ctx.fed.train.counts[clients])
        down = 4.0 * task.per_client["mask"].sum(1).double().cpu()
        state["mask"][clients] = mask
        up = 4.0 * mask.sum(1).double().cpu() + bitmap / max(1, len(clients))
        caps = task.per_client["capability"]
        _, cost = self.sizes.account(state, flops, caps, up, down)
        stats = self.local_work_stats(task, update)
        stats.update(cost, mean_density=float(mask.double().mean()))
        return stats

    def personal_models(self, state: State) -> torch.Tensor | None:
        return state["personal"]


@ALGORITHMS.register("lotteryfl")
class LotteryFLOptions(LocalWorkOptions):
    """LotteryFL-style personal magnitude masks (docs/fedlps.md)."""

    lr: float = 0.1
    prune_step: float = pydantic.Field(0.1, gt=0, lt=1, description="fraction pruned per step")
    target_density: float = pydantic.Field(
        0.5, gt=0, le=1, description="stop pruning a layer at this kept fraction"
    )
    acc_threshold: float = pydantic.Field(
        0.5, ge=0, le=1, description="prune only when the training accuracy reaches this"
    )
    capabilities: DrawnCapabilities = "dyn"

    client_outputs = ("model", "mask")
    node_keys = {"personal": "client"}
    personal_on_node = True
    algorithm_class = LotteryFL
