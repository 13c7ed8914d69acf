"""ShareGroupHeartbeat, ShareGroupDescribe, ListGroups, ShareFetch, ShareAcknowledge.

ShareFetch and ShareAcknowledge are decoded into `broker.share.fetch`'s requests, answered
by its `ShareFetchService` (share sessions, acknowledgements, the delayed share fetch) and
encoded here; nothing of their logic lives in this module. Every answer is a typed kio
response entity of the newest version spool serves (`broker.handlers.responses`), which
`protocol.api.at_version` converts to the request's version.

Authorization as Kafka 4.2's KafkaApis: ShareGroupHeartbeat needs READ on the group and
DESCRIBE on every subscribed topic (else TOPIC_AUTHORIZATION_FAILED for the request);
ShareGroupDescribe DESCRIBE per group, and a group assigned a topic the principal may
not DESCRIBE is answered TOPIC_AUTHORIZATION_FAILED; ListGroups lists every group with
DESCRIBE on the cluster, else the groups it may DESCRIBE; ShareFetch and
ShareAcknowledge READ on the group (the whole request) and READ on each topic (its
partitions answered TOPIC_AUTHORIZATION_FAILED)."""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol, TypeVar

import structlog
from kio.schema.types import GroupId, TopicName
from kio.static.primitive import Records, i16, i32, i32Timedelta, i64

from broker.cluster import ClusterView
from broker.handlers import responses as resp
from broker.handlers.access import (
    GROUP_DENIED,
    UNDESCRIBABLE_TOPICS,
    Guarded,
    authorized_operations,
    hides_a_topic,
)
from broker.handlers.leaders import MOVED, CurrentLeaders
from broker.handlers.responses import NO_THROTTLE
from broker.server import RequestContext
from broker.share.delayed_fetch import FetchEntry
from broker.share.fetch import (
    ShareAcknowledgeParams,
    ShareFetchParams,
    ShareFetchService,
)
from broker.share.manager import AckBatches, AckOutcome
from broker.share.session import TopicIdPartition
from coordinator.acls import AclOperation, ResourceType
from coordinator.group_coordinator import GroupCoordinator
from coordinator.metadata import MetadataStore
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


class ShareBroker(Guarded, Protocol):
    """What the share-group handlers use of the broker."""

    @property
    def node_id(self) -> int: ...
    @property
    def metadata(self) -> MetadataStore: ...
    @property
    def groups(self) -> GroupCoordinator: ...
    @property
    def share_service(self) -> ShareFetchService: ...
    @property
    def cluster(self) -> ClusterView: ...


SHARE_GROUP_TYPE = "share"
# Share groups report "share" as their protocol type in ListGroups, as Kafka does.
SHARE_PROTOCOL_TYPE = "share"
AUTHORIZED_OPERATIONS_OMITTED = i32(-(2**31))
ZERO_UUID = uuid.UUID(int=0)


T = TypeVar("T")


def _ms(ms: int) -> i32Timedelta:
    return i32Timedelta.parse(datetime.timedelta(milliseconds=ms))


async def share_group_heartbeat(
    ctx: RequestContext, req: ShareGroupHeartbeatRequest, broker: ShareBroker
) -> resp.share_group_heartbeat_v1.ShareGroupHeartbeatResponse:
    m = resp.share_group_heartbeat_v1
    az = broker.authorizer
    try:
        if not az.allows(ctx, AclOperation.READ, ResourceType.GROUP, req.group_id):
            raise KafkaError(ErrorCode.group_authorization_failed, GROUP_DENIED)
        # The subscription may name only topics the member may see.
        subscribed = sorted(set(req.subscribed_topic_names or ()))
        if len(
            az.filter(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, subscribed, log_denied=True)
        ) < len(subscribed):
            raise KafkaError(ErrorCode.topic_authorization_failed)
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
        return m.ShareGroupHeartbeatResponse(
            throttle_time=NO_THROTTLE,
            error_code=exc.code,
            error_message=exc.message,
            member_id=req.member_id,
            member_epoch=i32(-1),
            heartbeat_interval=_ms(0),
            assignment=None,
        )
    assignment = None
    if result.assignment is not None:
        assignment = m.Assignment(
            topic_partitions=tuple(
                m.TopicPartitions(
                    topic_id=topic_id, partitions=tuple(i32(p) for p in sorted(parts))
                )
                for topic_id, parts in sorted(result.assignment.items(), key=lambda i: str(i[0]))
            )
        )
    return m.ShareGroupHeartbeatResponse(
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        member_id=result.member_id,
        member_epoch=i32(result.member_epoch),
        heartbeat_interval=_ms(result.heartbeat_interval_ms),
        assignment=assignment,
    )


async def share_group_describe(
    ctx: RequestContext, req: ShareGroupDescribeRequest, broker: ShareBroker
) -> resp.share_group_describe_v1.ShareGroupDescribeResponse:
    m = resp.share_group_describe_v1
    az = broker.authorizer
    names = {t.topic_id: t.name for t in broker.metadata.state.topics.values()}

    def failed(
        group_id: GroupId, code: ErrorCode, message: str | None, state: str
    ) -> resp.share_group_describe_v1.DescribedGroup:
        return m.DescribedGroup(
            error_code=code,
            error_message=message,
            group_id=group_id,
            group_state=state,
            group_epoch=i32(0),
            assignment_epoch=i32(0),
            assignor_name="",
            members=(),
            authorized_operations=AUTHORIZED_OPERATIONS_OMITTED,
        )

    groups = []
    for group_id in req.group_ids:
        try:
            if not az.allows(ctx, AclOperation.DESCRIBE, ResourceType.GROUP, group_id):
                raise KafkaError(ErrorCode.group_authorization_failed)
            d = broker.groups.describe(group_id)
        except KafkaError as exc:
            groups.append(failed(group_id, exc.code, exc.message, "Dead"))
            continue
        assigned = sorted({names.get(tid, "") for member in d.members for tid in member.assignment})
        if hides_a_topic(az, ctx, assigned):
            # Kafka answers the whole group so: its members would show the topics.
            groups.append(
                failed(group_id, ErrorCode.topic_authorization_failed, UNDESCRIBABLE_TOPICS, "")
            )
            continue
        operations = AUTHORIZED_OPERATIONS_OMITTED
        if req.include_authorized_operations:
            operations = i32(authorized_operations(az, ctx, ResourceType.GROUP, d.group_id))
        groups.append(
            m.DescribedGroup(
                error_code=ErrorCode.none,
                group_id=GroupId(d.group_id),
                group_state=d.group_state,
                group_epoch=i32(d.group_epoch),
                assignment_epoch=i32(d.assignment_epoch),
                assignor_name=d.assignor_name,
                members=tuple(
                    m.Member(
                        member_id=member.member_id,
                        rack_id=member.rack_id,
                        member_epoch=i32(member.member_epoch),
                        client_id=member.client_id,
                        client_host=member.client_host,
                        subscribed_topic_names=tuple(
                            TopicName(t) for t in member.subscribed_topic_names
                        ),
                        assignment=m.Assignment(
                            topic_partitions=tuple(
                                m.TopicPartitions(
                                    topic_id=tid,
                                    topic_name=TopicName(names.get(tid, "")),
                                    partitions=tuple(i32(p) for p in sorted(parts)),
                                )
                                for tid, parts in member.assignment.items()
                            )
                        ),
                    )
                    for member in d.members
                ),
                authorized_operations=operations,
            )
        )
    return m.ShareGroupDescribeResponse(throttle_time=NO_THROTTLE, groups=tuple(groups))


async def list_groups(
    ctx: RequestContext, req: ListGroupsRequest, broker: ShareBroker
) -> resp.list_groups_v5.ListGroupsResponse:
    m = resp.list_groups_v5
    states_filter: tuple[str, ...] = getattr(req, "states_filter", ())  # v4+
    types_filter: tuple[str, ...] = getattr(req, "types_filter", ())  # v5+
    states = {s.lower() for s in states_filter or ()}
    types = {t.lower() for t in types_filter or ()}
    if broker.groups.runtime.loading:
        # Kafka's GroupCoordinatorService.listGroups: a groups log being loaded fails the
        # listing, which the admin client retries; one not led here lists nothing.
        return m.ListGroupsResponse(
            throttle_time=NO_THROTTLE, error_code=ErrorCode.coordinator_load_in_progress, groups=()
        )
    groups = []
    az = broker.authorizer
    # DESCRIBE on the cluster lists every group (Kafka keeps it for compatibility);
    # otherwise the groups the principal may DESCRIBE. Denials are not logged.
    every_group = az.allows(ctx, AclOperation.DESCRIBE, ResourceType.CLUSTER, log_denied=False)
    # Every type of the one group-id namespace (share, classic, ...), as Kafka 4.2 lists
    # them: the type filter and the state filter match lower-cased.
    for g in broker.groups.list_groups():
        if types and g.group_type.lower() not in types:
            continue
        if states and g.state.lower() not in states:
            continue
        if not every_group and not az.allows(
            ctx, AclOperation.DESCRIBE, ResourceType.GROUP, g.group_id, log_denied=False
        ):
            continue
        groups.append(
            m.ListedGroup(
                group_id=GroupId(g.group_id),
                protocol_type=g.protocol_type,
                group_state=g.state,
                group_type=g.group_type,
            )
        )
    return m.ListGroupsResponse(
        throttle_time=NO_THROTTLE, error_code=ErrorCode.none, groups=tuple(groups)
    )


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


def _by_topic(entries: Iterable[tuple[TopicIdPartition, T]]) -> list[tuple[uuid.UUID, list[T]]]:
    """Partition entries grouped per topic, in (topic id, partition) order."""
    by_topic: dict[uuid.UUID, list[T]] = {}
    for (tid, _), e in sorted(entries, key=lambda i: (str(i[0][0]), i[0][1])):
        by_topic.setdefault(tid, []).append(e)
    return list(by_topic.items())


def _readable(ctx: RequestContext, broker: ShareBroker) -> Callable[[uuid.UUID], bool]:
    """Whether the requester may READ a topic, by id: decided once per topic and request
    (one denial logged), an unknown id left to the UNKNOWN_TOPIC_ID answer."""
    decided: dict[uuid.UUID, bool] = {}
    topics = broker.metadata.state.topics_by_id

    def readable(topic_id: uuid.UUID) -> bool:
        if topic_id not in decided:
            topic = topics.get(topic_id)
            decided[topic_id] = topic is None or broker.authorizer.allows(
                ctx, AclOperation.READ, ResourceType.TOPIC, topic.name
            )
        return decided[topic_id]

    return readable


def _leads(broker: ShareBroker) -> Callable[[uuid.UUID, int], bool]:
    """Whether this broker leads a partition, and so its share partition (the partition
    leader is the share-partition leader, as in Kafka). An unknown topic is left to the
    UNKNOWN_TOPIC_ID answer."""
    cluster = broker.cluster
    topics = broker.metadata.state.topics_by_id

    def leads(topic_id: uuid.UUID, partition: int) -> bool:
        topic = topics.get(topic_id)
        if topic is None or not 0 <= partition < topic.partitions:
            return True
        return cluster.is_local(cluster.leader(topic_id, partition))

    return leads


def _current_leader(
    leaders: CurrentLeaders, tp: TopicIdPartition, code: ErrorCode
) -> tuple[int, int]:
    """A partition's CurrentLeader: for NOT_LEADER_OR_FOLLOWER and FENCED_LEADER_EPOCH
    the partition's leader, its endpoint listed in NodeEndpoints (KIP-951, as Kafka's
    KafkaApis fills them); otherwise this broker when it leads it."""
    return leaders.current(tp[0], tp[1], code) if code in MOVED else leaders.local(*tp)


async def share_fetch(
    ctx: RequestContext, req: ShareFetchRequest, broker: ShareBroker
) -> resp.share_fetch_v2.ShareFetchResponse:
    m = resp.share_fetch_v2
    if not broker.authorizer.allows(ctx, AclOperation.READ, ResourceType.GROUP, req.group_id or ""):
        return m.ShareFetchResponse(
            throttle_time=NO_THROTTLE,
            error_code=ErrorCode.group_authorization_failed,
            error_message=GROUP_DENIED,
            acquisition_lock_timeout=_ms(0),
            responses=(),
            node_endpoints=(),
        )
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
        readable=_readable(ctx, broker),
        leads=_leads(broker),
    )
    result = await broker.share_service.share_fetch(params)
    leaders = CurrentLeaders(broker.cluster, ctx.listener)

    def partition(tp: TopicIdPartition, e: FetchEntry) -> resp.share_fetch_v2.PartitionData:
        leader_id, epoch = _current_leader(leaders, tp, e.error_code)
        return m.PartitionData(
            partition_index=i32(tp[1]),
            error_code=e.error_code,
            error_message=e.error_message,
            acknowledge_error_code=i16(e.acknowledge_error_code),
            acknowledge_error_message=e.acknowledge_error_message,
            current_leader=m.LeaderIdAndEpoch(leader_id=i32(leader_id), leader_epoch=i32(epoch)),
            records=Records(e.records),
            acquired_records=tuple(
                m.AcquiredRecords(
                    first_offset=i64(r.first_offset),
                    last_offset=i64(r.last_offset),
                    delivery_count=i16(r.delivery_count),
                )
                for r in e.acquired
            ),
        )

    responses = tuple(
        m.ShareFetchableTopicResponse(topic_id=tid, partitions=tuple(parts))
        for tid, parts in _by_topic((tp, partition(tp, e)) for tp, e in result.partitions.items())
    )
    return m.ShareFetchResponse(
        throttle_time=NO_THROTTLE,
        error_code=result.error_code,
        error_message=result.error_message,
        acquisition_lock_timeout=_ms(result.acquisition_lock_timeout_ms),
        responses=responses,
        node_endpoints=leaders.endpoints(m.NodeEndpoint),
    )


async def share_acknowledge(
    ctx: RequestContext, req: ShareAcknowledgeRequest, broker: ShareBroker
) -> resp.share_acknowledge_v2.ShareAcknowledgeResponse:
    m = resp.share_acknowledge_v2
    if not broker.authorizer.allows(ctx, AclOperation.READ, ResourceType.GROUP, req.group_id or ""):
        return m.ShareAcknowledgeResponse(
            throttle_time=NO_THROTTLE,
            error_code=ErrorCode.group_authorization_failed,
            error_message=GROUP_DENIED,
            acquisition_lock_timeout=_ms(0),
            responses=(),
            node_endpoints=(),
        )
    params = ShareAcknowledgeParams(
        group_id=req.group_id or "",
        member_id=req.member_id or "",
        member_id_raw=req.member_id,
        epoch=req.share_session_epoch,
        acks=_acks(req),
        renew=getattr(req, "is_renew_ack", False),  # v2+
        version=ctx.api_version,
        readable=_readable(ctx, broker),
        leads=_leads(broker),
    )
    result = await broker.share_service.share_acknowledge(params)
    leaders = CurrentLeaders(broker.cluster, ctx.listener)

    def partition(
        tp: TopicIdPartition, outcome: AckOutcome
    ) -> resp.share_acknowledge_v2.PartitionData:
        code, message = outcome
        leader_id, epoch = _current_leader(leaders, tp, code)
        return m.PartitionData(
            partition_index=i32(tp[1]),
            error_code=code,
            error_message=message,
            current_leader=m.LeaderIdAndEpoch(leader_id=i32(leader_id), leader_epoch=i32(epoch)),
        )

    responses = tuple(
        m.ShareAcknowledgeTopicResponse(topic_id=tid, partitions=tuple(parts))
        for tid, parts in _by_topic(
            (tp, partition(tp, outcome)) for tp, outcome in result.partitions.items()
        )
    )
    return m.ShareAcknowledgeResponse(
        throttle_time=NO_THROTTLE,
        error_code=result.error_code,
        error_message=result.error_message,
        acquisition_lock_timeout=_ms(result.acquisition_lock_timeout_ms),
        responses=responses,
        node_endpoints=leaders.endpoints(m.NodeEndpoint),
    )
