"""The share-partition leader reads and writes share state with the topic partition's
leader epoch, so the share coordinator fences a former leader (Kafka's
readStateAndMaybeUpdateLeaderEpoch and its write check).

Two share-partition managers on one in-memory share coordinator stand for the old and
the new leader of a partition (in a cluster both reach the one share coordinator: on
another broker, through broker.share.remote_persister). The new leader loads the
partition with epoch 2; the old one, loaded with epoch 1 before, is refused its next
acknowledgement (NOT_LEADER_OR_FOLLOWER for its client), which changes nothing durable.
"""

from __future__ import annotations

from broker.share.manager import SharePartitionManager
from coordinator.share_persister import InMemoryPersister
from persister.clock import ManualClock
from protocol.errors import ErrorCode
from tests.unit.test_share_manager import KEY, FakeGroups, FakeLog, durable

ACCEPT = 1


def leader(persister: InMemoryPersister, epoch: int | None) -> SharePartitionManager:
    log = FakeLog()
    return SharePartitionManager(
        persister,
        FakeGroups(persister, 5),
        lambda t, p: log,
        lambda part, ts: None,
        clock=ManualClock(),
        **({} if epoch is None else {"leader_epoch": lambda t, p: epoch}),
    )


async def acquire(mgr: SharePartitionManager, member: str) -> None:
    fetched = await mgr.acquire(KEY, member, max_records=100, batch_size=100, max_bytes=1 << 20)
    assert fetched.acquired


async def test_a_former_leaders_acknowledgement_is_fenced_once_the_new_one_read() -> None:
    persister = InMemoryPersister()
    old = leader(persister, 1)
    await acquire(old, "m1")
    assert persister.shard.read_summary(KEY).leader_epoch == 1
    new = leader(persister, 2)  # the partition moved: the new leader reads the state
    await acquire(new, "m2")
    assert persister.shard.read_summary(KEY).leader_epoch == 2
    before = durable(persister)
    code, _ = await old.acknowledge(KEY, "m1", [(0, 9, (ACCEPT,))])
    assert code == ErrorCode.not_leader_or_follower
    assert durable(persister) == before  # nothing the old leader wrote
    assert KEY not in old.partitions  # dropped, to be read afresh if ever led again
    assert await new.acknowledge(KEY, "m2", [(0, 9, (ACCEPT,))]) == (ErrorCode.none, None)
    assert persister.shard.read_summary(KEY).start_offset == 10


async def test_a_broker_alone_reads_and_writes_at_epoch_zero() -> None:
    persister = InMemoryPersister()
    alone = leader(persister, None)
    await acquire(alone, "m")
    assert await alone.acknowledge(KEY, "m", [(0, 9, (ACCEPT,))]) == (ErrorCode.none, None)
    summary = persister.shard.read_summary(KEY)
    assert (summary.leader_epoch, summary.start_offset) == (0, 10)
