"""Records of the share-state log, in the layout of Kafka's `__share_group_state` records.

The share coordinator (coordinator.share_coordinator) emits and replays these; the broker
stores each as one record (key bytes, value bytes) in a v2 batch of the `share-state/` log.
They are defined here, not in the coordinator, so that the persister (compaction, the
Spark audit) can read the log without importing the coordinator.

Kafka's coordinator-record framing: the key and the value each start with an int16
version. The key's version is the record type (0 ShareSnapshot, 1 ShareUpdate); a
tombstone is the ShareSnapshot key with a null value (Kafka's
`newShareStateTombstoneRecord`).

Key (ShareSnapshotKey / ShareUpdateKey; not flexible, all big-endian):

    type int16 (0 snapshot, 1 update) | GroupId string (int16 length + UTF-8)
    | TopicId uuid (16 bytes) | Partition int32

ShareSnapshotValue (version 0, flexible):

    version int16 (0) | SnapshotEpoch int32 | StateEpoch int32 | LeaderEpoch int32
    | StartOffset int64 | CreateTimestamp int64 | WriteTimestamp int64
    | StateBatches compact array (uvarint count + 1) of
        (FirstOffset int64 | LastOffset int64 | DeliveryState int8 | DeliveryCount int16
         | tagged fields)
    | tagged fields

ShareUpdateValue (version 0, flexible):

    version int16 (0) | SnapshotEpoch int32 | LeaderEpoch int32 | StartOffset int64
    | StateBatches compact array (as above) | tagged fields

Both values end with a tagged-field section. Kafka 4.2 (KIP-1226) puts
DeliveryCompleteCount there as tag 0 (int32, default -1: "not known"), and, as Kafka's
generated serializers do, writes it only when it differs from the default:

    tagged fields = uvarint count | per field: uvarint tag | uvarint size | data
    DeliveryCompleteCount: tag 0, size 4, int32

A value without it (written by older spool, or holding -1) decodes with -1; unknown tags
are skipped.

Hand-written with `struct`: these are coordinator-record schemas (Kafka's
share-coordinator module), not RPC messages, and kio generates only the RPC messages
(`kio.schema` has no ShareSnapshotKey/Value or ShareUpdateKey/Value), so there is no
library layout to reuse.
"""

from __future__ import annotations

import functools
import itertools
import struct
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

SNAPSHOT_RECORD_TYPE = 0
UPDATE_RECORD_TYPE = 1
VALUE_VERSION = 0

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_KEY_TAIL = struct.Struct(">16si")  # TopicId, Partition
_SNAPSHOT_HEAD = struct.Struct(">hiiiqqq")  # version .. WriteTimestamp
_UPDATE_HEAD = struct.Struct(">hiiq")  # version, SnapshotEpoch, LeaderEpoch, StartOffset
_STATE_BATCH = struct.Struct(">qqbh")
_INT16_MAX = 2**15 - 1
_MAX_UVARINT_BYTES = 5
# DeliveryCompleteCount: tagged field 0 of both values (Kafka 4.2, KIP-1226).
DELIVERY_COMPLETE_COUNT_TAG = 0
# DeliveryCompleteCount not known (Kafka 4.2's UNINITIALIZED_DELIVERY_COMPLETE_COUNT).
UNKNOWN_DELIVERY_COMPLETE_COUNT = -1
# No share-partition start offset yet (Kafka's PartitionFactory.UNINITIALIZED_START_OFFSET):
# the share partition resolves share.auto.offset.reset when it first loads.
UNINITIALIZED_START_OFFSET = -1
# A leader or state epoch not given (Kafka's -1 defaults of the share-state RPCs).
NO_EPOCH = -1


class ShareKey(NamedTuple):
    """The key of a share partition's records: (group id, topic id, partition)."""

    group_id: str
    topic_id: uuid.UUID
    partition: int


class StateBatch(NamedTuple):
    """A state batch as stored: offsets, delivery state (0/2/4), delivery count."""

    first_offset: int
    last_offset: int
    delivery_state: int
    delivery_count: int


def merge_batches(
    stored: Sequence[StateBatch], update: Iterable[StateBatch], start_offset: int
) -> list[StateBatch]:
    """Overlay `update` on `stored` (newer wins where they overlap), drop what lies
    below `start_offset`, and return the batches sorted and non-overlapping.

    Batches of `update` that overlap each other apply in sorted order, the later one
    winning. Linear in the batches (plus a sort that finds them already sorted): a
    leader acknowledging one type per offset writes thousands of single-offset batches
    per update, replayed into a stored list as long.
    """
    upd = sorted(update)
    if not _disjoint(upd):
        # Only a request whose batches overlap (never spool's leader): one overlay each.
        normal: list[StateBatch] = []
        for new in upd:
            normal = _overlay(normal, [new])
        upd = normal
    # Nothing stored: `upd`, sorted and disjoint already, is the result.
    result = _overlay(sorted(stored), upd) if upd and stored else upd or sorted(stored)
    if start_offset >= 0:
        result = [
            b if b.first_offset >= start_offset else b._replace(first_offset=start_offset)
            for b in result
            if b.last_offset >= start_offset
        ]
    return result


def _disjoint(batches: Sequence[StateBatch]) -> bool:
    return all(a.last_offset < b.first_offset for a, b in itertools.pairwise(batches))


def _overlay(stored: Sequence[StateBatch], update: Sequence[StateBatch]) -> list[StateBatch]:
    """`stored` (sorted by first offset) clipped around `update` (sorted, disjoint), plus
    `update`, sorted: one pass over both."""
    pieces: list[StateBatch] = []
    j = 0
    for old in stored:
        # Skip update batches wholly before `old` (stored firsts only grow).
        while j < len(update) and update[j].last_offset < old.first_offset:
            j += 1
        cursor = old.first_offset
        k = j
        while k < len(update) and update[k].first_offset <= old.last_offset:
            if update[k].first_offset > cursor:
                pieces.append(
                    old._replace(first_offset=cursor, last_offset=update[k].first_offset - 1)
                )
            cursor = update[k].last_offset + 1
            k += 1
        if cursor == old.first_offset:
            pieces.append(old)
        elif cursor <= old.last_offset:
            pieces.append(old._replace(first_offset=cursor))
    # Two sorted runs (when stored is disjoint): sorted() merges them in one pass.
    pieces.extend(update)
    pieces.sort()
    return pieces


@dataclass(frozen=True, slots=True)
class ShareSnapshot:
    """The full state of one share partition (ShareSnapshotKey + ShareSnapshotValue)."""

    key: ShareKey
    snapshot_epoch: int
    state_epoch: int
    leader_epoch: int
    start_offset: int
    create_timestamp_ms: int
    write_timestamp_ms: int
    batches: tuple[StateBatch, ...] = ()
    # Offsets at or above start_offset whose delivery is complete (ACKNOWLEDGED or
    # ARCHIVED); -1 when not known. DescribeShareGroupOffsets computes lag from it.
    delivery_complete_count: int = UNKNOWN_DELIVERY_COMPLETE_COUNT


@dataclass(frozen=True, slots=True)
class ShareUpdate:
    """A delta over the last snapshot (ShareUpdateKey + ShareUpdateValue).

    `start_offset` and `leader_epoch` are -1 when unchanged; `delivery_complete_count`
    replaces the stored one (-1: not known), as Kafka's merge of an update does.
    """

    key: ShareKey
    snapshot_epoch: int
    leader_epoch: int
    start_offset: int
    batches: tuple[StateBatch, ...] = ()
    delivery_complete_count: int = UNKNOWN_DELIVERY_COMPLETE_COUNT


@dataclass(frozen=True, slots=True)
class ShareTombstone:
    """The key's state is deleted (ShareSnapshotKey with a null value)."""

    key: ShareKey


ShareRecord = ShareSnapshot | ShareUpdate | ShareTombstone


# ------------------------------------------------------------------ encoding


def _write_uvarint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _encode_key(record_type: int, key: ShareKey) -> bytes:
    group = key.group_id.encode()
    if len(group) > _INT16_MAX:
        raise ValueError(f"group id of {len(group)} bytes is longer than {_INT16_MAX}")
    return b"".join(
        (
            _INT16.pack(record_type),
            _INT16.pack(len(group)),
            group,
            _KEY_TAIL.pack(key.topic_id.bytes, key.partition),
        )
    )


def _encode_batches(out: bytearray, batches: tuple[StateBatch, ...]) -> None:
    _write_uvarint(out, len(batches) + 1)
    for batch in batches:
        out += _STATE_BATCH.pack(*batch)
        out.append(0)  # no tagged fields


def _encode_tagged_fields(out: bytearray, delivery_complete_count: int) -> None:
    if delivery_complete_count == UNKNOWN_DELIVERY_COMPLETE_COUNT:
        out.append(0)  # the default is not written
        return
    out += bytes((1, DELIVERY_COMPLETE_COUNT_TAG, _INT32.size))
    out += _INT32.pack(delivery_complete_count)


def encode(record: ShareRecord) -> tuple[bytes, bytes | None]:
    """(key bytes, value bytes or None for a tombstone); struct.error/ValueError when a
    field does not fit its type."""
    if isinstance(record, ShareTombstone):
        return _encode_key(SNAPSHOT_RECORD_TYPE, record.key), None
    if isinstance(record, ShareSnapshot):
        value = bytearray(
            _SNAPSHOT_HEAD.pack(
                VALUE_VERSION,
                record.snapshot_epoch,
                record.state_epoch,
                record.leader_epoch,
                record.start_offset,
                record.create_timestamp_ms,
                record.write_timestamp_ms,
            )
        )
        _encode_batches(value, record.batches)
        _encode_tagged_fields(value, record.delivery_complete_count)
        return _encode_key(SNAPSHOT_RECORD_TYPE, record.key), bytes(value)
    value = bytearray(
        _UPDATE_HEAD.pack(
            VALUE_VERSION, record.snapshot_epoch, record.leader_epoch, record.start_offset
        )
    )
    _encode_batches(value, record.batches)
    _encode_tagged_fields(value, record.delivery_complete_count)
    return _encode_key(UPDATE_RECORD_TYPE, record.key), bytes(value)


# ------------------------------------------------------------------ decoding


class _Reader:
    """Bounds-checked cursor; every short read is a ValueError naming the field."""

    def __init__(self, data: bytes, what: str) -> None:
        self.data = data
        self.pos = 0
        self.what = what

    def take(self, size: int, field: str) -> bytes:
        end = self.pos + size
        if size < 0 or end > len(self.data):
            raise ValueError(
                f"share-state {self.what} truncated in {field}: need {size} bytes at byte "
                f"{self.pos}, {len(self.data) - self.pos} remain"
            )
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def unpack(self, fmt: struct.Struct, field: str) -> tuple[int, ...]:
        values: tuple[int, ...] = fmt.unpack(self.take(fmt.size, field))
        return values

    def uvarint(self, field: str) -> int:
        # Fast path: almost every varint here (counts, empty tag sections) is one byte.
        if self.pos < len(self.data) and self.data[self.pos] < 0x80:
            self.pos += 1
            return self.data[self.pos - 1]
        value = 0
        for i in range(_MAX_UVARINT_BYTES):
            (b,) = self.take(1, field)
            value |= (b & 0x7F) << (7 * i)
            if b < 0x80:
                return value
        raise ValueError(f"share-state {self.what} has a varint longer than 5 bytes in {field}")

    def skip_tagged_fields(self, field: str) -> None:
        for _ in range(self.uvarint(field)):
            self.uvarint(field)  # tag
            self.take(self.uvarint(field), field)

    def value_tagged_fields(self) -> int:
        """Read a value's tagged fields; returns DeliveryCompleteCount (-1 if absent)."""
        count = UNKNOWN_DELIVERY_COMPLETE_COUNT
        for _ in range(self.uvarint("tagged fields")):
            tag = self.uvarint("tagged field tag")
            data = self.take(self.uvarint("tagged field size"), f"tagged field {tag}")
            if tag == DELIVERY_COMPLETE_COUNT_TAG:
                if len(data) != _INT32.size:
                    raise ValueError(
                        f"share-state {self.what} has a DeliveryCompleteCount of {len(data)} "
                        f"bytes; expected {_INT32.size}"
                    )
                (count,) = _INT32.unpack(data)
        return count

    def expect_end(self) -> None:
        if self.pos != len(self.data):
            raise ValueError(
                f"share-state {self.what} has {len(self.data) - self.pos} bytes after its "
                "last field"
            )


@functools.lru_cache(maxsize=65536)
def _decode_key(data: bytes) -> tuple[int, ShareKey]:
    # Cached: a log holds many records for few keys, and keys are immutable.
    reader = _Reader(data, "record key")
    (record_type,) = reader.unpack(_INT16, "record type")
    if record_type not in (SNAPSHOT_RECORD_TYPE, UPDATE_RECORD_TYPE):
        raise ValueError(
            f"share-state record key has type {record_type}; expected 0 (ShareSnapshot) "
            "or 1 (ShareUpdate)"
        )
    (length,) = reader.unpack(_INT16, "GroupId length")
    if length < 0:
        raise ValueError("share-state record key has a null GroupId")
    raw_group = reader.take(length, "GroupId")
    try:
        group_id = raw_group.decode()
    except UnicodeDecodeError:
        raise ValueError("share-state record key has a GroupId that is not UTF-8") from None
    topic_id = uuid.UUID(bytes=reader.take(16, "TopicId"))
    (partition,) = reader.unpack(_INT32, "Partition")
    reader.expect_end()
    return record_type, ShareKey(group_id, topic_id, partition)


def _decode_batches(reader: _Reader) -> tuple[StateBatch, ...]:
    count = reader.uvarint("StateBatches length") - 1
    if count < 0:
        raise ValueError(f"share-state {reader.what} has null StateBatches")
    # Each batch takes at least 20 bytes: reject absurd counts before allocating.
    if count * (_STATE_BATCH.size + 1) > len(reader.data) - reader.pos:
        raise ValueError(
            f"share-state {reader.what} claims {count} state batches but only "
            f"{len(reader.data) - reader.pos} bytes remain"
        )
    batches = []
    data, size = reader.data, _STATE_BATCH.size
    for _ in range(count):
        pos = reader.pos
        if pos + size < len(data) and data[pos + size] == 0:
            # Common case, no tagged fields: one unpack, no per-field bookkeeping.
            batches.append(StateBatch._make(_STATE_BATCH.unpack_from(data, pos)))
            reader.pos = pos + size + 1
            continue
        batches.append(StateBatch(*reader.unpack(_STATE_BATCH, "StateBatch")))
        reader.skip_tagged_fields("StateBatch tagged fields")
    return tuple(batches)


def decode(key: bytes, value: bytes | None) -> ShareRecord:
    """The record stored as (key, value); ValueError saying what is wrong if it is not one."""
    record_type, share_key = _decode_key(bytes(key))
    if value is None:
        return ShareTombstone(share_key)
    if record_type == SNAPSHOT_RECORD_TYPE:
        reader = _Reader(bytes(value), "ShareSnapshotValue")
        version, snapshot_epoch, state_epoch, leader_epoch, start, created, written = reader.unpack(
            _SNAPSHOT_HEAD, "header fields"
        )
        _check_version(version, reader.what)
        batches = _decode_batches(reader)
        count = reader.value_tagged_fields()
        reader.expect_end()
        return ShareSnapshot(
            share_key,
            snapshot_epoch,
            state_epoch,
            leader_epoch,
            start,
            created,
            written,
            batches,
            count,
        )
    reader = _Reader(bytes(value), "ShareUpdateValue")
    version, snapshot_epoch, leader_epoch, start = reader.unpack(_UPDATE_HEAD, "header fields")
    _check_version(version, reader.what)
    batches = _decode_batches(reader)
    count = reader.value_tagged_fields()
    reader.expect_end()
    return ShareUpdate(share_key, snapshot_epoch, leader_epoch, start, batches, count)


def _check_version(version: int, what: str) -> None:
    if version != VALUE_VERSION:
        raise ValueError(f"{what} version {version} is not supported (only {VALUE_VERSION})")
