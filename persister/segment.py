"""One segment of a partition log: `<base offset>.log` plus its `.index`, `.timeindex` and,
once a transaction aborted in it, `.txnindex` (persister.txn_index).

Follows Kafka's LogSegment: an index entry is added once more than `index.interval.bytes`
were written since the previous one, pointing at a batch by its last offset; a time-index
entry (the max timestamp so far and the offset that reached it) goes with it when the max
timestamp grew, and once more when the segment stops being active. Recovery re-reads
every batch, checks its structure and CRC, cuts the file at the first bad one and rebuilds
both indexes; the transaction index of a recovered segment is emptied, and the log
rebuilds it while replaying producer state (which needs the segments before it).

Not thread-safe except `fsync`, which the flush thread calls while the event-loop thread
appends (both only touch the kernel's file, never the Python-side state).
"""

from __future__ import annotations

import os
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from pathlib import Path

import structlog

from persister.index import INT32_MAX, OffsetIndex, TimeIndex
from persister.txn_index import TXN_INDEX_SUFFIX, TransactionIndex
from protocol.errors import CorruptRecordError
from protocol.records import (
    HEADER_SIZE,
    NO_TIMESTAMP,
    BatchHeader,
    EndTxnMarker,
    iter_batches,
    parse_header,
    read_batch_marker,
    validate_batch,
)

log = structlog.get_logger(__name__)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
# Every file of a segment, the log first.
SEGMENT_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)
# Chunk read when walking headers: covers the stretch between two index entries at the
# default index.interval.bytes, so a lookup usually costs one read.
_SCAN_CHUNK = 16 * 1024
# Chunk read when validating, so that CRCs are computed over few, large reads.
_RECOVERY_CHUNK = 1024 * 1024


# fdatasync where the platform has it (Linux); fsync elsewhere.
_fdatasync = getattr(os, "fdatasync", os.fsync)


def segment_file_name(base_offset: int, suffix: str) -> str:
    """Kafka's naming: the base offset zero-padded to 20 digits."""
    return f"{base_offset:020d}{suffix}"


def scan_batches(
    fd: int, start: int, end: int, *, validate: bool, chunk_size: int = _SCAN_CHUNK
) -> Iterator[tuple[int, BatchHeader]]:
    """Yield (position, header) of each batch in the file between `start` and `end`.

    Raises CorruptRecordError at a batch that is torn (runs past `end`) or malformed, or,
    with `validate`, whose CRC does not match.
    """
    buf = b""
    buf_start = start
    pos = start
    while pos < end:
        offset = pos - buf_start
        if len(buf) - offset < HEADER_SIZE:
            buf = os.pread(fd, min(max(chunk_size, HEADER_SIZE), end - pos), pos)
            buf_start, offset = pos, 0
        header = parse_header(buf, offset)
        if pos + header.size > end:
            raise CorruptRecordError(
                f"record batch at byte {pos} claims {header.size} bytes but only "
                f"{end - pos} remain in the segment"
            )
        if validate:
            if len(buf) - offset < header.size:
                buf = os.pread(fd, min(max(chunk_size, header.size), end - pos), pos)
                buf_start, offset = pos, 0
            validate_batch(buf, offset, header)
        yield pos, header
        pos += header.size


class LogSegment:
    """A `.log` file (read and written through one raw fd) and its two indexes."""

    def __init__(self, directory: Path, base_offset: int, fd: int, created_ms: int) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.fd = fd
        self.created_ms = created_ms
        self.offset_index = OffsetIndex(self.path(INDEX_SUFFIX))
        self.time_index = TimeIndex(self.path(TIME_INDEX_SUFFIX))
        self.txn_index = TransactionIndex(self.path(TXN_INDEX_SUFFIX))
        self.size = 0
        self.next_offset = base_offset
        self.max_timestamp = NO_TIMESTAMP
        self.offset_of_max_timestamp = -1
        # Kafka's rollingBasedTimestamp: segment.ms counts from the first batch's timestamp.
        self.rolling_timestamp: int | None = None
        self.last_modified_ms = created_ms
        # Set when the segment is deleted while a flush still holds its fd; that flush closes it.
        self.deleted = False
        self._bytes_since_last_index_entry = 0
        # The batches appended since the last offset-index entry, (last offsets, positions):
        # a read near the end (a consumer at the tail, a share fetch woken by a produce)
        # finds its batch here instead of walking every header from the index entry.
        # Empty after open and truncation, where the walk stands in.
        self._tail_base = -1
        self._tail_last: list[int] = []
        self._tail_pos: list[int] = []

    def path(self, suffix: str) -> Path:
        return self.directory / segment_file_name(self.base_offset, suffix)

    def __repr__(self) -> str:
        return f"LogSegment(base_offset={self.base_offset}, size={self.size})"

    @classmethod
    def create(cls, directory: Path, base_offset: int, now_ms: int) -> LogSegment:
        path = directory / segment_file_name(base_offset, LOG_SUFFIX)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        segment = cls(directory, base_offset, fd, now_ms)
        try:
            # Empty index files from the start, as Kafka has, so the directory always holds
            # all three.
            segment.offset_index.rewrite(array("i"), array("i"))
            segment.time_index.rewrite([], [])
        except BaseException:
            segment.close()  # an index the disk or the fd limit refused leaves no fd open
            raise
        return segment

    @classmethod
    def load(
        cls,
        directory: Path,
        base_offset: int,
        now_ms: int,
        *,
        trusted: bool,
        index_interval_bytes: int,
    ) -> tuple[LogSegment, bool, int]:
        """Open an existing segment; return it, whether it was recovered, and the number of
        bytes recovery cut off.

        A `trusted` segment (flushed before a clean shutdown or below the recovery point)
        keeps its indexes if they pass a sanity check; anything else is recovered.
        """
        fd = os.open(directory / segment_file_name(base_offset, LOG_SUFFIX), os.O_RDWR)
        segment = cls(directory, base_offset, fd, now_ms)
        try:
            file_size = os.fstat(fd).st_size
            segment.last_modified_ms = int(os.fstat(fd).st_mtime * 1000)
            segment.size = file_size
            if trusted and segment._load_indexes(file_size):
                segment.txn_index = TransactionIndex.load(segment.path(TXN_INDEX_SUFFIX))
                return segment, False, 0
            return segment, True, segment.recover(index_interval_bytes)
        except BaseException:
            segment.close()  # the log fd and any index fd recovery had opened
            raise

    def _load_indexes(self, file_size: int) -> bool:
        offset_index = OffsetIndex.load(self.path(INDEX_SUFFIX), file_size)
        time_index = TimeIndex.load(self.path(TIME_INDEX_SUFFIX))
        if offset_index is None or time_index is None:
            log.warning("segment_index_invalid", segment=str(self.path(LOG_SUFFIX)))
            return False
        self.offset_index = offset_index
        self.time_index = time_index
        last_time_entry = time_index.last_entry()
        if last_time_entry is not None:
            self.max_timestamp = last_time_entry[0]
            self.offset_of_max_timestamp = self.base_offset + last_time_entry[1]
        # Only the stretch after the last index entry needs reading to learn the end offset
        # and any timestamp newer than the last time-index entry (Kafka's readNextOffset).
        try:
            tail = list(
                scan_batches(self.fd, offset_index.last_position(), file_size, validate=False)
            )
            first = next(scan_batches(self.fd, 0, file_size, validate=False), None)
        except CorruptRecordError:
            log.warning("segment_index_invalid", segment=str(self.path(LOG_SUFFIX)))
            self.offset_index = OffsetIndex(self.path(INDEX_SUFFIX))
            self.time_index = TimeIndex(self.path(TIME_INDEX_SUFFIX))
            self.max_timestamp, self.offset_of_max_timestamp = NO_TIMESTAMP, -1
            return False
        if offset_index.relative_offsets and (
            not tail
            or tail[0][1].last_offset != self.base_offset + offset_index.relative_offsets[-1]
        ):
            log.warning("segment_index_stale", segment=str(self.path(LOG_SUFFIX)))
            return False
        for _, header in tail:
            self._observe_timestamp(header)
        if tail:
            self.next_offset = tail[-1][1].next_offset
        if (
            last_time_entry is not None
            and self.base_offset + last_time_entry[1] >= self.next_offset
        ):
            log.warning("segment_index_stale", segment=str(self.path(LOG_SUFFIX)))
            return False
        if first is not None:
            self.rolling_timestamp = first[1].max_timestamp
        self._bytes_since_last_index_entry = file_size - offset_index.last_position()
        return True

    def recover(self, index_interval_bytes: int) -> int:
        """Validate every batch, cut the file at the first bad one, rebuild the indexes.

        The transaction index is emptied; the log's producer-state replay refills it.
        """
        self.txn_index.reset()
        index_offsets: array[int] = array("i")
        index_positions: array[int] = array("i")
        time_stamps: list[int] = []
        time_offsets: list[int] = []
        self.max_timestamp, self.offset_of_max_timestamp = NO_TIMESTAMP, -1
        self.next_offset = self.base_offset
        self.rolling_timestamp = None
        valid_bytes = 0
        last_index_entry = 0
        file_size = os.fstat(self.fd).st_size
        try:
            for pos, header in scan_batches(
                self.fd, 0, file_size, validate=True, chunk_size=_RECOVERY_CHUNK
            ):
                if (
                    header.base_offset < self.next_offset
                    or header.last_offset - self.base_offset > INT32_MAX
                ):
                    raise CorruptRecordError(
                        f"record batch at byte {pos} has base offset {header.base_offset}, "
                        f"expected at least {self.next_offset}"
                    )
                if self.rolling_timestamp is None:
                    self.rolling_timestamp = header.max_timestamp
                self._observe_timestamp(header)
                if valid_bytes - last_index_entry > index_interval_bytes:
                    index_offsets.append(header.last_offset - self.base_offset)
                    index_positions.append(pos)
                    if self.max_timestamp >= 0 and (
                        not time_stamps or self.max_timestamp > time_stamps[-1]
                    ):
                        time_stamps.append(self.max_timestamp)
                        time_offsets.append(self.offset_of_max_timestamp - self.base_offset)
                    last_index_entry = valid_bytes
                valid_bytes = pos + header.size
                self.next_offset = header.next_offset
        except CorruptRecordError as exc:
            log.warning(
                "segment_recovery_found_invalid_batch",
                segment=str(self.path(LOG_SUFFIX)),
                position=valid_bytes,
                error=str(exc),
            )
        truncated = file_size - valid_bytes
        if truncated:
            os.ftruncate(self.fd, valid_bytes)
        self.size = valid_bytes
        self._bytes_since_last_index_entry = valid_bytes - last_index_entry
        self.offset_index.rewrite(index_offsets, index_positions)
        self.time_index.rewrite(time_stamps, time_offsets)
        self._append_final_time_entry()
        return truncated

    def _observe_timestamp(self, header: BatchHeader) -> None:
        if header.max_timestamp > self.max_timestamp:
            self.max_timestamp = header.max_timestamp
            self.offset_of_max_timestamp = header.last_offset

    def _append_final_time_entry(self) -> None:
        if self.max_timestamp >= 0:
            self.time_index.maybe_append(
                self.max_timestamp, self.offset_of_max_timestamp - self.base_offset
            )

    def append(
        self,
        data: bytes | bytearray | memoryview,
        batches: Sequence[tuple[int, BatchHeader]],
        now_ms: int,
        index_interval_bytes: int,
    ) -> None:
        """Write `data` (whose batches already carry their final offsets) at the end."""
        start = self.size
        view = memoryview(data)
        written = 0
        try:
            while written < len(view):
                written += os.pwrite(self.fd, view[written:], start + written)
        except OSError:
            # Leave no partial batch behind for readers or for the next append.
            os.ftruncate(self.fd, start)
            raise
        if start == 0:
            self.rolling_timestamp = batches[0][1].max_timestamp
        for relative_position, header in batches:
            self._observe_timestamp(header)
            if self._bytes_since_last_index_entry > index_interval_bytes:
                self.offset_index.append(
                    header.last_offset - self.base_offset, start + relative_position
                )
                self._append_final_time_entry()
                self._bytes_since_last_index_entry = 0
                self._tail_last, self._tail_pos = [], []
            if not self._tail_last:
                self._tail_base = header.base_offset
            self._tail_last.append(header.last_offset)
            self._tail_pos.append(start + relative_position)
            self._bytes_since_last_index_entry += header.size
        self.size = start + len(view)
        self.next_offset = batches[-1][1].next_offset
        self.last_modified_ms = now_ms

    def truncate_to(self, offset: int) -> int:
        """Cut the segment before the batch holding `offset` (a batch boundary); return the
        bytes removed.

        Also cuts whatever a failed append may have left past the segment's known size, so
        at or past `next_offset` it only tidies the file end. The indexes lose the entries
        for what was cut and the max timestamp is recomputed from what remains, as Kafka's
        LogSegment.truncateTo does.
        """
        position, new_next = self.size, self.next_offset
        if offset < self.next_offset:
            found = self.translate_offset(offset)
            if found is not None:
                position, header = found
                if header.base_offset < offset:
                    raise ValueError(
                        f"offset {offset} is inside the batch {header.base_offset}-"
                        f"{header.last_offset} of {self.path(LOG_SUFFIX).name}, not at its start"
                    )
                new_next = max(header.base_offset, self.base_offset)
        removed = os.fstat(self.fd).st_size - position
        os.ftruncate(self.fd, position)
        self.offset_index.truncate_to_position(position)
        self.time_index.truncate_to_offset(new_next - self.base_offset)
        self.txn_index.truncate_to(new_next)
        self.size = position
        self.next_offset = new_next
        last_time = self.time_index.last_entry()
        if last_time is None:
            self.max_timestamp, self.offset_of_max_timestamp = NO_TIMESTAMP, -1
        else:
            self.max_timestamp = last_time[0]
            self.offset_of_max_timestamp = self.base_offset + last_time[1]
        # Batches after the last index entry are not covered by the time index.
        for _, header in scan_batches(
            self.fd, self.offset_index.last_position(), position, validate=False
        ):
            self._observe_timestamp(header)
        self._bytes_since_last_index_entry = position - self.offset_index.last_position()
        self._tail_base, self._tail_last, self._tail_pos = -1, [], []
        if position == 0:
            self.rolling_timestamp = None
        return removed

    def on_become_inactive(self) -> None:
        """Record the segment's max timestamp in its time index (retention reads it there)."""
        self._append_final_time_entry()

    def time_waited_for_roll(self, now_ms: int, max_timestamp_in_append: int) -> int:
        """Kafka's rule: by batch timestamps if the first batch had one, else by wall clock."""
        if self.rolling_timestamp is not None and self.rolling_timestamp >= 0:
            return max_timestamp_in_append - self.rolling_timestamp
        return now_ms - self.created_ms

    def largest_timestamp(self) -> int:
        """Max batch timestamp, or the file's last modification when no batch has one."""
        return self.max_timestamp if self.max_timestamp >= 0 else self.last_modified_ms

    def translate_offset(self, offset: int) -> tuple[int, BatchHeader] | None:
        """Position and header of the first batch whose last offset is >= `offset`."""
        if self._tail_last and offset >= self._tail_base:
            slot = bisect_left(self._tail_last, offset)
            if slot == len(self._tail_last):
                return None
            position = self._tail_pos[slot]
            return position, parse_header(os.pread(self.fd, HEADER_SIZE, position), 0)
        start = self.offset_index.lookup(offset - self.base_offset)
        for pos, header in scan_batches(self.fd, start, self.size, validate=False):
            if header.last_offset >= offset:
                return pos, header
        return None

    def read(self, offset: int, max_bytes: int, max_offset: int | None) -> bytes:
        """Whole batches from the batch holding `offset`, at least one (KIP-74)."""
        found = self.translate_offset(offset)
        if found is None:
            return b""
        start, first = found
        if max_offset is not None and first.base_offset >= max_offset:
            return b""
        end = self.size
        if max_offset is not None and max_offset < self.next_offset:
            bound = self.translate_offset(max_offset)
            if bound is not None:
                bound_pos, bound_header = bound
                end = (
                    bound_pos
                    if bound_header.base_offset >= max_offset
                    else bound_pos + bound_header.size
                )
        # KIP-74: the first batch is returned whole even when it is larger than max_bytes.
        fetch_size = min(end - start, max(max_bytes, first.size))
        data = os.pread(self.fd, fetch_size, start)
        if len(data) == end - start:
            return data
        # Cut at max_bytes: drop the partial last batch, walking headers only from the last
        # indexed batch inside the buffer rather than from its start.
        positions = self.offset_index.positions
        slot = bisect_right(positions, start + len(data)) - 1
        walk_from = positions[slot] - start if slot >= 0 and positions[slot] > start else 0
        whole = walk_from
        for pos, header in iter_batches(memoryview(data)[walk_from:], validate=False):
            whole = walk_from + pos + header.size
        return data if whole == len(data) else data[:whole]

    def batches(self, start_offset: int) -> Iterator[BatchHeader]:
        """Headers of the batches whose last offset is >= `start_offset`."""
        found = self.translate_offset(start_offset)
        if found is None:
            return
        for _, header in scan_batches(self.fd, found[0], self.size, validate=False):
            yield header

    def replay(self, start_offset: int) -> Iterator[tuple[BatchHeader, EndTxnMarker | None]]:
        """Headers of the batches whose last offset is >= `start_offset`, each control
        batch with its transaction marker (read from the file; data batches are not)."""
        found = self.translate_offset(start_offset)
        if found is None:
            return
        for pos, header in scan_batches(self.fd, found[0], self.size, validate=False):
            marker = None
            if header.is_control:
                data = os.pread(self.fd, header.size, pos)
                marker = read_batch_marker(data, 0, header)
            yield header, marker

    def find_by_timestamp(self, timestamp: int, starting_offset: int) -> tuple[int, int] | None:
        """(base offset, max timestamp) of the first batch at/after `starting_offset` whose
        max timestamp is >= `timestamp` (Kafka's findOffsetByTimestamp, at batch level)."""
        relative = self.time_index.lookup(timestamp)
        from_offset = max(self.base_offset + (relative or 0), starting_offset)
        start = self.offset_index.lookup(from_offset - self.base_offset)
        for _, header in scan_batches(self.fd, start, self.size, validate=False):
            if header.last_offset >= starting_offset and header.max_timestamp >= timestamp:
                return header.base_offset, header.max_timestamp
        return None

    def fsync(self) -> None:
        """The log and every index: at roll, recovery, compaction and clean close, before
        the recovery point moves past this segment (from then on its indexes are trusted)."""
        self.fsync_log()
        self.offset_index.fsync()
        self.time_index.fsync()
        self.txn_index.fsync()

    def fsync_log(self) -> None:
        """Only the `.log`: what a record's durability needs. fdatasync also flushes the
        file size the append grew (it skips only metadata reads do not need, e.g. mtime).
        Indexes left unflushed are safe while this segment is at or above the persisted
        recovery point: an unclean start rebuilds them from the log (Kafka flushes a
        segment's indexes only at roll and close, too)."""
        _fdatasync(self.fd)

    def close_index_files(self) -> None:
        """Drop the index fds of a segment no longer written (lookups use memory)."""
        self.offset_index.close()
        self.time_index.close()
        self.txn_index.close()

    def close(self) -> None:
        self.close_index_files()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def unlink(self) -> None:
        for suffix in SEGMENT_SUFFIXES:
            self.path(suffix).unlink(missing_ok=True)
