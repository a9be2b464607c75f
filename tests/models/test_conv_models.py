"""Conv models with BatchNorm: batched forms against their plain nn.Module references, parameter
counts, buffers (running statistics) and feature taps."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from torch import nn

from fedhp.engine.ops import sgd_steps
from fedhp.engine.reference import reference_local_sgd
from fedhp.models import MODELS, BatchedModel
from fedhp.models.feature_net import FeatureNet
from fedhp.models.layout import BufferLayout
from tests.policies import use_policy

TINY_VGG_BN = {"name": "vgg", "cfg": [4, "M", 8, "M"], "batch_norm": True}
# (options, input shape): tiny inputs keep the large models fast on CPU. ResNet-18 at 16x16 ends
# at 2x2 (BatchNorm over 1x1 maps of 4 samples is too ill-conditioned to compare at 1e-5); its
# 11 M parameters make it the one slow case.
CASES = [
    ({"name": "cnn2"}, (1, 28, 28)),
    (TINY_VGG_BN, (3, 8, 8)),
    pytest.param({"name": "resnet18"}, (3, 16, 16), marks=pytest.mark.slow),
]


def build(cfg: dict[str, object], shape: tuple[int, ...]) -> BatchedModel:
    return MODELS.build(cfg, "model").build(shape, 10)


def test_parameter_counts() -> None:
    """The papers' sizes, counted without training."""
    assert build({"name": "cnn2"}, (1, 28, 28)).num_params == 21_840
    resnet = build({"name": "resnet18"}, (3, 32, 32))
    assert resnet.num_params == 11_173_962  # "11.2 M" on CIFAR-10
    assert resnet.num_buffers == 2 * 4800  # mean and variance of 4,800 BN channels
    vgg11 = build({"name": "vgg", "cfg": "vgg11", "batch_norm": True}, (3, 32, 32))
    assert (vgg11.num_params, vgg11.num_buffers) == (9_231_114, 2 * 2752)
    assert build({"name": "vgg", "cfg": "vgg11"}, (3, 32, 32)).num_buffers == 0
    assert build({"name": "vgg", "cfg": "vgg16"}, (3, 32, 32)).num_params == 14_728_266 - 8448


@pytest.mark.parametrize(
    "cfg", [{"name": "resnet18"}, {"name": "vgg", "cfg": "vgg11", "batch_norm": True}], ids=str
)
def test_big_models_run_on_mnist_sized_inputs(cfg: dict[str, object]) -> None:
    """ResNet-18 pools globally; the named VGGs round pooled sizes up (28-14-7-4-2-1)."""
    model = build(cfg, (1, 28, 28))
    flat = model.init_params(0).unsqueeze(0)
    assert model.forward(flat, torch.randn(1, 2, 1, 28, 28)).shape == (1, 2, 10)


def test_buffer_layout_leaves_out_counters_and_refuses_cumulative_average() -> None:
    module = nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3))
    layout = BufferLayout(module)
    assert [s.name for s in layout.specs] == ["1.running_mean", "1.running_var"]
    assert layout.size == 6
    with pytest.raises(ValueError, match="momentum=None"):
        BufferLayout(nn.Sequential(nn.BatchNorm2d(3, momentum=None)))


@pytest.mark.parametrize(("cfg", "shape"), CASES, ids=lambda v: str(v))
def test_sgd_round_matches_reference_in_train_and_eval_mode(
    cfg: dict[str, object], shape: tuple[int, ...]
) -> None:
    """Two clients, two SGD steps (batch 4): parameters and running statistics agree with the
    per-client nn.Module loop within 1e-5; so do the train- and eval-mode forwards after it."""
    torch.manual_seed(0)
    model = build(cfg, shape)
    w0 = torch.stack([model.init_params(s) for s in range(2)])
    batches = [(torch.randn(2, 4, *shape), torch.randint(0, 10, (2, 4))) for _ in range(2)]
    b_vec = model.init_buffers().expand(2, -1).clone()
    b_ref = b_vec.clone()
    it: Iterator[tuple[torch.Tensor, torch.Tensor]] = iter(batches)
    vec, _ = sgd_steps(model, w0, lambda: next(it), 2, 0.1, buffers=b_vec)
    ref = reference_local_sgd(model, w0, batches, 0.1, buffers=b_ref)
    assert (vec - ref).abs().max().item() < 1e-5
    assert (vec - w0).abs().max().item() > 1e-3  # the steps really moved the model
    if model.num_buffers:
        assert (b_vec - b_ref).abs().max().item() < 1e-5
        assert (b_vec - model.init_buffers()).abs().max().item() > 1e-3  # statistics moved
    x = torch.randn(2, 5, *shape)
    for train in (True, False):
        bufs = b_vec.clone()
        out = model.forward(vec, x, buffers=bufs, train=train)
        for c in range(2):
            module = model.make_module(vec[c], b_ref[c]).train(train)
            torch.testing.assert_close(out[c], module(x[c]), atol=1e-5, rtol=1e-4)
            if train and model.num_buffers:  # the forward updated the statistics like PyTorch's
                expected = model.buffer_layout.flatten_module(module)
                torch.testing.assert_close(bufs[c], expected, atol=1e-5, rtol=1e-4)


def test_eval_uses_each_clients_own_statistics() -> None:
    model = build(TINY_VGG_BN, (3, 8, 8))
    w = model.init_params(0).expand(2, -1)
    bufs = model.init_buffers().expand(2, -1).clone()
    bufs[1] += 0.5  # client 1's running means and variances differ
    x = torch.randn(1, 3, 3, 8, 8).expand(2, -1, -1, -1, -1)
    out = model.forward(w, x, buffers=bufs)
    assert not torch.allclose(out[0], out[1])
    default = model.forward(w[:1], x[:1])  # no buffers: the initial statistics
    torch.testing.assert_close(default[0], out[0])


@pytest.mark.parametrize(
    ("cfg", "shape"),
    [
        ({"name": "cnn"}, (1, 28, 28)),
        ({"name": "vgg"}, (3, 32, 32)),
        ({"name": "cnn2"}, (1, 28, 28)),
        (TINY_VGG_BN, (3, 8, 8)),
        ({"name": "resnet18"}, (3, 8, 8)),
    ],
    ids=lambda v: str(v),
)
def test_feature_taps(cfg: dict[str, object], shape: tuple[int, ...]) -> None:
    """Logits and penultimate features in one differentiable forward; the head maps one to the
    other."""
    model = build(cfg, shape)
    flat = torch.stack([model.init_params(s) for s in range(2)])
    x = torch.randn(2, 3, *shape, requires_grad=True)
    logits, feats = model.forward_with_features(flat, x)
    assert logits.shape == (2, 3, 10) and feats.dim() == 3 and feats.shape[:2] == (2, 3)
    torch.testing.assert_close(logits, model.forward(flat, x))
    module = model.make_module(flat[1]).eval()
    assert isinstance(module, FeatureNet)
    torch.testing.assert_close(module.head(feats[1]), logits[1], atol=1e-5, rtol=1e-5)
    (grad,) = torch.autograd.grad(feats.norm(dim=-1).sum(), x)  # differentiable
    assert grad[0].abs().sum() > 0 and grad[1].abs().sum() > 0


@pytest.mark.parametrize("direct", [False, True])
def test_weighted_batch_statistics_leave_padding_out(
    direct: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Training-mode taps with per-sample weights (0 = padding): the real samples' outputs and
    the updated running statistics equal PyTorch's BatchNorm on the real samples alone."""
    model = build(TINY_VGG_BN, (3, 8, 8))
    if direct:  # one client without vmap, as the engine runs large models
        use_policy(model, direct_min_params=1)
    clients = 1 if direct else 2
    flat = torch.stack([model.init_params(s) for s in range(clients)])
    x = torch.randn(clients, 5, 3, 8, 8)
    weight = torch.tensor([[1.0, 1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 1.0, 1.0, 1.0]])[:clients]
    bufs = model.init_buffers().expand(clients, -1).clone()
    logits, feats = model.forward_with_features(flat, x, buffers=bufs, train=True, weight=weight)
    for c in range(clients):
        keep = weight[c] > 0
        module = model.make_module(flat[c]).train()
        assert isinstance(module, FeatureNet)
        ref_logits, ref_feats = module(x[c][keep], features=True)
        torch.testing.assert_close(logits[c][keep], ref_logits, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(feats[c][keep], ref_feats, atol=1e-5, rtol=1e-4)
        expected = model.buffer_layout.flatten_module(module)
        torch.testing.assert_close(bufs[c], expected, atol=1e-5, rtol=1e-4)


def test_cnn2_dropout_is_off_by_default_and_random_when_on() -> None:
    x = torch.randn(2, 4, 1, 28, 28)
    off = build({"name": "cnn2"}, (1, 28, 28))
    w = off.init_params(0).expand(2, -1)
    torch.testing.assert_close(off.forward(w, x, train=True), off.forward(w, x, train=True))
    on = build({"name": "cnn2", "dropout": 0.5}, (1, 28, 28))
    assert not torch.equal(on.forward(w, x, train=True), on.forward(w, x, train=True))
    torch.testing.assert_close(on.forward(w, x), off.forward(w, x))  # eval: no dropout
