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
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from broker.logs import Partition
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


def _error_fields(exc: KafkaError) -> dict[str, Any]:
    return {"error_code": exc.code, "error_message": exc.message or exc.code.name}


# ------------------------------------------------------------ DescribeShareGroupOffsets


async def describe_share_group_offsets(
    ctx: RequestContext, req: DescribeShareGroupOffsetsRequest, broker: ShareAdminBroker
) -> dict[str, Any]:
    def end_offset(topic_id: uuid.UUID, partition: int) -> int | None:
        # Lag counts to the high watermark: what a consumer could be handed.
        log_part = broker.log_partition(topic_id, partition)
        return None if log_part is None else log_part.high_watermark

    groups = []
    for group in req.groups:
        entry: dict[str, Any] = {"group_id": group.group_id, "error_code": ErrorCode.none}
        if group.topics is not None and not group.topics:
            # Kafka: an empty topic list (not null) answers the group with no topics.
            groups.append({**entry, "topics": []})
            continue
        wanted = (
            None
            if group.topics is None
            else [(t.topic_name, list(t.partitions)) for t in group.topics]
        )
        try:
            topics = await broker.groups.describe_offsets(group.group_id, wanted, end_offset)
        except KafkaError as exc:
            groups.append({**entry, **_error_fields(exc), "topics": []})
            continue
        groups.append({**entry, "topics": [_described_topic(t) for t in topics]})
    return {"throttle_time": 0, "groups": groups}


def _described_topic(topic: TopicResult) -> dict[str, Any]:
    partitions = []
    for p in topic.partitions:
        assert isinstance(p, PartitionOffsets)
        partitions.append(
            {
                "partition_index": p.partition,
                "start_offset": p.start_offset,
                "leader_epoch": p.leader_epoch,
                "lag": p.lag,  # v1 (KIP-1226); left out of v0
                "error_code": ErrorCode.none,
            }
        )
    return {
        "topic_name": topic.name,
        "topic_id": topic.topic_id or ZERO_UUID,
        "partitions": partitions,
    }


# -------------------------------------------------------------- AlterShareGroupOffsets


async def alter_share_group_offsets(
    ctx: RequestContext, req: AlterShareGroupOffsetsRequest, broker: ShareAdminBroker
) -> dict[str, Any]:
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
        return {"throttle_time": 0, **_error_fields(exc), "responses": []}
    responses = []
    for topic in results:
        partitions = []
        for p in topic.partitions:
            assert not isinstance(p, PartitionOffsets)
            partitions.append(
                {"partition_index": p.partition, "error_code": p.error, "error_message": p.message}
            )
        responses.append(
            {
                "topic_name": topic.name,
                "topic_id": topic.topic_id or ZERO_UUID,
                "partitions": partitions,
            }
        )
    return {"throttle_time": 0, "error_code": ErrorCode.none, "responses": responses}


# ------------------------------------------------------------- DeleteShareGroupOffsets


async def delete_share_group_offsets(
    ctx: RequestContext, req: DeleteShareGroupOffsetsRequest, broker: ShareAdminBroker
) -> dict[str, Any]:
    try:
        invalid = _invalid_group_id(req.group_id)
        if invalid is not None:
            raise invalid
        results = await broker.groups.delete_offsets(
            req.group_id, [t.topic_name for t in req.topics]
        )
    except KafkaError as exc:
        log.info("share_offsets_delete_refused", group=req.group_id, error=exc.code.name)
        return {"throttle_time": 0, **_error_fields(exc), "responses": []}
    responses = [
        {
            "topic_name": topic.name,
            "topic_id": topic.topic_id or ZERO_UUID,
            "error_code": topic.error,
            "error_message": topic.message,
        }
        for topic in results
    ]
    return {"throttle_time": 0, "error_code": ErrorCode.none, "responses": responses}


# ------------------------------------------------------------------------ DeleteGroups


async def delete_groups(
    ctx: RequestContext, req: DeleteGroupsRequest, broker: ShareAdminBroker
) -> dict[str, Any]:
    results = await broker.groups.delete_groups(list(req.groups_names))
    return {
        "throttle_time": 0,
        # DeletableGroupResult has no message field: the code is all a client sees.
        "results": [
            {"group_id": group_id, "error_code": ErrorCode.none if exc is None else exc.code}
            for group_id, exc in results
        ],
    }
