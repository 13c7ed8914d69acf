"""`spool topics` and `spool configs` as an operator runs them: subprocesses against one
broker process shared by this module, checked by what they print and exit with and by
what the broker holds afterwards."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.cli_helpers import ok, spool
from tests.integration.conftest import (
    BOTH_STORAGES,
    Broker,
    module_broker,
    storage_settings_for,
    wait_for_partitions,
)


@pytest.fixture(scope="module")
def broker(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest, storage: str
) -> Iterator[Broker]:
    with module_broker(
        tmp_path_factory, "cli-topics", storage_settings_for(request, storage)
    ) as broker:
        yield broker


def topic_list(broker: Broker) -> list[str]:
    listed: list[str] = json.loads(ok(broker, "topics", "--list", "--output", "json"))
    return listed


@BOTH_STORAGES
def test_topic_lifecycle_create_describe_alter_delete(broker: Broker) -> None:
    out = ok(
        broker,
        "topics",
        "--create",
        "--topic",
        "cli-orders",
        "--partitions",
        "2",
        "--replication-factor",
        "1",
        "--config",
        "retention.ms=60000",
    )
    assert out.strip() == "Created topic cli-orders."
    assert "cli-orders" in ok(broker, "topics", "--list").splitlines()

    described = ok(broker, "topics", "--describe", "--topic", "cli-orders").splitlines()
    assert described[0].startswith("Topic: cli-orders\tTopicId: ")
    assert "\tPartitionCount: 2\tReplicationFactor: 1\tConfigs: retention.ms=60000" in described[0]
    assert [line.split("\t")[2] for line in described[1:]] == ["Partition: 0", "Partition: 1"]
    assert all("\tLeader: 1\tReplicas: 1\tIsr: 1" in line for line in described[1:])

    # Already there: Kafka's error name and message, exit 1; --if-not-exists is quiet.
    again = spool(broker, "topics", "--create", "--topic", "cli-orders")
    assert again.returncode == 1
    assert "TOPIC_ALREADY_EXISTS" in again.stderr
    ok(broker, "topics", "--create", "--topic", "cli-orders", "--if-not-exists")

    ok(broker, "topics", "--alter", "--topic", "cli-orders", "--partitions", "3")
    wait_for_partitions(broker, "cli-orders", 3)
    (doc,) = json.loads(
        ok(broker, "topics", "--describe", "--topic", "cli-orders", "--output", "json")
    )
    assert doc["partition_count"] == 3
    assert [p["partition"] for p in doc["partitions"]] == [0, 1, 2]
    assert doc["configs"] == {"retention.ms": "60000"}

    fewer = spool(broker, "topics", "--alter", "--topic", "cli-orders", "--partitions", "2")
    assert fewer.returncode == 1
    assert "INVALID_PARTITIONS" in fewer.stderr

    ok(broker, "topics", "--delete", "--topic", "cli-orders")
    assert "cli-orders" not in topic_list(broker)
    gone = spool(broker, "topics", "--delete", "--topic", "cli-orders")
    assert gone.returncode == 1
    assert "does not exist" in gone.stderr
    ok(broker, "topics", "--delete", "--topic", "cli-orders", "--if-exists")


def configs(broker: Broker, kind: str, name: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """`spool configs --entity-type kind --entity-name name <argv>`."""
    return spool(broker, "configs", "--entity-type", kind, "--entity-name", name, *argv)


def configs_ok(broker: Broker, kind: str, name: str, *argv: str) -> str:
    proc = configs(broker, kind, name, *argv)
    assert proc.returncode == 0, f"{argv}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def described(broker: Broker, kind: str, name: str) -> dict[str, Any]:
    """The entity's `--describe --output json` document."""
    (doc,) = json.loads(configs_ok(broker, kind, name, "--describe", "--output", "json"))
    return dict(doc)


@BOTH_STORAGES
def test_topic_config_set_shown_and_deleted(broker: Broker) -> None:
    ok(broker, "topics", "--create", "--topic", "cli-cfg")
    out = configs_ok(
        broker,
        "topics",
        "cli-cfg",
        "--alter",
        "--add-config",
        "retention.ms=120000,cleanup.policy=[delete]",
    )
    assert out.strip() == "Completed updating config for topic cli-cfg."
    lines = configs_ok(broker, "topics", "cli-cfg", "--describe").splitlines()
    assert lines[0] == "Dynamic configs for topic cli-cfg are:"
    assert any(
        line.startswith("  retention.ms=120000 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:")
        for line in lines
    ), lines
    assert any(line.startswith("  cleanup.policy=delete ") for line in lines), lines

    configs_ok(broker, "topics", "cli-cfg", "--alter", "--delete-config", "retention.ms")
    assert [c["name"] for c in described(broker, "topics", "cli-cfg")["configs"]] == [
        "cleanup.policy"
    ]

    # Deleting a key that is not set is refused before anything is sent.
    unset = configs(broker, "topics", "cli-cfg", "--alter", "--delete-config", "retention.ms")
    assert unset.returncode == 1
    assert "INVALID_CONFIG: Invalid config(s): retention.ms" in unset.stderr

    everything = configs_ok(broker, "topics", "cli-cfg", "--describe", "--all")
    assert everything.startswith("All configs for topic cli-cfg are:")
    assert "  retention.ms=604800000 sensitive=false synonyms={DEFAULT_CONFIG:" in everything


@BOTH_STORAGES
def test_group_config_set_before_the_group_exists_and_a_bad_value_refused(broker: Broker) -> None:
    group = "cli-future-group"
    configs_ok(
        broker, "groups", group, "--alter", "--add-config", "share.auto.offset.reset=earliest"
    )
    doc = described(broker, "groups", group)
    assert [(c["name"], c["value"], c["source"]) for c in doc["configs"]] == [
        ("share.auto.offset.reset", "earliest", "GROUP_CONFIG")
    ]

    bad = configs(
        broker, "groups", group, "--alter", "--add-config", "share.record.lock.duration.ms=1"
    )
    assert bad.returncode == 1
    assert "Error: INVALID_CONFIG:" in bad.stderr
    assert "share.record.lock.duration.ms" in bad.stderr
    # Nothing changed, and the broker still serves.
    assert described(broker, "groups", group) == doc


@BOTH_STORAGES
def test_describe_of_a_missing_topic_and_the_broker_defaults(broker: Broker) -> None:
    out = ok(broker, "configs", "--describe", "--entity-type", "topics", "--entity-name", "nope")
    assert out.strip() == "The topic 'nope' doesn't exist and doesn't have dynamic config."
    brokers = ok(broker, "configs", "--describe", "--entity-type", "brokers").splitlines()
    assert "Dynamic configs for broker 1 are:" in brokers
    assert "Default configs for brokers in the cluster are:" in brokers
    # An unset value reads `null`, as kafka-configs.sh prints it.
    everything = ok(
        broker, "configs", "--describe", "--all", "--entity-type", "brokers", "--entity-name", "1"
    ).splitlines()
    rack = [line for line in everything if line.strip().startswith("broker.rack=")]
    assert rack and rack[0].strip().startswith("broker.rack=null "), rack


def test_bad_arguments_are_usage_errors_and_an_absent_broker_is_an_error() -> None:
    usage = spool(None, "topics", "--list", "--describe")
    assert usage.returncode == 2
    assert "Command must include exactly one action" in usage.stderr
    usage = spool(None, "configs", "--describe", "--entity-type", "clients")
    assert usage.returncode == 2
    assert "Invalid entity type clients" in usage.stderr

    absent = spool(None, "topics", "--list")
    assert absent.returncode == 1
    assert "NETWORK_EXCEPTION" in absent.stderr
    assert "Traceback" not in absent.stderr
