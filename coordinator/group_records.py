"""Codec for the group coordinator's records (share, consumer and classic groups, their
committed offsets, group configs) in `data/groups/`.

The records are the dataclasses of `coordinator.share_group` and
`coordinator.group_config`. Each is stored under a key named after Kafka's record type,
with Kafka's type number, and keyed the way Kafka keys it, so compaction can keep the
newest record per key (one key per group-metadata piece, per member, per config):

    type  name                                key fields
    10    ShareGroupMemberMetadata            group_id, member_id
    11    ShareGroupMetadata                  group_id
    12    ShareGroupTargetAssignmentMetadata  group_id
    13    ShareGroupTargetAssignmentMember    group_id, member_id
    14    ShareGroupCurrentMemberAssignment   group_id, member_id
    15    ShareGroupStatePartitionMetadata    group_id
    4     ConfigRecord                        resource_type (32, GROUP), resource_name, config

and, for consumer and classic groups and their committed offsets (coordinator.offsets,
coordinator.classic_group, coordinator.consumer_group):

    1     OffsetCommit                            group_id, topic, partition
    2     GroupMetadata                           group_id
    3     ConsumerGroupMetadata                   group_id
    5     ConsumerGroupMemberMetadata             group_id, member_id
    6     ConsumerGroupTargetAssignmentMetadata   group_id
    7     ConsumerGroupTargetAssignmentMember     group_id, member_id
    8     ConsumerGroupCurrentMemberAssignment    group_id, member_id
    16    ConsumerGroupRegularExpression          group_id, regex
    1000  PendingTxnOffsetCommit                  group_id, producer_id, topic, partition

(the numbers are the `apiKey`s of Kafka 4.2's group coordinator record keys; 1000 is
spool's own, for transactional offsets, see coordinator.offsets; ConfigRecord is the
KRaft metadata record Kafka stores group configs as, and keeps its own key shape, so its
4 is told from ConsumerGroupPartitionMetadata's, which Kafka 4.2 no longer writes). The key
is compact JSON: `{"type": 10, "name": "ShareGroupMemberMetadata", "group_id": ...}`; the
value is spool's own JSON layout of the other fields with a `version`, or null for a
tombstone, as Kafka deletes a key. A group's deletion is tombstones on its three
group-level keys (Kafka's ShareGroup.createGroupTombstoneRecords); its members are gone
already, since only an empty group can be deleted.

Data directories written before these keys (JSON list keys and values tagged with the
Python class name, `{"type": "ShareGroupMetadataRecord", ...}`) still load: `decode`
reads both, and `compaction_keys` maps both onto the keys above.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import uuid
from collections.abc import Hashable, Mapping
from typing import Any

from coordinator import classic_group as cl
from coordinator import consumer_group as cg
from coordinator import offsets as of
from coordinator import share_group as sg
from coordinator.assignor import TopicMetadata
from coordinator.group_config import GroupConfigRecord
from persister.coordinator_log import KeyValue

GroupRecord = (
    sg.ShareGroupRecord
    | GroupConfigRecord
    | cg.ConsumerGroupRecord
    | cl.ClassicGroupRecord
    | of.OffsetRecord
)

VALUE_VERSION = 0
# Kafka's ConfigResource.Type.GROUP.
GROUP_RESOURCE_TYPE = 32

SHARE_GROUP_MEMBER_METADATA = 10
SHARE_GROUP_METADATA = 11
SHARE_GROUP_TARGET_ASSIGNMENT_METADATA = 12
SHARE_GROUP_TARGET_ASSIGNMENT_MEMBER = 13
SHARE_GROUP_CURRENT_MEMBER_ASSIGNMENT = 14
SHARE_GROUP_STATE_PARTITION_METADATA = 15
CONFIG_RECORD = 4
OFFSET_COMMIT = 1
GROUP_METADATA = 2
CONSUMER_GROUP_METADATA = 3
CONSUMER_GROUP_MEMBER_METADATA = 5
CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA = 6
CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER = 7
CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT = 8
CONSUMER_GROUP_REGULAR_EXPRESSION = 16
PENDING_TXN_OFFSET_COMMIT = 1000

TYPE_NAMES = {
    OFFSET_COMMIT: "OffsetCommit",
    GROUP_METADATA: "GroupMetadata",
    CONSUMER_GROUP_METADATA: "ConsumerGroupMetadata",
    CONSUMER_GROUP_MEMBER_METADATA: "ConsumerGroupMemberMetadata",
    CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA: "ConsumerGroupTargetAssignmentMetadata",
    CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER: "ConsumerGroupTargetAssignmentMember",
    CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT: "ConsumerGroupCurrentMemberAssignment",
    CONSUMER_GROUP_REGULAR_EXPRESSION: "ConsumerGroupRegularExpression",
    PENDING_TXN_OFFSET_COMMIT: "PendingTxnOffsetCommit",
    SHARE_GROUP_MEMBER_METADATA: "ShareGroupMemberMetadata",
    SHARE_GROUP_METADATA: "ShareGroupMetadata",
    SHARE_GROUP_TARGET_ASSIGNMENT_METADATA: "ShareGroupTargetAssignmentMetadata",
    SHARE_GROUP_TARGET_ASSIGNMENT_MEMBER: "ShareGroupTargetAssignmentMember",
    SHARE_GROUP_CURRENT_MEMBER_ASSIGNMENT: "ShareGroupCurrentMemberAssignment",
    SHARE_GROUP_STATE_PARTITION_METADATA: "ShareGroupStatePartitionMetadata",
    CONFIG_RECORD: "ConfigRecord",
}

# Record class -> type number, for records with a value and for tombstones.
_VALUE_TYPES: dict[type[Any], int] = {
    sg.ShareGroupMemberMetadataRecord: SHARE_GROUP_MEMBER_METADATA,
    sg.ShareGroupMetadataRecord: SHARE_GROUP_METADATA,
    sg.ShareGroupTargetAssignmentMetadataRecord: SHARE_GROUP_TARGET_ASSIGNMENT_METADATA,
    sg.ShareGroupTargetAssignmentMemberRecord: SHARE_GROUP_TARGET_ASSIGNMENT_MEMBER,
    sg.ShareGroupCurrentMemberAssignmentRecord: SHARE_GROUP_CURRENT_MEMBER_ASSIGNMENT,
    sg.ShareGroupStatePartitionMetadataRecord: SHARE_GROUP_STATE_PARTITION_METADATA,
}
_TOMBSTONE_TYPES: dict[type[Any], int] = {
    sg.ShareGroupMemberMetadataTombstone: SHARE_GROUP_MEMBER_METADATA,
    sg.ShareGroupTargetAssignmentMemberTombstone: SHARE_GROUP_TARGET_ASSIGNMENT_MEMBER,
    sg.ShareGroupCurrentMemberAssignmentTombstone: SHARE_GROUP_CURRENT_MEMBER_ASSIGNMENT,
}
_VALUE_CLASSES = {number: cls for cls, number in _VALUE_TYPES.items()}
_TOMBSTONE_CLASSES = {number: cls for cls, number in _TOMBSTONE_TYPES.items()}
_MEMBER_TYPES = frozenset(
    {
        SHARE_GROUP_MEMBER_METADATA,
        SHARE_GROUP_TARGET_ASSIGNMENT_MEMBER,
        SHARE_GROUP_CURRENT_MEMBER_ASSIGNMENT,
    }
)
# Deleting a group deletes these keys; replaying the last one forgets the group.
_GROUP_KEYS = (
    SHARE_GROUP_STATE_PARTITION_METADATA,
    SHARE_GROUP_TARGET_ASSIGNMENT_METADATA,
    SHARE_GROUP_METADATA,
)
_KEY_FIELDS = frozenset({"group_id", "member_id"})
_ASSIGNMENTS = {"assignment", "initializing", "initialized"}

# The consumer-group, classic-group and offset records: their key fields after group_id.
_MEMBER_KEY = ("member_id",)
_PARTITION_KEY = ("topic", "partition")
_KEYED_VALUES: dict[type[Any], tuple[int, tuple[str, ...]]] = {
    of.OffsetCommitRecord: (OFFSET_COMMIT, _PARTITION_KEY),
    of.PendingTxnOffsetCommitRecord: (PENDING_TXN_OFFSET_COMMIT, ("producer_id", *_PARTITION_KEY)),
    cl.GroupMetadataRecord: (GROUP_METADATA, ()),
    cg.ConsumerGroupMetadataRecord: (CONSUMER_GROUP_METADATA, ()),
    cg.ConsumerGroupMemberMetadataRecord: (CONSUMER_GROUP_MEMBER_METADATA, _MEMBER_KEY),
    cg.ConsumerGroupTargetAssignmentMetadataRecord: (CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA, ()),
    cg.ConsumerGroupTargetAssignmentMemberRecord: (
        CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER,
        _MEMBER_KEY,
    ),
    cg.ConsumerGroupCurrentMemberAssignmentRecord: (
        CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT,
        _MEMBER_KEY,
    ),
    cg.ConsumerGroupRegularExpressionRecord: (CONSUMER_GROUP_REGULAR_EXPRESSION, ("regex",)),
}
_KEYED_TOMBSTONES: dict[type[Any], int] = {
    of.OffsetCommitTombstone: OFFSET_COMMIT,
    of.PendingTxnOffsetCommitTombstone: PENDING_TXN_OFFSET_COMMIT,
    cl.ClassicGroupTombstone: GROUP_METADATA,
    cg.ConsumerGroupMemberMetadataTombstone: CONSUMER_GROUP_MEMBER_METADATA,
    cg.ConsumerGroupTargetAssignmentMemberTombstone: CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER,
    cg.ConsumerGroupCurrentMemberAssignmentTombstone: CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT,
    cg.ConsumerGroupRegularExpressionTombstone: CONSUMER_GROUP_REGULAR_EXPRESSION,
}
_KEYED_FIELDS = {number: fields for number, fields in _KEYED_VALUES.values()}
_KEYED_VALUE_CLASSES = {number: cls for cls, (number, _) in _KEYED_VALUES.items()}
_KEYED_TOMBSTONE_CLASSES = {number: cls for cls, number in _KEYED_TOMBSTONES.items()}
# A consumer group's deletion: its group-level keys, the metadata last (its tombstone,
# replayed, forgets the group); the assignment metadata's needs no replay.
_CONSUMER_GROUP_KEYS = (CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA, CONSUMER_GROUP_METADATA)
_CONSUMER_ASSIGNMENTS = {"assignment", "assigned_partitions", "partitions_pending_revocation"}


# ------------------------------------------------------------------ field codec


def _to_json(name: str, value: Any) -> Any:
    if name in _ASSIGNMENTS:
        return {str(tid): sorted(parts) for tid, parts in value.items()}
    if name == "subscribed_topic_names":
        return sorted(value)
    if name == "deleting":
        return sorted(str(tid) for tid in value)
    if name == "subscription_metadata":
        return [[str(t.topic_id), t.name, t.num_partitions] for t in value]
    return value


def _from_json(name: str, value: Any) -> Any:
    if name in _ASSIGNMENTS:
        return {uuid.UUID(tid): frozenset(parts) for tid, parts in value.items()}
    if name == "subscribed_topic_names":
        return frozenset(value)
    if name == "deleting":
        return frozenset(uuid.UUID(tid) for tid in value)
    if name == "subscription_metadata":
        return tuple(TopicMetadata(uuid.UUID(tid), n, p) for tid, n, p in value)
    return value


def _keyed_to_json(name: str, value: Any) -> Any:
    """A field of a consumer-group, classic-group or offset record, as stored."""
    if name in _CONSUMER_ASSIGNMENTS:
        return {str(tid): sorted(parts) for tid, parts in value.items()}
    if name == "subscribed_topic_names":
        return sorted(value)
    if name == "topics":
        return list(value)
    if name == "topic_id":
        return None if value is None else str(value)
    if name == "members":
        return [
            {
                f.name: (
                    base64.b64encode(getattr(m, f.name)).decode()
                    if f.name in ("subscription", "assignment")
                    else getattr(m, f.name)
                )
                for f in dataclasses.fields(m)
            }
            for m in value
        ]
    return value


def _keyed_from_json(name: str, value: Any) -> Any:
    if name in _CONSUMER_ASSIGNMENTS:
        return {uuid.UUID(tid): frozenset(parts) for tid, parts in value.items()}
    if name == "subscribed_topic_names":
        return frozenset(value)
    if name == "topics":
        return tuple(value)
    if name == "topic_id":
        return None if value is None else uuid.UUID(value)
    if name == "members":
        return tuple(
            cl.ClassicMember(
                **{
                    **m,
                    "subscription": base64.b64decode(m["subscription"]),
                    "assignment": base64.b64decode(m["assignment"]),
                }
            )
            for m in value
        )
    return value


def _keyed_key(record_type: int, group_id: str, key: Mapping[str, Any]) -> bytes:
    fields = {name: key[name] for name in _KEYED_FIELDS[record_type]}
    return json.dumps(
        {"type": record_type, "name": TYPE_NAMES[record_type], "group_id": group_id, **fields},
        separators=(",", ":"),
    ).encode()


def _keyed_value(record: Any, key_fields: tuple[str, ...]) -> bytes:
    skip = {"group_id", *key_fields}
    fields = {
        f.name: _keyed_to_json(f.name, getattr(record, f.name))
        for f in dataclasses.fields(record)
        if f.name not in skip
    }
    return json.dumps({"version": VALUE_VERSION, **fields}, sort_keys=True).encode()


def _record_key_fields(record: Any, record_type: int) -> dict[str, Any]:
    return {name: getattr(record, name) for name in _KEYED_FIELDS[record_type]}


def _stored_fields(cls: type[Any], data: Mapping[str, Any], skip: frozenset[str]) -> dict[str, Any]:
    """The dataclass fields stored in `data`; a field added later with a default (such
    as `deleting`) may be absent from records written before it."""
    return {
        f.name: _from_json(f.name, data[f.name])
        for f in dataclasses.fields(cls)
        if f.name not in skip and (f.name in data or f.default is dataclasses.MISSING)
    }


def _key(record_type: int, group_id: str, member_or_config: str | None = None) -> bytes:
    key: dict[str, Any] = {"type": record_type, "name": TYPE_NAMES[record_type]}
    if record_type == CONFIG_RECORD:
        key.update(resource_type=GROUP_RESOURCE_TYPE, resource_name=group_id)
        key["config"] = member_or_config
    else:
        key["group_id"] = group_id
        if record_type in _MEMBER_TYPES:
            key["member_id"] = member_or_config
    return json.dumps(key, separators=(",", ":")).encode()


def _value(record: Any) -> bytes:
    fields = {
        f.name: _to_json(f.name, getattr(record, f.name))
        for f in dataclasses.fields(record)
        if f.name not in _KEY_FIELDS
    }
    return json.dumps({"version": VALUE_VERSION, **fields}, sort_keys=True).encode()


# ------------------------------------------------------------------ encode


def encode(record: GroupRecord) -> list[KeyValue]:
    """The key/value records storing `record` (a group deletion is three tombstones)."""
    if isinstance(record, GroupConfigRecord):
        value = None if record.value is None else json.dumps({"value": record.value}).encode()
        return [(_key(CONFIG_RECORD, record.group_id, record.name), value)]
    if isinstance(record, sg.ShareGroupTombstone):
        return [(_key(t, record.group_id), None) for t in _GROUP_KEYS]
    if isinstance(record, cg.ConsumerGroupTombstone):
        return [(_keyed_key(t, record.group_id, {}), None) for t in _CONSUMER_GROUP_KEYS]
    keyed = _KEYED_VALUES.get(type(record))
    if keyed is not None:
        number, key_fields = keyed
        key = _keyed_key(number, record.group_id, _record_key_fields(record, number))
        return [(key, _keyed_value(record, key_fields))]
    keyed_tombstone = _KEYED_TOMBSTONES.get(type(record))
    if keyed_tombstone is not None:
        fields = _record_key_fields(record, keyed_tombstone)
        return [(_keyed_key(keyed_tombstone, record.group_id, fields), None)]
    member_id = getattr(record, "member_id", None)
    tombstone_type = _TOMBSTONE_TYPES.get(type(record))
    if tombstone_type is not None:
        return [(_key(tombstone_type, record.group_id, member_id), None)]
    return [(_key(_VALUE_TYPES[type(record)], record.group_id, member_id), _value(record))]


# ------------------------------------------------------------------ decode


def _parse_key(key: bytes | None) -> Mapping[str, Any] | list[Any]:
    if key is None:
        raise ValueError("group record has no key")
    parsed: Mapping[str, Any] | list[Any] = json.loads(key)
    return parsed


def _record_type(key: Mapping[str, Any]) -> int:
    record_type = key.get("type")
    if record_type not in TYPE_NAMES or key.get("name") != TYPE_NAMES[record_type]:
        raise ValueError(
            f"unknown group record type {record_type!r} ({key.get('name')!r}); known: "
            + ", ".join(f"{n} {name}" for n, name in sorted(TYPE_NAMES.items()))
        )
    assert isinstance(record_type, int)
    return record_type


def decode(key: bytes | None, value: bytes | None) -> GroupRecord | None:
    """The record stored as (key, value); None for a tombstone that replay needs not see
    (a deleted group's assignment-metadata and state-partition keys: forgetting the
    group covers them). ValueError if it is not a group record."""
    parsed = _parse_key(key)
    if isinstance(parsed, list):
        if value is None:
            raise ValueError("group record in the class-name format has no value")
        return _decode_class_name_format(value)
    record_type = _record_type(parsed)
    if record_type == CONFIG_RECORD:
        if parsed.get("resource_type") != GROUP_RESOURCE_TYPE:
            raise ValueError(f"ConfigRecord for resource type {parsed.get('resource_type')!r}")
        config_value = None if value is None else json.loads(value)["value"]
        return GroupConfigRecord(parsed["resource_name"], parsed["config"], config_value)
    group_id = parsed["group_id"]
    if record_type in _KEYED_FIELDS:
        return _decode_keyed(record_type, parsed, value)
    member = {"member_id": parsed["member_id"]} if record_type in _MEMBER_TYPES else {}
    if value is None:
        if record_type == SHARE_GROUP_METADATA:
            return sg.ShareGroupTombstone(group_id)
        cls = _TOMBSTONE_CLASSES.get(record_type)
        return None if cls is None else cls(group_id=group_id, **member)
    data = _value_data(record_type, value)
    cls = _VALUE_CLASSES[record_type]
    fields = _stored_fields(cls, data, _KEY_FIELDS)
    record: GroupRecord = cls(group_id=group_id, **member, **fields)
    return record


def _value_data(record_type: int, value: bytes) -> Mapping[str, Any]:
    """A stored value's fields; ValueError for a layout version this spool does not know."""
    data: Mapping[str, Any] = json.loads(value)
    if data.get("version") != VALUE_VERSION:
        raise ValueError(
            f"{TYPE_NAMES[record_type]} value version {data.get('version')!r} is not "
            f"supported (only {VALUE_VERSION})"
        )
    return data


def _decode_keyed(
    record_type: int, parsed: Mapping[str, Any], value: bytes | None
) -> GroupRecord | None:
    """A consumer-group, classic-group or offset record (see `_KEYED_VALUES`)."""
    group_id = parsed["group_id"]
    key = {name: parsed[name] for name in _KEYED_FIELDS[record_type]}
    if value is None:
        if record_type == CONSUMER_GROUP_METADATA:
            return cg.ConsumerGroupTombstone(group_id)
        tombstone = _KEYED_TOMBSTONE_CLASSES.get(record_type)
        return None if tombstone is None else tombstone(group_id=group_id, **key)
    data = _value_data(record_type, value)
    cls = _KEYED_VALUE_CLASSES[record_type]
    skip = {"group_id", *key}
    fields = {
        f.name: _keyed_from_json(f.name, data[f.name])
        for f in dataclasses.fields(cls)
        if f.name not in skip and (f.name in data or f.default is dataclasses.MISSING)
    }
    record: GroupRecord = cls(group_id=group_id, **key, **fields)
    return record


# The format before Kafka's record types: values tagged with the Python class name.
_CLASS_NAME_TYPES: dict[str, type[Any]] = {
    cls.__name__: cls
    for cls in (
        sg.ShareGroupMetadataRecord,
        sg.ShareGroupMemberMetadataRecord,
        sg.ShareGroupMemberMetadataTombstone,
        sg.ShareGroupTargetAssignmentMemberRecord,
        sg.ShareGroupTargetAssignmentMemberTombstone,
        sg.ShareGroupTargetAssignmentMetadataRecord,
        sg.ShareGroupCurrentMemberAssignmentRecord,
        sg.ShareGroupCurrentMemberAssignmentTombstone,
        sg.ShareGroupStatePartitionMetadataRecord,
        sg.ShareGroupTombstone,
        GroupConfigRecord,
    )
}


def _decode_class_name_format(value: bytes) -> GroupRecord:
    data: Mapping[str, Any] = json.loads(value)
    cls = _CLASS_NAME_TYPES.get(data["type"])
    if cls is None:
        raise ValueError(f"unknown group record type {data['type']!r}")
    kwargs = _stored_fields(cls, data, frozenset())
    record: GroupRecord = cls(**kwargs)
    return record


# ------------------------------------------------------------------ compaction


def _record_keys(record: GroupRecord) -> list[tuple[Hashable, bool]]:
    """(compaction key, deletes it) for each key the record sets."""
    if isinstance(record, GroupConfigRecord):
        return [((CONFIG_RECORD, record.group_id, record.name), record.value is None)]
    if isinstance(record, sg.ShareGroupTombstone):
        return [((t, record.group_id, ""), True) for t in _GROUP_KEYS]
    if isinstance(record, cg.ConsumerGroupTombstone):
        return [((t, record.group_id), True) for t in _CONSUMER_GROUP_KEYS]
    keyed = _KEYED_VALUES.get(type(record))
    keyed_tombstone = _KEYED_TOMBSTONES.get(type(record))
    number = keyed[0] if keyed is not None else keyed_tombstone
    if number is not None:
        fields = tuple(_record_key_fields(record, number).values())
        return [((number, record.group_id, *fields), keyed is None)]
    member_id = getattr(record, "member_id", "")
    tombstone_type = _TOMBSTONE_TYPES.get(type(record))
    if tombstone_type is not None:
        return [((tombstone_type, record.group_id, member_id), True)]
    return [((_VALUE_TYPES[type(record)], record.group_id, member_id), False)]


def compaction_keys(key: bytes | None, value: bytes | None) -> list[tuple[Hashable, bool]]:
    """The keys a stored record sets, for `persister.coordinator_log.compact_by_key`; the
    same for both formats, so a log mixing them compacts correctly."""
    parsed = _parse_key(key)
    if isinstance(parsed, list):
        record = decode(key, value)
        assert record is not None
        return _record_keys(record)
    record_type = _record_type(parsed)
    if record_type in _KEYED_FIELDS:
        fields = tuple(parsed[name] for name in _KEYED_FIELDS[record_type])
        return [((record_type, parsed["group_id"], *fields), value is None)]
    if record_type == CONFIG_RECORD:
        subkey = parsed["config"]
        group_id = parsed["resource_name"]
    else:
        group_id = parsed["group_id"]
        subkey = parsed["member_id"] if record_type in _MEMBER_TYPES else ""
    return [((record_type, group_id, subkey), value is None)]
