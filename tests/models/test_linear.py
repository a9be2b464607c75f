"""The Fed-HT paper's linear losses: closed-form gradients against autograd, sparse inputs equal
dense ones, evaluation hooks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedhp.errors import ConfigError
from fedhp.models import MODELS

C, B, D = 3, 7, 5


def reference_loss(name: str, w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, lam: float):
    """Per-client loss written from the paper's formulas (App. B)."""
    if name == "linreg":
        return ((y - x @ w) ** 2).mean()
    if name == "logreg":
        s = x @ w
        return (torch.log1p(torch.exp(s)) - y * s).mean() + lam / 2 * w.pow(2).sum()
    logits = x @ w.view(3, D).T
    return F.cross_entropy(logits, y) + sum(
        lam / 2 * w.view(3, D)[r].pow(2).sum() for r in range(3)
    )


@pytest.mark.parametrize("name", ["linreg", "logreg", "softmax"])
def test_loss_and_grad_match_the_formulas(name: str) -> None:
    g = torch.Generator().manual_seed(0)
    classes = {"linreg": 1, "logreg": 2, "softmax": 3}[name]
    cfg = {"name": name} if name == "linreg" else {"name": name, "lam": 0.3}
    model = MODELS.build(cfg, "model").build((D,), classes)
    lam = getattr(model, "lam", 0.0)
    flat = torch.randn(C, model.num_params, generator=g)
    x = torch.randn(C, B, D, generator=g)
    if name == "linreg":
        y = torch.randn(C, B, generator=g)
    else:
        y = torch.randint(0, classes, (C, B), generator=g)
    loss, grad = model.loss_and_grad(flat, x, y)
    for c in range(C):
        w = flat[c].clone().requires_grad_(True)
        yc = y[c].float() if name == "logreg" else y[c]
        ref = reference_loss(name, w, x[c], yc, lam)
        (ref_grad,) = torch.autograd.grad(ref, w)
        torch.testing.assert_close(loss[c], ref.detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(grad[c], ref_grad, rtol=1e-5, atol=1e-6)
    # a sparse COO input gives the same logits, losses and gradients
    x[x.abs() < 0.7] = 0
    dense = model.loss_and_grad(flat, x, y)
    sparse = model.loss_and_grad(flat, x.to_sparse(), y)
    torch.testing.assert_close(sparse[0], dense[0])
    torch.testing.assert_close(sparse[1], dense[1])


def test_evaluation_hooks_and_errors() -> None:
    reg = MODELS.build({"name": "linreg"}, "model").build((D,), 1)
    logits, y = torch.tensor([[1.0], [3.0]]), torch.tensor([0.5, 1.0])
    assert reg.sample_losses(logits, y).tolist() == [0.25, 4.0]
    assert not bool(reg.correct(logits, y).any())
    log = MODELS.build({"name": "logreg", "lam": 0.0}, "model").build((D,), 2)
    assert log.correct(torch.tensor([[2.0], [-1.0]]), torch.tensor([1, 1])).tolist() == [
        True,
        False,
    ]
    assert log.regularizer(torch.ones(2, D)).tolist() == [0.0, 0.0]
    with pytest.raises(ConfigError, match="logreg needs 2 classes"):
        MODELS.build({"name": "logreg"}, "model").build((D,), 3)
    soft = MODELS.build({"name": "softmax", "lam": 2.0}, "model").build((1, 2, 2), 3)
    assert soft.sparsity_groups == 3 and soft.num_params == 12
    assert soft.regularizer(torch.ones(12)).item() == 12.0


def test_evaluation_of_image_shaped_inputs() -> None:
    """MNIST's [1, 28, 28] features: evaluation sizes its chunks from the FLOPs without feeding
    the unflattened shape to the reference nn.Linear, and FlopCounterMode agrees on the count."""
    from torch.utils.flop_counter import FlopCounterMode

    from fedhp.engine.evaluate import evaluate_shared
    from fedhp.engine.federation import ClientTensors

    soft = MODELS.build({"name": "softmax"}, "model").build((1, 2, 2), 3)
    counter = FlopCounterMode(display=False)
    with counter:
        soft.reference(torch.zeros(1, 4))
    assert soft.flops_per_sample() == counter.get_total_flops() == 2 * 4 * 3
    x, y = torch.randn(6, 1, 2, 2), torch.tensor([0, 1, 2, 0, 1, 2])
    data = ClientTensors.from_parts([x[:4], x[4:]], [y[:4], y[4:]], torch.device("cpu"))
    flat = torch.randn(12)
    result = evaluate_shared(soft, flat, data)
    logits = x.reshape(6, 4) @ flat.view(3, 4).T
    expected = F.cross_entropy(logits, y, reduction="sum").double()
    torch.testing.assert_close(result.loss_sum.sum(), expected)


def test_training_flops_of_image_shaped_inputs() -> None:
    """The training count on [1, 2, 2] features: PyTorch's count of a forward and the weight
    gradient of the flattened product (no input gradient), 4·d·out."""
    from fedhp.models.flops import training_flops

    soft = MODELS.build({"name": "softmax"}, "model").build((1, 2, 2), 3)
    assert soft.train_flops_per_sample() == training_flops(soft.reference, (4,)) == 4 * 4 * 3
