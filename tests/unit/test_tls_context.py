"""TlsSettings.context(): PEM key and trust stores load, or startup says which and why.

Certificates are made here with `cryptography`; no socket is opened.
"""

from __future__ import annotations

import datetime
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from broker.config import BrokerConfig
from broker.listeners import TlsSettings
from protocol.errors import KafkaError


def _self_signed() -> tuple[str, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "broker")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM).decode(), key


def _key_pem(key: ec.EllipticCurvePrivateKey, password: str | None = None) -> str:
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password.encode())
        if password
        else serialization.NoEncryption()
    )
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    ).decode()


def settings(**keys: str) -> TlsSettings:
    config = BrokerConfig({"ssl.keystore.type": "PEM", **keys})
    return TlsSettings.from_config(config, "SSL")


def test_a_pem_file_with_chain_and_encrypted_key(tmp_path: Path) -> None:
    cert, key = _self_signed()
    store = tmp_path / "broker.pem"
    store.write_text(cert + _key_pem(key, "pw"))
    ctx = settings(**{"ssl.keystore.location": str(store), "ssl.key.password": "pw"}).context()
    assert ctx.verify_mode == ssl.CERT_NONE  # ssl.client.auth=none
    with pytest.raises(KafkaError, match=r"Listener SSL: cannot load the key store .*broker\.pem"):
        settings(**{"ssl.keystore.location": str(store), "ssl.key.password": "wrong"}).context()


def test_inline_chain_key_and_trusted_certificates() -> None:
    cert, key = _self_signed()
    ctx = settings(
        **{
            "ssl.keystore.certificate.chain": cert,
            "ssl.keystore.key": _key_pem(key),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.certificates": cert,
            "ssl.client.auth": "required",
            "ssl.enabled.protocols": "TLSv1.3",
        }
    ).context()
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    assert ctx.minimum_version == ctx.maximum_version == ssl.TLSVersion.TLSv1_3
    assert len(ctx.get_ca_certs()) == 1


def test_requested_client_auth_is_optional_verification() -> None:
    cert, key = _self_signed()
    tls = settings(
        **{
            "ssl.keystore.certificate.chain": cert,
            "ssl.keystore.key": _key_pem(key),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.certificates": cert,
            "ssl.client.auth": "requested",
        }
    )
    assert tls.context().verify_mode == ssl.CERT_OPTIONAL


def test_missing_or_bad_files_name_the_store(tmp_path: Path) -> None:
    with pytest.raises(KafkaError, match=r"cannot load the key store .*missing\.pem"):
        settings(**{"ssl.keystore.location": str(tmp_path / "missing.pem")}).context()
    cert, key = _self_signed()
    store = tmp_path / "broker.pem"
    store.write_text(cert + _key_pem(key))
    not_pem = tmp_path / "ca.pem"
    not_pem.write_text("not a certificate")
    with pytest.raises(KafkaError, match=r"cannot load the trust store .*ca\.pem"):
        settings(
            **{
                "ssl.keystore.location": str(store),
                "ssl.truststore.type": "PEM",
                "ssl.truststore.location": str(not_pem),
            }
        ).context()
