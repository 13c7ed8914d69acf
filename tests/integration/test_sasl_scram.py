"""SASL/SCRAM-SHA-256 and SCRAM-SHA-512 (KIP-84) with credentials managed by KIP-554
(`spool users`, `spool configs --entity-type users`, `spool format --add-scram`), and
KIP-368 re-authentication, with real confluent-kafka clients configured as Kafka users
configure them (security.protocol=SASL_PLAINTEXT, sasl.mechanism, sasl.username,
sasl.password).

Each broker has a PLAINTEXT listener (the admin tools create credentials there, as an
operator does on an internal listener before clients connect) and a SASL_PLAINTEXT one
with only the SCRAM mechanisms enabled.
"""

from __future__ import annotations

import datetime
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import scramp
from confluent_kafka import KafkaError, Producer
from prometheus_client.parser import text_string_to_metric_families

from protocol.errors import ErrorCode
from tests.integration.cli_helpers import ok, spool
from tests.integration.conftest import (
    REPO_ROOT,
    Broker,
    consume_assigned,
    create_topic,
    free_port,
    producer_config,
    started,
)
from tests.integration.share_helpers import log_lines
from tests.integration.test_sasl_plain import _frame, _read_response
from tests.integration.tls_helpers import closed_without_answer

SCRAM = ("SCRAM-SHA-256", "SCRAM-SHA-512")


class ScramBroker(Broker):
    """PLAINTEXT on `port`, SASL_PLAINTEXT (SCRAM only) on `sasl_port`, /metrics."""

    def __init__(self, root: Path, **settings: str) -> None:
        super().__init__(
            root / "data",
            root / "broker.log",
            {"sasl.enabled.mechanisms": ",".join(SCRAM), **settings},
        )
        self.sasl_port = free_port()
        self.metrics_port = free_port()
        self.settings["listeners"] = (
            f"PLAINTEXT://127.0.0.1:{self.port},SASL_PLAINTEXT://127.0.0.1:{self.sasl_port}"
        )

    def command(self) -> list[str]:
        return [*super().command(), "--metrics", f"127.0.0.1:{self.metrics_port}"]

    def metric(self, name: str, **labels: str) -> float:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        return sum(
            s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == name and set(labels.items()) <= set(s.labels.items())
        )


@pytest.fixture(scope="module")
def scram_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScramBroker]:
    with started(ScramBroker(tmp_path_factory.mktemp("scram"))) as broker:
        yield broker


def scram_config(
    broker: ScramBroker, user: str, password: str, mechanism: str = "SCRAM-SHA-256", **more: Any
) -> dict[str, Any]:
    return {
        "bootstrap.servers": f"127.0.0.1:{broker.sasl_port}",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": mechanism,
        "sasl.username": user,
        "sasl.password": password,
        **more,
    }


def broker_logged(broker: Broker, needle: str) -> list[str]:
    """Log lines with `needle`, leaving out the harness's own command-line lines."""
    return [line for line in log_lines(broker, needle) if not line.startswith("===== start")]


def add_user(broker: Broker, user: str, config: str, tool: tuple[str, ...] = ("users",)) -> str:
    return ok(broker, *tool, "--alter", "--entity-name", user, "--add-config", config)


def produce_and_consume(broker: ScramBroker, topic: str, client: dict[str, Any]) -> None:
    """Produce 10 records and read them back, both over SCRAM."""
    create_topic(broker, topic)
    producer = Producer(producer_config(broker, **client))
    for i in range(10):
        producer.produce(topic, f"{topic}-{i}".encode())
    assert producer.flush(30) == 0
    received = consume_assigned(broker, topic, [0], 10, **client)
    assert sorted(r.value for r in received) == sorted(f"{topic}-{i}".encode() for i in range(10))


def refused(broker: ScramBroker, client: dict[str, Any]) -> str:
    """The authentication error a producer with `client` gets."""
    errors: list[KafkaError] = []
    producer = Producer(producer_config(broker, **client, error_cb=errors.append))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not any(
        e.code() == KafkaError._AUTHENTICATION for e in errors
    ):
        producer.poll(0.2)
    found = [e.str() for e in errors if e.code() == KafkaError._AUTHENTICATION]
    assert found, errors
    return found[0]


def test_users_tool_creates_credentials_that_log_in(scram_broker: ScramBroker) -> None:
    out = add_user(
        scram_broker,
        "alice",
        "SCRAM-SHA-256=[iterations=8192,password=alice-secret],"
        "SCRAM-SHA-512=[password=alice-secret]",
    )
    assert out.strip() == "Completed updating config for user alice."
    described = ok(scram_broker, "users", "--describe", "--entity-name", "alice")
    assert described.strip() == (
        "SCRAM credential configs for user-principal 'alice' are "
        "SCRAM-SHA-256=iterations=8192, SCRAM-SHA-512=iterations=4096"
    )
    for mechanism in SCRAM:
        topic = f"scram-{mechanism.lower()}"
        produce_and_consume(
            scram_broker, topic, scram_config(scram_broker, "alice", "alice-secret", mechanism)
        )
        assert log_lines(scram_broker, "sasl_authenticated", "User:alice", mechanism)
    # Neither the password nor anything salted from it is ever logged.
    assert not broker_logged(scram_broker, "alice-secret")
    assert not broker_logged(scram_broker, "salted")


def test_wrong_password_and_unknown_user_are_refused(scram_broker: ScramBroker) -> None:
    add_user(scram_broker, "carol", "SCRAM-SHA-512=[password=carol-secret]")
    expected = (
        "Authentication failed during authentication due to invalid credentials with SASL "
        "mechanism SCRAM-SHA-512"
    )
    for user, password in (("carol", "not-carols"), ("mallory", "carol-secret")):
        message = refused(scram_broker, scram_config(scram_broker, user, password, "SCRAM-SHA-512"))
        assert expected in message, message
    # carol has no SCRAM-SHA-256 credential.
    assert "SCRAM-SHA-256" in refused(
        scram_broker, scram_config(scram_broker, "carol", "carol-secret", "SCRAM-SHA-256")
    )
    assert log_lines(scram_broker, "sasl_authentication_failed", "unknown user")
    assert not broker_logged(scram_broker, "not-carols")
    assert not broker_logged(scram_broker, "carol-secret")


def test_configs_tool_takes_users_and_kafkas_errors(scram_broker: ScramBroker) -> None:
    configs = ("configs", "--entity-type", "users")
    add_user(scram_broker, "dave", "SCRAM-SHA-256=[password=dave-secret]", configs)
    out = ok(scram_broker, *configs, "--describe", "--entity-name", "dave")
    assert "SCRAM-SHA-256=iterations=4096" in out
    # Unknown user: Kafka's per-user error line.
    out = ok(scram_broker, "users", "--describe", "--entity-name", "nobody")
    assert out.strip() == (
        "Error retrieving SCRAM credential configs for user-principal 'nobody': "
        "RESOURCE_NOT_FOUND: Attempt to describe a user credential that does not exist: nobody"
    )
    # Every user when none is named.
    everyone = ok(scram_broker, "users", "--describe")
    assert "user-principal 'dave'" in everyone and "user-principal 'alice'" in everyone
    # Deleting a credential that is not there.
    proc = spool(
        scram_broker, "users", "--alter", "--entity-name", "dave", "--delete-config",
        "SCRAM-SHA-512",
    )  # fmt: skip
    assert proc.returncode == 1
    assert "RESOURCE_NOT_FOUND" in proc.stderr
    # Too few iterations, and a quota config: refused before anything is sent.
    proc = spool(
        scram_broker, "users", "--alter", "--entity-name", "dave", "--add-config",
        "SCRAM-SHA-256=[iterations=100,password=x]",
    )  # fmt: skip
    assert proc.returncode == 2
    assert "Iterations 100 is less than the minimum 4096" in proc.stderr
    proc = spool(
        scram_broker, "users", "--alter", "--entity-name", "dave", "--add-config",
        "producer_byte_rate=1024",
    )  # fmt: skip
    assert proc.returncode == 2 and "producer_byte_rate" in proc.stderr


def test_credentials_survive_kill9_and_a_deleted_one_is_refused(
    tmp_path: Path,
) -> None:
    broker = ScramBroker(tmp_path)
    broker.start()
    try:
        add_user(broker, "bob", "SCRAM-SHA-256=[password=bob-secret]")
        broker.kill9()
        broker.start()
        produce_and_consume(broker, "after-kill9", scram_config(broker, "bob", "bob-secret"))
        # Deleted while the broker runs: the next login is refused.
        out = ok(
            broker, "users", "--alter", "--entity-name", "bob", "--delete-config", "SCRAM-SHA-256"
        )
        assert out.strip() == "Completed updating config for user bob."
        assert "invalid credentials" in refused(broker, scram_config(broker, "bob", "bob-secret"))
        broker.kill9()
        broker.start()
        assert "invalid credentials" in refused(broker, scram_config(broker, "bob", "bob-secret"))
        described = ok(broker, "users", "--describe", "--entity-name", "bob")
        assert "RESOURCE_NOT_FOUND" in described
    finally:
        broker.kill9()


def wait_for(check: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def test_clients_reauthenticate_and_keep_working(tmp_path: Path) -> None:
    """connections.max.reauth.ms=2000: librdkafka re-authenticates on its connections
    before each session ends, and a producer keeps producing through several."""
    broker = ScramBroker(tmp_path, **{"connections.max.reauth.ms": "2000"})
    broker.start()
    try:
        add_user(broker, "erin", "SCRAM-SHA-512=[password=erin-secret]")
        topic = "reauth"
        create_topic(broker, topic)
        client = scram_config(broker, "erin", "erin-secret", "SCRAM-SHA-512")
        errors: list[Any] = []
        stop = threading.Event()
        sent = [0]

        def keep_producing() -> None:
            producer = Producer(producer_config(broker, **client))
            while not stop.is_set():
                producer.produce(topic, b"x", on_delivery=lambda e, _m: e and errors.append(e))
                producer.flush(10)
                sent[0] += 1
                time.sleep(0.05)
            assert producer.flush(10) == 0

        thread = threading.Thread(target=keep_producing)
        thread.start()
        try:
            reauth = "kafka_server_socket_server_metrics_successful_reauthentication_total"
            wait_for(lambda: broker.metric(reauth) >= 3, "three re-authentications")
        finally:
            stop.set()
            thread.join(30)
        assert not thread.is_alive()
        assert errors == [] and sent[0] > 0
        # No connection was cut for an expired session.
        assert broker.metric("spool_connections_closed_total", reason="sasl_session_expired") == 0
        received = consume_assigned(broker, topic, [0], sent[0], **client)
        assert len(received) == sent[0]
    finally:
        broker.kill9()


def test_format_add_scram_before_the_first_start(tmp_path: Path) -> None:
    """kafka-storage.sh format --add-scram's way: the credential exists before any
    client connects, with no listener open to create it on."""
    broker = ScramBroker(tmp_path)
    proc = subprocess.run(
        [
            sys.executable, "-m", "broker", "format", "--data-dir", str(broker.data_dir),
            "--add-scram", "SCRAM-SHA-512=[name=frank,password=frank-secret]",
            "--add-scram", "SCRAM-SHA-256=[name=frank,iterations=8192,password=frank-secret]",
        ],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "frank-secret" not in proc.stdout + proc.stderr
    broker.start()
    try:
        for mechanism in SCRAM:
            client = scram_config(broker, "frank", "frank-secret", mechanism)
            produce_and_consume(broker, f"formatted-{mechanism.lower()}", client)
        assert "invalid credentials" in refused(broker, scram_config(broker, "frank", "nope"))
        described = ok(broker, "users", "--describe", "--entity-name", "frank")
        assert "SCRAM-SHA-256=iterations=8192, SCRAM-SHA-512=iterations=4096" in described
        assert not broker_logged(broker, "frank-secret")
    finally:
        broker.kill9()


# -- the exchange on the wire ----------------------------------------------------------------


class Wire:
    """A raw client connection: Kafka request frames, answers decoded."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.correlation = 0

    def ask(self, api_key: int, version: int, data: dict[str, Any]) -> Any:
        self.correlation += 1
        self.sock.sendall(_frame(api_key, version, self.correlation, data))
        return _read_response(self.sock, api_key, version)

    def scram(self, user: str, password: str, mechanism: str = "SCRAM-SHA-256") -> Any:
        """SaslHandshake v1 + two SaslAuthenticate v2: the last answer."""
        assert self.ask(17, 1, {"mechanism": mechanism}).error_code == ErrorCode.none
        client = scramp.ScramClient([mechanism], user, password)
        first = self.ask(36, 2, {"auth_bytes": client.get_client_first().encode()})
        if first.error_code != ErrorCode.none:
            return first
        assert first.session_lifetime == datetime.timedelta(0)  # not complete yet
        client.set_server_first(first.auth_bytes.decode())
        final = self.ask(36, 2, {"auth_bytes": client.get_client_final().encode()})
        if final.error_code == ErrorCode.none:
            client.set_server_final(final.auth_bytes.decode())
        return final

    def metadata_ok(self) -> bool:
        return bool(self.ask(3, 4, {"topics": None, "allow_auto_topic_creation": False}).brokers)

    def close(self) -> None:
        self.sock.close()


def test_malformed_scram_messages_close_only_that_connection(scram_broker: ScramBroker) -> None:
    add_user(scram_broker, "gina", "SCRAM-SHA-256=[password=gina-secret]")
    for token in (b"garbage", b"n,,n=gina", b"\xff\xfe", b"n,,n=gina,r=x,m=ext"):
        wire = Wire(scram_broker.sasl_port)
        try:
            assert wire.ask(17, 1, {"mechanism": "SCRAM-SHA-256"}).error_code == ErrorCode.none
            answer = wire.ask(36, 2, {"auth_bytes": token})
            assert answer.error_code == ErrorCode.sasl_authentication_failed
            assert answer.error_message == (
                "Authentication failed during authentication due to invalid credentials with "
                "SASL mechanism SCRAM-SHA-256"
            )
            assert closed_without_answer(wire.sock)
        finally:
            wire.close()
    wire = Wire(scram_broker.sasl_port)
    try:
        answer = wire.scram("gina", "gina-secret")
        assert answer.error_code == ErrorCode.none and answer.auth_bytes.startswith(b"v=")
        assert answer.session_lifetime == datetime.timedelta(0)  # no connections.max.reauth.ms
        assert wire.metadata_ok()
    finally:
        wire.close()


def test_sessions_expire_and_reauthenticate_on_the_wire(tmp_path: Path) -> None:
    broker = ScramBroker(tmp_path, **{"connections.max.reauth.ms": "1500"})
    broker.start()
    try:
        add_user(broker, "hana", "SCRAM-SHA-512=[password=hana-secret]")
        add_user(broker, "ivan", "SCRAM-SHA-512=[password=ivan-secret]")
        # Re-authenticating keeps the connection: the same user, a new session.
        wire = Wire(broker.sasl_port)
        try:
            answer = wire.scram("hana", "hana-secret", "SCRAM-SHA-512")
            assert answer.session_lifetime == datetime.timedelta(milliseconds=1500)
            time.sleep(1.1)  # the broker refuses re-authentication within a second
            answer = wire.scram("hana", "hana-secret", "SCRAM-SHA-512")
            assert answer.error_code == ErrorCode.none
            assert answer.session_lifetime == datetime.timedelta(milliseconds=1500)
            assert wire.metadata_ok()
        finally:
            wire.close()
        # Re-authenticating as someone else closes the connection.
        wire = Wire(broker.sasl_port)
        try:
            wire.scram("hana", "hana-secret", "SCRAM-SHA-512")
            time.sleep(1.1)
            answer = wire.scram("ivan", "ivan-secret", "SCRAM-SHA-512")
            assert answer.error_code == ErrorCode.sasl_authentication_failed
            assert answer.error_message == (
                "Cannot change principals during re-authentication from User.hana: User.ivan"
            )
            assert closed_without_answer(wire.sock)
        finally:
            wire.close()
        # A session left to expire: the next request closes the connection.
        wire = Wire(broker.sasl_port)
        try:
            wire.scram("hana", "hana-secret", "SCRAM-SHA-512")
            assert wire.metadata_ok()
            wait_for(lambda: not _still_served(wire), "the expired session to close", timeout=10)
        finally:
            wire.close()
        expired = broker.metric("spool_connections_closed_total", reason="sasl_session_expired")
        assert expired == 1
        assert log_lines(broker, "sasl_session_expired", "User:hana")
        assert (
            broker.metric("kafka_server_socket_server_metrics_successful_reauthentication_total")
            == 1
        )
    finally:
        broker.kill9()


def _still_served(wire: Wire) -> bool:
    try:
        return wire.metadata_ok()
    except (AssertionError, OSError):
        return False


def test_plain_users_from_a_jaas_file_beside_scram(tmp_path: Path) -> None:
    """PLAIN users in the JAAS file `java.security.auth.login.config` names (Kafka's
    -Djava.security.auth.login.config), SCRAM users in the metadata, one listener."""
    jaas = tmp_path / "kafka_server_jaas.conf"
    jaas.write_text(
        "KafkaServer {\n"
        "  org.apache.kafka.common.security.plain.PlainLoginModule required\n"
        '    user_admin="admin-secret" user_kim="kim-secret";\n'
        "};\n"
    )
    broker = ScramBroker(
        tmp_path,
        **{
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256",
            "java.security.auth.login.config": str(jaas),
        },
    )
    broker.start()
    try:
        plain = {**scram_config(broker, "kim", "kim-secret"), "sasl.mechanism": "PLAIN"}
        produce_and_consume(broker, "jaas-file-plain", plain)
        add_user(broker, "lee", "SCRAM-SHA-256=[password=lee-secret]")
        produce_and_consume(broker, "jaas-file-scram", scram_config(broker, "lee", "lee-secret"))
        wrong = {**plain, "sasl.password": "not-kims"}
        assert "Invalid username or password" in refused(broker, wrong)
        assert log_lines(broker, "sasl_authenticated", "User:kim", "PLAIN")
        assert not broker_logged(broker, "kim-secret")
    finally:
        broker.kill9()


def test_a_scram_only_broker_with_acls_managed_over_scram(tmp_path: Path) -> None:
    """The whole Kafka recipe: `format --add-scram` an admin, a broker with only a
    SASL listener and StandardAuthorizer, `spool users --command-config` as the admin
    to create a user, who may log in but not alter credentials (no ALTER on the
    cluster)."""
    broker = ScramBroker(
        tmp_path,
        **{
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": "User:admin",
        },
    )
    broker.settings["listeners"] = f"SASL_PLAINTEXT://127.0.0.1:{broker.sasl_port}"
    broker.port = broker.sasl_port  # the harness's start probe, and the tools' bootstrap
    proc = subprocess.run(
        [
            sys.executable, "-m", "broker", "format", "--data-dir", str(broker.data_dir),
            "-S", "SCRAM-SHA-512=[name=admin,password=admin-secret]",
        ],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr

    def properties(user: str, password: str) -> str:
        path = tmp_path / f"{user}.properties"
        path.write_text(
            "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-512\n"
            f"sasl.username={user}\nsasl.password={password}\n"
        )
        return str(path)

    admin = properties("admin", "admin-secret")
    broker.start()
    try:
        out = ok(
            broker, "users", "--command-config", admin, "--alter", "--entity-name", "mia",
            "--add-config", "SCRAM-SHA-512=[password=mia-secret]",
        )  # fmt: skip
        assert "Completed updating config for user mia." in out
        mia = properties("mia", "mia-secret")
        # mia authenticates, but may neither alter nor describe credentials.
        proc = spool(
            broker, "users", "--command-config", mia, "--alter", "--entity-name", "mia",
            "--add-config", "SCRAM-SHA-512=[password=other]",
        )  # fmt: skip
        assert proc.returncode == 1 and "CLUSTER_AUTHORIZATION_FAILED" in proc.stderr
        proc = spool(broker, "users", "--command-config", mia, "--describe")
        assert proc.returncode == 1 and "CLUSTER_AUTHORIZATION_FAILED" in proc.stderr
        described = ok(broker, "users", "--command-config", admin, "--describe")
        assert "user-principal 'admin'" in described and "user-principal 'mia'" in described
        assert log_lines(broker, "authorization_denied", "User:mia", "ALTER", "CLUSTER")
        assert not broker_logged(broker, "mia-secret")
        assert not broker_logged(broker, "admin-secret")
    finally:
        broker.kill9()
