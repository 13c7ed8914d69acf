"""`spool topics`, `share-groups`, `configs` and `users` with `--command-config` over SASL_SSL and
SASL_PLAINTEXT, as an operator runs them (subprocesses): Kafka client properties with
librdkafka's names and with the Java client's sasl.jaas.config, PLAIN and SCRAM. A wrong
password, a CA that did not sign the broker's certificate, a missing ssl.ca.location and
a client without security.protocol against a SASL listener each exit 1 with an error a
person can act on, and no password is ever printed.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.cli_helpers import CLI_TIMEOUT_S
from tests.integration.conftest import REPO_ROOT, Broker, free_port, started
from tests.integration.sasl_helpers import SaslBroker
from tests.integration.tls_helpers import Certs, certs

__all__ = ["certs"]  # the module fixture, from tls_helpers

SCRAM = ("SCRAM-SHA-256", "SCRAM-SHA-512")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, certs: Certs) -> Iterator[SaslBroker]:
    with started(SaslBroker(tmp_path_factory.mktemp("cli-security"), certs)) as broker:
        yield broker


def spool(port: int, config: Path | None, *argv: str) -> subprocess.CompletedProcess[str]:
    return spool_at(f"127.0.0.1:{port}", config, *argv)


def spool_at(bootstrap: str, config: Path | None, *argv: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "broker", *argv, "--bootstrap-server", bootstrap]
    if config is not None:
        cmd += ["--command-config", str(config)]
    return subprocess.run(
        cmd,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )


def ok(port: int, config: Path | None, *argv: str) -> str:
    proc = spool(port, config, *argv)
    assert proc.returncode == 0, f"{argv}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def properties(tmp_path: Path, name: str, **props: str) -> Path:
    path = tmp_path / f"{name}.properties"
    path.write_text("".join(f"{k.replace('_', '.')}={v}\n" for k, v in props.items()))
    return path


def sasl_ssl(tmp_path: Path, certs: Certs, password: str = "alice-secret", **more: str) -> Path:
    return properties(
        tmp_path,
        "sasl-ssl",
        security_protocol="SASL_SSL",
        sasl_mechanism="PLAIN",
        sasl_username="alice",
        sasl_password=password,
        ssl_ca_location=str(certs.ca),
        **more,
    )


def test_topics_over_sasl_ssl_with_plain(broker: SaslBroker, certs: Certs, tmp_path: Path) -> None:
    config = sasl_ssl(tmp_path, certs)
    out = ok(broker.sasl_ssl_port, config, "topics", "--create", "--topic", "sec-orders")
    assert out.strip() == "Created topic sec-orders."
    listed = json.loads(ok(broker.sasl_ssl_port, config, "topics", "--list", "--output", "json"))
    assert "sec-orders" in listed
    described = ok(broker.sasl_ssl_port, config, "topics", "--describe", "--topic", "sec-orders")
    assert described.startswith("Topic: sec-orders\t")
    # The same topic, seen over the PLAINTEXT listener: the commands really ran.
    assert "sec-orders" in ok(broker.port, None, "topics", "--list").splitlines()


def test_java_jaas_config_over_sasl_plaintext(broker: SaslBroker, tmp_path: Path) -> None:
    config = tmp_path / "java.properties"
    config.write_text(
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
        "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
        'username="admin" password="admin-secret";\n'
    )
    ok(broker.sasl_port, config, "share-groups", "--list")
    described = ok(
        broker.sasl_port,
        config,
        "configs",
        "--describe",
        "--entity-type",
        "brokers",
        "--entity-name",
        "1",
        "--all",
    )
    assert "log.retention.ms" in described


def test_wrong_password_is_refused_with_the_brokers_message(
    broker: SaslBroker, certs: Certs, tmp_path: Path
) -> None:
    proc = spool(broker.sasl_ssl_port, sasl_ssl(tmp_path, certs, "not-alices"), "topics", "--list")
    assert proc.returncode == 1, proc
    assert proc.stderr.startswith("Error: SASL_AUTHENTICATION_FAILED: "), proc.stderr
    assert "Invalid username or password" in proc.stderr
    assert "user 'alice'" in proc.stderr and "--command-config" in proc.stderr
    assert "not-alices" not in proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr


def test_unsupported_mechanism_names_the_enabled_ones(
    broker: SaslBroker, certs: Certs, tmp_path: Path
) -> None:
    config = sasl_ssl(tmp_path, certs)
    config.write_text(config.read_text().replace("=PLAIN", "=SCRAM-SHA-512"))
    proc = spool(broker.sasl_ssl_port, config, "topics", "--list")
    assert proc.returncode == 1, proc
    assert "Error: UNSUPPORTED_SASL_MECHANISM: " in proc.stderr
    assert "it enables PLAIN" in proc.stderr


def test_ssl_ca_location_is_validated(broker: SaslBroker, certs: Certs, tmp_path: Path) -> None:
    missing = sasl_ssl(tmp_path, certs)
    missing.write_text(missing.read_text().replace(str(certs.ca), str(tmp_path / "nope.pem")))
    proc = spool(broker.sasl_ssl_port, missing, "topics", "--list")
    assert proc.returncode == 1, proc
    assert "Error: INVALID_CONFIG: ssl.ca.location" in proc.stderr
    assert "nope.pem: no such file" in proc.stderr

    # A certificate that did not sign the broker's: the handshake fails, and says why.
    wrong = sasl_ssl(tmp_path, certs)
    wrong.write_text(wrong.read_text().replace(str(certs.ca), str(certs.client_cert)))
    proc = spool(broker.sasl_ssl_port, wrong, "topics", "--list")
    assert proc.returncode == 1, proc
    assert "Error: SSL_HANDSHAKE_FAILED: " in proc.stderr
    assert "certificate" in proc.stderr and "check ssl.ca.location" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_host_name_check_follows_endpoint_identification(
    certs: Certs, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """The certificate names localhost and 127.0.0.1: a SASL_SSL listener on 127.0.0.2
    fails the https check, and serves with the check off (algorithm none)."""
    other = SaslBroker(tmp_path_factory.mktemp("cli-other-host"), certs)
    other.settings["listeners"] = (
        f"PLAINTEXT://127.0.0.1:{other.port},SASL_SSL://127.0.0.2:{other.sasl_ssl_port}"
    )
    other.start()
    try:
        config = sasl_ssl(tmp_path, certs)
        proc = spool_at(f"127.0.0.2:{other.sasl_ssl_port}", config, "topics", "--list")
        assert proc.returncode == 1, proc
        assert "Error: SSL_HANDSHAKE_FAILED: " in proc.stderr
        assert "ssl.endpoint.identification.algorithm" in proc.stderr
        config = sasl_ssl(tmp_path, certs, ssl_endpoint_identification_algorithm="none")
        proc = spool_at(f"127.0.0.2:{other.sasl_ssl_port}", config, "topics", "--list")
        assert proc.returncode == 0, proc
    finally:
        other.stop()


def test_plaintext_client_on_a_sasl_listener_is_told_what_to_set(
    broker: SaslBroker, certs: Certs, tmp_path: Path
) -> None:
    proc = spool(broker.sasl_port, None, "topics", "--list")
    assert proc.returncode == 1, proc
    assert "Error: NETWORK_EXCEPTION: " in proc.stderr
    assert "security.protocol" in proc.stderr
    # And a TLS client on the SASL_PLAINTEXT port.
    proc = spool(broker.sasl_port, sasl_ssl(tmp_path, certs), "topics", "--list")
    assert proc.returncode == 1, proc
    assert "Error: SSL_HANDSHAKE_FAILED: " in proc.stderr
    assert "security.protocol must match the listener" in proc.stderr


def test_a_port_that_never_answers_is_reported_as_such(tmp_path: Path) -> None:
    # A port that accepts and stays silent (not a Kafka listener, or one stuck): the
    # tool gives up after default.api.timeout.ms and says so, not a blank reason.
    with socket.create_server(("127.0.0.1", 0)) as silent:
        config = properties(
            tmp_path,
            "silent",
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="PLAIN",
            sasl_username="alice",
            sasl_password="alice-secret",
            default_api_timeout_ms="1000",
        )
        proc = spool(silent.getsockname()[1], config, "topics", "--list")
    assert proc.returncode == 1, proc
    assert "Error: NETWORK_EXCEPTION: " in proc.stderr
    assert "no answer within 1 s (default.api.timeout.ms)" in proc.stderr
    assert "security.protocol=SASL_PLAINTEXT" in proc.stderr


def test_bad_command_config_is_a_usage_error(broker: SaslBroker, tmp_path: Path) -> None:
    config = properties(tmp_path, "gssapi", security_protocol="SASL_SSL", sasl_password="hunter2")
    proc = spool(broker.sasl_ssl_port, config, "topics", "--list")
    assert proc.returncode == 2, proc
    assert "needs sasl.mechanism" in proc.stderr
    assert "hunter2" not in proc.stderr


# --- SCRAM ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scram_broker(tmp_path_factory: pytest.TempPathFactory, certs: Certs) -> Iterator[SaslBroker]:
    """SCRAM-SHA-256 and -512 enabled; the user carol made with `spool users` over
    SASL_SSL as the PLAIN user admin (one mechanism per call: Kafka refuses a user
    altered twice in one AlterUserScramCredentials request)."""
    root = tmp_path_factory.mktemp("cli-scram")
    broker = SaslBroker(root, certs, ("PLAIN", *SCRAM))
    broker.start()
    try:
        admin = properties(
            root,
            "admin",
            security_protocol="SASL_SSL",
            sasl_mechanism="PLAIN",
            sasl_username="admin",
            sasl_password="admin-secret",
            ssl_ca_location=str(certs.ca),
        )
        for mechanism in SCRAM:
            ok(
                broker.sasl_ssl_port,
                admin,
                "users",
                "--alter",
                "--entity-name",
                "carol",
                "--add-config",
                f"{mechanism}=[iterations=4096,password=carol-secret]",
            )
        described = ok(broker.sasl_ssl_port, admin, "users", "--describe", "--entity-name", "carol")
        assert "SCRAM-SHA-512" in described and "carol-secret" not in described
        yield broker
    finally:
        if broker.running:
            broker.stop()


@pytest.mark.parametrize("mechanism", SCRAM)
def test_scram_over_sasl_ssl(
    scram_broker: SaslBroker, certs: Certs, tmp_path: Path, mechanism: str
) -> None:
    config = properties(
        tmp_path,
        "scram",
        security_protocol="SASL_SSL",
        sasl_mechanism=mechanism,
        sasl_username="carol",
        sasl_password="carol-secret",
        ssl_ca_location=str(certs.ca),
    )
    topic = f"scram-{mechanism.lower()}"
    ok(scram_broker.sasl_ssl_port, config, "topics", "--create", "--topic", topic)
    assert topic in ok(scram_broker.sasl_ssl_port, config, "topics", "--list").splitlines()

    config.write_text(config.read_text().replace("carol-secret", "carol-wrong"))
    proc = spool(scram_broker.sasl_ssl_port, config, "topics", "--list")
    assert proc.returncode == 1, proc
    assert "Error: SASL_AUTHENTICATION_FAILED: " in proc.stderr
    assert "carol-wrong" not in proc.stderr


def test_scram_with_java_jaas_config(scram_broker: SaslBroker, tmp_path: Path) -> None:
    config = tmp_path / "scram-java.properties"
    config.write_text(
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-512\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="carol" password="carol-secret";\n'
    )
    ok(scram_broker.sasl_port, config, "share-groups", "--list")


def test_client_certificate_on_an_ssl_listener_that_requires_one(
    certs: Certs, tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """ssl.client.auth=required: with ssl.certificate.location and ssl.key.location the
    tools are served; without, they exit 1 saying the connection was refused."""
    root = tmp_path_factory.mktemp("cli-mtls")
    broker = Broker(
        root / "data",
        root / "broker.log",
        {
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(certs.server),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(certs.ca),
            "ssl.client.auth": "required",
        },
    )
    ssl_port = free_port()
    broker.settings["listeners"] = f"PLAINTEXT://127.0.0.1:{broker.port},SSL://127.0.0.1:{ssl_port}"
    broker.start()
    try:
        with_cert = properties(
            tmp_path,
            "mtls",
            security_protocol="SSL",
            ssl_ca_location=str(certs.ca),
            ssl_certificate_location=str(certs.client_cert),
            ssl_key_location=str(certs.client_key),
        )
        ok(ssl_port, with_cert, "topics", "--create", "--topic", "mtls-topic")
        without = properties(
            tmp_path, "no-cert", security_protocol="SSL", ssl_ca_location=str(certs.ca)
        )
        proc = spool(ssl_port, without, "topics", "--list")
        assert proc.returncode == 1, proc
        assert proc.stderr.startswith("Error: "), proc.stderr
        assert "Traceback" not in proc.stderr
        assert "ssl.certificate.location and ssl.key.location" in proc.stderr
    finally:
        broker.stop()
