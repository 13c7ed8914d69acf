"""The packed in-flight state: `_RangeTable` against a plain sorted-dict model, and the
memory a fragmented share partition costs on both sides (leader and share coordinator).

Acknowledgements of one type per offset (KIP-932 AcknowledgeTypes: ACCEPT, RELEASE,
ACCEPT, ...) leave one range per in-flight record, up to share.partition.max.record.locks
(2,000) in every share partition; the broker must hold 100 groups x 10 partitions of that
within its RSS target, so each side has a budget per fragmented offset.
"""

from __future__ import annotations

import gc
import tracemalloc
import uuid
from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.share.partition import (
    AcknowledgeType,
    InFlightRange,
    RecordState,
    SharePartition,
    SharePartitionConfig,
    _RangeTable,
)
from coordinator.share_coordinator import ShareCoordinatorShard
from coordinator.share_state import PersistedBatch, ShareStateKey

N = 2_000
MEMBER = "member-0123456789abcdef"


def _range(first: int, length: int, state: RecordState, count: int, deadline: int) -> InFlightRange:
    if state is RecordState.ACQUIRED:
        return InFlightRange(first, first + length, state, count, MEMBER, deadline)
    return InFlightRange(first, first + length, state, count)


range_st = st.builds(
    _range,
    st.integers(0, 60),
    st.integers(0, 3),
    st.sampled_from(list(RecordState)),
    st.integers(0, 5),
    st.integers(0, 10_000),
)
op_st = st.one_of(
    st.tuples(st.just("put"), range_st),
    st.tuples(st.just("pop"), st.integers(0, 64)),
    st.tuples(st.just("cut"), st.integers(0, 64), st.integers(0, 64)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(op_st, max_size=40), st.integers(0, 64), st.integers(0, 64))
def test_range_table_reads_back_what_a_sorted_dict_of_ranges_holds(
    ops: list[tuple[object, ...]], low: int, high: int
) -> None:
    table = _RangeTable()
    model: dict[int, InFlightRange] = {}
    for op in ops:
        if op[0] == "put":
            record = op[1]
            assert isinstance(record, InFlightRange)
            table.put(record)
            model[record.first_offset] = record
        elif op[0] == "pop":
            first = op[1]
            if first in model:
                index = table.index_of(first)
                assert table.record(index) == model.pop(first)
                table.delete(index, index + 1)
        else:
            lo, hi = sorted(op[1:])
            assert isinstance(lo, int) and isinstance(hi, int)
            keys = sorted(model)
            for first in keys[lo:hi]:
                del model[first]
            table.delete(lo, hi)
    keys = sorted(model)
    assert table.records(0, len(table)) == [model[k] for k in keys]
    assert table.keys(min(low, high), max(low, high)) == [
        k for k in keys if min(low, high) <= k <= max(low, high)
    ]
    # The range holding an offset is the last one starting at or before it.
    assert table.index_at(low) == len([k for k in keys if k <= low]) - 1
    for state in RecordState:
        found = table.find_state(state)
        expected = [i for i, k in enumerate(keys) if model[k].state is state]
        assert found == (expected[0] if expected else -1)


def _fragmented_partition(partition: int) -> SharePartition:
    sp = SharePartition(
        "group",
        uuid.UUID(int=7),
        partition,
        config=SharePartitionConfig(record_lock_duration_ms=600_000, max_in_flight_records=N),
        state_epoch=0,
        start_offset=0,
    )
    sp.acquire(MEMBER, [(0, N - 1)], max_records=N, batch_size=N, now_ms=0).change.commit()
    return sp


ALTERNATING = [
    AcknowledgeType.ACCEPT if offset % 2 == 0 else AcknowledgeType.RELEASE for offset in range(N)
]


def _traced_bytes(build: Callable[[], object]) -> tuple[object, int]:
    """What `build` returns and the bytes it still holds once built."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        built = build()
        gc.collect()
        return built, tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def test_a_fragmented_partition_and_its_coordinator_state_fit_in_100_bytes_an_offset() -> None:
    partitions = 5
    updates = []
    # What the coordinator is sent: the acquisitions write nothing (KIP-932: ACQUIRED is
    # transient); the acknowledgement writes every offset from SPSO 1, one batch each,
    # ACKNOWLEDGED and AVAILABLE (released, delivery count 1) in turn.
    expected_batches = tuple(PersistedBatch(o, o, 2 if o % 2 == 0 else 0, 1) for o in range(1, N))
    for p in range(partitions):
        sp = _fragmented_partition(p)
        ack = sp.acknowledge(MEMBER, [(0, N - 1, ALTERNATING)], now_ms=10)
        ack.change.commit()
        again = sp.acquire(MEMBER, [(0, N - 1)], max_records=N, batch_size=N, now_ms=20)
        again.change.commit()
        assert again.state_update is None
        assert ack.state_update is not None
        assert ack.state_update.start_offset == 1
        assert ack.state_update.state_batches == expected_batches
        updates.append((ack.state_update,))

    def leaders() -> list[SharePartition]:
        built = []
        for p in range(partitions):
            sp = _fragmented_partition(p)
            sp.acknowledge(MEMBER, [(0, N - 1, ALTERNATING)], now_ms=10).change.commit()
            sp.acquire(MEMBER, [(0, N - 1)], max_records=N, batch_size=N, now_ms=20).change.commit()
            built.append(sp)
        return built

    keys = [ShareStateKey("group", uuid.UUID(int=7), p) for p in range(partitions)]

    def coordinator() -> ShareCoordinatorShard:
        shard = ShareCoordinatorShard()
        for key, written in zip(keys, updates, strict=True):
            for record in shard.initialize_state(key, 0, 0, now_ms=0)[0]:
                shard.replay(record)
            for update in written:
                records, _ = shard.write_state(
                    key,
                    0,
                    -1,
                    update.start_offset,
                    update.state_batches,
                    now_ms=0,
                    delivery_complete_count=update.delivery_complete_count,
                )
                for record in records:
                    shard.replay(record)
        return shard

    built, leader_bytes = _traced_bytes(leaders)
    assert isinstance(built, list)
    sp = built[0]
    # One range per offset: 1,000 ACKNOWLEDGED and 999 ACQUIRED at delivery count 2.
    assert sp.range_count == N - 1 and sp.acquired_count == N // 2
    shard, coordinator_bytes = _traced_bytes(coordinator)
    assert isinstance(shard, ShareCoordinatorShard)
    state = shard.state(keys[0])
    # The coordinator holds the fragmented state: one batch per offset of [1, N).
    assert state is not None and list(state.batches) == list(expected_batches)
    per_offset_leader = leader_bytes / partitions / N
    per_offset_coordinator = coordinator_bytes / partitions / N
    # Measured: ~40 and ~20 (a sorted map of range objects cost ~240, tuples ~90).
    assert per_offset_leader <= 60, per_offset_leader
    assert per_offset_coordinator <= 30, per_offset_coordinator
    assert per_offset_leader + per_offset_coordinator <= 100
