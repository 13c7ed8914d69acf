"""The transaction coordinator's state machine (coordinator.transactions), sans IO:
Kafka's transitions, fencing, re-init recovery, timeouts on a ManualClock, replay, and
failed writes. Markers go to a recording MarkerWriter."""

from __future__ import annotations

import asyncio
import errno
import os
import struct
from collections.abc import Callable, Sequence

import pytest

from coordinator import transactions as tx
from coordinator.transactions import (
    S,
    TopicPartition,
    TransactionConfig,
    TransactionCoordinator,
    TxnMetadata,
    TxnTombstone,
)
from persister.clock import ManualClock
from persister.coordinator_log import KeyValue, MemoryRecordLog
from protocol.errors import ErrorCode, KafkaError

TID = "txn-a"
TP0: TopicPartition = ("orders", 0)
TP1: TopicPartition = ("orders", 1)
TIMEOUT = 60_000


class FailingLog(MemoryRecordLog):
    """A record log whose next write fails as a full disk does."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_next: int | None = None

    def write(self, records: Sequence[KeyValue]) -> int:
        if self.fail_next is not None:
            code, self.fail_next = self.fail_next, None
            raise OSError(code, os.strerror(code))
        return super().write(records)


class Markers:
    """Records the markers written; `fail` makes the next call raise."""

    def __init__(self) -> None:
        self.written: list[tuple[int, int, bool, frozenset[TopicPartition]]] = []
        self.fail: KafkaError | None = None
        # While set and not released, marker writes wait (a slow partition).
        self.hold: asyncio.Event | None = None

    async def __call__(
        self,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        partitions: frozenset[TopicPartition],
    ) -> None:
        if self.fail is not None:
            error, self.fail = self.fail, None
            raise error
        if self.hold is not None:
            await self.hold.wait()
        self.written.append((producer_id, producer_epoch, commit, partitions))


class Ids:
    def __init__(self) -> None:
        self.next = 1000

    async def __call__(self) -> int:
        self.next += 1
        return self.next - 1


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def record_log() -> FailingLog:
    return FailingLog()


@pytest.fixture
def markers() -> Markers:
    return Markers()


def make(
    record_log: MemoryRecordLog, markers: Markers, clock: ManualClock, **config: int
) -> TransactionCoordinator:
    return TransactionCoordinator(
        record_log,
        allocate_producer_id=Ids(),
        markers=markers,
        config=TransactionConfig(**config),
        clock=clock,
    )


@pytest.fixture
def coord(record_log: FailingLog, markers: Markers, clock: ManualClock) -> TransactionCoordinator:
    return make(record_log, markers, clock)


async def until(condition: Callable[[], bool]) -> None:
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never became true")


async def code_of(awaitable: object) -> ErrorCode:
    with pytest.raises(KafkaError) as info:
        await awaitable  # type: ignore[misc]
    return info.value.code


# ------------------------------------------------------------------ InitProducerId


async def test_a_new_transactional_id_gets_a_fresh_producer_id_at_epoch_0(
    coord: TransactionCoordinator,
) -> None:
    pid, epoch = await coord.init_producer_id(TID, TIMEOUT)
    assert (pid, epoch) == (1000, 0)
    m = coord.get(TID)
    assert m is not None and m.state == S.EMPTY and m.txn_timeout_ms == TIMEOUT


async def test_re_init_bumps_the_epoch_and_fences_the_old_producer(
    coord: TransactionCoordinator,
) -> None:
    pid, epoch = await coord.init_producer_id(TID, TIMEOUT)
    assert await coord.init_producer_id(TID, TIMEOUT) == (pid, epoch + 1)
    assert await code_of(coord.add_partitions(TID, pid, epoch, [TP0])) == ErrorCode.producer_fenced
    assert await code_of(coord.end_txn(TID, pid, epoch, True)) == ErrorCode.producer_fenced


async def test_timeout_above_transaction_max_timeout_ms_is_refused(
    record_log: FailingLog, markers: Markers, clock: ManualClock
) -> None:
    coord = make(record_log, markers, clock, max_timeout_ms=10_000)
    assert (
        await code_of(coord.init_producer_id(TID, 10_001)) == ErrorCode.invalid_transaction_timeout
    )
    assert await code_of(coord.init_producer_id(TID, 0)) == ErrorCode.invalid_transaction_timeout
    assert coord.get(TID) is None and record_log.records == []
    assert (await coord.init_producer_id(TID, 10_000))[1] == 0


async def test_an_empty_transactional_id_is_an_invalid_request(
    coord: TransactionCoordinator,
) -> None:
    assert await code_of(coord.init_producer_id("", TIMEOUT)) == ErrorCode.invalid_request


async def test_kip_360_bump_with_the_current_epoch_and_its_retry(
    coord: TransactionCoordinator,
) -> None:
    pid, epoch = await coord.init_producer_id(TID, TIMEOUT)
    assert await coord.init_producer_id(TID, TIMEOUT, (pid, epoch)) == (pid, epoch + 1)
    # The answer was lost; the retry presents the old epoch again and gets the same.
    assert await coord.init_producer_id(TID, TIMEOUT, (pid, epoch)) == (pid, epoch + 1)
    # Another producer id is fenced.
    assert await code_of(coord.init_producer_id(TID, TIMEOUT, (pid + 7, 0))) == (
        ErrorCode.producer_fenced
    )


async def test_an_exhausted_epoch_rotates_to_a_new_producer_id(
    coord: TransactionCoordinator,
) -> None:
    pid, _ = await coord.init_producer_id(TID, TIMEOUT)
    m = coord.get(TID)
    assert m is not None
    coord.transactions[TID] = TxnMetadata(
        TID, pid, tx.SHORT_MAX - 1, TIMEOUT, S.EMPTY, frozenset(), -1, 0
    )
    new_pid, epoch = await coord.init_producer_id(TID, TIMEOUT)
    assert new_pid != pid and epoch == 0


# ------------------------------------------------------------------ a transaction


async def test_add_partitions_starts_the_transaction_and_a_known_subset_writes_nothing(
    coord: TransactionCoordinator, record_log: FailingLog, clock: ManualClock
) -> None:
    pid, epoch = await coord.init_producer_id(TID, TIMEOUT)
    start = clock.now_ms()
    await coord.add_partitions(TID, pid, epoch, [TP0])
    clock.advance(5)
    await coord.add_partitions(TID, pid, epoch, [TP1])
    m = coord.get(TID)
    assert m is not None
    assert (m.state, m.partitions, m.txn_start_ms) == (S.ONGOING, {TP0, TP1}, start)
    written = len(record_log.records)
    await coord.add_partitions(TID, pid, epoch, [TP1])
    assert len(record_log.records) == written


async def test_add_partitions_for_an_unknown_id_or_producer_is_invalid_producer_id_mapping(
    coord: TransactionCoordinator,
) -> None:
    assert await code_of(coord.add_partitions("nope", 1, 0, [TP0])) == (
        ErrorCode.invalid_producer_id_mapping
    )
    pid, epoch = await coord.init_producer_id(TID, TIMEOUT)
    assert await code_of(coord.add_partitions(TID, pid + 1, epoch, [TP0])) == (
        ErrorCode.invalid_producer_id_mapping
    )


@pytest.mark.parametrize("commit", [True, False])
async def test_end_txn_writes_every_marker_before_it_returns_and_completes(
    coord: TransactionCoordinator, markers: Markers, commit: bool
) -> None:
    pid, epoch = await coord.init_producer_id(TID, TIMEOUT)
    await coord.add_partitions(TID, pid, epoch, [TP0, TP1])
    await coord.end_txn(TID, pid, epoch, commit)
    assert markers.written == [(pid, epoch, commit, frozenset({TP0, TP1}))]
    m = coord.get(TID)
    assert m is not None
    assert m.state == (S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT)
    assert m.partitions == frozenset() and m.producer_epoch == epoch
    # A retry of the same EndTxn is answered NONE; the other outcome is INVALID_TXN_STATE.
    await coord.end_txn(TID, pid, epoch, commit)
    assert await code_of(coord.end_txn(TID, pid, epoch, not commit)) == ErrorCode.invalid_txn_state
    assert len(markers.written) == 1
    # The next transaction starts from Complete*.
    await coord.add_partitions(TID, pid, epoch, [TP1])
    m = coord.get(TID)
    assert m is not None and m.state == S.ONGOING and m.partitions == {TP1}


async def test_end_txn_without_a_transaction_is_invalid_txn_state(
    coord: TransactionCoordinator,
) -> None:
    pid, epoch = await coord.init_producer_id(TID, TIMEOUT)
    assert await code_of(coord.end_txn(TID, pid, epoch, True)) == ErrorCode.invalid_txn_state


async def test_re_init_aborts_an_ongoing_transaction_with_a_bumped_epoch_first(
    coord: TransactionCoordinator, markers: Markers
) -> None:
    pid, epoch = await coord.init_producer_id(TID, TIMEOUT)
    await coord.add_partitions(TID, pid, epoch, [TP0])
    assert await code_of(coord.init_producer_id(TID, TIMEOUT)) == ErrorCode.concurrent_transactions
    await until(lambda: coord.get(TID) is not None and coord.get(TID).state == S.COMPLETE_ABORT)  # type: ignore[union-attr]
    # The abort markers carry the fencing epoch, so the old producer's data is aborted.
    assert markers.written == [(pid, epoch + 1, False, frozenset({TP0}))]
    assert await coord.init_producer_id(TID, TIMEOUT) == (pid, epoch + 2)
    assert await code_of(coord.end_txn(TID, pid, epoch, True)) == ErrorCode.producer_fenced


async def test_re_init_completes_an_in_doubt_prepare_commit_before_a_new_epoch(
    coord: TransactionCoordinator, markers: Markers
) -> None:
    pid, epoch = await coord.init_producer_id(TID, TIMEOUT)
    await coord.add_partitions(TID, pid, epoch, [TP0])
    markers.fail = KafkaError(ErrorCode.kafka_storage_error, "marker write failed")
    assert await code_of(coord.end_txn(TID, pid, epoch, True)) == ErrorCode.kafka_storage_error
    m = coord.get(TID)
    assert m is not None and m.state == S.PREPARE_COMMIT
    # While it completes, the new producer is told to retry; the commit is kept.
    assert await code_of(coord.init_producer_id(TID, TIMEOUT)) == ErrorCode.concurrent_transactions
    await until(lambda: coord.get(TID).state == S.COMPLETE_COMMIT)  # type: ignore[union-attr]
    assert markers.written == [(pid, epoch, True, frozenset({TP0}))]
    assert await coord.init_producer_id(TID, TIMEOUT) == (pid, epoch + 1)


async def test_a_retried_end_txn_while_prepare_is_concurrent_transactions(
    coord: TransactionCoordinator, markers: Markers
) -> None:
    pid, epoch = await coord.init_producer_id(TID, TIMEOUT)
    await coord.add_partitions(TID, pid, epoch, [TP0])
    markers.fail = KafkaError(ErrorCode.kafka_storage_error, "marker write failed")
    await code_of(coord.end_txn(TID, pid, epoch, False))
    markers.hold = asyncio.Event()
    assert await code_of(coord.end_txn(TID, pid, epoch, False)) == (
        ErrorCode.concurrent_transactions
    )
    assert await code_of(coord.add_partitions(TID, pid, epoch, [TP1])) == (
        ErrorCode.concurrent_transactions
    )
    assert coord.verify(TID, pid, epoch, [TP0]) == {TP0: ErrorCode.concurrent_transactions}
    assert markers.written == []
    markers.hold.set()
    await until(lambda: coord.get(TID).state == S.COMPLETE_ABORT)  # type: ignore[union-attr]
    await coord.end_txn(TID, pid, epoch, False)


# ------------------------------------------------------------------ verification


async def test_produce_verification_names_the_partition_outside_the_transaction(
    coord: TransactionCoordinator,
) -> None:
    pid, epoch = await coord.init_producer_id(TID, TIMEOUT)
    await coord.add_partitions(TID, pid, epoch, [TP0])
    assert coord.verify(TID, pid, epoch, [TP0, TP1]) == {
        TP0: ErrorCode.none,
        TP1: ErrorCode.transaction_abortable,
    }
    assert coord.verify(TID, pid, epoch - 1, [TP0]) == {TP0: ErrorCode.producer_fenced}
    assert coord.verify("other", pid, epoch, [TP0]) == {TP0: ErrorCode.invalid_producer_id_mapping}


# ------------------------------------------------------------------ timeouts and expiry


async def test_a_transaction_past_its_timeout_is_aborted_and_its_producer_fenced(
    record_log: FailingLog, markers: Markers, clock: ManualClock
) -> None:
    coord = make(record_log, markers, clock, abort_timed_out_interval_ms=1_000)
    coord.start()
    try:
        pid, epoch = await coord.init_producer_id(TID, 5_000)
        await coord.add_partitions(TID, pid, epoch, [TP0])
        clock.advance(5_000)  # sweeps at 1..5 s: not yet older than its timeout
        await asyncio.sleep(0)
        assert coord.get(TID).state == S.ONGOING  # type: ignore[union-attr]
        clock.advance(1_000)
        await until(lambda: coord.get(TID).state == S.COMPLETE_ABORT)  # type: ignore[union-attr]
        assert markers.written == [(pid, epoch + 1, False, frozenset({TP0}))]
        assert await code_of(coord.end_txn(TID, pid, epoch, True)) == ErrorCode.producer_fenced
        assert await code_of(coord.add_partitions(TID, pid, epoch, [TP0])) == (
            ErrorCode.producer_fenced
        )
    finally:
        await coord.stop()


async def test_a_timed_out_transaction_at_the_maximum_epoch_is_aborted_with_a_new_producer_id(
    record_log: FailingLog, markers: Markers, clock: ManualClock
) -> None:
    """No epoch is left to fence with: the abort keeps the epoch, its completion rotates
    the producer id, and the sweep still aborts the transactions after it."""
    coord = make(record_log, markers, clock, abort_timed_out_interval_ms=1_000)
    pid, _ = await coord.init_producer_id("exhausted", 5_000)
    await coord.add_partitions("exhausted", pid, 0, [TP0])
    m = coord.get("exhausted")
    assert m is not None
    # Reached only through ~32k fences; put in place as replay would load it.
    at_max = TxnMetadata("exhausted", pid, tx.SHORT_MAX, 5_000, S.ONGOING, m.partitions, 0, 0)
    record_log.write(tx.encode(at_max))
    coord.transactions.clear()
    coord.load()
    assert coord.get("exhausted") == at_max
    later_pid, later_epoch = await coord.init_producer_id("later", 5_000)
    await coord.add_partitions("later", later_pid, later_epoch, [TP1])
    coord.start()
    try:
        clock.advance(6_000)
        await until(
            lambda: all(
                coord.get(t).state == S.COMPLETE_ABORT  # type: ignore[union-attr]
                for t in ("exhausted", "later")
            )
        )
        assert sorted(markers.written) == sorted(
            [
                (pid, tx.SHORT_MAX, False, frozenset({TP0})),
                (later_pid, later_epoch + 1, False, frozenset({TP1})),
            ]
        )
        rotated = coord.get("exhausted")
        assert rotated is not None and rotated.producer_id != pid
        assert rotated.producer_epoch == tx.NO_PRODUCER_EPOCH
        # The old producer is fenced by its id; a new InitProducerId gets epoch 0.
        assert await code_of(coord.end_txn("exhausted", pid, tx.SHORT_MAX, True)) == (
            ErrorCode.invalid_producer_id_mapping
        )
        assert await coord.init_producer_id("exhausted", 5_000) == (rotated.producer_id, 0)
        # The rotation is durable: replayed, the id keeps its new producer id.
        replayed = make(record_log, markers, clock)
        replayed.load()
        assert replayed.get("exhausted") == coord.get("exhausted")
    finally:
        await coord.stop()


async def test_idle_transactional_ids_expire_as_tombstones(
    record_log: FailingLog, markers: Markers, clock: ManualClock
) -> None:
    coord = make(record_log, markers, clock, id_expiration_ms=10_000)
    await coord.init_producer_id(TID, TIMEOUT)
    await coord.init_producer_id("busy", TIMEOUT)
    busy = coord.get("busy")
    assert busy is not None
    await coord.add_partitions("busy", busy.producer_id, busy.producer_epoch, [TP0])
    clock.advance(10_000)
    assert await coord.expire_transactional_ids() == [TID]
    assert coord.get(TID) is None and coord.get("busy") is not None
    assert tx.decode(*record_log.records[-1]) == TxnTombstone(TID)
    # Replayed, the id stays gone; a new init starts it over.
    again = make(record_log, markers, clock)
    again.load()
    assert again.get(TID) is None
    assert (await again.init_producer_id(TID, TIMEOUT))[1] == 0


# ------------------------------------------------------------------ durability


async def test_replay_gives_the_same_state(
    coord: TransactionCoordinator, record_log: FailingLog, markers: Markers, clock: ManualClock
) -> None:
    a_pid, a_epoch = await coord.init_producer_id("a", TIMEOUT)
    await coord.add_partitions("a", a_pid, a_epoch, [TP0, TP1])
    b_pid, b_epoch = await coord.init_producer_id("b", TIMEOUT)
    await coord.add_partitions("b", b_pid, b_epoch, [TP0])
    await coord.end_txn("b", b_pid, b_epoch, True)
    c_pid, c_epoch = await coord.init_producer_id("c", 30_000)
    await coord.add_partitions("c", c_pid, c_epoch, [TP1])
    markers.fail = KafkaError(ErrorCode.kafka_storage_error, "marker write failed")
    await code_of(coord.end_txn("c", c_pid, c_epoch, False))
    replayed = make(record_log, markers, clock)
    replayed.load()
    assert replayed.transactions == coord.transactions
    assert replayed.get("c").state == S.PREPARE_ABORT  # type: ignore[union-attr]
    # Started, the replayed coordinator completes the in-doubt abort.
    replayed.start()
    try:
        await until(lambda: replayed.get("c").state == S.COMPLETE_ABORT)  # type: ignore[union-attr]
        assert markers.written[-1] == (c_pid, c_epoch, False, frozenset({TP1}))
    finally:
        await replayed.stop()


@pytest.mark.parametrize("step", ["init", "add", "end"])
async def test_a_failed_write_is_kafka_storage_error_and_leaves_memory_unchanged(
    coord: TransactionCoordinator, record_log: FailingLog, markers: Markers, step: str
) -> None:
    pid, epoch = await coord.init_producer_id(TID, TIMEOUT)
    if step != "add":
        await coord.add_partitions(TID, pid, epoch, [TP0])
    before = dict(coord.transactions)
    records = list(record_log.records)
    record_log.fail_next = errno.ENOSPC
    if step == "init":
        call = coord.init_producer_id(TID, TIMEOUT)
    elif step == "add":
        call = coord.add_partitions(TID, pid, epoch, [TP0])
    else:
        call = coord.end_txn(TID, pid, epoch, True)
    assert await code_of(call) == ErrorCode.kafka_storage_error
    assert coord.transactions == before and record_log.records == records
    assert markers.written == []
    # The disk recovered: the same request succeeds.
    if step == "add":
        await coord.add_partitions(TID, pid, epoch, [TP0])
        assert coord.get(TID).state == S.ONGOING  # type: ignore[union-attr]


# ------------------------------------------------------------------ transitions and codec


def _meta(state: S, partitions: frozenset[TopicPartition] = frozenset({TP0})) -> TxnMetadata:
    return TxnMetadata(TID, 5, 3, TIMEOUT, state, partitions, 10, 20)


@pytest.mark.parametrize("old", list(S))
@pytest.mark.parametrize("new", list(S))
def test_only_kafkas_transitions_are_allowed(old: S, new: S) -> None:
    allowed = {
        S.EMPTY: {S.EMPTY, S.ONGOING, S.DEAD},
        S.ONGOING: {S.ONGOING, S.PREPARE_COMMIT, S.PREPARE_ABORT, S.PREPARE_EPOCH_FENCE},
        S.PREPARE_COMMIT: {S.COMPLETE_COMMIT},
        S.PREPARE_ABORT: {S.COMPLETE_ABORT},
        S.COMPLETE_COMMIT: {S.EMPTY, S.ONGOING, S.DEAD},
        S.COMPLETE_ABORT: {S.EMPTY, S.ONGOING, S.DEAD},
        S.DEAD: set(),
        S.PREPARE_EPOCH_FENCE: {S.PREPARE_ABORT},
    }
    if new in allowed[old]:
        assert _meta(old).transit(new).state == new
    else:
        with pytest.raises(tx.IllegalTransition):
            _meta(old).transit(new)


def test_records_use_kafkas_transaction_log_key_and_value_v0_layout() -> None:
    m = TxnMetadata(TID, 42, 7, 60_000, S.ONGOING, frozenset({TP1, TP0, ("x", 3)}), 100, 200)
    [(key, value)] = tx.encode(m)
    assert key == struct.pack(">hh", 0, len(TID)) + TID.encode()
    assert value is not None
    assert value[:17] == struct.pack(">hqhib", 0, 42, 7, 60_000, 1)
    assert value[-16:] == struct.pack(">qq", 200, 100)
    assert tx.decode(key, value) == m
    empty = _meta(S.EMPTY, frozenset())
    [(_, empty_value)] = tx.encode(empty)
    assert empty_value is not None and empty_value[17:21] == struct.pack(">i", -1)
    assert tx.decode(key, empty_value) == empty
    assert tx.encode(TxnTombstone(TID)) == [(key, None)]
    assert tx.compaction_keys(key, None) == [(TID, True)]


def test_offsets_partition_is_kafkas_partition_for() -> None:
    # Java: "test".hashCode() == 3556498; "polygenelubricants".hashCode() is
    # Integer.MIN_VALUE, which Kafka's Utils.abs maps to 0.
    assert tx.offsets_partition("test") == 3556498 % 50
    assert tx.offsets_partition("polygenelubricants") == 0
