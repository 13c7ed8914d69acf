"""A structure check of request bytes, run before kio decodes them.

kio's native reader trusts every declared length: a compact array claiming 2^32-2
elements makes it reserve ~34 GB up front and the process aborts. Kafka's generated
readers refuse such input ("Tried to allocate a collection of size N, but there are
only M bytes remaining"); this module does the same for spool. It walks kio's schema
for the entity class (dataclass fields, their `kafka_type` and `tag` metadata,
`__flexible__`, nested entity classes, tuples as arrays, `X | None` as nullable) and
checks every length against the bytes left, without allocating anything in
proportion to a declared length. Record batches are skipped by their length, so a
Produce of megabytes costs the same as an empty one.

Two outcomes besides passing:
- `protocol.api.MalformedRequest`: the bytes cannot be parsed (a length past the end,
  a truncated field, a bad varint). The stream cannot be trusted; the connection closes.
- `InvalidRequest`: the bytes parse but break the schema's rules (null where the
  field is not nullable, a negative length other than -1, text that is not UTF-8, a
  value kio cannot represent). The broker answers INVALID_REQUEST.

The check mirrors what kio's reader accepts, so a body that passes always decodes.
Unknown tagged fields are the one place kio is stricter than Kafka (it raises where
Kafka skips them, KIP-482); the check returns a copy of the frame without them.
Checkers are compiled once per entity class. The request header is read the same
way (`decode_request_header`, which the server calls on every frame).

The guard sits above `protocol.api`: it takes the schema classes and `MalformedRequest`
from there, and api imports nothing of it.
"""

from __future__ import annotations

import dataclasses
import datetime
import struct
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kio.schema.errors import ErrorCode as KioErrorCode

# kio's own field classification, so the check reads fields exactly as kio does.
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    is_optional,
)

from protocol.api import (
    API_VERSIONS_KEY,
    HEADER_PREFIX,
    MalformedRequest,
    RequestHeader,
    UnknownApi,
    is_flexible,
    request_class,
)

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")

_FIXED_WIDTH = {
    "int8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "uint8": 1,
    "uint16": 2,
    "uint32": 4,
    "uint64": 8,
    "float64": 8,
    "uuid": 16,
    "timedelta_i32": 4,  # any int32 of milliseconds is a valid timedelta
}
_ERROR_CODES = frozenset(int(code.value) for code in KioErrorCode)
# datetime.fromtimestamp's limit (year 9999), in whole seconds.
_MAX_TIMESTAMP_S = 253_402_300_799


class InvalidRequest(Exception):
    """The request parses but breaks its schema's rules: answer INVALID_REQUEST."""

    def __init__(self, field_path: str, reason: str) -> None:
        super().__init__(f"{field_path}: {reason}" if field_path else reason)
        self.field_path = field_path
        self.reason = reason


class _Fail(Exception):
    """Internal: where and why a check failed. `parts` is the field path, innermost first."""

    def __init__(self, reason: str, *, invalid: bool = False, part: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.invalid = invalid
        self.parts: list[str] = [] if part is None else [part]

    def path(self) -> str:
        out = ""
        for part in reversed(self.parts):
            out += part if part.startswith("[") or not out else "." + part
        return out

    def describe(self) -> str:
        path = self.path()
        return f"{path}: {self.reason}" if path else self.reason


class _Ctx:
    """Per-check state: byte edits that strip unknown tags, and whether rule breaks
    (as opposed to unparseable bytes) are only noted instead of raised."""

    __slots__ = ("edits", "lenient")

    def __init__(self, lenient: bool = False) -> None:
        self.edits: list[tuple[int, int, bytes]] = []
        self.lenient = lenient


# A compiled check: (buffer, position, end of the readable bytes, ctx) -> new position.
Check = Callable[[bytes, int, int, _Ctx], int]


@dataclass(frozen=True, slots=True)
class _Compiled:
    check: Check
    min_size: int  # bytes the smallest valid encoding takes
    fixed: int | None = None  # exact size when every encoding has it and needs no check


def _violate(ctx: _Ctx, reason: str) -> None:
    if not ctx.lenient:
        raise _Fail(reason, invalid=True)


def _uvarint(buf: bytes, pos: int, end: int, limit: int = 5) -> tuple[int, int]:
    """An unsigned varint of at most `limit` bytes (5 for int32, 10 for int64)."""
    if pos < end:
        b = buf[pos]
        if b < 0x80:
            return b, pos + 1
    value = 0
    shift = 0
    for _ in range(limit):
        if pos >= end:
            raise _Fail("varint cut short by the end of the request")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
    raise _Fail(f"varint longer than {limit} bytes")


def _encode_uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _need(width: int, pos: int, end: int) -> None:
    if pos + width > end:
        raise _Fail(f"{width} bytes needed but {max(end - pos, 0)} left")


# -- primitives ------------------------------------------------------------------


def _fixed_run(fields: list[tuple[str, int]]) -> Check:
    """Consecutive fixed-width fields of an entity, checked as one span."""
    total = sum(width for _, width in fields)

    def check(buf: bytes, pos: int, end: int, ctx: _Ctx) -> int:
        if pos + total > end:
            for name, width in fields:
                if pos + width > end:
                    raise _Fail(
                        f"{width} bytes needed but {max(end - pos, 0)} left", part=name or None
                    )
                pos += width
        return pos + total

    return check


def _check_bool(buf: bytes, pos: int, end: int, ctx: _Ctx) -> int:
    _need(1, pos, end)
    if buf[pos] > 1:
        _violate(ctx, f"boolean byte is {buf[pos]}, not 0 or 1")
    return pos + 1


def _check_error_code(buf: bytes, pos: int, end: int, ctx: _Ctx) -> int:
    _need(2, pos, end)
    (code,) = _I16.unpack_from(buf, pos)
    if code not in _ERROR_CODES:
        _violate(ctx, f"unknown error code {code}")
    return pos + 2


def _check_timedelta_i64(buf: bytes, pos: int, end: int, ctx: _Ctx) -> int:
    _need(8, pos, end)
    (ms,) = _I64.unpack_from(buf, pos)
    try:
        datetime.timedelta(milliseconds=ms)
    except OverflowError:
        _violate(ctx, f"duration of {ms} ms is out of range")
    return pos + 8


def _datetime_check(nullable: bool) -> Check:
    def check(buf: bytes, pos: int, end: int, ctx: _Ctx) -> int:
        _need(8, pos, end)
        (ms,) = _I64.unpack_from(buf, pos)
        if ms == -1 and nullable:
            return pos + 8
        if ms < 0:
            _violate(ctx, f"negative timestamp {ms}")
        elif ms // 1000 > _MAX_TIMESTAMP_S:
            _violate(ctx, f"timestamp {ms} is past year 9999")
        return pos + 8

    return check


def _utf8_error(buf: bytes, pos: int, stop: int) -> str | None:
    try:
        buf[pos:stop].decode()
    except UnicodeDecodeError as exc:
        return f"not valid UTF-8 at byte {exc.start}"
    return None


def _compact_string(nullable: bool, utf8: bool) -> Check:
    what = "string" if utf8 else "bytes"

    def check(buf: bytes, pos: int, end: int, ctx: _Ctx) -> int:
        value, pos = _uvarint(buf, pos, end)
        if value == 0:
            if not nullable:
                _violate(ctx, f"null {what}, but the field is not nullable")
            return pos
        size = value - 1
        if size > end - pos:
            raise _Fail(f"{what} of {size} bytes but {end - pos} bytes left")
        if utf8 and size and (error := _utf8_error(buf, pos, pos + size)):
            _violate(ctx, error)
        return pos + size

    return check


def _legacy_string(nullable: bool, utf8: bool) -> Check:
    what = "string" if utf8 else "bytes"
    header = _I16 if utf8 else _I32
    width = header.size

    def check(buf: bytes, pos: int, end: int, ctx: _Ctx) -> int:
        _need(width, pos, end)
        size: int = header.unpack_from(buf, pos)[0]
        pos += width
        if size < 0:
            if size != -1:
                _violate(ctx, f"negative {what} length {size}")
            elif not nullable:
                _violate(ctx, f"null {what}, but the field is not nullable")
            return pos
        if size > end - pos:
            raise _Fail(f"{what} of {size} bytes but {end - pos} bytes left")
        if utf8 and size and (error := _utf8_error(buf, pos, pos + size)):
            _violate(ctx, error)
        return pos + size

    return check


def _primitive(kafka_type: str, flexible: bool, optional: bool) -> _Compiled:
    """The check for one primitive value; the same (type, flexible, optional) table as
    kio's `get_reader`."""
    width = _FIXED_WIDTH.get(kafka_type)
    if width is not None and (not optional or kafka_type == "uuid"):
        return _Compiled(_fixed_run([("", width)]), width, width)
    if optional and kafka_type not in ("string", "bytes", "records", "datetime_i64"):
        raise TypeError(f"kio has no reader for nullable {kafka_type}")
    if kafka_type == "bool":
        return _Compiled(_check_bool, 1)
    if kafka_type == "error_code":
        return _Compiled(_check_error_code, 2)
    if kafka_type == "timedelta_i64":
        return _Compiled(_check_timedelta_i64, 8)
    if kafka_type == "datetime_i64":
        return _Compiled(_datetime_check(optional), 8)
    if kafka_type in ("string", "bytes", "records"):
        utf8 = kafka_type == "string"
        if flexible:
            return _Compiled(_compact_string(optional, utf8), 1)
        return _Compiled(_legacy_string(optional, utf8), 2 if utf8 else 4)
    raise TypeError(f"kio has no reader for kafka_type {kafka_type!r}")


# -- arrays ----------------------------------------------------------------------


def _too_many(count: int, item: _Compiled, left: int) -> str:
    each = f" of at least {item.min_size} bytes each" if item.min_size > 1 else ""
    return f"array of {count} elements{each} but {left} bytes left"


def _array_items(item: _Compiled) -> Callable[[bytes, int, int, _Ctx, int], int]:
    """Check `count` items; the count was already bounded by the bytes left."""
    min_size, fixed, check_item = item.min_size, item.fixed, item.check

    def items(buf: bytes, pos: int, end: int, ctx: _Ctx, count: int) -> int:
        # Kafka's rule for a declared collection size, tightened by the smallest item.
        left = end - pos
        if count > left or count * min_size > left:
            raise _Fail(_too_many(count, item, left))
        if fixed is not None:
            return pos + count * fixed
        index = 0
        try:
            while index < count:
                pos = check_item(buf, pos, end, ctx)
                index += 1
        except _Fail as fail:
            fail.parts.append(f"[{index}]")
            raise
        return pos

    return items


def _compact_array(item: _Compiled, nullable: bool) -> Check:
    items = _array_items(item)

    def check(buf: bytes, pos: int, end: int, ctx: _Ctx) -> int:
        value, pos = _uvarint(buf, pos, end)
        if value == 0:
            if not nullable:
                _violate(ctx, "null array, but the field is not nullable")
            return pos
        return items(buf, pos, end, ctx, value - 1)

    return check


def _legacy_array(item: _Compiled, nullable: bool) -> Check:
    items = _array_items(item)

    def check(buf: bytes, pos: int, end: int, ctx: _Ctx) -> int:
        _need(4, pos, end)
        (count,) = _I32.unpack_from(buf, pos)
        pos += 4
        if count < 0:
            if count != -1:
                _violate(ctx, f"negative array length {count}")
            elif not nullable:
                _violate(ctx, "null array, but the field is not nullable")
            return pos
        return items(buf, pos, end, ctx, count)

    return check


# -- entities --------------------------------------------------------------------


def _tagged_fields(known: dict[int, tuple[str, Check]]) -> Check:
    """A tagged-field section (KIP-482): a count, then (tag, size, value) each.

    Each size must fit the bytes left; a known tag's value must take exactly its size
    (kio reads the value and ignores the size, so a mismatch would desynchronise it).
    Unknown tags are skipped, as Kafka does, and noted for removal because kio
    raises on them.
    """

    def section(buf: bytes, pos: int, end: int, ctx: _Ctx) -> int:
        count_at = pos
        count, pos = _uvarint(buf, pos, end)
        if count == 0:
            return pos
        count_end = pos
        if count * 2 > end - pos:
            raise _Fail(f"{count} tagged fields but {end - pos} bytes left")
        unknown: list[tuple[int, int, bytes]] = []
        for _ in range(count):
            tag_at = pos
            tag, pos = _uvarint(buf, pos, end)
            size_at = pos
            size, pos = _uvarint(buf, pos, end)
            stop = pos + size
            if stop > end:
                raise _Fail(f"tag {tag} of {size} bytes but {end - pos} bytes left")
            field = known.get(tag)
            if field is None:
                unknown.append((tag_at, stop, b""))
            else:
                name, check_value = field
                mark = len(ctx.edits)
                try:
                    got = check_value(buf, pos, stop, ctx)
                except _Fail as fail:
                    fail.parts.append(name)
                    raise
                if got != stop:
                    raise _Fail(
                        f"tag {tag} declares {size} bytes but its value takes {got - pos}",
                        part=name,
                    )
                if len(ctx.edits) > mark:
                    # Unknown tags stripped inside this value shrink it: fix its size.
                    delta = sum(len(new) - (b - a) for a, b, new in ctx.edits[mark:])
                    ctx.edits.append((size_at, pos, _encode_uvarint(size + delta)))
            pos = stop
        if unknown:
            ctx.edits.append((count_at, count_end, _encode_uvarint(count - len(unknown))))
            ctx.edits.extend(unknown)
        return pos

    def check(buf: bytes, pos: int, end: int, ctx: _Ctx) -> int:
        try:
            return section(buf, pos, end, ctx)
        except _Fail as fail:
            if not fail.parts:
                fail.parts.append("_tagged_fields")
            raise

    return check


def _skip_tagged_fields(buf: bytes, pos: int, end: int) -> int:
    return _tagged_fields({})(buf, pos, end, _Ctx())


_entities: dict[tuple[type[Any], bool], _Compiled] = {}


def _entity(cls: type[Any], nullable: bool) -> _Compiled:
    cached = _entities.get((cls, nullable))
    if cached is None:
        cached = _entities[(cls, nullable)] = _compile_entity(cls, nullable)
    return cached


def _field(owner: type[Any], f: dataclasses.Field[Any], tagged: bool) -> _Compiled:
    """One field, classified as kio's `build_field_schema` does."""
    flexible = bool(owner.__flexible__)
    if owner.__name__ == "RequestHeader" and f.name == "client_id":
        return _primitive("string", False, True)  # always a legacy string (KIP-482)
    kind = classify_field(f)
    if isinstance(kind, EntityField):
        return _entity(kind.type_, is_optional(f))
    if isinstance(kind, EntityTupleField):
        item = _entity(kind.type_, False)
    elif isinstance(kind, PrimitiveTupleField):
        item = _primitive(f.metadata["kafka_type"], flexible, False)
    else:
        return _primitive(f.metadata["kafka_type"], flexible, is_optional(f) and not tagged)
    # kio reads a null array of any field as None; only `tuple[...] | None` allows it.
    nullable = typing.get_origin(f.type) in (types.UnionType, typing.Union)
    if flexible:
        return _Compiled(_compact_array(item, nullable), 1)
    return _Compiled(_legacy_array(item, nullable), 4)


def _compile_entity(cls: type[Any], nullable: bool) -> _Compiled:
    flexible = bool(cls.__flexible__)
    steps: list[tuple[str | None, Check]] = []
    run: list[tuple[str, int]] = []
    min_size = 1 if flexible else 0
    fixed: int | None = 0
    known_tags: dict[int, tuple[str, Check]] = {}
    all_fixed: list[tuple[str, int]] = []
    for f in dataclasses.fields(cls):
        tag = get_field_tag(f)
        compiled = _field(cls, f, tagged=tag is not None)
        if tag is not None:
            known_tags[int(tag)] = (f.name, compiled.check)
            continue
        min_size += compiled.min_size
        if compiled.fixed is not None:
            run.append((f.name, compiled.fixed))
            all_fixed.append((f.name, compiled.fixed))
            continue
        fixed = None
        if run:
            steps.append((None, _fixed_run(run)))
            run = []
        steps.append((f.name, compiled.check))
    if run:
        steps.append((None, _fixed_run(run)))
    if fixed is not None and not nullable and not flexible:
        # Only fixed-width fields: an array of these is skipped in one step.
        return _Compiled(_fixed_run(all_fixed), min_size, min_size)
    tagged = _tagged_fields(known_tags)

    def check(buf: bytes, pos: int, end: int, ctx: _Ctx) -> int:
        if nullable:
            # KIP-893 nullable struct: an int8 marker, -1 for null (kio's reading).
            _need(1, pos, end)
            pos += 1
            if buf[pos - 1] == 0xFF:
                return pos
        for name, step in steps:
            try:
                pos = step(buf, pos, end, ctx)
            except _Fail as fail:
                if name is not None:
                    fail.parts.append(name)
                raise
        if flexible:
            # Nearly every tagged-field section is empty: one zero byte.
            if pos < end and buf[pos] == 0:
                return pos + 1
            return tagged(buf, pos, end, ctx)
        return pos

    return _Compiled(check, 1 if nullable else min_size)


def _apply(buf: bytes, edits: list[tuple[int, int, bytes]]) -> bytes:
    out = bytearray()
    at = 0
    for start, stop, new in sorted(edits):
        out += buf[at:start]
        out += new
        at = stop
    out += buf[at:]
    return bytes(out)


# -- entry points ----------------------------------------------------------------


def check_entity(cls: type[Any], frame: bytes | bytearray | memoryview, offset: int) -> bytes:
    """Check the encoded entity of class `cls` at `offset` in `frame`.

    Returns the bytes kio should read: `frame` itself, or a copy without unknown
    tagged fields. Bytes after the entity are allowed, as in Kafka. Raises
    `MalformedRequest` (using the class's api key and version) or `InvalidRequest`.
    """
    buf = frame if type(frame) is bytes else bytes(frame)
    compiled = _entity(cls, False)
    ctx = _Ctx()
    try:
        compiled.check(buf, offset, len(buf), ctx)
    except _Fail as fail:
        api_key = int(getattr(cls, "__api_key__", -1))
        version = int(getattr(cls, "__version__", -1))
        if not fail.invalid:
            raise MalformedRequest(api_key, version, fail.describe()) from None
        # A broken rule is answerable only if the rest of the request parses.
        try:
            compiled.check(buf, offset, len(buf), _Ctx(lenient=True))
        except _Fail as worse:
            raise MalformedRequest(api_key, version, worse.describe()) from None
        raise InvalidRequest(fail.path(), fail.reason) from None
    return _apply(buf, ctx.edits) if ctx.edits else buf


def check_request(
    api_key: int, api_version: int, frame: bytes | bytearray | memoryview, offset: int
) -> bytes:
    """`check_entity` for the request class of this api key and version."""
    return check_entity(request_class(api_key, api_version), frame, offset)


def read_request_header(
    frame: bytes | bytearray | memoryview, api_key: int, api_version: int, flexible: bool
) -> tuple[str | None, int]:
    """The client id and the offset of the body, after the fixed 8-byte header prefix.

    The client id is a legacy nullable string in every header version. As Kafka's
    RequestHeaderData: a negative length is null, the text is decoded leniently, and
    header tags (v2) are skipped, none being defined.
    """
    buf = frame if type(frame) is bytes else bytes(frame)
    end = len(buf)
    if end < 10:
        raise MalformedRequest(api_key, api_version, f"request header of {end} bytes is cut short")
    (size,) = _I16.unpack_from(buf, 8)
    pos = 10
    client_id: str | None = None
    if size >= 0:
        if size > end - pos:
            raise MalformedRequest(
                api_key,
                api_version,
                f"client_id: string of {size} bytes but {end - pos} bytes left",
            )
        client_id = buf[pos : pos + size].decode("utf-8", "replace")
        pos += size
    if flexible:
        try:
            pos = _skip_tagged_fields(buf, pos, end)
        except _Fail as fail:
            raise MalformedRequest(
                api_key, api_version, f"request header tagged fields: {fail.reason}"
            ) from None
    return client_id, pos


def decode_request_header(frame: bytes | memoryview) -> tuple[RequestHeader, int]:
    """Parse a request header; returns the header and the offset of the body.

    Raises `MalformedRequest` when the header's bytes cannot be parsed (a client id
    length past the end of the frame, bad header tags).
    """
    if len(frame) < HEADER_PREFIX.size:
        raise MalformedRequest(-1, -1, f"request header of {len(frame)} bytes is cut short")
    api_key, api_version, correlation_id = HEADER_PREFIX.unpack_from(frame, 0)
    try:
        flexible = is_flexible(api_key, api_version)
    except UnknownApi:
        # Unknown version of a known api (or unknown api): only the fixed part and the
        # client id can be trusted; Kafka reads ApiVersions beyond its range as flexible.
        flexible = api_key == API_VERSIONS_KEY
    client_id, size = read_request_header(frame, api_key, api_version, flexible)
    return RequestHeader(api_key, api_version, correlation_id, client_id), size
