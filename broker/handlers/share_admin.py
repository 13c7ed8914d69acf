"""Share-group administration on the wire (KIP-932): DeleteGroups (42),
DescribeShareGroupOffsets (90), AlterShareGroupOffsets (91), DeleteShareGroupOffsets (92).

The rules live in `GroupCoordinator` (describe_offsets, alter_offsets, delete_offsets,
delete_groups); these handlers shape its answers as Kafka 4.2's KafkaApis does:
a whole-request failure of Alter/DeleteShareGroupOffsets fills only the top-level
ErrorCode and ErrorMessage and no topics (KafkaApis answers `getErrorResponse`, which
drops the per-partition echo GroupCoordinatorService built), DescribeShareGroupOffsets
errors are per group, DeleteGroups results per group.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Protocol

import structlog
from kio.schema.types import GroupId, TopicName
from kio.static.primitive import i32, i64

from broker.handlers import responses as resp
from broker.handlers.responses import NO_THROTTLE
from broker.partitions import Partition
from broker.server import RequestContext
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


class ShareAdminBroker(Protocol):
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

    groups = []
    for group in req.groups:
        if group.topics is not None and not group.topics:
            # Kafka: an empty topic list (not null) answers the group with no topics.
            groups.append(
                m.DescribeShareGroupOffsetsResponseGroup(
                    group_id=group.group_id, topics=(), error_code=ErrorCode.none
                )
            )
            continue
        wanted = (
            None
            if group.topics is None
            else [(t.topic_name, list(t.partitions)) for t in group.topics]
        )
        try:
            topics = await broker.groups.describe_offsets(group.group_id, wanted, end_offset)
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
                topics=tuple(_described_topic(t) for t in topics),
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


# -------------------------------------------------------------- AlterShareGroupOffsets


async def alter_share_group_offsets(
    ctx: RequestContext, req: AlterShareGroupOffsetsRequest, broker: ShareAdminBroker
) -> resp.alter_share_group_offsets_v0.AlterShareGroupOffsetsResponse:
    m = resp.alter_share_group_offsets_v0
    topics = [
        (t.topic_name, [(p.partition_index, p.start_offset) for p in t.partitions])
        for t in req.topics
    ]
    try:
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
    return m.AlterShareGroupOffsetsResponse(
        throttle_time=NO_THROTTLE, error_code=ErrorCode.none, responses=tuple(responses)
    )


# ------------------------------------------------------------- DeleteShareGroupOffsets


async def delete_share_group_offsets(
    ctx: RequestContext, req: DeleteShareGroupOffsetsRequest, broker: ShareAdminBroker
) -> resp.delete_share_group_offsets_v0.DeleteShareGroupOffsetsResponse:
    m = resp.delete_share_group_offsets_v0
    try:
        invalid = _invalid_group_id(req.group_id)
        if invalid is not None:
            raise invalid
        results = await broker.groups.delete_offsets(
            req.group_id, [t.topic_name for t in req.topics]
        )
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
    results = await broker.groups.delete_groups(list(req.groups_names))
    return m.DeleteGroupsResponse(
        throttle_time=NO_THROTTLE,
        # DeletableGroupResult has no message field: the code is all a client sees.
        results=tuple(
            m.DeletableGroupResult(
                group_id=GroupId(group_id),
                error_code=ErrorCode.none if exc is None else exc.code,
            )
            for group_id, exc in results
        ),
    )
