"""A full disk: the broker refuses writes with errors, stays up, loses nothing it
confirmed, and works again once space is freed.

The broker's data dir is a small tmpfs filled to the last byte, so every write gets a
real ENOSPC from the kernel (mounting needs root, as CI has; elsewhere the test is
skipped). Share-group traffic goes through spool's own client so each Kafka error
code is visible.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from protocol.client import KafkaClient
from protocol.errors import ErrorCode
from tests.integration.conftest import (
    Broker,
    consume_assigned,
    create_topic,
    producer_config,
)
from tests.integration.share_helpers import earliest, heartbeat, produce_values, topic_id
from tests.integration.test_share_group_rpcs import ACCEPT, ACK, FETCH, ack_body, fetch_body

pytestmark = pytest.mark.timeout(180)

DISK_BYTES = 64 * 1024 * 1024
GROUP = "g-disk"
TOPIC = "disk"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def fill(directory: Path) -> Path:
    """Write a file until the filesystem refuses another byte; returns its path."""
    filler = directory / "filler"
    chunk = b"\0" * (1 << 20)
    with filler.open("wb", buffering=0) as f:
        for size in (1 << 20, 1 << 12, 1):
            while True:
                try:
                    f.write(chunk[:size])
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
                    break
    return filler


def produce_one(broker: Broker, value: bytes) -> str | None:
    """Produce one record (acks=all); None when confirmed, else the error's name."""
    producer = Producer(
        producer_config(broker, **{"enable.idempotence": False, "message.timeout.ms": 4000})
    )
    outcome: list[str | None] = []
    producer.produce(
        TOPIC,
        value=value,
        partition=0,
        on_delivery=lambda err, _msg: outcome.append(None if err is None else err.name()),
    )
    producer.flush(15)
    assert outcome, "the producer reported nothing within 15 s"
    return outcome[0]


RECORDS = 300


def test_full_disk_refuses_writes_keeps_serving_and_recovers(small_disk: Path) -> None:
    broker = Broker(small_disk / "data", small_disk.parent / "broker.log")
    broker.start()
    try:
        create_topic(broker, TOPIC, partitions=1)
        earliest(broker, GROUP)
        confirmed = [f"before-{i}".encode() for i in range(RECORDS)]
        produce_values(broker, TOPIC, confirmed)

        confirmed += asyncio.run(_while_full_and_after(broker, small_disk))
        assert produce_one(broker, b"after-0") is None
        confirmed.append(b"after-0")

        # Everything confirmed survives kill -9; nothing accepted is delivered again.
        broker.kill9()
        broker.start()
        values = [r.value for r in consume_assigned(broker, TOPIC, [0], len(confirmed))]
        assert set(confirmed) <= set(values)
        asyncio.run(_only_unaccepted_are_delivered(broker, expected_first=RECORDS))
    finally:
        if broker.running:
            broker.stop()


class Session:
    """One member's share session on the topic's only partition."""

    def __init__(self, client: KafkaClient, member: str, tid: uuid.UUID) -> None:
        self.client, self.member, self.tid = client, member, tid
        self.epoch = 0

    async def fetch(self) -> list[tuple[int, int]]:
        body = fetch_body(GROUP, self.member, self.epoch, self.tid, max_wait=2000)
        body.update(max_records=RECORDS, batch_size=RECORDS)
        response = await self.client.request(FETCH, 1, body)
        self.epoch += 1
        assert response.error_code == ErrorCode.none
        partition = response.responses[0].partitions[0]
        assert partition.error_code == ErrorCode.none
        return [(r.first_offset, r.last_offset) for r in partition.acquired_records]

    async def accept(self, first: int, last: int) -> ErrorCode:
        batch = [{"first_offset": first, "last_offset": last, "acknowledge_types": [ACCEPT]}]
        response = await self.client.request(
            ACK, 1, ack_body(GROUP, self.member, self.epoch, self.tid, batch)
        )
        self.epoch += 1
        return ErrorCode(response.responses[0].partitions[0].error_code)


async def _while_full_and_after(broker: Broker, disk: Path) -> list[bytes]:
    """Fill the disk, see every kind of write refused, free it, see them succeed.

    A file's last page has room left after the filler took every free page, so small
    appends may still succeed at first: each kind of write is repeated until refused.
    Returns the values produced and confirmed along the way.
    """
    confirmed: list[bytes] = []
    client = await KafkaClient.connect(broker.host, broker.port, "spool-it-disk")
    try:
        member = uuid.uuid4().hex[:22]
        assert (await heartbeat(client, GROUP, member, 0, [TOPIC])).error_code == ErrorCode.none
        session = Session(client, member, await topic_id(client, TOPIC))
        acquired: set[int] = set()
        while len(acquired) < RECORDS:
            for first, last in await session.fetch():
                acquired.update(range(first, last + 1))
        assert acquired == set(range(RECORDS))

        filler = fill(disk)
        try:
            # Acknowledgements: refused once no room is left, with Kafka's answer to a
            # share-state write that failed: COORDINATOR_NOT_AVAILABLE.
            accepted: list[int] = []
            refused_offset = None
            for offset in range(RECORDS):
                code = await session.accept(offset, offset)
                if code == ErrorCode.none:
                    accepted.append(offset)
                    continue
                assert code == ErrorCode.coordinator_not_available
                refused_offset = offset
                break
            assert refused_offset is not None, "every acknowledgement fit on a full disk"

            # Group changes: a joining member is refused.
            for _ in range(100):
                joined = await heartbeat(client, GROUP, uuid.uuid4().hex[:22], 0, [TOPIC])
                if joined.error_code != ErrorCode.none:
                    # Kafka's coordinator runtime answers a failed append NOT_COORDINATOR.
                    assert joined.error_code == ErrorCode.not_coordinator
                    break
            else:
                raise AssertionError("every member joined on a full disk")

            # Produce: refused (the producer gives up after its message timeout).
            for n in range(100):
                value = f"while-full-{n}".encode().ljust(16 * 1024, b".")
                produce_error = await asyncio.to_thread(produce_one, broker, value)
                if produce_error is not None:
                    # librdkafka retries KAFKA_STORAGE_ERROR until the message times out.
                    assert produce_error in ("KAFKA_STORAGE_ERROR", "_MSG_TIMED_OUT")
                    break
                confirmed.append(value)
            else:
                raise AssertionError("every record was stored on a full disk")

            # The broker still answers everyone.
            assert await topic_id(client, TOPIC) == session.tid
        finally:
            filler.unlink()

        # The refused acknowledgement left its record acquired: the retry succeeds, and
        # so does everything else.
        assert await session.accept(refused_offset, refused_offset) == ErrorCode.none
        if refused_offset + 1 < RECORDS:
            assert await session.accept(refused_offset + 1, RECORDS - 1) == ErrorCode.none
        joined = await heartbeat(client, GROUP, uuid.uuid4().hex[:22], 0, [TOPIC])
        assert joined.error_code == ErrorCode.none
    finally:
        with contextlib.suppress(Exception):
            await client.close()
    return confirmed


async def _only_unaccepted_are_delivered(broker: Broker, expected_first: int) -> None:
    client = await KafkaClient.connect(broker.host, broker.port, "spool-it-disk-after")
    try:
        member = uuid.uuid4().hex[:22]
        assert (await heartbeat(client, GROUP, member, 0, [TOPIC])).error_code == ErrorCode.none
        session = Session(client, member, await topic_id(client, TOPIC))
        ranges = await session.fetch()
        assert ranges and min(first for first, _ in ranges) >= expected_first
    finally:
        await client.close()
