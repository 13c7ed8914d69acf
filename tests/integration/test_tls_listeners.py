"""Several listeners at once, TLS with PEM stores, and clients on the wrong port.

Kafka's `listeners` / `advertised.listeners` / `listener.security.protocol.map` and
`ssl.*` keys; the CA and the certificates are made here with `cryptography`, and real
confluent-kafka clients connect with `security.protocol=SSL`.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient

from tests.integration.conftest import (
    Broker,
    admin_config,
    create_topic,
    free_port,
    producer_config,
    started,
)
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


class ListenersBroker(Broker):
    """A broker with a PLAINTEXT listener on `port` and an SSL one on `ssl_port`, set
    with Kafka's keys (no --listen)."""

    def __init__(self, root: Path, settings: dict[str, str]) -> None:
        super().__init__(root / "data", root / "broker.log", settings)
        self.ssl_port = free_port()
        self.settings["listeners"] = (
            f"PLAINTEXT://127.0.0.1:{self.port},SSL://127.0.0.1:{self.ssl_port}"
        )

    @property
    def ssl_bootstrap(self) -> str:
        return f"127.0.0.1:{self.ssl_port}"

    def command(self) -> list[str]:
        return [*super().command(), "--log-level", "debug"]


def ssl_config(broker: ListenersBroker, certs: Certs, **more: Any) -> dict[str, Any]:
    return {
        "bootstrap.servers": broker.ssl_bootstrap,
        "security.protocol": "SSL",
        "ssl.ca.location": str(certs.ca),
        **more,
    }


def with_client_cert(certs: Certs) -> dict[str, str]:
    return {
        "ssl.certificate.location": str(certs.client_cert),
        "ssl.key.location": str(certs.client_key),
    }


def pem_file_settings(certs: Certs) -> dict[str, str]:
    return {"ssl.keystore.type": "PEM", "ssl.keystore.location": str(certs.server)}


def _start(root: Path, settings: dict[str, str]) -> Iterator[ListenersBroker]:
    with started(ListenersBroker(root, settings)) as broker:
        yield broker


@pytest.fixture(scope="module")
def two_listeners(
    tmp_path_factory: pytest.TempPathFactory, certs: Certs
) -> Iterator[ListenersBroker]:
    """PLAINTEXT and SSL at once; the key store is a PEM file (chain and key)."""
    yield from _start(tmp_path_factory.mktemp("two-listeners"), pem_file_settings(certs))


def advertised_port(config: dict[str, Any]) -> int:
    metadata = AdminClient(config).list_topics(timeout=15)
    [broker] = metadata.brokers.values()
    assert broker.host == "127.0.0.1"
    return int(broker.port)


def test_metadata_advertises_the_listener_asked(
    two_listeners: ListenersBroker, certs: Certs
) -> None:
    # Kafka answers Metadata and DescribeCluster with the endpoint of the listener the
    # request came in on (FindCoordinator too: the SSL share consumer below needs it).
    for config, port in (
        (admin_config(two_listeners), two_listeners.port),
        (ssl_config(two_listeners, certs), two_listeners.ssl_port),
    ):
        assert advertised_port(config) == port
        admin = AdminClient(config)
        cluster = admin.describe_cluster(request_timeout=15).result(timeout=15)
        assert [(n.host, n.port) for n in cluster.nodes] == [("127.0.0.1", port)]


def test_produce_and_share_consume_over_ssl(two_listeners: ListenersBroker, certs: Certs) -> None:
    topic, group = "tls-share", "tls-share-group"
    create_topic(two_listeners, topic)
    earliest(two_listeners, group)
    values = [f"v{i}".encode() for i in range(20)]
    producer = Producer(producer_config(two_listeners, **ssl_config(two_listeners, certs)))
    produce_values(two_listeners, topic, values, producer=producer)
    consumer = share_consumer(
        two_listeners, group, [topic], mode="implicit", **ssl_config(two_listeners, certs)
    )
    try:
        log = consume(consumer, until=lambda log: len(log.deliveries) >= len(values), timeout=30)
    finally:
        close_quietly(consumer)
    assert sorted(d.value for d in log.deliveries) == sorted(values)
    # Without a client certificate, a TLS client is User:ANONYMOUS.
    assert log_lines(two_listeners, "connection_opened", "User:ANONYMOUS", "listener=SSL")


def test_wrong_protocol_on_each_port_is_closed_others_served(
    two_listeners: ListenersBroker, certs: Certs
) -> None:
    """Plaintext (and garbage) on the SSL port, and a TLS client hello on the PLAINTEXT
    port, close those connections only, while a TLS producer keeps producing."""
    topic = "tls-wrong-port"
    create_topic(two_listeners, topic)
    errors: list[Any] = []
    stop = threading.Event()
    sent = [0]

    def keep_producing() -> None:
        producer = Producer(producer_config(two_listeners, **ssl_config(two_listeners, certs)))
        while not stop.is_set():
            producer.produce(topic, b"x", on_delivery=lambda e, _m: e and errors.append(e))
            producer.flush(10)
            sent[0] += 1
        assert producer.flush(10) == 0

    thread = threading.Thread(target=keep_producing)
    thread.start()
    try:
        for payload in (
            # an ApiVersions v0 request in the clear
            b"\x00\x00\x00\x0c\x00\x12\x00\x00\x00\x00\x00\x01\x00\x02ab",
            b"GET / HTTP/1.1\r\n\r\n",
        ):
            with socket.create_connection(("127.0.0.1", two_listeners.ssl_port), timeout=10) as s:
                s.sendall(payload)
                assert closed_without_answer(s)
        client_ctx = ssl.create_default_context(cafile=str(certs.ca))
        with (
            socket.create_connection(("127.0.0.1", two_listeners.port), timeout=10) as s,
            pytest.raises((ssl.SSLError, OSError)),
        ):
            client_ctx.wrap_socket(s, server_hostname="127.0.0.1")
    finally:
        stop.set()
        thread.join(30)
    assert not thread.is_alive()
    assert errors == [] and sent[0] > 0
    assert len(log_lines(two_listeners, "plaintext_on_ssl_listener")) == 2
    assert len(log_lines(two_listeners, "tls_on_plaintext_listener")) == 1
    # Both listeners still serve.
    assert advertised_port(admin_config(two_listeners)) == two_listeners.port
    assert advertised_port(ssl_config(two_listeners, certs)) == two_listeners.ssl_port


def test_client_auth_required(tmp_path: Path, certs: Certs) -> None:
    """ssl.client.auth=required on the SSL listener only (a listener.name.ssl. key),
    with the key and trust stores given as PEM text."""
    settings = {
        "listener.name.ssl.ssl.keystore.type": "PEM",
        "listener.name.ssl.ssl.keystore.certificate.chain": certs.server_chain,
        "listener.name.ssl.ssl.keystore.key": certs.server_key,
        "ssl.truststore.type": "PEM",
        "ssl.truststore.certificates": certs.ca.read_text(),
        "listener.name.ssl.ssl.client.auth": "required",
    }
    gen = _start(tmp_path, settings)
    broker = next(gen)
    try:
        no_cert = AdminClient(ssl_config(broker, certs))
        with pytest.raises(KafkaException):
            no_cert.list_topics(timeout=3)
        assert log_lines(broker, "tls_handshake_failed", "listener=SSL")
        assert advertised_port(ssl_config(broker, certs, **with_client_cert(certs))) == (
            broker.ssl_port
        )
        assert log_lines(broker, "connection_opened", "User:CN=alice,OU=eng,O=Acme")
        # The PLAINTEXT listener needs no certificate.
        assert advertised_port(admin_config(broker)) == broker.port
    finally:
        gen.close()


def test_handshakes_in_progress_count_against_connection_limits(
    tmp_path: Path, certs: Certs
) -> None:
    """A socket that never starts its handshake holds its max.connections.per.ip slot,
    so silent sockets cannot get round the limit; the slot frees when it closes."""
    gen = _start(tmp_path, {**pem_file_settings(certs), "max.connections.per.ip": "1"})
    broker = next(gen)
    client_ctx = ssl.create_default_context(cafile=str(certs.ca))

    def connect() -> socket.socket:
        # From an address of its own, so the harness's start-up probe (from 127.0.0.1)
        # holds no slot of this one.
        return socket.create_connection(
            ("127.0.0.1", broker.ssl_port), timeout=5, source_address=("127.0.0.2", 0)
        )

    def tls_handshake() -> bool:
        with connect() as s:
            try:
                with client_ctx.wrap_socket(s, server_hostname="127.0.0.1"):
                    return True
            except (ssl.SSLError, OSError):
                return False

    try:
        silent = connect()
        try:
            with connect() as second:
                # Refused at once (without the count, it would wait for a handshake).
                assert closed_without_answer(second)
            assert not tls_handshake()
        finally:
            silent.close()
        deadline = time.monotonic() + 10
        while not tls_handshake():
            assert time.monotonic() < deadline, "the slot was not freed"
            time.sleep(0.1)
        assert log_lines(broker, "connection_refused", "127.0.0.2", "max.connections.per.ip")
    finally:
        gen.close()
