"""``backend=flower-sim`` on an existing Ray cluster (``RAY_ADDRESS``), as docs/flower.md describes.

A real two-node Ray cluster runs on this machine as separate processes (``ray.cluster_utils``: a
head node and one worker node, 1 CPU each, no dashboard, in a private temp dir); the test process
is not connected to it. With ``RAY_ADDRESS`` pointing at it, a short sFedHP run on MNIST Setting 1
must give the same metrics as in-process, its ClientApp actors must have run on the cluster (one
on each node: each node has 1 CPU and each actor takes 1), and the cluster must still be up
afterwards (fedhp connects to an external cluster and leaves it alone). The fixture shuts the
cluster down and checks that none of its processes (gcs_server, raylets, workers, ...) outlive it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fedhp.cli import main
from tests.conftest import in_ci, require_module
from tests.flower.helpers import assert_same_metrics

ray = require_module("ray")

NODE_ARGS: dict[str, Any] = {"num_cpus": 1, "object_store_memory": 96 * 2**20}
ARGS = [
    "rounds=3",
    "eval_every=1",
    "threads=1",
    "progress=false",
    "checkpoint_every=0",
    "model.name=mlr",
    "algorithm.name=sfedhp",
]


def _processes() -> dict[int, tuple[int, str, str]]:
    """pid -> (parent pid, start time, command line) of every process, from /proc."""
    table: dict[int, tuple[int, str, str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:  # it ended meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        table[int(entry)] = (int(fields[1]), fields[19], cmdline.decode(errors="replace"))
    return table


def _cluster_processes(marker: str) -> set[tuple[int, str]]:
    """(pid, start time) of the processes whose command line names ``marker`` (the cluster's
    temp dir: gcs_server, raylets, monitors, dashboard) and of all their descendants (workers)."""
    table = _processes()
    ours = {pid for pid, (_, _, cmd) in table.items() if marker in cmd}
    grown = True
    while grown:
        more = {pid for pid, (ppid, _, _) in table.items() if ppid in ours} - ours
        ours |= more
        grown = bool(more)
    return {(pid, table[pid][1]) for pid in ours}


def _still_running(procs: set[tuple[int, str]]) -> set[tuple[int, str]]:
    table = _processes()
    return {(pid, start) for pid, start in procs if pid in table and table[pid][1] == start}


@pytest.fixture
def ray_cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A head node and one worker node; afterwards no process of theirs is left running."""
    from ray.cluster_utils import Cluster

    if not Path("/proc/self/stat").exists():
        if in_ci():  # CI runs on Linux: a missing /proc there is a failure, not a skip
            pytest.fail("CI is set but /proc is missing; this test needs it")
        pytest.skip("needs /proc to check that the cluster's processes end")
    tmp = tempfile.mkdtemp(prefix="fedhp-ray-")  # short: Ray's socket paths live under it
    # Ray's temp dir and its "current cluster" address file go there, not to the shared /tmp/ray.
    monkeypatch.setenv("RAY_TMPDIR", tmp)
    cluster = Cluster()
    try:
        # Generous waits: on a loaded 2-core machine a node can take long to register.
        cluster.add_node(wait=False, include_dashboard=False, **NODE_ARGS)
        cluster.add_node(wait=False, **NODE_ARGS)
        cluster.wait_for_nodes(timeout=120)
        yield cluster
    finally:
        started = _cluster_processes(tmp)
        try:
            if ray.is_initialized():  # a run that failed half-way may have left its connection
                ray.shutdown()
            cluster.shutdown()
        finally:
            deadline = time.monotonic() + 60
            while (left := _still_running(started)) and time.monotonic() < deadline:
                time.sleep(0.2)
            for pid, _ in left:  # ours (descendants of our cluster): never leave them running
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            shutil.rmtree(tmp, ignore_errors=True)
        assert not left, f"Ray processes outlived the cluster's shutdown: {sorted(left)}"


def _alive_nodes(cluster: Any) -> set[str]:
    return {n["NodeID"] for n in cluster.global_state.node_table() if n["Alive"]}


@pytest.mark.slow
def test_flower_sim_on_external_ray_cluster(
    tmp_path: Path, ray_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes = _alive_nodes(ray_cluster)
    assert len(nodes) == 2
    assert not ray.is_initialized()  # the test process is no driver of the cluster
    # Flower's Ray backend rewrites PYTHONPATH in this process and fedhp sets RAY_DEDUP_LOGS:
    # restore both afterwards (setenv then delenv records "unset" for an absent variable).
    for name in ("PYTHONPATH", "RAY_DEDUP_LOGS"):
        monkeypatch.setenv(name, os.environ.get(name, ""))
        if os.environ[name] == "":
            monkeypatch.delenv(name)
    monkeypatch.setenv("RAY_ADDRESS", ray_cluster.address)

    assert main(["run", *ARGS, "--out", str(tmp_path / "inprocess")]) == 0
    # flower.timeout: on a starved machine the first round (actors importing torch and loading
    # the data) can take minutes; a timeout would (correctly) skip the round.
    flower = [*ARGS, "backend=flower-sim", "flower.num_cpus=1", "flower.timeout=3000"]
    assert main(["run", *flower, "--out", str(tmp_path / "flower")]) == 0
    assert_same_metrics(tmp_path / "inprocess", tmp_path / "flower")

    # fedhp disconnected from the cluster and left it running: both nodes, all their processes.
    assert not ray.is_initialized()
    assert _alive_nodes(ray_cluster) == nodes
    assert ray_cluster.remaining_processes_alive()
    # The work ran on the cluster: this process's job placed its ClientApp actors there, one on
    # each node (a node has 1 CPU and an actor takes flower.num_cpus=1).
    jobs = ray_cluster.global_state.job_table()
    ours = {j["JobID"] for j in jobs if j["DriverPid"] == os.getpid()}
    assert len(ours) == 1
    actors = [
        a
        for a in ray_cluster.global_state.actor_table(None).values()
        if a["JobID"] in ours and a["ActorClassName"] == "ClientAppActor"
    ]
    assert len(actors) == 2
    assert {a["Address"]["NodeID"] for a in actors} == nodes
