"""One share group's membership, as a sans-IO state machine (KIP-932, ShareGroupHeartbeat v1).

Every rule of share-group membership lives in this file. It follows Kafka's
`GroupMetadataManager.shareGroupHeartbeat` and `ShareGroup`:

- Join: MemberEpoch 0 with a client-made MemberId (v1: an empty MemberId is
  INVALID_REQUEST) and SubscribedTopicNames. A known member may rejoin with epoch 0
  and gets its current state back (KAFKA-19233). Beyond `group.share.max.size`
  members: GROUP_MAX_SIZE_REACHED.
- Leave: MemberEpoch -1. Any other epoch must be the member's current epoch, or its
  previous one (the response that bumped it may have been lost), else
  FENCED_MEMBER_EPOCH; an unknown member gets UNKNOWN_MEMBER_ID.
- A change of membership, of a subscription or of the subscribed topics' metadata
  bumps the group epoch and recomputes the target assignment with the simple
  assignor at once. Share groups have no revocation phase, so a member moves to its
  target on its next heartbeat, taking the target's epoch as its member epoch. The
  response carries the assignment on a join and whenever it changed, else None.
- Only partitions whose share state is initialized are assigned (Kafka 4.2,
  KAFKA-18827: the target assignment is built with the `initialized` topics as its
  assignable partitions). The heartbeat that finds subscribed partitions neither
  initialized nor being initialized marks them `initializing` (in its own records)
  and returns them in `HeartbeatResult.initialize`; the caller initializes their
  share state (InitializeShareGroupState, start offset -1: the share-partition leader
  resolves `share.auto.offset.reset` on first load) without holding up the response,
  then writes `mark_initialized`, which bumps the group epoch and recomputes the
  target in the same records, so members that joined meanwhile split the partitions.
  A heartbeat also bumps when the target misses initialized partitions of subscribed
  topics (Kafka 4.2's `initializedAssignmentPending`). A failed initialization is
  `mark_uninitialized` and retried by the next heartbeat; partitions left
  `initializing` longer than `group.share.initialize.retry.interval.ms` (a lost
  write) are retried too, as Kafka's `subscribedTopicsChangeMap` does.
- A member with no heartbeat for `share.session.timeout.ms` is fenced by
  `expire_members`. As in Kafka 4.2, leaving or being fenced does not release the
  member's acquired records: its share session on the broker does (closed with epoch
  -1, or its connection dropped), or the records' acquisition locks expire.
- Request validation (`validate_heartbeat_request`) comes before any group lookup, as
  in Kafka's KafkaApis and GroupCoordinatorService: a MemberId that is empty or longer
  than 36 characters, an empty GroupId or RackId, a join without SubscribedTopicNames
  or an epoch below -1 is INVALID_REQUEST; then an unknown group is GROUP_ID_NOT_FOUND
  unless the member joins (epoch 0).

As in Kafka's coordinators, methods compute `records` (durable changes) and a
response without changing the group; the runtime appends the records, then feeds
each to `replay`, the only method that changes durable state. The one piece of soft
state, each member's session deadline, is a timer (not durable, as in Kafka) set by
`heartbeat` and rebuilt after loading with `on_loaded`. No method reads a clock or
does I/O: the current time comes in as `now_ms`. When each topic's share-state
initialization last started is soft state too (Kafka keeps it beside the replayed
record, not in it).
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from coordinator.assignor import SIMPLE_ASSIGNOR_NAME, AssignorMember, TopicMetadata, assign
from coordinator.group_config import GroupConfig
from protocol.errors import ErrorCode, KafkaError

__all__ = [
    "JOIN_GROUP_MEMBER_EPOCH",
    "LEAVE_GROUP_MEMBER_EPOCH",
    "MAX_MEMBER_ID_LENGTH",
    "ExpireResult",
    "HeartbeatResult",
    "ShareGroup",
    "ShareGroupCurrentMemberAssignmentRecord",
    "ShareGroupCurrentMemberAssignmentTombstone",
    "ShareGroupDescription",
    "ShareGroupMember",
    "ShareGroupMemberDescription",
    "ShareGroupMemberMetadataRecord",
    "ShareGroupMemberMetadataTombstone",
    "ShareGroupMetadataRecord",
    "ShareGroupRecord",
    "ShareGroupState",
    "ShareGroupStatePartitionMetadataRecord",
    "ShareGroupTargetAssignmentMemberRecord",
    "ShareGroupTargetAssignmentMemberTombstone",
    "ShareGroupTargetAssignmentMetadataRecord",
    "ShareGroupTombstone",
    "TopicMetadata",
    "TopicsChangedResult",
    "member_id_valid",
    "validate_heartbeat_request",
]

JOIN_GROUP_MEMBER_EPOCH = 0
LEAVE_GROUP_MEMBER_EPOCH = -1
# KIP-932 member ids are client-made UUIDs: Kafka's KafkaApis.isMemberIdValid refuses an
# empty one or one longer than a printed UUID in ShareGroupHeartbeat, ShareFetch and
# ShareAcknowledge.
MAX_MEMBER_ID_LENGTH = 36


def member_id_valid(member_id: str | None) -> bool:
    """Kafka's isMemberIdValid: non-empty and at most 36 characters."""
    return bool(member_id) and len(member_id or "") <= MAX_MEMBER_ID_LENGTH


def validate_heartbeat_request(
    group_id: str,
    member_id: str,
    member_epoch: int,
    subscribed_topic_names: Iterable[str] | None,
    rack_id: str | None,
) -> None:
    """The checks Kafka makes on a ShareGroupHeartbeat before looking the group up
    (KafkaApis.isMemberIdValid, then GroupCoordinatorService.
    throwIfShareGroupHeartbeatRequestIsInvalid); each failure is INVALID_REQUEST."""
    if not member_id_valid(member_id):
        raise KafkaError(ErrorCode.invalid_request, "Invalid member id in the request.")
    if not member_id.strip():
        raise KafkaError(ErrorCode.invalid_request, "MemberId can't be empty.")
    if not group_id.strip():
        raise KafkaError(ErrorCode.invalid_request, "GroupId can't be empty.")
    if rack_id is not None and not rack_id.strip():
        raise KafkaError(ErrorCode.invalid_request, "RackId can't be empty.")
    if member_epoch == JOIN_GROUP_MEMBER_EPOCH:
        if not subscribed_topic_names:
            raise KafkaError(
                ErrorCode.invalid_request, "SubscribedTopicNames must be set in first request."
            )
    elif member_epoch < LEAVE_GROUP_MEMBER_EPOCH:
        raise KafkaError(ErrorCode.invalid_request, "MemberEpoch is invalid.")


# topic id -> partitions, normalised: no empty sets, frozensets, sorted by topic id.
AssignmentDict = dict[uuid.UUID, frozenset[int]]
TopicsMetadata = Mapping[uuid.UUID, TopicMetadata]


class ShareGroupState(enum.Enum):
    """Kafka's `ShareGroup.ShareGroupState`; the values are what ListGroups reports."""

    EMPTY = "Empty"
    STABLE = "Stable"
    DEAD = "Dead"


def _freeze(assignment: Mapping[uuid.UUID, Iterable[int]]) -> AssignmentDict:
    return {
        topic_id: frozenset(parts)
        for topic_id, parts in sorted(assignment.items())
        if parts and frozenset(parts)
    }


# ---------------------------------------------------------------------------
# Records: the durable changes, named after Kafka's share-group record types.


@dataclass(frozen=True, slots=True)
class ShareGroupMetadataRecord:
    """The group epoch, and the subscribed topics' metadata it was computed from."""

    group_id: str
    epoch: int
    subscription_metadata: tuple[TopicMetadata, ...]


@dataclass(frozen=True, slots=True)
class ShareGroupMemberMetadataRecord:
    """A member joined or changed its rack, client or subscription."""

    group_id: str
    member_id: str
    rack_id: str | None
    client_id: str
    client_host: str
    subscribed_topic_names: frozenset[str]


@dataclass(frozen=True, slots=True)
class ShareGroupMemberMetadataTombstone:
    group_id: str
    member_id: str


@dataclass(frozen=True, slots=True)
class ShareGroupTargetAssignmentMemberRecord:
    """One member's part of the target assignment."""

    group_id: str
    member_id: str
    assignment: AssignmentDict


@dataclass(frozen=True, slots=True)
class ShareGroupTargetAssignmentMemberTombstone:
    group_id: str
    member_id: str


@dataclass(frozen=True, slots=True)
class ShareGroupTargetAssignmentMetadataRecord:
    """The group epoch the target assignment was computed for."""

    group_id: str
    assignment_epoch: int


@dataclass(frozen=True, slots=True)
class ShareGroupCurrentMemberAssignmentRecord:
    """A member moved to its target: its new epoch and assignment."""

    group_id: str
    member_id: str
    member_epoch: int
    previous_member_epoch: int
    assignment: AssignmentDict


@dataclass(frozen=True, slots=True)
class ShareGroupCurrentMemberAssignmentTombstone:
    group_id: str
    member_id: str


@dataclass(frozen=True, slots=True)
class ShareGroupStatePartitionMetadataRecord:
    """Which partitions have share state (initialized) or are getting it (initializing),
    and the topics whose share state is being deleted (Kafka's DeletingTopics: an admin
    delete marks them first, deletes the state, then unmarks them, so a crash between
    the steps leaves them marked to be finished)."""

    group_id: str
    initializing: AssignmentDict
    initialized: AssignmentDict
    deleting: frozenset[uuid.UUID] = frozenset()


@dataclass(frozen=True, slots=True)
class ShareGroupTombstone:
    """The group was deleted."""

    group_id: str


ShareGroupRecord = (
    ShareGroupMetadataRecord
    | ShareGroupMemberMetadataRecord
    | ShareGroupMemberMetadataTombstone
    | ShareGroupTargetAssignmentMemberRecord
    | ShareGroupTargetAssignmentMemberTombstone
    | ShareGroupTargetAssignmentMetadataRecord
    | ShareGroupCurrentMemberAssignmentRecord
    | ShareGroupCurrentMemberAssignmentTombstone
    | ShareGroupStatePartitionMetadataRecord
    | ShareGroupTombstone
)


# ---------------------------------------------------------------------------
# Members and results


@dataclass(frozen=True, slots=True)
class ShareGroupMember:
    """A member as the coordinator knows it (Kafka's `ShareGroupMember`)."""

    member_id: str
    member_epoch: int = 0
    previous_member_epoch: int = 0
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: frozenset[str] = frozenset()
    # The assignment the member has been given (it moves to the target on heartbeat).
    assignment: AssignmentDict = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    """Records to append, then what the ShareGroupHeartbeat response carries."""

    records: list[ShareGroupRecord]
    member_id: str
    member_epoch: int
    heartbeat_interval_ms: int
    # The full assignment on a join or when it changed; None means "unchanged".
    assignment: AssignmentDict | None
    # Partitions whose share state to initialize now; `records` mark them initializing.
    initialize: AssignmentDict = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ExpireResult:
    """Members whose session timed out, and the records that fence them."""

    records: list[ShareGroupRecord]
    expired: list[ShareGroupMember]


@dataclass(frozen=True, slots=True)
class TopicsChangedResult:
    """Records after a topic change, and topic ids gone from the cluster whose share
    state the broker should delete."""

    records: list[ShareGroupRecord]
    deleted_topic_ids: frozenset[uuid.UUID]


@dataclass(frozen=True, slots=True)
class ShareGroupMemberDescription:
    member_id: str
    rack_id: str | None
    member_epoch: int
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]
    assignment: AssignmentDict


@dataclass(frozen=True, slots=True)
class ShareGroupDescription:
    """What ShareGroupDescribe reports for one group."""

    group_id: str
    group_state: str
    group_epoch: int
    assignment_epoch: int
    assignor_name: str
    members: tuple[ShareGroupMemberDescription, ...]


# ---------------------------------------------------------------------------
# The group


class ShareGroup:
    """One share group: members, epochs, target assignment and share-state bookkeeping."""

    def __init__(self, group_id: str) -> None:
        self.group_id = group_id
        self.group_epoch = 0
        self.assignment_epoch = 0
        self.members: dict[str, ShareGroupMember] = {}
        self.target_assignment: dict[str, AssignmentDict] = {}
        # Subscribed topic name -> metadata, as of the last group epoch bump.
        self.subscription_metadata: dict[str, TopicMetadata] = {}
        self.initializing: AssignmentDict = {}
        self.initialized: AssignmentDict = {}
        self.deleting: frozenset[uuid.UUID] = frozenset()
        self.deleted = False
        # Soft state: member id -> session deadline (ms). A timer, not durable.
        self._session_deadlines: dict[str, int] = {}
        # Soft state: topic id -> when its share-state initialization last started (ms),
        # for the topics in `initializing`; older than the retry interval: retried.
        self._initializing_since: dict[uuid.UUID, int] = {}

    @property
    def state(self) -> ShareGroupState:
        if self.deleted:
            return ShareGroupState.DEAD
        return ShareGroupState.STABLE if self.members else ShareGroupState.EMPTY

    def session_deadline_ms(self, member_id: str) -> int | None:
        """When the member is fenced unless it heartbeats again."""
        return self._session_deadlines.get(member_id)

    def subscribed_topic_names(self) -> frozenset[str]:
        return frozenset(n for m in self.members.values() for n in m.subscribed_topic_names)

    # -- ShareGroupHeartbeat -----------------------------------------------------

    def heartbeat(
        self,
        member_id: str,
        member_epoch: int,
        subscribed_topic_names: Iterable[str] | None,
        rack_id: str | None,
        client_id: str,
        client_host: str,
        topics_metadata: TopicsMetadata,
        now_ms: int,
        config: GroupConfig,
    ) -> HeartbeatResult:
        """Handle one ShareGroupHeartbeat; raises KafkaError with Kafka's error code.

        Only the member's session timer changes here; replay the returned records
        to apply the rest.
        """
        names = None if subscribed_topic_names is None else frozenset(subscribed_topic_names)
        self._validate_request(member_id, member_epoch, names, rack_id)
        if member_epoch == LEAVE_GROUP_MEMBER_EPOCH:
            return self._leave(member_id, topics_metadata)

        member = self.members.get(member_id)
        if member is None:
            if len(self.members) >= config.max_size:
                raise KafkaError(
                    ErrorCode.group_max_size_reached,
                    f"The share group has reached its maximum capacity of {config.max_size} "
                    "members.",
                )
            if member_epoch != JOIN_GROUP_MEMBER_EPOCH:
                raise KafkaError(
                    ErrorCode.unknown_member_id,
                    f"Member {member_id} is not a member of share group {self.group_id}.",
                )
            member = ShareGroupMember(member_id)
        elif member_epoch != JOIN_GROUP_MEMBER_EPOCH:
            self._check_member_epoch(member, member_epoch)

        is_new = member_id not in self.members
        updated = replace(
            member,
            rack_id=member.rack_id if rack_id is None else rack_id,
            subscribed_topic_names=member.subscribed_topic_names if names is None else names,
            client_id=client_id,
            client_host=client_host,
        )
        records: list[ShareGroupRecord] = []
        if is_new or updated != member:
            records.append(
                ShareGroupMemberMetadataRecord(
                    self.group_id,
                    member_id,
                    updated.rack_id,
                    updated.client_id,
                    updated.client_host,
                    updated.subscribed_topic_names,
                )
            )

        members_after = {**self.members, member_id: updated}
        subscription_changed = is_new or updated.subscribed_topic_names != (
            member.subscribed_topic_names
        )
        metadata_after = _subscription_metadata(members_after.values(), topics_metadata)
        rebalance, target_epoch, target = self._rebalance(
            members_after,
            metadata_after,
            bump=subscription_changed
            or self._initialized_assignment_pending(members_after, metadata_after),
        )
        records += rebalance

        # Reconcile: no revocation in share groups, the member takes its target at once.
        member_target = target.get(member_id, {})
        new_epoch = updated.member_epoch
        if updated.member_epoch != target_epoch or updated.assignment != member_target:
            new_epoch = target_epoch
            records.append(
                ShareGroupCurrentMemberAssignmentRecord(
                    self.group_id, member_id, target_epoch, updated.member_epoch, member_target
                )
            )

        # Kafka's maybeCreateInitializeShareGroupStateRequest: subscribed partitions with
        # no share state (nor a recent initialization under way) start getting it.
        initialize = self.partitions_to_initialize(
            now_ms, config.initialize_retry_interval_ms, metadata_after
        )
        records += self.mark_initializing(initialize, now_ms)

        self._session_deadlines[member_id] = now_ms + config.session_timeout_ms
        send = member_epoch == JOIN_GROUP_MEMBER_EPOCH or member_target != member.assignment
        return HeartbeatResult(
            records,
            member_id,
            new_epoch,
            config.heartbeat_interval_ms,
            dict(member_target) if send else None,
            initialize,
        )

    def _validate_request(
        self,
        member_id: str,
        member_epoch: int,
        names: frozenset[str] | None,
        rack_id: str | None,
    ) -> None:
        # Kafka validates the request before it looks the group up.
        validate_heartbeat_request(self.group_id, member_id, member_epoch, names, rack_id)
        if self.deleted:
            raise KafkaError(
                ErrorCode.group_id_not_found, f"Share group {self.group_id} was deleted."
            )

    @staticmethod
    def _check_member_epoch(member: ShareGroupMember, received: int) -> None:
        if received == member.member_epoch or received == member.previous_member_epoch:
            # The previous epoch is accepted: the response that bumped it may be lost.
            return
        relation = "greater" if received > member.member_epoch else "smaller"
        raise KafkaError(
            ErrorCode.fenced_member_epoch,
            f"The share group member has a {relation} member epoch ({received}) than the one "
            f"known by the group coordinator ({member.member_epoch}). The member must abandon "
            "all its partitions and rejoin.",
        )

    def _leave(self, member_id: str, topics_metadata: TopicsMetadata) -> HeartbeatResult:
        if member_id not in self.members:
            raise KafkaError(
                ErrorCode.unknown_member_id,
                f"Member {member_id} is not a member of share group {self.group_id}.",
            )
        records = self._fence([member_id], topics_metadata)
        return HeartbeatResult(records, member_id, LEAVE_GROUP_MEMBER_EPOCH, 0, None)

    # -- expiry and topic changes ------------------------------------------------

    def expire_members(self, now_ms: int) -> ExpireResult:
        """Fence the members whose session deadline has passed (`share.session.timeout.ms`).

        Returns them so the broker can close their share sessions and release their
        acquired records; replay the records to remove them from the group.
        """
        for member_id in [m for m in self._session_deadlines if m not in self.members]:
            del self._session_deadlines[member_id]
        expired = [
            self.members[member_id]
            for member_id, deadline in sorted(self._session_deadlines.items())
            if deadline <= now_ms
        ]
        if not expired:
            return ExpireResult([], [])
        return ExpireResult(self._fence([m.member_id for m in expired], None), expired)

    def on_topics_changed(self, topics_metadata: TopicsMetadata) -> TopicsChangedResult:
        """React to topics deleted, re-created (new topic id) or grown (CreatePartitions).

        Bumps the group epoch and recomputes the target assignment when the subscribed
        topics resolve differently; forgets share-state bookkeeping for topic ids that
        no longer exist.
        """
        records, _, _ = self._rebalance(
            self.members,
            _subscription_metadata(self.members.values(), topics_metadata),
            bump=False,
        )
        deleted = frozenset(
            topic_id
            for topic_id in {*self.initialized, *self.initializing, *self.deleting}
            if topic_id not in topics_metadata
        )
        if deleted:
            records.append(
                ShareGroupStatePartitionMetadataRecord(
                    self.group_id,
                    {t: p for t, p in self.initializing.items() if t not in deleted},
                    {t: p for t, p in self.initialized.items() if t not in deleted},
                    self.deleting - deleted,
                )
            )
        return TopicsChangedResult(records, deleted)

    def on_loaded(self, now_ms: int, config: GroupConfig) -> None:
        """After replaying the log, give every member a fresh session timeout (as Kafka
        does when a coordinator loads), since timers are not durable; initializations
        the log shows under way count as started now (Kafka stamps the replayed
        initializing topics with the load time)."""
        self._session_deadlines = {m: now_ms + config.session_timeout_ms for m in self.members}
        self._initializing_since = dict.fromkeys(self.initializing, now_ms)

    # -- share-partition state bookkeeping --------------------------------------

    def partitions_to_initialize(
        self,
        now_ms: int,
        retry_interval_ms: int,
        subscription_metadata: Mapping[str, TopicMetadata] | None = None,
    ) -> AssignmentDict:
        """Subscribed partitions with no share state and no initialization under way
        (Kafka's subscribedTopicsChangeMap). An initialization started
        `retry_interval_ms` or more ago counts as lost: its partitions are returned
        again. `subscription_metadata` defaults to the group's, as of its last epoch.
        (Only soft state changes here: when a topic was first seen initializing.)

        The broker initializes these in the share coordinator
        (InitializeShareGroupState), after `mark_initializing`, then `mark_initialized`.
        """
        metadata = subscription_metadata
        if metadata is None:
            metadata = self.subscription_metadata
        result: dict[uuid.UUID, set[int]] = {}
        for topic in metadata.values():
            done = self.initialized.get(topic.topic_id, frozenset())
            if topic.topic_id in self.initializing:
                # First seen initializing (e.g. by a group the heartbeat's records
                # created): the retry interval counts from now, as Kafka's replay stamps.
                since = self._initializing_since.setdefault(topic.topic_id, now_ms)
                if now_ms - since < retry_interval_ms:
                    done |= self.initializing[topic.topic_id]
            missing = set(range(topic.num_partitions)) - done
            if missing:
                result[topic.topic_id] = missing
        return _freeze(result)

    def initializing_started(self, topic_ids: Iterable[uuid.UUID], now_ms: int) -> None:
        """Note (soft state) that these topics' initialization started at `now_ms`."""
        for topic_id in topic_ids:
            self._initializing_since[topic_id] = now_ms

    def mark_initializing(
        self, partitions: Mapping[uuid.UUID, Iterable[int]], now_ms: int | None = None
    ) -> list[ShareGroupRecord]:
        """Records noting that initialization of these partitions has started (at
        `now_ms`, if given: the retry interval counts from then)."""
        if now_ms is not None:
            self.initializing_started(partitions, now_ms)
        initializing = _union(self.initializing, partitions)
        # Kafka's addInitializingTopicsRecords: a topic getting state is no longer deleting.
        return self._state_partition_record(
            initializing, self.initialized, self.deleting - frozenset(partitions)
        )

    def mark_initialized(
        self, partitions: Mapping[uuid.UUID, Iterable[int]]
    ) -> list[ShareGroupRecord]:
        """Records noting that these partitions now have share state; if the group has
        members whose target lacks them, the group epoch is bumped and the target
        recomputed in the same records, so the partitions are assigned at once (Kafka
        4.2 does it on the next heartbeat, `initializedAssignmentPending`)."""
        initialized = _union(self.initialized, partitions)
        records = self._state_partition_record(
            _difference(self.initializing, partitions), initialized
        )
        if records and self._initialized_assignment_pending(
            self.members, self.subscription_metadata, initialized
        ):
            rebalance, _, _ = self._rebalance(
                self.members, self.subscription_metadata, bump=True, assignable=initialized
            )
            records += rebalance
        return records

    def mark_uninitialized(
        self, partitions: Mapping[uuid.UUID, Iterable[int]]
    ) -> list[ShareGroupRecord]:
        """Records forgetting share state of these partitions (its deletion, or a failed
        initialization to retry)."""
        return self._state_partition_record(
            _difference(self.initializing, partitions), _difference(self.initialized, partitions)
        )

    def _state_partition_record(
        self,
        initializing: AssignmentDict,
        initialized: AssignmentDict,
        deleting: frozenset[uuid.UUID] | None = None,
    ) -> list[ShareGroupRecord]:
        deleting = self.deleting if deleting is None else deleting
        if (initializing, initialized, deleting) == (
            self.initializing,
            self.initialized,
            self.deleting,
        ):
            return []
        return [
            ShareGroupStatePartitionMetadataRecord(
                self.group_id, initializing, initialized, deleting
            )
        ]

    # -- admin: reset and delete of share state (KIP-932 admin RPCs) -------------

    def require_empty(self) -> None:
        """Kafka's ShareGroup.validateEmptyGroup: admin changes need an Empty group."""
        if self.members:
            raise KafkaError(
                ErrorCode.non_empty_group,
                f"Share group {self.group_id} is not empty: it has {len(self.members)} "
                "member(s). Stop its consumers (or wait for their sessions to expire), "
                "then retry.",
            )

    def mark_altering(
        self, partitions: Mapping[uuid.UUID, Iterable[int]], now_ms: int | None = None
    ) -> list[ShareGroupRecord]:
        """AlterShareGroupOffsets, first step: the partitions are `initializing` (and their
        topics no longer `deleting`), as Kafka's addInitializingTopicsRecords; after the
        share state is re-initialized, `mark_initialized` completes it."""
        if now_ms is not None:
            self.initializing_started(partitions, now_ms)
        return self._state_partition_record(
            _union(self.initializing, partitions),
            self.initialized,
            self.deleting - frozenset(partitions),
        )

    def mark_deleting_topics(
        self, topic_ids: Iterable[uuid.UUID], topics_metadata: TopicsMetadata
    ) -> tuple[list[ShareGroupRecord], AssignmentDict]:
        """DeleteShareGroupOffsets, first step (Kafka's sharePartitionsEligibleForOffset-
        Deletion): initialized topics move to `deleting`; a topic already `deleting` (a
        delete cut short) is deleted again, every partition. Returns the records and the
        partitions whose share state to delete."""
        to_delete: dict[uuid.UUID, frozenset[int]] = {}
        for topic_id in topic_ids:
            if topic_id in self.initialized:
                to_delete[topic_id] = self.initialized[topic_id]
            elif topic_id in self.deleting and topic_id in topics_metadata:
                to_delete[topic_id] = frozenset(range(topics_metadata[topic_id].num_partitions))
        records = self._state_partition_record(
            self.initializing,
            {t: p for t, p in self.initialized.items() if t not in to_delete},
            self.deleting | frozenset(to_delete),
        )
        return records, _freeze(to_delete)

    def mark_deleting_all(
        self, topics_metadata: TopicsMetadata
    ) -> tuple[list[ShareGroupRecord], AssignmentDict]:
        """DeleteGroups, first step (Kafka's shareGroupBuildPartitionDeleteRequest): every
        initialized or initializing topic moves to `deleting`, with any left `deleting`
        by an earlier cut-short delete (all partitions of those that still exist)."""
        to_delete: dict[uuid.UUID, frozenset[int]] = dict(
            _union(self.initialized, self.initializing)
        )
        for topic_id in self.deleting:
            if topic_id in topics_metadata:
                every = frozenset(range(topics_metadata[topic_id].num_partitions))
                to_delete[topic_id] = to_delete.get(topic_id, frozenset()) | every
        records = self._state_partition_record({}, {}, frozenset(to_delete))
        return records, _freeze(to_delete)

    def mark_deleted_topics(self, topic_ids: Iterable[uuid.UUID]) -> list[ShareGroupRecord]:
        """The last step of a delete: these topics' share state is gone. A member that
        joined while it was being deleted may have counted them initialized again (their
        state still existed then): forgotten too, so that they are initialized anew."""
        gone = frozenset(topic_ids)
        return self._state_partition_record(
            {t: p for t, p in self.initializing.items() if t not in gone},
            {t: p for t, p in self.initialized.items() if t not in gone},
            self.deleting - gone,
        )

    # -- describe and delete ----------------------------------------------------

    def describe(self) -> ShareGroupDescription:
        """What ShareGroupDescribe needs (topic names come from the caller's metadata)."""
        return ShareGroupDescription(
            group_id=self.group_id,
            group_state=self.state.value,
            group_epoch=self.group_epoch,
            assignment_epoch=self.assignment_epoch,
            assignor_name=SIMPLE_ASSIGNOR_NAME,
            members=tuple(
                ShareGroupMemberDescription(
                    member_id=m.member_id,
                    rack_id=m.rack_id,
                    member_epoch=m.member_epoch,
                    client_id=m.client_id,
                    client_host=m.client_host,
                    subscribed_topic_names=tuple(sorted(m.subscribed_topic_names)),
                    assignment=dict(m.assignment),
                )
                for m in sorted(self.members.values(), key=lambda m: m.member_id)
            ),
        )

    def delete(self) -> list[ShareGroupRecord]:
        """Records deleting the group (DeleteGroups); only an Empty group may go.

        The caller deletes the share state of `initialized` partitions first.
        """
        if self.members:
            raise KafkaError(
                ErrorCode.non_empty_group, f"Share group {self.group_id} is not empty."
            )
        return [ShareGroupTombstone(self.group_id)]

    # -- the only mutator -------------------------------------------------------

    def replay(self, record: ShareGroupRecord) -> None:
        """Apply one record. Live operation and recovery from the log both come here."""
        match record:
            case ShareGroupMetadataRecord(epoch=epoch, subscription_metadata=metadata):
                self.group_epoch = epoch
                self.subscription_metadata = {t.name: t for t in metadata}
            case ShareGroupMemberMetadataRecord(member_id=member_id):
                old = self.members.get(member_id) or ShareGroupMember(member_id)
                self.members[member_id] = replace(
                    old,
                    rack_id=record.rack_id,
                    client_id=record.client_id,
                    client_host=record.client_host,
                    subscribed_topic_names=record.subscribed_topic_names,
                )
            case ShareGroupMemberMetadataTombstone(member_id=member_id):
                self.members.pop(member_id, None)
                self._session_deadlines.pop(member_id, None)
            case ShareGroupTargetAssignmentMemberRecord(member_id=member_id, assignment=a):
                self.target_assignment[member_id] = _freeze(a)
            case ShareGroupTargetAssignmentMemberTombstone(member_id=member_id):
                self.target_assignment.pop(member_id, None)
            case ShareGroupTargetAssignmentMetadataRecord(assignment_epoch=epoch):
                self.assignment_epoch = epoch
            case ShareGroupCurrentMemberAssignmentRecord(member_id=member_id):
                old = self.members.get(member_id) or ShareGroupMember(member_id)
                self.members[member_id] = replace(
                    old,
                    member_epoch=record.member_epoch,
                    previous_member_epoch=record.previous_member_epoch,
                    assignment=_freeze(record.assignment),
                )
            case ShareGroupCurrentMemberAssignmentTombstone(member_id=member_id):
                if member_id in self.members:
                    self.members[member_id] = replace(
                        self.members[member_id],
                        member_epoch=LEAVE_GROUP_MEMBER_EPOCH,
                        assignment={},
                    )
            case ShareGroupStatePartitionMetadataRecord():
                self.initializing = _freeze(record.initializing)
                self.initialized = _freeze(record.initialized)
                self.deleting = frozenset(record.deleting)
                self._initializing_since = {
                    t: at for t, at in self._initializing_since.items() if t in self.initializing
                }
            case ShareGroupTombstone():
                self.members.clear()
                self.target_assignment.clear()
                self.subscription_metadata.clear()
                self.initializing = {}
                self.initialized = {}
                self.deleting = frozenset()
                self._session_deadlines.clear()
                self._initializing_since.clear()
                self.deleted = True

    def replay_all(self, records: Iterable[ShareGroupRecord]) -> None:
        """Replay records in order (what the runtime does once they are durable)."""
        for record in records:
            self.replay(record)

    # -- helpers ---------------------------------------------------------------

    def _fence(
        self, member_ids: list[str], topics_metadata: TopicsMetadata | None
    ) -> list[ShareGroupRecord]:
        """Records removing members (leave or session timeout) and rebalancing the rest."""
        records: list[ShareGroupRecord] = []
        for member_id in member_ids:
            records += [
                ShareGroupCurrentMemberAssignmentTombstone(self.group_id, member_id),
                ShareGroupTargetAssignmentMemberTombstone(self.group_id, member_id),
                ShareGroupMemberMetadataTombstone(self.group_id, member_id),
            ]
        remaining = {k: v for k, v in self.members.items() if k not in member_ids}
        if topics_metadata is None:
            # No fresh metadata (timer path): keep what the group last resolved.
            names = {n for m in remaining.values() for n in m.subscribed_topic_names}
            metadata = {n: t for n, t in self.subscription_metadata.items() if n in names}
        else:
            metadata = _subscription_metadata(remaining.values(), topics_metadata)
        rebalance, _, _ = self._rebalance(remaining, metadata, bump=True)
        return records + rebalance

    def _initialized_assignment_pending(
        self,
        members: Mapping[str, ShareGroupMember],
        subscription_metadata: Mapping[str, TopicMetadata],
        initialized: AssignmentDict | None = None,
    ) -> bool:
        """Kafka 4.2's initializedAssignmentPending: the group has members, and for some
        subscribed topic the target assignment does not hold exactly its initialized
        partitions (so the target must be recomputed)."""
        initialized = self.initialized if initialized is None else initialized
        if not members or not initialized:
            return False
        assigned: dict[uuid.UUID, set[int]] = {}
        for member_id, assignment in self.target_assignment.items():
            if member_id in members:
                for topic_id, parts in assignment.items():
                    assigned.setdefault(topic_id, set()).update(parts)
        for topic in subscription_metadata.values():
            ready = initialized.get(topic.topic_id, frozenset()) & frozenset(
                range(topic.num_partitions)
            )
            if ready and assigned.get(topic.topic_id, set()) != ready:
                return True
        return False

    def _rebalance(
        self,
        members: Mapping[str, ShareGroupMember],
        subscription_metadata: dict[str, TopicMetadata],
        *,
        bump: bool,
        assignable: AssignmentDict | None = None,
    ) -> tuple[list[ShareGroupRecord], int, dict[str, AssignmentDict]]:
        """Bump the group epoch and recompute the target if anything changed.

        Only `assignable` partitions (default: the initialized ones) are assigned.
        Returns the records, the target assignment epoch and the target assignment.
        """
        if not bump and subscription_metadata == self.subscription_metadata:
            return [], self.assignment_epoch, self.target_assignment
        epoch = self.group_epoch + 1
        records: list[ShareGroupRecord] = [
            ShareGroupMetadataRecord(
                self.group_id,
                epoch,
                tuple(sorted(subscription_metadata.values(), key=lambda t: t.name)),
            )
        ]
        target = assign(
            [
                AssignorMember(
                    m.member_id,
                    m.subscribed_topic_names,
                    self.target_assignment.get(m.member_id, {}),
                )
                for m in members.values()
            ],
            {t.topic_id: t for t in subscription_metadata.values()},
            self.initialized if assignable is None else assignable,
        )
        for member_id, assignment in sorted(target.items()):
            if self.target_assignment.get(member_id) != assignment:
                records.append(
                    ShareGroupTargetAssignmentMemberRecord(self.group_id, member_id, assignment)
                )
        records.append(ShareGroupTargetAssignmentMetadataRecord(self.group_id, epoch))
        return records, epoch, target


def _subscription_metadata(
    members: Iterable[ShareGroupMember], topics_metadata: TopicsMetadata
) -> dict[str, TopicMetadata]:
    """The subscribed topics that exist, by name (a topic not created yet is left out)."""
    by_name = {t.name: t for t in topics_metadata.values()}
    names = {n for m in members for n in m.subscribed_topic_names}
    return {n: by_name[n] for n in sorted(names) if n in by_name}


def _union(
    a: Mapping[uuid.UUID, frozenset[int]], b: Mapping[uuid.UUID, Iterable[int]]
) -> AssignmentDict:
    result = {t: set(p) for t, p in a.items()}
    for t, p in b.items():
        result.setdefault(t, set()).update(p)
    return _freeze(result)


def _difference(
    a: Mapping[uuid.UUID, frozenset[int]], b: Mapping[uuid.UUID, Iterable[int]]
) -> AssignmentDict:
    result = {t: set(p) for t, p in a.items()}
    for t, p in b.items():
        if t in result:
            result[t] -= set(p)
    return _freeze(result)
