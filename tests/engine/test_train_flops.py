"""The engine's count of trained samples (``BatchedModel.trained_samples``) and summary.json's
``train_flops``: every gradient evaluation's rows, padding included, and nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import fedhp.engine.ops as ops
from fedhp.build import build_experiment
from fedhp.config import resolve_config
from fedhp.engine.checkpoint import CHECKPOINT_FILE, load_checkpoint
from fedhp.engine.runner import run_experiment
from fedhp.models import MODELS
from fedhp.models.base import BatchedModel
from fedhp.models.policy import CPU_CHUNK_FLOATS
from fedhp.unread import read_overrides
from tests.policies import use_policy

MNIST = (1, 28, 28)
FAST = [
    "progress=false",
    "threads=1",
    "model.name=mlr",
    "eval_every=1",
    "algorithm.name=fedavg",
    "algorithm.local_steps=3",
    "algorithm.batch_size=10",
]


def dnn() -> BatchedModel:
    return MODELS.build({"name": "dnn", "hidden": [16]}, "model").build(MNIST, 10)


def minibatches(clients: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(clients, batch, *MNIST, generator=g), torch.randint(
        0, 10, (clients, batch), generator=g
    )


@pytest.mark.parametrize("cache_floats", [CPU_CHUNK_FLOATS, 1], ids=["one-chunk", "chunked"])
def test_sgd_steps_count_clients_x_batch_x_steps(
    cache_floats: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """4 clients, 3 steps of 5 samples: 60 samples, whether the clients run in one chunk or one
    by one."""
    model = dnn()
    use_policy(model, cache_floats=cache_floats)
    x, y = minibatches(4, 5)
    w0 = model.init_params(0).expand(4, -1)
    ops.sgd_steps(model, w0, lambda: (x, y), 3, 0.1)
    assert model.trained_samples == 4 * 5 * 3
    assert model.train_flops == 60 * model.train_flops_per_sample()


def test_weighted_steps_count_padding_but_not_skipped_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rows of weight 0 (padding) are computed by the kernels, so they count; a chunk whose
    clients are all inactive at a step skips it, so it does not."""
    model = dnn()
    use_policy(model, cache_floats=1)  # one client per chunk
    x, y = minibatches(3, 4)
    weight = torch.ones(3, 4)
    weight[1, 2:] = 0  # client 1: a partial batch
    weight[2] = 0  # client 2: nothing left (inactive at step 1)
    active = torch.tensor([[True, True, True], [True, True, False]])

    def batch(step: int, rows: slice) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return x[rows], y[rows], weight[rows]

    w0 = model.init_params(0).expand(3, -1)
    ops.weighted_sgd_steps(model, w0, batch, 2, 0.1, active=active)
    assert model.trained_samples == 3 * 4 + 2 * 4  # step 0: 3 chunks; step 1: client 2 skipped


def test_a_methods_own_loss_counts_as_one_gradient_evaluation() -> None:
    model = dnn()
    x, y = minibatches(2, 5)
    w0 = model.init_params(0).expand(2, -1)

    def own(params: torch.Tensor, xb: torch.Tensor, yb: torch.Tensor, **kw: object) -> object:
        return model.loss_and_grad(params, xb, yb)

    ops.sgd_steps(model, w0, lambda: (x, y), 3, 0.1, loss_grad=own)
    assert model.trained_samples == 2 * 5 * 3


def run(out: Path, *overrides: str, resume: bool = False) -> dict[str, object]:
    return run_experiment(
        build_experiment(resolve_config(None, [*read_overrides(FAST, overrides), *overrides])),
        out,
        resume=resume,
    )


def test_summary_train_flops_is_samples_times_per_sample(tmp_path: Path) -> None:
    """FedAvg, 2 rounds, 20 clients × 3 local steps × batch 10: 1,200 samples of MLR's 31,360
    training FLOPs (2 × 784 × 10 forward, as much for the weight gradient)."""
    summary = run(tmp_path / "a", "rounds=2", "checkpoint_every=0")
    assert summary["train_samples"] == 2 * 20 * 3 * 10
    assert summary["train_flops_per_sample"] == 31_360
    assert summary["train_flops"] == 1_200 * 31_360


def test_sfedhp_counts_every_inner_step(tmp_path: Path) -> None:
    """sFedHP: R·K gradient evaluations per client per round (its own loop over
    ``batched_loss_grad``)."""
    summary = run(
        tmp_path / "s",
        "rounds=1",
        "checkpoint_every=0",
        "algorithm.name=sfedhp",
        "algorithm.R=2",
        "algorithm.K=3",
    )
    evals = summary["gradient_evaluations_per_round"]
    assert evals == 6
    assert summary["train_samples"] == 20 * evals * 10
    assert summary["train_flops"] == 20 * evals * 10 * 31_360


def test_resume_continues_the_count(tmp_path: Path) -> None:
    """A resumed run reports the uninterrupted run's count (the checkpoint holds it); a
    checkpoint written before the count existed gives None, not a partial count."""
    whole = run(tmp_path / "whole", "rounds=3", "checkpoint_every=1")
    part = tmp_path / "part"
    run(part, "rounds=2", "checkpoint_every=1")
    resumed = run(part, "rounds=3", "checkpoint_every=1", resume=True)
    assert resumed["train_samples"] == whole["train_samples"] == 3 * 20 * 3 * 10
    assert resumed["train_flops"] == whole["train_flops"]

    old = tmp_path / "old"
    run(old, "rounds=2", "checkpoint_every=1")
    data = load_checkpoint(old / CHECKPOINT_FILE)
    del data["trained_samples"], data["digest"]  # as written then: version 1, no digest
    data["version"] = 1
    torch.save(data, old / CHECKPOINT_FILE)
    unknown = run(old, "rounds=3", "checkpoint_every=1", resume=True)
    assert unknown["train_samples"] is None and unknown["train_flops"] is None
    assert unknown["train_flops_per_sample"] == 31_360


def test_rounds_on_flower_nodes_report_no_count(tmp_path: Path) -> None:
    """Under the Flower driver the nodes train: the cloud's model counts nothing, so the run
    reports null rather than 0."""
    pytest.importorskip("flwr")
    from tests.flower.helpers import config_args, run_flower_local

    summary, _ = run_flower_local(tmp_path, config_args("fedavg", "rounds=1"))
    assert summary["train_samples"] is None and summary["train_flops"] is None
    assert summary["train_flops_per_sample"] == 31_360
