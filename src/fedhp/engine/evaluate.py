"""Evaluation: the global model on every client's test set, personalized models on their own."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedhp.comm import count_nonzero
from fedhp.engine.federation import ClientTensors, slice_rows
from fedhp.models.base import BatchedModel
from fedhp.models.policy import widened


@dataclass(frozen=True)
class ClientEval:
    """Per-client sums: correct predictions, summed loss and sample counts (all ``[C]``)."""

    correct: torch.Tensor
    loss_sum: torch.Tensor
    count: torch.Tensor
    class_correct: torch.Tensor | None = None  # [K] correct predictions per true class
    class_count: torch.Tensor | None = None  # [K] samples per true class

    @property
    def balanced_accuracy(self) -> float | None:
        """Mean over the classes present of their accuracy (None without class counts)."""
        if self.class_correct is None or self.class_count is None:
            return None
        present = self.class_count > 0
        if not bool(present.any()):
            return None
        return float((self.class_correct[present] / self.class_count[present]).mean())

    @property
    def accuracy(self) -> float:
        """Micro-averaged accuracy: sum of correct over sum of samples."""
        return float(self.correct.sum()) / max(float(self.count.sum()), 1.0)

    @property
    def loss(self) -> float:
        return float(self.loss_sum.sum()) / max(float(self.count.sum()), 1.0)

    def per_client_accuracy(self) -> torch.Tensor:
        return self.correct / self.count.clamp(min=1)

    def per_group_accuracy(self, group: torch.Tensor, num_groups: int) -> torch.Tensor:
        """Micro-averaged accuracy per group (e.g. edge) of clients."""
        c = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, group, self.correct.double())
        n = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, group, self.count.double())
        return c / n.clamp(min=1)


@torch.no_grad()
def evaluate_shared(
    model: BatchedModel,
    params: torch.Tensor,
    data: ClientTensors,
    chunk: int = 8192,
    *,
    buffers: torch.Tensor | None = None,
) -> ClientEval:
    """One model ``[P]`` (with its BatchNorm statistics ``buffers [B]``) on the union of all
    clients' samples, in eval mode, broken down per client."""
    num_clients = data.offsets.shape[0] - 1
    correct = torch.zeros(num_clients, dtype=torch.float64, device=params.device)
    loss_sum = torch.zeros_like(correct)
    w = params.unsqueeze(0)
    bufs = None if buffers is None else buffers.unsqueeze(0)
    chunk = model.policy.eval_rows(chunk, model.forward_flops)
    classes = model.num_classes if not data.y.is_floating_point() and model.num_classes > 1 else 0
    class_correct = torch.zeros(classes, dtype=torch.float64, device=params.device)
    class_count = torch.zeros_like(class_correct)
    for start in range(0, data.y.shape[0], chunk):
        x, y = slice_rows(data.x, start, start + chunk), data.y[start : start + chunk]
        owner = data.owner[start : start + chunk]
        with model.policy.autocast():
            logits = model.forward(w, x.unsqueeze(0), buffers=bufs)[0]
        logits = widened(logits)
        hits = model.correct(logits, y).double()
        correct.index_add_(0, owner, hits)
        loss_sum.index_add_(0, owner, model.sample_losses(logits, y).double())
        if classes:
            class_correct.index_add_(0, y, hits)
            class_count.index_add_(0, y, torch.ones_like(hits))
    per_class = (class_correct.cpu(), class_count.cpu()) if classes else (None, None)
    return ClientEval(correct.cpu(), loss_sum.cpu(), data.counts.double().cpu(), *per_class)


@torch.no_grad()
def evaluate_personal(
    model: BatchedModel,
    params: torch.Tensor,
    data: ClientTensors,
    *,
    buffers: torch.Tensor | None = None,
    width: int = 512,
) -> ClientEval:
    """Client c's model ``params[c]`` (with its BatchNorm statistics ``buffers[c]``) on client
    c's own samples, in eval mode, for all clients at once, ``width`` samples of each at a time."""
    num_clients = params.shape[0]
    correct = torch.zeros(num_clients, dtype=torch.float64, device=params.device)
    loss_sum = torch.zeros_like(correct)
    width = model.policy.eval_rows(width, model.forward_flops, num_clients)
    for start in range(0, data.max_count, width):
        x, y, valid = data.windows(start, min(width, data.max_count - start))
        with model.policy.autocast():
            logits = model.forward(params, x, buffers=buffers)
        logits = widened(logits)
        losses = model.sample_losses(logits, y)
        correct += (model.correct(logits, y) & valid).double().sum(1)
        loss_sum += (losses * valid).double().sum(1)
    return ClientEval(correct.cpu(), loss_sum.cpu(), data.counts.double().cpu())


def density(params: torch.Tensor, zero_threshold: float) -> float:
    """Fraction of entries with ``|x| > zero_threshold`` (the papers' "sparsity" = density),
    from :func:`~fedhp.comm.count_nonzero`'s exact counts (no ``[C, P]`` float64 temporary)."""
    if params.numel() == 0:
        return float("nan")
    rows = params.reshape(-1, params.shape[-1]) if params.dim() else params.reshape(1, 1)
    return float(count_nonzero(rows, zero_threshold).sum()) / params.numel()
