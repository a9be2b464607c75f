"""The suite's shared fixture undoes each test (tests/conftest.py, ``_leave_nothing_behind``):
what one test registers or leaves running is gone when the next begins. The tests run in file
order; each ``..._is_gone`` test checks what the one before it left."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fedhp.algorithms import ALGORITHMS
from fedhp.algorithms.fedavg import FedAvgOptions
from fedhp.data import DATASETS, PARTITIONERS
from fedhp.flower.processes import running
from fedhp.models import MODELS
from fedhp.plugins import load_plugin

LEFT: dict[str, object] = {}

PLUGIN = '''
from fedhp.algorithms import ALGORITHMS
from fedhp.algorithms.fedavg import FedAvgOptions


@ALGORITHMS.register("isolation_plugin")
class IsolationOptions(FedAvgOptions):
    """A plugin algorithm for the isolation tests."""
'''


def test_a_test_registers_components_and_a_plugin(tmp_path: Path) -> None:
    @ALGORITHMS.register("isolation_inline")
    class Inline(FedAvgOptions):
        """Registered in a test's body."""

    plugin = tmp_path / "isolation_plugin.py"
    plugin.write_text(textwrap.dedent(PLUGIN))
    module = load_plugin(str(plugin))
    LEFT["plugin"], LEFT["module"] = plugin, module.__name__
    LEFT["sizes"] = [len(r.names()) for r in (DATASETS, MODELS, PARTITIONERS)]
    assert {"isolation_inline", "isolation_plugin"} <= set(ALGORITHMS.names())
    assert module.__name__ in sys.modules


def test_what_it_registered_is_gone_and_the_plugin_loads_again() -> None:
    if "plugin" not in LEFT:
        pytest.skip("checks what the test before it left (run the whole file)")
    assert "isolation_inline" not in ALGORITHMS and "isolation_plugin" not in ALGORITHMS
    assert [len(r.names()) for r in (DATASETS, MODELS, PARTITIONERS)] == LEFT["sizes"]
    assert LEFT["module"] not in sys.modules
    load_plugin(str(LEFT["plugin"]))  # no "already registered": the plugin is imported afresh
    assert "isolation_plugin" in ALGORITHMS


@pytest.mark.filterwarnings("ignore:the test left 2 process:pytest.PytestWarning")
def test_a_test_leaves_processes_running() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    detached = subprocess.Popen(  # its own session, reparented to init once its parent ends
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], "
            "start_new_session=True); print(p.pid, flush=True)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert detached.stdout is not None
    LEFT["pids"] = [child.pid, int(detached.stdout.readline())]
    detached.wait()
    LEFT["child"] = child  # (kept referenced: its exit status is reaped by the next test)
    assert all(running(pid) for pid in LEFT["pids"])  # type: ignore[attr-defined]


def test_the_processes_it_left_are_gone() -> None:
    if "child" not in LEFT:
        pytest.skip("checks what the test before it left (run the whole file)")
    child = LEFT["child"]
    assert isinstance(child, subprocess.Popen)
    child.wait(timeout=5)  # (ended by the fixture, SIGTERM)
    pids = LEFT["pids"]
    assert isinstance(pids, list)
    assert not any(running(pid) for pid in pids)
    assert os.environ.get("FEDHP_TEST_SESSION")  # what marks the processes of the session
