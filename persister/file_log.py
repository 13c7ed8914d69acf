"""The segmented append-only log behind every topic partition and internal log.

Behaves like Kafka's log layer (UnifiedLog / LocalLog / LogLoader): segments named by
their 20-digit base offset, rolled by size (`segment.bytes`) and age (`segment.ms`),
deleted by `retention.ms` / `retention.bytes` / DeleteRecords, and recovered after a
crash by validating the segments that were not known to be flushed and cutting a torn
tail.

Threads: everything runs on the event-loop thread except `flush()`, which a worker thread
(persister.commit.GroupCommit) calls while appends continue. The two meet only at the
set of segments that still need an fsync, guarded by a small lock; an fd the flush thread
may be using is closed only after that flush is done with it.

Files besides the segments, all per partition directory:

- `log-start-offset-checkpoint`: the log start offset, when DeleteRecords or retention
  moved it inside a segment (Kafka's name; written by flush, so durable once the
  caller's GroupCommit.sync(log) returns).
- `recovery-point-offset-checkpoint`: base offset of the first segment that may not be
  fully fsynced; segments below it are trusted on an unclean start.
- `.kafka_cleanshutdown`: written by a clean close, removed on open; without it the
  segments from the recovery point on are recovered.
- `<offset>.snapshot`: producer state as of that offset (Kafka's producer snapshots),
  written at each roll and at a clean close once `load_producer_state` attached a
  `ProducerStateManager`; opening loads the newest one not above the first recovered
  segment nor the log end, and scans only the batches after it.
"""

from __future__ import annotations

import bisect
import dataclasses
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from persister.checkpoint import (
    delete_producer_snapshots_after,
    producer_snapshot_offsets,
    producer_snapshot_path,
    write_producer_snapshot,
)
from persister.index import INT32_MAX
from persister.producer_state import ProducerStateManager
from persister.segment import (
    LOG_SUFFIX,
    SEGMENT_SUFFIXES,
    LogSegment,
    scan_batches,
)
from persister.txn_index import AbortedTxn
from protocol.errors import CorruptRecordError, ErrorCode, KafkaError
from protocol.records import (
    NO_TIMESTAMP,
    BatchHeader,
    parse_header,
    set_base_offset,
)

log = structlog.get_logger(__name__)

CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
# A compacted copy of a segment's `.log`, before it is renamed over the original.
CLEANED_SUFFIX = ".cleaned"
RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
_CHECKPOINT_VERSION = 0
# Left behind by a crash in the middle of writing a checkpoint, deleting a segment or
# compacting one (`replace_closed_segment`).
_STRAY_SUFFIXES = (".tmp", ".deleted", CLEANED_SUFFIX)
# A compacted copy of a run of closed segments, fsynced and named by the offsets it
# covers, [first, limit): once it exists it replaces them (`replace_closed_segments`),
# and opening the log finishes a replacement a crash interrupted.
SWAP_SUFFIX = ".swap"
_SWAP_NAME = re.compile(r"^(\d{20})\.(\d{20})\.swap$")
# Several swap files replacing one run (`replace_closed_segments_with`) are gathered in
# `<first>.<limit>.swaps-pending/`, which one rename makes `<first>.<limit>.swaps/`: the
# commit point. `open` removes a pending one and finishes a committed one.
_SWAP_DIR_NAME = re.compile(r"^(\d{20})\.(\d{20})\.swaps$")
_PENDING_SWAP_DIR_NAME = re.compile(r"^\d{20}\.\d{20}\.swaps-pending$")


_TOPIC_CONFIG_FIELDS = {
    "segment.bytes": "segment_bytes",
    "segment.ms": "segment_ms",
    "retention.ms": "retention_ms",
    "retention.bytes": "retention_bytes",
    "index.interval.bytes": "index_interval_bytes",
    "max.message.bytes": "max_message_bytes",
}


@dataclass(slots=True)
class LogConfig:
    """Per-log settings, named after Kafka's topic configs, with Kafka's defaults."""

    segment_bytes: int = 1073741824  # segment.bytes
    segment_ms: int = 604800000  # segment.ms
    retention_ms: int = 604800000  # retention.ms; -1 keeps data forever
    retention_bytes: int = -1  # retention.bytes; -1 = no size limit
    index_interval_bytes: int = 4096  # index.interval.bytes
    max_message_bytes: int = 1048588  # max.message.bytes

    @classmethod
    def from_topic_configs(cls, configs: Mapping[str, str | int]) -> LogConfig:
        """Build from Kafka-named keys (`segment.bytes`, ...); unrelated keys are ignored."""
        values = {
            field: int(configs[key])
            for key, field in _TOPIC_CONFIG_FIELDS.items()
            if key in configs
        }
        return cls(**values)


@dataclass(frozen=True, slots=True)
class AppendResult:
    """What an append assigned, as Kafka's LogAppendInfo reports it."""

    first_offset: int
    last_offset: int
    max_timestamp: int
    # Last offset of the batch that first reached max_timestamp (Kafka's shallow offset); -1 if
    # no batch carried a timestamp.
    offset_of_max_timestamp: int
    log_start_offset: int
    batch_count: int
    size_bytes: int


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_checkpoint(path: Path) -> int | None:
    try:
        lines = path.read_text().split()
    except FileNotFoundError:
        return None
    if len(lines) != 2 or lines[0] != str(_CHECKPOINT_VERSION) or not lines[1].isdigit():
        log.warning("checkpoint_unreadable", path=str(path))
        return None
    return int(lines[1])


def _write_checkpoint(path: Path, value: int) -> None:
    """Replace the file atomically: write a temp file, fsync it, rename, fsync the directory."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, f"{_CHECKPOINT_VERSION}\n{value}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    _fsync_directory(path.parent)


def commit_segment_swaps(directory: Path, limit: int, outputs: Sequence[tuple[int, Path]]) -> None:
    """Commit new segments for the run [outputs[0] base, limit) of `directory`'s log:
    hard-link each file as `<base>.<next base>.swap` into `<first>.<limit>.swaps-pending/`,
    fsync it, then rename it to `<first>.<limit>.swaps/` (the commit point). Opening the
    log (`PartitionLog._finish_swaps`) completes it; `replace_closed_segments_with`
    does so at once. The old segments are still there when this returns."""
    first = outputs[0][0]
    name = f"{first:020d}.{limit:020d}"
    pending = directory / f"{name}.swaps-pending"
    if pending.exists():
        shutil.rmtree(pending)
    pending.mkdir()
    ends = [base for base, _ in outputs[1:]] + [limit]
    for (base, path), end in zip(outputs, ends, strict=True):
        os.link(path, pending / f"{base:020d}.{end:020d}{SWAP_SUFFIX}")
    _fsync_directory(pending)
    _fsync_directory(directory)
    os.replace(pending, directory / f"{name}.swaps")
    _fsync_directory(directory)


def _offset_out_of_range(offset: int, log_start: int, log_end: int, directory: Path) -> KafkaError:
    return KafkaError(
        ErrorCode.offset_out_of_range,
        f"offset {offset} is outside the log {directory.name}: "
        f"log start offset {log_start}, log end offset {log_end}",
    )


class PartitionLog:
    """A directory of segments with offsets assigned on append; see the module docstring."""

    def __init__(self, directory: Path, config: LogConfig, segments: list[LogSegment]) -> None:
        self._directory = directory
        self.config = config
        self._segments = segments
        self._base_offsets = [segment.base_offset for segment in segments]
        self._log_start_offset = segments[0].base_offset
        self._closed = False
        # Guards what the flush thread reads: the active segment, the segments waiting
        # for an fsync, those the running flush holds, and the dirty flags.
        self._lock = threading.Lock()
        # Serialises flushes with each other and with close/delete.
        self._flush_lock = threading.Lock()
        self._unflushed: list[LogSegment] = []
        self._flushing: list[LogSegment] = []
        self._directory_dirty = False
        self._parent_directory_dirty = False
        self._persisted_log_start_offset: int | None = None
        self._persisted_recovery_point: int | None = None
        # Segments recovered at open: their transaction index is rebuilt by
        # `load_producer_state`, which replays the transactions they end.
        self._txn_index_rebuild: set[int] = set()
        # Snapshotted at each roll and clean close once attached (load_producer_state).
        self._producers: ProducerStateManager | None = None

    # ----------------------------------------------------------------- opening

    @classmethod
    def open(cls, directory: Path, config: LogConfig, now_ms: int) -> PartitionLog:
        """Create the log directory, or load it and recover what a crash may have torn."""
        directory = Path(directory)
        created = not directory.exists()
        directory.mkdir(parents=True, exist_ok=True)
        clean_marker = directory / CLEAN_SHUTDOWN_FILE
        clean = clean_marker.exists()
        log_start_checkpoint = _read_checkpoint(directory / LOG_START_OFFSET_CHECKPOINT)
        recovery_point = _read_checkpoint(directory / RECOVERY_POINT_CHECKPOINT)

        base_offsets = cls._scan_directory(directory)
        segments: list[LogSegment] = []
        recovered: list[LogSegment] = []
        directory_dirty = created
        try:
            for i, base_offset in enumerate(base_offsets):
                is_last = i == len(base_offsets) - 1
                trusted = clean or (
                    recovery_point is not None and base_offset < recovery_point and not is_last
                )
                segment, was_recovered, truncated = LogSegment.load(
                    directory,
                    base_offset,
                    now_ms,
                    trusted=trusted,
                    index_interval_bytes=config.index_interval_bytes,
                )
                segments.append(segment)
                if was_recovered:
                    recovered.append(segment)
                if truncated:
                    log.warning(
                        "log_truncated_torn_tail",
                        directory=str(directory),
                        base_offset=base_offset,
                        truncated_bytes=truncated,
                        log_end_offset=segment.next_offset,
                    )
                    # Kafka's LogLoader: nothing after a torn batch can be trusted.
                    for later in base_offsets[i + 1 :]:
                        for suffix in SEGMENT_SUFFIXES:
                            (directory / f"{later:020d}{suffix}").unlink(missing_ok=True)
                        directory_dirty = True
                    break
            if not segments:
                segments.append(LogSegment.create(directory, log_start_checkpoint or 0, now_ms))
                directory_dirty = True
        except BaseException:
            for segment in segments:
                segment.close()
            raise

        partition_log = cls(directory, config, segments)
        partition_log._persisted_log_start_offset = log_start_checkpoint
        partition_log._persisted_recovery_point = recovery_point
        partition_log._directory_dirty = directory_dirty
        partition_log._parent_directory_dirty = created
        # Recovered segments may hold truncations and rebuilt indexes not yet on disk.
        partition_log._unflushed = [s for s in recovered if s is not partition_log._active]
        partition_log._txn_index_rebuild = {s.base_offset for s in recovered}
        log_start = max(log_start_checkpoint or 0, segments[0].base_offset)
        if log_start > partition_log.log_end_offset:
            # The checkpoint is ahead of the data (the data was lost): start empty there.
            partition_log._truncate_fully_and_start_at(log_start, now_ms)
        partition_log._log_start_offset = log_start
        if clean:
            clean_marker.unlink()
            # A later crash must not find a stale marker and skip recovery.
            _fsync_directory(directory)
        log.info(
            "log_loaded",
            directory=str(directory),
            clean_shutdown=clean,
            segments=len(partition_log._segments),
            recovered_segments=len(recovered),
            log_start_offset=partition_log.log_start_offset,
            log_end_offset=partition_log.log_end_offset,
        )
        return partition_log

    @staticmethod
    def _scan_directory(directory: Path) -> list[int]:
        """Sorted base offsets of the `.log` files; removes leftovers of interrupted work."""
        PartitionLog._finish_swaps(directory)
        names = os.listdir(directory)
        base_offsets: set[int] = set()
        for name in names:
            stem, dot, suffix = name.partition(".")
            if any(name.endswith(s) for s in _STRAY_SUFFIXES):
                (directory / name).unlink(missing_ok=True)
            elif f".{suffix}" == LOG_SUFFIX and len(stem) == 20 and stem.isdigit() and dot:
                base_offsets.add(int(stem))
        for name in names:
            stem, _, suffix = name.partition(".")
            orphan_index = f".{suffix}" in SEGMENT_SUFFIXES[1:]
            if orphan_index and stem.isdigit() and int(stem) not in base_offsets:
                # An index whose log was deleted before a crash finished the job.
                (directory / name).unlink(missing_ok=True)
        return sorted(base_offsets)

    @staticmethod
    def _finish_swaps(directory: Path) -> None:
        """Complete a `replace_closed_segments` a crash interrupted: the swap file is whole
        (it was fsynced before it got its name), so the segments it covers go and it
        takes the first one's place. A committed `.swaps/` directory first hands its swap
        files to the log directory; a pending one is dropped (the old segments stay)."""
        for name in sorted(os.listdir(directory)):
            if _PENDING_SWAP_DIR_NAME.match(name):
                shutil.rmtree(directory / name)
                log.warning("segment_swap_discarded", directory=str(directory), swap=name)
            elif _SWAP_DIR_NAME.match(name):
                for swap in os.listdir(directory / name):
                    os.replace(directory / name / swap, directory / swap)
                _fsync_directory(directory)
                os.rmdir(directory / name)
                _fsync_directory(directory)
        for name in sorted(os.listdir(directory)):
            match = _SWAP_NAME.match(name)
            if match is None:
                continue
            first, limit = int(match.group(1)), int(match.group(2))
            for other in os.listdir(directory):
                stem, _, suffix = other.partition(".")
                if (
                    f".{suffix}" in SEGMENT_SUFFIXES
                    and len(stem) == 20
                    and stem.isdigit()
                    and first <= int(stem) < limit
                ):
                    (directory / other).unlink()
            os.replace(directory / name, directory / f"{first:020d}{LOG_SUFFIX}")
            _fsync_directory(directory)
            log.warning(
                "segment_swap_completed", directory=str(directory), first=first, limit=limit
            )

    # -------------------------------------------------------------- properties

    @property
    def directory(self) -> Path:
        return self._directory

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def log_end_offset(self) -> int:
        """The offset the next appended record gets."""
        return self._active.next_offset

    @property
    def size_bytes(self) -> int:
        return sum(segment.size for segment in self._segments)

    @property
    def segment_base_offsets(self) -> list[int]:
        return list(self._base_offsets)

    @property
    def closed_segment_base_offsets(self) -> list[int]:
        """Base offsets of the segments no longer written to (all but the active one)."""
        return self._base_offsets[:-1]

    @property
    def _active(self) -> LogSegment:
        return self._segments[-1]

    # ------------------------------------------------------------------ append

    def append(self, data: bytearray | memoryview, now_ms: int) -> AppendResult:
        """Assign offsets to already validated v2 batches and write them (no fsync).

        Rewrites each batch's base offset in `data` in place; offsets continue from the
        log end offset. The data is durable once a later `flush()` has run.
        """
        self._check_open()
        batches = self._split_batches(data)
        return self._append(data, batches, now_ms, assign_offsets=True)

    def append_raw(self, data: bytearray | memoryview, now_ms: int) -> AppendResult:
        """Append batches keeping their offsets (which must be at or past the log end)."""
        self._check_open()
        batches = self._split_batches(data)
        if batches[0][1].base_offset < self.log_end_offset:
            raise KafkaError(
                ErrorCode.invalid_request,
                f"batch base offset {batches[0][1].base_offset} is below the log end offset "
                f"{self.log_end_offset}",
            )
        return self._append(data, batches, now_ms, assign_offsets=False)

    def _split_batches(self, data: bytearray | memoryview) -> list[tuple[int, BatchHeader]]:
        batches: list[tuple[int, BatchHeader]] = []
        pos = 0
        while pos < len(data):
            header = parse_header(data, pos)
            if pos + header.size > len(data):
                raise CorruptRecordError(
                    f"record batch at byte {pos} claims {header.size} bytes but only "
                    f"{len(data) - pos} remain"
                )
            if header.size > self.config.max_message_bytes:
                raise KafkaError(
                    ErrorCode.message_too_large,
                    f"record batch of {header.size} bytes exceeds max.message.bytes "
                    f"({self.config.max_message_bytes})",
                )
            batches.append((pos, header))
            pos += header.size
        if not batches:
            raise KafkaError(ErrorCode.invalid_request, "no record batches to append")
        if len(data) > self.config.segment_bytes:
            raise KafkaError(
                ErrorCode.record_list_too_large,
                f"{len(data)} bytes of record batches exceed segment.bytes "
                f"({self.config.segment_bytes})",
            )
        return batches

    def _append(
        self,
        data: bytearray | memoryview,
        batches: list[tuple[int, BatchHeader]],
        now_ms: int,
        *,
        assign_offsets: bool,
    ) -> AppendResult:
        next_offset = self.log_end_offset
        placed: list[tuple[int, BatchHeader]] = []
        max_timestamp, offset_of_max_timestamp = NO_TIMESTAMP, -1
        for pos, header in batches:
            if assign_offsets:
                header = dataclasses.replace(header, base_offset=next_offset)
            elif header.base_offset < next_offset:
                raise KafkaError(
                    ErrorCode.invalid_request, f"batch offsets go backwards at byte {pos}"
                )
            placed.append((pos, header))
            next_offset = header.next_offset
            if header.max_timestamp > max_timestamp:
                max_timestamp, offset_of_max_timestamp = header.max_timestamp, header.last_offset

        first_offset = placed[0][1].base_offset
        last_offset = placed[-1][1].last_offset
        try:
            if self._should_roll(len(data), max_timestamp, last_offset, now_ms):
                self._roll(now_ms, first_offset if not assign_offsets else None)
            if assign_offsets:
                for pos, header in placed:
                    set_base_offset(data, pos, header.base_offset)
            self._active.append(data, placed, now_ms, self.config.index_interval_bytes)
        except OSError as exc:
            raise KafkaError(
                ErrorCode.kafka_storage_error, f"write to {self._directory.name} failed: {exc}"
            ) from exc
        return AppendResult(
            first_offset=first_offset,
            last_offset=last_offset,
            max_timestamp=max_timestamp,
            offset_of_max_timestamp=offset_of_max_timestamp,
            log_start_offset=self._log_start_offset,
            batch_count=len(placed),
            size_bytes=len(data),
        )

    def _should_roll(
        self, append_size: int, max_timestamp_in_append: int, last_offset: int, now_ms: int
    ) -> bool:
        """Kafka's LogSegment.shouldRoll (without segment.jitter.ms or index-full checks)."""
        active = self._active
        if active.size == 0:
            return False
        return (
            active.size > self.config.segment_bytes - append_size
            or active.time_waited_for_roll(now_ms, max_timestamp_in_append) > self.config.segment_ms
            or last_offset - active.base_offset > INT32_MAX
        )

    def _roll(self, now_ms: int, base_offset: int | None = None) -> None:
        old = self._active
        new_base = self.log_end_offset if base_offset is None else base_offset
        # The new segment first: if the disk refuses it, the old one stays active as it was.
        new = LogSegment.create(self._directory, new_base, now_ms)
        old.on_become_inactive()
        with self._lock:
            self._segments.append(new)
            self._base_offsets.append(new_base)
            self._unflushed.append(old)
            self._directory_dirty = True
        log.info(
            "segment_rolled",
            directory=str(self._directory),
            base_offset=new_base,
            previous_base_offset=old.base_offset,
            previous_size=old.size,
        )
        # Kafka's roll takes a producer snapshot at the new base: every batch below it
        # has been applied to the producer state by now.
        self._snapshot_producers(new_base)

    # -------------------------------------------------------------------- read

    def read(self, offset: int, max_bytes: int, *, max_offset: int | None = None) -> bytes:
        """Whole batches from the one containing `offset`, up to `max_bytes`.

        Stops before `max_offset` (exclusive, e.g. the high watermark; expected on a batch
        boundary) and returns at least one batch if one is available, even if larger than
        `max_bytes` (KIP-74). Offsets outside [log start, log end] raise OFFSET_OUT_OF_RANGE.
        """
        self._check_open()
        log_end = self.log_end_offset
        if offset < self._log_start_offset or offset > log_end:
            raise _offset_out_of_range(offset, self._log_start_offset, log_end, self._directory)
        if offset == log_end or (max_offset is not None and offset >= max_offset):
            return b""
        first = bisect.bisect_right(self._base_offsets, offset) - 1
        for segment in self._segments[max(first, 0) :]:
            # A segment can end below `offset` only if offsets have gaps (append_raw).
            data = segment.read(offset, max_bytes, max_offset)
            if data:
                return data
        return b""

    def iter_batch_headers(self, start_offset: int = 0) -> Iterator[BatchHeader]:
        """Headers of all batches from the one holding max(start_offset, log start) on.

        For rebuilding state on startup; do not append while iterating.
        """
        start = max(start_offset, self._log_start_offset)
        first = max(bisect.bisect_right(self._base_offsets, start) - 1, 0)
        for segment in list(self._segments[first:]):
            yield from segment.batches(start)

    def load_producer_state(self, producers: ProducerStateManager) -> None:
        """Load the newest usable producer snapshot into `producers` and replay every
        batch after it (or from the log start) and refill the transaction index of each
        segment recovered at open with the aborts it holds. Everything on disk counts as
        durable, so no ended transaction is left waiting for the high watermark. From
        now on `producers` is snapshotted at each roll and at a clean close."""
        self._check_open()
        producers.clear()
        self._producers = producers
        start = self._load_producer_snapshot(producers)
        first = max(bisect.bisect_right(self._base_offsets, start) - 1, 0)
        for segment in list(self._segments[first:]):
            rebuild = segment.base_offset in self._txn_index_rebuild
            for header, marker in segment.replay(start):
                if header.is_control and marker is None:
                    continue  # an empty control batch or not a transaction marker
                completed = producers.update(header, header.max_timestamp, marker)
                if rebuild and completed is not None and completed.aborted:
                    segment.txn_index.append(
                        AbortedTxn(
                            completed.producer_id,
                            completed.first_offset,
                            completed.last_offset,
                            producers.last_stable_offset(completed),
                        )
                    )
        self._txn_index_rebuild.clear()
        producers.on_high_watermark(self.log_end_offset)

    def rebuild_txn_index_from(self, offset: int) -> None:
        """Forget the transaction index of the segments from the one holding `offset` on,
        for the next `load_producer_state` to rebuild from their batches: what
        `append_raw` added (a log restored from another copy) indexed no aborts."""
        self._check_open()
        first = max(bisect.bisect_right(self._base_offsets, offset) - 1, 0)
        for segment in self._segments[first:]:
            segment.txn_index.reset()
            self._txn_index_rebuild.add(segment.base_offset)

    def _load_producer_snapshot(self, producers: ProducerStateManager) -> int:
        """Load the newest snapshot usable for this log into `producers`; return where
        the scan starts. A snapshot must lie within [log start, log end] and not above a
        segment recovered at open (whose transaction index the scan refills); a torn
        or damaged one is skipped for an older one, or the log start."""
        limit = min(self._txn_index_rebuild, default=self.log_end_offset)
        for offset in reversed(producer_snapshot_offsets(self._directory)):
            if offset > limit or offset < self._log_start_offset:
                continue
            path = producer_snapshot_path(self._directory, offset)
            try:
                producers.load_snapshot(path.read_bytes())
            except (OSError, ValueError) as exc:
                log.warning("producer_snapshot_ignored", path=str(path), reason=str(exc))
                continue
            if self._log_start_offset > 0:
                producers.truncate_below(self._log_start_offset)
            log.info("producer_snapshot_loaded", directory=str(self._directory), offset=offset)
            return offset
        return self._log_start_offset

    def _snapshot_producers(self, offset: int) -> None:
        """Write the producer state as of `offset`; a failure only costs a longer scan."""
        if self._producers is None:
            return
        try:
            write_producer_snapshot(self._directory, offset, self._producers.snapshot_bytes())
        except OSError as exc:
            log.warning("producer_snapshot_failed", directory=str(self._directory), error=repr(exc))

    def append_aborted_txn(self, entry: AbortedTxn) -> None:
        """Index an aborted transaction in the segment holding its marker (no fsync: the
        next `flush()` covers it). Raises KafkaError(KAFKA_STORAGE_ERROR) if the disk
        refuses."""
        self._check_open()
        slot = max(bisect.bisect_right(self._base_offsets, entry.last_offset) - 1, 0)
        segment = self._segments[slot]
        created = not segment.txn_index.entries and not segment.txn_index.path.exists()
        try:
            segment.txn_index.append(entry)
        except OSError as exc:
            raise KafkaError(
                ErrorCode.kafka_storage_error,
                f"write to the transaction index of {self._directory.name} failed: {exc}",
            ) from exc
        with self._lock:
            if created:
                self._directory_dirty = True
            if segment is not self._active and all(s is not segment for s in self._unflushed):
                self._unflushed.append(segment)

    def aborted_transactions(self, fetch_offset: int, upper_bound: int) -> list[AbortedTxn]:
        """Aborted transactions overlapping [fetch_offset, upper_bound): those whose marker
        is at or after `fetch_offset` and which began below `upper_bound` (Kafka's
        collectAbortedTransactions, segment by segment until an entry's LSO reaches the
        bound)."""
        found: list[AbortedTxn] = []
        first = max(bisect.bisect_right(self._base_offsets, fetch_offset) - 1, 0)
        for segment in self._segments[first:]:
            entries, complete = segment.txn_index.collect(fetch_offset, upper_bound)
            found.extend(entries)
            if complete:
                break
        return found

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """(base offset, max timestamp) of the first batch whose max timestamp >= timestamp_ms.

        Batch granularity, as the time index is; the caller refines to the record. The
        batch may begin below the log start offset when DeleteRecords cut inside it.
        """
        for segment in self._segments:
            if segment.max_timestamp >= timestamp_ms:
                found = segment.find_by_timestamp(timestamp_ms, self._log_start_offset)
                if found is not None:
                    return found
        return None

    def max_timestamp_offset(self) -> tuple[int, int] | None:
        """(base offset, timestamp) of the batch holding the largest timestamp (ListOffsets -3)."""
        best: LogSegment | None = None
        for segment in self._segments:
            if segment.max_timestamp >= 0 and (
                best is None or segment.max_timestamp > best.max_timestamp
            ):
                best = segment
        if best is None:
            return None
        found = best.translate_offset(best.offset_of_max_timestamp)
        if found is None:
            return None
        return found[1].base_offset, best.max_timestamp

    # --------------------------------------------------------------- deletion

    def delete_records_before(self, offset: int) -> int:
        """Move the log start offset up to `offset` (DeleteRecords); return the new one.

        Whole segments below it are deleted now; the new start offset is checkpointed by
        the next `flush()`.
        """
        self._check_open()
        if offset < 0 or offset > self.log_end_offset:
            raise _offset_out_of_range(
                offset, self._log_start_offset, self.log_end_offset, self._directory
            )
        if offset > self._log_start_offset:
            with self._lock:
                self._log_start_offset = offset
            log.info("log_start_offset_moved", directory=str(self._directory), offset=offset)
            self._delete_segments_below_log_start()
        return self._log_start_offset

    def enforce_retention(self, now_ms: int) -> int:
        """Delete segments past retention.ms or over retention.bytes; return how many."""
        self._check_open()
        deleted = 0
        retention_ms = self.config.retention_ms
        if retention_ms >= 0:
            deleted += self._delete_oldest_segments(
                lambda segment: now_ms - segment.largest_timestamp() > retention_ms,
                now_ms,
                reason="retention_ms",
            )
        retention_bytes = self.config.retention_bytes
        if retention_bytes >= 0 and self.size_bytes > retention_bytes:
            excess = self.size_bytes - retention_bytes

            def over_size(segment: LogSegment) -> bool:
                nonlocal excess
                if excess - segment.size < 0:
                    return False
                excess -= segment.size
                return True

            deleted += self._delete_oldest_segments(over_size, now_ms, reason="retention_bytes")
        deleted += self._delete_segments_below_log_start()
        return deleted

    def _delete_oldest_segments(
        self, deletable: Callable[[LogSegment], bool], now_ms: int, *, reason: str
    ) -> int:
        """Kafka's deleteOldSegments: a prefix of segments matching `deletable`.

        The active segment counts too when it is not empty; Kafka then rolls first, so the
        log keeps an (empty) active segment at the log end offset.
        """
        doomed: list[LogSegment] = []
        for segment in self._segments:
            if segment is self._active and segment.size == 0:
                break
            if not deletable(segment):
                break
            doomed.append(segment)
        if not doomed:
            return 0
        if len(doomed) == len(self._segments):
            self._roll(now_ms)
        for segment in doomed:
            self._delete_segment(segment, reason)
        with self._lock:
            self._log_start_offset = max(self._log_start_offset, self._segments[0].base_offset)
        return len(doomed)

    def _delete_segments_below_log_start(self) -> int:
        deleted = 0
        while len(self._segments) > 1 and self._segments[1].base_offset <= self._log_start_offset:
            self._delete_segment(self._segments[0], "log_start_offset")
            deleted += 1
        return deleted

    def _delete_segment(self, segment: LogSegment, reason: str) -> None:
        assert segment is self._segments[0] and segment is not self._active
        self._segments.pop(0)
        self._base_offsets.pop(0)
        with self._lock:
            self._unflushed = [s for s in self._unflushed if s is not segment]
            in_flush = any(s is segment for s in self._flushing)
            if in_flush:
                segment.deleted = True
            self._directory_dirty = True
        segment.unlink()
        if not in_flush:
            segment.close()
        log.info(
            "segment_deleted",
            directory=str(self._directory),
            base_offset=segment.base_offset,
            size=segment.size,
            reason=reason,
        )

    def _truncate_fully_and_start_at(self, offset: int, now_ms: int) -> None:
        delete_producer_snapshots_after(self._directory, -1)
        for segment in self._segments:
            segment.unlink()
            segment.close()
        self._segments = [LogSegment.create(self._directory, offset, now_ms)]
        self._base_offsets = [offset]
        self._unflushed = []
        self._directory_dirty = True

    def truncate_to(self, offset: int) -> int:
        """Remove every batch from `offset` (a batch boundary) on; return the bytes removed.

        For undoing a write whose append or fsync failed: the log end offset goes back to
        `offset`, segments starting at or after it are deleted, the one holding it is cut
        and its indexes follow (Kafka's LocalLog.truncateTo). Waits for a running flush,
        so no fd it holds changes under it. Raises OSError if the disk refuses; the log's
        in-memory view may then be ahead of its files, and it must not be written again.
        """
        self._check_open()
        if offset < self._log_start_offset:
            raise _offset_out_of_range(
                offset, self._log_start_offset, self.log_end_offset, self._directory
            )
        # A snapshot above the cut describes batches that are gone.
        delete_producer_snapshots_after(self._directory, offset)
        with self._flush_lock:
            removed: list[LogSegment] = []
            while len(self._segments) > 1 and self._segments[-1].base_offset >= offset:
                removed.append(self._segments.pop())
                self._base_offsets.pop()
            target = self._segments[-1]
            removed_bytes = target.truncate_to(offset)
            with self._lock:
                gone = [target, *removed]
                self._unflushed = [s for s in self._unflushed if all(s is not g for g in gone)]
                self._directory_dirty |= bool(removed)
            for segment in removed:
                removed_bytes += segment.size
                segment.unlink()
                segment.close()
            if removed:
                _fsync_directory(self._directory)
            if (
                self._persisted_recovery_point is not None
                and self._persisted_recovery_point > target.base_offset
            ):
                # The checkpoint names a segment that is gone: a crash now must not trust
                # the cut segment once it is no longer the last one.
                _write_checkpoint(self._directory / RECOVERY_POINT_CHECKPOINT, target.base_offset)
                self._persisted_recovery_point = target.base_offset
        log.warning(
            "log_truncated",
            directory=str(self._directory),
            offset=offset,
            log_end_offset=self.log_end_offset,
            removed_bytes=removed_bytes,
            removed_segments=len(removed),
        )
        return removed_bytes

    # -------------------------------------------------------------- compaction

    def replace_closed_segments(
        self, base_offsets: Sequence[int], cleaned: Path, now_ms: int
    ) -> None:
        """Replace a run of consecutive closed segments by one: `cleaned`, a compacted copy
        of all of them, becomes the first one's `.log` and the others are deleted.

        `cleaned` must be in the log directory and already fsynced; its batches must be
        valid and lie in the run's offset range (checked before anything changes). It is
        first renamed to `<first>.<limit>.swap` (the range it covers), then the old files
        go, then it takes the first segment's name; a crash in between leaves the swap
        file, which `open` uses to finish the job, so replay sees either the old segments
        or the new one.
        """
        self._check_open()
        slot, last_slot, limit = self._closed_run(base_offsets)
        first = base_offsets[0]
        self._check_cleaned(cleaned, first, limit)
        swap = self._directory / f"{first:020d}.{limit:020d}{SWAP_SUFFIX}"
        os.replace(cleaned, swap)
        _fsync_directory(self._directory)
        for segment in self._segments[slot : last_slot + 1]:
            segment.unlink()
        os.replace(swap, self._directory / f"{first:020d}{LOG_SUFFIX}")
        _fsync_directory(self._directory)
        self._install(slot, last_slot, [first], now_ms)

    def replace_closed_segments_with(
        self, base_offsets: Sequence[int], outputs: Sequence[tuple[int, Path]], now_ms: int
    ) -> None:
        """Replace a run of consecutive closed segments by several new ones: `outputs`
        are (base offset, fsynced file in the log directory), increasing, the first at
        the run's first base offset; file i holds offsets below base i+1 (or the run's
        limit). The files stay where they are (hard links are made).

        Crash-safe as one step: `commit_segment_swaps` gathers the swap files in a
        pending directory and one rename commits them all; `open` finishes a committed
        swap or drops a pending one, so replay sees the old run or the new one.
        """
        self._check_open()
        slot, last_slot, limit = self._closed_run(base_offsets)
        bases = [base for base, _ in outputs]
        if not bases or bases[0] != base_offsets[0] or bases != sorted(set(bases)):
            raise ValueError(f"new segments {bases} do not start the run {list(base_offsets)}")
        for (base, path), end in zip(outputs, [*bases[1:], limit], strict=True):
            self._check_cleaned(path, base, end)
        commit_segment_swaps(self._directory, limit, outputs)
        self._finish_swaps(self._directory)
        self._install(slot, last_slot, bases, now_ms)

    def _closed_run(self, base_offsets: Sequence[int]) -> tuple[int, int, int]:
        """(first slot, last slot, limit offset) of a run of closed segments."""
        if not base_offsets:
            raise ValueError("no segments to replace")
        slot = bisect.bisect_left(self._base_offsets, base_offsets[0])
        last_slot = slot + len(base_offsets) - 1
        if last_slot >= len(self._segments) - 1 or self._base_offsets[slot : last_slot + 1] != list(
            base_offsets
        ):
            raise KafkaError(
                ErrorCode.invalid_request,
                f"{self._directory.name} has no run of closed segments {list(base_offsets)}",
            )
        return slot, last_slot, self._base_offsets[last_slot + 1]

    def _install(self, slot: int, last_slot: int, bases: Sequence[int], now_ms: int) -> None:
        """Put the segments now on disk at `bases` in place of slots [slot, last_slot]
        (whose files are gone) and close the old ones."""
        old = self._segments[slot : last_slot + 1]
        new = [self._load_closed_segment(base, now_ms) for base in bases]
        with self._lock:
            self._segments[slot : last_slot + 1] = new
            self._base_offsets[slot : last_slot + 1] = list(bases)
            self._unflushed = [s for s in self._unflushed if all(s is not o for o in old)]
            # The new indexes are not fsynced yet: the next flush does it.
            self._unflushed.extend(new)
            in_flush = [o for o in old if any(s is o for s in self._flushing)]
            for segment in in_flush:
                segment.deleted = True
            self._directory_dirty = True
        for segment in old:
            if all(segment is not s for s in in_flush):
                segment.close()
        log.info(
            "segments_replaced",
            directory=str(self._directory),
            base_offsets=[o.base_offset for o in old],
            new_base_offsets=list(bases),
            previous_size=sum(s.size for s in old),
            size=sum(s.size for s in new),
        )

    def _check_cleaned(self, cleaned: Path, first: int, limit: int) -> None:
        fd = os.open(cleaned, os.O_RDONLY)
        try:
            for pos, header in scan_batches(fd, 0, os.fstat(fd).st_size, validate=True):
                if header.base_offset < first or header.last_offset >= limit:
                    raise CorruptRecordError(
                        f"compacted segment {cleaned.name}: batch at byte {pos} holds offsets "
                        f"{header.base_offset}-{header.last_offset}, outside the segment's "
                        f"{first}-{limit - 1}"
                    )
        finally:
            os.close(fd)

    def _load_closed_segment(self, base_offset: int, now_ms: int) -> LogSegment:
        """Open a rewritten closed segment, rebuilding its indexes from its batches."""
        segment, _, _ = LogSegment.load(
            self._directory,
            base_offset,
            now_ms,
            trusted=False,
            index_interval_bytes=self.config.index_interval_bytes,
        )
        segment.on_become_inactive()
        return segment

    def replace_closed_segment(self, base_offset: int, cleaned: Path, now_ms: int) -> None:
        """Swap the `.log` of a closed segment for `cleaned` (a compacted copy) and rebuild
        its indexes.

        `cleaned` must be in the log directory and already fsynced; its batches must be
        valid and lie in the segment's offset range (checked before anything changes).
        The swap is one rename, so a crash leaves the old file or the new one; the old
        indexes are removed before it, so the next open rebuilds them from whichever file
        it finds, and a leftover `*.cleaned` is removed on open.
        """
        self._check_open()
        slot = bisect.bisect_left(self._base_offsets, base_offset)
        if slot >= len(self._segments) - 1 or self._base_offsets[slot] != base_offset:
            raise KafkaError(
                ErrorCode.invalid_request,
                f"{self._directory.name} has no closed segment with base offset {base_offset}",
            )
        old = self._segments[slot]
        limit = self._base_offsets[slot + 1]
        self._check_cleaned(cleaned, base_offset, limit)
        for suffix in SEGMENT_SUFFIXES[1:]:
            old.path(suffix).unlink(missing_ok=True)
        os.replace(cleaned, old.path(LOG_SUFFIX))
        _fsync_directory(self._directory)
        new = self._load_closed_segment(base_offset, now_ms)
        with self._lock:
            self._segments[slot] = new
            # The new indexes are not fsynced yet: the next flush does it.
            self._unflushed = [s for s in self._unflushed if s is not old]
            self._unflushed.append(new)
            in_flush = any(s is old for s in self._flushing)
            if in_flush:
                old.deleted = True
            self._directory_dirty = True
        if not in_flush:
            old.close()
        log.info(
            "segment_replaced",
            directory=str(self._directory),
            base_offset=base_offset,
            previous_size=old.size,
            size=new.size,
        )

    # -------------------------------------------------------------- durability

    def flush(self) -> None:
        """fsync everything written so far. Blocking: call it from a worker thread.

        Covers the active segment's `.log`, segments rolled or recovered since the last
        flush with their indexes, the directory entries of created/deleted segments, and
        the log-start and recovery-point checkpoints. The active segment's indexes are
        left to the page cache: the recovery point never passes the active segment, so
        an unclean start rebuilds them from its log (`close` flushes them for a clean one).
        """
        self._flush(active_indexes=False)

    def _flush(self, *, active_indexes: bool) -> None:
        with self._flush_lock:
            if self._closed:
                return
            with self._lock:
                rolled, self._unflushed = self._unflushed, []
                active = self._active
                self._flushing = [*rolled, active]
                directory_dirty, self._directory_dirty = self._directory_dirty, False
                parent_dirty, self._parent_directory_dirty = self._parent_directory_dirty, False
                log_start = self._log_start_offset
            recovery_point = active.base_offset
            done = False
            try:
                for segment in rolled:
                    segment.fsync()
                if active_indexes:
                    active.fsync()
                else:
                    active.fsync_log()
                if directory_dirty:
                    _fsync_directory(self._directory)
                if parent_dirty:
                    _fsync_directory(self._directory.parent)
                if recovery_point != self._persisted_recovery_point:
                    _write_checkpoint(self._directory / RECOVERY_POINT_CHECKPOINT, recovery_point)
                    self._persisted_recovery_point = recovery_point
                if log_start != self._persisted_log_start_offset:
                    _write_checkpoint(self._directory / LOG_START_OFFSET_CHECKPOINT, log_start)
                    self._persisted_log_start_offset = log_start
                done = True
            finally:
                with self._lock:
                    if not done:
                        # Try again next time; a failed fsync is the caller's to report.
                        self._unflushed[:0] = [s for s in rolled if not s.deleted]
                        self._directory_dirty |= directory_dirty
                        self._parent_directory_dirty |= parent_dirty
                    for segment in self._flushing:
                        if segment.deleted:
                            segment.close()
                        elif done and segment is not active:
                            segment.close_index_files()
                    self._flushing = []

    def close(self, clean: bool = True) -> None:
        """Close the files; `clean` flushes first and leaves the clean-shutdown marker."""
        if self._closed:
            return
        if clean:
            self._snapshot_producers(self.log_end_offset)
            self._active.on_become_inactive()
            # A clean start trusts every segment's indexes, the active one's too.
            self._flush(active_indexes=True)
        with self._flush_lock:
            self._closed = True
            for segment in self._segments:
                segment.close()
            self._unflushed = []
            if clean:
                os.close(
                    os.open(self._directory / CLEAN_SHUTDOWN_FILE, os.O_WRONLY | os.O_CREAT, 0o644)
                )
                _fsync_directory(self._directory)
        log.info("log_closed", directory=str(self._directory), clean=clean)

    def delete(self) -> None:
        """Close the log and remove its directory (topic deletion)."""
        self.close(clean=False)
        shutil.rmtree(self._directory, ignore_errors=True)
        log.info("log_deleted", directory=str(self._directory))

    def _check_open(self) -> None:
        if self._closed:
            raise KafkaError(ErrorCode.kafka_storage_error, f"log {self._directory.name} is closed")
