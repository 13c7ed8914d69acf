"""Request frames for fuzzing: valid ones built from kio's schemas, then mutated.

Every frame is a function of (seed, index, pools), so a run is reproducible from its
seed; a failing frame is also printed as hex for `python -m tests.fuzz --replay`.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import random
import struct
import types
import typing
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kio.records.schema import NewRecordBatch, Record
from kio.records.writers import write_new_batch
from kio.schema.errors import ErrorCode as KioErrorCode
from kio.serial import entity_writer
from kio.serial._implicit_defaults import get_tagged_field_default
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    is_optional,
)

from protocol import api

ZERO_UUID = uuid.UUID(int=0)

# Correlation ids of the fuzzer's own probes; fuzz frames use small positive ids.
PROBE_CORRELATION_ID = 0x7E57_0000


def advertised_apis() -> list[tuple[int, int, int]]:
    """(api key, min version, max version) the broker registers, read from a
    constructed (never started) `Broker`."""
    from broker.broker import Broker
    from broker.config import BrokerConfig, load_static
    from broker.server import Endpoint

    broker = Broker(
        BrokerConfig(load_static(None, [])), Path("/nonexistent"), Endpoint("127.0.0.1", 0)
    )
    return [(e.api_key, e.min_version, e.max_version) for e in broker.table.entries()]


# -- values ----------------------------------------------------------------------


@dataclass
class Pools:
    """Names and ids the generator draws from, so requests meet real state."""

    topics: list[str] = field(default_factory=lambda: [f"fuzz-{i}" for i in range(4)])
    topic_ids: list[uuid.UUID] = field(default_factory=list)
    groups: list[str] = field(default_factory=lambda: ["fuzz-g0", "fuzz-g1", "fuzz-share"])
    members: list[str] = field(default_factory=lambda: ["", "m-1", str(uuid.UUID(int=7))])
    config_keys: list[str] = field(
        default_factory=lambda: [
            "retention.ms",
            "cleanup.policy",
            "segment.bytes",
            "max.message.bytes",
            "share.auto.offset.reset",
            "share.record.lock.duration.ms",
            "share.session.timeout.ms",
            "no.such.config",
        ]
    )
    config_values: list[str] = field(
        default_factory=lambda: ["1", "0", "-1", "60000", "delete", "compact", "earliest", "x"]
    )


_INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint8": (0, 2**8 - 1),
    "uint16": (0, 2**16 - 1),
    "uint32": (0, 2**32 - 1),
    "uint64": (0, 2**64 - 1),
}


class Builder:
    """Random kio entities: small arrays, values mostly from pools or small ranges,
    edge values now and then."""

    def __init__(self, rng: random.Random, pools: Pools) -> None:
        self.rng = rng
        self.pools = pools

    def entity(self, cls: type[Any], depth: int = 0) -> Any:
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            tagged = get_field_tag(f) is not None
            has_default = (
                f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            )
            if (tagged and self.rng.random() < 0.6) or (has_default and self.rng.random() < 0.2):
                continue  # leave the default (a tagged default is not written)
            kwargs[f.name] = self.field(f, depth)
        return cls(**kwargs)

    def field(self, f: dataclasses.Field[Any], depth: int) -> Any:
        rng = self.rng
        kind = classify_field(f)
        outer_nullable = typing.get_origin(f.type) in (types.UnionType, typing.Union)
        if isinstance(kind, EntityField):
            if is_optional(f) and rng.random() < 0.15:
                return None
            return self.entity(kind.type_, depth + 1)
        if isinstance(kind, EntityTupleField | PrimitiveTupleField):
            if outer_nullable and rng.random() < 0.15:
                return None
            count = min(int(rng.expovariate(0.8)), 6 if depth < 2 else 3)
            if isinstance(kind, EntityTupleField):
                return tuple(self.entity(kind.type_, depth + 1) for _ in range(count))
            return tuple(
                self.primitive(f.metadata["kafka_type"], f.name, False) for _ in range(count)
            )
        nullable = is_optional(f) and get_field_tag(f) is None
        return self.primitive(f.metadata["kafka_type"], f.name, nullable)

    def primitive(self, kafka_type: str, name: str, nullable: bool) -> Any:
        rng = self.rng
        if nullable and kafka_type != "uuid" and rng.random() < 0.1:
            return None
        if kafka_type in _INT_RANGES:
            return self.integer(kafka_type, name)
        if kafka_type == "bool":
            return rng.random() < 0.5
        if kafka_type == "float64":
            return rng.choice([0.0, 1.5, -1.0, 1e300])
        if kafka_type == "uuid":
            roll = rng.random()
            if self.pools.topic_ids and roll < 0.6:
                return rng.choice(self.pools.topic_ids)
            return None if roll < 0.8 else uuid.UUID(int=rng.getrandbits(128))
        if kafka_type in ("timedelta_i32", "timedelta_i64"):
            # Long-poll waits stay short so the probe behind them is answered quickly.
            ms = rng.choice([0, 0, 1, 5, 20, 50]) if rng.random() < 0.995 else 2**31 - 1
            if name == "timeout" and rng.random() < 0.3:
                ms = rng.choice([-1, 1000, 30000])
            return datetime.timedelta(milliseconds=ms)
        if kafka_type == "datetime_i64":
            return datetime.datetime.fromtimestamp(rng.choice([0, 1_700_000_000]), datetime.UTC)
        if kafka_type == "string":
            return self.string(name)
        if kafka_type == "bytes":
            return rng.randbytes(rng.choice([0, 1, 8, 40]))
        if kafka_type == "records":
            return self.records()
        if kafka_type == "error_code":
            return KioErrorCode(rng.choice([0, 3, 6]))
        raise TypeError(f"no generator for {kafka_type}")

    def integer(self, kafka_type: str, name: str) -> int:
        rng = self.rng
        low, high = _INT_RANGES[kafka_type]
        roll = rng.random()
        if roll < 0.08:
            return rng.choice([low, high, -1 if low < 0 else 0, 0])
        if roll < 0.15:
            return rng.randint(max(low, -1000), min(high, 1_000_000))
        if name == "acks":
            return rng.choice([-1, -1, 1, 0])
        if name in ("num_partitions", "count"):
            return rng.choice([-1, 1, 2, 3])
        if name == "replication_factor":
            return rng.choice([-1, 1])
        if "epoch" in name:
            return rng.choice([-1, 0, 0, 1, 2])
        if "bytes" in name:
            return rng.choice([0, 1, 1024, 1 << 20])
        return rng.choice([0, 0, 1, 1, 2, 3, -1]) if low < 0 else rng.choice([0, 1, 2, 3])

    def string(self, name: str) -> str:
        rng = self.rng
        pools = self.pools
        roll = rng.random()
        if roll < 0.08:
            return rng.choice(["", "ü-ß-日本", "a" * 300, "with space", "..", "x/y"])
        if roll < 0.15:
            return "".join(rng.choice("abcdefghij-_.") for _ in range(rng.randint(1, 12)))
        if name in ("group_id", "group_ids", "key", "coordinator_keys"):
            return rng.choice(pools.groups)
        if name == "member_id":
            return rng.choice(pools.members)
        if name in ("configuration_keys",):
            return rng.choice(pools.config_keys)
        if name == "value":
            return rng.choice(pools.config_values)
        if name == "name":
            return rng.choice(pools.topics + pools.config_keys[:3])
        if name in ("types_filter", "states_filter"):
            return rng.choice(["share", "consumer", "Stable", "Empty"])
        return rng.choice(pools.topics)

    def records(self) -> bytes | None:
        rng = self.rng
        roll = rng.random()
        if roll < 0.1:
            return b""
        if roll < 0.25:
            return rng.randbytes(rng.randint(1, 80))
        now = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
        records = tuple(
            Record(
                attributes=0,  # type: ignore[arg-type]
                timestamp=now,  # type: ignore[arg-type]
                offset=i,  # type: ignore[arg-type]
                key=None if rng.random() < 0.3 else f"k{i}".encode(),
                value=rng.randbytes(rng.choice([0, 4, 32])),
                headers=(),
            )
            for i in range(rng.randint(1, 3))
        )
        buf = io.BytesIO()
        write_new_batch(
            buf,
            NewRecordBatch(
                producer_id=-1,  # type: ignore[arg-type]
                producer_epoch=-1,  # type: ignore[arg-type]
                base_sequence=-1,  # type: ignore[arg-type]
                attributes=rng.choice([0, 0, 0, 1, 4, 16]),  # type: ignore[arg-type]
                records=records,
            ),
        )
        return buf.getvalue()


# -- encoding that remembers where the lengths are ---------------------------------


@dataclass(frozen=True, slots=True)
class Length:
    """A length or count field in an encoded frame."""

    offset: int
    kind: str  # "int16", "int32" or "uvarint"
    value: int  # as encoded (compact forms are length + 1)
    path: str


def uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


class _Out:
    def __init__(self) -> None:
        self.data = bytearray()
        self.lengths: list[Length] = []

    def length(self, kind: str, value: int, path: str) -> None:
        self.lengths.append(Length(len(self.data), kind, value, path))
        if kind == "uvarint":
            self.data += uvarint(value)
        else:
            self.data += struct.pack(">h" if kind == "int16" else ">i", value)

    def extend(self, other: _Out) -> None:
        base = len(self.data)
        self.lengths += [dataclasses.replace(n, offset=n.offset + base) for n in other.lengths]
        self.data += other.data


_PACK = {
    "int8": ">b",
    "int16": ">h",
    "int32": ">i",
    "int64": ">q",
    "uint8": ">B",
    "uint16": ">H",
    "uint32": ">I",
    "uint64": ">Q",
    "float64": ">d",
}


def _write_primitive(
    out: _Out, kafka_type: str, flexible: bool, value: Any, path: str, legacy_string: bool
) -> None:
    if kafka_type in _PACK:
        out.data += struct.pack(_PACK[kafka_type], value)
    elif kafka_type == "bool":
        out.data += b"\x01" if value else b"\x00"
    elif kafka_type == "uuid":
        out.data += (value or ZERO_UUID).bytes
    elif kafka_type in ("timedelta_i32", "timedelta_i64"):
        ms = round(value.total_seconds() * 1000)
        out.data += struct.pack(">i" if kafka_type == "timedelta_i32" else ">q", ms)
    elif kafka_type == "datetime_i64":
        out.data += struct.pack(">q", -1 if value is None else round(value.timestamp() * 1000))
    elif kafka_type == "error_code":
        out.data += struct.pack(">h", int(value))
    elif kafka_type in ("string", "bytes", "records"):
        raw = value.encode() if isinstance(value, str) else value
        if flexible and not legacy_string:
            out.length("uvarint", 0 if raw is None else len(raw) + 1, path)
        elif kafka_type == "string":
            out.length("int16", -1 if raw is None else len(raw), path)
        else:
            out.length("int32", -1 if raw is None else len(raw), path)
        out.data += raw or b""
    else:
        raise TypeError(kafka_type)


def _write_field(out: _Out, owner: type[Any], f: dataclasses.Field[Any], value: Any, path: str):
    flexible = bool(owner.__flexible__)
    kind = classify_field(f)
    if isinstance(kind, EntityField):
        if is_optional(f):
            out.data += b"\xff" if value is None else b"\x01"
            if value is None:
                return
        _write_entity(out, kind.type_, value, path)
        return
    if isinstance(kind, EntityTupleField | PrimitiveTupleField):
        if flexible:
            out.length("uvarint", 0 if value is None else len(value) + 1, path)
        else:
            out.length("int32", -1 if value is None else len(value), path)
        for i, item in enumerate(value or ()):
            if isinstance(kind, EntityTupleField):
                _write_entity(out, kind.type_, item, f"{path}[{i}]")
            else:
                _write_primitive(out, f.metadata["kafka_type"], flexible, item, path, False)
        return
    legacy = owner.__name__ == "RequestHeader" and f.name == "client_id"
    _write_primitive(out, f.metadata["kafka_type"], flexible, value, path, legacy)


def _write_entity(out: _Out, cls: type[Any], entity: Any, path: str) -> None:
    """As kio's entity writer: plain fields in order, then the tags that differ from
    their defaults, sorted by tag."""
    tagged = []
    for f in dataclasses.fields(cls):
        tag = get_field_tag(f)
        sub = f"{path}.{f.name}" if path else f.name
        if tag is None:
            _write_field(out, cls, f, getattr(entity, f.name), sub)
        else:
            tagged.append((int(tag), f, sub))
    if not cls.__flexible__:
        return
    section = _Out()
    count = 0
    for tag, f, sub in sorted(tagged, key=lambda t: t[0]):
        value = getattr(entity, f.name)
        if value == f.default or (
            f.default is dataclasses.MISSING and value == get_tagged_field_default(f)
        ):
            continue
        inner = _Out()
        _write_field(inner, cls, f, value, sub)
        section.data += uvarint(tag)
        section.length("uvarint", len(inner.data), f"{sub}(tag size)")
        section.extend(inner)
        count += 1
    out.length("uvarint", count, f"{path}(tag count)" if path else "(tag count)")
    out.extend(section)


def encode_body(entity: Any) -> tuple[bytes, list[Length]]:
    """The entity's bytes (as kio's writer makes them) and where its lengths are."""
    out = _Out()
    _write_entity(out, type(entity), entity, "")
    return bytes(out.data), out.lengths


def kio_body(entity: Any) -> bytes:
    buf = io.BytesIO()
    entity_writer(type(entity))(buf, entity)
    return buf.getvalue()


def encode_header(
    api_key: int, version: int, correlation_id: int, client_id: str | None, flexible: bool
) -> tuple[bytes, list[Length]]:
    out = _Out()
    out.data += struct.pack(">hhi", api_key, version, correlation_id)
    raw = None if client_id is None else client_id.encode()
    out.length("int16", -1 if raw is None else len(raw), "header.client_id")
    out.data += raw or b""
    if flexible:
        out.length("uvarint", 0, "header(tag count)")
    return bytes(out.data), out.lengths


# -- frames and mutations ----------------------------------------------------------


@dataclass
class Frame:
    """One request as sent, without its 4-byte size prefix."""

    payload: bytes
    api_key: int
    version: int
    correlation_id: int
    header_size: int = 8
    mutation: str = "valid"
    detail: str = ""
    # "whole", "chunks" (random splits) or "bytes" (one byte per write)
    delivery: str = "whole"
    # Send a size prefix larger than the payload, then close (a frame cut in transit).
    short: bool = False

    def describe(self) -> str:
        name = api.api_name(self.api_key)
        extra = f" ({self.detail})" if self.detail else ""
        return f"{name} v{self.version} {self.mutation}{extra}, {len(self.payload)} bytes"


def valid_frame(
    rng: random.Random,
    pools: Pools,
    api_key: int,
    version: int,
    correlation_id: int,
    client_id: str | None = "spool-fuzz",
) -> tuple[Frame, list[Length]]:
    cls = api.request_class(api_key, version)
    entity = Builder(rng, pools).entity(cls)
    body, body_lengths = encode_body(entity)
    header, header_lengths = encode_header(
        api_key, version, correlation_id, client_id, bool(cls.__flexible__)
    )
    lengths = header_lengths + [
        dataclasses.replace(n, offset=n.offset + len(header)) for n in body_lengths
    ]
    return Frame(header + body, api_key, version, correlation_id, len(header)), lengths


def _lie(rng: random.Random, length: Length) -> int:
    v = length.value
    if length.kind == "int16":
        return rng.choice([2**15 - 1, -2, -1, -(2**15), v + 1, v - 1, v + 100])
    if length.kind == "int32":
        return rng.choice([2**31 - 1, -2, -1, -(2**31), v + 1, v - 1, 2**20])
    return rng.choice([2**32 - 1, 2**35 - 1, 0, 1, v + 1, max(v - 1, 0), v + 1000, 2**31])


def splice_length(payload: bytes, length: Length, new: int) -> bytes:
    if length.kind == "uvarint":
        old = len(uvarint(length.value))
        raw = uvarint(new & (2**35 - 1))
    else:
        old = 2 if length.kind == "int16" else 4
        raw = struct.pack(">h" if old == 2 else ">i", new)
    return payload[: length.offset] + raw + payload[length.offset + old :]


MUTATIONS: Sequence[tuple[str, float]] = (
    ("valid", 0.12),
    ("lying_length", 0.33),
    ("truncate", 0.12),
    ("junk_tail", 0.08),
    ("flip", 0.2),
    ("random_body", 0.08),
    ("header", 0.05),
    ("short", 0.02),
)


def mutate(rng: random.Random, frame: Frame, lengths: list[Length]) -> Frame:
    names = [m for m, _ in MUTATIONS]
    mutation = rng.choices(names, weights=[w for _, w in MUTATIONS])[0]
    payload = frame.payload
    detail = ""
    body_lengths = [n for n in lengths if not n.path.startswith("header")]
    if mutation == "lying_length" and not body_lengths:
        mutation = "flip"
    if mutation == "lying_length":
        target = rng.choice(body_lengths)
        new = _lie(rng, target)
        payload = splice_length(payload, target, new)
        detail = f"{target.path or 'body'} {target.value} -> {new}"
    elif mutation == "truncate":
        cut = rng.randint(8, max(len(payload) - 1, 8))
        payload = payload[:cut]
        detail = f"cut at {cut}"
    elif mutation == "junk_tail":
        payload += rng.randbytes(rng.randint(1, 64))
    elif mutation == "flip":
        data = bytearray(payload)
        for _ in range(rng.randint(1, 4)):
            at = rng.randrange(8, len(data)) if len(data) > 8 else 0
            data[at] ^= rng.randint(1, 255)
        payload = bytes(data)
    elif mutation == "random_body":
        payload = payload[: frame.header_size] + rng.randbytes(rng.randint(0, 200))
    elif mutation == "header":
        client = next(n for n in lengths if n.path == "header.client_id")
        new = rng.choice([2**15 - 1, client.value + 1, len(payload), -2, 200])
        payload = splice_length(payload, client, new)
        detail = f"client_id length {client.value} -> {new}"
    roll = rng.random()
    delivery = "whole"
    if roll < 0.05 and len(payload) < 400:
        delivery = "bytes"
    elif roll < 0.15:
        delivery = "chunks"
    return dataclasses.replace(
        frame,
        payload=payload,
        mutation=mutation,
        detail=detail,
        delivery=delivery,
        short=mutation == "short",
    )


def fuzz_frame(seed: int, index: int, apis: Sequence[tuple[int, int, int]], pools: Pools) -> Frame:
    """Frame number `index` of the run with this seed."""
    rng = random.Random(seed * 1_000_003 + index)
    api_key, low, high = rng.choice(apis)
    version = rng.randint(low, high)
    frame, lengths = valid_frame(rng, pools, api_key, version, correlation_id=1 + index % 2**30)
    frame = mutate(rng, frame, lengths)
    roll = rng.random()
    if roll < 0.05:
        # The body of one version read as another (header versions may differ too).
        other = rng.randint(0, high + 2)
        payload = frame.payload[:2] + struct.pack(">h", other) + frame.payload[4:]
        frame = dataclasses.replace(
            frame, payload=payload, mutation="version", detail=f"v{version} body as v{other}"
        )
    elif roll < 0.06:
        # An api the broker does not serve (or kio does not know).
        other = rng.choice([11, 12, 14, 50, 68, 80, 999, -1])
        payload = struct.pack(">h", other) + frame.payload[2:]
        frame = dataclasses.replace(
            frame, payload=payload, mutation="unserved_api", detail=f"api key {other}"
        )
    return frame
