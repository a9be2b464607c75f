"""The execution policy: the CPU's cache-sized chunks as before, a (faked) CUDA memory budget,
the config override, precision and channels-last."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fedhp.cli import main
from fedhp.engine.ops import sgd_steps
from fedhp.models import MODELS
from fedhp.models.base import BatchedModel
from fedhp.models.policy import (
    CPU_CHUNK_FLOATS,
    CPU_POLICY,
    ROW_COPIES,
    TRAIN_ACTIVATION_COPIES,
    ExecutionPolicy,
    activation_floats,
    build_policy,
)
from tests.conftest import small_experiment
from tests.policies import use_policy

MNIST = (1, 28, 28)
DNN100 = 784 * 100 + 100 + 100 * 10 + 10  # 79,510 parameters


def dnn(hidden: list[int] | None = None) -> BatchedModel:
    return MODELS.build({"name": "dnn", "hidden": hidden or [100]}, "model").build(MNIST, 10)


def test_cpu_policy_is_the_earlier_cache_sized_chunking() -> None:
    """The constants the engine used before the policy: 2.5 M floats a chunk (31 DNN-100
    clients; sFedHP's two rows: 15), one client from 2.5 M parameters, which also run without
    vmap; evaluation rows scaled down only above 1e8 FLOPs a sample."""
    policy = build_policy(torch.device("cpu"), dnn().reference, MNIST)
    assert policy == CPU_POLICY and policy.budget_bytes is None
    assert policy.chunk(DNN100, 10_000) == 31 == CPU_CHUNK_FLOATS // DNN100
    assert policy.chunk(2 * DNN100, 1000) == 15
    assert policy.chunk(15, 7) == 7  # everything fits: all clients
    assert policy.chunk(9_000_000, 10) == 1  # VGG-size: client by client
    assert policy.direct(1, 2_500_000) and not policy.direct(2, 2_500_000)
    assert not policy.direct(1, 2_499_999)
    assert policy.eval_rows(8192, 10**6) == 8192
    assert policy.eval_rows(8192, 4 * 10**8) == 2048
    assert policy.eval_rows(512, 10**11) == 8


def test_a_faked_device_budget_holds_all_clients_or_splits_them() -> None:
    """CUDA sizing from an injected free-memory figure: one chunk for all 10,000 DNN-100 clients
    where the budget holds them, a split into budget-sized chunks where it does not."""
    reference = dnn().reference
    cuda = torch.device("cuda")  # never touched: the free memory is given
    acts = activation_floats(reference, MNIST)
    assert acts == 784 + 100 + 10  # the input, then the two Linear layers' outputs
    per_client = ROW_COPIES * 4 * DNN100 + TRAIN_ACTIVATION_COPIES * 4 * acts * 5
    big = build_policy(cuda, reference, MNIST, batch_size=5, free_bytes=80 * 2**30)
    assert big.device_type == "cuda" and big.budget_bytes == 40 * 2**30
    assert big.chunk(DNN100, 10_000) == 10_000  # one chunk, not the CPU's 31
    small = build_policy(cuda, reference, MNIST, batch_size=5, free_bytes=2 * 2500 * per_client)
    assert small.chunk(DNN100, 10_000) == 2500  # half the free memory: 2,500 clients a chunk
    tight = build_policy(cuda, reference, MNIST, batch_size=5, free_bytes=per_client)
    assert tight.chunk(DNN100, 10_000) == 1  # never zero
    # evaluation: as many rows as the budget holds for the clients evaluated together
    assert big.eval_rows(512, 10**6, clients=1) > 8192
    assert small.eval_rows(512, 10**6, clients=10**6) == 8


def test_the_engine_trains_in_the_policys_chunks() -> None:
    """``sgd_steps`` takes its chunks from the model's policy: one fused step per chunk and
    step, and the same result either way (the minibatches are drawn ahead)."""
    model = dnn([8])
    calls: list[int] = []
    step = model.sgd_step

    def spy(flat, x, y, lr, before=None):  # type: ignore[no-untyped-def]
        calls.append(flat.shape[0])
        return step(flat, x, y, lr, before)

    model.sgd_step = spy  # type: ignore[method-assign]
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(6, 4, *MNIST, generator=g), torch.randint(0, 10, (6, 4), generator=g)
    w0 = model.init_params(0).expand(6, -1)
    whole, _ = sgd_steps(model, w0, lambda: (x, y), 2, 0.1)
    assert calls == [6, 6]
    calls.clear()
    use_policy(model, budget_bytes=2 * ROW_COPIES * 4 * model.num_params)  # two a chunk
    parts, _ = sgd_steps(model, w0, lambda: (x, y), 2, 0.1)
    assert calls == [2, 2, 2, 2, 2, 2]
    torch.testing.assert_close(parts, whole, rtol=1e-6, atol=1e-7)


def test_config_override_wins() -> None:
    exp = small_experiment(
        "engine.clients_per_chunk=3",
        "dataset.name=synthetic",
        "dataset.dim=10",
        "dataset.num_clients=20",
        "partition.name=natural",
        "model.name=mlr",
    )
    assert exp.ctx.policy is exp.model.policy
    assert exp.ctx.policy.chunk(15, 20) == 3 and exp.ctx.policy.chunk(10**9, 20) == 3
    task = exp.algorithm.plan(exp.algorithm.init_state(exp.model.init_params(0)), 0)
    assert [len(p.clients) for p in exp.algorithm.round_parts(task)] == [3] * 6 + [2]
    assert ExecutionPolicy(budget_bytes=10).with_override(5).chunk(10**6, 20) == 5


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ("engine.clients_per_chunk=0", "engine.clients_per_chunk"),
        ("engine.clients_per_chunk=many", "engine.clients_per_chunk"),
        ("engine.memory_fraction=1.5", "engine.memory_fraction"),
        ("precision=fp16", "precision"),
    ],
)
def test_a_bad_policy_option_is_a_one_line_config_error(
    override: str, field: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(["run", override, "rounds=1", "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert field in err and "Traceback" not in err


def _local_round(
    model: BatchedModel, policy: ExecutionPolicy, shape: tuple[int, ...] = MNIST
) -> torch.Tensor:
    """Three local SGD steps of three clients under ``policy`` (BatchNorm statistics fresh)."""
    model.policy = policy
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(3, 8, *shape, generator=g), torch.randint(0, 10, (3, 8), generator=g)
    bufs = model.init_buffers().expand(3, -1).clone() if model.num_buffers else None
    w0 = model.init_params(0).expand(3, -1)
    out, _ = sgd_steps(model, w0, lambda: (x, y), 3, 0.1, buffers=bufs)
    return out


@pytest.mark.parametrize("kind", ["dnn", "vgg-bn"])
def test_bf16_rounds_run_on_the_cpu_near_fp32(kind: str) -> None:
    """``precision=bf16``: autocast on the CPU (the MLP's generic path, a vmap'd conv net with
    BatchNorm); the rows stay float32 and land near the fp32 result (within 10 % of the
    distance they moved: bf16 keeps ~3 significant digits), but not on it (the forward really
    ran in bf16). fp32 is the policy's default."""
    if kind == "dnn":
        model, shape = dnn([16]), MNIST
    else:
        options = {"name": "vgg", "cfg": [4, "M", 8, "M"], "batch_norm": True}
        model, shape = MODELS.build(options, "model").build((1, 8, 8), 10), (1, 8, 8)
    w0 = model.init_params(0)
    fp32 = _local_round(model, CPU_POLICY, shape)
    bf16 = _local_round(model, ExecutionPolicy(precision="bf16"), shape)
    assert bf16.dtype == torch.float32
    moved = (fp32 - w0).norm()
    gap = (bf16 - fp32).norm()
    assert 0 < gap < 0.1 * moved, (gap, moved)


def test_tf32_and_fp32_leave_cpu_results_unchanged() -> None:
    """The CPU has no TF32: ``tf32`` trains exactly like ``fp32``."""
    model = dnn([16])
    fp32 = _local_round(model, CPU_POLICY)
    assert torch.equal(_local_round(model, ExecutionPolicy(precision="tf32")), fp32)


def test_channels_last_inputs_give_the_same_forward() -> None:
    model = MODELS.build({"name": "vgg", "cfg": [4, "M", 8, "M"]}, "model").build((3, 8, 8), 10)
    flat = torch.stack([model.init_params(s) for s in range(2)])
    x = torch.randn(2, 5, 3, 8, 8)
    arranged = ExecutionPolicy(channels_last=True).arrange(x)
    assert torch.equal(arranged, x) and arranged.permute(0, 1, 3, 4, 2).is_contiguous()
    plain = model.forward(flat, x)
    use_policy(model, channels_last=True)
    torch.testing.assert_close(model.forward(flat, x), plain, rtol=1e-5, atol=1e-6)


def test_the_policy_rejects_a_zero_override() -> None:
    with pytest.raises(ValueError, match="clients_per_chunk"):
        ExecutionPolicy(clients_per_chunk=0)


def test_a_bf16_run_trains_and_evaluates_end_to_end(tmp_path: Path) -> None:
    """``precision=bf16`` through the CLI on the CPU: training and both evaluations under
    autocast, finite float32 metrics."""
    args = [
        "run",
        "precision=bf16",
        "rounds=2",
        "progress=false",
        "checkpoint_every=0",
        "dataset.name=synthetic",
        "dataset.dim=10",
        "dataset.num_clients=8",
        "partition.name=natural",
        "federation.num_clients=8",
        "federation.num_edges=2",
        "model.name=dnn",
        "model.hidden=[8]",
        "algorithm.name=sfedhp",
        "algorithm.R=2",
        "algorithm.K=2",
        "--out",
        str(tmp_path),
    ]
    assert main(args) == 0
    rows = (tmp_path / "metrics.csv").read_text().splitlines()
    header, last = rows[0].split(","), rows[-1].split(",")
    loss = float(last[header.index("global_loss")])
    assert loss == loss and 0 < loss < 10  # finite
