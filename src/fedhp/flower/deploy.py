"""Run fedhp as a Flower deployment: a SuperLink and N SuperNodes as separate processes.

TLS is always on and SuperNode authentication is always on. The pieces, each usable alone:

- ``superlink_command`` / ``supernode_command`` (:mod:`fedhp.flower.commands`): the
  ``flower-superlink`` / ``flower-supernode`` command lines (flwr 1.41: one HTTPS port on the
  SuperLink serves the Fleet, Control and Runtime APIs; each SuperNode also serves a local Runtime
  API on its own port);
- ``write_app`` (:mod:`fedhp.flower.packaging`): a Flower app project (``pyproject.toml``) naming
  fedhp's ServerApp/ClientApp, with the fedhp configuration as the run config ``fedhp-config`` and
  the results folder as ``fedhp-out``;
- ``write_connection`` (:mod:`fedhp.flower.packaging`): the SuperLink connection in
  ``$FLWR_HOME/config.toml`` (address + CA certificate) that ``flwr run`` / ``flwr supernode
  register`` use;
- ``LoopbackFederation`` (here): all of it on 127.0.0.1 as a context manager that kills every
  process it started on exit (used by ``fedhp flower deploy`` and the end-to-end tests); the
  processes are supervised by :mod:`fedhp.flower.processes`, and a :class:`Watchdog` ends them
  (and whatever they started) if the process that owns the federation dies without stopping it.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from fedhp.flower.certs import Certificates, NodeKey, write_certificates, write_node_keys
from fedhp.flower.commands import (
    flower_bin,
    flower_env,
    free_port,
    superlink_command,
    supernode_command,
)
from fedhp.flower.packaging import CONNECTION, ConfigValue, write_connection
from fedhp.flower.processes import (
    DeployError,
    Process,
    Watchdog,
    descendants,
    start_process,
    wait_for,
)


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
    ``certs/``, ``keys/``, ``flwr-home/`` and ``logs/``. Every process is killed on exit, the
    SuperNodes first; if the owning process dies without that (SIGKILL), the federation's
    :class:`Watchdog` ends every process it started, and those they started.
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
    watchdog: Watchdog | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def flwr_home(self) -> Path:
        return self.workdir / "flwr-home"

    @property
    def env(self) -> dict[str, str]:
        """The Flower processes' environment (marked as the watchdog's, once it runs)."""
        env = flower_env(self.flwr_home)
        return env if self.watchdog is None else self.watchdog.mark(env)

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
        if self.watchdog is None:
            self.watchdog = Watchdog.start()
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
        """Stop the SuperNodes (all at once), then the SuperLink, each with its helpers; then
        the watchdog ends anything else the federation started (e.g. a ``flwr`` command)."""
        try:
            if self.supernodes:
                with ThreadPoolExecutor(max_workers=len(self.supernodes)) as pool:
                    list(pool.map(Process.stop, self.supernodes))
            if self.superlink is not None:
                self.superlink.stop()
        finally:
            if self.watchdog is not None:
                self.watchdog.close()
                self.watchdog = None
