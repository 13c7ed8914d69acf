"""`spool audit`: check the share-state log (`DATA/share-state/`) with Spark.

The log is the whole durable truth of the share groups (KIP-932): Kafka's
`__share_group_state` records (ShareSnapshot, ShareUpdate, tombstones) that the share
coordinator replays on start. The audit reads a copy or a stopped broker's data dir and
checks, each as a named rule (and counts, per share partition, where its offsets
stand: `partition_stats`):

- `crc_and_framing`: every batch has whole framing and a matching CRC32C, every record
  is a share-state record. Read in the executors; a bad batch is a violation at its
  segment file and offset, never a crash, and the rest of the segment is read when the
  batch's length can be trusted (a CRC mismatch), not after a torn or garbled length.
- `replay_equivalent`: with a compaction staging dir (`share-state/compacted-*/` with a
  `manifest.json`), replaying its output plus the segments it did not cover gives every
  key the state that replaying the originals gives; without one, the full replay of
  each key equals its replay from its newest snapshot or tombstone, which is what any
  compaction keeps (persister.share_compaction).
- `state_epoch_monotonic`: per key in log order a snapshot's state epoch never goes
  back (a tombstone ends the key; a later initialize starts afresh, as in Kafka).
- `start_offset_monotonic`: the start offset moves back only where the state epoch
  changes (an admin reset, KIP-932's AlterShareGroupOffsets, writes a new epoch).
- `state_batches_ordered`: each record's state batches are valid ranges, in order,
  non-overlapping and at or above the start offset in force.
- `delivery_state_known`: 0 Available, 2 Acknowledged, 3 Archiving or 4 Archived, the
  only states Kafka persists (Acquired is never written; Archiving, KIP-1191, holds a
  record whose dead-letter copy is being written).
- `delivery_count_within_limit`: no count above the group's `share.delivery.count.limit`
  (a group override in the metadata log, or in the groups log of a spool from before
  group configs moved there and not yet adopted, else the dynamic broker default
  `group.share.delivery.count.limit` in the metadata log, else Kafka's default 5).
- `offsets_in_topic_log`: the topic id names a topic in the metadata log, and start
  offsets and state batches lie at or below its partition's log end offset.

The pure parts (scanning a segment's bytes, the per-key rules, the replay) take plain
values and are unit-tested without Spark; `run_audit` distributes them in one pass:
one task per segment file scans it and groups its records by share key, undecoded
(`scan_keys`); after the shuffle each key's records are decoded, replayed once and
checked (`check_group`), which also gives the records table its rows.
"""

from __future__ import annotations

import bisect
import json
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from persister import share_replay
from persister.dirlock import in_use
from persister.segment import LOG_SUFFIX
from persister.share_records import (
    ShareRecord,
    ShareSnapshot,
    ShareUpdate,
    StateBatch,
    decode,
)
from persister.spark import report
from persister.spark.findings import AuditResult, LogRecord, ShareKeyTuple, Violation
from persister.spark.pg import (
    SHARE_STATE_LOG,
    TABLE,
    LogRow,
    PgTarget,
    StorageUnavailable,
    add_source_arguments,
    batch_frame,
    count_rows,
    log_batches,
    source_target,
)
from persister.spark.pg import logs as pg_logs
from persister.spark.segments import (
    SNAPSHOT,
    TOMBSTONE,
    UPDATE,
    NotASpoolDataDir,
    job_session,
    share_state_dir,
)
from protocol.errors import CorruptRecordError
from protocol.records import (
    HEADER_SIZE,
    Record,
    _read_varint,
    compute_crc,
    decode_records,
    parse_header,
)

if TYPE_CHECKING:
    import argparse

    from pyspark.sql import SparkSession

# ------------------------------------------------------------------ rules

CRC_AND_FRAMING = "crc_and_framing"
REPLAY_EQUIVALENT = "replay_equivalent"
STATE_EPOCH_MONOTONIC = "state_epoch_monotonic"
START_OFFSET_MONOTONIC = "start_offset_monotonic"
STATE_BATCHES_ORDERED = "state_batches_ordered"
DELIVERY_STATE_KNOWN = "delivery_state_known"
DELIVERY_COUNT_WITHIN_LIMIT = "delivery_count_within_limit"
OFFSETS_IN_TOPIC_LOG = "offsets_in_topic_log"

RULES: dict[str, str] = {
    CRC_AND_FRAMING: "every batch is whole with a matching CRC32C; every record decodes",
    REPLAY_EQUIVALENT: "replaying the compacted log gives every key the same state",
    STATE_EPOCH_MONOTONIC: "a key's state epoch never goes back",
    START_OFFSET_MONOTONIC: "a start offset moves back only with a new state epoch",
    STATE_BATCHES_ORDERED: "state batches ordered, non-overlapping, at or above the start",
    DELIVERY_STATE_KNOWN: (
        "delivery states are 0 Available, 2 Acknowledged, 3 Archiving or 4 Archived"
    ),
    DELIVERY_COUNT_WITHIN_LIMIT: "delivery counts within share.delivery.count.limit",
    OFFSETS_IN_TOPIC_LOG: "offsets exist in the topic partition's log",
}

# What Kafka persists (PersisterStateBatch): Acquired (1) is in memory only; Archiving
# (3) is KIP-1191's: archived once the record's dead-letter copy is durable.
KNOWN_DELIVERY_STATES = {0: "Available", 2: "Acknowledged", 3: "Archiving", 4: "Archived"}
AVAILABLE, ACKNOWLEDGED, ARCHIVING, ARCHIVED = 0, 2, 3, 4
# The outcomes the summary totals over every share partition.
OUTCOME_TOTALS = ("accepted", "archived", "dead_lettered", "archiving")
# Kafka's group.share.delivery.count.limit default (KIP-932).
DEFAULT_DELIVERY_COUNT_LIMIT = 5
GROUP_LIMIT_KEY = "share.delivery.count.limit"
BROKER_LIMIT_KEY = "group.share.delivery.count.limit"
NO_OFFSET = -1

# Segment bytes per group of keys checked together: their records, as shuffled, stay
# well within a Python worker's memory.
_GROUP_BYTES = 16 * 1024 * 1024
# Where a record was read: the live log, or a compaction's output.
SOURCE_LOG, SOURCE_COMPACTED = "log", "compacted"


def _violation(rule: str, record: LogRecord, message: str) -> Violation:
    return Violation(
        rule,
        message,
        record.group_id,
        record.topic_id,
        record.partition,
        record.segment,
        record.offset,
        record.byte_position,
    )


# ------------------------------------------------------------------ scanning segments


def log_record(
    source: str, segment: str, byte_position: int, offset: int, share: ShareRecord
) -> LogRecord:
    """The row of one decoded record at its position."""
    key = share.key
    kind = TOMBSTONE
    snapshot_epoch = state_epoch = leader_epoch = start_offset = NO_OFFSET
    batches: tuple[StateBatch, ...] = ()
    if isinstance(share, ShareSnapshot):
        kind, state_epoch = SNAPSHOT, share.state_epoch
    if isinstance(share, ShareSnapshot | ShareUpdate):
        kind = kind if kind == SNAPSHOT else UPDATE
        snapshot_epoch, leader_epoch = share.snapshot_epoch, share.leader_epoch
        start_offset, batches = share.start_offset, share.batches
    return LogRecord(
        source,
        segment,
        byte_position,
        offset,
        kind,
        key.group_id,
        str(key.topic_id),
        key.partition,
        snapshot_epoch,
        state_epoch,
        leader_epoch,
        start_offset,
        batches,
        share,
    )


def _peek_key(data: bytes, pos: int) -> Any:
    """The share key of the first record of a damaged batch at `pos`, or None: a torn or
    garbled batch still usually names whose state it carried."""
    try:
        body = bytes(data[pos + HEADER_SIZE :])
        _length, at = _read_varint(body, 0)
        at += 1  # attributes
        _, at = _read_varint(body, at)  # timestamp delta
        _, at = _read_varint(body, at)  # offset delta
        key_length, at = _read_varint(body, at)
        if key_length < 0 or at + key_length > len(body):
            return None
        return decode(body[at : at + key_length], None).key
    except (IndexError, ValueError, CorruptRecordError):
        return None


def _framing(
    segment: str, pos: int, offset: int | None, message: str, key: Any = None
) -> Violation:
    return Violation(
        CRC_AND_FRAMING,
        message,
        None if key is None else key.group_id,
        None if key is None else str(key.topic_id),
        None if key is None else key.partition,
        segment,
        offset,
        pos,
    )


def scan_batches(
    data: bytes, segment: str, *, writing: bool = False
) -> Iterator[tuple[int, Record] | Violation]:
    """`scan_segment`'s walk over the batches: (batch position, record) for each record
    of a sound batch, undecoded, and a `crc_and_framing` violation for each batch that
    is not sound."""
    pos, end = 0, len(data)
    next_offset: int | None = None
    while pos < end:
        if end - pos < HEADER_SIZE:
            if writing:
                return
            yield _framing(
                segment,
                pos,
                None,
                f"{end - pos} trailing bytes are not a record batch (a torn write)",
            )
            return
        try:
            header = parse_header(data, pos)
        except CorruptRecordError as exc:
            yield _framing(segment, pos, None, f"batch header unreadable: {exc}")
            return
        if pos + header.size > end:
            if writing:
                return
            yield _framing(
                segment,
                pos,
                header.base_offset,
                f"batch at base offset {header.base_offset} claims {header.size} bytes but "
                f"only {end - pos} remain (a truncated record)",
                _peek_key(data, pos),
            )
            return
        # The length is whole from here on, so the next batch can be read even if this
        # one's contents are bad.
        batch_pos, pos = pos, pos + header.size
        actual = compute_crc(data, batch_pos, header)
        if actual != header.crc:
            yield _framing(
                segment,
                batch_pos,
                header.base_offset,
                f"batch at base offset {header.base_offset} has CRC32C {header.crc:#010x} "
                f"stored but {actual:#010x} computed",
                _peek_key(data, batch_pos),
            )
            continue
        if next_offset is not None and header.base_offset < next_offset:
            yield _framing(
                segment,
                batch_pos,
                header.base_offset,
                f"batch base offset {header.base_offset} is below the previous batch's next "
                f"offset {next_offset}",
            )
        next_offset = header.next_offset
        if header.is_control:
            continue
        try:
            records: Sequence[Record] = decode_records(data, batch_pos, header)
        except CorruptRecordError as exc:
            yield _framing(segment, batch_pos, header.base_offset, f"records unreadable: {exc}")
            continue
        for record in records:
            yield batch_pos, record


def decode_share(
    segment: str, batch_pos: int, offset: int, key: bytes | None, value: bytes | None
) -> ShareRecord | Violation:
    """The share record a record's key and value hold, or the `crc_and_framing`
    violation saying why they are not one."""
    try:
        if key is None:
            raise ValueError("record has no key; it is not a share-state record")
        return decode(key, value)
    except ValueError as exc:
        return _framing(segment, batch_pos, offset, str(exc))


def scan_segment(
    data: bytes, segment: str, source: str = SOURCE_LOG, *, writing: bool = False
) -> Iterator[LogRecord | Violation]:
    """Every share record of one segment file's bytes, and a `crc_and_framing` violation
    for each batch or record that is not sound. Never raises on bad bytes.

    `writing`: a running broker is appending to this segment, so an incomplete batch at
    its end is a write in progress, not damage (the broker's recovery would keep it if
    it completes, or cut it if the broker dies first)."""
    for item in scan_batches(data, segment, writing=writing):
        if isinstance(item, Violation):
            yield item
            continue
        batch_pos, record = item
        share = decode_share(segment, batch_pos, record.offset, record.key, record.value)
        if isinstance(share, Violation):
            yield share
        else:
            yield log_record(source, segment, batch_pos, record.offset, share)


def scan_file(
    path: str, segment: str, source: str, writing: bool = False
) -> list[LogRecord | Violation]:
    """`scan_segment` of a file, whole (the Spark job runs `scan_keys`)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        return [_framing(segment, 0, None, f"segment unreadable: {exc}")]
    return list(scan_segment(data, segment, source, writing=writing))


# ------------------------------------------------------------------ replay


def fold(records: Iterable[LogRecord]) -> ShareSnapshot | None:
    """A key's state after `records` by the coordinator's own replay rules
    (persister.share_replay), as the ShareSnapshot that stands for it; None if deleted."""
    return share_replay.fold(r.share for r in records)


def from_last_reset(records: Sequence[LogRecord]) -> Sequence[LogRecord]:
    """The records a compaction keeps of one key: from its newest snapshot or tombstone."""
    for i in range(len(records) - 1, -1, -1):
        if records[i].record_type != UPDATE:
            return records[i:]
    return records


# ------------------------------------------------------------------ per-key rules


@dataclass(frozen=True, slots=True)
class KeyContext:
    """What the rules of one key need from outside the share-state log."""

    delivery_count_limit: int = DEFAULT_DELIVERY_COUNT_LIMIT
    limit_source: str = "Kafka default"
    topic: str | None = None
    log_start_offset: int | None = None
    log_end_offset: int | None = None


# A key's state before each of its records, then after the last: `key_states`.
States = Sequence[ShareSnapshot | None]


def key_states(records: Sequence[LogRecord]) -> list[ShareSnapshot | None]:
    """The key's state before each record and, last, after them all: one replay that
    every rule of the key shares (`check_key`)."""
    states: list[ShareSnapshot | None] = [None]
    state: ShareSnapshot | None = None
    for record in records:
        state = share_replay.apply(state, record.share)
        states.append(state)
    return states


def _steps(
    records: Sequence[LogRecord], states: States | None
) -> Iterable[tuple[LogRecord, ShareSnapshot | None]]:
    """Each record with the key's state before it."""
    return zip(records, key_states(records) if states is None else states, strict=False)


def _final(records: Sequence[LogRecord], states: States | None) -> ShareSnapshot | None:
    return fold(records) if states is None else states[-1]


def check_state_epochs(records: Sequence[LogRecord]) -> list[Violation]:
    out = []
    newest: int | None = None
    for record in records:
        if record.record_type == TOMBSTONE:
            newest = None
        elif record.record_type == SNAPSHOT:
            if newest is not None and record.state_epoch < newest:
                out.append(
                    _violation(
                        STATE_EPOCH_MONOTONIC,
                        record,
                        f"state epoch {record.state_epoch} after {newest}",
                    )
                )
            newest = record.state_epoch if newest is None else max(newest, record.state_epoch)
    return out


def check_start_offsets(
    records: Sequence[LogRecord], states: States | None = None
) -> list[Violation]:
    out = []
    for record, before in _steps(records, states):
        if record.record_type == TOMBSTONE or before is None or record.start_offset == NO_OFFSET:
            continue
        if record.start_offset >= before.start_offset:
            continue
        if record.record_type == SNAPSHOT and record.state_epoch != before.state_epoch:
            continue  # a reset: a new state epoch may start anywhere
        out.append(
            _violation(
                START_OFFSET_MONOTONIC,
                record,
                f"start offset {record.start_offset} is below {before.start_offset} with "
                f"the state epoch unchanged at {before.state_epoch}",
            )
        )
    return out


def _start_in_force(record: LogRecord, before: ShareSnapshot | None) -> int:
    if record.start_offset != NO_OFFSET or record.record_type == SNAPSHOT or before is None:
        return record.start_offset
    return before.start_offset


def check_batches(records: Sequence[LogRecord], states: States | None = None) -> list[Violation]:
    out = []
    for record, before in _steps(records, states):
        start = _start_in_force(record, before)
        previous: StateBatch | None = None
        for batch in record.batches:
            what = f"state batch {batch.first_offset}-{batch.last_offset}"
            problem = None
            if batch.first_offset < 0 or batch.last_offset < batch.first_offset:
                problem = f"{what} is not a valid offset range"
            elif start >= 0 and batch.first_offset < start:
                problem = f"{what} begins below the start offset {start}"
            elif previous is not None and batch.first_offset <= previous.last_offset:
                ordered = batch.first_offset > previous.first_offset
                problem = (
                    f"{what} overlaps the batch before it "
                    f"({previous.first_offset}-{previous.last_offset})"
                    if ordered
                    else f"{what} comes after {previous.first_offset}-{previous.last_offset}"
                    " (batches out of order)"
                )
            if problem is not None:
                out.append(_violation(STATE_BATCHES_ORDERED, record, problem))
            previous = batch
    return out


def check_delivery_states(records: Sequence[LogRecord]) -> list[Violation]:
    return [
        _violation(
            DELIVERY_STATE_KNOWN,
            record,
            f"state batch {batch.first_offset}-{batch.last_offset} has delivery state "
            f"{batch.delivery_state}; Kafka stores 0 (Available), 2 (Acknowledged), "
            "3 (Archiving) or 4 (Archived)",
        )
        for record in records
        for batch in record.batches
        if batch.delivery_state not in KNOWN_DELIVERY_STATES
    ]


def check_delivery_counts(records: Sequence[LogRecord], context: KeyContext) -> list[Violation]:
    limit = context.delivery_count_limit
    return [
        _violation(
            DELIVERY_COUNT_WITHIN_LIMIT,
            record,
            f"state batch {batch.first_offset}-{batch.last_offset} has delivery count "
            f"{batch.delivery_count}, outside 0..{limit} ({GROUP_LIMIT_KEY} "
            f"{limit}, {context.limit_source})",
        )
        for record in records
        for batch in record.batches
        if not 0 <= batch.delivery_count <= limit
    ]


def check_topic_offsets(
    records: Sequence[LogRecord], context: KeyContext, states: States | None = None
) -> list[Violation]:
    if not records:
        return []
    if context.topic is None:
        # Only a key whose state is still live matters: a deleted topic's state is
        # deleted after it (by tombstones), not before.
        if _final(records, states) is None:
            return []
        return [
            _violation(
                OFFSETS_IN_TOPIC_LOG,
                records[-1],
                f"topic id {records[-1].topic_id} is not a topic in the metadata log",
            )
        ]
    end = context.log_end_offset
    if end is None:
        return []
    out = []
    for record in records:
        if record.start_offset > end:
            out.append(
                _violation(
                    OFFSETS_IN_TOPIC_LOG,
                    record,
                    f"start offset {record.start_offset} is past the log end offset {end} "
                    f"of {context.topic}-{record.partition}",
                )
            )
        out += [
            _violation(
                OFFSETS_IN_TOPIC_LOG,
                record,
                f"state batch {b.first_offset}-{b.last_offset} reaches past the log end "
                f"offset {end} of {context.topic}-{record.partition}",
            )
            for b in record.batches
            if b.last_offset >= end
        ]
    return out


def check_replay_equivalent(
    original: Sequence[LogRecord],
    compacted: Sequence[LogRecord] | None,
    states: States | None = None,
) -> list[Violation]:
    """`compacted` None: compare the full replay with the replay from the last reset."""
    if not original and not compacted:
        return []
    kept = from_last_reset(original) if compacted is None else compacted
    expected = _final(original, states)
    got = fold(kept) if compacted is not None or states is None else _replay_kept(kept, states)
    if expected == got:
        return []
    where = kept[-1] if kept else original[-1]
    what = "its newest snapshot on" if compacted is None else "the compacted log"
    return [
        _violation(
            REPLAY_EQUIVALENT,
            where,
            f"replaying {what} gives {_describe_state(got)}; the full log gives "
            f"{_describe_state(expected)}",
        )
    ]


def _replay_kept(kept: Sequence[LogRecord], states: States) -> ShareSnapshot | None:
    """`fold(kept)` for `kept` a suffix of the records whose `key_states` are `states`.
    Replay is deterministic: when kept's first record leaves the state the full replay
    has after it, replaying the rest gives the full replay's final state, so it is
    replayed again only when that first state differs."""
    if not kept:
        return None
    first = share_replay.apply(None, kept[0].share)
    if first == states[len(states) - len(kept)]:
        return states[-1]
    return share_replay.fold((r.share for r in kept[1:]), first)


def _describe_state(state: ShareSnapshot | None) -> str:
    if state is None:
        return "no state (deleted)"
    return (
        f"state epoch {state.state_epoch}, start offset {state.start_offset}, "
        f"{len(state.batches)} state batches"
    )


def check_key(
    original: Sequence[LogRecord],
    context: KeyContext,
    compacted: Sequence[LogRecord] | None = None,
    states: States | None = None,
) -> list[Violation]:
    """Every per-key rule over one key's records in log order. `states`: the
    `key_states` of `original`, if the caller has them (replayed here otherwise)."""
    if states is None:
        states = key_states(original)
    return [
        *check_replay_equivalent(original, compacted, states),
        *check_state_epochs(original),
        *check_start_offsets(original, states),
        *check_batches(original, states),
        *check_delivery_states(original),
        *check_delivery_counts(original, context),
        *check_topic_offsets(original, context, states),
    ]


# ------------------------------------------------------------------ per-partition stats


def partition_stats(
    key: ShareKeyTuple,
    records: Sequence[LogRecord],
    context: KeyContext,
    states: States | None = None,
) -> dict[str, Any]:
    """What the final state says of a share partition: offsets accepted (done), archived
    (poison or given up), of those the dead-lettered ones (`dead_lettered`: archived
    after passing through Archiving, so with a copy in the group's dead-letter topic,
    KIP-1191), archiving (a dead-letter copy still to be written), released (available
    again after a delivery), redelivered (delivered more than once), the delivery-count
    histogram, and the lag (KIP-932's share-group lag: log end - start offset - offsets
    done above the start). Archiving offsets are not done (Kafka's SPSO stops at them).

    Dead-lettered offsets are known from the records the log holds: a compaction keeps
    only the newest snapshot, where they are archived like any other."""
    state = _final(records, states)
    counts: Counter[int] = Counter()
    by_state: Counter[int] = Counter()
    released = redelivered = 0
    for batch in state.batches if state else ():
        size = batch.last_offset - batch.first_offset + 1
        counts[batch.delivery_count] += size
        by_state[batch.delivery_state] += size
        if batch.delivery_state == AVAILABLE and batch.delivery_count > 0:
            released += size
        if batch.delivery_count > 1:
            redelivered += size
    done = by_state[ACKNOWLEDGED] + by_state[ARCHIVED]
    dead_lettered = _overlap(
        [
            (b.first_offset, b.last_offset)
            for b in (state.batches if state else ())
            if b.delivery_state == ARCHIVED
        ],
        archiving_ranges(records),
    )
    start = state.start_offset if state else NO_OFFSET
    lag = None
    if state is not None and context.log_end_offset is not None and start >= 0:
        lag = max(context.log_end_offset - start - done, 0)
    group_id, topic_id, partition = key
    kinds = Counter(r.record_type for r in records)
    return {
        "group_id": group_id,
        "topic_id": topic_id,
        "topic": context.topic,
        "partition": partition,
        "deleted": state is None,
        "state_epoch": state.state_epoch if state else None,
        "start_offset": start if state else None,
        "log_end_offset": context.log_end_offset,
        "records": len(records),
        "snapshots": kinds[SNAPSHOT],
        "updates": kinds[UPDATE],
        "tombstones": kinds[TOMBSTONE],
        "accepted": by_state[ACKNOWLEDGED],
        "archived": by_state[ARCHIVED],
        "dead_lettered": dead_lettered,
        "archiving": by_state[ARCHIVING],
        "released": released,
        "redelivered": redelivered,
        "lag": lag,
        "delivery_count_limit": context.delivery_count_limit,
        "limit_source": context.limit_source,
        "delivery_count_histogram": {str(k): v for k, v in sorted(counts.items())},
    }


def archiving_ranges(records: Sequence[LogRecord]) -> list[tuple[int, int]]:
    """The offset ranges, merged and sorted, that a key's records put in the Archiving
    state since its state last started afresh (a tombstone, or a snapshot of a new state
    epoch: an admin reset, after which offsets are delivered anew)."""
    ranges: list[tuple[int, int]] = []
    epoch: int | None = None
    for record in records:
        if record.record_type == TOMBSTONE or (
            record.record_type == SNAPSHOT and record.state_epoch != epoch
        ):
            ranges.clear()
            epoch = record.state_epoch if record.record_type == SNAPSHOT else None
        ranges += [
            (b.first_offset, b.last_offset) for b in record.batches if b.delivery_state == ARCHIVING
        ]
    merged: list[tuple[int, int]] = []
    for first, last in sorted(ranges):
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return merged


def _overlap(ranges: Sequence[tuple[int, int]], merged: Sequence[tuple[int, int]]) -> int:
    """How many offsets of `ranges` lie in the merged, sorted, disjoint `merged`."""
    starts = [first for first, _ in merged]
    total = 0
    for first, last in ranges:
        i = max(bisect.bisect_right(starts, first) - 1, 0)
        while i < len(merged) and merged[i][0] <= last:
            low, high = max(first, merged[i][0]), min(last, merged[i][1])
            total += max(high - low + 1, 0)
            i += 1
    return total


# ------------------------------------------------------------------ context from the data dir


def segment_files(directory: Path) -> list[Path]:
    """The `.log` segment files of a log directory, oldest first."""
    if not directory.is_dir():
        return []
    names = [
        p
        for p in directory.iterdir()
        if p.name.endswith(LOG_SUFFIX) and p.name[: -len(LOG_SUFFIX)].isdigit()
    ]
    return sorted(names, key=lambda p: int(p.name[: -len(LOG_SUFFIX)]))


def _read_key_values(directory: Path) -> Iterator[tuple[bytes | None, bytes | None]]:
    """The records of a coordinator log, read-only, stopping quietly at a torn tail."""
    for path in segment_files(directory):
        data = path.read_bytes()
        for _, batch in scan_batches_lenient(data):
            yield from batch


def scan_batches_lenient(
    data: bytes,
) -> Iterator[tuple[int, list[tuple[bytes | None, bytes | None]]]]:
    pos = 0
    while len(data) - pos >= HEADER_SIZE:
        try:
            header = parse_header(data, pos)
        except CorruptRecordError:
            return
        if pos + header.size > len(data):
            return
        if not header.is_control and compute_crc(data, pos, header) == header.crc:
            try:
                records = decode_records(data, pos, header)
            except CorruptRecordError:
                records = []
            yield header.next_offset, [(r.key, r.value) for r in records]
        else:
            yield header.next_offset, []
        pos += header.size


@dataclass(slots=True)
class DataDirContext:
    """Topic names, log bounds and delivery-count limits of a data dir."""

    topics: dict[str, tuple[str, int]] = field(default_factory=dict)  # id -> (name, parts)
    broker_configs: dict[str, str] = field(default_factory=dict)
    group_limits: dict[str, int] = field(default_factory=dict)
    bounds: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)

    def key_context(self, key: ShareKeyTuple) -> KeyContext:
        group_id, topic_id, partition = key
        limit, source = self.delivery_count_limit(group_id)
        topic = self.topics.get(topic_id)
        name = None if topic is None else topic[0]
        bounds = None if name is None else self.bounds.get((name, partition))
        return KeyContext(
            limit,
            source,
            name,
            None if bounds is None else bounds[0],
            None if bounds is None else bounds[1],
        )

    def delivery_count_limit(self, group_id: str) -> tuple[int, str]:
        if group_id in self.group_limits:
            return self.group_limits[group_id], "group config"
        raw = self.broker_configs.get(BROKER_LIMIT_KEY)
        if raw is not None and raw.lstrip("-").isdigit():
            return int(raw), f"broker config {BROKER_LIMIT_KEY}"
        return DEFAULT_DELIVERY_COUNT_LIMIT, "Kafka default"


def load_context(data_dir: Path) -> DataDirContext:
    """Read (never write) the metadata log, the groups log and the topic logs."""
    return build_context(
        _read_key_values(data_dir / "meta"),
        _read_key_values(data_dir / "groups"),
        lambda name, p: log_bounds(data_dir / "topics" / f"{name}-{p}"),
    )


def load_context_pg(db: PgTarget, logs: dict[str, LogRow]) -> DataDirContext:
    """`load_context` from the database: the `meta` and `groups` logs' rows, and the
    topic partitions' log start and end offsets from `spool_logs`."""

    def key_values(name: str) -> Iterator[tuple[bytes | None, bytes | None]]:
        if name not in logs:
            return
        for data in log_batches(db, name):
            for _, batch in scan_batches_lenient(data):
                yield from batch

    def bounds(name: str, partition: int) -> tuple[int, int]:
        row = logs.get(f"topics/{name}-{partition}")
        return (0, 0) if row is None else (row.log_start_offset, row.next_offset)

    return build_context(key_values("meta"), key_values("groups"), bounds)


def build_context(
    meta: Iterable[tuple[bytes | None, bytes | None]],
    groups: Iterable[tuple[bytes | None, bytes | None]],
    bounds: Callable[[str, int], tuple[int, int]],
) -> DataDirContext:
    """The context from the metadata log's and the groups log's records, and the
    (log start, log end) of each topic partition."""
    ctx = DataDirContext()
    by_name: dict[str, tuple[str, int]] = {}
    # Dynamic broker configs: the cluster-wide defaults, and each broker's own over them
    # (the audit takes any broker's: one broker's data, or brokers configured alike).
    default_configs: dict[str, str] = {}
    node_configs: dict[str, dict[str, str]] = {}
    # Group overrides of the delivery count limit in the metadata log (coordinator.
    # metadata's `group_config` records), and whether the groups log's were adopted.
    meta_limits: dict[str, int | None] = {}
    adopted = False
    for _key, value in meta:
        try:
            record = json.loads(value) if value is not None else None
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        kind = record.get("type")
        if kind == "topic":
            by_name[record["name"]] = (record["topic_id"], int(record["partitions"]))
        elif kind == "topic_deleted":
            if by_name.get(record["name"], ("",))[0] == record.get("topic_id"):
                del by_name[record["name"]]
        elif kind == "group_config" and record.get("name") == GROUP_LIMIT_KEY:
            raw = record.get("value")
            limit = str(raw) if raw is not None else None
            meta_limits[str(record.get("group"))] = (
                int(limit) if limit is not None and limit.lstrip("-").isdigit() else None
            )
        elif kind == "group_configs_adopted":
            adopted = True
        elif kind == "broker_config":
            configs = {str(k): str(v) for k, v in record["configs"].items()}
            if record.get("node") is None:
                default_configs = configs
            else:
                node_configs[str(record["node"])] = configs
    ctx.broker_configs = dict(default_configs)
    for configs in node_configs.values():
        ctx.broker_configs.update(configs)
    ctx.topics = {tid: (name, parts) for name, (tid, parts) in by_name.items()}
    if not adopted:
        # Written before group configs moved to the metadata log; the metadata wins.
        for key, value in groups:
            _group_limit(ctx.group_limits, key, value)
    for group, meta_limit in meta_limits.items():
        if meta_limit is None:
            ctx.group_limits.pop(group, None)
        else:
            ctx.group_limits[group] = meta_limit
    for name, (_tid, parts) in by_name.items():
        for p in range(parts):
            ctx.bounds[(name, p)] = bounds(name, p)
    return ctx


def _group_limit(limits: dict[str, int], key: bytes | None, value: bytes | None) -> None:
    """A ConfigRecord of a group's share.delivery.count.limit (coordinator.group_records)."""
    try:
        parsed = json.loads(key) if key is not None else None
    except ValueError:
        return
    if not isinstance(parsed, dict) or parsed.get("name") != "ConfigRecord":
        return
    if parsed.get("config") != GROUP_LIMIT_KEY:
        return
    group = str(parsed.get("resource_name"))
    if value is None:
        limits.pop(group, None)
        return
    raw = str(json.loads(value).get("value"))
    if raw.lstrip("-").isdigit():
        limits[group] = int(raw)


def log_bounds(directory: Path) -> tuple[int, int]:
    """(log start offset, log end offset) of a topic partition's directory, read-only."""
    files = segment_files(directory)
    if not files:
        return 0, 0
    start = int(files[0].name[: -len(LOG_SUFFIX)])
    checkpoint = directory / "log-start-offset-checkpoint"
    if checkpoint.exists():
        lines = checkpoint.read_text().split()
        if len(lines) == 2 and lines[1].isdigit():
            start = max(start, int(lines[1]))
    end = int(files[-1].name[: -len(LOG_SUFFIX)])
    for next_offset, _ in scan_batches_lenient(files[-1].read_bytes()):
        end = next_offset
    return start, end


# ------------------------------------------------------------------ compaction staging


@dataclass(frozen=True, slots=True)
class Staging:
    """A compaction's staging dir: its output files and the input segments they replace."""

    directory: Path
    outputs: list[Path]
    inputs: frozenset[str]


def find_staging(share_dir: Path) -> Staging | None:
    """The newest `compacted-*/manifest.json` under the share-state dir, if any."""
    manifests = sorted(share_dir.glob("compacted-*/manifest.json"))
    if not manifests:
        return None
    path = manifests[-1]
    try:
        manifest = json.loads(path.read_text())
        inputs_listed = [(str(i["file"]), int(i["size"])) for i in manifest["inputs"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    # Stale when the broker has compacted or truncated an input since: the broker would
    # discard it (persister.spark.adopt), so comparing with it says nothing.
    for name, size in inputs_listed:
        input_path = share_dir / name
        if not input_path.exists() or input_path.stat().st_size != size:
            return None
    # persister.spark.compact's manifest: inputs and outputs each list {"file": name, ...}.
    outputs = [path.parent / str(o["file"]) for o in manifest.get("outputs", [])]
    inputs = frozenset(str(i["file"]) for i in manifest.get("inputs", []))
    return Staging(path.parent, outputs, inputs)


# ------------------------------------------------------------------ the Spark job


class ScanTask(NamedTuple):
    """One segment file for the executors to scan."""

    path: str
    segment: str  # as violations and the records table name it
    source: str
    writing: bool


# A crc_and_framing violation's place in the scan's order, as `scan_segment` yields them:
# (task, byte position, offset or -1, 0 if the scan found it or 1 if the decode did, n).
_Order = tuple[int, int, int, int, int]
# One record as shuffled: offset, batch position, key bytes, value bytes (undecoded).
_RawRecord = tuple[int, Any, bytes, bytes | None]


def _order(index: int, v: Violation, side: int, n: int) -> _Order:
    return (
        index,
        -1 if v.byte_position is None else v.byte_position,
        -1 if v.offset is None else v.offset,
        side,
        n,
    )


def scan_keys(index: int, task: ScanTask) -> Iterator[tuple[Any, Any]]:
    """Executor side: `scan_segment` of `task`'s file (the `index`th) with its records
    grouped by share key and left undecoded (their keys are decoded once per key):
    `(key, (index, [raw record, ...]))` per key, and `(None, (order, violation))` per
    `crc_and_framing` violation. The values are decoded after the shuffle
    (`check_group`): shuffling bytes is far cheaper than shuffling decoded objects."""
    try:
        data = Path(task.path).read_bytes()
    except OSError as exc:
        v = _framing(task.segment, 0, None, f"segment unreadable: {exc}")
        yield None, (_order(index, v, 0, 0), v)
        return

    def items() -> Iterator[_Scanned]:
        for n, item in enumerate(scan_batches(data, task.segment, writing=task.writing)):
            if isinstance(item, Violation):
                yield item, _order(index, item, 0, n), task.segment
            else:
                yield item[1], item[0], task.segment

    yield from _grouped(index, items())


# What `_grouped` takes: (violation, its order, _) or (record, its position, its segment);
# a position is the batch's byte position in a file, or (row base offset, byte position
# in the row) for a row of the database.
_Scanned = tuple[Any, Any, str]


def _position_order(index: int, position: Any, offset: int, side: int, n: int) -> _Order:
    if isinstance(position, tuple):
        return (index, position[0], offset, side, n)
    return (index, position, offset, side, n)


def _grouped(index: int, items: Iterable[_Scanned]) -> Iterator[tuple[Any, Any]]:
    """`scan_keys`'s grouping of scanned records by share key, undecoded; violations
    are passed on with their order."""
    # Each distinct key's bytes: the first seen (so equal keys pickle once) and its key.
    keys: dict[bytes, tuple[bytes, ShareKeyTuple]] = {}
    groups: dict[ShareKeyTuple, list[_RawRecord]] = {}
    for n, (item, where, segment) in enumerate(items):
        if isinstance(item, Violation):
            yield None, (where, item)
            continue
        record: Record = item
        known = None if record.key is None else keys.get(record.key)
        if known is None:
            # decode_share checks the key before the value, so this is its verdict on it.
            batch_pos = where[1] if isinstance(where, tuple) else where
            share = decode_share(segment, batch_pos, record.offset, record.key, None)
            if isinstance(share, Violation):
                yield None, (_position_order(index, where, record.offset, 0, n), share)
                continue
            assert record.key is not None
            k = share.key
            known = keys[record.key] = (record.key, (k.group_id, str(k.topic_id), k.partition))
        raw, key = known
        group = groups.get(key)
        if group is None:
            group = groups[key] = []
        group.append((record.offset, where, raw, record.value))
    for key, group in groups.items():
        yield key, (index, group)


def _row_segment(table: str, base_offset: int) -> str:
    """How a row of the database is named where a file would be: `spool_batches[<base>]`."""
    return f"{table}[{base_offset}]"


def scan_rows(index: int, rows: Iterable[Any]) -> Iterator[tuple[Any, Any]]:
    """Executor side: `scan_keys` for rows of the database's share-state log (a JDBC
    partition's, in base offset order: base_offset, last_offset, data, ...). A row is
    one append: its batches must start at its base offset and end by its last offset,
    and rows must not overlap. A violation names the row `spool_batches[<base offset>]`
    and the byte position in its data."""

    def items() -> Iterator[_Scanned]:
        previous_last: int | None = None
        for row in rows:
            base, last, data = int(row[0]), int(row[1]), bytes(row[2])
            segment = _row_segment(TABLE, base)
            problems = []
            if previous_last is not None and base <= previous_last:
                problems.append(f"row at base offset {base} overlaps the row before it")
            if len(data) >= HEADER_SIZE:
                try:
                    first_base = parse_header(data, 0).base_offset
                except CorruptRecordError:
                    first_base = base  # scan_batches says why
                if first_base != base:
                    problems.append(
                        f"row at base offset {base} holds a batch at base offset {first_base}"
                    )
            previous_last = last if previous_last is None else max(last, previous_last)
            for n, problem in enumerate(problems):
                v = _framing(segment, 0, base, problem)
                yield v, (index, base, -1, 0, n), segment
            end = base
            for item in scan_batches(data, segment):
                if isinstance(item, Violation):
                    where = -1 if item.byte_position is None else item.byte_position
                    yield item, (index, base, where, 0, 0), segment
                    continue
                pos, record = item
                end = max(end, record.offset + 1)
                yield record, (base, pos), segment
            if end > last + 1:
                problem = f"row at base offset {base} ends at offset {last} but holds {end - 1}"
                yield _framing(segment, 0, base, problem), (index, base, last, 0, 9), segment

    yield from _grouped(index, items())


def check_group(
    item: tuple[ShareKeyTuple | None, Iterable[Any]],
    tasks: Sequence[ScanTask],
    ctx: DataDirContext,
    replaced: frozenset[str] | None,
    table_rows: bool,
) -> list[tuple[str, Any]]:
    """Executor side: one key's records from every file (`scan_keys`) decoded and
    checked (`_audit_key`); tagged results: ("framing", (order, violation)) for a
    record that does not decode, ("violation", v), ("stats", dict) and, with
    `table_rows`, ("row", records table row) per record. The None key carries the
    scan's own violations through."""
    key, parts = item
    if key is None:
        return [("framing", part) for part in parts]
    out: list[tuple[str, Any]] = []
    records: list[LogRecord] = []
    for index, group in parts:
        task = tasks[index]
        for offset, position, raw_key, value in group:
            segment, batch_pos, order = task.segment, position, None
            if isinstance(position, tuple):  # a row of the database
                segment = _row_segment(task.segment, position[0])
                batch_pos = position[1]
                order = _position_order(index, position, offset, 1, 0)
            share = decode_share(segment, batch_pos, offset, raw_key, value)
            if isinstance(share, Violation):
                out.append(("framing", (order or _order(index, share, 1, 0), share)))
            else:
                records.append(log_record(task.source, segment, batch_pos, offset, share))
    out += _audit_key((key, records), ctx, replaced)
    if table_rows:
        out += [("row", report.record_row(r)) for r in records]
    return out


def _audit_key(
    item: tuple[ShareKeyTuple, Iterable[LogRecord]],
    ctx: DataDirContext,
    replaced: frozenset[str] | None,
) -> list[tuple[str, Any]]:
    key, rows = item
    ordered = sorted(rows, key=lambda r: (r.offset, r.source != SOURCE_COMPACTED))
    original = [r for r in ordered if r.source == SOURCE_LOG]
    compacted = None
    if replaced is not None:
        compacted = [
            r for r in ordered if r.source == SOURCE_COMPACTED or r.segment not in replaced
        ]
    context = ctx.key_context(key)
    # One replay of the key, shared by every rule and the figures.
    states = key_states(original)
    out: list[tuple[str, Any]] = [
        ("violation", v) for v in check_key(original, context, compacted, states)
    ]
    if original:
        out.append(("stats", partition_stats(key, original, context, states)))
    return out


def run_audit(
    spark: SparkSession,
    data_dir: Path,
    out: Path,
    progress: Callable[[str], None] | None = None,
    *,
    tables: bool = True,
) -> AuditResult:
    """Audit `data_dir/share-state` and write `out/` (report.json, report.html, and with
    `tables` the Parquet tables, the slowest part of a small audit)."""
    say = progress or (lambda _m: None)
    share_dir = data_dir / "share-state"
    say(f"[1/5] reading topics, log bounds and group configs of {data_dir}")
    ctx = load_context(data_dir)
    staging = find_staging(share_dir)
    # With a broker running on the data dir, its newest segment is being appended to.
    live = in_use(data_dir)
    segments = segment_files(share_dir)
    tasks = [
        ScanTask(str(p), p.name, SOURCE_LOG, live and i == len(segments) - 1)
        for i, p in enumerate(segments)
    ]
    if staging is not None:
        tasks += [
            ScanTask(str(p), str(p.relative_to(share_dir)), SOURCE_COMPACTED, False)
            for p in staging.outputs
        ]
    say(
        f"[2/5] scanning {len(tasks)} segment files in the executors"
        + ("" if staging is None else f" (with compaction output {staging.directory.name})")
    )
    sc = spark.sparkContext
    log_bytes = sum(_file_size(t.path) for t in tasks)
    # Keys spread over a few groups per core (as many groups as files would leave a
    # core idle while another checks two of them), none so big that its Python worker
    # spills it to disk (past spark.python.worker.memory, 512m by default).
    groups = max(len(tasks), 4 * sc.defaultParallelism, -(-log_bytes // _GROUP_BYTES))
    scanned = sc.parallelize(list(enumerate(tasks)), max(len(tasks), 1)).flatMap(
        lambda it: scan_keys(*it)
    )
    summary = {
        "data_dir": str(data_dir),
        "broker_running": live,
        "segments": sum(1 for t in tasks if t.source == SOURCE_LOG),
        "compaction_staging": None if staging is None else staging.directory.name,
        "replay_comparison": (
            "full replay vs. newest snapshot + later updates per key"
            if staging is None
            else f"originals vs. {staging.directory.name} output + segments it did not cover"
        ),
    }
    replaced = None if staging is None else staging.inputs
    return _check(spark, scanned, groups, tasks, ctx, replaced, summary, out, say, tables)


def run_audit_pg(
    spark: SparkSession,
    db: PgTarget,
    out: Path,
    progress: Callable[[str], None] | None = None,
    *,
    tables: bool = True,
) -> AuditResult:
    """`run_audit` of a database's share-state log (`spool serve --storage`): its rows
    below the log end offset read when the audit starts (what a running broker appends
    later is left for the next audit), through Spark's JDBC source."""
    say = progress or (lambda _m: None)
    say(f"[1/5] reading topics, log bounds and group configs of {db.masked}")
    logs = pg_logs(db)
    ctx = load_context_pg(db, logs)
    share = logs.get(SHARE_STATE_LOG)
    sc = spark.sparkContext
    if share is None:
        scanned: Any = sc.parallelize([], 1)
        rows, parts, tasks = 0, 1, []
    else:
        rows, first = count_rows(db, share.log_id, share.next_offset)
        frame = batch_frame(spark, db, share.log_id, first or 0, share.next_offset, rows).select(
            "base_offset", "last_offset", "data"
        )
        parts = frame.rdd.getNumPartitions()
        tasks = [ScanTask("", TABLE, SOURCE_LOG, False)] * parts
        scanned = frame.rdd.mapPartitionsWithIndex(scan_rows)
    say(f"[2/5] scanning {rows} rows of {SHARE_STATE_LOG} in {parts} JDBC partitions")
    groups = max(parts, 4 * sc.defaultParallelism)
    summary = {
        "data_dir": None,
        "storage": db.masked,
        "broker_running": None,
        "segments": 0,
        "rows": rows,
        "log_end_offset": None if share is None else share.next_offset,
        "compaction_staging": None,
        "replay_comparison": "full replay vs. newest snapshot + later updates per key",
    }
    return _check(spark, scanned, groups, tasks, ctx, None, summary, out, say, tables)


def _check(
    spark: SparkSession,
    scanned: Any,
    groups: int,
    tasks: Sequence[ScanTask],
    ctx: DataDirContext,
    replaced: frozenset[str] | None,
    summary: dict[str, Any],
    out: Path,
    say: Callable[[str], None],
    tables: bool,
) -> AuditResult:
    """Check every key of `scanned` (`scan_keys` / `scan_rows` items) and write `out/`."""
    from pyspark import StorageLevel

    sc = spark.sparkContext
    ctx_b = sc.broadcast(ctx)
    say("[3/5] checking every share key (grouped by group, topic, partition)")
    # One pass: scanned and grouped by key on the map side, then each key decoded and
    # checked; the records table's rows come out of the same pass.
    checked = scanned.groupByKey(groups).flatMap(
        lambda item: check_group(item, tasks, ctx_b.value, replaced, tables)
    )
    if tables:
        checked = checked.persist(StorageLevel.MEMORY_AND_DISK)
    results = (checked.filter(lambda t: t[0] != "row") if tables else checked).collect()
    framing = in_scan_order(p for tag, p in results if tag == "framing")
    violations = framing + [v for tag, v in results if tag == "violation"]
    violations = [_with_topic(v, ctx) for v in violations]
    partitions = sorted(
        (s for tag, s in results if tag == "stats"),
        key=lambda s: (s["group_id"], s["topic"] or "", s["partition"]),
    )
    out.mkdir(parents=True, exist_ok=True)
    if tables:
        say(f"[4/5] writing Parquet tables under {out}")
        rows = checked.filter(lambda t: t[0] == "row").map(lambda t: t[1])
        try:
            report.write_tables(spark, rows, violations, partitions, out)
        finally:
            checked.unpersist()
    checks = [
        {
            "rule": rule,
            "description": text,
            "passed": not any(v.rule == rule for v in violations),
            "violations": sum(1 for v in violations if v.rule == rule),
        }
        for rule, text in RULES.items()
    ]
    summary = {
        **summary,
        "keys": len(partitions),
        "delivery_count_limits": _limit_sources(ctx, partitions),
        **{name: sum(p[name] for p in partitions) for name in OUTCOME_TOTALS},
    }
    result = AuditResult(checks, violations, partitions, summary)
    say(f"[5/5] writing {out / 'report.json'} and {out / 'report.html'}")
    report.write_reports(result, out)
    return result


def _file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0  # the scan reports it


def in_scan_order(framing: Iterable[tuple[_Order, Violation]]) -> list[Violation]:
    """The ("framing", ...) results of `check_group`, in the order `scan_segment` of
    each file, in turn, yields them."""
    return [v for _, v in sorted(framing, key=lambda pair: pair[0])]


def _with_topic(v: Violation, ctx: DataDirContext) -> Violation:
    topic = None if v.topic_id is None else ctx.topics.get(v.topic_id)
    if topic is None:
        return v
    return Violation(**{**v.to_dict(), "topic": topic[0]})


def _limit_sources(ctx: DataDirContext, partitions: list[dict[str, Any]]) -> dict[str, Any]:
    groups = sorted({p["group_id"] for p in partitions})
    return {
        g: {"limit": limit, "source": source}
        for g in groups
        for limit, source in [ctx.delivery_count_limit(g)]
    }


# ------------------------------------------------------------------ command line


def register(subparsers: Any) -> None:
    """`spool audit --data-dir DIR | --storage URL --out OUT [--master URL]`."""
    parser = subparsers.add_parser(
        "audit",
        help="check the share-state log with Spark and write a report",
        description=(
            "Check a data dir's share-state log, or a database's (--storage) (CRCs, replay, "
            "epochs, start offsets, state batches, delivery states and counts, topic "
            "offsets); write OUT/report.json, OUT/report.html and Parquet tables. Exit 0: "
            "every check passed; 1: violations; 2: usage error. Run it on a copy or a "
            "stopped broker's data dir; a database may be audited while its broker runs."
        ),
    )
    add_arguments(parser, "local[*]")
    parser.set_defaults(run=audit_command)


def add_arguments(parser: argparse.ArgumentParser, default_master: str | None) -> None:
    add_source_arguments(parser)
    parser.add_argument("--out", type=Path, required=True, help="directory for the report")
    parser.add_argument(
        "--master",
        default=default_master,
        help="Spark master URL (default local[*]; under spark-submit, its --master)",
    )


def audit_command(args: argparse.Namespace) -> int:
    data_dir: Path | None = args.data_dir
    db: PgTarget | None = None
    try:
        if data_dir is not None:
            share_state_dir(data_dir)
        else:
            db = source_target(args)
    except (NotASpoolDataDir, StorageUnavailable) as exc:
        print(f"spool audit: {exc}", file=sys.stderr)
        return 2
    if args.out.exists() and not args.out.is_dir():
        print(f"spool audit: --out {args.out} exists and is not a directory", file=sys.stderr)
        return 2

    def say(message: str) -> None:
        print(f"spool audit: {message}", file=sys.stderr, flush=True)

    say(f"starting Spark ({args.master or 'master from spark-submit'})")
    with job_session(args.master, "spool-audit") as spark:
        if db is None:
            assert data_dir is not None
            result = run_audit(spark, data_dir, args.out, say)
        else:
            try:
                result = run_audit_pg(spark, db, args.out, say)
            except StorageUnavailable as exc:
                print(f"spool audit: {db.masked}: {exc}", file=sys.stderr)
                return 2
    failed = [c["rule"] for c in result.checks if not c["passed"]]
    say(outcome_line(result.summary))
    say(
        "every check passed"
        if not failed
        else f"{len(result.violations)} violations of {', '.join(failed)}"
    )
    say(f"report: {args.out / 'report.html'}")
    return exit_code(result)


def outcome_line(summary: dict[str, Any]) -> str:
    """The offsets' outcomes over every share partition, as the command prints them."""
    return (
        f"{summary.get('accepted', 0)} offsets accepted, {summary.get('archived', 0)} "
        f"archived ({summary.get('dead_lettered', 0)} dead-lettered), "
        f"{summary.get('archiving', 0)} still archiving"
    )


def exit_code(result: AuditResult) -> int:
    """0 when every check passed, 1 when any has a violation (2 is a usage error)."""
    return 0 if result.passed else 1


def main(argv: Sequence[str] | None = None) -> int:
    """spark-submit entry: `spark-submit persister/spark/audit.py --data-dir D --out O`."""
    import argparse

    parser = argparse.ArgumentParser(prog="audit.py")
    add_arguments(parser, None)
    return audit_command(parser.parse_args(argv))


if __name__ == "__main__":
    # Run through the module's own name: functions Spark ships to executors must be
    # importable there, not pickled by value out of __main__.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from persister.spark import audit

    sys.exit(audit.main())
