"""Local epochs: per-client epoch minibatches, weighted losses, and the vectorized run of unequal
clients against a client-by-client reference loop."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fedhp.algorithms.base import ALGORITHMS, Task
from fedhp.comm import CommLedger
from fedhp.data.types import ClientData
from fedhp.engine.context import RunContext
from fedhp.engine.federation import Federation
from fedhp.engine.ops import LocalWork, prox_grad, weighted_sgd_steps
from fedhp.engine.reference import reference_client_sgd
from fedhp.engine.sampler import BatchSampler
from fedhp.errors import ConfigError
from fedhp.models import MODELS
from fedhp.models.base import BatchedModel
from fedhp.models.zoo import MLP, BatchedMLP, CNNOptions, DNNOptions
from fedhp.topology import Topology
from tests.flower.helpers import (
    assert_same_metrics,
    config_args,
    read_csv,
    run_flower_local,
    run_inprocess,
)
from tests.policies import use_policy

COUNTS = (5, 13, 27, 1)
TINY_VGG_BN = {"name": "vgg", "cfg": [4, "M", 8, "M"], "batch_norm": True}
SHAPE = (1, 8, 8)
CLASSES = 3


def unequal_context(model: BatchedModel, counts: tuple[int, ...] = COUNTS) -> RunContext:
    """A tiny federation of image-shaped random data with unequal clients."""
    g = torch.Generator().manual_seed(0)
    empty_x, empty_y = torch.zeros(0, *SHAPE), torch.zeros(0, dtype=torch.long)
    clients = [
        ClientData(
            torch.randn(n, *SHAPE, generator=g) + c,
            torch.randint(0, CLASSES, (n,), generator=g),
            empty_x,
            empty_y,
            empty_x,
            empty_y,
        )
        for c, n in enumerate(counts)
    ]
    fed = Federation.from_clients(clients, CLASSES)
    gen = torch.Generator().manual_seed(1)
    return RunContext(
        model=model,
        fed=fed,
        topology=Topology.build(len(counts), 1),
        ledger=CommLedger(),
        generator=gen,
        sampler=BatchSampler(fed.train.counts, gen),
    )


def test_each_epoch_visits_every_own_sample_once() -> None:
    counts = torch.tensor(COUNTS)
    plan = BatchSampler(counts, torch.Generator().manual_seed(0)).epochs(torch.arange(4), 6, 2)
    per_epoch = max((n + 5) // 6 for n in COUNTS)
    assert plan.num_steps == 2 * per_epoch and plan.index.shape == (2 * per_epoch, 4, 6)
    assert plan.steps.tolist() == [2 * ((n + 5) // 6) for n in COUNTS]
    for c, n in enumerate(COUNTS):
        for e in range(2):
            idx = plan.index[e * per_epoch : (e + 1) * per_epoch, c]
            w = plan.weight[e * per_epoch : (e + 1) * per_epoch, c]
            assert sorted(idx[w > 0].tolist()) == list(range(n))  # a permutation of its own data
            assert bool((idx[w == 0] == 0).all())
            assert int((w.sum(1) > 0).sum()) == (n + 5) // 6  # ceil(n/B) non-empty steps
    first = plan.index[:per_epoch, 2][plan.weight[:per_epoch, 2] > 0]
    second = plan.index[per_epoch:, 2][plan.weight[per_epoch:, 2] > 0]
    assert not torch.equal(first, second)  # a fresh permutation per epoch


def test_no_clients_still_consume_the_generator_like_everyone_else() -> None:
    counts = torch.tensor(COUNTS)
    a, b = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    empty = BatchSampler(counts, a).epochs(torch.zeros(0, dtype=torch.long), 4, 2)
    BatchSampler(counts, b).epochs(torch.arange(4), 4, 2)
    assert empty.num_steps == 0 and empty.steps.numel() == 0
    assert torch.equal(a.get_state(), b.get_state())
    ctx = unequal_context(DNNOptions(hidden=[4]).build(SHAPE, CLASSES))
    none = torch.zeros(0, dtype=torch.long)
    params, loss, steps = ctx.local_sgd(
        torch.zeros(0, ctx.model.num_params), none, LocalWork(0.1, 4, epochs=2)
    )
    assert params.shape == (0, ctx.model.num_params) and loss.numel() == steps.numel() == 0


def test_epochs_do_not_depend_on_who_else_takes_part() -> None:
    counts = torch.tensor(COUNTS)
    alone = BatchSampler(counts, torch.Generator().manual_seed(3)).epochs(torch.tensor([1]), 4, 2)
    every = BatchSampler(counts, torch.Generator().manual_seed(3)).epochs(torch.arange(4), 4, 2)
    per_alone, per_every = alone.num_steps // 2, every.num_steps // 2
    for e in range(2):
        a = alone.index[e * per_alone : (e + 1) * per_alone, 0].flatten()
        wa = alone.weight[e * per_alone : (e + 1) * per_alone, 0].flatten()
        b = every.index[e * per_every : (e + 1) * per_every, 1].flatten()
        wb = every.weight[e * per_every : (e + 1) * per_every, 1].flatten()
        assert torch.equal(a[wa > 0], b[wb > 0])


@pytest.mark.parametrize("kind", ["dnn", "cnn"])
def test_weighted_loss_and_grad_match_autograd_on_valid_samples(kind: str) -> None:
    model = (
        DNNOptions(hidden=[7]).build(SHAPE, CLASSES)
        if kind == "dnn"
        else CNNOptions().build(SHAPE, CLASSES)
    )
    g = torch.Generator().manual_seed(0)
    flat = torch.stack([model.init_params(s) for s in range(3)])
    x = torch.randn(3, 5, *SHAPE, generator=g)
    y = torch.randint(0, CLASSES, (3, 5), generator=g)
    weight = torch.tensor([[1.0] * 5, [1.0, 1.0, 0.0, 0.0, 0.0], [0.0] * 5])
    loss, grad = model.loss_and_grad(flat, x, y, weight=weight)
    for c in range(2):
        keep = weight[c] > 0
        module = model.make_module(flat[c])
        ref = F.cross_entropy(module(x[c][keep]), y[c][keep])
        ref.backward()
        ref_grad = torch.cat([p.grad.reshape(-1) for p in module.parameters()])  # type: ignore[union-attr]
        assert abs(float(loss[c]) - float(ref.detach())) < 1e-5
        assert (grad[c] - ref_grad).abs().max().item() < 1e-5
    assert float(loss[2]) == 0.0 and float(grad[2].abs().max()) == 0.0
    plain_loss, plain_grad = model.loss_and_grad(flat, x, y)
    ones_loss, ones_grad = model.loss_and_grad(flat, x, y, weight=torch.ones(3, 5))
    assert (plain_loss - ones_loss).abs().max().item() < 1e-6
    assert (plain_grad - ones_grad).abs().max().item() < 1e-6


def build_kind(kind: str) -> BatchedModel:
    if kind == "dnn":
        return DNNOptions(hidden=[16]).build(SHAPE, CLASSES)
    if kind == "cnn":
        return CNNOptions().build(SHAPE, CLASSES)
    return MODELS.build(TINY_VGG_BN, "model").build(SHAPE, CLASSES)


@pytest.mark.parametrize(
    ("kind", "chunked", "direct"),
    [
        ("dnn", False, False),
        ("dnn", True, False),
        ("cnn", False, False),
        ("vgg-bn", False, False),
        ("vgg-bn", True, False),
        ("vgg-bn", True, True),
    ],
)
def test_local_epochs_match_per_client_reference_loop(
    kind: str, chunked: bool, direct: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unequal clients (partial last batches) against a loop of real smaller batches: for
    BatchNorm, parameters and running statistics come from the real samples only; ``direct``:
    one client per chunk run without vmap, as the engine runs large models."""
    model = build_kind(kind)
    if chunked:  # one client per chunk: finished clients' steps are skipped, not computed
        use_policy(model, cache_floats=1)
    if direct:
        use_policy(model, direct_min_params=1)
    ctx = unequal_context(model)
    clients = ctx.all_clients
    start = torch.stack([model.init_params(s) for s in range(len(COUNTS))])
    buffers = model.init_buffers().expand(len(COUNTS), -1).clone() if model.num_buffers else None
    ref_buffers = None if buffers is None else buffers.clone()
    state = ctx.generator.get_state()
    params, loss_sum, steps = ctx.local_sgd(
        start, clients, LocalWork(0.1, 6, epochs=2), buffers=buffers
    )
    ctx.generator.set_state(state)
    plan = ctx.sampler.epochs(clients, 6, 2)
    assert torch.equal(steps, plan.steps)
    batches: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
    lo = ctx.fed.train.offsets
    for c in range(len(COUNTS)):
        x_c, y_c = ctx.fed.train.x[lo[c] : lo[c + 1]], ctx.fed.train.y[lo[c] : lo[c + 1]]
        own = []
        for s in range(plan.num_steps):
            keep = plan.index[s, c][plan.weight[s, c] > 0]
            if len(keep):
                own.append((x_c[keep], y_c[keep]))
        assert len(own) == int(steps[c])
        batches.append(own)
    reference = reference_client_sgd(model, start, batches, 0.1, buffers=ref_buffers)
    assert (params - reference).abs().max().item() < 1e-5
    if buffers is not None and ref_buffers is not None:
        assert (buffers - ref_buffers).abs().max().item() < 1e-5
        assert (buffers - model.init_buffers()).abs().max().item() > 1e-3
    assert (params - start).abs().max().item() > 1e-3
    assert bool((loss_sum > 0).all())


def test_finished_clients_are_frozen_even_with_a_prox_term() -> None:
    model = DNNOptions(hidden=[4]).build(SHAPE, CLASSES)
    start = torch.stack([model.init_params(s) for s in range(2)])
    center = model.init_params(9)
    x = torch.randn(2, 3, *SHAPE)
    y = torch.zeros(2, 3, dtype=torch.long)
    weight = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])

    def batch(step: int, rows: slice) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return x[rows], y[rows], weight[rows]

    params, _ = weighted_sgd_steps(model, start, batch, 3, 0.1, prox_grad(center, 1.0))
    assert torch.equal(params[1], start[1])
    assert not torch.equal(params[0], start[0])


def test_fedavg_round_reports_real_step_counts() -> None:
    model = DNNOptions(hidden=[8]).build(SHAPE, CLASSES)
    ctx = unequal_context(model)
    opts = ALGORITHMS.build({"name": "fedavg", "local_epochs": 3, "batch_size": 4}, "algorithm")
    algo = opts.build(ctx)
    state = algo.init_state(model.init_params(0))
    task = Task(ctx.all_clients, broadcast={"global": state["global"]})
    update = algo.train(state, task)
    assert update.steps is not None
    assert update.steps.tolist() == [3 * ((n + 3) // 4) for n in COUNTS]
    stats = algo.aggregate(state, task, update)
    expected = sum(3 * ((n + 3) // 4) for n in COUNTS) / len(COUNTS)
    assert stats["local_steps_mean"] == pytest.approx(expected)
    assert stats["local_steps_min"] == 3 and stats["local_steps_max"] == 21
    # Flower does not carry ``steps``: the cloud derives the same counts from the sample counts.
    update.steps = None
    assert algo.local_work_stats(task, update)["local_steps_mean"] == pytest.approx(expected)


@pytest.mark.parametrize("name", ["fedavg", "fedprox", "local", "heurfedamp"])
def test_steps_and_epochs_are_exclusive(name: str) -> None:
    with pytest.raises(ConfigError, match="local_steps or local_epochs"):
        ALGORITHMS.build({"name": name, "local_steps": 5, "local_epochs": 1}, "algorithm")
    assert ALGORITHMS.build({"name": name, "local_epochs": 2}, "algorithm").local_work() == (
        "local_epochs=2"
    )
    assert ALGORITHMS.build({"name": name}, "algorithm").local_work() == "local_steps=20"


@pytest.mark.slow
def test_flower_nodes_give_the_in_process_metrics_under_local_epochs(tmp_path: Path) -> None:
    """Nodes draw the same epoch permutations as the in-process engine; the cloud derives the
    step counts the update does not carry."""
    args = [
        a
        for a in config_args("fedavg", "rounds=2", "algorithm.local_epochs=1")
        if not a.startswith("algorithm.local_steps")
    ]
    args += ["federation.client_fraction=0.5", "partition.name=dirichlet"]
    run_inprocess(tmp_path / "a", args)
    _, driver = run_flower_local(tmp_path / "b", args)
    assert_same_metrics(tmp_path / "a", tmp_path / "b")
    assert not driver.events
    assert "local_steps_mean" in read_csv(tmp_path / "b" / "metrics.csv")[0]


class _CountingMLP(BatchedMLP):
    """A stand-in for a BatchNorm model: every call bumps each client's one "buffer" by 1, as a
    running-statistics update would (padding included)."""

    def loss_and_grad(  # type: ignore[override]
        self,
        flat: torch.Tensor,
        x: torch.Tensor,
        y: torch.Tensor,
        *,
        weight: torch.Tensor | None = None,
        buffers: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if buffers is not None:
            buffers.add_(1.0)
        return super().loss_and_grad(flat, x, y, weight=weight)


@pytest.mark.parametrize("chunked", [False, True])
def test_buffers_are_updated_only_at_a_clients_real_steps(
    chunked: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _CountingMLP(MLP([64, 8, CLASSES]), SHAPE, CLASSES)
    if chunked:
        use_policy(model, cache_floats=1)
    ctx = unequal_context(model)
    buffers = torch.zeros(len(COUNTS), 1)
    start = model.init_params(0).expand(len(COUNTS), -1)
    _, _, steps = ctx.local_sgd(
        start, ctx.all_clients, LocalWork(0.1, 6, epochs=2), buffers=buffers
    )
    assert buffers[:, 0].tolist() == steps.float().tolist()
