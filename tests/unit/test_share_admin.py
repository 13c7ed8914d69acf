"""The group coordinator's share-group admin operations (KIP-932 admin RPCs): describe,
reset (alter) and delete share-group offsets, delete groups; their failures and what a
crash between their durable steps leaves."""

from __future__ import annotations

import asyncio
import errno
import uuid
from collections.abc import Sequence

import pytest

from coordinator.assignor import TopicMetadata
from coordinator.group_config import AlterConfigOp, GroupConfigStore
from coordinator.group_coordinator import GroupCoordinator, PartitionOffsets, PartitionResult
from coordinator.share_persister import InMemoryPersister
from coordinator.share_state import PersistedBatch, ShareStateKey
from persister.clock import ManualClock
from persister.coordinator_log import KeyValue, MemoryRecordLog
from protocol.errors import ErrorCode, KafkaError

T1 = uuid.UUID(int=1)
T2 = uuid.UUID(int=2)
TOPICS = {T1: TopicMetadata(T1, "t1", 2), T2: TopicMetadata(T2, "t2", 1)}
END_OFFSETS = {(T1, 0): 100, (T1, 1): 50, (T2, 0): 10}


class Crash(BaseException):
    """The process dies here: nothing after this point runs."""


class Disk(MemoryRecordLog):
    """The group log as a disk that can refuse the next write (EIO)."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_next = False

    def write(self, records: Sequence[KeyValue]) -> int:
        if self.fail_next:
            self.fail_next = False
            raise OSError(errno.EIO, "Input/output error")
        return super().write(records)


class Persister(InMemoryPersister):
    """The share coordinator; `fail_delete`/`crash_delete` make DeleteShareGroupState fail."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_delete: KafkaError | None = None
        self.crash_delete = False
        self.fail_initialize: KafkaError | None = None

    async def delete_state(self, key: ShareStateKey) -> None:
        if self.crash_delete:
            raise Crash()
        if self.fail_delete is not None:
            raise self.fail_delete
        await super().delete_state(key)

    async def initialize_state(
        self, key: ShareStateKey, state_epoch: int, start_offset: int
    ) -> None:
        if self.fail_initialize is not None:
            raise self.fail_initialize
        await super().initialize_state(key, state_epoch, start_offset)

    async def reset_state(self, key: ShareStateKey, start_offset: int) -> int:
        if self.fail_initialize is not None:
            raise self.fail_initialize
        return await super().reset_state(key, start_offset)


def coordinator(
    persister: Persister | None = None, disk: Disk | None = None
) -> tuple[GroupCoordinator, Persister, Disk]:
    persister = persister or Persister()
    disk = disk or Disk()
    groups = GroupCoordinator(
        persister, lambda: TOPICS, GroupConfigStore(), disk, clock=ManualClock()
    )
    groups.load()
    return groups, persister, disk


async def consumed_then_left(groups: GroupCoordinator, group_id: str = "g") -> None:
    """A member subscribed to t1, its partitions got share state, then it left."""
    await groups.heartbeat(group_id, "m1", 0, ["t1"], None, "c", "/127.0.0.1")
    for p in (0, 1):
        await groups.ensure_initialized(group_id, T1, p)
    await groups.heartbeat(group_id, "m1", 1, None, None, "c", "/127.0.0.1")
    await groups.heartbeat(group_id, "m1", -1, None, None, "c", "/127.0.0.1")
    assert groups.groups[group_id].state.value == "Empty"


def end_offset(topic_id: uuid.UUID, partition: int) -> int | None:
    return END_OFFSETS.get((topic_id, partition))


# ------------------------------------------------------------------- describe


async def test_describe_reports_start_offset_leader_epoch_and_lag_from_the_summary() -> None:
    groups, persister, _ = coordinator()
    await consumed_then_left(groups)
    key = ShareStateKey("g", T1, 0)
    # What a leader wrote: SPSO 40, 3 records above it done (Kafka's lag subtracts them).
    epoch = (await persister.read_state(key, 0)).state_epoch
    await persister.write_state(
        key, epoch, 0, 40, [PersistedBatch(41, 43, 2, 1)], delivery_complete_count=3
    )
    topics = await groups.describe_offsets("g", None, end_offset)
    assert [(t.name, t.topic_id) for t in topics] == [("t1", T1)]
    # Partition 1 was initialized but never consumed: start -1, count unknown, lag -1.
    assert topics[0].partitions == (
        PartitionOffsets(0, 40, 0, 100 - 40 - 3),
        PartitionOffsets(1, -1, 0, -1),
    )


async def test_describe_unknown_group_topic_and_partition_as_kafka() -> None:
    groups, _, _ = coordinator()
    # All topics of a group that does not exist: none (Kafka reads its empty metadata).
    assert await groups.describe_offsets("nope", None, end_offset) == []
    # Named topics are read whatever the group; no state is start -1, epoch 0, lag -1.
    named = await groups.describe_offsets("nope", [("t1", [0, 7]), ("missing", [3])], end_offset)
    assert [(t.name, t.topic_id) for t in named] == [("t1", T1), ("missing", None)]
    assert named[0].partitions == (PartitionOffsets(0), PartitionOffsets(7))
    assert named[1].partitions == (PartitionOffsets(3),)


# ---------------------------------------------------------------------- alter


class SlowFsync(MemoryRecordLog):
    """The share-state log with an fsync that waits for `done`."""

    def __init__(self) -> None:
        super().__init__()
        self.done = asyncio.Event()

    async def sync(self) -> None:
        await self.done.wait()


async def test_concurrent_alters_get_rising_state_epochs_and_the_last_offset_wins() -> None:
    """Each reset reads the stored state epoch in the turn that writes epoch + 1, so of
    two resets at once the second fences the state the first handed out; reading the
    epoch before waiting for the turn gave both the same epoch, and a leader that loaded
    the first reset kept writing over the second."""
    disk = SlowFsync()
    persister = Persister()
    persister.runtime.record_log = disk
    groups, _, _ = coordinator(persister)
    key = ShareStateKey("g", T1, 0)
    first = asyncio.ensure_future(groups.alter_offsets("g", [("t1", [(0, 3)])]))
    second = asyncio.ensure_future(groups.alter_offsets("g", [("t1", [(0, 7)])]))
    for _ in range(20):
        await asyncio.sleep(0)
    disk.done.set()
    await asyncio.gather(first, second)
    summary = await persister.read_summary(key)
    assert (summary.state_epoch, summary.start_offset) == (2, 7)
    with pytest.raises(KafkaError) as err:  # the first reset's epoch is fenced
        await persister.write_state(key, 1, 0, 3, [])
    assert err.value.code == ErrorCode.fenced_state_epoch


async def test_background_initialization_never_clobbers_a_reset() -> None:
    """Initializing a newly subscribed partition checks for state in the turn that
    writes it: a reset queued ahead of it keeps its offset."""
    disk = SlowFsync()
    persister = Persister()
    persister.runtime.record_log = disk
    key = ShareStateKey("g", T1, 0)
    reset = asyncio.ensure_future(persister.reset_state(key, 9))
    fresh = asyncio.ensure_future(persister.initialize_if_absent(key))
    for _ in range(5):
        await asyncio.sleep(0)
    disk.done.set()
    assert await asyncio.gather(reset, fresh) == [1, False]
    summary = await persister.read_summary(key)
    assert (summary.state_epoch, summary.start_offset) == (1, 9)


async def test_alter_resets_state_with_a_bumped_epoch_and_marks_it_initialized() -> None:
    groups, persister, _ = coordinator()
    dropped: list[tuple[str, uuid.UUID]] = []
    groups.state_deleted_hooks.append(lambda g, t: dropped.append((g, t)))
    await consumed_then_left(groups)
    key = ShareStateKey("g", T1, 0)
    # Initialized with the group epoch as its state epoch (Kafka's heartbeat does so).
    epoch = (await persister.read_state(key, 0)).state_epoch
    assert epoch >= 1
    await persister.write_state(key, epoch, 0, 5, [PersistedBatch(6, 9, 0, 3)])
    results = await groups.alter_offsets("g", [("t1", [(0, 0)]), ("t2", [(0, 4)])])
    assert [(r.name, r.partitions) for r in results] == [
        ("t1", (PartitionResult(0),)),
        ("t2", (PartitionResult(0),)),
    ]
    state = await persister.read_state(key, 0)
    # Delivery counts start over: no batches, start 0, a state epoch above the old one.
    assert (state.state_epoch, state.start_offset, state.batches) == (epoch + 1, 0, [])
    assert state.delivery_complete_count == 0
    # A never-consumed topic is reset too, and the group records both as initialized.
    assert (await persister.read_summary(ShareStateKey("g", T2, 0))).start_offset == 4
    group = groups.groups["g"]
    assert group.initialized == {T1: frozenset({0, 1}), T2: frozenset({0})}
    assert group.initializing == {}
    assert ("g", T1) in dropped and ("g", T2) in dropped
    # A leader still writing with the old state epoch is fenced (it reloads).
    with pytest.raises(KafkaError) as err:
        await persister.write_state(key, epoch, 0, 9, [])
    assert err.value.code == ErrorCode.fenced_state_epoch


async def test_alter_per_partition_errors_and_a_new_group() -> None:
    groups, persister, _ = coordinator()
    results = await groups.alter_offsets(
        "fresh", [("t1", [(0, 3), (9, 0), (1, -2)]), ("missing", [(0, 0)])]
    )
    codes = {(r.name, p.partition): p.error for r in results for p in r.partitions}
    assert codes == {
        ("t1", 0): ErrorCode.none,
        ("t1", 9): ErrorCode.unknown_topic_or_partition,
        ("t1", 1): ErrorCode.invalid_request,
        ("missing", 0): ErrorCode.unknown_topic_or_partition,
    }
    # As Kafka, the group is created Empty; only the valid partition changed.
    assert groups.groups["fresh"].initialized == {T1: frozenset({0})}
    assert (await persister.read_summary(ShareStateKey("fresh", T1, 1))).start_offset == -1


async def test_alter_of_a_group_with_members_is_non_empty_and_changes_nothing() -> None:
    groups, _persister, disk = coordinator()
    await groups.heartbeat("g", "m1", 0, ["t1"], None, "c", "/127.0.0.1")
    before = list(disk.records)
    with pytest.raises(KafkaError) as err:
        await groups.alter_offsets("g", [("t1", [(0, 0)])])
    assert err.value.code == ErrorCode.non_empty_group
    assert "g" in (err.value.message or "")
    assert disk.records == before


async def test_alter_naming_a_partition_twice_is_invalid_request() -> None:
    groups, _, _ = coordinator()
    with pytest.raises(KafkaError) as err:
        await groups.alter_offsets("g", [("t1", [(0, 0), (0, 5)])])
    assert err.value.code == ErrorCode.invalid_request


async def test_alter_whose_group_write_fails_is_not_coordinator_and_changes_nothing() -> None:
    groups, persister, disk = coordinator()
    await consumed_then_left(groups)
    disk.fail_next = True
    with pytest.raises(KafkaError) as err:
        await groups.alter_offsets("g", [("t1", [(0, 7)])])
    assert err.value.code == ErrorCode.not_coordinator
    assert (await persister.read_summary(ShareStateKey("g", T1, 0))).start_offset == -1
    assert groups.groups["g"].initializing == {}


async def test_alter_whose_share_state_write_fails_is_storage_error_and_recovers() -> None:
    groups, persister, disk = coordinator()
    await consumed_then_left(groups)
    persister.fail_initialize = KafkaError(ErrorCode.kafka_storage_error, "fsync failed")
    with pytest.raises(KafkaError) as err:
        await groups.alter_offsets("g", [("t1", [(0, 7)])])
    assert err.value.code == ErrorCode.kafka_storage_error
    # Memory did not run ahead: the old state stands; the partition waits `initializing`.
    assert (await persister.read_summary(ShareStateKey("g", T1, 0))).start_offset == -1
    assert groups.groups["g"].initializing == {T1: frozenset({0})}
    persister.fail_initialize = None
    # A restart finishes the bookkeeping without clobbering the state.
    restarted, _, _ = coordinator(persister, disk)
    restarted.start()
    await restarted.settle()
    assert restarted.groups["g"].initializing == {}
    assert restarted.groups["g"].initialized == {T1: frozenset({0, 1})}
    await restarted.stop()


# ------------------------------------------------------------- delete offsets


async def test_delete_offsets_removes_state_and_the_groups_record_of_it() -> None:
    groups, persister, _ = coordinator()
    await consumed_then_left(groups)
    results = await groups.delete_offsets("g", ["t1", "t2", "missing"])
    # t2 exists but the group has no state for it: Kafka's "no offset information".
    assert {r.name: (r.error, r.topic_id) for r in results} == {
        "t1": (ErrorCode.none, T1),
        "t2": (ErrorCode.unknown_topic_or_partition, T2),
        "missing": (ErrorCode.unknown_topic_or_partition, None),
    }
    assert persister.shard.state(ShareStateKey("g", T1, 0)) is None
    group = groups.groups["g"]
    assert (group.initialized, group.deleting) == ({}, frozenset())


async def test_delete_offsets_of_unknown_or_non_empty_group() -> None:
    groups, _, _ = coordinator()
    with pytest.raises(KafkaError) as err:
        await groups.delete_offsets("nope", ["t1"])
    assert err.value.code == ErrorCode.group_id_not_found
    await groups.heartbeat("g", "m1", 0, ["t1"], None, "c", "/127.0.0.1")
    with pytest.raises(KafkaError) as err:
        await groups.delete_offsets("g", ["t1"])
    assert err.value.code == ErrorCode.non_empty_group


async def test_delete_offsets_whose_state_delete_fails_keeps_the_topic_deleting() -> None:
    groups, persister, _disk = coordinator()
    await consumed_then_left(groups)
    persister.fail_delete = KafkaError(ErrorCode.kafka_storage_error, "EIO")
    results = await groups.delete_offsets("g", ["t1"])
    assert [(r.name, r.error) for r in results] == [("t1", ErrorCode.kafka_storage_error)]
    assert groups.groups["g"].deleting == {T1}
    # A retry deletes every partition of a topic left `deleting`.
    persister.fail_delete = None
    results = await groups.delete_offsets("g", ["t1"])
    assert [(r.name, r.error) for r in results] == [("t1", ErrorCode.none)]
    assert groups.groups["g"].deleting == frozenset()
    assert persister.shard.state(ShareStateKey("g", T1, 1)) is None


# ---------------------------------------------------------------- delete groups


async def test_delete_groups_removes_group_state_durably_and_keeps_its_configs() -> None:
    groups, persister, disk = coordinator()
    await consumed_then_left(groups)
    await groups.alter_configs(
        "g", [AlterConfigOp("share.record.lock.duration.ms", 0, "20000")], False
    )
    await groups.heartbeat("busy", "m2", 0, ["t1"], None, "c", "/127.0.0.1")
    results = await groups.delete_groups(["g", "busy", "nope", "g"])
    codes = [(g, None if e is None else e.code) for g, e in results]
    assert codes == [
        ("g", None),
        ("busy", ErrorCode.non_empty_group),
        ("nope", ErrorCode.group_id_not_found),
    ]
    assert "g" not in groups.groups
    assert persister.shard.state(ShareStateKey("g", T1, 0)) is None
    # As in Kafka 4.2, whose DeleteGroups leaves the group's ConfigRecords alone.
    kept = {"share.record.lock.duration.ms": 20000}
    assert groups.configs.overrides("g") == kept
    # Replayed from the log (a restart): still gone, its configs still there.
    restarted, _, _ = coordinator(persister, disk)
    assert "g" not in restarted.groups and "busy" in restarted.groups
    assert restarted.configs.overrides("g") == kept


async def test_a_crash_between_delete_steps_leaves_an_empty_group_the_restart_cleans() -> None:
    groups, persister, disk = coordinator()
    await consumed_then_left(groups)
    persister.crash_delete = True
    with pytest.raises(Crash):
        await groups.delete_groups(["g"])
    # On disk: the group, Empty, its topics marked `deleting`; the share state untouched.
    persister.crash_delete = False
    restarted, _, _ = coordinator(persister, disk)
    assert restarted.groups["g"].deleting == {T1}
    assert restarted.groups["g"].initialized == {}
    assert persister.shard.state(ShareStateKey("g", T1, 0)) is not None
    # The restart finishes the state deletion; the group stays until DeleteGroups again.
    restarted.start()
    await restarted.settle()
    assert persister.shard.state(ShareStateKey("g", T1, 0)) is None
    assert restarted.groups["g"].deleting == frozenset()
    assert [(g, e) for g, e in await restarted.delete_groups(["g"])] == [("g", None)]
    await restarted.stop()


async def test_delete_group_whose_tombstone_write_fails_keeps_the_group() -> None:
    groups, _persister, disk = coordinator()
    await consumed_then_left(groups)
    real = groups._run_admin
    calls = 0

    async def second_write_fails(group_id, op):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        if calls == 2:
            disk.fail_next = True
        return await real(group_id, op)

    groups._run_admin = second_write_fails  # type: ignore[method-assign]
    [(_, error)] = await groups.delete_groups(["g"])
    assert error is not None and error.code == ErrorCode.not_coordinator
    assert "g" in groups.groups and groups.groups["g"].state.value == "Empty"
