"""How far float32 takes test_gpu's ResNet-18 FedAvg round from its float64 value, on each of the
CPU's convolution paths: the error relative to the round's update (``update_error``) of the
engine's round, of plain ``nn.Module`` loops through oneDNN (the default), through PyTorch's
native convolutions (oneDNN off) and channels-last, and of oneDNN's loop with each client's
samples shuffled (the round is invariant to that order; its rounding is not).

Usage (from the project root): python benchmarks/float32_paths.py [--shuffles N]
The GPU's figure to compare with is in docs/gpu.md (an H100: 0.0268).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.engine import test_gpu  # noqa: E402
from tests.engine.float64_reference import fedavg_round_reference, update_error  # noqa: E402

from fedhp.engine.experiment import MODEL_SEED_OFFSET  # noqa: E402
from fedhp.engine.federation import ClientTensors  # noqa: E402

STEPS = 2


def module_round(run: test_gpu.Run, start: torch.Tensor, data: ClientTensors) -> torch.Tensor:
    """The round as plain float32 ``nn.Module`` steps in channels-last memory order."""
    model, lr = run.exp.model, run.exp.options.lr  # type: ignore[attr-defined]
    rows = []
    offsets = data.offsets.tolist()
    for c in range(len(offsets) - 1):
        x = data.x[offsets[c] : offsets[c + 1]].contiguous(memory_format=torch.channels_last)
        module = model.make_module(start, model.init_buffers()).train()
        module = module.to(memory_format=torch.channels_last)
        for _ in range(STEPS):
            module.zero_grad(set_to_none=True)
            F.cross_entropy(module(x), data.y[offsets[c] : offsets[c + 1]]).backward()
            with torch.no_grad():
                for p in module.parameters():
                    p.sub_(lr * p.grad)
        rows.append(model.layout.flatten_module(module).double())
    return torch.stack(rows).mean(0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shuffles", type=int, default=6)
    args = parser.parse_args()
    overrides = ["algorithm.name=fedavg", f"algorithm.local_steps={STEPS}", "model.name=resnet18"]
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as patch:
        run = test_gpu.Run(
            "cpu",
            [*overrides, *test_gpu.FULL_BATCH],
            Path(tmp),
            patch,
            test_gpu.own_sampler_stream,
        )
    exp = run.exp
    start = exp.model.init_params(exp.cfg.seed + MODEL_SEED_OFFSET)
    lr, data = exp.options.lr, exp.ctx.fed.train  # type: ignore[attr-defined]
    ref = fedavg_round_reference(exp.model, start, data, STEPS, lr)
    assert run.global_model is not None

    def loop(d: ClientTensors = data) -> torch.Tensor:
        return fedavg_round_reference(exp.model, start, d, STEPS, lr, torch.float32)

    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    print(f"engine (oneDNN)               {update_error(run.global_model, ref, start):.4g}")
    print(f"nn.Module loop, oneDNN        {update_error(loop(), ref, start):.4g}")
    last = module_round(run, start, data)
    print(f"nn.Module loop, channels-last {update_error(last, ref, start):.4g}")
    with torch.backends.mkldnn.flags(enabled=False):
        print(f"nn.Module loop, native conv   {update_error(loop(), ref, start):.4g}")
    g = torch.Generator().manual_seed(0)
    spans = list(zip(data.offsets[:-1].tolist(), data.offsets[1:].tolist(), strict=True))
    for k in range(args.shuffles):
        perm = torch.cat([lo + torch.randperm(hi - lo, generator=g) for lo, hi in spans])
        shuffled = ClientTensors(data.x[perm], data.y[perm], data.offsets, data.owner[perm])
        print(f"oneDNN loop, shuffle {k}       {update_error(loop(shuffled), ref, start):.4g}")


if __name__ == "__main__":
    main()
