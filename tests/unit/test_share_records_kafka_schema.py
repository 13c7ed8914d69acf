"""spool's share-state records, read by a decoder built from Kafka 4.2's message schemas.

The schemas below restate `share-coordinator/src/main/resources/common/message/
Share{Snapshot,Update}{Key,Value}.json` of Kafka 4.2 as data: field order, types, the
versions each field exists in, and tagged fields (tag, default). `_decode` is a small
interpreter of Kafka's generated-message wire rules (flexible versions: compact arrays
and a tagged-field section per struct; tagged fields only in that section, absent means
the default), written independently of `persister.share_records`, so a record spool
writes is checked against the schema field by field rather than against spool's own
reader.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass
from typing import Any

import pytest

from coordinator.share_coordinator import ShareCoordinatorShard
from coordinator.share_state import PersistedBatch, ShareStateKey
from persister.share_records import (
    ShareKey,
    ShareRecord,
    ShareSnapshot,
    ShareUpdate,
    StateBatch,
    encode,
)


@dataclass(frozen=True)
class Field:
    name: str
    type: str  # int8/int16/int32/int64/string/uuid, or "[]" + struct name
    tag: int | None = None  # tagged field (taggedVersions "0+")
    default: Any = None


STATE_BATCH = [
    Field("FirstOffset", "int64"),
    Field("LastOffset", "int64"),
    Field("DeliveryState", "int8"),
    Field("DeliveryCount", "int16"),
]
KEY_FIELDS = [Field("GroupId", "string"), Field("TopicId", "uuid"), Field("Partition", "int32")]
# Kafka 4.2 (KIP-1226): DeliveryCompleteCount, int32, tag 0, default -1, in both values.
SNAPSHOT_VALUE = [
    Field("SnapshotEpoch", "int32"),
    Field("StateEpoch", "int32"),
    Field("LeaderEpoch", "int32"),
    Field("StartOffset", "int64"),
    Field("DeliveryCompleteCount", "int32", tag=0, default=-1),
    Field("CreateTimestamp", "int64"),
    Field("WriteTimestamp", "int64"),
    Field("StateBatches", "[]StateBatch"),
]
UPDATE_VALUE = [
    Field("SnapshotEpoch", "int32"),
    Field("LeaderEpoch", "int32"),
    Field("StartOffset", "int64"),
    Field("DeliveryCompleteCount", "int32", tag=0, default=-1),
    Field("StateBatches", "[]StateBatch"),
]
STRUCTS = {"StateBatch": STATE_BATCH}
# Record type (the key's version prefix) -> key schema, value schema.
RECORD_TYPES = {0: ("ShareSnapshotKey", SNAPSHOT_VALUE), 1: ("ShareUpdateKey", UPDATE_VALUE)}
_FIXED = {"int8": ">b", "int16": ">h", "int32": ">i", "int64": ">q"}


class Cursor:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        assert self.pos + n <= len(self.data), f"short read of {n} at {self.pos}"
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def fixed(self, kind: str) -> int:
        fmt = struct.Struct(_FIXED[kind])
        value: int = fmt.unpack(self.take(fmt.size))[0]
        return value

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            byte = self.take(1)[0]
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value


def _decode(cur: Cursor, fields: list[Field], flexible: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields:
        if f.tag is not None:
            out[f.name] = f.default  # set from the tagged section if present
            continue
        if f.type in _FIXED:
            out[f.name] = cur.fixed(f.type)
        elif f.type == "uuid":
            out[f.name] = uuid.UUID(bytes=cur.take(16))
        elif f.type == "string":
            length = cur.uvarint() - 1 if flexible else cur.fixed("int16")
            out[f.name] = cur.take(length).decode()
        elif f.type.startswith("[]"):
            count = cur.uvarint() - 1 if flexible else cur.fixed("int32")
            assert count >= 0, f"{f.name} is null"
            inner = STRUCTS[f.type[2:]]
            out[f.name] = [_decode(cur, inner, flexible) for _ in range(count)]
        else:
            raise AssertionError(f"type {f.type} not in these schemas")
    if flexible:
        by_tag = {f.tag: f for f in fields if f.tag is not None}
        for _ in range(cur.uvarint()):
            tag, size = cur.uvarint(), cur.uvarint()
            raw = Cursor(cur.take(size))
            field = by_tag.get(tag)
            if field is not None:
                out[field.name] = raw.fixed(field.type)
                assert raw.pos == size, f"tagged field {field.name} has {size} bytes"
    return out


def kafka_decode(key: bytes, value: bytes | None) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """(record type, key fields, value fields) as Kafka 4.2's serde reads them."""
    kcur = Cursor(key)
    record_type = kcur.fixed("int16")
    # Keys are "flexibleVersions": "none"; values "0+".
    key_fields = _decode(kcur, KEY_FIELDS, flexible=False)
    assert kcur.pos == len(key)
    if value is None:
        return record_type, key_fields, {}
    vcur = Cursor(value)
    assert vcur.fixed("int16") == 0, "value version"
    value_fields = _decode(vcur, RECORD_TYPES[record_type][1], flexible=True)
    assert vcur.pos == len(value), "bytes after the value's last field"
    return record_type, key_fields, value_fields


TOPIC = uuid.UUID("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0")
KEY = ShareKey("grp-ü", TOPIC, 7)
SKEY = ShareStateKey("grp-ü", TOPIC, 7)
NOW = 1_750_000_000_000
BATCHES = (StateBatch(10, 12, 2, 1), StateBatch(13, 13, 4, 5), StateBatch(14, 20, 0, 2))


def _batches(fields: dict[str, Any]) -> list[tuple[int, int, int, int]]:
    return [
        (b["FirstOffset"], b["LastOffset"], b["DeliveryState"], b["DeliveryCount"])
        for b in fields["StateBatches"]
    ]


@pytest.mark.parametrize("count", [-1, 0, 3, 2**31 - 1])
def test_snapshot_decodes_field_by_field_with_kafka_schema(count: int) -> None:
    record = ShareSnapshot(KEY, 4, 2, 9, 10, NOW - 5, NOW, BATCHES, count)
    record_type, key, value = kafka_decode(*encode(record))
    assert record_type == 0
    assert key == {"GroupId": "grp-ü", "TopicId": TOPIC, "Partition": 7}
    assert value["SnapshotEpoch"] == 4
    assert value["StateEpoch"] == 2
    assert value["LeaderEpoch"] == 9
    assert value["StartOffset"] == 10
    assert value["DeliveryCompleteCount"] == count
    assert value["CreateTimestamp"] == NOW - 5
    assert value["WriteTimestamp"] == NOW
    assert _batches(value) == [tuple(b) for b in BATCHES]


@pytest.mark.parametrize("count", [-1, 0, 6])
def test_update_decodes_field_by_field_with_kafka_schema(count: int) -> None:
    record = ShareUpdate(KEY, 4, 9, -1, BATCHES, count)
    record_type, key, value = kafka_decode(*encode(record))
    assert record_type == 1
    assert key == {"GroupId": "grp-ü", "TopicId": TOPIC, "Partition": 7}
    assert value["SnapshotEpoch"] == 4
    assert value["LeaderEpoch"] == 9
    assert value["StartOffset"] == -1
    assert value["DeliveryCompleteCount"] == count
    assert _batches(value) == [tuple(b) for b in BATCHES]


def test_the_default_count_is_not_written_as_kafka_omits_tagged_defaults() -> None:
    _, value = encode(ShareUpdate(KEY, 4, 9, -1, (), -1))
    assert value is not None and value.endswith(b"\x01\x00")  # empty batches, no tags
    _, counted = encode(ShareUpdate(KEY, 4, 9, -1, (), 5))
    assert counted is not None and counted.endswith(b"\x01\x01\x00\x04" + struct.pack(">i", 5))


def test_tombstone_is_a_snapshot_key_with_no_value() -> None:
    from persister.share_records import ShareTombstone

    record_type, key, value = kafka_decode(*encode(ShareTombstone(KEY)))
    assert (record_type, value) == (0, {})
    assert key["Partition"] == 7


def _written(shard: ShareCoordinatorShard, result: tuple[list[ShareRecord], Any]) -> ShareRecord:
    records, _ = result
    assert len(records) == 1
    shard.replay(records[0])
    return records[0]


def test_records_the_shard_writes_carry_kafka_42_values() -> None:
    shard = ShareCoordinatorShard(snapshot_update_records_per_snapshot=1)
    # Initialize: leader epoch 0, create = write = now, count -1 with no start offset.
    init = kafka_decode(*encode(_written(shard, shard.initialize_state(SKEY, 3, -1, NOW))))[2]
    assert (init["LeaderEpoch"], init["StateEpoch"], init["StartOffset"]) == (0, 3, -1)
    assert (init["CreateTimestamp"], init["WriteTimestamp"]) == (NOW, NOW)
    assert init["DeliveryCompleteCount"] == -1
    # A reset to an explicit start offset: count 0, so lag is computable at once.
    reset = kafka_decode(*encode(_written(shard, shard.initialize_state(SKEY, 4, 10, NOW))))[2]
    assert (reset["SnapshotEpoch"], reset["StartOffset"], reset["DeliveryCompleteCount"]) == (
        1,
        10,
        0,
    )
    # A read with a new leader epoch: an update keeping the start offset and the count.
    read = _written(shard, shard.read_state(SKEY, 2, NOW + 1))
    record_type, _, value = kafka_decode(*encode(read))
    assert record_type == 1
    assert (value["LeaderEpoch"], value["StartOffset"], value["DeliveryCompleteCount"]) == (
        2,
        10,
        0,
    )
    # The next write rolls a snapshot: created and written now, the stored leader epoch.
    batch = PersistedBatch(10, 11, 2, 1)
    rolled = _written(
        shard,
        shard.write_state(SKEY, 4, 5, 10, [batch], NOW + 9, delivery_complete_count=2),
    )
    record_type, _, value = kafka_decode(*encode(rolled))
    assert record_type == 0
    assert (value["CreateTimestamp"], value["WriteTimestamp"]) == (NOW + 9, NOW + 9)
    assert (value["LeaderEpoch"], value["DeliveryCompleteCount"]) == (2, 2)
    assert _batches(value) == [(10, 11, 2, 1)]
