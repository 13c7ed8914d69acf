"""Classic groups (JoinGroup/SyncGroup): the records.

As in Kafka, a classic group's rebalance in progress (pending joins, members awaiting
their assignment) lives in memory only; what is stored is Kafka 4.2's GroupMetadata
record (type 2), one per group, written when the leader's SyncGroup sets a generation's
assignment, when the group goes Empty, and when a static member is replaced. After a
failover a classic group is back at its last stored generation, as in Kafka. A
"simple" group (offsets committed with generation -1, no members) has no GroupMetadata:
its offsets are all there is of it.

The members' `subscription` and `assignment` are the classic consumer protocol's bytes
(ConsumerProtocolSubscription / ConsumerProtocolAssignment), kept as they arrived.

Below the records, the group itself (Kafka 4.2's ClassicGroup and ClassicGroupMember):
its states (Empty, PreparingRebalance, CompletingRebalance, Stable, Dead), its members
and static members (`group.instance.id`), the members that were told MEMBER_ID_REQUIRED
and have not joined yet, the protocol every member supports and the one elected, and
the checks the offsets make of it (`OffsetGroup`). A member parked in JoinGroup or
SyncGroup holds a responder, a plain callable the shell (coordinator.classic_group_ops)
gives it, so this module stays free of I/O; the rebalance itself (when a join phase
completes, the timeouts) is driven by that shell, as Kafka's GroupMetadataManager drives
ClassicGroup.
"""

from __future__ import annotations

import enum
import struct
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from coordinator.group_config import GroupCoordinatorConfig
from coordinator.group_host import GroupType, OffsetAndMetadata
from protocol.errors import ErrorCode, KafkaError


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


# --------------------------------------------------------------------------- the group

INT32_MAX = 2**31 - 1
# The protocol type of groups of Kafka consumers (ConsumerProtocol.PROTOCOL_TYPE).
CONSUMER_PROTOCOL_TYPE = "consumer"
# Kafka's GroupCoordinatorConfig.CLASSIC_GROUP_NEW_MEMBER_JOIN_TIMEOUT_MS: a new member's
# parked JoinGroup is given up after this long (it cannot heartbeat yet).
NEW_MEMBER_JOIN_TIMEOUT_MS = 5 * 60 * 1000


@dataclass(frozen=True, slots=True)
class ClassicGroupConfig:
    """The broker keys of classic groups, with Kafka 4.2's defaults
    (GroupCoordinatorConfig): session timeouts a JoinGroup may ask for, the delay of a
    new group's first rebalance, and the most members a group may have."""

    min_session_timeout_ms: int = 6000
    max_session_timeout_ms: int = 1800000
    initial_rebalance_delay_ms: int = 3000
    max_size: int = INT32_MAX
    new_member_join_timeout_ms: int = NEW_MEMBER_JOIN_TIMEOUT_MS

    @classmethod
    def of(cls, config: GroupCoordinatorConfig) -> ClassicGroupConfig:
        """The classic-group part of the broker's group coordinator keys."""
        return cls(
            min_session_timeout_ms=config.classic_group_min_session_timeout_ms,
            max_session_timeout_ms=config.classic_group_max_session_timeout_ms,
            initial_rebalance_delay_ms=config.classic_group_initial_rebalance_delay_ms,
            max_size=config.classic_group_max_size,
        )


class ClassicGroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


_S = ClassicGroupState
# The states each state may be entered from (Kafka's ClassicGroupState.validPreviousStates).
_VALID_PREVIOUS: dict[ClassicGroupState, frozenset[ClassicGroupState]] = {
    _S.PREPARING_REBALANCE: frozenset({_S.STABLE, _S.COMPLETING_REBALANCE, _S.EMPTY}),
    _S.COMPLETING_REBALANCE: frozenset({_S.PREPARING_REBALANCE}),
    _S.STABLE: frozenset({_S.COMPLETING_REBALANCE}),
    _S.EMPTY: frozenset({_S.PREPARING_REBALANCE}),
    _S.DEAD: frozenset(_S),
}

# (name, metadata) of one protocol a member supports, in its order of preference.
JoinProtocol = tuple[str, bytes]


@dataclass(frozen=True, slots=True)
class JoinMember:
    """One member of the leader's JoinGroup answer."""

    member_id: str
    group_instance_id: str | None
    metadata: bytes


@dataclass(frozen=True, slots=True)
class JoinResult:
    """A JoinGroup answer."""

    error: ErrorCode = ErrorCode.none
    member_id: str = ""
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    skip_assignment: bool = False
    members: tuple[JoinMember, ...] = ()
    message: str | None = None


@dataclass(frozen=True, slots=True)
class SyncResult:
    """A SyncGroup answer."""

    error: ErrorCode = ErrorCode.none
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""
    message: str | None = None


JoinResponder = Callable[[JoinResult], None]
SyncResponder = Callable[[SyncResult], None]


@dataclass(eq=False, slots=True)
class Member:
    """A member of a classic group (Kafka's ClassicGroupMember): what it joined with,
    its assignment, and the responders of its parked JoinGroup and SyncGroup."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: tuple[JoinProtocol, ...]
    assignment: bytes = b""
    awaiting_join: JoinResponder | None = None
    awaiting_sync: SyncResponder | None = None
    # Joined during the rebalance under way: it cannot heartbeat yet, so its deadline
    # is the new-member join timeout, and it may expire while awaiting its join.
    is_new: bool = False

    @property
    def is_static(self) -> bool:
        return self.group_instance_id is not None

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]

    def matches(self, protocols: Iterable[JoinProtocol]) -> bool:
        """Joined again with the same protocols and metadata, in the same order."""
        return tuple(protocols) == self.protocols

    def metadata(self, protocol_name: str | None) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol_name:
                return metadata
        return b""

    def vote(self, candidates: set[str]) -> str:
        """The first of its protocols that every member supports."""
        for name, _ in self.protocols:
            if name in candidates:
                return name
        raise ValueError(f"member {self.member_id} supports none of {sorted(candidates)}")

    def has_satisfied_heartbeat(self) -> bool:
        """Parked in a rebalance counts as alive, unless it is new (Kafka's rule)."""
        if self.is_new:
            return False
        return self.awaiting_join is not None or self.awaiting_sync is not None


def _error(code: ErrorCode, message: str) -> KafkaError:
    return KafkaError(code, message)


def subscribed_topics(subscription: bytes) -> frozenset[str] | None:
    """The topics of a ConsumerProtocolSubscription (any version: each starts with its
    int16 version and the topic names), None if the bytes are not one."""
    try:
        if len(subscription) < 6:
            return None
        (count,) = struct.unpack_from(">i", subscription, 2)
        offset = 6
        topics = []
        for _ in range(max(count, 0)):
            (length,) = struct.unpack_from(">h", subscription, offset)
            offset += 2
            if length < 0 or offset + length > len(subscription):
                return None
            topics.append(subscription[offset : offset + length].decode())
            offset += length
        return frozenset(topics)
    except (struct.error, UnicodeDecodeError):
        return None


class ClassicGroup:
    """A classic group (Kafka 4.2's ClassicGroup); an `OffsetGroup`."""

    def __init__(self, group_id: str, now_ms: int) -> None:
        self.group_id = group_id
        self.state = ClassicGroupState.EMPTY
        self.previous_state = ClassicGroupState.EMPTY
        self.state_timestamp: int | None = now_ms
        self.generation_id = 0
        self.protocol_type_: str | None = None
        self.protocol_name: str | None = None
        self.leader_id: str | None = None
        self.members: dict[str, Member] = {}
        self.static_members: dict[str, str] = {}
        self.pending_join_members: set[str] = set()
        self.pending_sync_members: set[str] = set()
        self.supported_protocols: Counter[str] = Counter()
        self.new_member_added = False
        self.subscribed: frozenset[str] | None = None

    # -- OffsetGroup ---------------------------------------------------------------

    @property
    def group_type(self) -> GroupType:
        return GroupType.CLASSIC

    @property
    def protocol_type(self) -> str:
        return self.protocol_type_ or ""

    @property
    def state_name(self) -> str:
        return self.state.value

    @property
    def is_empty(self) -> bool:
        return self.state == ClassicGroupState.EMPTY

    def validate_offset_commit(
        self,
        member_id: str,
        instance_id: str | None,
        generation_or_epoch: int,
        *,
        transactional: bool,
        api_version: int,
    ) -> None:
        """Kafka's ClassicGroup.validateOffsetCommit."""
        if self.state == ClassicGroupState.DEAD:
            raise _error(
                ErrorCode.coordinator_not_available,
                f"Group {self.group_id} is being removed; look the coordinator up again.",
            )
        if generation_or_epoch < 0 and self.is_empty:
            return  # an admin client or a consumer not using group management
        if generation_or_epoch >= 0 or member_id or instance_id is not None:
            self.validate_member(member_id, instance_id, "offset-commit")
            if generation_or_epoch != self.generation_id:
                raise _error(
                    ErrorCode.illegal_generation,
                    f"Generation {generation_or_epoch} is not the current generation "
                    f"{self.generation_id} of group {self.group_id}; rejoin the group.",
                )
        elif not transactional and not self.is_empty:
            raise _error(
                ErrorCode.unknown_member_id,
                f"Group {self.group_id} has members: a commit without a member id and "
                "generation is accepted only while the group is Empty.",
            )
        if not transactional and self.state == ClassicGroupState.COMPLETING_REBALANCE:
            raise _error(
                ErrorCode.rebalance_in_progress,
                f"Group {self.group_id} is completing a rebalance; commit after SyncGroup.",
            )

    def validate_offset_fetch(self, member_id: str | None, member_epoch: int | None) -> None:
        if self.state == ClassicGroupState.DEAD:
            raise _error(ErrorCode.group_id_not_found, f"Group {self.group_id} is in dead state.")

    def validate_offset_delete(self) -> None:
        if self.state == ClassicGroupState.DEAD:
            raise _error(ErrorCode.group_id_not_found, f"Group {self.group_id} is in dead state.")
        if not self.is_empty and not self.uses_consumer_protocol():
            raise _error(
                ErrorCode.non_empty_group,
                f"Group {self.group_id} has members that do not use the consumer protocol.",
            )

    def validate_delete_group(self) -> None:
        if self.state == ClassicGroupState.DEAD:
            raise _error(ErrorCode.group_id_not_found, f"Group {self.group_id} is in dead state.")
        if not self.is_empty:
            raise _error(
                ErrorCode.non_empty_group,
                f"Group {self.group_id} is not empty ({len(self.members)} members); stop "
                "its consumers first.",
            )

    def is_subscribed_to_topic(self, topic: str) -> bool:
        if self.subscribed is None:
            # Unknown subscriptions: a consumer group is taken as subscribed to every topic.
            return self.uses_consumer_protocol()
        return topic in self.subscribed

    def tombstones(self) -> list[Any]:
        return [ClassicGroupTombstone(self.group_id)]

    def offset_expiration_base(self, offset: OffsetAndMetadata) -> int | None:
        """When `offset`'s retention started (Kafka's offsetExpirationCondition): its
        commit for a simple group, or a Stable consumer group aware of its
        subscriptions; when the group went Empty for an empty one; None otherwise."""
        if self.protocol_type_ is None:
            return offset.commit_timestamp
        if self.is_empty:
            since = self.state_timestamp
            return since if since is not None else offset.commit_timestamp
        if (
            self.uses_consumer_protocol()
            and self.subscribed is not None
            and self.state == ClassicGroupState.STABLE
        ):
            return offset.commit_timestamp
        return None

    # -- members ---------------------------------------------------------------------

    def uses_consumer_protocol(self) -> bool:
        return self.protocol_type_ == CONSUMER_PROTOCOL_TYPE

    def has_member(self, member_id: str) -> bool:
        return member_id in self.members

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id == member_id

    def num_awaiting_join(self) -> int:
        return sum(1 for m in self.members.values() if m.awaiting_join is not None)

    def add(self, member: Member, responder: JoinResponder | None = None) -> None:
        if member.group_instance_id is not None:
            if member.group_instance_id in self.static_members:
                raise ValueError(f"static member {member.group_instance_id} is a member already")
            self.static_members[member.group_instance_id] = member.member_id
        if not self.members:
            self.protocol_type_ = member.protocol_type
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        self.supported_protocols.update(member.protocol_names())
        member.awaiting_join = responder
        self.pending_join_members.discard(member.member_id)

    def remove(self, member_id: str) -> None:
        removed = self.members.pop(member_id, None)
        if removed is not None:
            self.supported_protocols.subtract(removed.protocol_names())
            if removed.group_instance_id is not None:
                self.static_members.pop(removed.group_instance_id, None)
        if self.is_leader(member_id):
            self.leader_id = next(iter(self.members), None)
        self.pending_join_members.discard(member_id)
        self.pending_sync_members.discard(member_id)

    def maybe_elect_new_joined_leader(self) -> bool:
        """Keep a leader that rejoined, else elect one that did; False if none did."""
        if self.leader_id is None:
            return False
        leader = self.members.get(self.leader_id)
        if leader is not None and leader.awaiting_join is not None:
            return True
        for member in self.members.values():
            if member.awaiting_join is not None:
                self.leader_id = member.member_id
                return True
        return False

    def replace_static_member(self, instance_id: str, old_id: str, new_id: str) -> Member:
        """A static member rejoined with no member id: its entry moves to `new_id`, and
        whatever the old id has parked is fenced."""
        old = self.members.pop(old_id)
        if old.awaiting_join is not None:
            responder, old.awaiting_join = old.awaiting_join, None
            responder(JoinResult(ErrorCode.fenced_instance_id, member_id=old_id))
        if old.awaiting_sync is not None:
            sync, old.awaiting_sync = old.awaiting_sync, None
            sync(SyncResult(ErrorCode.fenced_instance_id))
        new = Member(
            new_id,
            old.group_instance_id,
            old.client_id,
            old.client_host,
            old.rebalance_timeout_ms,
            old.session_timeout_ms,
            old.protocol_type,
            old.protocols,
            old.assignment,
        )
        self.members[new_id] = new
        if self.is_leader(old_id):
            self.leader_id = new_id
        self.static_members[instance_id] = new_id
        return new

    def add_pending_member(self, member_id: str) -> None:
        self.pending_join_members.add(member_id)

    def is_pending_member(self, member_id: str) -> bool:
        return member_id in self.pending_join_members

    def not_yet_rejoined(self) -> list[Member]:
        return [m for m in self.members.values() if m.awaiting_join is None]

    def has_all_members_joined(self) -> bool:
        return len(self.members) == self.num_awaiting_join() and not self.pending_join_members

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def generate_member_id(self, client_id: str, instance_id: str | None) -> str:
        return f"{instance_id if instance_id is not None else client_id}-{uuid.uuid4()}"

    def validate_member(self, member_id: str, instance_id: str | None, operation: str) -> None:
        """UNKNOWN_MEMBER_ID or FENCED_INSTANCE_ID, as ClassicGroup.validateMember."""
        if instance_id is not None:
            existing = self.static_members.get(instance_id)
            if existing is None:
                raise _error(
                    ErrorCode.unknown_member_id,
                    f"No static member with group.instance.id {instance_id} in group "
                    f"{self.group_id} ({operation}); rejoin the group.",
                )
            if existing != member_id:
                raise _error(
                    ErrorCode.fenced_instance_id,
                    f"Member {member_id} of group {self.group_id} was fenced: another "
                    f"consumer joined with group.instance.id {instance_id} ({operation}).",
                )
        if member_id not in self.members:
            raise _error(
                ErrorCode.unknown_member_id,
                f"Member {member_id!r} is not a member of group {self.group_id} "
                f"({operation}); rejoin the group.",
            )

    # -- protocols ---------------------------------------------------------------------

    def candidate_protocols(self) -> set[str]:
        size = len(self.members)
        return {name for name, count in self.supported_protocols.items() if count == size}

    def select_protocol(self) -> str:
        """The protocol every member supports with the most first choices (Kafka's vote)."""
        if not self.members:
            raise ValueError("no protocol to select for an empty group")
        candidates = self.candidate_protocols()
        votes: Counter[str] = Counter(m.vote(candidates) for m in self.members.values())
        return votes.most_common(1)[0][0]

    def supports_protocols(self, protocol_type: str, names: Iterable[str]) -> bool:
        names = list(names)
        if self.is_empty:
            return bool(protocol_type) and bool(names)
        size = len(self.members)
        return self.protocol_type_ == protocol_type and any(
            self.supported_protocols.get(name, 0) == size for name in names
        )

    def update_member(
        self,
        member: Member,
        protocols: tuple[JoinProtocol, ...],
        rebalance_timeout_ms: int,
        session_timeout_ms: int,
        responder: JoinResponder | None,
    ) -> None:
        self.supported_protocols.subtract(member.protocol_names())
        member.protocols = protocols
        self.supported_protocols.update(member.protocol_names())
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.session_timeout_ms = session_timeout_ms
        member.awaiting_join = responder

    # -- states --------------------------------------------------------------------------

    def can_rebalance(self) -> bool:
        return self.state in _VALID_PREVIOUS[ClassicGroupState.PREPARING_REBALANCE]

    def transition_to(self, state: ClassicGroupState, now_ms: int) -> None:
        if self.state not in _VALID_PREVIOUS[state]:
            raise ValueError(
                f"group {self.group_id} cannot go from {self.state.value} to {state.value}"
            )
        self.previous_state = self.state
        self.state = state
        self.state_timestamp = now_ms

    def complete_join(self, member: Member, result: JoinResult) -> bool:
        if member.awaiting_join is None:
            return False
        responder, member.awaiting_join = member.awaiting_join, None
        responder(result)
        return True

    def complete_sync(self, member: Member, result: SyncResult) -> bool:
        if member.awaiting_sync is None:
            return False
        responder, member.awaiting_sync = member.awaiting_sync, None
        responder(result)
        return True

    def init_next_generation(self, now_ms: int) -> None:
        self.generation_id += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self.subscribed = self._compute_subscribed()
            self.transition_to(ClassicGroupState.COMPLETING_REBALANCE, now_ms)
        else:
            self.protocol_name = None
            self.subscribed = self._compute_subscribed()
            self.transition_to(ClassicGroupState.EMPTY, now_ms)
        self.pending_sync_members.clear()

    def _compute_subscribed(self) -> frozenset[str] | None:
        """The union of the members' subscribed topics if the group uses the consumer
        protocol and every subscription parses, else None: unknown (Kafka's
        computeSubscribedTopics)."""
        if not self.uses_consumer_protocol():
            return None
        if not self.members:
            return frozenset()
        if self.protocol_name is None:
            return None
        topics: set[str] = set()
        for member in self.members.values():
            parsed = subscribed_topics(member.metadata(self.protocol_name))
            if parsed is None:
                return None
            topics |= parsed
        return frozenset(topics)

    def current_members(self) -> tuple[JoinMember, ...]:
        """The leader's JoinGroup answer: every member with its protocol metadata."""
        return tuple(
            JoinMember(m.member_id, m.group_instance_id, m.metadata(self.protocol_name))
            for m in self.members.values()
        )

    def join_result(self, member_id: str, *, members: bool, skip: bool = False) -> JoinResult:
        return JoinResult(
            member_id=member_id,
            generation_id=self.generation_id,
            protocol_type=self.protocol_type_,
            protocol_name=self.protocol_name,
            leader=self.leader_id or "",
            skip_assignment=skip,
            members=self.current_members() if members else (),
        )

    def group_assignment(self) -> dict[str, bytes]:
        return {m.member_id: m.assignment for m in self.members.values()}

    # -- records -------------------------------------------------------------------------

    def to_record(self, assignment: Mapping[str, bytes]) -> GroupMetadataRecord:
        """The group as stored (Kafka's newGroupMetadataRecord), with `assignment`."""
        return GroupMetadataRecord(
            group_id=self.group_id,
            protocol_type=self.protocol_type,
            generation=self.generation_id,
            protocol=self.protocol_name,
            leader=self.leader_id,
            current_state_timestamp=self.state_timestamp or 0,
            members=tuple(
                ClassicMember(
                    member_id=m.member_id,
                    group_instance_id=m.group_instance_id,
                    client_id=m.client_id,
                    client_host=m.client_host,
                    rebalance_timeout_ms=m.rebalance_timeout_ms,
                    session_timeout_ms=m.session_timeout_ms,
                    subscription=m.metadata(self.protocol_name),
                    assignment=assignment.get(m.member_id, b""),
                )
                for m in self.members.values()
            ),
        )

    @classmethod
    def from_record(cls, record: GroupMetadataRecord) -> ClassicGroup:
        """A group as loaded: Stable with its stored members, or Empty without."""
        group = cls(record.group_id, record.current_state_timestamp)
        group.generation_id = record.generation
        group.protocol_type_ = record.protocol_type or None
        group.protocol_name = record.protocol
        for stored in record.members:
            group.add(
                Member(
                    stored.member_id,
                    stored.group_instance_id,
                    stored.client_id,
                    stored.client_host,
                    stored.rebalance_timeout_ms,
                    stored.session_timeout_ms,
                    record.protocol_type,
                    ((record.protocol or "", stored.subscription),),
                    stored.assignment,
                )
            )
        group.leader_id = record.leader if record.leader in group.members else group.leader_id
        if group.members:
            group.state = ClassicGroupState.STABLE
            group.previous_state = ClassicGroupState.COMPLETING_REBALANCE
        group.subscribed = group._compute_subscribed()
        return group


@dataclass(frozen=True, slots=True)
class DescribedMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True, slots=True)
class DescribedGroup:
    """One group of DescribeGroups (Kafka's describeGroups for a classic group)."""

    group_id: str
    state: str
    protocol_type: str = ""
    protocol_data: str = ""
    members: tuple[DescribedMember, ...] = field(default=())
    error: ErrorCode = ErrorCode.none
    message: str | None = None


def describe(group: ClassicGroup) -> DescribedGroup:
    stable = group.state == ClassicGroupState.STABLE
    return DescribedGroup(
        group.group_id,
        group.state_name,
        group.protocol_type,
        (group.protocol_name or "") if stable else "",
        tuple(
            DescribedMember(
                m.member_id,
                m.group_instance_id,
                m.client_id,
                m.client_host,
                m.metadata(group.protocol_name) if stable else b"",
                m.assignment,
            )
            for m in group.members.values()
        ),
    )
