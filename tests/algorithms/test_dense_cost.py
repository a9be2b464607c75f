"""The dense methods' device model (``capabilities: off|fix|dyn``,
:class:`fedhp.algorithms.device_cost.DenseCostModel`): off changes nothing, on changes no training,
T_k and the round time by hand, Fix vs Dyn, exact resume, one-line errors."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from fedhp.algorithms.device_cost import (
    DOWN_BYTES_PER_S,
    PEAK_FLOPS,
    UP_BYTES_PER_S,
    capability_generator,
    draw_capabilities,
)
from fedhp.api import run
from fedhp.errors import ConfigError
from tests.conftest import small_experiment

DENSE = ("fedavg", "fedper", "ditto", "perfedavg")
RUN = dict(
    progress=False,
    subsample__train=2500,
    subsample__test=400,
    partition__test_per_class=30,
    federation__client_fraction=0.25,
    eval_every=1,
    checkpoint_every=1,
    threads=1,
    seed=3,
    model__name="dnn",
    model__hidden=[8],
)
OUTPUTS = ("metrics.csv", "per_client.csv", "final_state.pt")


def _run(out: Path, name: str, rounds: int = 2, **extra: object) -> None:
    steps = {"algorithm__local_steps": 2} if name == "perfedavg" else {"algorithm__local_epochs": 1}
    run(out=out, rounds=rounds, algorithm__name=name, **{**RUN, **steps, **extra})


def _rows(folder: Path) -> list[dict[str, str]]:
    with (folder / "metrics.csv").open() as f:
        return list(csv.DictReader(f))


def _checkpoint(folder: Path) -> dict:
    return torch.load(folder / "checkpoint.pt", weights_only=True)


def _same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], keys: set[str]) -> bool:
    return all(torch.equal(a[k], b[k]) for k in keys)


@pytest.mark.parametrize("name", DENSE)
def test_off_is_the_option_absent_byte_for_byte(tmp_path: Path, name: str) -> None:
    """``capabilities=off`` writes the bytes of a run that never names it, and its checkpoint
    holds the same state, generators and ledger (torch's global RNG is not the run's)."""
    _run(tmp_path / "absent", name)
    _run(tmp_path / "off", name, algorithm__capabilities="off")
    for file in OUTPUTS:
        assert (tmp_path / "absent" / file).read_bytes() == (tmp_path / "off" / file).read_bytes()
    a, b = _checkpoint(tmp_path / "absent"), _checkpoint(tmp_path / "off")
    assert set(a["state"]) == set(b["state"]) and "capability" not in a["state"]
    assert _same_tensors(a["state"], b["state"], set(a["state"]))
    assert set(a["rng"]) == set(b["rng"])  # no capability generator when off
    assert _same_tensors(a["rng"], b["rng"], set(a["rng"]) - {"torch"})
    assert a["ledger"] == b["ledger"] and a["rows"] == b["rows"]
    assert "sim_time_s" not in _rows(tmp_path / "off")[0]


@pytest.mark.parametrize("name", DENSE)
def test_on_trains_exactly_as_off(tmp_path: Path, name: str) -> None:
    """Dyn capabilities change no model, accuracy, loss or byte: every column of the off run is
    equal, the state agrees on every shared entry, the training generators end in the same
    state; the cost columns are added."""
    _run(tmp_path / "off", name)
    _run(tmp_path / "dyn", name, algorithm__capabilities="dyn")
    off, dyn = _rows(tmp_path / "off"), _rows(tmp_path / "dyn")
    assert [{k: r[k] for k in off[0]} for r in dyn] == off
    assert set(dyn[0]) - set(off[0]) == {"sim_time_s", "round_sim_time_s", "flops"}
    assert float(dyn[1]["sim_time_s"]) == pytest.approx(
        float(dyn[0]["round_sim_time_s"]) + float(dyn[1]["round_sim_time_s"]), rel=1e-12
    )
    a, b = _checkpoint(tmp_path / "off"), _checkpoint(tmp_path / "dyn")
    assert set(b["state"]) - set(a["state"]) == {"capability", "sim_time_s", "flops"}
    assert _same_tensors(a["state"], b["state"], set(a["state"]))
    assert set(b["rng"]) - set(a["rng"]) == {"algorithm.capability_generator"}
    assert _same_tensors(a["rng"], b["rng"], set(a["rng"]) - {"torch"})
    assert a["ledger"] == b["ledger"]
    assert (tmp_path / "off" / "per_client.csv").read_bytes() == (
        tmp_path / "dyn" / "per_client.csv"
    ).read_bytes()


def _forward_flops(exp) -> float:  # type: ignore[no-untyped-def]
    """The DNN 784-100-10's forward FLOPs per sample, by hand."""
    assert exp.model.num_params == 784 * 100 + 100 + 100 * 10 + 10
    return 2.0 * (784 * 100 + 100 * 10)


@pytest.mark.parametrize("name", DENSE)
def test_round_time_by_hand(name: str) -> None:
    """Two selected clients with z = 1 and ¼ (Fix): T_k = 3 × forward FLOPs × samples /
    (z · 727 GFLOP/s) + bytes up / 14 MB/s + bytes down / 110.6 MB/s, the round its slower
    client's. Samples: a client's n_k real samples per epoch (its partial last batch of 7
    counted by its real samples), twice for Ditto, 2 batches per Per-FedAvg step; bytes: the
    dense model (FedPer: its body) each way, 4 bytes an entry."""
    budget = "algorithm.local_steps=3" if name == "perfedavg" else "algorithm.local_epochs=1"
    exp = small_experiment(
        f"algorithm.name={name}",
        "algorithm.capabilities=fix",
        "federation.client_fraction=0.1",  # 2 of the 20 clients
        "algorithm.batch_size=7",
        budget,
    )
    algo, ctx = exp.algorithm, exp.ctx
    state = algo.init_state(exp.model.init_params(0))
    state["capability"] = torch.tensor([1.0, 0.25]).repeat(10).double()
    task = algo.plan(state, 0)
    clients = task.clients
    assert len(clients) == 2
    counts = ctx.fed.train.counts[clients].double()
    if name == "perfedavg":
        samples = torch.full((2,), 2.0 * 3 * 7, dtype=torch.float64)
    else:
        samples = counts * (2 if name == "ditto" else 1)
        assert bool((counts % 7 != 0).any())  # a partial last batch
    entries = len(algo.body_idx) if name == "fedper" else exp.model.num_params
    z = state["capability"][clients]
    flops = 3 * _forward_flops(exp) * samples
    t = flops / (z * PEAK_FLOPS) + 4.0 * entries / UP_BYTES_PER_S + 4.0 * entries / DOWN_BYTES_PER_S
    stats = algo.aggregate(state, task, algo.train(state, task))
    assert stats["round_sim_time_s"] == pytest.approx(float(t.max()), rel=1e-12)
    assert stats["sim_time_s"] == stats["round_sim_time_s"]
    assert stats["flops"] == float(flops.sum())
    assert float(state["flops"]) == stats["flops"]
    round_bytes = ctx.ledger.end_round()
    assert round_bytes["bytes_client_cloud_up"] == 2 * 4 * entries  # what was billed


def test_fix_keeps_and_dyn_redraws_from_their_own_stream() -> None:
    """Capabilities are drawn from ``capability_generator`` (the run's seed), never from the
    training generator: Fix keeps the first draw, Dyn draws again at every later round."""
    for mode in ("fix", "dyn"):
        exp = small_experiment("algorithm.name=ditto", f"algorithm.capabilities={mode}")
        algo = exp.algorithm
        gen = capability_generator(torch.Generator().manual_seed(exp.ctx.generator.initial_seed()))
        draws = [draw_capabilities(20, gen) for _ in range(3)]
        state = algo.init_state(exp.model.init_params(0))
        assert torch.equal(state["capability"], draws[0])
        for rnd in range(3):
            algo.plan(state, rnd)
            assert torch.equal(state["capability"], draws[rnd if mode == "dyn" else 0])
    assert not torch.equal(draws[0], draws[1])


def test_a_dyn_run_resumes_bit_identically(tmp_path: Path) -> None:
    """3 rounds straight = 2 rounds, a checkpoint and --resume to 3 (Ditto, Dyn: the capability
    generator and the running totals are in the checkpoint)."""
    from fedhp.cli import main

    _run(tmp_path / "a", "ditto", rounds=3, algorithm__capabilities="dyn")
    _run(tmp_path / "b", "ditto", rounds=2, algorithm__capabilities="dyn")
    assert main(["run", "--resume", str(tmp_path / "b"), "rounds=3"]) == 0
    assert _rows(tmp_path / "a") == _rows(tmp_path / "b")
    a, b = (torch.load(tmp_path / d / "final_state.pt", weights_only=True)["state"] for d in "ab")
    assert set(a) == set(b) and _same_tensors(a, b, set(a))
    assert float(_rows(tmp_path / "a")[-1]["sim_time_s"]) > 0


@pytest.mark.parametrize(
    ("name", "value"),
    [("fedavg", "sometimes"), ("perfedavg", "true"), ("fedper", "1"), ("moon", "dyn")],
)
def test_bad_values_are_one_line_errors(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=r"^algorithm\.capabilities: ") as err:
        small_experiment(f"algorithm.name={name}", f"algorithm.capabilities={value}")
    assert "\n" not in str(err.value)
