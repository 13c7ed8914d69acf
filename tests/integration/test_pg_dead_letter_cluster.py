"""Dead letters across a cluster: the DLQ partition led by another broker than the
share-partition leader (KIP-1191 over PostgreSQL).

Two broker processes on one real PostgreSQL. `dlq.orders` has one partition, led by
one of them; `orders` has four, and the test picks one the other broker leads. A
ShareConsumer rejects every record of that partition: its share-partition leader reads
them from its own log and sends the copies as Produce acks=-1 to the DLQ partition's
leader over the inter-broker listener (broker.share.dead_letter_sink). Each rejected
record is in dlq.orders exactly once with its headers, key and value, and the sending
broker counted the writes and no failure.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from confluent_kafka import AcknowledgeType, Message, Producer
from confluent_kafka.admin import AdminClient

from tests.integration.conftest import (
    ADMIN_TIMEOUT_S,
    consume_assigned,
    create_topic,
    produce,
    producer_config,
)
from tests.integration.pg_helpers import (
    ClusterBroker,
    cluster,
    pg_dsn,
    pg_server,
    start_brokers,
    wait_for,
)
from tests.integration.share_helpers import (
    close_quietly,
    consume,
    set_group_configs,
    share_consumer,
)

__all__ = ["cluster", "pg_dsn", "pg_server"]  # the fixtures, from pg_helpers

SOURCE, DLQ, GROUP = "orders", "dlq.orders", "billing"
SOURCE_PARTITIONS = 4
RECORDS = 3
WAIT_S = 45.0


def leaders(brokers: list[ClusterBroker], topic: str) -> dict[int, int]:
    """Partition -> leader node id, from Metadata ({} until every one has a leader)."""
    admin = AdminClient({"bootstrap.servers": ",".join(b.bootstrap for b in brokers)})
    t = admin.list_topics(topic, timeout=ADMIN_TIMEOUT_S).topics.get(topic)
    if t is None or t.error is not None:
        return {}
    found = {p.id: p.leader for p in t.partitions.values()}
    return {} if any(leader < 0 for leader in found.values()) else found


def test_copies_go_to_a_dlq_partition_another_broker_leads(
    cluster: Callable[..., ClusterBroker],
) -> None:
    brokers = start_brokers([cluster(1), cluster(2)])
    by_id = {b.node_id: b for b in brokers}
    first = brokers[0]
    create_topic(first, DLQ, 1, {"errors.deadletterqueue.group.enable": "true"})
    create_topic(first, SOURCE, SOURCE_PARTITIONS)
    # The leader as seen by the check that found it (asked again, a broker still
    # settling its leadership may answer without one).
    dlq_leader: dict[int, int] = {}

    def dlq_led() -> bool:
        dlq_leader.update(leaders(brokers, DLQ))
        return 0 in dlq_leader

    wait_for(dlq_led, "the DLQ partition's leader", WAIT_S)

    # Likewise the source partition the other broker leads, kept as the check found it.
    other: dict[int, int] = {}

    def elsewhere() -> bool:
        found = leaders(brokers, SOURCE)
        other.update({p: n for p, n in found.items() if n != dlq_leader[0]})
        return bool(other)

    wait_for(elsewhere, "a source partition the other broker leads", WAIT_S)
    partition, sender = sorted(other.items())[0]
    set_group_configs(
        first,
        GROUP,
        {
            "share.auto.offset.reset": "earliest",
            "errors.deadletterqueue.topic.name": DLQ,
            "errors.deadletterqueue.copy.record.enable": "true",
        },
    )
    leader = by_id[sender]
    producer = Producer(producer_config(leader))
    records: list[tuple[int | None, bytes | None, bytes | None, list[tuple[str, Any]]]] = [
        (partition, f"k{i}".encode(), f"v{i}".encode(), [("n", str(i).encode())])
        for i in range(RECORDS)
    ]
    outcome = produce(producer, SOURCE, records)
    assert len(outcome.acked) == RECORDS and not outcome.errors, outcome

    def reject(msg: Message) -> AcknowledgeType:
        return AcknowledgeType.REJECT

    consumer = share_consumer(leader, GROUP, [SOURCE])
    try:
        log = consume(
            consumer, until=lambda lg: len(lg.deliveries) >= RECORDS, timeout=WAIT_S, decide=reject
        )
    finally:
        close_quietly(consumer)
    assert sorted(d.key for d in log.deliveries) == [(partition, o) for o in range(RECORDS)]

    reader = by_id[dlq_leader[0]]
    copies = consume_assigned(reader, DLQ, [0], RECORDS, timeout=WAIT_S)
    by_offset = {dict(c.headers)["__dlq.errors.offset"]: c for c in copies}
    assert len(copies) == RECORDS and sorted(by_offset) == [
        str(o).encode() for o in range(RECORDS)
    ], copies
    for o, c in by_offset.items():
        i = int(o)
        assert (c.key, c.value) == (f"k{i}".encode(), f"v{i}".encode())
        assert c.headers == (
            ("__dlq.errors.topic", SOURCE.encode()),
            ("__dlq.errors.partition", str(partition).encode()),
            ("__dlq.errors.offset", o),
            ("__dlq.errors.group", GROUP.encode()),
            ("__dlq.errors.delivery.count", b"1"),
            ("__dlq.errors.message", b"Offset rejected by client."),
            ("n", str(i).encode()),
        )

    def counted(name: str) -> float:
        pattern = rf'kafka_server_sharegroupmetrics_{name}_total\{{group="{GROUP}"\}}'
        return sum(float(m) for m in re.findall(rf"^{pattern} (\S+)$", leader.metrics(), re.M))

    assert counted("deadletterqueuetotalproducerequests") >= 1
    assert counted("deadletterqueuefailedproducerequests") == 0
