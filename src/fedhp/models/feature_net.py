"""Networks split into a feature extractor and a linear head (the reference modules whose
penultimate features methods such as FedRep, MOON and FNR-FL read)."""

from __future__ import annotations

import torch
from torch import nn


class FeatureNet(nn.Module):
    """A network split into a feature extractor and a linear head: ``forward(x)`` is
    ``head(embed(x))``; ``forward(x, features=True)`` also returns the penultimate features."""

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Penultimate features ``[B, H]``."""
        raise NotImplementedError

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, K]`` from features."""
        raise NotImplementedError

    def forward(
        self, x: torch.Tensor, features: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        h = self.embed(x)
        out = self.head(h)
        return (out, h) if features else out
