"""Group coordinator records survive the JSON codec unchanged."""

from __future__ import annotations

import uuid

import pytest

from coordinator import group_records
from coordinator import share_group as sg
from coordinator.assignor import TopicMetadata
from coordinator.group_config import GroupConfigRecord

T = uuid.uuid4()

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


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_record_round_trips(record: group_records.GroupRecord) -> None:
    _, value = group_records.encode(record)
    assert group_records.decode(value) == record


def test_unknown_record_type_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown group record type"):
        group_records.decode(b'{"type": "Nope"}')
