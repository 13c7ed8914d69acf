"""Only initialized share partitions are assigned (Kafka 4.2, KAFKA-18827).

The sans-IO `ShareGroup` first (an injected `now_ms`, no sockets), then the
`GroupCoordinator` over an in-memory persister whose InitializeShareGroupState can be
held or made to fail: members that join a new group before its share state is
initialized get nothing, and split the partitions once it is durable; a failed
initialization leaves the partitions unassigned and a later heartbeat retries it.
"""

from __future__ import annotations

import asyncio
import errno
import os
import uuid
from collections.abc import Sequence

from coordinator.group_config import GroupConfig, GroupConfigStore
from coordinator.group_coordinator import INITIALIZE_WAIT_MS, GroupCoordinator
from coordinator.group_records import decode, encode
from coordinator.share_group import (
    HeartbeatResult,
    ShareGroup,
    ShareGroupMetadataRecord,
    ShareGroupStatePartitionMetadataRecord,
    ShareGroupTombstone,
    TopicMetadata,
)
from coordinator.share_persister import InMemoryPersister
from coordinator.share_state import UNINITIALIZED_START_OFFSET, ShareStateKey
from persister.clock import ManualClock
from persister.coordinator_log import KeyValue, MemoryRecordLog
from protocol.errors import ErrorCode, KafkaError

T1 = uuid.UUID(int=1)
T2 = uuid.UUID(int=2)
TOPICS = {T1: TopicMetadata(T1, "t1", 4), T2: TopicMetadata(T2, "t2", 2)}
CONFIG = GroupConfig()
RETRY_MS = CONFIG.initialize_retry_interval_ms
ALL_T1 = {T1: frozenset(range(4))}


def beat(
    group: ShareGroup,
    member_id: str,
    epoch: int,
    names: list[str] | None = None,
    now_ms: int = 0,
) -> HeartbeatResult:
    """Heartbeat and replay the records, as the runtime does."""
    result = group.heartbeat(
        member_id, epoch, names, None, "client", "/127.0.0.1", TOPICS, now_ms, CONFIG
    )
    group.replay_all(result.records)
    return result


def join(group: ShareGroup, member_id: str, now_ms: int = 0) -> HeartbeatResult:
    return beat(group, member_id, 0, ["t1"], now_ms)


def parts(assignment: dict[uuid.UUID, frozenset[int]] | None) -> set[int]:
    return set() if assignment is None else set(assignment.get(T1, frozenset()))


# -- the sans-IO group -------------------------------------------------------------


def test_members_joining_a_new_group_get_nothing_until_its_state_is_initialized() -> None:
    group = ShareGroup("g")
    a = join(group, "a")
    # The first heartbeat starts the initialization of every subscribed partition ...
    assert a.initialize == ALL_T1
    assert group.initializing == ALL_T1
    # ... and assigns nothing while it is under way.
    assert a.assignment == {}
    b = join(group, "b", now_ms=10)
    assert b.initialize == {}  # under way already: not started twice
    assert b.assignment == {}
    assert group.target_assignment == {"a": {}, "b": {}}


def test_initialized_state_bumps_the_epoch_and_members_split_the_partitions() -> None:
    group = ShareGroup("g")
    a, b = join(group, "a"), join(group, "b", now_ms=10)
    epoch = group.group_epoch
    records = group.mark_initialized(ALL_T1)
    assert isinstance(records[0], ShareGroupStatePartitionMetadataRecord)
    assert [r.epoch for r in records if isinstance(r, ShareGroupMetadataRecord)] == [epoch + 1]
    group.replay_all(records)
    assert group.initialized == ALL_T1 and group.initializing == {}
    assert group.assignment_epoch == epoch + 1
    # Each member takes its half on its next heartbeat.
    a2 = beat(group, "a", a.member_epoch, now_ms=5000)
    b2 = beat(group, "b", b.member_epoch, now_ms=5000)
    assert a2.member_epoch == b2.member_epoch == epoch + 1
    assert len(parts(a2.assignment)) == len(parts(b2.assignment)) == 2
    assert parts(a2.assignment) | parts(b2.assignment) == {0, 1, 2, 3}


def test_marking_state_initialized_in_an_empty_group_bumps_nothing() -> None:
    group = ShareGroup("g")
    group.replay_all(group.mark_initializing(ALL_T1, 0))
    records = group.mark_initialized(ALL_T1)
    assert [type(r) for r in records] == [ShareGroupStatePartitionMetadataRecord]


def test_partially_initialized_topic_assigns_only_the_initialized_partitions() -> None:
    group = ShareGroup("g")
    join(group, "a")
    group.replay_all(group.mark_initialized({T1: [0, 2]}))
    assert group.target_assignment["a"] == {T1: frozenset({0, 2})}
    assert group.initializing == {T1: frozenset({1, 3})}


def test_failed_initialization_is_unassigned_and_retried_by_the_next_heartbeat() -> None:
    group = ShareGroup("g")
    a = join(group, "a")
    # InitializeShareGroupState failed: the partitions are forgotten (Kafka's
    # uninitializeShareGroupState), not assigned.
    group.replay_all(group.mark_uninitialized(ALL_T1))
    assert group.initializing == {} and group.initialized == {}
    again = beat(group, "a", a.member_epoch, now_ms=100)
    assert again.initialize == ALL_T1
    assert parts(again.assignment) == set()
    assert group.target_assignment["a"] == {}


def test_initialization_lost_midway_is_retried_after_the_retry_interval() -> None:
    group = ShareGroup("g")
    a = join(group, "a", now_ms=1_000)
    # Neither mark_initialized nor mark_uninitialized was written (both writes failed).
    assert beat(group, "a", a.member_epoch, now_ms=1_000 + RETRY_MS - 1).initialize == {}
    late = beat(group, "a", a.member_epoch, now_ms=1_000 + RETRY_MS)
    assert late.initialize == ALL_T1
    assert group.target_assignment["a"] == {}
    # The retry restarts the interval.
    assert beat(group, "a", a.member_epoch, now_ms=1_000 + RETRY_MS + 1).initialize == {}


def test_retry_interval_is_at_least_offsets_commit_timeout() -> None:
    from coordinator.group_config import ShareGroupBrokerConfig

    broker = ShareGroupBrokerConfig.from_mapping({"group.share.initialize.retry.interval.ms": 10})
    assert GroupConfig.effective({}, broker).initialize_retry_interval_ms == 5000
    assert GroupConfig().initialize_retry_interval_ms == 30_000


def test_heartbeat_bumps_when_initialized_partitions_are_not_in_the_target() -> None:
    """Kafka 4.2's initializedAssignmentPending: state initialized by a write that did
    not recompute the target (e.g. an older log) is assigned by the next heartbeat."""
    group = ShareGroup("g")
    a = join(group, "a")
    group.replay(ShareGroupStatePartitionMetadataRecord("g", {}, ALL_T1))
    epoch = group.group_epoch
    result = beat(group, "a", a.member_epoch)
    assert group.group_epoch == epoch + 1
    assert parts(result.assignment) == {0, 1, 2, 3}
    # Once the target holds them, heartbeats bump nothing.
    assert beat(group, "a", result.member_epoch).records == []


def test_initialized_topics_not_subscribed_do_not_bump() -> None:
    group = ShareGroup("g")
    a = join(group, "a")
    group.replay(ShareGroupStatePartitionMetadataRecord("g", {}, {T2: frozenset({0, 1})}))
    epoch = group.group_epoch
    beat(group, "a", a.member_epoch)
    assert group.group_epoch == epoch


def test_replay_rebuilds_initializing_and_initialized_and_load_restarts_the_interval() -> None:
    group = ShareGroup("g")
    log = list(join(group, "a").records)
    more = group.mark_initialized({T1: [0, 1]})
    group.replay_all(more)
    log += more
    fresh = ShareGroup("g")
    for record in log:
        for key, value in encode(record):
            decoded = decode(key, value)
            assert decoded is not None
            fresh.replay(decoded)
    assert fresh.initialized == {T1: frozenset({0, 1})}
    assert fresh.initializing == {T1: frozenset({2, 3})}
    assert fresh.target_assignment == group.target_assignment
    fresh.on_loaded(50_000, CONFIG)
    # Loaded at 50 s: the initialization under way is retried from then on.
    assert fresh.partitions_to_initialize(50_000 + RETRY_MS - 1, RETRY_MS) == {}
    assert fresh.partitions_to_initialize(50_000 + RETRY_MS, RETRY_MS) == {T1: frozenset({2, 3})}


def test_deleted_group_forgets_its_share_state_bookkeeping() -> None:
    group = ShareGroup("g")
    join(group, "a")
    group.replay_all(group.mark_initialized({T1: [0]}))
    group.replay(ShareGroupTombstone("g"))
    assert (group.initialized, group.initializing, group.deleting) == ({}, {}, frozenset())


def test_deleted_topic_leaves_the_bookkeeping_and_the_target() -> None:
    group = ShareGroup("g")
    join(group, "a")
    group.replay_all(group.mark_initialized(ALL_T1))
    result = group.on_topics_changed({T2: TOPICS[T2]})
    assert result.deleted_topic_ids == {T1}
    group.replay_all(result.records)
    assert group.initialized == {} and group.initializing == {}
    assert group.target_assignment["a"] == {}


# -- the coordinator: background initialization, never awaited by a heartbeat ---------


class GatedPersister(InMemoryPersister):
    """InitializeShareGroupState (the group coordinator's initialize_if_absent) waits
    for `gate` (None: it does not) and fails while `fail` is set; every other call is
    the in-memory share coordinator's."""

    def __init__(self) -> None:
        super().__init__()
        self.gate: asyncio.Event | None = None
        self.fail = False
        self.initialized: list[tuple[ShareStateKey, int]] = []
        self.calls: list[ShareStateKey] = []

    async def initialize_if_absent(self, key: ShareStateKey, state_epoch: int = 0) -> bool:
        self.calls.append(key)
        if self.gate is not None:
            await self.gate.wait()
        if self.fail:
            raise KafkaError(ErrorCode.kafka_storage_error, "injected initialize failure")
        self.initialized.append((key, state_epoch))
        return await super().initialize_if_absent(key, state_epoch)


def coordinator(persister: GatedPersister, clock: ManualClock) -> GroupCoordinator:
    return GroupCoordinator(persister, lambda: TOPICS, GroupConfigStore(), clock=clock)


async def hb(groups: GroupCoordinator, member: str, epoch: int) -> HeartbeatResult:
    names = ["t1"] if epoch == 0 else None
    # Bounded: a heartbeat never waits for the share-state initialization.
    return await asyncio.wait_for(
        groups.heartbeat("g", member, epoch, names, None, "c", "/127.0.0.1"), timeout=5
    )


async def test_members_that_join_together_split_the_partitions_once_state_is_durable() -> None:
    persister, clock = GatedPersister(), ManualClock()
    persister.gate = asyncio.Event()
    groups = coordinator(persister, clock)
    a = await hb(groups, "a", 0)
    b = await hb(groups, "b", 0)
    # The initialization is held: the heartbeats were answered, with nothing assigned.
    assert a.assignment == {} and b.assignment == {}
    assert groups.groups["g"].initializing == ALL_T1
    assert not groups.is_initialized("g", T1, 0)
    persister.gate.set()
    await asyncio.wait_for(groups.settle(), timeout=5)
    assert all(groups.is_initialized("g", T1, p) for p in range(4))
    # InitializeShareGroupState: state epoch the group epoch, start offset -1 (the
    # share-partition leader applies share.auto.offset.reset on first load).
    assert sorted(k.partition for k, _ in persister.initialized) == [0, 1, 2, 3]
    assert {epoch for _, epoch in persister.initialized} == {a.member_epoch}
    summary = await persister.read_summary(ShareStateKey("g", T1, 0))
    assert (summary.state_epoch, summary.start_offset) == (
        a.member_epoch,
        UNINITIALIZED_START_OFFSET,
    )
    a2 = await hb(groups, "a", a.member_epoch)
    b2 = await hb(groups, "b", b.member_epoch)
    assert (len(parts(a2.assignment)), len(parts(b2.assignment))) == (2, 2)
    assert parts(a2.assignment) | parts(b2.assignment) == {0, 1, 2, 3}
    await groups.stop()


async def test_failed_initialization_stays_unassigned_and_a_later_heartbeat_retries() -> None:
    persister, clock = GatedPersister(), ManualClock()
    persister.fail = True
    groups = coordinator(persister, clock)
    a = await hb(groups, "a", 0)
    await asyncio.wait_for(groups.settle(), timeout=5)
    group = groups.groups["g"]
    assert group.initialized == {} and group.initializing == {}
    again = await hb(groups, "a", a.member_epoch)
    assert parts(again.assignment) == set()
    await asyncio.wait_for(groups.settle(), timeout=5)
    assert group.target_assignment["a"] == {}
    # The share coordinator recovers: the next heartbeat starts it again, and it lands.
    persister.fail = False
    await hb(groups, "a", again.member_epoch)
    await asyncio.wait_for(groups.settle(), timeout=5)
    assert group.initialized == ALL_T1
    assert parts((await hb(groups, "a", again.member_epoch)).assignment) == {0, 1, 2, 3}
    await groups.stop()


async def test_fetch_of_a_partition_waits_boundedly_for_a_held_initialization() -> None:
    """ensure_initialized (a ShareFetch's load) waits at most INITIALIZE_WAIT_MS on the
    clock for the initialization under way, then initializes the partition itself."""
    persister, clock = GatedPersister(), ManualClock()
    persister.gate = asyncio.Event()
    groups = coordinator(persister, clock)
    await hb(groups, "a", 0)
    calls = len(persister.calls)
    load = asyncio.ensure_future(groups.ensure_initialized("g", T1, 1))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not load.done() and len(persister.calls) == calls  # waiting, not initializing
    clock.advance(INITIALIZE_WAIT_MS - 1)
    for _ in range(5):
        await asyncio.sleep(0)
    assert not load.done() and len(persister.calls) == calls
    clock.advance(1)
    for _ in range(5):
        await asyncio.sleep(0)
    # Past its bounded wait the fetch initializes the partition itself (held by the gate).
    assert len(persister.calls) == calls + 1
    persister.gate.set()
    await asyncio.wait_for(load, timeout=5)
    await asyncio.wait_for(groups.settle(), timeout=5)
    assert groups.is_initialized("g", T1, 1)
    await groups.stop()


async def test_restart_finishes_an_initialization_cut_short_and_assigns_it() -> None:
    """The initializing set is durable (ShareGroupStatePartitionMetadata): a coordinator
    that stops before the state is initialized leaves the partitions initializing and
    unassigned; the next one replays that, initializes them and assigns them."""
    log, persister, clock = MemoryRecordLog(), GatedPersister(), ManualClock()
    persister.gate = asyncio.Event()
    first = GroupCoordinator(persister, lambda: TOPICS, GroupConfigStore(), log, clock=clock)
    first.load()
    joined = await hb(first, "a", 0)
    await first.stop()  # the held initialization is cancelled: nothing marked initialized
    persister.gate = None
    second = GroupCoordinator(persister, lambda: TOPICS, GroupConfigStore(), log, clock=clock)
    second.load()
    group = second.groups["g"]
    assert group.initializing == ALL_T1 and group.initialized == {}
    assert group.target_assignment["a"] == {}
    second.start()
    await asyncio.wait_for(second.settle(), timeout=5)
    assert group.initialized == ALL_T1 and group.initializing == {}
    assert parts(group.target_assignment["a"]) == {0, 1, 2, 3}
    assert parts((await hb(second, "a", joined.member_epoch)).assignment) == {0, 1, 2, 3}
    await second.stop()


class FailingLog(MemoryRecordLog):
    """A group log whose next `fail_writes` appends fail (a full disk)."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_writes = 0

    def write(self, records: Sequence[KeyValue]) -> int:
        if self.fail_writes:
            self.fail_writes -= 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(records)


async def test_lost_bookkeeping_leaves_partitions_unassigned_until_the_retry_interval() -> None:
    """The state was initialized but `initialized` could not be written: the partitions
    stay `initializing`, unassigned; a heartbeat once the retry interval has passed
    initializes them again (the state is kept) and they are assigned."""
    log, persister, clock = FailingLog(), GatedPersister(), ManualClock()
    persister.gate = asyncio.Event()
    groups = GroupCoordinator(persister, lambda: TOPICS, GroupConfigStore(), log, clock=clock)
    groups.load()
    a = await hb(groups, "a", 0)
    log.fail_writes = 1  # mark_initialized
    persister.gate.set()
    await asyncio.wait_for(groups.settle(), timeout=5)
    group = groups.groups["g"]
    assert group.initializing == ALL_T1 and group.initialized == {}
    clock.advance(RETRY_MS - 1)
    early = await hb(groups, "a", a.member_epoch)
    await asyncio.wait_for(groups.settle(), timeout=5)
    assert parts(early.assignment) == set() and group.initialized == {}
    clock.advance(1)
    await hb(groups, "a", a.member_epoch)
    await asyncio.wait_for(groups.settle(), timeout=5)
    assert group.initialized == ALL_T1
    assert parts((await hb(groups, "a", a.member_epoch)).assignment) == {0, 1, 2, 3}
    await groups.stop()


async def test_group_deleted_while_its_initialization_is_held_leaves_no_share_state() -> None:
    """The last member leaves and the group is deleted while InitializeShareGroupState
    is still under way: once that lands, no share state of the deleted group may be
    left in the share coordinator (a group of that name made later would find it)."""
    persister, clock = GatedPersister(), ManualClock()
    persister.gate = asyncio.Event()
    groups = coordinator(persister, clock)
    a = await hb(groups, "a", 0)
    await asyncio.wait_for(groups.heartbeat("g", "a", -1, None, None, "c", "/127.0.0.1"), timeout=5)
    assert a.member_epoch > 0
    deleting = asyncio.ensure_future(groups.delete_groups(["g"]))
    for _ in range(10):
        await asyncio.sleep(0)
    persister.gate.set()  # the initialization calling the share coordinator lands
    assert await asyncio.wait_for(deleting, timeout=5) == [("g", None)]
    await asyncio.wait_for(groups.settle(), timeout=5)
    assert "g" not in groups.groups
    left = [p for p in range(4) if persister.shard.state(ShareStateKey("g", T1, p)) is not None]
    assert left == []
    await groups.stop()


async def test_topic_deleted_while_its_initialization_is_held_leaves_no_share_state() -> None:
    """A subscribed topic is deleted while InitializeShareGroupState for it is under way:
    once that lands, the group must neither count the dead topic initialized nor keep
    share state of it in the share coordinator."""
    persister, clock = GatedPersister(), ManualClock()
    persister.gate = asyncio.Event()
    topics = dict(TOPICS)
    groups = GroupCoordinator(persister, lambda: topics, GroupConfigStore(), clock=clock)
    await hb(groups, "a", 0)
    del topics[T1]
    changed = asyncio.ensure_future(groups.on_topics_changed())
    for _ in range(10):
        await asyncio.sleep(0)
    persister.gate.set()  # the initialization calling the share coordinator lands
    await asyncio.wait_for(changed, timeout=5)
    await asyncio.wait_for(groups.settle(), timeout=5)
    group = groups.groups["g"]
    assert T1 not in group.initialized and T1 not in group.initializing
    left = [p for p in range(4) if persister.shard.state(ShareStateKey("g", T1, p)) is not None]
    assert left == []
    await groups.stop()


async def test_member_joining_while_group_deletion_waits_keeps_its_share_state() -> None:
    """DeleteGroups waits for initializations under way (here another group's) before
    deleting share state; a member joining the group meanwhile takes its topics back
    out of `deleting`. Their state must then be kept (the group answers NON_EMPTY_GROUP),
    not deleted under a group that counts it initialized."""
    persister, clock = GatedPersister(), ManualClock()
    groups = coordinator(persister, clock)
    a = await hb(groups, "a", 0)
    await asyncio.wait_for(groups.settle(), timeout=5)
    await hb(groups, "a", -1)
    assert groups.groups["g"].initialized == ALL_T1 and not groups.groups["g"].members
    persister.gate = asyncio.Event()
    await asyncio.wait_for(
        groups.heartbeat("h", "x", 0, ["t1"], None, "c", "/127.0.0.1"), timeout=5
    )  # h's initialization is held
    deleting = asyncio.ensure_future(groups.delete_groups(["g"]))
    for _ in range(10):
        await asyncio.sleep(0)
    assert groups.groups["g"].deleting == frozenset({T1})
    b = await hb(groups, "b", 0)  # joins g while the deletion waits
    persister.gate.set()
    ((_, error),) = await asyncio.wait_for(deleting, timeout=5)
    assert error is not None and error.code == ErrorCode.non_empty_group
    await asyncio.wait_for(groups.settle(), timeout=5)
    group = groups.groups["g"]
    assert group.initialized == ALL_T1 and "b" in group.members and a.member_epoch > 0
    kept = [p for p in range(4) if persister.shard.state(ShareStateKey("g", T1, p)) is not None]
    assert kept == [0, 1, 2, 3]
    assert parts((await hb(groups, "b", b.member_epoch)).assignment) == {0, 1, 2, 3}
    await groups.stop()


class DeleteGatedPersister(GatedPersister):
    """DeleteShareGroupState waits for `delete_gate` (None: it does not)."""

    def __init__(self) -> None:
        super().__init__()
        self.delete_gate: asyncio.Event | None = None

    async def delete_state(self, key: ShareStateKey) -> None:
        if self.delete_gate is not None:
            await self.delete_gate.wait()
        await super().delete_state(key)


async def test_member_joining_while_group_state_is_deleted_gets_it_initialized_again() -> None:
    """A member joins while DeleteGroups is deleting the group's share state: the group
    stays (NON_EMPTY_GROUP) and counted the topic initialized (its state still existed
    when the join initialized it), but the deletion then removed it. It must be
    initialized again, not assigned with no state behind it."""
    persister, clock = DeleteGatedPersister(), ManualClock()
    groups = coordinator(persister, clock)
    await hb(groups, "a", 0)
    await asyncio.wait_for(groups.settle(), timeout=5)
    await hb(groups, "a", -1)
    persister.delete_gate = asyncio.Event()
    deleting = asyncio.ensure_future(groups.delete_groups(["g"]))
    for _ in range(10):
        await asyncio.sleep(0)
    b = await hb(groups, "b", 0)
    await asyncio.wait_for(groups.settle(), timeout=5)
    persister.delete_gate.set()
    ((_, error),) = await asyncio.wait_for(deleting, timeout=5)
    assert error is not None and error.code == ErrorCode.non_empty_group
    await hb(groups, "b", b.member_epoch)  # the next heartbeat initializes what is missing
    await asyncio.wait_for(groups.settle(), timeout=5)
    group = groups.groups["g"]
    assert group.initialized == ALL_T1
    kept = [p for p in range(4) if persister.shard.state(ShareStateKey("g", T1, p)) is not None]
    assert kept == [0, 1, 2, 3]
    await groups.stop()


async def test_member_joining_while_offsets_are_deleted_gets_the_state_initialized_again() -> None:
    """DeleteShareGroupOffsets, as DeleteGroups: a member joining while the topic's state
    is being deleted counts the topic initialized (its state still existed); once the
    deletion removed it, the group must initialize it again."""
    persister, clock = DeleteGatedPersister(), ManualClock()
    groups = coordinator(persister, clock)
    await hb(groups, "a", 0)
    await asyncio.wait_for(groups.settle(), timeout=5)
    await hb(groups, "a", -1)
    persister.delete_gate = asyncio.Event()
    deleting = asyncio.ensure_future(groups.delete_offsets("g", ["t1"]))
    for _ in range(10):
        await asyncio.sleep(0)
    b = await hb(groups, "b", 0)
    await asyncio.wait_for(groups.settle(), timeout=5)
    persister.delete_gate.set()
    await asyncio.wait_for(deleting, timeout=5)
    await hb(groups, "b", b.member_epoch)  # the next heartbeat initializes what is missing
    await asyncio.wait_for(groups.settle(), timeout=5)
    group = groups.groups["g"]
    assert group.initialized == ALL_T1 and group.deleting == frozenset()
    kept = [p for p in range(4) if persister.shard.state(ShareStateKey("g", T1, p)) is not None]
    assert kept == [0, 1, 2, 3]
    await groups.stop()
