"""Share consumers started together on a new share group split the work (KIP-932).

Kafka 4.2 puts only share partitions whose state is initialized into a share group's
target assignment (KAFKA-18827: `GroupMetadataManager.updateTargetAssignment` builds it
with `withTopicAssignablePartitionsMap(initializedTopics)`). The heartbeat that finds
subscribed partitions without share state starts their initialization; once it is
durable the group epoch is bumped and the assignment recomputed
(`initializedAssignmentPending`). Members that join a new group together therefore get
their partitions from one assignment over all of them, and no member's first
ShareFetch takes the whole backlog.

Each test produces a backlog first, then starts its ShareConsumers together (each owned
by one thread, each START_GAP_S after the previous one, well within one heartbeat
interval, as the consumers of one application starting up) and drains the backlog,
accepting every record. Before this was so, the first consumer was assigned every
partition at its join and its first ShareFetch took the whole backlog (400 / 0 and
400 / 0 / 0 / 0). Waits are bounded.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable

import pytest
from confluent_kafka import AcknowledgeType, Message

from tests.integration.conftest import Broker, create_topic
from tests.integration.share_helpers import (
    PollLog,
    close_quietly,
    consume,
    describe_share_group,
    earliest,
    produce_values,
    share_consumer,
)

PARTITIONS = 4
PER_PARTITION = 100
DRAIN_TIMEOUT_S = 60.0
START_GAP_S = 0.25
# A shorter heartbeat interval than Kafka's 5 s keeps the test short: members learn their
# assignment on the heartbeat after the share state is initialized.
SETTINGS = {
    "group.share.min.heartbeat.interval.ms": "1000",
    "group.share.heartbeat.interval.ms": "2000",
}


def backlog(broker: Broker, topic: str) -> list[bytes]:
    """PER_PARTITION records on each of the topic's PARTITIONS partitions."""
    create_topic(broker, topic, partitions=PARTITIONS)
    records: list[bytes] = []
    for partition in range(PARTITIONS):
        chunk = [f"{topic}-{partition}-{i}".encode() for i in range(PER_PARTITION)]
        produce_values(broker, topic, chunk, partition=partition)
        records += chunk
    return records


def drain_together(
    broker: Broker, group: str, topic: str, count: int, total: int, gap_s: float
) -> list[PollLog]:
    """`count` threads, started START_GAP_S apart, each make an explicit-mode
    ShareConsumer and poll it at once, accepting everything, until `total` records are
    accepted."""
    earliest(broker, group)
    lock = threading.Lock()
    accepted: set[bytes | None] = set()
    done = threading.Event()
    logs = [PollLog() for _ in range(count)]
    failures: list[BaseException] = []

    def decide(msg: Message) -> AcknowledgeType:
        with lock:
            accepted.add(msg.value())
            if len(accepted) >= total:
                done.set()
        return AcknowledgeType.ACCEPT

    def run(i: int) -> None:
        time.sleep(i * gap_s)
        try:
            consumer = share_consumer(broker, group, [topic])
            try:
                consume(
                    consumer,
                    until=lambda _log: done.is_set(),
                    timeout=DRAIN_TIMEOUT_S,
                    decide=decide,
                    log=logs[i],
                )
            finally:
                close_quietly(consumer)
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)
            done.set()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + DRAIN_TIMEOUT_S + 40
    for t in threads:
        t.join(max(deadline - time.monotonic(), 0.1))
    assert not any(t.is_alive() for t in threads), "consumer threads did not finish"
    if failures:
        raise failures[0]
    assert len(accepted) == total, (
        f"accepted {len(accepted)} of {total}; per consumer "
        f"{[len(lg.deliveries) for lg in logs]}; errors {[lg.errors[:3] for lg in logs]}"
    )
    return logs


def split(logs: list[PollLog]) -> str:
    """Records and partitions each consumer got, for assertion messages."""
    return "; ".join(
        f"consumer {i}: {len(lg.deliveries)} records from partitions "
        f"{sorted(Counter(d.partition for d in lg.deliveries).items())}"
        for i, lg in enumerate(logs)
    )


@pytest.mark.timeout(120)
def test_four_consumers_started_together_each_get_records(
    broker_factory: Callable[..., Broker],
) -> None:
    broker = broker_factory(SETTINGS)
    topic, group = "assign-four", "g-assign-four"
    records = backlog(broker, topic)
    logs = drain_together(broker, group, topic, 4, len(records), 0.0)
    counts = [len(lg.deliveries) for lg in logs]
    print(f"split of {len(records)} records: {split(logs)}")
    assert all(n > 0 for n in counts), (
        f"a consumer got nothing: {split(logs)}; group {describe_share_group(broker, group)}"
    )
    delivered = Counter(v for lg in logs for v in lg.values())
    assert sorted(delivered) == sorted(records), "a record was lost or delivered twice"


@pytest.mark.timeout(120)
def test_two_consumers_started_together_split_a_backlog(
    broker_factory: Callable[..., Broker],
) -> None:
    broker = broker_factory(SETTINGS)
    topic, group = "assign-two", "g-assign-two"
    records = backlog(broker, topic)
    logs = drain_together(broker, group, topic, 2, len(records), START_GAP_S)
    counts = [len(lg.deliveries) for lg in logs]
    print(f"split of {len(records)} records: {split(logs)}")
    assert all(0 < n < len(records) for n in counts), (
        f"one consumer took the whole backlog: {split(logs)}; "
        f"group {describe_share_group(broker, group)}"
    )
