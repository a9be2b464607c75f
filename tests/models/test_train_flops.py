"""Training FLOPs per sample (``fedhp.models.flops.training_flops``): what the engine's kernels
compute — forward, and backward with respect to the parameters only (no input gradient for the
first layer) — as FlopCounterMode counts it, checked against hand counts."""

from __future__ import annotations

import pytest
import torch

from fedhp.models import MODELS
from fedhp.models.base import BatchedModel
from fedhp.models.flops import _training_flops

MNIST = (1, 28, 28)
CIFAR = (3, 32, 32)


def build(shape: tuple[int, ...], **options: object) -> BatchedModel:
    return MODELS.build(options, "model").build(shape, 10)


def linear(n_in: int, n_out: int) -> int:
    """FlopCounterMode's count of one ``Linear(n_in, n_out)`` product for one sample: 2 per
    multiply-add; the bias addition is not counted (``addmm`` counts its product only)."""
    return 2 * n_in * n_out


def conv(c_in: int, c_out: int, k: int, out_side: int) -> int:
    """FlopCounterMode's count of one ``k x k`` convolution's forward for one sample."""
    return 2 * c_in * c_out * k * k * out_side * out_side


def test_dnn100_is_the_hand_count() -> None:
    """784-100-10: forward 2·784·100 + 2·100·10 = 158,800; backward: both weight gradients
    (156,800 + 2,000) and the second layer's input gradient (2,000), not the first layer's
    (156,800, which 3× forward would count): 319,600, 1.49× less than 3× forward's 476,400."""
    model = build(MNIST, name="dnn", hidden=[100])
    forward = linear(784, 100) + linear(100, 10)
    assert forward == 158_800 == model.flops_per_sample()
    backward = linear(784, 100) + 2 * linear(100, 10)
    assert model.train_flops_per_sample() == forward + backward == 319_600
    assert 3 * model.flops_per_sample() - model.train_flops_per_sample() == linear(784, 100)


def test_dnn_500_200_is_the_hand_count() -> None:
    model = build(MNIST, name="dnn", hidden=[500, 200])
    layers = [linear(784, 500), linear(500, 200), linear(200, 10)]
    assert model.train_flops_per_sample() == 3 * sum(layers) - layers[0] == 2_180_000


def test_mlr_counts_the_weight_gradient_only() -> None:
    """MLR (784 → 10): forward 15,680 and the weight gradient 15,680, no input gradient at all:
    2× forward (3× forward overstates it by 1.5×)."""
    model = build(MNIST, name="mlr")
    assert model.train_flops_per_sample() == 2 * linear(784, 10) == 31_360
    assert model.train_flops_per_sample() == 2 * model.flops_per_sample()


def test_sparse_learning_softmax_counts_the_weight_gradient_only() -> None:
    """The closed-form linear models (no bias; flat features, e.g. LibSVM's): 2 × d × c twice."""
    model = build((60,), name="softmax")
    assert model.train_flops_per_sample() == 2 * linear(60, 10) == 2_400


@pytest.mark.parametrize(
    ("options", "shape", "first"),
    [
        ({"name": "cnn2"}, MNIST, conv(1, 10, 5, 24)),  # conv 1→10 5×5, no padding: 24×24
        ({"name": "vgg", "cfg": "vgg11", "batch_norm": True}, CIFAR, conv(3, 64, 3, 32)),
        ({"name": "resnet18"}, CIFAR, conv(3, 64, 3, 32)),
    ],
    ids=["cnn2", "vgg11-bn", "resnet18"],
)
def test_conv_models_skip_only_the_first_layers_input_gradient(
    options: dict[str, object], shape: tuple[int, ...], first: int
) -> None:
    """Every convolution and matrix product costs its forward three times (forward, input and
    weight gradients) except the first convolution, whose input gradient is never computed:
    training = 3 × forward − the first convolution's forward (BatchNorm is not counted)."""
    model = build(shape, **options)
    assert model.train_flops_per_sample() == 3 * model.flops_per_sample() - first


def test_meta_and_cpu_counts_agree_and_are_per_sample() -> None:
    """The count runs on the meta device; real tensors (the fallback) and other batch sizes give
    the same per-sample figure."""
    model = build(MNIST, name="cnn2")
    meta = model.train_flops_per_sample()
    for batch in (2, 3):
        assert _training_flops(model.reference, MNIST, batch, torch.device("cpu")) == meta


def test_the_count_leaves_the_reference_module_alone() -> None:
    model = build(MNIST, name="dnn", hidden=[100])
    before = [p.clone() for p in model.reference.parameters()]
    model.train_flops_per_sample()
    assert all(p.grad is None for p in model.reference.parameters())
    assert all(p.device.type == "cpu" for p in model.reference.parameters())
    for p, q in zip(before, model.reference.parameters(), strict=True):
        assert torch.equal(p, q)


def test_train_flops_is_samples_times_the_per_sample_count() -> None:
    model = build(MNIST, name="dnn", hidden=[100])
    assert model.trained_samples == 0 and model.train_flops == 0
    model.count_trained(torch.zeros(3, 7, *MNIST))
    model.count_trained(torch.zeros(2, 5, *MNIST))
    assert model.trained_samples == 31
    assert model.train_flops == 31 * 319_600
