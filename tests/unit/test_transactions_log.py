"""Transactions on a topic partition: control batches, producer state, the LSO, the
aborted-transaction index (`.txnindex`) across restarts and torn tails, and what Fetch /
ListOffsets answer read_committed (Kafka's UnifiedLog/ProducerStateManager/
TransactionIndex behaviour)."""

from __future__ import annotations

import os
import struct
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from broker.config import BrokerConfig
from broker.handlers.produce_fetch import LATEST, _fetch_once, _offset_for, _Wanted
from broker.partitions import LogManager, Partition, validate_produce_data
from persister.clock import ManualClock
from persister.commit import GroupCommit
from persister.segment import LogSegment
from persister.txn_index import ENTRY_SIZE, AbortedTxn, TransactionIndex, aborted_batch_ranges
from protocol.errors import CorruptRecordError, ErrorCode, KafkaError
from protocol.records import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    BatchHeader,
    EndTxnMarker,
    NewRecord,
    build_batch,
    build_end_txn_marker_batch,
    control_type,
    decode_records,
    iter_batches,
    parse_header,
    read_batch_marker,
)

TOPIC = "t"


class Harness:
    """A LogManager over a temp dir whose partitions can be closed (clean or as kill -9
    would leave them) and opened again."""

    def __init__(self, directory: Path, commit: GroupCommit) -> None:
        self.directory = directory
        self.commit = commit
        self.clock = ManualClock(now_ms=1_000_000)
        self.topic_id = uuid.uuid4()
        self.overrides: dict[str, str] = {}
        self.logs = self._open()

    def _open(self) -> LogManager:
        logs = LogManager(self.directory, BrokerConfig({}), self.commit, self.clock)
        logs.open_topic(TOPIC, self.topic_id, 1, self.overrides)
        return logs

    @property
    def part(self) -> Partition:
        part = self.logs.get(TOPIC, 0)
        assert part is not None
        return part

    def reopen(self, *, clean: bool) -> Partition:
        if clean:
            self.logs.close()
        else:
            for part in self.logs:
                part.log.close(clean=False)
        self.logs = self._open()
        return self.part

    @property
    def partition_dir(self) -> Path:
        return self.directory / f"{TOPIC}-0"


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[Harness]:
    commit = GroupCommit()
    commit.start()
    harness = Harness(tmp_path, commit)
    try:
        yield harness
    finally:
        await harness.logs.flush_all()
        harness.logs.close()
        await commit.stop()


async def produce(
    part: Partition,
    count: int = 1,
    *,
    pid: int = -1,
    epoch: int = 0,
    seq: int = -1,
    transactional: bool = False,
) -> tuple[int, int]:
    batch = build_batch(
        [NewRecord(None, f"v{i}".encode()) for i in range(count)],
        producer_id=pid,
        producer_epoch=epoch if pid >= 0 else -1,
        base_sequence=seq,
        is_transactional=transactional,
        default_timestamp=part.clock.now_ms(),
    )
    data, batches = validate_produce_data(batch)
    outcome = part.append(data, batches)
    await part.wait_durable(outcome.last_offset, 10)
    return outcome.base_offset, outcome.last_offset


async def end_txn(
    part: Partition, pid: int, *, commit: bool, epoch: int = 0, coordinator_epoch: int = 0
) -> int:
    outcome = part.append_marker(pid, epoch, commit=commit, coordinator_epoch=coordinator_epoch)
    await part.wait_durable(outcome.last_offset, 10)
    return outcome.last_offset


# -- control batches ---------------------------------------------------------------


def test_marker_batch_is_kafkas_control_batch_and_reads_back() -> None:
    data = build_end_txn_marker_batch(
        producer_id=42, producer_epoch=3, commit=False, coordinator_epoch=7, timestamp=5
    )
    (pos, header), *rest = list(iter_batches(data))  # CRC checked
    assert not rest
    assert header.is_control and header.is_transactional
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (42, 3, -1)
    (record,) = decode_records(data, pos, header)
    # Kafka's ControlRecordType key (version 0, type) and EndTxnMarker value (version 0, epoch).
    assert record.key == struct.pack(">hh", 0, CONTROL_ABORT)
    assert record.value == struct.pack(">hi", 0, 7)
    assert read_batch_marker(data, pos, header) == EndTxnMarker(commit=False, coordinator_epoch=7)
    commit = build_end_txn_marker_batch(
        producer_id=42, producer_epoch=3, commit=True, coordinator_epoch=0, timestamp=5
    )
    assert control_type(decode_records(commit, 0, parse_header(commit))[0].key) == CONTROL_COMMIT


def test_data_batch_has_no_marker_and_a_short_control_key_is_corrupt() -> None:
    data = build_batch([NewRecord(None, b"x")])
    assert read_batch_marker(data, 0, parse_header(data)) is None
    with pytest.raises(CorruptRecordError):
        control_type(b"\x00")


# -- producer state and the LSO ----------------------------------------------------


async def test_open_transaction_holds_the_lso_until_its_marker_is_durable(h: Harness) -> None:
    part = h.part
    await produce(part, 2)
    first, _ = await produce(part, 3, pid=1, seq=0, transactional=True)
    await produce(part, 2)  # non-transactional data after it
    assert part.high_watermark == 7
    assert part.last_stable_offset == first == 2
    woken: list[int] = []
    part.add_listener(lambda: woken.append(part.last_stable_offset))
    outcome = part.append_marker(1, 0, commit=True, coordinator_epoch=0)
    # Written but not durable yet: the LSO stays where it was.
    assert part.last_stable_offset == 2
    await part.wait_durable(outcome.last_offset, 10)
    assert part.last_stable_offset == part.high_watermark == 8
    assert woken and woken[-1] == 8
    assert part.aborted_transactions(0, 8) == []


async def test_abort_is_indexed_with_the_lso_of_other_open_transactions(h: Harness) -> None:
    part = h.part
    a_first, _ = await produce(part, 2, pid=1, seq=0, transactional=True)  # 0-1
    b_first, _ = await produce(part, 1, pid=2, seq=0, transactional=True)  # 2
    assert part.last_stable_offset == a_first
    marker = await end_txn(part, 1, commit=False)  # 3
    # Producer 2's transaction is still open: it bounds the LSO now and in the index entry.
    assert part.last_stable_offset == b_first
    assert part.aborted_transactions(0, 10) == [AbortedTxn(1, a_first, marker, b_first)]
    await end_txn(part, 2, commit=True)
    assert part.last_stable_offset == part.high_watermark == 5
    index = h.partition_dir / f"{0:020d}.txnindex"
    assert index.stat().st_size == ENTRY_SIZE


async def test_marker_epoch_and_coordinator_epoch_are_checked(h: Harness) -> None:
    part = h.part
    await produce(part, 1, pid=1, epoch=2, seq=0, transactional=True)
    with pytest.raises(KafkaError) as info:
        part.append_marker(1, 1, commit=True, coordinator_epoch=0)
    assert info.value.code == ErrorCode.invalid_producer_epoch
    # Transactions v2: the coordinator bumps the epoch, so the same epoch is stale.
    with pytest.raises(KafkaError) as info:
        part.append_marker(1, 2, commit=True, coordinator_epoch=0, transaction_version=2)
    assert info.value.code == ErrorCode.invalid_producer_epoch
    await end_txn(part, 1, commit=False, epoch=2, coordinator_epoch=5)
    await produce(part, 1, pid=1, epoch=2, seq=1, transactional=True)
    with pytest.raises(KafkaError) as info:
        part.append_marker(1, 2, commit=True, coordinator_epoch=4)
    assert info.value.code == ErrorCode.transaction_coordinator_fenced
    # Nothing refused was written; the transaction is still open.
    assert part.log_end_offset == 3
    assert part.last_stable_offset == 2


async def test_clients_cannot_write_control_batches(h: Harness) -> None:
    data, batches = validate_produce_data(
        build_end_txn_marker_batch(
            producer_id=1, producer_epoch=0, commit=True, coordinator_epoch=0, timestamp=1
        )
    )
    with pytest.raises(KafkaError) as info:
        h.part.append(data, batches)
    assert info.value.code == ErrorCode.invalid_record
    assert h.part.log_end_offset == 0


async def test_a_failed_index_write_takes_the_abort_marker_back(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    part = h.part
    await produce(part, 2, pid=1, seq=0, transactional=True)

    def refuse(self: TransactionIndex, entry: AbortedTxn) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(TransactionIndex, "append", refuse)
    with pytest.raises(KafkaError) as info:
        part.append_marker(1, 0, commit=False, coordinator_epoch=0)
    assert info.value.code == ErrorCode.kafka_storage_error
    # The marker is gone and the transaction still open: the coordinator retries.
    assert part.log_end_offset == 2
    assert part.last_stable_offset == 0
    monkeypatch.undo()
    marker = await end_txn(part, 1, commit=False)
    assert marker == 2
    assert part.aborted_transactions(0, 3) == [AbortedTxn(1, 0, 2, 3)]


async def test_a_marker_the_disk_refuses_leaves_the_transaction_open(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    part = h.part
    await produce(part, 2, pid=1, seq=0, transactional=True)

    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(LogSegment, "append", refuse)
    with pytest.raises(KafkaError) as info:
        part.append_marker(1, 0, commit=True, coordinator_epoch=0)
    assert info.value.code == ErrorCode.kafka_storage_error
    assert (part.log_end_offset, part.last_stable_offset) == (2, 0)
    monkeypatch.undo()
    # The coordinator's retry ends it.
    assert await end_txn(part, 1, commit=True) == 2
    assert part.last_stable_offset == part.high_watermark == 3


# -- restarts ----------------------------------------------------------------------


@pytest.mark.parametrize("clean", [True, False], ids=["clean", "kill-9"])
async def test_open_transactions_and_aborts_survive_a_restart(h: Harness, clean: bool) -> None:
    part = h.part
    await produce(part, 2, pid=1, seq=0, transactional=True)  # 0-1 aborted
    await end_txn(part, 1, commit=False)  # 2
    await produce(part, 1, pid=2, seq=0, transactional=True)  # 3, left open
    await produce(part, 1)  # 4
    before = (part.last_stable_offset, part.aborted_transactions(0, 5))
    assert before == (3, [AbortedTxn(1, 0, 2, 3)])
    part = h.reopen(clean=clean)
    assert (part.last_stable_offset, part.aborted_transactions(0, 5)) == before
    # The open transaction is live again: its marker ends it.
    await end_txn(part, 2, commit=True)
    assert part.last_stable_offset == part.high_watermark == 6


async def test_kill_9_rebuilds_a_lost_or_torn_transaction_index(h: Harness) -> None:
    part = h.part
    await produce(part, 2, pid=1, seq=0, transactional=True)
    await end_txn(part, 1, commit=False)  # 2
    await produce(part, 1, pid=1, seq=2, transactional=True)  # 3
    await end_txn(part, 1, commit=False)  # 4
    index = h.partition_dir / f"{0:020d}.txnindex"
    expected = [AbortedTxn(1, 0, 2, 3), AbortedTxn(1, 3, 4, 5)]
    assert part.aborted_transactions(0, 5) == expected
    part.log.close(clean=False)
    # The crash left half of the second entry.
    with open(index, "r+b") as f:
        f.truncate(ENTRY_SIZE + 10)
    part = h.reopen(clean=False)
    assert part.aborted_transactions(0, 5) == expected
    assert index.stat().st_size == 2 * ENTRY_SIZE
    # A torn entry alone is dropped on load, not misread.
    assert TransactionIndex.load(index).entries == expected


async def test_a_torn_marker_reopens_its_transaction(h: Harness) -> None:
    part = h.part
    await produce(part, 2, pid=1, seq=0, transactional=True)
    await end_txn(part, 1, commit=False)  # 2
    part.log.close(clean=False)
    log_file = h.partition_dir / f"{0:020d}.log"
    size = log_file.stat().st_size
    os.truncate(log_file, size - 5)  # the marker batch is torn
    part = h.reopen(clean=False)
    assert part.log_end_offset == 2
    assert part.last_stable_offset == 0  # open again, as on disk
    assert part.aborted_transactions(0, 10) == []
    marker = await end_txn(part, 1, commit=False)
    assert part.aborted_transactions(0, 10) == [AbortedTxn(1, 0, marker, marker + 1)]


async def test_retention_deletes_a_segment_with_its_transaction_index(h: Harness) -> None:
    h.overrides = {"segment.ms": "1000", "retention.ms": "60000"}
    part = h.reopen(clean=True)
    await produce(part, 1, pid=1, seq=0, transactional=True)
    await end_txn(part, 1, commit=False)
    index = h.partition_dir / f"{0:020d}.txnindex"
    assert index.exists()
    h.clock.advance(2_000)
    await produce(part, 1)  # rolls: segment 0 is closed
    h.clock.advance(120_000)
    assert h.logs.enforce_retention() >= 1
    assert not index.exists()
    assert part.aborted_transactions(0, part.log_end_offset) == []


# -- Fetch and ListOffsets ---------------------------------------------------------


async def test_read_committed_fetch_stops_at_the_lso_and_lists_overlapping_aborts(
    h: Harness,
) -> None:
    part = h.part
    await produce(part, 2, pid=1, seq=0, transactional=True)  # 0-1 aborted
    await end_txn(part, 1, commit=False)  # 2
    await produce(part, 2)  # 3-4
    await produce(part, 1, pid=2, seq=0, transactional=True)  # 5 committed
    await end_txn(part, 2, commit=True)  # 6
    await produce(part, 1, pid=3, seq=0, transactional=True)  # 7, open

    def fetch(offset: int, committed: bool, max_bytes: int = 1 << 20) -> Any:
        wanted = [_Wanted(TOPIC, h.topic_id, 0, offset, max_bytes)]
        by_topic, _, errors = _fetch_once(h.logs, 1 << 20, wanted, committed)
        assert not errors
        [[entry]] = by_topic.values()
        return entry

    def last_fetched(entry: Any) -> int:
        return [header for _, header in iter_batches(entry.records)][-1].last_offset

    def aborted(entry: Any) -> list[tuple[int, int]] | None:
        txns = entry.aborted_transactions
        return None if txns is None else [(t.producer_id, t.first_offset) for t in txns]

    committed = fetch(0, True)
    assert committed.last_stable_offset == 7 and committed.high_watermark == 8
    assert last_fetched(committed) == 6
    assert aborted(committed) == [(1, 0)]
    # Past the aborted transaction's marker nothing is listed.
    assert aborted(fetch(3, True)) == []
    # At the LSO there is nothing to read yet.
    assert fetch(7, True).records == b""
    uncommitted = fetch(0, False)
    assert aborted(uncommitted) is None
    assert last_fetched(uncommitted) == 7
    # A read cut by max bytes to the first batch lists only what it covers.
    first_only = fetch(3, True, max_bytes=1)
    assert last_fetched(first_only) == 4 and aborted(first_only) == []

    assert _offset_for(part, LATEST, True) == (7, -1)
    assert _offset_for(part, LATEST, False) == (8, -1)


def test_aborted_batches_are_the_producers_transactional_batches_up_to_its_marker() -> None:
    def header(
        base: int, count: int, pid: int, *, txn: bool = True, control: bool = False
    ) -> BatchHeader:
        data = build_batch(
            [NewRecord(None, b"x")] * count if not control else [NewRecord(b"\0\0\0\0", b"")],
            base_offset=base,
            producer_id=pid,
            producer_epoch=0,
            is_transactional=txn,
            is_control=control,
        )
        return parse_header(data)

    headers = [
        header(0, 2, 1),  # aborted (pid 1)
        header(2, 1, 2),  # committed (pid 2)
        header(3, 1, 1, control=True),  # pid 1's abort marker
        header(4, 1, 1),  # pid 1's next transaction: not aborted
        header(5, 1, 3, txn=False),  # plain data of another producer
        header(6, 1, 2, control=True),
    ]
    ranges = aborted_batch_ranges(headers, [AbortedTxn(1, 0, 3, 2)])
    assert ranges == [(0, 1)]
