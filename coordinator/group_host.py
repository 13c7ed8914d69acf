"""What the group coordinator's parts share: the group types of one group-id namespace,
and what the committed offsets need of a consumer or classic group.

Kafka's group coordinator serves classic, consumer and share groups with one namespace
of group ids: an id belongs to one group of one type at a time, and a request of another
type's protocol is refused as Kafka 4.2 refuses it (GroupMetadataManager). `OffsetGroup`
is Kafka's `Group` interface as the offsets use it (OffsetMetadataManager): the group
validates a commit, a fetch, an OffsetDelete and its own deletion, and says whether it
is subscribed to a topic; a classic group (coordinator.classic_group) and a consumer
group (coordinator.consumer_group) implement it. Share groups have no committed offsets.
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

# OffsetCommitValue's defaults in Kafka 4.2 (no leader epoch, no expiry given).
NO_LEADER_EPOCH = -1
NO_EXPIRE_TIMESTAMP = -1


class GroupType(enum.StrEnum):
    """A group's type, as ListGroups v5 names it."""

    CLASSIC = "classic"
    CONSUMER = "consumer"
    SHARE = "share"


@dataclass(frozen=True, slots=True)
class OffsetAndMetadata:
    """A committed offset as OffsetFetch answers it and retention judges it."""

    offset: int
    leader_epoch: int = NO_LEADER_EPOCH
    metadata: str = ""
    commit_timestamp: int = 0
    expire_timestamp: int = NO_EXPIRE_TIMESTAMP
    topic_id: uuid.UUID | None = None


class OffsetGroup(Protocol):
    """A consumer or classic group, as its committed offsets see it."""

    @property
    def group_id(self) -> str: ...

    @property
    def group_type(self) -> GroupType: ...

    @property
    def protocol_type(self) -> str:
        """ "consumer" for consumer groups and classic groups of consumers, "" for a
        simple group (offsets only), what its members declared otherwise."""
        ...

    @property
    def state_name(self) -> str:
        """The state as ListGroups and DescribeGroups show it (Empty, Stable, ...)."""
        ...

    @property
    def is_empty(self) -> bool: ...

    def validate_offset_commit(
        self,
        member_id: str,
        instance_id: str | None,
        generation_or_epoch: int,
        *,
        transactional: bool,
        api_version: int,
    ) -> None:
        """Raise the KafkaError Kafka 4.2 answers a commit from this member with
        (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, STALE_MEMBER_EPOCH, FENCED_INSTANCE_ID,
        REBALANCE_IN_PROGRESS, UNSUPPORTED_VERSION), or return if it may commit."""
        ...

    def validate_offset_fetch(self, member_id: str | None, member_epoch: int | None) -> None:
        """OffsetFetch v9+ names the member: raise if it may not read (STALE_MEMBER_EPOCH,
        UNKNOWN_MEMBER_ID); a fetch naming no member always may."""
        ...

    def validate_offset_delete(self) -> None:
        """Raise if offsets may not be deleted now (NON_EMPTY_GROUP for a classic group
        with members that do not use the consumer protocol)."""
        ...

    def validate_delete_group(self) -> None:
        """Raise NON_EMPTY_GROUP if the group has members."""
        ...

    def is_subscribed_to_topic(self, topic: str) -> bool: ...

    def offset_expiration_base(self, offset: OffsetAndMetadata) -> int | None:
        """When `offset`'s retention started (Kafka's OffsetExpirationCondition): the
        commit time for a simple group, the time it went Empty for a classic group of
        consumers; None while the group keeps its offsets (members are using them)."""
        ...

    def tombstones(self) -> list[Any]:
        """The records deleting the group (its offsets are deleted by the caller)."""
        ...
