"""Group coordinator records: Kafka's record types in the keys, JSON values, tombstones,
and data directories written in the older class-name format still load."""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from coordinator import group_records
from coordinator import share_group as sg
from coordinator.assignor import TopicMetadata
from coordinator.group_config import SET, AlterConfigOp, GroupConfigRecord, GroupConfigStore
from coordinator.group_coordinator import GroupCoordinator
from coordinator.share_persister import InMemoryPersister
from persister.commit import GroupCommit
from persister.coordinator_log import KeyValue, RecordLog, internal_log_config
from protocol.records import decode_records, iter_batches

T = uuid.UUID(int=5)

RECORDS = [
    sg.ShareGroupMetadataRecord("g", 3, (TopicMetadata(T, "t", 4),)),
    sg.ShareGroupMemberMetadataRecord("g", "m", None, "c", "/1.2.3.4", frozenset({"t", "u"})),
    sg.ShareGroupMemberMetadataTombstone("g", "m"),
    sg.ShareGroupTargetAssignmentMemberRecord("g", "m", {T: frozenset({0, 2})}),
    sg.ShareGroupTargetAssignmentMemberTombstone("g", "m"),
    sg.ShareGroupTargetAssignmentMetadataRecord("g", 3),
    sg.ShareGroupCurrentMemberAssignmentRecord("g", "m", 3, 2, {T: frozenset({1})}),
    sg.ShareGroupCurrentMemberAssignmentTombstone("g", "m"),
    sg.ShareGroupStatePartitionMetadataRecord("g", {T: frozenset({3})}, {T: frozenset({0, 1})}),
    sg.ShareGroupTombstone("g"),
    GroupConfigRecord("g", "share.auto.offset.reset", "earliest"),
    GroupConfigRecord("g", "share.auto.offset.reset", None),
]

# Kafka 4.2's coordinator record types (group-coordinator ShareGroup*Key.json apiKey) and
# the KRaft ConfigRecord.
EXPECTED_TYPES = {
    "ShareGroupMetadataRecord": (11, "ShareGroupMetadata"),
    "ShareGroupMemberMetadataRecord": (10, "ShareGroupMemberMetadata"),
    "ShareGroupMemberMetadataTombstone": (10, "ShareGroupMemberMetadata"),
    "ShareGroupTargetAssignmentMemberRecord": (13, "ShareGroupTargetAssignmentMember"),
    "ShareGroupTargetAssignmentMemberTombstone": (13, "ShareGroupTargetAssignmentMember"),
    "ShareGroupTargetAssignmentMetadataRecord": (12, "ShareGroupTargetAssignmentMetadata"),
    "ShareGroupCurrentMemberAssignmentRecord": (14, "ShareGroupCurrentMemberAssignment"),
    "ShareGroupCurrentMemberAssignmentTombstone": (14, "ShareGroupCurrentMemberAssignment"),
    "ShareGroupStatePartitionMetadataRecord": (15, "ShareGroupStatePartitionMetadata"),
    "GroupConfigRecord": (4, "ConfigRecord"),
}


def _decoded(pairs: list[KeyValue]) -> list[Any]:
    return [r for k, v in pairs if (r := group_records.decode(k, v)) is not None]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_record_round_trips(record: group_records.GroupRecord) -> None:
    assert _decoded(group_records.encode(record)) == [record]


@pytest.mark.parametrize(
    "record", [r for r in RECORDS if not isinstance(r, sg.ShareGroupTombstone)], ids=repr
)
def test_key_carries_kafkas_record_type_number_and_name(record: Any) -> None:
    [(key, value)] = group_records.encode(record)
    parsed = json.loads(key)
    assert (parsed["type"], parsed["name"]) == EXPECTED_TYPES[type(record).__name__]
    is_delete = "Tombstone" in type(record).__name__ or getattr(record, "value", "") is None
    assert (value is None) == is_delete


def test_keys_are_kafkas_keys_one_per_group_piece_member_and_config() -> None:
    member_keys = {
        json.loads(k)["member_id"]
        for r in RECORDS
        if hasattr(r, "member_id")
        for k, _ in group_records.encode(r)
    }
    assert member_keys == {"m"}
    [(config_key, _)] = group_records.encode(RECORDS[-2])
    assert json.loads(config_key) == {
        "type": 4,
        "name": "ConfigRecord",
        "resource_type": 32,
        "resource_name": "g",
        "config": "share.auto.offset.reset",
    }


def test_group_deletion_is_a_tombstone_on_each_group_level_key() -> None:
    pairs = group_records.encode(sg.ShareGroupTombstone("g"))
    assert [json.loads(k)["type"] for k, _ in pairs] == [15, 12, 11]
    assert all(v is None for _, v in pairs)
    keys = [k for pair in pairs for k in group_records.compaction_keys(*pair)]
    assert keys == [((15, "g", ""), True), ((12, "g", ""), True), ((11, "g", ""), True)]


def test_unknown_record_type_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown group record type"):
        group_records.decode(b'{"type": 99, "name": "Nope"}', b"{}")
    with pytest.raises(ValueError, match="unknown group record type"):
        group_records.decode(b'{"type": 10, "name": "ShareGroupMetadata"}', b"{}")
    with pytest.raises(ValueError, match="unknown group record type"):
        group_records.decode(b'["Nope", "g", null, null]', b'{"type": "Nope"}')


# ------------------------------------------------------------------ the class-name format


def class_name_encode(record: Any) -> KeyValue:
    """How spool stored group records before Kafka's record types (kept for this test)."""
    kind = type(record).__name__
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(record):
        if f.name == "deleting":
            continue  # added after this format; decoding defaults it
        value = getattr(record, f.name)
        if f.name in ("assignment", "initializing", "initialized"):
            value = {str(tid): sorted(parts) for tid, parts in value.items()}
        elif f.name == "subscribed_topic_names":
            value = sorted(value)
        elif f.name == "subscription_metadata":
            value = [[str(t.topic_id), t.name, t.num_partitions] for t in value]
        fields[f.name] = value
    key = json.dumps([kind, fields.get("group_id"), fields.get("member_id"), fields.get("name")])
    return key.encode(), json.dumps({"type": kind, **fields}, sort_keys=True).encode()


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_class_name_format_records_still_decode(record: Any) -> None:
    assert group_records.decode(*class_name_encode(record)) == record
    new_keys = [
        k for pair in group_records.encode(record) for k in group_records.compaction_keys(*pair)
    ]
    assert group_records.compaction_keys(*class_name_encode(record)) == new_keys


def group_view(groups: GroupCoordinator) -> dict[str, Any]:
    return {
        "groups": {
            gid: (g.group_epoch, g.assignment_epoch, g.members, g.target_assignment, g.initialized)
            for gid, g in groups.groups.items()
        },
        "configs": {gid: groups.configs.overrides(gid) for gid in groups.configs.group_ids()},
    }


def load_groups(directory: Path) -> GroupCoordinator:
    groups = GroupCoordinator(
        InMemoryPersister(),
        lambda: {T: TopicMetadata(T, "t", 4)},
        GroupConfigStore(),
        RecordLog(directory, GroupCommit()),
    )
    groups.load()
    return groups


async def test_a_data_dir_in_the_class_name_format_loads_and_keeps_working(
    tmp_path: Path,
) -> None:
    # Build the log a previous spool wrote: a live group, a deleted one, a config.
    live = sg.ShareGroup("g")
    records: list[Any] = []

    def apply(group: sg.ShareGroup, new: list[Any]) -> None:
        group.replay_all(new)
        records.extend(new)

    topics = {T: TopicMetadata(T, "t", 4)}
    config = GroupConfigStore().config("g")
    apply(live, live.heartbeat("a", 0, ["t"], None, "c", "/h", topics, 0, config).records)
    apply(live, live.heartbeat("b", 0, ["t"], None, "c", "/h", topics, 0, config).records)
    apply(live, live.mark_initialized({T: range(4)}))
    apply(live, live.heartbeat("b", -1, None, None, "c", "/h", topics, 0, config).records)
    gone = sg.ShareGroup("gone")
    apply(gone, gone.heartbeat("x", 0, ["t"], None, "c", "/h", topics, 0, config).records)
    apply(gone, gone.heartbeat("x", -1, None, None, "c", "/h", topics, 0, config).records)
    apply(gone, gone.delete())
    records.append(GroupConfigRecord("g", "share.record.lock.duration.ms", "20000"))
    old_log = RecordLog(tmp_path / "groups", GroupCommit())
    old_log.write([class_name_encode(r) for r in records])
    old_log.close()

    groups = load_groups(tmp_path / "groups")
    assert set(groups.groups) == {"g"}
    assert set(groups.groups["g"].members) == {"a"}
    assert groups.groups["g"].initialized == {T: frozenset(range(4))}
    assert groups.groups["g"].group_epoch == live.group_epoch
    assert groups.config("g").record_lock_duration_ms == 20000
    loaded = group_view(groups)

    # New records (Kafka's types) follow the old ones in small segments; compaction of
    # closed segments holding both formats keeps the state and drops the deleted group.
    groups.close()
    commit = GroupCommit()
    commit.start()
    groups = GroupCoordinator(
        InMemoryPersister(),
        lambda: topics,
        GroupConfigStore(),
        RecordLog(tmp_path / "groups", commit, internal_log_config(1024)),
    )
    groups.load()
    assert group_view(groups) == loaded
    plog = groups.runtime.record_log.partition_log
    assert plog is not None
    for i in range(20):
        value = str(20000 + i * 1000)
        op = AlterConfigOp("share.record.lock.duration.ms", SET, value)
        await groups.alter_configs("g", [op], False)
    await groups.runtime.compact()
    assert len(plog.closed_segment_base_offsets) == 1
    data = plog.read(plog.log_start_offset, 1 << 20, max_offset=plog.segment_base_offsets[-1])
    closed = [r.key or b"" for pos, h in iter_batches(data) for r in decode_records(data, pos, h)]
    # One closed segment, compacted from both formats: old records kept as written.
    assert any(k.startswith(b"[") for k in closed) and any(k.startswith(b"{") for k in closed)
    assert not any(b"gone" in k for k in closed)
    assert sum(1 for k in closed if b"ConfigRecord" in k or b"GroupConfigRecord" in k) == 1
    after = group_view(groups)
    assert after["configs"] == {"g": {"share.record.lock.duration.ms": 39000}}
    groups.close()
    await commit.stop()
    assert group_view(load_groups(tmp_path / "groups")) == after
