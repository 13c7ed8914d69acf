"""A partition whose flush was refused as fenced (another broker claimed its log,
`persister.storage.Fenced`) is out of service: the waiting writer, later appends,
reads and DeleteRecords answer NOT_LEADER_OR_FOLLOWER, and it is not flushed again."""

from __future__ import annotations

import pytest

from broker.partitions import Partition
from persister.storage import Fenced
from protocol.errors import ErrorCode, KafkaError
from tests.unit.test_partition_flush import append_one, commit, gate, partition

__all__ = ["commit", "partition"]  # the fixtures, from test_partition_flush


async def test_a_fenced_partition_answers_not_leader_and_is_not_flushed_again(
    partition: Partition,
) -> None:
    before = append_one(partition)
    await partition.flush()
    flush = gate(partition)
    flush.error = Fenced("topics/t-0", 1)
    refused = append_one(partition)
    flush.gate.set()
    with pytest.raises(KafkaError) as waited:
        await partition.wait_durable(refused, timeout_s=10)
    assert waited.value.code == ErrorCode.not_leader_or_follower
    assert partition.fenced is not None
    assert partition.high_watermark == before + 1

    with pytest.raises(KafkaError) as appended:
        append_one(partition)
    assert appended.value.code == ErrorCode.not_leader_or_follower
    with pytest.raises(KafkaError) as read:
        partition.read(0, 1 << 20)
    assert read.value.code == ErrorCode.not_leader_or_follower
    with pytest.raises(KafkaError) as deleted:
        await partition.delete_records_before(0)
    assert deleted.value.code == ErrorCode.not_leader_or_follower

    flush.entered.clear()
    await partition.flush()  # at stop: nothing to do, no error
    assert not flush.entered.is_set()
