"""The coordinator runtime: nothing applied before its fsync, failed writes undone, group
commit across keys, per-key serialization, compaction; for a toy table and for every
state machine that runs on it (share coordinator, share groups, group configs, cluster
metadata).

The disk fails on demand: `Disk` makes the next append (pwrite) or fsync of one record
log raise EIO or ENOSPC, or holds fsync rounds until the test lets them go.
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Hashable, Iterator
from pathlib import Path
from typing import Any

import pytest

import persister.segment
from coordinator import group_records
from coordinator.assignor import TopicMetadata
from coordinator.group_config import SET, AlterConfigOp, GroupConfigStore
from coordinator.group_coordinator import GroupCoordinator
from coordinator.metadata import MetadataStore, topic_record
from coordinator.runtime import CoordinatorRuntime, KeyCompaction, for_coordinator_rpc
from coordinator.share_persister import DurablePersister, InMemoryPersister
from coordinator.share_state import PersistedBatch, ShareStateKey
from persister.clock import ManualClock
from persister.commit import GroupCommit
from persister.coordinator_log import KeyValue, RecordLog, internal_log_config
from protocol.errors import ErrorCode, KafkaError
from protocol.records import decode_records, iter_batches

ERRNOS = [errno.EIO, errno.ENOSPC]
STAGES = ["append", "fsync"]
T1 = uuid.UUID(int=1)
TOPICS = {T1: TopicMetadata(T1, "t1", 2)}


# ------------------------------------------------------------------ a disk that fails


class _FailingOs:
    """`os` for persister.segment, whose pwrite fails when the Disk says so."""

    def __init__(self, disk: Disk) -> None:
        self._disk = disk

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def pwrite(self, fd: int, data: Any, offset: int) -> int:
        return self._disk.pwrite(fd, data, offset)


class Disk:
    """Faults for the record logs it is attached to (one test at a time)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.append_error: int | None = None
        self.fsync_error: int | None = None
        self.gate = threading.Event()
        self.gate.set()
        self.flushes_started = 0
        self.flushes = 0
        monkeypatch.setattr(persister.segment, "os", _FailingOs(self))

    def attach(self, record_log: RecordLog) -> RecordLog:
        real = record_log.log.flush

        def flush() -> None:
            self.flushes_started += 1
            self.gate.wait()
            self.flushes += 1
            code, self.fsync_error = self.fsync_error, None
            if code is not None:
                raise OSError(code, os.strerror(code))
            real()

        record_log.log.flush = flush  # type: ignore[method-assign]
        return record_log

    def pwrite(self, fd: int, data: Any, offset: int) -> int:
        code = self.append_error
        if code is None:
            return os.pwrite(fd, data, offset)
        self.append_error = None
        # Part of the batch reaches the file first, as a write that runs out of space does.
        os.pwrite(fd, bytes(memoryview(data)[: len(data) // 2]), offset)
        raise OSError(code, os.strerror(code))

    def fail(self, stage: str, code: int) -> None:
        if stage == "append":
            self.append_error = code
        else:
            self.fsync_error = code


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> Iterator[Disk]:
    faults = Disk(monkeypatch)
    yield faults
    faults.gate.set()  # a failed test must not leave an fsync waiting forever


@pytest.fixture
async def commit() -> AsyncIterator[GroupCommit]:
    group = GroupCommit()
    group.start()
    yield group
    await group.stop()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


async def until(condition: Callable[[], bool]) -> None:
    """Yield to the loop and the fsync thread until `condition` holds."""
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition never became true")


# ------------------------------------------------------------------ a toy state machine

Row = tuple[str, str | None]


class Table:
    """Keys to values; a None value deletes the key."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def replay(self, row: Row) -> None:
        key, value = row
        if value is None:
            self.values.pop(key, None)
        else:
            self.values[key] = value


def encode_row(row: Row) -> list[KeyValue]:
    return [(row[0].encode(), None if row[1] is None else row[1].encode())]


def decode_row(key: bytes | None, value: bytes | None) -> Row:
    assert key is not None
    return key.decode(), None if value is None else value.decode()


def row_keys(key: bytes | None, value: bytes | None) -> list[tuple[Hashable, bool]]:
    return [(key, value is None)]


class TableStore:
    def __init__(
        self, directory: Path, commit: GroupCommit, clock: ManualClock, segment_bytes: int
    ) -> None:
        self.table = Table()
        self.log = RecordLog(directory, commit, internal_log_config(segment_bytes), clock=clock)
        self.runtime: CoordinatorRuntime[Row] = CoordinatorRuntime(
            "table",
            self.log,
            encode=encode_row,
            decode=decode_row,
            replay=self.table.replay,
            clock=clock,
            compaction=KeyCompaction(row_keys, clock),
        )
        self.runtime.load()

    async def set(self, key: str, value: str | None) -> None:
        await self.runtime.run(key, lambda: ([(key, value)], None))


@pytest.fixture
def open_table(
    tmp_path: Path, commit: GroupCommit, clock: ManualClock, disk: Disk
) -> Iterator[Callable[..., TableStore]]:
    opened: list[TableStore] = []

    def open_(segment_bytes: int = 1 << 20) -> TableStore:
        store = TableStore(tmp_path / "table", commit, clock, segment_bytes)
        disk.attach(store.log)
        opened.append(store)
        return store

    yield open_
    disk.gate.set()
    for store in opened:
        store.runtime.close()


def reopen(store: TableStore, open_table: Callable[..., TableStore]) -> TableStore:
    store.runtime.close()
    return open_table()


# ------------------------------------------------------------------ the runtime


async def test_nothing_is_applied_before_the_fsync(
    open_table: Callable[..., TableStore], disk: Disk
) -> None:
    store = open_table()
    disk.gate.clear()
    op = asyncio.ensure_future(store.set("a", "1"))
    await until(lambda: disk.flushes_started == 1)
    assert store.table.values == {}
    disk.gate.set()
    await op
    assert store.table.values == {"a": "1"}


async def test_concurrent_operations_on_different_keys_share_an_fsync_round(
    open_table: Callable[..., TableStore], disk: Disk, commit: GroupCommit
) -> None:
    store = open_table()
    rounds = commit.rounds
    disk.gate.clear()
    first = asyncio.ensure_future(store.set("a", "1"))
    await until(lambda: disk.flushes_started == 1)
    later = [asyncio.ensure_future(store.set(k, "1")) for k in ("b", "c", "d")]
    await until(lambda: store.runtime.pending_writes == 4)
    disk.gate.set()
    await asyncio.gather(first, *later)
    # One round for the first writer, one shared by the three that wrote meanwhile.
    assert commit.rounds - rounds == 2
    assert disk.flushes == 2
    assert store.table.values == {"a": "1", "b": "1", "c": "1", "d": "1"}


async def test_operations_on_one_key_run_one_at_a_time_on_committed_state(
    open_table: Callable[..., TableStore], disk: Disk
) -> None:
    store = open_table()
    seen: list[str | None] = []

    def append_one() -> tuple[list[Row], None]:
        value = store.table.values.get("a")
        seen.append(value)
        return [("a", (value or "") + "x")], None

    disk.gate.clear()
    first = asyncio.ensure_future(store.runtime.run("a", append_one))
    second = asyncio.ensure_future(store.runtime.run("a", append_one))
    await until(lambda: disk.flushes_started == 1)
    await asyncio.sleep(0.01)
    assert seen == [None]  # the second waits for the first to be durable and applied
    disk.gate.set()
    await asyncio.gather(first, second)
    assert seen == [None, "x"]
    assert store.table.values == {"a": "xx"}
    assert store.runtime.keys_in_use == 0


async def test_applied_runs_after_the_replay_and_before_the_next_operation(
    open_table: Callable[..., TableStore], disk: Disk
) -> None:
    """The shell's effects of a change (opening a topic's logs) run in the order the
    operations were serialised: the next operation on the key computes, and its own
    effects run, only once the earlier one's have."""
    store = open_table()
    events: list[str] = []

    def put(value: str) -> Callable[[], tuple[list[Row], str]]:
        def op() -> tuple[list[Row], str]:
            events.append(f"op {value} sees {store.table.values.get('a')}")
            return [("a", value)], value

        return op

    def applied(value: str) -> None:
        events.append(f"applied {value} with {store.table.values.get('a')}")

    disk.gate.clear()
    first = asyncio.ensure_future(store.runtime.run("a", put("1"), applied=applied))
    second = asyncio.ensure_future(store.runtime.run("a", put("2"), applied=applied))
    await until(lambda: disk.flushes_started == 1)
    disk.gate.set()
    assert await asyncio.gather(first, second) == ["1", "2"]
    assert events == ["op 1 sees None", "applied 1 with 1", "op 2 sees 1", "applied 2 with 2"]

    def refused() -> tuple[list[Row], str]:
        raise KafkaError(ErrorCode.invalid_request, "no")

    with pytest.raises(KafkaError):
        await store.runtime.run("a", refused, applied=applied)
    disk.fail("fsync", errno.EIO)
    with pytest.raises(KafkaError):
        await store.runtime.run("a", put("3"), applied=applied)
    assert events[-1] == "op 3 sees 2"  # neither failed operation is applied


@pytest.mark.parametrize("code", ERRNOS, ids=errno.errorcode.get)
@pytest.mark.parametrize("stage", STAGES)
async def test_a_failed_write_changes_nothing_and_the_next_one_succeeds(
    open_table: Callable[..., TableStore], disk: Disk, stage: str, code: int
) -> None:
    store = open_table()
    await store.set("a", "1")
    end = store.log.end_offset
    disk.fail(stage, code)
    with pytest.raises(KafkaError) as failed:
        await store.set("a", "2")
    assert failed.value.code == ErrorCode.kafka_storage_error
    assert os.strerror(code) in failed.value.message
    assert store.table.values == {"a": "1"}
    assert store.log.end_offset == end
    await store.set("b", "3")
    assert store.table.values == {"a": "1", "b": "3"}
    live = dict(store.table.values)
    assert reopen(store, open_table).table.values == live


@pytest.mark.parametrize("stage", STAGES)
async def test_a_failed_write_that_rolled_a_segment_removes_it(
    open_table: Callable[..., TableStore], disk: Disk, stage: str
) -> None:
    store = open_table(segment_bytes=600)
    plog = store.log.log

    def active_size() -> int:
        return (plog.directory / f"{plog.segment_base_offsets[-1]:020d}.log").stat().st_size

    await store.set("k00", "v00")
    batch = active_size()
    i = 1
    while active_size() + batch <= 600:  # the next (same-sized) write rolls
        await store.set(f"k{i:02d}", "v00")
        i += 1
    segments, live = plog.segment_base_offsets, dict(store.table.values)
    disk.fail(stage, errno.ENOSPC)
    with pytest.raises(KafkaError):
        await store.set(f"k{i:02d}", "v00")
    assert plog.segment_base_offsets == segments
    assert len(list(plog.directory.glob("*.log"))) == len(segments)
    assert store.table.values == live
    await store.set(f"k{i:02d}", "v01")
    assert len(plog.segment_base_offsets) == len(segments) + 1
    live = dict(store.table.values)
    assert reopen(store, open_table).table.values == live


async def test_an_operation_appended_after_a_failed_one_fails_too(
    open_table: Callable[..., TableStore], disk: Disk, commit: GroupCommit
) -> None:
    store = open_table()
    await store.set("a", "1")
    end, flushes = store.log.end_offset, disk.flushes
    disk.gate.clear()
    disk.fail("fsync", errno.EIO)
    failing = asyncio.ensure_future(store.set("a", "2"))
    await until(lambda: disk.flushes_started == flushes + 1)
    # Written after the failing one, waiting for the next fsync round (which succeeds).
    after = asyncio.ensure_future(store.set("b", "2"))
    await until(lambda: store.runtime.pending_writes == 2)
    disk.gate.set()
    results = await asyncio.gather(failing, after, return_exceptions=True)
    assert [getattr(r, "code", r) for r in results] == [ErrorCode.kafka_storage_error] * 2
    # The later round ran, and succeeded, but its records had been cut.
    assert disk.flushes == flushes + 2
    assert store.table.values == {"a": "1"}
    assert store.log.end_offset == end
    await store.set("c", "3")
    assert store.table.values == {"a": "1", "c": "3"}
    assert reopen(store, open_table).table.values == {"a": "1", "c": "3"}


async def test_a_failed_truncation_leaves_the_log_failed_until_restart(
    open_table: Callable[..., TableStore], disk: Disk, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_table()
    await store.set("a", "1")

    def broken_truncate(offset: int) -> None:
        raise OSError(errno.EIO, "truncate failed")

    monkeypatch.setattr(store.log, "truncate", broken_truncate)
    disk.fail("fsync", errno.EIO)
    with pytest.raises(KafkaError):
        await store.set("a", "2")
    assert store.runtime.failed is not None
    with pytest.raises(KafkaError) as refused:
        await store.set("b", "1")
    assert refused.value.code == ErrorCode.kafka_storage_error
    assert "restart" in refused.value.message
    assert store.table.values == {"a": "1"}
    monkeypatch.undo()
    assert reopen(store, open_table).runtime.failed is None


async def test_a_cancelled_caller_does_not_stop_its_operation(
    open_table: Callable[..., TableStore], disk: Disk
) -> None:
    store = open_table()
    disk.gate.clear()
    caller = asyncio.ensure_future(store.set("a", "1"))
    await until(lambda: disk.flushes_started == 1)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert store.runtime.keys_in_use == 1  # still held until the write is applied
    disk.gate.set()
    await until(lambda: store.runtime.keys_in_use == 0)
    assert store.table.values == {"a": "1"}


async def test_an_operation_error_writes_nothing(open_table: Callable[..., TableStore]) -> None:
    store = open_table()

    def refuse() -> tuple[list[Row], None]:
        raise KafkaError(ErrorCode.invalid_request, "no")

    end = store.log.end_offset
    with pytest.raises(KafkaError) as refused:
        await store.runtime.run("a", refuse)
    assert refused.value.code == ErrorCode.invalid_request
    assert store.log.end_offset == end and store.runtime.keys_in_use == 0


def test_storage_errors_become_not_coordinator_for_coordinator_rpcs() -> None:
    storage = KafkaError(ErrorCode.kafka_storage_error, "disk")
    assert for_coordinator_rpc(storage).code == ErrorCode.not_coordinator
    fenced = KafkaError(ErrorCode.fenced_state_epoch, "old")
    assert for_coordinator_rpc(fenced) is fenced


# ------------------------------------------------------------------ compaction


def records_below(store_log: RecordLog, limit: int) -> list[KeyValue]:
    plog = store_log.log
    out: list[KeyValue] = []
    offset = plog.log_start_offset
    while offset < min(limit, plog.log_end_offset):
        data = plog.read(offset, 1 << 20, max_offset=limit)
        if not data:
            break
        for pos, header in iter_batches(data):
            out += [(r.key, r.value) for r in decode_records(data, pos, header)]
            offset = header.next_offset
    return out


def assert_bounded(store_log: RecordLog, live_keys: int) -> None:
    """What a restart replays is at most the live state plus the active segment: the
    closed segments hold one record per key live at their end, and a key live there but
    not now has a record in the active segment."""
    plog = store_log.log
    active_base = plog.segment_base_offsets[-1]
    closed = len(records_below(store_log, active_base))
    active = len(records_below(store_log, 1 << 62)) - closed
    assert closed <= live_keys + active
    assert len(plog.closed_segment_base_offsets) <= 1


def live_key_count(store_log: RecordLog, keys_of: Callable[..., Any]) -> int:
    newest: dict[Hashable, bool] = {}
    for key, value in records_below(store_log, 1 << 62):
        for k, tombstone in keys_of(key, value):
            newest[k] = tombstone
    return sum(1 for tombstone in newest.values() if not tombstone)


async def test_key_compaction_keeps_the_live_state_and_bounds_the_log(
    open_table: Callable[..., TableStore],
) -> None:
    store = open_table(segment_bytes=600)
    for i in range(400):
        key = f"k{i % 7}"
        await store.set(key, None if i % 5 == 4 else f"v{i}")
    await store.set("gone", "x")
    await store.set("gone", None)
    await store.runtime.compact()
    live = dict(store.table.values)
    assert len(records_below(store.log, 1 << 62)) < store.log.end_offset / 4
    assert_bounded(store.log, len(live))
    assert reopen(store, open_table).table.values == live


async def test_compaction_runs_by_itself_after_a_roll(
    open_table: Callable[..., TableStore],
) -> None:
    store = open_table(segment_bytes=600)
    for i in range(300):
        await store.set(f"k{i % 3}", f"v{i}")
    await until(lambda: store.runtime._compaction_task is None)
    assert_bounded(store.log, 3)


async def test_compaction_leaves_segments_with_uncommitted_records_alone(
    open_table: Callable[..., TableStore], disk: Disk
) -> None:
    store = open_table(segment_bytes=600)
    for i in range(30):
        await store.set(f"k{i % 3}", f"v{i}")
    await store.runtime.compact()
    disk.gate.clear()
    plog = store.log.log
    segments = len(plog.segment_base_offsets)
    writes = []
    while len(plog.segment_base_offsets) < segments + 2:
        writes.append(asyncio.ensure_future(store.set(f"x{len(writes)}", "w")))
        await until(lambda: store.runtime.pending_writes == len(writes))
    committed = store.runtime.committed_offset

    def uncommitted_segments() -> dict[str, bytes]:
        bases = plog.segment_base_offsets
        return {
            f"{b:020d}.log": (plog.directory / f"{b:020d}.log").read_bytes()
            for b, limit in zip(bases, [*bases[1:], 1 << 62], strict=True)
            if limit > committed
        }

    held = uncommitted_segments()
    assert len(held) >= 2  # closed segments among them
    await store.runtime.compact()
    assert uncommitted_segments() == held
    disk.gate.set()
    await asyncio.gather(*writes)


# ------------------------------------------------------------------ the share coordinator


def share_state(persister: InMemoryPersister | DurablePersister) -> dict[Any, Any]:
    shard = persister.shard
    return {
        key: (shard.state(key), shard.updates_since_snapshot(key), shard.snapshot_epoch(key))
        for key in list(shard.keys())
    }


KEY = ShareStateKey("g", T1, 0)


@pytest.mark.parametrize("code", ERRNOS, ids=errno.errorcode.get)
@pytest.mark.parametrize("stage", STAGES)
async def test_share_coordinator_write_failure_changes_nothing(
    tmp_path: Path, commit: GroupCommit, clock: ManualClock, disk: Disk, stage: str, code: int
) -> None:
    def open_() -> DurablePersister:
        persister = DurablePersister(tmp_path / "share-state", commit, clock=clock)
        disk.attach(persister.records)
        persister.load()
        return persister

    persister = open_()
    await persister.initialize_state(KEY, 0, 0)
    await persister.write_state(KEY, 0, 1, 0, [PersistedBatch(0, 4, 2, 1)])
    before = share_state(persister)
    disk.fail(stage, code)
    with pytest.raises(KafkaError) as failed:
        await persister.write_state(KEY, 0, 1, 5, [PersistedBatch(5, 9, 2, 1)])
    assert failed.value.code == ErrorCode.kafka_storage_error
    assert share_state(persister) == before
    await persister.write_state(KEY, 0, 1, 10, [PersistedBatch(10, 12, 0, 1)])
    assert persister.shard.state(KEY).start_offset == 10  # type: ignore[union-attr]
    live = share_state(persister)
    persister.close()
    restarted = open_()
    assert share_state(restarted) == live
    restarted.close()


async def test_in_memory_share_coordinator_replays_to_the_same_state() -> None:
    persister = InMemoryPersister(snapshot_update_records_per_snapshot=2)
    await persister.initialize_state(KEY, 0, 0)
    for i in range(5):
        await persister.write_state(KEY, 0, 1, i, [PersistedBatch(i, i, 2, 1)])
    replayed = InMemoryPersister(
        snapshot_update_records_per_snapshot=2, record_log=persister.runtime.record_log
    )
    replayed.runtime.load()
    assert share_state(replayed) == share_state(persister)


async def test_share_state_compaction_keeps_the_live_state(
    tmp_path: Path, commit: GroupCommit, clock: ManualClock
) -> None:
    def open_() -> DurablePersister:
        persister = DurablePersister(
            tmp_path / "share-state",
            commit,
            clock=clock,
            segment_bytes=2048,
            snapshot_update_records_per_snapshot=3,
        )
        persister.load()
        return persister

    persister = open_()
    keys = [ShareStateKey("g", T1, p) for p in range(3)]
    for key in keys:
        await persister.initialize_state(key, 0, 0)
    for i in range(120):
        await persister.write_state(keys[i % 3], 0, 1, i, [PersistedBatch(i, i + 1, 2, 1)])
    await persister.compact()
    # Per key its last snapshot and the (at most 3) updates after it stay.
    plog = persister.records.log
    closed = records_below(persister.records, plog.segment_base_offsets[-1])
    assert len(closed) <= 3 * 4
    live = share_state(persister)
    persister.close()
    restarted = open_()
    assert share_state(restarted) == live
    restarted.close()


async def test_with_log_cleaner_disabled_the_broker_never_compacts_the_share_state_log(
    tmp_path: Path, commit: GroupCommit, clock: ManualClock
) -> None:
    # log.cleaner.enable=false: the closed segments stay as written (for `spool compact`).
    persister = DurablePersister(
        tmp_path / "share-state",
        commit,
        clock=clock,
        segment_bytes=2048,
        snapshot_update_records_per_snapshot=3,
        compaction_enabled=False,
    )
    persister.load()
    keys = [ShareStateKey("g", T1, p) for p in range(3)]
    for key in keys:
        await persister.initialize_state(key, 0, 0)
    for i in range(120):
        await persister.write_state(keys[i % 3], 0, 1, i, [PersistedBatch(i, i + 1, 2, 1)])
    plog = persister.records.log
    assert len(plog.segment_base_offsets) > 3  # rolled several times
    assert await persister.compact() == 0
    # Every record below the active segment is still there, one per offset.
    active = plog.segment_base_offsets[-1]
    assert len(records_below(persister.records, active)) == active
    persister.close()


# ------------------------------------------------------------------ share groups and configs


def group_state(groups: GroupCoordinator) -> dict[str, Any]:
    return {
        "groups": {
            gid: (
                g.group_epoch,
                g.assignment_epoch,
                dict(g.members),
                dict(g.target_assignment),
                dict(g.subscription_metadata),
                dict(g.initializing),
                dict(g.initialized),
            )
            for gid, g in sorted(groups.groups.items())
        },
        "configs": {gid: groups.configs.overrides(gid) for gid in groups.configs.group_ids()},
    }


class Groups:
    """A GroupCoordinator on a record log in `directory`, as the broker builds it."""

    def __init__(
        self,
        directory: Path,
        commit: GroupCommit,
        clock: ManualClock,
        disk: Disk | None = None,
        segment_bytes: int = 1 << 20,
    ) -> None:
        self.log = RecordLog(directory, commit, internal_log_config(segment_bytes), clock=clock)
        if disk is not None:
            disk.attach(self.log)
        self.coordinator = GroupCoordinator(
            InMemoryPersister(clock=clock),
            lambda: TOPICS,
            GroupConfigStore(),
            self.log,
            clock=clock,
        )
        self.coordinator.load()

    async def join(self, group_id: str, member_id: str) -> None:
        await self.coordinator.heartbeat(group_id, member_id, 0, ["t1"], None, "c", "/h")
        await self.settle()

    async def leave(self, group_id: str, member_id: str) -> None:
        await self.coordinator.heartbeat(group_id, member_id, -1, None, None, "c", "/h")

    async def settle(self) -> None:
        """Let the background share-state initializations finish."""
        while self.coordinator._initializing:
            await asyncio.gather(*self.coordinator._initializing)

    async def set_config(self, group_id: str, name: str, value: str) -> None:
        await self.coordinator.alter_configs(group_id, [AlterConfigOp(name, SET, value)], False)

    def close(self) -> None:
        self.coordinator.close()


@pytest.mark.parametrize("code", ERRNOS, ids=errno.errorcode.get)
@pytest.mark.parametrize("stage", STAGES)
async def test_share_group_heartbeat_failure_changes_nothing(
    tmp_path: Path, commit: GroupCommit, clock: ManualClock, disk: Disk, stage: str, code: int
) -> None:
    groups = Groups(tmp_path / "groups", commit, clock, disk)
    await groups.join("g", "a")
    assert groups.coordinator.is_initialized("g", T1, 0)
    before = group_state(groups.coordinator)
    disk.fail(stage, code)
    with pytest.raises(KafkaError) as failed:
        await groups.join("g", "b")
    # Kafka's group coordinator answers a failed write with NOT_COORDINATOR (retriable).
    assert failed.value.code == ErrorCode.not_coordinator
    assert group_state(groups.coordinator) == before
    with pytest.raises(KafkaError):
        disk.fail(stage, code)
        await groups.join("new-group", "a")
    assert "new-group" not in groups.coordinator.groups
    await groups.join("g", "b")
    assert set(groups.coordinator.groups["g"].members) == {"a", "b"}
    live = group_state(groups.coordinator)
    groups.close()
    restarted = Groups(tmp_path / "groups", commit, clock)
    assert group_state(restarted.coordinator) == live
    restarted.close()


@pytest.mark.parametrize("code", ERRNOS, ids=errno.errorcode.get)
@pytest.mark.parametrize("stage", STAGES)
async def test_group_config_alter_failure_changes_nothing(
    tmp_path: Path, commit: GroupCommit, clock: ManualClock, disk: Disk, stage: str, code: int
) -> None:
    groups = Groups(tmp_path / "groups", commit, clock, disk)
    await groups.set_config("g", "share.auto.offset.reset", "earliest")
    before = group_state(groups.coordinator)
    disk.fail(stage, code)
    with pytest.raises(KafkaError) as failed:
        await groups.set_config("g", "share.record.lock.duration.ms", "20000")
    assert failed.value.code == ErrorCode.kafka_storage_error
    assert group_state(groups.coordinator) == before
    assert groups.coordinator.config("g").record_lock_duration_ms == 30000
    await groups.set_config("g", "share.record.lock.duration.ms", "25000")
    assert groups.coordinator.config("g").record_lock_duration_ms == 25000
    live = group_state(groups.coordinator)
    groups.close()
    restarted = Groups(tmp_path / "groups", commit, clock)
    assert group_state(restarted.coordinator) == live
    restarted.close()


async def test_member_expiry_runs_on_the_clock(
    tmp_path: Path, commit: GroupCommit, clock: ManualClock
) -> None:
    groups = Groups(tmp_path / "groups", commit, clock)
    removed: list[tuple[str, str]] = []
    groups.coordinator.member_removed_hooks.append(lambda g, m: removed.append((g, m)))
    groups.coordinator.start()
    await groups.join("g", "a")
    clock.advance(44_000)
    await asyncio.sleep(0.01)
    assert "a" in groups.coordinator.groups["g"].members
    clock.advance(1_250)
    await until(lambda: bool(removed))
    assert removed == [("g", "a")]
    assert "a" not in groups.coordinator.groups["g"].members
    await groups.coordinator.stop()
    groups.close()


async def test_group_log_compaction_keeps_the_live_state_and_bounds_the_log(
    tmp_path: Path, commit: GroupCommit, clock: ManualClock
) -> None:
    groups = Groups(tmp_path / "groups", commit, clock, segment_bytes=4096)
    for i in range(40):
        await groups.join("g", f"m{i % 4}")
        await groups.join(f"short-{i}", "x")
        await groups.leave(f"short-{i}", "x")
        await groups.set_config("g", "share.record.lock.duration.ms", str(20000 + i))
        if i % 4 == 3:
            for m in range(4):
                await groups.leave("g", f"m{m}")
    await groups.join("g", "stays")
    await groups.coordinator.runtime.compact()
    assert len(records_below(groups.log, 1 << 62)) < groups.log.end_offset / 2
    live = group_state(groups.coordinator)
    # Group metadata pieces, members and configs: one record each at most.
    assert_bounded(groups.log, live_key_count(groups.log, group_records.compaction_keys))
    groups.close()
    restarted = Groups(tmp_path / "groups", commit, clock)
    assert group_state(restarted.coordinator) == live
    restarted.close()


# ------------------------------------------------------------------ cluster metadata


def metadata_state(store: MetadataStore) -> dict[str, Any]:
    s = store.state
    return {
        "cluster_id": s.cluster_id,
        "topics": {n: (t.topic_id, t.partitions, dict(t.configs)) for n, t in s.topics.items()},
        "by_id": sorted(s.topics_by_id),
        "broker_configs": dict(s.broker_configs),
        "producer_id_limit": s.producer_id_limit,
    }


def new_topic(name: str, partitions: int = 1) -> dict[str, Any]:
    from coordinator.metadata import Topic

    return topic_record(Topic(name, uuid.uuid4(), partitions))


async def write(store: MetadataStore, *records: dict[str, Any]) -> None:
    """One metadata operation writing `records` as they are (no checks)."""
    await store.run(lambda: (list(records), None))


@pytest.mark.parametrize("code", ERRNOS, ids=errno.errorcode.get)
@pytest.mark.parametrize("stage", STAGES)
async def test_cluster_metadata_failure_changes_nothing(
    tmp_path: Path, commit: GroupCommit, clock: ManualClock, disk: Disk, stage: str, code: int
) -> None:
    def open_() -> MetadataStore:
        store = MetadataStore(tmp_path / "meta", commit, clock=clock)
        disk.attach(store.runtime.record_log)  # type: ignore[arg-type]
        return store

    store = open_()
    await store.ensure_cluster_id()
    await write(store, new_topic("orders", 3))
    before = metadata_state(store)
    disk.fail(stage, code)
    with pytest.raises(KafkaError) as failed:
        await write(store, new_topic("payments"))
    assert failed.value.code == ErrorCode.kafka_storage_error
    assert metadata_state(store) == before
    disk.fail(stage, code)
    with pytest.raises(KafkaError):
        await store.allocate_producer_id()
    assert metadata_state(store) == before
    await write(store, new_topic("payments"))
    pid = await store.allocate_producer_id()
    assert pid < store.state.producer_id_limit
    assert set(store.state.topics) == {"orders", "payments"}
    live = metadata_state(store)
    store.close()
    restarted = open_()
    assert metadata_state(restarted) == live
    restarted.close()


async def test_undoing_a_creation_deletes_only_the_topic_it_created(
    tmp_path: Path, commit: GroupCommit, clock: ManualClock
) -> None:
    """A creation whose logs could not be opened is undone in a later operation; a
    deletion and re-creation of the name in between leave the new topic alone."""
    store = MetadataStore(tmp_path / "meta", commit, clock=clock)
    await write(store, new_topic("orders"))
    first = store.state.topics["orders"]
    await write(store, store.state.delete_topic_record(first))
    await write(store, new_topic("orders"))
    end = store.runtime.record_log.end_offset

    def undo() -> tuple[list[dict[str, Any]], None]:
        record = store.state.undo_creation_record(first)
        return ([] if record is None else [record]), None

    await store.run(undo)
    assert store.runtime.record_log.end_offset == end
    assert "orders" in store.state.topics
    store.close()


async def test_metadata_compaction_keeps_the_live_state_and_bounds_the_log(
    tmp_path: Path, commit: GroupCommit, clock: ManualClock
) -> None:
    def open_() -> MetadataStore:
        return MetadataStore(tmp_path / "meta", commit, clock=clock, segment_bytes=2048)

    store = open_()
    await store.ensure_cluster_id()
    for i in range(60):
        record = new_topic(f"t{i % 5}", 1 + i % 3)
        await write(store, record)
        if i % 2:
            await write(
                store,
                {"type": "topic_deleted", "name": record["name"], "topic_id": record["topic_id"]},
            )
        await write(store, {"type": "broker_config", "configs": {"x": str(i)}})
        await store.allocate_producer_id()
    await store.runtime.compact()
    live = metadata_state(store)
    record_log = store.runtime.record_log
    assert isinstance(record_log, RecordLog)
    # The cluster id, the broker configs, the producer id block and the live topics.
    assert_bounded(record_log, 3 + len(live["topics"]))
    store.close()
    restarted = open_()
    assert metadata_state(restarted) == live
    restarted.close()
