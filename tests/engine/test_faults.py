"""Simulated client dropout, edge failure and stragglers."""

from __future__ import annotations

import pytest
import torch

from fedhp.algorithms import ALGORITHMS
from fedhp.build import build_experiment
from fedhp.config import FaultsConfig, resolve_config
from fedhp.engine.faults import FaultModel, RoundSkipped
from fedhp.engine.runner import run_experiment
from fedhp.unread import read_overrides

FAST = [
    "progress=false",
    "threads=2",
    "model.name=mlr",
    "algorithm.name=fedavg",
    "algorithm.local_steps=2",
    "rounds=2",
]


def experiment(*overrides: str):  # noqa: ANN201 - an Experiment
    return build_experiment(resolve_config(None, [*read_overrides(FAST, overrides), *overrides]))


def test_failures_are_reproducible_nested_and_seeded() -> None:
    def model(p: float, seed: int = 0, offset: int = 0) -> FaultModel:
        cfg = FaultsConfig(client_dropout=p, straggler=0.2, edge_failure=0.3, seed_offset=offset)
        return FaultModel(cfg, seed, 200, 10)

    a, b = model(0.3).draw(5), model(0.3).draw(5)
    assert torch.equal(a.dropped, b.dropped) and torch.equal(a.edge_failed, b.edge_failed)
    assert 30 < int(a.dropped.sum()) < 90  # about 60 of 200
    assert not (a.dropped & a.straggler).any()
    more = model(0.6).draw(5)
    assert bool((a.dropped <= more.dropped).all())  # raising p only adds dropouts
    assert not torch.equal(a.dropped, model(0.3).draw(6).dropped)
    assert not torch.equal(a.dropped, model(0.3, seed=1).draw(5).dropped)
    assert not torch.equal(a.dropped, model(0.3, offset=1).draw(5).dropped)
    assert not FaultModel(FaultsConfig(), 0, 20, 4).draw(0).dropped.any()


def test_flat_sampling_leaves_out_dropped_and_stragglers() -> None:
    exp = experiment("faults.client_dropout=0.3", "faults.straggler=0.2")
    ctx = exp.ctx
    faults = ctx.begin_round(3)
    assert faults is not None
    clients = ctx.participation.sample_clients()
    expected = torch.arange(ctx.num_clients)[faults.available]
    assert torch.equal(clients, expected)
    assert ctx.participation.round_stragglers is not None
    assert torch.equal(
        ctx.participation.round_stragglers, torch.arange(ctx.num_clients)[faults.straggler]
    )


def test_hierarchical_sampling_leaves_out_failed_edges() -> None:
    exp = experiment("algorithm.name=hierfavg", "faults.edge_failure=0.5")
    ctx = exp.ctx
    for rnd in range(20):
        faults = ctx.begin_round(rnd)
        assert faults is not None
        if bool(faults.edge_failed.all()):
            with pytest.raises(RoundSkipped):
                ctx.participation.sample_edges()
            continue
        edges = ctx.participation.sample_edges()
        assert not faults.edge_failed[edges].any()
        clients, seg = ctx.participation.clients_of_edges(edges)
        assert torch.equal(ctx.topology.edge_of_client[clients], edges[seg])
        assert not faults.edge_failed[ctx.topology.edge_of_client[clients]].any()


def test_all_clients_dropped_skips_rounds_and_keeps_the_model(
    capsys: pytest.CaptureFixture[str],
) -> None:
    exp = experiment("faults.client_dropout=1.0")
    init = exp.model.init_params(exp.cfg.seed)
    summary = run_experiment(exp, None)
    assert "round skipped" in capsys.readouterr().err
    assert summary["rounds"] == 2
    assert summary["communication"]["bytes_total"] == 0
    # the global model never moved: accuracy equals the initial model's
    fresh = experiment()
    state = fresh.algorithm.init_state(init)
    from fedhp.engine.runner import evaluate_state

    assert summary["final_global_acc"] == evaluate_state(fresh, state)[0]["global_acc"]


def test_communication_counts_only_what_was_sent() -> None:
    exp = experiment("faults.client_dropout=0.3", "faults.straggler=0.2", "rounds=1")
    faults = exp.ctx.participation.faults
    assert faults is not None
    f = faults.draw(0)
    available, stragglers = int(f.available.sum()), int(f.straggler.sum())
    p = exp.model.num_params
    summary = run_experiment(exp, None)
    comm = summary["communication"]
    assert comm["messages_client_cloud_up"] == available
    assert comm["messages_client_cloud_down"] == available + stragglers
    assert comm["dense_bytes_client_cloud_up"] == 4 * p * available


def test_absent_clients_keep_their_personal_state() -> None:
    assert "sfedhp" in ALGORITHMS.names()
    exp = experiment(
        "algorithm.name=sfedhp", "algorithm.R=1", "algorithm.K=1", "faults.client_dropout=0.5"
    )
    state = exp.algorithm.init_state(exp.model.init_params(0))
    before = state["theta"].clone()
    faults = exp.ctx.begin_round(0)
    assert faults is not None
    exp.algorithm.run_round(state, 0)
    absent = ~faults.available
    assert absent.any() and faults.available.any()
    assert torch.equal(state["theta"][absent], before[absent])
    assert not torch.equal(state["theta"][faults.available], before[faults.available])


# Algorithms checked to converge under 30% client dropout; extend as algorithms are added.
# Each entry: (overrides, rounds). MNIST Setting 1 with MLR (fast; see docs/reliability.md for DNN).
DROPOUT_CASES = {
    "fedavg": (["algorithm.name=fedavg", "algorithm.local_steps=10", "model.name=mlr"], 30),
    "sfedhp": (
        [
            "algorithm.name=sfedhp",
            "algorithm.lam=15",
            "algorithm.R=5",
            "algorithm.K=2",
            "model.name=mlr",
        ],
        20,
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(DROPOUT_CASES))
def test_converges_with_30_percent_client_dropout(name: str) -> None:
    assert name in ALGORITHMS.names(), f"{name} is not registered"
    overrides, rounds = DROPOUT_CASES[name]
    base = ["progress=false", "threads=2", f"rounds={rounds}", "eval_every=1000", *overrides]

    def final_acc(*extra: str) -> float:
        exp = build_experiment(resolve_config(None, [*base, *extra]))
        summary = run_experiment(exp, None)
        return float(summary["final_global_acc"])

    clean = final_acc()
    dropped = final_acc("faults.client_dropout=0.3")
    print(f"{name}: {rounds} rounds, global acc {clean:.4f} -> {dropped:.4f} with 30% dropout")
    assert clean > 0.7
    assert dropped >= clean - 0.03


def test_sfedhp_stragglers_are_billed_every_edge_message_once() -> None:
    """sFedHP bills its stragglers' 2R edge messages itself; the runner adds nothing on top."""
    exp = experiment(
        "algorithm.name=sfedhp",
        "algorithm.R=2",
        "algorithm.K=1",
        "faults.client_dropout=0.2",
        "faults.straggler=0.3",
        "rounds=1",
    )
    assert exp.ctx.participation.faults is not None
    f = exp.ctx.participation.faults.draw(0)
    available, stragglers = int(f.available.sum()), int(f.straggler.sum())
    assert stragglers > 0 and available > 0
    comm = run_experiment(exp, None)["communication"]
    assert comm["messages_client_edge_up"] == 2 * available
    assert comm["messages_client_edge_down"] == 2 * 2 * (available + stragglers)
