"""KIP-848 consumer groups (ConsumerGroupHeartbeat): the records.

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

import copy
import enum
import hashlib
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from coordinator.assignor import TopicMetadata
from coordinator.consumer_assignors import ConsumerAssignor, MemberSubscription
from coordinator.group_config import GroupCoordinatorConfig
from coordinator.group_host import GroupType, OffsetAndMetadata
from protocol.errors import ErrorCode, KafkaError

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


# ---------------------------------------------------------------------------------
# The state machine (Kafka 4.2's ConsumerGroup, the consumer-group part of
# GroupMetadataManager, and CurrentAssignmentBuilder).
#
# Every change is computed from committed state as records: the group is copied, each
# record is replayed onto the copy as it is made (so later steps see earlier ones, as
# Kafka's records take effect in its coordinator at once), and the records are
# returned for the coordinator to make durable and replay onto the real group. Nothing
# here does I/O or reads a clock: time is passed in.

LEAVE_GROUP_MEMBER_EPOCH = -1
LEAVE_GROUP_STATIC_MEMBER_EPOCH = -2
# The partition epoch of a partition no member owns (Kafka's currentPartitionEpoch).
NO_OWNER_EPOCH = -1
# ConsumerGroupHeartbeat v1 (KIP-1082): the client makes its member id.
CONSUMER_GENERATED_MEMBER_ID_REQUIRED_VERSION = 1


class ConsumerGroupState(enum.StrEnum):
    """A consumer group's state as ListGroups and ConsumerGroupDescribe name it."""

    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(slots=True)
class ConsumerMember:
    """A member as the group knows it: its metadata (type 5) and its current
    assignment (type 8)."""

    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: frozenset[str] = frozenset()
    subscribed_topic_regex: str | None = None
    rebalance_timeout_ms: int = -1
    server_assignor: str | None = None
    member_epoch: int = 0
    previous_member_epoch: int = 0
    state: MemberState = MemberState.STABLE
    assigned: AssignmentDict = field(default_factory=dict)
    pending_revocation: AssignmentDict = field(default_factory=dict)

    def is_reconciled_to(self, epoch: int) -> bool:
        return self.state == MemberState.STABLE and self.member_epoch == epoch

    def metadata_record(self, group_id: str) -> ConsumerGroupMemberMetadataRecord:
        return ConsumerGroupMemberMetadataRecord(
            group_id,
            self.member_id,
            self.instance_id,
            self.rack_id,
            self.client_id,
            self.client_host,
            self.subscribed_topic_names,
            self.subscribed_topic_regex,
            self.rebalance_timeout_ms,
            self.server_assignor,
        )

    def assignment_record(self, group_id: str) -> ConsumerGroupCurrentMemberAssignmentRecord:
        return ConsumerGroupCurrentMemberAssignmentRecord(
            group_id,
            self.member_id,
            self.member_epoch,
            self.previous_member_epoch,
            int(self.state),
            dict(self.assigned),
            dict(self.pending_revocation),
        )


@dataclass(frozen=True, slots=True)
class ResolvedRegex:
    topics: frozenset[str]
    version: int
    timestamp: int


@dataclass(frozen=True, slots=True)
class ConsumerHeartbeat:
    """A ConsumerGroupHeartbeat as the group sees it (None: the field was not sent)."""

    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: frozenset[str] | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    owned: AssignmentDict | None = None
    client_id: str = ""
    client_host: str = ""

    @property
    def is_full(self) -> bool:
        """Kafka's full request: sent on (re)joining and after errors; it is answered
        with the member's whole assignment."""
        return (
            self.rebalance_timeout_ms != -1
            and (self.subscribed_topic_names is not None or self.subscribed_topic_regex is not None)
            and self.owned is not None
        )


@dataclass(frozen=True, slots=True)
class ConsumerHeartbeatResult:
    records: list[ConsumerGroupRecord]
    member_id: str
    member_epoch: int
    # The member's partitions when the response carries them, else None.
    assignment: AssignmentDict | None = None
    # Members that are gone after the change (left, fenced, replaced by a static rejoin).
    removed: tuple[str, ...] = ()
    # The member waits to revoke partitions (its rebalance timeout runs), with its epoch
    # and timeout; None if it does not.
    revoking: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class ConsumerMemberDescription:
    member_id: str
    instance_id: str | None
    rack_id: str | None
    member_epoch: int
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]
    subscribed_topic_regex: str | None
    assignment: AssignmentDict
    target_assignment: AssignmentDict


@dataclass(frozen=True, slots=True)
class ConsumerGroupDescription:
    group_id: str
    group_state: str
    group_epoch: int
    assignment_epoch: int
    assignor_name: str
    members: tuple[ConsumerMemberDescription, ...]


def _error(code: ErrorCode, message: str) -> KafkaError:
    return KafkaError(code, message)


def validate_heartbeat_request(
    group_id: str,
    request: ConsumerHeartbeat,
    api_version: int,
    assignors: Collection[str],
) -> None:
    """Kafka's GroupCoordinatorService.throwIfConsumerGroupHeartbeatRequestIsInvalid."""

    def not_empty(value: str | None, message: str) -> None:
        if value is not None and not value.strip():
            raise _error(ErrorCode.invalid_request, message)

    epoch = request.member_epoch
    if (
        api_version >= CONSUMER_GENERATED_MEMBER_ID_REQUIRED_VERSION
        or epoch > 0
        or epoch == LEAVE_GROUP_MEMBER_EPOCH
    ):
        not_empty(request.member_id, "MemberId can't be empty.")
    not_empty(group_id, "GroupId can't be empty.")
    not_empty(request.instance_id, "InstanceId can't be empty.")
    not_empty(request.rack_id, "RackId can't be empty.")
    if epoch == 0:
        if request.rebalance_timeout_ms == -1:
            raise _error(
                ErrorCode.invalid_request, "RebalanceTimeoutMs must be provided in first request."
            )
        if request.owned is None or request.owned:
            raise _error(
                ErrorCode.invalid_request, "TopicPartitions must be empty when (re-)joining."
            )
        if request.subscribed_topic_names is None and request.subscribed_topic_regex is None:
            raise _error(
                ErrorCode.invalid_request,
                "Either SubscribedTopicNames or SubscribedTopicRegex must be non-null when "
                "(re-)joining.",
            )
    elif epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
        if request.instance_id is None:
            raise _error(ErrorCode.invalid_request, "InstanceId can't be null.")
    elif epoch < LEAVE_GROUP_STATIC_MEMBER_EPOCH:
        raise _error(ErrorCode.invalid_request, "MemberEpoch is invalid.")
    if request.server_assignor is not None and request.server_assignor not in assignors:
        raise _error(
            ErrorCode.unsupported_assignor,
            f"ServerAssignor {request.server_assignor} is not supported. Supported "
            f"assignors: {', '.join(assignors)}.",
        )


def metadata_hash(topics: Iterable[TopicMetadata]) -> int:
    """A stable hash of the subscribed topics' metadata (KIP-1101's group metadata
    hash, in spirit: it moves when a subscribed topic appears, goes or grows), as a
    signed 64-bit number; 0 for no topics."""
    parts = sorted(f"{t.name}\0{t.topic_id}\0{t.num_partitions}" for t in topics)
    if not parts:
        return 0
    digest = hashlib.sha256("\n".join(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _owns_any(owned: AssignmentDict | None, partitions: AssignmentDict) -> bool:
    """The member still reports one of `partitions` (a request without owned
    partitions counts as owning them all, as Kafka's ownsRevokedPartitions)."""
    if owned is None:
        return True
    return any(owned.get(tid, frozenset()) & parts for tid, parts in partitions.items())


def _is_subset(owned: AssignmentDict | None, assigned: AssignmentDict) -> bool:
    if owned is None:
        return False
    return all(parts <= assigned.get(tid, frozenset()) for tid, parts in owned.items())


def _clean(assignment: Mapping[uuid.UUID, Iterable[int]]) -> AssignmentDict:
    return {tid: frozenset(parts) for tid, parts in assignment.items() if parts}


class ConsumerGroup:
    """A KIP-848 consumer group: members, epochs, the target assignment and each
    member's reconciliation towards it. It is also the `OffsetGroup` its committed
    offsets are validated by (coordinator.group_host)."""

    def __init__(self, group_id: str) -> None:
        self._group_id = group_id
        self.group_epoch = 0
        self.metadata_hash = 0
        self.assignment_epoch = 0
        self.members: dict[str, ConsumerMember] = {}
        self.target: dict[str, AssignmentDict] = {}
        self.regexes: dict[str, ResolvedRegex] = {}
        # (topic id, partition) -> the epoch of the member that owns it (assigned or
        # pending revocation); derived from the members' current assignments.
        self.partition_epochs: dict[tuple[uuid.UUID, int], int] = {}
        self.deleted = False

    # -- OffsetGroup --------------------------------------------------------------

    @property
    def group_id(self) -> str:
        return self._group_id

    @property
    def group_type(self) -> GroupType:
        return GroupType.CONSUMER

    @property
    def protocol_type(self) -> str:
        return "consumer"

    @property
    def state(self) -> ConsumerGroupState:
        if not self.members:
            return ConsumerGroupState.EMPTY
        if self.group_epoch > self.assignment_epoch:
            return ConsumerGroupState.ASSIGNING
        if any(not m.is_reconciled_to(self.assignment_epoch) for m in self.members.values()):
            return ConsumerGroupState.RECONCILING
        return ConsumerGroupState.STABLE

    @property
    def state_name(self) -> str:
        return self.state.value

    @property
    def is_empty(self) -> bool:
        return not self.members

    def _member_or_unknown(self, member_id: str) -> ConsumerMember:
        member = self.members.get(member_id)
        if member is None:
            raise _error(
                ErrorCode.unknown_member_id,
                f"Member {member_id} is not a member of group {self.group_id}.",
            )
        return member

    @staticmethod
    def _check_member_epoch(received: int, expected: int) -> None:
        if received != expected:
            raise _error(
                ErrorCode.stale_member_epoch,
                f"The received member epoch {received} does not match the expected member "
                f"epoch {expected}.",
            )

    def validate_offset_commit(
        self,
        member_id: str,
        instance_id: str | None,
        generation_or_epoch: int,
        *,
        transactional: bool,
        api_version: int,
    ) -> None:
        # Epoch -1 from an admin client or a consumer outside the group: an Empty
        # group takes it.
        if generation_or_epoch < 0 and not self.members:
            return
        if transactional and generation_or_epoch == -1 and member_id == "" and instance_id is None:
            return
        member = self._member_or_unknown(member_id)
        if not transactional and api_version < 9:
            raise _error(
                ErrorCode.unsupported_version,
                "OffsetCommit version 9 or above must be used by members using the modern "
                "group protocol",
            )
        self._check_member_epoch(generation_or_epoch, member.member_epoch)

    def validate_offset_fetch(self, member_id: str | None, member_epoch: int | None) -> None:
        if member_id is None and (member_epoch is None or member_epoch < 0):
            return
        member = self._member_or_unknown(member_id or "")
        self._check_member_epoch(-1 if member_epoch is None else member_epoch, member.member_epoch)

    def validate_offset_delete(self) -> None:
        return

    def validate_delete_group(self) -> None:
        if self.state != ConsumerGroupState.EMPTY:
            raise _error(ErrorCode.non_empty_group, "The group is not empty.")

    def subscribed_topic_names(self) -> set[str]:
        """Every topic name a member subscribes to, by name or through a regex."""
        names: set[str] = set()
        for member in self.members.values():
            names |= self._member_topics(member)
        return names

    def _member_topics(self, member: ConsumerMember) -> frozenset[str]:
        names = member.subscribed_topic_names
        if member.subscribed_topic_regex:
            resolved = self.regexes.get(member.subscribed_topic_regex)
            if resolved is not None:  # an unresolved regex matches nothing yet
                names = names | resolved.topics
        return names

    def is_subscribed_to_topic(self, topic: str) -> bool:
        return topic in self.subscribed_topic_names()

    def offset_expiration_base(self, offset: OffsetAndMetadata) -> int | None:
        return offset.commit_timestamp

    def tombstones(self) -> list[Any]:
        """The group's deletion: its members' keys, its regexes, then types 6 and 3."""
        records: list[Any] = []
        for member_id in sorted(self.members):
            records += self._member_tombstones(member_id)
        records += [
            ConsumerGroupRegularExpressionTombstone(self.group_id, regex)
            for regex in sorted(self.regexes)
        ]
        records.append(ConsumerGroupTombstone(self.group_id))
        return records

    def _member_tombstones(self, member_id: str) -> list[ConsumerGroupRecord]:
        return [
            ConsumerGroupCurrentMemberAssignmentTombstone(self.group_id, member_id),
            ConsumerGroupTargetAssignmentMemberTombstone(self.group_id, member_id),
            ConsumerGroupMemberMetadataTombstone(self.group_id, member_id),
        ]

    # -- replay -------------------------------------------------------------------

    def replay(self, record: ConsumerGroupRecord) -> None:
        """Apply one committed record (the only way the group changes)."""
        match record:
            case ConsumerGroupMetadataRecord():
                self.group_epoch = record.epoch
                self.metadata_hash = record.metadata_hash
            case ConsumerGroupMemberMetadataRecord():
                member = self.members.get(record.member_id)
                if member is None:
                    member = self.members[record.member_id] = ConsumerMember(record.member_id)
                member.instance_id = record.instance_id
                member.rack_id = record.rack_id
                member.client_id = record.client_id
                member.client_host = record.client_host
                member.subscribed_topic_names = frozenset(record.subscribed_topic_names)
                member.subscribed_topic_regex = record.subscribed_topic_regex
                member.rebalance_timeout_ms = record.rebalance_timeout_ms
                member.server_assignor = record.server_assignor
            case ConsumerGroupMemberMetadataTombstone():
                member = self.members.pop(record.member_id, None)
                if member is not None:
                    self._release(member)
            case ConsumerGroupTargetAssignmentMetadataRecord():
                self.assignment_epoch = record.assignment_epoch
            case ConsumerGroupTargetAssignmentMemberRecord():
                self.target[record.member_id] = _clean(record.assignment)
            case ConsumerGroupTargetAssignmentMemberTombstone():
                self.target.pop(record.member_id, None)
            case ConsumerGroupCurrentMemberAssignmentRecord():
                member = self.members.get(record.member_id)
                if member is None:
                    member = self.members[record.member_id] = ConsumerMember(record.member_id)
                self._release(member)
                member.member_epoch = record.member_epoch
                member.previous_member_epoch = record.previous_member_epoch
                try:
                    member.state = MemberState(record.state)
                except ValueError:
                    member.state = MemberState.UNKNOWN
                member.assigned = _clean(record.assigned_partitions)
                member.pending_revocation = _clean(record.partitions_pending_revocation)
                self._hold(member)
            case ConsumerGroupCurrentMemberAssignmentTombstone():
                member = self.members.get(record.member_id)
                if member is not None:
                    self._release(member)
                    member.member_epoch = 0
                    member.previous_member_epoch = 0
                    member.state = MemberState.STABLE
                    member.assigned = {}
                    member.pending_revocation = {}
            case ConsumerGroupRegularExpressionRecord():
                self.regexes[record.regex] = ResolvedRegex(
                    frozenset(record.topics), record.metadata_version, record.timestamp
                )
            case ConsumerGroupRegularExpressionTombstone():
                self.regexes.pop(record.regex, None)
            case ConsumerGroupTombstone():
                self.deleted = True

    def replay_all(self, records: Iterable[ConsumerGroupRecord]) -> None:
        for record in records:
            self.replay(record)

    def _owned(self, member: ConsumerMember) -> Iterator[tuple[uuid.UUID, int]]:
        for assignment in (member.assigned, member.pending_revocation):
            for tid, parts in assignment.items():
                for p in parts:
                    yield tid, p

    def _release(self, member: ConsumerMember) -> None:
        for key in self._owned(member):
            if self.partition_epochs.get(key) == member.member_epoch:
                del self.partition_epochs[key]

    def _hold(self, member: ConsumerMember) -> None:
        for key in self._owned(member):
            self.partition_epochs[key] = member.member_epoch

    def partition_epoch(self, topic_id: uuid.UUID, partition: int) -> int:
        return self.partition_epochs.get((topic_id, partition), NO_OWNER_EPOCH)

    def static_member(self, instance_id: str) -> ConsumerMember | None:
        for member in self.members.values():
            if member.instance_id == instance_id:
                return member
        return None

    def preferred_assignor(self, default: str) -> str:
        """The server assignor most members asked for (ties: by name), else `default`."""
        counts = Counter(m.server_assignor for m in self.members.values() if m.server_assignor)
        if not counts:
            return default
        return min(counts.items(), key=lambda item: (-item[1], item[0]))[0]

    # -- ConsumerGroupHeartbeat ---------------------------------------------------

    def heartbeat(
        self,
        request: ConsumerHeartbeat,
        topics: Mapping[uuid.UUID, TopicMetadata],
        now_ms: int,
        config: GroupCoordinatorConfig,
        assignors: Mapping[str, ConsumerAssignor],
        resolve: RegexResolver,
    ) -> ConsumerHeartbeatResult:
        """One heartbeat (Kafka's consumerGroupHeartbeat, after the request checks of
        `validate_heartbeat_request` and the group lookup): a join, a heartbeat or a
        leave. Raises the KafkaError Kafka answers with."""
        work = _Work(self, topics)
        if request.member_epoch in (LEAVE_GROUP_MEMBER_EPOCH, LEAVE_GROUP_STATIC_MEMBER_EPOCH):
            return work.leave(request)
        return work.heartbeat(request, topics, now_ms, config, assignors, resolve)

    # -- timeouts, topic changes --------------------------------------------------

    def fence(
        self, member_id: str, topics: Mapping[uuid.UUID, TopicMetadata]
    ) -> list[ConsumerGroupRecord]:
        """The member's session or rebalance timed out: it is removed, the group epoch
        bumped (the next heartbeat computes the new target assignment)."""
        if member_id not in self.members:
            return []
        work = _Work(self, topics)
        work.fence(member_id)
        return work.records

    def refresh_topics(
        self,
        topics: Mapping[uuid.UUID, TopicMetadata],
        now_ms: int,
        resolve: RegexResolver,
        *,
        force: bool = True,
        refresh_interval_ms: int = 0,
    ) -> list[ConsumerGroupRecord]:
        """Topics changed: the regexes are resolved again and the group epoch bumped if
        the subscribed topics' metadata moved, so the next heartbeat reassigns."""
        work = _Work(self, topics)
        work.refresh_regexes(topics, now_ms, resolve, force, refresh_interval_ms)
        work.maybe_bump(topics, force_bump=False)
        return work.records

    # -- describe -------------------------------------------------------------------

    def describe(self, default_assignor: str) -> ConsumerGroupDescription:
        return ConsumerGroupDescription(
            self.group_id,
            self.state_name,
            self.group_epoch,
            self.assignment_epoch,
            self.preferred_assignor(default_assignor),
            tuple(
                ConsumerMemberDescription(
                    m.member_id,
                    m.instance_id,
                    m.rack_id,
                    m.member_epoch,
                    m.client_id,
                    m.client_host,
                    tuple(sorted(m.subscribed_topic_names)),
                    m.subscribed_topic_regex,
                    dict(m.assigned),
                    dict(self.target.get(m.member_id, {})),
                )
                for m in sorted(self.members.values(), key=lambda m: m.member_id)
            ),
        )


# Resolves regexes against topic names: {regex: matching names} (coordinator.topic_regex).
RegexResolver = Callable[[Iterable[str], Iterable[str]], Mapping[str, frozenset[str]]]


class _Work:
    """One change of a group: records made one by one, each replayed onto a copy of
    the group so later steps see it."""

    def __init__(self, group: ConsumerGroup, topics: Mapping[uuid.UUID, TopicMetadata]) -> None:
        self.group = copy.deepcopy(group)
        self.topics = topics
        self.records: list[ConsumerGroupRecord] = []
        self.removed: list[str] = []

    def emit(self, record: ConsumerGroupRecord) -> None:
        self.records.append(record)
        self.group.replay(record)

    @property
    def group_id(self) -> str:
        return self.group.group_id

    # -- leave and fencing ---------------------------------------------------------

    def leave(self, request: ConsumerHeartbeat) -> ConsumerHeartbeatResult:
        g = self.group
        if request.instance_id is None:
            g._member_or_unknown(request.member_id)
            self.fence(request.member_id)
            return self._left(request.member_id, LEAVE_GROUP_MEMBER_EPOCH)
        member = g.static_member(request.instance_id)
        if member is None:
            raise _error(
                ErrorCode.unknown_member_id, f"Instance id {request.instance_id} is unknown."
            )
        self._check_not_fenced(member, request)
        if request.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            # A static member leaving for a while: it keeps its partitions (and the group
            # its assignment) until its session times out or its instance comes back.
            leaving = copy.deepcopy(member)
            leaving.member_epoch = LEAVE_GROUP_STATIC_MEMBER_EPOCH
            leaving.pending_revocation = {}
            self.emit(leaving.assignment_record(self.group_id))
            return self._left(member.member_id, LEAVE_GROUP_STATIC_MEMBER_EPOCH)
        self.fence(member.member_id)
        return self._left(member.member_id, LEAVE_GROUP_MEMBER_EPOCH)

    def _left(self, member_id: str, epoch: int) -> ConsumerHeartbeatResult:
        return ConsumerHeartbeatResult(self.records, member_id, epoch, removed=tuple(self.removed))

    def fence(self, member_id: str) -> None:
        """Remove the member and bump the group epoch (Kafka's consumerGroupFenceMember)."""
        member = self.group.members[member_id]
        self._remove(member)
        self._drop_unused_regex(member.subscribed_topic_regex)
        self.maybe_bump(self.topics, force_bump=True)

    def _remove(self, member: ConsumerMember) -> None:
        for record in self.group._member_tombstones(member.member_id):
            self.emit(record)
        self.removed.append(member.member_id)

    def _drop_unused_regex(self, regex: str | None) -> None:
        if not regex or regex not in self.group.regexes:
            return
        if any(m.subscribed_topic_regex == regex for m in self.group.members.values()):
            return
        self.emit(ConsumerGroupRegularExpressionTombstone(self.group_id, regex))

    def _check_not_fenced(self, member: ConsumerMember, request: ConsumerHeartbeat) -> None:
        if member.member_id != request.member_id:
            raise _error(
                ErrorCode.fenced_instance_id,
                f"Static member {request.member_id} with instance id {request.instance_id} "
                f"was fenced by member {member.member_id}.",
            )

    @staticmethod
    def _check_epoch(member: ConsumerMember, request: ConsumerHeartbeat) -> None:
        received = request.member_epoch
        if received == 0:
            return
        if received > member.member_epoch:
            raise _error(
                ErrorCode.fenced_member_epoch,
                f"The consumer group member has a greater member epoch ({received}) than the "
                f"one known by the group coordinator ({member.member_epoch}). The member must "
                "abandon all its partitions and rejoin.",
            )
        if received < member.member_epoch and (
            received != member.previous_member_epoch
            or not _is_subset(request.owned, member.assigned)
        ):
            raise _error(
                ErrorCode.fenced_member_epoch,
                f"The consumer group member has a smaller member epoch ({received}) than the "
                f"one known by the group coordinator ({member.member_epoch}). The member must "
                "abandon all its partitions and rejoin.",
            )

    # -- join and heartbeat --------------------------------------------------------

    def _get_member(self, request: ConsumerHeartbeat) -> ConsumerMember:
        """Kafka's getOrMaybeSubscribe{Dynamic,Static}ConsumerGroupMember."""
        g = self.group
        joining = request.member_epoch == 0
        if request.instance_id is None:
            member = g.members.get(request.member_id)
            if member is None:
                if not joining:
                    g._member_or_unknown(request.member_id)
                return ConsumerMember(request.member_id)
            self._check_epoch(member, request)
            return copy.deepcopy(member)
        existing = g.static_member(request.instance_id)
        if not joining:
            if existing is None:
                raise _error(
                    ErrorCode.unknown_member_id, f"Instance id {request.instance_id} is unknown."
                )
            self._check_not_fenced(existing, request)
            self._check_epoch(existing, request)
            return copy.deepcopy(existing)
        if existing is None:
            return ConsumerMember(request.member_id)
        if existing.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            raise _error(
                ErrorCode.unreleased_instance_id,
                f"Static member {request.member_id} with instance id {request.instance_id} "
                f"cannot join the group because the instance id is owned by "
                f"{existing.member_id} member.",
            )
        # The instance is back under a new member id: it takes the old member's place,
        # assignment and target included, without a rebalance.
        replacement = copy.deepcopy(existing)
        replacement.member_id = request.member_id
        replacement.member_epoch = 0
        replacement.previous_member_epoch = 0
        target = g.target.get(existing.member_id, {})
        self._remove(existing)
        if existing.member_id == request.member_id:
            self.removed.remove(existing.member_id)
        self.emit(replacement.metadata_record(self.group_id))
        self.emit(
            ConsumerGroupTargetAssignmentMemberRecord(self.group_id, request.member_id, target)
        )
        self.emit(replacement.assignment_record(self.group_id))
        return copy.deepcopy(replacement)

    def heartbeat(
        self,
        request: ConsumerHeartbeat,
        topics: Mapping[uuid.UUID, TopicMetadata],
        now_ms: int,
        config: GroupCoordinatorConfig,
        assignors: Mapping[str, ConsumerAssignor],
        resolve: RegexResolver,
    ) -> ConsumerHeartbeatResult:
        g = self.group
        if request.member_id not in g.members and len(g.members) >= config.consumer_group_max_size:
            raise _error(
                ErrorCode.group_max_size_reached,
                f"The consumer group has reached its maximum capacity of "
                f"{config.consumer_group_max_size} members.",
            )
        before = self._get_member(request)
        was_member = before.member_id in g.members
        old_assigned = dict(before.assigned) if was_member else {}
        updated = copy.deepcopy(before)
        if request.instance_id is not None:
            updated.instance_id = request.instance_id
        if request.rack_id is not None:
            updated.rack_id = request.rack_id
        if request.rebalance_timeout_ms != -1:
            updated.rebalance_timeout_ms = request.rebalance_timeout_ms
        if request.server_assignor is not None:
            updated.server_assignor = request.server_assignor
        if request.subscribed_topic_names is not None:
            updated.subscribed_topic_names = request.subscribed_topic_names
        if request.subscribed_topic_regex is not None:
            updated.subscribed_topic_regex = request.subscribed_topic_regex or None
        updated.client_id = request.client_id
        updated.client_host = request.client_host
        if not was_member or updated.metadata_record(self.group_id) != before.metadata_record(
            self.group_id
        ):
            self.emit(updated.metadata_record(self.group_id))
        names_changed = was_member is False or (
            updated.subscribed_topic_names != before.subscribed_topic_names
        )
        regex_changed = was_member and (
            updated.subscribed_topic_regex != before.subscribed_topic_regex
        )
        if not was_member and updated.subscribed_topic_regex:
            regex_changed = True
        if regex_changed:
            self._drop_unused_regex(before.subscribed_topic_regex)
        self.refresh_regexes(
            topics, now_ms, resolve, False, config.consumer_group_regex_refresh_interval_ms
        )
        subscription_changed = names_changed or regex_changed
        self.maybe_bump(topics, force_bump=subscription_changed or g.group_epoch == 0)

        if g.group_epoch > g.assignment_epoch:
            self.update_target(topics, config, assignors)

        member = g.members[updated.member_id]
        revoking: tuple[int, int] | None = None
        if subscription_changed or not member.is_reconciled_to(g.assignment_epoch):
            next_member = reconcile(
                member,
                g.assignment_epoch,
                g.target.get(member.member_id, {}),
                self.subscribed_topic_ids(member, topics),
                g.partition_epoch,
                request.owned,
                subscription_changed=subscription_changed,
            )
            if next_member != member:
                self.emit(next_member.assignment_record(self.group_id))
        member = g.members[updated.member_id]
        if member.state == MemberState.UNREVOKED_PARTITIONS:
            revoking = (member.member_epoch, member.rebalance_timeout_ms)
        send_assignment = (
            request.member_epoch == 0 or request.is_full or member.assigned != old_assigned
        )
        return ConsumerHeartbeatResult(
            self.records,
            member.member_id,
            member.member_epoch,
            dict(member.assigned) if send_assignment else None,
            tuple(self.removed),
            revoking,
        )

    def subscribed_topic_ids(
        self, member: ConsumerMember, topics: Mapping[uuid.UUID, TopicMetadata]
    ) -> frozenset[uuid.UUID]:
        names = self.group._member_topics(member)
        return frozenset(tid for tid, t in topics.items() if t.name in names)

    def refresh_regexes(
        self,
        topics: Mapping[uuid.UUID, TopicMetadata],
        now_ms: int,
        resolve: RegexResolver,
        force: bool,
        refresh_interval_ms: int,
    ) -> None:
        """Resolve the subscribed regexes not resolved yet, and (forced, or when
        `refresh_interval_ms` has passed) the others again; a changed match is written
        (type 16)."""
        g = self.group
        used = {m.subscribed_topic_regex for m in g.members.values() if m.subscribed_topic_regex}
        due = [
            regex
            for regex in sorted(used)
            if regex not in g.regexes
            or force
            or now_ms - g.regexes[regex].timestamp >= refresh_interval_ms
        ]
        if not due:
            return
        resolved = resolve(due, sorted(t.name for t in topics.values()))
        for regex in due:
            matched = frozenset(resolved.get(regex, frozenset()))
            old = g.regexes.get(regex)
            if old is not None and old.topics == matched:
                continue
            self.emit(
                ConsumerGroupRegularExpressionRecord(
                    self.group_id,
                    regex,
                    tuple(sorted(matched)),
                    0 if old is None else old.version + 1,
                    now_ms,
                )
            )

    def maybe_bump(self, topics: Mapping[uuid.UUID, TopicMetadata], *, force_bump: bool) -> None:
        """Bump the group epoch if the subscriptions changed or the subscribed topics'
        metadata moved (a topic created, deleted, grown)."""
        g = self.group
        names = g.subscribed_topic_names()
        new_hash = metadata_hash(t for t in topics.values() if t.name in names)
        if force_bump or new_hash != g.metadata_hash:
            self.emit(ConsumerGroupMetadataRecord(self.group_id, g.group_epoch + 1, new_hash))

    def update_target(
        self,
        topics: Mapping[uuid.UUID, TopicMetadata],
        config: GroupCoordinatorConfig,
        assignors: Mapping[str, ConsumerAssignor],
    ) -> None:
        """A new target assignment at the group epoch, written as a delta (Kafka's
        updateTargetAssignment)."""
        g = self.group
        name = g.preferred_assignor(config.consumer_group_default_assignor)
        assignor = assignors[name]
        subscriptions = {
            m.member_id: MemberSubscription(
                member_id=m.member_id,
                instance_id=m.instance_id,
                rack_id=m.rack_id,
                subscribed_topic_ids=self.subscribed_topic_ids(m, topics),
                current=dict(g.target.get(m.member_id, {})),
            )
            for m in g.members.values()
        }
        new_target = assignor.assign(subscriptions, topics)
        for member_id in sorted(g.members):
            assignment = _clean(new_target.get(member_id, {}))
            if assignment != g.target.get(member_id, {}):
                self.emit(
                    ConsumerGroupTargetAssignmentMemberRecord(self.group_id, member_id, assignment)
                )
        self.emit(ConsumerGroupTargetAssignmentMetadataRecord(self.group_id, g.group_epoch))


def reconcile(
    member: ConsumerMember,
    target_epoch: int,
    target: AssignmentDict,
    subscribed: frozenset[uuid.UUID],
    partition_epoch: Callable[[uuid.UUID, int], int],
    owned: AssignmentDict | None,
    *,
    subscription_changed: bool,
) -> ConsumerMember:
    """The member's next current assignment (Kafka's CurrentAssignmentBuilder):
    partitions it must give up are revoked first (it stays at its epoch, in
    UNREVOKED_PARTITIONS, until a heartbeat no longer reports them); only then does it
    move to the target epoch and get its new partitions, except those another member
    still owns (UNRELEASED_PARTITIONS), which it gets once they are released."""

    def next_assignment(epoch: int) -> ConsumerMember:
        assigned: dict[uuid.UUID, set[int]] = {}
        revoke: dict[uuid.UUID, set[int]] = {}
        pending: dict[uuid.UUID, set[int]] = {}
        unreleased = False
        for tid in set(target) | set(member.assigned):
            want = target.get(tid, frozenset()) if tid in subscribed else frozenset()
            current = member.assigned.get(tid, frozenset())
            keep = set(current & want)
            gone = set(current - keep)
            new = set(want - keep)
            held = {
                p
                for p in new
                if partition_epoch(tid, p) != NO_OWNER_EPOCH
                and p not in member.pending_revocation.get(tid, frozenset())
            }
            if held:
                unreleased = True
                new -= held
            if keep:
                assigned[tid] = keep
            if gone:
                revoke[tid] = gone
            if new:
                pending[tid] = new
        revoking = _clean(revoke)
        result = copy.deepcopy(member)
        if revoking and _owns_any(owned, revoking):
            result.state = MemberState.UNREVOKED_PARTITIONS
            _update_epoch(result, epoch)
            result.assigned = _clean(assigned)
            result.pending_revocation = revoking
            return result
        for tid, parts in pending.items():
            assigned.setdefault(tid, set()).update(parts)
        result.state = MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE
        _update_epoch(result, target_epoch)
        result.assigned = _clean(assigned)
        result.pending_revocation = {}
        return result

    def shrink_to_subscription() -> ConsumerMember:
        assigned = dict(member.assigned)
        revoke = {tid: set(parts) for tid, parts in member.pending_revocation.items()}
        changed = False
        for tid in list(assigned):
            if tid not in subscribed:
                revoke.setdefault(tid, set()).update(assigned.pop(tid))
                changed = True
        if not changed:
            return member
        result = copy.deepcopy(member)
        result.assigned = assigned
        revoking = _clean(revoke)
        if revoking and _owns_any(owned, revoking):
            result.state = MemberState.UNREVOKED_PARTITIONS
            result.pending_revocation = revoking
        return result

    if member.state == MemberState.STABLE:
        if member.member_epoch != target_epoch:
            return next_assignment(member.member_epoch)
        if subscription_changed:
            return shrink_to_subscription()
        return member
    if member.state == MemberState.UNREVOKED_PARTITIONS:
        if _owns_any(owned, member.pending_revocation):
            return shrink_to_subscription() if subscription_changed else member
        return next_assignment(member.member_epoch)
    if member.state == MemberState.UNRELEASED_PARTITIONS:
        return next_assignment(member.member_epoch)
    # UNKNOWN: written by a newer coordinator; the member starts over.
    if owned is None or owned:
        raise _error(
            ErrorCode.fenced_member_epoch,
            "The consumer group member is in a unknown state. The member must abandon all "
            "its partitions and rejoin.",
        )
    return next_assignment(target_epoch)


def _update_epoch(member: ConsumerMember, epoch: int) -> None:
    """Kafka's updateMemberEpoch: the previous epoch is kept for a lost response."""
    member.previous_member_epoch = member.member_epoch
    member.member_epoch = epoch
