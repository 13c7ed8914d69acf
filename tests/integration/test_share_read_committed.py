"""Share groups and transactions end to end (KIP-932 share.isolation.level): real
transactional producers commit and abort interleaved transactions over several
partitions; a read_committed share group receives exactly the committed records, each
once, as a plain read_committed Consumer does; a read_uncommitted group receives every
data record and no control record; an open transaction holds read_committed readers back
until it ends and its marker wakes their long polls; a config change reaches a live
group. One broker serves the module; each test has its own topic and groups.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from tests.integration.conftest import (
    BOTH_STORAGES,
    Broker,
    consumer_config,
    create_topic,
    module_broker,
    producer_config,
    storage_settings_for,
)
from tests.integration.share_helpers import (
    POLL_S,
    PollLog,
    accept_all,
    close_quietly,
    consume,
    set_group_configs,
    share_consumer,
)

PARTITIONS = 3
TXN_TIMEOUT_S = 30.0
# A long-poll that is not woken returns only after this; every wait on a wake-up below
# is bounded well under it, so passing means the LSO move woke the poll.
LONG_POLL_MS = 30_000
WOKEN_WITHIN_S = 10.0


# The durable paths: each test runs on the file engine and on PostgreSQL.
pytestmark = BOTH_STORAGES


@pytest.fixture(scope="module")
def broker(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest, storage: str
) -> Iterator[Broker]:
    with module_broker(
        tmp_path_factory, "share-read-committed", storage_settings_for(request, storage)
    ) as broker:
        yield broker


def txn_producer(broker: Broker, transactional_id: str) -> Producer:
    producer = Producer(producer_config(broker, **{"transactional.id": transactional_id}))
    producer.init_transactions(TXN_TIMEOUT_S)
    return producer


def write_txn(
    producer: Producer, topic: str, values: list[tuple[int, bytes]], *, commit: bool
) -> None:
    """One transaction of (partition, value) records, flushed into the log, then ended."""
    producer.begin_transaction()
    for partition, value in values:
        producer.produce(topic, value=value, partition=partition)
    assert producer.flush(TXN_TIMEOUT_S) == 0
    if commit:
        producer.commit_transaction(TXN_TIMEOUT_S)
    else:
        producer.abort_transaction(TXN_TIMEOUT_S)


def spread(tag: str, count: int) -> list[tuple[int, bytes]]:
    return [(i % PARTITIONS, f"{tag}-{i}".encode()) for i in range(count)]


def share_group(broker: Broker, group: str, isolation: str) -> None:
    set_group_configs(
        broker,
        group,
        {"share.auto.offset.reset": "earliest", "share.isolation.level": isolation},
    )


def consume_share(
    broker: Broker, group: str, topic: str, until_values: set[bytes], timeout: float = 60.0
) -> PollLog:
    """Consume (accepting everything) until every value in `until_values` was seen."""
    consumer = share_consumer(broker, group, [topic], **{"fetch.wait.max.ms": 500})
    try:
        return consume(
            consumer,
            until=lambda log: until_values <= set(log.values()),
            timeout=timeout,
            decide=accept_all,
        )
    finally:
        close_quietly(consumer)


def read_plain(
    broker: Broker, topic: str, isolation: str, until_values: set[bytes], timeout: float = 60.0
) -> list[tuple[int, int, bytes | None]]:
    """(partition, offset, value) a plain assigned Consumer reads from the beginning."""
    consumer = Consumer(
        consumer_config(broker, **{"isolation.level": isolation, "enable.partition.eof": False})
    )
    seen: list[tuple[int, int, bytes | None]] = []
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not until_values <= {v for _, _, v in seen}:
            msg = consumer.poll(POLL_S)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            seen.append((msg.partition(), msg.offset(), msg.value()))
    finally:
        consumer.close()
    return seen


def test_committed_records_once_for_read_committed_every_data_record_otherwise(
    broker: Broker,
) -> None:
    topic = "rc-interleaved"
    create_topic(broker, topic, PARTITIONS)
    a, b = txn_producer(broker, "rc-a"), txn_producer(broker, "rc-b")
    committed: set[bytes] = set()
    aborted: set[bytes] = set()
    # Two producers' transactions interleave in every partition: b's transaction is
    # open around each of a's, and some of each abort.
    for round_ in range(4):
        b.begin_transaction()
        b_values = spread(f"b{round_}", 6)
        for partition, value in b_values[:3]:
            b.produce(topic, value=value, partition=partition)
        assert b.flush(TXN_TIMEOUT_S) == 0
        a_values = spread(f"a{round_}", 6)
        a_commit = round_ % 2 == 0
        write_txn(a, topic, a_values, commit=a_commit)
        for partition, value in b_values[3:]:
            b.produce(topic, value=value, partition=partition)
        assert b.flush(TXN_TIMEOUT_S) == 0
        b_commit = round_ != 1
        if b_commit:
            b.commit_transaction(TXN_TIMEOUT_S)
        else:
            b.abort_transaction(TXN_TIMEOUT_S)
        (committed if a_commit else aborted).update(v for _, v in a_values)
        (committed if b_commit else aborted).update(v for _, v in b_values)
    # A last committed transaction in every partition: once a reader has it, it has
    # passed everything before it.
    sentinels = spread("end", PARTITIONS)
    write_txn(a, topic, sentinels, commit=True)
    committed.update(v for _, v in sentinels)

    share_group(broker, "rc-committed", "read_committed")
    share_group(broker, "rc-uncommitted", "read_uncommitted")
    got_committed = consume_share(broker, "rc-committed", topic, committed)
    got_all = consume_share(broker, "rc-uncommitted", topic, committed | aborted)

    assert got_committed.errors == [] and got_all.errors == []
    # Exactly the committed records, each once.
    assert sorted(got_committed.values()) == sorted(committed)  # type: ignore[type-var]
    assert all(d.delivery_count in (None, 1) for d in got_committed.deliveries)
    # Every data record, aborted ones too, each once; no control record (their offsets
    # are the ones no plain read_uncommitted consumer returns either).
    assert sorted(got_all.values()) == sorted(committed | aborted)  # type: ignore[type-var]
    plain_all = read_plain(broker, topic, "read_uncommitted", committed | aborted)
    assert {(p, o) for p, o, _ in plain_all} == set(got_all.offsets())
    # A plain read_committed Consumer sees the same records at the same offsets.
    plain_committed = read_plain(broker, topic, "read_committed", committed)
    assert sorted((p, o, v) for p, o, v in plain_committed) == sorted(
        (d.partition, d.offset, d.value) for d in got_committed.deliveries
    )


def test_an_open_transaction_holds_read_committed_back_until_its_commit_wakes_it(
    broker: Broker,
) -> None:
    topic = "rc-open"
    create_topic(broker, topic, 1)
    share_group(broker, "rc-open-group", "read_committed")
    producer = txn_producer(broker, "rc-open")
    write_txn(producer, topic, [(0, b"before")], commit=True)
    consumer = share_consumer(
        broker, "rc-open-group", [topic], **{"fetch.wait.max.ms": LONG_POLL_MS}
    )
    plain = Consumer(
        consumer_config(
            broker,
            **{"isolation.level": "read_committed", "fetch.wait.max.ms": LONG_POLL_MS},
        )
    )
    try:
        plain.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        log = consume(
            consumer, until=lambda log: b"before" in log.values(), timeout=30, decide=accept_all
        )
        assert log.values() == [b"before"]
        producer.begin_transaction()
        producer.produce(topic, value=b"held", partition=0)
        assert producer.flush(TXN_TIMEOUT_S) == 0
        # Plain records written after the open transaction are held back too (LSO).
        plain_producer = Producer(producer_config(broker))
        plain_producer.produce(topic, value=b"after", partition=0)
        assert plain_producer.flush(TXN_TIMEOUT_S) == 0
        held = consume(consumer, until=lambda log: False, timeout=3, decide=accept_all)
        assert held.values() == []
        assert [m.value() for m in _drain(plain, 3)] == [b"before"]

        producer.commit_transaction(TXN_TIMEOUT_S)
        committed_at = time.monotonic()
        released = consume(
            consumer,
            until=lambda log: {b"held", b"after"} <= set(log.values()),
            timeout=WOKEN_WITHIN_S,
            decide=accept_all,
        )
        assert released.values() == [b"held", b"after"]
        assert time.monotonic() - committed_at < WOKEN_WITHIN_S
        values = [m.value() for m in _drain(plain, WOKEN_WITHIN_S, until=2)]
        assert values == [b"held", b"after"]
    finally:
        close_quietly(consumer)
        plain.close()


def _drain(consumer: Consumer, timeout: float, until: int | None = None) -> list[Any]:
    """Messages polled for `timeout` s (or until `until` of them arrived)."""
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (until is None or len(out) < until):
        msg = consumer.poll(POLL_S)
        if msg is None or (
            msg.error() is not None and msg.error().code() == KafkaError._PARTITION_EOF
        ):
            continue
        assert msg.error() is None, msg.error()
        out.append(msg)
    return out


def test_switching_a_live_group_to_read_committed_takes_effect(broker: Broker) -> None:
    topic = "rc-switch"
    create_topic(broker, topic, 1)
    group = "rc-switch-group"
    share_group(broker, group, "read_uncommitted")
    producer = txn_producer(broker, "rc-switch")
    consumer = share_consumer(broker, group, [topic], **{"fetch.wait.max.ms": 500})
    try:
        write_txn(producer, topic, [(0, b"aborted-1")], commit=False)
        write_txn(producer, topic, [(0, b"mark-1")], commit=True)
        first = consume(
            consumer, until=lambda log: b"mark-1" in log.values(), timeout=30, decide=accept_all
        )
        assert first.values() == [b"aborted-1", b"mark-1"]
        set_group_configs(broker, group, {"share.isolation.level": "read_committed"})
        write_txn(producer, topic, [(0, b"aborted-2")], commit=False)
        write_txn(producer, topic, [(0, b"mark-2")], commit=True)
        second = consume(
            consumer, until=lambda log: b"mark-2" in log.values(), timeout=30, decide=accept_all
        )
        assert second.values() == [b"mark-2"]
    finally:
        close_quietly(consumer)
