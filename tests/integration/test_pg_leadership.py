"""Partitions led by lease over three broker processes on one PostgreSQL database
(broker.leadership): a 6-partition topic's leaders are spread 2/2/2 and every broker
answers Metadata with the same leaders; an idempotent acks=all producer and a consumer
write and read across the three leaders; a graceful stop of a broker hands its
partitions to the others while a producer runs, without an application error, a loss
or a duplicate; after a kill -9 its partitions are led by the others once its lease
expired, with every acknowledged record there.

The brokers are pg_helpers' `cluster` brokers, with short leases
(broker.session.timeout.ms 3000, broker.heartbeat.interval.ms 500) to keep it fast.
Leaders are read per broker with a Metadata request of its own, never through a
client's cached view.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable

from confluent_kafka import Producer

from protocol.client import KafkaClient
from tests.integration.conftest import (
    consume_assigned,
    create_topic,
    produce,
    producer_config,
)
from tests.integration.pg_helpers import (
    INTERVAL_MS,
    SESSION_MS,
    ClusterBroker,
    cluster,
    db_rows,
    pg_dsn,
    pg_server,
    start_brokers,
    wait_for,
)

__all__ = ["cluster", "pg_dsn", "pg_server"]  # the fixtures

PARTITIONS = 6
LEADER_COUNT = "kafka_server_replicamanager_leadercount"


def leaders(b: ClusterBroker, topic: str) -> dict[int, int]:
    """Partition -> leader id as broker `b` answers Metadata (-1: no leader)."""

    async def ask() -> dict[int, int]:
        client = await KafkaClient.connect(b.host, b.port, "spool-it-leadership")
        try:
            metadata = await client.request(
                3,
                12,
                {
                    "topics": None,
                    "allow_auto_topic_creation": False,
                    "include_topic_authorized_operations": False,
                },
            )
        finally:
            await client.close()
        for t in metadata.topics:
            if t.name == topic:
                return {int(p.partition_index): int(p.leader_id) for p in t.partitions}
        return {}

    return asyncio.run(ask())


def settled(brokers: list[ClusterBroker], topic: str, live: set[int]) -> Callable[[], bool]:
    """Every broker of `brokers` names a live leader for every partition, the same one,
    the partitions spread evenly over `live`."""

    def check() -> bool:
        seen = [leaders(b, topic) for b in brokers]
        first = seen[0]
        if len(first) != PARTITIONS or any(s != first for s in seen[1:]):
            return False
        counts = Counter(first.values())
        return set(counts) == live and max(counts.values()) - min(counts.values()) <= 1

    return check


def start_cluster(make: Callable[..., ClusterBroker], topic: str) -> list[ClusterBroker]:
    brokers = start_brokers([make(n) for n in (1, 2, 3)])
    create_topic(brokers[0], topic, PARTITIONS)
    wait_for(settled(brokers, topic, {1, 2, 3}), "the leaders to spread over three brokers")
    return brokers


def records(prefix: str, n: int) -> list[tuple[int | None, bytes | None, bytes | None, list]]:  # type: ignore[type-arg]
    return [(i % PARTITIONS, None, f"{prefix}-{i}".encode(), []) for i in range(n)]


def test_six_partitions_are_led_two_by_each_broker_and_clients_use_all_three(
    cluster: Callable[..., ClusterBroker], pg_dsn: str
) -> None:
    brokers = start_cluster(cluster, "spread")
    layout = leaders(brokers[2], "spread")
    assert sorted(Counter(layout.values()).values()) == [2, 2, 2]
    for b in brokers:
        assert b.metric(LEADER_COUNT) == 2
    # The database holds the same: each log's holder at the epoch of its claim.
    rows = db_rows(
        pg_dsn,
        "SELECT name, leader_node, leader_epoch FROM spool_logs WHERE name LIKE 'topics/%'",
    )
    assert {r["name"]: r["leader_node"] for r in rows} == {
        f"topics/spread-{p}": leader for p, leader in layout.items()
    }

    producer = Producer(producer_config(brokers[0]))
    outcome = produce(producer, "spread", records("v", 600), flush_timeout=60)
    assert outcome.errors == [] and outcome.unflushed == 0
    assert len(outcome.acked) == 600
    got = consume_assigned(brokers[1], "spread", list(range(PARTITIONS)), 600)
    assert sorted(r.value for r in got) == sorted(s.value for s in outcome.acked)  # type: ignore[type-var]
    # Each leader wrote its own partitions: offsets 0..99 in every one.
    for p in range(PARTITIONS):
        assert sorted(r.offset for r in got if r.partition == p) == list(range(100))


def test_a_graceful_stop_hands_its_partitions_over_while_a_producer_runs(
    cluster: Callable[..., ClusterBroker],
) -> None:
    brokers = start_cluster(cluster, "handover")
    one, two, three = brokers
    led_by_three = [p for p, leader in leaders(one, "handover").items() if leader == 3]
    assert len(led_by_three) == 2

    producer = Producer(producer_config(one, **{"linger.ms": 1}))
    stopper = threading.Timer(1.0, three.stop)
    stopper.start()
    sent = records("h", 3000)
    acked: list[bytes] = []
    errors: list[object] = []

    def on_delivery(err: object, msg: object) -> None:
        if err is not None:
            errors.append(err)
        else:
            acked.append(msg.value())  # type: ignore[attr-defined]

    started = time.monotonic()
    for partition, _key, value, _headers in sent:
        producer.produce("handover", value=value, partition=partition, on_delivery=on_delivery)
        producer.poll(0.001)  # about 3 s of records: the stop lands in the middle
    assert producer.flush(60) == 0
    stopper.join()
    assert errors == [], errors[:5]
    assert time.monotonic() - started > 1.0
    assert sorted(acked) == sorted(v for _, _, v, _ in sent)  # type: ignore[type-var]

    wait_for(settled([one, two], "handover", {1, 2}), "the two brokers to lead all six")
    got = consume_assigned(one, "handover", list(range(PARTITIONS)), len(sent))
    values = [r.value for r in got]
    assert len(values) == len(set(values)) == len(sent)  # no loss, no duplicate
    assert one.metric("spool_leadership_releases_total") is not None
    assert (two.metric(LEADER_COUNT) or 0) + (one.metric(LEADER_COUNT) or 0) == PARTITIONS


def test_after_a_kill9_the_others_lead_its_partitions_once_its_lease_expired(
    cluster: Callable[..., ClusterBroker],
) -> None:
    brokers = start_cluster(cluster, "failover")
    one, two, three = brokers
    producer = Producer(producer_config(one))
    first = produce(producer, "failover", records("a", 600))
    assert first.errors == [] and len(first.acked) == 600

    three.kill9()
    killed_at = time.monotonic()
    took = wait_for(
        settled([one, two], "failover", {1, 2}),
        "the partitions of the killed broker to be led by the others",
        timeout=SESSION_MS / 1000 + 15,
    )
    # Not before the lease ran out (nobody claims a live broker's log), and within a
    # few heartbeats after.
    assert took <= SESSION_MS / 1000 + 4 * INTERVAL_MS / 1000 + 5, took
    assert time.monotonic() - killed_at >= SESSION_MS / 1000 - 1

    # Every acknowledged record is there, and the new leaders take writes.
    second = produce(producer, "failover", records("b", 600))
    assert second.errors == [] and len(second.acked) == 600
    got = consume_assigned(two, "failover", list(range(PARTITIONS)), 1200)
    values = sorted(r.value for r in got)  # type: ignore[type-var]
    assert values == sorted(s.value for s in first.acked + second.acked)  # type: ignore[type-var]
