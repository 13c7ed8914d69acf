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
