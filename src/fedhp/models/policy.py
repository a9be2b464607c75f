"""The execution policy: how much of a run's work goes into one batch of kernels on its device.

One frozen :class:`ExecutionPolicy` is built per run from the device and the model
(:func:`fedhp.build.build_experiment`), held by the model (``BatchedModel.policy``) and
exposed by the run context (``RunContext.policy``). It answers the questions every client chunk and
evaluation forward used to answer with CPU constants of their own:

* :meth:`~ExecutionPolicy.chunk`: how many clients train together, for a per-client row width;
* :meth:`~ExecutionPolicy.eval_rows`: how many evaluation rows go into one forward;
* :meth:`~ExecutionPolicy.direct`: whether a single client skips ``vmap``;
* :attr:`~ExecutionPolicy.small_layer`: the MLP step's small-layer kernel threshold;
* :meth:`~ExecutionPolicy.autocast`: the run's precision (``fp32 | tf32 | bf16``);
* :attr:`~ExecutionPolicy.cuda_graphs`: whether steps with a captured form replay as CUDA graphs
  (:mod:`fedhp.engine.graphs`).

It lives with the models, which hold it and consult it in every forward and step, so that the
models import nothing of the engine; the engine reads it through the model and the run context.

On the CPU the numbers are exactly the earlier constants (a chunk's rows near
:data:`CPU_CHUNK_FLOATS` floats, the L3 of this class of CPUs), so CPU results are unchanged bit for
bit. On CUDA a chunk holds as many clients as fit a memory budget: the free device memory measured
by ``torch.cuda.mem_get_info`` when the run is built, times ``engine.memory_fraction``, divided by
an estimate of one client's bytes (its parameter row, gradient, optimizer state and a temporary,
plus the activations of one training minibatch). ``engine.clients_per_chunk`` overrides both.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Literal

import torch
from torch import nn

Precision = Literal["fp32", "tf32", "bf16"]

CPU_CHUNK_FLOATS = 2_500_000
"""CPU: parameters of one client chunk (~8 MB, plus as much gradient): fits this class of CPUs'
L3 (was ``engine.ops.CACHE_FLOATS``)."""

DIRECT_MIN_PARAMS = 2_500_000
"""From this many parameters on, a single client is run without vmap (was
``models.base.DIRECT_MIN_PARAMS``; see :class:`~fedhp.models.vmap.VmapModel`)."""

SMALL_LAYER = 4096
"""Per-client weight matrices up to this many entries take their SGD step as one batched ``bmm``
then an ``add_``; larger ones as an in-place ``baddbmm_`` (on the flat rows' strided view PyTorch
runs that as one ``addmm_`` per client on the CPU, the faster kernel for large layers and ~2x
slower for small ones; docs/benchmarks.md, run H). Was ``models.zoo.SMALL_LAYER``."""

CPU_EVAL_FLOPS = 1e8
"""CPU: models above this many forward FLOPs per sample evaluate proportionally fewer rows per
forward, so that activations stay within a few hundred MB."""

ROW_COPIES = 4
"""CUDA estimate: ``[P]``-sized tensors one training client holds at once (its parameter row, its
gradient, a momentum/optimizer or prox-centre row and one temporary)."""

TRAIN_ACTIVATION_COPIES = 3
"""CUDA estimate: one training sample's activations are held about three times (saved for the
backward pass, their gradients, vmap/cuDNN temporaries)."""

EVAL_ACTIVATION_COPIES = 2
"""CUDA estimate: an evaluation forward holds a layer's input and output at once."""

MAX_EVAL_ROWS = 1 << 20
"""CUDA: an upper bound on rows per evaluation forward (the data bound them anyway)."""


@dataclass(frozen=True)
class ExecutionPolicy:
    """How a run batches its work on its device (see the module docstring).

    ``budget_bytes`` None: CPU cache sizing (``cache_floats`` per chunk); else the bytes one chunk
    may use (CUDA). ``clients_per_chunk``: the config's override (None: sized as above).
    ``client_bytes``: one training client's bytes besides its rows (a minibatch's activations);
    ``eval_row_bytes``: one evaluation row's activation bytes."""

    device_type: str = "cpu"
    budget_bytes: int | None = None
    clients_per_chunk: int | None = None
    cache_floats: int = CPU_CHUNK_FLOATS
    client_bytes: int = 0
    eval_row_bytes: int = 0
    direct_min_params: int = DIRECT_MIN_PARAMS
    small_layer: int = SMALL_LAYER
    precision: Precision = "fp32"
    channels_last: bool = False
    cuda_graphs: bool = False

    def __post_init__(self) -> None:
        if self.clients_per_chunk is not None and self.clients_per_chunk < 1:
            raise ValueError("clients_per_chunk must be at least 1")

    def chunk(self, width: int, num_clients: int) -> int:
        """Clients per chunk (at least 1, at most ``num_clients``) for per-client rows of
        ``width`` floats (a method holding two rows per client passes twice its parameters)."""
        if self.clients_per_chunk is not None:
            return max(1, min(num_clients, self.clients_per_chunk))
        if self.budget_bytes is None:
            return max(1, min(num_clients, self.cache_floats // max(width, 1)))
        per_client = ROW_COPIES * 4 * max(width, 1) + self.client_bytes
        return max(1, min(num_clients, self.budget_bytes // per_client))

    def eval_rows(self, rows: int, forward_flops: int, clients: int = 1) -> int:
        """Samples per client in one evaluation forward of ``clients`` models of
        ``forward_flops`` FLOPs per sample, for a caller asking ``rows``. CPU: ``rows``, scaled
        down above :data:`CPU_EVAL_FLOPS` (at least 8). CUDA: as many as the budget holds (at
        least 8)."""
        if self.budget_bytes is None:
            if forward_flops <= CPU_EVAL_FLOPS:
                return rows
            return max(8, int(rows * CPU_EVAL_FLOPS / forward_flops))
        per_row = max(1, clients * self.eval_row_bytes)
        return max(8, min(MAX_EVAL_ROWS, self.budget_bytes // per_row))

    def direct(self, num_clients: int, num_params: int) -> bool:
        """Whether a call of ``num_clients`` clients of a ``num_params`` model skips ``vmap``."""
        return num_clients == 1 and num_params >= self.direct_min_params

    @property
    def bf16(self) -> bool:
        """The run computes forward/backward under bf16 autocast."""
        return self.precision == "bf16"

    def autocast(self) -> contextlib.AbstractContextManager[object]:
        """The run's precision around a forward/backward (the ``[C, P]`` rows, the optimizer
        state and the aggregation stay float32 outside it):

        * ``fp32``: nothing (PyTorch's defaults: float32 matmuls; on CUDA, cuDNN convolutions
          may use TF32, ``torch.backends.cudnn.allow_tf32``'s default). A shared no-op context,
          so the CPU's steps pay ~0.2 µs for it;
        * ``tf32``: CUDA matmuls and cuDNN convolutions in TF32 (flags restored on exit;
          nothing on the CPU, which has no TF32);
        * ``bf16``: ``torch.autocast(device, bfloat16)``: matmuls and convolutions on bf16
          copies, float32 gradients of the float32 rows."""
        if self.precision == "bf16":
            return torch.autocast(self.device_type, dtype=torch.bfloat16)
        if self.precision == "tf32" and self.device_type == "cuda":
            return _tf32()
        return _NOTHING

    def arrange(self, x: torch.Tensor) -> torch.Tensor:
        """Image inputs ``[C, B, ch, H, W]`` in each client's channels-last memory order where
        the policy asks for it (``engine.channels_last``; values unchanged), else ``x``."""
        if not self.channels_last or x.dim() != 5:
            return x
        return x.permute(0, 1, 3, 4, 2).contiguous().permute(0, 1, 4, 2, 3)

    def with_override(self, clients_per_chunk: int | None) -> ExecutionPolicy:
        """The same policy with ``clients_per_chunk`` fixed (tests, benchmarks)."""
        return replace(self, clients_per_chunk=clients_per_chunk)


def widened(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32 if autocast left it in a half type (bf16/fp16); otherwise ``t`` itself
    (no copy: float32 and float64 results are untouched)."""
    return t.float() if t.dtype in (torch.bfloat16, torch.float16) else t


_NOTHING = contextlib.nullcontext()


@contextlib.contextmanager
def _tf32() -> Iterator[None]:
    """TF32 in CUDA matmuls and cuDNN inside the block, the flags restored after."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


CPU_POLICY = ExecutionPolicy()
"""The CPU policy with the earlier constants (what a model not built for a run uses)."""


def activation_floats(module: nn.Module, feature_shape: tuple[int, ...]) -> int:
    """Floats of every leaf module's output for one sample of ``feature_shape`` (a forward of a
    copy of ``module`` in eval mode on the CPU): the activations one sample's forward creates."""
    total = 0

    def count(_: nn.Module, __: object, out: object) -> None:
        nonlocal total
        if isinstance(out, torch.Tensor):
            total += out.numel()

    probe = copy.deepcopy(module).cpu().eval()
    hooks = [m.register_forward_hook(count) for m in probe.modules() if not list(m.children())]
    try:
        with torch.no_grad():
            probe(torch.zeros(1, *feature_shape))
    finally:
        for hook in hooks:
            hook.remove()
    return total + int(torch.Size(feature_shape).numel())


def free_device_bytes(device: torch.device) -> int:
    """Free memory of a CUDA ``device`` now (``torch.cuda.mem_get_info``)."""
    free, _ = torch.cuda.mem_get_info(device)
    return int(free)


def build_policy(
    device: torch.device,
    reference: nn.Module,
    feature_shape: tuple[int, ...],
    *,
    batch_size: int = 1,
    precision: Precision = "fp32",
    clients_per_chunk: int | None = None,
    memory_fraction: float = 0.5,
    channels_last: bool = False,
    cuda_graphs: bool = False,
    free_bytes: int | None = None,
) -> ExecutionPolicy:
    """The policy of a run on ``device`` of the model whose plain module is ``reference``.

    CPU: the cache-sized constants. CUDA: a budget of ``memory_fraction`` of the free device
    memory (``free_bytes`` if given — tests fake a device with it — else measured now), per-client
    activation bytes from :func:`activation_floats` at ``batch_size`` samples; CUDA graphs for
    the steps with a captured form where ``cuda_graphs``."""
    common = {
        "clients_per_chunk": clients_per_chunk,
        "precision": precision,
        "channels_last": channels_last,
    }
    if device.type != "cuda":
        return ExecutionPolicy(device_type=device.type, **common)  # type: ignore[arg-type]
    free = free_device_bytes(device) if free_bytes is None else free_bytes
    acts = activation_floats(reference, feature_shape)
    return ExecutionPolicy(
        device_type="cuda",
        budget_bytes=int(free * memory_fraction),
        client_bytes=TRAIN_ACTIVATION_COPIES * 4 * acts * max(batch_size, 1),
        eval_row_bytes=EVAL_ACTIVATION_COPIES * 4 * acts,
        cuda_graphs=cuda_graphs,
        **common,  # type: ignore[arg-type]
    )
