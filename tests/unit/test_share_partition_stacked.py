"""A change stacked on a pending one (`SharePartition.stack_on`): a ShareFetch applies the
previous delivery's acknowledgements and acquires on top of them, and both are one
PendingChange, one state update (one share-state write), committed or rolled back
together."""

from __future__ import annotations

import pytest

from broker.share.partition import NO_CHANGE, ChangePending, SharePartition, StateUpdate
from coordinator.share_state import PersistedBatch
from tests.unit.test_share_partition import (
    ACCEPT,
    RELEASE,
    A,
    Q,
    Stored,
    X,
    fetch,
    make,
    states,
)


def _setup() -> SharePartition:
    sp = make()
    fetch(sp, "m", [(0, 9)], max_records=10)  # 0-9 acquired by m, delivery count 1
    return sp


def _ack_then_acquire(
    sp: SharePartition, gaps: tuple[tuple[int, int], ...] = ()
) -> tuple[object, object]:
    ack = sp.acknowledge("m", [(0, 4, ACCEPT), (5, 9, RELEASE)], now_ms=100)
    sp.stack_on(ack.change)
    got = sp.acquire("m", [(0, 19)], max_records=100, batch_size=100, now_ms=100, gaps=gaps)
    return ack, got


def test_a_stacked_acquisition_and_its_acknowledgements_are_one_state_update() -> None:
    sp = _setup()
    ack, got = _ack_then_acquire(sp)
    assert [tuple(r) for r in got.acquired] == [(5, 9, 2), (10, 19, 1)]  # type: ignore[attr-defined]
    change = got.change  # type: ignore[attr-defined]
    assert change.pending and not ack.change.pending  # type: ignore[attr-defined]
    # The acknowledgements moved SPSO to 5 and released 5-9 with the delivery made
    # (AVAILABLE, count 1). The acquisition on top writes nothing of its own: 5-9 acquired
    # again with count 2 read as AVAILABLE with 1, 10-19 (count 1) as never delivered.
    assert change.state_update == StateUpdate(5, (PersistedBatch(5, 9, 0, 1),), 0)
    change.commit()
    assert states(sp) == [(5, 9, Q, 2, "m"), (10, 19, Q, 1, "m")]
    assert not sp.change_pending
    assert sp.snapshot_state() == (5, [PersistedBatch(5, 9, 0, 1)])
    # A crash after the write redelivers what the acquisition handed out, with the counts
    # from before it.
    stored = Stored()
    stored.write(change.state_update)
    assert fetch(stored.reload(), "n", [(0, 19)]) == [(5, 9, 2), (10, 19, 1)]


def test_a_stacked_acquisition_that_writes_rewrites_the_acknowledged_spans_from_now() -> None:
    sp = _setup()
    ack, got = _ack_then_acquire(sp, gaps=((15, 15),))
    assert [tuple(r) for r in got.acquired] == [(5, 9, 2), (10, 14, 1), (16, 19, 1)]  # type: ignore[attr-defined]
    change = got.change  # type: ignore[attr-defined]
    assert change.pending and not ack.change.pending  # type: ignore[attr-defined]
    # The acquisition archives the gap at 15 (its own write); the acknowledgement's span
    # 5-9, acquired again since, is written as it durably is: AVAILABLE with count 1.
    assert change.state_update == StateUpdate(
        5, (PersistedBatch(5, 9, 0, 1), PersistedBatch(15, 15, int(X), 0)), 1
    )
    change.rollback()
    assert states(sp) == [(0, 9, Q, 1, "m")]
    assert (sp.spso, sp.speo, sp.acquired_count, sp.change_pending) == (0, 10, 10, False)


def test_rolling_back_a_stacked_change_undoes_both() -> None:
    sp = _setup()
    before = states(sp)
    _, got = _ack_then_acquire(sp)
    got.change.rollback()  # type: ignore[attr-defined]
    assert states(sp) == before
    assert (sp.spso, sp.speo, sp.acquired_count, sp.change_pending) == (0, 10, 10, False)


def test_a_stacked_call_that_changes_nothing_returns_the_base_still_pending() -> None:
    sp = make(max_in_flight=10)
    fetch(sp, "m", [(0, 9)], max_records=10)
    ack = sp.acknowledge("m", [(0, 9, ACCEPT)], now_ms=100)
    sp.stack_on(ack.change)
    # Nothing past SPEO is in the log yet: the acquisition adds nothing.
    got = sp.acquire("m", [], max_records=100, batch_size=100, now_ms=100)
    assert got.acquired == () and got.change is ack.change and ack.change.pending
    ack.change.commit()
    assert (sp.spso, sp.change_pending) == (10, False)


def test_without_stack_on_a_second_change_is_still_refused() -> None:
    sp = _setup()
    ack = sp.acknowledge("m", [(0, 9, ACCEPT)], now_ms=100)
    with pytest.raises(ChangePending):
        sp.acquire("m", [(0, 19)], max_records=100, batch_size=100, now_ms=100)
    # stack_on is good for one call only.
    sp.stack_on(ack.change)
    got = sp.acquire("m", [(0, 19)], max_records=100, batch_size=100, now_ms=100)
    with pytest.raises(ChangePending):
        sp.expire_locks(10**9)
    got.change.commit()
    assert states(sp) == [(10, 19, Q, 1, "m")]


def test_stack_on_only_takes_the_partitions_own_pending_change() -> None:
    sp = _setup()
    other = _setup().acknowledge("m", [(0, 9, ACCEPT)], now_ms=100)
    with pytest.raises(RuntimeError):
        sp.stack_on(other.change)
    sp.stack_on(NO_CHANGE)  # nothing pending to build on: the next call starts afresh
    fetch(sp, "n", [(0, 19)], max_records=100)
    assert states(sp)[-1] == (10, 19, Q, 1, "n")


def test_a_stacked_call_that_fails_half_way_leaves_the_base_pending() -> None:
    sp = _setup()
    ack = sp.acknowledge("m", [(0, 4, ACCEPT), (5, 9, RELEASE)], now_ms=100)
    sp.stack_on(ack.change)
    with pytest.raises(ValueError):
        # Bad input raising inside the stacked call (batches not ascending).
        sp.acquire("m", [(10, 19), (0, 9)], max_records=100, batch_size=100, now_ms=100)
    assert ack.change.pending
    assert states(sp) == [(5, 9, A, 1, None)]
    ack.change.rollback()
    assert states(sp) == [(0, 9, Q, 1, "m")]
