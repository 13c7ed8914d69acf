"""merge_batches, linear, against the quadratic merge it replaced (kept here as the oracle);
and merge_packed, the share coordinator's merge into a key's PackedBatches, against
merge_batches on the tuples."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterable, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from persister.share_records import StateBatch, merge_batches
from persister.share_replay import PackedBatches, merge_packed


def _quadratic_merge(
    stored: Sequence[StateBatch], update: Iterable[StateBatch], start_offset: int
) -> list[StateBatch]:
    """The previous merge_batches, verbatim in behaviour: rebuild and sort per batch."""
    result: list[StateBatch] = list(stored)
    for new in sorted(update):
        pieces: list[StateBatch] = []
        for old in result:
            if old.last_offset < new.first_offset or old.first_offset > new.last_offset:
                pieces.append(old)
                continue
            if old.first_offset < new.first_offset:
                pieces.append(old._replace(last_offset=new.first_offset - 1))
            if old.last_offset > new.last_offset:
                pieces.append(old._replace(first_offset=new.last_offset + 1))
        pieces.append(new)
        result = sorted(pieces)
    if start_offset >= 0:
        result = [
            b if b.first_offset >= start_offset else b._replace(first_offset=start_offset)
            for b in result
            if b.last_offset >= start_offset
        ]
    return result


batch = st.builds(
    lambda first, length, state, count: StateBatch(first, first + length, state, count),
    st.integers(0, 80),
    st.integers(0, 12),
    st.sampled_from([0, 2, 4]),
    st.integers(0, 5),
)


@settings(max_examples=500, deadline=None)
@given(
    st.lists(st.lists(batch, max_size=8), max_size=6),
    st.lists(batch, max_size=10),
    st.integers(-1, 90),
)
def test_linear_merge_equals_the_quadratic_merge_for_any_update(
    history: list[list[StateBatch]], update: list[StateBatch], start: int
) -> None:
    # Stored state is always some merge's output (sorted, disjoint); an update may hold
    # batches that overlap each other (a request not from spool's leader).
    stored: list[StateBatch] = []
    for write in history:
        stored = _quadratic_merge(stored, write, -1)
    assert merge_batches(stored, update, start) == _quadratic_merge(stored, update, start)


def test_alternating_single_offset_update_splits_one_stored_batch_per_offset() -> None:
    stored = [StateBatch(0, 1_999, 0, 1)]
    update = [StateBatch(o, o, 2, 1) for o in range(0, 2_000, 2)]
    merged = merge_batches(stored, update, 1)
    assert merged == _quadratic_merge(stored, update, 1)
    assert len(merged) == 1_999
    assert merged[0] == StateBatch(1, 1, 0, 1)
    assert merged[-1] == StateBatch(1_999, 1_999, 0, 1)


# -- PackedBatches / merge_packed --------------------------------------------------------


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


def test_packing_keeps_every_field_and_the_order() -> None:
    batches = [StateBatch(0, 9, 2, 32_767), StateBatch(10, 12, 4, 3)]
    packed = PackedBatches(batches)
    assert packed.unpack() == tuple(batches)
    assert len(packed) == 2 and packed.disjoint
    # A snapshot from elsewhere may list its batches out of order: kept as listed.
    unordered = PackedBatches(reversed(batches))
    assert unordered.unpack() == tuple(reversed(batches)) and not unordered.disjoint


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
