"""The Flower round driver with in-process nodes: same metrics as the in-process engine for every
algorithm, and the fault handling (missing, error, malformed replies)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Array, RecordDict

from fedhp.build import build_experiment
from fedhp.config import resolve_config
from fedhp.engine.checkpoint import FINAL_STATE_FILE
from fedhp.engine.runner import run_experiment
from fedhp.flower.cloud import FlowerDriver
from fedhp.flower.local import LocalTransport
from fedhp.flower.messages import ARRAYS, ENC, LEN, META, SHAPE, from_record
from fedhp.flower.shards import make_shards, node_count
from tests.conftest import small_experiment
from tests.flower.helpers import (
    assert_same_metrics,
    config_args,
    read_csv,
    run_flower_local,
    run_inprocess,
)

P_MLR = 7850  # 784 * 10 + 10


@pytest.mark.parametrize(
    ("name", "extra"),
    [
        ("fedavg", ()),
        ("fedprox", ()),
        ("hierfavg", ("flower.nodes=2",)),  # two edges per node
        (
            "sfedhp",
            (
                "algorithm.gamma1=0.001",
                "algorithm.gamma2=0.001",
                "algorithm.sparse_schedule=true",
                "algorithm.density_target=0.99",
                "algorithm.gamma2_switch_round=1",
                "comm.zero_threshold=1e-4",
            ),
        ),
        ("sfedhp", ("federation.edges_per_round=2", "algorithm.all_edges_train=true")),
        # stragglers receive every edge broadcast: billed on the nodes, as in-process
        ("sfedhp", ("faults.straggler=0.3", "faults.client_dropout=0.1")),
        # truncated messages; stragglers billed every edge model on the nodes
        ("hierfavg", ("flower.nodes=2", "comm.zero_threshold=1e-2", "faults.straggler=0.3")),
        ("pfedme", ("flower.nodes=20",)),  # cross-device: one client per node
        ("perfedavg", ()),
        ("perfedavg", ("comm.zero_threshold=1e-2",)),  # evaluation adapts the truncated model
        ("heurfedamp", ("federation.client_fraction=0.5",)),
        ("local", ()),
        # node-held client control variates, reused across rounds by the sampled clients
        ("scaffold", ("federation.client_fraction=0.5", "flower.nodes=2")),
        ("fednova", ("algorithm.local_epochs=1", "partition.name=dirichlet")),  # unequal steps
        ("moon", ("federation.client_fraction=0.5", "flower.nodes=2")),  # node-held prev models
        # BatchNorm: node-held previous statistics beside the previous models
        (
            "moon",
            ("flower.nodes=2", "model.name=vgg", "model.cfg=[4,M,8,M]", "model.batch_norm=true"),
        ),
        ("fnrfl", ("algorithm.base=scaffold", "flower.nodes=2")),  # refinement at the cloud
        ("ditto", ("federation.client_fraction=0.5", "flower.nodes=2")),  # node-held personal
        ("fedper", ("flower.nodes=2", "model.name=dnn", "model.hidden=[8]")),  # node-held heads
        # FedLPS and its sub-model baselines: node-held personal models (and scores), per-client
        # sub-models sent down, entry-wise averaging at the cloud
        ("heterofl", ("federation.client_fraction=0.5", "flower.nodes=2")),
        ("fedrolex", ("federation.client_fraction=0.5", "flower.nodes=2")),
        ("lotteryfl", ("federation.client_fraction=0.5", "flower.nodes=2")),
        ("fedlps", ("federation.client_fraction=0.5", "flower.nodes=2")),
        (  # the authors' evaluation: node-held "has a personal model" rows, the global sent along
            "fedlps",
            (
                "federation.client_fraction=0.5",
                "flower.nodes=2",
                "algorithm.ratio=capability",
                "algorithm.personal_keep_above=0.25",
            ),
        ),
        ("fedavg", ("subsample.train=2500", "subsample.test=600", "partition.test_per_class=50")),
        # FedLPS's device model on the dense baselines: capabilities drawn at the cloud, the
        # bytes the cloud's ledger billed each client (FedPer: its body), the same sim_time_s
        ("fedavg", ("federation.client_fraction=0.5", "algorithm.capabilities=dyn")),
        (
            "ditto",
            ("federation.client_fraction=0.5", "flower.nodes=2", "algorithm.capabilities=dyn"),
        ),
        (
            "fedper",
            ("flower.nodes=2", "model.name=dnn", "model.hidden=[8]", "algorithm.capabilities=fix"),
        ),
        ("perfedavg", ("algorithm.capabilities=dyn",)),
    ],
)
def test_same_metrics_as_inprocess(tmp_path: Path, name: str, extra: tuple[str, ...]) -> None:
    args = config_args(name, "rounds=2", *extra)
    run_inprocess(tmp_path / "a", args)
    _, driver = run_flower_local(tmp_path / "b", args)
    assert_same_metrics(tmp_path / "a", tmp_path / "b")
    assert not driver.events
    assert (tmp_path / "b" / "flower_bytes.csv").exists()
    if any(e.startswith("algorithm.capabilities=") for e in extra):  # the cost model: exactly
        cost = ("sim_time_s", "round_sim_time_s", "flops")
        a_rows, b_rows = (read_csv(tmp_path / d / "metrics.csv") for d in "ab")
        assert [[r[k] for k in cost] for r in a_rows] == [[r[k] for k in cost] for r in b_rows]
        assert float(a_rows[-1]["sim_time_s"]) > 0
    # final_state.pt holds the whole state, the nodes' part included, as in-process.
    a, b = (
        torch.load(p / FINAL_STATE_FILE, weights_only=True)["state"] for p in tmp_path.iterdir()
    )
    assert set(a) == set(b)
    if name == "fedlps":  # float rounding (≤ 1e-8), every metric above identical: FedLPS trains
        # all of a process's clients in one batch, and the MLP's batched matmuls give a client's
        # gradient 1.5e-8 apart in a batch of 10 (in-process) and of 5 (its node)
        assert all(torch.allclose(a[k], b[k], rtol=0, atol=1e-7) for k in a)
    else:
        assert all(torch.equal(a[k], b[k]) for k in a)


def build_state_keys(args: list[str]) -> set[str]:
    """The in-process state's keys for these arguments (``flower.*``, unread there, left out)."""
    exp = small_experiment(*[a for a in args if not a.startswith("flower.")])
    return set(exp.algorithm.init_state(exp.model.init_params(0)))


def checkpointed_state_keys(args: list[str]) -> set[str]:
    """The keys of the in-process state that a checkpoint holds for these arguments (all but the
    entries no later round reads)."""
    given = [a for a in args if not a.startswith("flower.")]
    return build_state_keys(args) - small_experiment(*given).algorithm.round_local_keys()


def _messages(driver: FlowerDriver) -> list[tuple[str, int, int]]:
    assert isinstance(driver.transport, LocalTransport)
    return driver.transport.sent


def test_evaluation_rides_on_the_train_reply(tmp_path: Path) -> None:
    """sFedHP's personalized models are node state: an evaluated round needs no second message,
    and the numbers are the in-process ones."""
    args = config_args("sfedhp", "rounds=3", "eval_every=2")
    run_inprocess(tmp_path / "a", args)
    _, driver = run_flower_local(tmp_path / "b", args)
    assert_same_metrics(tmp_path / "a", tmp_path / "b")
    trains = [("train", r, s) for r in range(3) for s in range(4)]
    assert _messages(driver) == trains + [("query", 2, s) for s in range(4)]  # final state
    carried = read_csv(tmp_path / "b" / "flower_bytes.csv")
    assert [r["kind"] for r in carried] == ["train"] * 3 + ["query"]


def test_nodes_without_a_train_part_are_asked_to_evaluate(tmp_path: Path) -> None:
    """pFedMe samples half the clients (one per node): the others get an evaluate message."""
    args = config_args("pfedme", "rounds=2", "flower.nodes=20", "federation.client_fraction=0.5")
    run_inprocess(tmp_path / "a", args)
    _, driver = run_flower_local(tmp_path / "b", args)
    assert_same_metrics(tmp_path / "a", tmp_path / "b")
    for rnd in range(2):
        train = {s for k, r, s in _messages(driver) if (k, r) == ("train", rnd)}
        evaluate = {s for k, r, s in _messages(driver) if (k, r) == ("evaluate", rnd)}
        assert len(train) == 10 and evaluate == set(range(20)) - train


def test_personal_models_needing_the_global_model_are_evaluated_after_aggregation(
    tmp_path: Path,
) -> None:
    """Per-FedAvg adapts the new global model: its evaluation is a message of its own."""
    args = config_args("perfedavg", "rounds=1")
    _, driver = run_flower_local(tmp_path, args)
    assert [k for k, _, _ in _messages(driver)] == ["train"] * 4 + ["evaluate"] * 4
    # No node-held state: nothing to ask for the final state or a checkpoint.


def test_malformed_evaluation_on_a_train_reply_rejects_the_reply(tmp_path: Path) -> None:
    def fault(kind: str, rnd: int, shard: int, reply: RecordDict) -> RecordDict | None:
        if (kind, shard) == ("train", 2):
            return _replace(reply, "v.nnz", np.zeros(3, dtype=np.int64))
        return reply

    args = config_args("sfedhp", "rounds=1")
    summary, driver = run_flower_local(tmp_path, args, fault)
    assert [(e["shard"], e["event"]) for e in driver.events] == [(2, "rejected")]
    assert "shape" in driver.events[0]["detail"]
    assert _edge_up_bytes(tmp_path) == [3 * 4 * P_MLR]  # 3 edges send a model (4 B a value)
    assert summary["rounds"] == 1


def _arrays(reply: RecordDict) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in from_record(reply).arrays.items()}


def _replace(reply: RecordDict, key: str, value: np.ndarray | None) -> RecordDict:
    """Drop ``key`` (plain or in the wire encoding) and, unless ``value`` is None, put ``value``
    there as a plain array (receivers accept both forms)."""
    record = reply.array_records[ARRAYS]
    for name in (key, key + ENC, key + LEN, key + SHAPE):
        if name in record:
            del record[name]
    if value is not None:
        record[key] = Array.from_numpy_ndarray(value)
    return reply


def _edge_up_bytes(out: Path) -> list[float]:
    return [float(r["round_bytes_edge_cloud_up"] or 0) for r in read_csv(out / "metrics.csv")]


def test_missing_node_is_a_failed_edge_and_comes_back(tmp_path: Path) -> None:
    def fault(kind: str, rnd: int, shard: int, reply: RecordDict) -> RecordDict | None:
        return None if (kind, rnd, shard) == ("train", 0, 1) else reply

    args = config_args("hierfavg", "rounds=2")
    summary, driver = run_flower_local(tmp_path, args, fault)
    assert [(e["round"], e["shard"], e["event"]) for e in driver.events] == [(1, 1, "missing")]
    assert _edge_up_bytes(tmp_path) == [3 * 4 * P_MLR, 4 * 4 * P_MLR]  # 3 edges, then all 4
    assert summary["rounds"] == 2 and summary["final_global_acc"] > 0.5
    events = read_csv(tmp_path / "flower_events.csv")
    assert events[0]["event"] == "missing"


@pytest.mark.parametrize(
    ("corrupt", "why"),
    [
        ("nan", "NaN or Inf"),
        ("inf", "NaN or Inf"),
        ("shape", "shape"),
        ("dtype", "dtype"),
        ("missing_key", "missing"),
        ("extra_key", "unexpected"),
        ("wrong_edges", "does not list"),
        ("bad_ledger", "ledger"),
        ("big_endian", "unsupported dtype"),
    ],
)
def test_malformed_update_is_rejected(tmp_path: Path, corrupt: str, why: str) -> None:
    def fault(kind: str, rnd: int, shard: int, reply: RecordDict) -> RecordDict | None:
        if (kind, shard) != ("train", 2):
            return reply
        model = _arrays(reply)["e.model"]
        if corrupt in ("nan", "inf"):
            bad = model.copy()
            bad[0, 5] = np.nan if corrupt == "nan" else np.inf
            return _replace(reply, "e.model", bad)
        if corrupt == "shape":
            return _replace(reply, "e.model", model[:, :-1].copy())
        if corrupt == "dtype":
            return _replace(reply, "e.model", model.astype(np.float64))
        if corrupt == "missing_key":
            return _replace(reply, "losses", None)
        if corrupt == "extra_key":
            return _replace(reply, "poison", model)
        if corrupt == "bad_ledger":
            reply.config_records[META]["ledger"] = (
                '{"round": [["moon", "up", {}]], "node_round": []}'
            )
            return reply
        if corrupt == "big_endian":
            return _replace(reply, "e.model", model.astype(">f4"))
        return _replace(reply, "edges", np.array([0], dtype=np.int64))

    args = config_args("hierfavg", "rounds=1")
    _, driver = run_flower_local(tmp_path, args, fault)
    assert [e["event"] for e in driver.events] == ["rejected"]
    assert why in driver.events[0]["detail"]
    assert _edge_up_bytes(tmp_path) == [3 * 4 * P_MLR]
    final = torch.load(tmp_path / FINAL_STATE_FILE, weights_only=True)["state"]["global"]
    assert torch.isfinite(final).all()


def test_rejected_node_leaves_the_same_model_as_a_missing_one(tmp_path: Path) -> None:
    """A NaN-poisoned update has no influence: the global model equals the one without the node.
    (Finite but adversarial values are not malformed; robust aggregation is another matter.)"""

    def drop(kind: str, rnd: int, shard: int, reply: RecordDict) -> RecordDict | None:
        return None if shard == 0 and kind == "train" else reply

    def poison(kind: str, rnd: int, shard: int, reply: RecordDict) -> RecordDict | None:
        if shard == 0 and kind == "train":
            return _replace(reply, "c.model", np.full((5, P_MLR), np.nan, dtype=np.float32))
        return reply

    args = config_args("fedavg", "rounds=2")
    run_flower_local(tmp_path / "drop", args, drop)
    run_flower_local(tmp_path / "poison", args, poison)
    a = torch.load(tmp_path / "drop" / FINAL_STATE_FILE, weights_only=True)["state"]["global"]
    b = torch.load(tmp_path / "poison" / FINAL_STATE_FILE, weights_only=True)["state"]["global"]
    assert torch.equal(a, b)


def test_error_reply_and_all_nodes_down(tmp_path: Path) -> None:
    """Round 1: one node errs, the others are silent, so the round is skipped (model unchanged,
    nothing accounted); round 2 runs normally."""

    def fault(kind: str, rnd: int, shard: int, reply: RecordDict) -> RecordDict | str | None:
        if rnd == 0 and kind == "train":
            return "ClientApp exception: disk on fire" if shard == 0 else None
        return reply

    args = config_args("sfedhp", "rounds=2")
    summary, driver = run_flower_local(tmp_path, args, fault)
    kinds = [(e["round"], e["shard"], e["event"]) for e in driver.events]
    assert kinds == [(1, 0, "error"), (1, 1, "missing"), (1, 2, "missing"), (1, 3, "missing")]
    assert "disk on fire" in driver.events[0]["detail"]
    assert summary["rounds"] == 2
    assert _edge_up_bytes(tmp_path) == [0.0, 4 * 4 * P_MLR]


def test_sparse_models_travel_sparse(tmp_path: Path) -> None:
    """Sparse sFedHP: with the wire encoding (default) what Flower carries up follows fedhp's
    ledger (a constant per-message overhead on top); without it Flower carries dense arrays.
    Same metrics either way (the encoding is lossless)."""
    sparse = ("algorithm.gamma1=0.01", "algorithm.gamma2=0.01", "comm.zero_threshold=1e-3")
    args = config_args("sfedhp", "rounds=3", *sparse)
    run_flower_local(tmp_path / "sparse", args)
    run_flower_local(tmp_path / "dense", [*args, "flower.sparse_wire=false"])
    assert_same_metrics(tmp_path / "sparse", tmp_path / "dense")
    on, off = (
        [r for r in read_csv(tmp_path / d / "flower_bytes.csv") if r["kind"] == "train"]
        for d in ("sparse", "dense")
    )
    ledger = [int(r["fedhp_bytes_up"]) for r in on]
    assert ledger[-1] < ledger[0] < int(on[0]["fedhp_dense_bytes_up"])  # sparser every round
    overhead = [int(r["payload_bytes_up"]) - b for r, b in zip(on, ledger, strict=True)]
    assert max(overhead) - min(overhead) <= 4 * 4  # a tag byte per edge row, nothing else moves
    assert all(int(r["payload_bytes_up"]) >= int(r["fedhp_dense_bytes_up"]) for r in off)
    assert int(on[-1]["payload_bytes_up"]) < int(off[-1]["payload_bytes_up"])


@pytest.mark.parametrize(
    ("name", "extra"),
    [
        ("sfedhp", ()),  # theta restarts every round: not checkpointed, not restored
        ("sfedhp", ("algorithm.theta_init=warm",)),
        ("hierfavg", ()),
        # Half the clients per round, one per node: some nodes' first message after the resume
        # is an evaluate message, which must install the checkpoint's rows too.
        ("pfedme", ("flower.nodes=20", "federation.client_fraction=0.5")),
        # the cloud's capability generator and running sim_time_s / flops in the checkpoint
        (
            "ditto",
            ("federation.client_fraction=0.5", "flower.nodes=2", "algorithm.capabilities=dyn"),
        ),
    ],
)
def test_resume_matches_an_uninterrupted_run(
    tmp_path: Path, name: str, extra: tuple[str, ...]
) -> None:
    """Stopped after round 2 and resumed with fresh nodes (as after a crash of the whole
    simulation): the checkpoint carries the nodes' state, they get it back with their first
    message, and rounds 3-4 are those of an uninterrupted run."""
    args = config_args(name, "rounds=4", "checkpoint_every=2", *extra)
    run_flower_local(tmp_path / "whole", args)
    run_flower_local(tmp_path / "cut", [*args, "rounds=2"])
    checkpoint = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=False)
    keys = checkpointed_state_keys(args)
    assert set(checkpoint["state"]) == keys  # node-held entries included
    assert ("theta" in keys) == (name == "pfedme" or "algorithm.theta_init=warm" in extra)
    _, driver = run_flower_local(tmp_path / "cut", args, resume=True)
    assert_same_metrics(tmp_path / "whole", tmp_path / "cut")
    a = torch.load(tmp_path / "whole" / FINAL_STATE_FILE, weights_only=True)["state"]
    b = torch.load(tmp_path / "cut" / FINAL_STATE_FILE, weights_only=True)["state"]
    assert set(a) == set(b) == set(build_state_keys(args))  # theta too: the personalized models
    assert all(torch.equal(a[k], b[k]) for k in a)
    sent = _messages(driver)
    assert sent[0][:2] == ("train", 2)  # resumed at round 3
    if name != "hierfavg":  # node-held state: the checkpoint at round 4 asked every node
        nodes = range(len(driver.shards))
        assert [m for m in sent if m[0] == "query"] == [("query", 3, s) for s in nodes]


def test_checkpoint_is_skipped_when_a_node_cannot_give_its_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def fault(kind: str, rnd: int, shard: int, reply: RecordDict) -> RecordDict | None:
        return None if (kind, rnd, shard) == ("query", 1, 3) else reply

    args = config_args("sfedhp", "rounds=3", "checkpoint_every=1")
    run_flower_local(tmp_path, args, fault)
    assert "round 2: no checkpoint" in capsys.readouterr().err
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=False)
    assert saved["round"] == 3  # rounds 1 and 3 were checkpointed, 2 was not


@pytest.mark.parametrize(
    ("name", "extra"),
    [
        ("sfedhp", ()),
        # some nodes' first message after the restart is an evaluate message
        ("pfedme", ("flower.nodes=20", "federation.client_fraction=0.5")),
    ],
)
def test_resume_with_surviving_nodes_that_are_ahead(
    tmp_path: Path, name: str, extra: tuple[str, ...]
) -> None:
    """The cloud restarts from the round-2 checkpoint while its nodes survived and already ran
    rounds 3-4 (a deployment whose ServerApp crashed before its checkpoint reached the disk): the
    checkpoint's rows replace the nodes' own state with the first message of any kind, so rounds
    3-4 are the uninterrupted ones."""
    args = config_args(name, *extra, "checkpoint_every=2")
    run_flower_local(tmp_path / "whole", [*args, "rounds=4"])
    out = tmp_path / "cut"
    backup = tmp_path / "round2.pt"

    def keep_round_two(kind: str, rnd: int, shard: int, reply: RecordDict) -> RecordDict:
        if rnd == 2 and not backup.exists():  # round 3 is running: round 2's checkpoint is on disk
            shutil.copy(out / "checkpoint.pt", backup)
        return reply

    transport = LocalTransport(keep_round_two)
    _run_with(transport, out, [*args, "rounds=4"])
    shutil.copy(backup, out / "checkpoint.pt")  # the crash: rounds 3-4 never saved
    _run_with(transport, out, [*args, "rounds=4"], resume=True)
    assert_same_metrics(tmp_path / "whole", out)


def _run_with(transport: LocalTransport, out: Path, args: list[str], resume: bool = False) -> None:
    exp = build_experiment(resolve_config(None, args, on_flower=True))  # (flower.* read)
    hier = exp.options.hierarchical
    shards = make_shards(exp.ctx.topology, node_count(exp.cfg, hier), hier)
    driver = FlowerDriver(exp, transport, shards, out, log=lambda _: None)
    run_experiment(exp, out, resume=resume, driver=driver)
