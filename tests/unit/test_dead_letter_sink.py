"""The dead-letter copies (broker.share.dead_letter_sink, KIP-1191): what is written, where,
and what is refused or retried.

Real partition logs (file engine) under tmp_path for the source topic `orders` (3
partitions) and the dead-letter topic `dlq.orders` (2 partitions, opted in); a fake
cluster view and a fake transport for a DLQ partition another broker leads. No sockets.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.cluster import BrokerEndpoint, BrokerInfo, Leader
from broker.config import BrokerConfig
from broker.metrics import ShareMetrics
from broker.partitions import LogManager, validate_produce_data
from broker.share.dead_letter_sink import (
    DeadLetterTopicSink,
    destination_partition,
    split_batches,
)
from broker.share.dead_letters import (
    HEADER_DELIVERY_COUNT,
    HEADER_GROUP,
    HEADER_MESSAGE,
    HEADER_OFFSET,
    HEADER_PARTITION,
    HEADER_TOPIC,
    DeadLetter,
    DeadLetterReason,
    DeadLetterRefused,
    DeadLetterRetriable,
)
from broker.share.remote_persister import Target, TransportError
from coordinator.group_config import GroupConfig
from coordinator.metadata import Topic
from persister.clock import ManualClock
from persister.commit import GroupCommit
from protocol import api
from protocol.errors import CorruptRecordError, ErrorCode, KafkaError
from protocol.records import (
    HEADER_SIZE,
    NewRecord,
    Record,
    build_batch,
    build_batch_of_tails,
    decode_records,
    encode_record_tail,
    iter_batches,
    record_starts,
    set_log_append_time,
)
from tests.unit.cluster_fakes import FakeCluster

ME, OTHER = 1, 2
GROUP = "billing"
SOURCE, DLQ = "orders", "dlq.orders"
NOW_MS = 1_700_000_000_000
OPT_IN = {"errors.deadletterqueue.group.enable": "true"}
BROKERS = [
    BrokerInfo(ME, (BrokerEndpoint("INTERNAL", "one", 9093),)),
    BrokerInfo(OTHER, (BrokerEndpoint("INTERNAL", "two", 9193),)),
]


class FakeTransport:
    """Answers each Produce with `codes` in turn (none once they run out), or raises."""

    def __init__(self) -> None:
        self.sent: list[tuple[Target, int, int, Mapping[str, Any]]] = []
        self.codes: list[ErrorCode] = []
        self.fail: TransportError | None = None

    async def send(
        self, target: Target, api_key: int, version: int, body: Mapping[str, Any]
    ) -> Any:
        self.sent.append((target, api_key, version, body))
        # As BrokerConnections sends it: built as the version's request entity, encoded.
        request = api.build(api.request_class(api_key, version), body)
        assert api.encode_request(api_key, version, 1, "spool-broker-1", request)
        assert request.topic_data[0].topic_id == body["topic_data"][0]["topic_id"]
        if self.fail is not None:
            raise self.fail
        code = self.codes.pop(0) if self.codes else ErrorCode.none
        (topic,) = body["topic_data"]
        (part,) = topic["partition_data"]
        return api.build_response(
            api_key,
            version,
            {
                "responses": [
                    {
                        "topic_id": topic["topic_id"],
                        "partition_responses": [
                            {
                                "index": part["index"],
                                "error_code": code,
                                "error_message": None if code == ErrorCode.none else "no",
                            }
                        ],
                    }
                ]
            },
        )

    async def close(self) -> None:
        pass


class World:
    """The logs, metadata, config and sink of one test."""

    def __init__(self, logs: LogManager) -> None:
        self.logs = logs
        self.topics: dict[str, Topic] = {}
        self.config = GroupConfig(dead_letter_topic=DLQ)
        self.prefix = "dlq."
        self.auto_create = False
        self.created: list[tuple[str, dict[str, str]]] = []
        self.metrics = ShareMetrics()
        self.transport = FakeTransport()
        self.cluster = FakeCluster(ME, BROKERS)
        self.clock = ManualClock(NOW_MS)
        self.source = self.add_topic(SOURCE, 3)
        self.dlq = self.add_topic(DLQ, 2, OPT_IN)
        self.sink = DeadLetterTopicSink(
            group_config=lambda _g: self.config,
            topics=lambda: SimpleNamespace(
                topics=self.topics, topics_by_id={t.topic_id: t for t in self.topics.values()}
            ),
            log_partition=self.log_partition,
            cluster=lambda: self.cluster,
            transport=self.transport,
            listener="INTERNAL",
            metrics=self.metrics,
            clock=self.clock,
            prefix=lambda: self.prefix,
            auto_create=lambda: self.auto_create,
            create_topic=self.create_topic,
        )

    def add_topic(self, name: str, partitions: int, configs: dict[str, str] | None = None) -> Topic:
        topic = Topic(name, uuid.uuid4(), partitions, dict(configs or {}))
        self.logs.open_topic(name, topic.topic_id, partitions, topic.configs)
        self.topics[name] = topic
        return topic

    async def create_topic(self, name: str, configs: dict[str, str]) -> Topic:
        self.created.append((name, configs))
        return self.add_topic(name, 1, configs)

    def log_partition(self, topic_id: uuid.UUID, partition: int) -> Any:
        topic = next((t for t in self.topics.values() if t.topic_id == topic_id), None)
        return None if topic is None else self.logs.get(topic.name, partition)

    async def produce(self, topic: str, partition: int, batch: bytes) -> int:
        part = self.logs.get(topic, partition)
        assert part is not None
        data, headers = validate_produce_data(batch)
        outcome = part.append(data, headers)
        await part.wait_durable(outcome.last_offset, 5)
        return outcome.base_offset

    def read(self, topic: str, partition: int) -> list[Record]:
        part = self.logs.get(topic, partition)
        assert part is not None
        data = part.read(0, 1 << 24)
        return [
            r
            for pos, h in iter_batches(data, validate=True)
            if not h.is_control
            for r in decode_records(data, pos, h)
        ]

    def letter(
        self,
        first: int,
        last: int,
        partition: int = 1,
        reason: DeadLetterReason = DeadLetterReason.REJECTED,
        delivery_count: int = 2,
    ) -> DeadLetter:
        return DeadLetter(
            GROUP, self.source.topic_id, partition, first, last, delivery_count, reason
        )


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    commit = GroupCommit()
    commit.start()
    logs = LogManager(tmp_path, BrokerConfig({}), commit)
    try:
        yield World(logs)
    finally:
        await logs.flush_all()
        logs.close()
        await commit.stop()


def source_records(n: int, start_ts: int = 1_000) -> bytes:
    return build_batch(
        [
            NewRecord(
                f"k{i}".encode(),
                f"v{i}".encode(),
                (("trace", f"t{i}".encode()), ("empty", None)),
                timestamp=start_ts + i,
            )
            for i in range(n)
        ]
    )


def dlq_headers(record: Record) -> dict[str, bytes | None]:
    return {k: v for k, v in record.headers if k.startswith("__dlq.")}


# -- what is written -------------------------------------------------------------------


async def test_headers_only_copies_by_default(world: World) -> None:
    await world.produce(SOURCE, 1, source_records(5))
    written = await world.sink.write(world.letter(1, 3, delivery_count=5))
    assert written == 3
    # Source partition 1 of 3 goes to DLQ partition 1 % 2 = 1.
    assert world.read(DLQ, 0) == []
    copies = world.read(DLQ, 1)
    assert [r.offset for r in copies] == [0, 1, 2]
    for source_offset, copy in zip((1, 2, 3), copies, strict=True):
        assert copy.key is None and copy.value is None
        assert copy.timestamp == NOW_MS  # the write's wall clock, not the record's
        assert copy.headers == (
            (HEADER_TOPIC, b"orders"),
            (HEADER_PARTITION, b"1"),
            (HEADER_OFFSET, str(source_offset).encode()),
            (HEADER_GROUP, b"billing"),
            (HEADER_DELIVERY_COUNT, b"5"),
            (HEADER_MESSAGE, b"Offset rejected by client."),
        )
    assert world.metrics.dead_letter_writes == {GROUP: [1, 0]}


async def test_copy_record_keeps_key_value_headers_and_timestamp(world: World) -> None:
    world.config = GroupConfig(dead_letter_topic=DLQ, dead_letter_copy_record=True)
    await world.produce(SOURCE, 1, source_records(3))
    written = await world.sink.write(world.letter(0, 2, reason=DeadLetterReason.DELIVERY_LIMIT))
    assert written == 3
    copies = world.read(DLQ, 1)
    for i, copy in enumerate(copies):
        assert (copy.key, copy.value, copy.timestamp) == (
            f"k{i}".encode(),
            f"v{i}".encode(),
            1_000 + i,
        )
        assert copy.headers[:6] == (
            (HEADER_TOPIC, b"orders"),
            (HEADER_PARTITION, b"1"),
            (HEADER_OFFSET, str(i).encode()),
            (HEADER_GROUP, b"billing"),
            (HEADER_DELIVERY_COUNT, b"2"),
            (HEADER_MESSAGE, b"Offset delivery count exceeded the threshold."),
        )
        # The original headers follow the __dlq ones, a null value kept null.
        assert copy.headers[6:] == (("trace", f"t{i}".encode()), ("empty", None))
    # Written as a plain producer would: no producer id, not transactional, uncompressed.
    part = world.logs.get(DLQ, 1)
    assert part is not None
    data = part.read(0, 1 << 20)
    for _, header in iter_batches(data, validate=True):
        assert header.producer_id == -1
        assert not header.is_transactional and header.compression == 0


async def test_runs_written_at_once_share_one_append_and_one_batch(world: World) -> None:
    world.config = GroupConfig(dead_letter_topic=DLQ, dead_letter_copy_record=True)
    await world.produce(SOURCE, 1, source_records(40))
    runs = [world.letter(o, o) for o in range(0, 40, 10)] + [world.letter(21, 23)]
    written = await asyncio.gather(*(world.sink.write(run) for run in runs))
    assert written == [1, 1, 1, 1, 3]
    part = world.logs.get(DLQ, 1)
    assert part is not None
    # One batch for the five runs (one append, one durable wait), in the order written.
    assert len(list(iter_batches(part.read(0, 1 << 20), validate=True))) == 1
    offsets = [dlq_headers(r)[HEADER_OFFSET] for r in world.read(DLQ, 1)]
    assert offsets == [b"0", b"10", b"20", b"30", b"21", b"22", b"23"]
    assert world.metrics.dead_letter_writes == {GROUP: [5, 0]}
    # The next turn's runs make an append of their own.
    assert await world.sink.write(world.letter(5, 5)) == 1
    assert len(list(iter_batches(part.read(0, 1 << 20), validate=True))) == 2


def break_dlq_appends(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Appends to DLQ partition 1 fail with ENOSPC."""
    part = world.logs.get(DLQ, 1)
    assert part is not None

    def broken(*_args: Any) -> Any:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(part, "append", broken)


async def test_a_failed_shared_append_fails_every_run_in_it_as_retriable(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    await world.produce(SOURCE, 1, source_records(5))
    break_dlq_appends(world, monkeypatch)
    outcomes = await asyncio.gather(
        *(world.sink.write(world.letter(o, o)) for o in (1, 3)), return_exceptions=True
    )
    assert all(isinstance(o, DeadLetterRetriable) for o in outcomes), outcomes
    assert "No space left on device" in str(outcomes[0])
    monkeypatch.undo()
    assert await world.sink.write(world.letter(1, 1)) == 1


async def test_write_all_resolves_once_appends_once_and_answers_per_letter(
    world: World,
) -> None:
    world.config = GroupConfig(dead_letter_topic=DLQ, dead_letter_copy_record=True)
    await world.produce(SOURCE, 1, source_records(30))
    resolved: list[str] = []
    config = world.config
    world.sink.group_config = lambda g: resolved.append(g) or config  # type: ignore[func-returns-value]
    runs = [world.letter(o, o) for o in range(0, 30, 10)] + [world.letter(40, 45)]
    outcomes = await world.sink.write_all(runs)
    assert outcomes == [1, 1, 1, 0]  # one per letter, in order; 40-45 hold no record
    assert resolved == [GROUP]  # the group's config resolved once for the take
    part = world.logs.get(DLQ, 1)
    assert part is not None
    assert len(list(iter_batches(part.read(0, 1 << 20), validate=True))) == 1
    offsets = [dlq_headers(r)[HEADER_OFFSET] for r in world.read(DLQ, 1)]
    assert offsets == [b"0", b"10", b"20"]
    assert world.metrics.dead_letter_writes == {GROUP: [3, 0]}


async def test_write_all_refuses_only_the_letter_with_a_copy_too_large(world: World) -> None:
    world.config = GroupConfig(dead_letter_topic=DLQ, dead_letter_copy_record=True)
    world.dlq.configs["max.message.bytes"] = "300"
    part = world.logs.get(DLQ, 1)
    assert part is not None
    part.settings["max.message.bytes"] = 300
    await world.produce(SOURCE, 1, source_records(2))
    await world.produce(SOURCE, 1, build_batch([NewRecord(b"k", b"x" * 400, ())]))
    outcomes = await world.sink.write_all([world.letter(0, 0), world.letter(2, 2)])
    assert outcomes[0] == 1
    assert isinstance(outcomes[1], DeadLetterRefused)
    assert "max.message.bytes (300)" in str(outcomes[1])
    assert [dlq_headers(r)[HEADER_OFFSET] for r in world.read(DLQ, 1)] == [b"0"]
    assert world.metrics.dead_letter_writes == {GROUP: [2, 1]}


async def test_write_all_fails_a_failed_append_for_the_letters_in_it_only(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    await world.produce(SOURCE, 1, source_records(5))
    break_dlq_appends(world, monkeypatch)
    outcomes = await world.sink.write_all([world.letter(1, 1), world.letter(9, 9)])
    assert isinstance(outcomes[0], DeadLetterRetriable)
    assert outcomes[1] == 0  # nothing to copy: not part of the append


async def test_control_batches_and_missing_offsets_get_no_copy(world: World) -> None:
    await world.produce(SOURCE, 0, source_records(2))  # offsets 0, 1
    part = world.logs.get(SOURCE, 0)
    assert part is not None
    marker = part.append_marker(7, 0, commit=False, coordinator_epoch=0)  # offset 2
    await part.wait_durable(marker.last_offset, 5)
    await world.produce(SOURCE, 0, source_records(1))  # offset 3
    written = await world.sink.write(world.letter(1, 6, partition=0))
    assert written == 2
    assert [dlq_headers(r)[HEADER_OFFSET] for r in world.read(DLQ, 0)] == [b"1", b"3"]


async def test_offsets_below_the_log_start_get_no_copy(world: World) -> None:
    await world.produce(SOURCE, 2, source_records(4))
    part = world.logs.get(SOURCE, 2)
    assert part is not None
    await part.delete_records_before(3)
    assert await world.sink.write(world.letter(0, 3, partition=2)) == 1
    assert [dlq_headers(r)[HEADER_OFFSET] for r in world.read(DLQ, 0)] == [b"3"]


@pytest.mark.parametrize("copy_record", [True, False])
async def test_runs_in_the_batch_read_last_are_copied_without_reading_it_again(
    world: World, monkeypatch: pytest.MonkeyPatch, copy_record: bool
) -> None:
    world.config = GroupConfig(dead_letter_topic=DLQ, dead_letter_copy_record=copy_record)
    await world.produce(SOURCE, 1, source_records(50))
    part = world.logs.get(SOURCE, 1)
    assert part is not None
    reads: list[int] = []
    real_read = part.read

    def counting_read(offset: int, max_bytes: int) -> Any:
        reads.append(offset)
        return real_read(offset, max_bytes)

    monkeypatch.setattr(part, "read", counting_read)
    first = await world.sink.write_all([world.letter(o, o) for o in (0, 10, 20)])
    second = await world.sink.write_all([world.letter(30, 31), world.letter(45, 45)])
    assert (first, second) == ([1, 1, 1], [2, 1])
    assert reads == [0]  # one read of the batch; every later run spliced from it
    copies = world.read(DLQ, 1)
    offsets = [0, 10, 20, 30, 31, 45]
    assert [dlq_headers(c)[HEADER_OFFSET] for c in copies] == [str(o).encode() for o in offsets]
    if copy_record:
        assert [(c.key, c.value, c.timestamp) for c in copies] == [
            (f"k{o}".encode(), f"v{o}".encode(), 1_000 + o) for o in offsets
        ]
    else:
        assert all((c.key, c.value, c.timestamp) == (None, None, NOW_MS) for c in copies)


async def test_a_run_the_log_start_passed_is_not_copied_from_the_batch_read_before(
    world: World,
) -> None:
    await world.produce(SOURCE, 2, source_records(10))
    assert await world.sink.write(world.letter(1, 1, partition=2)) == 1
    part = world.logs.get(SOURCE, 2)
    assert part is not None
    await part.delete_records_before(6)
    # The batch read for offset 1 holds 4-7 still; the log no longer holds 4 and 5.
    assert await world.sink.write(world.letter(4, 7, partition=2)) == 2
    assert [dlq_headers(r)[HEADER_OFFSET] for r in world.read(DLQ, 0)] == [b"1", b"6", b"7"]


async def test_nothing_left_to_copy_writes_nothing(world: World) -> None:
    await world.produce(SOURCE, 2, source_records(2))
    part = world.logs.get(SOURCE, 2)
    assert part is not None
    await part.delete_records_before(2)
    assert await world.sink.write(world.letter(0, 1, partition=2)) == 0
    assert world.read(DLQ, 0) == []
    assert world.metrics.dead_letter_writes == {}


@pytest.mark.parametrize(("source", "partitions", "expected"), [(0, 2, 0), (5, 2, 1), (7, 3, 1)])
def test_destination_partition_is_the_source_partition_modulo(
    source: int, partitions: int, expected: int
) -> None:
    assert destination_partition(source, partitions) == expected


# -- sizes -----------------------------------------------------------------------------


def as_copies(records: list[NewRecord]) -> list[tuple[int, bytes]]:
    """`records` as the sink's copies: (timestamp, the fields after the offset delta)."""
    return [(r.timestamp or 0, encode_record_tail(r.key, r.value, r.headers)) for r in records]


def test_split_batches_fits_each_batch_and_keeps_the_order() -> None:
    records = [NewRecord(None, bytes(100), (("h", b"x"),), timestamp=NOW_MS) for _ in range(20)]
    batches = split_batches(as_copies(records), 600)
    assert len(batches) > 1
    seen = 0
    for batch in batches:
        assert len(batch) <= 600
        ((pos, header),) = list(iter_batches(batch, validate=True))
        assert header.size == len(batch)
        seen += len(decode_records(batch, pos, header))
    assert seen == 20
    # The greedy split is tight: one more record would not have fit.
    ((pos, header),) = list(iter_batches(batches[0], validate=True))
    n = header.records_count
    assert batches[0] == build_batch(records[:n])
    assert len(build_batch(records[: n + 1])) > 600


def test_split_batches_counts_timestamp_deltas() -> None:
    records = [NewRecord(None, b"v", timestamp=t) for t in (0, 1 << 40, 5, -(1 << 30))]
    (batch,) = split_batches(as_copies(records), 1 << 20)
    assert batch == build_batch(records)


async def test_copies_split_to_fit_the_dlq_topics_max_message_bytes(world: World) -> None:
    world.topics.pop(DLQ)
    world.dlq = world.add_topic("dlq.small", 1, {**OPT_IN, "max.message.bytes": "700"})
    world.config = GroupConfig(dead_letter_topic="dlq.small", dead_letter_copy_record=True)
    await world.produce(
        SOURCE, 0, build_batch([NewRecord(None, bytes(200), timestamp=1) for _ in range(10)])
    )
    assert await world.sink.write(world.letter(0, 9, partition=0)) == 10
    part = world.logs.get("dlq.small", 0)
    assert part is not None
    sizes = [h.size for _, h in iter_batches(part.read(0, 1 << 20), validate=True)]
    assert len(sizes) >= 4 and max(sizes) <= 700
    assert [dlq_headers(r)[HEADER_OFFSET] for r in world.read("dlq.small", 0)] == [
        str(i).encode() for i in range(10)
    ]


async def test_a_copy_too_large_alone_is_refused_before_anything_is_written(
    world: World,
) -> None:
    world.topics.pop(DLQ)
    world.add_topic("dlq.small", 1, {**OPT_IN, "max.message.bytes": "700"})
    world.config = GroupConfig(dead_letter_topic="dlq.small", dead_letter_copy_record=True)
    await world.produce(SOURCE, 0, build_batch([NewRecord(None, bytes(100), timestamp=1)]))
    await world.produce(SOURCE, 0, build_batch([NewRecord(None, bytes(5000), timestamp=1)]))
    with pytest.raises(DeadLetterRefused, match=r"max\.message\.bytes"):
        await world.sink.write(world.letter(0, 1, partition=0))
    assert world.read("dlq.small", 0) == []
    assert world.metrics.dead_letter_writes == {GROUP: [1, 1]}
    # Headers only, the same record fits.
    world.config = GroupConfig(dead_letter_topic="dlq.small")
    assert await world.sink.write(world.letter(0, 1, partition=0)) == 2


# -- refusals --------------------------------------------------------------------------


async def refused(world: World, match: str) -> None:
    await world.produce(SOURCE, 1, source_records(1))
    with pytest.raises(DeadLetterRefused, match=match):
        await world.sink.write(world.letter(0, 0))
    assert world.read(DLQ, 1) == []
    assert world.metrics.dead_letter_writes == {GROUP: [1, 1]}


async def test_refused_without_a_dlq_topic(world: World) -> None:
    world.config = GroupConfig()
    await refused(world, "errors.deadletterqueue.topic.name")


async def test_refused_for_an_internal_name(world: World) -> None:
    world.prefix = ""
    world.config = GroupConfig(dead_letter_topic="__consumer_offsets")
    await refused(world, "must not start with '__'")


async def test_refused_without_the_prefix(world: World) -> None:
    world.prefix = "dead."
    await refused(world, r"must start with 'dead\.'.*errors.deadletterqueue.topic.name.prefix")


async def test_refused_for_a_missing_topic_without_auto_create(world: World) -> None:
    world.config = GroupConfig(dead_letter_topic="dlq.missing")
    await refused(world, "does not exist; create it with errors.deadletterqueue.group.enable=true")
    assert world.created == []


async def test_refused_for_a_topic_without_the_opt_in(world: World) -> None:
    world.add_topic("dlq.plain", 1, {"errors.deadletterqueue.group.enable": "false"})
    world.config = GroupConfig(dead_letter_topic="dlq.plain")
    await refused(world, "does not have errors.deadletterqueue.group.enable=true")


async def test_refused_for_the_source_topic_itself(world: World) -> None:
    world.prefix = ""
    world.source.configs.update(OPT_IN)
    world.config = GroupConfig(dead_letter_topic=SOURCE)
    await refused(world, "cannot write its dead letters to its own source topic")


async def test_auto_create_makes_the_topic_with_the_opt_in(world: World) -> None:
    world.auto_create = True
    world.config = GroupConfig(dead_letter_topic="dlq.new")
    await world.produce(SOURCE, 1, source_records(2))
    assert await world.sink.write(world.letter(0, 1)) == 2
    assert world.created == [
        (
            "dlq.new",
            {"errors.deadletterqueue.group.enable": "true", "message.timestamp.type": "CreateTime"},
        )
    ]
    assert len(world.read("dlq.new", 0)) == 2  # 1 partition: 1 % 1 = 0


# -- where it goes, and errors ----------------------------------------------------------


async def test_a_dlq_partition_led_elsewhere_gets_a_produce_with_acks_all(world: World) -> None:
    world.cluster.leaders[(world.dlq.topic_id, 1)] = Leader(OTHER, 4)
    await world.produce(SOURCE, 1, source_records(2))
    assert await world.sink.write(world.letter(0, 1)) == 2
    ((target, api_key, version, body),) = world.transport.sent
    assert target == Target(OTHER, "two", 9193)
    assert (api_key, version, body["acks"]) == (0, 13, -1)
    (topic,) = body["topic_data"]
    assert (topic["name"], topic["topic_id"]) == (DLQ, world.dlq.topic_id)
    ((part),) = topic["partition_data"]
    assert part["index"] == 1
    ((pos, header),) = list(iter_batches(part["records"], validate=True))
    assert [
        dlq_headers(r)[HEADER_OFFSET] for r in decode_records(part["records"], pos, header)
    ] == [
        b"0",
        b"1",
    ]
    assert world.read(DLQ, 1) == []  # nothing written here
    assert world.metrics.dead_letter_writes == {GROUP: [1, 0]}


@pytest.mark.parametrize(
    "code",
    [
        ErrorCode.not_leader_or_follower,
        ErrorCode.kafka_storage_error,
        ErrorCode.request_timed_out,
        ErrorCode.leader_not_available,
    ],
)
async def test_retriable_produce_errors(world: World, code: ErrorCode) -> None:
    world.cluster.leaders[(world.dlq.topic_id, 1)] = Leader(OTHER, 4)
    world.transport.codes = [code]
    await world.produce(SOURCE, 1, source_records(1))
    with pytest.raises(DeadLetterRetriable, match=code.name.upper()):
        await world.sink.write(world.letter(0, 0))
    assert world.metrics.dead_letter_writes == {GROUP: [1, 1]}
    assert await world.sink.write(world.letter(0, 0)) == 1  # the retry goes through
    assert world.metrics.dead_letter_writes == {GROUP: [2, 1]}


@pytest.mark.parametrize(
    "code",
    [
        ErrorCode.message_too_large,
        ErrorCode.record_list_too_large,
        ErrorCode.unknown_topic_or_partition,
        ErrorCode.unknown_topic_id,
        ErrorCode.topic_authorization_failed,
    ],
)
async def test_refused_produce_errors(world: World, code: ErrorCode) -> None:
    world.cluster.leaders[(world.dlq.topic_id, 1)] = Leader(OTHER, 4)
    world.transport.codes = [code]
    await world.produce(SOURCE, 1, source_records(1))
    with pytest.raises(DeadLetterRefused, match=code.name.upper()) as refused:
        await world.sink.write(world.letter(0, 0))
    if code == ErrorCode.topic_authorization_failed:
        assert "grant it WRITE on the topic" in str(refused.value)


@pytest.mark.parametrize("code", [ErrorCode.network_exception, ErrorCode.request_timed_out])
async def test_a_connection_lost_or_timed_out_is_retriable(world: World, code: ErrorCode) -> None:
    world.cluster.leaders[(world.dlq.topic_id, 1)] = Leader(OTHER, 4)
    world.transport.fail = TransportError(code, "gone")
    await world.produce(SOURCE, 1, source_records(1))
    with pytest.raises(DeadLetterRetriable, match="gone"):
        await world.sink.write(world.letter(0, 0))


async def test_no_leader_for_the_dlq_partition_is_retriable(world: World) -> None:
    world.cluster.leaders[(world.dlq.topic_id, 1)] = None
    await world.produce(SOURCE, 1, source_records(1))
    with pytest.raises(DeadLetterRetriable, match="no leader"):
        await world.sink.write(world.letter(0, 0))


async def test_a_source_partition_no_longer_led_here_is_retriable(world: World) -> None:
    await world.produce(SOURCE, 1, source_records(1))
    world.logs.drop_partition(SOURCE, 1, "moved")
    with pytest.raises(DeadLetterRetriable, match="not led by this broker"):
        await world.sink.write(world.letter(0, 0))


async def test_a_failed_local_append_is_retriable(world: World) -> None:
    await world.produce(SOURCE, 1, source_records(1))
    part = world.logs.get(DLQ, 1)
    assert part is not None
    part.dropped = "handed over"  # appends answer NOT_LEADER_OR_FOLLOWER from now
    with pytest.raises(DeadLetterRetriable, match="NOT_LEADER_OR_FOLLOWER"):
        await world.sink.write(world.letter(0, 0))


@pytest.mark.parametrize(
    "error",
    [
        KafkaError(ErrorCode.not_controller, "the metadata changed under this request"),
        KafkaError(ErrorCode.kafka_storage_error, "database down"),
        ConnectionRefusedError("database down"),
    ],
)
async def test_auto_create_failing_for_now_is_retriable(world: World, error: Exception) -> None:
    async def failing(name: str, configs: dict[str, str]) -> Topic:
        raise error

    world.auto_create = True
    world.sink.create_topic = failing
    world.config = GroupConfig(dead_letter_topic="dlq.new")
    await world.produce(SOURCE, 1, source_records(1))
    with pytest.raises(DeadLetterRetriable, match=r"dlq\.new"):
        await world.sink.write(world.letter(0, 0))


async def test_an_unknown_server_error_is_a_refusal(world: World) -> None:
    world.cluster.leaders[(world.dlq.topic_id, 1)] = Leader(OTHER, 4)
    world.transport.codes = [ErrorCode.unknown_server_error]
    await world.produce(SOURCE, 1, source_records(1))
    with pytest.raises(DeadLetterRefused, match="UNKNOWN_SERVER_ERROR"):
        await world.sink.write(world.letter(0, 0))


# --- reading the source: only what a run needs -------------------------------------------


class BlobLog:
    """A SourceLog over batches laid end to end; counts reads and decoded batches."""

    def __init__(self, *batches: bytes) -> None:
        self.data = b"".join(batches)
        self.reads = 0
        self.log_start_offset = 0
        self.high_watermark = max(h.next_offset for _, h in iter_batches(self.data))

    def read(self, offset: int, max_bytes: int) -> bytes:
        self.reads += 1
        for pos, header in iter_batches(self.data):
            if header.next_offset > offset:
                return self.data[pos:]
        return b""


def gapped_batch(base_offset: int, offsets: list[int]) -> bytes:
    """A compacted batch: records only at `offsets` (absolute)."""
    return build_batch(
        [Record(o, 5, b"k", f"v{o}".encode()) for o in offsets],
        base_offset=base_offset,
    )


LETTER = DeadLetter(GROUP, uuid.UUID(int=7), 1, 0, 0, 3, DeadLetterReason.REJECTED)


def copies_of(
    log: BlobLog, first: int, last: int, *, copy_record: bool = True, kept: list[Any] | None = None
) -> list[Record]:
    """read_source_copies of [first, last], as the records a consumer of the DLQ reads."""
    from broker.share.dead_letter_sink import CopyHeaders, read_source_copies

    copies = read_source_copies(
        log,
        first,
        last,
        CopyHeaders(LETTER, SOURCE),
        copy_record=copy_record,
        now_ms=NOW_MS,
        last_batch=kept,
    )
    if not copies:
        return []
    batch = build_batch_of_tails(copies)
    ((pos, header),) = list(iter_batches(batch, validate=True))
    return decode_records(batch, pos, header)


def source_offset(copy: Record) -> int:
    value = dlq_headers(copy)[HEADER_OFFSET]
    assert value is not None
    return int(value)


def test_runs_in_one_batch_index_it_once_and_decode_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import broker.share.dead_letter_sink as sink_module

    log = BlobLog(
        build_batch([NewRecord(None, f"a{i}".encode()) for i in range(100)]),
        build_batch([NewRecord(None, f"b{i}".encode()) for i in range(100)], base_offset=100),
    )
    indexed: list[int] = []
    real_starts = sink_module.record_starts

    def counting_starts(data: Any, count: int, *where: int) -> Any:
        indexed.append(count)
        return real_starts(data, count, *where)

    monkeypatch.setattr(sink_module, "record_starts", counting_starts)
    # Copies are spliced from the batch's bytes: no record is decoded.
    monkeypatch.setattr(sink_module, "decode_records", None)
    kept: list[Any] = []
    got = [[c.value for c in copies_of(log, o, o, kept=kept)] for o in (3, 17, 42, 99, 100, 150)]
    assert got == [[b"a3"], [b"a17"], [b"a42"], [b"a99"], [b"b0"], [b"b50"]]
    # Each batch read and indexed once; the second alone for the runs past the first.
    assert indexed == [100, 100]
    assert log.reads == 2
    assert [source_offset(c) for c in copies_of(log, 98, 102, kept=kept)] == [98, 99, 100, 101, 102]


def test_a_compressed_or_gapped_batch_is_decoded_whole_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import broker.share.dead_letter_sink as sink_module

    log = BlobLog(
        build_batch([NewRecord(None, f"z{i}".encode()) for i in range(10)], compression=1),
        gapped_batch(10, [10, 12, 15]),
    )
    decoded: list[int] = []
    real = sink_module.decode_records

    def counting(data: Any, pos: int, header: Any) -> Any:
        decoded.append(header.base_offset)
        return real(data, pos, header)

    monkeypatch.setattr(sink_module, "decode_records", counting)
    kept: list[Any] = []
    got = [
        [(source_offset(c), c.value) for c in copies_of(log, a, b, kept=kept)]
        for a, b in ((2, 3), (7, 7), (11, 12), (13, 15))
    ]
    assert got == [[(2, b"z2"), (3, b"z3")], [(7, b"z7")], [(12, b"v12")], [(15, b"v15")]]
    assert decoded == [0, 10]


def test_a_run_stops_at_its_last_offset() -> None:
    log = BlobLog(
        build_batch([NewRecord(None, b"x")] * 10),
        build_batch([NewRecord(None, b"y")] * 10, base_offset=10),
    )
    assert [source_offset(c) for c in copies_of(log, 8, 11)] == [8, 9, 10, 11]
    assert [source_offset(c) for c in copies_of(log, 2, 4)] == [2, 3, 4]


def test_headers_only_runs_read_offsets_without_decoding_unless_a_batch_has_gaps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import broker.share.dead_letter_sink as sink_module

    log = BlobLog(
        build_batch([NewRecord(None, b"x")] * 10),
        gapped_batch(10, [10, 12, 15]),  # 11, 13, 14 compacted away
    )
    decoded: list[int] = []
    real = sink_module.decode_records

    def counting(data: Any, pos: int, header: Any) -> Any:
        decoded.append(header.base_offset)
        return real(data, pos, header)

    monkeypatch.setattr(sink_module, "decode_records", counting)
    monkeypatch.setattr(sink_module, "record_starts", None)  # nor indexed
    got = copies_of(log, 7, 15, copy_record=False)
    assert [source_offset(c) for c in got] == [7, 8, 9, 10, 12, 15]
    assert all((c.key, c.value, c.timestamp) == (None, None, NOW_MS) for c in got)
    assert decoded == [10]  # the gapless batch was not decoded


_header_values = st.one_of(st.none(), st.binary(max_size=20))
_records = st.lists(
    st.tuples(
        st.one_of(st.none(), st.binary(max_size=30)),
        st.one_of(st.none(), st.binary(max_size=300)),
        st.lists(st.tuples(st.text(max_size=8), _header_values), max_size=3),
        st.integers(-(1 << 40), 1 << 40),
    ),
    min_size=1,
    max_size=20,
)


@settings(max_examples=200, deadline=None)
@given(
    batches=st.lists(
        st.tuples(_records, st.sampled_from([0, 1]), st.booleans(), st.booleans()),
        min_size=1,
        max_size=4,
    ),
    data=st.data(),
)
def test_copies_are_the_records_with_the_dlq_headers_first(
    batches: list[tuple[list[Any], int, bool, bool]], data: st.DataObject
) -> None:
    """Whatever the source batches (uncompressed or compressed, CreateTime or
    LogAppendTime, with offset gaps or not), a copy is its record with the six
    `__dlq.errors.*` headers before the record's own, as a decode of the source has it."""
    raw: list[bytes] = []
    base = 0
    for records, compression, append_time, gapped in batches:
        news = [
            NewRecord(k, v, tuple(h), timestamp=ts, offset_delta=2 * i if gapped else i)
            for i, (k, v, h, ts) in enumerate(records)
        ]
        batch = bytearray(build_batch(news, base_offset=base, compression=compression))
        header = next(h for _, h in iter_batches(batch))
        if append_time:
            set_log_append_time(batch, 0, header, 1_234_567)
        raw.append(bytes(batch))
        base = header.next_offset
    log = BlobLog(*raw)
    first = data.draw(st.integers(0, base - 1))
    last = data.draw(st.integers(first, base - 1))
    expected = [
        r
        for blob in raw
        for pos, h in iter_batches(blob, validate=True)
        for r in decode_records(blob, pos, h)
        if first <= r.offset <= last
    ]
    got = copies_of(log, first, last, kept=[])
    assert [source_offset(c) for c in got] == [r.offset for r in expected]
    for copy, record in zip(got, expected, strict=True):
        assert (copy.key, copy.value, copy.timestamp) == (
            record.key,
            record.value,
            record.timestamp,
        )
        assert copy.headers[6:] == record.headers
        assert dlq_headers(copy) == {
            HEADER_TOPIC: SOURCE.encode(),
            HEADER_PARTITION: b"1",
            HEADER_OFFSET: str(record.offset).encode(),
            HEADER_GROUP: GROUP.encode(),
            HEADER_DELIVERY_COUNT: b"3",
            HEADER_MESSAGE: b"Offset rejected by client.",
        }


def test_a_batch_whose_records_lie_about_their_lengths_is_corrupt() -> None:
    """A source batch whose record lengths run past it (its CRC is not checked on this
    read) is CorruptRecordError, which the sink turns into a refusal of the run."""
    batch = bytearray(build_batch([NewRecord(None, b"v" * 20) for _ in range(3)]))
    # The second record's length varint (one byte), grown past the batch's end.
    second = record_starts(bytes(batch), 3, HEADER_SIZE, len(batch))[1]
    batch[second] = 0x7E  # zigzag 63
    with pytest.raises(CorruptRecordError):
        copies_of(BlobLog(bytes(batch)), 1, 1, kept=[])


async def test_a_run_over_a_corrupt_source_batch_is_refused_alone(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    world.config = GroupConfig(dead_letter_topic=DLQ, dead_letter_copy_record=True)
    await world.produce(SOURCE, 1, source_records(3))
    await world.produce(SOURCE, 1, source_records(3))
    part = world.logs.get(SOURCE, 1)
    assert part is not None
    real_read = part.read

    def lying(offset: int, max_bytes: int, **kwargs: Any) -> bytes:
        data = bytearray(real_read(offset, max_bytes, **kwargs))
        if offset < 3:  # the first batch: its second record's length runs past it
            data[record_starts(bytes(data), 3, HEADER_SIZE, len(data))[1]] = 0x7E
        return bytes(data)

    monkeypatch.setattr(part, "read", lying)
    outcomes = await world.sink.write_all([world.letter(1, 1), world.letter(4, 4)])
    assert isinstance(outcomes[0], DeadLetterRefused) and "CORRUPT_MESSAGE" in str(outcomes[0])
    assert outcomes[1] == 1
    assert [dlq_headers(r)[HEADER_OFFSET] for r in world.read(DLQ, 1)] == [b"4"]
