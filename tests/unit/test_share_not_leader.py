"""Share partitions of a topic partition this broker no longer leads (its log dropped:
broker.partitions.LogManager.drop_partition) unload, releasing what they acquired in
memory only, and a later ShareFetch or acknowledgement of it answers
NOT_LEADER_OR_FOLLOWER; other partitions are untouched."""

from __future__ import annotations

import uuid

from broker.share.manager import SharePartitionManager
from broker.share.reader import LogPartition
from persister.clock import ManualClock
from protocol.errors import ErrorCode, KafkaError
from tests.unit.test_share_manager import (
    ACCEPT,
    KEY,
    OTHER_KEY,
    TOPIC_ID,
    FakeGroups,
    FakeLog,
    FlakyPersister,
    durable,
    fetch,
    spans,
)


async def test_a_dropped_partition_unloads_and_answers_not_leader() -> None:
    persister = FlakyPersister()
    log = FakeLog()
    gone: set[int] = set()

    def log_partition(topic_id: uuid.UUID, partition: int) -> LogPartition | None:
        return None if partition in gone else log

    def not_leader(topic_id: uuid.UUID, partition: int) -> KafkaError | None:
        if partition not in gone:
            return None
        return KafkaError(ErrorCode.not_leader_or_follower, "led by another broker")

    mgr = SharePartitionManager(
        persister,
        FakeGroups(persister, 5),
        log_partition,
        lambda part, ts: None,
        clock=ManualClock(),
        not_leader=not_leader,
    )
    assert spans(await fetch(mgr)) == [(0, 9, 1)]
    assert spans(await fetch(mgr, OTHER_KEY)) == [(0, 9, 1)]
    stored = durable(persister)

    gone.add(KEY.partition)
    assert mgr.drop_partition(TOPIC_ID, KEY.partition, "claimed") == 1
    assert KEY not in mgr.partitions and OTHER_KEY in mgr.partitions
    assert durable(persister) == stored  # nothing written: the acquisition was transient

    fetched = await fetch(mgr)
    assert (fetched.error_code, fetched.acquired) == (ErrorCode.not_leader_or_follower, [])
    code, _ = await mgr.acknowledge(KEY, "m", [(0, 9, (ACCEPT,))])
    assert code == ErrorCode.not_leader_or_follower
    assert KEY not in mgr.partitions  # not loaded again
    assert await mgr.acknowledge(OTHER_KEY, "m", [(0, 9, (ACCEPT,))]) == (ErrorCode.none, None)
    mgr.stop()
