"""A share fetch over many partitions that only acquires writes no share state at all
(KIP-932: the ACQUIRED state is transient, so an acquisition changes nothing durable): no
append, no fsync, and a failing disk does not stop it. A request's acknowledgements over
many partitions, and a fetch carrying them (its acquisitions stacked on them), persist
with one share-state write: one append and one fsync round of the share coordinator's log,
whatever the number of partitions; a failed write fails every partition and leaves each as
it was.

The share coordinator is the durable one (`DurablePersister` on a tmp dir, a real
`GroupCommit`), and its disk fails on demand (test_runtime's `Disk`).
"""

from __future__ import annotations

import asyncio
import errno
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from broker.share.manager import FetchedPartition, SharePartitionManager
from coordinator.share_persister import DurablePersister
from coordinator.share_state import ShareStateKey
from persister.clock import ManualClock
from persister.commit import GroupCommit
from protocol.errors import ErrorCode
from protocol.records import NewRecord, build_batch
from tests.unit import test_runtime
from tests.unit.test_runtime import STAGES, Disk
from tests.unit.test_share_manager import FakeGroups, FakeLog

commit = test_runtime.commit
disk = test_runtime.disk

TOPIC = uuid.UUID(int=3)
PARTITIONS = 8
KEYS = [ShareStateKey("g", TOPIC, p) for p in range(PARTITIONS)]
ACCEPT = 1
RELEASE = 2


@dataclass
class Setup:
    mgr: SharePartitionManager
    persister: DurablePersister
    log: FakeLog
    commit: GroupCommit
    appends: list[int]


@pytest.fixture
async def setup(tmp_path: Path, commit: GroupCommit, disk: Disk) -> AsyncIterator[Setup]:
    clock = ManualClock()
    persister = DurablePersister(tmp_path / "share-state", commit, clock=clock)
    disk.attach(persister.records)
    persister.load()
    appends: list[int] = []
    write = persister.records.write

    def counted(records: list[tuple[bytes | None, bytes | None]]) -> int:
        appends.append(len(records))
        return write(records)

    persister.records.write = counted  # type: ignore[method-assign,assignment]
    # Every partition's log: nothing yet (the first fetch only loads the share state).
    log = FakeLog(high_watermark=0, last_stable_offset=0)
    mgr = SharePartitionManager(
        persister,
        FakeGroups(persister, delivery_count_limit=5),  # type: ignore[arg-type]
        lambda t, p: log,
        lambda part, ts: None,
        clock=clock,
    )
    assert await fetch(mgr) == {}
    log.high_watermark = log.last_stable_offset = 10
    appends.clear()
    yield Setup(mgr, persister, log, commit, appends)
    mgr.stop()
    persister.close()


async def fetch(
    mgr: SharePartitionManager, keys: list[ShareStateKey] = KEYS, member: str = "m"
) -> dict[ShareStateKey, tuple[int, int, int] | ErrorCode]:
    """Per partition that got something: its one acquired range, or its error."""
    got = await mgr.acquire_many(keys, member, max_records=1000, batch_size=1000, max_bytes=1 << 20)
    return {key: _summary(f) for key, f in got.items() if f.acquired or f.error_code}


def _summary(f: FetchedPartition) -> tuple[int, int, int] | ErrorCode:
    if f.error_code != ErrorCode.none:
        return f.error_code
    (r,) = f.acquired
    return r.first_offset, r.last_offset, r.delivery_count


async def test_a_fetch_over_every_partition_that_only_acquires_writes_nothing(
    setup: Setup, disk: Disk
) -> None:
    stored = {key: setup.persister.shard.state(key) for key in KEYS}
    rounds, fsyncs = setup.commit.rounds, disk.flushes_started
    assert await fetch(setup.mgr) == {key: (0, 9, 1) for key in KEYS}
    assert (setup.commit.rounds - rounds, disk.flushes_started - fsyncs) == (0, 0)
    assert setup.appends == []
    assert {key: setup.persister.shard.state(key) for key in KEYS} == stored
    for key in KEYS:
        state = setup.persister.shard.state(key)
        assert state is not None and (state.start_offset, list(state.batches)) == (0, [])
        sp = setup.mgr.partitions[key]
        assert (sp.spso, sp.speo, sp.acquired_count, sp.change_pending) == (0, 10, 10, False)


@pytest.mark.parametrize("stage", STAGES)
async def test_a_failing_disk_does_not_stop_a_plain_fetch_and_fails_the_next_shared_write(
    setup: Setup, disk: Disk, stage: str
) -> None:
    stored = {key: setup.persister.shard.state(key) for key in KEYS}
    disk.fail(stage, errno.EIO)
    # The fetch only acquires: it never touches the disk, and every partition gets its records.
    assert await fetch(setup.mgr) == {key: (0, 9, 1) for key in KEYS}
    assert setup.appends == []
    armed = disk.append_error if stage == "append" else disk.fsync_error
    assert armed == errno.EIO  # the fault still waits for the next write
    held = {key: setup.mgr.partitions[key].in_flight_ranges() for key in KEYS}
    # The next write is a fetch carrying acknowledgements: 0-9 released and, stacked on
    # that, acquired again. It fails every partition, on both results, and undoes both.
    acks = {key: [(0, 9, (RELEASE,))] for key in KEYS}
    acked, got = await setup.mgr.acknowledge_and_acquire(
        acks, KEYS, "m", max_records=1000, batch_size=1000, max_bytes=1 << 20
    )
    assert {key: code for key, (code, _) in acked.items()} == {
        key: ErrorCode.coordinator_not_available for key in KEYS
    }
    assert {key: _summary(f) for key, f in got.items()} == {
        key: ErrorCode.coordinator_not_available for key in KEYS
    }
    assert all(f.records == b"" and f.acquired == [] for f in got.values())
    assert setup.appends == [PARTITIONS]  # one write for all of them, and it failed
    for key in KEYS:
        sp = setup.mgr.partitions[key]
        # Still acquired by "m", delivery count 1, under the same lock.
        assert sp.in_flight_ranges() == held[key]
        assert (sp.spso, sp.speo, sp.acquired_count, sp.change_pending) == (0, 10, 10, False)
    assert {key: setup.persister.shard.state(key) for key in KEYS} == stored
    # The disk is back: the same request succeeds as a whole, with one append and one fsync.
    setup.appends.clear()
    rounds = setup.commit.rounds
    acked, got = await setup.mgr.acknowledge_and_acquire(
        acks, KEYS, "m", max_records=1000, batch_size=1000, max_bytes=1 << 20
    )
    assert acked == {key: (ErrorCode.none, None) for key in KEYS}
    assert {key: _summary(f) for key, f in got.items()} == {key: (0, 9, 2) for key in KEYS}
    assert (setup.commit.rounds - rounds, setup.appends) == (1, [PARTITIONS])
    for key in KEYS:
        # The release is written (the delivery made); the new acquisition is not.
        state = setup.persister.shard.state(key)
        assert state is not None and state.start_offset == 0
        assert [tuple(b) for b in state.batches] == [(0, 9, 0, 1)]


async def test_two_fetches_over_the_same_partitions_in_opposite_orders_split_the_records(
    setup: Setup,
) -> None:
    first, second = await asyncio.wait_for(
        asyncio.gather(
            fetch(setup.mgr, KEYS, "m1"),
            fetch(setup.mgr, KEYS[::-1], "m2"),
        ),
        timeout=10,
    )
    # Each partition's records went to exactly one of them, once.
    assert set(first) | set(second) == set(KEYS)
    assert not set(first) & set(second)
    assert all(v == (0, 9, 1) for v in [*first.values(), *second.values()])


async def test_acknowledgements_of_every_partition_are_one_append_and_one_fsync(
    setup: Setup,
) -> None:
    await fetch(setup.mgr)
    setup.appends.clear()
    rounds = setup.commit.rounds
    results = await setup.mgr.acknowledge_many({key: [(0, 9, (ACCEPT,))] for key in KEYS}, "m")
    assert results == {key: (ErrorCode.none, None) for key in KEYS}
    assert setup.commit.rounds - rounds == 1
    assert setup.appends == [PARTITIONS]
    for key in KEYS:
        state = setup.persister.shard.state(key)
        assert state is not None and state.start_offset == 10
        assert setup.mgr.partitions[key].spso == 10


@pytest.mark.parametrize("stage", STAGES)
async def test_a_failed_shared_acknowledgement_write_keeps_every_partition_acquired(
    setup: Setup, disk: Disk, stage: str
) -> None:
    await fetch(setup.mgr)
    stored = {key: setup.persister.shard.state(key) for key in KEYS}
    disk.fail(stage, errno.ENOSPC)
    results = await setup.mgr.acknowledge_many({key: [(0, 9, (ACCEPT,))] for key in KEYS}, "m")
    assert {code for code, _ in results.values()} == {ErrorCode.coordinator_not_available}
    for key in KEYS:
        sp = setup.mgr.partitions[key]
        assert (sp.spso, sp.acquired_count, sp.change_pending) == (0, 10, False)
    assert {key: setup.persister.shard.state(key) for key in KEYS} == stored
    # Retried once the disk is back, the same acknowledgements are accepted.
    results = await setup.mgr.acknowledge_many({key: [(0, 9, (ACCEPT,))] for key in KEYS}, "m")
    assert set(results.values()) == {(ErrorCode.none, None)}


def grow_log_to_20(log: FakeLog) -> None:
    """The log now holds one batch of offsets 0-19 (FakeLog's has 0-9)."""
    log.high_watermark = log.last_stable_offset = 20
    batch = build_batch([NewRecord(None, b"v%d" % i) for i in range(20)])
    log.read = lambda offset, max_bytes, **_: batch  # type: ignore[method-assign]


async def test_a_fetch_carrying_acknowledgements_persists_them_in_one_write_not_its_acquisitions(
    setup: Setup,
) -> None:
    await fetch(setup.mgr)
    grow_log_to_20(setup.log)
    setup.appends.clear()
    rounds = setup.commit.rounds
    # The previous delivery's acknowledgements ride on the next fetch (ShareFetch's steady
    # state): offsets 0-4 accepted, 5-9 released; the fetch then takes 5-19 again/new.
    acks = {key: [(0, 9, (ACCEPT,) * 5 + (RELEASE,) * 5)] for key in KEYS}
    acked, got = await setup.mgr.acknowledge_and_acquire(
        acks, KEYS, "m", max_records=1000, batch_size=1000, max_bytes=1 << 20
    )
    assert acked == {key: (ErrorCode.none, None) for key in KEYS}
    assert {key: [tuple(r) for r in f.acquired] for key, f in got.items()} == {
        key: [(5, 9, 2), (10, 19, 1)] for key in KEYS
    }
    assert setup.commit.rounds - rounds == 1
    assert setup.appends == [PARTITIONS]
    for key in KEYS:
        # What the acknowledgements changed: SPSO past the accepted 0-4, the released 5-9
        # AVAILABLE with the delivery made. The acquisitions (5-9 again, 10-19 new) are
        # transient and add nothing: 10-19 has no state batch, as never delivered.
        state = setup.persister.shard.state(key)
        assert state is not None and state.start_offset == 5
        assert [tuple(b) for b in state.batches] == [(5, 9, 0, 1)]
        sp = setup.mgr.partitions[key]
        assert (sp.spso, sp.speo, sp.acquired_count, sp.change_pending) == (5, 20, 15, False)


@pytest.mark.parametrize("stage", STAGES)
async def test_a_failed_write_of_acknowledgements_and_acquisitions_undoes_both(
    setup: Setup, disk: Disk, stage: str
) -> None:
    await fetch(setup.mgr)
    grow_log_to_20(setup.log)
    stored = {key: setup.persister.shard.state(key) for key in KEYS}
    acks = {key: [(0, 9, (ACCEPT,))] for key in KEYS}
    disk.fail(stage, errno.EIO)
    acked, got = await setup.mgr.acknowledge_and_acquire(
        acks, KEYS, "m", max_records=1000, batch_size=1000, max_bytes=1 << 20
    )
    # The client sees the storage error on both: the acknowledgement and the fetch.
    assert {code for code, _ in acked.values()} == {ErrorCode.coordinator_not_available}
    assert {key: f.error_code for key, f in got.items()} == {
        key: ErrorCode.coordinator_not_available for key in KEYS
    }
    # Nothing moved: 0-9 still acquired by the member, 10-19 never delivered.
    for key in KEYS:
        sp = setup.mgr.partitions[key]
        assert (sp.spso, sp.speo, sp.acquired_count, sp.change_pending) == (0, 10, 10, False)
    assert {key: setup.persister.shard.state(key) for key in KEYS} == stored
    # The disk is back: the same request succeeds as a whole.
    acked, got = await setup.mgr.acknowledge_and_acquire(
        acks, KEYS, "m", max_records=1000, batch_size=1000, max_bytes=1 << 20
    )
    assert set(acked.values()) == {(ErrorCode.none, None)}
    assert {key: [tuple(r) for r in f.acquired] for key, f in got.items()} == {
        key: [(10, 19, 1)] for key in KEYS
    }


async def test_acknowledgements_are_persisted_when_the_fetch_finds_nothing_to_acquire(
    setup: Setup,
) -> None:
    await fetch(setup.mgr)
    setup.appends.clear()
    acked, got = await setup.mgr.acknowledge_and_acquire(
        {KEYS[0]: [(0, 9, (ACCEPT,))]}, KEYS[:1], "m", max_records=1000, batch_size=1, max_bytes=1
    )
    assert acked == {KEYS[0]: (ErrorCode.none, None)}
    assert not got[KEYS[0]].acquired
    assert setup.appends == [1]
    state = setup.persister.shard.state(KEYS[0])
    assert state is not None and state.start_offset == 10


async def test_a_closing_members_records_are_released_with_one_append_and_one_fsync(
    setup: Setup,
) -> None:
    """Session close or member leaving (Kafka's releaseSession): every partition the member
    holds records of is released by one share-state write, not one fsync per partition."""
    await fetch(setup.mgr)
    setup.appends.clear()
    rounds = setup.commit.rounds
    assert await setup.mgr.release_member("g", "m", KEYS) == PARTITIONS * 10
    assert (setup.commit.rounds - rounds, setup.appends) == (1, [PARTITIONS])
    for key in KEYS:
        # AVAILABLE again, the delivery made, durable.
        state = setup.persister.shard.state(key)
        assert state is not None and [tuple(b) for b in state.batches] == [(0, 9, 0, 1)]
        assert setup.mgr.partitions[key].acquired_count == 0
    # Another member gets them all, delivery 2.
    assert await fetch(setup.mgr, member="m2") == {key: (0, 9, 2) for key in KEYS}


@pytest.mark.parametrize("stage", STAGES)
async def test_a_failed_release_write_keeps_the_members_records_until_their_locks_expire(
    setup: Setup, disk: Disk, stage: str
) -> None:
    await fetch(setup.mgr)
    held = {key: setup.mgr.partitions[key].in_flight_ranges() for key in KEYS}
    disk.fail(stage, errno.EIO)
    setup.appends.clear()
    assert await setup.mgr.release_member("g", "m", KEYS) == 0
    assert setup.appends == [PARTITIONS]  # one write for all, and it failed
    for key in KEYS:
        sp = setup.mgr.partitions[key]
        assert sp.in_flight_ranges() == held[key] and not sp.change_pending
