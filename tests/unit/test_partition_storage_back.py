"""A partition whose flush failed because the storage was unavailable (a database that
did not answer, `persister.storage.StorageUnavailable`) serves again once a flush
succeeds: the writers waiting then are answered by their own flush, not failed by the
old error as after a failed fsync."""

from __future__ import annotations

import asyncio
import errno

import pytest

from broker.partitions import Partition
from persister.storage import StorageUnavailable
from protocol.errors import ErrorCode, KafkaError
from tests.unit.test_partition_flush import append_one, commit, gate, partition

__all__ = ["commit", "partition"]  # the fixtures, from test_partition_flush


async def test_writers_after_the_storage_came_back_wait_for_their_own_flush(
    partition: Partition,
) -> None:
    flush = gate(partition)
    flush.error = StorageUnavailable(errno.EIO, "commit to postgresql failed: gone")
    failed = append_one(partition)
    flush.gate.set()
    with pytest.raises(KafkaError) as failure:
        await partition.wait_durable(failed, timeout_s=10)
    assert failure.value.code == ErrorCode.kafka_storage_error

    # Back: two writers, the second's records in the round after the first's.
    flush.error = None
    flush.gate.clear()
    first = append_one(partition)
    second = append_one(partition)
    waits = asyncio.gather(
        partition.wait_durable(first, timeout_s=10),
        partition.wait_durable(second, timeout_s=10),
        return_exceptions=True,
    )
    flush.gate.set()
    assert await waits == [None, None]
    assert partition.high_watermark == second + 1


async def test_a_writer_waiting_for_pending_records_asks_for_another_round(
    partition: Partition,
) -> None:
    """No new append after the failure (a retried produce found its batch a duplicate,
    a share fetch acquired records past the HW): waiting for those records starts a round,
    which commits them once the storage is back, instead of failing on the old error or
    waiting for a round nobody asks for."""
    flush = gate(partition)
    flush.error = StorageUnavailable(errno.EIO, "commit to postgresql failed: gone")
    pending = append_one(partition)
    flush.gate.set()
    with pytest.raises(KafkaError):
        await partition.wait_durable(pending, timeout_s=10)
    assert partition.high_watermark <= pending

    flush.error = None
    # The partition's timeout runs on its ManualClock: bound the wait on the loop's.
    await asyncio.wait_for(partition.wait_durable(pending, timeout_s=10), 5)
    assert partition.high_watermark == pending + 1
