"""The sparse-learning metrics of a global model (models that ``report_objective``): the
training objective f(x) = Σ_i p_i f_i(x), support recovery against the true support and the
distance to the true model (where known)."""

from __future__ import annotations

import torch

from fedhp.engine.evaluate import ClientEval
from fedhp.engine.federation import Federation
from fedhp.engine.ops import normalized
from fedhp.models.base import BatchedModel


def sparse_learning_metrics(
    model: BatchedModel,
    w: torch.Tensor,
    train: ClientEval,
    weights: torch.Tensor,
    fed: Federation,
    zero_threshold: float = 0.0,
) -> dict[str, float]:
    """``objective`` (f_i = client i's mean training loss + regularizer, p_i = ``weights``
    normalized), ``support_size``, and where the data know them ``support_precision`` /
    ``support_recall`` (supp(x) vs the true support) and ``dist_to_true`` (‖x − x*‖)."""
    per_client = train.loss_sum / train.count.clamp(min=1)
    p = normalized(weights.detach().cpu().double())
    reg = float(model.regularizer(w.detach().unsqueeze(0))[0])
    row = {"objective": float(p @ per_client.double()) + reg}
    support = (w.abs() > zero_threshold).cpu()
    row["support_size"] = float(support.sum())
    if fed.true_support is not None:
        true = fed.true_support.cpu()
        hits = float((support & true).sum())
        row["support_precision"] = hits / max(float(support.sum()), 1.0)
        row["support_recall"] = hits / max(float(true.sum()), 1.0)
    if fed.true_params is not None:
        row["dist_to_true"] = float(torch.linalg.vector_norm(w.cpu() - fed.true_params.cpu()))
    return row
