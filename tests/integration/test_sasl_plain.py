"""SASL PLAIN on SASL_PLAINTEXT and SASL_SSL listeners, with real confluent-kafka clients
configured as Kafka users configure them (security.protocol, sasl.mechanism,
sasl.username, sasl.password), and the broker's side keys as Kafka's brokers take them
(sasl.enabled.mechanisms and listener.name.<listener>.plain.sasl.jaas.config).
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient

from protocol import api
from protocol.errors import ErrorCode
from tests.integration.conftest import (
    admin_config,
    create_topic,
    producer_config,
    started,
)
from tests.integration.sasl_helpers import SaslBroker
from tests.integration.share_helpers import (
    close_quietly,
    consume,
    earliest,
    log_lines,
    produce_values,
    share_consumer,
)
from tests.integration.tls_helpers import Certs, certs, closed_without_answer

__all__ = ["certs"]  # the module fixture, from tls_helpers


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory, certs: Certs) -> Iterator[SaslBroker]:
    with started(SaslBroker(tmp_path_factory.mktemp("sasl"), certs)) as broker:
        yield broker


def broker_logged(broker: SaslBroker, needle: str) -> list[str]:
    return [line for line in log_lines(broker, needle) if not line.startswith("===== start")]


def sasl_config(
    broker: SaslBroker, user: str = "alice", password: str = "alice-secret", **more: Any
) -> dict[str, Any]:
    return {
        "bootstrap.servers": f"127.0.0.1:{broker.sasl_port}",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": user,
        "sasl.password": password,
        **more,
    }


def sasl_ssl_config(broker: SaslBroker, certs: Certs) -> dict[str, Any]:
    return {
        **sasl_config(broker),
        "bootstrap.servers": f"127.0.0.1:{broker.sasl_ssl_port}",
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": str(certs.ca),
    }


def produce_and_share_consume(broker: SaslBroker, name: str, client: dict[str, Any]) -> None:
    topic, group = f"{name}-topic", f"{name}-group"
    create_topic(broker, topic)
    earliest(broker, group)
    values = [f"{name}-{i}".encode() for i in range(20)]
    producer = Producer(producer_config(broker, **client))
    produce_values(broker, topic, values, producer=producer)
    consumer = share_consumer(broker, group, [topic], mode="implicit", **client)
    try:
        log = consume(consumer, until=lambda log: len(log.deliveries) >= len(values), timeout=30)
    finally:
        close_quietly(consumer)
    assert sorted(d.value for d in log.deliveries) == sorted(values)


def test_right_password_produces_and_share_consumes(sasl_broker: SaslBroker) -> None:
    produce_and_share_consume(sasl_broker, "sasl-plain", sasl_config(sasl_broker))
    assert log_lines(sasl_broker, "sasl_authenticated", "User:alice", "SASL_PLAINTEXT")
    # Neither a password nor the JAAS value is ever logged (the test harness writes
    # the command line, with its --set values, into the same file).
    assert not broker_logged(sasl_broker, "alice-secret")
    assert not broker_logged(sasl_broker, "admin-secret")


def test_sasl_ssl_is_tls_then_plain(sasl_broker: SaslBroker, certs: Certs) -> None:
    produce_and_share_consume(sasl_broker, "sasl-ssl", sasl_ssl_config(sasl_broker, certs))
    assert log_lines(sasl_broker, "sasl_authenticated", "User:alice", "listener=SASL_SSL")


def test_wrong_password_is_refused_while_others_keep_working(sasl_broker: SaslBroker) -> None:
    topic = "sasl-wrong-password"
    create_topic(sasl_broker, topic)
    errors: list[Any] = []
    stop = threading.Event()
    sent = [0]

    def keep_producing() -> None:
        producer = Producer(
            producer_config(sasl_broker, **sasl_config(sasl_broker, "admin", "admin-secret"))
        )
        while not stop.is_set():
            producer.produce(topic, b"x", on_delivery=lambda e, _m: e and errors.append(e))
            producer.flush(10)
            sent[0] += 1
        assert producer.flush(10) == 0

    thread = threading.Thread(target=keep_producing)
    thread.start()
    client_errors: list[KafkaError] = []
    try:
        for user, password in (("alice", "not-alices"), ("mallory", "alice-secret")):
            bad = Producer(
                producer_config(
                    sasl_broker,
                    **sasl_config(sasl_broker, user, password),
                    error_cb=client_errors.append,
                )
            )
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not any(
                e.code() == KafkaError._AUTHENTICATION for e in client_errors
            ):
                bad.poll(0.2)
            assert any(e.code() == KafkaError._AUTHENTICATION for e in client_errors), client_errors
            assert any("Invalid username or password" in e.str() for e in client_errors)
            client_errors.clear()
    finally:
        stop.set()
        thread.join(30)
    assert not thread.is_alive()
    assert errors == [] and sent[0] > 0
    assert log_lines(sasl_broker, "sasl_authentication_failed", "Invalid username or password")
    assert not broker_logged(sasl_broker, "not-alices")


def _frame(api_key: int, version: int, correlation_id: int, data: dict[str, Any]) -> bytes:
    body = api.build(api.request_class(api_key, version), data)
    return api.encode_request(api_key, version, correlation_id, "raw", body)


def _read_response(sock: socket.socket, api_key: int, version: int) -> Any:
    def exact(n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = sock.recv(n - len(out))
            assert chunk, "connection closed"
            out += chunk
        return out

    (size,) = struct.unpack(">i", exact(4))
    return api.decode_response(api_key, version, exact(size))[1]


def test_requests_before_authentication_close_only_that_connection(
    sasl_broker: SaslBroker,
) -> None:
    port = sasl_broker.sasl_port
    # A Metadata request first.
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(_frame(3, 4, 1, {"topics": None, "allow_auto_topic_creation": False}))
        assert closed_without_answer(s)
    # A handshake, then Metadata instead of SaslAuthenticate.
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(_frame(17, 1, 1, {"mechanism": "PLAIN"}))
        answer = _read_response(s, 17, 1)
        assert answer.error_code == ErrorCode.none and answer.mechanisms == ("PLAIN",)
        s.sendall(_frame(3, 4, 2, {"topics": None, "allow_auto_topic_creation": False}))
        # Kafka answers this one ILLEGAL_SASL_STATE (Metadata v4 has no top-level
        # error field: an empty answer), then closes.
        assert _read_response(s, 3, 4).brokers == ()
        assert closed_without_answer(s)
    # An unsupported mechanism: the enabled list, then close.
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(_frame(17, 1, 1, {"mechanism": "SCRAM-SHA-256"}))
        answer = _read_response(s, 17, 1)
        assert answer.error_code == ErrorCode.unsupported_sasl_mechanism
        assert answer.mechanisms == ("PLAIN",)
        assert closed_without_answer(s)
    # Malformed PLAIN messages: SASL_AUTHENTICATION_FAILED, then close.
    for token in (b"no-nuls-at-all", b"\x00\x00alice-secret"):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(_frame(17, 1, 1, {"mechanism": "PLAIN"}))
            _read_response(s, 17, 1)
            s.sendall(_frame(36, 2, 2, {"auth_bytes": token}))
            answer = _read_response(s, 36, 2)
            assert answer.error_code == ErrorCode.sasl_authentication_failed
            assert answer.error_message.startswith(("Invalid SASL/PLAIN", "Authentication failed"))
            assert closed_without_answer(s)
    # Handshake v0 then a bare token (Kafka's pre-KIP-152 framing); then requests.
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(_frame(17, 0, 1, {"mechanism": "PLAIN"}))
        assert _read_response(s, 17, 0).error_code == ErrorCode.none
        token = b"\x00admin\x00admin-secret"
        s.sendall(struct.pack(">i", len(token)) + token)
        assert s.recv(4) == b"\x00\x00\x00\x00"
        s.sendall(_frame(3, 4, 2, {"topics": None, "allow_auto_topic_creation": False}))
        assert _read_response(s, 3, 4).brokers
        # Authenticated: a second handshake is out of place, as in Kafka's KafkaApis.
        s.sendall(_frame(17, 1, 3, {"mechanism": "PLAIN"}))
        assert _read_response(s, 17, 1).error_code == ErrorCode.illegal_sasl_state
        s.sendall(_frame(36, 2, 4, {"auth_bytes": token}))
        assert _read_response(s, 36, 2).error_code == ErrorCode.illegal_sasl_state
    # The PLAINTEXT listener has no SASL: ILLEGAL_SASL_STATE too.
    with socket.create_connection(("127.0.0.1", sasl_broker.port), timeout=10) as s:
        s.sendall(_frame(17, 1, 1, {"mechanism": "PLAIN"}))
        assert _read_response(s, 17, 1).error_code == ErrorCode.illegal_sasl_state
    assert log_lines(sasl_broker, "sasl_unexpected_request_closed")
    # The broker still serves SASL clients, and the PLAINTEXT listener.
    metadata = AdminClient(sasl_config(sasl_broker)).list_topics(timeout=15)
    assert [b.port for b in metadata.brokers.values()] == [sasl_broker.sasl_port]
    assert AdminClient(admin_config(sasl_broker)).list_topics(timeout=15).brokers
