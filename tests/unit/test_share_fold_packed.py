"""PackedBatches and merge_packed: the share coordinator's packed form of a key's state
batches must merge exactly as merge_batches does on the tuples, for any history."""

from __future__ import annotations

import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st

from persister.share_fold import PackedBatches, merge_packed
from persister.share_records import StateBatch, merge_batches

batch = st.builds(
    lambda first, length, state, count: StateBatch(first, first + length, state, count),
    st.integers(0, 80),
    st.integers(0, 12),
    st.sampled_from([0, 2, 4]),
    st.integers(0, 5),
)


@settings(max_examples=500, deadline=None)
@given(
    st.lists(st.tuples(st.lists(batch, max_size=8), st.integers(-1, 90)), max_size=8),
    st.lists(batch, max_size=10),
    st.integers(-1, 90),
)
def test_packed_merge_equals_merge_batches_after_any_history(
    history: list[tuple[list[StateBatch], int]], update: list[StateBatch], start: int
) -> None:
    stored: list[StateBatch] = []
    packed = PackedBatches()
    for write, write_start in history:
        stored = merge_batches(stored, write, write_start)
        packed = merge_packed(packed, write, write_start)
        assert list(packed) == stored
    assert list(merge_packed(packed, update, start)) == merge_batches(stored, update, start)


@settings(max_examples=200, deadline=None)
@given(st.lists(batch, max_size=10), st.lists(batch, max_size=10), st.integers(-1, 90))
def test_packed_merge_of_overlapping_stored_batches_falls_back_to_merge_batches(
    stored: list[StateBatch], update: list[StateBatch], start: int
) -> None:
    # A snapshot not written by spool may hold overlapping batches.
    expected = merge_batches(stored, update, start)
    assert list(merge_packed(PackedBatches(stored), update, start)) == expected


def test_packing_keeps_every_field_and_sorts() -> None:
    batches = [StateBatch(10, 12, 4, 3), StateBatch(0, 9, 2, 32_767)]
    packed = PackedBatches(batches)
    assert packed.unpack() == (StateBatch(0, 9, 2, 32_767), StateBatch(10, 12, 4, 3))
    assert len(packed) == 2 and packed.disjoint
    assert packed == PackedBatches(reversed(batches))


def test_a_fragmented_key_costs_about_twenty_bytes_a_batch() -> None:
    # 2,000 single-offset batches (one type per offset, share.partition.max.record.locks).
    batches = [StateBatch(o, o, 2 if o % 2 else 0, 1 + o % 2) for o in range(2_000)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        packed = merge_packed(PackedBatches(), batches, 0)
        size = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert list(packed) == batches
    assert size < 2_000 * 24
