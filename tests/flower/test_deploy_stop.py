"""``fedhp flower deploy`` started as ``setsid fedhp flower deploy rounds=300 --out X &``, its
nodes and their app processes up, then ``kill -TERM`` / ``kill -KILL`` of the fedhp process:
15 s later none of its descendants (SuperLink, SuperExecs, SuperNodes, ServerApp, ClientApps,
``flwr`` commands, the watchdog) runs. Checked through ``/proc``."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedhp.flower.processes import descendants, end_owned, owned, running
from tests.conftest import require_module

require_module("flwr")

pytestmark = pytest.mark.slow

FEDHP = str(Path(sys.executable).parent / "fedhp")
CONFIG = [
    "rounds=300",
    "progress=false",
    "checkpoint_every=0",
    "threads=1",
    "model.name=mlr",
    "federation.num_clients=4",
    "federation.num_edges=2",
    "flower.nodes=2",
]
STARTUP_S = 300.0  # a starved 2-vCPU machine: each app process imports torch


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def token_of(tree: list[int]) -> str | None:
    """The deployment's watchdog token (the watchdog's last argument)."""
    for pid in tree:
        if "_watch()" in cmdline(pid):
            return cmdline(pid).split()[-1]
    return None


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], list[int]]]:
    """The deployment as a user's shell starts it in the background (a session of its own),
    once a ServerApp and every ClientApp run; every process of it is gone afterwards, whatever
    the test did."""
    log = (tmp_path / "deploy.log").open("wb")
    proc = subprocess.Popen(
        [FEDHP, "flower", "deploy", *CONFIG, "--out", str(tmp_path / "out")],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    tree: list[int] = []
    try:
        deadline = time.monotonic() + STARTUP_S
        while True:
            assert proc.poll() is None, (tmp_path / "deploy.log").read_text()
            assert time.monotonic() < deadline, "no ServerApp and 2 ClientApps in time"
            tree = [proc.pid, *descendants(proc.pid)]
            lines = [cmdline(pid) for pid in tree]
            apps = sum("flwr-clientapp" in line for line in lines)
            if apps >= 2 and any("flwr-serverapp" in line for line in lines):
                break
            time.sleep(0.5)
        yield proc, tree
    finally:
        token = token_of(tree)
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        for pid in tree:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if token is not None:
            end_owned(token, grace=0.0)
        log.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["TERM", "KILL"])
def test_no_descendant_outlives_a_killed_deploy(
    deployment: tuple[subprocess.Popen[bytes], list[int]], sig: signal.Signals, tmp_path: Path
) -> None:
    proc, tree = deployment
    names = {pid: cmdline(pid) for pid in tree}
    assert sum("flower-supernode" in n for n in names.values()) == 2
    assert any("flower-superlink" in n for n in names.values())
    assert sum("flower-superexec" in n for n in names.values()) == 3  # the link's, each node's
    token = token_of(tree)
    assert token is not None
    killed = time.monotonic()
    os.kill(proc.pid, sig)
    code = proc.wait(timeout=60)
    if sig == signal.SIGTERM:
        assert code == 143
        last = (tmp_path / "deploy.log").read_text().strip().splitlines()[-1]
        assert last.startswith("fedhp: stopped by SIGTERM; the deployment's processes are stopped")
    else:
        assert code == -signal.SIGKILL
    time.sleep(max(0.0, 15.0 - (time.monotonic() - killed)))
    alive = {pid: names[pid] for pid in tree if running(pid)}
    assert not alive, f"running 15 s after {sig.name}: {alive}"

    assert owned(token) == []  # nor anything the tree started after it was listed
