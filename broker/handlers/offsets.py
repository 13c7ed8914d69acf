"""Committed offsets on the wire: OffsetCommit (8), OffsetFetch (9), OffsetDelete (47).

The rules live in `GroupCoordinator` (commit_offsets, fetch_offsets,
delete_committed_offsets, over coordinator.offsets); these handlers check what Kafka
4.2's KafkaApis checks before it asks the group coordinator, and shape the answers as it
does:

- OffsetCommit needs READ on the group (GROUP_AUTHORIZATION_FAILED for every partition
  otherwise) and READ on each topic (TOPIC_AUTHORIZATION_FAILED for its partitions); a
  topic the cluster does not have, or a partition past its count, is
  UNKNOWN_TOPIC_OR_PARTITION, and from v10, which names topics by id, an unknown id is
  UNKNOWN_TOPIC_ID. A whole-request failure of the coordinator (the member's or the
  group's, NOT_COORDINATOR for a failed write) is every partition's error, as Kafka's
  getErrorResponse answers. The rest are committed together, durably, before the answer.
- OffsetFetch needs DESCRIBE on the group (a group error) and answers a topic the
  principal may not DESCRIBE with TOPIC_AUTHORIZATION_FAILED per partition, or leaves
  it out of an all-topics answer. v1-v7 ask for one group (its error at the top from v2,
  per partition in v1), v8+ for several, each answered on its own; v10 names topics by
  id. `RequireStable` (v7+) answers UNSTABLE_OFFSET_COMMIT for a partition with a
  pending transactional offset.
- OffsetDelete needs DELETE on the group and READ on each topic.

An empty group id is INVALID_GROUP_ID, as Kafka's GroupCoordinatorService answers it.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import structlog
from kio.schema.types import TopicName
from kio.static.primitive import i32, i64

from broker.handlers import responses as resp
from broker.handlers.access import Guarded
from broker.handlers.responses import NO_THROTTLE
from broker.server import RequestContext
from coordinator.acls import AclOperation, ResourceType
from coordinator.assignor import TopicMetadata
from coordinator.group_coordinator import GroupCoordinator
from coordinator.offsets import FetchedOffset, PartitionCommit
from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from broker.handlers.requests import (
        OffsetCommitRequest,
        OffsetDeleteRequest,
        OffsetFetchRequest,
    )

log = structlog.get_logger("spool.groups")

ZERO_UUID = uuid.UUID(int=0)
# OffsetCommit v2-v4's RetentionTimeMs meaning "the broker's offsets.retention.minutes".
DEFAULT_RETENTION = -1


class OffsetsBroker(Guarded, Protocol):
    """What the offset handlers use of the broker."""

    @property
    def groups(self) -> GroupCoordinator: ...


def _invalid_group_id(group_id: str) -> KafkaError | None:
    if not group_id:
        return KafkaError(ErrorCode.invalid_group_id, "The group id must not be empty.")
    return None


def _topics_by_name(broker: OffsetsBroker) -> dict[str, TopicMetadata]:
    return {t.name: t for t in broker.groups.topics().values()}


def _retention_ms(req: Any) -> int:
    retention = getattr(req, "retention_time", None)
    if retention is None:
        return DEFAULT_RETENTION
    ms = int(retention.total_seconds() * 1000)
    return DEFAULT_RETENTION if ms < 0 else ms


# ------------------------------------------------------------------ OffsetCommit


async def offset_commit(
    ctx: RequestContext, req: OffsetCommitRequest, broker: OffsetsBroker
) -> resp.offset_commit_v9.OffsetCommitResponse | resp.offset_commit_v10.OffsetCommitResponse:
    by_id = ctx.api_version >= 10
    topics = broker.groups.topics()
    by_name = {t.name: t for t in topics.values()}
    # (topic name or None, topic id or None, partitions) of the request, in its order.
    named: list[tuple[str | None, uuid.UUID | None, Sequence[Any]]] = []
    for t in req.topics:
        if by_id:
            topic_id = getattr(t, "topic_id", None)
            found = topics.get(topic_id) if topic_id is not None else None
            named.append((None if found is None else found.name, topic_id, t.partitions))
        else:
            named.append((getattr(t, "name", None), None, t.partitions))
    # partition errors set before the coordinator is asked: (topic index, partition) -> code
    errors: dict[tuple[int, int], ErrorCode] = {}
    wanted: list[PartitionCommit] = []
    where: dict[tuple[str, int], tuple[int, int]] = {}
    group_error = _invalid_group_id(req.group_id)
    if group_error is None and not broker.authorizer.allows(
        ctx, AclOperation.READ, ResourceType.GROUP, req.group_id
    ):
        group_error = KafkaError(ErrorCode.group_authorization_failed, "")
    if group_error is None:
        for i, (name, _, partitions) in enumerate(named):
            if name is None:
                code = ErrorCode.unknown_topic_id
            elif not broker.authorizer.allows(ctx, AclOperation.READ, ResourceType.TOPIC, name):
                code = ErrorCode.topic_authorization_failed
            elif name not in by_name:
                code = ErrorCode.unknown_topic_or_partition
            else:
                code = ErrorCode.none
            for p in partitions:
                index = int(p.partition_index)
                topic = by_name.get(name) if name is not None else None
                if code == ErrorCode.none and (
                    topic is None or not 0 <= index < topic.num_partitions
                ):
                    errors[(i, index)] = ErrorCode.unknown_topic_or_partition
                elif code != ErrorCode.none:
                    errors[(i, index)] = code
                else:
                    assert name is not None
                    wanted.append(
                        PartitionCommit(
                            name,
                            index,
                            int(p.committed_offset),
                            int(getattr(p, "committed_leader_epoch", -1)),
                            p.committed_metadata,
                            by_name[name].topic_id if by_id else None,
                        )
                    )
                    where[(name, index)] = (i, index)
    if group_error is None and wanted:
        try:
            outcomes = await broker.groups.commit_offsets(
                req.group_id,
                req.member_id,
                getattr(req, "group_instance_id", None),
                int(req.generation_id_or_member_epoch),
                wanted,
                retention_ms=_retention_ms(req),
                api_version=ctx.api_version,
            )
        except KafkaError as exc:
            group_error = exc
            log.info(
                "offset_commit_refused", group=req.group_id, error=exc.code.name, reason=exc.message
            )
        else:
            for commit, code in outcomes:
                errors[where[(commit.topic, commit.partition)]] = code
    if group_error is not None:
        errors = {
            (i, int(p.partition_index)): group_error.code
            for i, (_, _, partitions) in enumerate(named)
            for p in partitions
        }
    if by_id:
        m10 = resp.offset_commit_v10
        return m10.OffsetCommitResponse(
            throttle_time=NO_THROTTLE,
            topics=tuple(
                m10.OffsetCommitResponseTopic(
                    topic_id=topic_id,
                    partitions=tuple(
                        m10.OffsetCommitResponsePartition(
                            partition_index=p.partition_index,
                            error_code=errors.get((i, int(p.partition_index)), ErrorCode.none),
                        )
                        for p in partitions
                    ),
                )
                for i, (_, topic_id, partitions) in enumerate(named)
            ),
        )
    m9 = resp.offset_commit_v9
    return m9.OffsetCommitResponse(
        throttle_time=NO_THROTTLE,
        topics=tuple(
            m9.OffsetCommitResponseTopic(
                name=TopicName(name or ""),
                partitions=tuple(
                    m9.OffsetCommitResponsePartition(
                        partition_index=p.partition_index,
                        error_code=errors.get((i, int(p.partition_index)), ErrorCode.none),
                    )
                    for p in partitions
                ),
            )
            for i, (name, _, partitions) in enumerate(named)
        ),
    )


# ------------------------------------------------------------------ OffsetFetch


class _Group:
    """One group of an OffsetFetch, whatever the version asked it."""

    def __init__(
        self,
        group_id: str,
        topics: list[tuple[str | None, uuid.UUID | None, list[int]]] | None,
        member_id: str | None = None,
        member_epoch: int | None = None,
    ) -> None:
        self.group_id = group_id
        self.topics = topics
        self.member_id = member_id
        self.member_epoch = member_epoch


Answer = tuple[ErrorCode, list[tuple[str | None, uuid.UUID | None, list[FetchedOffset]]]]


def _fetch_group(
    ctx: RequestContext, broker: OffsetsBroker, group: _Group, require_stable: bool
) -> Answer:
    """(group error, [(topic name, topic id, partitions)]) for one group."""
    invalid = _invalid_group_id(group.group_id)
    if invalid is not None:
        return invalid.code, []
    az = broker.authorizer
    if not az.allows(ctx, AclOperation.DESCRIBE, ResourceType.GROUP, group.group_id):
        return ErrorCode.group_authorization_failed, []
    denied: list[tuple[str | None, uuid.UUID | None, list[FetchedOffset]]] = []
    wanted: list[tuple[str, Sequence[int], uuid.UUID | None]] | None = None
    unknown_ids: list[tuple[str | None, uuid.UUID | None, list[FetchedOffset]]] = []
    if group.topics is not None:
        wanted = []
        for name, topic_id, partitions in group.topics:
            if name is None:
                # v10: an id the cluster does not know (Kafka answers UNKNOWN_TOPIC_ID).
                unknown_ids.append(
                    (
                        None,
                        topic_id,
                        [FetchedOffset(p, error=ErrorCode.unknown_topic_id) for p in partitions],
                    )
                )
            elif az.allows(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, name):
                wanted.append((name, partitions, topic_id))
            else:
                denied.append(
                    (
                        name,
                        topic_id,
                        [
                            FetchedOffset(p, error=ErrorCode.topic_authorization_failed)
                            for p in partitions
                        ],
                    )
                )
    try:
        fetched = broker.groups.fetch_offsets(
            group.group_id,
            wanted,
            member_id=group.member_id,
            member_epoch=group.member_epoch,
            require_stable=require_stable,
        )
    except KafkaError as exc:
        return exc.code, []
    answer: list[tuple[str | None, uuid.UUID | None, list[FetchedOffset]]] = [
        (name, topic_id, offsets) for name, topic_id, offsets in fetched
    ]
    if wanted is None:
        # All topics: those the principal may not describe are left out.
        answer = [
            (name, tid, offsets)
            for name, tid, offsets in answer
            if name is not None and az.allows(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, name)
        ]
    return ErrorCode.none, answer + denied + unknown_ids


async def offset_fetch(
    ctx: RequestContext, req: OffsetFetchRequest, broker: OffsetsBroker
) -> (
    resp.offset_fetch_v7.OffsetFetchResponse
    | resp.offset_fetch_v9.OffsetFetchResponse
    | resp.offset_fetch_v10.OffsetFetchResponse
):
    version = ctx.api_version
    require_stable = bool(getattr(req, "require_stable", False))
    if version < 8:
        single = req  # one group
        topics = getattr(single, "topics", None)
        group = _Group(
            single.group_id,  # type: ignore[union-attr]
            None
            if topics is None
            else [(t.name, None, [int(p) for p in t.partition_indexes]) for t in topics],
        )
        error, answer = _fetch_group(ctx, broker, group, require_stable)
        m7 = resp.offset_fetch_v7
        if error != ErrorCode.none and version < 2:
            # v1 has no group error: every partition asked carries it.
            answer = [
                (name, tid, [FetchedOffset(p, error=error) for p in parts])
                for name, tid, parts in (group.topics or [])
            ]
            error = ErrorCode.none
        return m7.OffsetFetchResponse(
            throttle_time=NO_THROTTLE,
            topics=tuple(
                m7.OffsetFetchResponseTopic(
                    name=TopicName(name or ""),
                    partitions=tuple(_partition(m7.OffsetFetchResponsePartition, o) for o in parts),
                )
                for name, _, parts in answer
            ),
            error_code=error,
        )
    by_id = version >= 10
    topic_names = {t.topic_id: t.name for t in broker.groups.topics().values()}
    groups = []
    for g in req.groups:  # type: ignore[union-attr]
        topics_of: list[tuple[str | None, uuid.UUID | None, list[int]]] | None = None
        if g.topics is not None:
            topics_of = []
            for t in g.topics:
                parts = [int(p) for p in t.partition_indexes]
                if by_id:
                    topic_id: uuid.UUID | None = getattr(t, "topic_id", None)
                    name = None if topic_id is None else topic_names.get(topic_id)
                    topics_of.append((name, topic_id, parts))
                else:
                    topics_of.append((getattr(t, "name", None), None, parts))
        member_epoch = getattr(g, "member_epoch", -1)
        groups.append(
            (
                g.group_id,
                _fetch_group(
                    ctx,
                    broker,
                    _Group(
                        g.group_id,
                        topics_of,
                        getattr(g, "member_id", None),
                        None if member_epoch is None or member_epoch < 0 else int(member_epoch),
                    ),
                    require_stable,
                ),
            )
        )
    if by_id:
        m10 = resp.offset_fetch_v10
        ids = {t.name: t.topic_id for t in broker.groups.topics().values()}
        return m10.OffsetFetchResponse(
            throttle_time=NO_THROTTLE,
            groups=tuple(
                m10.OffsetFetchResponseGroup(
                    group_id=group_id,
                    topics=tuple(
                        m10.OffsetFetchResponseTopics(
                            topic_id=tid if tid is not None else ids.get(name or "", ZERO_UUID),
                            partitions=tuple(
                                _partition(m10.OffsetFetchResponsePartitions, o) for o in parts
                            ),
                        )
                        for name, tid, parts in answer
                    ),
                    error_code=error,
                )
                for group_id, (error, answer) in groups
            ),
        )
    m9 = resp.offset_fetch_v9
    return m9.OffsetFetchResponse(
        throttle_time=NO_THROTTLE,
        groups=tuple(
            m9.OffsetFetchResponseGroup(
                group_id=group_id,
                topics=tuple(
                    m9.OffsetFetchResponseTopics(
                        name=TopicName(name or ""),
                        partitions=tuple(
                            _partition(m9.OffsetFetchResponsePartitions, o) for o in parts
                        ),
                    )
                    for name, _, parts in answer
                ),
                error_code=error,
            )
            for group_id, (error, answer) in groups
        ),
    )


def _partition(cls: Any, o: FetchedOffset) -> Any:
    return cls(
        partition_index=i32(o.partition),
        committed_offset=i64(o.offset),
        committed_leader_epoch=i32(o.leader_epoch),
        metadata=o.metadata,
        error_code=o.error,
    )


# ------------------------------------------------------------------ OffsetDelete


async def offset_delete(
    ctx: RequestContext, req: OffsetDeleteRequest, broker: OffsetsBroker
) -> resp.offset_delete_v0.OffsetDeleteResponse:
    m = resp.offset_delete_v0

    def answer(
        error: ErrorCode, topics: list[tuple[str, list[tuple[int, ErrorCode]]]]
    ) -> resp.offset_delete_v0.OffsetDeleteResponse:
        return m.OffsetDeleteResponse(
            error_code=error,
            throttle_time=NO_THROTTLE,
            topics=tuple(
                m.OffsetDeleteResponseTopic(
                    name=TopicName(name),
                    partitions=tuple(
                        m.OffsetDeleteResponsePartition(partition_index=i32(p), error_code=code)
                        for p, code in parts
                    ),
                )
                for name, parts in topics
            ),
        )

    invalid = _invalid_group_id(req.group_id)
    if invalid is not None:
        return answer(invalid.code, [])
    az = broker.authorizer
    if not az.allows(ctx, AclOperation.DELETE, ResourceType.GROUP, req.group_id):
        return answer(ErrorCode.group_authorization_failed, [])
    by_name = _topics_by_name(broker)
    early: list[tuple[str, list[tuple[int, ErrorCode]]]] = []
    wanted: list[tuple[str, Sequence[int]]] = []
    for t in req.topics:
        parts = [int(p.partition_index) for p in t.partitions]
        if not az.allows(ctx, AclOperation.READ, ResourceType.TOPIC, t.name):
            early.append((t.name, [(p, ErrorCode.topic_authorization_failed) for p in parts]))
            continue
        topic = by_name.get(t.name)
        known = [p for p in parts if topic is not None and 0 <= p < topic.num_partitions]
        unknown = [(p, ErrorCode.unknown_topic_or_partition) for p in parts if p not in known]
        if unknown:
            early.append((t.name, unknown))
        if known:
            wanted.append((t.name, known))
    try:
        done = await broker.groups.delete_committed_offsets(req.group_id, wanted) if wanted else []
    except KafkaError as exc:
        return answer(exc.code, [])
    return answer(ErrorCode.none, done + early)
