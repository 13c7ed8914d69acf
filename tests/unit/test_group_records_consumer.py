"""The consumer-group, classic-group and offset records: Kafka 4.2's record type numbers
and key fields, round trips, tombstones and compaction keys."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from coordinator import classic_group as cl
from coordinator import consumer_group as cg
from coordinator import group_records
from coordinator import offsets as of

T = uuid.UUID(int=7)
U = uuid.UUID(int=8)

MEMBER = cl.ClassicMember(
    "m-1", "static-1", "client", "/10.0.0.1", 300000, 45000, b"\x00sub", b"\x01as"
)

# record -> (Kafka 4.2 record type, name, key fields besides the group id)
EXPECTED: list[tuple[Any, int, str, dict[str, Any]]] = [
    (of.OffsetCommitRecord("g", "t", 3, 42, 5, "meta", 1000, -1, T), 1, "OffsetCommit",
     {"topic": "t", "partition": 3}),
    (of.OffsetCommitRecord("g", "t", 4, 7), 1, "OffsetCommit", {"topic": "t", "partition": 4}),
    (of.OffsetCommitTombstone("g", "t", 3), 1, "OffsetCommit", {"topic": "t", "partition": 3}),
    (of.PendingTxnOffsetCommitRecord("g", 9001, "t", 0, 2, 11, -1, "", 5), 1000,
     "PendingTxnOffsetCommit", {"producer_id": 9001, "topic": "t", "partition": 0}),
    (of.PendingTxnOffsetCommitTombstone("g", 9001, "t", 0), 1000, "PendingTxnOffsetCommit",
     {"producer_id": 9001, "topic": "t", "partition": 0}),
    (cl.GroupMetadataRecord("g", "consumer", 4, "range", "m-1", 123, (MEMBER,)), 2,
     "GroupMetadata", {}),
    (cl.GroupMetadataRecord("g", "", 0, None, None, 0), 2, "GroupMetadata", {}),
    (cl.ClassicGroupTombstone("g"), 2, "GroupMetadata", {}),
    (cg.ConsumerGroupMetadataRecord("g", 12, 99), 3, "ConsumerGroupMetadata", {}),
    (cg.ConsumerGroupMemberMetadataRecord("g", "m", "i", None, "c", "/h", frozenset({"a", "b"}),
     None, 30000, "uniform"), 5, "ConsumerGroupMemberMetadata", {"member_id": "m"}),
    (cg.ConsumerGroupMemberMetadataTombstone("g", "m"), 5, "ConsumerGroupMemberMetadata",
     {"member_id": "m"}),
    (cg.ConsumerGroupTargetAssignmentMetadataRecord("g", 12), 6,
     "ConsumerGroupTargetAssignmentMetadata", {}),
    (cg.ConsumerGroupTargetAssignmentMemberRecord("g", "m", {T: frozenset({0, 2})}), 7,
     "ConsumerGroupTargetAssignmentMember", {"member_id": "m"}),
    (cg.ConsumerGroupTargetAssignmentMemberTombstone("g", "m"), 7,
     "ConsumerGroupTargetAssignmentMember", {"member_id": "m"}),
    (cg.ConsumerGroupCurrentMemberAssignmentRecord("g", "m", 12, 11, cg.MemberState(1),
     {T: frozenset({0})}, {U: frozenset({1, 2})}), 8, "ConsumerGroupCurrentMemberAssignment",
     {"member_id": "m"}),
    (cg.ConsumerGroupCurrentMemberAssignmentTombstone("g", "m"), 8,
     "ConsumerGroupCurrentMemberAssignment", {"member_id": "m"}),
    (cg.ConsumerGroupRegularExpressionRecord("g", "orders-.*", ("orders-1", "orders-2"), 3, 77),
     16, "ConsumerGroupRegularExpression", {"regex": "orders-.*"}),
    (cg.ConsumerGroupRegularExpressionTombstone("g", "orders-.*"), 16,
     "ConsumerGroupRegularExpression", {"regex": "orders-.*"}),
]  # fmt: skip


@pytest.mark.parametrize("record,number,name,key", EXPECTED, ids=lambda v: repr(v)[:60])
def test_keys_are_kafkas_and_records_round_trip(
    record: Any, number: int, name: str, key: dict[str, Any]
) -> None:
    [(k, v)] = group_records.encode(record)
    assert json.loads(k) == {"type": number, "name": name, "group_id": "g", **key}
    assert (v is None) == ("Tombstone" in type(record).__name__)
    assert group_records.decode(k, v) == record
    [(compaction_key, deletes)] = group_records.compaction_keys(k, v)
    assert compaction_key == (number, "g", *key.values())
    assert deletes == (v is None)


def test_a_consumer_groups_deletion_tombstones_its_group_level_keys_metadata_last() -> None:
    pairs = group_records.encode(cg.ConsumerGroupTombstone("g"))
    assert [json.loads(k)["type"] for k, _ in pairs] == [6, 3]
    assert all(v is None for _, v in pairs)
    # Replaying the metadata's tombstone forgets the group; the other needs no replay.
    assert [group_records.decode(k, v) for k, v in pairs] == [None, cg.ConsumerGroupTombstone("g")]
    keys = [key for pair in pairs for key in group_records.compaction_keys(*pair)]
    assert keys == [((6, "g"), True), ((3, "g"), True)]


def test_classic_member_bytes_are_stored_as_base64() -> None:
    record = cl.GroupMetadataRecord("g", "consumer", 1, "range", "m-1", 5, (MEMBER,))
    [(_, value)] = group_records.encode(record)
    assert value is not None
    [member] = json.loads(value)["members"]
    assert member["subscription"] == "AHN1Yg=="
    assert member["group_instance_id"] == "static-1"


def test_type_four_stays_the_config_record() -> None:
    # ConsumerGroupPartitionMetadata's number is ConfigRecord's here; Kafka 4.2 never
    # writes it, so a key of that name is not one this codec knows.
    with pytest.raises(ValueError, match="unknown group record type"):
        group_records.decode(
            b'{"type": 4, "name": "ConsumerGroupPartitionMetadata", "group_id": "g"}', None
        )
