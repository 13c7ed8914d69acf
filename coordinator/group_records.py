"""JSON codec for the group coordinator's records (share groups and group configs).

The records are the dataclasses of `coordinator.share_group` and
`coordinator.group_config`; each is stored as one key/value record in `data/groups/`
with the record type and group id in the key, so a future compaction can keep the
latest record per key.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Mapping
from typing import Any

from coordinator import share_group as sg
from coordinator.assignor import TopicMetadata
from coordinator.group_config import GroupConfigRecord

GroupRecord = sg.ShareGroupRecord | GroupConfigRecord

_TYPES: dict[str, type[Any]] = {
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
_ASSIGNMENTS = {"assignment", "initializing", "initialized"}


def _to_json(name: str, value: Any) -> Any:
    if name in _ASSIGNMENTS:
        return {str(tid): sorted(parts) for tid, parts in value.items()}
    if name == "subscribed_topic_names":
        return sorted(value)
    if name == "subscription_metadata":
        return [[str(t.topic_id), t.name, t.num_partitions] for t in value]
    return value


def _from_json(name: str, value: Any) -> Any:
    if name in _ASSIGNMENTS:
        return {uuid.UUID(tid): frozenset(parts) for tid, parts in value.items()}
    if name == "subscribed_topic_names":
        return frozenset(value)
    if name == "subscription_metadata":
        return tuple(TopicMetadata(uuid.UUID(tid), n, p) for tid, n, p in value)
    return value


def encode(record: GroupRecord) -> tuple[bytes, bytes]:
    kind = type(record).__name__
    fields = {f.name: _to_json(f.name, getattr(record, f.name)) for f in dataclasses.fields(record)}
    key = json.dumps([kind, fields.get("group_id"), fields.get("member_id"), fields.get("name")])
    return key.encode(), json.dumps({"type": kind, **fields}, sort_keys=True).encode()


def decode(value: bytes) -> GroupRecord:
    data: Mapping[str, Any] = json.loads(value)
    cls = _TYPES.get(data["type"])
    if cls is None:
        raise ValueError(f"unknown group record type {data['type']!r}")
    kwargs = {f.name: _from_json(f.name, data[f.name]) for f in dataclasses.fields(cls)}
    record: GroupRecord = cls(**kwargs)
    return record
