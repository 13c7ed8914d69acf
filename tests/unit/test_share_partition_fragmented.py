"""Per-offset acknowledgements that fragment a share partition (KIP-932 AcknowledgeTypes
one per offset): the state they leave, what is persisted, and a rollback of all of it."""

from __future__ import annotations

import uuid

from broker.share.partition import (
    AcknowledgeType,
    RecordState,
    SharePartition,
    SharePartitionConfig,
)
from coordinator.share_state import PersistedBatch

N = 2_000
ACCEPT, RELEASE = AcknowledgeType.ACCEPT, AcknowledgeType.RELEASE


def acquired_partition() -> SharePartition:
    sp = SharePartition(
        "group",
        uuid.UUID(int=7),
        0,
        config=SharePartitionConfig(record_lock_duration_ms=1_000, max_in_flight_records=N),
        state_epoch=0,
        start_offset=0,
    )
    sp.acquire("m", [(0, N - 1)], max_records=N, batch_size=N, now_ms=0).change.commit()
    return sp


def alternating(first: int, last: int) -> list[int]:
    return [ACCEPT if offset % 2 == 0 else RELEASE for offset in range(first, last + 1)]


def test_alternating_accept_release_leaves_one_range_per_offset_and_persists_each() -> None:
    sp = acquired_partition()
    result = sp.acknowledge("m", [(0, N - 1, alternating(0, N - 1))], now_ms=10)
    assert result.released == N // 2
    update = result.state_update
    assert update is not None
    # Offset 0 is accepted: SPSO moves over it. Every offset is written, one batch each:
    # accepted ACKNOWLEDGED, released AVAILABLE with the delivery made (count 1), as the
    # acquisition itself wrote nothing.
    assert update.start_offset == 1
    assert update.delivery_complete_count == N // 2 - 1
    assert update.state_batches == tuple(
        PersistedBatch(o, o, 2 if o % 2 == 0 else 0, 1) for o in range(1, N)
    )
    result.change.commit()
    assert sp.range_count == N - 1
    assert [(r.first_offset, r.last_offset, r.state) for r in sp.in_flight_ranges()[:2]] == [
        (1, 1, RecordState.AVAILABLE),
        (2, 2, RecordState.ACKNOWLEDGED),
    ]

    again = sp.acquire("m", [(0, N - 1)], max_records=N, batch_size=N, now_ms=20)
    assert sum(r.last_offset - r.first_offset + 1 for r in again.acquired) == N // 2
    assert {r.delivery_count for r in again.acquired} == {2}
    # Acquiring the released half again changes nothing durable: nothing to write.
    assert again.state_update is None
    again.change.commit()
    assert sp.acquired_count == N // 2
    assert sp.snapshot_state() == (1, list(update.state_batches))
    # Reloaded from what was written, the released half is delivered again with count 2.
    reloaded = SharePartition(
        "group",
        uuid.UUID(int=7),
        0,
        config=sp.config,
        state_epoch=0,
        start_offset=update.start_offset,
        state_batches=update.state_batches,
    )
    redelivered = reloaded.acquire("m", [(0, N - 1)], max_records=N, batch_size=N, now_ms=30)
    assert [(r.first_offset, r.last_offset, r.delivery_count) for r in redelivered.acquired] == [
        (o, o, 2) for o in range(1, N, 2)
    ]


def test_per_offset_types_of_a_batch_reaching_below_spso_apply_to_their_own_offsets() -> None:
    sp = acquired_partition()
    sp.acknowledge("m", [(0, 2, [ACCEPT])], now_ms=10).change.commit()
    assert sp.spso == 3
    # The types for 0..2 are skipped with their offsets: 3 is RELEASE, 4 ACCEPT, 5 RELEASE.
    sp.acknowledge("m", [(0, 5, [ACCEPT] * 3 + alternating(3, 5))], now_ms=20).change.commit()
    got = [(r.first_offset, r.last_offset, r.state) for r in sp.in_flight_ranges()[:3]]
    assert got == [
        (3, 3, RecordState.AVAILABLE),
        (4, 4, RecordState.ACKNOWLEDGED),
        (5, 5, RecordState.AVAILABLE),
    ]


def test_a_failed_write_of_a_fragmenting_acknowledgement_restores_the_acquired_range() -> None:
    sp = acquired_partition()
    before = sp.in_flight_ranges()
    result = sp.acknowledge("m", [(0, N - 1, alternating(0, N - 1))], now_ms=10)
    result.change.rollback()
    assert sp.in_flight_ranges() == before
    assert (sp.spso, sp.acquired_count, sp.range_count) == (0, N, 1)
