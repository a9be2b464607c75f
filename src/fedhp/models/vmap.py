"""The generic batched form of any reference module: ``torch.func.vmap`` over
``functional_call``."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from fedhp.models.base import BatchedModel, FeatureOptions, ForwardOptions, Params
from fedhp.models.batchnorm import sample_weights, vmappable
from fedhp.models.feature_net import FeatureNet

if TYPE_CHECKING:
    from typing_extensions import Unpack

Flags = dict[str, bool]
"""Extra keyword arguments of the reference module's forward (``features=True``)."""


class VmapModel(BatchedModel):
    """Generic batched form of any module, via ``torch.func.vmap`` over ``functional_call``.

    One client of a large model (:meth:`~fedhp.models.policy.ExecutionPolicy.direct`: at least
    2.5 M parameters; the CPU trains such models client by client) is run by a plain
    ``functional_call`` of the reference module instead: vmap's batched-weight convolutions cost
    about twice a plain loop's for VGG-11 (docs/benchmarks.md). Feature taps need a
    :class:`FeatureNet` reference."""

    def __init__(self, reference: nn.Module, feature_shape: tuple[int, ...], num_classes: int):
        super().__init__(reference, feature_shape, num_classes)
        self.functional = vmappable(reference)

    def forward(self, flat: Tensor, x: Tensor, **opts: Unpack[ForwardOptions]) -> Tensor:
        return self.forward_params(self.layout.unflatten(flat), x, **opts)

    def forward_params(self, params: Params, x: Tensor, **opts: Unpack[FeatureOptions]) -> Tensor:
        out = self._call(params, x, opts, False, opts.get("weight"))
        assert isinstance(out, Tensor)
        return out

    def forward_with_features(
        self, flat: Tensor, x: Tensor, **opts: Unpack[FeatureOptions]
    ) -> tuple[Tensor, Tensor]:
        if not isinstance(self.reference, FeatureNet):
            raise TypeError(f"{type(self.reference).__name__} has no features/head split")
        weight = self.statistic_weight(opts.get("weight"))
        out = self._call(self.layout.unflatten(flat), x, opts, True, weight)
        assert isinstance(out, tuple)
        return out

    def _call(
        self,
        params: Params,
        x: Tensor,
        opts: ForwardOptions,
        features: bool,
        weight: Tensor | None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        kwargs = {"features": True} if features else {}
        x = self.policy.arrange(x)
        buffers, train = opts.get("buffers"), opts.get("train", False)
        if weight is not None and self.num_buffers and train:
            return self._call_weighted(params, x, buffers, weight, kwargs)
        if self.policy.direct(x.shape[0], self.num_params):
            return self._call_one(params, x, buffers, train, kwargs)
        module = self.functional
        module.train(train)
        if self.num_buffers == 0:

            def one(p: Params, xb: Tensor) -> Tensor:
                return torch.func.functional_call(module, p, (xb,), kwargs)

            return torch.func.vmap(one, randomness="different")(params, x)
        bufs = self.buffer_layout.unflatten(self._buffers_for(x, buffers))

        def one_bn(p: Params, b: Params, xb: Tensor) -> Tensor:
            return torch.func.functional_call(module, {**p, **b}, (xb,), kwargs)

        return torch.func.vmap(one_bn, randomness="different")(params, bufs, x)

    def _call_weighted(
        self, params: Params, x: Tensor, buffers: Tensor | None, weight: Tensor, kwargs: Flags
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Training-mode forward whose BatchNorm statistics weight each client's samples by
        ``weight [C, B]`` (one client without vmap, as in :meth:`_call_one`)."""
        module = self.functional
        module.train(True)
        bufs = self.buffer_layout.unflatten(self._buffers_for(x, buffers))

        def one(p: Params, b: Params, xb: Tensor, wb: Tensor) -> Tensor | tuple[Tensor, Tensor]:
            with sample_weights(module, wb):
                out = torch.func.functional_call(module, {**p, **b}, (xb,), kwargs)
            return out

        if self.policy.direct(x.shape[0], self.num_params):
            first = {k: v[0] for k, v in params.items()}
            return _one_client(one(first, {k: v[0] for k, v in bufs.items()}, x[0], weight[0]))
        return torch.func.vmap(one, randomness="different")(params, bufs, x, weight)

    def _call_one(
        self, params: Params, x: Tensor, buffers: Tensor | None, train: bool, kwargs: Flags
    ) -> Tensor | tuple[Tensor, Tensor]:
        """One client (``x [1, B, ...]``) without vmap; BatchNorm updates ``buffers`` in place."""
        tensors = {k: v[0] for k, v in params.items()}
        if self.num_buffers:
            bufs = self.buffer_layout.unflatten(self._buffers_for(x, buffers))
            tensors.update({k: v[0] for k, v in bufs.items()})
        module = self.reference
        module.train(train)
        return _one_client(torch.func.functional_call(module, tensors, (x[0],), kwargs))


def _one_client(out: Tensor | tuple[Tensor, Tensor]) -> Tensor | tuple[Tensor, Tensor]:
    """A single client's output with its client dimension ``[1, ...]`` put back."""
    if isinstance(out, tuple):
        return out[0].unsqueeze(0), out[1].unsqueeze(0)
    return out.unsqueeze(0)
