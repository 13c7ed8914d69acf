"""ShareGroupHeartbeat, ShareGroupDescribe, ListGroups, ShareFetch, ShareAcknowledge.

ShareFetch and ShareAcknowledge are decoded into `broker.share.fetch`'s requests, answered
by its `ShareFetchService` (share sessions, acknowledgements, the delayed share fetch) and
encoded here; nothing of their logic lives in this module."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from broker.cluster import MetadataStore
from broker.server import RequestContext
from broker.share.fetch import ShareAcknowledgeParams, ShareFetchParams, ShareFetchService
from broker.share.manager import AckBatches
from broker.share.session import TopicIdPartition
from coordinator.group_coordinator import GroupCoordinator
from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from broker.handlers.requests import (
        ListGroupsRequest,
        ShareAcknowledgeRequest,
        ShareFetchRequest,
        ShareGroupDescribeRequest,
        ShareGroupHeartbeatRequest,
    )

log = structlog.get_logger("spool.share")


class ShareBroker(Protocol):
    """What the share-group handlers use of the broker."""

    @property
    def node_id(self) -> int: ...
    @property
    def metadata(self) -> MetadataStore: ...
    @property
    def groups(self) -> GroupCoordinator: ...
    @property
    def share_service(self) -> ShareFetchService: ...


SHARE_GROUP_TYPE = "share"
# Share groups report "share" as their protocol type in ListGroups, as Kafka does.
SHARE_PROTOCOL_TYPE = "share"
AUTHORIZED_OPERATIONS_OMITTED = -(2**31)
ZERO_UUID = uuid.UUID(int=0)


def _leader(node_id: int) -> dict[str, int]:
    return {"leader_id": node_id, "leader_epoch": 0}


async def share_group_heartbeat(
    ctx: RequestContext, req: ShareGroupHeartbeatRequest, broker: ShareBroker
) -> dict[str, Any]:
    try:
        result = await broker.groups.heartbeat(
            req.group_id,
            req.member_id,
            req.member_epoch,
            None if req.subscribed_topic_names is None else list(req.subscribed_topic_names),
            req.rack_id,
            ctx.header.client_id or "",
            ctx.client_host,
        )
    except KafkaError as exc:
        log.info(
            "share_heartbeat_refused",
            group=req.group_id,
            member=req.member_id,
            member_epoch=req.member_epoch,
            error=exc.code.name,
            reason=exc.message,
        )
        return {
            "error_code": exc.code,
            "error_message": exc.message,
            "member_id": req.member_id,
            "member_epoch": -1,
            "heartbeat_interval": 0,
            "assignment": None,
        }
    assignment = None
    if result.assignment is not None:
        assignment = {
            "topic_partitions": [
                {"topic_id": topic_id, "partitions": sorted(parts)}
                for topic_id, parts in sorted(result.assignment.items(), key=lambda i: str(i[0]))
            ]
        }
    return {
        "error_code": ErrorCode.none,
        "member_id": result.member_id,
        "member_epoch": result.member_epoch,
        "heartbeat_interval": result.heartbeat_interval_ms,
        "assignment": assignment,
    }


async def share_group_describe(
    ctx: RequestContext, req: ShareGroupDescribeRequest, broker: ShareBroker
) -> dict[str, Any]:
    names = {t.topic_id: t.name for t in broker.metadata.state.topics.values()}
    groups = []
    for group_id in req.group_ids:
        try:
            d = broker.groups.describe(group_id)
        except KafkaError as exc:
            groups.append(
                {
                    "group_id": group_id,
                    "error_code": exc.code,
                    "error_message": exc.message,
                    "group_state": "Dead",
                    "authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
                }
            )
            continue
        groups.append(
            {
                "error_code": ErrorCode.none,
                "group_id": d.group_id,
                "group_state": d.group_state,
                "group_epoch": d.group_epoch,
                "assignment_epoch": d.assignment_epoch,
                "assignor_name": d.assignor_name,
                "members": [
                    {
                        "member_id": m.member_id,
                        "rack_id": m.rack_id,
                        "member_epoch": m.member_epoch,
                        "client_id": m.client_id,
                        "client_host": m.client_host,
                        "subscribed_topic_names": list(m.subscribed_topic_names),
                        "assignment": {
                            "topic_partitions": [
                                {
                                    "topic_id": tid,
                                    "topic_name": names.get(tid, ""),
                                    "partitions": sorted(parts),
                                }
                                for tid, parts in m.assignment.items()
                            ]
                        },
                    }
                    for m in d.members
                ],
                "authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
            }
        )
    return {"throttle_time": 0, "groups": groups}


async def list_groups(
    ctx: RequestContext, req: ListGroupsRequest, broker: ShareBroker
) -> dict[str, Any]:
    states_filter: tuple[str, ...] = getattr(req, "states_filter", ())  # v4+
    types_filter: tuple[str, ...] = getattr(req, "types_filter", ())  # v5+
    states = {s.lower() for s in states_filter or ()}
    types = {t.lower() for t in types_filter or ()}
    groups = []
    if not types or SHARE_GROUP_TYPE in types:
        for g in broker.groups.list_groups():
            if states and g.state.lower() not in states:
                continue
            groups.append(
                {
                    "group_id": g.group_id,
                    "protocol_type": SHARE_PROTOCOL_TYPE,
                    "group_state": g.state,
                    "group_type": SHARE_GROUP_TYPE,
                }
            )
    return {"throttle_time": 0, "error_code": ErrorCode.none, "groups": groups}


def _topic_id(topic_id: uuid.UUID | None) -> uuid.UUID:
    """kio reads the zero uuid as None; to Kafka it is a topic id naming no topic."""
    return ZERO_UUID if topic_id is None else topic_id


def _acks(req: ShareFetchRequest | ShareAcknowledgeRequest) -> dict[TopicIdPartition, AckBatches]:
    """The request's AcknowledgementBatches per partition (those that carry any)."""
    return {
        (_topic_id(t.topic_id), p.partition_index): [
            (b.first_offset, b.last_offset, tuple(b.acknowledge_types))
            for b in p.acknowledgement_batches
        ]
        for t in req.topics
        for p in t.partitions
        if p.acknowledgement_batches
    }


async def share_fetch(
    ctx: RequestContext, req: ShareFetchRequest, broker: ShareBroker
) -> dict[str, Any]:
    params = ShareFetchParams(
        group_id=req.group_id or "",
        member_id=req.member_id or "",
        member_id_raw=req.member_id,
        epoch=req.share_session_epoch,
        partitions=[
            (_topic_id(t.topic_id), p.partition_index) for t in req.topics for p in t.partitions
        ],
        forgotten=[
            (_topic_id(t.topic_id), p) for t in req.forgotten_topics_data for p in t.partitions
        ],
        acks=_acks(req),
        max_wait_ms=round(req.max_wait.total_seconds() * 1000),
        min_bytes=req.min_bytes,
        max_bytes=req.max_bytes,
        max_records=req.max_records,
        batch_size=req.batch_size,
        acquire_mode=getattr(req, "share_acquire_mode", 0),  # v2+ (KIP-1206)
        renew_only=getattr(req, "is_renew_ack", False),  # v2+ (KIP-1222)
        version=ctx.api_version,
        connection_id=str(ctx.connection_id),
    )
    result = await broker.share_service.share_fetch(params)
    leader = _leader(broker.node_id)
    entries = {
        tp: {
            "partition_index": tp[1],
            "error_code": e.error_code,
            "error_message": e.error_message,
            "acknowledge_error_code": e.acknowledge_error_code,
            "acknowledge_error_message": e.acknowledge_error_message,
            "current_leader": leader,
            "records": e.records,
            "acquired_records": [
                {
                    "first_offset": r.first_offset,
                    "last_offset": r.last_offset,
                    "delivery_count": r.delivery_count,
                }
                for r in e.acquired
            ],
        }
        for tp, e in result.partitions.items()
    }
    return {
        "throttle_time": 0,
        "acquisition_lock_timeout": result.acquisition_lock_timeout_ms,
        "error_code": result.error_code,
        "error_message": result.error_message,
        "responses": _group(entries),
    }


async def share_acknowledge(
    ctx: RequestContext, req: ShareAcknowledgeRequest, broker: ShareBroker
) -> dict[str, Any]:
    params = ShareAcknowledgeParams(
        group_id=req.group_id or "",
        member_id=req.member_id or "",
        member_id_raw=req.member_id,
        epoch=req.share_session_epoch,
        acks=_acks(req),
        renew=getattr(req, "is_renew_ack", False),  # v2+
        version=ctx.api_version,
    )
    result = await broker.share_service.share_acknowledge(params)
    leader = _leader(broker.node_id)
    entries = {
        tp: {
            "partition_index": tp[1],
            "error_code": code,
            "error_message": message,
            "current_leader": leader,
        }
        for tp, (code, message) in result.partitions.items()
    }
    return {
        "throttle_time": 0,
        "acquisition_lock_timeout": result.acquisition_lock_timeout_ms,
        "error_code": result.error_code,
        "error_message": result.error_message,
        "responses": _group(entries),
    }


def _group(entries: dict[tuple[uuid.UUID, int], dict[str, Any]]) -> list[dict[str, Any]]:
    by_topic: dict[uuid.UUID, list[dict[str, Any]]] = {}
    for (tid, _), e in sorted(entries.items(), key=lambda i: (str(i[0][0]), i[0][1])):
        by_topic.setdefault(tid, []).append(e)
    return [{"topic_id": tid, "partitions": parts} for tid, parts in by_topic.items()]
