"""Kafka's StandardAuthorizer decisions over stored ACLs (coordinator.acls), its
authorizeByResourceType, the filters DescribeAcls and DeleteAcls use, and CreateAcls'
checks of a new binding; the broker's wrapper (super users, the no-ACL default, denial
counts) in broker.authorizer. Sans-IO."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from broker import cli
from broker.authorizer import Authorizer, parse_super_users
from broker.config import BrokerConfig
from broker.security import KafkaPrincipal, SecurityContext
from coordinator.acls import (
    CLUSTER_NAME,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AclSet,
    Decision,
    PatternType,
    ResourceType,
    binding_of,
    validate_filter,
    validate_new_acl,
)
from protocol.errors import ErrorCode, KafkaError

Op = AclOperation
TOPIC, GROUP, CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
LITERAL, PREFIXED = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
HOST = "10.0.0.5"


def acl(
    name: str = "orders",
    op: AclOperation = Op.READ,
    permission: AclPermissionType = ALLOW,
    *,
    principal: str = "User:alice",
    host: str = "*",
    pattern: PatternType = LITERAL,
    rtype: ResourceType = TOPIC,
) -> AclBinding:
    return AclBinding(rtype, name, pattern, principal, host, op, permission)


def acls(*bindings: AclBinding) -> AclSet:
    s = AclSet()
    for b in bindings:
        s.add(b)
    return s


def decide(
    s: AclSet,
    op: AclOperation = Op.READ,
    name: str = "orders",
    *,
    principal: str = "User:alice",
    host: str = HOST,
    rtype: ResourceType = TOPIC,
) -> Decision:
    return s.authorize(principal, host, op, rtype, name)


# -- decisions ----------------------------------------------------------------------------


def test_no_acl_on_the_resource_leaves_it_to_the_default() -> None:
    assert decide(AclSet()) is Decision.NO_ACL
    # ACLs on other resources (or other types) do not make this one "has ACLs".
    s = acls(acl("payments"), acl("orders", rtype=GROUP))
    assert decide(s) is Decision.NO_ACL


def test_an_allow_for_the_operation_allows_and_others_do_not() -> None:
    s = acls(acl("orders", Op.READ))
    assert decide(s, Op.READ) is Decision.ALLOWED
    assert decide(s, Op.WRITE) is Decision.DENIED


def test_acls_for_someone_else_deny_rather_than_default() -> None:
    # The resource has ACLs, none for bob: denied, not the no-ACL default.
    s = acls(acl("orders", principal="User:alice"))
    assert decide(s, principal="User:bob") is Decision.DENIED


def test_deny_wins_over_allow_from_any_matching_pattern() -> None:
    s = acls(
        acl("orders", Op.ALL),
        acl("ord", Op.READ, DENY, pattern=PREFIXED),
    )
    assert decide(s, Op.READ) is Decision.DENIED
    assert decide(s, Op.WRITE) is Decision.ALLOWED
    # A wildcard-principal DENY on the wildcard resource denies everyone.
    s2 = acls(acl("orders", Op.READ), acl("*", Op.READ, DENY, principal="User:*"))
    assert decide(s2, Op.READ) is Decision.DENIED


def test_read_write_delete_alter_imply_describe_only_when_allowed() -> None:
    for op in (Op.READ, Op.WRITE, Op.DELETE, Op.ALTER, Op.DESCRIBE):
        assert decide(acls(acl(op=op)), Op.DESCRIBE) is Decision.ALLOWED, op
    for op in (Op.CREATE, Op.ALTER_CONFIGS, Op.DESCRIBE_CONFIGS, Op.IDEMPOTENT_WRITE):
        assert decide(acls(acl(op=op)), Op.DESCRIBE) is Decision.DENIED, op
    assert decide(acls(acl(op=Op.ALTER_CONFIGS)), Op.DESCRIBE_CONFIGS) is Decision.ALLOWED
    assert decide(acls(acl(op=Op.DESCRIBE_CONFIGS)), Op.ALTER_CONFIGS) is Decision.DENIED
    # A DENY READ does not deny DESCRIBE (implication is for ALLOW only) ...
    s = acls(acl(op=Op.READ, permission=DENY), acl(op=Op.DESCRIBE))
    assert decide(s, Op.DESCRIBE) is Decision.ALLOWED
    # ... but DENY ALL does.
    s = acls(acl(op=Op.ALL, permission=DENY), acl(op=Op.DESCRIBE))
    assert decide(s, Op.DESCRIBE) is Decision.DENIED


def test_wildcard_principal_host_and_resource() -> None:
    s = acls(acl("*", Op.WRITE, principal="User:*"))
    assert decide(s, Op.WRITE, "anything", principal="User:carol") is Decision.ALLOWED
    s = acls(acl(op=Op.WRITE, host=HOST))
    assert decide(s, Op.WRITE, host=HOST) is Decision.ALLOWED
    assert decide(s, Op.WRITE, host="10.0.0.6") is Decision.DENIED


def test_hosts_match_exactly_as_in_kafka_4_2() -> None:
    # Kafka 4.2 compares an ACL's host with the client's address as strings; CIDR
    # ranges came later (KIP-1276). A stored range therefore covers no client.
    s = acls(acl(op=Op.WRITE, host="10.0.0.0/24"))
    assert decide(s, Op.WRITE, host="10.0.0.5") is Decision.DENIED


@pytest.mark.parametrize(
    ("acl_host", "client_host"),
    [
        ("0:0:0:0:0:0:0:1", "::1"),  # Java's spelling in the ACL, Python's from the socket
        ("::1", "0:0:0:0:0:0:0:1"),
        ("::ffff:10.0.0.5", "10.0.0.5"),
        ("2001:DB8::5", "2001:db8:0:0:0:0:0:5"),
    ],
)
def test_an_ip_address_matches_however_it_is_spelled(acl_host: str, client_host: str) -> None:
    for permission, decision in ((ALLOW, Decision.ALLOWED), (DENY, Decision.DENIED)):
        s = acls(acl(op=Op.WRITE, permission=permission, host=acl_host))
        assert decide(s, Op.WRITE, host=client_host) is decision
        # Another address is another host.
        assert decide(s, Op.WRITE, host="::2") is Decision.DENIED
    assert any_allowed(acls(acl(op=Op.WRITE, host=acl_host)), host=client_host)
    assert not any_allowed(
        acls(acl(op=Op.WRITE), acl("*", Op.WRITE, DENY, host=acl_host)), host=client_host
    )


def test_prefixed_acls_cover_names_that_start_with_them_and_no_others() -> None:
    s = acls(acl("team-a.", Op.WRITE, pattern=PREFIXED))
    assert decide(s, Op.WRITE, "team-a.orders") is Decision.ALLOWED
    assert decide(s, Op.WRITE, "team-a.") is Decision.ALLOWED
    assert decide(s, Op.WRITE, "team-b.orders") is Decision.NO_ACL
    assert decide(s, Op.WRITE, "team-a") is Decision.NO_ACL
    # A LITERAL ACL whose name is only a prefix of the resource's does not apply.
    s = acls(acl("team", Op.WRITE))
    assert decide(s, Op.WRITE, "team-a.orders") is Decision.NO_ACL
    # A LITERAL "*" is the wildcard; a PREFIXED "*" is the prefix "*", no wildcard.
    s = acls(acl("*", Op.WRITE, pattern=PREFIXED))
    assert decide(s, Op.WRITE, "orders") is Decision.NO_ACL


def test_cluster_acls() -> None:
    s = acls(acl(CLUSTER_NAME, Op.ALTER, rtype=CLUSTER))
    assert decide(s, Op.ALTER, CLUSTER_NAME, rtype=CLUSTER) is Decision.ALLOWED
    assert decide(s, Op.DESCRIBE, CLUSTER_NAME, rtype=CLUSTER) is Decision.ALLOWED
    assert decide(s, Op.CLUSTER_ACTION, CLUSTER_NAME, rtype=CLUSTER) is Decision.DENIED


# -- authorizeByResourceType --------------------------------------------------------------


def any_allowed(
    s: AclSet, op: AclOperation = Op.WRITE, rtype: ResourceType = TOPIC, *, host: str = HOST
) -> bool:
    return s.any_allowed("User:alice", host, op, rtype)


def test_by_resource_type() -> None:
    assert not any_allowed(AclSet())
    assert any_allowed(acls(acl("t1", Op.WRITE)))
    assert any_allowed(acls(acl("t1", Op.ALL)))
    # No implied operations: READ does not give DESCRIBE here.
    assert not any_allowed(acls(acl("t1", Op.READ)), Op.DESCRIBE)
    # A LITERAL allow denied by the same LITERAL deny, or by a PREFIXED deny of it.
    assert not any_allowed(acls(acl("t1", Op.WRITE), acl("t1", Op.WRITE, DENY)))
    assert not any_allowed(acls(acl("t1", Op.WRITE), acl("t", Op.WRITE, DENY, pattern=PREFIXED)))
    # A PREFIXED allow survives a deny on a longer prefix.
    assert any_allowed(
        acls(
            acl("t", Op.WRITE, pattern=PREFIXED),
            acl("t1", Op.WRITE, DENY, pattern=PREFIXED),
        )
    )
    # A wildcard DENY denies everything; a wildcard ALLOW allows.
    assert not any_allowed(acls(acl("t1", Op.WRITE), acl("*", Op.WRITE, DENY)))
    assert any_allowed(acls(acl("*", Op.WRITE)))
    # Other principals' and hosts' ACLs do not count.
    assert not any_allowed(acls(acl("t1", Op.WRITE, principal="User:bob")))
    assert not any_allowed(acls(acl("t1", Op.WRITE, host="10.9.9.9")))


# -- filters ------------------------------------------------------------------------------


STORED = [
    acl("orders", Op.READ),
    acl("orders", Op.WRITE, DENY, principal="User:bob"),
    acl("ord", Op.READ, pattern=PREFIXED),
    acl("*", Op.DESCRIBE),
    acl("payments", Op.READ),
    acl("orders", Op.READ, rtype=GROUP),
]


def matching(filt: AclBindingFilter) -> set[AclBinding]:
    return set(acls(*STORED).matching(filt))


def test_filter_any_matches_everything() -> None:
    assert matching(AclBindingFilter()) == set(STORED)


def test_filter_literal_and_prefixed_match_that_pattern_exactly() -> None:
    assert matching(AclBindingFilter(TOPIC, "orders", LITERAL)) == set(STORED[:2])
    assert matching(AclBindingFilter(TOPIC, "ord", PREFIXED)) == {STORED[2]}
    assert matching(AclBindingFilter(TOPIC, "orders", PREFIXED)) == set()


def test_filter_any_pattern_matches_the_name_under_every_pattern_type() -> None:
    assert matching(AclBindingFilter(ResourceType.ANY, "orders", PatternType.ANY)) == {
        STORED[0],
        STORED[1],
        STORED[5],
    }


def test_filter_match_finds_every_acl_that_applies_to_the_resource() -> None:
    assert matching(AclBindingFilter(TOPIC, "orders", PatternType.MATCH)) == set(STORED[:4])
    assert matching(AclBindingFilter(TOPIC, "payments", PatternType.MATCH)) == {
        STORED[3],
        STORED[4],
    }


def test_filter_entry_fields() -> None:
    assert matching(AclBindingFilter(principal="User:bob")) == {STORED[1]}
    assert matching(AclBindingFilter(operation=Op.DESCRIBE)) == {STORED[3]}
    assert matching(AclBindingFilter(permission=DENY)) == {STORED[1]}
    assert matching(AclBindingFilter(host="10.0.0.1")) == set()


def test_filter_with_unknown_elements_is_refused() -> None:
    for filt in (
        AclBindingFilter(resource_type=ResourceType.UNKNOWN),
        AclBindingFilter(pattern_type=PatternType.UNKNOWN),
        AclBindingFilter(operation=Op.UNKNOWN),
        AclBindingFilter(permission=AclPermissionType.UNKNOWN),
    ):
        with pytest.raises(KafkaError) as exc:
            validate_filter(filt)
        assert exc.value.code == ErrorCode.invalid_request
    validate_filter(AclBindingFilter(pattern_type=PatternType.MATCH))


# -- new bindings -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("binding", "code", "words"),
    [
        (acl(rtype=ResourceType.ANY), ErrorCode.invalid_request, "Invalid resourceType ANY"),
        (acl(rtype=ResourceType.UNKNOWN), ErrorCode.invalid_request, "resourceType UNKNOWN"),
        (acl(pattern=PatternType.MATCH), ErrorCode.invalid_request, "Invalid patternType MATCH"),
        (acl(pattern=PatternType.ANY), ErrorCode.invalid_request, "Invalid patternType ANY"),
        (acl(op=Op.ANY), ErrorCode.invalid_request, "Invalid operation ANY"),
        (acl(op=Op.UNKNOWN), ErrorCode.invalid_request, "Invalid operation UNKNOWN"),
        (acl(permission=AclPermissionType.ANY), ErrorCode.invalid_request, "permissionType"),
        (acl(""), ErrorCode.invalid_request, "Invalid empty resource name"),
        (acl(principal="alice"), ErrorCode.invalid_request, "no colon"),
        (acl(host=""), ErrorCode.invalid_request, "Host"),
        (acl(host="10.0.0.0/8"), ErrorCode.unsupported_version, "CIDR"),
        (
            acl("my-cluster", Op.ALTER, rtype=CLUSTER),
            ErrorCode.invalid_request,
            "The only valid name for the CLUSTER resource is kafka-cluster",
        ),
    ],
)
def test_invalid_new_acls(binding: AclBinding, code: ErrorCode, words: str) -> None:
    with pytest.raises(KafkaError) as exc:
        validate_new_acl(binding)
    assert exc.value.code == code
    assert words in (exc.value.message or "")


def test_valid_new_acls() -> None:
    for binding in (
        acl(),
        acl("team-", pattern=PREFIXED, op=Op.ALL, permission=DENY),
        acl("*", principal="User:*", host=HOST),
        acl(CLUSTER_NAME, Op.ALTER, rtype=CLUSTER),
        acl("alice", Op.DESCRIBE, rtype=ResourceType.USER),
    ):
        validate_new_acl(binding)


def test_unknown_wire_codes_become_unknown() -> None:
    b = binding_of(99, "orders", 99, "User:alice", "*", 99, 99)
    assert b.resource_type is ResourceType.UNKNOWN
    assert b.pattern_type is PatternType.UNKNOWN
    assert b.operation is Op.UNKNOWN
    assert b.permission is AclPermissionType.UNKNOWN


def test_record_round_trip() -> None:
    for b in STORED:
        assert AclBinding.from_record(b.to_record()) == b


# -- the broker's authorizer --------------------------------------------------------------


@dataclass(frozen=True)
class Ctx:
    security: SecurityContext
    client_host: str = HOST


def ctx(name: str) -> Ctx:
    return Ctx(SecurityContext("SASL_PLAINTEXT", "SASL_PLAINTEXT", KafkaPrincipal("User", name)))


def authorizer(s: AclSet, *, allow_if_no_acl: bool = False) -> Authorizer:
    return Authorizer(
        enabled=True,
        acls=lambda: s,
        super_users=parse_super_users(" User:admin ; ;User:ops"),
        allow_if_no_acl=allow_if_no_acl,
    )


def test_super_users_pass_every_check_even_a_deny() -> None:
    a = authorizer(acls(acl("orders", Op.ALL, DENY, principal="User:*")))
    assert a.allows(ctx("admin"), Op.READ, TOPIC, "orders")
    assert a.allows(ctx("ops"), Op.ALTER, CLUSTER)
    assert not a.allows(ctx("alice"), Op.READ, TOPIC, "orders")


@pytest.mark.parametrize("value", ["admin", "User:admin;ops", ":admin", "User:"])
def test_a_super_user_without_its_type_is_refused_at_startup(value: str) -> None:
    # Kafka's StandardAuthorizer parses each one (SecurityUtils.parseKafkaPrincipal): a
    # bare name would match no principal, and the operator would think it a super user.
    with pytest.raises(KafkaError) as info:
        parse_super_users(value)
    assert info.value.code == ErrorCode.invalid_config
    assert "principalType:principalName" in info.value.message


@pytest.mark.parametrize(
    ("name", "enabled"),
    [
        ("", False),
        ("org.apache.kafka.metadata.authorizer.StandardAuthorizer", True),
        ("kafka.security.authorizer.AclAuthorizer", True),
    ],
)
def test_authorizer_class_names_kafka_has(name: str, enabled: bool) -> None:
    config = BrokerConfig({"authorizer.class.name": name, "super.users": "User:admin"})
    assert Authorizer.from_config(config, AclSet).enabled is enabled


def test_an_authorizer_class_spool_cannot_load_is_refused_at_startup(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Not silently StandardAuthorizer rules under another class's name: Kafka fails to
    # start on a class it cannot load, and so does spool.
    config = BrokerConfig({"authorizer.class.name": "org.openpolicyagent.kafka.OpaAuthorizer"})
    with pytest.raises(KafkaError) as info:
        Authorizer.from_config(config, AclSet)
    assert info.value.code == ErrorCode.invalid_config
    assert "OpaAuthorizer" in info.value.message
    args = cli.build_parser().parse_args(
        ["serve", "--data-dir", str(tmp_path / "d"), "--set", "super.users=admin"]
    )
    assert cli.serve(args) == 2
    assert "super.users" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


def test_no_acl_default_is_deny_unless_allow_everyone() -> None:
    assert not authorizer(AclSet()).allows(ctx("alice"), Op.READ, TOPIC, "orders")
    open_ = authorizer(AclSet(), allow_if_no_acl=True)
    assert open_.allows(ctx("alice"), Op.READ, TOPIC, "orders")
    # The default applies only to resources nobody has ACLs on.
    s = acls(acl("orders", Op.READ, principal="User:bob"))
    assert not authorizer(s, allow_if_no_acl=True).allows(ctx("alice"), Op.READ, TOPIC, "orders")


def test_denials_are_counted_by_operation_and_resource_type() -> None:
    a = authorizer(acls(acl("orders", Op.READ)))
    assert a.allows(ctx("alice"), Op.READ, TOPIC, "orders")
    assert not a.allows(ctx("alice"), Op.WRITE, TOPIC, "orders")
    assert not a.allows(ctx("alice"), Op.WRITE, TOPIC, "orders", log_denied=False)
    assert not a.allows(ctx("bob"), Op.ALTER, CLUSTER)
    assert a.denials == {("WRITE", "TOPIC"): 2, ("ALTER", "CLUSTER"): 1}
    assert a.acl_count() == 1


def test_allows_any_checks_the_made_up_name_first() -> None:
    # allow.everyone.if.no.acl.found covers a type nobody has ACLs on, as in Kafka.
    assert authorizer(AclSet(), allow_if_no_acl=True).allows_any(ctx("alice"), Op.WRITE, TOPIC)
    assert not authorizer(AclSet()).allows_any(ctx("alice"), Op.WRITE, TOPIC)
    assert authorizer(acls(acl("t1", Op.WRITE))).allows_any(ctx("alice"), Op.WRITE, TOPIC)
    a = authorizer(AclSet())
    assert a.allows_any(ctx("admin"), Op.IDEMPOTENT_WRITE, CLUSTER)
    assert not a.allows_any(ctx("alice"), Op.IDEMPOTENT_WRITE, CLUSTER)
    assert a.denials == {("IDEMPOTENT_WRITE", "CLUSTER"): 1}


def test_without_an_authorizer_everything_is_allowed() -> None:
    a = Authorizer(enabled=False, acls=AclSet)
    assert a.allows(ctx("alice"), Op.ALTER, CLUSTER)
    assert a.allows_any(ctx("alice"), Op.WRITE, TOPIC)
    assert not a.denials


def test_denials_and_the_acl_count_are_in_metrics() -> None:
    from broker.metrics import BrokerMetrics, collect
    from tests.unit.test_metrics import bare_broker, samples

    a = authorizer(acls(acl("orders", Op.READ)))
    a.allows(ctx("alice"), Op.WRITE, TOPIC, "orders")
    a.allows(ctx("bob"), Op.ALTER, CLUSTER)
    a.allows(ctx("bob"), Op.ALTER, CLUSTER)
    broker = bare_broker(BrokerMetrics())
    broker.authorizer = a
    got = samples(collect(broker))
    name = "spool_authorizer_denied_total"
    assert got[(name, (("operation", "WRITE"), ("resource_type", "TOPIC")))] == 1
    assert got[(name, (("operation", "ALTER"), ("resource_type", "CLUSTER")))] == 2
    assert got[("spool_authorizer_acls", ())] == 1
