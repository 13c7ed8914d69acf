"""The pure parts of `spool share-groups --replay-dead-letters` (broker.tools.replay):
which records a group replays and how, the headers a replayed record keeps, the
partition it goes to, Kafka's murmur2, the read_committed filter of fetched batches,
and the argument rules. No broker, no sockets."""

from __future__ import annotations

import argparse
import asyncio

import pytest

from broker.share.dead_letters import (
    HEADER_DELIVERY_COUNT,
    HEADER_GROUP,
    HEADER_MESSAGE,
    HEADER_OFFSET,
    HEADER_PARTITION,
    HEADER_TOPIC,
)
from broker.tools import replay
from broker.tools.common import UsageError
from broker.tools.replay import (
    OTHER_GROUP,
    REPLAY_COPY,
    REPLAY_ORIGINAL,
    SKIP,
    carries_copy,
    choose_partition,
    decide,
    murmur2,
    replayed_record,
    strip_dead_letter_headers,
)
from protocol.records import NewRecord, Record, build_batch, build_end_txn_marker_batch
from protocol.txn_client import committed_records


def context(
    group: str = "G", topic: str = "orders", partition: int = 3, offset: int = 42
) -> tuple[tuple[str, bytes | None], ...]:
    return (
        (HEADER_TOPIC, topic.encode()),
        (HEADER_PARTITION, str(partition).encode()),
        (HEADER_OFFSET, str(offset).encode()),
        (HEADER_GROUP, group.encode()),
        (HEADER_DELIVERY_COUNT, b"5"),
        (HEADER_MESSAGE, b"Offset rejected by client."),
    )


def dead(
    key: bytes | None = None,
    value: bytes | None = None,
    headers: tuple[tuple[str, bytes | None], ...] = (),
    offset: int = 7,
) -> Record:
    return Record(offset, 1_000, key, value, headers)


def test_a_copy_is_replayed_from_itself_to_its_source() -> None:
    record = dead(b"k", b"v", (*context(), ("trace", b"1")))
    d = decide(record, 0, "G", None)
    assert (d.action, d.target_topic, d.source_partition, d.source_offset) == (
        REPLAY_COPY,
        "orders",
        3,
        42,
    )
    assert (d.dlq_partition, d.dlq_offset) == (0, 7)


def test_a_headers_only_record_is_replayed_from_the_source_log() -> None:
    d = decide(dead(headers=context()), 1, "G", None)
    assert (d.action, d.source_topic, d.source_partition, d.source_offset) == (
        REPLAY_ORIGINAL,
        "orders",
        3,
        42,
    )


def test_to_topic_overrides_the_target_but_not_the_source() -> None:
    d = decide(dead(headers=context()), 0, "G", "orders.fixed")
    assert (d.target_topic, d.source_topic) == ("orders.fixed", "orders")


def test_other_groups_records_are_passed_over() -> None:
    d = decide(dead(b"k", b"v", context(group="H")), 0, "G", None)
    assert d.action == OTHER_GROUP and "'H'" in d.reason


@pytest.mark.parametrize(
    ("headers", "why"),
    [
        ((), HEADER_GROUP),  # not a dead-letter record at all
        (tuple(h for h in context() if h[0] != HEADER_OFFSET), HEADER_OFFSET),
        (((HEADER_GROUP, b"G"), (HEADER_PARTITION, b"x"), (HEADER_OFFSET, b"1")), HEADER_TOPIC),
    ],
)
def test_records_that_cannot_be_replayed_are_skipped_saying_why(
    headers: tuple[tuple[str, bytes | None], ...], why: str
) -> None:
    d = decide(dead(headers=headers), 0, "G", None)
    assert d.action == SKIP and why in d.reason


def test_a_copy_without_its_source_topic_needs_to_topic() -> None:
    record = dead(b"k", b"v", ((HEADER_GROUP, b"G"),))
    assert decide(record, 0, "G", None).action == SKIP
    assert decide(record, 0, "G", "t").target_topic == "t"


def test_copy_or_headers_only_is_decided_from_content() -> None:
    assert not carries_copy(dead(headers=context()))
    assert carries_copy(dead(key=b"k", headers=context()))
    assert carries_copy(dead(value=b"", headers=context()))  # an empty value is a value
    assert carries_copy(dead(headers=(*context(), ("own", None))))


def test_replayed_records_keep_their_own_headers_only() -> None:
    headers = (*context(), ("a", b"1"), ("__dlq.errors.exception", b"x"), ("b", None))
    assert strip_dead_letter_headers(headers) == (("a", b"1"), ("b", None))
    assert replayed_record(dead(b"k", b"v", headers)) == NewRecord(
        b"k", b"v", (("a", b"1"), ("b", None))
    )


def test_murmur2_matches_kafka() -> None:
    # Values of Kafka's Utils.murmur2 (its own test vectors).
    assert murmur2(b"21") == -973932308
    assert murmur2(b"foobar") == -790332482
    assert murmur2(b"a-little-bit-long-string") == -985981536
    assert murmur2(b"a-little-bit-longer-string") == -1486304829
    assert murmur2(b"abc") == 479470107


def test_partition_is_the_source_one_else_the_key_hash_else_zero() -> None:
    assert choose_partition(3, b"k", 4) == 3
    assert choose_partition(3, b"foobar", 2) == (-790332482 & 0x7FFFFFFF) % 2
    assert choose_partition(None, b"foobar", 3) == (-790332482 & 0x7FFFFFFF) % 3
    assert choose_partition(5, None, 2) == 0
    assert choose_partition(None, None, 1) == 0


def txn_batch(base: int, pid: int, values: list[bytes]) -> bytes:
    return build_batch(
        [NewRecord(None, v) for v in values],
        base_offset=base,
        producer_id=pid,
        producer_epoch=0,
        base_sequence=0,
        is_transactional=True,
    )


def marker(base: int, pid: int, commit: bool) -> bytes:
    return build_end_txn_marker_batch(
        producer_id=pid,
        producer_epoch=0,
        commit=commit,
        coordinator_epoch=0,
        timestamp=0,
        base_offset=base,
    )


def test_read_committed_drops_aborted_batches_and_markers() -> None:
    data = (
        build_batch([NewRecord(None, b"plain")], base_offset=0)
        + txn_batch(1, 7, [b"aborted-1", b"aborted-2"])
        + txn_batch(3, 8, [b"committed"])
        + marker(4, 7, commit=False)
        + marker(5, 8, commit=True)
        + txn_batch(6, 7, [b"later"])  # the same producer's next transaction
    )
    records, next_offset = committed_records(data, 0, [(7, 1)])
    assert [r.value for r in records] == [b"plain", b"committed", b"later"]
    assert next_offset == 7
    # read_uncommitted keeps them all (but never the markers).
    everything, _ = committed_records(data, 0, None)
    assert len(everything) == 5


def test_records_before_the_fetch_offset_are_left_out() -> None:
    data = build_batch([NewRecord(None, b"a"), NewRecord(None, b"b")], base_offset=10)
    records, next_offset = committed_records(data, 11, [])
    assert [(r.offset, r.value) for r in records] == [(11, b"b")]
    assert next_offset == 12
    assert committed_records(b"", 5, []) == ([], 5)


def args(**given: object) -> argparse.Namespace:
    defaults: dict[str, object] = {d: None for d in replay.NOT_WITH_REPLAY}
    defaults.update(group=["G"], topic=["dlq.orders"], to_topic=None)
    defaults.update(given)
    return argparse.Namespace(**defaults)


def test_arguments() -> None:
    replay.validate(args())
    replay.validate(args(to_topic="orders"))
    for bad, message in [
        (args(group=None), "one --group"),
        (args(group=["a", "b"]), "one --group"),
        (args(topic=None), "one --topic"),
        (args(topic=["dlq.x:0"]), "without partitions"),
        (args(execute=True), "--execute can't be used"),
        (args(all_groups=True), "--all-groups can't be used"),
        (args(to_topic=""), "--to-topic takes"),
        (args(to_topic="dlq.orders"), "the dead-letter topic itself"),
    ]:
        with pytest.raises(UsageError, match=message):
            replay.validate(bad)


class FakeClient:
    """What Replay asks of its TxnClient, recorded: one topic of `partitions`."""

    def __init__(self, partitions: int = 2) -> None:
        self.partitions = partitions
        self.calls: list[tuple[str, object]] = []

    async def describe_topics(self, topics: list[str]) -> list[object]:
        parts = [argparse.Namespace(partition=p) for p in range(self.partitions)]
        return [argparse.Namespace(name=t, partitions=parts) for t in topics]

    async def add_partitions(self, txn: str, producer: object, partitions: object) -> None:
        self.calls.append(("add_partitions", sorted(partitions)))  # type: ignore[call-overload]

    async def produce(self, txn: str, producer: object, records: object, now: int) -> None:
        self.calls.append(("produce", records))

    async def add_offsets(self, txn: str, producer: object, group: str) -> None:
        self.calls.append(("add_offsets", group))

    async def commit_offsets(self, txn: str, producer: object, group: str, offsets: object) -> None:
        self.calls.append(("commit_offsets", offsets))

    async def end_txn(self, txn: str, producer: object, commit: bool) -> None:
        self.calls.append(("end_txn", commit))


def a_replay(client: FakeClient, dry_run: bool = False) -> replay.Replay:
    namespace = args(dry_run=dry_run, output="table")
    r = replay.Replay(client, namespace)  # type: ignore[arg-type]
    r.producer = argparse.Namespace(producer_id=1, producer_epoch=0)  # type: ignore[assignment]
    return r


def test_a_transaction_produces_the_records_and_commits_the_offsets_after_them() -> None:
    client = FakeClient()
    records = [
        dead(b"k0", b"v0", context(partition=1, offset=10), offset=20),
        dead(b"k1", b"v1", context(group="H"), offset=21),  # passed over, still consumed
    ]
    position = asyncio.run(a_replay(client).replay_batch(0, records, 22))
    assert position == 22
    assert [name for name, _ in client.calls] == [
        "add_partitions",
        "produce",
        "add_offsets",
        "commit_offsets",
        "end_txn",
    ]
    assert client.calls[1][1] == {("orders", 1): [NewRecord(b"k0", b"v0", ())]}
    assert client.calls[2][1] == "spool-replay-G"
    assert client.calls[3][1] == {("dlq.orders", 0): 22}
    assert client.calls[4][1] is True


def test_a_transaction_stops_before_its_bytes_pass_the_bound() -> None:
    client = FakeClient()
    big = b"x" * (replay.TRANSACTION_MAX_BYTES // 2)
    records = [dead(b"k%d" % i, big, context(offset=i), offset=i) for i in range(3)]
    r = a_replay(client)
    assert asyncio.run(r.replay_batch(0, records, 3)) == 1  # the record at 1 waits
    assert client.calls[3][1] == {("dlq.orders", 0): 1}
    assert r.counts["replayed"] == 1


def test_a_dry_run_changes_nothing() -> None:
    client = FakeClient()
    r = a_replay(client, dry_run=True)
    assert asyncio.run(r.replay_batch(0, [dead(b"k", b"v", context())], 8)) == 8
    assert client.calls == [] and r.counts["replayed"] == 1
    # The source partition, 3, is not there: the key's hash chooses.
    assert r.listed[0]["target_partition"] == (murmur2(b"k") & 0x7FFFFFFF) % 2


def test_an_original_in_an_open_transaction_stops_the_partition_without_skipping() -> None:
    """A headers-only record whose original is above the source partition's last stable
    offset (its transaction still open) is neither replayed nor skipped: the batch stops
    before it, commits what came before, and the partition waits for a later run."""
    client = FakeClient()

    async def fetch(topic: str, partition: int, offset: int, max_bytes: int) -> object:
        client.calls.append(("fetch", (topic, partition, offset)))
        return argparse.Namespace(
            records=(),
            next_offset=offset,
            high_watermark=60,
            last_stable_offset=50,
            log_start_offset=0,
        )

    client.fetch = fetch  # type: ignore[attr-defined]
    records = [
        dead(b"k0", b"v0", context(offset=10), offset=20),  # a copy: replayed
        dead(None, None, context(offset=55), offset=21),  # original at 55 >= LSO 50
        dead(b"k2", b"v2", context(offset=12), offset=22),
    ]
    r = a_replay(client)
    assert asyncio.run(r.replay_batch(0, records, 23)) == 21
    assert r.waiting == {0: 21}
    assert r.counts["replayed"] == 1 and r.counts["skipped"] == 0
    assert ("commit_offsets", {("dlq.orders", 0): 21}) in client.calls
    # Stopped at the first record: no transaction at all, nothing committed.
    client.calls.clear()
    r = a_replay(client)
    assert asyncio.run(r.replay_batch(0, records[1:], 23)) == 21
    assert [name for name, _ in client.calls] == ["fetch"]
