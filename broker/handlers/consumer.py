"""ConsumerGroupHeartbeat (68) and ConsumerGroupDescribe (69): KIP-848 consumer groups.

The rules live in `coordinator.consumer_group` (sans-IO) and its shell
`coordinator.consumer_group_ops`; this module checks access, converts the kio request
into a `ConsumerHeartbeat` and the outcome into a typed response of the newest version
(`broker.handlers.responses`), which `protocol.api.at_version` converts to the
request's version.

Authorization as Kafka 4.2's KafkaApis: ConsumerGroupHeartbeat needs READ on the group
and DESCRIBE on every subscribed topic name (else TOPIC_AUTHORIZATION_FAILED for the
request); ConsumerGroupDescribe needs DESCRIBE per group, and a group assigned a topic
the principal may not DESCRIBE is answered TOPIC_AUTHORIZATION_FAILED. An error is
answered with MemberEpoch -1 and no assignment, as Kafka's do.
"""

from __future__ import annotations

import datetime
import uuid
from typing import TYPE_CHECKING, Protocol

import structlog
from kio.schema.types import GroupId, TopicName
from kio.static.primitive import i8, i32, i32Timedelta

from broker.cluster import ClusterView
from broker.handlers import responses as resp
from broker.handlers.access import (
    GROUP_DENIED,
    UNDESCRIBABLE_TOPICS,
    Guarded,
    authorized_operations,
    hides_a_topic,
)
from broker.handlers.responses import NO_THROTTLE
from broker.server import RequestContext
from coordinator.acls import AclOperation, ResourceType
from coordinator.consumer_group import AssignmentDict, ConsumerHeartbeat
from coordinator.consumer_group_ops import Describable
from coordinator.group_coordinator import GroupCoordinator
from coordinator.metadata import MetadataStore
from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from broker.handlers.requests import (
        ConsumerGroupDescribeRequest,
        ConsumerGroupHeartbeatRequest,
    )

log = structlog.get_logger("spool.groups")

AUTHORIZED_OPERATIONS_OMITTED = i32(-(2**31))
# ConsumerGroupDescribe v1's MemberType: 1 for a member using the consumer protocol.
CONSUMER_MEMBER_TYPE = i8(1)


class ConsumerBroker(Guarded, Protocol):
    """What the consumer-group handlers use of the broker."""

    @property
    def metadata(self) -> MetadataStore: ...
    @property
    def groups(self) -> GroupCoordinator: ...
    @property
    def cluster(self) -> ClusterView: ...


def _ms(ms: int) -> i32Timedelta:
    return i32Timedelta.parse(datetime.timedelta(milliseconds=ms))


def _by_id(assignment: AssignmentDict) -> list[tuple[uuid.UUID, list[i32]]]:
    return [
        (tid, [i32(p) for p in sorted(parts)])
        for tid, parts in sorted(assignment.items(), key=lambda i: str(i[0]))
    ]


async def consumer_group_heartbeat(
    ctx: RequestContext, req: ConsumerGroupHeartbeatRequest, broker: ConsumerBroker
) -> resp.consumer_group_heartbeat_v1.ConsumerGroupHeartbeatResponse:
    m = resp.consumer_group_heartbeat_v1
    az = broker.authorizer
    try:
        if not az.allows(ctx, AclOperation.READ, ResourceType.GROUP, req.group_id):
            raise KafkaError(ErrorCode.group_authorization_failed, GROUP_DENIED)
        subscribed = sorted(set(req.subscribed_topic_names or ()))
        if len(
            az.filter(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, subscribed, log_denied=True)
        ) < len(subscribed):
            raise KafkaError(ErrorCode.topic_authorization_failed)
        owned: AssignmentDict | None = None
        if req.topic_partitions is not None:
            owned = {}
            for tp in req.topic_partitions:
                if tp.topic_id is not None and tp.partitions:
                    owned[tp.topic_id] = owned.get(tp.topic_id, frozenset()) | frozenset(
                        tp.partitions
                    )
        request = ConsumerHeartbeat(
            member_id=req.member_id,
            member_epoch=req.member_epoch,
            instance_id=req.instance_id,
            rack_id=req.rack_id,
            rebalance_timeout_ms=req.rebalance_timeout // datetime.timedelta(milliseconds=1),
            subscribed_topic_names=None
            if req.subscribed_topic_names is None
            else frozenset(req.subscribed_topic_names),
            subscribed_topic_regex=getattr(req, "subscribed_topic_regex", None),  # v1+
            server_assignor=req.server_assignor,
            owned=owned,
            client_id=ctx.header.client_id or "",
            client_host=ctx.client_host,
        )
        describable: Describable | None = None
        if az.enabled:
            # A regex resolves to the topics this member may DESCRIBE (Kafka 4.2).
            def describable(names: list[str]) -> list[str]:
                return az.filter(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, names)

        result = await broker.groups.consumer.heartbeat(
            req.group_id, request, int(req.__version__), describable
        )
    except KafkaError as exc:
        log.info(
            "consumer_heartbeat_refused",
            group=req.group_id,
            member=req.member_id,
            member_epoch=req.member_epoch,
            error=exc.code.name,
            reason=exc.message,
        )
        return m.ConsumerGroupHeartbeatResponse(
            throttle_time=NO_THROTTLE,
            error_code=exc.code,
            error_message=exc.message,
            member_id=req.member_id or None,
            member_epoch=i32(-1),
            heartbeat_interval=_ms(0),
            assignment=None,
        )
    assignment = None
    if result.assignment is not None:
        assignment = m.Assignment(
            topic_partitions=tuple(
                m.TopicPartitions(topic_id=tid, partitions=tuple(parts))
                for tid, parts in _by_id(result.assignment)
            )
        )
    return m.ConsumerGroupHeartbeatResponse(
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        member_id=result.member_id,
        member_epoch=i32(result.member_epoch),
        heartbeat_interval=_ms(
            broker.groups.consumer.group_config(req.group_id).heartbeat_interval_ms
        ),
        assignment=assignment,
    )


async def consumer_group_describe(
    ctx: RequestContext, req: ConsumerGroupDescribeRequest, broker: ConsumerBroker
) -> resp.consumer_group_describe_v1.ConsumerGroupDescribeResponse:
    m = resp.consumer_group_describe_v1
    az = broker.authorizer
    names = {t.topic_id: t.name for t in broker.metadata.state.topics.values()}

    def failed(
        group_id: GroupId, code: ErrorCode, message: str | None, state: str
    ) -> resp.consumer_group_describe_v1.DescribedGroup:
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

    def assignment(parts: AssignmentDict) -> resp.consumer_group_describe_v1.Assignment:
        return m.Assignment(
            topic_partitions=tuple(
                m.TopicPartitions(
                    topic_id=tid, topic_name=TopicName(names.get(tid, "")), partitions=tuple(ps)
                )
                for tid, ps in _by_id(parts)
            )
        )

    groups = []
    for group_id in req.group_ids:
        try:
            if not az.allows(ctx, AclOperation.DESCRIBE, ResourceType.GROUP, group_id):
                raise KafkaError(ErrorCode.group_authorization_failed)
            d = broker.groups.consumer.describe(group_id)
        except KafkaError as exc:
            groups.append(failed(group_id, exc.code, exc.message, "Dead"))
            continue
        assigned = sorted(
            {
                names.get(tid, "")
                for member in d.members
                for tid in (*member.assignment, *member.target_assignment)
            }
        )
        if hides_a_topic(az, ctx, assigned):
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
                        instance_id=member.instance_id,
                        rack_id=member.rack_id,
                        member_epoch=i32(member.member_epoch),
                        client_id=member.client_id,
                        client_host=member.client_host,
                        subscribed_topic_names=tuple(
                            TopicName(t) for t in member.subscribed_topic_names
                        ),
                        subscribed_topic_regex=member.subscribed_topic_regex,
                        assignment=assignment(member.assignment),
                        target_assignment=assignment(member.target_assignment),
                        member_type=CONSUMER_MEMBER_TYPE,
                    )
                    for member in d.members
                ),
                authorized_operations=operations,
            )
        )
    return m.ConsumerGroupDescribeResponse(throttle_time=NO_THROTTLE, groups=tuple(groups))
