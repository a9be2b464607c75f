"""ResNet-18 in its CIFAR form (He et al. 2016; the 3x3-stem variant without max-pooling that
FL papers train on 32x32 images), as a :class:`~fedhp.models.feature_net.FeatureNet`."""

from __future__ import annotations

import torch
from torch import nn

from fedhp.models.feature_net import FeatureNet


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers with an identity (or 1x1 conv-BN projection) shortcut."""

    def __init__(self, in_planes: int, planes: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(h)) + self.shortcut(x))


class ResNet18(FeatureNet):
    """3x3 stem (64), four stages of two :class:`BasicBlock` (64, 128, 256, 512; strides 1, 2,
    2, 2), global average pooling, one linear layer. Any input side works (28 or 32)."""

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        stages: list[nn.Module] = []
        planes = 64
        for width, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            stages.append(
                nn.Sequential(BasicBlock(planes, width, stride), BasicBlock(width, width, 1))
            )
            planes = width
        self.layers = nn.Sequential(*stages)
        self.linear = nn.Linear(512, num_classes)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        h = self.layers(torch.relu(self.bn1(self.conv1(x))))
        return h.mean((-2, -1))

    def head(self, h: torch.Tensor) -> torch.Tensor:
        return self.linear(h)
