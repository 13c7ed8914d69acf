"""DescribeUserScramCredentials and AlterUserScramCredentials (KIP-554), as Kafka 4.2's
KafkaApis (describe), ControllerApis and ScramControlManager (alter) answer them.

- Describe needs DESCRIBE on the CLUSTER, Alter needs ALTER on it; without it every user
  of the request is answered CLUSTER_AUTHORIZATION_FAILED (and Describe's top-level
  error too), as the requests' error responses are in Kafka.
- Describe answers the mechanisms and iteration counts of each user named (all users
  with a credential when none is named); a user without any credential is
  RESOURCE_NOT_FOUND, a user named twice DUPLICATE_RESOURCE (Kafka's ScramImage). Never a
  salt or a key.
- Alter is one metadata operation (`MetadataStore.alter_scram_credentials`, Kafka's
  checks in `ClusterState.alter_scram_records`); the upsertion's salted password is
  turned into the stored and server keys there and is never logged or kept.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import structlog
from kio.static.primitive import i8, i32

from broker.authorizer import Authorizer
from broker.handlers import responses as resp
from broker.handlers.responses import NO_THROTTLE
from broker.server import RequestContext
from coordinator.acls import AclOperation, ResourceType
from coordinator.metadata import MetadataStore
from coordinator.scram import MECHANISMS, ScramDeletion, ScramUpsertion
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.handlers.requests import (
        AlterUserScramCredentialsRequest,
        DescribeUserScramCredentialsRequest,
    )

log = structlog.get_logger("spool.users")

DESCRIBE_DUPLICATE_USER = (
    "Cannot describe SCRAM credentials for the same user twice in a single request: "
)
DESCRIBE_UNKNOWN_USER = "Attempt to describe a user credential that does not exist: "


class UsersBroker(Protocol):
    """What the SCRAM credential handlers use of the broker."""

    @property
    def metadata(self) -> MetadataStore: ...
    @property
    def authorizer(self) -> Authorizer: ...


def _denied(api: str, operation: AclOperation) -> str:
    return (
        f"{api} needs {operation.name} on the CLUSTER resource; the principal has no ACL "
        "granting it"
    )


async def describe_user_scram_credentials(
    ctx: RequestContext, req: DescribeUserScramCredentialsRequest, broker: UsersBroker
) -> resp.describe_user_scram_credentials_v0.DescribeUserScramCredentialsResponse:
    m = resp.describe_user_scram_credentials_v0
    named = [u.name for u in req.users or ()]
    if not broker.authorizer.allows(ctx, AclOperation.DESCRIBE, ResourceType.CLUSTER):
        denied = _denied("DescribeUserScramCredentials", AclOperation.DESCRIBE)
        code = ErrorCode.cluster_authorization_failed
        return m.DescribeUserScramCredentialsResponse(
            throttle_time=NO_THROTTLE,
            error_code=code,
            error_message=denied,
            results=tuple(
                m.DescribeUserScramCredentialsResult(
                    user=user, error_code=code, error_message=denied, credential_infos=()
                )
                for user in named
            ),
        )
    stored = broker.metadata.state.scram_credentials
    # user -> named more than once (Kafka's uniqueUsers), in the order first named.
    users: dict[str, bool] = {}
    if named:
        for user in named:
            users[user] = user in users
    else:
        users = dict.fromkeys(sorted({user for user, _ in stored}), False)
    results = []
    message: str | None
    for user, duplicate in users.items():
        infos = tuple(
            m.CredentialInfo(mechanism=i8(kind), iterations=i32(stored[(user, name)]["iterations"]))
            for name, (kind, _) in MECHANISMS.items()
            if (user, name) in stored
        )
        if duplicate:
            code, message, infos = ErrorCode.duplicate_resource, DESCRIBE_DUPLICATE_USER + user, ()
        elif not infos:
            code, message = ErrorCode.resource_not_found, DESCRIBE_UNKNOWN_USER + user
        else:
            code, message = ErrorCode.none, None
        results.append(
            m.DescribeUserScramCredentialsResult(
                user=user, error_code=code, error_message=message, credential_infos=infos
            )
        )
    return m.DescribeUserScramCredentialsResponse(
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        error_message=None,
        results=tuple(results),
    )


async def alter_user_scram_credentials(
    ctx: RequestContext, req: AlterUserScramCredentialsRequest, broker: UsersBroker
) -> resp.alter_user_scram_credentials_v0.AlterUserScramCredentialsResponse:
    m = resp.alter_user_scram_credentials_v0
    if not broker.authorizer.allows(ctx, AclOperation.ALTER, ResourceType.CLUSTER):
        message = _denied("AlterUserScramCredentials", AclOperation.ALTER)
        users = sorted({d.name for d in req.deletions} | {u.name for u in req.upsertions})
        return m.AlterUserScramCredentialsResponse(
            throttle_time=NO_THROTTLE,
            results=tuple(
                m.AlterUserScramCredentialsResult(
                    user=user,
                    error_code=ErrorCode.cluster_authorization_failed,
                    error_message=message,
                )
                for user in users
            ),
        )
    deletions = [ScramDeletion(d.name, int(d.mechanism)) for d in req.deletions]
    upsertions = [
        ScramUpsertion(
            u.name, int(u.mechanism), int(u.iterations), bytes(u.salt), bytes(u.salted_password)
        )
        for u in req.upsertions
    ]
    results = await broker.metadata.alter_scram_credentials(deletions, upsertions)
    changed = {user for user, code, _ in results if code == ErrorCode.none}
    if changed:
        log.info(
            "scram_credentials_altered",
            principal=str(ctx.security.principal),
            upserted=sorted({u.user for u in upsertions} & changed),
            deleted=sorted({d.user for d in deletions} & changed),
        )
    return m.AlterUserScramCredentialsResponse(
        throttle_time=NO_THROTTLE,
        results=tuple(
            m.AlterUserScramCredentialsResult(user=user, error_code=code, error_message=message)
            for user, code, message in results
        ),
    )
