"""A durable log of key/value records: what every coordinator's state is written to.

A coordinator turns a request into records; `write` appends them as one v2 record batch
on a segmented `PartitionLog` (to the OS, not yet fsynced) and `sync` returns once they
are fsynced (group commit); `truncate` undoes a write whose append or fsync failed;
`replay` yields every record from the start (or from an offset a checkpoint covers up
to), which is how state is rebuilt on startup.
Keys and values are opaque bytes: each coordinator has its own codec.
`coordinator.runtime.CoordinatorRuntime` drives these calls.

`MemoryRecordLog` has the same calls and keeps the records in a list, for unit tests
of the coordinators' callers.

`compact_by_key` is the compaction of logs whose records each set the whole value of
their key (group metadata, group configs, cluster metadata): per key the newest record
of the closed segments is kept, and a key whose newest record there is a tombstone is
dropped with all its records. Replaying the result gives the same state as replaying
the original, since the active segment holds only newer records.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from persister.clock import SYSTEM_CLOCK, Clock
from persister.commit import GroupCommit
from persister.file_log import CLEANED_SUFFIX, LogConfig, PartitionLog
from persister.files import write_synced
from persister.segment import LOG_SUFFIX, segment_file_name
from protocol.records import (
    BatchHeader,
    NewRecord,
    Record,
    build_batch,
    decode_records,
    iter_batches,
)

KeyValue = tuple[bytes | None, bytes | None]
# What compaction needs to know of a record: the keys whose value it sets, each with
# whether it deletes that key (a tombstone). Most records set one key.
CompactionKeys = Callable[[bytes | None, bytes | None], Iterable[tuple[Hashable, bool]]]

# Internal logs roll at 64 MiB so closed segments can be compacted in reasonable pieces.
INTERNAL_SEGMENT_BYTES = 64 * 1024 * 1024
_READ_CHUNK = 1 << 20


def internal_log_config(segment_bytes: int = INTERNAL_SEGMENT_BYTES) -> LogConfig:
    """Coordinator logs: kept forever (compaction bounds them), rolled by size only."""
    return LogConfig(segment_bytes=segment_bytes, retention_ms=-1, segment_ms=2**62)


class RecordLog:
    """Coordinator records on a `PartitionLog`; see the module docstring."""

    def __init__(
        self,
        directory: Path,
        commit: GroupCommit,
        config: LogConfig | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
        open_log: Callable[[Path, LogConfig, int], PartitionLog] = PartitionLog.open,
    ) -> None:
        """`open_log` opens the segmented log underneath (a storage engine's
        `open_log`; the file engine's is `PartitionLog.open`)."""
        self._clock = clock
        self.log = open_log(directory, config or internal_log_config(), clock.now_ms())
        self._commit = commit

    @property
    def partition_log(self) -> PartitionLog:
        return self.log

    @property
    def end_offset(self) -> int:
        """Where the next write begins."""
        return self.log.log_end_offset

    def write(self, records: Sequence[KeyValue]) -> int:
        """Append records as one batch (to the OS, not yet fsynced); return the offset
        where they begin. Raises OSError or KafkaError(KAFKA_STORAGE_ERROR) if the disk
        refused, possibly after part of the batch reached the file (`truncate` tidies)."""
        start = self.log.log_end_offset
        if records:
            now = self._clock.now_ms()
            batch = build_batch(
                [NewRecord(key=k, value=v) for k, v in records], default_timestamp=now
            )
            self.log.append(bytearray(batch), now)
        return start

    async def sync(self) -> None:
        """Return once everything written so far is on disk."""
        await self._commit.sync(self.log)

    def truncate(self, offset: int) -> None:
        """Remove everything written from `offset` on (a failed write and what followed)."""
        self.log.truncate_to(offset)

    def replay(self, start: int | None = None) -> Iterator[KeyValue]:
        """Every record from the log start, in order; with `start`, every record at or
        after that offset (what a runtime replays on top of a checkpoint)."""
        if start is None:
            return self._replay_all()
        return self._replay_from(start)

    def _replay_all(self) -> Iterator[KeyValue]:
        offset = self.log.log_start_offset
        while offset < self.log.log_end_offset:
            data = self.log.read(offset, _READ_CHUNK)
            if not data:
                break
            for pos, header in iter_batches(data, validate=True):
                if not header.is_control:
                    for record in decode_records(data, pos, header):
                        yield record.key, record.value
                offset = header.next_offset

    def _replay_from(self, start: int) -> Iterator[KeyValue]:
        position = max(start, self.log.log_start_offset)
        while position < self.log.log_end_offset:
            data = self.log.read(position, _READ_CHUNK)
            if not data:
                break
            for pos, header in iter_batches(data, validate=True):
                if not header.is_control and header.last_offset >= start:
                    for record in decode_records(data, pos, header):
                        if record.offset >= start:
                            yield record.key, record.value
                position = header.next_offset

    def close(self) -> None:
        self.log.close()


class MemoryRecordLog:
    """The calls of `RecordLog` over a list: nothing is durable, nothing fails."""

    partition_log: PartitionLog | None = None

    def __init__(self) -> None:
        self.records: list[KeyValue] = []

    @property
    def end_offset(self) -> int:
        return len(self.records)

    def write(self, records: Sequence[KeyValue]) -> int:
        start = len(self.records)
        self.records.extend(records)
        return start

    async def sync(self) -> None:
        return None

    def truncate(self, offset: int) -> None:
        del self.records[offset:]

    def replay(self, start: int | None = None) -> Iterator[KeyValue]:
        return iter(self.records[start or 0 :])

    def close(self) -> None:
        return None


# ------------------------------------------------------------------ compaction


@dataclass(frozen=True, slots=True)
class KeyCompaction:
    """What `compact_by_key` wrote: the cleaned file (None when no record is kept) and
    the record counts before and after."""

    cleaned: Path | None
    records_before: int
    records_after: int


def _closed_batches(
    plog: PartitionLog, base_offsets: Sequence[int]
) -> Iterator[tuple[BatchHeader, tuple[Record, ...]]]:
    """(header, records) of every batch of the closed segments `base_offsets`."""
    for base_offset in base_offsets:
        data = (plog.directory / segment_file_name(base_offset, LOG_SUFFIX)).read_bytes()
        for pos, header in iter_batches(data, validate=True):
            records = () if header.is_control else tuple(decode_records(data, pos, header))
            yield header, records


def compact_by_key(
    plog: PartitionLog, base_offsets: Sequence[int], keys_of: CompactionKeys
) -> KeyCompaction:
    """Write and fsync one `.cleaned` file holding what the closed segments
    `base_offsets` keep: per key its newest record, unless that is a tombstone.

    A record that sets several keys is kept while it is the newest of any of them that
    it does not delete. Kept records keep their offsets and timestamps. Blocking file
    I/O on closed segments only: run it off the event loop; the caller swaps the file
    in (`PartitionLog.replace_closed_segments`) if the segments are still there.
    """
    newest: dict[Hashable, tuple[int, bool]] = {}
    batches = list(_closed_batches(plog, base_offsets))
    for _, records in batches:
        for record in records:
            for key, tombstone in keys_of(record.key, record.value):
                newest[key] = (record.offset, tombstone)
    out = bytearray()
    before = after = 0
    for header, records in batches:
        kept = [
            record
            for record in records
            if any(
                newest[key] == (record.offset, False)
                for key, _ in keys_of(record.key, record.value)
            )
        ]
        before += len(records)
        after += len(kept)
        if kept:
            out += build_batch(
                kept,
                base_offset=header.base_offset,
                compression=header.compression,
                log_append_time=header.max_timestamp if header.is_log_append_time else None,
                partition_leader_epoch=header.partition_leader_epoch,
            )
    if not out:
        return KeyCompaction(None, before, after)
    cleaned = plog.directory / (segment_file_name(base_offsets[0], LOG_SUFFIX) + CLEANED_SUFFIX)
    write_synced(cleaned, out)
    return KeyCompaction(cleaned, before, after)
