"""Nothing a deployment starts outlives the process that started it: the watchdog (every process
carrying its token ends when its owner ends, SIGKILL included), the parent-death signal of the
direct children, and SIGTERM/SIGINT turned into an orderly stop with the shell's exit code."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fedhp.flower.processes import (
    OWNER_ENV,
    Stopped,
    Watchdog,
    owned,
    running,
    start_process,
    stop_on_signals,
)

ROOT = Path(__file__).resolve().parents[2]


def wait_until(check: object, timeout: float, what: str) -> None:
    assert callable(check)
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def gone_within(pids: list[int], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while any(running(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def owner_script(tmp_path: Path, body: str) -> subprocess.Popen[bytes]:
    """A Python process (its own session, like ``setsid fedhp ...``) running ``body``, which
    writes the pids it wants checked to ``pids.txt``, one a line, then sleeps."""
    script = tmp_path / "owner.py"
    script.write_text(textwrap.dedent(body))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.Popen(
        [sys.executable, str(script), str(tmp_path)], env=env, start_new_session=True
    )


def read_pids(tmp_path: Path, count: int, proc: subprocess.Popen[bytes]) -> list[int]:
    path = tmp_path / "pids.txt"

    def ready() -> bool:
        assert proc.poll() is None, "the owner process ended early"
        return path.is_file() and len(path.read_text().split()) == count

    wait_until(ready, 60, "the owner's children")
    return [int(p) for p in path.read_text().split()]


SLEEPER = "[sys.executable, '-c', 'import time; time.sleep(120)']"


def test_watchdog_ends_detached_grandchildren_when_its_owner_is_killed(tmp_path: Path) -> None:
    """SIGKILL the owner: a child in a session of its own and the grandchild it started (which
    inherits no parent-death signal and is reparented to init) both end; the watchdog too."""
    proc = owner_script(
        tmp_path,
        f"""
        import subprocess, sys, time
        from pathlib import Path
        from fedhp.flower.processes import Watchdog
        dog = Watchdog.start()
        env = dog.mark(dict(__import__("os").environ))
        child = subprocess.Popen(
            [sys.executable, "-c",
             "import subprocess, sys, time; "
             "p = subprocess.Popen({SLEEPER}, start_new_session=True); "
             "open(sys.argv[1], 'w').write(str(p.pid)); time.sleep(120)",
             sys.argv[1] + "/grandchild"],
            env=env, start_new_session=True)
        while not Path(sys.argv[1] + "/grandchild").is_file() or not Path(
            sys.argv[1] + "/grandchild").read_text():
            time.sleep(0.05)
        grand = Path(sys.argv[1] + "/grandchild").read_text()
        Path(sys.argv[1] + "/pids.txt").write_text(f"{{dog.popen.pid}} {{child.pid}} {{grand}}")
        time.sleep(120)
        """,
    )
    try:
        dog, child, grand = read_pids(tmp_path, 3, proc)
        assert all(running(pid) for pid in (dog, child, grand))
        proc.kill()
        proc.wait(timeout=10)
        assert gone_within([dog, child, grand], 15), [
            pid for pid in (dog, child, grand) if running(pid)
        ]
    finally:
        proc.kill()
        for pid in read_pids_safely(tmp_path):
            kill_quietly(pid)


def test_watchdog_acts_when_its_owner_dies_even_if_the_pipe_leaked(tmp_path: Path) -> None:
    """A marked child that inherited a copy of the watchdog pipe's write end keeps the pipe open
    after the owner's SIGKILL; the watchdog sees its owner gone anyway and ends the child."""
    proc = owner_script(
        tmp_path,
        f"""
        import os, subprocess, sys, time
        from pathlib import Path
        from fedhp.flower.processes import Watchdog
        dog = Watchdog.start()
        env = dog.mark(dict(os.environ))
        leak = dog.popen.stdin.fileno()
        child = subprocess.Popen({SLEEPER}, env=env, pass_fds=(leak,), start_new_session=True)
        Path(sys.argv[1] + "/pids.txt").write_text(f"{{dog.popen.pid}} {{child.pid}}")
        time.sleep(120)
        """,
    )
    try:
        dog, child = read_pids(tmp_path, 2, proc)
        assert running(dog) and running(child)
        proc.kill()
        proc.wait(timeout=10)
        assert gone_within([dog, child], 15), [pid for pid in (dog, child) if running(pid)]
    finally:
        proc.kill()
        for pid in read_pids_safely(tmp_path):
            kill_quietly(pid)


def test_direct_children_get_the_parent_death_signal(tmp_path: Path) -> None:
    """``start_process`` children end with their owner even without a watchdog (Linux)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    proc = owner_script(
        tmp_path,
        f"""
        import sys
        from pathlib import Path
        from fedhp.flower.processes import start_process
        p = start_process("sleeper", {SLEEPER}, Path(sys.argv[1]) / "sleeper.log", {{}})
        Path(sys.argv[1] + "/pids.txt").write_text(str(p.popen.pid))
        __import__("time").sleep(120)
        """,
    )
    try:
        (child,) = read_pids(tmp_path, 1, proc)
        assert running(child)
        proc.kill()
        proc.wait(timeout=10)
        assert gone_within([child], 10)
    finally:
        proc.kill()
        for pid in read_pids_safely(tmp_path):
            kill_quietly(pid)


def read_pids_safely(tmp_path: Path) -> list[int]:
    path = tmp_path / "pids.txt"
    return [int(p) for p in path.read_text().split()] if path.is_file() else []


def kill_quietly(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGKILL)


def test_closing_the_watchdog_ends_what_carries_its_token(tmp_path: Path) -> None:
    dog = Watchdog.start()
    try:
        marked = start_process(
            "marked",
            [sys.executable, "-c", "import time; time.sleep(120)"],
            tmp_path / "m.log",
            dog.mark(os.environ),
        )
        unmarked = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        wait_until(lambda: marked.popen.pid in dog.owned(), 10, "the marked process")
        assert unmarked.pid not in dog.owned()
        dog.close()
        marked.popen.wait(timeout=5)  # (reaped here: it is this process's child)
        assert not running(marked.popen.pid)
        assert dog.popen.returncode == 0 and owned(dog.token) == []
        assert unmarked.poll() is None  # a process without the token is not the watchdog's
    finally:
        unmarked.kill()
        unmarked.wait()
        dog.close()


def test_the_watchdog_is_not_marked_and_ignores_terminal_signals() -> None:
    dog = Watchdog.start()
    try:
        environ = Path(f"/proc/{dog.popen.pid}/environ")
        wait_until(
            lambda: b"_watch" in Path(f"/proc/{dog.popen.pid}/cmdline").read_bytes(),
            10,
            "the watchdog's exec",
        )
        assert f"{OWNER_ENV}=".encode() not in environ.read_bytes()
        time.sleep(0.5)  # (its handlers are set once it imported fedhp)
        os.kill(dog.popen.pid, signal.SIGINT)
        os.kill(dog.popen.pid, signal.SIGHUP)
        time.sleep(0.3)
        assert dog.popen.poll() is None
    finally:
        dog.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_stop_signal_becomes_stopped_with_the_shells_exit_code(sig: signal.Signals) -> None:
    before = signal.getsignal(sig)
    stopped = []
    with pytest.raises(Stopped) as caught, stop_on_signals():
        try:
            os.kill(os.getpid(), sig)
            time.sleep(5)  # (the handler raises here)
        finally:
            os.kill(os.getpid(), sig)  # a second one, while stopping, is ignored
            stopped.append(True)
    assert stopped and caught.value.code == 128 + sig and caught.value.signum == sig
    assert signal.getsignal(sig) == before


def test_marking_puts_the_token_in_the_environment_for_the_block_only() -> None:
    dog = Watchdog.start()
    try:
        before = os.environ.get(OWNER_ENV)
        with dog.marking():
            assert os.environ[OWNER_ENV] == dog.token
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        assert os.environ.get(OWNER_ENV) == before
        wait_until(lambda: child.pid in dog.owned(), 10, "the marked child")
        dog.close()
        child.wait(timeout=5)
        assert child.returncode == -signal.SIGTERM
    finally:
        dog.close()
