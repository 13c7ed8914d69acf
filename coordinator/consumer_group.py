"""KIP-848 consumer groups (ConsumerGroupHeartbeat): the records (issue 26's seam).

Kafka 4.2's consumer-group records, with its record type numbers, keyed as Kafka keys
them so compaction keeps the newest per key:

    type  name                                    key fields
    3     ConsumerGroupMetadata                   group_id
    5     ConsumerGroupMemberMetadata             group_id, member_id
    6     ConsumerGroupTargetAssignmentMetadata   group_id
    7     ConsumerGroupTargetAssignmentMember     group_id, member_id
    8     ConsumerGroupCurrentMemberAssignment    group_id, member_id
    16    ConsumerGroupRegularExpression          group_id, regex

Type 4 (ConsumerGroupPartitionMetadata) is not written, as in Kafka 4.2 (the metadata
hash of ConsumerGroupMetadata replaced it, KIP-1101). A group's deletion writes the
tombstones of its members' keys and regexes, then of types 6 and 3 (Kafka's
ConsumerGroup.createGroupTombstoneRecords); replaying type 3's tombstone forgets the
group. Members' migration from the classic protocol (ClassicMemberMetadata) is not
stored: spool does not move a non-empty group between protocols.
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass, field

AssignmentDict = dict[uuid.UUID, frozenset[int]]


class MemberState(enum.IntEnum):
    """A member's reconciliation state (Kafka's MemberState, stored as int8)."""

    STABLE = 0
    UNREVOKED_PARTITIONS = 1
    UNRELEASED_PARTITIONS = 2
    UNKNOWN = 127


@dataclass(frozen=True, slots=True)
class ConsumerGroupMetadataRecord:
    """The group epoch, bumped by every change of membership or subscriptions."""

    group_id: str
    epoch: int
    metadata_hash: int = 0


@dataclass(frozen=True, slots=True)
class ConsumerGroupMemberMetadataRecord:
    """A member as it joined or last changed (subscriptions, timeouts, assignor)."""

    group_id: str
    member_id: str
    instance_id: str | None
    rack_id: str | None
    client_id: str
    client_host: str
    subscribed_topic_names: frozenset[str]
    subscribed_topic_regex: str | None
    rebalance_timeout_ms: int
    server_assignor: str | None


@dataclass(frozen=True, slots=True)
class ConsumerGroupMemberMetadataTombstone:
    group_id: str
    member_id: str


@dataclass(frozen=True, slots=True)
class ConsumerGroupTargetAssignmentMetadataRecord:
    """The group epoch the target assignment was computed at."""

    group_id: str
    assignment_epoch: int


@dataclass(frozen=True, slots=True)
class ConsumerGroupTargetAssignmentMemberRecord:
    """One member's target partitions, by topic id."""

    group_id: str
    member_id: str
    assignment: AssignmentDict


@dataclass(frozen=True, slots=True)
class ConsumerGroupTargetAssignmentMemberTombstone:
    group_id: str
    member_id: str


@dataclass(frozen=True, slots=True)
class ConsumerGroupCurrentMemberAssignmentRecord:
    """What a member owns now and what it was asked to revoke, at its member epoch."""

    group_id: str
    member_id: str
    member_epoch: int
    previous_member_epoch: int
    state: int
    assigned_partitions: AssignmentDict
    partitions_pending_revocation: AssignmentDict = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ConsumerGroupCurrentMemberAssignmentTombstone:
    group_id: str
    member_id: str


@dataclass(frozen=True, slots=True)
class ConsumerGroupRegularExpressionRecord:
    """A subscribed regular expression resolved to topic names (Kafka's Topics, Version
    and Timestamp: the metadata version and the time it was resolved at; stored as
    `metadata_version`, since `version` is the value layout's)."""

    group_id: str
    regex: str
    topics: tuple[str, ...]
    metadata_version: int
    timestamp: int


@dataclass(frozen=True, slots=True)
class ConsumerGroupRegularExpressionTombstone:
    group_id: str
    regex: str


@dataclass(frozen=True, slots=True)
class ConsumerGroupTombstone:
    """The group is deleted: tombstones on its group-level keys (types 6 and 3)."""

    group_id: str


ConsumerGroupRecord = (
    ConsumerGroupMetadataRecord
    | ConsumerGroupMemberMetadataRecord
    | ConsumerGroupMemberMetadataTombstone
    | ConsumerGroupTargetAssignmentMetadataRecord
    | ConsumerGroupTargetAssignmentMemberRecord
    | ConsumerGroupTargetAssignmentMemberTombstone
    | ConsumerGroupCurrentMemberAssignmentRecord
    | ConsumerGroupCurrentMemberAssignmentTombstone
    | ConsumerGroupRegularExpressionRecord
    | ConsumerGroupRegularExpressionTombstone
    | ConsumerGroupTombstone
)
