"""End to end: a SuperLink and 4 SuperNodes as real processes on 127.0.0.1, TLS and SuperNode
authentication on, running fedhp's Flower app (sFedHP, 4 edges x 5 clients).

One federation serves the module's tests, in order: a full 3-round run (the same metrics.csv as
the in-process engine's); the same run resubmitted to continue from its checkpoint; a fifth
SuperNode with
an unregistered key is refused; a SuperNode killed mid-run is a failed edge and the run finishes.
"""

from __future__ import annotations

import csv
import json
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from fedhp.cli import main
from fedhp.flower.certs import write_node_key
from fedhp.flower.deploy import LoopbackFederation
from fedhp.flower.deploy_cli import resolve_run_config
from fedhp.flower.packaging import write_app
from fedhp.flower.processes import Process, descendants, running
from tests.flower.helpers import assert_same_metrics

pytestmark = pytest.mark.slow

NODES = 4
CLIENTAPP_STARTED = "Start `flwr-clientapp` process"
# flower.timeout: how long the cloud waits for a round's replies. Generous: on a starved 2-vCPU
# machine a round's ClientApp processes (each importing torch) can take minutes, and a node that
# misses the deadline is (correctly) a failed edge, which the first test does not expect.
ROUND_TIMEOUT = 600.0
BASE = [
    "algorithm.name=sfedhp",
    "federation.num_clients=20",
    "federation.num_edges=4",
    "progress=false",
    "checkpoint_every=0",
    "threads=1",
    f"flower.nodes={NODES}",
    f"flower.timeout={ROUND_TIMEOUT}",
]
IN_PROCESS = [o for o in BASE if not o.startswith("flower.")]
"""The same run in-process (which reads no flower.* option, so refuses them)."""


def fedhp_app(app_dir: Path, out: Path, *overrides: str) -> Path:
    """The real fedhp Flower app project, as ``fedhp flower app`` writes it."""
    _, run_config, _ = resolve_run_config([*BASE, *overrides], str(out))
    return write_app(app_dir, run_config)


def csv_rows(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with path.open() as fh:
        return list(csv.DictReader(fh))


def node_id(proc: Process) -> int:
    match = re.search(r"SuperNode ID: (\d+)", proc.text())
    assert match, f"no node id in {proc.log}"
    return int(match.group(1))


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackFederation]:
    work = tmp_path_factory.mktemp("deploy")
    with LoopbackFederation(work, nodes=NODES) as federation:
        yield federation
        tree = federation.process_tree()
    deadline = time.monotonic() + 30  # SIGKILLed processes may take a moment on a loaded machine
    while any(running(pid) for pid in tree) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(running(pid) for pid in tree), "a Flower process outlived the federation"


def test_three_rounds_of_sfedhp_on_four_supernodes(fed: LoopbackFederation) -> None:
    link_log = fed.superlink.text() if fed.superlink else ""
    activated = set(re.findall(r"\[Fleet.ActivateNode\] Activated node_id=(\d+)", link_log))
    assert activated == {str(node_id(p)) for p in fed.supernodes} and len(activated) == NODES
    assert "Uvicorn running on https://" in link_log  # TLS on the SuperLink's only port
    out = fed.workdir / "run-3"
    app = fedhp_app(fed.workdir / "app-3", out, "rounds=3", "eval_every=3", "checkpoint_every=3")
    result = fed.run(app, timeout=600)
    assert result.ok, f"run ended {result.status}; see {result.log}"
    assert csv_rows(out / "flower_events.csv") == []  # no node missed a round
    rows = csv_rows(out / "metrics.csv")
    assert [int(r["round"]) for r in rows] == [3]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 3
    assert float(rows[-1]["personal_acc"]) > 0.5  # 5-label clients: chance is 0.2
    # The same numbers as the in-process engine: same code, same minibatches.
    ref = out.with_name("ref")
    assert main(["run", *IN_PROCESS, "rounds=3", "eval_every=3", "--out", str(ref)]) == 0
    assert_same_metrics(out.with_name("ref"), out)
    for node in fed.supernodes:  # every SuperNode ran the ClientApp in every round
        assert node.text().count(CLIENTAPP_STARTED) >= 3
    # The evaluation rode on round 3's train reply; the final state's node part came by query.
    carried = [(r["kind"], r["messages_up"]) for r in csv_rows(out / "flower_bytes.csv")]
    assert carried == [("train", str(NODES))] * 3 + [("query", str(NODES))]
    final = torch.load(out / "final_state.pt", weights_only=True)["state"]
    reference = torch.load(out.with_name("ref") / "final_state.pt", weights_only=True)["state"]
    assert set(final) == set(reference) and all(torch.equal(final[k], reference[k]) for k in final)


def test_resubmitted_run_resumes_from_its_checkpoint(fed: LoopbackFederation) -> None:
    """The 3-round run, resubmitted with rounds=4 and Flower's run-config override
    ``fedhp-resume=true``, continues from its checkpoint (which holds the nodes' state; the new
    Flower run gives the nodes fresh contexts) and ends where a 4-round in-process run ends."""
    out = fed.workdir / "run-3"
    assert (out / "checkpoint.pt").exists()
    app = fedhp_app(fed.workdir / "app-4", out, "rounds=4", "eval_every=3", "checkpoint_every=3")
    result = fed.run(app, ["fedhp-resume=true"], timeout=600)
    assert result.ok, f"run ended {result.status}; see {result.log}"
    assert [int(r["round"]) for r in csv_rows(out / "metrics.csv")] == [3, 4]
    ref = fed.workdir / "ref-4"
    assert main(["run", *IN_PROCESS, "rounds=4", "eval_every=3", "--out", str(ref)]) == 0
    assert_same_metrics(ref, out)


def test_supernode_with_unknown_key_is_refused(fed: LoopbackFederation) -> None:
    key = write_node_key(fed.workdir / "keys" / "intruder")
    intruder = fed.start_supernode(NODES, key.private, max_retries=0)
    intruder.popen.wait(timeout=300)
    assert fed.superlink is not None and fed.superlink.alive()
    fed.supernodes.remove(intruder)
    assert intruder.popen.returncode != 0
    assert "Failed to activate SuperNode" in intruder.text()
    assert "No SuperNode found with the given public key" in (
        fed.superlink.text() if fed.superlink else ""
    )
    nodes = fed.flwr_json("supernode", "list", "fedhp")["nodes"]
    assert isinstance(nodes, list) and len(nodes) == NODES  # the intruder never got a node id
    assert all(n["status"] == "online" for n in nodes)


def test_killed_supernode_is_a_failed_edge_and_the_run_finishes(fed: LoopbackFederation) -> None:
    """SIGKILL a SuperNode (and its ClientApp) while it works on round 1 of a 2-round run."""
    victim = fed.supernodes[-1]
    shard = sorted(node_id(p) for p in fed.supernodes).index(node_id(victim))
    started_before = victim.text().count(CLIENTAPP_STARTED)
    sent_before = victim.text().count("Sent successfully")
    out = fed.workdir / "run-kill"
    run_id = fed.submit(fedhp_app(fed.workdir / "app-kill", out, "rounds=2", "eval_every=2"))
    deadline = time.monotonic() + 300
    while victim.text().count(CLIENTAPP_STARTED) == started_before:  # round 1's train message
        assert time.monotonic() < deadline, "the victim never received round 1"
        time.sleep(0.1)
    tree = [victim.popen.pid, *descendants(victim.popen.pid)]
    victim.kill(signal.SIGKILL)
    victim.popen.wait(timeout=30)
    deadline = time.monotonic() + 30
    while any(running(pid) for pid in tree) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(running(pid) for pid in tree)
    assert victim.text().count("Sent successfully") == sent_before  # died before replying
    status = fed.wait(run_id, timeout=600)
    assert status == "finished:completed"
    assert [int(r["round"]) for r in csv_rows(out / "metrics.csv")] == [2]
    events = csv_rows(out / "flower_events.csv")
    assert events and {int(e["shard"]) for e in events} == {shard}  # only the victim failed
    # The SuperLink answers for a node whose heartbeats stopped ("node unavailable"): an error
    # reply, matched to the message it answers.
    assert {e["event"] for e in events} == {"error"}
    assert int(events[0]["round"]) == 1
    log = (fed.workdir / "logs" / f"run-{run_id}.log").read_text()
    assert re.search(rf"fedhp: round 1: node {shard}: error reply", log)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds"] == 2
