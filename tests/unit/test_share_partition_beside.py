"""Acquiring beside a pending change (SharePartition.acquire_beside): while another
request's acknowledgement waits for its share-state write, a fetch acquires new records
past SPEO at once, as Kafka lets a fetch acquire while an acknowledgement's persister
write runs; what it acquired stays whether the acknowledgement commits or rolls back."""

from __future__ import annotations

import pytest

from broker.share.partition import ChangePending, SharePartition
from tests.unit.test_share_partition import (
    ACCEPT,
    RELEASE,
    A,
    K,
    Q,
    committed,
    fetch,
    make,
    states,
    whole_state,
)


def pending_ack(sp: SharePartition, first: int, last: int) -> object:
    """`m`'s acknowledgement of [first, last] as ACCEPT, not yet written."""
    return sp.acknowledge("m", [(first, last, ACCEPT)], now_ms=0)


def beside(sp: SharePartition, member: str, batches: list[tuple[int, int]], **kw: int) -> list:
    return list(sp.acquire_beside(member, batches, max_records=kw.get("max_records", 500),
                                  batch_size=500, now_ms=0))  # fmt: skip


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
def test_new_records_are_acquired_beside_a_pending_acknowledgement(outcome: str) -> None:
    sp = make()
    fetch(sp, "m", [(0, 9)])
    ack = pending_ack(sp, 0, 4)
    assert sp.change_pending and sp.can_acquire_beside()
    got = beside(sp, "n", [(10, 19)])
    assert [(r.first_offset, r.last_offset, r.delivery_count) for r in got] == [(10, 19, 1)]
    assert sp.speo == 20
    if outcome == "commit":
        ack.change.commit()  # type: ignore[attr-defined]
        assert states(sp) == [(5, 9, Q, 1, "m"), (10, 19, Q, 1, "n")]
        assert sp.spso == 5
    else:
        ack.change.rollback()  # type: ignore[attr-defined]
        assert states(sp) == [(0, 9, Q, 1, "m"), (10, 19, Q, 1, "n")]
        assert sp.spso == 0
    assert sp.speo == 20
    assert sp.acquired_count == (15 if outcome == "commit" else 20)
    # The next change of the partition starts from there, as usual.
    committed(sp.acknowledge("n", [(10, 19, ACCEPT)], now_ms=0))
    assert (10, 19, K, 1, "n") not in states(sp)  # SPSO moved over it or it is done
    assert sp.speo == 20


def test_a_rollback_leaves_the_partition_as_without_the_acknowledgement() -> None:
    # The same acquisitions without an acknowledgement in between: same state.
    sp, plain = make(), make()
    for p in (sp, plain):
        fetch(p, "m", [(0, 9)])
    ack = pending_ack(sp, 0, 9)
    beside(sp, "n", [(10, 14)])
    ack.change.rollback()  # type: ignore[attr-defined]
    fetch(plain, "n", [(10, 14)])
    assert whole_state(sp)[:3] == whole_state(plain)[:3]
    assert [(r.first_offset, r.last_offset, r.member_id) for r in sp.in_flight_ranges()] == [
        (0, 9, "m"),
        (10, 14, "n"),
    ]


def test_not_beside_a_change_that_acquired() -> None:
    sp = make()
    fetch(sp, "m", [(0, 9)])
    stacked = sp.acknowledge("m", [(0, 9, ACCEPT)], now_ms=0)
    sp.stack_on(stacked.change)
    mine = sp.acquire("m", [(10, 19)], max_records=500, batch_size=500, now_ms=0)
    assert sp.change_pending and not sp.can_acquire_beside()  # it moved SPEO
    with pytest.raises(ChangePending):
        beside(sp, "n", [(20, 29)])
    mine.change.rollback()


def test_not_while_records_are_available() -> None:
    sp = make()
    fetch(sp, "m", [(0, 9)])
    release = sp.acknowledge("m", [(0, 4, RELEASE)], now_ms=0)  # AVAILABLE if it is written
    assert not sp.can_acquire_beside()
    release.change.commit()
    assert (0, 4, A, 1, None) in states(sp)
    ack = pending_ack(sp, 5, 9)
    assert not sp.can_acquire_beside()  # 0-4 go first, with the lock, in order
    ack.change.rollback()


def test_the_record_lock_limit_counts_from_spso_before_the_pending_change() -> None:
    sp = make(max_in_flight=20)
    fetch(sp, "m", [(0, 9)])
    ack = pending_ack(sp, 0, 9)  # SPSO 10 if written, 0 if not
    got = beside(sp, "n", [(10, 39)])
    # At most 20 records past the SPSO a rollback would restore.
    assert [(r.first_offset, r.last_offset) for r in got] == [(10, 19)]
    assert not sp.can_acquire_beside()
    ack.change.rollback()  # type: ignore[attr-defined]
    assert sp.speo - sp.spso == 20


def test_only_from_speo_and_only_without_a_pending_change() -> None:
    sp = make()
    fetch(sp, "m", [(0, 9)])
    assert not sp.can_acquire_beside()  # nothing pending: take the lock instead
    ack = pending_ack(sp, 0, 4)
    assert beside(sp, "n", [(12, 19)]) == []  # the read does not start at SPEO
    assert beside(sp, "n", [(10, 12)], max_records=2) == [] or sp.speo == 13
    ack.change.commit()  # type: ignore[attr-defined]
