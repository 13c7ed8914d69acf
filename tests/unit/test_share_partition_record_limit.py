"""SharePartition.acquire in ShareFetch v2's acquire modes (KIP-1206).

record_limit makes MaxRecords a hard limit: a log batch is cut wherever the limit falls and
the rest of it stays available to the next fetch, by any member, as records never delivered
(past SPEO) or AVAILABLE with their delivery count unchanged. batch_optimized (the default,
and every v1 fetch) finishes the last log batch, as before KIP-1206.
"""

from __future__ import annotations

import pytest

from broker.share.partition import (
    AcquiredRange,
    RecordState,
    ShareAcquireMode,
    SharePartition,
    StateUpdate,
)
from coordinator.share_state import PersistedBatch
from tests.unit.test_share_partition import RELEASE, Stored, committed, make, states, whole_state

A = RecordState.AVAILABLE
Q = RecordState.ACQUIRED
X = RecordState.ARCHIVED
LIMIT = ShareAcquireMode.RECORD_LIMIT
BATCH = ShareAcquireMode.BATCH_OPTIMIZED
# One produced batch of 352 records, as a producer's linger makes it.
BIG = [(0, 351)]


def fetch(
    sp: SharePartition,
    member: str,
    batches: list[tuple[int, int]],
    *,
    max_records: int = 5,
    batch_size: int = 5,
    mode: ShareAcquireMode = LIMIT,
    gaps: tuple[tuple[int, int], ...] = (),
) -> list[AcquiredRange]:
    result = sp.acquire(
        member,
        batches,
        max_records=max_records,
        batch_size=batch_size,
        now_ms=0,
        gaps=gaps,
        mode=mode,
    )
    return list(committed(result).acquired)


def test_modes_have_kafkas_wire_ids() -> None:
    # ShareFetchRequest.json v2: "0:batch-optimized,1:record-limit".
    assert (int(BATCH), int(LIMIT)) == (0, 1)


def test_batch_optimized_finishes_the_batch_past_max_records() -> None:
    sp = make()
    assert fetch(sp, "m1", BIG, mode=BATCH, batch_size=500) == [AcquiredRange(0, 351, 1)]
    assert sp.speo == 352


def test_record_limit_cuts_a_batch_at_max_records() -> None:
    sp = make()
    result = committed(sp.acquire("m1", BIG, max_records=5, batch_size=5, now_ms=0, mode=LIMIT))
    assert result.acquired == (AcquiredRange(0, 4, 1),)
    # Records never delivered before are written nothing (KIP-932: ACQUIRED is transient).
    assert result.state_update is None
    assert states(sp) == [(0, 4, Q, 1, "m1")]
    # The rest of the batch was never delivered: past SPEO, where the next fetch starts.
    assert (sp.spso, sp.speo, sp.next_fetch_offset()) == (0, 5, 5)
    assert sp.acquired_count == 5


def test_record_limit_leaves_the_rest_of_the_batch_to_the_next_member() -> None:
    sp = make()
    assert fetch(sp, "m1", BIG) == [AcquiredRange(0, 4, 1)]
    # The log read from next_fetch_offset() (5) returns the whole batch again.
    assert fetch(sp, "m2", BIG) == [AcquiredRange(5, 9, 1)]
    assert fetch(sp, "m1", BIG) == [AcquiredRange(10, 14, 1)]
    assert states(sp) == [(0, 4, Q, 1, "m1"), (5, 9, Q, 1, "m2"), (10, 14, Q, 1, "m1")]
    # 67 more fetches of 5 take the batch to its end, each record delivered once.
    got = [r for _ in range(67) for r in fetch(sp, "m3", BIG)]
    assert got[-1] == AcquiredRange(345, 349, 1)
    assert fetch(sp, "m3", BIG) == [AcquiredRange(350, 351, 1)]
    assert fetch(sp, "m3", BIG) == []
    assert {r.delivery_count for r in got} == {1}
    assert sp.speo == 352


def test_record_limit_does_not_split_by_batch_size() -> None:
    # Kafka 4.2 splits no batch in record_limit mode: BatchSize shapes batch_optimized only.
    batches = [(0, 3), (4, 7), (8, 11), (12, 15)]
    assert fetch(make(), "m1", batches, max_records=10, batch_size=2) == [AcquiredRange(0, 9, 1)]
    assert fetch(make(), "m1", batches, max_records=10, batch_size=2, mode=BATCH) == [
        AcquiredRange(0, 3, 1),
        AcquiredRange(4, 7, 1),
        AcquiredRange(8, 11, 1),
    ]


def test_record_limit_cuts_available_records_and_keeps_the_rest_available() -> None:
    # 0-99 were delivered once and released.
    sp = make(0, ((0, 99, 0, 1),))
    assert fetch(sp, "m1", [(0, 49), (50, 99)], max_records=10) == [AcquiredRange(0, 9, 2)]
    assert states(sp) == [(0, 9, Q, 2, "m1"), (10, 99, A, 1, None)]
    assert sp.next_fetch_offset() == 10
    assert fetch(sp, "m2", [(0, 49), (50, 99)], max_records=10) == [AcquiredRange(10, 19, 2)]
    # batch_optimized would have finished the log batch: 10-49.
    assert fetch(sp, "m3", [(0, 49), (50, 99)], max_records=10, mode=BATCH) == [
        AcquiredRange(20, 49, 2)
    ]


def test_record_limit_counts_available_and_new_records_together() -> None:
    sp = make(0, ((0, 2, 0, 1),))
    assert fetch(sp, "m1", BIG, max_records=5) == [AcquiredRange(0, 2, 2), AcquiredRange(3, 4, 1)]
    assert sp.speo == 5


def test_record_limit_counts_offsets_so_a_gap_within_the_limit_takes_its_place() -> None:
    # Control and aborted batches are archived, never delivered. The limit is on offsets, as
    # Kafka 4.2's acquireNewBatchRecords counts them (it acquires a control record with
    # the rest, for the client to acknowledge as a gap): never more than MaxRecords.
    sp = make()
    got = fetch(sp, "m1", [(0, 0), (1, 351)], gaps=((0, 0),), max_records=5)
    assert got == [AcquiredRange(1, 4, 1)]
    assert states(sp) == [(1, 4, Q, 1, "m1")]
    assert (sp.spso, sp.speo) == (1, 5)
    assert fetch(sp, "m2", [(1, 351)], max_records=5) == [AcquiredRange(5, 9, 1)]


def test_record_limit_release_redelivers_only_what_was_acquired() -> None:
    stored = Stored()
    sp = make()
    fetch(sp, "m1", BIG)
    released = committed(sp.acknowledge("m1", [(0, 4, RELEASE)], now_ms=0))
    assert released.state_update == StateUpdate(0, (PersistedBatch(0, 4, 0, 1),), 0)
    stored.write(released.state_update)
    # Released records come back first, with their count; the uncut rest as new records.
    assert fetch(sp, "m2", BIG, max_records=8) == [AcquiredRange(0, 4, 2), AcquiredRange(5, 7, 1)]
    # A new leader reads the same: 0-4 delivered once, the rest never.
    reloaded = stored.reload()
    assert states(reloaded) == [(0, 4, A, 1, None)]
    assert fetch(reloaded, "m3", BIG, max_records=8) == [
        AcquiredRange(0, 4, 2),
        AcquiredRange(5, 7, 1),
    ]


def test_record_limit_still_honours_max_in_flight_records() -> None:
    sp = make(max_in_flight=3)
    assert fetch(sp, "m1", BIG, max_records=5) == [AcquiredRange(0, 2, 1)]
    assert not sp.can_acquire()


@pytest.mark.parametrize("max_records", [0, -1])
def test_record_limit_with_no_records_to_take_changes_nothing(max_records: int) -> None:
    sp = make()
    before = whole_state(sp)
    assert fetch(sp, "m1", BIG, max_records=max_records) == []
    assert whole_state(sp) == before


def test_record_limit_cut_is_rolled_back_with_its_change() -> None:
    sp = make(0, ((0, 9, 0, 1),))
    before = whole_state(sp)
    result = sp.acquire("m1", [(0, 351)], max_records=15, batch_size=15, now_ms=0, mode=LIMIT)
    assert result.acquired == (AcquiredRange(0, 9, 2), AcquiredRange(10, 14, 1))
    result.change.rollback()
    assert whole_state(sp) == before
