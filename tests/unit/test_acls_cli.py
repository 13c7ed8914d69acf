"""`spool acls`: kafka-acls.sh's argument rules and the ACLs its flags name
(AclCommand's checkArgs, getResourceFilterToAcls, --producer/--consumer). No sockets."""

from __future__ import annotations

import argparse

import pytest

from broker.cli import build_parser
from broker.tools import acls as tool
from broker.tools.common import UsageError
from coordinator.acls import AclOperation, AclPermissionType, PatternType, ResourceType

B = ["--bootstrap-server", "127.0.0.1:1"]
Op = AclOperation
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
TOPIC, GROUP, CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
LITERAL, PREFIXED = PatternType.LITERAL, PatternType.PREFIXED


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["acls", *B, *argv])


def rule_broken(*argv: str) -> str:
    with pytest.raises(UsageError) as exc:
        tool.validate(parse(*argv))
    return str(exc.value)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ((), "exactly one action: --list, --add, --remove"),
        (("--add", "--list"), "exactly one action"),
        (("--list", "--allow-principal", "User:a"), '"[list]" can\'t be used with option'),
        (("--list", "--producer", "--topic", "t"), "can't be used"),
        (
            (
                "--add",
                "--producer",
                "--topic",
                "t",
                "--allow-principal",
                "User:a",
                "--operation",
                "Read",
            ),
            '"[producer]" can\'t be used with option "[operation]"',
        ),
        (
            ("--add", "--consumer", "--topic", "t", "--group", "g", "--deny-principal", "User:a"),
            "can't be used",
        ),
        (("--add", "--principal", "User:a"), "only available if --list is set"),
        (("--add", "--producer", "--allow-principal", "User:a"), "With --producer you must"),
        (("--add", "--idempotent", "--topic", "t"), "only available if --producer is set"),
        (
            ("--add", "--consumer", "--topic", "t", "--allow-principal", "User:a"),
            "With --consumer you must specify a --topic and a --group",
        ),
        (("--add", "--allow-principal", "User:a"), "You must provide at least one resource"),
        (("--add", "--topic", "t"), "You must specify one of: --allow-principal, --deny-principal"),
        (("--add", "--topic", "t", "--allow-principal", "alice"), "principalType:principalName"),
        (
            (
                "--add",
                "--topic",
                "t",
                "--allow-principal",
                "User:a",
                "--resource-pattern-type",
                "match",
            ),
            "'--resource-pattern-type' value of 'MATCH' is not valid when adding acls",
        ),
        (
            (
                "--add",
                "--topic",
                "t",
                "--allow-principal",
                "User:a",
                "--operation",
                "IdempotentWrite",
            ),
            "ResourceType TOPIC only supports operations",
        ),
        (
            ("--add", "--topic", "t", "--allow-principal", "User:a", "--operation", "Fly"),
            "ResourceType TOPIC only supports operations",
        ),
        (("--list", "--principal", "nobody"), "principalType:principalName"),
    ],
)
def test_rules(argv: tuple[str, ...], message: str) -> None:
    assert message in rule_broken(*argv)


def test_unknown_pattern_type_is_argparses_error() -> None:
    with pytest.raises(SystemExit):
        parse("--list", "--resource-pattern-type", "fuzzy")


def test_add_makes_one_acl_per_principal_operation_and_host() -> None:
    args = parse(
        "--add",
        "--topic",
        "orders",
        "--allow-principal",
        "User:alice",
        "--allow-principal",
        "User:bob",
        "--operation",
        "Read",
        "--operation",
        "describe",
        "--allow-host",
        "10.0.0.1",
        "--deny-principal",
        "User:eve",
    )
    tool.validate(args)
    plan = tool.plan(args)
    assert list(plan) == [(TOPIC, "orders", LITERAL)]
    assert plan[(TOPIC, "orders", LITERAL)] == {
        ("User:alice", "10.0.0.1", Op.READ, ALLOW),
        ("User:alice", "10.0.0.1", Op.DESCRIBE, ALLOW),
        ("User:bob", "10.0.0.1", Op.READ, ALLOW),
        ("User:bob", "10.0.0.1", Op.DESCRIBE, ALLOW),
        ("User:eve", "*", Op.READ, DENY),
        ("User:eve", "*", Op.DESCRIBE, DENY),
    }


def test_operation_defaults_to_all_and_names_parse_as_kafka_does() -> None:
    args = parse("--add", "--cluster", "--allow-principal", "User:ops")
    assert tool.plan(args) == {
        (CLUSTER, "kafka-cluster", LITERAL): {("User:ops", "*", Op.ALL, ALLOW)}
    }
    assert tool.parse_operation("IdempotentWrite") is Op.IDEMPOTENT_WRITE
    assert tool.parse_operation("IDEMPOTENTWRITE") is Op.IDEMPOTENT_WRITE
    assert tool.parse_operation("describe_configs") is Op.DESCRIBE_CONFIGS
    assert tool.parse_operation("nope") is Op.UNKNOWN


def test_producer_and_consumer_roles() -> None:
    args = parse(
        "--add",
        "--producer",
        "--consumer",
        "--idempotent",
        "--topic",
        "team-",
        "--group",
        "g",
        "--transactional-id",
        "tx",
        "--allow-principal",
        "User:app",
        "--resource-pattern-type",
        "prefixed",
    )
    tool.validate(args)
    plan = tool.plan(args)

    def ops(p: tuple[ResourceType, str, PatternType]) -> set[AclOperation]:
        return {e[2] for e in plan[p]}

    assert ops((TOPIC, "team-", PREFIXED)) == {Op.WRITE, Op.DESCRIBE, Op.CREATE, Op.READ}
    assert ops((GROUP, "g", PREFIXED)) == {Op.READ}
    assert ops((ResourceType.TRANSACTIONAL_ID, "tx", PREFIXED)) == {Op.WRITE, Op.DESCRIBE}
    assert ops((CLUSTER, "kafka-cluster", LITERAL)) == {Op.IDEMPOTENT_WRITE}
    # --producer alone: no cluster ACL (kafka-acls.sh adds one only with --idempotent).
    plain = tool.plan(parse("--add", "--producer", "--topic", "t", "--allow-principal", "User:a"))
    assert list(plain) == [(TOPIC, "t", LITERAL)]


def test_remove_without_principal_names_the_whole_filter() -> None:
    args = parse("--remove", "--topic", "t", "--resource-pattern-type", "any", "--force")
    tool.validate(args)
    assert tool.plan(args) == {(TOPIC, "t", PatternType.ANY): set()}


def test_kafka_text_forms() -> None:
    assert (
        tool.pattern_text((TOPIC, "orders", PREFIXED))
        == "ResourcePattern(resourceType=TOPIC, name=orders, patternType=PREFIXED)"
    )
    assert (
        tool.entry_text(("User:a", "*", Op.READ, ALLOW))
        == "(principal=User:a, host=*, operation=READ, permissionType=ALLOW)"
    )
