"""Releasing a member's records, and expiring locks, in one pass over fragmented ranges.

`release_member` and `expire_locks` give back every range at once (`_release`). The oracle
kept here is the way they worked before: `_apply` on each ACQUIRED range, one at a time,
then `_finish`. Both must leave the same in-flight state and write the same StateUpdate,
whatever the fragmentation (per-offset KIP-932 acknowledge types, several members, locks
taken at different times, records at share.delivery.count.limit), and a failed write must
put back exactly what was there. What is stored, before and after the update is written
over it, is checked against KIP-932's durable view worked out here (`kip_durable`), not
by the code under test: ACQUIRED is transient, so every released record is written, as
AVAILABLE with the delivery made or ARCHIVED at the limit.
"""

from __future__ import annotations

import collections
import copy
import itertools
import uuid
from collections.abc import Callable, Iterable

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.share.partition import (
    AcknowledgeType,
    Event,
    InFlightRange,
    OffsetRange,
    PendingChange,
    RecordState,
    ReleaseResult,
    SharePartition,
    SharePartitionConfig,
    StateUpdate,
)
from coordinator.share_state import PersistedBatch
from persister.clock import ManualClock

LOCK_MS = 1_000
MEMBERS = ("m1", "m2", "m3")


def new_partition(records: int, limit: int = 5) -> SharePartition:
    return SharePartition(
        "group",
        uuid.UUID(int=9),
        0,
        config=SharePartitionConfig(
            record_lock_duration_ms=LOCK_MS,
            delivery_count_limit=limit,
            max_in_flight_records=records + 1,
        ),
        state_epoch=0,
        start_offset=0,
    )


def fragmented(records: int, limit: int = 5) -> SharePartition:
    """Offset 0 held by another member (SPSO stays), then 1..records acquired by "m",
    acknowledged ACCEPT, RELEASE, ACCEPT, ... and the released half acquired again: one
    single-offset ACQUIRED range between each two ACKNOWLEDGED ones."""
    sp = new_partition(records, limit)
    sp.acquire("other", [(0, 0)], max_records=1, batch_size=1, now_ms=0).change.commit()
    sp.acquire(
        "m", [(1, records)], max_records=records, batch_size=records, now_ms=0
    ).change.commit()
    types = [
        AcknowledgeType.ACCEPT if offset % 2 == 0 else AcknowledgeType.RELEASE
        for offset in range(1, records + 1)
    ]
    sp.acknowledge("m", [(1, records, types)], now_ms=10).change.commit()
    sp.acquire(
        "m", [(1, records)], max_records=records, batch_size=records, now_ms=20
    ).change.commit()
    return sp


def release_range_by_range(
    sp: SharePartition, event: Event, holds: Callable[[InFlightRange], bool]
) -> tuple[list[OffsetRange], list[OffsetRange], PendingChange]:
    """The old way: `_apply` to each held ACQUIRED range in turn, then `_finish`."""
    sp._start()
    firsts = [
        r.first_offset
        for r in sp.in_flight_ranges()
        if r.state is RecordState.ACQUIRED and holds(r)
    ]
    available: list[OffsetRange] = []
    archived: list[OffsetRange] = []
    for first in firsts:
        record = sp._range_at(first)
        for _, new in sp._apply(first, record.last_offset, event):
            target = archived if new.state is RecordState.ARCHIVED else available
            target.append(OffsetRange(new.first_offset, new.last_offset))
    return joined(available), joined(archived), sp._finish()


def durable(start_offset: int, batches: Iterable[PersistedBatch]) -> dict[int, tuple[int, int]]:
    """Per offset (state, delivery count) of what is stored at or above the start offset."""
    return {
        offset: (batch.delivery_state, batch.delivery_count)
        for batch in batches
        for offset in range(max(batch.first_offset, start_offset), batch.last_offset + 1)
    }


def written(stored: dict[int, tuple[int, int]], update: StateUpdate) -> dict[int, tuple[int, int]]:
    """What the share coordinator keeps: newer batches win, offsets below the start go."""
    merged = {**stored, **durable(update.start_offset, update.state_batches)}
    return {offset: value for offset, value in merged.items() if offset >= update.start_offset}


def kip_durable(sp: SharePartition) -> dict[int, tuple[int, int]]:
    """Per offset (state, delivery count) KIP-932 stores for the in-flight state: an
    ACQUIRED record with count n as AVAILABLE with n - 1 (the acquisition is transient),
    and no state batch for AVAILABLE with count 0 (never delivered)."""
    out: dict[int, tuple[int, int]] = {}
    for r in sp.in_flight_ranges():
        if r.state is _Q:
            value = (int(_A), r.delivery_count - 1)
        else:
            value = (int(r.state), r.delivery_count)
        if value != (int(_A), 0):
            out.update(dict.fromkeys(range(r.first_offset, r.last_offset + 1), value))
    return out


def joined(spans: list[OffsetRange] | tuple[OffsetRange, ...]) -> list[OffsetRange]:
    out: list[OffsetRange] = []
    for first, last in spans:
        if out and out[-1].last_offset + 1 == first:
            out[-1] = OffsetRange(out[-1].first_offset, last)
        else:
            out.append(OffsetRange(first, last))
    return out


def state(sp: SharePartition) -> tuple[object, ...]:
    """Everything observable, plus the internal indexes checked against the ranges."""
    ranges = sp.in_flight_ranges()
    # The lock-deadline index: ACQUIRED ranges per deadline (AVAILABLE ones are found in
    # the packed table itself).
    assert sp._deadlines == collections.Counter(r.lock_deadline_ms for r in ranges if r.state is _Q)
    assert sp.acquired_count == sum(r.record_count for r in ranges if r.state is _Q)
    assert sp.delivery_complete_count == sum(r.record_count for r in ranges if r.state in (_K, _X))
    for before, after in itertools.pairwise(ranges):
        assert before.last_offset + 1 == after.first_offset
    return (
        sp.spso,
        sp.speo,
        ranges,
        sp.acquired_count,
        sp.delivery_complete_count,
        sp.next_lock_deadline(),
        sp.next_fetch_offset(),
    )


_A, _Q, _K, _X = (
    RecordState.AVAILABLE,
    RecordState.ACQUIRED,
    RecordState.ACKNOWLEDGED,
    RecordState.ARCHIVED,
)


def assert_same_as_range_by_range(
    sp: SharePartition,
    release: Callable[[SharePartition], ReleaseResult],
    event: Event,
    holds: Callable[[InFlightRange], bool],
) -> StateUpdate | None:
    oracle = copy.deepcopy(sp)
    before = state(sp)
    stored = durable(*sp.snapshot_state())
    assert stored == kip_durable(sp)
    result = release(sp)
    available, archived, oracle_change = release_range_by_range(oracle, event, holds)
    assert state(sp) == state(oracle)
    # The update, written over what was stored, is the new durable state.
    if result.change.state_update is not None:
        stored = written(stored, result.change.state_update)
    assert stored == kip_durable(sp) == durable(*sp.snapshot_state())
    # Releasing always changes what is stored (the delivery made is now counted): there
    # is an update exactly when something was released.
    assert (result.change.state_update is None) == (not result.available and not result.archived)
    assert result.change.state_update == oracle_change.state_update
    assert joined(result.available) == available
    assert joined(result.archived) == archived
    update: StateUpdate | None = result.change.state_update
    # A failed write puts everything back, indexes included.
    result.change.rollback()
    oracle_change.rollback()
    assert state(sp) == before == state(oracle)
    return update


# -- the fragmented case the broker met: alternating per-offset acknowledgements ----------


def test_release_member_of_alternating_acks_matches_range_by_range_and_keeps_counts() -> None:
    sp = fragmented(2_000)
    assert sp.acquired_count == 1_001 and sp.range_count == 2_001  # "other" holds 0
    update = assert_same_as_range_by_range(
        sp,
        lambda p: p.release_member("m", 30),
        Event.MEMBER_RELEASE,
        lambda r: r.member_id == "m",
    )
    # Delivery count 2 < limit 5: AVAILABLE again, written with the count of the delivery
    # made (the acquisition was stored as AVAILABLE with 1). "other"'s offset 0, still
    # acquired, is not written; the 1,000 accepted offsets above SPSO are done.
    assert update == StateUpdate(
        0, tuple(PersistedBatch(o, o, int(_A), 2) for o in range(1, 2_000, 2)), 1_000
    )
    result = sp.release_member("m", 30)
    assert result.released == 1_000 and result.archived == ()
    result.change.commit()
    assert sp.acquired_count == 1  # "other" keeps offset 0
    assert {r.delivery_count for r in sp.in_flight_ranges() if r.state is _A} == {2}
    # A new leader loading what is stored delivers the released half with count 3.
    stored = durable(*sp.snapshot_state())
    reloaded = SharePartition(
        "group",
        uuid.UUID(int=9),
        0,
        config=sp.config,
        state_epoch=0,
        start_offset=0,
        state_batches=[(o, o, *value) for o, value in sorted(stored.items())],
    )
    redelivered = reloaded.acquire("n", [(0, 2_000)], max_records=2_001, batch_size=1, now_ms=0)
    assert [tuple(r) for r in redelivered.acquired] == [(0, 0, 1)] + [
        (o, o, 3) for o in range(1, 2_000, 2)
    ]


def test_release_member_at_the_delivery_limit_archives_in_one_write() -> None:
    sp = fragmented(2_000, limit=2)
    update = assert_same_as_range_by_range(
        sp,
        lambda p: p.release_member("m", 30),
        Event.MEMBER_RELEASE,
        lambda r: r.member_id == "m",
    )
    assert update is not None
    # SPSO is held by "other"'s offset 0; offsets 1..2,000 are all done now.
    assert update.start_offset == 0
    assert update.delivery_complete_count == 2_000
    assert update.state_batches == tuple((o, o, int(_X), 2) for o in range(1, 2_001, 2))


def test_expiry_of_fragmented_locks_on_a_manual_clock_matches_range_by_range() -> None:
    clock = ManualClock(0)
    sp = fragmented(2_000, limit=2)  # "other" locked offset 0 at 0, "m" its 1,000 at 20

    def expire_now(holds: Callable[[InFlightRange], bool]) -> StateUpdate | None:
        at_ms = clock.now_ms()
        update = assert_same_as_range_by_range(
            sp, lambda p: p.expire_locks(at_ms), Event.LOCK_TIMEOUT, holds
        )
        sp.expire_locks(at_ms).change.commit()
        return update

    clock.advance(LOCK_MS - 1)
    nothing = sp.expire_locks(clock.now_ms())
    assert (nothing.available, nothing.archived, nothing.change.pending) == ((), (), False)
    clock.advance(1)  # "other"'s lock only: offset 0 AVAILABLE, its delivery written
    assert expire_now(lambda r: r.member_id == "other") == StateUpdate(
        0, (PersistedBatch(0, 0, int(_A), 1),), 1_000
    )
    assert sp.acquired_count == 1_000 and sp.next_lock_deadline() == 20 + LOCK_MS
    clock.advance(19)
    assert sp.expire_locks(clock.now_ms()).change.pending is False
    clock.advance(1)  # "m"'s 1,000 single-offset locks, at the delivery limit: archived
    update = expire_now(lambda r: r.member_id == "m")
    assert update == StateUpdate(
        0, tuple(PersistedBatch(o, o, int(_X), 2) for o in range(1, 2_001, 2)), 2_000
    )
    assert sp.next_lock_deadline() is None and sp.acquired_count == 0
    assert sp.in_flight_ranges()[:3] == [
        InFlightRange(0, 0, _A, 1),
        InFlightRange(1, 1, _X, 2),
        InFlightRange(2, 2, _K, 1),
    ]
    assert (sp.range_count, sp.delivery_complete_count, sp.next_fetch_offset()) == (2_001, 2_000, 0)


def test_a_failed_write_of_a_fragmented_release_keeps_the_member_s_records_acquired() -> None:
    sp = fragmented(2_000, limit=2)
    before = sp.in_flight_ranges()
    result = sp.release_member("m", 30)
    assert result.state_update is not None
    result.change.rollback()
    assert sp.in_flight_ranges() == before
    assert sp.acquired_count == 1_001 and sp.next_lock_deadline() == LOCK_MS
    # The records can be released once the write succeeds.
    again = sp.release_member("m", 40)
    again.change.commit()
    assert sp.acquired_count == 1


def test_released_ranges_merge_with_equal_neighbours_into_one() -> None:
    # 0..99 acquired by "m" in ten fetches at different times: ten ranges (deadlines differ).
    sp = new_partition(100)
    for step in range(10):
        sp.acquire(
            "m", [(step * 10, step * 10 + 9)], max_records=10, batch_size=10, now_ms=step
        ).change.commit()
    assert sp.range_count == 10
    assert_same_as_range_by_range(
        sp, lambda p: p.release_member("m", 50), Event.MEMBER_RELEASE, lambda r: True
    )
    result = sp.release_member("m", 50)
    assert result.available == (OffsetRange(0, 99),)
    assert result.state_update == StateUpdate(0, (PersistedBatch(0, 99, int(_A), 1),), 0)
    result.change.commit()
    assert sp.in_flight_ranges() == [InFlightRange(0, 99, _A, 1)]


# -- property: any fragmentation, several members -----------------------------------------

ack_type = st.sampled_from(
    [
        AcknowledgeType.ACCEPT,
        AcknowledgeType.RELEASE,
        AcknowledgeType.REJECT,
        AcknowledgeType.RENEW,
    ]
)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[SharePartition, int]:
    records = draw(st.integers(1, 60))
    sp = new_partition(records, limit=draw(st.integers(1, 4)))
    now = 0
    for _ in range(draw(st.integers(1, 6))):
        now += draw(st.integers(0, LOCK_MS // 2))
        member = draw(st.sampled_from(MEMBERS))
        first = draw(st.integers(0, records - 1))
        last = draw(st.integers(first, records - 1))
        fetched = sp.acquire(
            member,
            [(first, last)],
            max_records=draw(st.integers(1, records)),
            batch_size=records,
            now_ms=now,
        )
        fetched.change.commit()
        for got in fetched.acquired:
            if draw(st.booleans()):
                count = got.last_offset - got.first_offset + 1
                types = draw(st.lists(ack_type, min_size=count, max_size=count))
                sp.acknowledge(
                    member, [(got.first_offset, got.last_offset, types)], now_ms=now
                ).change.commit()
    return sp, now


@settings(max_examples=300, deadline=None)
@given(scenarios(), st.sampled_from(MEMBERS))
def test_release_member_equals_releasing_range_by_range(
    scenario: tuple[SharePartition, int], member: str
) -> None:
    sp, now = scenario
    assert_same_as_range_by_range(
        sp,
        lambda p: p.release_member(member, now),
        Event.MEMBER_RELEASE,
        lambda r: r.member_id == member,
    )


@settings(max_examples=300, deadline=None)
@given(scenarios(), st.integers(0, 3 * LOCK_MS))
def test_lock_expiry_equals_expiring_range_by_range(
    scenario: tuple[SharePartition, int], at_ms: int
) -> None:
    sp, _ = scenario
    assert_same_as_range_by_range(
        sp,
        lambda p: p.expire_locks(at_ms),
        Event.LOCK_TIMEOUT,
        lambda r: r.lock_deadline_ms is not None and r.lock_deadline_ms <= at_ms,
    )
