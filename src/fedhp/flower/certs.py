"""Development TLS certificates and SuperNode authentication keys for a Flower deployment.

``write_certificates(DIR)`` writes a self-signed CA (``ca.crt``, ``ca.key``) and a SuperLink
server certificate signed by it (``server.pem``, ``server.key``) valid for 127.0.0.1/localhost
(plus any extra host names or IPs). ``write_node_keys(DIR, n)`` writes one ECDSA P-384 key pair
per SuperNode in OpenSSH format (``node-<i>``, ``node-<i>.pub``), the form Flower's
``flower-supernode --auth-supernode-private-key`` and ``flwr supernode register`` read.
For development and tests only: production deployments use certificates from a real CA.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fedhp.errors import ConfigError

DEFAULT_HOSTS = ("127.0.0.1", "localhost")


@dataclass(frozen=True)
class Certificates:
    """Paths of the files ``write_certificates`` wrote."""

    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path


@dataclass(frozen=True)
class NodeKey:
    """One SuperNode's authentication key pair (OpenSSH format)."""

    private: Path
    public: Path


def _write(path: Path, data: bytes, secret: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if secret:
        os.chmod(path, 0o600)


def _key_pem(
    key: ec.EllipticCurvePrivateKey,
    form: serialization.PrivateFormat = serialization.PrivateFormat.PKCS8,
) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, form, serialization.NoEncryption())


def _san(hosts: tuple[str, ...]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def write_certificates(
    out: Path, hosts: tuple[str, ...] = DEFAULT_HOSTS, days: int = 365
) -> Certificates:
    """Write a development CA and a server certificate for ``hosts`` into ``out``."""
    if not hosts:
        raise ConfigError("certs: give at least one host (e.g. --host 127.0.0.1)")
    if days < 1:
        raise ConfigError(f"certs: days must be >= 1, got {days}")
    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedhp development CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA384())
    )
    server_key = ec.generate_private_key(ec.SECP384R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_san(hosts), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA384())
    )
    paths = Certificates(
        ca_cert=out / "ca.crt",
        ca_key=out / "ca.key",
        server_cert=out / "server.pem",
        server_key=out / "server.key",
    )
    _write(paths.ca_cert, ca_cert.public_bytes(serialization.Encoding.PEM))
    _write(paths.ca_key, _key_pem(ca_key), secret=True)
    _write(paths.server_cert, server_cert.public_bytes(serialization.Encoding.PEM))
    _write(paths.server_key, _key_pem(server_key), secret=True)
    return paths


def write_node_key(private: Path, comment: str = "") -> NodeKey:
    """Write one ECDSA P-384 key pair: ``private`` (OpenSSH) and ``private.pub``."""
    key = ec.generate_private_key(ec.SECP384R1())
    public = private.with_name(private.name + ".pub")
    ssh_public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    _write(private, _key_pem(key, serialization.PrivateFormat.OpenSSH), secret=True)
    _write(public, ssh_public + (f" {comment}".encode() if comment else b"") + b"\n")
    return NodeKey(private=private, public=public)


def write_node_keys(out: Path, nodes: int, prefix: str = "node") -> list[NodeKey]:
    """Write ``nodes`` SuperNode key pairs ``<prefix>-<i>`` / ``<prefix>-<i>.pub`` into ``out``."""
    if nodes < 1:
        raise ConfigError(f"keys: --nodes must be >= 1, got {nodes}")
    return [write_node_key(out / f"{prefix}-{i}", comment=f"{prefix}-{i}") for i in range(nodes)]
