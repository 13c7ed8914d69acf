"""DescribeUserScramCredentials and AlterUserScramCredentials handlers (KIP-554) against
a real `MetadataStore`: what they answer (mechanisms and iterations, never a secret),
Kafka's per-user errors, and CLUSTER_AUTHORIZATION_FAILED without DESCRIBE / ALTER on
the cluster."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.alter_user_scram_credentials.v0 import request as alter_v0
from kio.schema.describe_user_scram_credentials.v0 import request as describe_v0
from kio.static.primitive import i8, i32

from broker.authorizer import Authorizer
from broker.handlers.users import alter_user_scram_credentials, describe_user_scram_credentials
from coordinator.acls import (
    CLUSTER_NAME,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from coordinator.metadata import MetadataStore
from coordinator.scram import salted_password
from persister.commit import GroupCommit
from protocol.errors import ErrorCode
from tests.unit.admin_helpers import Broker, commit, ctx

__all__ = ["commit"]  # the fixture, from admin_helpers


@pytest.fixture
def broker(tmp_path: Path, commit: GroupCommit) -> Iterator[Broker]:
    store = MetadataStore(tmp_path / "meta", commit)
    authorizer = Authorizer(
        enabled=True, acls=lambda: store.state.acls, super_users=frozenset({"User:admin"})
    )
    yield Broker(store, authorizer)
    store.close()


SALT = os.urandom(16)


def upsertion(user: str, mech: int = 1, iterations: int = 4096) -> Any:
    name = "SCRAM-SHA-256" if mech == 1 else "SCRAM-SHA-512"
    return alter_v0.ScramCredentialUpsertion(
        name=user,
        mechanism=i8(mech),
        iterations=i32(iterations),
        salt=SALT,
        salted_password=salted_password(name, "the-password", SALT, iterations),
    )


def alter(ups: list[Any], dels: tuple[tuple[str, int], ...] = ()) -> Any:
    return alter_v0.AlterUserScramCredentialsRequest(
        deletions=tuple(alter_v0.ScramCredentialDeletion(name=n, mechanism=i8(m)) for n, m in dels),
        upsertions=tuple(ups),
    )


def describe(*users: str) -> Any:
    return describe_v0.DescribeUserScramCredentialsRequest(
        users=tuple(describe_v0.UserName(name=u) for u in users) if users else None
    )


async def test_alter_then_describe_shows_mechanisms_and_iterations_only(broker: Broker) -> None:
    answer = await alter_user_scram_credentials(
        ctx(), alter([upsertion("alice", 1, 8192), upsertion("bob", 2)]), broker
    )
    assert [(r.user, r.error_code) for r in answer.results] == [
        ("alice", ErrorCode.none),
        ("bob", ErrorCode.none),
    ]
    await alter_user_scram_credentials(ctx(), alter([upsertion("alice", 2)]), broker)
    described = await describe_user_scram_credentials(ctx(), describe(), broker)
    assert described.error_code == ErrorCode.none
    got = {
        r.user: [(int(c.mechanism), int(c.iterations)) for c in r.credential_infos]
        for r in described.results
    }
    assert got == {"alice": [(1, 8192), (2, 4096)], "bob": [(2, 4096)]}
    assert SALT.hex() not in repr(described) and repr(SALT) not in repr(described)


async def test_describe_errors_per_user(broker: Broker) -> None:
    await alter_user_scram_credentials(ctx(), alter([upsertion("alice")]), broker)
    described = await describe_user_scram_credentials(
        ctx(), describe("alice", "nobody", "twice", "twice"), broker
    )
    by_user = {r.user: (r.error_code, r.error_message) for r in described.results}
    assert by_user == {
        "alice": (ErrorCode.none, None),
        "nobody": (
            ErrorCode.resource_not_found,
            "Attempt to describe a user credential that does not exist: nobody",
        ),
        "twice": (
            ErrorCode.duplicate_resource,
            "Cannot describe SCRAM credentials for the same user twice in a single request: twice",
        ),
    }


async def test_without_cluster_acls_every_user_is_refused(broker: Broker) -> None:
    answer = await alter_user_scram_credentials(
        ctx("alice"), alter([upsertion("alice"), upsertion("zed")], (("bob", 1),)), broker
    )
    assert [r.user for r in answer.results] == ["alice", "bob", "zed"]
    assert {r.error_code for r in answer.results} == {ErrorCode.cluster_authorization_failed}
    assert broker.metadata.state.scram_credentials == {}
    described = await describe_user_scram_credentials(ctx("alice"), describe("alice"), broker)
    assert described.error_code == ErrorCode.cluster_authorization_failed
    assert [r.error_code for r in described.results] == [ErrorCode.cluster_authorization_failed]


async def test_describe_on_the_cluster_allows_describe_but_not_alter(broker: Broker) -> None:
    grant = AclBinding(
        ResourceType.CLUSTER,
        CLUSTER_NAME,
        PatternType.LITERAL,
        "User:ops",
        "*",
        AclOperation.DESCRIBE,
        AclPermissionType.ALLOW,
    )
    broker.metadata.state.acls.add(grant)
    described = await describe_user_scram_credentials(ctx("ops"), describe(), broker)
    assert described.error_code == ErrorCode.none
    answer = await alter_user_scram_credentials(ctx("ops"), alter([upsertion("ops")]), broker)
    assert answer.results[0].error_code == ErrorCode.cluster_authorization_failed
