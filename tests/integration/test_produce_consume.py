"""Produce with a real idempotent producer, read back with a real assign() consumer."""

from __future__ import annotations

import random
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.integration.conftest import (
    BOTH_STORAGES,
    Broker,
    Received,
    admin_config,
    consume_assigned,
    consumer_config,
    create_topic,
    produce,
    producer_config,
    wait_for_partitions,
    watermarks,
)

PARTITIONS = 3

Record = tuple[int | None, bytes | None, bytes | None, list[tuple[str, Any]]]


def make_records(count: int, partitions: int, seed: int) -> list[Record]:
    """Deterministic records spread round-robin over partitions.

    Values mix compressible text with random bytes, and include the awkward cases:
    empty value, null value, null key, no headers, a header with a null value.
    """
    rng = random.Random(seed)
    records: list[Record] = []
    for i in range(count):
        key: bytes | None = f"key-{i}".encode()
        value: bytes | None = f"value-{i}-".encode() * rng.randint(0, 8) + rng.randbytes(
            rng.randint(0, 64)
        )
        headers: list[tuple[str, Any]] = [("seq", str(i).encode()), ("src", b"spool-it")]
        if i % 101 == 0:
            key = None
        if i % 211 == 0:
            value = None
        if i % 307 == 0:
            value = b""
        if i % 13 == 0:
            headers = []
        if i % 17 == 0:
            headers.append(("nullable", None))
        records.append((i % partitions, key, value, headers))
    return records


def by_partition(records: list[Record]) -> dict[int, list[tuple[Any, Any, Any]]]:
    out: dict[int, list[tuple[Any, Any, Any]]] = defaultdict(list)
    for partition, key, value, headers in records:
        assert partition is not None
        out[partition].append((key, value, tuple(headers)))
    return out


def received_by_partition(received: list[Received]) -> dict[int, list[Received]]:
    out: dict[int, list[Received]] = defaultdict(list)
    for r in received:
        out[r.partition].append(r)
    return out


def assert_reads_back(received: list[Received], records: list[Record]) -> None:
    """Every partition holds exactly the sent records, in order, at offsets 0..n-1."""
    expected = by_partition(records)
    got = received_by_partition(received)
    assert sorted(got) == sorted(expected)
    for partition, sent in expected.items():
        rows = got[partition]
        assert [r.offset for r in rows] == list(range(len(sent))), f"partition {partition}"
        for offset, (row, (key, value, headers)) in enumerate(zip(rows, sent, strict=True)):
            assert (row.key, row.value, row.headers) == (key, value, headers), (
                f"partition {partition} offset {offset}"
            )


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("codec", "count", "storage"),
    [
        ("none", 30_000, "file"),
        ("gzip", 5_000, "file"),
        ("snappy", 5_000, "file"),
        ("lz4", 5_000, "file"),
        ("zstd", 5_000, "file"),
        # PostgreSQL stores batches as they arrived, whatever their codec: two suffice.
        ("none", 30_000, "postgresql"),
        ("zstd", 5_000, "postgresql"),
    ],
    indirect=["storage"],
)
def test_idempotent_produce_reads_back_byte_identical_in_order(
    broker: Broker, codec: str, count: int
) -> None:
    topic = f"records-{codec}"
    create_topic(broker, topic, partitions=PARTITIONS)
    records = make_records(count, PARTITIONS, seed=count)

    producer = Producer(producer_config(broker, **{"compression.type": codec}))
    outcome = produce(producer, topic, records, flush_timeout=120)
    assert outcome.errors == [], outcome.errors[:5]
    assert outcome.unflushed == 0
    assert len(outcome.acked) == count

    # Delivery reports carry the offsets the broker assigned: 0..n-1 per partition,
    # in produce order (idempotence keeps order across retries).
    acked_offsets: dict[int, list[int]] = defaultdict(list)
    for sent in outcome.acked:
        acked_offsets[sent.partition].append(sent.offset)
    for partition, sent in by_partition(records).items():
        assert sorted(acked_offsets[partition]) == list(range(len(sent)))

    received = consume_assigned(broker, topic, range(PARTITIONS), count, timeout=120)
    assert_reads_back(received, records)
    for partition, sent in by_partition(records).items():
        assert watermarks(broker, topic, partition) == (0, len(sent))

    broker.restart()

    again = consume_assigned(broker, topic, range(PARTITIONS), count, timeout=120)
    assert_reads_back(again, records)
    for partition, sent in by_partition(records).items():
        assert watermarks(broker, topic, partition) == (0, len(sent))


@BOTH_STORAGES
def test_fetch_from_middle_offset_starts_exactly_there(broker: Broker) -> None:
    topic = "middle"
    create_topic(broker, topic)
    records: list[Record] = [(0, None, f"v{i}".encode(), []) for i in range(2_000)]
    outcome = produce(Producer(producer_config(broker)), topic, records)
    assert outcome.errors == [] and outcome.unflushed == 0

    consumer = Consumer(consumer_config(broker))
    try:
        # Offset 1234 is inside a producer batch: the consumer must still start at 1234.
        consumer.assign([TopicPartition(topic, 0, 1234)])
        first = None
        deadline = time.monotonic() + 30
        while first is None and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                first = msg
        assert first is not None, "no record fetched from offset 1234"
        assert (first.offset(), first.value()) == (1234, b"v1234")
    finally:
        consumer.close()


@BOTH_STORAGES
@pytest.mark.timeout(180)
def test_records_across_rolled_segments_read_back_after_restart(
    broker_factory: Callable[..., Broker],
) -> None:
    broker = broker_factory({"log.segment.bytes": str(1024 * 1024)})
    topic = "segmented"
    create_topic(broker, topic)
    count = 10_000
    rng = random.Random(3)
    records: list[Record] = [(0, f"k{i}".encode(), rng.randbytes(400), []) for i in range(count)]
    outcome = produce(Producer(producer_config(broker)), topic, records)
    assert outcome.errors == [] and outcome.unflushed == 0
    # ~4 MB in 1 MiB segments (topics/<topic>-<p>/<base offset>.log, as Kafka lays out a partition).
    segments = sorted((broker.data_dir / "topics" / f"{topic}-0").glob("*.log"))
    assert len(segments) >= 3, segments

    broker.restart()

    got = consume_assigned(broker, topic, [0], count, timeout=60)
    assert_reads_back(got, records)
    assert watermarks(broker, topic, 0) == (0, count)
    consumer = Consumer(consumer_config(broker))
    try:
        consumer.assign([TopicPartition(topic, 0, 7777)])  # in a later segment
        first = None
        deadline = time.monotonic() + 30
        while first is None and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                first = msg
        assert first is not None and (first.offset(), first.key()) == (7777, b"k7777")
    finally:
        consumer.close()


def test_large_record_round_trips(broker: Broker) -> None:
    topic = "large"
    create_topic(broker, topic)
    value = random.Random(7).randbytes(600_000)
    outcome = produce(Producer(producer_config(broker)), topic, [(0, b"big", value, [])])
    assert outcome.errors == [] and outcome.unflushed == 0
    got = consume_assigned(broker, topic, [0], 1, timeout=30)
    assert [(r.offset, r.key, r.value) for r in got] == [(0, b"big", value)]


@BOTH_STORAGES
def test_offsets_for_times_returns_first_offset_at_or_after_timestamp(broker: Broker) -> None:
    topic = "times"
    create_topic(broker, topic)
    count = 500
    base_ms = int(time.time() * 1000) - 3_600_000
    timestamps = [base_ms + 10 * i for i in range(count)]
    records: list[Record] = [(0, None, f"t{i}".encode(), []) for i in range(count)]
    outcome = produce(Producer(producer_config(broker)), topic, records, timestamps=timestamps)
    assert outcome.errors == [] and outcome.unflushed == 0

    got = consume_assigned(broker, topic, [0], count, timeout=30)
    assert [r.timestamp for r in got] == timestamps

    queries = {
        base_ms - 60_000: 0,  # before everything: the first record
        base_ms: 0,
        base_ms + 1: 1,
        base_ms + 10 * 250: 250,
        base_ms + 10 * 250 + 5: 251,
        base_ms + 10 * (count - 1): count - 1,
        base_ms + 10 * count: -1,  # after everything: no offset (Kafka answers -1)
    }
    consumer = Consumer(consumer_config(broker))
    try:
        for ts, expected in queries.items():
            [tp] = consumer.offsets_for_times([TopicPartition(topic, 0, ts)], timeout=10)
            assert tp.error is None, f"ts={ts}: {tp.error}"
            assert tp.offset == expected, f"ts={ts} (base+{ts - base_ms})"
    finally:
        consumer.close()
    assert watermarks(broker, topic, 0) == (0, count)


def test_watermarks_of_empty_partition_are_zero(broker: Broker) -> None:
    create_topic(broker, "empty", partitions=2)
    assert watermarks(broker, "empty", 0) == (0, 0)
    assert watermarks(broker, "empty", 1) == (0, 0)


def test_produce_to_unknown_topic_auto_creates_it_with_num_partitions(
    broker_factory: Callable[..., Broker],
) -> None:
    broker = broker_factory({"num.partitions": "3"})
    topic = "auto-created"
    # No explicit partition: the client waits for metadata (which creates the topic)
    # and then spreads keyed records over its partitions.
    records: list[Record] = [(None, f"k{i}".encode(), f"v{i}".encode(), []) for i in range(300)]
    outcome = produce(Producer(producer_config(broker)), topic, records)
    assert outcome.errors == [], outcome.errors[:5]
    assert outcome.unflushed == 0

    wait_for_partitions(broker, topic, 3)
    assert {s.partition for s in outcome.acked} == {0, 1, 2}
    got = consume_assigned(broker, topic, range(3), len(records), timeout=60)
    assert sorted(r.value for r in got) == sorted(v for (_, _, v, _) in records)
    by_key = {s.key: s.partition for s in outcome.acked}
    assert all(by_key[r.key] == r.partition for r in got)


def test_produce_to_unknown_topic_fails_when_auto_create_disabled(
    broker_factory: Callable[..., Broker],
) -> None:
    broker = broker_factory({"auto.create.topics.enable": "false"})
    topic = "never-created"
    producer = Producer(
        producer_config(broker, **{"message.timeout.ms": 5_000, "enable.idempotence": False})
    )
    outcome = produce(producer, topic, [(None, b"k", b"v", [])], flush_timeout=30)
    assert outcome.acked == []
    assert outcome.unflushed == 0
    assert len(outcome.errors) == 1
    assert outcome.errors[0].code() in (
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_TOPIC,
        KafkaError._MSG_TIMED_OUT,
    ), outcome.errors[0]

    md = AdminClient(admin_config(broker)).list_topics(timeout=10)
    assert topic not in md.topics or md.topics[topic].error is not None
