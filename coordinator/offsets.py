"""Committed offsets of consumer and classic groups: the records (issue 26's seam).

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

The offset store itself (commit, fetch, delete, expiry, transactions) is built on these
records by the group coordinator (coordinator.group_coordinator).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

# OffsetCommitValue's defaults in Kafka 4.2 (no leader epoch, no expiry given).
NO_LEADER_EPOCH = -1
NO_EXPIRE_TIMESTAMP = -1


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
