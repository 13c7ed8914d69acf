from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from persister.producer_state import (
    MAX_SEQUENCE,
    NUM_BATCHES_TO_RETAIN,
    DuplicateBatch,
    ProducerStateManager,
)
from protocol.errors import ErrorCode, KafkaError
from protocol.records import (
    CONTROL_FLAG,
    HEADER_SIZE,
    MAGIC_V2,
    TRANSACTIONAL_FLAG,
    BatchHeader,
)

PID = 1000


def batch(
    base_sequence: int,
    count: int = 1,
    *,
    epoch: int = 0,
    producer_id: int = PID,
    base_offset: int = 0,
    timestamp: int = 1_000,
    transactional: bool = False,
    control: bool = False,
) -> BatchHeader:
    attributes = (TRANSACTIONAL_FLAG if transactional else 0) | (CONTROL_FLAG if control else 0)
    return BatchHeader(
        base_offset=base_offset,
        batch_length=HEADER_SIZE - 12,
        partition_leader_epoch=0,
        magic=MAGIC_V2,
        crc=0,
        attributes=attributes,
        last_offset_delta=count - 1,
        base_timestamp=timestamp,
        max_timestamp=timestamp,
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=-1 if control else base_sequence,
        records_count=count,
    )


class Log:
    """A partition stand-in: assigns offsets and keeps the headers it appended."""

    def __init__(self) -> None:
        self.state = ProducerStateManager()
        self.headers: list[BatchHeader] = []
        self.next_offset = 0

    def produce(self, header: BatchHeader) -> tuple[int, int] | DuplicateBatch:
        duplicate = self.state.check(header)
        if duplicate is not None:
            return duplicate
        appended = replace(header, base_offset=self.next_offset)
        self.next_offset = appended.next_offset
        self.state.update(appended, append_time_ms=appended.max_timestamp)
        self.headers.append(appended)
        return appended.base_offset, appended.last_offset


def error_of(log: Log, header: BatchHeader) -> ErrorCode:
    with pytest.raises(KafkaError) as info:
        log.produce(header)
    return info.value.code


def test_in_order_batches_are_accepted() -> None:
    log = Log()
    assert log.produce(batch(0, 3)) == (0, 2)
    assert log.produce(batch(3, 2)) == (3, 4)
    assert log.produce(batch(5)) == (5, 5)
    entry = log.state.entry(PID)
    assert entry is not None and entry.last_sequence == 5


def test_sequence_gap_is_out_of_order_with_expected_and_got() -> None:
    log = Log()
    log.produce(batch(0, 3))
    with pytest.raises(KafkaError) as info:
        log.produce(batch(4))
    assert info.value.code == ErrorCode.out_of_order_sequence_number
    assert "expected 3, got 4" in str(info.value)
    assert log.next_offset == 3


def test_sequence_older_than_the_cached_batches_is_out_of_order() -> None:
    log = Log()
    for seq in range(NUM_BATCHES_TO_RETAIN + 1):
        log.produce(batch(seq))
    assert error_of(log, batch(0)) == ErrorCode.out_of_order_sequence_number


@pytest.mark.parametrize("back", range(1, NUM_BATCHES_TO_RETAIN + 1))
def test_retry_of_each_of_the_last_five_batches_is_a_duplicate(back: int) -> None:
    log = Log()
    for i in range(8):
        log.produce(batch(i * 2, 2, timestamp=100 + i))
    i = 8 - back
    result = log.produce(batch(i * 2, 2))
    assert result == DuplicateBatch(i * 2, i * 2 + 1, 100 + i, i * 2, i * 2 + 1)
    assert log.next_offset == 16


def test_same_first_sequence_but_different_range_is_not_a_duplicate() -> None:
    log = Log()
    log.produce(batch(0, 2))
    assert error_of(log, batch(0, 3)) == ErrorCode.out_of_order_sequence_number


def test_duplicate_needs_the_same_epoch() -> None:
    log = Log()
    log.produce(batch(0, 2, epoch=1))
    log.produce(batch(0, 2, epoch=2))
    # A retry from the old epoch is fenced, not reported as a duplicate.
    assert error_of(log, batch(0, 2, epoch=1)) == ErrorCode.invalid_producer_epoch


def test_older_epoch_is_fenced() -> None:
    log = Log()
    log.produce(batch(0, epoch=5))
    with pytest.raises(KafkaError) as info:
        log.produce(batch(1, epoch=4))
    assert info.value.code == ErrorCode.invalid_producer_epoch
    assert "4" in str(info.value) and "5" in str(info.value)


def test_epoch_bump_resets_sequence_to_zero() -> None:
    log = Log()
    log.produce(batch(0, 10, epoch=0))
    assert log.produce(batch(0, 1, epoch=1)) == (10, 10)
    assert log.produce(batch(1, 1, epoch=1)) == (11, 11)
    entry = log.state.entry(PID)
    assert entry is not None and entry.producer_epoch == 1
    assert len(entry.batches) == 2


def test_new_epoch_not_starting_at_zero_is_out_of_order() -> None:
    log = Log()
    log.produce(batch(0, 10, epoch=0))
    with pytest.raises(KafkaError) as info:
        log.produce(batch(10, epoch=1))
    assert info.value.code == ErrorCode.out_of_order_sequence_number
    assert "sequence 0" in str(info.value)


def test_unknown_producer_is_accepted_at_any_sequence_as_in_kafka_4() -> None:
    log = Log()
    assert log.produce(batch(17, 3, epoch=4)) == (0, 2)
    assert log.produce(batch(20, epoch=4)) == (3, 3)
    assert error_of(log, batch(22, epoch=4)) == ErrorCode.out_of_order_sequence_number


def test_non_idempotent_batches_are_never_checked() -> None:
    log = Log()
    for _ in range(3):
        assert log.state.check(batch(-1, producer_id=-1, epoch=-1)) is None
        log.produce(batch(-1, producer_id=-1, epoch=-1))
    assert len(log.state) == 0


def test_sequence_wraps_after_int32_max() -> None:
    log = Log()
    log.produce(batch(MAX_SEQUENCE - 1, 2))
    assert log.produce(batch(0, 3)) == (2, 4)
    # A batch whose range crosses the wrap keeps last sequence modulo 2**31.
    log2 = Log()
    log2.produce(batch(MAX_SEQUENCE - 1, 4))
    entry = log2.state.entry(PID)
    assert entry is not None and entry.last_sequence == 1
    assert log2.produce(batch(2)) == (4, 4)
    assert isinstance(log2.produce(batch(MAX_SEQUENCE - 1, 4)), DuplicateBatch)


def test_producers_are_independent() -> None:
    log = Log()
    log.produce(batch(0, 2, producer_id=1))
    log.produce(batch(0, 5, producer_id=2))
    assert log.produce(batch(2, producer_id=1)) == (7, 7)
    assert error_of(log, batch(2, producer_id=2)) == ErrorCode.out_of_order_sequence_number


def test_transaction_is_open_until_its_marker() -> None:
    log = Log()
    log.produce(batch(0, 2, epoch=0, transactional=True))
    log.produce(batch(0, 1, epoch=0, producer_id=7))
    assert log.state.first_unstable_offset() == 0
    assert error_of(log, batch(2, epoch=0)) == ErrorCode.invalid_txn_state
    log.produce(batch(-1, epoch=0, control=True))
    # Ended, but unstable until the marker (offset 3) is below the high watermark.
    assert log.state.first_unstable_offset() == 0
    log.state.on_high_watermark(3)
    assert log.state.first_unstable_offset() == 0
    log.state.on_high_watermark(4)
    assert log.state.first_unstable_offset() is None
    assert log.produce(batch(2, epoch=0)) == (4, 4)


def test_marker_with_bumped_epoch_restarts_sequences() -> None:
    # Transactions v2: the coordinator bumps the epoch in the commit marker.
    log = Log()
    log.produce(batch(0, 3, epoch=0, transactional=True))
    log.produce(batch(-1, epoch=1, control=True))
    assert error_of(log, batch(3, epoch=0)) == ErrorCode.invalid_producer_epoch
    assert log.produce(batch(0, epoch=1, transactional=True)) == (4, 4)


def test_marker_with_older_epoch_is_fenced() -> None:
    log = Log()
    log.produce(batch(0, epoch=3, transactional=True))
    assert error_of(log, batch(-1, epoch=2, control=True)) == ErrorCode.invalid_producer_epoch


def test_truncate_below_forgets_producers_without_retained_batches() -> None:
    log = Log()
    log.produce(batch(0, 5, producer_id=1))
    log.produce(batch(0, 5, producer_id=2))
    log.state.truncate_below(5)
    assert log.state.entry(1) is None
    assert log.state.entry(2) is not None
    # Forgotten producers continue at any sequence.
    assert log.produce(batch(5, producer_id=1)) == (10, 10)


def test_remove_expired_keeps_recent_and_open_transactions() -> None:
    log = Log()
    log.produce(batch(0, producer_id=1, timestamp=1_000))
    log.produce(batch(0, producer_id=2, timestamp=1_000, transactional=True))
    log.produce(batch(0, producer_id=3, timestamp=50_000))
    assert log.state.remove_expired(now_ms=61_000, expiration_ms=60_000) == [1]
    assert {e.producer_id for e in log.state} == {2, 3}


def test_check_all_sees_earlier_batches_of_the_same_append() -> None:
    state = ProducerStateManager()
    state.update(batch(0, 2), append_time_ms=0)
    assert state.check_all([batch(2, 2), batch(4), batch(0, 2, producer_id=9)]) == [None] * 3
    with pytest.raises(KafkaError) as info:
        state.check_all([batch(2, 2), batch(5)])
    assert info.value.code == ErrorCode.out_of_order_sequence_number
    # Nothing was recorded by the checks.
    entry = state.entry(PID)
    assert entry is not None and entry.last_sequence == 1
    assert state.check_all([batch(0, 2), batch(2)])[0] is not None


def test_update_without_batch_timestamp_uses_append_time() -> None:
    state = ProducerStateManager()
    state.update(replace(batch(0), max_timestamp=-1), append_time_ms=42)
    entry = state.entry(PID)
    assert entry is not None and entry.last_timestamp == 42


# A random producer workload: retries, gaps, epoch bumps, fencing, several producers.
actions = st.lists(
    st.tuples(
        st.integers(min_value=1, max_value=3),  # producer id
        st.integers(min_value=0, max_value=3),  # epoch
        st.integers(min_value=0, max_value=12),  # base sequence
        st.integers(min_value=1, max_value=3),  # record count
        st.booleans(),  # control marker instead of data
    ),
    max_size=60,
)


def outcome(log: Log, header: BatchHeader) -> object:
    try:
        return log.produce(header)
    except KafkaError as e:
        return e.code


@settings(max_examples=200)
@given(workload=actions, probes=actions)
def test_rebuild_gives_the_same_answers_as_live_updates(
    workload: list[tuple[int, int, int, int, bool]],
    probes: list[tuple[int, int, int, int, bool]],
) -> None:
    live = Log()
    for pid, epoch, seq, count, control in workload:
        outcome(live, batch(seq, count, epoch=epoch, producer_id=pid, control=control))

    rebuilt = Log()
    rebuilt.state.rebuild(live.headers)
    rebuilt.headers = list(live.headers)
    rebuilt.next_offset = live.next_offset
    assert sorted(live.state, key=lambda e: e.producer_id) == sorted(
        rebuilt.state, key=lambda e: e.producer_id
    )
    for pid, epoch, seq, count, control in probes:
        header = batch(seq, count, epoch=epoch, producer_id=pid, control=control)
        assert outcome(live, header) == outcome(rebuilt, header)
