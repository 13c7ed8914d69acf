"""Share-group administration on the wire (KIP-932): DeleteGroups (42),
DescribeShareGroupOffsets (90), AlterShareGroupOffsets (91), DeleteShareGroupOffsets (92).

The rules live in `GroupCoordinator` (describe_offsets, alter_offsets, delete_offsets,
delete_groups); these handlers shape its answers as Kafka 4.2's KafkaApis does:
a whole-request failure of Alter/DeleteShareGroupOffsets fills only the top-level
ErrorCode and ErrorMessage and no topics (KafkaApis answers `getErrorResponse`, which
drops the per-partition echo GroupCoordinatorService built), DescribeShareGroupOffsets
errors are per group, DeleteGroups results per group.

Authorization as Kafka 4.2: DeleteGroups needs DELETE on each group
(GROUP_AUTHORIZATION_FAILED for that group); DescribeShareGroupOffsets DESCRIBE on the
group and on each topic (a named topic denied is answered TOPIC_AUTHORIZATION_FAILED per
partition, an all-topics answer leaves it out); AlterShareGroupOffsets READ on the group
and on each topic; DeleteShareGroupOffsets DELETE on the group and READ on each topic.
A denied group fails its request (or its entry); denied topics are answered beside the
others, which are served.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Protocol

import structlog
from kio.schema.types import GroupId, TopicName
from kio.static.primitive import i32, i64

from broker.handlers import responses as resp
from broker.handlers.access import GROUP_DENIED, TOPIC_DENIED, Guarded
from broker.handlers.responses import NO_THROTTLE
from broker.partitions import Partition
from broker.server import RequestContext
from coordinator.acls import AclOperation, ResourceType
from coordinator.group_coordinator import GroupCoordinator, PartitionOffsets, TopicResult
from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from broker.handlers.requests import (
        AlterShareGroupOffsetsRequest,
        DeleteGroupsRequest,
        DeleteShareGroupOffsetsRequest,
        DescribeShareGroupOffsetsRequest,
    )

log = structlog.get_logger("spool.groups")

ZERO_UUID = uuid.UUID(int=0)


class ShareAdminBroker(Guarded, Protocol):
    """What the share-group admin handlers use of the broker."""

    @property
    def groups(self) -> GroupCoordinator: ...

    def log_partition(self, topic_id: uuid.UUID, partition: int) -> Partition | None: ...


def _invalid_group_id(group_id: str) -> KafkaError | None:
    # Kafka's GroupCoordinatorService refuses an empty group id with INVALID_GROUP_ID.
    if not group_id:
        return KafkaError(ErrorCode.invalid_group_id, "The group id must not be empty.")
    return None


def _error_message(exc: KafkaError) -> str:
    return exc.message or exc.code.name


# ------------------------------------------------------------ DescribeShareGroupOffsets


async def describe_share_group_offsets(
    ctx: RequestContext, req: DescribeShareGroupOffsetsRequest, broker: ShareAdminBroker
) -> resp.describe_share_group_offsets_v1.DescribeShareGroupOffsetsResponse:
    m = resp.describe_share_group_offsets_v1

    def end_offset(topic_id: uuid.UUID, partition: int) -> int | None:
        # Lag counts to the high watermark: what a consumer could be handed.
        log_part = broker.log_partition(topic_id, partition)
        return None if log_part is None else log_part.high_watermark

    az = broker.authorizer
    groups = []
    for group in req.groups:
        if not az.allows(ctx, AclOperation.DESCRIBE, ResourceType.GROUP, group.group_id):
            groups.append(
                m.DescribeShareGroupOffsetsResponseGroup(
                    group_id=group.group_id,
                    topics=(),
                    error_code=ErrorCode.group_authorization_failed,
                )
            )
            continue
        if group.topics is not None and not group.topics:
            # Kafka: an empty topic list (not null) answers the group with no topics.
            groups.append(
                m.DescribeShareGroupOffsetsResponseGroup(
                    group_id=group.group_id, topics=(), error_code=ErrorCode.none
                )
            )
            continue
        denied: list[tuple[str, list[int]]] = []
        wanted: list[tuple[str, list[int]]] | None = None
        if group.topics is not None:
            wanted = []
            for t in group.topics:
                entry = (t.topic_name, [int(p) for p in t.partitions])
                if az.allows(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, t.topic_name):
                    wanted.append(entry)
                else:
                    denied.append(entry)
        try:
            topics = await broker.groups.describe_offsets(group.group_id, wanted, end_offset)
            if wanted is None:
                # All topics: those the principal may not describe are left out.
                topics = [
                    t
                    for t in topics
                    if az.allows(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, t.name)
                ]
        except KafkaError as exc:
            groups.append(
                m.DescribeShareGroupOffsetsResponseGroup(
                    group_id=group.group_id,
                    topics=(),
                    error_code=exc.code,
                    error_message=_error_message(exc),
                )
            )
            continue
        groups.append(
            m.DescribeShareGroupOffsetsResponseGroup(
                group_id=group.group_id,
                topics=tuple(_described_topic(t) for t in topics)
                + tuple(_denied_topic(name, parts) for name, parts in denied),
                error_code=ErrorCode.none,
            )
        )
    return m.DescribeShareGroupOffsetsResponse(throttle_time=NO_THROTTLE, groups=tuple(groups))


def _described_topic(
    topic: TopicResult,
) -> resp.describe_share_group_offsets_v1.DescribeShareGroupOffsetsResponseTopic:
    m = resp.describe_share_group_offsets_v1
    partitions = []
    for p in topic.partitions:
        assert isinstance(p, PartitionOffsets)
        partitions.append(
            m.DescribeShareGroupOffsetsResponsePartition(
                partition_index=i32(p.partition),
                start_offset=i64(p.start_offset),
                leader_epoch=i32(p.leader_epoch),
                lag=i64(p.lag),  # v1 (KIP-1226); left out of v0
                error_code=ErrorCode.none,
            )
        )
    return m.DescribeShareGroupOffsetsResponseTopic(
        topic_name=TopicName(topic.name),
        topic_id=topic.topic_id or ZERO_UUID,
        partitions=tuple(partitions),
    )


def _denied_topic(
    name: str, partitions: list[int]
) -> resp.describe_share_group_offsets_v1.DescribeShareGroupOffsetsResponseTopic:
    m = resp.describe_share_group_offsets_v1
    return m.DescribeShareGroupOffsetsResponseTopic(
        topic_name=TopicName(name),
        topic_id=ZERO_UUID,
        partitions=tuple(
            m.DescribeShareGroupOffsetsResponsePartition(
                partition_index=i32(p),
                start_offset=i64(-1),
                leader_epoch=i32(-1),
                lag=i64(-1),
                error_code=ErrorCode.topic_authorization_failed,
                error_message=TOPIC_DENIED,
            )
            for p in partitions
        ),
    )


# -------------------------------------------------------------- AlterShareGroupOffsets


async def alter_share_group_offsets(
    ctx: RequestContext, req: AlterShareGroupOffsetsRequest, broker: ShareAdminBroker
) -> resp.alter_share_group_offsets_v0.AlterShareGroupOffsetsResponse:
    m = resp.alter_share_group_offsets_v0
    az = broker.authorizer
    topics = []
    denied = []
    for t in req.topics:
        entry = (t.topic_name, [(p.partition_index, p.start_offset) for p in t.partitions])
        if az.allows(ctx, AclOperation.READ, ResourceType.TOPIC, t.topic_name):
            topics.append(entry)
        else:
            denied.append(entry)
    try:
        if not az.allows(ctx, AclOperation.READ, ResourceType.GROUP, req.group_id):
            raise KafkaError(ErrorCode.group_authorization_failed, GROUP_DENIED)
        invalid = _invalid_group_id(req.group_id)
        if invalid is not None:
            raise invalid
        results = await broker.groups.alter_offsets(req.group_id, topics)
    except KafkaError as exc:
        log.info("share_offsets_reset_refused", group=req.group_id, error=exc.code.name)
        return m.AlterShareGroupOffsetsResponse(
            throttle_time=NO_THROTTLE,
            error_code=exc.code,
            error_message=_error_message(exc),
            responses=(),
        )
    responses = []
    for topic in results:
        partitions = []
        for p in topic.partitions:
            assert not isinstance(p, PartitionOffsets)
            partitions.append(
                m.AlterShareGroupOffsetsResponsePartition(
                    partition_index=i32(p.partition), error_code=p.error, error_message=p.message
                )
            )
        responses.append(
            m.AlterShareGroupOffsetsResponseTopic(
                topic_name=TopicName(topic.name),
                topic_id=topic.topic_id or ZERO_UUID,
                partitions=tuple(partitions),
            )
        )
    for name, parts in denied:
        responses.append(
            m.AlterShareGroupOffsetsResponseTopic(
                topic_name=TopicName(name),
                topic_id=ZERO_UUID,
                partitions=tuple(
                    m.AlterShareGroupOffsetsResponsePartition(
                        partition_index=i32(p),
                        error_code=ErrorCode.topic_authorization_failed,
                        error_message=TOPIC_DENIED,
                    )
                    for p, _ in parts
                ),
            )
        )
    return m.AlterShareGroupOffsetsResponse(
        throttle_time=NO_THROTTLE, error_code=ErrorCode.none, responses=tuple(responses)
    )


# ------------------------------------------------------------- DeleteShareGroupOffsets


async def delete_share_group_offsets(
    ctx: RequestContext, req: DeleteShareGroupOffsetsRequest, broker: ShareAdminBroker
) -> resp.delete_share_group_offsets_v0.DeleteShareGroupOffsetsResponse:
    m = resp.delete_share_group_offsets_v0
    az = broker.authorizer
    try:
        if not az.allows(ctx, AclOperation.DELETE, ResourceType.GROUP, req.group_id):
            raise KafkaError(ErrorCode.group_authorization_failed, GROUP_DENIED)
        invalid = _invalid_group_id(req.group_id)
        if invalid is not None:
            raise invalid
        names = [t.topic_name for t in req.topics]
        readable = [n for n in names if az.allows(ctx, AclOperation.READ, ResourceType.TOPIC, n)]
        denied = [n for n in names if n not in readable]
        results = await broker.groups.delete_offsets(req.group_id, readable)
    except KafkaError as exc:
        log.info("share_offsets_delete_refused", group=req.group_id, error=exc.code.name)
        return m.DeleteShareGroupOffsetsResponse(
            throttle_time=NO_THROTTLE,
            error_code=exc.code,
            error_message=_error_message(exc),
            responses=(),
        )
    return m.DeleteShareGroupOffsetsResponse(
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        responses=tuple(
            m.DeleteShareGroupOffsetsResponseTopic(
                topic_name=TopicName(name),
                topic_id=ZERO_UUID,
                error_code=ErrorCode.topic_authorization_failed,
                error_message=TOPIC_DENIED,
            )
            for name in denied
        )
        + tuple(
            m.DeleteShareGroupOffsetsResponseTopic(
                topic_name=TopicName(topic.name),
                topic_id=topic.topic_id or ZERO_UUID,
                error_code=topic.error,
                error_message=topic.message,
            )
            for topic in results
        ),
    )


# ------------------------------------------------------------------------ DeleteGroups


async def delete_groups(
    ctx: RequestContext, req: DeleteGroupsRequest, broker: ShareAdminBroker
) -> resp.delete_groups_v2.DeleteGroupsResponse:
    m = resp.delete_groups_v2
    az = broker.authorizer
    names = list(req.groups_names)
    allowed = [g for g in names if az.allows(ctx, AclOperation.DELETE, ResourceType.GROUP, g)]
    results = await broker.groups.delete_groups(allowed) if allowed else []
    denied = [
        (g, KafkaError(ErrorCode.group_authorization_failed))
        for g in dict.fromkeys(names)
        if g not in allowed
    ]
    return m.DeleteGroupsResponse(
        throttle_time=NO_THROTTLE,
        # DeletableGroupResult has no message field: the code is all a client sees.
        results=tuple(
            m.DeletableGroupResult(
                group_id=GroupId(group_id),
                error_code=ErrorCode.none if exc is None else exc.code,
            )
            for group_id, exc in [*results, *denied]
        ),
    )
