"""A partition whose log another writer claimed: the broker drops what it held of it.

A broker on PostgreSQL serves a two-partition topic; then another writer claims the
log of partition 0 alone (a newer epoch in `spool_logs`, as a broker opening that
partition does: here a `PgStorage` of the test process, since a second broker process
claims every log at its start and would leave the first nothing to keep serving). The
first broker's next commit of partition 0 is refused; from then on it answers Produce,
Fetch, ListOffsets, ShareFetch and ShareAcknowledge for partition 0 with
NOT_LEADER_OR_FOLLOWER, as Kafka's ReplicaManager answers for a partition the metadata
knows and the broker no longer hosts, hands out nothing it held (records, acquired
share records), has deleted its local copy, and keeps serving partition 1.

The same with two broker processes: the first paused past its lease, the second claims
the logs at its start; the first, refused at its next produce once resumed, drops the
partition and no longer serves it.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker.leadership import TopicRef, layout
from persister.file_log import LogConfig
from persister.pg_storage import PgPartitionLog, PgStorage
from protocol.client import KafkaClient
from protocol.errors import ErrorCode
from protocol.records import NewRecord, build_batch
from tests.integration.conftest import Broker, create_topic, wait_for_partitions
from tests.integration.pg_helpers import pg_dsn, pg_server, take_over_while_paused
from tests.integration.share_helpers import (
    earliest,
    heartbeat,
    heartbeat_until_assigned,
    log_lines,
    produce_values,
    run_wire,
    share_ack_body,
    share_fetch_body,
    topic_id,
)

__all__ = ["pg_dsn", "pg_server"]  # the fixtures, from pg_helpers

TOPIC = "claimed"
SESSION_MS = 3000
GROUP = "claimed-share"
PRODUCE, FETCH, LIST_OFFSETS, SHARE_FETCH, SHARE_ACK = 0, 1, 2, 78, 79
ACCEPT = 1
EARLIEST = -2


async def produce(client: KafkaClient, partition: int, value: bytes) -> Any:
    """Produce v9, acks=all: the partition's response."""
    batch = bytes(build_batch([NewRecord(key=None, value=value)]))
    body = {
        "transactional_id": None,
        "acks": -1,
        "timeout": 30_000,
        "topic_data": [{"name": TOPIC, "partition_data": [{"index": partition, "records": batch}]}],
    }
    response = await client.request(PRODUCE, 9, body)
    return response.responses[0].partition_responses[0]


async def fetch(client: KafkaClient, partition: int) -> Any:
    """Fetch v12 from offset 0: the partition's response."""
    body = {
        "cluster_id": None,
        "replica_id": -1,
        "max_wait": 0,
        "min_bytes": 0,
        "max_bytes": 1 << 20,
        "isolation_level": 0,
        "session_id": 0,
        "session_epoch": -1,
        "topics": [
            {
                "topic": TOPIC,
                "partitions": [
                    {
                        "partition": partition,
                        "current_leader_epoch": -1,
                        "fetch_offset": 0,
                        "last_fetched_epoch": -1,
                        "log_start_offset": -1,
                        "partition_max_bytes": 1 << 20,
                    }
                ],
            }
        ],
        "forgotten_topics_data": [],
        "rack_id": "",
    }
    response = await client.request(FETCH, 12, body)
    return response.responses[0].partitions[0]


async def list_offsets(client: KafkaClient, partition: int) -> Any:
    """ListOffsets v7, earliest: the partition's response."""
    body = {
        "replica_id": -1,
        "isolation_level": 0,
        "topics": [
            {
                "name": TOPIC,
                "partitions": [
                    {
                        "partition_index": partition,
                        "current_leader_epoch": -1,
                        "timestamp": EARLIEST,
                    }
                ],
            }
        ],
    }
    response = await client.request(LIST_OFFSETS, 7, body)
    return response.topics[0].partitions[0]


def claim_partition_log(dsn: str, data_dir: Path, partition: int) -> None:
    """Claim `TOPIC`'s partition log as another broker opening it would: a new epoch."""

    async def claim() -> None:
        engine = PgStorage(dsn)
        await engine.start(data_dir)
        try:
            plog = engine.open_topic_log(
                data_dir / "topics" / f"{TOPIC}-{partition}", LogConfig(), 0
            )
            assert isinstance(plog, PgPartitionLog)
            await plog._claimed()
            plog.close()
        finally:
            await engine.stop()

    asyncio.run(claim())


def test_a_fenced_partition_is_dropped_and_answers_not_leader_while_others_serve(
    broker_factory: Callable[..., Broker], pg_dsn: str, tmp_path: Path
) -> None:
    # The test's claimer is no registered broker: the broker's next reconcile would see
    # partition 0 held by no live broker and claim it back. Heartbeats (and so the
    # reconciles) a minute apart keep that out of the test's few seconds.
    broker = broker_factory(
        {
            "storage": pg_dsn,
            "broker.heartbeat.interval.ms": "60000",
            "broker.session.timeout.ms": "120000",
        }
    )
    create_topic(broker, TOPIC, partitions=2)
    earliest(broker, GROUP)
    produce_values(broker, TOPIC, [b"zero-%d" % i for i in range(5)], partition=0)
    produce_values(broker, TOPIC, [b"one-%d" % i for i in range(5)], partition=1)
    cache = broker.data_dir / "topics" / f"{TOPIC}-0"
    assert cache.is_dir()

    async def scenario(client: KafkaClient) -> None:
        # A share consumer holds partition 0's records (acquired, not acknowledged).
        member = uuid.uuid4().hex[:22]
        joined = await heartbeat(client, GROUP, member, 0, [TOPIC])
        assert joined.error_code == ErrorCode.none, joined
        await heartbeat_until_assigned(client, GROUP, member, joined.member_epoch)
        tid = await topic_id(client, TOPIC)
        epoch = 0
        acquired: set[int] = set()
        deadline = time.monotonic() + 30
        while acquired != set(range(5)):
            assert time.monotonic() < deadline, acquired
            body = share_fetch_body(GROUP, member, epoch, {(tid, 0): []}, max_wait=500)
            response = await client.request(SHARE_FETCH, 1, body)
            epoch += 1
            for r in response.responses[0].partitions[0].acquired_records:
                acquired.update(range(r.first_offset, r.last_offset + 1))

        await asyncio.to_thread(claim_partition_log, pg_dsn, tmp_path / "claimer", 0)

        # The first write after the claim is refused by PostgreSQL: NOT_LEADER_OR_FOLLOWER.
        refused = await produce(client, 0, b"after the claim")
        assert refused.error_code == ErrorCode.not_leader_or_follower, refused

        # From then on nothing the broker held of partition 0 is served.
        deadline = time.monotonic() + 30
        while cache.exists():  # dropped on the loop's next turn after the refusal
            assert time.monotonic() < deadline, "the local copy was not deleted"
            await asyncio.sleep(0.05)
        again = await produce(client, 0, b"again")
        assert again.error_code == ErrorCode.not_leader_or_follower, again
        fetched = await fetch(client, 0)
        assert fetched.error_code == ErrorCode.not_leader_or_follower, fetched
        assert bytes(fetched.records or b"") == b""
        offsets = await list_offsets(client, 0)
        assert offsets.error_code == ErrorCode.not_leader_or_follower, offsets

        body = share_fetch_body(GROUP, member, epoch, {(tid, 0): []})
        shared = await client.request(SHARE_FETCH, 1, body)
        epoch += 1
        part = shared.responses[0].partitions[0]
        assert part.error_code == ErrorCode.not_leader_or_follower, part
        assert not part.acquired_records
        batches = [{"first_offset": 0, "last_offset": 4, "acknowledge_types": [ACCEPT]}]
        acked = await client.request(
            SHARE_ACK, 1, share_ack_body(GROUP, member, epoch, {(tid, 0): batches})
        )
        epoch += 1
        code = acked.responses[0].partitions[0].error_code
        assert code == ErrorCode.not_leader_or_follower, ErrorCode(code)

        # Partition 1 is still this broker's: produce, fetch, ListOffsets, ShareFetch.
        kept = await produce(client, 1, b"one-5")
        assert (kept.error_code, kept.base_offset) == (ErrorCode.none, 5), kept
        fetched = await fetch(client, 1)
        assert fetched.error_code == ErrorCode.none and fetched.high_watermark == 6, fetched
        offsets = await list_offsets(client, 1)
        assert (offsets.error_code, offsets.offset) == (ErrorCode.none, 0), offsets
        got: set[int] = set()
        deadline = time.monotonic() + 30
        while got != set(range(6)):
            assert time.monotonic() < deadline, got
            body = share_fetch_body(GROUP, member, epoch, {(tid, 1): []}, max_wait=500)
            response = await client.request(SHARE_FETCH, 1, body)
            epoch += 1
            # The session still holds partition 0 (NOT_LEADER_OR_FOLLOWER each time).
            (p1,) = [p for p in response.responses[0].partitions if p.partition_index == 1]
            assert p1.error_code == ErrorCode.none, p1
            for r in p1.acquired_records:
                got.update(range(r.first_offset, r.last_offset + 1))

    run_wire(broker, scenario)
    assert log_lines(broker, "partition_fenced", TOPIC)
    assert log_lines(broker, "partition_dropped")
    assert log_lines(broker, "share_partitions_unloaded_not_leader")
    broker.stop()  # a dropped partition is not flushed at stop: the exit is clean


def test_a_second_broker_process_claiming_the_log_makes_the_first_drop_it(
    broker_factory: Callable[..., Broker], pg_dsn: str
) -> None:
    """The first broker paused (SIGSTOP) past its lease: the second, alone live, claims
    every partition (broker.leadership). Resumed, the first's write to a partition the
    layout of the two gives the second is refused, and it drops that partition."""
    short = {
        "storage": pg_dsn,
        "broker.session.timeout.ms": str(SESSION_MS),
        "broker.heartbeat.interval.ms": str(SESSION_MS // 6),
    }
    first = broker_factory(short)
    create_topic(first, TOPIC, 2)
    ids: list[uuid.UUID] = []

    async def read_id(client: KafkaClient) -> None:
        ids.append(await topic_id(client, TOPIC))

    run_wire(first, read_id)
    target = layout([TopicRef(TOPIC, ids[0], 2)], [1, 2])
    partition = next(p for p in range(2) if target[f"topics/{TOPIC}-{p}"] == 2)

    async def before(client: KafkaClient) -> None:
        written = await produce(client, partition, b"before")
        assert written.error_code == ErrorCode.none, written

    run_wire(first, before)
    cache = first.data_dir / "topics" / f"{TOPIC}-{partition}"

    def start_second() -> Broker:
        second = broker_factory({**short, "node.id": "2"})
        wait_for_partitions(second, TOPIC, 2)
        return second

    second = take_over_while_paused(first, pg_dsn, start_second)

    async def scenario(client: KafkaClient) -> None:
        refused = await produce(client, partition, b"stale")
        assert refused.error_code == ErrorCode.not_leader_or_follower, refused
        deadline = time.monotonic() + 30
        while cache.exists():
            assert time.monotonic() < deadline, "the local copy was not deleted"
            await asyncio.sleep(0.05)
        fetched = await fetch(client, partition)
        assert fetched.error_code == ErrorCode.not_leader_or_follower, fetched
        assert bytes(fetched.records or b"") == b""
        offsets = await list_offsets(client, partition)
        assert offsets.error_code == ErrorCode.not_leader_or_follower, offsets

    run_wire(first, scenario)

    async def on_second(client: KafkaClient) -> None:
        kept = await produce(client, partition, b"after")
        assert (kept.error_code, kept.base_offset) == (ErrorCode.none, 1), kept

    run_wire(second, on_second)
    assert log_lines(first, "partition_dropped")
