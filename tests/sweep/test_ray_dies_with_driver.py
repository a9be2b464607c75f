"""The local Ray that ``fedhp sweep --backend ray`` starts ends with the fedhp process, also when
that process is killed with SIGKILL: its processes carry the token of a watchdog
(:class:`fedhp.flower.processes.Watchdog`) that ends them when fedhp ends. (Ray's own
parent-death handling ends its GCS server and raylet, but its dashboard and runtime-env agents
were seen running 15 s after a SIGKILL of the driver on a busy machine.) Every process of the
sweep carries a mark of the test in its environment, so none escapes the check."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from fedhp.flower.processes import end_owned, owned, running
from tests.conftest import require_module

require_module("ray")

pytestmark = pytest.mark.slow

FEDHP = str(Path(sys.executable).parent / "fedhp")
MARK = "FEDHP_RAY_TEST"
SWEEP = [
    "--backend",
    "ray",
    "--seeds",
    "0",
    "rounds=100000",
    "progress=false",
    "checkpoint_every=0",
    "threads=1",
    "model.name=mlr",
    "subsample.train=600",
    "subsample.test=300",
    "partition.train_per_class=30",
    "partition.test_per_class=15",
    "federation.num_clients=6",
    "federation.num_edges=2",
    "algorithm.name=fedavg",
]


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:100]
    except OSError:
        return "?"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["TERM", "KILL"])
def test_a_local_ray_ends_with_the_sweep_that_started_it(
    tmp_path: Path, sig: signal.Signals
) -> None:
    token = f"{os.getpid()}-{sig.name}"
    short = tempfile.mkdtemp(prefix="fedhp-ray-")  # (Ray's socket paths must stay short)
    env = {**os.environ, MARK: token, "RAY_TMPDIR": short}
    env.pop("RAY_ADDRESS", None)
    out = tmp_path / "sweep.log"
    with out.open("wb") as log:
        proc = subprocess.Popen(
            [FEDHP, "sweep", "--out", str(tmp_path / "sweep"), *SWEEP],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 300
        while True:  # until a Ray worker runs the batch
            assert proc.poll() is None, out.read_text()
            assert time.monotonic() < deadline, "no Ray worker ran the batch in time"
            ray_pids = {pid: cmdline(pid) for pid in owned(token, MARK) if pid != proc.pid}
            if any("ray::_work" in line for line in ray_pids.values()):
                break
            time.sleep(0.5)
        assert any("raylet" in line for line in ray_pids.values())
        os.kill(proc.pid, sig)
        proc.wait(timeout=60)
        time.sleep(15)
        left = {pid: line for pid, line in ray_pids.items() if running(pid)}
        assert not left, f"running 15 s after {sig.name}: {left}"
        assert owned(token, MARK) == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        end_owned(token, grace=0.0, variable=MARK)
        shutil.rmtree(short, ignore_errors=True)
