"""Shared fixtures: a small real federation (MNIST, the sFedHP paper's Setting 1), and every
test undone when it ends (:func:`_leave_nothing_behind`: what it registered, the processes and
the Ray it started), so the suite passes in one process and in any order."""

from __future__ import annotations

import contextlib
import importlib
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from fedhp.build import build_experiment
from fedhp.config import resolve_config
from fedhp.engine.experiment import Experiment
from fedhp.flower.processes import end_owned, owned, running


@pytest.fixture(autouse=True)
def _torch_threads() -> None:
    torch.set_num_threads(2)


_CACHE: list[str] = []
SESSION_ENV = "FEDHP_TEST_SESSION"
"""Marks every process the session starts (inherited through the environment), so that what a
test leaves running is found, wherever it was reparented to."""
LONG_LIVED = ("multiprocessing.resource_tracker", "multiprocessing.forkserver", "compile_worker")
"""Helpers Python and torch start once and keep for the whole process, never a test's leftover."""


def pytest_configure(config: pytest.Config) -> None:
    """Caches written by the code under test (Flower nodes' data) go to a throwaway folder, not
    the user's ~/.cache; subprocesses inherit it. Every process started from here on carries
    this session's mark (a fresh one: a pytest run by a test has its own)."""
    if "FEDHP_CACHE_DIR" not in os.environ:
        _CACHE.append(tempfile.mkdtemp(prefix="fedhp-test-cache-"))
        os.environ["FEDHP_CACHE_DIR"] = _CACHE[0]
    os.environ[SESSION_ENV] = secrets.token_hex(8)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Nothing the session started outlives it; then its caches go."""
    token = os.environ.get(SESSION_ENV)
    if token:
        end_owned(token, grace=2.0, variable=SESSION_ENV)
    for path in _CACHE:
        shutil.rmtree(path, ignore_errors=True)


def _registries() -> list[Any]:
    from fedhp.registry import Registry

    return list(Registry.every)


def _snapshot_registrations() -> dict[str, Any]:
    """The registries' contents, the plugins loaded, and the modules imported so far."""
    from fedhp import plugins

    return {
        "items": {id(r): (r, dict(r._items)) for r in _registries()},
        "loaded": dict(plugins._LOADED),
        "entry_points": list(plugins._ENTRY_POINTS_LOADED),
        "modules": set(sys.modules),
    }


def _restore_registrations(snap: dict[str, Any]) -> None:
    """Undo what a test registered, except components of fedhp's own modules first imported by
    the test (importing them again would not register them again); a plugin module imported by
    the test is forgotten too, so that loading it again registers it again."""
    from fedhp import plugins

    undone: set[str] = set()
    for registry, before in snap["items"].values():
        for name, cls in list(registry._items.items()):
            if before.get(name) is cls:
                continue
            if name not in before and cls.__module__.split(".")[0] == "fedhp":
                continue  # (fedhp's own component, imported lazily: registered for good)
            undone.add(cls.__module__)
            del registry._items[name]
        for name, cls in before.items():
            registry._items.setdefault(name, cls)
    plugins._LOADED.clear()
    plugins._LOADED.update(snap["loaded"])
    plugins._ENTRY_POINTS_LOADED[:] = snap["entry_points"]
    for module in undone - snap["modules"]:
        sys.modules.pop(module, None)


def _ray_started() -> bool:
    ray = sys.modules.get("ray")
    return ray is not None and bool(ray.is_initialized())


def _kept_by(pid: int, before: set[int]) -> bool:
    """Whether ``pid`` descends from a process that ran before the test (a longer-lived
    fixture's, e.g. a module's deployment starting app processes), or is a long-lived helper."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True
    if any(name.encode() in cmdline for name in LONG_LIVED):
        return True
    seen = set()
    while pid > 1 and pid not in seen:
        seen.add(pid)
        if pid in before:
            return True
        try:
            text = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(text[text.rfind(")") + 2 :].split()[1])
    return False


def _end_leftovers(before: set[int], token: str) -> list[str]:
    """SIGTERM (then SIGKILL) the processes started during the test that still run 2 s later;
    their command lines."""
    left = [
        pid for pid in owned(token, SESSION_ENV) if pid not in before and not _kept_by(pid, before)
    ]
    deadline = time.monotonic() + 2.0  # (one ending already, e.g. a Ray actor after shutdown)
    while any(running(pid) for pid in left) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [pid for pid in left if running(pid)]
    names = []
    for pid in left:
        with contextlib.suppress(OSError):
            names.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 2.0
    while any(running(pid) for pid in left) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:
        if running(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    return names


@contextlib.contextmanager
def _undone_after(what: str) -> Iterator[None]:
    """Undo, when the block ends, what it registered, the Ray it left connected and the
    processes it left running (see :func:`_leave_nothing_behind`)."""
    token = os.environ.get(SESSION_ENV, "")
    before = set(owned(token, SESSION_ENV)) if token else set()
    snap = _snapshot_registrations()
    ray_before = _ray_started()
    yield
    _restore_registrations(snap)
    if _ray_started() and not ray_before:
        sys.modules["ray"].shutdown()
    if token:
        names = _end_leftovers(before, token)
        if names:
            warnings.warn(
                f"{what} left {len(names)} process(es) running, now ended: "
                + "; ".join(n[:120] for n in names),
                pytest.PytestWarning,
                stacklevel=1,
            )


@pytest.fixture(autouse=True, scope="module")
def _module_leaves_nothing_behind() -> Iterator[None]:
    """The same for a module's own fixtures (a module's deployment), when the module ends."""
    with _undone_after("the test module's fixtures"):
        yield


@pytest.fixture(autouse=True)
def _leave_nothing_behind(_module_leaves_nothing_behind: None) -> Iterator[None]:
    """Whatever a test registers (algorithms, datasets, models, partitions, plugins) is
    unregistered when it ends, a Ray it started and left connected is shut down, and a process
    it started that still runs is ended (with a warning naming it). Processes of longer-lived
    fixtures (a module's deployment) and what they start are left alone until their module
    ends."""
    with _undone_after("the test"):
        yield


def in_ci() -> bool:
    """CI runs with ``CI`` set (``CI=true``): there a missing dependency or dataset is a
    failure, never a silent skip."""
    return bool(os.environ.get("CI"))


def require_module(name: str) -> ModuleType:
    """Import ``name`` for a test module: skip the module with a reason where it is missing,
    except under CI, where that fails loudly."""
    if not in_ci():
        return pytest.importorskip(name, reason=f"{name} is not installed (make test installs it)")
    try:
        return importlib.import_module(name)
    except ImportError as err:
        pytest.fail(f"CI is set but {name} cannot be imported ({err}); CI must run these tests")


def skip_unless_ci(condition: bool, reason: str) -> pytest.MarkDecorator:
    """``skipif(condition)`` locally; under CI the test runs (and fails if it cannot)."""
    return pytest.mark.skipif(condition and not in_ci(), reason=reason)


def small_experiment(*overrides: str) -> Experiment:
    """MNIST Setting 1 (20 clients, 4 edges), FedAvg unless overridden, with ``key=value``."""
    base = ["progress=false", "algorithm.name=fedavg", "eval_every=1"]
    return build_experiment(resolve_config(None, [*base, *overrides]))
