"""Authorization of requests: Kafka's StandardAuthorizer over the stored ACLs.

A broker has an authorizer when `authorizer.class.name` names Kafka's
`org.apache.kafka.metadata.authorizer.StandardAuthorizer` (or `kafka.security.authorizer.
AclAuthorizer`, which 4.x no longer ships, taken as the same); with the key empty (the
default) every request is allowed, as today. With it on:
- principals in `super.users` (`User:admin;User:ops`) may do anything;
- otherwise the ACLs decide (coordinator.acls: DENY before ALLOW, implied DESCRIBE);
- a resource no ACL names is denied unless `allow.everyone.if.no.acl.found=true`.

Handlers ask `allows(ctx, operation, resource_type, name)` for each resource a request
touches and answer the denied ones with Kafka's *_AUTHORIZATION_FAILED code. A denial is
logged at INFO with principal, host, operation and resource, as Kafka's
`kafka.authorizer.logger` does, unless the handler is only filtering a listing (Kafka's
`logIfDenied=false` for Metadata's topics and the like); every denial is counted per
operation and resource type for `/metrics`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from typing import Protocol

import structlog

from broker.config import BrokerConfig
from broker.security import SecurityContext
from coordinator.acls import (
    CLUSTER_NAME,
    AclOperation,
    AclSet,
    Decision,
    ResourceType,
)
from protocol.errors import ErrorCode, KafkaError

log = structlog.get_logger("spool.authorizer")

STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
# Kafka 3.x's ZooKeeper-era class: accepted as the same ACL authorizer.
ACL_AUTHORIZER = "kafka.security.authorizer.AclAuthorizer"
AUTHORIZER_CLASSES = (STANDARD_AUTHORIZER, ACL_AUTHORIZER)


class Requester(Protocol):
    """What the authorizer needs of a request: who and from where (server.RequestContext)."""

    @property
    def security(self) -> SecurityContext: ...

    @property
    def client_host(self) -> str: ...


def parse_super_users(text: str) -> frozenset[str]:
    """`super.users`: principals separated by `;` (Kafka's format), blanks ignored; one
    not of the form `Type:name` is INVALID_CONFIG, as Kafka's StandardAuthorizer refuses
    it at startup (a bare `admin` would never match anyone)."""
    users = frozenset(p.strip() for p in text.split(";") if p.strip())
    for user in sorted(users):
        kind, sep, name = user.partition(":")
        if not sep or not kind or not name:
            raise KafkaError(
                ErrorCode.invalid_config,
                "super.users: expected a string in format principalType:principalName "
                f"but got {user} (e.g. User:{user})",
            )
    return users


def check_authorizer_class(name: str) -> None:
    """`authorizer.class.name` is empty (no authorizer) or Kafka's ACL authorizer: any
    other class (a plugin spool cannot load) is INVALID_CONFIG at startup, as Kafka
    fails on a class it cannot find, rather than run with other rules than configured."""
    if name and name not in AUTHORIZER_CLASSES:
        raise KafkaError(
            ErrorCode.invalid_config,
            f"authorizer.class.name: spool cannot load {name}; it has Kafka's "
            f"{STANDARD_AUTHORIZER} (ACLs on; {ACL_AUTHORIZER} is taken as the same), "
            "or leave the key empty for no authorizer",
        )


class Authorizer:
    """The broker's authorizer; `enabled` is False when no authorizer is configured, and
    then every check allows."""

    def __init__(
        self,
        enabled: bool,
        acls: Callable[[], AclSet],
        super_users: frozenset[str] = frozenset(),
        allow_if_no_acl: bool = False,
    ) -> None:
        self.enabled = enabled
        self._acls = acls
        self.super_users = super_users
        self.allow_if_no_acl = allow_if_no_acl
        # (operation name, resource type name) -> denials, for /metrics.
        self.denials: Counter[tuple[str, str]] = Counter()

    @classmethod
    def from_config(cls, config: BrokerConfig, acls: Callable[[], AclSet]) -> Authorizer:
        """The configured authorizer; KafkaError(INVALID_CONFIG) for a class name or a
        super user Kafka would refuse."""
        name = str(config.get("authorizer.class.name") or "").strip()
        check_authorizer_class(name)
        return cls(
            enabled=bool(name),
            acls=acls,
            super_users=parse_super_users(str(config.get("super.users") or "")),
            allow_if_no_acl=bool(config.get("allow.everyone.if.no.acl.found")),
        )

    def is_super_user(self, ctx: Requester) -> bool:
        return str(ctx.security.principal) in self.super_users

    def allows(
        self,
        ctx: Requester,
        operation: AclOperation,
        resource_type: ResourceType,
        name: str = CLUSTER_NAME,
        *,
        log_denied: bool = True,
    ) -> bool:
        """May the request's principal do `operation` on the resource? CLUSTER checks
        leave `name` at its default."""
        if not self.enabled:
            return True
        principal = str(ctx.security.principal)
        if principal in self.super_users:
            return True
        decision = self._acls().authorize(
            principal, ctx.client_host, operation, resource_type, name
        )
        allowed = decision is Decision.ALLOWED or (
            decision is Decision.NO_ACL and self.allow_if_no_acl
        )
        if not allowed:
            self.denials[(operation.name, resource_type.name)] += 1
            if log_denied:
                log.info(
                    "authorization_denied",
                    principal=principal,
                    host=ctx.client_host,
                    operation=operation.name,
                    resource_type=resource_type.name,
                    resource=name,
                    listener=ctx.security.listener,
                )
        return allowed

    def filter(
        self,
        ctx: Requester,
        operation: AclOperation,
        resource_type: ResourceType,
        names: Iterable[str],
        *,
        log_denied: bool = False,
    ) -> list[str]:
        """The names among `names` the principal may do `operation` on (a listing's
        filter: denials not logged by default, as Kafka's filterByAuthorized)."""
        return [
            n for n in names if self.allows(ctx, operation, resource_type, n, log_denied=log_denied)
        ]

    def allows_any(
        self, ctx: Requester, operation: AclOperation, resource_type: ResourceType
    ) -> bool:
        """Kafka's authorizeByResourceType: may the principal do `operation` on some
        resource of this type (InitProducerId's idempotent-write fallback). As Kafka,
        first the decision for one made-up LITERAL name (super users, `*` and prefix
        ACLs covering it, allow.everyone.if.no.acl.found), then the ACLs of the type
        (coordinator.acls.AclSet.any_allowed). A refusal is counted, not logged."""
        if not self.enabled:
            return True
        principal = str(ctx.security.principal)
        if principal in self.super_users:
            return True
        acls = self._acls()
        decision = acls.authorize(principal, ctx.client_host, operation, resource_type, "hardcode")
        if decision is Decision.ALLOWED or (decision is Decision.NO_ACL and self.allow_if_no_acl):
            return True
        if acls.any_allowed(principal, ctx.client_host, operation, resource_type):
            return True
        self.denials[(operation.name, resource_type.name)] += 1
        return False

    def acl_count(self) -> int:
        """ACLs stored (Kafka's acls-total-count)."""
        return len(self._acls())


NO_AUTHORIZER = Authorizer(enabled=False, acls=AclSet)
