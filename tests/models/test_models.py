"""The batched model forms agree with their plain nn.Module references."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedhp.errors import ConfigError
from fedhp.models import MODELS, BatchedModel
from fedhp.models.zoo import relu_backward, softmax_cross_entropy

CASES = [
    ({"name": "mlr"}, (1, 28, 28)),
    ({"name": "dnn"}, (1, 28, 28)),
    ({"name": "dnn", "hidden": [500, 200]}, (1, 28, 28)),
    ({"name": "cnn"}, (1, 28, 28)),
    ({"name": "vgg"}, (3, 32, 32)),
]


def test_paper_parameter_counts() -> None:
    dnn = MODELS.build({"name": "dnn", "hidden": [100]}, "model").build((1, 28, 28), 10)
    big = MODELS.build({"name": "dnn", "hidden": [500, 200]}, "model").build((1, 28, 28), 10)
    mlr = MODELS.build({"name": "mlr"}, "model").build((1, 28, 28), 10)
    assert (dnn.num_params, big.num_params, mlr.num_params) == (79_510, 494_710, 7_850)


@pytest.mark.parametrize(("cfg", "shape"), CASES, ids=lambda v: str(v))
def test_batched_forward_matches_reference(cfg: dict[str, object], shape: tuple[int, ...]) -> None:
    model = MODELS.build(cfg, "model").build(shape, 10)
    flat = torch.stack([model.init_params(s) for s in range(3)])
    x = torch.randn(3, 4, *shape)
    out = model.forward(flat, x)
    assert out.shape == (3, 4, 10)
    for c in range(3):
        ref = model.make_module(flat[c])(x[c])
        torch.testing.assert_close(out[c], ref, atol=1e-5, rtol=1e-5)


def test_layout_round_trip() -> None:
    model = MODELS.build({"name": "cnn"}, "model").build((1, 28, 28), 10)
    flat = model.init_params(3)
    assert torch.equal(model.layout.flatten_module(model.make_module(flat)), flat)
    assert not torch.equal(model.init_params(4), flat)


def test_vgg_rejects_too_many_pools() -> None:
    with pytest.raises(ConfigError, match="model.cfg"):
        MODELS.build({"name": "vgg", "cfg": [8, "M"] * 6}, "model").build((1, 28, 28), 10)


def test_conv_models_need_images() -> None:
    with pytest.raises(ConfigError, match="model.name"):
        MODELS.build({"name": "cnn"}, "model").build((60,), 10)


def test_mlp_features_are_the_last_layer_input() -> None:
    model = MODELS.build({"name": "dnn", "hidden": [32]}, "model").build((1, 28, 28), 10)
    flat = torch.stack([model.init_params(s) for s in range(2)])
    x = torch.randn(2, 5, 1, 28, 28)
    logits, feats = model.forward_with_features(flat, x)  # type: ignore[attr-defined]
    assert feats.shape == (2, 5, 32) and bool((feats >= 0).all())  # post-ReLU
    module = model.make_module(flat[1])
    torch.testing.assert_close(module.layers[-1](feats[1]), logits[1])


def test_hand_written_backward_matches_autograd() -> None:
    model = MODELS.build({"name": "dnn", "hidden": [64, 32]}, "model").build((1, 28, 28), 10)
    flat = torch.stack([model.init_params(s) for s in range(3)])
    x, y = torch.randn(3, 7, 1, 28, 28), torch.randint(0, 10, (3, 7))
    loss, grad = model.loss_and_grad(flat, x, y)
    generic_loss, generic_grad = BatchedModel.loss_and_grad(model, flat, x, y)
    torch.testing.assert_close(loss, generic_loss)
    torch.testing.assert_close(grad, generic_grad, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", ["cnn2", "dnn"])
def test_loss_grad_correct_is_loss_and_grad_plus_the_forwards_predictions(name: str) -> None:
    model = MODELS.get(name)().build((1, 28, 28), 10)
    g = torch.Generator().manual_seed(0)
    flat = model.init_params(0).expand(3, -1).clone() + 0.01 * torch.randn(
        3, model.num_params, generator=g
    )
    x = torch.randn(3, 5, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (3, 5), generator=g)
    weight = torch.ones(3, 5)
    weight[1, 3:] = 0
    loss, grad, correct = model.loss_grad_correct(flat, x, y, weight=weight)
    ref_loss, ref_grad = model.loss_and_grad(flat, x, y, weight=weight)
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(grad, ref_grad)
    assert torch.equal(correct, model.correct(model.forward(flat, x), y))


@pytest.mark.parametrize(
    "cfg", [{"name": "mlr"}, {"name": "dnn", "hidden": [64, 32]}, {"name": "cnn2"}]
)
def test_sgd_step_is_loss_and_grad_then_a_step(cfg: dict[str, object]) -> None:
    """The fused step (MLPs: inside the backward pass) moves every client's rows by
    ``-lr * grad`` of its own loss, layer by layer: the old weights pass ``delta`` down."""
    model = MODELS.build(cfg, "model").build((1, 28, 28), 10)
    g = torch.Generator().manual_seed(1)
    flat = model.init_params(0).expand(3, -1).clone()
    flat += 0.05 * torch.randn(flat.shape, generator=g)
    x, y = torch.randn(3, 6, 1, 28, 28, generator=g), torch.randint(0, 10, (3, 6), generator=g)
    loss, grad = model.loss_and_grad(flat, x, y)
    stepped = flat.clone()
    step_loss = model.sgd_step(stepped, x, y, 0.5)
    torch.testing.assert_close(step_loss, loss)
    torch.testing.assert_close(stepped, flat - 0.5 * grad, atol=1e-6, rtol=1e-5)
    assert not torch.equal(stepped, flat)


@pytest.mark.parametrize("cfg", [{"name": "dnn", "hidden": [64, 32]}, {"name": "cnn2"}])
def test_sgd_step_applies_the_column_hook_before_each_parameters_step(
    cfg: dict[str, object],
) -> None:
    """``before(lo, hi)`` sees every parameter's columns once, with the gradient taken at the
    old values: a proximal pull inside the step is ``lerp(theta, c, a) - lr * grad(theta)``."""
    model = MODELS.build(cfg, "model").build((1, 28, 28), 10)
    g = torch.Generator().manual_seed(2)
    flat = model.init_params(0).expand(2, -1).clone()
    center = flat + 0.1 * torch.randn(flat.shape, generator=g)
    x, y = torch.randn(2, 4, 1, 28, 28, generator=g), torch.randint(0, 10, (2, 4), generator=g)
    _, grad = model.loss_and_grad(flat, x, y)
    seen: list[tuple[int, int]] = []
    stepped = flat.clone()

    def pull(lo: int, hi: int) -> None:
        seen.append((lo, hi))
        stepped[:, lo:hi].lerp_(center[:, lo:hi], 0.3)

    model.sgd_step(stepped, x, y, 0.5, pull)
    assert sorted(seen) == [(s.offset, s.offset + s.numel) for s in model.layout.specs]
    expected = torch.lerp(flat, center, 0.3) - 0.5 * grad
    torch.testing.assert_close(stepped, expected, atol=1e-6, rtol=1e-5)


def test_softmax_cross_entropy_is_pytorchs_loss_and_its_gradient() -> None:
    """The MLPs' five-kernel cross-entropy equals ``F.cross_entropy`` per sample and its logit
    derivative ``softmax - onehot``, also for logits far from zero (the max is shifted out)."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 7, 10, generator=g) * torch.tensor([1.0, 30.0, 300.0]).view(3, 1, 1)
    y = torch.randint(0, 10, (3, 7), generator=g)
    loss, delta = softmax_cross_entropy(logits, y.unsqueeze(2))
    leaf = logits.clone().requires_grad_()
    ref = F.cross_entropy(leaf.reshape(-1, 10), y.reshape(-1), reduction="none").view(3, 7)
    (ref_delta,) = torch.autograd.grad(ref.sum(), leaf)
    torch.testing.assert_close(loss, ref.detach())
    torch.testing.assert_close(delta, ref_delta)
    assert bool(torch.isfinite(loss).all())


def test_relu_backward_passes_the_gradient_where_the_output_is_positive() -> None:
    grad = torch.tensor([1.0, -2.0, 3.0, 4.0])
    out = torch.tensor([0.5, 0.0, 0.0, 2.0])  # a ReLU's outputs: 0 where the input was <= 0
    assert relu_backward(grad, out).tolist() == [1.0, 0.0, 0.0, 4.0]
