"""ACLs (KIP-11) and how Kafka's StandardAuthorizer decides with them, sans-IO.

The enums carry Kafka's wire codes (org.apache.kafka.common.resource.ResourceType,
acl.AclOperation, acl.AclPermissionType, resource.PatternType). An `AclBinding` is one
stored ACL: a resource pattern (type, name, LITERAL or PREFIXED) and an entry (principal
`User:name` or `User:*`, host or `*`, operation, ALLOW or DENY).

`AclSet.authorize` follows StandardAuthorizerData.findAclRule for one LITERAL resource:
- the ACLs that match the resource are its LITERAL ACLs of that exact name, the LITERAL
  ACLs named `*` and the PREFIXED ACLs whose name starts the resource's name;
- of those, an entry applies to the request if its principal is the request's or
  `User:*` and its host is `*` or the client's address (Kafka 4.2 compares hosts as
  strings, the client's as Java's InetAddress.getHostAddress spells it; spool compares
  IP literals by value, `same_host`, so that `::1`, Java's `0:0:0:0:0:0:0:1` and
  `::ffff:127.0.0.1` for 127.0.0.1 all match; CIDR ranges are KIP-1276, after 4.2, so
  `validate_new_acl` refuses them rather than store a rule that would never match);
- any applying DENY for the operation (or ALL) denies; else any applying ALLOW for the
  operation (or ALL, or an operation that implies it: READ, WRITE, DELETE and ALTER
  imply DESCRIBE, ALTER_CONFIGS implies DESCRIBE_CONFIGS) allows; an implied operation
  never comes from a DENY;
- with no applying entry: denied if the resource has any ACL at all (for anyone),
  otherwise `allow.everyone.if.no.acl.found` decides (`Decision.NO_ACL`).
Super users are the caller's business (broker.authorizer), as they are checked before
any ACL in Kafka.

`validate_new_acl` and `validate_filter` are the checks CreateAcls and DeleteAcls make
of each binding or filter (Kafka's AclApis and AclControlManager), and the `from_code`
constructors map a wire code Kafka does not know to UNKNOWN, as Kafka's `fromCode` does.
"""

from __future__ import annotations

import enum
import functools
import ipaddress
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Self

from protocol.errors import ErrorCode, KafkaError

WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"
CLUSTER_NAME = "kafka-cluster"  # the one CLUSTER resource's name in Kafka


@functools.lru_cache(maxsize=4096)
def _host_value(host: str) -> str:
    """One spelling of an IP literal (compressed IPv6, IPv4-mapped as IPv4, the zone
    kept); anything else (a name) as given."""
    address, _, zone = host.partition("%")
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return f"{ip}%{zone}" if zone else str(ip)


def same_host(acl_host: str, client_host: str) -> bool:
    """Whether an ACL's host (not `*`) names the client's address: equal strings, or
    the same IP address however spelled."""
    return acl_host == client_host or _host_value(acl_host) == _host_value(client_host)


class _Coded(enum.IntEnum):
    @classmethod
    def from_code(cls, code: int) -> Self:
        """The member with wire code `code`, UNKNOWN (0) for a code Kafka does not know."""
        try:
            return cls(code)
        except ValueError:
            return cls(0)


class ResourceType(_Coded):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class AclOperation(_Coded):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14
    TWO_PHASE_COMMIT = 15


class AclPermissionType(_Coded):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


class PatternType(_Coded):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


# Kafka's AclEntry.supportedOperations: the operations an ACL on each resource type may
# name (ALL is valid everywhere too) and what a KIP-430 authorized-operations field reports.
SUPPORTED_OPERATIONS: dict[ResourceType, frozenset[AclOperation]] = {
    ResourceType.TOPIC: frozenset(
        {
            AclOperation.READ,
            AclOperation.WRITE,
            AclOperation.CREATE,
            AclOperation.DESCRIBE,
            AclOperation.DELETE,
            AclOperation.ALTER,
            AclOperation.DESCRIBE_CONFIGS,
            AclOperation.ALTER_CONFIGS,
        }
    ),
    ResourceType.GROUP: frozenset(
        {
            AclOperation.READ,
            AclOperation.DESCRIBE,
            AclOperation.DELETE,
            AclOperation.DESCRIBE_CONFIGS,
            AclOperation.ALTER_CONFIGS,
        }
    ),
    ResourceType.CLUSTER: frozenset(
        {
            AclOperation.CREATE,
            AclOperation.CLUSTER_ACTION,
            AclOperation.DESCRIBE_CONFIGS,
            AclOperation.ALTER_CONFIGS,
            AclOperation.IDEMPOTENT_WRITE,
            AclOperation.ALTER,
            AclOperation.DESCRIBE,
        }
    ),
    ResourceType.TRANSACTIONAL_ID: frozenset(
        {AclOperation.DESCRIBE, AclOperation.WRITE, AclOperation.TWO_PHASE_COMMIT}
    ),
    ResourceType.DELEGATION_TOKEN: frozenset({AclOperation.DESCRIBE}),
    ResourceType.USER: frozenset({AclOperation.CREATE_TOKENS, AclOperation.DESCRIBE_TOKENS}),
}

_IMPLIES_DESCRIBE = frozenset(
    {
        AclOperation.DESCRIBE,
        AclOperation.READ,
        AclOperation.WRITE,
        AclOperation.DELETE,
        AclOperation.ALTER,
    }
)
_IMPLIES_DESCRIBE_CONFIGS = frozenset({AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS})


class Decision(enum.Enum):
    ALLOWED = "ALLOWED"
    DENIED = "DENIED"
    # No ACL names the resource: `allow.everyone.if.no.acl.found` decides.
    NO_ACL = "NO_ACL"


@dataclass(frozen=True, slots=True, order=True)
class AclBinding:
    """One ACL as stored (Kafka's StandardAcl / AclBinding)."""

    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: AclOperation
    permission: AclPermissionType

    def to_record(self) -> dict[str, Any]:
        return {
            "resource_type": int(self.resource_type),
            "resource_name": self.resource_name,
            "pattern_type": int(self.pattern_type),
            "principal": self.principal,
            "host": self.host,
            "operation": int(self.operation),
            "permission": int(self.permission),
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> AclBinding:
        return cls(
            ResourceType(record["resource_type"]),
            record["resource_name"],
            PatternType(record["pattern_type"]),
            record["principal"],
            record["host"],
            AclOperation(record["operation"]),
            AclPermissionType(record["permission"]),
        )

    def key(self) -> str:
        """A stable text key for the metadata log (one record per binding)."""
        return (
            f"acl:{int(self.resource_type)}:{int(self.pattern_type)}:{self.resource_name}:"
            f"{self.principal}:{self.host}:{int(self.operation)}:{int(self.permission)}"
        )

    def _applies_to_resource(self, resource_type: ResourceType, name: str) -> bool:
        if self.resource_type is not resource_type:
            return False
        if self.pattern_type is PatternType.LITERAL:
            return self.resource_name == name or self.resource_name == WILDCARD
        if self.pattern_type is PatternType.PREFIXED:
            return name.startswith(self.resource_name)
        return False

    def _result(
        self, principals: tuple[str, ...], host: str, operation: AclOperation
    ) -> AclPermissionType | None:
        """ALLOW or DENY if this entry applies to the request, None if it does not
        (StandardAuthorizerData.findResult)."""
        if self.principal not in principals:
            return None
        if self.host != WILDCARD and not same_host(self.host, host):
            return None
        if self.operation is not AclOperation.ALL:
            if self.permission is AclPermissionType.ALLOW:
                if operation is AclOperation.DESCRIBE:
                    if self.operation not in _IMPLIES_DESCRIBE:
                        return None
                elif operation is AclOperation.DESCRIBE_CONFIGS:
                    if self.operation not in _IMPLIES_DESCRIBE_CONFIGS:
                        return None
                elif operation is not self.operation:
                    return None
            elif operation is not self.operation:
                return None
        return self.permission


@dataclass(frozen=True, slots=True)
class AclBindingFilter:
    """DescribeAcls / DeleteAcls filter: None (or ANY, `*`-less) matches every value.

    Pattern type ANY matches bindings of any pattern type with exactly that name;
    MATCH matches every binding that would apply to a LITERAL resource of that name
    (LITERAL of that name, LITERAL `*`, PREFIXED prefixes of it), as Kafka's
    ResourcePatternFilter does.
    """

    resource_type: ResourceType = ResourceType.ANY
    resource_name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: AclOperation = AclOperation.ANY
    permission: AclPermissionType = AclPermissionType.ANY

    def matches(self, acl: AclBinding) -> bool:
        if self.resource_type is not ResourceType.ANY and acl.resource_type is not (
            self.resource_type
        ):
            return False
        if self.pattern_type is PatternType.MATCH:
            if self.resource_name is None:
                pass
            elif acl.pattern_type is PatternType.LITERAL:
                if acl.resource_name not in (self.resource_name, WILDCARD):
                    return False
            elif acl.pattern_type is PatternType.PREFIXED:
                if not self.resource_name.startswith(acl.resource_name):
                    return False
            else:
                return False
        else:
            if self.pattern_type is not PatternType.ANY and acl.pattern_type is not (
                self.pattern_type
            ):
                return False
            if self.resource_name is not None and acl.resource_name != self.resource_name:
                return False
        if self.principal is not None and acl.principal != self.principal:
            return False
        if self.host is not None and acl.host != self.host:
            return False
        if self.operation is not AclOperation.ANY and acl.operation is not self.operation:
            return False
        return self.permission is AclPermissionType.ANY or acl.permission is self.permission


@dataclass(slots=True)
class AclSet:
    """Every stored ACL, indexed by resource type; replayed from the metadata log."""

    _by_type: dict[ResourceType, set[AclBinding]] = field(default_factory=dict)

    def add(self, acl: AclBinding) -> None:
        self._by_type.setdefault(acl.resource_type, set()).add(acl)

    def remove(self, acl: AclBinding) -> None:
        bucket = self._by_type.get(acl.resource_type)
        if bucket is not None:
            bucket.discard(acl)

    def __contains__(self, acl: object) -> bool:
        return isinstance(acl, AclBinding) and acl in self._by_type.get(acl.resource_type, ())

    def __iter__(self) -> Iterator[AclBinding]:
        for bucket in self._by_type.values():
            yield from bucket

    def __len__(self) -> int:
        return sum(len(bucket) for bucket in self._by_type.values())

    def matching(self, filt: AclBindingFilter) -> list[AclBinding]:
        return sorted(acl for acl in self if filt.matches(acl))

    def authorize(
        self,
        principal: str,
        host: str,
        operation: AclOperation,
        resource_type: ResourceType,
        name: str,
    ) -> Decision:
        """Kafka's decision for `principal` at `host` doing `operation` on the LITERAL
        resource (`resource_type`, `name`); super users are not considered here."""
        principals = (principal, WILDCARD_PRINCIPAL)
        has_resource_acls = False
        allowed = False
        for acl in self._by_type.get(resource_type, ()):
            if not acl._applies_to_resource(resource_type, name):
                continue
            has_resource_acls = True
            result = acl._result(principals, host, operation)
            if result is AclPermissionType.DENY:
                return Decision.DENIED
            if result is AclPermissionType.ALLOW:
                allowed = True
        if allowed:
            return Decision.ALLOWED
        return Decision.DENIED if has_resource_acls else Decision.NO_ACL

    def any_allowed(
        self,
        principal: str,
        host: str,
        operation: AclOperation,
        resource_type: ResourceType,
    ) -> bool:
        """Whether the ACLs let the principal do `operation` on some resource of
        `resource_type`, as Kafka's Authorizer.authorizeByResourceType decides after its
        check of one made-up name (which covers super users and the no-ACL default; the
        caller's): of the entries for this principal (or `User:*`), host (or `*`) and
        exactly this operation (or ALL), a DENY on LITERAL `*` denies; an ALLOW on
        LITERAL `*` allows; else some other ALLOW must survive the DENYs: a LITERAL name
        not denied by the same LITERAL name nor by a PREFIXED deny starting it, a
        PREFIXED name not starting with a PREFIXED deny. No implied operations here."""
        principals = (principal, WILDCARD_PRINCIPAL)
        deny_literal: set[str] = set()
        deny_prefixed: set[str] = set()
        allow: list[AclBinding] = []
        wildcard_allow = False
        for acl in self._by_type.get(resource_type, ()):
            if acl.principal not in principals:
                continue
            if acl.host != WILDCARD and not same_host(acl.host, host):
                continue
            if acl.operation is not operation and acl.operation is not AclOperation.ALL:
                continue
            literal = acl.pattern_type is PatternType.LITERAL
            if acl.permission is AclPermissionType.DENY:
                if literal and acl.resource_name == WILDCARD:
                    return False
                (deny_literal if literal else deny_prefixed).add(acl.resource_name)
            elif literal and acl.resource_name == WILDCARD:
                wildcard_allow = True
            else:
                allow.append(acl)
        if wildcard_allow:
            return True
        for acl in allow:
            if acl.pattern_type is PatternType.LITERAL and acl.resource_name in deny_literal:
                continue
            name = acl.resource_name
            if not any(name[:i] in deny_prefixed for i in range(1, len(name) + 1)):
                return True
        return False


# Kafka's QuorumController.MAX_RECORDS_PER_USER_OP: the most ACLs one CreateAcls or
# DeleteAcls may write.
MAX_RECORDS_PER_USER_OP = 10000


def binding_of(
    resource_type: int,
    resource_name: str,
    pattern_type: int,
    principal: str,
    host: str,
    operation: int,
    permission: int,
) -> AclBinding:
    """A binding from a request's wire codes (unknown codes become UNKNOWN)."""
    return AclBinding(
        ResourceType.from_code(resource_type),
        resource_name,
        PatternType.from_code(pattern_type),
        principal,
        host,
        AclOperation.from_code(operation),
        AclPermissionType.from_code(permission),
    )


def validate_new_acl(acl: AclBinding) -> None:
    """CreateAcls' checks of one binding, INVALID_REQUEST with Kafka's words: the
    CLUSTER resource's name and an empty name (AclApis.handleCreateAcls), then the
    types, the name again and the principal's `Type:name` form
    (AclControlManager.validateNewAcl). Hosts: empty is refused and a CIDR range is
    UNSUPPORTED_VERSION, as Kafka's controller answers them before KIP-1276's metadata
    version (Kafka 4.2 itself would store a range and never match it)."""

    def invalid(message: str) -> KafkaError:
        return KafkaError(ErrorCode.invalid_request, message)

    if acl.resource_type is ResourceType.CLUSTER and acl.resource_name != CLUSTER_NAME:
        raise invalid(f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}")
    if not acl.resource_name:
        raise invalid("Invalid empty resource name")
    if acl.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
        raise invalid(f"Invalid resourceType {acl.resource_type.name}")
    if acl.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise invalid(f"Invalid patternType {acl.pattern_type.name}")
    if acl.operation in (AclOperation.UNKNOWN, AclOperation.ANY):
        raise invalid(f"Invalid operation {acl.operation.name}")
    if acl.permission not in (AclPermissionType.ALLOW, AclPermissionType.DENY):
        raise invalid(f"Invalid permissionType {acl.permission.name}")
    if ":" not in acl.principal:
        raise invalid(
            f"Could not parse principal from `{acl.principal}` (no colon is present "
            "separating the principal type from the principal name)"
        )
    if not acl.host:
        raise invalid("Host pattern cannot be null or empty")
    if "/" in acl.host:
        raise KafkaError(
            ErrorCode.unsupported_version,
            f"Host {acl.host!r} is a CIDR range; Kafka 4.2 matches ACL hosts exactly "
            "(ranges are KIP-1276): give one address or *",
        )


def validate_filter(filt: AclBindingFilter) -> None:
    """DescribeAcls' and DeleteAcls' check of a filter (AclControlManager.validateFilter
    and the requests' refusal of UNKNOWN elements): INVALID_REQUEST."""
    if filt.resource_type is ResourceType.UNKNOWN or filt.pattern_type is PatternType.UNKNOWN:
        raise KafkaError(ErrorCode.invalid_request, "Unknown patternFilter.")
    if filt.operation is AclOperation.UNKNOWN or filt.permission is AclPermissionType.UNKNOWN:
        raise KafkaError(ErrorCode.invalid_request, "Unknown entryFilter.")


def bindings(records: Iterable[dict[str, Any]]) -> list[AclBinding]:
    return [AclBinding.from_record(r) for r in records]
