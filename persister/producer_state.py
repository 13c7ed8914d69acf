"""Idempotent and transactional producer state for one partition (sans-IO).

Follows Kafka's ProducerStateManager / ProducerAppendInfo / ProducerStateEntry:

- Per producer id the partition keeps the current epoch and the metadata of the last
  5 appended batches (first/last sequence, offsets, timestamp).
- `check` runs before an append. A retried batch whose epoch and sequence range equal
  one of the 5 cached batches is a duplicate: the broker answers with the original
  offsets and appends nothing. Otherwise an older epoch is fenced
  (INVALID_PRODUCER_EPOCH, which Kafka returns to producers since 2.7), a new epoch
  must start at sequence 0, and within an epoch the batch must continue the sequence
  exactly (OUT_OF_ORDER_SEQUENCE_NUMBER). A producer id the partition has no state
  for is accepted at any sequence, as Kafka 4.x does (its state may have been removed
  by retention or expiration while the producer lived on).
- `update` runs after the append with the header carrying the assigned offsets;
  `rebuild` replays every batch header of the log on startup through the same path,
  without checks (Kafka loads the log with the replication origin, which skips them).

Transactions (Kafka's ProducerStateManager ongoing/unreplicated transactions): a
transactional data batch opens a transaction for its producer (its first offset is
kept); the producer's COMMIT or ABORT marker closes it and `update` returns the
`CompletedTxn`. A completed transaction stays "unreplicated" until the high watermark
passes its marker (`on_high_watermark`), so the last stable offset never runs ahead of
what is durable: `first_unstable_offset` is the first offset of the earliest open or
not yet durable transaction. Markers are checked by `check_marker` (producer epoch and
coordinator epoch, as Kafka's ProducerAppendInfo.appendEndTxnMarker).

Not modelled: the transactions-v2 verification state (Kafka rejects a non-zero first
sequence from a TV2 transactional producer with no state).

A produce request carrying several batches for one partition is checked with
`check_all` (each batch against the state the earlier ones would leave), then
`update` is called for each appended batch.

Snapshots (Kafka's `<offset>.snapshot` files, ProducerStateManager.takeSnapshot): the
state of every producer as of a log offset, so that opening a log loads the newest
usable one and scans only the batches after it (`persister.file_log`). `snapshot_bytes` /
`load_snapshot` are the encoding, all big-endian:

    version int16 (1) | crc32c uint32 of the rest | producer count int32 | per producer:
      producer id int64 | epoch int16 | coordinator epoch int32 | last timestamp int64
      | open transaction's first offset int64 (-1: none) | batch count int8
      | per batch (oldest first): first seq int32 | last seq int32 | first offset int64
        | last offset int64 | timestamp int64

Like Kafka's, with open transactions; unlike it, all retained batches (up to 5), not
only the last, so duplicate detection after a restart is exactly what a full scan
gives. Ended transactions are not kept: what is on disk at open counts as durable.
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace

import crc32c
from sortedcontainers import SortedDict

from protocol.errors import ErrorCode, KafkaError
from protocol.records import (
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    BatchHeader,
    EndTxnMarker,
)

NUM_BATCHES_TO_RETAIN = 5
MAX_SEQUENCE = 2**31 - 1
# Kafka's producer.id.expiration.ms default (1 day).
DEFAULT_PRODUCER_ID_EXPIRATION_MS = 86_400_000
SNAPSHOT_VERSION = 1
_SNAPSHOT_HEAD = struct.Struct(">hI")
_SNAPSHOT_COUNT = struct.Struct(">i")
_SNAPSHOT_ENTRY = struct.Struct(">qhiqqb")
_SNAPSHOT_BATCH = struct.Struct(">iiqqq")


@dataclass(slots=True, frozen=True)
class BatchMetadata:
    """What is remembered of one appended batch, to recognise its retries."""

    first_sequence: int
    last_sequence: int
    first_offset: int
    last_offset: int
    timestamp: int


@dataclass(slots=True, frozen=True)
class CompletedTxn:
    """A transaction its marker ended: [first_offset, last_offset], the marker last."""

    producer_id: int
    first_offset: int
    last_offset: int
    aborted: bool


@dataclass(slots=True, frozen=True)
class DuplicateBatch:
    """A retried batch already in the log: answer with these, append nothing."""

    base_offset: int
    last_offset: int
    # The original batch's max timestamp (its log append time on LogAppendTime topics).
    timestamp: int
    first_sequence: int
    last_sequence: int


@dataclass(slots=True)
class ProducerStateEntry:
    """The state of one producer id in one partition."""

    producer_id: int
    producer_epoch: int = NO_PRODUCER_EPOCH
    batches: deque[BatchMetadata] = field(
        default_factory=lambda: deque(maxlen=NUM_BATCHES_TO_RETAIN)
    )
    last_timestamp: int = -1
    current_txn_first_offset: int | None = None
    # Of the last transaction marker written for this producer (Kafka's coordinatorEpoch).
    coordinator_epoch: int = -1

    @property
    def last_sequence(self) -> int:
        return self.batches[-1].last_sequence if self.batches else NO_SEQUENCE

    @property
    def last_data_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1

    def find_duplicate(self, header: BatchHeader) -> BatchMetadata | None:
        if header.producer_epoch != self.producer_epoch:
            return None
        first, last = header.base_sequence, header.last_sequence
        for batch in self.batches:
            if batch.first_sequence == first and batch.last_sequence == last:
                return batch
        return None

    def _set_epoch(self, epoch: int) -> None:
        # A new epoch restarts sequences, so the old epoch's batches cannot be retries.
        if epoch != self.producer_epoch:
            self.batches.clear()
            self.producer_epoch = epoch


def _in_sequence(last_sequence: int, next_sequence: int) -> bool:
    return next_sequence == last_sequence + 1 or (
        next_sequence == 0 and last_sequence == MAX_SEQUENCE
    )


def _next_sequence(last_sequence: int) -> int:
    return 0 if last_sequence == MAX_SEQUENCE else last_sequence + 1


class ProducerStateManager:
    """Producer ids, epochs and recent sequence ranges of one partition."""

    def __init__(self) -> None:
        self._producers: dict[int, ProducerStateEntry] = {}
        # first offset -> producer id of every open transaction.
        self._ongoing: SortedDict = SortedDict()
        # Ended transactions whose marker is not below the high watermark yet, in marker order.
        self._unreplicated: deque[CompletedTxn] = deque()

    def __len__(self) -> int:
        return len(self._producers)

    def __iter__(self) -> Iterator[ProducerStateEntry]:
        return iter(self._producers.values())

    def entry(self, producer_id: int) -> ProducerStateEntry | None:
        return self._producers.get(producer_id)

    def check(self, header: BatchHeader) -> DuplicateBatch | None:
        """Validate a batch about to be appended.

        Returns a DuplicateBatch for a retry of a recent batch, None if the batch may
        be appended; raises KafkaError with Kafka's code otherwise.
        """
        producer_id = header.producer_id
        if producer_id == NO_PRODUCER_ID:
            return None
        entry = self._producers.get(producer_id)
        if entry is None:
            return None
        epoch = header.producer_epoch
        if header.is_control:
            self._check_epoch(entry, header)
            return None

        duplicate = entry.find_duplicate(header)
        if duplicate is not None:
            return DuplicateBatch(
                duplicate.first_offset,
                duplicate.last_offset,
                duplicate.timestamp,
                duplicate.first_sequence,
                duplicate.last_sequence,
            )
        self._check_epoch(entry, header)

        first_sequence = header.base_sequence
        if entry.producer_epoch == NO_PRODUCER_EPOCH:
            pass
        elif epoch != entry.producer_epoch:
            if first_sequence != 0:
                raise KafkaError(
                    ErrorCode.out_of_order_sequence_number,
                    f"producer {producer_id} starts new epoch {epoch} (was "
                    f"{entry.producer_epoch}) at sequence {first_sequence}; a new epoch "
                    "must start at sequence 0",
                )
        elif not _in_sequence(entry.last_sequence, first_sequence):
            raise KafkaError(
                ErrorCode.out_of_order_sequence_number,
                f"out of order sequence number for producer {producer_id} epoch {epoch}: "
                f"expected {_next_sequence(entry.last_sequence)}, got {first_sequence}",
            )

        if entry.current_txn_first_offset is not None and not header.is_transactional:
            raise KafkaError(
                ErrorCode.invalid_txn_state,
                f"producer {producer_id} sent a non-transactional batch while its "
                f"transaction starting at offset {entry.current_txn_first_offset} is open",
            )
        return None

    def check_all(self, headers: Sequence[BatchHeader]) -> list[DuplicateBatch | None]:
        """`check` for the batches of one append, each as if the ones before it were in.

        Nothing changes here; call `update` for each appended batch afterwards.
        """
        if len(headers) == 1:
            return [self.check(headers[0])]
        scratch = ProducerStateManager()
        for header in headers:
            entry = self._producers.get(header.producer_id)
            if entry is not None and header.producer_id not in scratch._producers:
                scratch._producers[header.producer_id] = replace(
                    entry, batches=deque(entry.batches, maxlen=NUM_BATCHES_TO_RETAIN)
                )
        results: list[DuplicateBatch | None] = []
        for header in headers:
            duplicate = scratch.check(header)
            results.append(duplicate)
            if duplicate is None:
                scratch.update(header, header.max_timestamp)
        return results

    @staticmethod
    def _check_epoch(entry: ProducerStateEntry, header: BatchHeader) -> None:
        if header.producer_epoch < entry.producer_epoch:
            raise KafkaError(
                ErrorCode.invalid_producer_epoch,
                f"epoch {header.producer_epoch} of producer {header.producer_id} is older "
                f"than its current epoch {entry.producer_epoch}",
            )

    def check_marker(
        self,
        producer_id: int,
        producer_epoch: int,
        coordinator_epoch: int,
        *,
        transaction_version: int = 0,
    ) -> None:
        """Validate a COMMIT/ABORT marker about to be written (Kafka's appendEndTxnMarker).

        An older producer epoch is INVALID_PRODUCER_EPOCH (with transactions v2 the
        coordinator bumps the epoch for the marker, so an equal epoch is refused too,
        unless no transaction is open: a retry of a marker already written). An older
        coordinator epoch than the last marker's is TRANSACTION_COORDINATOR_FENCED.
        """
        entry = self._producers.get(producer_id)
        if entry is None:
            return
        current = entry.producer_epoch
        invalid = (
            producer_epoch <= current if transaction_version >= 2 else producer_epoch < current
        )
        if invalid and not (
            transaction_version >= 2
            and producer_epoch == current
            and entry.current_txn_first_offset is None
        ):
            raise KafkaError(
                ErrorCode.invalid_producer_epoch,
                f"transaction marker epoch {producer_epoch} of producer {producer_id} is "
                f"{'at or below' if transaction_version >= 2 else 'below'} its current epoch "
                f"{current}",
            )
        if coordinator_epoch < entry.coordinator_epoch:
            raise KafkaError(
                ErrorCode.transaction_coordinator_fenced,
                f"transaction marker for producer {producer_id} carries coordinator epoch "
                f"{coordinator_epoch}, older than {entry.coordinator_epoch} of its last marker",
            )

    def update(
        self, header: BatchHeader, append_time_ms: int, marker: EndTxnMarker | None = None
    ) -> CompletedTxn | None:
        """Record a batch just appended; `header` carries its assigned offsets.

        As in Kafka, a producer's timestamp is its batches' max timestamp (so a
        rebuild from the log sees the same); `append_time_ms` stands in for batches
        that carry none. For a control batch `marker` is its COMMIT/ABORT marker (None
        counts as a commit); the transaction it ends is returned, None if the producer
        had none open (a marker with no data is no transaction to index).
        """
        producer_id = header.producer_id
        if producer_id == NO_PRODUCER_ID:
            return None
        entry = self._producers.get(producer_id)
        if entry is None:
            entry = self._producers[producer_id] = ProducerStateEntry(producer_id)
        timestamp = header.max_timestamp if header.max_timestamp >= 0 else append_time_ms
        entry._set_epoch(header.producer_epoch)
        entry.last_timestamp = timestamp
        if header.is_control:
            first = entry.current_txn_first_offset
            if marker is not None:
                entry.coordinator_epoch = marker.coordinator_epoch
            if first is None:
                return None
            entry.current_txn_first_offset = None
            self._ongoing.pop(first, None)
            completed = CompletedTxn(
                producer_id, first, header.base_offset, marker is not None and not marker.commit
            )
            self._unreplicated.append(completed)
            return completed
        entry.batches.append(
            BatchMetadata(
                header.base_sequence,
                header.last_sequence,
                header.base_offset,
                header.last_offset,
                timestamp,
            )
        )
        if header.is_transactional and entry.current_txn_first_offset is None:
            entry.current_txn_first_offset = header.base_offset
            self._ongoing[header.base_offset] = producer_id
        return None

    def rebuild(self, headers: Iterable[BatchHeader]) -> None:
        """Forget everything and replay the log's batch headers in offset order."""
        self.clear()
        for header in headers:
            self.update(header, header.max_timestamp)

    def clear(self) -> None:
        self._producers.clear()
        self._ongoing.clear()
        self._unreplicated.clear()

    def truncate_below(self, log_start_offset: int) -> None:
        """Forget producers with no data batch left at or above the log start offset.

        Kafka does this when retention or DeleteRecords moves the log start offset.
        """
        gone = [
            producer_id
            for producer_id, entry in self._producers.items()
            if not entry.batches or entry.last_data_offset < log_start_offset
        ]
        for producer_id in gone:
            entry = self._producers.pop(producer_id)
            if entry.current_txn_first_offset is not None:
                self._ongoing.pop(entry.current_txn_first_offset, None)

    def remove_expired(
        self, now_ms: int, expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS
    ) -> list[int]:
        """Forget producers idle for `expiration_ms` without an open transaction.

        Returns the removed producer ids (Kafka's producer.id.expiration.ms).
        """
        expired = [
            producer_id
            for producer_id, entry in self._producers.items()
            if entry.current_txn_first_offset is None
            and now_ms - entry.last_timestamp >= expiration_ms
        ]
        for producer_id in expired:
            del self._producers[producer_id]
        return expired

    def on_high_watermark(self, high_watermark: int) -> None:
        """Ended transactions whose marker is now below the high watermark are stable."""
        while self._unreplicated and self._unreplicated[0].last_offset < high_watermark:
            self._unreplicated.popleft()

    def first_unstable_offset(self) -> int | None:
        """First offset of the earliest open or not yet durable transaction (Kafka's
        firstUnstableOffset, which bounds the last stable offset)."""
        offsets: list[int] = [txn.first_offset for txn in self._unreplicated]
        if self._ongoing:
            first: int = self._ongoing.peekitem(0)[0]
            offsets.append(first)
        return min(offsets) if offsets else None

    def last_stable_offset(self, completed: CompletedTxn) -> int:
        """The LSO right after `completed` ended, as its index entry records it (Kafka's
        ProducerStateManager.lastStableOffset): the start of the earliest transaction of
        another producer still open, else just past the marker."""
        for first, producer_id in self._ongoing.items():
            if producer_id != completed.producer_id:
                return int(first)
        return completed.last_offset + 1

    def snapshot_bytes(self) -> bytes:
        """Every producer's state, encoded (see the module docstring)."""
        body = bytearray(_SNAPSHOT_COUNT.pack(len(self._producers)))
        for entry in self._producers.values():
            first = entry.current_txn_first_offset
            body += _SNAPSHOT_ENTRY.pack(
                entry.producer_id,
                entry.producer_epoch,
                entry.coordinator_epoch,
                entry.last_timestamp,
                -1 if first is None else first,
                len(entry.batches),
            )
            for b in entry.batches:
                body += _SNAPSHOT_BATCH.pack(
                    b.first_sequence, b.last_sequence, b.first_offset, b.last_offset, b.timestamp
                )
        return _SNAPSHOT_HEAD.pack(SNAPSHOT_VERSION, crc32c.crc32c(body)) + bytes(body)

    def load_snapshot(self, data: bytes) -> None:
        """Replace the state with a snapshot's; ValueError (nothing changed) if it is
        torn, damaged or of another version."""
        if len(data) < _SNAPSHOT_HEAD.size + _SNAPSHOT_COUNT.size:
            raise ValueError(f"producer snapshot too short ({len(data)} bytes)")
        version, crc = _SNAPSHOT_HEAD.unpack_from(data)
        if version != SNAPSHOT_VERSION:
            raise ValueError(f"producer snapshot version {version}, expected {SNAPSHOT_VERSION}")
        body = memoryview(data)[_SNAPSHOT_HEAD.size :]
        if crc32c.crc32c(body) != crc:
            raise ValueError("producer snapshot CRC mismatch (torn or damaged)")
        try:
            producers = _decode_entries(body)
        except struct.error as exc:
            raise ValueError(f"producer snapshot is malformed: {exc}") from exc
        self.clear()
        self._producers = producers
        for entry in producers.values():
            if entry.current_txn_first_offset is not None:
                self._ongoing[entry.current_txn_first_offset] = entry.producer_id

    def open_transactions(self) -> list[tuple[int, int]]:
        """(first offset, producer id) of each open transaction, ascending."""
        return [(int(first), int(pid)) for first, pid in self._ongoing.items()]


def _decode_entries(body: memoryview) -> dict[int, ProducerStateEntry]:
    (count,) = _SNAPSHOT_COUNT.unpack_from(body)
    pos = _SNAPSHOT_COUNT.size
    producers: dict[int, ProducerStateEntry] = {}
    for _ in range(count):
        pid, epoch, coordinator_epoch, timestamp, first, n = _SNAPSHOT_ENTRY.unpack_from(body, pos)
        pos += _SNAPSHOT_ENTRY.size
        entry = ProducerStateEntry(
            pid,
            epoch,
            last_timestamp=timestamp,
            current_txn_first_offset=None if first < 0 else first,
            coordinator_epoch=coordinator_epoch,
        )
        for _ in range(n):
            entry.batches.append(BatchMetadata(*_SNAPSHOT_BATCH.unpack_from(body, pos)))
            pos += _SNAPSHOT_BATCH.size
        producers[pid] = entry
    if pos != len(body):
        raise ValueError(f"producer snapshot has {len(body) - pos} bytes after its entries")
    return producers
