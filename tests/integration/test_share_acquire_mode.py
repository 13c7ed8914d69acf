"""ShareFetch v2's ShareAcquireMode (KIP-1206) on the wire.

A share consumer with share.acquire.mode=record_limit asks for at most MaxRecords records
and must get no more: a 352-record batch (as a producer's linger makes it, compressed or
not) is cut at MaxRecords, the response carries the whole batch and the client skips the
offsets it did not acquire; the rest stays available to any member as never delivered, so
nothing is released and redelivered with a higher delivery count. librdkafka's
ShareConsumer has no share.acquire.mode, so the fetches are spool's own client's.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer

from protocol.client import KafkaClient
from protocol.errors import ErrorCode
from protocol.records import iter_batches
from tests.integration.conftest import Broker, create_topic, module_broker, producer_config
from tests.integration.share_helpers import (
    earliest,
    heartbeat,
    produce_values,
    run_wire,
    share_fetch_body,
    topic_id,
)

pytestmark = pytest.mark.timeout(120)

FETCH = 78
BATCH_OPTIMIZED, RECORD_LIMIT = 0, 1
ACCEPT = 1
RECORDS = 352
# Kafka's record batch attributes, bits 0-2.
CODECS = {"none": 0, "lz4": 3, "zstd": 4}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    with module_broker(tmp_path_factory, "acquire-mode") as started:
        yield started


def one_batch(broker: Broker, topic: str, compression: str, partition: int = 0) -> None:
    """352 records in one produced batch: the producer lingers past the whole produce and
    flush() sends them at once, far below batch.num.messages and batch.size."""
    producer = Producer(
        producer_config(
            broker,
            **{
                "linger.ms": 5_000,
                "batch.num.messages": 10_000,
                "batch.size": 1_000_000,
                "compression.type": compression,
            },
        )
    )
    values = [f"record-{i:03d}".encode() * 4 for i in range(RECORDS)]
    sent = produce_values(broker, topic, values, partition=partition, producer=producer)
    assert [s.offset for s in sent] == list(range(RECORDS))


def fetch(
    group: str,
    member: str,
    epoch: int,
    tid: uuid.UUID,
    mode: int,
    acks: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A ShareFetch v2 of partition 0, at most 5 records, in `mode`."""
    return share_fetch_body(
        group,
        member,
        epoch,
        {(tid, 0): acks or []},
        version=2,
        max_records=5,
        batch_size=5,
        share_acquire_mode=mode,
    )


def acquired(response: Any) -> list[tuple[int, int, int]]:
    assert response.error_code == ErrorCode.none, response.error_message
    (topic,) = response.responses
    (partition,) = topic.partitions
    assert partition.error_code == ErrorCode.none, partition.error_message
    return [(a.first_offset, a.last_offset, a.delivery_count) for a in partition.acquired_records]


def batches(response: Any) -> list[tuple[int, int, int]]:
    """(base offset, last offset, codec) of the batches a response carries."""
    records = response.responses[0].partitions[0].records or b""
    return [(h.base_offset, h.last_offset, h.compression) for _, h in iter_batches(records)]


@pytest.mark.parametrize("compression", ["none", "lz4", "zstd"])
def test_record_limit_acquires_at_most_max_records_of_one_batch(
    broker: Broker, compression: str
) -> None:
    topic, group = f"limit-{compression}", f"g-limit-{compression}"
    create_topic(broker, topic)
    earliest(broker, group)
    one_batch(broker, topic, compression)
    whole = [(0, RECORDS - 1, CODECS[compression])]

    async def scenario(client: KafkaClient) -> None:
        a, b = f"{group}-a", f"{group}-b"
        assert (await heartbeat(client, group, a, 0, [topic])).error_code == 0
        assert (await heartbeat(client, group, b, 0, [topic])).error_code == 0
        tid = await topic_id(client, topic)

        got = await client.request(FETCH, 2, fetch(group, a, 0, tid, RECORD_LIMIT))
        assert acquired(got) == [(0, 4, 1)]
        # The log holds one batch of 352 records, and the whole of it is sent: the client
        # skips the offsets outside its acquired ranges.
        assert batches(got) == whole

        # The rest of the batch is another member's to take, delivered for the first time.
        got = await client.request(FETCH, 2, fetch(group, b, 0, tid, RECORD_LIMIT))
        assert acquired(got) == [(5, 9, 1)]
        assert batches(got) == whole

        # Accepting 0-4 with the next fetch: again 5 records, the next ones.
        accept = [{"first_offset": 0, "last_offset": 4, "acknowledge_types": [ACCEPT]}]
        got = await client.request(FETCH, 2, fetch(group, a, 1, tid, RECORD_LIMIT, accept))
        assert got.responses[0].partitions[0].acknowledge_error_code == ErrorCode.none
        assert acquired(got) == [(10, 14, 1)]

        # batch_optimized (every v1 fetch too) finishes the log batch past MaxRecords.
        got = await client.request(FETCH, 2, fetch(group, b, 1, tid, BATCH_OPTIMIZED))
        assert acquired(got) == [(15, RECORDS - 1, 1)]
        assert batches(got) == whole

    run_wire(broker, scenario)


def test_record_limit_is_shared_by_the_requests_partitions(broker: Broker) -> None:
    # Kafka 4.2's ShareFetchUtils gives each partition MaxRecords less what the partitions
    # before it acquired: the limit is the request's, not each partition's.
    topic, group = "limit-two", "g-limit-two"
    create_topic(broker, topic, partitions=2)
    earliest(broker, group)
    one_batch(broker, topic, "none", partition=0)
    one_batch(broker, topic, "none", partition=1)

    async def scenario(client: KafkaClient) -> None:
        member = f"{group}-m"
        assert (await heartbeat(client, group, member, 0, [topic])).error_code == 0
        tid = await topic_id(client, topic)
        taken: list[tuple[int, int, int, int]] = []
        for epoch in range(4):
            body = share_fetch_body(
                group,
                member,
                epoch,
                {(tid, 0): [], (tid, 1): []},
                version=2,
                max_records=5,
                batch_size=5,
                share_acquire_mode=RECORD_LIMIT,
            )
            got = await client.request(FETCH, 2, body)
            assert got.error_code == ErrorCode.none, got.error_message
            this = [
                (p.partition_index, a.first_offset, a.last_offset, a.delivery_count)
                for t in got.responses
                for p in t.partitions
                for a in p.acquired_records
            ]
            assert sum(last - first + 1 for _, first, last, _ in this) == 5, this
            taken += this
        # Each record once, delivery count 1, from whichever partition came first.
        offsets = [(p, o) for p, first, last, _ in taken for o in range(first, last + 1)]
        assert len(set(offsets)) == 20
        assert {count for *_, count in taken} == {1}

    run_wire(broker, scenario)


def test_an_unknown_acquire_mode_is_an_invalid_request(broker: Broker) -> None:
    topic, group = "limit-invalid", "g-limit-invalid"
    create_topic(broker, topic)
    earliest(broker, group)
    produce_values(broker, topic, [b"x"] * 10)

    async def scenario(client: KafkaClient) -> None:
        member = f"{group}-m"
        assert (await heartbeat(client, group, member, 0, [topic])).error_code == 0
        tid = await topic_id(client, topic)
        got = await client.request(FETCH, 2, fetch(group, member, 0, tid, RECORD_LIMIT))
        assert acquired(got) == [(0, 4, 1)]

        # Mode 2 does not exist: refused as a whole, its acknowledgements not applied and
        # the session epoch not moved.
        accept = [{"first_offset": 0, "last_offset": 4, "acknowledge_types": [ACCEPT]}]
        bad = await client.request(FETCH, 2, fetch(group, member, 1, tid, 2, accept))
        assert bad.error_code == ErrorCode.invalid_request
        assert bad.error_message is not None and "ShareAcquireMode 2" in bad.error_message
        assert bad.responses == ()

        # The broker keeps serving the member: the same epoch now applies the acks.
        got = await client.request(FETCH, 2, fetch(group, member, 1, tid, RECORD_LIMIT, accept))
        assert got.responses[0].partitions[0].acknowledge_error_code == ErrorCode.none
        assert acquired(got) == [(5, 9, 1)]

    run_wire(broker, scenario)
