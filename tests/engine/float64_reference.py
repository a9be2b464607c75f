"""A float64 reference of one FedAvg round of full-batch local SGD, and the accuracy measure the
GPU tests compare both devices with (``tests/engine/test_gpu.py``; checked on the CPU in
``tests/engine/test_float64_reference.py``).

Two float32 runs of a deep net (ResNet-18) on different devices differ entry-wise by more than
any fixed tolerance is worth: their convolutions sum in different orders, and a few entries near
zero differ relatively by much. What must hold is that each device computes the round about as
accurately as the other: the error of each against the same round in float64 (the reference
modules of :meth:`~fedhp.models.base.BatchedModel.make_module`, ``torch.optim.SGD``-like plain
steps), measured relative to the size of the round's update, within one bound.

The bound is set by the CPU's own float32 convolutions. On torch 2.13's CPU they differ in
accuracy: ResNet-18's round through oneDNN (the default) is 1.15e-2 off float64, through
PyTorch's native convolutions (oneDNN off; channels-last gives the same) 2.68e-2 — and an H100's
cuDNN round 2.68e-2 (docs/gpu.md, 2026-11-26). A device is as accurate as the CPU when it is
within :data:`FACTOR` of the least accurate of these baselines
(:func:`cpu_float32_rounds`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fedhp.engine.federation import ClientTensors
from fedhp.models.base import BatchedModel


def fedavg_round_reference(
    model: BatchedModel,
    start: torch.Tensor,
    data: ClientTensors,
    steps: int,
    lr: float,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """FedAvg's global model ``[P]`` (``dtype``, on the CPU) after one round of ``steps``
    full-batch SGD steps per client on its whole training set (``data``), uniform weights, from
    ``start`` ``[P]`` with the initial BatchNorm statistics: plain ``nn.Module`` steps."""
    rows = []
    offsets = data.offsets.cpu().tolist()
    for c in range(len(offsets) - 1):
        x = data.x[offsets[c] : offsets[c + 1]].cpu().to(dtype)
        y = data.y[offsets[c] : offsets[c + 1]].cpu()
        module = model.make_module(start.cpu(), model.init_buffers()).to(dtype).train()
        for _ in range(steps):
            module.zero_grad(set_to_none=True)
            F.cross_entropy(module(x), y).backward()
            with torch.no_grad():
                for p in module.parameters():
                    assert p.grad is not None
                    p.sub_(lr * p.grad)
        rows.append(model.layout.flatten_module(module).to(dtype))
    return torch.stack(rows).mean(0)


def cpu_float32_rounds(
    model: BatchedModel, start: torch.Tensor, data: ClientTensors, steps: int, lr: float
) -> dict[str, torch.Tensor]:
    """The round of :func:`fedavg_round_reference` in float32 through the CPU's two convolution
    implementations: ``loop32`` (oneDNN, the default) and ``loop32-native`` (oneDNN off)."""
    loop32 = fedavg_round_reference(model, start, data, steps, lr, torch.float32)
    with torch.backends.mkldnn.flags(enabled=False):
        native = fedavg_round_reference(model, start, data, steps, lr, torch.float32)
    return {"loop32": loop32, "loop32-native": native}


def update_error(result: torch.Tensor, reference: torch.Tensor, start: torch.Tensor) -> float:
    """``‖result − reference‖ / ‖reference − start‖``: the error of a round's result relative to
    the size of its update (in float64)."""
    ref = reference.double().cpu()
    moved = (ref - start.double().cpu()).norm()
    return float((result.double().cpu() - ref).norm() / moved)


FACTOR = 2.0
"""Each result may be off float64 by at most this many times the baseline's (the CPU's) error:
rounding in another order lands about as far off, in another direction."""
FLOOR = 1e-6
"""...or by this much (where the baseline is near exact)."""


def assert_as_accurate(
    results: dict[str, torch.Tensor],
    reference: torch.Tensor,
    start: torch.Tensor,
    baselines: tuple[str, ...] = ("cpu",),
) -> dict[str, float]:
    """Every result (name → global model) within ``FACTOR`` × the largest of the ``baselines``'
    :func:`update_error` against the float64 ``reference`` (at least :data:`FLOOR`); returns
    the errors."""
    errors = {k: update_error(v, reference, start) for k, v in results.items()}
    bound = max(FACTOR * max(errors[b] for b in baselines), FLOOR)
    bad = {k: e for k, e in errors.items() if not e <= bound}
    assert not bad, f"update errors against float64 above {bound:.3g}: {errors}"
    return errors
