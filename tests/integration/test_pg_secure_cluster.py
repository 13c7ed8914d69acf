"""A cluster whose only listener is secured: brokers on one real PostgreSQL reach each
other over SASL_SSL (or SSL with client certificates), as Kafka's brokers do with
`inter.broker.listener.name` / `security.inter.broker.protocol`,
`sasl.mechanism.inter.broker.protocol` and the listener's JAAS entry and ssl.* keys
(broker.listeners.inter_broker_client).

Each broker has one listener (SASL_SSL with PLAIN; SSL with ssl.client.auth=required;
SASL_PLAINTEXT where the brokers log in with SCRAM-SHA-256, their credential made
through the cluster's API first, and the client with PLAIN) and an authorizer whose
super.users holds the brokers' principal (User:broker from the JAAS entry's username, or
the subject DN of the brokers' certificate) and the test's client. On a 2-partition
topic led by two brokers:

- a transactional producer commits one transaction and aborts another over both
  partitions: the partition leader that is not the transaction coordinator verifies its
  batches with it (AddPartitionsToTxn) and gets its markers (WriteTxnMarkers) over the
  secured listener, so both partitions' last stable offsets reach their log ends;
- a share group (read_committed) gets exactly the committed records, each once, and
  acknowledges them: the share-partition leader that does not hold the share-state log
  reads and writes its state on the broker that does (ReadShareGroupState /
  WriteShareGroupState requests served there).

Before inter-broker security, these brokers were refused at start ("spool's brokers reach
each other over PLAINTEXT only for now").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from protocol.client import AuthenticationError, ClientSecurity, KafkaClient
from tests.integration.conftest import ADMIN_TIMEOUT_S, consumer_config, producer_config
from tests.integration.pg_helpers import (
    ClusterBroker,
    db_rows,
    pg_dsn,
    pg_server,
    start_brokers,
    wait_for,
)
from tests.integration.share_helpers import (
    accept_all,
    close_quietly,
    consume,
    log_lines,
    never,
    share_consumer,
)
from tests.integration.tls_helpers import Certs, certs

__all__ = ["certs", "pg_dsn", "pg_server"]  # the fixtures

PARTITIONS = 2
PER_PARTITION = 5
TXN_TIMEOUT_S = 30.0
WAIT_S = 30.0
TOPIC, GROUP, TXN_ID = "secure-cluster", "secure-cluster-group", "secure-cluster-txn"
PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
BROKER_SECRET = "broker-secret"
ADMIN_SECRET = "admin-secret"
# The subject DNs of tls_helpers' certificates (the brokers share the server's).
BROKER_DN = "CN=localhost"
CLIENT_DN = "CN=alice,OU=eng,O=Acme"
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


def requests_served(broker: ClusterBroker, request: str) -> float:
    return broker.metric_sum(
        rf'kafka_network_requestmetrics_requests_total\{{request="{request}"[^}}]*\}}'
    )


@dataclass(frozen=True)
class Variant:
    """One way to secure the cluster: the listener, the brokers' keys, the clients'."""

    protocol: str
    brokers: int
    mechanism: str = "PLAIN"  # the brokers' own (the client logs in with PLAIN)

    def broker_settings(self, certs: Certs) -> dict[str, str]:
        settings = {
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(certs.server),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(certs.ca),
            "authorizer.class.name": AUTHORIZER,
        }
        if self.mechanism != "PLAIN":
            listener = self.protocol.lower()
            return {
                **settings,
                "inter.broker.listener.name": self.protocol,
                "sasl.enabled.mechanisms": f"PLAIN,{self.mechanism}",
                "sasl.mechanism.inter.broker.protocol": self.mechanism,
                f"listener.name.{listener}.plain.sasl.jaas.config": (
                    f'{PLAIN_MODULE} required user_admin="{ADMIN_SECRET}";'
                ),
                # Kafka's ScramLoginModule: the broker's own SCRAM user.
                f"listener.name.{listener}.{self.mechanism.lower()}.sasl.jaas.config": (
                    f'{SCRAM_MODULE} required username="broker" password="{BROKER_SECRET}";'
                ),
                "super.users": "User:broker;User:admin",
            }
        if self.protocol == "SASL_SSL":
            return {
                **settings,
                "inter.broker.listener.name": "SASL_SSL",
                "sasl.enabled.mechanisms": "PLAIN",
                "sasl.mechanism.inter.broker.protocol": "PLAIN",
                # Kafka's PlainLoginModule: username/password are the broker's own.
                "listener.name.sasl_ssl.plain.sasl.jaas.config": (
                    f'{PLAIN_MODULE} required username="broker" password="{BROKER_SECRET}" '
                    f'user_broker="{BROKER_SECRET}" user_admin="{ADMIN_SECRET}";'
                ),
                "super.users": "User:broker;User:admin",
            }
        return {
            **settings,
            "security.inter.broker.protocol": "SSL",
            "ssl.client.auth": "required",
            "super.users": f"User:{BROKER_DN};User:{CLIENT_DN}",
        }

    def client_settings(self, certs: Certs) -> dict[str, Any]:
        settings: dict[str, Any] = {
            "security.protocol": self.protocol,
            "ssl.ca.location": str(certs.ca),
        }
        if self.protocol.startswith("SASL"):
            return {
                **settings,
                "sasl.mechanism": "PLAIN",
                "sasl.username": "admin",
                "sasl.password": ADMIN_SECRET,
            }
        return {
            **settings,
            "ssl.certificate.location": str(certs.client_cert),
            "ssl.key.location": str(certs.client_key),
        }


VARIANTS = [
    Variant("SASL_SSL", 3),
    Variant("SSL", 2),
    Variant("SASL_PLAINTEXT", 2, "SCRAM-SHA-256"),
]


class SecureBroker(ClusterBroker):
    """A cluster broker whose only listener is `protocol` on its port."""

    def __init__(self, root: Path, dsn: str, node_id: int, protocol: str, settings: Any):
        super().__init__(root, f"broker{node_id}", dsn, node_id)
        self.settings.update(settings)
        self.settings["listeners"] = f"{protocol}://127.0.0.1:{self.port}"


@pytest.fixture(
    params=VARIANTS,
    ids=lambda v: v.protocol if v.protocol == "SSL" else f"{v.protocol}-{v.mechanism}",
)
def secured(
    request: pytest.FixtureRequest, tmp_path: Path, pg_dsn: str, certs: Certs
) -> Iterator[tuple[Variant, list[SecureBroker]]]:
    variant: Variant = request.param
    settings = variant.broker_settings(certs)
    brokers = [
        SecureBroker(tmp_path, pg_dsn, n, variant.protocol, settings)
        for n in range(1, variant.brokers + 1)
    ]
    try:
        start_brokers(brokers, timeout=WAIT_S)
        yield variant, brokers
    finally:
        for b in brokers:
            if b.running:
                b.stop()


def holder(dsn: str, log: str) -> int | None:
    """The node id holding a coordinator log."""
    rows = db_rows(dsn, "SELECT leader_node FROM spool_logs WHERE name = $1", log)
    return rows[0]["leader_node"] if rows else None


def test_share_group_and_transaction_across_brokers_over_a_secured_listener(
    secured: tuple[Variant, list[SecureBroker]], certs: Certs, pg_dsn: str
) -> None:
    variant, brokers = secured
    client = {
        "bootstrap.servers": ",".join(b.bootstrap for b in brokers),
        **variant.client_settings(certs),
    }
    admin = AdminClient({**client, "broker.address.family": "v4"})
    if variant.mechanism != "PLAIN":
        make_scram_user(admin, brokers, variant.mechanism)
    admin.create_topics(
        [NewTopic(TOPIC, num_partitions=PARTITIONS, replication_factor=1)],
        request_timeout=ADMIN_TIMEOUT_S,
    )[TOPIC].result(timeout=ADMIN_TIMEOUT_S)

    def leaders() -> dict[int, int] | None:
        md = admin.list_topics(TOPIC, timeout=ADMIN_TIMEOUT_S).topics.get(TOPIC)
        if md is None or md.error is not None or len(md.partitions) != PARTITIONS:
            return None
        found = {p.id: p.leader for p in md.partitions.values()}
        return (
            found if len(set(found.values())) == PARTITIONS and -1 not in found.values() else None
        )

    led = wait_for_value(leaders, "the two partitions led by two brokers")
    share_holder = wait_for_value(lambda: holder(pg_dsn, "share-state"), "a share-state holder")
    txn_holder = wait_for_value(lambda: holder(pg_dsn, "transactions"), "a transactions holder")
    # Some partition is led away from each coordinator: its traffic crosses brokers.
    assert set(led.values()) - {share_holder} and set(led.values()) - {txn_holder}, (
        led,
        share_holder,
        txn_holder,
    )
    resource = ConfigResource(
        "GROUP",
        GROUP,
        incremental_configs=[
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
            for k, v in (
                ("share.auto.offset.reset", "earliest"),
                ("share.isolation.level", "read_committed"),
            )
        ],
    )
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=ADMIN_TIMEOUT_S)

    producer = Producer(producer_config(brokers[0], **client, **{"transactional.id": TXN_ID}))
    producer.init_transactions(TXN_TIMEOUT_S)
    committed = [
        (p, f"committed-{p}-{i}".encode()) for p in range(PARTITIONS) for i in range(PER_PARTITION)
    ]
    for records, commit in (
        (committed, True),
        ([(p, b"aborted") for p in range(PARTITIONS)], False),
    ):
        producer.begin_transaction()
        for partition, value in records:
            producer.produce(TOPIC, value=value, partition=partition)
        assert producer.flush(TXN_TIMEOUT_S) == 0
        if commit:
            producer.commit_transaction(TXN_TIMEOUT_S)
        else:
            producer.abort_transaction(TXN_TIMEOUT_S)

    # Both markers reached both partitions: each one's LSO is its log end.
    stable = ends(brokers[0], client, "read_committed")
    assert stable == ends(brokers[0], client, "read_uncommitted"), stable
    assert stable == dict.fromkeys(range(PARTITIONS), PER_PARTITION + 1 + 1 + 1)

    consumer = share_consumer(brokers[0], GROUP, [TOPIC], **client)
    try:
        seen = consume(
            consumer,
            until=lambda log: len(log.deliveries) >= len(committed),
            timeout=60,
            decide=accept_all,
        )
        consume(consumer, until=never, timeout=2, decide=accept_all, log=seen)
    finally:
        close_quietly(consumer)
    got = sorted((d.partition, d.value) for d in seen.deliveries)
    assert got == sorted(committed), f"errors: {seen.errors[:5]}"

    if variant.protocol.startswith("SASL"):
        # The brokers logged in to each other as User:broker with their mechanism (the
        # test's own SCRAM check made one login per broker).
        logins = [
            line
            for b in brokers
            for line in log_lines(b, "sasl_authenticated", "principal=User:broker")
            if f"mechanism={variant.mechanism} " in line
        ]
        assert len(logins) > (len(brokers) if variant.mechanism != "PLAIN" else 0), logins
    by_id = {b.node_id: b for b in brokers}
    # The share-partition leader away from the share coordinator wrote its
    # acknowledgements there, and the transaction coordinator sent markers to the
    # other leader, all over the secured listener.
    assert requests_served(by_id[share_holder], "WriteShareGroupState") > 0
    assert sum(requests_served(b, "WriteTxnMarkers") for b in brokers) > 0
    for b in brokers:
        assert not log_lines(b, "inter_broker_connection_refused"), b.node_id
        assert not log_lines(b, "not_authorized"), b.node_id
        # The harness writes each start's command line (with the --set JAAS) first.
        logged = [
            line
            for line in b.log_path.read_text(errors="replace").splitlines()
            if not line.startswith("===== start")
        ]
        assert not [line for line in logged if BROKER_SECRET in line or ADMIN_SECRET in line]


def make_scram_user(admin: AdminClient, brokers: list[SecureBroker], mechanism: str) -> None:
    """The brokers' SCRAM credential, as an operator makes it (AlterUserScramCredentials),
    then each broker seen to take it (a login with it), before any inter-broker call."""
    info = ScramCredentialInfo(ScramMechanism[mechanism.replace("-", "_")], 4096)
    upsert = UserScramCredentialUpsertion("broker", info, BROKER_SECRET.encode())
    for future in admin.alter_user_scram_credentials([upsert]).values():
        future.result(timeout=ADMIN_TIMEOUT_S)
    security = ClientSecurity(
        protocol="SASL_PLAINTEXT", mechanism=mechanism, username="broker", password=BROKER_SECRET
    )

    async def logs_in(b: SecureBroker) -> bool:
        try:
            client = await KafkaClient.connect(b.host, b.port, "it-scram", security=security)
        except AuthenticationError:
            return False
        await client.close()
        return True

    for b in brokers:
        wait_for(lambda b=b: asyncio.run(logs_in(b)), f"broker {b.node_id} to know the user")


def wait_for_value(check: Callable[[], Any], what: str) -> Any:
    found: list[Any] = []

    def probe() -> bool:
        value = check()
        if value is not None:
            found.append(value)
        return value is not None

    wait_for(probe, what, WAIT_S)
    return found[-1]


def ends(broker: ClusterBroker, client: dict[str, Any], isolation: str) -> dict[int, int]:
    """Each partition's end for `isolation`: the last stable offset for read_committed,
    the log end for read_uncommitted."""
    consumer = Consumer(consumer_config(broker, **client, **{"isolation.level": isolation}))
    try:
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                return {
                    p: consumer.get_watermark_offsets(
                        TopicPartition(TOPIC, p), timeout=ADMIN_TIMEOUT_S, cached=False
                    )[1]
                    for p in range(PARTITIONS)
                }
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        consumer.close()
