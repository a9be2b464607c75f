"""The deployment helpers without starting processes: certificates, keys, commands, app project.

Each artefact is checked with the code Flower itself uses to read it.
"""

from __future__ import annotations

import ipaddress
import sys
import time
from pathlib import Path

import pytest
import tomli
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_private_key, load_ssh_private_key
from flwr.common.config import fuse_dicts, parse_config_args

from fedhp.cli import main
from fedhp.errors import ConfigError
from fedhp.flower.certs import write_certificates, write_node_keys
from fedhp.flower.commands import superlink_command, supernode_command
from fedhp.flower.packaging import (
    CLIENTAPP,
    SERVERAPP,
    app_pyproject,
    write_app,
    write_connection,
)
from fedhp.flower.processes import DeployError, descendants, running, start_process, wait_for


def test_server_certificate_is_signed_by_the_ca_for_loopback(tmp_path: Path) -> None:
    paths = write_certificates(tmp_path)
    ca = x509.load_pem_x509_certificate(paths.ca_cert.read_bytes())
    server = x509.load_pem_x509_certificate(paths.server_cert.read_bytes())
    server.verify_directly_issued_by(ca)
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in san.get_values_for_type(x509.IPAddress)
    assert "localhost" in san.get_values_for_type(x509.DNSName)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    key = load_pem_private_key(paths.server_key.read_bytes(), None)
    assert key.public_key().public_numbers() == server.public_key().public_numbers()  # type: ignore[union-attr]
    assert paths.server_key.stat().st_mode & 0o077 == 0


def test_tls_handshake_with_the_dev_certificates(tmp_path: Path) -> None:
    """A TLS server with server.pem/server.key is accepted by a client trusting only ca.crt."""
    import socket
    import ssl
    import threading

    paths = write_certificates(tmp_path)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(paths.server_cert, paths.server_key)
    client_ctx = ssl.create_default_context(cafile=str(paths.ca_cert))
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]

        def serve() -> None:
            conn, _ = listener.accept()
            with server_ctx.wrap_socket(conn, server_side=True) as tls:
                tls.sendall(b"ok")

        thread = threading.Thread(target=serve)
        thread.start()
        with (
            socket.create_connection(("127.0.0.1", port)) as raw,
            client_ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            assert tls.recv(2) == b"ok"
        thread.join(5)


def test_node_keys_load_the_way_flower_loads_them(tmp_path: Path) -> None:
    from flwr.cli.supernode.register import try_load_public_key

    keys = write_node_keys(tmp_path, 3)
    assert [k.private.name for k in keys] == ["node-0", "node-1", "node-2"]
    publics = set()
    for key in keys:
        private = load_ssh_private_key(key.private.read_bytes(), None)
        assert isinstance(private, ec.EllipticCurvePrivateKey)
        assert private.curve.name == "secp384r1"
        publics.add(try_load_public_key(key.public))  # what `flwr supernode register` sends
        assert key.private.stat().st_mode & 0o077 == 0
    assert len(publics) == 3


def test_bad_counts_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match="--nodes must be >= 1"):
        write_node_keys(tmp_path, 0)
    with pytest.raises(ConfigError, match="days must be >= 1"):
        write_certificates(tmp_path, days=0)
    assert main(["flower", "keys", str(tmp_path), "--nodes", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "fedhp: error: keys: --nodes must be >= 1, got 0"


def test_commands_parse_with_flowers_own_parsers(tmp_path: Path) -> None:
    from flwr.superlink.cli.flower_superlink import _parse_args_run_superlink
    from flwr.supernode.cli.flower_supernode import _parse_args_run_supernode

    certs = write_certificates(tmp_path)
    link = _parse_args_run_superlink().parse_args(superlink_command(certs, "127.0.0.1", 9100)[1:])
    assert link.enable_supernode_auth and not link.insecure
    assert (link.ssl_certfile, link.ssl_keyfile) == (str(certs.server_cert), str(certs.server_key))
    assert link.runtime_dependency_install is False
    assert (link.host, link.port) == ("127.0.0.1", 9100)
    cmd = supernode_command(
        "127.0.0.1:9100", certs.ca_cert, tmp_path / "node-0", 9200, {"partition-id": 1}
    )
    node = _parse_args_run_supernode().parse_args(cmd[1:])
    assert node.superlink == "127.0.0.1:9100" and not node.insecure
    assert node.root_certificates == str(certs.ca_cert)
    assert node.auth_supernode_private_key == str(tmp_path / "node-0")
    assert node.port == 9200 and node.node_config == "partition-id=1"


def test_app_project_is_a_valid_flower_app(tmp_path: Path) -> None:
    from flwr.cli.config_utils import load_and_validate

    yaml_text = "rounds: 3\nalgorithm:\n  name: sfedhp\n"
    app = write_app(tmp_path / "app", {"fedhp-config": yaml_text, "fedhp-out": "/tmp/x"})
    config, _ = load_and_validate(app / "pyproject.toml", check_module=False)
    flwr = config["tool"]["flwr"]["app"]
    assert flwr["components"] == {"serverapp": SERVERAPP, "clientapp": CLIENTAPP}
    assert flwr["config"]["fedhp-config"] == yaml_text
    assert tomli.loads(app_pyproject({"a": 1}))["tool"]["flwr"]["app"]["config"] == {"a": 1}


def test_connection_names_the_superlink_and_its_ca(tmp_path: Path) -> None:
    from flwr.cli.flower_config import parse_superlink_connection

    path = write_connection(tmp_path / "home", "127.0.0.1:9100", tmp_path / "ca.crt")
    doc = tomli.loads(path.read_text())
    assert doc["superlink"]["default"] == "fedhp"
    conn = parse_superlink_connection(doc["superlink"]["fedhp"], "fedhp")
    assert conn.address == "127.0.0.1:9100" and not conn.insecure
    assert conn.root_certificates == str((tmp_path / "ca.crt").resolve())


def test_stop_kills_the_whole_process_tree(tmp_path: Path) -> None:
    """Children started in a new session (as Flower's SuperExec is) are stopped too."""
    script = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
        " start_new_session=True)\n"
        "print('started', flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = start_process("tree", [sys.executable, "-c", script], tmp_path / "tree.log", {})
    for _ in range(100):
        if "started" in proc.text():
            break
        time.sleep(0.1)
    tree = [proc.popen.pid, *descendants(proc.popen.pid)]
    assert len(tree) == 2
    proc.stop(grace=2)
    assert not proc.alive()
    time.sleep(0.5)
    assert not any(running(pid) for pid in tree)


def test_cli_certs_keys_and_app(tmp_path: Path) -> None:
    assert main(["flower", "certs", str(tmp_path / "certs"), "--host", "10.0.0.5"]) == 0
    server = x509.load_pem_x509_certificate((tmp_path / "certs" / "server.pem").read_bytes())
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.5")]
    assert main(["flower", "keys", str(tmp_path / "keys"), "--nodes", "2"]) == 0
    assert sorted(p.name for p in (tmp_path / "keys").iterdir()) == [
        "node-0",
        "node-0.pub",
        "node-1",
        "node-1.pub",
    ]
    out = tmp_path / "run"
    assert main(["flower", "app", str(tmp_path / "app"), "rounds=3", "--out", str(out)]) == 0
    doc = tomli.loads((tmp_path / "app" / "pyproject.toml").read_text())
    cfg = doc["tool"]["flwr"]["app"]["config"]
    assert cfg["fedhp-out"] == str(out.resolve())
    assert "rounds: 3" in cfg["fedhp-config"]
    # Declared, so Flower's own override (flwr run --run-config 'fedhp-resume=true') applies.
    assert cfg["fedhp-resume"] is False
    assert fuse_dicts(cfg, parse_config_args(["fedhp-resume=true"]))["fedhp-resume"] is True
    assert main(["flower", "app", str(tmp_path / "app"), "rounds=zero", "--out", "x"]) == 2


def test_without_flower_a_one_line_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "flwr" else real(name, *a)
    )
    assert main(["flower", "certs", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == (
        "fedhp: error: fedhp flower: Flower is not installed; pip install 'fedhp[flower]'"
    )
    assert not (tmp_path / "ca.crt").exists()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("algorithm.name=centralized", "algorithm.name: centralized is a non-federated"),
        ("flower.nodes=5", "flower.nodes: 5 nodes for 4 edges"),
        ("algorithm.lam=abc", "algorithm.lam"),
        ("device=cuda", "device: a Flower deployment runs on the CPU"),
    ],
)
def test_bad_run_config_is_refused_before_any_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], override: str, message: str
) -> None:
    out, work = tmp_path / "run", tmp_path / "work"
    assert main(["flower", "deploy", override, "--out", str(out), "--workdir", str(work)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fedhp: error: ") and message in err and "\n" not in err
    assert not work.exists() and not out.exists()


def test_wait_for_reports_a_process_that_exits_early(tmp_path: Path) -> None:
    proc = start_process("quitter", [sys.executable, "-c", "print('bye')"], tmp_path / "q.log", {})
    with pytest.raises(DeployError, match="quitter exited before 'ready'"):
        wait_for(proc, "ready", timeout=30)
    proc = start_process(
        "sleeper", [sys.executable, "-c", "import time; time.sleep(30)"], tmp_path / "s.log", {}
    )
    try:
        with pytest.raises(DeployError, match="sleeper: no 'ready' within 1s"):
            wait_for(proc, "ready", timeout=1)
    finally:
        proc.stop(grace=2)
    assert not proc.alive()
