"""Where each named tensor of a module sits in a flat ``[.., N]`` vector.

Every model's parameters live in ONE flat tensor ``[C, P]`` (a leading client dimension ``C``);
layers are views into it (:class:`ParamLayout`). Models with BatchNorm also have per-client
*buffers* (running means and variances), the rows of a ``[C, B]`` tensor beside the parameters
(:class:`BufferLayout`); models without have ``B = 0``.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import torch
from torch import nn


@dataclass(frozen=True)
class ParamSpec:
    """One named tensor: its shape and where it sits in the flat vector."""

    name: str
    shape: tuple[int, ...]
    offset: int

    @property
    def numel(self) -> int:
        return prod(self.shape)


class FlatLayout:
    """The order and shapes of named tensors inside a flat ``[.., N]`` vector."""

    def __init__(self, named: list[tuple[str, torch.Tensor]]) -> None:
        specs: list[ParamSpec] = []
        offset = 0
        for name, p in named:
            specs.append(ParamSpec(name, tuple(p.shape), offset))
            offset += p.numel()
        self.specs = tuple(specs)
        self.size = offset

    def view(self, flat: torch.Tensor, spec: ParamSpec) -> torch.Tensor:
        """View of one tensor for every client: ``[C, *shape]`` (or ``shape`` for 1-D flat)."""
        lead = flat.shape[:-1]
        return flat[..., spec.offset : spec.offset + spec.numel].reshape(*lead, *spec.shape)

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Name → view, for ``torch.func.functional_call``."""
        return {s.name: self.view(flat, s) for s in self.specs}

    def _tensors(self, module: nn.Module) -> list[torch.Tensor]:
        raise NotImplementedError

    def flatten_module(self, module: nn.Module) -> torch.Tensor:
        """A module's tensors as one flat ``[N]`` tensor (copied)."""
        tensors = self._tensors(module)
        if not tensors:
            return torch.zeros(0)
        return torch.cat([t.detach().reshape(-1) for t in tensors])

    def load_into(self, module: nn.Module, flat: torch.Tensor) -> None:
        """Copy a flat ``[N]`` vector into a module's tensors (in place)."""
        with torch.no_grad():
            for spec, t in zip(self.specs, self._tensors(module), strict=True):
                t.copy_(self.view(flat, spec))


class ParamLayout(FlatLayout):
    """The order and shapes of a module's parameters inside the flat ``[.., P]`` vector."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__(list(module.named_parameters()))

    def _tensors(self, module: nn.Module) -> list[torch.Tensor]:
        return list(module.parameters())


class BufferLayout(FlatLayout):
    """A module's floating-point buffers (BatchNorm running means and variances) inside the flat
    ``[.., B]`` buffer vector.

    BatchNorm's integer ``num_batches_tracked`` counters are left out: they only matter with
    ``momentum=None`` (a cumulative average), which is refused here; with a fixed momentum they
    are never read."""

    def __init__(self, module: nn.Module) -> None:
        for name, m in module.named_modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.momentum is None:
                raise ValueError(f"{name}: BatchNorm with momentum=None is not supported")
        super().__init__([(n, b) for n, b in module.named_buffers() if b.is_floating_point()])

    def _tensors(self, module: nn.Module) -> list[torch.Tensor]:
        return [b for b in module.buffers() if b.is_floating_point()]
