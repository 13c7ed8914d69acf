"""Committed offsets of consumer and classic groups: the records.

Kafka keeps a group's committed offsets in `__consumer_offsets` beside the group's own
records; spool keeps them in the same place, the groups log (`data/groups/`), so a
commit goes through the group coordinator's one commit path and is fenced like every
group change. The records are Kafka 4.2's OffsetCommit key/value (record type 1), keyed
by group, topic and partition, so compaction keeps the newest commit per partition;
a tombstone deletes it (OffsetDelete, retention, DeleteGroups).

Kafka writes a transactional offset commit (TxnOffsetCommit) into a transactional batch
of `__consumer_offsets` that the transaction marker later commits or aborts. The groups
log has no transactional batches, so spool writes a PendingTxnOffsetCommit record (type
1000, spool's own) per producer and partition instead; the marker's operation writes,
in one batch, the OffsetCommit records (on commit) and the pending records' tombstones.

`OffsetStore` is the committed state the records build (replay is the one place they
take effect) and computes the records of each change, as Kafka's OffsetMetadataManager:
a commit (OffsetCommit), a fetch of some or all of a group's offsets (OffsetFetch), a
deletion (OffsetDelete, DeleteGroups), retention (`offsets.retention.minutes`, checked
every `offsets.retention.check.interval.ms`) and the offsets of a deleted topic.
A commit with generation -1 to an id naming no group makes a "simple" group
(`SimpleGroup`: an Empty classic group without a protocol, only using the coordinator to
store offsets); it is not stored as such, replaying its offsets makes it again, and it
goes once its last offset does.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from coordinator.group_host import (
    NO_EXPIRE_TIMESTAMP,
    NO_LEADER_EPOCH,
    GroupType,
    OffsetAndMetadata,
    OffsetGroup,
)
from protocol.errors import ErrorCode, KafkaError

# What OffsetFetch answers for a partition without a committed offset.
INVALID_OFFSET = -1
# Kafka 4.2's defaults: offset.metadata.max.bytes, offsets.retention.minutes (7 days),
# offsets.retention.check.interval.ms.
OFFSET_METADATA_MAX_BYTES = 4096
OFFSETS_RETENTION_MS = 7 * 24 * 60 * 60 * 1000
OFFSETS_RETENTION_CHECK_INTERVAL_MS = 600_000


@dataclass(frozen=True, slots=True)
class OffsetCommitRecord:
    """A committed offset (Kafka's OffsetCommitKey/OffsetCommitValue, type 1).

    `expire_timestamp` is set only by OffsetCommit v2-v4's RetentionTimeMs; `topic_id`
    is the topic's id when the commit named it (OffsetCommit v10), None before."""

    group_id: str
    topic: str
    partition: int
    offset: int
    leader_epoch: int = NO_LEADER_EPOCH
    metadata: str = ""
    commit_timestamp: int = 0
    expire_timestamp: int = NO_EXPIRE_TIMESTAMP
    topic_id: uuid.UUID | None = None


@dataclass(frozen=True, slots=True)
class OffsetCommitTombstone:
    """A committed offset deleted."""

    group_id: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class PendingTxnOffsetCommitRecord:
    """An offset committed by a transaction not yet ended (spool's type 1000): it becomes
    an OffsetCommitRecord when the transaction commits, and goes when it ends."""

    group_id: str
    producer_id: int
    topic: str
    partition: int
    producer_epoch: int
    offset: int
    leader_epoch: int = NO_LEADER_EPOCH
    metadata: str = ""
    commit_timestamp: int = 0


@dataclass(frozen=True, slots=True)
class PendingTxnOffsetCommitTombstone:
    group_id: str
    producer_id: int
    topic: str
    partition: int


OffsetRecord = (
    OffsetCommitRecord
    | OffsetCommitTombstone
    | PendingTxnOffsetCommitRecord
    | PendingTxnOffsetCommitTombstone
)


# ------------------------------------------------------------------ the committed state


@dataclass(frozen=True, slots=True)
class PartitionCommit:
    """One partition of an OffsetCommit request."""

    topic: str
    partition: int
    offset: int
    leader_epoch: int = NO_LEADER_EPOCH
    metadata: str | None = ""
    topic_id: uuid.UUID | None = None


@dataclass(frozen=True, slots=True)
class FetchedOffset:
    """One partition of an OffsetFetch answer."""

    partition: int
    offset: int = INVALID_OFFSET
    leader_epoch: int = NO_LEADER_EPOCH
    metadata: str = ""
    error: ErrorCode = ErrorCode.none


@dataclass(slots=True)
class SimpleGroup:
    """A group that only stores offsets (Kafka: an Empty classic group without a protocol
    type, made by a commit with generation -1): any member or generation is unknown to
    it, and its offsets expire a retention after their commit."""

    group_id: str
    group_type: GroupType = GroupType.CLASSIC
    protocol_type: str = ""
    state_name: str = "Empty"
    is_empty: bool = True

    def validate_offset_commit(
        self,
        member_id: str,
        instance_id: str | None,
        generation_or_epoch: int,
        *,
        transactional: bool,
        api_version: int,
    ) -> None:
        # ClassicGroup.validateOffsetCommit for an Empty group: generation -1 commits;
        # a generation names a member it does not have.
        if generation_or_epoch < 0:
            return
        raise KafkaError(
            ErrorCode.unknown_member_id,
            f"Member {member_id or '(none)'} is not a member of group {self.group_id}.",
        )

    def validate_offset_fetch(self, member_id: str | None, member_epoch: int | None) -> None:
        return None

    def validate_offset_delete(self) -> None:
        return None

    def validate_delete_group(self) -> None:
        return None

    def is_subscribed_to_topic(self, topic: str) -> bool:
        return False

    def offset_expiration_base(self, offset: OffsetAndMetadata) -> int | None:
        return offset.commit_timestamp

    def tombstones(self) -> list[Any]:
        return []  # nothing of it is stored but its offsets


@dataclass(slots=True)
class OffsetStore:
    """Committed offsets and pending transactional ones, per group (see the module
    docstring). Changes are computed as records; only `replay` changes the store."""

    metadata_max_bytes: int = OFFSET_METADATA_MAX_BYTES
    retention_ms: int = OFFSETS_RETENTION_MS
    # group -> (topic, partition) -> committed offset
    committed: dict[str, dict[tuple[str, int], OffsetAndMetadata]] = field(default_factory=dict)
    # group -> producer id -> (topic, partition) -> pending transactional offset
    pending: dict[str, dict[int, dict[tuple[str, int], PendingTxnOffsetCommitRecord]]] = field(
        default_factory=dict
    )

    # -- replay -----------------------------------------------------------------------

    def replay(self, record: OffsetRecord) -> None:
        key = (record.topic, record.partition)
        if isinstance(record, OffsetCommitRecord):
            self.committed.setdefault(record.group_id, {})[key] = _offset_of(record)
        elif isinstance(record, OffsetCommitTombstone):
            group = self.committed.get(record.group_id)
            if group is not None:
                group.pop(key, None)
                if not group:
                    del self.committed[record.group_id]
        elif isinstance(record, PendingTxnOffsetCommitRecord):
            by_producer = self.pending.setdefault(record.group_id, {})
            by_producer.setdefault(record.producer_id, {})[key] = record
        else:
            producers = self.pending.get(record.group_id, {})
            offsets = producers.get(record.producer_id, {})
            offsets.pop(key, None)
            if not offsets:
                producers.pop(record.producer_id, None)
            if not producers:
                self.pending.pop(record.group_id, None)

    # -- reads --------------------------------------------------------------------------

    def has_offsets(self, group_id: str) -> bool:
        return bool(self.committed.get(group_id)) or bool(self.pending.get(group_id))

    def group_ids(self) -> set[str]:
        return set(self.committed) | set(self.pending)

    def _unstable(self, group_id: str) -> set[tuple[str, int]]:
        return {key for offsets in self.pending.get(group_id, {}).values() for key in offsets}

    def fetch(
        self,
        group_id: str,
        topics: Sequence[tuple[str, Sequence[int], uuid.UUID | None]] | None,
        *,
        require_stable: bool = False,
    ) -> list[tuple[str, uuid.UUID | None, list[FetchedOffset]]]:
        """OffsetFetch for one group: the named topics' partitions (INVALID_OFFSET where
        none is committed, or where it was committed under another id of the topic), or
        with `topics` None every committed one. With `require_stable` a partition with a
        pending transactional offset answers UNSTABLE_OFFSET_COMMIT (OffsetFetch v7+)."""
        committed = self.committed.get(group_id, {})
        unstable = self._unstable(group_id) if require_stable else set()
        if topics is None:
            by_topic: dict[str, list[int]] = {}
            for topic, partition in sorted(committed):
                by_topic.setdefault(topic, []).append(partition)
            topics = [(topic, parts, None) for topic, parts in by_topic.items()]
        result = []
        for topic, partitions, topic_id in topics:
            answers = []
            for partition in partitions:
                found = committed.get((topic, partition))
                if (topic, partition) in unstable:
                    answers.append(FetchedOffset(partition, error=ErrorCode.unstable_offset_commit))
                elif found is None or _mismatched(found.topic_id, topic_id):
                    answers.append(FetchedOffset(partition))
                else:
                    answers.append(
                        FetchedOffset(partition, found.offset, found.leader_epoch, found.metadata)
                    )
            result.append((topic, topic_id, answers))
        return result

    # -- changes, as records ----------------------------------------------------------------

    def commit(
        self,
        group_id: str,
        partitions: Iterable[PartitionCommit],
        now_ms: int,
        retention_ms: int = -1,
    ) -> tuple[list[OffsetRecord], list[tuple[PartitionCommit, ErrorCode]]]:
        """The records of an OffsetCommit already validated by the group, and each
        partition's outcome (OFFSET_METADATA_TOO_LARGE past `metadata_max_bytes`).
        `retention_ms` is OffsetCommit v2-v4's RetentionTimeMs (-1: the broker's)."""
        records: list[OffsetRecord] = []
        outcomes = []
        expire = NO_EXPIRE_TIMESTAMP if retention_ms == -1 else now_ms + retention_ms
        for p in partitions:
            metadata = p.metadata or ""
            if len(metadata) > self.metadata_max_bytes:
                outcomes.append((p, ErrorCode.offset_metadata_too_large))
                continue
            records.append(
                OffsetCommitRecord(
                    group_id,
                    p.topic,
                    p.partition,
                    p.offset,
                    p.leader_epoch,
                    metadata,
                    now_ms,
                    expire,
                    p.topic_id,
                )
            )
            outcomes.append((p, ErrorCode.none))
        return records, outcomes

    def commit_transactional(
        self,
        group_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[PartitionCommit],
        now_ms: int,
    ) -> tuple[list[OffsetRecord], list[tuple[PartitionCommit, ErrorCode]]]:
        """The records of a TxnOffsetCommit already validated: pending offsets of the
        producer's transaction, committed or dropped by its marker (`complete`)."""
        records: list[OffsetRecord] = []
        outcomes = []
        for p in partitions:
            metadata = p.metadata or ""
            if len(metadata) > self.metadata_max_bytes:
                outcomes.append((p, ErrorCode.offset_metadata_too_large))
                continue
            records.append(
                PendingTxnOffsetCommitRecord(
                    group_id,
                    producer_id,
                    p.topic,
                    p.partition,
                    producer_epoch,
                    p.offset,
                    p.leader_epoch,
                    metadata,
                    now_ms,
                )
            )
            outcomes.append((p, ErrorCode.none))
        return records, outcomes

    def pending_groups(self, producer_id: int) -> list[str]:
        """The groups with offsets pending in the producer's transaction."""
        return sorted(g for g, producers in self.pending.items() if producer_id in producers)

    def complete(self, group_id: str, producer_id: int, commit: bool) -> list[OffsetRecord]:
        """The transaction's marker reached the group (Kafka's replayEndTransactionMarker):
        on commit its pending offsets become committed ones; either way they go."""
        offsets = self.pending.get(group_id, {}).get(producer_id, {})
        records: list[OffsetRecord] = []
        if commit:
            records += [
                OffsetCommitRecord(
                    group_id,
                    topic,
                    partition,
                    p.offset,
                    p.leader_epoch,
                    p.metadata,
                    p.commit_timestamp,
                )
                for (topic, partition), p in sorted(offsets.items())
            ]
        records += [
            PendingTxnOffsetCommitTombstone(group_id, producer_id, topic, partition)
            for topic, partition in sorted(offsets)
        ]
        return records

    def delete(
        self, group_id: str, topics: Sequence[tuple[str, Sequence[int]]], group: OffsetGroup
    ) -> tuple[list[OffsetRecord], list[tuple[str, list[tuple[int, ErrorCode]]]]]:
        """OffsetDelete: tombstones for the committed (or pending) offsets of topics the
        group is not subscribed to; GROUP_SUBSCRIBED_TO_TOPIC for the others."""
        committed = self.committed.get(group_id, {})
        unstable = self._unstable(group_id)
        records: list[OffsetRecord] = []
        answers = []
        for topic, partitions in topics:
            if group.is_subscribed_to_topic(topic):
                answers.append(
                    (topic, [(p, ErrorCode.group_subscribed_to_topic) for p in partitions])
                )
                continue
            for p in partitions:
                if (topic, p) in committed or (topic, p) in unstable:
                    records.append(OffsetCommitTombstone(group_id, topic, p))
            answers.append((topic, [(p, ErrorCode.none) for p in partitions]))
        return records, answers

    def delete_all(self, group_id: str) -> list[OffsetRecord]:
        """Tombstones for every offset of the group, committed or pending (DeleteGroups)."""
        records: list[OffsetRecord] = [
            OffsetCommitTombstone(group_id, topic, p)
            for topic, p in sorted(self.committed.get(group_id, {}))
        ]
        for producer_id, offsets in sorted(self.pending.get(group_id, {}).items()):
            for topic, p in sorted(offsets):
                records.append(PendingTxnOffsetCommitTombstone(group_id, producer_id, topic, p))
        return records

    def expire(
        self, group_id: str, group: OffsetGroup, now_ms: int
    ) -> tuple[list[OffsetRecord], bool]:
        """Retention (Kafka's cleanupExpiredOffsets): tombstones for the offsets of topics
        the group is not subscribed to whose time is up (their explicit expiry, or the
        group's expiration base plus `retention_ms`), none with a pending transactional
        offset; and whether every offset of the group is gone with them."""
        committed = self.committed.get(group_id, {})
        unstable = self._unstable(group_id)
        records: list[OffsetRecord] = []
        all_gone = True
        for (topic, p), offset in sorted(committed.items()):
            base = group.offset_expiration_base(offset)
            expired = base is not None and not group.is_subscribed_to_topic(topic)
            if expired and offset.expire_timestamp != NO_EXPIRE_TIMESTAMP:
                expired = now_ms >= offset.expire_timestamp
            elif expired:
                assert base is not None
                expired = now_ms - base >= self.retention_ms
            if expired and (topic, p) not in unstable:
                records.append(OffsetCommitTombstone(group_id, topic, p))
            else:
                all_gone = False
        return records, all_gone and not self.pending.get(group_id)

    def on_topics_deleted(self, topics: Iterable[str]) -> list[OffsetRecord]:
        """Tombstones for every offset, committed or pending, of the deleted topics."""
        gone = set(topics)
        records: list[OffsetRecord] = []
        for group_id, committed in sorted(self.committed.items()):
            records += [
                OffsetCommitTombstone(group_id, t, p) for t, p in sorted(committed) if t in gone
            ]
        for group_id, producers in sorted(self.pending.items()):
            for producer_id, offsets in sorted(producers.items()):
                records += [
                    PendingTxnOffsetCommitTombstone(group_id, producer_id, t, p)
                    for t, p in sorted(offsets)
                    if t in gone
                ]
        return records


def _mismatched(stored: uuid.UUID | None, asked: uuid.UUID | None) -> bool:
    """A commit made under another id of the topic (deleted and created again) is not
    this topic's: both known and different (Kafka's isMismatchedTopicId)."""
    zero = uuid.UUID(int=0)
    return stored not in (None, zero) and asked not in (None, zero) and stored != asked


def _offset_of(record: OffsetCommitRecord) -> OffsetAndMetadata:
    return OffsetAndMetadata(
        record.offset,
        record.leader_epoch,
        record.metadata,
        record.commit_timestamp,
        record.expire_timestamp,
        record.topic_id,
    )
