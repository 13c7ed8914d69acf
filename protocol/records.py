"""Record batches in Kafka's v2 format (magic 2).

The broker treats a batch as opaque bytes plus its 61-byte header: it validates the
CRC32C (which covers everything from `attributes` to the end of the batch), assigns
offsets by rewriting `base_offset` (not covered by the CRC), and indexes by the
header's offsets and timestamps. Records are decoded only where a feature needs
them (timestamp look-ups, tests, internal logs).

Layout of the header (all big-endian):

    base_offset int64 | batch_length int32 | partition_leader_epoch int32 | magic int8
    crc uint32 | attributes int16 | last_offset_delta int32 | base_timestamp int64
    max_timestamp int64 | producer_id int64 | producer_epoch int16
    base_sequence int32 | records_count int32
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

import crc32c

from protocol.compression import compress, decompress
from protocol.errors import CorruptRecordError

HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_SIZE = HEADER.size  # 61
# Bytes before `batch_length` counts: base_offset (8) + batch_length (4).
LOG_OVERHEAD = 12
# Offset of the first byte covered by the CRC (the attributes field).
CRC_START = 21
CRC_OFFSET = 17
MAGIC_OFFSET = 16
PARTITION_LEADER_EPOCH_OFFSET = 12
MAGIC_V2 = 2

# attributes bits
COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_FLAG = 0x10
CONTROL_FLAG = 0x20
DELETE_HORIZON_FLAG = 0x40

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_TIMESTAMP = -1


@dataclass(slots=True, frozen=True)
class BatchHeader:
    """The fixed-size header of a v2 record batch."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        """Total bytes of the batch on the wire / on disk."""
        return LOG_OVERHEAD + self.batch_length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def is_log_append_time(self) -> bool:
        return bool(self.attributes & TIMESTAMP_TYPE_MASK)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_FLAG)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG)

    @property
    def last_sequence(self) -> int:
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        # Sequences wrap at int32 max, as in Kafka's DefaultRecordBatch.
        return (self.base_sequence + self.last_offset_delta) % (2**31)


def parse_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Parse the header of the batch at `pos`; raise CorruptRecordError if it cannot be one."""
    if len(buf) - pos < HEADER_SIZE:
        raise CorruptRecordError(
            f"record batch header truncated: {len(buf) - pos} bytes, need {HEADER_SIZE}"
        )
    header = BatchHeader(*HEADER.unpack_from(buf, pos))
    if header.magic != MAGIC_V2:
        raise CorruptRecordError(
            f"unsupported record batch magic {header.magic}; only v2 batches (magic 2) are accepted"
        )
    if header.size < HEADER_SIZE:
        raise CorruptRecordError(f"record batch length {header.batch_length} is too small")
    if header.last_offset_delta < 0 or header.records_count < 0:
        raise CorruptRecordError("record batch has a negative record count or offset delta")
    return header


def compute_crc(buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader) -> int:
    """CRC32C of the batch body (attributes to end), as stored in the header."""
    view = memoryview(buf)[pos + CRC_START : pos + header.size]
    return int(crc32c.crc32c(view))


def validate_batch(buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader) -> None:
    """Check that the whole batch is present and its CRC matches."""
    if pos + header.size > len(buf):
        raise CorruptRecordError(
            f"record batch at byte {pos} claims {header.size} bytes but only "
            f"{len(buf) - pos} remain"
        )
    actual = compute_crc(buf, pos, header)
    if actual != header.crc:
        raise CorruptRecordError(
            f"record batch CRC mismatch at base offset {header.base_offset}: "
            f"stored {header.crc:#010x}, computed {actual:#010x}"
        )


def iter_batches(
    buf: bytes | bytearray | memoryview, *, validate: bool = True
) -> Iterator[tuple[int, BatchHeader]]:
    """Yield (position, header) for each complete batch in `buf`.

    With `validate`, a partial trailing batch or a bad CRC raises CorruptRecordError.
    Without it, iteration stops quietly at the first incomplete batch (as when reading
    a fetch response that was cut at max bytes).
    """
    pos = 0
    end = len(buf)
    while pos < end:
        if end - pos < HEADER_SIZE:
            if validate:
                raise CorruptRecordError(f"{end - pos} trailing bytes are not a record batch")
            return
        header = parse_header(buf, pos)
        if pos + header.size > end:
            if validate:
                raise CorruptRecordError(
                    f"record batch at byte {pos} claims {header.size} bytes but only "
                    f"{end - pos} remain"
                )
            return
        if validate:
            validate_batch(buf, pos, header)
        yield pos, header
        pos += header.size


def set_base_offset(buf: bytearray | memoryview, pos: int, base_offset: int) -> None:
    """Rewrite a batch's base offset in place (the CRC does not cover it)."""
    struct.pack_into(">q", buf, pos, base_offset)


def set_partition_leader_epoch(buf: bytearray | memoryview, pos: int, epoch: int) -> None:
    """Rewrite a batch's partition leader epoch in place (not covered by the CRC)."""
    struct.pack_into(">i", buf, pos + PARTITION_LEADER_EPOCH_OFFSET, epoch)


# ---------------------------------------------------------------------------
# Records inside a batch.
#
# Not kio.records: its reader truncates timestamps to whole seconds, knows no
# compression and decodes eagerly; here decoding is lazy (only on demand) and exact.
#
# Record layout (varints are zigzag-encoded):
#   length varint | attributes int8 | timestamp_delta varlong | offset_delta varint
#   key_length varint | key | value_length varint | value
#   header_count varint | (key_length varint | key utf-8 | value_length varint | value)*
# ---------------------------------------------------------------------------

ATTRIBUTES_OFFSET = 21
MAX_TIMESTAMP_OFFSET = 35
# A varlong takes at most 10 bytes; more continuation bits than that is corruption.
_MAX_VARINT_SHIFT = 63

Header = tuple[str, bytes | None]


@dataclass(slots=True, frozen=True)
class Record:
    """One decoded record with its absolute offset and effective timestamp (ms)."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()


@dataclass(slots=True, frozen=True)
class NewRecord:
    """A record to put in a batch built by `build_batch`.

    `timestamp` None takes the batch's `default_timestamp`; `offset_delta` None takes the
    record's position in the batch (explicit deltas let tests build compacted batches).
    """

    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()
    timestamp: int | None = None
    offset_delta: int | None = None


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """Decode a zigzag varint at `pos`; return (value, next position)."""
    b = data[pos]
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos + 1
    # Two bytes (values to 8191: most record lengths) without the loop.
    second = data[pos + 1]
    raw = (b & 0x7F) | ((second & 0x7F) << 7)
    if second < 0x80:
        return (raw >> 1) ^ -(raw & 1), pos + 2
    shift = 14
    pos += 2
    while True:
        b = data[pos]
        pos += 1
        raw |= (b & 0x7F) << shift
        if b < 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7
        if shift > _MAX_VARINT_SHIFT:
            raise CorruptRecordError(f"varint longer than 10 bytes at byte {pos}")


def _write_varint(out: bytearray, value: int) -> None:
    raw = (value << 1) ^ (value >> 63)
    while raw >= 0x80:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)


def decode_records(
    buf: bytes | bytearray | memoryview,
    pos: int,
    header: BatchHeader,
    *,
    max_decompressed_size: int | None = None,
) -> list[Record]:
    """Decode every record of the batch at `pos` (decompressing it if needed).

    The caller validates the CRC (`validate_batch`/`iter_batches`); this checks the
    structure of the records and raises CorruptRecordError saying what is wrong.
    """
    end = pos + header.size
    if end > len(buf):
        raise CorruptRecordError(
            f"record batch at byte {pos} claims {header.size} bytes but only "
            f"{len(buf) - pos} remain"
        )
    body = memoryview(buf)[pos + HEADER_SIZE : end]
    if header.compression:
        data = decompress(header.compression, body, max_size=max_decompressed_size)
    else:
        data = bytes(body)
    try:
        return _decode_records(data, header)
    except IndexError:
        raise CorruptRecordError(
            f"record batch at base offset {header.base_offset} ends inside a record"
        ) from None
    except UnicodeDecodeError:
        raise CorruptRecordError(
            f"record batch at base offset {header.base_offset} has a header key that is not UTF-8"
        ) from None


def record_starts(data: bytes, count: int, pos: int = 0, end: int | None = None) -> list[int]:
    """Where each of the `count` records of an uncompressed batch body starts (the body
    is `data[pos:end]`, the bytes after the batch header; positions are in `data`), and
    where the last ends: `count + 1` positions, found by reading only each record's
    length. With them `record_parts` reads a few records of a large batch without the
    others. Raises CorruptRecordError if a length runs past the end."""
    starts = [pos]
    append = starts.append
    size = len(data) if end is None else end
    try:
        for _ in range(count):
            b = data[pos]
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            elif data[pos + 1] < 0x80:  # two bytes, as `_read_varint` reads them
                raw = (b & 0x7F) | (data[pos + 1] << 7)
                length = (raw >> 1) ^ -(raw & 1)
                pos += 2
            else:
                length, pos = _read_varint(data, pos)
            pos += length
            if length < 0 or pos > size:
                raise CorruptRecordError(
                    f"record {len(starts) - 1} of a batch has length {length} but the "
                    f"batch ends {size - pos + length} bytes after it"
                )
            append(pos)
    except IndexError:
        raise CorruptRecordError(f"a batch of {count} records ends inside a record") from None
    return starts


def _decode_records(data: bytes, header: BatchHeader) -> list[Record]:
    read = _read_varint
    base_offset = header.base_offset
    base_timestamp = header.base_timestamp
    # LogAppendTime batches report the broker's time for every record, as Kafka does.
    append_time = header.max_timestamp if header.is_log_append_time else None
    records: list[Record] = []
    pos = 0
    size = len(data)
    for _ in range(header.records_count):
        length, pos = read(data, pos)
        record_end = pos + length
        if length < 0 or record_end > size:
            raise CorruptRecordError(
                f"record {len(records)} of batch at base offset {base_offset} has "
                f"length {length} but {size - pos} bytes remain"
            )
        pos += 1  # record attributes: unused in v2
        timestamp_delta, pos = read(data, pos)
        # One-byte varints inlined: offset deltas and key lengths are nearly always small.
        b = data[pos]
        if b < 0x80:
            offset_delta = (b >> 1) ^ -(b & 1)
            pos += 1
        else:
            offset_delta, pos = read(data, pos)
        b = data[pos]
        if b < 0x80:
            key_length = (b >> 1) ^ -(b & 1)
            pos += 1
        else:
            key_length, pos = read(data, pos)
        if key_length < 0:
            key = None
        else:
            key = data[pos : pos + key_length]
            pos += key_length
        value_length, pos = read(data, pos)
        if value_length < 0:
            value = None
        else:
            value = data[pos : pos + value_length]
            pos += value_length
        headers: tuple[Header, ...] = ()
        if data[pos] == 0:
            pos += 1
        else:
            header_count, pos = read(data, pos)
            if header_count < 0:
                raise CorruptRecordError(
                    f"record at offset delta {offset_delta} has a negative header count"
                )
            header_list: list[Header] = []
            for _h in range(header_count):
                name_length, pos = read(data, pos)
                if name_length < 0:
                    raise CorruptRecordError(
                        f"record at offset delta {offset_delta} has a null header key"
                    )
                name = data[pos : pos + name_length].decode()
                pos += name_length
                header_value_length, pos = read(data, pos)
                if header_value_length < 0:
                    header_value = None
                else:
                    header_value = data[pos : pos + header_value_length]
                    pos += header_value_length
                header_list.append((name, header_value))
            headers = tuple(header_list)
        if pos != record_end:
            raise CorruptRecordError(
                f"record at offset delta {offset_delta} of batch at base offset "
                f"{base_offset} declares {length} bytes but its fields take "
                f"{length + pos - record_end}"
            )
        records.append(
            Record(
                base_offset + offset_delta,
                base_timestamp + timestamp_delta if append_time is None else append_time,
                key,
                value,
                headers,
            )
        )
    if pos != size:
        raise CorruptRecordError(
            f"record batch at base offset {base_offset} has {size - pos} bytes after its "
            f"{header.records_count} declared records"
        )
    return records


def build_batch(
    records: Sequence[NewRecord | Record],
    *,
    base_offset: int = 0,
    compression: int = 0,
    default_timestamp: int = NO_TIMESTAMP,
    log_append_time: int | None = None,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    is_transactional: bool = False,
    is_control: bool = False,
    partition_leader_epoch: int = -1,
) -> bytes:
    """Build a complete v2 batch with a valid CRC32C.

    A `Record` keeps its offset (relative to `base_offset`) and timestamp. With
    `log_append_time` the batch is a LogAppendTime batch whose max timestamp is that
    time; otherwise it is CreateTime.
    """
    if not records:
        raise ValueError("a record batch needs at least one record")
    entries: list[tuple[int, int, bytes | None, bytes | None, tuple[Header, ...]]] = []
    last_delta = -1
    for index, record in enumerate(records):
        if isinstance(record, Record):
            delta = record.offset - base_offset
            timestamp = record.timestamp
        else:
            delta = index if record.offset_delta is None else record.offset_delta
            timestamp = default_timestamp if record.timestamp is None else record.timestamp
        if delta <= last_delta:
            raise ValueError(f"offset deltas must increase: {delta} after {last_delta}")
        last_delta = delta
        entries.append((delta, timestamp, record.key, record.value, record.headers))

    base_timestamp = entries[0][1]
    max_timestamp = max(entry[1] for entry in entries)
    payload = bytearray()
    body = bytearray()
    for delta, timestamp, key, value, headers in entries:
        body.clear()
        body.append(0)
        _write_varint(body, timestamp - base_timestamp)
        _write_varint(body, delta)
        body += encode_record_tail(key, value, headers)
        _write_varint(payload, len(body))
        payload += body

    attributes = compression & COMPRESSION_MASK
    if log_append_time is not None:
        attributes |= TIMESTAMP_TYPE_MASK
        max_timestamp = log_append_time
    if is_transactional:
        attributes |= TRANSACTIONAL_FLAG
    if is_control:
        attributes |= CONTROL_FLAG
    section = compress(compression, payload) if compression else bytes(payload)
    out = bytearray(HEADER_SIZE)
    out += section
    _seal_batch(
        out,
        base_offset=base_offset,
        partition_leader_epoch=partition_leader_epoch,
        attributes=attributes,
        last_offset_delta=last_delta,
        base_timestamp=base_timestamp,
        max_timestamp=max_timestamp,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        records_count=len(entries),
    )
    return bytes(out)


def _seal_batch(
    out: bytearray,
    *,
    base_offset: int,
    partition_leader_epoch: int,
    attributes: int,
    last_offset_delta: int,
    base_timestamp: int,
    max_timestamp: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    records_count: int,
) -> None:
    """Write the v2 header into `out`'s first HEADER_SIZE bytes (the records follow)
    and its CRC32C."""
    HEADER.pack_into(
        out,
        0,
        base_offset,
        len(out) - LOG_OVERHEAD,
        partition_leader_epoch,
        MAGIC_V2,
        0,
        attributes,
        last_offset_delta,
        base_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        records_count,
    )
    struct.pack_into(">I", out, CRC_OFFSET, crc32c.crc32c(memoryview(out)[CRC_START:]))


def varint(value: int) -> bytes:
    """`value` as a zigzag varint, as a v2 batch encodes lengths and deltas."""
    if 0 <= value < _SMALL_VARINTS_TO:
        return _SMALL_VARINTS[value]
    return _encoded_varint(value)


def _encoded_varint(value: int) -> bytes:
    out = bytearray()
    _write_varint(out, value)
    return bytes(out)


# Header counts and lengths of short header values, encoded once.
_SMALL_VARINTS_TO = 1024
_SMALL_VARINTS = tuple(_encoded_varint(value) for value in range(_SMALL_VARINTS_TO))


def encode_header(name: bytes, value: bytes | None) -> bytes:
    """One record header (its key already UTF-8) as a v2 batch encodes it."""
    out = bytearray()
    _write_bytes(out, name)
    _write_bytes(out, value)
    return bytes(out)


def encode_record_tail(
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[Header],
    extra: bytes = b"",
    extra_count: int = 0,
) -> bytes:
    """A record's fields after its offset delta (key, value, header count, headers) as a
    v2 batch encodes them; `extra` (`extra_count` headers, already encoded) goes before
    `headers`. With a timestamp each, such tails make a batch (`build_batch_of_tails`)."""
    out = bytearray()
    _write_bytes(out, key)
    _write_bytes(out, value)
    _write_varint(out, extra_count + len(headers))
    out += extra
    for name, header_value in headers:
        _write_bytes(out, name.encode())
        _write_bytes(out, header_value)
    return bytes(out)


class RecordParts(NamedTuple):
    """Where the fields of one record of an uncompressed batch body lie (`record_parts`):
    its timestamp and offset deltas, then its key and value (`fields` up to
    `headers_count_at`), its header count, and its headers (`headers_at` up to `end`)."""

    timestamp_delta: int
    offset_delta: int
    fields: int
    headers_count_at: int
    header_count: int
    headers_at: int
    end: int


def record_parts(data: bytes, pos: int) -> RecordParts:
    """The parts of the record starting at `pos` (at its length) in an uncompressed
    batch body, read without copying them: a record can then be re-encoded with other
    deltas or more headers by slicing `data` (`encode_record_tail`'s layout). Raises
    CorruptRecordError if its lengths run past it."""
    read = _read_varint
    try:
        length, pos = read(data, pos)
        end = pos + length
        if length < 0 or end > len(data):
            raise CorruptRecordError(f"a record of length {length} runs past its batch")
        timestamp_delta, pos = read(data, pos + 1)  # after the attributes
        offset_delta, fields = read(data, pos)
        key_size, pos = read(data, fields)
        value_size, pos = read(data, pos + max(key_size, 0))
        count_at = pos + max(value_size, 0)
        header_count, pos = read(data, count_at)
    except IndexError:
        raise CorruptRecordError("a record ends inside its fields") from None
    if header_count < 0 or pos > end:
        raise CorruptRecordError(f"a record at offset delta {offset_delta} is malformed")
    return RecordParts(timestamp_delta, offset_delta, fields, count_at, header_count, pos, end)


def tails_with_headers(
    data: bytes,
    starts: Sequence[int],
    lo: int,
    hi: int,
    header: BatchHeader,
    extra: Callable[[int], bytes],
    extra_count: int,
) -> list[tuple[int, bytes]] | None:
    """The records at indexes [lo, hi) of the uncompressed batch `header` (their
    positions `starts`, from `record_starts`) as (timestamp, tail) with more headers
    before their own: `extra(offset)`, `extra_count` encoded headers. Spliced from
    `data`, nothing decoded; None if an offset delta is not its index (a compacted
    batch: decode it instead). Raises CorruptRecordError as `record_parts`."""
    out: list[tuple[int, bytes]] = []
    append = out.append
    base_offset = header.base_offset
    base_timestamp = header.base_timestamp
    append_time = header.max_timestamp if header.is_log_append_time else None
    for index in range(lo, hi):
        (ts_delta, offset_delta, fields, count_at, count, headers_at, end) = record_parts(
            data, starts[index]
        )
        if offset_delta != index or end != starts[index + 1]:
            return None
        append(
            (
                base_timestamp + ts_delta if append_time is None else append_time,
                b"".join(
                    (
                        data[fields:count_at],
                        varint(count + extra_count),
                        extra(base_offset + index),
                        data[headers_at:end],
                    )
                ),
            )
        )
    return out


def build_batch_of_tails(records: Sequence[tuple[int, bytes]]) -> bytes:
    """`build_batch` (CreateTime, uncompressed, no producer) of records given as
    (timestamp, tail): `tail` their fields after the offset delta (`encode_record_tail`),
    offset deltas 0, 1, 2, ..."""
    if not records:
        raise ValueError("a record batch needs at least one record")
    base_timestamp = records[0][0]
    max_timestamp = base_timestamp
    out = bytearray(HEADER_SIZE)
    encoded = varint
    for delta, (timestamp, tail) in enumerate(records):
        if timestamp > max_timestamp:
            max_timestamp = timestamp
        # attributes 0, the timestamp delta, the offset delta: then the tail
        head = b"\x00" + encoded(timestamp - base_timestamp) + encoded(delta)
        out += encoded(len(head) + len(tail))
        out += head
        out += tail
    _seal_batch(
        out,
        base_offset=0,
        partition_leader_epoch=-1,
        attributes=0,
        last_offset_delta=len(records) - 1,
        base_timestamp=base_timestamp,
        max_timestamp=max_timestamp,
        producer_id=NO_PRODUCER_ID,
        producer_epoch=NO_PRODUCER_EPOCH,
        base_sequence=NO_SEQUENCE,
        records_count=len(records),
    )
    return bytes(out)


def _write_bytes(out: bytearray, data: bytes | None) -> None:
    if data is None:
        out.append(0x01)  # zigzag(-1)
        return
    _write_varint(out, len(data))
    out += data


def set_log_append_time(
    buf: bytearray | memoryview, pos: int, header: BatchHeader, timestamp_ms: int
) -> BatchHeader:
    """Mark the batch LogAppendTime with `timestamp_ms` as its max timestamp, in place.

    Kafka does this on append for topics with message.timestamp.type=LogAppendTime;
    both fields are under the CRC, so it is recomputed. Returns the updated header.
    """
    attributes = header.attributes | TIMESTAMP_TYPE_MASK
    struct.pack_into(">h", buf, pos + ATTRIBUTES_OFFSET, attributes)
    struct.pack_into(">q", buf, pos + MAX_TIMESTAMP_OFFSET, timestamp_ms)
    updated = replace(header, attributes=attributes, max_timestamp=timestamp_ms)
    crc = compute_crc(buf, pos, updated)
    struct.pack_into(">I", buf, pos + CRC_OFFSET, crc)
    return replace(updated, crc=crc)


# ---------------------------------------------------------------------------
# Control batches (transaction markers).
#
# A control batch (attributes bit 5) holds one control record whose key is
# `version int16 (0) | type int16` (Kafka's ControlRecordType: 0 ABORT, 1 COMMIT) and,
# for transaction markers, whose value is Kafka's EndTxnMarker:
# `version int16 (0) | coordinator_epoch int32`.
# ---------------------------------------------------------------------------

CONTROL_ABORT = 0
CONTROL_COMMIT = 1
_CONTROL_KEY = struct.Struct(">hh")
_END_TXN_MARKER = struct.Struct(">hi")


@dataclass(slots=True, frozen=True)
class EndTxnMarker:
    """A COMMIT or ABORT marker read from a control record."""

    commit: bool
    coordinator_epoch: int


def control_type(key: bytes | None) -> int:
    """The control record type of a control record's key (Kafka's ControlRecordType.parse)."""
    if key is None or len(key) < _CONTROL_KEY.size:
        raise CorruptRecordError(
            f"control record key has {0 if key is None else len(key)} bytes, need at least "
            f"{_CONTROL_KEY.size}"
        )
    version, kind = _CONTROL_KEY.unpack_from(key)
    if version < 0:
        raise CorruptRecordError(f"control record key has negative version {version}")
    return int(kind)


def read_end_txn_marker(record: Record) -> EndTxnMarker | None:
    """The transaction marker a control record holds; None for other control types."""
    kind = control_type(record.key)
    if kind not in (CONTROL_ABORT, CONTROL_COMMIT):
        return None
    value = record.value
    if value is None or len(value) < _END_TXN_MARKER.size:
        raise CorruptRecordError("transaction marker value is shorter than its 6 bytes")
    version, coordinator_epoch = _END_TXN_MARKER.unpack_from(value)
    if version < 0:
        raise CorruptRecordError(f"transaction marker has negative version {version}")
    return EndTxnMarker(kind == CONTROL_COMMIT, coordinator_epoch)


def build_end_txn_marker_batch(
    *,
    producer_id: int,
    producer_epoch: int,
    commit: bool,
    coordinator_epoch: int,
    timestamp: int,
    base_offset: int = 0,
    partition_leader_epoch: int = -1,
) -> bytes:
    """One control batch holding a COMMIT or ABORT marker, as Kafka's transaction
    coordinator has the partition leader write it (transactional, no sequence)."""
    key = _CONTROL_KEY.pack(0, CONTROL_COMMIT if commit else CONTROL_ABORT)
    value = _END_TXN_MARKER.pack(0, coordinator_epoch)
    return build_batch(
        [NewRecord(key, value)],
        base_offset=base_offset,
        default_timestamp=timestamp,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        is_transactional=True,
        is_control=True,
        partition_leader_epoch=partition_leader_epoch,
    )


def read_batch_marker(
    buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader
) -> EndTxnMarker | None:
    """The transaction marker of the control batch at `pos`; None for a data batch, an
    empty control batch (its transaction was cleaned away) or another control type."""
    if not header.is_control:
        return None
    records = decode_records(buf, pos, header)
    if not records:
        return None
    return read_end_txn_marker(records[0])
