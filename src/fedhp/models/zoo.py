"""The model zoo: MLR, DNN (MLP), the MNIST CNNs, VGG (optionally with BatchNorm) and ResNet-18.

Each entry is a pydantic options model registered in :data:`MODELS` whose ``build`` returns a
:class:`~fedhp.models.base.BatchedModel`.
"""

from __future__ import annotations

from math import prod
from typing import TYPE_CHECKING, Literal

import pydantic
import torch
from pydantic_core import PydanticCustomError
from torch import nn

from fedhp.errors import ConfigError
from fedhp.models.base import BatchedModel, ColumnHook, FeatureOptions, ForwardOptions, LossOptions
from fedhp.models.client_mean import sample_weight_totals, weighted_client_mean
from fedhp.models.feature_net import FeatureNet
from fedhp.models.policy import SMALL_LAYER
from fedhp.models.vmap import VmapModel
from fedhp.registry import Registry

if TYPE_CHECKING:
    from typing_extensions import Unpack


class ModelOptions(pydantic.BaseModel):
    """Base of every model's options."""

    model_config = pydantic.ConfigDict(extra="forbid", allow_inf_nan=False)

    def build(self, feature_shape: tuple[int, ...], num_classes: int) -> BatchedModel:
        raise NotImplementedError


MODELS: Registry[ModelOptions] = Registry("model")


class MLP(FeatureNet):
    """Flatten, then Linear/ReLU layers; no activation after the last layer."""

    def __init__(self, sizes: list[int]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes, sizes[1:], strict=False))

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        h = x.flatten(1)
        for layer in self.layers[:-1]:
            h = torch.relu(layer(h))
        return h

    def head(self, h: torch.Tensor) -> torch.Tensor:
        return self.layers[-1](h)


def softmax_cross_entropy(
    logits: torch.Tensor, target: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample cross-entropy ``[C, B]`` of ``logits [C, B, K]`` at ``target [C, B, 1]`` and
    its derivative ``softmax - onehot`` ``[C, B, K]``, from one exponential of the shifted logits
    (what ``log_softmax`` computes, in five small kernels: PyTorch's last-dim ``log_softmax`` is
    ~10x slower than them for K = 10)."""
    shifted = logits - logits.amax(2, keepdim=True)
    exp = shifted.exp()
    total = exp.sum(2, keepdim=True)
    loss = (total.log() - shifted.gather(2, target)).squeeze(2)
    delta = exp.div_(total)
    delta.scatter_add_(2, target, torch.full_like(target, -1, dtype=delta.dtype))
    return loss, delta


def weight_step_(
    w: torch.Tensor,
    delta: torch.Tensor,
    h_in: torch.Tensor,
    lr: float,
    small_layer: int = SMALL_LAYER,
) -> None:
    """``w -= lr * deltaᵀ h_in`` per client, in place (``w [C, out, in]``, ``delta [C, B, out]``,
    ``h_in [C, B, in]``), with the faster kernel for the layer's size (up to ``small_layer``
    entries per client: ``bmm`` then ``add_``; the run's
    :attr:`~fedhp.models.policy.ExecutionPolicy.small_layer`)."""
    if w[0].numel() > small_layer:
        w.baddbmm_(delta.transpose(1, 2), h_in, alpha=-lr)
    else:
        w.add_(torch.bmm(delta.transpose(1, 2), h_in), alpha=-lr)


def relu_backward(grad: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``grad`` where the ReLU's output ``out`` is positive, else 0 (one kernel, no bool mask)."""
    return torch.ops.aten.threshold_backward(grad, out, 0)


class BatchedMLP(BatchedModel):
    """Hand-batched MLP: one ``baddbmm`` per layer over the client dimension, and a hand-written
    backward pass that writes each layer's gradient straight into the flat ``[C, P]`` buffer."""

    rows_independent = True

    def _layers(self, flat: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        specs = self.layout.specs
        return [
            (self.layout.view(flat, specs[2 * i]), self.layout.view(flat, specs[2 * i + 1]))
            for i in range(len(specs) // 2)
        ]  # (weight [C, out, in], bias [C, out]) per layer

    def _activations(self, flat: torch.Tensor, x: torch.Tensor) -> list[torch.Tensor]:
        """Inputs of every layer followed by the logits."""
        layers = self._layers(flat)
        h = x.reshape(x.shape[0], x.shape[1], -1)
        acts = [h]
        for i, (w, b) in enumerate(layers):
            h = torch.baddbmm(b.unsqueeze(1), h, w.transpose(1, 2))
            if i < len(layers) - 1:
                h.relu_()
            acts.append(h)
        return acts

    def forward(
        self, flat: torch.Tensor, x: torch.Tensor, **opts: Unpack[ForwardOptions]
    ) -> torch.Tensor:
        return self._activations(flat, x)[-1]

    def forward_with_features(
        self, flat: torch.Tensor, x: torch.Tensor, **opts: Unpack[FeatureOptions]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits ``[C, B, K]`` and the penultimate features ``[C, B, H]`` (the last layer's
        input), differentiable, for feature-level penalties such as feature-norm regularization."""
        acts = self._activations(flat, x)
        return acts[-1], acts[-2]

    def _loss_delta(
        self, flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor | None
    ) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
        """The layers' inputs, the per-client (weighted) mean cross-entropy ``[C]`` and its
        derivative with respect to the logits ``[C, B, K]``."""
        acts = self._activations(flat, x)
        b = y.shape[1]
        target = y.unsqueeze(2)
        loss, delta = softmax_cross_entropy(acts[-1], target)
        loss = weighted_client_mean(loss, weight)
        if weight is None:
            delta.div_(b)  # d(mean loss)/d(logits)
        else:  # d(weighted mean loss)/d(logits)
            delta.mul_((weight / sample_weight_totals(weight).unsqueeze(1)).unsqueeze(2))
        return acts, loss, delta

    def sgd_step(
        self,
        flat: torch.Tensor,
        x: torch.Tensor,
        y: torch.Tensor,
        lr: float,
        before: ColumnHook | None = None,
    ) -> torch.Tensor:
        """The SGD step inside the backward pass: each layer's ``W -= lr * delta^T h`` is one
        ``baddbmm`` into the flat rows (after the layer's old weights have passed ``delta`` on,
        and after ``before`` on the layer's columns), so no ``[C, P]`` gradient is written and
        read back. Equal to ``loss_and_grad`` then ``flat -= lr * grad`` up to rounding (one
        rounding of the update instead of two). Under ``precision=bf16`` the generic autograd
        step under autocast instead (:meth:`BatchedModel.sgd_step`)."""
        if self.policy.bf16:
            return super().sgd_step(flat, x, y, lr, before)
        with torch.no_grad(), self.policy.autocast():  # (tf32: its matmul flags)
            acts, loss, delta = self._loss_delta(flat, x, y, None)
            specs = self.layout.specs
            layers = self._layers(flat)
            for i in reversed(range(len(layers))):
                w, b = layers[i]
                h_in = acts[i]
                below = relu_backward(torch.bmm(delta, w), h_in) if i > 0 else delta
                if before is not None:
                    for spec in (specs[2 * i], specs[2 * i + 1]):
                        before(spec.offset, spec.offset + spec.numel)
                b.sub_(delta.sum(1), alpha=lr)
                weight_step_(w, delta, h_in, lr, self.policy.small_layer)
                delta = below
            return loss

    def loss_and_grad(
        self, flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor, **opts: Unpack[LossOptions]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.policy.bf16:  # the generic autograd path under autocast
            return super().loss_and_grad(flat, x, y, **opts)
        loss, grad, _ = self._loss_grad_logits(flat, x, y, opts.get("weight"))
        return loss, grad

    def loss_grad_correct(
        self, flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor, **opts: Unpack[LossOptions]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`loss_and_grad` and each sample's correctness from the same forward pass."""
        if self.policy.bf16:
            return super().loss_grad_correct(flat, x, y, **opts)
        loss, grad, logits = self._loss_grad_logits(flat, x, y, opts.get("weight"))
        return loss, grad, self.correct(logits, y)

    def _loss_grad_logits(
        self, flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        with torch.no_grad(), self.policy.autocast():  # (tf32: its matmul flags)
            acts, loss, delta = self._loss_delta(flat, x, y, weight)
            grad = torch.empty_like(flat)
            layers = self._layers(flat)
            grads = self._layers(grad)
            for i in reversed(range(len(layers))):
                h_in = acts[i]
                torch.bmm(delta.transpose(1, 2), h_in, out=grads[i][0])
                torch.sum(delta, dim=1, out=grads[i][1])
                if i > 0:
                    delta = relu_backward(torch.bmm(delta, layers[i][0]), h_in)
            return loss, grad, acts[-1]


@MODELS.register("mlr")
class MLROptions(ModelOptions):
    """Multinomial logistic regression (one linear layer): the strongly convex case."""

    def build(self, feature_shape: tuple[int, ...], num_classes: int) -> BatchedModel:
        return BatchedMLP(MLP([prod(feature_shape), num_classes]), feature_shape, num_classes)


@MODELS.register("dnn")
class DNNOptions(ModelOptions):
    """Fully connected ReLU network. ``hidden=[100]`` is 784-100-10 (79,510 parameters on MNIST);
    ``hidden=[500, 200]`` is 784-500-200-10 (494,710 parameters)."""

    hidden: list[pydantic.PositiveInt] = [100]

    @pydantic.field_validator("hidden")
    @classmethod
    def _some_hidden_layer(cls, value: list[int]) -> list[int]:
        if not value:  # (no hidden layer is mlr, under its own name)
            raise PydanticCustomError(
                "dnn_no_hidden",
                "[] leaves no hidden layer, which is the linear model mlr; use model.name=mlr, "
                "or give hidden widths, e.g. model.hidden=[100]",
            )
        return value

    def build(self, feature_shape: tuple[int, ...], num_classes: int) -> BatchedModel:
        sizes = [prod(feature_shape), *self.hidden, num_classes]
        return BatchedMLP(MLP(sizes), feature_shape, num_classes)


class MnistCNN(FeatureNet):
    """The CNN of McMahan et al. (2017): two 5x5 conv layers (32, 64) with max-pooling, FC 512."""

    def __init__(self, in_channels: int, side: int, num_classes: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 32, 5, padding=2)
        self.conv2 = nn.Conv2d(32, 64, 5, padding=2)
        self.fc1 = nn.Linear(64 * (side // 4) * (side // 4), 512)
        self.fc2 = nn.Linear(512, num_classes)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        h = torch.max_pool2d(torch.relu(self.conv2(h)), 2)
        return torch.relu(self.fc1(h.flatten(-3)))

    def head(self, h: torch.Tensor) -> torch.Tensor:
        return self.fc2(h)


def _image_shape(feature_shape: tuple[int, ...], model: str) -> tuple[int, int, int]:
    if len(feature_shape) != 3:
        raise ConfigError(
            f"model.name: {model!r} needs image data [C,H,W], got features {feature_shape}; "
            "use mlr or dnn"
        )
    c, h, w = feature_shape
    return c, h, w


@MODELS.register("cnn")
class CNNOptions(ModelOptions):
    """The MNIST CNN (McMahan et al. 2017)."""

    def build(self, feature_shape: tuple[int, ...], num_classes: int) -> BatchedModel:
        c, h, _ = _image_shape(feature_shape, "cnn")
        return VmapModel(MnistCNN(c, h, num_classes), feature_shape, num_classes)


class FedLPSCNN(FeatureNet):
    """FedLPS's MNIST CNN: conv 1→10 5×5, max-pool, conv 10→20 5×5, (dropout), max-pool,
    FC 320→50→10 with ReLUs (no padding; 21,840 parameters on MNIST). ``dropout`` is the
    probability of the code's Dropout2d after conv2 and dropout after fc1 (0: off)."""

    def __init__(self, in_channels: int, side: int, num_classes: int, dropout: float) -> None:
        super().__init__()
        spatial = ((side - 4) // 2 - 4) // 2
        if spatial < 1:
            raise ConfigError(f"model.name: 'cnn2' needs inputs of at least 16x16, got {side}")
        self.conv1 = nn.Conv2d(in_channels, 10, 5)
        self.conv2 = nn.Conv2d(10, 20, 5)
        self.conv2_drop = nn.Dropout2d(dropout)
        self.fc1 = nn.Linear(20 * spatial * spatial, 50)
        self.drop = nn.Dropout(dropout)
        self.fc2 = nn.Linear(50, num_classes)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(torch.max_pool2d(self.conv1(x), 2))
        h = torch.relu(torch.max_pool2d(self.conv2_drop(self.conv2(h)), 2))
        return self.drop(torch.relu(self.fc1(h.flatten(-3))))

    def head(self, h: torch.Tensor) -> torch.Tensor:
        return self.fc2(h)


@MODELS.register("cnn2")
class CNN2Options(ModelOptions):
    """FedLPS's MNIST CNN (conv 10, conv 20, FC 320-50-10; 21,840 parameters on MNIST)."""

    dropout: float = pydantic.Field(0.0, ge=0, lt=1, description="the code's p=0.5; 0: off")

    def build(self, feature_shape: tuple[int, ...], num_classes: int) -> BatchedModel:
        c, h, _ = _image_shape(feature_shape, "cnn2")
        return VmapModel(FedLPSCNN(c, h, num_classes, self.dropout), feature_shape, num_classes)


_VGG_CFGS: dict[str, list[int | str]] = {
    "vgg11": [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "vgg13": [64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "vgg16": [
        *(64, 64, "M", 128, 128, "M", 256, 256, 256, "M"),
        *(512, 512, 512, "M", 512, 512, 512, "M"),
    ],
}
"""Simonyan & Zisserman's configurations A, B, D (the CIFAR form: one linear classifier)."""


class VGG(FeatureNet):
    """VGG-style network from a cfg list: ints are 3x3 conv widths (each followed by BatchNorm
    when ``batch_norm``, then ReLU), ``"M"`` is 2x2 max-pooling (rounding up with
    ``ceil_pool``); one linear classifier."""

    def __init__(
        self,
        cfg: list[int | str],
        in_channels: int,
        side: int,
        num_classes: int,
        batch_norm: bool = False,
        ceil_pool: bool = False,
    ):
        super().__init__()
        layers: list[nn.Module] = []
        ch, spatial = in_channels, side
        for item in cfg:
            if item == "M":
                layers.append(nn.MaxPool2d(2, ceil_mode=ceil_pool))
                spatial = -(-spatial // 2) if ceil_pool else spatial // 2
            else:
                width = int(item)
                layers.append(nn.Conv2d(ch, width, 3, padding=1))
                if batch_norm:
                    layers.append(nn.BatchNorm2d(width))
                layers.append(nn.ReLU())
                ch = width
        if spatial < 1:
            raise ConfigError(
                f"model.cfg: too many 'M' pools for {side}x{side} inputs; remove some pools"
            )
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(ch * spatial * spatial, num_classes)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x).flatten(-3)

    def head(self, h: torch.Tensor) -> torch.Tensor:
        return self.classifier(h)


@MODELS.register("vgg")
class VGGOptions(ModelOptions):
    """VGG from a cfg list or a name (vgg11, vgg13, vgg16); the sFedHP paper's CIFAR-10 model is
    the default cfg. ``batch_norm``: BatchNorm after every conv (FedLPS's VGG-BN)."""

    cfg: list[pydantic.PositiveInt | Literal["M"]] | Literal["vgg11", "vgg13", "vgg16"] = [
        16,
        "M",
        32,
        "M",
        64,
        "M",
        128,
        "M",
        128,
        "M",
    ]
    batch_norm: bool = False

    def build(self, feature_shape: tuple[int, ...], num_classes: int) -> BatchedModel:
        c, h, _ = _image_shape(feature_shape, "vgg")
        cfg: list[int | str] = _VGG_CFGS[self.cfg] if isinstance(self.cfg, str) else [*self.cfg]
        # Named configs round pooled sizes up, so 28x28 inputs also reach 1x1 (28-14-7-4-2-1);
        # on 32x32 (the configs' CIFAR setting) nothing changes.
        module = VGG(cfg, c, h, num_classes, self.batch_norm, ceil_pool=isinstance(self.cfg, str))
        return VmapModel(module, feature_shape, num_classes)


@MODELS.register("resnet18")
class ResNet18Options(ModelOptions):
    """ResNet-18, CIFAR variant (3x3 stem, no max-pool; 11,173,962 parameters on CIFAR-10)."""

    def build(self, feature_shape: tuple[int, ...], num_classes: int) -> BatchedModel:
        from fedhp.models.resnet import ResNet18

        c, _, _ = _image_shape(feature_shape, "resnet18")
        return VmapModel(ResNet18(c, num_classes), feature_shape, num_classes)
