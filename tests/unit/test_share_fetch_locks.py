"""No share request waits on another without a bound (Kafka's share fetch try-acquires a
share partition's fetch lock, SharePartition.maybeAcquireFetchLock, and skips partitions
it cannot lock).

Two ShareFetches once deadlocked: each held the lock of a partition it had nothing to do
on and waited for one the other held, the two taking partitions in different (rotated)
orders, while a third request's write made them wait at all. Each scenario here is bounded
by `asyncio.wait_for`, so the old behaviour fails instead of hanging the suite; waits that
are meant to time out run on a ManualClock.
"""

from __future__ import annotations

import asyncio
import errno
import uuid
from dataclasses import dataclass
from unittest.mock import Mock

import pytest

from broker.partitions import Wakeup
from broker.share.locks import FetchLocks
from broker.share.manager import LOCK_WAIT_MS, FetchedPartition, SharePartitionManager
from broker.share.partition import InFlightRange, RecordState
from coordinator.share_state import ShareState, ShareStateKey
from persister.clock import ManualClock
from protocol.errors import ErrorCode
from protocol.records import NewRecord, build_batch
from tests.unit.test_share_manager import ACCEPT, LOCK_MS, FakeLog, manager, spans

TOPIC = uuid.UUID(int=7)
X, Y, Z = (ShareStateKey("g", TOPIC, p) for p in range(3))
BOUND_S = 5.0  # far above what any scenario needs; only a hang reaches it
Q = RecordState.ACQUIRED


async def fetch(
    mgr: SharePartitionManager, keys: list[ShareStateKey], member: str = "m"
) -> dict[ShareStateKey, FetchedPartition]:
    return await mgr.acquire_many(keys, member, max_records=100, batch_size=100, max_bytes=1 << 20)


async def turns(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_two_fetches_in_opposite_orders_behind_a_third_write_never_deadlock() -> None:
    mgr, persister, _ = manager()
    got = await fetch(mgr, [X, Y, Z])  # "m" holds every record: later fetches get nothing
    assert {k: spans(f) for k, f in got.items()} == {k: [(0, 9, 1)] for k in (X, Y, Z)}
    persister.gate = asyncio.Event()
    # C: an acknowledgement of Z, its write held at the gate (Z's lock held meanwhile).
    c = asyncio.ensure_future(mgr.acknowledge(Z, "m", [(0, 9, (ACCEPT,))]))
    await turns()
    # A fetches X then Z (busy), then Y; B fetches Y then X: rotated orders.
    a = asyncio.ensure_future(fetch(mgr, [X, Z, Y], "a"))
    await turns()
    b = asyncio.ensure_future(fetch(mgr, [Y, X], "b"))
    await turns()
    persister.gate.set()
    # Before the fix A held X waiting for Z then Y, and B held Y waiting for X: forever.
    done_a, done_b, acked = await asyncio.wait_for(asyncio.gather(a, b, c), BOUND_S)
    assert acked == (ErrorCode.none, None)
    assert all(not f.acquired and f.error_code == ErrorCode.none for f in done_a.values())
    assert all(not f.acquired and f.error_code == ErrorCode.none for f in done_b.values())
    assert len(mgr._locks) == 0
    mgr.stop()


async def test_a_fetch_never_waits_for_a_lock_and_gets_the_partitions_it_could_take() -> None:
    mgr, persister, clock = manager()
    await fetch(mgr, [X, Y])
    got = await fetch(mgr, [Z], "other")  # Z loaded, its records acquired by "other"
    persister.gate = asyncio.Event()
    c = asyncio.ensure_future(mgr.acknowledge(X, "m", [(0, 9, (2,))]))  # RELEASE, gated
    await turns()
    # X is busy with the release: skipped at once; Y and Z hold nothing for "n".
    got = await asyncio.wait_for(fetch(mgr, [X, Y, Z], "n"), BOUND_S)
    assert X not in got
    persister.gate.set()
    assert await c == (ErrorCode.none, None)
    # Now free: the released records go to the next fetch, delivery 2.
    got = await fetch(mgr, [X], "n")
    assert spans(got[X]) == [(0, 9, 2)]
    assert mgr.partitions[X].record_state(0) == InFlightRange(
        0, 9, Q, 2, "n", clock.now_ms() + LOCK_MS
    )
    mgr.stop()


async def test_acknowledgements_wait_for_a_busy_partition_and_are_applied() -> None:
    mgr, persister, _ = manager()
    await fetch(mgr, [X, Y])
    persister.gate = asyncio.Event()
    first = asyncio.ensure_future(mgr.acknowledge(X, "m", [(0, 4, (ACCEPT,))]))
    await turns()
    # Two requests acknowledge X and Y in opposite orders: locks are taken in one order.
    second = asyncio.ensure_future(
        mgr.acknowledge_many({Y: [(0, 9, (ACCEPT,))], X: [(5, 9, (ACCEPT,))]}, "m")
    )
    third = asyncio.ensure_future(
        mgr.acknowledge_many({X: [(5, 9, (ACCEPT,))], Y: [(0, 9, (ACCEPT,))]}, "m")
    )
    await turns()
    assert not second.done() and not third.done()
    persister.gate.set()
    r1, r2, r3 = await asyncio.wait_for(asyncio.gather(first, second, third), BOUND_S)
    assert r1 == (ErrorCode.none, None)
    assert r2 == {Y: (ErrorCode.none, None), X: (ErrorCode.none, None)}
    # The same records again, answered too: below the SPSO now, so done already.
    assert r3 == {X: (ErrorCode.none, None), Y: (ErrorCode.none, None)}
    assert mgr.partitions[X].acquired_count == mgr.partitions[Y].acquired_count == 0
    mgr.stop()


async def test_an_acknowledgement_of_a_partition_busy_too_long_fails_with_request_timed_out() -> (
    None
):
    mgr, persister, clock = manager()
    await fetch(mgr, [X, Y])
    persister.gate = asyncio.Event()
    holder = asyncio.ensure_future(mgr.acknowledge(X, "m", [(0, 4, (ACCEPT,))]))
    await turns()
    waiting = asyncio.ensure_future(
        mgr.acknowledge_many({X: [(5, 9, (ACCEPT,))], Y: [(0, 9, (ACCEPT,))]}, "m")
    )
    await turns()
    clock.advance(LOCK_WAIT_MS - 1)
    await turns()
    assert not waiting.done()
    clock.advance(1)  # the bound, on the injected clock
    await turns()
    assert not waiting.done()  # Y's acknowledgement is being written (the gate)
    persister.gate.set()
    results = await asyncio.wait_for(waiting, BOUND_S)
    assert results[Y] == (ErrorCode.none, None)
    code, message = results[X]
    assert code == ErrorCode.request_timed_out and message and "busy" in message
    assert await holder == (ErrorCode.none, None)
    # Not applied, not lost: 5-9 are still "m"'s, to acknowledge again.
    still = mgr.partitions[X].record_state(5)
    assert still is not None and still.state == Q
    assert await mgr.acknowledge(X, "m", [(5, 9, (ACCEPT,))]) == (ErrorCode.none, None)
    mgr.stop()


async def test_a_fetch_woken_by_a_skipped_partition_being_let_go() -> None:
    mgr, persister, clock = manager()
    await fetch(mgr, [X])
    persister.gate = asyncio.Event()
    release = asyncio.ensure_future(mgr.acknowledge(X, "m", [(0, 9, (2,))]))
    await turns()
    with Wakeup([mgr.listeners(X)]) as wakeup:
        assert X not in await fetch(mgr, [X], "n")  # skipped: busy
        parked = asyncio.ensure_future(wakeup.wait(3600, clock=clock))
        await turns()
        assert not parked.done()
        persister.gate.set()
        await release
        await asyncio.wait_for(parked, BOUND_S)  # woken by the release, not the timer
    assert spans((await fetch(mgr, [X], "n"))[X]) == [(0, 9, 2)]
    mgr.stop()


# -- FetchLocks itself -------------------------------------------------------------------


async def test_fetch_locks_hand_over_in_order_and_time_out_on_the_clock() -> None:
    clock = ManualClock()
    freed: list[str] = []
    locks: FetchLocks[str] = FetchLocks(clock, on_free=freed.append)
    assert locks.try_acquire("k") and not locks.try_acquire("k")
    first = asyncio.ensure_future(locks.acquire("k", 100))
    second = asyncio.ensure_future(locks.acquire("k", 50))
    await turns()
    clock.advance(50)
    await turns()
    assert second.done() and second.result() is False  # timed out on the clock
    locks.release("k")
    assert await first is True and locks.held("k")
    assert freed == []  # handed over, not freed
    locks.release("k")
    assert freed == ["k"] and "k" not in locks  # the try-acquire that failed is woken
    assert clock.pending_timers == 0


async def test_fetch_locks_a_waiter_cancelled_as_it_is_handed_the_lock_lets_it_go() -> None:
    locks: FetchLocks[str] = FetchLocks(ManualClock())
    assert locks.try_acquire("k")
    waiter = asyncio.ensure_future(locks.acquire("k", 1000))
    await turns()
    locks.release("k")  # handed to the waiter
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert "k" not in locks and locks.try_acquire("k")


async def test_fetch_locks_ordered_takes_keys_in_one_order_within_one_bound() -> None:
    clock = ManualClock()
    locks: FetchLocks[str] = FetchLocks(clock)
    assert locks.try_acquire("b")
    taking = asyncio.ensure_future(locks.ordered(["c", "b", "a"], 100))
    await turns()
    assert locks.held("a") and not locks.held("c")  # a, then waiting for b
    clock.advance(100)
    taken, missed = await asyncio.wait_for(taking, BOUND_S)
    assert (taken, missed) == (["a", "c"], ["b"])


async def test_a_closing_members_release_waits_for_a_fetch_still_loading_its_partition() -> None:
    # Kafka's releaseSession takes each share partition's lock; a partition a fetch of the
    # same member is loading (first use, its share state being read) is not in memory yet,
    # but it is locked: the release must wait for it, not skip it and leave what the fetch
    # acquires locked to a gone member until share.record.lock.duration.ms.
    mgr, persister, _ = manager()
    loading = asyncio.Event()
    read_state = persister.read_state

    async def gated_read(key: ShareStateKey, leader_epoch: int) -> ShareState:
        await loading.wait()
        return await read_state(key, leader_epoch)

    persister.read_state = gated_read  # type: ignore[method-assign]
    fetching = asyncio.ensure_future(fetch(mgr, [X], "m"))
    await turns()
    assert X in mgr._locks and X not in mgr.partitions  # loading, under X's lock
    releasing = asyncio.ensure_future(mgr.release_member("g", "m", [X]))
    await turns()
    loading.set()
    got, released = await asyncio.wait_for(asyncio.gather(fetching, releasing), BOUND_S)
    assert spans(got[X]) == [(0, 9, 1)]  # acquired before the release took the lock
    assert released == 10
    assert mgr.partitions[X].acquired_count == 0
    assert len(mgr._locks) == 0
    mgr.stop()


async def test_a_log_read_failing_after_the_acknowledgements_leaves_no_change_pending() -> None:
    # A ShareFetch applies its acknowledgements in memory, then reads the log to acquire
    # on top of them. When that read fails (an I/O error on a segment) the request fails,
    # but the partition must be left as it was: a change left pending would refuse every
    # later acknowledgement, fetch and lock expiry of the partition (ChangePending).
    log = FakeLog(high_watermark=20, last_stable_offset=20)
    mgr, _, _ = manager(log)
    assert spans((await fetch(mgr, [X]))[X]) == [(0, 9, 1)]
    log.read = Mock(side_effect=OSError(errno.EIO, "Input/output error"))  # type: ignore[method-assign]
    with pytest.raises(OSError):
        await mgr.acknowledge_and_acquire(
            {X: [(0, 9, (ACCEPT,))]}, [X], "m", max_records=100, batch_size=100, max_bytes=1 << 20
        )
    assert not mgr.partitions[X].change_pending
    assert len(mgr._locks) == 0
    # Not applied, not lost: the same acknowledgement succeeds when sent again.
    assert mgr.partitions[X].acquired_count == 10
    assert await mgr.acknowledge(X, "m", [(0, 9, (ACCEPT,))]) == (ErrorCode.none, None)
    mgr.stop()


async def test_a_closing_members_release_sees_a_partition_its_fetch_loads_while_it_waits() -> None:
    # A ShareFetch of "m" waits for X's lock (its acknowledgements of X), behind a write;
    # the session closes meanwhile and the release queues on X too. The fetch then loads
    # Y (never used before) and acquires there: the release, which gets X after the fetch,
    # must release Y's records as well, not only the partitions loaded when it began.
    mgr, persister, _ = manager()
    await fetch(mgr, [X])
    persister.gate = asyncio.Event()
    holder = asyncio.ensure_future(mgr.acknowledge(X, "m", [(0, 4, (ACCEPT,))]))
    await turns()
    fetching = asyncio.ensure_future(
        mgr.acknowledge_and_acquire(
            {X: [(5, 9, (ACCEPT,))]},
            [X, Y],
            "m",
            max_records=100,
            batch_size=100,
            max_bytes=1 << 20,
        )
    )
    await turns()
    releasing = asyncio.ensure_future(mgr.release_member("g", "m", [X, Y]))
    await turns()
    persister.gate.set()
    acked, got = await asyncio.wait_for(fetching, BOUND_S)
    assert acked == {X: (ErrorCode.none, None)}
    assert spans(got[Y]) == [(0, 9, 1)]
    assert await asyncio.wait_for(releasing, BOUND_S) == 10
    assert await holder == (ErrorCode.none, None)
    assert mgr.partitions[Y].acquired_count == 0
    assert len(mgr._locks) == 0
    mgr.stop()


@dataclass
class GrowingLog(FakeLog):
    """Batches of ten records, one more each time `append` is called."""

    batches: int = 1

    def append(self) -> None:
        self.batches += 1
        self.high_watermark = self.last_stable_offset = 10 * self.batches

    def read(
        self,
        offset: int,
        max_bytes: int,
        *,
        committed_only: bool = False,
        beyond_high_watermark: bool = False,
    ) -> bytes:
        first = offset - offset % 10
        return b"".join(
            build_batch([NewRecord(None, b"v%d" % i) for i in range(10)], base_offset=base)
            for base in range(first, self.high_watermark, 10)
        )


@pytest.mark.parametrize("write", ["succeeds", "fails"])
async def test_a_fetch_takes_new_records_beside_an_acknowledgement_being_written(
    write: str,
) -> None:
    """Kafka's fetch does not wait for an acknowledgement's persister write: new records
    appended meanwhile are acquired at once; whether the write then succeeds or fails,
    they stay the fetching member's, and the acknowledgement is applied or undone."""
    log = GrowingLog()
    mgr, persister, _ = manager(log)
    await fetch(mgr, [X], "m")  # m holds 0-9
    persister.gate = asyncio.Event()
    if write == "fails":
        persister.fail_next(OSError(errno.EIO, "disk gone"), X)
    acked = asyncio.ensure_future(mgr.acknowledge(X, "m", [(0, 9, (ACCEPT,))]))
    await turns()
    log.append()  # offsets 10-19
    got = await asyncio.wait_for(fetch(mgr, [X], "n"), BOUND_S)
    assert spans(got[X]) == [(10, 19, 1)]  # without waiting for the write
    assert not acked.done()
    persister.gate.set()
    code, _ = await acked
    sp = mgr.partitions[X]
    assert sp.record_state(15) is not None and sp.record_state(15).member_id == "n"  # type: ignore[union-attr]
    if write == "succeeds":
        assert code == ErrorCode.none and sp.spso == 10
    else:
        assert code != ErrorCode.none and sp.spso == 0
        assert sp.record_state(5).member_id == "m"  # type: ignore[union-attr]
    assert sp.speo == 20
    mgr.stop()
