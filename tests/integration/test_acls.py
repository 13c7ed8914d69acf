"""ACLs on a real broker: `spool acls` as kafka-acls.sh (add, list, remove, prefixed,
--producer/--consumer), CreateAcls/DescribeAcls/DeleteAcls from confluent-kafka's admin
client, CLUSTER_AUTHORIZATION_FAILED for a SASL user without ALTER on the cluster (and
the denial on /metrics), ACLs surviving kill -9, SECURITY_DISABLED without an
authorizer, and concurrent creates and deletes from several clients each landing once.

The broker has Kafka's StandardAuthorizer on, PLAINTEXT for the CLI (which cannot
authenticate yet, so `super.users` names its principal, User:ANONYMOUS) and
SASL_PLAINTEXT with PLAIN users from the JAAS entry, as a Kafka broker is configured.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from tests.integration.cli_helpers import CLI_TIMEOUT_S, ok, spool
from tests.integration.conftest import REPO_ROOT, Broker, admin_config, free_port, started

STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    'username="admin" password="admin-secret" '
    'user_admin="admin-secret" user_alice="alice-secret";'
)
TIMEOUT_S = 30


class AclBroker(Broker):
    """ACLs on: PLAINTEXT on `port` (super user ANONYMOUS), SASL_PLAINTEXT on
    `sasl_port`, /metrics on `metrics_port`."""

    def __init__(self, root: Path) -> None:
        super().__init__(
            root / "data",
            root / "broker.log",
            {
                "authorizer.class.name": STANDARD_AUTHORIZER,
                "super.users": "User:ANONYMOUS;User:admin",
                "sasl.enabled.mechanisms": "PLAIN",
                "listener.name.sasl_plaintext.plain.sasl.jaas.config": JAAS,
            },
        )
        self.sasl_port = free_port()
        self.metrics_port = free_port()
        self.settings["listeners"] = (
            f"PLAINTEXT://127.0.0.1:{self.port},SASL_PLAINTEXT://127.0.0.1:{self.sasl_port}"
        )

    def command(self) -> list[str]:
        return [*super().command(), "--metrics", f"127.0.0.1:{self.metrics_port}"]

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            body: bytes = response.read()
        return body.decode()


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AclBroker]:
    with started(AclBroker(tmp_path_factory.mktemp("acls"))) as broker:
        yield broker


def sasl_admin(broker: AclBroker, user: str, password: str) -> AdminClient:
    return AdminClient(
        admin_config(
            broker,
            **{
                "bootstrap.servers": f"127.0.0.1:{broker.sasl_port}",
                "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "PLAIN",
                "sasl.username": user,
                "sasl.password": password,
            },
        )
    )


def listed(broker: Broker, *argv: str) -> set[tuple[str, str, str, str, str]]:
    """`spool acls --list --output json`: (type, name, pattern, principal, operation)."""
    out = json.loads(ok(broker, "acls", "--list", "--output", "json", *argv))
    return {
        (r["resource_type"], r["resource_name"], r["pattern_type"], a["principal"], a["operation"])
        for r in out
        for a in r["acls"]
    }


ANY_FILTER = AclBindingFilter(
    ResourceType.ANY,
    None,
    ResourcePatternType.ANY,
    None,
    None,
    AclOperation.ANY,
    AclPermissionType.ANY,
)


def remove_all(broker: Broker) -> None:
    """Every ACL deleted (the module's broker is shared by the tests)."""
    admin = AdminClient(admin_config(broker))
    for f in admin.delete_acls([ANY_FILTER]).values():
        f.result(timeout=TIMEOUT_S)


def test_add_list_remove_round_trip(acl_broker: AclBroker) -> None:
    b = acl_broker
    remove_all(b)
    out = ok(
        b,
        "acls",
        "--add",
        "--allow-principal",
        "User:alice",
        "--operation",
        "Read",
        "--operation",
        "Describe",
        "--topic",
        "orders",
    )
    assert "Adding ACLs for resource `ResourcePattern(resourceType=TOPIC, name=orders" in out
    assert "(principal=User:alice, host=*, operation=READ, permissionType=ALLOW)" in out
    ok(
        b,
        "acls",
        "--add",
        "--deny-principal",
        "User:bob",
        "--topic",
        "team-a.",
        "--force",
        "--resource-pattern-type",
        "prefixed",
    )
    # Adding again reports the ACL and leaves it.
    again = ok(
        b,
        "acls",
        "--add",
        "--allow-principal",
        "User:alice",
        "--operation",
        "Read",
        "--topic",
        "orders",
    )
    assert "already exists" in again
    assert listed(b) == {
        ("TOPIC", "orders", "LITERAL", "User:alice", "READ"),
        ("TOPIC", "orders", "LITERAL", "User:alice", "DESCRIBE"),
        ("TOPIC", "team-a.", "PREFIXED", "User:bob", "ALL"),
    }
    # The table form is kafka-acls.sh's.
    table = ok(b, "acls", "--list", "--topic", "orders")
    assert (
        "Current ACLs for resource `ResourcePattern(resourceType=TOPIC, name=orders, "
        "patternType=LITERAL)`:" in table
    )
    # match: every ACL that applies to topic team-a.x; any: the name under any pattern.
    assert listed(b, "--topic", "team-a.x", "--resource-pattern-type", "match") == {
        ("TOPIC", "team-a.", "PREFIXED", "User:bob", "ALL"),
    }
    assert listed(b, "--topic", "team-a.", "--resource-pattern-type", "any") == {
        ("TOPIC", "team-a.", "PREFIXED", "User:bob", "ALL"),
    }
    assert listed(b, "--topic", "team-a.") == set()  # LITERAL team-a.: none
    assert listed(b, "--principal", "User:bob") == {
        ("TOPIC", "team-a.", "PREFIXED", "User:bob", "ALL"),
    }
    # Remove one operation's ACL, then the whole prefixed resource.
    ok(
        b,
        "acls",
        "--remove",
        "--force",
        "--allow-principal",
        "User:alice",
        "--operation",
        "Describe",
        "--topic",
        "orders",
    )
    assert listed(b, "--topic", "orders") == {("TOPIC", "orders", "LITERAL", "User:alice", "READ")}
    # Without --force and with no terminal to ask on, --remove neither waits for an
    # answer nor removes unasked: it fails, as kafka-acls.sh does.
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "broker",
            "acls",
            "--bootstrap-server",
            b.bootstrap,
            "--remove",
            "--topic",
            "team-a.",
            "--resource-pattern-type",
            "prefixed",
        ],
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    assert "give --force" in proc.stderr
    assert ("TOPIC", "team-a.", "PREFIXED", "User:bob", "ALL") in listed(b)
    ok(
        b,
        "acls",
        "--remove",
        "--force",
        "--topic",
        "team-a.",
        "--resource-pattern-type",
        "prefixed",
    )
    assert listed(b) == {("TOPIC", "orders", "LITERAL", "User:alice", "READ")}


def test_producer_and_consumer_roles(acl_broker: AclBroker) -> None:
    b = acl_broker
    remove_all(b)
    ok(b, "acls", "--add", "--producer", "--topic", "jobs", "--allow-principal", "User:app")
    ok(
        b,
        "acls",
        "--add",
        "--consumer",
        "--topic",
        "jobs",
        "--group",
        "workers",
        "--allow-principal",
        "User:app",
    )
    ok(
        b,
        "acls",
        "--add",
        "--producer",
        "--idempotent",
        "--topic",
        "jobs",
        "--allow-principal",
        "User:app2",
    )
    assert listed(b, "--principal", "User:app") == {
        ("TOPIC", "jobs", "LITERAL", "User:app", "WRITE"),
        ("TOPIC", "jobs", "LITERAL", "User:app", "DESCRIBE"),
        ("TOPIC", "jobs", "LITERAL", "User:app", "CREATE"),
        ("TOPIC", "jobs", "LITERAL", "User:app", "READ"),
        ("GROUP", "workers", "LITERAL", "User:app", "READ"),
    }
    assert ("CLUSTER", "kafka-cluster", "LITERAL", "User:app2", "IDEMPOTENT_WRITE") in listed(
        b, "--cluster"
    )
    # --remove with the role flags removes exactly what they added.
    ok(
        b,
        "acls",
        "--remove",
        "--force",
        "--consumer",
        "--topic",
        "jobs",
        "--group",
        "workers",
        "--allow-principal",
        "User:app",
    )
    assert listed(b, "--principal", "User:app") == {
        ("TOPIC", "jobs", "LITERAL", "User:app", "WRITE"),
        ("TOPIC", "jobs", "LITERAL", "User:app", "CREATE"),
    }


def test_sasl_user_without_cluster_alter_is_refused_then_granted(acl_broker: AclBroker) -> None:
    b = acl_broker
    remove_all(b)
    binding = AclBinding(
        ResourceType.TOPIC,
        "alice-topic",
        ResourcePatternType.LITERAL,
        "User:alice",
        "*",
        AclOperation.READ,
        AclPermissionType.ALLOW,
    )
    alice = sasl_admin(b, "alice", "alice-secret")
    with pytest.raises(KafkaException) as exc:
        alice.create_acls([binding])[binding].result(timeout=TIMEOUT_S)
    assert exc.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    # librdkafka drops DescribeAcls' top-level error code (its DescribeAclsResponse
    # parser returns no error whatever the code), so a refused listing reads as empty;
    # the broker's side is the denial counted on /metrics (and logged).
    any_filter = ANY_FILTER
    assert alice.describe_acls(any_filter).result(timeout=TIMEOUT_S) == []
    assert listed(b) == set()
    metrics = b.metrics()
    for op in ("ALTER", "DESCRIBE"):
        assert (
            f'spool_authorizer_denied_total{{operation="{op}",resource_type="CLUSTER"}}' in metrics
        )
    # A super user over SASL may; and once alice has ALTER on the cluster, so may she.
    admin = sasl_admin(b, "admin", "admin-secret")
    admin.create_acls([binding])[binding].result(timeout=TIMEOUT_S)
    ok(b, "acls", "--add", "--cluster", "--operation", "Alter", "--allow-principal", "User:alice")
    other = AclBinding(
        ResourceType.GROUP,
        "alice-group",
        ResourcePatternType.PREFIXED,
        "User:alice",
        "*",
        AclOperation.READ,
        AclPermissionType.ALLOW,
    )
    alice.create_acls([other])[other].result(timeout=TIMEOUT_S)
    # ALTER implies DESCRIBE: alice may now list.
    found = alice.describe_acls(any_filter).result(timeout=TIMEOUT_S)
    assert {(a.name, a.resource_pattern_type) for a in found} >= {
        ("alice-topic", ResourcePatternType.LITERAL),
        ("alice-group", ResourcePatternType.PREFIXED),
    }
    # Invalid bindings get INVALID_REQUEST from the broker.
    bad = AclBinding(
        ResourceType.BROKER,  # librdkafka names CLUSTER (4) BROKER
        "not-the-cluster",
        ResourcePatternType.LITERAL,
        "User:alice",
        "*",
        AclOperation.ALTER,
        AclPermissionType.ALLOW,
    )
    with pytest.raises(KafkaException) as exc:
        admin.create_acls([bad])[bad].result(timeout=TIMEOUT_S)
    assert exc.value.args[0].code() == KafkaError.INVALID_REQUEST


def test_acls_survive_kill_9(tmp_path: Path) -> None:
    broker = AclBroker(tmp_path)
    broker.start()
    try:
        ok(
            broker,
            "acls",
            "--add",
            "--allow-principal",
            "User:alice",
            "--topic",
            "durable",
            "--operation",
            "Write",
        )
        ok(
            broker,
            "acls",
            "--add",
            "--deny-principal",
            "User:bob",
            "--topic",
            "du",
            "--resource-pattern-type",
            "prefixed",
        )
        ok(broker, "acls", "--add", "--allow-principal", "User:gone", "--topic", "durable")
        ok(
            broker,
            "acls",
            "--remove",
            "--force",
            "--allow-principal",
            "User:gone",
            "--topic",
            "durable",
        )
        before = listed(broker)
        assert len(before) == 2
        broker.kill9()
        broker.start()
        assert listed(broker) == before
    finally:
        if broker.running:
            broker.stop()


def test_without_an_authorizer_acl_apis_are_security_disabled(broker: Broker) -> None:
    proc = spool(broker, "acls", "--list")
    assert proc.returncode == 1
    assert "SECURITY_DISABLED" in proc.stderr
    admin = AdminClient(admin_config(broker))
    binding = AclBinding(
        ResourceType.TOPIC,
        "t",
        ResourcePatternType.LITERAL,
        "User:alice",
        "*",
        AclOperation.READ,
        AclPermissionType.ALLOW,
    )
    with pytest.raises(KafkaException) as exc:
        admin.create_acls([binding])[binding].result(timeout=TIMEOUT_S)
    assert exc.value.args[0].code() == KafkaError.SECURITY_DISABLED


CLIENTS = 4
ACLS = 60


@pytest.mark.parametrize("round_", range(3))
def test_concurrent_creates_and_deletes_land_once(acl_broker: AclBroker, round_: int) -> None:
    b = acl_broker
    remove_all(b)
    names = [f"race{round_}-{i}" for i in range(ACLS)]

    def binding(name: str) -> AclBinding:
        return AclBinding(
            ResourceType.TOPIC,
            name,
            ResourcePatternType.LITERAL,
            "User:racer",
            "*",
            AclOperation.WRITE,
            AclPermissionType.ALLOW,
        )

    # Each client creates an overlapping two thirds of the ACLs, all at once.
    rotated = [names[i * ACLS // CLIENTS :] + names[: i * ACLS // CLIENTS] for i in range(CLIENTS)]
    shares = [(r[: ACLS * 2 // 3],) for r in rotated]
    errors: list[BaseException] = []
    deleted: list[list[str]] = []
    start = threading.Barrier(CLIENTS)

    def create(share: list[str]) -> None:
        try:
            admin = AdminClient(admin_config(b))
            start.wait()
            futures = admin.create_acls([binding(n) for n in share])
            for f in futures.values():
                f.result(timeout=TIMEOUT_S)
        except BaseException as exc:
            errors.append(exc)

    def delete() -> None:
        try:
            admin = AdminClient(admin_config(b))
            filt = AclBindingFilter(
                ResourceType.TOPIC,
                None,
                ResourcePatternType.ANY,
                "User:racer",
                None,
                AclOperation.ANY,
                AclPermissionType.ANY,
            )
            start.wait()
            for f in admin.delete_acls([filt]).values():
                deleted.append([a.name for a in f.result(timeout=TIMEOUT_S)])
        except BaseException as exc:
            errors.append(exc)

    runs: list[tuple[Any, list[tuple[Any, ...]]]] = [(create, shares), (delete, [()] * CLIENTS)]
    for target, per_thread in runs:
        threads = [threading.Thread(target=target, args=a) for a in per_thread]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=2 * TIMEOUT_S)
        assert not errors, errors
        if target is create:
            got = listed(b, "--principal", "User:racer")
            assert got == {("TOPIC", n, "LITERAL", "User:racer", "WRITE") for n in names}
    # Every ACL was reported deleted by exactly one of the racing deletes.
    reported = [n for d in deleted for n in d]
    assert sorted(reported) == sorted(names)
    assert listed(b, "--principal", "User:racer") == set()


def test_cli_as_a_sasl_user_with_command_config(acl_broker: AclBroker, tmp_path: Path) -> None:
    """`spool acls --command-config` authenticates as Kafka's tools do; a user without
    ALTER/DESCRIBE on the cluster gets Kafka's error, the admin super user gets through."""
    b = acl_broker
    remove_all(b)

    def props(user: str, password: str) -> Path:
        path = tmp_path / f"{user}.properties"
        path.write_text(
            "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
            f"sasl.username={user}\nsasl.password={password}\n"
        )
        return path

    def run(config: Path, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "broker",
                "acls",
                "--bootstrap-server",
                f"127.0.0.1:{b.sasl_port}",
                "--command-config",
                str(config),
                *argv,
            ],
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT_S,
            check=False,
        )

    alice, admin = props("alice", "alice-secret"), props("admin", "admin-secret")
    refused = run(alice, "--list")
    assert refused.returncode == 1
    assert "CLUSTER_AUTHORIZATION_FAILED" in refused.stderr
    refused = run(alice, "--add", "--allow-principal", "User:alice", "--topic", "t")
    assert refused.returncode == 1
    assert "CLUSTER_AUTHORIZATION_FAILED" in refused.stderr
    done = run(
        admin, "--add", "--allow-principal", "User:alice", "--topic", "t", "--operation", "Read"
    )
    assert done.returncode == 0, done.stderr
    ok(
        b,
        "acls",
        "--add",
        "--cluster",
        "--operation",
        "Describe",
        "--allow-principal",
        "User:alice",
    )
    listing = run(alice, "--list", "--topic", "t")
    assert listing.returncode == 0, listing.stderr
    assert "(principal=User:alice, host=*, operation=READ, permissionType=ALLOW)" in listing.stdout
