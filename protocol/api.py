"""The API table: which api keys and versions spool serves, and their wire codec.

Message layouts come from kio (generated from Kafka's own JSON schemas). This module
adds the few things kio leaves to the server: header versions per API version,
looking up entity classes, converting a handler's response entity to the request's
version (`at_version`: a handler builds one typed kio entity and every version it
supports is encoded from it), building entities from plain mappings (requests for
spool's own client and tests, generic error responses), loading kio's modules on
first use (`lazy_module`), and the table of handlers by api key and version range.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import io
import pkgutil
import struct
import types
import typing
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import cache
from pkgutil import resolve_name
from typing import Any, Generic, TypeVar, cast

from kio.schema.index import api_key_map, schema_name_map
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType
from kio.static.protocol import Payload

from protocol.errors import ErrorCode

API_VERSIONS_KEY = 18

# api key, api version, correlation id: the fixed prefix of every request header.
HEADER_PREFIX = struct.Struct(">hhi")

Entity = Any
# What a handler answers: a kio response entity of any version of its API, which
# `at_version` turns into the request's version, or None for no response at all
# (Produce with acks=0).
Response = Payload
# The request context the server passes handlers (the broker's `RequestContext`).
Ctx = TypeVar("Ctx")
# A handler as the table holds it: request context and decoded kio request entity in.
Handler = Callable[[Ctx, Any], Awaitable[Response | None]]
T = TypeVar("T")


class UnknownApi(Exception):
    """The api key or version has no schema at all (kio does not know it)."""


class MalformedRequest(Exception):
    """A request whose bytes cannot be parsed: the connection must be closed, as Kafka
    closes it (an error response could not be trusted by the client either)."""

    def __init__(self, api_key: int, api_version: int, reason: str) -> None:
        super().__init__(reason)
        self.api_key = api_key
        self.api_version = api_version
        self.reason = reason


def api_name(api_key: int) -> str:
    """Kafka's snake_case name of an api key, or 'unknown(<key>)'."""
    return api_key_map.get(api_key, f"unknown({api_key})")


@cache
def _entity_class(api_key: int, version: int, kind: EntityType) -> type[Any]:
    try:
        path = schema_name_map[api_key_map[api_key]][version][kind]  # type: ignore[index]
    except KeyError:
        raise UnknownApi(f"api key {api_key} version {version} is not known") from None
    cls = resolve_name(path)
    assert isinstance(cls, type)
    return cls


def request_class(api_key: int, version: int) -> type[Any]:
    return _entity_class(api_key, version, EntityType.request)


def response_class(api_key: int, version: int) -> type[Any]:
    return _entity_class(api_key, version, EntityType.response)


def schema_versions(api_key: int) -> tuple[int, int] | None:
    """The range of versions kio has a schema for, or None for an unknown api key."""
    name = api_key_map.get(api_key)
    if name is None:
        return None
    versions = sorted(schema_name_map[name])
    return versions[0], versions[-1]


def is_flexible(api_key: int, version: int) -> bool:
    return bool(request_class(api_key, version).__flexible__)


def response_header_version(api_key: int, version: int) -> int:
    # ApiVersions responses always use header v0 so that a client which does not
    # yet know the broker's versions can parse them (KIP-511).
    if api_key == API_VERSIONS_KEY:
        return 0
    return 1 if is_flexible(api_key, version) else 0


@dataclass(slots=True, frozen=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


_read_header_v1 = entity_reader(RequestHeaderV1)
_read_header_v2 = entity_reader(RequestHeaderV2)


def peek_header(frame: bytes | memoryview) -> tuple[int, int, int]:
    """api key, api version and correlation id: readable even when the rest is garbage."""
    return HEADER_PREFIX.unpack_from(frame, 0)


def decode_request(api_key: int, version: int, frame: bytes | memoryview, offset: int) -> Entity:
    """Decode the body at `offset` into kio's request entity for this version.

    Bytes after the body are ignored, as Kafka's own parser does (librdkafka sends
    some, e.g. a v8-10 Metadata field on later versions).
    """
    cls = request_class(api_key, version)
    try:
        entity, _ = _reader(cls)(frame, offset)
    except Exception as exc:
        # Run `protocol.request_check` first: kio aborts the process on some bad lengths.
        raise MalformedRequest(api_key, version, f"{type(exc).__name__}: {exc}") from exc
    return entity


_readers: dict[type[Any], Callable[[Any, int], tuple[Any, int]]] = {}
_writers: dict[type[Any], Callable[[io.BytesIO, Any], None]] = {}


def _reader(cls: type[Any]) -> Callable[[Any, int], tuple[Any, int]]:
    reader = _readers.get(cls)
    if reader is None:
        reader = _readers[cls] = entity_reader(cls)
    return reader


def _writer(cls: type[Any]) -> Callable[[io.BytesIO, Any], None]:
    writer = _writers.get(cls)
    if writer is None:
        writer = _writers[cls] = entity_writer(cls)
    return writer


def encode_response(api_key: int, version: int, correlation_id: int, body: Entity) -> bytes:
    """Size-prefixed response frame: header (v0 or v1) then the body."""
    buf = io.BytesIO()
    buf.write(b"\x00\x00\x00\x00")
    buf.write(struct.pack(">i", correlation_id))
    if response_header_version(api_key, version) >= 1:
        buf.write(b"\x00")  # empty tagged fields
    _writer(type(body))(buf, body)
    data = buf.getbuffer()
    struct.pack_into(">i", data, 0, len(data) - 4)
    return bytes(data)


def encode_request(
    api_key: int, version: int, correlation_id: int, client_id: str, body: Entity
) -> bytes:
    """Size-prefixed request frame, for spool's own client and tests."""
    buf = io.BytesIO()
    buf.write(b"\x00\x00\x00\x00")
    header_cls = RequestHeaderV2 if is_flexible(api_key, version) else RequestHeaderV1
    header = header_cls(
        request_api_key=api_key,  # type: ignore[arg-type]
        request_api_version=version,  # type: ignore[arg-type]
        correlation_id=correlation_id,  # type: ignore[arg-type]
        client_id=client_id,
    )
    _writer(header_cls)(buf, header)
    _writer(type(body))(buf, body)
    data = buf.getbuffer()
    struct.pack_into(">i", data, 0, len(data) - 4)
    return bytes(data)


def decode_response(api_key: int, version: int, frame: bytes) -> tuple[int, Entity]:
    """Correlation id and body of a response frame (without its size prefix)."""
    (correlation_id,) = struct.unpack_from(">i", frame, 0)
    offset = 4
    if response_header_version(api_key, version) >= 1:
        offset += 1  # spool's own client never expects response header tags
    cls = response_class(api_key, version)
    body, _ = _reader(cls)(frame, offset)
    return correlation_id, body


# ---------------------------------------------------------------------------
# Building entities of any version from plain mappings.
# ---------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class _FieldPlan:
    name: str
    kind: str  # "entity", "entities", "scalar"
    target: Any  # nested entity class for entity/entities
    kafka_type: str | None
    required: bool
    default: Any
    nullable: bool = False


_plans: dict[type[Any], tuple[_FieldPlan, ...]] = {}


def _plan(cls: type[Any]) -> tuple[_FieldPlan, ...]:
    cached = _plans.get(cls)
    if cached is not None:
        return cached
    plans = []
    for f in dataclasses.fields(cls):
        kind, target = "scalar", None
        tp = f.type
        nullable = False
        origin = typing.get_origin(tp)
        if origin is tuple:
            (item, *_rest) = typing.get_args(tp)
            if dataclasses.is_dataclass(item):
                kind, target = "entities", item
        elif origin in (types.UnionType, typing.Union):
            nullable = type(None) in typing.get_args(tp)
            for arg in typing.get_args(tp):
                if dataclasses.is_dataclass(arg):
                    kind, target = "entity", arg
                elif typing.get_origin(arg) is tuple:
                    # A nullable array of entities: `tuple[X, ...] | None`.
                    (item, *_rest) = typing.get_args(arg)
                    if dataclasses.is_dataclass(item):
                        kind, target = "entities", item
        elif dataclasses.is_dataclass(tp):
            kind, target = "entity", tp
        has_default = f.default is not dataclasses.MISSING
        plans.append(
            _FieldPlan(
                name=f.name,
                kind=kind,
                target=target,
                kafka_type=f.metadata.get("kafka_type"),
                required=not has_default and f.default_factory is dataclasses.MISSING,
                default=f.default if has_default else None,
                nullable=nullable,
            )
        )
    _plans[cls] = tuple(plans)
    return _plans[cls]


_EPOCH = datetime.datetime.fromtimestamp(0, datetime.UTC)


def _scalar(value: Any, kafka_type: str | None) -> Any:
    if value is None:
        return None
    if kafka_type == "error_code":
        return value if isinstance(value, ErrorCode) else ErrorCode(value)
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        if isinstance(value, datetime.timedelta):
            return value
        return datetime.timedelta(milliseconds=value)
    if kafka_type == "datetime_i64":
        if isinstance(value, datetime.datetime):
            return value
        return _EPOCH + datetime.timedelta(milliseconds=value)
    if isinstance(value, list):
        return tuple(value)
    if kafka_type == "uuid" and not isinstance(value, uuid.UUID):
        return uuid.UUID(bytes=value) if isinstance(value, bytes) else uuid.UUID(str(value))
    return value


def _zero(plan: _FieldPlan) -> Any:
    """A neutral value for a required field the caller did not give."""
    if plan.kind == "entities":
        return ()
    if plan.kind == "entity":
        return build(plan.target, {})
    kt = plan.kafka_type
    if kt == "error_code":
        return ErrorCode.none
    if kt in ("timedelta_i32", "timedelta_i64"):
        return datetime.timedelta(0)
    if kt in ("string",):
        return ""
    if kt in ("bytes", "records"):
        return b""
    if kt == "bool":
        return False
    if kt == "uuid":
        return uuid.UUID(int=0)
    if kt == "float64":
        return 0.0
    return 0


def _sibling_modules(cls: type[Any]) -> tuple[str, str, list[int]] | None:
    """kio generates one module per API, version and kind (`kio.schema.fetch.v18.
    response`); the same entity name in its sibling version packages is the same
    entity at another version. The package, kind and sibling versions of `cls`, newest
    first, or None for a class outside that layout."""
    package, _, rest = cls.__module__.rpartition(".v")
    version, _, kind = rest.partition(".")
    if not (package and version.isdigit() and kind):
        return None
    versions = [
        int(sub.name[1:])
        for sub in pkgutil.iter_modules(importlib.import_module(package).__path__)
        if sub.name.startswith("v") and sub.name[1:].isdigit()
    ]
    return package, kind, sorted(versions, reverse=True)


def _version_fields(package: str, kind: str, version: int, name: str) -> frozenset[str]:
    try:
        module = importlib.import_module(f"{package}.v{version}.{kind}")
    except ModuleNotFoundError:
        return frozenset()
    other = getattr(module, name, None)
    if isinstance(other, type) and dataclasses.is_dataclass(other):
        return frozenset(f.name for f in dataclasses.fields(other))
    return frozenset()


# Per entity class: the keys known to be a field of some version of it. Starts as the
# class's own fields and grows by the keys a handler writes for newer (or older)
# versions, so a request's first response imports sibling versions only when its
# handler writes a key this version lacks, and only until that key is found.
_known_by_class: dict[type[Any], frozenset[str]] = {}


def _check_keys(cls: type[Any], data: Mapping[str, Any]) -> None:
    known = _known_by_class.get(cls)
    if known is None:
        known = _known_by_class[cls] = frozenset(f.name for f in dataclasses.fields(cls))
    if known.issuperset(data):  # the common case costs one set scan, no new set
        return
    missing = set(data.keys() - known)
    siblings = _sibling_modules(cls)
    if siblings is not None:
        package, kind, versions = siblings
        for version in versions:  # handlers write the newest fields: look there first
            missing -= _version_fields(package, kind, version, cls.__name__)
            if not missing:
                break
    if missing:
        unknown = ", ".join(sorted(missing))
        raise ValueError(f"{cls.__module__}.{cls.__name__} has no field {unknown} in any version")
    _known_by_class[cls] = known | data.keys()


def build(cls: type[Any], data: Mapping[str, Any]) -> Entity:
    """Build an entity of class `cls` from a mapping, recursively.

    Keys this version does not have are ignored (one mapping serves every version),
    but a key no version of the entity has is a mistake and raises ValueError naming
    it. Fields the mapping lacks take the schema default or a neutral zero. Error
    codes, durations and uuids are converted from plain ints / bytes.
    """
    _check_keys(cls, data)
    kwargs: dict[str, Any] = {}
    for plan in _plan(cls):
        if plan.name in data:
            value = data[plan.name]
        elif plan.required:
            value = _zero(plan)
        else:
            continue
        if plan.kind == "entities":
            if value is not None or not plan.nullable:
                value = tuple(
                    item if isinstance(item, plan.target) else build(plan.target, item)
                    for item in (value or ())
                )
        elif plan.kind == "entity":
            if value is not None and not isinstance(value, plan.target):
                value = build(plan.target, value)
        else:
            value = _scalar(value, plan.kafka_type)
        kwargs[plan.name] = value
    return cls(**kwargs)


def build_response(api_key: int, version: int, data: Mapping[str, Any]) -> Entity:
    return build(response_class(api_key, version), data)


# ---------------------------------------------------------------------------
# Handlers' response entities, at the request's version.
# ---------------------------------------------------------------------------


class WrongResponse(TypeError):
    """A handler answered something that is not a response of its request's API."""


def at_version(api_key: int, version: int, body: Response) -> Entity:
    """The handler's answer as the `version` response of `api_key`, ready to encode.

    A handler builds its response with the classes of one version of the API (mostly
    the newest); this converts it to the request's version (`convert`), or returns it
    as it is when it already is that version. Anything that is not a response entity
    of `api_key` raises `WrongResponse` rather than reaching the wire.
    """
    cls = response_class(api_key, version)
    if type(body) is cls:
        return body
    if (
        getattr(body, "__type__", None) is not EntityType.response
        or getattr(body, "__api_key__", None) != api_key
        or not dataclasses.is_dataclass(body)
    ):
        raise WrongResponse(
            f"the {api_name(api_key)} handler answered {type(body).__module__}."
            f"{type(body).__qualname__}, not a {api_name(api_key)} response entity"
        )
    return convert(body, cls)


def convert(entity: Any, cls: type[T]) -> T:
    """`entity`, an instance of one version of a kio entity, as an instance of `cls`,
    another version of the same entity, recursively.

    Fields both have are carried over; fields `cls` lacks are dropped (a newer field
    an older client cannot read, as Kafka's serializers skip fields a version lacks);
    fields only `cls` has take the schema default or a neutral zero, as `build` gives
    them. A field whose kind differs between the two (a name in one version, an id in
    the other) is the caller's to fill: build that version's classes instead.
    """
    return cast(T, _converter(type(entity), cls)(entity))


_converters: dict[tuple[type[Any], type[Any]], Callable[[Any], Any]] = {}


def _converter(src: type[Any], dst: type[Any]) -> Callable[[Any], Any]:
    fn = _converters.get((src, dst))
    if fn is None:
        fn = _converters[(src, dst)] = _compile_converter(src, dst)
    return fn


def _same(entity: Any) -> Any:
    return entity


def _compile_converter(src: type[Any], dst: type[Any]) -> Callable[[Any], Any]:
    """One function per pair of classes, generated as `dataclasses` generates
    `__init__`: a Produce v12 response converts to v9 in a third of the time a loop
    over the fields took (it runs for every request of an older version)."""
    if src is dst:
        return _same
    have = {f.name: f for f in dataclasses.fields(src)}
    namespace: dict[str, Any] = {"dst": dst, "_one": _convert_one, "_many": _convert_many}
    args = []
    for i, plan in enumerate(_plan(dst)):
        name = plan.name
        if name not in have:
            if plan.required:  # immutable zeros, shared by every conversion
                namespace[f"zero{i}"] = _zero(plan)
                args.append(f"{name}=zero{i}")
        elif plan.kind == "scalar":
            args.append(f"{name}=entity.{name}")
        elif plan.kind == "entities":
            namespace[f"cls{i}"] = plan.target
            args.append(f"{name}=_many(entity.{name}, cls{i})")
        else:
            namespace[f"cls{i}"] = plan.target
            default = have[name].default
            if dataclasses.is_dataclass(default) and dataclasses.is_dataclass(plan.default):
                # A nested entity left at its schema default (Fetch's diverging_epoch,
                # current_leader, snapshot_id) is the target's default: none is built.
                namespace[f"src_default{i}"] = default
                namespace[f"dst_default{i}"] = plan.default
                args.append(
                    f"{name}=dst_default{i} if entity.{name} is src_default{i}"
                    f" else _one(entity.{name}, cls{i})"
                )
            else:
                args.append(f"{name}=_one(entity.{name}, cls{i})")
    source = f"def convert(entity):\n    return dst({', '.join(args)})\n"
    exec(source, namespace)  # the names are kio's field names: identifiers
    convert: Callable[[Any], Any] = namespace["convert"]
    return convert


def _convert_one(value: Any, cls: type[Any]) -> Any:
    return None if value is None else _converter(type(value), cls)(value)


def _convert_many(values: Any, cls: type[Any]) -> Any:
    if not values:
        return values if values is None else ()
    convert = _converter(type(values[0]), cls)
    return tuple(map(convert, values))


class LazyModule:
    """A module imported when one of its attributes is first read, then read like the
    module (each attribute is looked up in it once). For kio's per-version schema
    modules, which are slow to import: a start should not load a version no request
    has asked for. Type-check the name as the real module:

        if TYPE_CHECKING:
            from kio.schema.metadata.v13 import response as metadata_v13
        else:
            metadata_v13 = lazy_module("kio.schema.metadata.v13.response")
    """

    def __init__(self, name: str) -> None:
        self.__name = name

    def __getattr__(self, attr: str) -> Any:
        value = getattr(importlib.import_module(self.__name), attr)
        setattr(self, attr, value)  # found in the instance next time, no __getattr__
        return value

    def __repr__(self) -> str:
        return f"<lazy module {self.__name!r}>"


def lazy_module(name: str) -> Any:
    return LazyModule(name)


def error_response(
    api_key: int, version: int, code: ErrorCode, message: str | None = None
) -> Entity:
    """A response of this api/version whose top-level error fields carry `code`.

    Every other error code in it stays zero and every array empty: a generic answer
    for a request that could not be decoded or served at all.
    """
    cls = response_class(api_key, version)
    data = {"error_code": code, "error_message": message}
    # Not every response has both (Metadata has neither): give it those it has.
    own = {f.name for f in dataclasses.fields(cls)}
    return build(cls, {k: v for k, v in data.items() if k in own})


@dataclass(slots=True, frozen=True)
class ApiEntry(Generic[Ctx]):
    api_key: int
    min_version: int
    max_version: int
    handler: Handler[Ctx]


class ApiTable(Generic[Ctx]):
    """api key -> supported version range -> handler.

    ApiVersions advertises exactly what is registered here, so a version is only
    listed once a handler serves it.
    """

    def __init__(self) -> None:
        self._entries: dict[int, ApiEntry[Ctx]] = {}

    def register(
        self, api_key: int, min_version: int, max_version: int, handler: Handler[Ctx]
    ) -> None:
        known = schema_versions(api_key)
        if known is None or min_version < known[0] or max_version > known[1]:
            raise ValueError(
                f"kio has no schema for {api_name(api_key)} v{min_version}-{max_version}"
            )
        if api_key in self._entries:
            raise ValueError(f"{api_name(api_key)} is registered twice")
        self._entries[api_key] = ApiEntry(api_key, min_version, max_version, handler)

    def lookup(self, api_key: int, version: int) -> ApiEntry[Ctx] | None:
        entry = self._entries.get(api_key)
        if entry is None or not entry.min_version <= version <= entry.max_version:
            return None
        return entry

    def entries(self) -> list[ApiEntry[Ctx]]:
        return sorted(self._entries.values(), key=lambda e: e.api_key)

    def entry(self, api_key: int) -> ApiEntry[Ctx] | None:
        """The api's entry whatever the version (for error messages)."""
        return self._entries.get(api_key)
