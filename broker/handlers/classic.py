"""Classic consumer groups on the wire: JoinGroup (11), Heartbeat (12), LeaveGroup (13),
SyncGroup (14), DescribeGroups (15).

The rules live in `coordinator.classic_group_ops` (the group coordinator's `classic`);
these handlers decode the request, await the answer (a parked JoinGroup or SyncGroup
waits here, outside the group's operation) and shape it as Kafka 4.2's KafkaApis does.
JoinGroup v0 has no rebalance timeout: the session timeout is used. JoinGroup answers
before v7 carry a protocol name that may not be null (Kafka sends ""). LeaveGroup v0-2
names one member; v3+ a batch with per-member errors.

Authorization as Kafka 4.2's KafkaApis: READ on the group for JoinGroup, SyncGroup,
Heartbeat and LeaveGroup (GROUP_AUTHORIZATION_FAILED for the request); DESCRIBE on each
group for DescribeGroups (GROUP_AUTHORIZATION_FAILED for that group).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import structlog
from kio.schema.types import GroupId
from kio.static.primitive import i32

from broker.handlers import responses as resp
from broker.handlers.access import GROUP_DENIED, Guarded, authorized_operations
from broker.handlers.responses import NO_THROTTLE
from broker.server import RequestContext
from coordinator.acls import AclOperation, ResourceType
from coordinator.classic_group import DescribedGroup
from coordinator.classic_group_ops import JoinRequest, LeavingMember, SyncRequest
from coordinator.group_coordinator import GroupCoordinator
from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from broker.handlers.requests import (
        DescribeGroupsRequest,
        HeartbeatRequest,
        JoinGroupRequest,
        LeaveGroupRequest,
        SyncGroupRequest,
    )

log = structlog.get_logger("spool.groups")

AUTHORIZED_OPERATIONS_OMITTED = i32(-(2**31))
# JoinGroup answers carry a nullable protocol name from v7.
NULLABLE_PROTOCOL_NAME_VERSION = 7
# LeaveGroup names a batch of members from v3.
BATCH_LEAVE_VERSION = 3
# JoinGroup answers every client gets in a normal join: not worth a log line.
_ROUTINE_JOIN_ERRORS = frozenset(
    {ErrorCode.none, ErrorCode.member_id_required, ErrorCode.rebalance_in_progress}
)


class ClassicBroker(Guarded, Protocol):
    """What the classic-group handlers use of the broker."""

    @property
    def groups(self) -> GroupCoordinator: ...


def _ms(value: object) -> int:
    seconds = getattr(value, "total_seconds", None)
    return round(seconds() * 1000) if seconds is not None else int(str(value))


def _allowed(ctx: RequestContext, broker: ClassicBroker, group_id: str) -> bool:
    return broker.authorizer.allows(ctx, AclOperation.READ, ResourceType.GROUP, group_id)


async def join_group(
    ctx: RequestContext, req: JoinGroupRequest, broker: ClassicBroker
) -> resp.join_group_v9.JoinGroupResponse:
    m = resp.join_group_v9
    version = ctx.api_version
    session_ms = _ms(req.session_timeout)
    rebalance = getattr(req, "rebalance_timeout", None)  # v1+
    rebalance_ms = session_ms if version < 1 or rebalance is None else _ms(rebalance)
    if not _allowed(ctx, broker, req.group_id):
        result_error, member_id = ErrorCode.group_authorization_failed, req.member_id
        result = None
    else:
        result = await broker.groups.classic.join(
            JoinRequest(
                group_id=req.group_id,
                member_id=req.member_id,
                group_instance_id=getattr(req, "group_instance_id", None),
                protocol_type=req.protocol_type,
                protocols=tuple((p.name, p.metadata) for p in req.protocols),
                session_timeout_ms=session_ms,
                rebalance_timeout_ms=rebalance_ms,
                client_id=ctx.header.client_id or "",
                client_host=ctx.client_host,
                api_version=version,
                reason=getattr(req, "reason", None),
            )
        )
        result_error, member_id = result.error, result.member_id
    if result_error not in _ROUTINE_JOIN_ERRORS:
        log.info(
            "join_group_answered",
            group=req.group_id,
            member=req.member_id,
            error=result_error.name,
            reason=None if result is None else result.message,
        )
    protocol_name = None if result is None else result.protocol_name
    if protocol_name is None and version < NULLABLE_PROTOCOL_NAME_VERSION:
        protocol_name = ""
    return m.JoinGroupResponse(
        throttle_time=NO_THROTTLE,
        error_code=result_error,
        generation_id=i32(-1 if result is None else result.generation_id),
        protocol_type=None if result is None else result.protocol_type,
        protocol_name=protocol_name,
        leader="" if result is None else result.leader,
        skip_assignment=False if result is None else result.skip_assignment,
        member_id=member_id,
        members=()
        if result is None
        else tuple(
            m.JoinGroupResponseMember(
                member_id=member.member_id,
                group_instance_id=member.group_instance_id,
                metadata=member.metadata,
            )
            for member in result.members
        ),
    )


async def sync_group(
    ctx: RequestContext, req: SyncGroupRequest, broker: ClassicBroker
) -> resp.sync_group_v5.SyncGroupResponse:
    m = resp.sync_group_v5
    if not _allowed(ctx, broker, req.group_id):
        return m.SyncGroupResponse(
            throttle_time=NO_THROTTLE,
            error_code=ErrorCode.group_authorization_failed,
            assignment=b"",
        )
    result = await broker.groups.classic.sync(
        SyncRequest(
            group_id=req.group_id,
            generation_id=req.generation_id,
            member_id=req.member_id,
            group_instance_id=getattr(req, "group_instance_id", None),
            protocol_type=getattr(req, "protocol_type", None),
            protocol_name=getattr(req, "protocol_name", None),
            assignments={a.member_id: a.assignment for a in req.assignments},
        )
    )
    if result.error != ErrorCode.none:
        log.info(
            "sync_group_answered",
            group=req.group_id,
            member=req.member_id,
            error=result.error.name,
            reason=result.message,
        )
    return m.SyncGroupResponse(
        throttle_time=NO_THROTTLE,
        error_code=result.error,
        protocol_type=result.protocol_type,
        protocol_name=result.protocol_name,
        assignment=result.assignment,
    )


async def heartbeat(
    ctx: RequestContext, req: HeartbeatRequest, broker: ClassicBroker
) -> resp.heartbeat_v4.HeartbeatResponse:
    m = resp.heartbeat_v4
    error = ErrorCode.none
    if not _allowed(ctx, broker, req.group_id):
        error = ErrorCode.group_authorization_failed
    else:
        try:
            await broker.groups.classic.heartbeat(
                req.group_id,
                req.generation_id,
                req.member_id,
                getattr(req, "group_instance_id", None),
            )
        except KafkaError as exc:
            error = exc.code
            if error != ErrorCode.rebalance_in_progress:
                log.info(
                    "heartbeat_refused",
                    group=req.group_id,
                    member=req.member_id,
                    error=error.name,
                    reason=exc.message,
                )
    return m.HeartbeatResponse(throttle_time=NO_THROTTLE, error_code=error)


async def leave_group(
    ctx: RequestContext, req: LeaveGroupRequest, broker: ClassicBroker
) -> resp.leave_group_v5.LeaveGroupResponse:
    m = resp.leave_group_v5
    version = ctx.api_version
    if version < BATCH_LEAVE_VERSION:
        leaving = [LeavingMember(getattr(req, "member_id", ""))]
    else:
        leaving = [
            LeavingMember(
                member.member_id, member.group_instance_id, getattr(member, "reason", None)
            )
            for member in getattr(req, "members", ())
        ]
    if not _allowed(ctx, broker, req.group_id):
        return m.LeaveGroupResponse(
            throttle_time=NO_THROTTLE,
            error_code=ErrorCode.group_authorization_failed,
            members=(),
        )
    try:
        outcomes = await broker.groups.classic.leave(req.group_id, leaving)
    except KafkaError as exc:
        return m.LeaveGroupResponse(throttle_time=NO_THROTTLE, error_code=exc.code, members=())
    members = tuple(
        m.MemberResponse(
            member_id=o.member_id, group_instance_id=o.group_instance_id, error_code=o.error
        )
        for o in outcomes
    )
    error = ErrorCode.none
    if version < BATCH_LEAVE_VERSION:
        # One member: its error is the request's (Kafka's LeaveGroupResponse for v0-2).
        error = outcomes[0].error if outcomes else ErrorCode.none
        members = ()
    return m.LeaveGroupResponse(throttle_time=NO_THROTTLE, error_code=error, members=members)


async def describe_groups(
    ctx: RequestContext, req: DescribeGroupsRequest, broker: ClassicBroker
) -> resp.describe_groups_v6.DescribeGroupsResponse:
    m = resp.describe_groups_v6
    az = broker.authorizer
    include_operations = getattr(req, "include_authorized_operations", False)
    described = []
    for group_id in req.groups:
        if not az.allows(ctx, AclOperation.DESCRIBE, ResourceType.GROUP, group_id):
            d = DescribedGroup(
                group_id, "", error=ErrorCode.group_authorization_failed, message=GROUP_DENIED
            )
        else:
            try:
                d = broker.groups.classic.describe(group_id, ctx.api_version)
            except KafkaError as exc:
                d = DescribedGroup(group_id, "", error=exc.code, message=exc.message)
        operations = AUTHORIZED_OPERATIONS_OMITTED
        if include_operations and d.error == ErrorCode.none:
            operations = i32(authorized_operations(az, ctx, ResourceType.GROUP, group_id))
        described.append(
            m.DescribedGroup(
                error_code=d.error,
                error_message=d.message,
                group_id=GroupId(group_id),
                group_state=d.state,
                protocol_type=d.protocol_type,
                protocol_data=d.protocol_data,
                members=tuple(
                    m.DescribedGroupMember(
                        member_id=member.member_id,
                        group_instance_id=member.group_instance_id,
                        client_id=member.client_id,
                        client_host=member.client_host,
                        member_metadata=member.metadata,
                        member_assignment=member.assignment,
                    )
                    for member in d.members
                ),
                authorized_operations=operations,
            )
        )
    return m.DescribeGroupsResponse(throttle_time=NO_THROTTLE, groups=tuple(described))
