"""A segment's aborted-transaction index: `<base offset>.txnindex`, as Kafka's
TransactionIndex.

One fixed-size entry per transaction that ended with an ABORT marker in the segment,
in marker order, each Kafka's AbortedTxn (big-endian):

    version int16 (0) | producer_id int64 | first_offset int64 | last_offset int64
    | last_stable_offset int64

`last_offset` is the marker's offset; `last_stable_offset` the LSO once the abort was
written, which lets a fetch stop scanning later segments (`collect`). The entries are few
and small, so they are kept in memory; the file is created on the first entry, appended
to, fsynced with its segment, and cut or rebuilt with it. A torn trailing entry (a crash
in the middle of an append) is dropped on load.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

import structlog

from protocol.records import BatchHeader

log = structlog.get_logger(__name__)

TXN_INDEX_SUFFIX = ".txnindex"
_ENTRY = struct.Struct(">hqqqq")
ENTRY_SIZE = _ENTRY.size  # 34
_VERSION = 0


class AbortedTxn(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int

    def encode(self) -> bytes:
        return _ENTRY.pack(
            _VERSION, self.producer_id, self.first_offset, self.last_offset, self.last_stable_offset
        )


class TransactionIndex:
    """The aborted transactions whose marker lies in one segment."""

    def __init__(self, path: Path, entries: list[AbortedTxn] | None = None) -> None:
        self.path = path
        self.entries: list[AbortedTxn] = entries or []
        self._fd = -1

    @classmethod
    def load(cls, path: Path) -> TransactionIndex:
        """Read the file if there is one; a partial last entry is cut off."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return cls(path)
        whole = len(data) - len(data) % ENTRY_SIZE
        entries: list[AbortedTxn] = []
        for pos in range(0, whole, ENTRY_SIZE):
            version, *fields = _ENTRY.unpack_from(data, pos)
            if version != _VERSION:
                # Not ours to read: drop the rest, as a torn tail (it is rebuilt on recovery).
                whole = pos
                break
            entries.append(AbortedTxn(*fields))
        index = cls(path, entries)
        if whole != len(data):
            log.warning("txn_index_torn_tail", path=str(path), cut_bytes=len(data) - whole)
            index._truncate_file(whole)
        return index

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def last_offset(self) -> int | None:
        return self.entries[-1].last_offset if self.entries else None

    def append(self, entry: AbortedTxn) -> None:
        """Write one entry (no fsync); last offsets must increase, as in Kafka."""
        if self.entries and entry.last_offset <= self.entries[-1].last_offset:
            raise ValueError(
                f"aborted transaction ending at {entry.last_offset} is not after the last "
                f"entry of {self.path.name} ({self.entries[-1].last_offset})"
            )
        fd = self._open()
        position = len(self.entries) * ENTRY_SIZE
        data = entry.encode()
        try:
            written = 0
            while written < len(data):
                written += os.pwrite(fd, data[written:], position + written)
        except OSError:
            os.ftruncate(fd, position)
            raise
        self.entries.append(entry)

    def truncate_to(self, offset: int) -> None:
        """Drop the entries whose marker is at or after `offset` (the log was cut there)."""
        keep = len(self.entries)
        while keep and self.entries[keep - 1].last_offset >= offset:
            keep -= 1
        if keep != len(self.entries):
            del self.entries[keep:]
            self._truncate_file(keep * ENTRY_SIZE)

    def reset(self) -> None:
        """Forget every entry (before the segment's entries are rebuilt from its batches)."""
        self.entries = []
        if self._fd >= 0 or self.path.exists():
            self._truncate_file(0)

    def collect(self, fetch_offset: int, upper_bound: int) -> tuple[list[AbortedTxn], bool]:
        """Entries overlapping [fetch_offset, upper_bound), and whether later segments can
        hold no more (an entry's LSO reached the bound): Kafka's collectAbortedTxns."""
        found: list[AbortedTxn] = []
        for entry in self.entries:
            if entry.last_offset >= fetch_offset and entry.first_offset < upper_bound:
                found.append(entry)
            if entry.last_stable_offset >= upper_bound:
                return found, True
        return found, False

    def fsync(self) -> None:
        if self._fd >= 0:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def unlink(self) -> None:
        self.path.unlink(missing_ok=True)

    def _open(self) -> int:
        if self._fd < 0:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        return self._fd

    def _truncate_file(self, size: int) -> None:
        os.ftruncate(self._open(), size)


def aborted_batch_ranges(
    headers: Iterable[BatchHeader], aborted: Iterable[AbortedTxn]
) -> list[tuple[int, int]]:
    """(base, last) offsets of the data batches in `headers` (ascending) that belong to
    an aborted transaction, as Kafka's SharePartition.fetchAbortedTransactionRecordBatches
    (and a read_committed consumer) finds them: a producer is aborting from the first
    offset of its aborted transaction until its next control batch, which is that abort's
    marker; its transactional batches in between are aborted."""
    pending = sorted(aborted, key=lambda txn: txn.first_offset)
    next_txn = 0
    aborting: set[int] = set()
    ranges: list[tuple[int, int]] = []
    for header in headers:
        while next_txn < len(pending) and pending[next_txn].first_offset <= header.last_offset:
            aborting.add(pending[next_txn].producer_id)
            next_txn += 1
        if header.is_control:
            aborting.discard(header.producer_id)
        elif header.is_transactional and header.producer_id in aborting:
            ranges.append((header.base_offset, header.last_offset))
    return ranges
