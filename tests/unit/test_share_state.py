"""merge_batches and the in-memory persister's fencing."""

from __future__ import annotations

import asyncio
import itertools
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.share_persister import InMemoryPersister
from coordinator.share_state import PersistedBatch, ShareStateKey
from persister.share_records import merge_batches
from protocol.errors import ErrorCode, KafkaError

batch = st.builds(
    lambda first, length, state, count: PersistedBatch(first, first + length, state, count),
    st.integers(0, 60),
    st.integers(0, 10),
    st.sampled_from([0, 2, 4]),
    st.integers(0, 5),
)


def _per_offset(batches: list[PersistedBatch]) -> dict[int, tuple[int, int]]:
    return {
        o: (b.delivery_state, b.delivery_count)
        for b in batches
        for o in range(b.first_offset, b.last_offset + 1)
    }


@given(st.lists(st.lists(batch, max_size=4), max_size=6), st.integers(-1, 40))
def test_merge_is_an_offset_by_offset_overlay_above_the_start_offset(
    writes: list[list[PersistedBatch]], start: int
) -> None:
    stored: list[PersistedBatch] = []
    expected: dict[int, tuple[int, int]] = {}
    for write in writes:
        # Within one write, batches do not overlap (the leader's contract).
        clean: list[PersistedBatch] = []
        for b in sorted(write):
            if not clean or b.first_offset > clean[-1].last_offset:
                clean.append(b)
        stored = merge_batches(stored, clean, -1)
        expected.update(_per_offset(clean))
    stored = merge_batches(stored, [], start)
    if start >= 0:
        expected = {o: v for o, v in expected.items() if o >= start}
    assert _per_offset(stored) == expected
    for a, b in itertools.pairwise(stored):
        assert a.last_offset < b.first_offset


def test_in_memory_persister_fences_older_state_and_leader_epochs() -> None:
    async def scenario() -> None:
        p = InMemoryPersister()
        key = ShareStateKey("g", uuid.uuid4(), 0)
        await p.initialize_state(key, 3, 10)
        # Only a read records a leader epoch (Kafka 4.2); a write carries the stored one.
        await p.read_state(key, 5)
        await p.write_state(key, 3, 5, 12, [PersistedBatch(12, 14, 2, 1)])
        with pytest.raises(KafkaError) as stale_state:
            await p.write_state(key, 2, 5, 12, [])
        assert stale_state.value.code == ErrorCode.fenced_state_epoch
        with pytest.raises(KafkaError) as stale_leader:
            await p.read_state(key, 4)
        assert stale_leader.value.code == ErrorCode.fenced_leader_epoch
        state = await p.read_state(key, 5)
        assert (state.state_epoch, state.start_offset, state.batches) == (
            3,
            12,
            [PersistedBatch(12, 14, 2, 1)],
        )

    asyncio.run(scenario())
