"""The share coordinator shard: operations return records, only replay changes state."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.share_coordinator import ShareCoordinatorShard
from coordinator.share_state import PersistedBatch, ShareState, ShareStateKey
from persister.share_records import (
    ShareKey,
    ShareRecord,
    ShareSnapshot,
    ShareTombstone,
    ShareUpdate,
    StateBatch,
    decode,
    encode,
)
from protocol.errors import ErrorCode, KafkaError

NOW = 1_700_000_000_000
TOPIC = uuid.UUID(int=7)
KEY = ShareStateKey("g", TOPIC, 0)
RKEY = ShareKey("g", TOPIC, 0)


class Harness:
    """Runs operations as the runtime does (apply records via replay) and keeps the log."""

    def __init__(self, per_snapshot: int = 500) -> None:
        self.shard = ShareCoordinatorShard(per_snapshot)
        self.log: list[ShareRecord] = []

    def apply(self, result: tuple[list[ShareRecord], Any]) -> Any:
        records, response = result
        for record in records:
            # Through the codec, as the log stores them.
            stored = decode(*encode(record))
            self.log.append(stored)
            self.shard.replay(stored)
        return response

    def replayed(self) -> ShareCoordinatorShard:
        fresh = ShareCoordinatorShard(self.shard.snapshot_update_records_per_snapshot)
        for record in self.log:
            fresh.replay(record)
        return fresh


def states(shard: ShareCoordinatorShard) -> dict[ShareStateKey, tuple[ShareState, int, int | None]]:
    return {
        key: (
            shard.state(key),  # type: ignore[misc]
            shard.updates_since_snapshot(key),
            shard.snapshot_epoch(key),
        )
        for key in list(shard.keys())
    }


def b(first: int, last: int, state: int = 0, count: int = 1) -> PersistedBatch:
    return PersistedBatch(first, last, state, count)


def initialized(per_snapshot: int = 500, start: int = 0, state_epoch: int = 0) -> Harness:
    h = Harness(per_snapshot)
    h.apply(h.shard.initialize_state(KEY, state_epoch, start, NOW))
    return h


# ----------------------------------------------------------------- initialize


def test_initialize_writes_a_snapshot_and_changes_nothing_before_replay() -> None:
    shard = ShareCoordinatorShard()
    records, result = shard.initialize_state(KEY, 1, 100, NOW)
    assert result is None
    # Kafka 4.2: leader epoch 0, and a DeliveryCompleteCount of 0 from an explicit start.
    assert records == [ShareSnapshot(RKEY, 0, 1, 0, 100, NOW, NOW, (), 0)]
    assert shard.state(KEY) is None and list(shard.keys()) == []
    shard.replay(records[0])
    assert shard.state(KEY) == ShareState(1, 0, 100, [], 0)
    assert list(shard.keys()) == [KEY]


def test_initialize_without_a_start_offset_leaves_the_delivery_complete_count_unknown() -> None:
    records, _ = ShareCoordinatorShard().initialize_state(KEY, 0, -1, NOW)
    assert records == [ShareSnapshot(RKEY, 0, 0, 0, -1, NOW, NOW, (), -1)]


def test_reinitialize_bumps_snapshot_epoch_and_resets_state() -> None:
    h = initialized()
    h.apply(h.shard.write_state(KEY, 0, 3, 5, [b(5, 9)], NOW))
    records, _ = h.shard.initialize_state(KEY, 1, 50, NOW + 1)
    assert records == [ShareSnapshot(RKEY, 1, 1, 0, 50, NOW + 1, NOW + 1, (), 0)]
    h.apply((records, None))
    assert h.shard.state(KEY) == ShareState(1, 0, 50, [], 0)
    assert h.shard.updates_since_snapshot(KEY) == 0


def test_initialize_with_older_state_epoch_is_fenced() -> None:
    h = initialized(state_epoch=3)
    with pytest.raises(KafkaError) as err:
        h.shard.initialize_state(KEY, 2, 0, NOW)
    assert err.value.code == ErrorCode.fenced_state_epoch
    # The same epoch is allowed (Kafka fences only older ones).
    assert h.shard.initialize_state(KEY, 3, 0, NOW)[0]


@pytest.mark.parametrize("partition", [-1, -5])
def test_negative_partition_is_invalid(partition: int) -> None:
    shard = ShareCoordinatorShard()
    bad = ShareStateKey("g", TOPIC, partition)
    for call in (
        lambda: shard.initialize_state(bad, 0, 0, NOW),
        lambda: shard.write_state(bad, 0, 0, 0, [], NOW),
        lambda: shard.read_state(bad, 0, NOW),
        lambda: shard.read_summary(bad),
        lambda: shard.delete_state(bad),
    ):
        with pytest.raises(KafkaError) as err:
            call()
        assert err.value.code == ErrorCode.invalid_request


def test_initialize_rejects_negative_start_offset() -> None:
    with pytest.raises(KafkaError) as err:
        ShareCoordinatorShard().initialize_state(KEY, 0, -2, NOW)
    assert err.value.code == ErrorCode.invalid_request


# ---------------------------------------------------------------------- write


def test_write_of_a_never_initialized_key_is_invalid_request() -> None:
    with pytest.raises(KafkaError) as err:
        ShareCoordinatorShard().write_state(KEY, 0, 0, 0, [], NOW)
    assert err.value.code == ErrorCode.invalid_request
    assert "uninitialized share partition" in (err.value.message or "")


def test_write_emits_an_update_with_the_delta_only() -> None:
    h = initialized()
    h.apply(h.shard.read_state(KEY, 2, NOW))
    h.apply(h.shard.write_state(KEY, 0, 2, 0, [b(0, 9)], NOW))
    before = h.shard.state(KEY)
    records, result = h.shard.write_state(
        KEY, 0, 2, -1, [b(5, 6, 2), b(3, 3, 4)], NOW, delivery_complete_count=3
    )
    assert result is None
    # The update carries the stored leader epoch and the leader's count (Kafka 4.2).
    assert records == [
        ShareUpdate(RKEY, 0, 2, -1, (StateBatch(3, 3, 4, 1), StateBatch(5, 6, 2, 1)), 3)
    ]
    assert h.shard.state(KEY) == before  # not applied until replayed
    h.apply((records, None))
    assert h.shard.state(KEY) == ShareState(
        0, 2, 0, [b(0, 2), b(3, 3, 4), b(4, 4), b(5, 6, 2), b(7, 9)], 3
    )


def test_a_write_does_not_move_the_leader_epoch_only_a_read_does() -> None:
    # Kafka's generateShareStateRecord: a write's record carries the stored leader epoch.
    h = initialized()
    records, _ = h.shard.write_state(KEY, 0, 7, -1, [], NOW)
    assert records == [ShareUpdate(RKEY, 0, 0, -1, ())]
    h.apply((records, None))
    assert h.shard.read_summary(KEY).leader_epoch == 0


def test_write_normalises_overlapping_request_batches() -> None:
    h = initialized()
    records, _ = h.shard.write_state(KEY, 0, -1, -1, [b(0, 9, 0, 1), b(4, 5, 2, 1)], NOW)
    assert records == [
        ShareUpdate(
            RKEY,
            0,
            0,
            -1,
            (StateBatch(0, 3, 0, 1), StateBatch(4, 5, 2, 1), StateBatch(6, 9, 0, 1)),
        )
    ]


def test_write_moves_start_offset_and_drops_batches_below() -> None:
    h = initialized()
    h.apply(h.shard.write_state(KEY, 0, 0, 0, [b(0, 4, 2), b(5, 9)], NOW))
    h.apply(h.shard.write_state(KEY, 0, 0, 7, [], NOW))
    assert h.shard.state(KEY) == ShareState(0, 0, 7, [b(7, 9)])
    h.apply(h.shard.write_state(KEY, 0, 0, -1, [b(12, 12, 4, 5)], NOW))
    assert h.shard.state(KEY) == ShareState(0, 0, 7, [b(7, 9), b(12, 12, 4, 5)])


def test_write_fencing() -> None:
    h = initialized(state_epoch=2)
    h.apply(h.shard.read_state(KEY, 5, NOW))
    h.apply(h.shard.write_state(KEY, 2, 5, 0, [], NOW))
    with pytest.raises(KafkaError) as err:
        h.shard.write_state(KEY, 1, 5, 0, [], NOW)
    assert err.value.code == ErrorCode.fenced_state_epoch
    with pytest.raises(KafkaError) as err:
        h.shard.write_state(KEY, 2, 4, 0, [], NOW)
    assert err.value.code == ErrorCode.fenced_leader_epoch
    # -1 skips either check and keeps the stored leader epoch.
    h.apply(h.shard.write_state(KEY, -1, -1, 3, [], NOW))
    assert h.shard.state(KEY) == ShareState(2, 5, 3, [])
    # A newer leader epoch passes the check, but only a read records it (Kafka 4.2).
    h.apply(h.shard.write_state(KEY, 2, 6, -1, [], NOW))
    assert h.shard.read_summary(KEY).leader_epoch == 5


@pytest.mark.parametrize(
    "batch",
    [b(5, 4), b(-1, 3), b(0, 1, 1), b(0, 1, 0, -1), b(0, 1, 0, 2**15)],
)
def test_write_rejects_malformed_batches(batch: PersistedBatch) -> None:
    h = initialized()
    with pytest.raises(KafkaError) as err:
        h.shard.write_state(KEY, 0, 0, -1, [batch], NOW)
    assert err.value.code == ErrorCode.invalid_request


def test_snapshot_every_n_updates() -> None:
    n = 3
    h = initialized(per_snapshot=n)
    kinds = []
    for i in range(9):
        records, _ = h.shard.write_state(
            KEY, 0, i, i, [b(i, i, 2)], NOW + i, delivery_complete_count=i
        )
        kinds.append(type(records[0]).__name__)
        h.apply((records, None))
    # n updates after each snapshot, then a snapshot instead of the next update.
    assert kinds == [
        "ShareUpdate",
        "ShareUpdate",
        "ShareUpdate",
        "ShareSnapshot",
        "ShareUpdate",
        "ShareUpdate",
        "ShareUpdate",
        "ShareSnapshot",
        "ShareUpdate",
    ]
    snapshot = h.log[4]
    assert isinstance(snapshot, ShareSnapshot)
    # The merged state: start offset 3, batches below it dropped, the stored leader
    # epoch; a new snapshot, so created and written now (Kafka 4.2).
    assert snapshot == ShareSnapshot(
        RKEY, 1, 0, 0, 3, NOW + 3, NOW + 3, (StateBatch(3, 3, 2, 1),), 3
    )
    assert h.shard.snapshot_epoch(KEY) == 2
    assert h.shard.updates_since_snapshot(KEY) == 1
    assert states(h.replayed()) == states(h.shard)


def test_snapshot_every_update_when_zero() -> None:
    h = initialized(per_snapshot=0)
    records, _ = h.shard.write_state(KEY, 0, 0, -1, [b(0, 0)], NOW)
    assert isinstance(records[0], ShareSnapshot)


# ----------------------------------------------------------------------- read


def test_read_of_a_never_initialized_key_is_invalid_request() -> None:
    with pytest.raises(KafkaError) as err:
        ShareCoordinatorShard().read_state(KEY, 0, NOW)
    assert err.value.code == ErrorCode.invalid_request
    assert "uninitialized share partition" in (err.value.message or "")


def test_read_same_epoch_writes_nothing_and_returns_a_copy() -> None:
    h = initialized()
    h.apply(h.shard.read_state(KEY, 4, NOW))
    h.apply(h.shard.write_state(KEY, 0, 4, 0, [b(0, 3)], NOW))
    records, state = h.shard.read_state(KEY, 4, NOW)
    assert records == []
    assert state == ShareState(0, 4, 0, [b(0, 3)])
    state.batches.clear()
    assert h.shard.state(KEY) == ShareState(0, 4, 0, [b(0, 3)])


def test_read_with_newer_leader_epoch_records_it() -> None:
    h = initialized()
    h.apply(h.shard.read_state(KEY, 4, NOW))
    h.apply(h.shard.write_state(KEY, 0, 4, 2, [b(2, 3)], NOW, delivery_complete_count=1))
    records, state = h.shard.read_state(KEY, 6, NOW)
    # Kafka 4.2: the update keeps the current start offset and the stored count.
    assert records == [ShareUpdate(RKEY, 0, 6, 2, (), 1)]
    assert state == ShareState(0, 6, 2, [b(2, 3)], 1)
    assert h.shard.read_summary(KEY).leader_epoch == 4  # not yet replayed
    h.apply((records, state))
    assert h.shard.state(KEY) == state


def test_read_with_older_leader_epoch_is_fenced() -> None:
    h = initialized()
    h.apply(h.shard.read_state(KEY, 5, NOW))
    for epoch in (4, -1):
        with pytest.raises(KafkaError) as err:
            h.shard.read_state(KEY, epoch, NOW)
        assert err.value.code == ErrorCode.fenced_leader_epoch


def test_read_with_no_leader_epoch_is_fenced_once_initialize_recorded_epoch_0() -> None:
    # Kafka 4.2: Initialize writes leader epoch 0, so -1 is older than what is known.
    h = initialized()
    with pytest.raises(KafkaError) as err:
        h.shard.read_state(KEY, -1, NOW)
    assert err.value.code == ErrorCode.fenced_leader_epoch
    records, state = h.shard.read_state(KEY, 0, NOW)
    assert records == [] and state == ShareState(0, 0, 0, [], 0)


def test_read_leader_epoch_update_becomes_a_snapshot_when_due() -> None:
    h = initialized(per_snapshot=1)
    h.apply(h.shard.write_state(KEY, 0, -1, 0, [b(0, 1)], NOW, delivery_complete_count=0))
    records, _ = h.shard.read_state(KEY, 2, NOW + 5)
    assert records == [
        ShareSnapshot(RKEY, 1, 0, 2, 0, NOW + 5, NOW + 5, (StateBatch(0, 1, 0, 1),), 0)
    ]


# -------------------------------------------------------------- summary, delete


def test_read_summary() -> None:
    h = initialized(start=10, state_epoch=2)
    h.apply(h.shard.read_state(KEY, 3, NOW))
    h.apply(h.shard.write_state(KEY, 2, 3, 12, [b(12, 20)], NOW, delivery_complete_count=4))
    assert h.shard.read_summary(KEY) == ShareState(2, 3, 12, [], 4)
    # A key with no state answers the uninitialized defaults, not an error.
    assert h.shard.read_summary(ShareStateKey("other", TOPIC, 0)) == ShareState(0, 0, -1, [], -1)


def test_delete_writes_a_tombstone_and_replay_forgets_the_key() -> None:
    h = initialized()
    other = ShareStateKey("g", TOPIC, 1)
    h.apply(h.shard.initialize_state(other, 0, 0, NOW))
    records, result = h.shard.delete_state(KEY)
    assert result is None and records == [ShareTombstone(RKEY)]
    assert h.shard.state(KEY) is not None
    h.apply((records, None))
    assert h.shard.state(KEY) is None
    assert list(h.shard.keys()) == [other]
    with pytest.raises(KafkaError) as err:
        h.shard.write_state(KEY, 0, 0, 0, [], NOW)
    assert err.value.code == ErrorCode.invalid_request
    # Deleting what is not there writes nothing.
    assert h.shard.delete_state(KEY) == ([], None)


def test_update_for_an_unknown_key_starts_its_state() -> None:
    shard = ShareCoordinatorShard()
    shard.replay(ShareUpdate(RKEY, 3, 2, 5, (StateBatch(1, 9, 0, 1),)))
    assert shard.state(KEY) == ShareState(0, 2, 5, [b(5, 9)])


# ------------------------------------------- never-initialized state (Kafka 4.2)


def test_read_and_write_of_deleted_state_are_invalid_request_and_write_nothing() -> None:
    h = initialized()
    h.apply(h.shard.delete_state(KEY))
    before = states(h.shard)
    for call in (
        lambda: h.shard.read_state(KEY, 0, NOW),
        lambda: h.shard.read_state(KEY, -1, NOW),
        lambda: h.shard.write_state(KEY, -1, -1, -1, [b(0, 0)], NOW),
    ):
        with pytest.raises(KafkaError) as err:
            call()
        assert err.value.code == ErrorCode.invalid_request
    assert states(h.shard) == before


def test_uninitialized_is_checked_before_the_epochs_and_batches() -> None:
    # Kafka's order: key shape, then "uninitialized", then the epochs.
    with pytest.raises(KafkaError) as err:
        ShareCoordinatorShard().write_state(KEY, 0, 0, -1, [b(5, 4)], NOW)
    assert err.value.code == ErrorCode.invalid_request
    assert "uninitialized" in (err.value.message or "")
    with pytest.raises(KafkaError) as err:
        ShareCoordinatorShard().read_state(ShareStateKey("g", TOPIC, -1), 0, NOW)
    assert "negative" in (err.value.message or "")


def test_write_with_both_epochs_stale_is_fenced_by_the_leader_epoch_first() -> None:
    h = initialized(state_epoch=2)
    h.apply(h.shard.read_state(KEY, 5, NOW))
    with pytest.raises(KafkaError) as err:
        h.shard.write_state(KEY, 1, 4, 0, [], NOW)
    assert err.value.code == ErrorCode.fenced_leader_epoch


def test_summary_of_a_never_initialized_or_deleted_key_is_the_uninitialized_default() -> None:
    shard = ShareCoordinatorShard()
    assert shard.read_summary(KEY) == ShareState(
        state_epoch=0, leader_epoch=0, start_offset=-1, batches=[], delivery_complete_count=-1
    )
    h = initialized(start=4, state_epoch=3)
    assert h.shard.read_summary(KEY) == ShareState(3, 0, 4, [], 0)
    h.apply(h.shard.delete_state(KEY))
    assert h.shard.read_summary(KEY) == ShareState(0, 0, -1, [])


def test_replay_of_the_emitted_log_equals_live_state() -> None:
    h = initialized(per_snapshot=4)
    other = ShareStateKey("h", TOPIC, 2)
    h.apply(h.shard.initialize_state(other, 1, 100, NOW))
    for i in range(30):
        key = KEY if i % 3 else other
        base = 0 if key is KEY else 100
        h.apply(h.shard.write_state(key, -1, i, base + i, [b(base + i, base + i + 3, 2)], NOW))
        if i % 7 == 0:
            h.apply(h.shard.read_state(key, i + 1, NOW))
    h.apply(h.shard.delete_state(other))
    assert states(h.replayed()) == states(h.shard)


# ---------------------------------------------------------------- property test

KEYS = [ShareStateKey("g", TOPIC, 0), ShareStateKey("g", TOPIC, 1), ShareStateKey("h", TOPIC, 0)]

batch_st = st.builds(
    lambda first, length, state, count: PersistedBatch(first, first + length, state, count),
    st.integers(0, 60),
    st.integers(0, 10),
    st.sampled_from([0, 2, 3, 4]),
    st.integers(0, 5),
)
op_st = st.one_of(
    st.tuples(st.just("init"), st.sampled_from(KEYS), st.integers(0, 3), st.integers(0, 40)),
    st.tuples(
        st.just("write"),
        st.sampled_from(KEYS),
        st.integers(-1, 3),
        st.integers(-1, 6),
        st.integers(-1, 50),
        st.lists(batch_st, max_size=4),
    ),
    st.tuples(st.just("read"), st.sampled_from(KEYS), st.integers(-1, 6)),
    st.tuples(st.just("summary"), st.sampled_from(KEYS)),
    st.tuples(st.just("delete"), st.sampled_from(KEYS)),
)


def run(h: Harness, op: Sequence[Any], now_ms: int) -> None:
    shard = h.shard
    before = states(shard)
    try:
        match op[0]:
            case "init":
                result: tuple[list[ShareRecord], Any] = shard.initialize_state(
                    op[1], op[2], op[3], now_ms
                )
            case "write":
                result = shard.write_state(op[1], op[2], op[3], op[4], op[5], now_ms)
            case "read":
                result = shard.read_state(op[1], op[2], now_ms)
            case "summary":
                shard.read_summary(op[1])
                result = ([], None)
            case _:
                result = shard.delete_state(op[1])
    except KafkaError:
        assert states(shard) == before  # a failed operation changes nothing
        return
    assert states(shard) == before  # operations never mutate: only replay does
    h.apply(result)


@settings(max_examples=300, deadline=None)
@given(st.lists(op_st, max_size=60), st.integers(0, 4))
def test_replaying_all_emitted_records_gives_the_live_state(
    ops: list[Sequence[Any]], per_snapshot: int
) -> None:
    h = Harness(per_snapshot)
    for i, op in enumerate(ops):
        run(h, op, NOW + i)
    assert states(h.replayed()) == states(h.shard)
    for key in list(h.shard.keys()):
        state = h.shard.state(key)
        assert state is not None
        offsets = [(x.first_offset, x.last_offset) for x in state.batches]
        assert offsets == sorted(offsets)
        assert all(a[1] < c[0] for a, c in itertools.pairwise(offsets))
        if state.start_offset >= 0:
            assert all(first >= state.start_offset for first, _ in offsets)


def test_write_keeps_archiving_batches() -> None:
    # KIP-1191: delivery state 3 (Archiving) is stored and read back like the others.
    h = initialized()
    h.apply(h.shard.write_state(KEY, 0, 0, -1, [b(2, 4, 3, 5)], NOW))
    assert h.shard.state(KEY) == ShareState(0, 0, 0, [b(2, 4, 3, 5)])
    assert states(h.replayed()) == states(h.shard)
