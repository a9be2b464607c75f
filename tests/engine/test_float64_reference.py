"""The float64-reference comparison the GPU tests use for deep nets, run on the CPU: the CPU
engine's float32 round and plain float32 per-client loops of the same round, through oneDNN's
and through PyTorch's native convolutions, are within the bound the GPU must meet (the engine as
close as oneDNN's loop), and a wrong round is not."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedhp.engine.experiment import MODEL_SEED_OFFSET
from tests.engine.float64_reference import (
    FACTOR,
    assert_as_accurate,
    cpu_float32_rounds,
    fedavg_round_reference,
    update_error,
)
from tests.engine.test_gpu import TINY_VGG, Run, full_batch_pair_on

STEPS, LR = 2, 0.05


@pytest.mark.parametrize(
    "model",
    [
        pytest.param([*TINY_VGG, "model.batch_norm=true"], id="vgg-bn"),
        pytest.param(["model.name=resnet18"], id="resnet18", marks=pytest.mark.slow),
    ],
)
def test_float32_rounds_are_equally_far_from_float64(
    model: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    overrides = ["algorithm.name=fedavg", f"algorithm.local_steps={STEPS}", *model]
    cpu: Run = full_batch_pair_on(["cpu"], overrides, tmp_path, monkeypatch)[0]
    exp = cpu.exp
    start = exp.model.init_params(exp.cfg.seed + MODEL_SEED_OFFSET)
    assert exp.options.lr == LR  # type: ignore[attr-defined]
    train = exp.ctx.fed.train
    reference = fedavg_round_reference(exp.model, start, train, STEPS, LR)
    loops = cpu_float32_rounds(exp.model, start, train, STEPS, LR)
    assert cpu.global_model is not None
    errors = assert_as_accurate({"cpu": cpu.global_model, **loops}, reference, start, tuple(loops))
    assert errors["loop32"] <= FACTOR * errors["cpu"]  # the engine is oneDNN's loop, to rounding
    print(f"update errors against float64: {errors}")
    # a round farther off than FACTOR x the CPU's error is caught
    err = max(errors["cpu"], 1e-6)
    noise = torch.randn(start.shape, generator=torch.Generator().manual_seed(0))
    noise *= 3 * FACTOR * err * (reference.float() - start).norm() / noise.norm()
    wrong = cpu.global_model + noise
    assert update_error(wrong, reference, start) > FACTOR * err
    with pytest.raises(AssertionError, match="above"):
        assert_as_accurate({"cpu": cpu.global_model, "wrong": wrong}, reference, start)
