"""Supervision of the Flower processes a deployment starts: each in its own session, logging to a
file, waited for by a line in its log, and stopped with every process it started."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
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


def start_process(name: str, cmd: Sequence[str], log: Path, env: Mapping[str, str]) -> Process:
    """Start ``cmd`` in a new session (so its whole group can be killed), output to ``log``."""
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
        )
    finally:
        fh.close()
    return Process(name=name, popen=popen, log=log)


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
