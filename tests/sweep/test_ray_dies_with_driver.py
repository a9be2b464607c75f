"""The local Ray that ``--backend ray`` starts (``ray.init(address="local")``, also what
``backend=flower-sim`` starts through Flower) ends with the fedhp process that started it, also
when that process is killed with SIGKILL: Ray starts its GCS server and raylet with the
parent-death signal, and its workers end with the raylet. This checks that the Ray fedhp ships
with keeps doing so (every process of it carries a mark in its environment)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from fedhp.flower.processes import end_owned, owned, running
from tests.conftest import require_module

require_module("ray")

pytestmark = pytest.mark.slow

DRIVER = """
import os, sys, time
import ray
from fedhp.sweep.ray_backend import _connect
_connect(ray, None, 1)

@ray.remote
def pid() -> int:
    return os.getpid()

print("ray-worker-pid", ray.get(pid.remote()), flush=True)
time.sleep(300)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["TERM", "KILL"])
def test_a_local_ray_ends_with_its_driver(tmp_path: Path, sig: signal.Signals) -> None:
    token = f"ray-{os.getpid()}-{sig.name}"
    short = tempfile.mkdtemp(prefix="fedhp-ray-")  # (Ray's socket paths must stay short)
    env = {**os.environ, "FEDHP_OWNER": token, "RAY_TMPDIR": short}
    env.pop("RAY_ADDRESS", None)
    out = tmp_path / "driver.log"
    with out.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(DRIVER)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 180
        while "ray-worker-pid" not in out.read_text():
            assert proc.poll() is None, out.read_text()
            assert time.monotonic() < deadline, "Ray did not start in time"
            time.sleep(0.5)
        ray_pids = [pid for pid in owned(token) if pid != proc.pid]
        assert len(ray_pids) >= 3  # GCS server, raylet, a worker (and Ray's helpers)
        os.kill(proc.pid, sig)
        proc.wait(timeout=30)
        time.sleep(15)
        assert [pid for pid in ray_pids if running(pid)] == [] and owned(token) == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        end_owned(token, grace=0.0)
        shutil.rmtree(short, ignore_errors=True)
