"""A segment's sparse indexes, in Kafka's on-disk formats.

`.index` (OffsetIndex): 8-byte entries, int32 offset relative to the segment's base offset
and int32 byte position in the `.log` file. `.timeindex` (TimeIndex): 12-byte entries,
int64 timestamp and int32 relative offset. Both are big-endian and strictly increasing.

Lookups run against in-memory arrays (the event-loop thread reads them); the files are
appended to as entries are added so that a cleanly closed segment does not need a scan
on the next start. After a crash, the indexes of unflushed segments are rebuilt from the
log, so the files only need to be right when the segment is known to be clean.
"""

from __future__ import annotations

import itertools
import os
import struct
import sys
from array import array
from bisect import bisect_left, bisect_right
from pathlib import Path

from persister.files import write_all

OFFSET_ENTRY = struct.Struct(">ii")
TIME_ENTRY = struct.Struct(">qi")
INT32_MAX = 2**31 - 1


def _strictly_increasing(values: array[int]) -> bool:
    return all(a < b for a, b in itertools.pairwise(values))


class _IndexFile:
    """The append-only file behind an index; opened lazily, only for segments being written."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def _append_bytes(self, data: bytes) -> None:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        write_all(self._fd, data)

    def _replace_contents(self, data: bytes) -> None:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.ftruncate(self._fd, 0)
        write_all(self._fd, data)

    def fsync(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class OffsetIndex(_IndexFile):
    """Relative offset -> file position, one entry per `index.interval.bytes` of log."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.relative_offsets: array[int] = array("i")
        self.positions: array[int] = array("i")

    @classmethod
    def load(cls, path: Path, log_size: int) -> OffsetIndex | None:
        """Read an existing index; None if it is missing or fails the sanity check."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        if len(data) % OFFSET_ENTRY.size:
            return None
        raw = array("i")
        raw.frombytes(data)
        if sys.byteorder == "little":
            raw.byteswap()
        index = cls(path)
        index.relative_offsets = raw[0::2]
        index.positions = raw[1::2]
        if not index._sane(log_size):
            return None
        return index

    def _sane(self, log_size: int) -> bool:
        if not self.relative_offsets:
            return True
        return (
            self.relative_offsets[0] >= 0
            and self.positions[0] >= 0
            and self.positions[-1] < log_size
            and _strictly_increasing(self.relative_offsets)
            and _strictly_increasing(self.positions)
        )

    def __len__(self) -> int:
        return len(self.relative_offsets)

    def append(self, relative_offset: int, position: int) -> None:
        self.relative_offsets.append(relative_offset)
        self.positions.append(position)
        self._append_bytes(OFFSET_ENTRY.pack(relative_offset, position))

    def lookup(self, relative_offset: int) -> int:
        """Position of the last entry at or below `relative_offset` (0 if there is none)."""
        slot = bisect_right(self.relative_offsets, relative_offset) - 1
        return self.positions[slot] if slot >= 0 else 0

    def last_position(self) -> int:
        return self.positions[-1] if self.positions else 0

    def truncate_to_position(self, position: int) -> None:
        """Drop the entries pointing at or past `position` (the log was cut there)."""
        keep = bisect_left(self.positions, position)
        if keep < len(self.positions):
            self.rewrite(self.relative_offsets[:keep], self.positions[:keep])

    def rewrite(self, relative_offsets: array[int], positions: array[int]) -> None:
        """Replace the whole index (after recovery rebuilt it from the log)."""
        self.relative_offsets = relative_offsets
        self.positions = positions
        interleaved = array("i", [0]) * (2 * len(positions))
        interleaved[0::2] = relative_offsets
        interleaved[1::2] = positions
        if sys.byteorder == "little":
            interleaved.byteswap()
        self._replace_contents(interleaved.tobytes())


class TimeIndex(_IndexFile):
    """Max timestamp so far -> relative offset of the batch that first reached it."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.timestamps: list[int] = []
        self.relative_offsets: list[int] = []

    @classmethod
    def load(cls, path: Path) -> TimeIndex | None:
        """Read an existing index; None if it is missing or fails the sanity check."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        if len(data) % TIME_ENTRY.size:
            return None
        index = cls(path)
        for timestamp, relative_offset in TIME_ENTRY.iter_unpack(data):
            if relative_offset < 0 or (
                index.timestamps
                and (
                    timestamp <= index.timestamps[-1]
                    or relative_offset < index.relative_offsets[-1]
                )
            ):
                return None
            index.timestamps.append(timestamp)
            index.relative_offsets.append(relative_offset)
        return index

    def __len__(self) -> int:
        return len(self.timestamps)

    def maybe_append(self, timestamp: int, relative_offset: int) -> None:
        """Add an entry only if the timestamp grew, as Kafka's TimeIndex.maybeAppend does."""
        if timestamp < 0 or (self.timestamps and timestamp <= self.timestamps[-1]):
            return
        self.timestamps.append(timestamp)
        self.relative_offsets.append(relative_offset)
        self._append_bytes(TIME_ENTRY.pack(timestamp, relative_offset))

    def lookup(self, timestamp: int) -> int | None:
        """Relative offset of the last entry with a timestamp <= `timestamp`, if any."""
        slot = bisect_right(self.timestamps, timestamp) - 1
        return self.relative_offsets[slot] if slot >= 0 else None

    def last_entry(self) -> tuple[int, int] | None:
        if not self.timestamps:
            return None
        return self.timestamps[-1], self.relative_offsets[-1]

    def truncate_to_offset(self, relative_offset: int) -> None:
        """Drop the entries for offsets at or past `relative_offset` (the log was cut there)."""
        keep = bisect_left(self.relative_offsets, relative_offset)
        if keep < len(self.relative_offsets):
            self.rewrite(self.timestamps[:keep], self.relative_offsets[:keep])

    def rewrite(self, timestamps: list[int], relative_offsets: list[int]) -> None:
        """Replace the whole index (after recovery rebuilt it from the log)."""
        self.timestamps = timestamps
        self.relative_offsets = relative_offsets
        self._replace_contents(
            b"".join(
                TIME_ENTRY.pack(t, o) for t, o in zip(timestamps, relative_offsets, strict=True)
            )
        )
