"""Run fedhp as a Flower deployment: a SuperLink and N SuperNodes as separate processes.

TLS is always on and SuperNode authentication is always on. The pieces, each usable alone:

- ``superlink_command`` / ``supernode_command``: the ``flower-superlink`` / ``flower-supernode``
  command lines (flwr 1.41: one HTTPS port on the SuperLink serves the Fleet, Control and Runtime
  APIs; each SuperNode also serves a local Runtime API on its own port);
- ``write_app``: a Flower app project (``pyproject.toml``) naming fedhp's ServerApp/ClientApp,
  with the fedhp configuration as the run config ``fedhp-config`` and the results folder as
  ``fedhp-out``;
- ``write_connection``: the SuperLink connection in ``$FLWR_HOME/config.toml`` (address + CA
  certificate) that ``flwr run`` / ``flwr supernode register`` use;
- ``LoopbackFederation``: all of it on 127.0.0.1 as a context manager that kills every process
  it started on exit (used by ``fedhp flower deploy`` and the end-to-end tests).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO

from fedhp.errors import FedhpError
from fedhp.flower.certs import Certificates, NodeKey, write_certificates, write_node_keys

SERVERAPP = "fedhp.flower.server_app:app"
CLIENTAPP = "fedhp.flower.client_app:app"
CONNECTION = "fedhp"
ConfigValue = str | int | float | bool


class DeployError(FedhpError):
    """A Flower deployment process failed to start or a run did not finish."""


def flower_bin(name: str) -> str:
    """The Flower executable ``name`` next to the running interpreter (else from PATH)."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def superlink_command(certs: Certificates, host: str, port: int) -> list[str]:
    """``flower-superlink`` with TLS and SuperNode authentication on.

    Runtime dependency installation (``uv sync`` of the app's dependencies) is disabled: fedhp
    runs from the environment it is installed in.
    """
    return [
        flower_bin("flower-superlink"),
        "--ssl-ca-certfile",
        str(certs.ca_cert),
        "--ssl-certfile",
        str(certs.server_cert),
        "--ssl-keyfile",
        str(certs.server_key),
        "--enable-supernode-auth",
        "--disable-runtime-dependency-installation",
        "--host",
        host,
        "--port",
        str(port),
    ]


def supernode_command(
    superlink: str,
    ca_cert: Path,
    private_key: Path,
    runtime_port: int,
    node_config: Mapping[str, ConfigValue] | None = None,
    max_retries: int | None = None,
) -> list[str]:
    """``flower-supernode`` connecting to ``superlink`` (host:port) over TLS with its key."""
    cmd = [
        flower_bin("flower-supernode"),
        "--superlink",
        superlink,
        "--root-certificates",
        str(ca_cert),
        "--auth-supernode-private-key",
        str(private_key),
        "--host",
        "127.0.0.1",
        "--port",
        str(runtime_port),
    ]
    if node_config:
        cmd += ["--node-config", " ".join(f"{k}={_toml_value(v)}" for k, v in node_config.items())]
    if max_retries is not None:
        cmd += ["--max-retries", str(max_retries)]
    return cmd


def _toml_value(value: ConfigValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return str(value)


def app_pyproject(
    config: Mapping[str, ConfigValue],
    serverapp: str = SERVERAPP,
    clientapp: str = CLIENTAPP,
    name: str = "fedhp-flower",
) -> str:
    """The ``pyproject.toml`` of a Flower app project running ``serverapp``/``clientapp``."""
    import tomli_w

    doc = {
        "project": {
            "name": name,
            "version": "0.1.0",
            "description": "fedhp on a Flower deployment",
            "license": "MIT",
            "dependencies": [],
        },
        "tool": {
            "flwr": {
                "app": {
                    "publisher": "fedhp",
                    "components": {"serverapp": serverapp, "clientapp": clientapp},
                    "config": dict(config),
                }
            }
        },
    }
    return tomli_w.dumps(doc, multiline_strings=True)


def write_app(
    app_dir: Path,
    config: Mapping[str, ConfigValue],
    serverapp: str = SERVERAPP,
    clientapp: str = CLIENTAPP,
    files: Sequence[Path] = (),
) -> Path:
    """Write a Flower app project into ``app_dir`` (``files`` are copied next to it)."""
    app_dir.mkdir(parents=True, exist_ok=True)
    (app_dir / "pyproject.toml").write_text(app_pyproject(config, serverapp, clientapp))
    for src in files:
        (app_dir / src.name).write_bytes(src.read_bytes())
    return app_dir


def write_connection(flwr_home: Path, address: str, ca_cert: Path, name: str = CONNECTION) -> Path:
    """Write ``$FLWR_HOME/config.toml`` with one default SuperLink connection ``name``."""
    import tomli_w

    flwr_home.mkdir(parents=True, exist_ok=True)
    path = flwr_home / "config.toml"
    doc = {
        "superlink": {
            "default": name,
            name: {"address": address, "root-certificates": str(ca_cert.resolve())},
        }
    }
    path.write_text(tomli_w.dumps(doc))
    return path


SUPEREXEC_POLL_ENV = "FLWR_SUPEREXEC_TASK_POLL_INTERVAL"
SUPEREXEC_POLL_S = "0.1"


def flower_env(flwr_home: Path) -> dict[str, str]:
    """The environment for Flower processes: ``FLWR_HOME`` set, this interpreter's bin first.

    The SuperLink and SuperNodes start ``flower-superexec``, ``flwr-serverapp`` and
    ``flwr-clientapp`` by name, so the directory holding them must come first on PATH. Flower's
    telemetry and update check are off unless set otherwise: both call out to flower.ai (a
    command waits for the update check before it exits), pointless on a loopback federation.
    SuperExec looks for new tasks every 0.1 s instead of Flower's default 1 s (a task is a
    message to run, so this is latency on every message; the cost is a few idle wake-ups).
    """
    env = dict(os.environ)
    env.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    env.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    env.setdefault(SUPEREXEC_POLL_ENV, SUPEREXEC_POLL_S)
    env["FLWR_HOME"] = str(flwr_home.resolve())
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    return env


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


@dataclass
class RunResult:
    """The outcome of one ``flwr run`` on the deployment."""

    run_id: int
    status: str
    seconds: float
    log: Path

    @property
    def ok(self) -> bool:
        return self.status == "finished:completed"


@dataclass
class LoopbackFederation:
    """A SuperLink and ``nodes`` SuperNodes on 127.0.0.1, TLS and node authentication on.

    ``with LoopbackFederation(workdir, nodes=4) as fed: fed.run(app_dir)``. ``workdir`` receives
    ``certs/``, ``keys/``, ``flwr-home/`` and ``logs/``. Every process is killed on exit.
    """

    workdir: Path
    nodes: int
    host: str = "127.0.0.1"
    startup_timeout: float = 300.0
    node_config: Mapping[str, ConfigValue] = field(default_factory=dict)
    superlink: Process | None = None
    supernodes: list[Process] = field(default_factory=list)
    certs: Certificates | None = None
    keys: list[NodeKey] = field(default_factory=list)
    port: int = 0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def flwr_home(self) -> Path:
        return self.workdir / "flwr-home"

    @property
    def env(self) -> dict[str, str]:
        return flower_env(self.flwr_home)

    def __enter__(self) -> LoopbackFederation:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Certificates, keys, SuperLink, key registration, then the SuperNodes."""
        if self.nodes < 1:
            raise DeployError(f"deploy: nodes must be >= 1, got {self.nodes}")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.certs = write_certificates(self.workdir / "certs")
        self.keys = write_node_keys(self.workdir / "keys", self.nodes)
        for attempt in range(3):  # the free port may be taken before the SuperLink binds it
            self.port = free_port(self.host)
            self.superlink = start_process(
                "superlink",
                superlink_command(self.certs, self.host, self.port),
                self.workdir / "logs" / "superlink.log",
                self.env,
            )
            try:
                wait_for(self.superlink, "Application startup complete", self.startup_timeout)
                break
            except DeployError:
                self.superlink.stop()
                if attempt == 2 or "address already in use" not in self.superlink.text().lower():
                    raise
        write_connection(self.flwr_home, self.address, self.certs.ca_cert)
        self.register_all([key.public for key in self.keys])
        for i, key in enumerate(self.keys):
            self.start_supernode(i, key.private)
        for proc in self.supernodes:
            wait_for(proc, "SuperNode ID:", self.startup_timeout)

    def flwr(self, *args: str, timeout: float = 600.0) -> subprocess.CompletedProcess[str]:
        """Run the ``flwr`` CLI against this federation's SuperLink connection."""
        try:
            return subprocess.run(
                [flower_bin("flwr"), *args],
                env=self.env,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as err:
            raise DeployError(f"flwr {' '.join(args)}: no answer within {timeout:.0f}s") from err

    def flwr_json(self, *args: str) -> dict[str, object]:
        """``flwr ARGS --format json``'s answer; raises :class:`DeployError` unless it succeeded."""
        res = self.flwr(*args, "--format", "json")
        try:
            data: dict[str, object] = json.loads(res.stdout)
        except json.JSONDecodeError:
            data = {}
        if res.returncode != 0 or not data.get("success"):
            detail = (res.stdout + res.stderr).strip().splitlines()
            raise DeployError(f"flwr {' '.join(args)} failed: {detail[-1] if detail else '?'}")
        return data

    def register(self, public_key: Path) -> int:
        """``flwr supernode register`` one public key; the node id the SuperLink assigned."""
        data = self.flwr_json("supernode", "register", str(public_key), CONNECTION)
        return int(str(data["node-id"]))

    def register_all(self, public_keys: Sequence[Path]) -> list[int]:
        """``register`` several public keys at once (one ``flwr`` process each, in parallel)."""
        with ThreadPoolExecutor(max_workers=max(1, len(public_keys))) as pool:
            return list(pool.map(self.register, public_keys))

    def start_supernode(
        self, index: int, private_key: Path, max_retries: int | None = None
    ) -> Process:
        """Start SuperNode ``index`` (node config ``partition-id``/``num-partitions``)."""
        assert self.certs is not None
        config: dict[str, ConfigValue] = {"partition-id": index, "num-partitions": self.nodes}
        config.update(self.node_config)
        proc = start_process(
            f"supernode-{index}",
            supernode_command(
                self.address,
                self.certs.ca_cert,
                private_key,
                free_port(),
                config,
                max_retries=max_retries,
            ),
            self.workdir / "logs" / f"supernode-{index}.log",
            self.env,
        )
        self.supernodes.append(proc)
        return proc

    def submit(self, app_dir: Path, overrides: Sequence[str] = ()) -> int:
        """``flwr run APP fedhp`` (TLS to the Control API); the run id."""
        args = ["run", str(app_dir.resolve()), CONNECTION]
        for item in overrides:
            args += ["--run-config", item]
        return int(str(self.flwr_json(*args)["run-id"]))

    def status(self, run_id: int) -> str:
        """The run's status, e.g. ``running`` or ``finished:completed``."""
        data = self.flwr_json("list", CONNECTION, "--run-id", str(run_id))
        runs = data.get("runs")
        if not isinstance(runs, list) or not runs:
            raise DeployError(f"flwr list: run {run_id} not found")
        return str(runs[0]["status"])

    def wait(self, run_id: int, timeout: float) -> str:
        """Stream the run's logs into ``logs/run-<id>.log`` until it ends; its final status.

        ``flwr log`` returns when the run finishes; if it returns earlier (a dropped connection),
        it is started again (the log then repeats from the beginning)."""
        log = self.workdir / "logs" / f"run-{run_id}.log"
        deadline = time.monotonic() + timeout
        with log.open("w") as fh:
            while True:
                remaining = deadline - time.monotonic()
                try:
                    if remaining <= 0:
                        raise subprocess.TimeoutExpired("flwr log", timeout)
                    subprocess.run(
                        [flower_bin("flwr"), "log", str(run_id), CONNECTION],
                        env=self.env,
                        stdout=fh,
                        stderr=subprocess.STDOUT,
                        timeout=remaining,
                        check=False,
                    )
                except subprocess.TimeoutExpired as err:
                    msg = f"run {run_id} did not finish within {timeout:.0f}s; see {log}"
                    raise DeployError(msg) from err
                status = self.status(run_id)
                if status.startswith("finished"):
                    return status
                time.sleep(1.0)

    def run(self, app_dir: Path, overrides: Sequence[str] = (), timeout: float = 3600) -> RunResult:
        """Submit ``app_dir``, wait for the end; raises :class:`DeployError` on timeout."""
        start = time.monotonic()
        run_id = self.submit(app_dir, overrides)
        status = self.wait(run_id, timeout)
        return RunResult(
            run_id=run_id,
            status=status,
            seconds=time.monotonic() - start,
            log=self.workdir / "logs" / f"run-{run_id}.log",
        )

    def process_tree(self) -> list[int]:
        """The pids of every process of this federation now (started ones and their helpers)."""
        procs = [p for p in [self.superlink, *self.supernodes] if p is not None]
        return [pid for p in procs for pid in [p.popen.pid, *descendants(p.popen.pid)]]

    def stop(self) -> None:
        """Stop the SuperNodes (all at once), then the SuperLink, each with its helpers."""
        if self.supernodes:
            with ThreadPoolExecutor(max_workers=len(self.supernodes)) as pool:
                list(pool.map(Process.stop, self.supernodes))
        if self.superlink is not None:
            self.superlink.stop()
