"""The command lines and environment of the Flower processes (``flower-superlink``,
``flower-supernode``) a deployment starts."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping
from pathlib import Path

from fedhp.flower.certs import Certificates
from fedhp.flower.packaging import ConfigValue, toml_value


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
        cmd += ["--node-config", " ".join(f"{k}={toml_value(v)}" for k, v in node_config.items())]
    if max_retries is not None:
        cmd += ["--max-retries", str(max_retries)]
    return cmd


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
