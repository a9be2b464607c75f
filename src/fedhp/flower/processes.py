"""Supervision of the Flower processes a deployment starts: each in its own session, logging to a
file, waited for by a line in its log, and stopped with every process it started.

Nothing outlives the process that started a deployment (docs/flower.md, "When fedhp stops"):

- every process started through :func:`start_process` with a :class:`Watchdog`'s ``env`` carries
  the watchdog's token in its environment (``FEDHP_OWNER``), and so do the processes *they*
  start (Flower's SuperExec and app processes inherit the environment, even though Flower starts
  them in sessions of their own and they outlive their parent);
- the :class:`Watchdog` is a small process of its own session that waits for its stdin to close:
  when the owner ends, however it ends (SIGKILL included: the kernel closes the pipe), it stops
  every process carrying the token, SIGTERM first, then SIGKILL;
- on Linux the direct children also get the parent-death signal (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO

from fedhp.errors import FedhpError


class DeployError(FedhpError):
    """A Flower deployment process failed to start or a run did not finish."""


@dataclass
class Process:
    """A started Flower process, in its own process group, logging to ``log``."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the process, its group and every process it started.

        Flower starts ``flower-superexec`` (and that the app processes) in new sessions, so the
        group alone would miss them; descendants are found through ``/proc``.
        """
        pids = [self.popen.pid, *descendants(self.popen.pid)]
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, sig)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM the process tree, then SIGKILL every process of it that is left.

        The tree is rescanned while killing (a SuperExec may start an app process meanwhile),
        and ``stop`` returns once none of them runs, or after a further ``grace`` seconds."""
        seen = {self.popen.pid, *descendants(self.popen.pid)}
        self.kill(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=grace)
        deadline = time.monotonic() + grace
        while True:
            for pid in list(seen):
                seen.update(descendants(pid))
            for pid in seen:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.poll()
            if not any(running(pid) for pid in seen) or time.monotonic() > deadline:
                return
            time.sleep(0.1)


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (not gone, not a zombie)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text[text.rfind(")") + 2 :].split()[0] != "Z"


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (Linux ``/proc``; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rfind(")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found: list[int] = []
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


PR_SET_PDEATHSIG = 1  # (linux/prctl.h)


def _death_signal() -> Callable[[], None] | None:
    """A ``preexec_fn`` giving the child SIGTERM when this thread ends (Linux
    ``PR_SET_PDEATHSIG``), or None: elsewhere, and off the main thread, whose end is not the
    process's (the signal follows the thread that started the child)."""
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # (looked up here: the child only calls it)
    parent = os.getpid()

    def die_with_parent() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the prctl: go now
            os.kill(os.getpid(), signal.SIGTERM)

    return die_with_parent


def start_process(name: str, cmd: Sequence[str], log: Path, env: Mapping[str, str]) -> Process:
    """Start ``cmd`` in a new session (so its whole group can be killed), output to ``log``; on
    Linux it gets SIGTERM when this process ends (see :func:`_death_signal`)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    fh: IO[bytes] = log.open("wb")
    try:
        popen = subprocess.Popen(
            list(cmd),
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env),
            start_new_session=True,
            preexec_fn=_death_signal(),  # (takes no lock in the child: prctl only)
        )
    finally:
        fh.close()
    return Process(name=name, popen=popen, log=log)


OWNER_ENV = "FEDHP_OWNER"
"""The environment variable that marks a process (and everything it starts) as a deployment's."""


def owned(token: str, variable: str = OWNER_ENV) -> list[int]:
    """The live processes whose environment carries ``variable=token`` (default
    ``FEDHP_OWNER``; Linux ``/proc``: processes of other users are not readable, not listed),
    this one excepted."""
    mark = f"{variable}={token}".encode()
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            entries = environ.read_bytes().split(b"\0")
        except OSError:
            continue
        if mark in entries:
            pid = int(environ.parent.name)
            if pid != os.getpid() and running(pid):
                found.append(pid)
    return found


def end_owned(
    token: str, grace: float = 3.0, limit: float = 30.0, variable: str = OWNER_ENV
) -> int:
    """SIGTERM every process carrying ``variable=token`` (:func:`owned`), SIGKILL what is left
    after ``grace`` seconds, and go on (a process may start another meanwhile) until a rescan
    finds none, or ``limit`` seconds have passed; the number of processes found."""
    seen: set[int] = set()
    start = time.monotonic()
    pids = owned(token, variable)
    seen.update(pids)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    while pids and time.monotonic() - start < grace:
        time.sleep(0.1)
        pids = owned(token, variable)  # (one started meanwhile is SIGKILLed below)
        seen.update(pids)
    quiet = 0
    while quiet < 2 and time.monotonic() - start < limit:  # two empty scans in a row: done
        pids = owned(token, variable)
        seen.update(pids)
        quiet = 0 if pids else quiet + 1
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)
    return len(seen)


def _watch() -> None:
    """The watchdog process: wait until the owner (``sys.argv[2]``) ends or closes stdin, then
    end every process carrying the token ``sys.argv[1]``.

    The pipe's end-of-file is the quick signal; the owner's pid is also polled twice a second,
    so that a copy of the pipe's write end that leaked into another process cannot keep the
    watchdog waiting."""
    import select

    for sig in (signal.SIGINT, signal.SIGHUP):  # (the terminal's signals are the owner's)
        signal.signal(sig, signal.SIG_IGN)
    token, owner = sys.argv[1], int(sys.argv[2])
    fd = sys.stdin.fileno()
    with contextlib.suppress(OSError):
        while os.getppid() == owner and running(owner):  # (reparented: the owner has ended)
            readable, _, _ = select.select([fd], [], [], 0.5)
            if readable and not os.read(fd, 4096):
                break
    end_owned(token)


@dataclass
class Watchdog:
    """A process that ends every process carrying its token once its owner (the process that
    started it) closes it or ends, however: ``with contextlib.closing(Watchdog.start()) as dog:
    start_process(..., dog.mark(env))``. It runs in a session of its own (a signal to the
    owner's process group does not reach it) and ignores SIGINT and SIGHUP."""

    token: str
    popen: subprocess.Popen[bytes]

    @classmethod
    def start(cls) -> Watchdog:
        """Start the watchdog process (about 50 ms)."""
        token = secrets.token_hex(8)
        env = {k: v for k, v in os.environ.items() if k != OWNER_ENV}
        popen = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from fedhp.flower.processes import _watch; _watch()",
                token,
                str(os.getpid()),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        return cls(token=token, popen=popen)

    def mark(self, env: Mapping[str, str]) -> dict[str, str]:
        """``env`` with this watchdog's token: a process started with it is the watchdog's."""
        return {**env, OWNER_ENV: self.token}

    def owned(self) -> list[int]:
        """The live processes that carry this watchdog's token."""
        return owned(self.token)

    @contextlib.contextmanager
    def marking(self) -> Iterator[None]:
        """This process's environment carries the token inside the block, so that what a library
        starts in it (Ray's GCS server and raylet, and what they start) is the watchdog's."""
        previous = os.environ.get(OWNER_ENV)
        os.environ[OWNER_ENV] = self.token
        try:
            yield
        finally:
            if previous is None:
                os.environ.pop(OWNER_ENV, None)
            else:
                os.environ[OWNER_ENV] = previous

    def close(self, timeout: float = 40.0) -> None:
        """Let the watchdog end what carries its token, and wait (``timeout`` s at most) until
        it has."""
        if self.popen.stdin is not None and not self.popen.stdin.closed:
            with contextlib.suppress(OSError):
                self.popen.stdin.close()
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


class Stopped(BaseException):
    """SIGTERM, SIGINT or SIGHUP arrived (:func:`stop_on_signals`); ``code`` is the exit status
    a shell gives a process the signal ended (128 + the signal's number). A BaseException, so
    no ``except Exception`` on the way swallows it."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.code = 128 + signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Turn the first SIGTERM/SIGINT/SIGHUP into :class:`Stopped` raised in the main thread, so
    that ``with`` blocks inside stop what they started; later ones are ignored while that
    happens. The previous handlers come back on exit. Off the main thread: does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    stopping: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        if stopping:
            return
        stopping.append(signum)
        raise Stopped(signum)

    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def wait_for(proc: Process, text: str, timeout: float) -> None:
    """Wait until ``text`` appears in ``proc``'s log; raise if it exits or times out first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in proc.text():
            return
        if not proc.alive():
            raise DeployError(f"{proc.name} exited before '{text}'; see {proc.log}")
        time.sleep(0.2)
    raise DeployError(f"{proc.name}: no '{text}' within {timeout:.0f}s; see {proc.log}")
