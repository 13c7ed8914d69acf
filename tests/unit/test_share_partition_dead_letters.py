"""SharePartition with a dead-letter topic (KIP-1191): the ARCHIVING state, sans-IO."""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest

from broker.share.dead_letters import DeadLetter, DeadLetterReason
from broker.share.partition import (
    TRANSITIONS,
    AcknowledgeType,
    ChangePending,
    Event,
    PendingChange,
    RecordState,
    SharePartition,
    SharePartitionConfig,
)
from coordinator.share_state import PersistedBatch
from protocol.errors import ErrorCode

TOPIC_ID = uuid.UUID("6d1f9c1e-0000-4000-8000-000000000002")
LOCK_MS = 1_000
A = RecordState.AVAILABLE
Q = RecordState.ACQUIRED
G = RecordState.ARCHIVING
X = RecordState.ARCHIVED
REJECTED = DeadLetterReason.REJECTED
LIMIT = DeadLetterReason.DELIVERY_LIMIT


def make(
    start_offset: int = 0,
    state_batches: tuple[tuple[int, int, int, int], ...] = (),
    *,
    limit: int = 2,
    dead_letter: bool = True,
) -> SharePartition:
    return SharePartition(
        "group",
        TOPIC_ID,
        0,
        config=SharePartitionConfig(
            record_lock_duration_ms=LOCK_MS,
            delivery_count_limit=limit,
            dead_letter=dead_letter,
        ),
        state_epoch=0,
        start_offset=start_offset,
        state_batches=state_batches,
    )


def states(sp: SharePartition) -> list[tuple[int, int, RecordState, int]]:
    return [
        (r.first_offset, r.last_offset, r.state, r.delivery_count) for r in sp.in_flight_ranges()
    ]


def letter(first: int, last: int, count: int, reason: DeadLetterReason) -> DeadLetter:
    return DeadLetter("group", TOPIC_ID, 0, first, last, count, reason)


def acquire(sp: SharePartition, last: int, now_ms: int = 0, member: str = "m") -> None:
    result = sp.acquire(
        member, [(sp.next_fetch_offset(), last)], max_records=100, batch_size=100, now_ms=now_ms
    )
    result.change.commit()


def ack(sp: SharePartition, first: int, last: int, kind: AcknowledgeType) -> PendingChange:
    result = sp.acknowledge("m", [(first, last, (kind,))], now_ms=0)
    assert result.error_code == ErrorCode.none, result.error_message
    return result.change


def test_the_table_moves_archiving_only_to_archived() -> None:
    assert [key for key in TRANSITIONS if key[0] is G] == [(G, Event.ARCHIVE)]
    assert TRANSITIONS[(G, Event.ARCHIVE)] is X


def test_without_a_dead_letter_topic_a_reject_archives_as_before() -> None:
    sp = make(dead_letter=False)
    acquire(sp, 4)
    change = ack(sp, 0, 4, AcknowledgeType.REJECT)
    assert change.state_update is not None
    assert change.state_update.start_offset == 5  # SPSO moved over the archived records
    change.commit()
    assert sp.spso == 5 and not sp.has_dead_letters
    assert sp.take_dead_letters() == []


def test_reject_is_archiving_until_archived() -> None:
    sp = make()
    acquire(sp, 4)
    ack(sp, 0, 1, AcknowledgeType.ACCEPT).commit()
    change = ack(sp, 2, 3, AcknowledgeType.REJECT)
    update = change.state_update
    assert update is not None
    # Persisted as state 3; SPSO stops before it; not complete yet.
    assert update.start_offset == 2
    assert PersistedBatch(2, 3, 3, 1) in update.state_batches
    assert update.delivery_complete_count == 0
    change.commit()
    assert states(sp) == [(2, 3, G, 1), (4, 4, Q, 1)]
    assert sp.has_dead_letters and sp.delivery_complete_count == 0
    assert sp.take_dead_letters() == [letter(2, 3, 1, REJECTED)]
    assert sp.take_dead_letters() == []  # handed out once
    archived = sp.archive_dead_letter(2, 3)
    assert archived.state_update is not None
    assert archived.state_update.start_offset == 4
    archived.commit()
    assert states(sp) == [(4, 4, Q, 1)]
    assert not sp.has_dead_letters


def test_gap_is_archived_straight_away() -> None:
    sp = make()
    acquire(sp, 2)
    ack(sp, 0, 2, AcknowledgeType.GAP).commit()
    assert sp.spso == 3 and not sp.has_dead_letters


@pytest.mark.parametrize("how", ["release", "lock_timeout", "member_release"])
def test_delivery_limit_reached_is_archiving(how: str) -> None:
    sp = make(limit=2)
    acquire(sp, 2)
    ack(sp, 0, 2, AcknowledgeType.RELEASE).commit()
    acquire(sp, 2, now_ms=10)  # delivery 2 of 2
    if how == "release":
        change = ack(sp, 0, 2, AcknowledgeType.RELEASE)
    elif how == "lock_timeout":
        result = sp.expire_locks(10 + LOCK_MS)
        assert result.archived == ((0, 2),) and result.available == ()
        change = result.change
    else:
        change = sp.release_member("m", 20).change
    change.commit()
    assert states(sp) == [(0, 2, G, 2)]
    assert sp.next_fetch_offset() == 3  # never acquired again
    assert sp.take_dead_letters() == [letter(0, 2, 2, LIMIT)]


def test_a_fetch_skipping_a_record_at_the_limit_dead_letters_it_but_not_a_gap() -> None:
    # Offsets 0-1 persisted AVAILABLE at the limit (lowered since); 2-3 an aborted batch.
    sp = make(0, ((0, 1, 0, 2),), limit=2)
    result = sp.acquire(
        "m", [(0, 1), (2, 3), (4, 5)], max_records=10, batch_size=10, now_ms=0, gaps=[(2, 3)]
    )
    result.change.commit()
    assert [(r.first_offset, r.last_offset) for r in result.acquired] == [(4, 5)]
    assert states(sp) == [(0, 1, G, 2), (2, 3, X, 0), (4, 5, Q, 1)]
    assert sp.take_dead_letters() == [letter(0, 1, 2, LIMIT)]


def test_load_resumes_archiving_with_the_reason_inferred() -> None:
    # Below the limit it was rejected; at the limit Kafka reads it as the delivery limit.
    sp = make(10, ((10, 11, 3, 1), (12, 12, 2, 1), (13, 14, 3, 2)), limit=2)
    assert sp.spso == 10 and sp.delivery_complete_count == 1
    assert sp.take_dead_letters() == [letter(10, 11, 1, REJECTED), letter(13, 14, 2, LIMIT)]
    assert sp.snapshot_state() == (
        10,
        [PersistedBatch(10, 11, 3, 1), PersistedBatch(12, 12, 2, 1), PersistedBatch(13, 14, 3, 2)],
    )
    sp.archive_dead_letter(10, 11).commit()
    assert sp.spso == 13


def test_a_failed_archive_write_leaves_it_archiving_and_handed_out() -> None:
    sp = make(0, ((0, 3, 3, 1),))
    assert sp.take_dead_letters() == [letter(0, 3, 1, REJECTED)]
    before = (states(sp), sp.snapshot_state(), sp.delivery_complete_count)
    sp.archive_dead_letter(0, 3).rollback()
    assert (states(sp), sp.snapshot_state(), sp.delivery_complete_count) == before
    assert sp.take_dead_letters() == []
    sp.return_dead_letters()
    assert sp.take_dead_letters() == [letter(0, 3, 1, REJECTED)]


def test_new_runs_next_to_handed_ones_are_handed_out_alone() -> None:
    sp = make()
    acquire(sp, 5)
    ack(sp, 0, 1, AcknowledgeType.REJECT).commit()
    assert sp.take_dead_letters() == [letter(0, 1, 1, REJECTED)]
    ack(sp, 2, 3, AcknowledgeType.REJECT).commit()
    assert states(sp)[0] == (0, 3, G, 1)  # one range, two runs
    assert sp.take_dead_letters() == [letter(2, 3, 1, REJECTED)]
    sp.archive_dead_letter(0, 1).commit()
    assert states(sp)[0] == (2, 3, G, 1)
    assert sp.take_dead_letters() == []


def test_a_run_rejected_between_handed_ones_is_the_only_one_handed_out() -> None:
    """One rejection in ten, as consumers reject: each handed run is found again on every
    take until archived, and only a run rejected later among them is new."""
    sp = make()
    acquire(sp, 39)
    rejected = {0, 10, 30}
    acks = [
        (o, o, (AcknowledgeType.REJECT if o in rejected else AcknowledgeType.ACCEPT,))
        for o in range(40)
        if o != 20
    ]
    result = sp.acknowledge("m", acks, now_ms=0)
    assert result.error_code == ErrorCode.none
    result.change.commit()
    assert sp.take_dead_letters() == [letter(o, o, 1, REJECTED) for o in sorted(rejected)]
    assert sp.take_dead_letters() == []
    ack(sp, 20, 20, AcknowledgeType.REJECT).commit()
    assert sp.take_dead_letters() == [letter(20, 20, 1, REJECTED)]
    sp.archive_dead_letters([(0, 0), (10, 10)]).commit()
    assert sp.take_dead_letters() == []
    sp.return_dead_letters()
    assert sp.take_dead_letters() == [letter(20, 20, 1, REJECTED), letter(30, 30, 1, REJECTED)]


@pytest.mark.parametrize("how", ["reject", "release", "lock_timeout", "member_release"])
def test_a_take_with_nothing_new_since_the_last_finds_what_any_change_made_archiving(
    how: str,
) -> None:
    """A take after one that found everything hands out nothing (and looks at nothing)
    until a range becomes ARCHIVING, whichever way it does."""
    sp = make(limit=2)
    acquire(sp, 5)
    ack(sp, 0, 0, AcknowledgeType.REJECT).commit()
    ack(sp, 1, 3, AcknowledgeType.RELEASE).commit()
    assert sp.take_dead_letters() == [letter(0, 0, 1, REJECTED)]
    assert sp.take_dead_letters() == []
    acquire(sp, 3, now_ms=10)  # 1-3: delivery 2 of 2
    assert sp.take_dead_letters() == []
    if how == "reject":
        change = ack(sp, 1, 3, AcknowledgeType.REJECT)
        expected = letter(1, 3, 2, REJECTED)
    elif how == "release":
        change = ack(sp, 1, 3, AcknowledgeType.RELEASE)
        expected = letter(1, 3, 2, LIMIT)
    elif how == "lock_timeout":
        change = sp.expire_locks(10 + LOCK_MS).change
        expected = letter(1, 3, 2, LIMIT)
    else:
        change = sp.release_member("m", 20).change
        expected = letter(1, 3, 2, LIMIT)
    change.commit()
    assert sp.take_dead_letters() == [expected]
    assert sp.take_dead_letters() == []
    # An archive rolled back puts its range back ARCHIVING: still handed out, not new.
    sp.archive_dead_letter(0, 0).rollback()
    assert sp.take_dead_letters() == []
    sp.return_dead_letters()
    assert sp.take_dead_letters() == [letter(0, 0, 1, REJECTED), expected]


def test_dead_letters_are_not_taken_while_a_change_is_pending() -> None:
    sp = make()
    acquire(sp, 1)
    change = ack(sp, 0, 1, AcknowledgeType.REJECT)
    with pytest.raises(ChangePending):
        sp.take_dead_letters()
    change.rollback()
    assert sp.take_dead_letters() == []
    assert states(sp) == [(0, 1, Q, 1)]


def test_archiving_records_are_not_acknowledged() -> None:
    sp = make()
    acquire(sp, 1)
    ack(sp, 0, 1, AcknowledgeType.REJECT).commit()
    result = sp.acknowledge("m", [(0, 1, (AcknowledgeType.ACCEPT,))], now_ms=0)
    assert result.error_code == ErrorCode.invalid_record_state
    assert "ARCHIVING" in (result.error_message or "")


def test_switching_the_topic_off_drains_what_is_archiving() -> None:
    sp = make()
    acquire(sp, 3)
    ack(sp, 0, 1, AcknowledgeType.REJECT).commit()
    sp.config = replace(sp.config, dead_letter=False)
    ack(sp, 2, 3, AcknowledgeType.REJECT).commit()
    assert states(sp) == [(0, 1, G, 1), (2, 3, X, 1)]
    assert sp.take_dead_letters() == [letter(0, 1, 1, REJECTED)]
    sp.archive_dead_letter(0, 1).commit()
    assert sp.spso == 4 and states(sp) == []
