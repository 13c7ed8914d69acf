"""Classic groups (JoinGroup/SyncGroup): the records (issue 26's seam).

As in Kafka, a classic group's rebalance in progress (pending joins, members awaiting
their assignment) lives in memory only; what is stored is Kafka 4.2's GroupMetadata
record (type 2), one per group, written when the leader's SyncGroup sets a generation's
assignment, when the group goes Empty, and when a static member is replaced. After a
failover a classic group is back at its last stored generation, as in Kafka. A
"simple" group (offsets committed with generation -1, no members) has no GroupMetadata:
its offsets are all there is of it.

The members' `subscription` and `assignment` are the classic consumer protocol's bytes
(ConsumerProtocolSubscription / ConsumerProtocolAssignment), kept as they arrived.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ClassicMember:
    """One member of GroupMetadataValue's `members`."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    subscription: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupMetadataRecord:
    """A classic group's stored state (Kafka's GroupMetadataKey/GroupMetadataValue)."""

    group_id: str
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp: int
    members: tuple[ClassicMember, ...] = ()


@dataclass(frozen=True, slots=True)
class ClassicGroupTombstone:
    """The classic group is deleted (DeleteGroups, or converted to a consumer group)."""

    group_id: str


ClassicGroupRecord = GroupMetadataRecord | ClassicGroupTombstone
