"""Engine building blocks: sampling, aggregation, topology, evaluation, communication."""

from __future__ import annotations

import pytest
import torch

from fedhp.engine.evaluate import evaluate_personal, evaluate_shared
from fedhp.engine.federation import ClientTensors
from fedhp.engine.ops import batched_loss_grad, segment_mean, weighted_mean
from fedhp.engine.runner import run_experiment
from fedhp.engine.sampler import BatchSampler
from fedhp.errors import ConfigError
from fedhp.topology import Topology
from tests.conftest import small_experiment


def test_sampler_without_replacement_stays_in_range_and_is_distinct() -> None:
    counts = torch.tensor([30, 5, 100])
    sampler = BatchSampler(counts, torch.Generator().manual_seed(0))
    for _ in range(20):
        idx = sampler.draw(torch.arange(3), 8)
        assert idx.shape == (3, 8)
        assert bool((idx < counts.unsqueeze(1)).all()) and bool((idx >= 0).all())
        assert len(set(idx[0].tolist())) == 8 and len(set(idx[2].tolist())) == 8
        assert set(idx[1].tolist()) == set(range(5))  # a small client repeats, covering all


def test_sampler_is_seeded() -> None:
    counts = torch.tensor([50, 60])
    a = BatchSampler(counts, torch.Generator().manual_seed(1)).draw(torch.arange(2), 10)
    b = BatchSampler(counts, torch.Generator().manual_seed(1)).draw(torch.arange(2), 10)
    c = BatchSampler(counts, torch.Generator().manual_seed(2)).draw(torch.arange(2), 10)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_segment_mean_and_weighted_mean() -> None:
    params = torch.tensor([[1.0, 2.0], [3.0, 4.0], [10.0, 0.0]])
    seg = torch.tensor([0, 0, 1])
    w = torch.tensor([1.0, 3.0, 2.0])
    out = segment_mean(params, seg, w, 2)
    torch.testing.assert_close(out, torch.tensor([[2.5, 3.5], [10.0, 0.0]]))
    torch.testing.assert_close(weighted_mean(params, w), (w / 6) @ params)


def test_uneven_topology() -> None:
    topo = Topology.build(7, 3, [1, 4, 2])
    assert topo.edge_of_client.tolist() == [0, 1, 1, 1, 1, 2, 2]
    assert topo.edge_sizes == [1, 4, 2]
    assert Topology.build(20, 4).clients_of(1).tolist() == [5, 6, 7, 8, 9]
    with pytest.raises(ConfigError, match="edge_sizes"):
        Topology.build(7, 3, [1, 1, 1])


def test_batched_gradient_rows_are_per_client_gradients() -> None:
    exp = small_experiment("model.name=mlr")
    ctx = exp.ctx
    x, y = ctx.batches(ctx.all_clients, 10)()
    params = torch.stack([exp.model.init_params(s) for s in range(ctx.num_clients)])
    loss, grad = batched_loss_grad(exp.model, params, x, y)
    for c in (0, 7):
        module = exp.model.make_module(params[c])
        ref = torch.nn.functional.cross_entropy(module(x[c]), y[c])
        ref.backward()
        ref_grad = torch.cat([p.grad.reshape(-1) for p in module.parameters()])
        torch.testing.assert_close(grad[c], ref_grad, atol=1e-6, rtol=1e-5)
        assert abs(float(loss[c]) - ref.item()) < 1e-5


def test_evaluation_is_micro_averaged_over_own_test_sets() -> None:
    exp = small_experiment("model.name=mlr")
    fed = exp.ctx.fed
    w = exp.model.init_params(0)
    shared = evaluate_shared(exp.model, w, fed.test)
    personal = evaluate_personal(exp.model, w.expand(fed.num_clients, -1), fed.test, width=37)
    torch.testing.assert_close(shared.correct, personal.correct)
    module = exp.model.make_module(w)
    manual = (module(fed.test.x).argmax(1) == fed.test.y).double().mean().item()
    assert abs(shared.accuracy - manual) < 1e-12
    assert int(shared.count.sum()) == 8000  # Setting 1: 800 test samples x 10 classes


def test_uneven_clients_evaluate_only_their_own_samples() -> None:
    xs = [torch.randn(n, 4) for n in (3, 9)]
    ys = [torch.zeros(n, dtype=torch.long) for n in (3, 9)]
    data = ClientTensors.from_parts(xs, ys, torch.device("cpu"))
    x, y, valid = data.windows(0, 9)
    assert valid.sum(1).tolist() == [3, 9]
    torch.testing.assert_close(x[0, :3], xs[0])


def test_equal_clients_windows_are_views_of_their_rows() -> None:
    xs = [torch.randn(5, 4) for _ in range(3)]
    ys = [torch.randint(0, 3, (5,)) for _ in range(3)]
    data = ClientTensors.from_parts(xs, ys, torch.device("cpu"))
    x, y, valid = data.windows(1, 3)
    assert x.data_ptr() == data.x[1].data_ptr() and bool(valid.all())  # no copy
    for c in range(3):
        torch.testing.assert_close(x[c], xs[c][1:4], rtol=0, atol=0)
        torch.testing.assert_close(y[c], ys[c][1:4], rtol=0, atol=0)
    x, _, valid = data.windows(3, 4)  # past the end: the gathered path, last sample repeated
    assert valid.sum(1).tolist() == [2, 2, 2]
    torch.testing.assert_close(x[2, 3], xs[2][4], rtol=0, atol=0)


def test_fedavg_run_writes_results_and_counts_bytes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    exp = small_experiment("rounds=3", "model.name=mlr", "algorithm.local_steps=2")
    summary = run_experiment(exp, tmp_path, progress=False)
    for name in ("config.yaml", "metrics.csv", "per_client.csv", "summary.json", "plot.png"):
        assert (tmp_path / name).stat().st_size > 0
    comm = summary["communication"]
    # 3 rounds x 20 clients x 7,850 fp32 parameters each way.
    assert comm["bytes_client_cloud_up"] == comm["bytes_client_cloud_down"] == 3 * 20 * 7850 * 4
    assert summary["final_global_acc"] > 0.5


def test_hierfavg_counts_both_links() -> None:
    exp = small_experiment("algorithm.name=hierfavg", "model.name=mlr")
    state = exp.algorithm.init_state(exp.model.init_params(0))
    exp.algorithm.run_round(state, 0)
    comm = exp.ctx.ledger.end_round()
    kappa2 = exp.options.kappa2  # type: ignore[attr-defined]
    assert comm["messages_client_edge_up"] == 20 * kappa2
    assert comm["messages_edge_cloud_up"] == 4


def test_perfedavg_evaluation_traffic_is_billed_on_its_own_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Per-FedAvg's personalized evaluation sends the global model to every client: billed on
    the ``client_cloud_eval`` link at each evaluated round only, and reported."""
    exp = small_experiment(
        "algorithm.name=perfedavg",
        "model.name=mlr",
        "algorithm.local_steps=1",
        "rounds=3",
        "eval_every=2",
        "partition.train_per_class=20",
        "partition.test_per_class=20",
    )
    summary = run_experiment(exp, tmp_path, progress=False)
    comm = summary["communication"]
    p, c = exp.model.num_params, exp.ctx.num_clients
    assert comm["messages_client_cloud_eval_down"] == 2 * c  # rounds 2 and 3 are evaluated
    assert comm["dense_bytes_client_cloud_eval_down"] == 2 * c * 4 * p
    assert comm["messages_client_cloud_eval_up"] == 0
    assert comm["messages_client_cloud_down"] == 3 * c  # training traffic unchanged
    header = (tmp_path / "metrics.csv").read_text().splitlines()[0].split(",")
    assert "round_bytes_client_cloud_eval" in header and "cum_bytes_client_cloud_eval" in header


def test_resampled_feature_noise_runs_are_deterministic() -> None:
    """Fresh noise per access comes from the run's generator: the same seed gives the same
    model, and the noise really enters training (differs from the clean split)."""
    from tests.conftest import small_experiment

    args = ["partition.name=feature_noise", "partition.noise=0.5", "algorithm.local_steps=3"]
    models = []
    for extra in (["partition.resample=true"], ["partition.resample=true"], ["partition.noise=0"]):
        exp = small_experiment(*args, *extra)
        state = exp.algorithm.init_state(exp.model.init_params(0))
        exp.algorithm.run_round(state, 0)
        models.append(state["global"])
    assert torch.equal(models[0], models[1])
    assert not torch.equal(models[0], models[2])
