"""Transactions over a cluster (broker.txn_markers): three broker processes on one real
PostgreSQL, a 6-partition topic whose partitions are led by all three, and a
confluent-kafka transactional Producer whose transaction coordinator is one of them.

The producer commits one transaction and aborts another, each with records on every
partition: the partition leaders that are not the coordinator verify the transactional
batches with it (AddPartitionsToTxn v4+ VerifyOnly), and the coordinator sends them the
markers (WriteTxnMarkers). A ShareConsumer of a share group with
share.isolation.level=read_committed then receives exactly the committed records, from
every partition, and every partition's last stable offset (ListOffsets read_committed)
is its log end (read_uncommitted), so no reader is held back by a transaction left open.

Before broker.txn_markers the coordinator refused the partitions other brokers lead
(UNKNOWN_TOPIC_OR_PARTITION on AddPartitionsToTxn) and wrote markers only on its own.
The brokers are started here (not by a shared helper): node ids 1-3, a 3 s session.
"""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.integration.conftest import (
    ADMIN_TIMEOUT_S,
    Broker,
    consumer_config,
    create_topic,
    free_port,
    producer_config,
)
from tests.integration.pg_helpers import pg_dsn, pg_server
from tests.integration.share_helpers import (
    accept_all,
    close_quietly,
    consume,
    set_group_configs,
    share_consumer,
)

__all__ = ["pg_dsn", "pg_server"]  # the fixtures, from pg_helpers

NODES = (1, 2, 3)
SESSION_MS = 3000
INTERVAL_MS = 500
WAIT_S = 45.0
TXN_TIMEOUT_S = 30.0
PARTITIONS = 6
PER_PARTITION = 4
TOPIC, GROUP, TXN_ID = "txn-cluster", "txn-cluster-rc", "txn-cluster-producer"
ACTIVE = "kafka_controller_kafkacontroller_activebrokercount"


class Node(Broker):
    """A broker of the test's database with its node id and `--metrics`."""

    def __init__(self, root: Path, dsn: str, node_id: int) -> None:
        super().__init__(
            root / f"data-{node_id}",
            root / f"broker-{node_id}.log",
            {
                "storage": dsn,
                "broker.session.timeout.ms": str(SESSION_MS),
                "broker.heartbeat.interval.ms": str(INTERVAL_MS),
            },
        )
        self.node_id = node_id
        self.metrics_port = free_port()

    def command(self) -> list[str]:
        return [
            *super().command(),
            *("--node-id", str(self.node_id)),
            *("--metrics", f"127.0.0.1:{self.metrics_port}"),
        ]

    def metric(self, name: str) -> float | None:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                text = response.read().decode()
        except OSError:
            return None
        found = re.search(rf"^{name}(?:\{{[^}}]*\}})? (\S+)$", text, re.MULTILINE)
        return None if found is None else float(found.group(1))


@pytest.fixture
def brokers(tmp_path: Path, pg_dsn: str) -> Iterator[list[Node]]:
    nodes = [Node(tmp_path, pg_dsn, n) for n in NODES]
    try:
        for n in nodes:
            n.start()
        yield nodes
    finally:
        for n in nodes:
            if n.running:
                n.stop()


def wait_for(check: Callable[[], Any], what: str, timeout: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def bootstrap(nodes: list[Node]) -> str:
    return ",".join(n.bootstrap for n in nodes)


def leaders(nodes: list[Node]) -> dict[int, int]:
    """Partition -> leader node id, from Metadata (-1 while a partition has none)."""
    admin = AdminClient({"bootstrap.servers": bootstrap(nodes)})
    md = admin.list_topics(TOPIC, timeout=ADMIN_TIMEOUT_S)
    t = md.topics.get(TOPIC)
    if t is None or t.error is not None:
        return {}
    return {p.id: p.leader for p in t.partitions.values()}


def ends(nodes: list[Node], isolation: str) -> dict[int, int]:
    """Each partition's end for `isolation` (ListOffsets LATEST at the leader): the log
    end for read_uncommitted, the last stable offset for read_committed."""
    # A consumer's first metadata may not know the topic yet (UNKNOWN_PARTITION): asked
    # again with a new consumer (and so new metadata) until WAIT_S, then each broker's
    # own view of the topic goes with the error.
    deadline = time.monotonic() + WAIT_S
    while True:
        consumer = Consumer(
            consumer_config(
                nodes[0], **{"bootstrap.servers": bootstrap(nodes), "isolation.level": isolation}
            )
        )
        try:
            return {
                p: consumer.get_watermark_offsets(
                    TopicPartition(TOPIC, p), timeout=ADMIN_TIMEOUT_S, cached=False
                )[1]
                for p in range(PARTITIONS)
            }
        except KafkaException as exc:
            if time.monotonic() > deadline:
                raise AssertionError(f"{exc}; the brokers' metadata: {views(nodes)}") from exc
            time.sleep(0.2)
        finally:
            consumer.close()


def views(nodes: list[Node]) -> dict[str, Any]:
    """What each broker alone answers Metadata for TOPIC: partition -> (leader, error)."""
    out: dict[str, Any] = {}
    for node in nodes:
        try:
            admin = AdminClient({"bootstrap.servers": node.bootstrap})
            topic = admin.list_topics(TOPIC, timeout=ADMIN_TIMEOUT_S).topics.get(TOPIC)
            out[node.bootstrap] = (
                None
                if topic is None
                else (
                    topic.error,
                    {p.id: (p.leader, p.error) for p in topic.partitions.values()},
                )
            )
        except KafkaException as exc:
            out[node.bootstrap] = str(exc)
    return out


def values(tag: str) -> list[tuple[int, bytes]]:
    return [(p, f"{tag}-{p}-{i}".encode()) for p in range(PARTITIONS) for i in range(PER_PARTITION)]


def transaction(producer: Producer, records: list[tuple[int, bytes]], *, commit: bool) -> None:
    producer.begin_transaction()
    for partition, value in records:
        producer.produce(TOPIC, value=value, partition=partition)
    assert producer.flush(TXN_TIMEOUT_S) == 0
    if commit:
        producer.commit_transaction(TXN_TIMEOUT_S)
    else:
        producer.abort_transaction(TXN_TIMEOUT_S)


def test_a_transaction_over_partitions_of_three_brokers_commits_and_aborts(
    brokers: list[Node],
) -> None:
    wait_for(lambda: all(b.metric(ACTIVE) == 3 for b in brokers), "three live brokers")
    create_topic(brokers[0], TOPIC, PARTITIONS)
    spread = wait_for(
        lambda: (lambda found: found if set(found.values()) == set(NODES) else None)(
            leaders(brokers)
        ),
        "the partitions led by all three brokers",
    )
    assert sorted(spread) == list(range(PARTITIONS))
    set_group_configs(
        brokers[0],
        GROUP,
        {"share.isolation.level": "read_committed", "share.auto.offset.reset": "earliest"},
    )

    producer = Producer(
        producer_config(
            brokers[0],
            **{"bootstrap.servers": bootstrap(brokers), "transactional.id": TXN_ID},
        )
    )
    producer.init_transactions(TXN_TIMEOUT_S)
    committed = values("committed")
    transaction(producer, committed, commit=True)
    transaction(producer, values("aborted"), commit=False)
    producer.flush(5)

    # Every partition's LSO reached its log end: each saw both markers.
    stable = ends(brokers, "read_committed")
    log_end = ends(brokers, "read_uncommitted")
    assert stable == log_end, f"LSO {stable} behind the log end {log_end}"
    # Two transactions of PER_PARTITION records and a marker each, on every partition.
    assert log_end == dict.fromkeys(range(PARTITIONS), 2 * (PER_PARTITION + 1))

    consumer = share_consumer(
        brokers[0], GROUP, [TOPIC], **{"bootstrap.servers": bootstrap(brokers)}
    )
    try:
        seen = consume(
            consumer,
            until=lambda log: len(log.deliveries) >= len(committed),
            timeout=60,
            decide=accept_all,
        )
        # A moment more: nothing else (an aborted record) may come.
        consume(consumer, until=lambda _log: False, timeout=3, decide=accept_all, log=seen)
    finally:
        close_quietly(consumer)
    got = sorted((d.partition, d.value) for d in seen.deliveries)
    assert got == sorted(committed), f"errors: {seen.errors[:5]}"
