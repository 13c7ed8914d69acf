"""Certificates for the TLS and SASL_SSL integration tests, made with `cryptography`,
and the socket check both use for a connection the broker refused.
"""

from __future__ import annotations

import datetime
import ipaddress
import socket
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class Certs:
    ca: Path  # the CA certificate
    server: Path  # the server's chain and key, one PEM file
    server_chain: str
    server_key: str
    client_cert: Path
    client_key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert(
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    *,
    ca: bool = False,
    san: list[x509.GeneralName] | None = None,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def make_certs(root: Path) -> Certs:
    """A CA, a server certificate for localhost and 127.0.0.1, and a client certificate
    (`CN=alice,OU=eng,O=Acme`), as PEM files in `root` (the benchmarks use it too)."""
    root.mkdir(parents=True, exist_ok=True)
    ca_key = _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "spool test CA")])
    ca = _cert(ca_name, ca_key, ca_name, ca_key, ca=True)
    server_key = _key()
    server = _cert(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]),
        server_key,
        ca_name,
        ca_key,
        san=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
    )
    client_key = _key()
    client = _cert(
        x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Acme"),
                x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "eng"),
                x509.NameAttribute(NameOID.COMMON_NAME, "alice"),
            ]
        ),
        client_key,
        ca_name,
        ca_key,
    )
    pem = serialization.Encoding.PEM
    (root / "ca.pem").write_bytes(ca.public_bytes(pem))
    chain = server.public_bytes(pem).decode()
    (root / "server.pem").write_text(chain + _pem_key(server_key).decode())
    (root / "client.pem").write_bytes(client.public_bytes(pem))
    (root / "client.key").write_bytes(_pem_key(client_key))
    return Certs(
        root / "ca.pem",
        root / "server.pem",
        chain,
        _pem_key(server_key).decode(),
        root / "client.pem",
        root / "client.key",
    )


def closed_without_answer(sock: socket.socket) -> bool:
    """The peer closed (a reset: it left our bytes unread) and sent nothing."""
    try:
        return sock.recv(100) == b""
    except ConnectionResetError:
        return True
