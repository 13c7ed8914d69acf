"""The share-partition manager with an in-memory share coordinator, a fake log and a ManualClock.

Share-state writes fail on demand (as a full or broken disk, or a fenced epoch, makes them
fail): whatever the operation, the partition must be left exactly as before the failed
write, the error must reach the caller, and the next attempt must succeed.

A fetch that only acquires writes nothing (KIP-932: the ACQUIRED state is transient, an
acquired record is persisted as the AVAILABLE record it was), so it never meets such a
failure; acknowledgements, releases and lock expiries write, and meet it.
"""

from __future__ import annotations

import asyncio
import errno
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import pytest
from structlog.testing import capture_logs

from broker.partitions import Wakeup
from broker.share.manager import (
    EXPIRY_RETRY_BACKOFF_MS,
    FetchedPartition,
    SharePartitionManager,
    persister_error,
)
from broker.share.partition import InFlightRange, RecordState, SharePartition
from broker.tasks import guarded, spawn
from coordinator.group_config import GroupConfig
from coordinator.share_persister import InMemoryPersister
from coordinator.share_state import PersistedBatch, ShareStateKey
from persister.clock import ManualClock
from protocol.errors import ErrorCode, KafkaError
from protocol.records import NewRecord, build_batch

TOPIC_ID = uuid.uuid4()
KEY = ShareStateKey("g", TOPIC_ID, 0)
OTHER_KEY = ShareStateKey("g", TOPIC_ID, 1)
ACCEPT, RELEASE, RENEW = 1, 2, 4
LOCK_MS = 30_000  # share.record.lock.duration.ms default
IDLE_MS = 10_000
SWEEP_MS = 1_000

A = RecordState.AVAILABLE
Q = RecordState.ACQUIRED


@dataclass
class FakeLog:
    """One batch of ten records at offsets 0-9."""

    topic: str = "t"
    index: int = 0
    log_start_offset: int = 0
    high_watermark: int = 10
    last_stable_offset: int = 10

    @property
    def log_end_offset(self) -> int:
        return self.high_watermark

    def read(
        self,
        offset: int,
        max_bytes: int,
        *,
        committed_only: bool = False,
        beyond_high_watermark: bool = False,
    ) -> bytes:
        return build_batch([NewRecord(None, f"v{i}".encode()) for i in range(10)])

    async def wait_durable(
        self, last_offset: int, timeout_s: float, *, delivery: bool = False
    ) -> None:
        assert last_offset < self.high_watermark  # this log is durable up to its end


# What a fetch of any of offsets 0-9 hands out: FakeLog's one batch.
LOG_BATCH = FakeLog().read(0, 1 << 20)


class FakeGroups:
    def __init__(self, persister: InMemoryPersister, delivery_count_limit: int) -> None:
        self.persister = persister
        self.group_config = GroupConfig.effective(
            {
                "share.auto.offset.reset": "earliest",
                "share.delivery.count.limit": delivery_count_limit,
            }
        )

    def config(self, group_id: str) -> GroupConfig:
        return self.group_config

    async def ensure_initialized(self, group_id: str, topic_id: uuid.UUID, partition: int) -> None:
        key = ShareStateKey(group_id, topic_id, partition)
        if self.persister.shard.state(key) is None:
            await self.persister.initialize_state(key, 0, -1)


class FlakyPersister(InMemoryPersister):
    """The in-memory share coordinator, whose next writes fail (per key) when told to, and
    whose writes can be held at a gate to interleave operations."""

    def __init__(self) -> None:
        super().__init__()
        # Per key, what the next writes do: raise the exception, or succeed (None).
        self.failures: dict[ShareStateKey, list[BaseException | None]] = {}
        self.gate: asyncio.Event | None = None
        self.writes = 0

    def fail_next(
        self, exc: BaseException, key: ShareStateKey = KEY, *, after_successes: int = 0
    ) -> None:
        self.failures.setdefault(key, []).extend([None] * after_successes + [exc])

    async def write_state(
        self,
        key: ShareStateKey,
        state_epoch: int,
        leader_epoch: int,
        start_offset: int,
        batches: Sequence[PersistedBatch],
        delivery_complete_count: int = -1,
    ) -> None:
        if self.gate is not None:
            await self.gate.wait()
        pending = self.failures.get(key)
        failure = pending.pop(0) if pending else None
        if failure is not None:
            raise failure
        self.writes += 1
        await super().write_state(
            key,
            state_epoch,
            leader_epoch,
            start_offset,
            batches,
            delivery_complete_count=delivery_complete_count,
        )


STORAGE = KafkaError(ErrorCode.kafka_storage_error, "fsync of share-state segment failed")
EIO = OSError(errno.EIO, "Input/output error")
ENOSPC = OSError(errno.ENOSPC, "No space left on device")


def manager(
    log: FakeLog | None = None, *, delivery_count_limit: int = 5
) -> tuple[SharePartitionManager, FlakyPersister, ManualClock]:
    persister = FlakyPersister()
    clock = ManualClock()
    the_log = log or FakeLog()
    mgr = SharePartitionManager(
        persister,
        FakeGroups(persister, delivery_count_limit),
        lambda t, p: the_log,
        lambda part, ts: None,
        clock=clock,
        idle_unload_ms=IDLE_MS,
        unload_check_interval_ms=SWEEP_MS,
    )
    return mgr, persister, clock


async def fetch(mgr: SharePartitionManager, key: ShareStateKey = KEY) -> FetchedPartition:
    return await mgr.acquire(key, "m", max_records=100, batch_size=100, max_bytes=1 << 20)


def spans(fetched: FetchedPartition) -> list[tuple[int, int, int]]:
    return [(r.first_offset, r.last_offset, r.delivery_count) for r in fetched.acquired]


def observable(sp: SharePartition) -> tuple[object, ...]:
    return (
        sp.spso,
        sp.speo,
        sp.in_flight_ranges(),
        sp.next_lock_deadline(),
        sp.acquired_count,
        sp.next_fetch_offset(),
        sp.snapshot_state(),
        sp.change_pending,
    )


def durable(persister: InMemoryPersister, key: ShareStateKey = KEY) -> tuple[int, list[object]]:
    state = persister.shard.state(key)
    assert state is not None
    return state.start_offset, list(state.batches)


# -- failed writes: nothing changes, the caller hears of it, the next attempt succeeds ----------


@pytest.mark.parametrize(
    "failure", [STORAGE, EIO, ENOSPC], ids=["kafka_storage_error", "EIO", "ENOSPC"]
)
async def test_failed_acknowledgement_write_leaves_records_acquired_and_a_retry_succeeds(
    failure: BaseException,
) -> None:
    mgr, persister, clock = manager()
    assert spans(await fetch(mgr)) == [(0, 9, 1)]
    sp = mgr.partitions[KEY]
    before, stored = observable(sp), durable(persister)
    clock.advance(1_000)
    persister.fail_next(failure)
    code, message = await mgr.acknowledge(KEY, "m", [(0, 9, (ACCEPT,))])
    assert code == ErrorCode.coordinator_not_available
    assert message
    assert observable(sp) == before
    assert sp.record_state(0) == InFlightRange(0, 9, Q, 1, "m", clock.now_ms() - 1_000 + LOCK_MS)
    assert durable(persister) == stored
    # The same acknowledgement, retried once the disk works, is accepted.
    assert await mgr.acknowledge(KEY, "m", [(0, 9, (ACCEPT,))]) == (ErrorCode.none, None)
    assert (sp.spso, sp.acquired_count) == (10, 0)
    assert durable(persister) == (10, [])
    mgr.stop()


async def test_failed_acknowledgement_write_then_lock_expiry_redelivers() -> None:
    mgr, persister, clock = manager()
    await fetch(mgr)
    persister.fail_next(STORAGE)
    assert (await mgr.acknowledge(KEY, "m", [(0, 9, (ACCEPT,))]))[
        0
    ] == ErrorCode.coordinator_not_available
    clock.advance(LOCK_MS)
    await mgr.settle()
    assert spans(await fetch(mgr)) == [(0, 9, 2)]
    mgr.stop()


async def test_failed_write_of_a_fetch_carrying_acks_delivers_nothing_and_changes_nothing() -> None:
    mgr, persister, clock = manager()
    assert spans(await fetch(mgr)) == [(0, 9, 1)]
    sp = mgr.partitions[KEY]
    clock.advance(1_000)
    before, stored, writes = observable(sp), durable(persister), persister.writes
    assert (stored, writes) == ((0, []), 1)  # the start offset only: the fetch wrote nothing
    # The previous delivery's acknowledgements ride on the next fetch: 0-4 released (and
    # acquired again by the fetch, stacked on them), 5-9 accepted.
    acks = {KEY: [(0, 4, (RELEASE,)), (5, 9, (ACCEPT,))]}
    persister.fail_next(EIO)
    acked, got = await mgr.acknowledge_and_acquire(
        acks, [KEY], "m", max_records=100, batch_size=100, max_bytes=1 << 20
    )
    # Both results carry the error; nothing is delivered.
    [(code, message)] = acked.values()
    assert (list(acked), code) == ([KEY], ErrorCode.coordinator_not_available) and message
    failed = got[KEY]
    assert list(got) == [KEY]
    assert failed == FetchedPartition(
        error_code=ErrorCode.coordinator_not_available, error_message=failed.error_message
    )
    assert failed.error_message and failed.records == b"" and failed.acquired == []
    # Both undone: 0-9 still acquired by "m", delivery count 1, under their first lock.
    assert observable(sp) == before
    assert sp.record_state(0) == InFlightRange(0, 9, Q, 1, "m", clock.now_ms() - 1_000 + LOCK_MS)
    assert (durable(persister), persister.writes, persister.failures[KEY]) == (stored, writes, [])
    # Retried, the request succeeds as a whole, with one write: 0-4 delivered again.
    acked, got = await mgr.acknowledge_and_acquire(
        acks, [KEY], "m", max_records=100, batch_size=100, max_bytes=1 << 20
    )
    assert acked == {KEY: (ErrorCode.none, None)}
    assert spans(got[KEY]) == [(0, 4, 2)] and got[KEY].records == LOG_BATCH
    assert sp.record_state(0) == InFlightRange(0, 4, Q, 2, "m", clock.now_ms() + LOCK_MS)
    # Written: the release (AVAILABLE, the delivery made) and the acceptance; the
    # re-acquisition of 0-4 is transient.
    assert persister.writes == writes + 1
    assert durable(persister) == (0, [PersistedBatch(0, 4, 0, 1), PersistedBatch(5, 9, 2, 1)])
    mgr.stop()


async def test_a_plain_fetch_writes_nothing_so_a_failing_store_fails_only_the_acknowledgement() -> (
    None
):
    mgr, persister, clock = manager()
    assert spans(await fetch(mgr)) == [(0, 9, 1)]
    assert await mgr.acknowledge(KEY, "m", [(0, 4, (RELEASE,)), (5, 9, (ACCEPT,))]) == (
        ErrorCode.none,
        None,
    )
    sp = mgr.partitions[KEY]
    assert sp.record_state(0) == InFlightRange(0, 4, A, 1)
    stored, writes = durable(persister), persister.writes
    assert stored == (0, [PersistedBatch(0, 4, 0, 1), PersistedBatch(5, 9, 2, 1)])
    persister.fail_next(EIO)  # the store's next write fails
    fetched = await fetch(mgr)
    # The fetch hands out exactly the released records, delivery 2, and their batch...
    assert fetched == FetchedPartition(records=LOG_BATCH, acquired=fetched.acquired)
    assert spans(fetched) == [(0, 4, 2)]
    assert sp.record_state(0) == InFlightRange(0, 4, Q, 2, "m", clock.now_ms() + LOCK_MS)
    # ...without a write: the failure still waits for the next one, nothing new is stored.
    assert (persister.failures[KEY], persister.writes, durable(persister)) == (
        [EIO],
        writes,
        stored,
    )
    before = observable(sp)
    # The acknowledgement on the same store is the next write: it fails, the records stay
    # acquired by "m" under their lock.
    code, message = await mgr.acknowledge(KEY, "m", [(0, 4, (ACCEPT,))])
    assert code == ErrorCode.coordinator_not_available and message
    assert observable(sp) == before
    assert (persister.failures[KEY], persister.writes, durable(persister)) == ([], writes, stored)
    assert await mgr.acknowledge(KEY, "m", [(0, 4, (ACCEPT,))]) == (ErrorCode.none, None)
    assert (sp.spso, sp.acquired_count, durable(persister)) == (10, 0, (10, []))
    mgr.stop()


async def test_failed_initializing_write_leaves_nothing_and_a_first_fetch_writes_nothing() -> None:
    mgr, persister, clock = manager()
    persister.fail_next(STORAGE)  # writing the start offset resolved by auto.offset.reset
    failed = await fetch(mgr)
    assert failed.error_code == ErrorCode.coordinator_not_available and not failed.acquired
    assert KEY not in mgr.partitions  # not loaded: the next use starts again
    assert (durable(persister), persister.writes) == ((-1, []), 0)  # still no start offset
    # This time the start offset is written; the write after it would fail, but the first
    # acquisition makes none: the records are handed out and the failure stays queued.
    persister.fail_next(STORAGE, after_successes=1)
    fetched = await fetch(mgr)
    assert fetched == FetchedPartition(records=LOG_BATCH, acquired=fetched.acquired)
    assert spans(fetched) == [(0, 9, 1)]
    sp = mgr.partitions[KEY]
    deadline = clock.now_ms() + LOCK_MS
    assert (sp.spso, sp.speo, sp.acquired_count, sp.next_lock_deadline()) == (0, 10, 10, deadline)
    assert (durable(persister), persister.writes, persister.failures[KEY]) == (
        (0, []),
        1,
        [STORAGE],
    )
    # The failure hits the next write, the lock expiry's release: the records stay acquired.
    clock.advance(LOCK_MS)
    await mgr.settle()
    assert sp.record_state(0) == InFlightRange(0, 9, Q, 1, "m", deadline)
    assert (durable(persister), persister.writes, persister.failures[KEY]) == ((0, []), 1, [])
    # Retried, the release writes them AVAILABLE with the delivery that was made.
    clock.advance(EXPIRY_RETRY_BACKOFF_MS)
    await mgr.settle()
    assert sp.record_state(0) == InFlightRange(0, 9, A, 1)
    assert (durable(persister), persister.writes) == ((0, [PersistedBatch(0, 9, 0, 1)]), 2)
    assert spans(await fetch(mgr)) == [(0, 9, 2)]
    mgr.stop()


async def last_delivery(mgr: SharePartitionManager) -> SharePartition:
    """Records 0-9 acquired by "m" for the last time (delivery count 2 of 2): giving them back
    archives them (and moves SPSO past them), a change that has to be written."""
    await fetch(mgr)
    assert await mgr.acknowledge(KEY, "m", [(0, 9, (RELEASE,))]) == (ErrorCode.none, None)
    assert spans(await fetch(mgr)) == [(0, 9, 2)]
    return mgr.partitions[KEY]


async def test_failed_release_of_a_departed_member_keeps_records_until_their_lock_expires() -> None:
    mgr, persister, clock = manager(delivery_count_limit=2)
    sp = await last_delivery(mgr)
    before = observable(sp)
    persister.fail_next(ENOSPC)
    with capture_logs() as logs:
        assert await mgr.release_member("g", "m") == 0
    assert observable(sp) == before
    failure = next(e for e in logs if e["event"] == "share_state_write_failed")
    assert failure["group"] == "g" and failure["partition"] == 0 and failure["topic"] == "t"
    assert failure["operation"] == "release_member" and failure["member"] == "m"
    # The lock still expires, and the expiry archives them.
    clock.advance(LOCK_MS)
    await mgr.settle()
    assert (sp.spso, sp.speo, sp.acquired_count) == (10, 10, 0)
    assert durable(persister) == (10, [])
    mgr.stop()


async def test_failed_log_start_move_changes_nothing_and_is_retried_on_the_next_fetch() -> None:
    log = FakeLog()
    mgr, persister, _ = manager(log)
    await fetch(mgr)
    assert await mgr.acknowledge(KEY, "m", [(0, 9, (RELEASE,))]) == (ErrorCode.none, None)
    sp = mgr.partitions[KEY]
    before = observable(sp)
    log.log_start_offset = 5
    persister.fail_next(STORAGE)
    failed = await fetch(mgr)
    assert failed.error_code == ErrorCode.coordinator_not_available and not failed.acquired
    assert observable(sp) == before
    assert spans(await fetch(mgr)) == [(5, 9, 2)]
    assert sp.spso == 5
    mgr.stop()


@pytest.mark.parametrize("code", [ErrorCode.fenced_state_epoch, ErrorCode.fenced_leader_epoch])
async def test_fenced_share_state_is_not_leader_or_follower_and_the_partition_is_reloaded(
    code: ErrorCode,
) -> None:
    mgr, persister, _ = manager()
    await fetch(mgr)
    assert await mgr.acknowledge(KEY, "m", [(0, 9, (RELEASE,))]) == (ErrorCode.none, None)
    assert spans(await fetch(mgr)) == [(0, 9, 2)]
    stale = mgr.partitions[KEY]
    # Durable: the first delivery (written by its release), not the second (in flight).
    stored = (0, [PersistedBatch(0, 9, 0, 1)])
    assert durable(persister) == stored
    persister.fail_next(KafkaError(code, "state epoch 0 is older than 1"))
    result = await mgr.acknowledge(KEY, "m", [(0, 9, (ACCEPT,))])
    assert result[0] == ErrorCode.not_leader_or_follower
    assert KEY not in mgr.partitions  # dropped: the next use reads the state afresh
    assert stale.acquired_count == 10 and not stale.change_pending
    assert durable(persister) == stored
    # Read again: the in-flight delivery was never written and is forgotten, so 0-9 go out
    # as delivery 2 again (not 3), to a partition read from the share coordinator.
    assert spans(await fetch(mgr)) == [(0, 9, 2)]
    assert mgr.partitions[KEY] is not stale
    mgr.stop()


async def test_a_fenced_state_is_met_by_the_next_write_not_by_a_plain_fetch() -> None:
    mgr, persister, clock = manager()
    await fetch(mgr, OTHER_KEY)
    assert await mgr.acknowledge(OTHER_KEY, "m", [(0, 9, (RELEASE,))]) == (ErrorCode.none, None)
    stale = mgr.partitions[OTHER_KEY]
    stored = (0, [PersistedBatch(0, 9, 0, 1)])
    assert durable(persister, OTHER_KEY) == stored
    fenced = KafkaError(ErrorCode.fenced_state_epoch)
    persister.fail_next(fenced, key=OTHER_KEY)
    # The fetch writes nothing, so it does not meet the fence: it hands the records out.
    fetched = await fetch(mgr, OTHER_KEY)
    assert fetched == FetchedPartition(records=LOG_BATCH, acquired=fetched.acquired)
    assert spans(fetched) == [(0, 9, 2)]
    assert mgr.partitions[OTHER_KEY] is stale and persister.failures[OTHER_KEY] == [fenced]
    # The next write does: the release of the expired lock.
    with capture_logs() as logs:
        clock.advance(LOCK_MS)
        await mgr.settle()
    assert persister.failures[OTHER_KEY] == []
    failure = next(e for e in logs if e["event"] == "share_state_write_failed")
    assert (failure["operation"], failure["error"], failure["partition"]) == (
        "lock_expiry",
        "not_leader_or_follower",
        1,
    )
    assert [e["partition"] for e in logs if e["event"] == "share_partition_fenced"] == [1]
    assert OTHER_KEY not in mgr.partitions  # dropped, and no expiry retry is armed for it
    assert clock.pending_timers == 0
    assert stale.acquired_count == 10 and not stale.change_pending  # the release undone
    assert durable(persister, OTHER_KEY) == stored
    # Read afresh: delivery 2 was never written, so it is made again.
    assert spans(await fetch(mgr, OTHER_KEY)) == [(0, 9, 2)]
    assert mgr.partitions[OTHER_KEY] is not stale
    mgr.stop()


async def test_unexpected_persister_exception_is_unknown_server_error_for_that_partition_only() -> (
    None
):
    mgr, persister, _ = manager()
    await fetch(mgr)
    await fetch(mgr, OTHER_KEY)
    sp = mgr.partitions[KEY]
    before = observable(sp)
    persister.fail_next(ValueError("a bug in the coordinator"))
    with capture_logs() as logs:
        code, _ = await mgr.acknowledge(KEY, "m", [(0, 9, (ACCEPT,))])
    assert code == ErrorCode.unknown_server_error
    assert observable(sp) == before
    failure = next(e for e in logs if e["event"] == "share_state_write_failed")
    assert failure["exc_info"] is not None and failure["operation"] == "acknowledge"
    assert await mgr.acknowledge(OTHER_KEY, "m", [(0, 9, (ACCEPT,))]) == (ErrorCode.none, None)
    assert await mgr.acknowledge(KEY, "m", [(0, 9, (ACCEPT,))]) == (ErrorCode.none, None)
    mgr.stop()


@pytest.mark.parametrize(
    ("failure", "code"),
    [
        (KafkaError(ErrorCode.fenced_state_epoch), ErrorCode.not_leader_or_follower),
        (KafkaError(ErrorCode.fenced_leader_epoch), ErrorCode.not_leader_or_follower),
        (KafkaError(ErrorCode.not_coordinator), ErrorCode.coordinator_not_available),
        (KafkaError(ErrorCode.coordinator_load_in_progress), ErrorCode.coordinator_not_available),
        (KafkaError(ErrorCode.kafka_storage_error), ErrorCode.coordinator_not_available),
        (KafkaError(ErrorCode.group_id_not_found), ErrorCode.group_id_not_found),
        (KafkaError(ErrorCode.invalid_request, "bad batch"), ErrorCode.unknown_server_error),
        (EIO, ErrorCode.coordinator_not_available),
        (ENOSPC, ErrorCode.coordinator_not_available),
        (ValueError("bug"), ErrorCode.unknown_server_error),
    ],
)
def test_share_coordinator_errors_map_as_kafka_tells_share_clients(
    failure: Exception, code: ErrorCode
) -> None:
    assert persister_error(failure).code == code


# -- changes of one partition are serialized -------------------------------------------------


@pytest.mark.parametrize("write_fails", [False, True], ids=["written", "failed"])
async def test_fetch_skips_a_partition_whose_write_is_in_flight_and_is_woken_when_it_is_done(
    write_fails: bool,
) -> None:
    """As Kafka's share fetch try-acquires a share partition's fetch lock: a fetch does not
    wait for another request's change of a partition, it skips it (taking nothing the
    write may yet give back), and the lock's release wakes it to look again."""
    mgr, persister, clock = manager()
    assert spans(await fetch(mgr)) == [(0, 9, 1)]
    sp = mgr.partitions[KEY]
    held = sp.record_state(0)
    assert held == InFlightRange(0, 9, Q, 1, "m", clock.now_ms() + LOCK_MS)
    persister.gate = asyncio.Event()
    if write_fails:
        persister.fail_next(STORAGE)
    release = asyncio.ensure_future(mgr.acknowledge(KEY, "m", [(0, 9, (RELEASE,))]))
    await asyncio.sleep(0)
    # Released in memory, not durable yet: the write holds the partition's lock.
    assert sp.change_pending and sp.record_state(0) == InFlightRange(0, 9, A, 1)
    with Wakeup([mgr.listeners(KEY)]) as wakeup:
        got = await asyncio.wait_for(
            mgr.acquire(KEY, "m2", max_records=100, batch_size=100, max_bytes=1 << 20), 5
        )
        assert got == FetchedPartition()
        assert sp.change_pending and sp.acquired_count == 0
        persister.gate.set()
        acked = await release
        # Woken by the lock's release (the wait returns at once; the timer never fires).
        await asyncio.wait_for(wakeup.wait(3600, clock=clock), 5)
    assert not sp.change_pending
    got = await mgr.acquire(KEY, "m2", max_records=100, batch_size=100, max_bytes=1 << 20)
    if write_fails:
        assert acked[0] == ErrorCode.coordinator_not_available
        # The release was undone: 0-9 are "m"'s again, and "m2" gets nothing, no error.
        assert got == FetchedPartition()
        assert sp.record_state(0) == held
        assert (durable(persister), persister.writes) == ((0, []), 1)
    else:
        assert acked == (ErrorCode.none, None)
        # Built on the committed release: delivery 2, to "m2"; the fetch wrote nothing.
        assert got == FetchedPartition(records=LOG_BATCH, acquired=got.acquired)
        assert spans(got) == [(0, 9, 2)]
        assert sp.record_state(0) == InFlightRange(0, 9, Q, 2, "m2", clock.now_ms() + LOCK_MS)
        assert (durable(persister), persister.writes) == ((0, [PersistedBatch(0, 9, 0, 1)]), 2)
    mgr.stop()


async def test_lock_expiry_waits_for_an_acknowledgement_in_flight() -> None:
    mgr, persister, clock = manager()
    await fetch(mgr)
    persister.gate = asyncio.Event()
    persister.fail_next(STORAGE)
    ack = asyncio.ensure_future(mgr.acknowledge(KEY, "m", [(0, 9, (ACCEPT,))]))
    await asyncio.sleep(0)
    sp = mgr.partitions[KEY]
    assert sp.change_pending and sp.acquired_count == 0  # accepted in memory, not durable
    clock.advance(LOCK_MS)  # the lock is due while the acknowledgement is being written
    await asyncio.sleep(0)
    assert sp.change_pending  # the expiry waits for the acknowledgement to finish
    persister.gate.set()
    assert (await ack)[0] == ErrorCode.coordinator_not_available
    await mgr.settle()
    # The acknowledgement was rolled back, then the expiry released the records.
    assert mgr.partitions[KEY].record_state(0) == InFlightRange(0, 9, A, 1)
    mgr.stop()


# -- time: lock expiry, renew and idle unloading on a ManualClock ------------------------------


async def test_lock_expires_exactly_at_its_deadline() -> None:
    mgr, _, clock = manager()
    woken: list[int] = []
    await fetch(mgr)
    mgr.add_listener(KEY, lambda: woken.append(clock.now_ms()))
    sp = mgr.partitions[KEY]
    deadline = sp.next_lock_deadline()
    assert deadline == clock.now_ms() + LOCK_MS
    clock.advance(LOCK_MS - 1)
    await mgr.settle()
    assert sp.acquired_count == 10 and not woken
    clock.advance(1)
    await mgr.settle()
    assert sp.record_state(0) == InFlightRange(0, 9, A, 1)
    assert woken == [deadline]
    mgr.stop()


async def test_renew_moves_the_lock_deadline() -> None:
    mgr, _, clock = manager()
    await fetch(mgr)
    sp = mgr.partitions[KEY]
    clock.advance(10_000)
    assert await mgr.acknowledge(KEY, "m", [(0, 9, (RENEW,))]) == (ErrorCode.none, None)
    renewed = clock.now_ms() + LOCK_MS
    assert sp.next_lock_deadline() == renewed
    clock.advance(LOCK_MS - 10_000)  # the original deadline: nothing is released
    await mgr.settle()
    assert sp.acquired_count == 10
    clock.advance(10_000 - 1)
    await mgr.settle()
    assert sp.acquired_count == 10
    clock.advance(1)
    await mgr.settle()
    assert clock.now_ms() == renewed
    assert sp.acquired_count == 0 and sp.next_fetch_offset() == 0
    mgr.stop()


async def test_failed_expiry_write_is_retried_on_a_later_tick_and_then_succeeds() -> None:
    mgr, persister, clock = manager(delivery_count_limit=2)
    sp = await last_delivery(mgr)
    before = observable(sp)
    persister.fail_next(EIO)
    with capture_logs() as logs:
        clock.advance(LOCK_MS)
        await mgr.settle()
    assert observable(sp) == before  # still acquired: the release is not durable
    failure = next(e for e in logs if e["event"] == "share_state_write_failed")
    assert failure["operation"] == "lock_expiry" and failure["partition"] == 0
    assert failure["error"] == "coordinator_not_available"
    clock.advance(EXPIRY_RETRY_BACKOFF_MS - 1)
    await mgr.settle()
    assert sp.acquired_count == 10
    clock.advance(1)
    await mgr.settle()
    assert (sp.spso, sp.speo, sp.acquired_count) == (10, 10, 0)  # archived at the limit
    assert durable(persister) == (10, [])
    mgr.stop()


async def test_expiry_survives_an_exception_and_keeps_expiring_other_partitions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mgr, _, clock = manager()
    await fetch(mgr)
    await fetch(mgr, OTHER_KEY)
    broken = mgr.partitions[KEY]
    real = SharePartition.expire_locks

    def expire_locks(self: SharePartition, now_ms: int) -> object:
        if self is broken:
            raise RuntimeError("bug")
        return real(self, now_ms)

    monkeypatch.setattr(SharePartition, "expire_locks", expire_locks)
    with capture_logs() as logs:
        clock.advance(LOCK_MS)
        await mgr.settle()
    assert any(e["event"] == "share_lock_expiry_failed" for e in logs)
    assert mgr.partitions[OTHER_KEY].acquired_count == 0
    assert broken.acquired_count == 10 and not broken.change_pending
    monkeypatch.undo()
    clock.advance(EXPIRY_RETRY_BACKOFF_MS)
    await mgr.settle()
    assert broken.acquired_count == 0
    mgr.stop()


async def test_idle_partition_is_unloaded_after_the_idle_time_only_when_nothing_is_acquired() -> (
    None
):
    mgr, persister, clock = manager()
    mgr.start()
    fetched = await fetch(mgr)
    assert spans(fetched) == [(0, 9, 1)]
    clock.advance(2 * IDLE_MS)
    assert KEY in mgr.partitions  # records are held: stays loaded
    assert await mgr.acknowledge(KEY, "m", [(0, 9, (ACCEPT,))]) == (ErrorCode.none, None)
    clock.advance(IDLE_MS - 1)
    assert KEY in mgr.partitions
    clock.advance(1)
    assert KEY not in mgr.partitions
    # Reloaded from the share coordinator: the accepted records are not delivered again.
    again = await fetch(mgr)
    assert again.acquired == []
    assert mgr.partitions[KEY].spso == 10
    assert durable(persister) == (10, [])
    mgr.stop()


async def test_recently_used_partition_is_not_unloaded() -> None:
    mgr, _, clock = manager()
    mgr.start()
    fetched = await fetch(mgr)
    await mgr.acknowledge(
        KEY, "m", [(r.first_offset, r.last_offset, (ACCEPT,)) for r in fetched.acquired]
    )
    for _ in range(5):
        clock.advance(IDLE_MS - SWEEP_MS)
        await fetch(mgr)  # used again before it went idle
        assert KEY in mgr.partitions
    mgr.stop()
    clock.advance(10 * IDLE_MS)
    assert KEY in mgr.partitions and clock.pending_timers == 0  # stopped: no sweep


async def test_partition_with_a_write_in_flight_is_not_unloaded() -> None:
    mgr, persister, clock = manager()
    await fetch(mgr)
    persister.gate = asyncio.Event()
    persister.fail_next(STORAGE)
    ack = asyncio.ensure_future(mgr.acknowledge(KEY, "m", [(0, 9, (ACCEPT,))]))
    await asyncio.sleep(0)
    sp = mgr.partitions[KEY]
    assert sp.change_pending and sp.acquired_count == 0  # looks idle, but may be undone
    clock.advance(IDLE_MS)
    assert mgr.unload_idle(clock.now_ms()) == 0
    persister.gate.set()
    assert (await ack)[0] == ErrorCode.coordinator_not_available
    assert mgr.partitions[KEY] is sp and sp.acquired_count == 10
    assert await mgr.acknowledge(KEY, "m", [(0, 9, (ACCEPT,))]) == (ErrorCode.none, None)
    mgr.stop()


# -- background work is logged, never lost -----------------------------------------------------


async def test_spawned_task_failure_is_logged_with_its_context() -> None:
    async def fails() -> None:
        raise OSError(errno.EIO, "Input/output error")

    tasks: set[asyncio.Future[object]] = set()
    with capture_logs() as logs:
        task = spawn(fails(), what="release_member", tasks=tasks, group="g", member="m")
        await asyncio.gather(task, return_exceptions=True)
    assert not tasks
    [entry] = [e for e in logs if e["event"] == "background_task_failed"]
    assert entry["task"] == "release_member" and entry["group"] == "g" and entry["member"] == "m"
    assert isinstance(entry["exc_info"], OSError)


def test_guarded_timer_callback_logs_and_swallows_its_exception() -> None:
    clock = ManualClock()
    ran: list[int] = []

    def tick() -> None:
        ran.append(clock.now_ms())
        raise RuntimeError("bug")

    clock.call_at(clock.now_ms() + 5, guarded(tick, what="sweep", group="g"))
    with capture_logs() as logs:
        assert clock.advance(5) == 1
    assert ran and logs[0]["event"] == "background_task_failed" and logs[0]["task"] == "sweep"


# -- acquiring while the records' own fsync runs ---------------------------------------------


class SyncingLog(FakeLog):
    """Offsets 0-9 appended, their fsync in flight: the high watermark is still 0 until
    the test ends the fsync (`synced`) or fails it (`failed`)."""

    def __init__(self) -> None:
        super().__init__(high_watermark=0, last_stable_offset=0)
        self._done = asyncio.Event()
        self._error: KafkaError | None = None
        # Per wait_durable call: whether it waited as a delivery.
        self.waits: list[bool] = []

    @property
    def log_end_offset(self) -> int:
        return 10

    def synced(self) -> None:
        self.high_watermark = self.last_stable_offset = 10
        self._done.set()

    def failed(self) -> None:
        self._error = KafkaError(ErrorCode.kafka_storage_error, "fsync failed: EIO")
        self._done.set()

    async def wait_durable(
        self, last_offset: int, timeout_s: float, *, delivery: bool = False
    ) -> None:
        self.waits.append(delivery)
        await self._done.wait()
        if self._error is not None:
            raise self._error


async def test_records_are_acquired_while_their_fsync_runs_and_handed_out_once_durable() -> None:
    log = SyncingLog()
    mgr, persister, clock = manager(log)
    fetching = asyncio.create_task(fetch(mgr))
    for _ in range(20):
        await asyncio.sleep(0)
    # Acquired in memory, but not handed out: their log is not synced. Nothing is written
    # for the acquisition (the share coordinator holds the start offset only).
    assert not fetching.done()
    sp = mgr.partitions[KEY]
    assert sp.record_state(0) == InFlightRange(0, 9, Q, 1, "m", clock.now_ms() + LOCK_MS)
    assert (durable(persister), persister.writes) == ((0, []), 1)
    # The wait holds no lock of the partition: another member's fetch is answered meanwhile
    # (nothing is left for it to acquire).
    other = mgr.acquire(KEY, "m2", max_records=100, batch_size=100, max_bytes=1 << 20)
    assert await asyncio.wait_for(other, 5) == FetchedPartition()
    log.synced()
    fetched = await asyncio.wait_for(fetching, 5)
    # Waited as a delivery: resumed ahead of the producers on the same fsync.
    assert log.waits == [True]
    assert fetched == FetchedPartition(records=LOG_BATCH, acquired=fetched.acquired)
    assert spans(fetched) == [(0, 9, 1)]
    assert (durable(persister), persister.writes) == ((0, []), 1)
    mgr.stop()


async def test_a_failed_log_fsync_answers_the_error_and_the_records_stay_acquired() -> None:
    log = SyncingLog()
    mgr, persister, clock = manager(log)
    fetching = asyncio.create_task(fetch(mgr))
    for _ in range(20):
        await asyncio.sleep(0)
    log.failed()
    fetched = await asyncio.wait_for(fetching, 5)
    # The client gets the storage error and no records; the acquisition stays, in memory
    # only (never written), until its lock expires.
    assert (fetched.error_code, fetched.records, fetched.acquired) == (
        ErrorCode.kafka_storage_error,
        b"",
        [],
    )
    sp = mgr.partitions[KEY]
    assert sp.record_state(0) == InFlightRange(0, 9, Q, 1, "m", clock.now_ms() + LOCK_MS)
    assert (durable(persister), persister.writes) == ((0, []), 1)
    clock.advance(LOCK_MS)
    await mgr.settle()
    # The expiry releases them and writes the delivery that was made.
    assert sp.acquired_count == 0 and sp.next_fetch_offset() == 0
    assert sp.record_state(0) == InFlightRange(0, 9, A, 1)
    assert (durable(persister), persister.writes) == ((0, [PersistedBatch(0, 9, 0, 1)]), 2)
    mgr.stop()


async def test_read_committed_acquires_only_below_the_last_stable_offset() -> None:
    log = SyncingLog()
    mgr, _, _ = manager(log)
    mgr.groups.group_config = GroupConfig.effective(  # type: ignore[attr-defined]
        {"share.auto.offset.reset": "earliest", "share.isolation.level": "read_committed"}
    )
    # Nothing is stable yet: nothing is acquired, and the fetch does not wait.
    fetched = await asyncio.wait_for(fetch(mgr), 5)
    assert fetched.acquired == [] and mgr.partitions[KEY].acquired_count == 0
