"""Compaction of the share-state log's closed segments.

Replay (coordinator.share_coordinator) makes a key's state after a ShareSnapshot depend
on that snapshot alone, and after a ShareTombstone on nothing (the key is gone). So, for
each key, everything before its last snapshot or tombstone in the closed segments can go:

- last reset is a snapshot: keep the snapshot and the updates after it;
- last reset is a tombstone: keep only what follows it (usually nothing: the key is gone);
- no snapshot or tombstone in the closed segments: keep everything.

Kept records keep their offsets and timestamps (batches are rebuilt with the original
base offset and absolute record offsets), so replaying the compacted log gives the same
state for every key as replaying the original. The active segment is never read or
written here, and replaying it after either version of the closed segments gives the same
result, since the per-key state at its start is the same.

Each rewritten segment goes through `<base>.log.cleaned`, written and fsynced, then
`PartitionLog.replace_closed_segment` renames it over the original. Segments are swapped
one at a time, oldest first, so after a crash the swapped ones are a prefix, and a prefix
of compacted segments followed by original ones replays the same: a key whose last reset
lies in the original part has nothing left in the compacted part and everything from that
reset on in the original part; one whose last reset lies in the compacted part has only
records after it in the original part. A crash anywhere therefore leaves a log whose
replay is unchanged, and the next run plans again from what it finds.

Blocking file I/O: run it where disk work may block (a worker, or between requests), and
do not append to the log while it runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from persister.file_log import CLEANED_SUFFIX, PartitionLog
from persister.files import write_synced
from persister.segment import LOG_SUFFIX, segment_file_name
from persister.share_records import (
    ShareKey,
    ShareRecord,
    ShareSnapshot,
    ShareTombstone,
    decode,
)
from protocol.records import (
    BatchHeader,
    Record,
    build_batch,
    decode_records,
    iter_batches,
)

log = structlog.get_logger(__name__)

_READ_CHUNK = 1024 * 1024


@dataclass(frozen=True, slots=True)
class CompactionPlan:
    """Per key, the offset of its last snapshot or tombstone in the closed segments."""

    base_offsets: list[int]
    last_reset: dict[ShareKey, tuple[int, bool]] = field(default_factory=dict)

    def keeps(self, offset: int, record: ShareRecord) -> bool:
        reset = self.last_reset.get(record.key)
        if reset is None:
            return True
        reset_offset, is_tombstone = reset
        return offset > reset_offset or (offset == reset_offset and not is_tombstone)


@dataclass(frozen=True, slots=True)
class CompactionResult:
    """What `compact_share_log` did: closed segments examined and rewritten, share records
    and bytes in them before and after, and keys whose last record there was a tombstone
    (their records are gone from the closed segments)."""

    segments_compacted: int
    segments_rewritten: int
    records_before: int
    records_after: int
    bytes_before: int
    bytes_after: int
    keys_dropped: int


def _segment_batches(path: Path) -> Iterator[tuple[bytes, int, BatchHeader]]:
    """(file contents, position, header) of each batch of a closed segment file."""
    data = path.read_bytes()
    for pos, header in iter_batches(data, validate=True):
        yield data, pos, header


def _decode_batch(
    data: bytes, pos: int, header: BatchHeader, path: Path
) -> list[tuple[Record, ShareRecord]]:
    result = []
    for record in decode_records(data, pos, header):
        if record.key is None:
            raise ValueError(
                f"{path.name}: record at offset {record.offset} has no key; it is not a "
                "share-state record"
            )
        try:
            result.append((record, decode(record.key, record.value)))
        except ValueError as exc:
            raise ValueError(f"{path.name}: record at offset {record.offset}: {exc}") from exc
    return result


def _segment_path(log_: PartitionLog, base_offset: int) -> Path:
    return log_.directory / segment_file_name(base_offset, LOG_SUFFIX)


def plan_share_compaction(log_: PartitionLog) -> CompactionPlan:
    """Read the closed segments and note each key's last snapshot or tombstone.

    Raises ValueError (CorruptRecordError for a bad batch) if a closed segment holds
    something that is not a valid share-state record; nothing is changed then.
    """
    plan = CompactionPlan(base_offsets=log_.closed_segment_base_offsets)
    for base_offset in plan.base_offsets:
        path = _segment_path(log_, base_offset)
        for data, pos, header in _segment_batches(path):
            if header.is_control:
                continue
            for record, share_record in _decode_batch(data, pos, header, path):
                if isinstance(share_record, ShareSnapshot | ShareTombstone):
                    plan.last_reset[share_record.key] = (
                        record.offset,
                        isinstance(share_record, ShareTombstone),
                    )
    return plan


@dataclass(slots=True)
class _SegmentOutcome:
    cleaned: Path | None
    records_before: int = 0
    records_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0


def write_cleaned_segment(
    log_: PartitionLog, base_offset: int, plan: CompactionPlan
) -> Path | None:
    """Write and fsync `<base>.log.cleaned` with what `plan` keeps of the segment.

    Returns its path, or None when the segment keeps every record (nothing to rewrite).
    """
    outcome = _write_cleaned(log_, base_offset, plan)
    return outcome.cleaned


def _write_cleaned(log_: PartitionLog, base_offset: int, plan: CompactionPlan) -> _SegmentOutcome:
    path = _segment_path(log_, base_offset)
    out = bytearray()
    outcome = _SegmentOutcome(cleaned=None)
    changed = False
    for data, pos, header in _segment_batches(path):
        raw = data[pos : pos + header.size]
        outcome.bytes_before += header.size
        if header.is_control:
            # Not share records (the share-state log has none today): kept as they are.
            out += raw
            continue
        decoded = _decode_batch(data, pos, header, path)
        kept = [record for record, share in decoded if plan.keeps(record.offset, share)]
        outcome.records_before += len(decoded)
        outcome.records_after += len(kept)
        if len(kept) == len(decoded):
            out += raw
        elif kept:
            changed = True
            out += build_batch(
                kept,
                base_offset=header.base_offset,
                compression=header.compression,
                log_append_time=header.max_timestamp if header.is_log_append_time else None,
                producer_id=header.producer_id,
                producer_epoch=header.producer_epoch,
                is_transactional=header.is_transactional,
                partition_leader_epoch=header.partition_leader_epoch,
            )
        else:
            changed = True
    outcome.bytes_after = len(out)
    if not changed:
        outcome.bytes_after = outcome.bytes_before
        return outcome
    cleaned = path.with_name(path.name + CLEANED_SUFFIX)
    write_synced(cleaned, out)
    outcome.cleaned = cleaned
    return outcome


def compact_share_log(log_: PartitionLog, now_ms: int) -> CompactionResult:
    """Compact every closed segment of the share-state log in place; see the module doc."""
    plan = plan_share_compaction(log_)
    records_before = records_after = bytes_before = bytes_after = rewritten = 0
    for base_offset in plan.base_offsets:
        outcome = _write_cleaned(log_, base_offset, plan)
        records_before += outcome.records_before
        records_after += outcome.records_after
        bytes_before += outcome.bytes_before
        bytes_after += outcome.bytes_after
        if outcome.cleaned is not None:
            log_.replace_closed_segment(base_offset, outcome.cleaned, now_ms)
            rewritten += 1
    result = CompactionResult(
        segments_compacted=len(plan.base_offsets),
        segments_rewritten=rewritten,
        records_before=records_before,
        records_after=records_after,
        bytes_before=bytes_before,
        bytes_after=bytes_after,
        keys_dropped=sum(1 for _, tombstone in plan.last_reset.values() if tombstone),
    )
    log.info(
        "share_log_compacted",
        directory=str(log_.directory),
        segments=result.segments_compacted,
        segments_rewritten=result.segments_rewritten,
        records_before=result.records_before,
        records_after=result.records_after,
        bytes_before=result.bytes_before,
        bytes_after=result.bytes_after,
    )
    return result


def read_share_records(
    log_: PartitionLog, start_offset: int = 0
) -> Iterator[tuple[int, ShareRecord]]:
    """(offset, record) of every share-state record in the log, in order (for replay).

    Raises ValueError on a record that is not a share-state record.
    """
    offset = max(start_offset, log_.log_start_offset)
    while offset < log_.log_end_offset:
        data = log_.read(offset, _READ_CHUNK)
        if not data:
            return
        for pos, header in iter_batches(data, validate=True):
            offset = header.next_offset
            if header.is_control:
                continue
            for record, share in _decode_batch(data, pos, header, log_.directory):
                if record.offset >= start_offset:
                    yield record.offset, share
