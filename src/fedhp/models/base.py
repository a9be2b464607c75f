"""Batched multi-client models over a flat parameter tensor.

Every model's parameters live in ONE flat tensor ``[C, P]`` (a leading client dimension ``C``);
layers are views into it. Aggregation, sparsification, hard thresholding and byte accounting then
act on plain ``[C, P]`` tensors, and autograd returns gradients in the same ``[C, P]`` shape.

Each model also exposes a plain ``torch.nn.Module`` (its *reference* form) with the same parameter
names and order; the reference path and the tests use it to check the batched forward/backward.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from math import prod

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode


@dataclass(frozen=True)
class ParamSpec:
    """One named parameter: its shape and where it sits in the flat vector."""

    name: str
    shape: tuple[int, ...]
    offset: int

    @property
    def numel(self) -> int:
        return prod(self.shape)


class ParamLayout:
    """The order and shapes of a module's parameters inside the flat ``[.., P]`` vector."""

    def __init__(self, module: nn.Module) -> None:
        specs: list[ParamSpec] = []
        offset = 0
        for name, p in module.named_parameters():
            specs.append(ParamSpec(name, tuple(p.shape), offset))
            offset += p.numel()
        self.specs = tuple(specs)
        self.size = offset

    def view(self, flat: torch.Tensor, spec: ParamSpec) -> torch.Tensor:
        """View of one parameter for every client: ``[C, *shape]`` (or ``shape`` for 1-D flat)."""
        lead = flat.shape[:-1]
        return flat[..., spec.offset : spec.offset + spec.numel].reshape(*lead, *spec.shape)

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Name → view, for ``torch.func.functional_call``."""
        return {s.name: self.view(flat, s) for s in self.specs}

    def flatten_module(self, module: nn.Module) -> torch.Tensor:
        """A module's parameters as one flat ``[P]`` tensor (copied)."""
        return torch.cat([p.detach().reshape(-1) for p in module.parameters()])

    def load_into(self, module: nn.Module, flat: torch.Tensor) -> None:
        """Copy a flat ``[P]`` vector into a module's parameters (in place)."""
        with torch.no_grad():
            for spec, p in zip(self.specs, module.parameters(), strict=True):
                p.copy_(self.view(flat, spec))


class BatchedModel(ABC):
    """A model evaluated for many clients at once: ``forward(flat [C,P], x [C,B,...])``.

    ``reports_objective``: evaluation also logs the training objective (sparse-learning losses,
    :mod:`fedhp.models.linear`); ``sparsity_groups``: blocks of P thresholded separately by H_τ."""

    reports_objective: bool = False
    sparsity_groups: int = 1

    def __init__(self, reference: nn.Module, feature_shape: tuple[int, ...], num_classes: int):
        self.reference = reference
        self.feature_shape = feature_shape
        self.num_classes = num_classes
        self.layout = ParamLayout(reference)

    @property
    def num_params(self) -> int:
        return self.layout.size

    def init_params(self, seed: int) -> torch.Tensor:
        """Initial flat ``[P]`` parameters: PyTorch's default init of the reference module."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            for m in self.reference.modules():
                reset = getattr(m, "reset_parameters", None)
                if m is not self.reference and callable(reset):
                    reset()
            return self.layout.flatten_module(self.reference).clone()

    @abstractmethod
    def forward(self, flat: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Logits ``[C, B, K]`` for parameters ``[C, P]`` and inputs ``[C, B, *feature_shape]``."""

    def loss_and_grad(
        self, flat: torch.Tensor, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-client mean cross-entropy ``[C]`` and its gradient ``[C, P]``.

        Autograd over per-layer leaf copies (not over slices of the flat tensor, whose backward
        would materialize a zero-filled ``[C, P]`` buffer per parameter). The clients' losses are
        summed before differentiation; as clients share no parameters, row c of the gradient is
        exactly the gradient of client c's own loss.
        """
        leaves = [
            self.layout.view(flat, s).detach().contiguous().requires_grad_(True)
            for s in self.layout.specs
        ]
        params = {s.name: leaf for s, leaf in zip(self.layout.specs, leaves, strict=True)}
        logits = self.forward_params(params, x)
        c, b = logits.shape[0], logits.shape[1]
        losses = F.cross_entropy(logits.reshape(c * b, -1), y.reshape(-1), reduction="none")
        per_client = losses.view(c, b).mean(1)
        grads = torch.autograd.grad(per_client.sum(), leaves)
        return per_client.detach(), torch.cat([g.reshape(c, -1) for g in grads], dim=1)

    def sample_losses(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Per-sample loss (shape of ``y``) from logits ``[..., K]``: cross-entropy."""
        k = logits.shape[-1]
        return F.cross_entropy(logits.reshape(-1, k), y.reshape(-1), reduction="none").view(y.shape)

    def correct(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Per-sample correctness (bool, shape of ``y``): the top logit is the label."""
        return logits.argmax(-1) == y

    def regularizer(self, flat: torch.Tensor) -> torch.Tensor:
        """Regularization term of each row of ``flat [.., P]`` added to the objective (none)."""
        return torch.zeros(flat.shape[:-1], dtype=flat.dtype, device=flat.device)

    def forward_params(self, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """Like :meth:`forward`, from per-parameter tensors ``name -> [C, *shape]``."""
        flat = torch.cat([params[s.name].reshape(x.shape[0], -1) for s in self.layout.specs], 1)
        return self.forward(flat, x)

    def make_module(self, flat: torch.Tensor) -> nn.Module:
        """A fresh plain ``nn.Module`` holding the flat ``[P]`` parameters (reference path)."""
        import copy

        module = copy.deepcopy(self.reference)
        self.layout.load_into(module, flat)
        return module

    def flops_per_sample(self) -> int:
        """Forward FLOPs for one sample (counted by PyTorch's FlopCounterMode)."""
        x = torch.zeros(1, *self.feature_shape)
        counter = FlopCounterMode(display=False)
        with counter, torch.no_grad():
            self.reference(x)
        return int(counter.get_total_flops())


class VmapModel(BatchedModel):
    """Generic batched form of any module, via ``torch.func.vmap`` over ``functional_call``."""

    def forward(self, flat: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.forward_params(self.layout.unflatten(flat), x)

    def forward_params(self, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        def one(p: dict[str, torch.Tensor], xb: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = torch.func.functional_call(self.reference, p, (xb,))
            return out

        result: torch.Tensor = torch.func.vmap(one)(params, x)
        return result
