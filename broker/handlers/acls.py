"""CreateAcls, DescribeAcls and DeleteAcls (KIP-11, KIP-290's pattern types), as Kafka
4.2's AclApis and controller (AclControlManager) answer them.

- A broker without an authorizer (`authorizer.class.name` empty) answers all three with
  SECURITY_DISABLED, as Kafka does when no authorizer is configured.
- CreateAcls and DeleteAcls need ALTER on the CLUSTER, DescribeAcls DESCRIBE on it
  (Kafka's AuthHelper.authorizeClusterOperation): CLUSTER_AUTHORIZATION_FAILED for
  every creation, every filter or the whole describe otherwise.
- Each CreateAcls or DeleteAcls is one metadata operation (`MetadataStore.run`): the
  bindings are checked, compared with the stored ACLs and written in one turn, so
  concurrent requests are serialised as Kafka's controller events are. Creating an ACL
  that exists (or twice in one request) succeeds and writes nothing; a DeleteAcls
  answers, per filter, the bindings it removed (one a filter matched is listed under
  every filter that matched it, as in Kafka, and removed once).
- Per-binding and per-filter checks are `coordinator.acls.validate_new_acl` and
  `validate_filter`: INVALID_REQUEST with Kafka's message, for that entry only.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

import structlog
from kio.static.primitive import i8

from broker.authorizer import Authorizer
from broker.handlers import responses as resp
from broker.handlers.responses import NO_THROTTLE
from broker.server import RequestContext
from coordinator.acls import (
    MAX_RECORDS_PER_USER_OP,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
    binding_of,
    validate_filter,
    validate_new_acl,
)
from coordinator.metadata import MetadataStore, Record
from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from broker.handlers.requests import (
        CreateAclsRequest,
        DeleteAclsRequest,
        DescribeAclsRequest,
    )

log = structlog.get_logger("spool.acls")

NO_AUTHORIZER = "No Authorizer is configured."


class AclsBroker(Protocol):
    """What the ACL handlers use of the broker."""

    @property
    def metadata(self) -> MetadataStore: ...
    @property
    def authorizer(self) -> Authorizer: ...


def _cluster_denied(api: str, operation: AclOperation) -> KafkaError:
    return KafkaError(
        ErrorCode.cluster_authorization_failed,
        f"{api} needs {operation.name} on the CLUSTER resource; the principal has no ACL "
        "granting it",
    )


def _check(ctx: RequestContext, broker: AclsBroker, api: str, operation: AclOperation) -> None:
    """Kafka's order: the cluster check first (it allows all without an authorizer),
    then SECURITY_DISABLED."""
    if not broker.authorizer.allows(ctx, operation, ResourceType.CLUSTER):
        raise _cluster_denied(api, operation)
    if not broker.authorizer.enabled:
        raise KafkaError(ErrorCode.security_disabled, NO_AUTHORIZER)


def filter_of(
    resource_type: int,
    resource_name: str | None,
    pattern_type: int,
    principal: str | None,
    host: str | None,
    operation: int,
    permission: int,
) -> AclBindingFilter:
    return AclBindingFilter(
        ResourceType.from_code(resource_type),
        resource_name,
        PatternType.from_code(pattern_type),
        principal,
        host,
        AclOperation.from_code(operation),
        AclPermissionType.from_code(permission),
    )


# -- CreateAcls ---------------------------------------------------------------------------


def create_op(
    existing: Container[AclBinding], bindings: Sequence[AclBinding]
) -> tuple[list[Record], list[KafkaError | None]]:
    """The records and per-binding outcomes of creating `bindings` over the stored ACLs
    (AclControlManager.createAcls): a bad binding fails alone; an existing one, or one
    named twice, succeeds without a record. More than MAX_RECORDS_PER_USER_OP new ACLs
    fail the whole request with INVALID_REQUEST."""
    records: list[Record] = []
    outcomes: list[KafkaError | None] = []
    new: set[AclBinding] = set()
    for acl in bindings:
        try:
            validate_new_acl(acl)
        except KafkaError as exc:
            outcomes.append(exc)
            continue
        if acl not in existing and acl not in new:
            new.add(acl)
            records.append({"type": "acl", "acl": acl.to_record()})
        outcomes.append(None)
    if len(records) > MAX_RECORDS_PER_USER_OP:
        raise KafkaError(
            ErrorCode.invalid_request,
            f"Cannot create more than {MAX_RECORDS_PER_USER_OP} ACLs in one request",
        )
    return records, outcomes


async def create_acls(
    ctx: RequestContext, req: CreateAclsRequest, broker: AclsBroker
) -> resp.create_acls_v3.CreateAclsResponse:
    m = resp.create_acls_v3
    bindings = [
        binding_of(
            c.resource_type,
            c.resource_name,
            c.resource_pattern_type,
            c.principal,
            c.host,
            c.operation,
            c.permission_type,
        )
        for c in req.creations
    ]
    outcomes: list[KafkaError | None]
    try:
        _check(ctx, broker, "CreateAcls", AclOperation.ALTER)
        state = broker.metadata.state

        def op() -> tuple[list[Record], tuple[list[Record], list[KafkaError | None]]]:
            records, results = create_op(state.acls, bindings)
            return records, (records, results)

        def applied(done: tuple[list[Record], list[KafkaError | None]]) -> None:
            for record in done[0]:
                log.info("acl_created", acl=_describe(AclBinding.from_record(record["acl"])))

        _, outcomes = await broker.metadata.run(op, applied=applied)
    except KafkaError as exc:
        outcomes = [exc] * len(bindings)
    return m.CreateAclsResponse(
        throttle_time=NO_THROTTLE,
        results=tuple(
            m.AclCreationResult(
                error_code=ErrorCode.none if e is None else e.code,
                error_message=None if e is None else e.message,
            )
            for e in outcomes
        ),
    )


def _describe(acl: AclBinding) -> str:
    """An ACL as Kafka's tools print it."""
    return (
        f"(principal={acl.principal}, host={acl.host}, operation={acl.operation.name}, "
        f"permissionType={acl.permission.name}) on {acl.resource_type.name}:"
        f"{acl.pattern_type.name}:{acl.resource_name}"
    )


# -- DescribeAcls -------------------------------------------------------------------------


async def describe_acls(
    ctx: RequestContext, req: DescribeAclsRequest, broker: AclsBroker
) -> resp.describe_acls_v3.DescribeAclsResponse:
    m = resp.describe_acls_v3
    filt = filter_of(
        req.resource_type_filter,
        req.resource_name_filter,
        req.pattern_type_filter,
        req.principal_filter,
        req.host_filter,
        req.operation,
        req.permission_type,
    )
    try:
        _check(ctx, broker, "DescribeAcls", AclOperation.DESCRIBE)
        validate_filter(filt)
    except KafkaError as exc:
        return m.DescribeAclsResponse(
            throttle_time=NO_THROTTLE, error_code=exc.code, error_message=exc.message, resources=()
        )
    # Grouped by resource pattern, as Kafka's DescribeAclsResponse.aclsResources.
    by_pattern: dict[tuple[ResourceType, str, PatternType], list[AclBinding]] = {}
    for acl in broker.metadata.state.acls.matching(filt):
        by_pattern.setdefault((acl.resource_type, acl.resource_name, acl.pattern_type), []).append(
            acl
        )
    return m.DescribeAclsResponse(
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        error_message=None,
        resources=tuple(
            m.DescribeAclsResource(
                resource_type=i8(rtype),
                resource_name=name,
                pattern_type=i8(ptype),
                acls=tuple(
                    m.AclDescription(
                        principal=a.principal,
                        host=a.host,
                        operation=i8(a.operation),
                        permission_type=i8(a.permission),
                    )
                    for a in acls
                ),
            )
            for (rtype, name, ptype), acls in by_pattern.items()
        ),
    )


# -- DeleteAcls ---------------------------------------------------------------------------

FilterOutcome = tuple[KafkaError | None, list[AclBinding]]


def delete_op(
    state_acls: Iterable[AclBinding], filters: Sequence[AclBindingFilter]
) -> tuple[list[Record], list[FilterOutcome]]:
    """The records and per-filter outcomes of DeleteAcls over the stored ACLs
    (AclControlManager.deleteAcls): a bad filter fails alone; every stored binding a
    filter matches is its result and removed once. More than MAX_RECORDS_PER_USER_OP
    removals fail the whole request with INVALID_REQUEST, as Kafka does rather than
    answer a partial deletion."""
    stored = sorted(state_acls)
    removed: dict[AclBinding, Record] = {}
    outcomes: list[FilterOutcome] = []
    for filt in filters:
        try:
            validate_filter(filt)
        except KafkaError as exc:
            outcomes.append((exc, []))
            continue
        matched = [acl for acl in stored if filt.matches(acl)]
        for acl in matched:
            removed.setdefault(acl, {"type": "acl_deleted", "acl": acl.to_record()})
        if len(removed) > MAX_RECORDS_PER_USER_OP:
            raise KafkaError(
                ErrorCode.invalid_request,
                f"Cannot remove more than {MAX_RECORDS_PER_USER_OP} acls in a single delete "
                "operation.",
            )
        outcomes.append((None, matched))
    return list(removed.values()), outcomes


async def delete_acls(
    ctx: RequestContext, req: DeleteAclsRequest, broker: AclsBroker
) -> resp.delete_acls_v3.DeleteAclsResponse:
    m = resp.delete_acls_v3
    filters = [
        filter_of(
            f.resource_type_filter,
            f.resource_name_filter,
            f.pattern_type_filter,
            f.principal_filter,
            f.host_filter,
            f.operation,
            f.permission_type,
        )
        for f in req.filters
    ]
    outcomes: list[FilterOutcome]
    try:
        _check(ctx, broker, "DeleteAcls", AclOperation.ALTER)
        state = broker.metadata.state

        def op() -> tuple[list[Record], tuple[list[Record], list[FilterOutcome]]]:
            records, results = delete_op(state.acls, filters)
            return records, (records, results)

        def applied(done: tuple[list[Record], list[FilterOutcome]]) -> None:
            for record in done[0]:
                log.info("acl_deleted", acl=_describe(AclBinding.from_record(record["acl"])))

        _, outcomes = await broker.metadata.run(op, applied=applied)
    except KafkaError as exc:
        outcomes = [(exc, [])] * len(filters)
    return m.DeleteAclsResponse(
        throttle_time=NO_THROTTLE,
        filter_results=tuple(
            m.DeleteAclsFilterResult(
                error_code=ErrorCode.none if e is None else e.code,
                error_message=None if e is None else e.message,
                matching_acls=tuple(
                    m.DeleteAclsMatchingAcl(
                        error_code=ErrorCode.none,
                        error_message=None,
                        resource_type=i8(a.resource_type),
                        resource_name=a.resource_name,
                        pattern_type=i8(a.pattern_type),
                        principal=a.principal,
                        host=a.host,
                        operation=i8(a.operation),
                        permission_type=i8(a.permission),
                    )
                    for a in acls
                ),
            )
            for e, acls in outcomes
        ),
    )
