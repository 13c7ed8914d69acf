"""The classic-group handlers (broker.handlers.classic): authorization as Kafka 4.2's
KafkaApis (READ on the group for JoinGroup, SyncGroup, Heartbeat and LeaveGroup;
DESCRIBE per group for DescribeGroups), and the answers shaped per version (JoinGroup
before v7 has a non-null protocol name; LeaveGroup before v3 one member)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from broker.handlers import classic
from broker.handlers.access import GROUP_DENIED
from coordinator.acls import AclOperation, ResourceType
from coordinator.classic_group import ClassicGroupConfig
from coordinator.group_config import GroupConfigStore
from coordinator.group_coordinator import GroupCoordinator
from coordinator.share_persister import InMemoryPersister
from protocol import api
from protocol.errors import ErrorCode
from tests.unit.test_authorization_checks import allow, authorizer, ctx, request, untouchable

JOIN = {
    "group_id": "g",
    "session_timeout": 10_000,
    "rebalance_timeout": 10_000,
    "member_id": "",
    "protocol_type": "consumer",
    "protocols": [{"name": "range", "metadata": b"x"}],
}


def denied_broker() -> Any:
    return SimpleNamespace(authorizer=authorizer(), groups=untouchable())


@pytest.mark.parametrize(
    ("key", "version", "handler", "data"),
    [
        (11, 9, classic.join_group, JOIN),
        (14, 5, classic.sync_group, {"group_id": "g", "generation_id": 1, "member_id": "m"}),
        (12, 4, classic.heartbeat, {"group_id": "g", "generation_id": 1, "member_id": "m"}),
        (13, 5, classic.leave_group, {"group_id": "g", "members": [{"member_id": "m"}]}),
    ],
)
async def test_member_rpcs_need_read_on_the_group(
    key: int, version: int, handler: Any, data: dict[str, Any]
) -> None:
    answer = await handler(ctx(version), request(key, version, data), denied_broker())
    assert answer.error_code == ErrorCode.group_authorization_failed
    api.at_version(key, version, answer)  # a valid answer of that version


async def test_describe_groups_needs_describe_per_group() -> None:
    groups = GroupCoordinator(InMemoryPersister(), dict, GroupConfigStore())
    groups.load()
    broker = SimpleNamespace(
        authorizer=authorizer(allow(ResourceType.GROUP, "mine", AclOperation.DESCRIBE)),
        groups=groups,
    )
    req = request(15, 5, {"groups": ["mine", "theirs"], "include_authorized_operations": True})
    answer = await classic.describe_groups(ctx(5), req, broker)
    assert [(g.group_id, g.error_code, g.group_state) for g in answer.groups] == [
        ("mine", ErrorCode.none, "Dead"),
        ("theirs", ErrorCode.group_authorization_failed, ""),
    ]
    assert answer.groups[1].error_message == GROUP_DENIED


async def test_old_versions_get_their_shapes() -> None:
    groups = GroupCoordinator(InMemoryPersister(), dict, GroupConfigStore())
    groups.load()
    groups.classic.config = ClassicGroupConfig(initial_rebalance_delay_ms=0)
    broker = SimpleNamespace(
        authorizer=authorizer(allow(ResourceType.GROUP, "g", AclOperation.READ)), groups=groups
    )
    # JoinGroup v5 refused before a protocol is chosen: protocol name "" (not null).
    bad = await classic.join_group(ctx(5), request(11, 5, {**JOIN, "session_timeout": 1}), broker)
    assert bad.error_code == ErrorCode.invalid_session_timeout
    encoded = api.at_version(11, 5, bad)
    assert encoded.protocol_name == ""  # type: ignore[attr-defined]
    # LeaveGroup v1 names one member; its error is the request's.
    left = await classic.leave_group(
        ctx(1), request(13, 1, {"group_id": "g", "member_id": "m"}), broker
    )
    assert left.error_code == ErrorCode.unknown_member_id and left.members == ()
