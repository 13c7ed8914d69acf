"""SharePartition: every transition and error of the share-partition leader, no clock, no I/O."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from broker.share.partition import (
    NO_CHANGE,
    TRANSITIONS,
    AcknowledgeType,
    AcquiredRange,
    ChangePending,
    Event,
    IllegalStateTransition,
    InFlightRange,
    OffsetRange,
    PendingChange,
    RecordState,
    SharePartition,
    SharePartitionConfig,
    StateUpdate,
    _transition,
)
from coordinator.share_state import PersistedBatch
from protocol.errors import ErrorCode

TOPIC_ID = uuid.UUID("6d1f9c1e-0000-4000-8000-000000000001")
LOCK_MS = 30_000
ACCEPT = (AcknowledgeType.ACCEPT,)
RELEASE = (AcknowledgeType.RELEASE,)
REJECT = (AcknowledgeType.REJECT,)
GAP = (AcknowledgeType.GAP,)
RENEW = (AcknowledgeType.RENEW,)

A = RecordState.AVAILABLE
Q = RecordState.ACQUIRED
K = RecordState.ACKNOWLEDGED
X = RecordState.ARCHIVED


def make(
    start_offset: int = 0,
    state_batches: tuple[tuple[int, int, int, int], ...] = (),
    *,
    limit: int = 5,
    max_in_flight: int = 2_000,
    state_epoch: int = 0,
) -> SharePartition:
    config = SharePartitionConfig(
        record_lock_duration_ms=LOCK_MS,
        delivery_count_limit=limit,
        max_in_flight_records=max_in_flight,
    )
    return SharePartition(
        "group",
        TOPIC_ID,
        0,
        config=config,
        state_epoch=state_epoch,
        start_offset=start_offset,
        state_batches=state_batches,
    )


R = TypeVar("R")


def committed(result: R) -> R:
    """Commit the change a call returned (its write succeeded), and return the call's result."""
    change = result if isinstance(result, PendingChange) else result.change  # type: ignore[attr-defined]
    change.commit()
    return result


def states(sp: SharePartition) -> list[tuple[int, int, RecordState, int, str | None]]:
    return [
        (r.first_offset, r.last_offset, r.state, r.delivery_count, r.member_id)
        for r in sp.in_flight_ranges()
    ]


def fetch(
    sp: SharePartition,
    member: str,
    batches: list[tuple[int, int]],
    *,
    now_ms: int = 0,
    max_records: int = 500,
    batch_size: int = 500,
    gaps: tuple[tuple[int, int], ...] = (),
) -> list[AcquiredRange]:
    return list(
        committed(
            sp.acquire(
                member,
                batches,
                max_records=max_records,
                batch_size=batch_size,
                now_ms=now_ms,
                gaps=gaps,
            )
        ).acquired
    )


def whole_state(sp: SharePartition) -> tuple[object, ...]:
    return (sp.spso, sp.speo, sp.snapshot_state(), sp.in_flight_ranges(), sp.acquired_count)


class Stored:
    """What the share coordinator holds for one share partition: the StateUpdates written,
    replayed as it does (newer batches win per offset, offsets below the start offset go)."""

    def __init__(
        self, start_offset: int = 0, batches: tuple[tuple[int, int, int, int], ...] = ()
    ) -> None:
        self.start_offset = start_offset
        self.offsets: dict[int, tuple[int, int]] = {}
        self._merge(batches)

    def _merge(self, batches: tuple[tuple[int, int, int, int], ...]) -> None:
        for first, last, state, count in batches:
            for offset in range(max(first, self.start_offset), last + 1):
                self.offsets[offset] = (state, count)

    def write(self, update: StateUpdate | None) -> None:
        if update is None:
            return
        self.start_offset = update.start_offset
        self._merge(update.state_batches)
        self.offsets = {o: v for o, v in self.offsets.items() if o >= update.start_offset}

    def batches(self) -> tuple[tuple[int, int, int, int], ...]:
        return tuple((o, o, *self.offsets[o]) for o in sorted(self.offsets))

    def reload(self, *, limit: int = 5) -> SharePartition:
        """The partition a new leader builds from what was written (after a crash)."""
        return make(self.start_offset, self.batches(), limit=limit)


# -- the transition table -------------------------------------------------------------------


def test_terminal_states_have_no_transitions() -> None:
    assert not [key for key in TRANSITIONS if key[0] in (K, X)]


def test_only_acquired_records_can_be_acknowledged() -> None:
    for event in (Event.ACCEPT, Event.RELEASE, Event.REJECT, Event.GAP, Event.RENEW):
        assert (Q, event) in TRANSITIONS
        assert (A, event) not in TRANSITIONS


def test_illegal_transition_is_a_bug_not_silently_ignored() -> None:
    record = InFlightRange(0, 0, K, 1)
    with pytest.raises(IllegalStateTransition):
        _transition(record, Event.RELEASE, delivery_count_limit=5)


# -- construction and initialization ----------------------------------------------------------


def test_new_partition_starts_with_empty_window() -> None:
    sp = make(start_offset=100)
    assert (sp.spso, sp.speo, sp.in_flight_count, sp.acquired_count) == (100, 100, 0, 0)
    assert sp.next_fetch_offset() == 100
    assert sp.snapshot_state() == (100, [])


def test_persisted_state_is_loaded_as_ranges() -> None:
    sp = make(100, ((100, 104, 0, 1), (105, 109, 2, 1), (110, 119, 4, 5), (120, 129, 0, 2)))
    assert sp.spso == 100
    assert sp.speo == 130
    assert states(sp) == [
        (100, 104, A, 1, None),
        (105, 109, K, 1, None),
        (110, 119, X, 5, None),
        (120, 129, A, 2, None),
    ]
    assert sp.next_fetch_offset() == 100


def test_persisted_leading_done_records_move_spso() -> None:
    sp = make(100, ((100, 104, 2, 1), (105, 109, 4, 2), (110, 119, 0, 1)))
    assert sp.spso == 110
    assert sp.snapshot_state() == (110, [PersistedBatch(110, 119, 0, 1)])


def test_persisted_gap_is_available_never_delivered() -> None:
    sp = make(100, ((105, 109, 2, 1),))
    assert states(sp) == [(100, 104, A, 0, None), (105, 109, K, 1, None)]
    assert sp.next_fetch_offset() == 100
    assert sp.snapshot_state() == (100, [PersistedBatch(105, 109, 2, 1)])


def test_persisted_batches_below_start_offset_are_dropped() -> None:
    sp = make(105, ((100, 109, 0, 1),))
    assert states(sp) == [(105, 109, A, 1, None)]


@pytest.mark.parametrize(
    "batches",
    [((0, 9, 1, 1),), ((0, 9, 5, 1),), ((0, 9, 0, 1), (5, 12, 0, 1)), ((9, 0, 0, 1),)],
    ids=["acquired", "unknown_state", "overlap", "first_after_last"],
)
def test_invalid_persisted_state_is_rejected(
    batches: tuple[tuple[int, int, int, int], ...],
) -> None:
    with pytest.raises(ValueError):
        make(0, batches)


def test_uninitialized_partition_needs_start_offset() -> None:
    sp = make(start_offset=-1)
    assert not sp.initialized
    assert not sp.can_acquire()
    with pytest.raises(RuntimeError):
        sp.next_fetch_offset()
    with pytest.raises(RuntimeError):
        committed(sp.acquire("m", [(0, 9)], max_records=10, batch_size=10, now_ms=0))


def test_initialize_sets_spso_and_asks_to_persist_it() -> None:
    sp = make(start_offset=-1)
    assert committed(sp.initialize(42)).state_update == StateUpdate(42, ())
    assert (sp.spso, sp.speo, sp.next_fetch_offset()) == (42, 42, 42)
    with pytest.raises(RuntimeError):
        committed(sp.initialize(50))


def test_uninitialized_partition_with_state_batches_is_rejected() -> None:
    with pytest.raises(ValueError):
        make(-1, ((0, 9, 0, 1),))


# -- acquire ---------------------------------------------------------------------------------


def test_acquire_new_records_from_speo() -> None:
    sp = make()
    result = committed(sp.acquire("m1", [(0, 9)], max_records=100, batch_size=100, now_ms=1_000))
    assert result.acquired == (AcquiredRange(0, 9, 1),)
    assert states(sp) == [(0, 9, Q, 1, "m1")]
    assert sp.speo == 10
    assert sp.acquired_count == 10
    assert sp.next_lock_deadline() == 1_000 + LOCK_MS
    assert sp.next_fetch_offset() == 10


def test_acquire_of_new_records_writes_nothing_and_a_crash_redelivers_them() -> None:
    # KIP-932: ACQUIRED is transient; acquired with delivery count 1 is AVAILABLE with 0,
    # which past SPEO has no state batch at all.
    stored = Stored()
    sp = make()
    result = committed(sp.acquire("m1", [(0, 9)], max_records=100, batch_size=100, now_ms=0))
    assert result.acquired == (AcquiredRange(0, 9, 1),)
    assert result.state_update is None
    assert states(sp) == [(0, 9, Q, 1, "m1")]
    assert sp.snapshot_state() == (0, [])
    # A crash now forgets the in-flight delivery, not the records: delivered again as first.
    crashed = stored.reload()
    assert (crashed.spso, crashed.speo) == (0, 0)
    assert fetch(crashed, "m2", [(0, 9)]) == [AcquiredRange(0, 9, 1)]
    # The release writes the delivery that was made: AVAILABLE with count 1.
    released = committed(sp.acknowledge("m1", [(0, 9, RELEASE)], now_ms=0))
    assert released.state_update == StateUpdate(0, (PersistedBatch(0, 9, 0, 1),), 0)
    stored.write(released.state_update)
    reloaded = stored.reload()
    assert states(reloaded) == [(0, 9, A, 1, None)]
    assert fetch(reloaded, "m2", [(0, 9)]) == [AcquiredRange(0, 9, 2)]


def test_acquire_finishes_log_batch_beyond_max_records() -> None:
    sp = make()
    assert fetch(sp, "m1", [(0, 9), (10, 19)], max_records=5) == [AcquiredRange(0, 9, 1)]
    assert sp.speo == 10


def test_acquire_stops_at_max_records_on_batch_boundary() -> None:
    sp = make()
    assert fetch(sp, "m1", [(0, 9), (10, 19), (20, 29)], max_records=15) == [
        AcquiredRange(0, 19, 1)
    ]


def test_acquire_never_exceeds_max_in_flight_records() -> None:
    sp = make(max_in_flight=25)
    assert fetch(sp, "m1", [(0, 19), (20, 39)]) == [AcquiredRange(0, 24, 1)]
    assert sp.in_flight_count == 25
    assert not sp.can_acquire()
    assert fetch(sp, "m2", [(20, 39)]) == []


def test_window_reopens_when_spso_advances() -> None:
    sp = make(max_in_flight=10)
    fetch(sp, "m1", [(0, 9)])
    assert not sp.can_acquire()
    committed(sp.acknowledge("m1", [(0, 4, ACCEPT)], now_ms=0))
    assert sp.can_acquire()
    assert fetch(sp, "m1", [(10, 19)]) == [AcquiredRange(10, 14, 1)]


def test_acquire_returns_ranges_of_about_batch_size_on_log_batch_boundaries() -> None:
    sp = make()
    batches = [(0, 3), (4, 7), (8, 11), (12, 15)]
    assert fetch(sp, "m1", batches, batch_size=5) == [
        AcquiredRange(0, 7, 1),
        AcquiredRange(8, 15, 1),
    ]
    # Internally the acquisition is still one range.
    assert sp.range_count == 1


def test_acquire_reacquires_available_records_first_with_delivery_count_plus_one() -> None:
    sp = make()
    fetch(sp, "m1", [(0, 9)])
    released = committed(sp.acknowledge("m1", [(2, 4, RELEASE)], now_ms=0))
    assert released.state_update == StateUpdate(0, (PersistedBatch(2, 4, 0, 1),), 0)
    assert sp.next_fetch_offset() == 2
    result = committed(
        sp.acquire("m2", [(0, 9), (10, 19)], max_records=100, batch_size=100, now_ms=5)
    )
    assert result.acquired == (AcquiredRange(2, 4, 2), AcquiredRange(10, 19, 1))
    assert states(sp) == [
        (0, 1, Q, 1, "m1"),
        (2, 4, Q, 2, "m2"),
        (5, 9, Q, 1, "m1"),
        (10, 19, Q, 1, "m2"),
    ]
    # Re-acquiring AVAILABLE(1) and acquiring new records changes nothing durable: 2-4 are
    # still stored as the release wrote them, AVAILABLE with count 1.
    assert result.state_update is None
    assert sp.snapshot_state() == (0, [PersistedBatch(2, 4, 0, 1)])
    reloaded = make(*sp.snapshot_state())
    assert states(reloaded) == [(0, 1, A, 0, None), (2, 4, A, 1, None)]
    assert fetch(reloaded, "m3", [(0, 9), (10, 19)]) == [
        AcquiredRange(0, 1, 1),
        AcquiredRange(2, 4, 2),
        AcquiredRange(5, 19, 1),
    ]


def test_acquire_of_available_records_respects_max_records() -> None:
    sp = make(0, ((0, 99, 0, 1),))
    assert fetch(sp, "m1", [(0, 49), (50, 99)], max_records=10) == [AcquiredRange(0, 49, 2)]
    assert sp.next_fetch_offset() == 50


def test_acquire_archives_available_records_at_delivery_limit() -> None:
    sp = make(0, ((0, 4, 0, 3), (5, 9, 0, 1)), limit=3)
    result = committed(sp.acquire("m1", [(0, 9)], max_records=100, batch_size=100, now_ms=0))
    assert result.acquired == (AcquiredRange(5, 9, 2),)
    assert sp.spso == 5
    assert states(sp) == [(5, 9, Q, 2, "m1")]
    # 0-4 archived moves SPSO over them (no batch left for them); the acquisition of 5-9
    # is not written: they stay stored as AVAILABLE with count 1.
    assert result.state_update == StateUpdate(5, (), 0)
    stored = Stored(0, ((0, 4, 0, 3), (5, 9, 0, 1)))
    stored.write(result.state_update)
    assert (stored.start_offset, stored.batches()) == (5, tuple((o, o, 0, 1) for o in range(5, 10)))
    assert sp.snapshot_state() == (5, [PersistedBatch(5, 9, 0, 1)])
    assert fetch(stored.reload(limit=3), "m2", [(0, 9)]) == [AcquiredRange(5, 9, 2)]


def test_acquire_archives_gaps_and_never_delivers_them() -> None:
    sp = make()
    result = committed(
        sp.acquire(
            "m1",
            [(0, 4), (5, 5), (6, 9)],
            max_records=100,
            batch_size=100,
            now_ms=0,
            gaps=((5, 5),),
        )
    )
    assert result.acquired == (AcquiredRange(0, 4, 1), AcquiredRange(6, 9, 1))
    assert states(sp)[1] == (5, 5, X, 0, None)
    assert result.state_update is not None
    assert PersistedBatch(5, 5, 4, 0) in result.state_update.state_batches


def test_acquire_leading_gap_moves_spso() -> None:
    sp = make()
    result = committed(
        sp.acquire(
            "m1", [(0, 4), (5, 9)], max_records=100, batch_size=100, now_ms=0, gaps=((0, 4),)
        )
    )
    assert result.acquired == (AcquiredRange(5, 9, 1),)
    assert sp.spso == 5
    assert states(sp) == [(5, 9, Q, 1, "m1")]
    # Only SPSO is written: 5-9 acquired for the first time are AVAILABLE with count 0.
    assert result.state_update == StateUpdate(5, (), 0)
    assert sp.snapshot_state() == (5, [])


def test_acquire_archives_offsets_missing_before_first_batch() -> None:
    sp = make(0)
    fetch(sp, "m1", [(0, 9)])
    assert fetch(sp, "m1", [(20, 29)]) == [AcquiredRange(20, 29, 1)]
    assert states(sp) == [(0, 9, Q, 1, "m1"), (10, 19, X, 0, None), (20, 29, Q, 1, "m1")]


def test_acquire_skips_missing_offsets_at_start_of_empty_window() -> None:
    sp = make(0)
    assert fetch(sp, "m1", [(50, 59)]) == [AcquiredRange(50, 59, 1)]
    assert (sp.spso, sp.speo) == (50, 60)


def test_acquire_includes_compaction_holes_between_batches() -> None:
    sp = make()
    # Kafka acquires the whole span; the client acknowledges the missing offsets as gaps.
    assert fetch(sp, "m1", [(0, 4), (8, 9)]) == [AcquiredRange(0, 9, 1)]


def test_acquire_ignores_batches_below_spso() -> None:
    sp = make(100)
    assert fetch(sp, "m1", [(90, 109)]) == [AcquiredRange(100, 109, 1)]


def test_acquire_skips_records_that_are_not_available() -> None:
    sp = make()
    fetch(sp, "m1", [(0, 9)])
    committed(sp.acknowledge("m1", [(0, 0, RELEASE)], now_ms=0))
    assert fetch(sp, "m2", [(0, 9)]) == [AcquiredRange(0, 0, 2)]
    assert fetch(sp, "m2", [(0, 9)]) == []


def test_acquire_with_nothing_to_acquire_changes_nothing() -> None:
    sp = make()
    before = whole_state(sp)
    assert (
        committed(sp.acquire("m1", [], max_records=10, batch_size=10, now_ms=0)).state_update
        is None
    )
    assert (
        committed(sp.acquire("m1", [(0, 9)], max_records=0, batch_size=10, now_ms=0)).acquired == ()
    )
    assert whole_state(sp) == before


def test_acquire_rejects_unordered_log_batches() -> None:
    sp = make()
    with pytest.raises(ValueError):
        committed(sp.acquire("m1", [(10, 19), (0, 9)], max_records=10, batch_size=10, now_ms=0))


# -- acknowledge -----------------------------------------------------------------------------


def test_accept_acknowledges_and_moves_spso() -> None:
    sp = make()
    fetch(sp, "m1", [(0, 9)])
    result = committed(sp.acknowledge("m1", [(0, 9, ACCEPT)], now_ms=0))
    assert result.error_code == ErrorCode.none
    assert (sp.spso, sp.speo, sp.range_count, sp.acquired_count) == (10, 10, 0, 0)
    assert result.state_update == StateUpdate(10, ())
    assert sp.next_lock_deadline() is None


def test_accept_inside_a_range_splits_it() -> None:
    sp = make()
    fetch(sp, "m1", [(0, 499)])
    result = committed(sp.acknowledge("m1", [(250, 250, ACCEPT)], now_ms=0))
    assert states(sp) == [(0, 249, Q, 1, "m1"), (250, 250, K, 1, None), (251, 499, Q, 1, "m1")]
    # One record above SPSO is done: the count Kafka 4.2's leader writes (KIP-1226).
    assert result.state_update == StateUpdate(0, (PersistedBatch(250, 250, 2, 1),), 1)
    assert sp.acquired_count == 499


def test_spso_waits_for_the_leading_record() -> None:
    sp = make()
    fetch(sp, "m1", [(0, 9)])
    committed(sp.acknowledge("m1", [(1, 9, ACCEPT)], now_ms=0))
    assert sp.spso == 0
    committed(sp.acknowledge("m1", [(0, 0, ACCEPT)], now_ms=0))
    assert sp.spso == 10


def test_adjacent_acknowledged_ranges_merge() -> None:
    sp = make()
    fetch(sp, "m1", [(0, 9)])
    committed(sp.acknowledge("m1", [(1, 3, ACCEPT), (4, 6, ACCEPT)], now_ms=0))
    committed(sp.acknowledge("m1", [(7, 9, ACCEPT)], now_ms=0))
    assert states(sp) == [(0, 0, Q, 1, "m1"), (1, 9, K, 1, None)]


def test_release_writes_records_available_with_the_delivery_count_made() -> None:
    sp = make(0, ((0, 4, 0, 2),))
    stored = Stored(0, ((0, 4, 0, 2),))
    acquired = committed(sp.acquire("m1", [(0, 9)], max_records=100, batch_size=100, now_ms=0))
    assert acquired.acquired == (AcquiredRange(0, 4, 3), AcquiredRange(5, 9, 1))
    assert acquired.state_update is None
    result = committed(sp.acknowledge("m1", [(0, 9, RELEASE)], now_ms=0))
    assert result.error_code == ErrorCode.none
    assert result.released == 10
    assert states(sp) == [(0, 4, A, 3, None), (5, 9, A, 1, None)]
    assert sp.next_fetch_offset() == 0
    # The acquisition was not written: the release writes each count with its delivery.
    assert result.state_update == StateUpdate(
        0, (PersistedBatch(0, 4, 0, 3), PersistedBatch(5, 9, 0, 1)), 0
    )
    stored.write(result.state_update)
    assert states(stored.reload()) == states(sp)


def test_release_at_delivery_limit_archives() -> None:
    sp = make(0, ((0, 9, 0, 1),), limit=2)
    fetch(sp, "m1", [(0, 9)])
    result = committed(sp.acknowledge("m1", [(0, 9, RELEASE)], now_ms=0))
    assert result.released == 0
    assert (sp.spso, sp.range_count) == (10, 0)
    assert result.state_update == StateUpdate(10, ())


def test_reject_archives() -> None:
    sp = make()
    fetch(sp, "m1", [(0, 9)])
    result = committed(sp.acknowledge("m1", [(5, 9, REJECT)], now_ms=0))
    assert states(sp) == [(0, 4, Q, 1, "m1"), (5, 9, X, 1, None)]
    assert result.state_update == StateUpdate(0, (PersistedBatch(5, 9, 4, 1),), 5)


def test_gap_archives() -> None:
    sp = make()
    fetch(sp, "m1", [(0, 9)])
    committed(sp.acknowledge("m1", [(0, 0, GAP)], now_ms=0))
    assert sp.spso == 1


def test_renew_restarts_lock_and_persists_nothing() -> None:
    sp = make()
    fetch(sp, "m1", [(0, 9)], now_ms=0)
    result = committed(sp.acknowledge("m1", [(0, 4, RENEW)], now_ms=20_000))
    assert result.error_code == ErrorCode.none
    assert result.state_update is None
    assert [r.lock_deadline_ms for r in sp.in_flight_ranges()] == [20_000 + LOCK_MS, LOCK_MS]
    committed(sp.expire_locks(LOCK_MS))
    assert states(sp) == [(0, 4, Q, 1, "m1"), (5, 9, A, 1, None)]


def test_per_offset_acknowledge_types() -> None:
    sp = make()
    fetch(sp, "m1", [(0, 4)])
    types = (
        AcknowledgeType.ACCEPT,
        AcknowledgeType.RELEASE,
        AcknowledgeType.REJECT,
        AcknowledgeType.REJECT,
        AcknowledgeType.RENEW,
    )
    result = committed(sp.acknowledge("m1", [(0, 4, types)], now_ms=7))
    assert result.error_code == ErrorCode.none
    assert result.released == 1
    assert states(sp) == [(1, 1, A, 1, None), (2, 3, X, 1, None), (4, 4, Q, 1, "m1")]
    assert sp.spso == 1


def test_ack_by_other_member_is_refused() -> None:
    sp = make()
    fetch(sp, "m1", [(0, 9)])
    before = whole_state(sp)
    result = committed(sp.acknowledge("m2", [(0, 9, ACCEPT)], now_ms=0))
    assert result.error_code == ErrorCode.invalid_record_state
    assert result.state_update is None
    assert whole_state(sp) == before


def test_ack_is_atomic_across_batches() -> None:
    sp = make()
    fetch(sp, "m1", [(0, 9)])
    fetch(sp, "m2", [(10, 19)])
    before = whole_state(sp)
    result = committed(sp.acknowledge("m1", [(0, 9, ACCEPT), (10, 10, ACCEPT)], now_ms=0))
    assert result.error_code == ErrorCode.invalid_record_state
    assert whole_state(sp) == before


def test_ack_of_available_record_is_invalid_record_state() -> None:
    sp = make()
    fetch(sp, "m1", [(0, 9)])
    committed(sp.acknowledge("m1", [(0, 0, RELEASE)], now_ms=0))
    result = committed(sp.acknowledge("m1", [(0, 0, ACCEPT)], now_ms=0))
    assert result.error_code == ErrorCode.invalid_record_state


def test_ack_of_acknowledged_record_is_invalid_record_state() -> None:
    sp = make()
    fetch(sp, "m1", [(0, 9)])
    committed(sp.acknowledge("m1", [(5, 5, ACCEPT)], now_ms=0))
    before = whole_state(sp)
    result = committed(sp.acknowledge("m1", [(4, 6, ACCEPT)], now_ms=0))
    assert result.error_code == ErrorCode.invalid_record_state
    assert whole_state(sp) == before


def test_ack_after_lock_expiry_is_refused() -> None:
    sp = make()
    fetch(sp, "m1", [(0, 9)], now_ms=0)
    committed(sp.expire_locks(LOCK_MS))
    assert committed(sp.acknowledge("m1", [(0, 9, ACCEPT)], now_ms=LOCK_MS)).error_code == (
        ErrorCode.invalid_record_state
    )


def test_ack_past_speo_is_invalid_request() -> None:
    sp = make()
    fetch(sp, "m1", [(0, 9)])
    before = whole_state(sp)
    result = committed(sp.acknowledge("m1", [(5, 10, ACCEPT)], now_ms=0))
    assert result.error_code == ErrorCode.invalid_request
    assert whole_state(sp) == before


@pytest.mark.parametrize(
    "batches",
    [
        [(5, 4, ACCEPT)],
        [(5, 9, ACCEPT), (0, 4, ACCEPT)],
        [(0, 5, ACCEPT), (5, 9, ACCEPT)],
        [(0, 4, (1, 1))],
        [(0, 4, ())],
        [(0, 4, (5,))],
        [(0, 1, (1, 9))],
    ],
    ids=[
        "first_after_last",
        "out_of_order",
        "overlapping",
        "wrong_type_count",
        "no_types",
        "unknown_type",
        "unknown_per_offset_type",
    ],
)
def test_malformed_acknowledgement_is_invalid_request(
    batches: list[tuple[int, int, tuple[int, ...]]],
) -> None:
    sp = make()
    fetch(sp, "m1", [(0, 9)])
    before = whole_state(sp)
    result = committed(sp.acknowledge("m1", batches, now_ms=0))
    assert result.error_code == ErrorCode.invalid_request
    assert result.error_message
    assert whole_state(sp) == before


def test_ack_below_spso_is_skipped_as_done() -> None:
    sp = make()
    fetch(sp, "m1", [(0, 9)])
    committed(sp.acknowledge("m1", [(0, 4, ACCEPT)], now_ms=0))
    result = committed(sp.acknowledge("m1", [(0, 6, ACCEPT)], now_ms=0))
    assert result.error_code == ErrorCode.none
    assert states(sp) == [(7, 9, Q, 1, "m1")]


# -- lock expiry -----------------------------------------------------------------------------


def test_lock_expiry_makes_records_available() -> None:
    sp = make()
    fetch(sp, "m1", [(0, 9)], now_ms=100)
    fetch(sp, "m2", [(10, 19)], now_ms=200)
    assert sp.next_lock_deadline() == 100 + LOCK_MS
    assert committed(sp.expire_locks(100 + LOCK_MS - 1)).available == ()
    result = committed(sp.expire_locks(100 + LOCK_MS))
    assert result.available == (OffsetRange(0, 9),)
    assert result.released == 10
    # Released with the delivery made; m2's 10-19, still acquired, are not written.
    assert result.state_update == StateUpdate(0, (PersistedBatch(0, 9, 0, 1),), 0)
    assert states(sp) == [(0, 9, A, 1, None), (10, 19, Q, 1, "m2")]
    assert sp.snapshot_state() == (0, [PersistedBatch(0, 9, 0, 1)])
    assert sp.next_lock_deadline() == 200 + LOCK_MS
    assert sp.next_fetch_offset() == 0


def test_acquisitions_write_nothing_while_expiry_and_rejection_write_the_counts() -> None:
    sp = make()
    stored = Stored()
    first = committed(sp.acquire("m1", [(0, 9)], max_records=10, batch_size=10, now_ms=0))
    assert first.acquired == (AcquiredRange(0, 9, 1),)
    assert first.state_update is None
    expired = committed(sp.expire_locks(LOCK_MS))
    assert (expired.available, expired.archived) == ((OffsetRange(0, 9),), ())
    assert expired.state_update == StateUpdate(0, (PersistedBatch(0, 9, 0, 1),), 0)
    stored.write(expired.state_update)
    again = committed(sp.acquire("m2", [(0, 9)], max_records=10, batch_size=10, now_ms=LOCK_MS))
    assert again.acquired == (AcquiredRange(0, 9, 2),)
    assert again.state_update is None
    assert states(sp) == [(0, 9, Q, 2, "m2")]
    # A crash now redelivers 0-9 with the count they had before this acquisition.
    assert fetch(stored.reload(), "m3", [(0, 9)]) == [AcquiredRange(0, 9, 2)]
    rejected = committed(sp.acknowledge("m2", [(5, 9, REJECT)], now_ms=LOCK_MS))
    assert rejected.state_update == StateUpdate(0, (PersistedBatch(5, 9, 4, 2),), 5)
    stored.write(rejected.state_update)
    rejected = committed(sp.acknowledge("m2", [(0, 4, REJECT)], now_ms=LOCK_MS))
    # All archived: SPSO moves over them and the stored batches below it go.
    assert rejected.state_update == StateUpdate(10, (), 0)
    assert (sp.spso, sp.speo, sp.range_count, sp.acquired_count) == (10, 10, 0, 0)
    stored.write(rejected.state_update)
    assert (stored.start_offset, stored.batches()) == (10, ())


def test_lock_expiry_at_delivery_limit_archives() -> None:
    sp = make(limit=1)
    fetch(sp, "m1", [(0, 9)], now_ms=0)
    result = committed(sp.expire_locks(LOCK_MS))
    assert result.archived == (OffsetRange(0, 9),)
    assert result.state_update == StateUpdate(10, ())
    assert (sp.spso, sp.range_count) == (10, 0)


def test_lock_expiry_of_split_range_releases_every_piece() -> None:
    sp = make()
    fetch(sp, "m1", [(0, 9)], now_ms=0)
    committed(sp.acknowledge("m1", [(3, 3, ACCEPT), (6, 6, ACCEPT)], now_ms=0))
    committed(sp.expire_locks(LOCK_MS))
    assert sp.acquired_count == 0
    assert sp.next_lock_deadline() is None
    assert states(sp) == [
        (0, 2, A, 1, None),
        (3, 3, K, 1, None),
        (4, 5, A, 1, None),
        (6, 6, K, 1, None),
        (7, 9, A, 1, None),
    ]


# -- member release --------------------------------------------------------------------------


def test_release_member_returns_only_its_records() -> None:
    sp = make()
    fetch(sp, "m1", [(0, 9)])
    fetch(sp, "m2", [(10, 19)])
    result = committed(sp.release_member("m1", now_ms=5))
    assert result.available == (OffsetRange(0, 9),)
    assert states(sp) == [(0, 9, A, 1, None), (10, 19, Q, 1, "m2")]
    assert sp.acquired_count == 10


def test_release_member_keeps_delivery_count() -> None:
    sp = make(0, ((0, 9, 0, 2),))
    fetch(sp, "m1", [(0, 9)])
    committed(sp.release_member("m1", now_ms=0))
    assert states(sp) == [(0, 9, A, 3, None)]


def test_release_member_at_delivery_limit_archives() -> None:
    sp = make(0, ((0, 4, 0, 2), (5, 9, 0, 0)), limit=3)
    fetch(sp, "m1", [(0, 9)])
    result = committed(sp.release_member("m1", now_ms=0))
    assert result.archived == (OffsetRange(0, 4),)
    assert result.available == (OffsetRange(5, 9),)
    assert sp.spso == 5


def test_release_unknown_member_changes_nothing() -> None:
    sp = make()
    fetch(sp, "m1", [(0, 9)])
    before = whole_state(sp)
    assert committed(sp.release_member("nobody", now_ms=0)).state_update is None
    assert whole_state(sp) == before


# -- log start offset ------------------------------------------------------------------------


def test_log_start_past_spso_drops_state_below() -> None:
    sp = make()
    fetch(sp, "m1", [(0, 9)])
    assert committed(sp.update_log_start_offset(4)).state_update == StateUpdate(4, ())
    assert states(sp) == [(4, 9, Q, 1, "m1")]
    assert sp.acquired_count == 6
    # The dropped offsets are done: acknowledging them is skipped, not refused.
    assert committed(sp.acknowledge("m1", [(0, 5, ACCEPT)], now_ms=0)).error_code == ErrorCode.none
    assert sp.spso == 6


def test_log_start_past_speo_empties_window() -> None:
    sp = make()
    fetch(sp, "m1", [(0, 9)])
    assert committed(sp.update_log_start_offset(50)).state_update == StateUpdate(50, ())
    assert (sp.spso, sp.speo, sp.range_count, sp.acquired_count) == (50, 50, 0, 0)
    assert sp.next_lock_deadline() is None
    assert sp.next_fetch_offset() == 50


def test_log_start_not_past_spso_changes_nothing() -> None:
    sp = make(10)
    assert committed(sp.update_log_start_offset(10)).state_update is None
    assert committed(sp.update_log_start_offset(3)).state_update is None
    assert sp.spso == 10


def test_log_start_onto_done_records_moves_spso_further() -> None:
    sp = make()
    fetch(sp, "m1", [(0, 9)])
    committed(sp.acknowledge("m1", [(5, 7, ACCEPT)], now_ms=0))
    assert committed(sp.update_log_start_offset(5)).state_update == StateUpdate(8, ())


# -- persistence -----------------------------------------------------------------------------


def test_snapshot_writes_acquired_as_available_with_the_count_before_acquisition() -> None:
    sp = make(0, ((10, 14, 0, 2),))
    assert fetch(sp, "m1", [(0, 19)]) == [
        AcquiredRange(0, 9, 1),
        AcquiredRange(10, 14, 3),
        AcquiredRange(15, 19, 1),
    ]
    committed(sp.acknowledge("m1", [(5, 9, ACCEPT)], now_ms=0))
    # 0-4 and 15-19 acquired with count 1 were never delivered before: no batch; 10-14
    # acquired with count 3 are AVAILABLE with 2.
    assert sp.snapshot_state() == (0, [PersistedBatch(5, 9, 2, 1), PersistedBatch(10, 14, 0, 2)])


def test_snapshot_roundtrips_through_constructor() -> None:
    sp = make(0, limit=3)
    fetch(sp, "m1", [(0, 9)])
    committed(sp.acknowledge("m1", [(2, 3, RELEASE), (6, 6, REJECT), (8, 9, ACCEPT)], now_ms=0))
    fetch(sp, "m2", [(0, 9), (10, 14)])
    start, batches = sp.snapshot_state()
    reloaded = make(start, tuple(batches), limit=3)
    assert reloaded.snapshot_state() == sp.snapshot_state()
    assert reloaded.acquired_count == 0
    assert reloaded.next_fetch_offset() == sp.spso


# -- counters and memory ---------------------------------------------------------------------


def test_counters_follow_transitions() -> None:
    sp = make()
    fetch(sp, "m1", [(0, 9)])
    fetch(sp, "m2", [(10, 14)])
    assert (sp.in_flight_count, sp.acquired_count) == (15, 15)
    committed(sp.acknowledge("m1", [(0, 4, ACCEPT), (5, 6, RELEASE)], now_ms=0))
    assert (sp.in_flight_count, sp.acquired_count) == (10, 8)


def test_a_million_records_in_a_few_acknowledgements_leave_a_handful_of_ranges() -> None:
    sp = make(max_in_flight=1_000_000)
    for index in range(1_000):
        first = index * 1_000
        result = committed(
            sp.acquire(
                "m1", [(first, first + 999)], max_records=1_000, batch_size=1_000, now_ms=index
            )
        )
        assert result.acquired == (AcquiredRange(first, first + 999, 1),)
    # One acquisition per fetch: each has its own lock deadline, so its own range.
    assert sp.range_count == 1_000
    assert sp.in_flight_count == 1_000_000

    committed(
        sp.acknowledge("m1", [(1_000, 399_999, ACCEPT), (400_000, 998_999, ACCEPT)], now_ms=1_000)
    )
    assert sp.range_count == 3
    assert states(sp) == [
        (0, 999, Q, 1, "m1"),
        (1_000, 998_999, K, 1, None),
        (999_000, 999_999, Q, 1, "m1"),
    ]
    committed(sp.acknowledge("m1", [(0, 999, ACCEPT)], now_ms=1_000))
    assert (sp.spso, sp.range_count) == (999_000, 1)


# -- two-phase changes: commit keeps, rollback restores exactly --------------------------------


def observable(sp: SharePartition) -> tuple[object, ...]:
    """Everything a caller can see, plus the indexes behind next_fetch_offset/next_lock_deadline."""
    if not sp.initialized:
        return (sp.initialized, sp.spso, sp.speo, sp.in_flight_ranges(), sp.acquired_count)
    return (
        sp.spso,
        sp.speo,
        sp.in_flight_ranges(),
        sp.next_lock_deadline(),
        sp.acquired_count,
        sp.range_count,
        sp.in_flight_count,
        sp.next_fetch_offset(),
        sp.can_acquire(),
        sp.snapshot_state(),
        # The lock-deadline index behind next_lock_deadline (deadline -> ranges holding it).
        dict(sp._deadlines),
    )


def busy() -> SharePartition:
    """Mixed ranges: m1 holds 0-2 (lock at LOCK_MS), m2 holds 5-7 (LOCK_MS + 10), 3-4
    acknowledged, 8-9 archived, 10-14 available at delivery count 2 (limit 3), SPEO 15."""
    sp = make(0, ((3, 4, 2, 1), (8, 9, 4, 1), (10, 14, 0, 2)), limit=3)
    fetch(sp, "m1", [(0, 2)], now_ms=0)
    fetch(sp, "m2", [(5, 7)], now_ms=10)
    assert states(sp) == [
        (0, 2, Q, 1, "m1"),
        (3, 4, K, 1, None),
        (5, 7, Q, 1, "m2"),
        (8, 9, X, 1, None),
        (10, 14, A, 2, None),
    ]
    return sp


Operation = Callable[[SharePartition], Any]

OPERATIONS: dict[str, Operation] = {
    "acquire_available_and_new_with_gap": lambda sp: sp.acquire(
        "m3", [(10, 14), (15, 19)], max_records=100, batch_size=3, now_ms=20, gaps=((17, 17),)
    ),
    "acknowledge_accept_and_release_moving_spso": lambda sp: sp.acknowledge(
        "m1", [(0, 0, ACCEPT), (1, 2, RELEASE)], now_ms=30
    ),
    "acknowledge_per_offset_types": lambda sp: sp.acknowledge(
        "m2",
        [(5, 7, (AcknowledgeType.REJECT, AcknowledgeType.ACCEPT, AcknowledgeType.RELEASE))],
        30,
    ),
    "renew_part_of_a_lock": lambda sp: sp.acknowledge("m2", [(6, 6, RENEW)], now_ms=5_000),
    "expire_locks": lambda sp: sp.expire_locks(LOCK_MS),
    "release_member": lambda sp: sp.release_member("m2", now_ms=40),
    "update_log_start_offset": lambda sp: sp.update_log_start_offset(6),
    "update_log_start_offset_past_speo": lambda sp: sp.update_log_start_offset(40),
}


def change_of(result: Any) -> PendingChange:
    return result if isinstance(result, PendingChange) else result.change  # type: ignore[no-any-return]


@pytest.mark.parametrize("operation", OPERATIONS.values(), ids=OPERATIONS.keys())
def test_rollback_restores_the_partition_exactly(operation: Operation) -> None:
    sp = busy()
    before = observable(sp)
    change = change_of(operation(sp))
    assert change.pending and sp.change_pending
    assert observable(sp) != before  # the change is visible in memory until completed
    change.rollback()
    assert not sp.change_pending
    assert observable(sp) == before


@pytest.mark.parametrize("operation", OPERATIONS.values(), ids=OPERATIONS.keys())
def test_after_a_rollback_the_same_change_commits_as_if_never_tried(operation: Operation) -> None:
    tried = busy()
    change_of(operation(tried)).rollback()
    retried = operation(tried)
    committed(retried)
    fresh = busy()
    first_time = operation(fresh)
    committed(first_time)
    assert observable(tried) == observable(fresh)
    assert change_of(retried).state_update == change_of(first_time).state_update


@pytest.mark.parametrize("operation", OPERATIONS.values(), ids=OPERATIONS.keys())
def test_no_change_may_start_while_one_is_pending(operation: Operation) -> None:
    sp = busy()
    change = change_of(operation(sp))
    pending = observable(sp)
    for other in OPERATIONS.values():
        with pytest.raises(ChangePending):
            other(sp)
    # Even a call that would change nothing is refused: the caller has a bug.
    with pytest.raises(ChangePending):
        sp.acknowledge("nobody", [(0, 0, ACCEPT)], now_ms=0)
    assert observable(sp) == pending
    change.commit()
    assert not sp.change_pending
    committed(sp.expire_locks(0))  # the next change may start


def test_rollback_of_acquisition_keeps_records_available_with_their_delivery_count() -> None:
    sp = busy()
    result = sp.acquire("m3", [(10, 14), (15, 19)], max_records=100, batch_size=100, now_ms=20)
    assert result.acquired == (AcquiredRange(10, 14, 3), AcquiredRange(15, 19, 1))
    result.change.rollback()
    assert sp.speo == 15
    assert sp.record_state(10) == InFlightRange(10, 14, A, 2)
    assert sp.next_fetch_offset() == 10


def test_rollback_of_acknowledgement_keeps_records_acquired_under_their_lock() -> None:
    sp = busy()
    sp.acknowledge("m1", [(0, 2, ACCEPT)], now_ms=500).change.rollback()
    assert sp.record_state(0) == InFlightRange(0, 2, Q, 1, "m1", LOCK_MS)
    assert sp.spso == 0
    # The client's retry succeeds, and had the lock expired first the records would return.
    retry = committed(sp.acknowledge("m1", [(0, 2, ACCEPT)], now_ms=600))
    assert retry.error_code == ErrorCode.none
    assert sp.spso == 5


def test_rollback_of_initialize_leaves_the_partition_uninitialized() -> None:
    sp = SharePartition(
        "group",
        TOPIC_ID,
        0,
        config=SharePartitionConfig(),
        state_epoch=0,
        start_offset=-1,
    )
    change = sp.initialize(42)
    assert change.state_update == StateUpdate(42, ())
    change.rollback()
    assert not sp.initialized
    assert observable(sp) == (False, -1, -1, [], 0)
    assert committed(sp.initialize(43)).state_update == StateUpdate(43, ())
    assert (sp.spso, sp.speo) == (43, 43)


def test_a_change_is_completed_once() -> None:
    sp = busy()
    change = sp.expire_locks(LOCK_MS).change
    change.commit()
    with pytest.raises(RuntimeError):
        change.commit()
    with pytest.raises(RuntimeError):
        change.rollback()


def test_a_call_that_changes_nothing_leaves_nothing_pending() -> None:
    sp = busy()
    before = observable(sp)
    refused = sp.acknowledge("m2", [(0, 2, ACCEPT)], now_ms=0)
    assert refused.error_code == ErrorCode.invalid_record_state
    assert refused.change is NO_CHANGE
    assert sp.expire_locks(0).change is NO_CHANGE
    assert sp.release_member("nobody", now_ms=0).change is NO_CHANGE
    assert sp.update_log_start_offset(0) is NO_CHANGE
    assert sp.acquire("m1", [], max_records=5, batch_size=5, now_ms=0).change is NO_CHANGE
    assert not sp.change_pending
    NO_CHANGE.rollback()
    NO_CHANGE.commit()
    assert observable(sp) == before


def test_renew_is_a_pending_change_without_a_write() -> None:
    sp = busy()
    result = sp.acknowledge("m1", [(0, 2, RENEW)], now_ms=1_000)
    assert result.state_update is None
    assert result.change.pending
    result.change.rollback()
    assert sp.next_lock_deadline() == LOCK_MS


def test_an_exception_half_way_through_a_change_undoes_what_it_did(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sp = busy()
    before = observable(sp)
    # acknowledge applies each batch's runs in one call: fail on the second batch.
    real_apply = SharePartition._apply_runs
    calls = 0

    def failing_apply(self: SharePartition, *args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise RuntimeError("bug")
        return real_apply(self, *args, **kwargs)

    monkeypatch.setattr(SharePartition, "_apply_runs", failing_apply)
    with pytest.raises(RuntimeError, match="bug"):
        sp.acknowledge("m1", [(0, 0, ACCEPT), (2, 2, REJECT)], now_ms=0)
    assert calls == 2
    assert observable(sp) == before
    assert not sp.change_pending
    monkeypatch.undo()
    committed(sp.acknowledge("m1", [(0, 0, ACCEPT), (2, 2, REJECT)], now_ms=0))
    assert sp.spso == 1


def test_delivery_complete_count_is_terminal_records_at_or_above_spso() -> None:
    # Kafka 4.2's SharePartition.deliveryCompleteCount: ACKNOWLEDGED/ARCHIVED records not
    # yet passed by SPSO; SPSO moving over them takes them out, a rollback puts it back.
    sp = make()
    fetch(sp, "m1", [(0, 9)])
    assert sp.delivery_complete_count == 0
    committed(sp.acknowledge("m1", [(2, 3, ACCEPT), (5, 5, REJECT)], now_ms=0))
    assert sp.delivery_complete_count == 3
    result = sp.acknowledge("m1", [(0, 1, ACCEPT)], now_ms=0)
    # SPSO moves to 4 over 0-3: only offset 5 is left to count.
    assert result.state_update is not None
    assert result.state_update.start_offset == 4
    assert result.state_update.delivery_complete_count == 1
    result.change.rollback()
    assert sp.delivery_complete_count == 3 and sp.spso == 0
    loaded = SharePartition(
        "g",
        sp.topic_id,
        0,
        config=sp.config,
        state_epoch=0,
        start_offset=2,
        state_batches=[(2, 3, 2, 1), (4, 4, 0, 1), (5, 6, 4, 2)],
    )
    # Loading: 2-3 done moves SPSO to 4; 5-6 are counted.
    assert (loaded.spso, loaded.delivery_complete_count) == (4, 2)
