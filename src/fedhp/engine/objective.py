"""The sparse-learning metrics of a global model: the training objective f(x) = Σ_i p_i f_i(x),
support recovery against the true support and the distance to the true model (where known)."""

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
