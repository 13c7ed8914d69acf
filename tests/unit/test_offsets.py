"""Committed offsets in the group coordinator (coordinator.offsets), without sockets:
commits of simple groups, Kafka 4.2's answers to the notable cases, OffsetFetch's -1
for what is not committed and UNSTABLE_OFFSET_COMMIT for pending transactional offsets,
OffsetDelete, retention on the injected clock, the offsets of deleted topics, and the
state rebuilt from the log after a restart."""

from __future__ import annotations

import asyncio
import errno
import uuid

import pytest

from coordinator.assignor import TopicMetadata
from coordinator.group_config import GroupConfigStore
from coordinator.group_coordinator import GroupCoordinator
from coordinator.group_host import GroupType
from coordinator.offsets import (
    FetchedOffset,
    OffsetStore,
    PartitionCommit,
    PendingTxnOffsetCommitRecord,
    SimpleGroup,
)
from coordinator.share_persister import InMemoryPersister
from persister.clock import ManualClock
from persister.coordinator_log import MemoryRecordLog
from protocol.errors import ErrorCode, KafkaError

T1, T2 = uuid.UUID(int=1), uuid.UUID(int=2)
DAY_MS = 24 * 60 * 60 * 1000


def coordinator(
    log: MemoryRecordLog | None = None,
    clock: ManualClock | None = None,
    topics: dict[uuid.UUID, TopicMetadata] | None = None,
) -> GroupCoordinator:
    metadata = (
        topics
        if topics is not None
        else {
            T1: TopicMetadata(T1, "orders", 3),
            T2: TopicMetadata(T2, "audit", 1),
        }
    )
    groups = GroupCoordinator(
        InMemoryPersister(),
        lambda: metadata,
        GroupConfigStore(),
        record_log=log,
        clock=clock or ManualClock(1_000_000),
        offsets=OffsetStore(retention_ms=DAY_MS),
    )
    groups.load()
    return groups


def commits(*items: tuple[str, int, int]) -> list[PartitionCommit]:
    return [PartitionCommit(t, p, o) for t, p, o in items]


async def test_a_commit_with_generation_minus_one_makes_a_simple_group() -> None:
    groups = coordinator()
    outcomes = await groups.commit_offsets(
        "app", "", None, -1, commits(("orders", 0, 5), ("orders", 2, 9)), api_version=9
    )
    assert [code for _, code in outcomes] == [ErrorCode.none, ErrorCode.none]
    assert groups.group_type("app") == GroupType.CLASSIC
    assert isinstance(groups.classic_groups["app"], SimpleGroup)
    [(name, _, fetched)] = groups.fetch_offsets("app", [("orders", [0, 1, 2], None)])
    assert name == "orders"
    assert [(f.partition, f.offset) for f in fetched] == [(0, 5), (1, -1), (2, 9)]
    # All topics: what is committed.
    assert [(t, [f.offset for f in fs]) for t, _, fs in groups.fetch_offsets("app", None)] == [
        ("orders", [5, 9])
    ]


@pytest.mark.parametrize(
    "version,code", [(9, ErrorCode.group_id_not_found), (8, ErrorCode.illegal_generation)]
)
async def test_a_generation_for_a_group_that_does_not_exist(version: int, code: ErrorCode) -> None:
    groups = coordinator()
    with pytest.raises(KafkaError) as refused:
        await groups.commit_offsets(
            "ghost", "m-1", None, 3, commits(("orders", 0, 1)), api_version=version
        )
    assert refused.value.code == code
    assert groups.group_type("ghost") is None


async def test_a_simple_group_knows_no_member() -> None:
    groups = coordinator()
    await groups.commit_offsets("app", "", None, -1, commits(("orders", 0, 1)), api_version=9)
    with pytest.raises(KafkaError) as refused:
        await groups.commit_offsets("app", "m-1", None, 1, commits(("orders", 0, 2)), api_version=9)
    assert refused.value.code == ErrorCode.unknown_member_id


async def test_metadata_past_the_limit_is_refused_per_partition() -> None:
    groups = coordinator()
    outcomes = await groups.commit_offsets(
        "app",
        "",
        None,
        -1,
        [
            PartitionCommit("orders", 0, 1, metadata="x" * 4097),
            PartitionCommit("orders", 1, 2, metadata="ok"),
        ],
        api_version=9,
    )
    assert [code for _, code in outcomes] == [ErrorCode.offset_metadata_too_large, ErrorCode.none]
    [(_, _, fetched)] = groups.fetch_offsets("app", [("orders", [0, 1], None)])
    assert [(f.offset, f.metadata) for f in fetched] == [(-1, ""), (2, "ok")]


async def test_a_share_groups_id_is_not_a_consumer_group() -> None:
    groups = coordinator()
    await groups.heartbeat("workers", "m", 0, ["orders"], None, "c", "/127.0.0.1")
    with pytest.raises(KafkaError) as refused:
        await groups.commit_offsets(
            "workers", "", None, -1, commits(("orders", 0, 1)), api_version=9
        )
    assert refused.value.code == ErrorCode.group_id_not_found
    assert refused.value.message == "Group workers is not a consumer group."
    # OffsetFetch answers a share group with -1 everywhere, no error (Kafka 4.2).
    [(_, _, fetched)] = groups.fetch_offsets("workers", [("orders", [0], None)])
    assert fetched == [FetchedOffset(0)]
    with pytest.raises(KafkaError) as refused:
        await groups.delete_committed_offsets("workers", [("orders", [0])])
    assert refused.value.code == ErrorCode.group_id_not_found


async def test_require_stable_answers_unstable_for_a_pending_transactional_offset() -> None:
    groups = coordinator()
    await groups.commit_offsets("app", "", None, -1, commits(("orders", 0, 1)), api_version=9)
    groups._replay(PendingTxnOffsetCommitRecord("app", 77, "orders", 0, 0, 10))
    [(_, _, stable)] = groups.fetch_offsets("app", [("orders", [0], None)], require_stable=True)
    assert stable[0].error == ErrorCode.unstable_offset_commit
    [(_, _, plain)] = groups.fetch_offsets("app", [("orders", [0], None)])
    assert plain[0].offset == 1


async def test_offset_delete_and_delete_group() -> None:
    groups = coordinator()
    await groups.commit_offsets(
        "app",
        "",
        None,
        -1,
        commits(("orders", 0, 1), ("orders", 1, 2), ("audit", 0, 3)),
        api_version=9,
    )
    answered = await groups.delete_committed_offsets("app", [("orders", [0])])
    assert answered == [("orders", [(0, ErrorCode.none)])]
    assert [t for t, _, _ in groups.fetch_offsets("app", None)] == ["audit", "orders"]
    [(group_id, error)] = await groups.delete_groups(["app"])
    assert (group_id, error) == ("app", None)
    assert groups.group_type("app") is None
    assert groups.fetch_offsets("app", None) == []
    with pytest.raises(KafkaError) as refused:
        await groups.delete_committed_offsets("app", [("orders", [1])])
    assert refused.value.code == ErrorCode.group_id_not_found


async def test_retention_expires_a_simple_groups_offsets_and_the_group() -> None:
    clock = ManualClock(1_000_000)
    groups = coordinator(clock=clock)
    await groups.commit_offsets("app", "", None, -1, commits(("orders", 0, 1)), api_version=9)
    clock.advance(DAY_MS // 2)
    await groups.commit_offsets("app", "", None, -1, commits(("orders", 1, 2)), api_version=9)
    clock.advance(DAY_MS // 2)
    assert await groups.expire_offsets(clock.now_ms()) == 1  # the first is a day old
    assert [f.partition for _, _, fs in groups.fetch_offsets("app", None) for f in fs] == [1]
    clock.advance(DAY_MS // 2)
    assert await groups.expire_offsets(clock.now_ms()) == 1
    assert groups.group_type("app") is None  # a simple group goes with its last offset


async def test_an_explicit_retention_wins() -> None:
    clock = ManualClock(1_000_000)
    groups = coordinator(clock=clock)
    await groups.commit_offsets(
        "app", "", None, -1, commits(("orders", 0, 1)), retention_ms=1000, api_version=2
    )
    clock.advance(999)
    assert await groups.expire_offsets(clock.now_ms()) == 0
    clock.advance(1)
    assert await groups.expire_offsets(clock.now_ms()) == 1


async def test_the_offsets_of_a_deleted_topic_go() -> None:
    metadata = {T1: TopicMetadata(T1, "orders", 3), T2: TopicMetadata(T2, "audit", 1)}
    groups = coordinator(topics=metadata)
    await groups.commit_offsets(
        "app", "", None, -1, commits(("orders", 0, 1), ("audit", 0, 3)), api_version=9
    )
    del metadata[T1]
    await groups.on_topics_changed()
    assert [t for t, _, _ in groups.fetch_offsets("app", None)] == ["audit"]


async def test_offsets_and_simple_groups_come_back_from_the_log() -> None:
    log = MemoryRecordLog()
    groups = coordinator(log)
    await groups.commit_offsets("app", "", None, -1, commits(("orders", 0, 4)), api_version=9)
    await groups.commit_offsets("gone", "", None, -1, commits(("orders", 0, 1)), api_version=9)
    await groups.delete_groups(["gone"])
    again = coordinator(log)
    assert again.group_type("app") == GroupType.CLASSIC
    assert again.group_type("gone") is None
    [(_, _, fetched)] = again.fetch_offsets("app", [("orders", [0], None)])
    assert fetched[0].offset == 4


async def test_transactional_offsets_wait_for_the_marker() -> None:
    groups = coordinator()
    outcomes = await groups.commit_transactional_offsets(
        "app", "", None, -1, 77, 0, commits(("orders", 0, 9)), api_version=3
    )
    assert [code for _, code in outcomes] == [ErrorCode.none]
    assert groups.group_type("app") == GroupType.CLASSIC  # a simple group, pending only
    [(_, _, before)] = groups.fetch_offsets("app", [("orders", [0], None)])
    assert before[0].offset == -1
    # A marker for another __consumer_offsets partition leaves them pending.
    from coordinator.transactions import offsets_partition

    mine = offsets_partition("app")
    await groups.complete_transaction(77, True, frozenset({mine + 1}))
    [(_, _, still)] = groups.fetch_offsets("app", [("orders", [0], None)], require_stable=True)
    assert still[0].error == ErrorCode.unstable_offset_commit
    await groups.complete_transaction(77, True, frozenset({mine}))
    [(_, _, after)] = groups.fetch_offsets("app", [("orders", [0], None)], require_stable=True)
    assert (after[0].offset, after[0].error) == (9, ErrorCode.none)


async def test_an_aborted_transactions_offsets_are_dropped_and_a_simple_group_goes() -> None:
    from coordinator.transactions import offsets_partition

    groups = coordinator()
    await groups.commit_transactional_offsets(
        "app", "", None, -1, 77, 0, commits(("orders", 0, 9)), api_version=3
    )
    await groups.complete_transaction(77, False, frozenset({offsets_partition("app")}))
    assert groups.fetch_offsets("app", None) == []
    assert groups.group_type("app") is None


async def test_a_transactional_commit_with_a_generation_to_no_group_is_illegal_generation() -> None:
    groups = coordinator()
    with pytest.raises(KafkaError) as refused:
        await groups.commit_transactional_offsets(
            "ghost", "m", None, 2, 77, 0, commits(("orders", 0, 9)), api_version=3
        )
    assert refused.value.code == ErrorCode.illegal_generation


async def test_an_empty_classic_group_goes_with_its_last_offset() -> None:
    """Kafka's cleanupGroupMetadata: an Empty classic group's offsets expire a retention
    after it went Empty (its GroupMetadata's current state timestamp), and once all are
    gone the group is deleted too (maybeDeleteGroup)."""
    from coordinator.classic_group import GroupMetadataRecord

    clock = ManualClock(1_000_000)
    groups = coordinator(clock=clock)
    for group_id, empty_since in (("old", 1_000_000), ("later", 1_000_000 + DAY_MS // 2)):
        groups._replay(GroupMetadataRecord(group_id, "consumer", 3, "range", None, empty_since))
        assert groups.group_type(group_id) == GroupType.CLASSIC
        assert not isinstance(groups.classic_groups[group_id], SimpleGroup)
        await groups.commit_offsets(
            group_id, "", None, -1, commits(("orders", 0, 1), ("orders", 1, 2)), api_version=9
        )
    clock.advance(DAY_MS)
    assert await groups.expire_offsets(clock.now_ms()) == 2
    assert groups.group_type("old") is None
    assert groups.group_type("later") == GroupType.CLASSIC
    assert len(groups.fetch_offsets("later", None)[0][2]) == 2
    clock.advance(DAY_MS // 2)
    assert await groups.expire_offsets(clock.now_ms()) == 2
    assert groups.group_type("later") is None


class _InterleavingLog(MemoryRecordLog):
    """A record log whose sync yields to the event loop, so concurrent commits overlap,
    and fails (EIO) on the syncs numbered in `fail`."""

    def __init__(self, fail: frozenset[int] = frozenset()) -> None:
        super().__init__()
        self.fail = fail
        self.syncs = 0

    async def sync(self) -> None:
        self.syncs += 1
        number = self.syncs
        for _ in range(3):
            await asyncio.sleep(0)
        if number in self.fail:
            raise OSError(errno.EIO, "injected I/O error")


@pytest.mark.parametrize("fail", [frozenset(), frozenset({2, 5, 9})])
async def test_many_committers_at_once_agree_with_the_log(fail: frozenset[int]) -> None:
    """40 members of one group commit at once (3 partitions, a new offset each): each
    commit is applied whole or not at all, the group's offsets are those of the last
    successful commit of each partition, and a coordinator rebuilt from the log sees the
    same offsets as memory (memory never ahead of what was written). With failed syncs
    the failed commits report an error and change nothing."""
    log = _InterleavingLog(fail)
    groups = coordinator(log)
    await groups.commit_offsets("app", "", None, -1, commits(("orders", 0, 0)), api_version=9)

    async def commit(i: int) -> tuple[int, bool]:
        try:
            outcomes = await groups.commit_offsets(
                "app", "", None, -1, commits(("orders", i % 3, i)), api_version=9
            )
        except KafkaError:
            return i, False
        return i, all(code == ErrorCode.none for _, code in outcomes)

    results = await asyncio.gather(*(commit(i) for i in range(1, 41)))
    succeeded = [i for i, ok in results if ok]
    if fail:
        assert len(succeeded) < 40, "an injected sync failure was not reported"
    else:
        assert len(succeeded) == 40
    expected = {0: 0}
    for i in succeeded:  # submitted in this order, applied in this order
        expected[i % 3] = i
    [(_, _, fetched)] = groups.fetch_offsets("app", [("orders", [0, 1, 2], None)])
    in_memory = {f.partition: f.offset for f in fetched if f.offset >= 0}
    assert in_memory == expected
    again = coordinator(log)
    [(_, _, replayed)] = again.fetch_offsets("app", [("orders", [0, 1, 2], None)])
    assert {f.partition: f.offset for f in replayed if f.offset >= 0} == in_memory
