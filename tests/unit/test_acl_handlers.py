"""CreateAcls, DescribeAcls and DeleteAcls handlers against a real `MetadataStore` (its
log in a temp dir): Kafka's per-entry checks and codes, SECURITY_DISABLED without an
authorizer, CLUSTER_AUTHORIZATION_FAILED without ALTER/DESCRIBE on the cluster, each
mutation one metadata operation (concurrent requests serialised, each ACL written
once), and ACLs back after a reopen (the replay)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kio.schema.create_acls.v3 import request as create_v3
from kio.schema.delete_acls.v3 import request as delete_v3
from kio.schema.describe_acls.v3 import request as describe_v3
from kio.static.primitive import i8

from broker.authorizer import Authorizer
from broker.handlers.acls import create_acls, delete_acls, describe_acls
from coordinator.acls import (
    CLUSTER_NAME,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from coordinator.metadata import MetadataStore
from persister.commit import GroupCommit
from protocol.errors import ErrorCode
from tests.unit.admin_helpers import Broker, commit, ctx

__all__ = ["commit"]  # the fixture, from admin_helpers

Op = AclOperation
TOPIC, GROUP, CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
LITERAL, PREFIXED = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY


@pytest.fixture
def open_broker(tmp_path: Path, commit: GroupCommit) -> Callable[..., Broker]:
    """A broker over the metadata log in tmp_path, `admin` a super user; calling it
    again reopens the log (a restart)."""
    opened: list[MetadataStore] = []

    def make(enabled: bool = True) -> Broker:
        if opened:
            opened[-1].close()
        store = MetadataStore(tmp_path / "meta", commit)
        opened.append(store)
        authorizer = Authorizer(
            enabled=enabled, acls=lambda: store.state.acls, super_users=frozenset({"User:admin"})
        )
        return Broker(store, authorizer)

    yield make
    if opened:
        opened[-1].close()


def creation(
    name: str = "orders",
    op: AclOperation = Op.READ,
    permission: AclPermissionType = ALLOW,
    *,
    principal: str = "User:alice",
    host: str = "*",
    pattern: int = LITERAL,
    rtype: int = TOPIC,
) -> create_v3.AclCreation:
    return create_v3.AclCreation(
        resource_type=i8(rtype),
        resource_name=name,
        resource_pattern_type=i8(pattern),
        principal=principal,
        host=host,
        operation=i8(op),
        permission_type=i8(permission),
    )


def create_req(*creations: create_v3.AclCreation) -> Any:
    return create_v3.CreateAclsRequest(creations=creations)


def describe_req(
    rtype: int = ResourceType.ANY,
    name: str | None = None,
    pattern: int = PatternType.ANY,
    principal: str | None = None,
) -> Any:
    return describe_v3.DescribeAclsRequest(
        resource_type_filter=i8(rtype),
        resource_name_filter=name,
        pattern_type_filter=i8(pattern),
        principal_filter=principal,
        host_filter=None,
        operation=i8(Op.ANY),
        permission_type=i8(AclPermissionType.ANY),
    )


def delete_filter(
    rtype: int = ResourceType.ANY,
    name: str | None = None,
    pattern: int = PatternType.ANY,
    principal: str | None = None,
    op: int = Op.ANY,
) -> delete_v3.DeleteAclsFilter:
    return delete_v3.DeleteAclsFilter(
        resource_type_filter=i8(rtype),
        resource_name_filter=name,
        pattern_type_filter=i8(pattern),
        principal_filter=principal,
        host_filter=None,
        operation=i8(op),
        permission_type=i8(AclPermissionType.ANY),
    )


def delete_req(*filters: delete_v3.DeleteAclsFilter) -> Any:
    return delete_v3.DeleteAclsRequest(filters=filters)


def codes(answer: Any) -> list[ErrorCode]:
    return [r.error_code for r in answer.results]


async def described(broker: Broker, **filt: Any) -> set[tuple[Any, ...]]:
    answer = await describe_acls(ctx(), describe_req(**filt), broker)
    assert answer.error_code == ErrorCode.none
    return {
        (r.resource_type, r.resource_name, r.pattern_type, a.principal, a.host, a.operation)
        for r in answer.resources
        for a in r.acls
    }


async def test_create_describe_delete_round_trip(open_broker: Callable[..., Broker]) -> None:
    broker = open_broker()
    answer = await create_acls(
        ctx(),
        create_req(
            creation("orders", Op.READ),
            creation("team-", Op.WRITE, pattern=PREFIXED),
            creation("readers", Op.READ, rtype=GROUP),
        ),
        broker,
    )
    assert codes(answer) == [ErrorCode.none] * 3
    assert len(broker.metadata.state.acls) == 3
    assert await described(broker, rtype=TOPIC) == {
        (TOPIC, "orders", LITERAL, "User:alice", "*", Op.READ),
        (TOPIC, "team-", PREFIXED, "User:alice", "*", Op.WRITE),
    }
    # MATCH: what applies to topic team-x.
    assert await described(broker, rtype=TOPIC, name="team-x", pattern=PatternType.MATCH) == {
        (TOPIC, "team-", PREFIXED, "User:alice", "*", Op.WRITE),
    }
    deleted = await delete_acls(ctx(), delete_req(delete_filter(TOPIC, "team-", PREFIXED)), broker)
    (result,) = deleted.filter_results
    assert result.error_code == ErrorCode.none
    assert [(a.resource_name, a.pattern_type) for a in result.matching_acls] == [("team-", 4)]
    assert len(broker.metadata.state.acls) == 2
    # Survives a restart (the metadata log's replay), deletions included.
    broker = open_broker()
    assert await described(broker) == {
        (TOPIC, "orders", LITERAL, "User:alice", "*", Op.READ),
        (GROUP, "readers", LITERAL, "User:alice", "*", Op.READ),
    }


async def test_creating_an_existing_acl_succeeds_and_writes_nothing(
    open_broker: Callable[..., Broker],
) -> None:
    broker = open_broker()
    one = creation()
    assert codes(await create_acls(ctx(), create_req(one, one), broker)) == [ErrorCode.none] * 2
    end = broker.metadata.runtime.record_log.end_offset
    assert codes(await create_acls(ctx(), create_req(one), broker)) == [ErrorCode.none]
    assert broker.metadata.runtime.record_log.end_offset == end
    assert len(broker.metadata.state.acls) == 1


async def test_bad_creations_fail_alone_with_kafkas_codes(
    open_broker: Callable[..., Broker],
) -> None:
    broker = open_broker()
    answer = await create_acls(
        ctx(),
        create_req(
            creation(rtype=ResourceType.ANY),
            creation(rtype=99),
            creation(pattern=PatternType.MATCH),
            creation(op=Op.ANY),
            creation(permission=AclPermissionType.ANY),
            creation(""),
            creation(principal="alice"),
            creation("c", Op.ALTER, rtype=CLUSTER),
            creation(host="10.0.0.0/8"),
            creation("fine"),
        ),
        broker,
    )
    assert codes(answer) == [ErrorCode.invalid_request] * 8 + [
        ErrorCode.unsupported_version,
        ErrorCode.none,
    ]
    assert all(r.error_message for r in answer.results[:9])
    assert [a.resource_name for a in broker.metadata.state.acls] == ["fine"]


async def test_without_an_authorizer_acl_apis_are_security_disabled(
    open_broker: Callable[..., Broker],
) -> None:
    broker = open_broker(enabled=False)
    created = await create_acls(ctx(), create_req(creation(), creation("b")), broker)
    assert codes(created) == [ErrorCode.security_disabled] * 2
    assert created.results[0].error_message == "No Authorizer is configured."
    answer = await describe_acls(ctx(), describe_req(), broker)
    assert answer.error_code == ErrorCode.security_disabled
    deleted = await delete_acls(ctx(), delete_req(delete_filter()), broker)
    assert [r.error_code for r in deleted.filter_results] == [ErrorCode.security_disabled]
    assert len(broker.metadata.state.acls) == 0


async def test_acl_apis_need_alter_or_describe_on_the_cluster(
    open_broker: Callable[..., Broker],
) -> None:
    broker = open_broker()
    alice = ctx("alice")
    assert codes(await create_acls(alice, create_req(creation()), broker)) == [
        ErrorCode.cluster_authorization_failed
    ]
    assert (
        await describe_acls(alice, describe_req(), broker)
    ).error_code == ErrorCode.cluster_authorization_failed
    # DESCRIBE on the cluster lets alice list, not create or delete.
    await create_acls(ctx(), create_req(creation(CLUSTER_NAME, Op.DESCRIBE, rtype=CLUSTER)), broker)
    assert (await describe_acls(alice, describe_req(), broker)).error_code == ErrorCode.none
    deleted = await delete_acls(alice, delete_req(delete_filter()), broker)
    assert [r.error_code for r in deleted.filter_results] == [
        ErrorCode.cluster_authorization_failed
    ]
    # ALTER on the cluster implies DESCRIBE and lets alice create.
    await create_acls(ctx(), create_req(creation(CLUSTER_NAME, Op.ALTER, rtype=CLUSTER)), broker)
    assert codes(await create_acls(alice, create_req(creation()), broker)) == [ErrorCode.none]
    assert broker.authorizer.denials[("ALTER", "CLUSTER")] == 2


async def test_delete_filters_each_answer_what_they_matched(
    open_broker: Callable[..., Broker],
) -> None:
    broker = open_broker()
    await create_acls(
        ctx(),
        create_req(
            creation("orders", Op.READ),
            creation("orders", Op.WRITE, principal="User:bob"),
            creation("payments", Op.READ),
        ),
        broker,
    )
    answer = await delete_acls(
        ctx(),
        delete_req(
            delete_filter(TOPIC, "orders", LITERAL),
            delete_filter(principal="User:bob"),
            delete_filter(rtype=ResourceType.UNKNOWN),
            delete_filter(TOPIC, "nothing", LITERAL),
        ),
        broker,
    )
    results = answer.filter_results
    assert [r.error_code for r in results] == [
        ErrorCode.none,
        ErrorCode.none,
        ErrorCode.invalid_request,
        ErrorCode.none,
    ]
    assert sorted(a.principal for a in results[0].matching_acls) == ["User:alice", "User:bob"]
    # bob's ACL matched both filters: listed under each, removed once.
    assert [a.principal for a in results[1].matching_acls] == ["User:bob"]
    assert results[3].matching_acls == ()
    assert [a.resource_name for a in broker.metadata.state.acls] == ["payments"]


async def test_concurrent_creates_and_deletes_serialise(
    open_broker: Callable[..., Broker],
) -> None:
    broker = open_broker()
    names = [f"t{i}" for i in range(40)]
    # Four clients create overlapping halves at once: every ACL lands once.
    batches = [names[:20], names[10:30], names[20:], names[5:35]]
    answers = await asyncio.gather(
        *(create_acls(ctx(), create_req(*(creation(n) for n in b)), broker) for b in batches)
    )
    assert all(set(codes(a)) == {ErrorCode.none} for a in answers)
    assert sorted(a.resource_name for a in broker.metadata.state.acls) == sorted(names)
    # One record per ACL, none twice.
    assert len([r for r in _records(broker.metadata) if r["type"] == "acl"]) == len(names)
    # Two deletes of the same ACLs at once: each ACL is reported deleted once overall.
    deletes = await asyncio.gather(
        *(delete_acls(ctx(), delete_req(delete_filter(TOPIC)), broker) for _ in range(3))
    )
    reported = [a.resource_name for d in deletes for a in d.filter_results[0].matching_acls]
    assert sorted(reported) == sorted(names)
    assert len(broker.metadata.state.acls) == 0


def _records(store: MetadataStore) -> list[dict[str, Any]]:
    return [json.loads(v) for _k, v in store.runtime.record_log.replay() if v is not None]
