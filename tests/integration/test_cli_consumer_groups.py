"""`spool consumer-groups` as an operator runs it, against one broker process shared by
this module and a real confluent-kafka Consumer that assign()s partitions and commits
(a simple group): lag before and after consuming, a reset to the earliest offsets (dry
run, then execute), offset deletion, group deletion, and the listing. Each test has its
own topic and group."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from tests.integration import cli_helpers
from tests.integration.conftest import (
    Broker,
    consumer_config,
    create_topic,
    module_broker,
    produce,
    producer_config,
)

RECORDS = 10  # per partition


# Short KIP-848 heartbeats, so a consumer joins in well under a second.
SETTINGS = {
    "group.consumer.min.session.timeout.ms": "1000",
    "group.consumer.session.timeout.ms": "6000",
    "group.consumer.min.heartbeat.interval.ms": "100",
    "group.consumer.heartbeat.interval.ms": "500",
}
WAIT_S = 60.0


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    with module_broker(tmp_path_factory, "cli-consumer-groups", SETTINGS) as broker:
        yield broker


def consumer_groups(broker: Broker, *argv: str) -> subprocess.CompletedProcess[str]:
    return cli_helpers.spool(broker, "consumer-groups", *argv, "--timeout", "20000")


def ok(broker: Broker, *argv: str) -> str:
    return cli_helpers.ok(broker, "consumer-groups", *argv, "--timeout", "20000")


def lag(broker: Broker, group: str) -> dict[tuple[str, int], tuple[int | None, int | None, int]]:
    """(topic, partition) -> (committed offset, lag, log end) from `--describe --output json`."""
    rows: list[dict[str, Any]] = json.loads(
        ok(broker, "--describe", "--group", group, "--output", "json")
    )
    return {
        (r["topic"], r["partition"]): (r["current_offset"], r["lag"], r["log_end_offset"])
        for r in rows
    }


def setup_topic(broker: Broker, topic: str) -> None:
    """Two partitions of RECORDS records each."""
    create_topic(broker, topic, partitions=2)
    producer = Producer(producer_config(broker))
    outcome = produce(
        producer,
        topic,
        [(p, None, f"{p}-{i}".encode(), []) for p in (0, 1) for i in range(RECORDS)],
    )
    assert not outcome.errors


def consume_and_commit(broker: Broker, group: str, topic: str, upto: dict[int, int]) -> None:
    """A Consumer of `group` assigned both partitions from the start reads `upto[p]`
    records of each and commits there (synchronously), then closes."""
    consumer = Consumer(consumer_config(broker, **{"group.id": group}))
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in upto])
        seen = dict.fromkeys(upto, 0)
        for _ in range(200):
            if all(seen[p] >= upto[p] for p in upto):
                break
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            seen[msg.partition()] = max(seen[msg.partition()], msg.offset() + 1)
        assert all(seen[p] >= upto[p] for p in upto), seen
        committed = consumer.commit(
            offsets=[TopicPartition(topic, p, o) for p, o in upto.items()], asynchronous=False
        )
        assert committed is not None
        assert all(tp.error is None for tp in committed), committed
    finally:
        consumer.close()


def test_describe_shows_lag_then_none_after_commit(broker: Broker) -> None:
    topic, group = "cg-lag", "cg-lag-group"
    setup_topic(broker, topic)
    consume_and_commit(broker, group, topic, {0: 3, 1: 5})
    assert lag(broker, group) == {(topic, 0): (3, 7, RECORDS), (topic, 1): (5, 5, RECORDS)}

    table = consumer_groups(broker, "--describe", "--group", group)
    assert table.returncode == 0, table.stderr
    header = table.stdout.split("\n")[1].split()
    assert header == [
        "GROUP",
        "TOPIC",
        "PARTITION",
        "CURRENT-OFFSET",
        "LOG-END-OFFSET",
        "LAG",
        "CONSUMER-ID",
        "HOST",
        "CLIENT-ID",
    ]
    row = next(line.split() for line in table.stdout.splitlines() if line.startswith(group))
    assert row == [group, topic, "0", "3", str(RECORDS), "7", "-", "-", "-"]

    consume_and_commit(broker, group, topic, {0: RECORDS, 1: RECORDS})
    assert lag(broker, group) == {(topic, 0): (10, 0, RECORDS), (topic, 1): (10, 0, RECORDS)}


def test_reset_to_earliest_dry_run_then_execute(broker: Broker) -> None:
    topic, group = "cg-reset", "cg-reset-group"
    setup_topic(broker, topic)
    consume_and_commit(broker, group, topic, {0: 4, 1: 6})

    plan = consumer_groups(
        broker, "--reset-offsets", "--group", group, "--topic", topic, "--to-earliest"
    )
    assert plan.returncode == 0, plan.stderr
    assert "--execute option is missing" in plan.stderr  # dry run by default, as Kafka warns
    assert [line.split() for line in plan.stdout.splitlines() if line.startswith(group)] == [
        [group, topic, "0", "0"],
        [group, topic, "1", "0"],
    ]
    assert lag(broker, group) == {(topic, 0): (4, 6, RECORDS), (topic, 1): (6, 4, RECORDS)}

    ok(broker, "--reset-offsets", "--group", group, "--topic", topic, "--to-earliest", "--execute")
    assert lag(broker, group) == {(topic, 0): (0, 10, RECORDS), (topic, 1): (0, 10, RECORDS)}

    # --shift-by from the committed offsets, on one partition, clamped at the log end.
    ok(
        broker,
        "--reset-offsets",
        "--group",
        group,
        "--topic",
        f"{topic}:1",
        "--shift-by",
        "25",
        "--execute",
    )
    assert lag(broker, group) == {(topic, 0): (0, 10, RECORDS), (topic, 1): (10, 0, RECORDS)}

    # --export writes the plan --from-file reads back.
    exported = ok(
        broker,
        "--reset-offsets",
        "--group",
        group,
        "--all-topics",
        "--to-offset",
        "2",
        "--dry-run",
        "--export",
    )
    assert exported.split() == [f"{topic},0,2", f"{topic},1,2"]


def test_delete_offsets_then_delete_group(broker: Broker) -> None:
    topic, group = "cg-delete", "cg-delete-group"
    setup_topic(broker, topic)
    consume_and_commit(broker, group, topic, {0: 2, 1: 2})

    out = ok(broker, "--delete-offsets", "--group", group, "--topic", f"{topic}:1")
    assert f"Request succeeded for deleting offsets from group {group}." in out
    assert lag(broker, group) == {(topic, 0): (2, 8, RECORDS)}

    out = ok(broker, "--delete", "--group", group)
    assert f"Deletion of requested consumer groups ('{group}') was successful." in out
    assert lag(broker, group) == {}

    missing = consumer_groups(broker, "--delete", "--group", group)
    assert missing.returncode == 1
    assert (
        f"* Group '{group}' could not be deleted due to: GROUP_ID_NOT_FOUND: "
        "The group id does not exist." in missing.stdout
    )


def test_list_shows_the_simple_group(broker: Broker) -> None:
    topic, group = "cg-list", "cg-list-group"
    setup_topic(broker, topic)
    consume_and_commit(broker, group, topic, {0: 1})
    listed = ok(broker, "--list").split()
    assert group in listed
    typed = ok(broker, "--list", "--type", "--state")
    row = next(line.split() for line in typed.splitlines() if line.startswith(group))
    assert row == [group, "Classic", "Empty"]


@pytest.mark.parametrize(
    ("protocol", "group_type", "assignor"),
    [("consumer", "Consumer", "uniform"), ("classic", "Classic", "range")],
)
def test_a_live_consumer_group(
    broker: Broker, protocol: str, group_type: str, assignor: str
) -> None:
    """A member that subscribed and committed, in either group.protocol (KIP-848,
    described by ConsumerGroupDescribe; classic, by DescribeGroups with the assignment
    read from the member's bytes): the listing, its members and state, lag by member; a
    reset and a delete are refused while it is in the group, and work once it left."""
    topic, group = f"cg-live-{protocol}", f"cg-live-{protocol}-group"
    setup_topic(broker, topic)
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "group.protocol": protocol,
            "client.id": "cg-live-client",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 100,
        }
    )
    try:
        consumer.subscribe([topic])
        seen = {0: 0, 1: 0}
        deadline = time.monotonic() + WAIT_S
        while min(seen.values()) < 4 and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                seen[msg.partition()] = max(seen[msg.partition()], msg.offset() + 1)
        assert min(seen.values()) >= 4, seen
        consumer.commit(offsets=[TopicPartition(topic, p, 4) for p in (0, 1)], asynchronous=False)

        assert group in ok(broker, "--list").split()
        typed = ok(broker, "--list", "--type", "--state")
        assert next(line.split() for line in typed.splitlines() if line.startswith(group)) == [
            group,
            group_type,
            "Stable",
        ]

        members = ok(broker, "--describe", "--group", group, "--members", "--verbose")
        row = next(line.split() for line in members.splitlines() if line.startswith(group))
        assert row[3:5] == ["cg-live-client", "2"]  # CLIENT-ID, #PARTITIONS
        assert row[6] == f"{topic}:0,1"  # CURRENT-ASSIGNMENT
        # TARGET-ASSIGNMENT: the broker's (KIP-848); a classic group has none ('-').
        assert row[8] == (f"{topic}:0,1" if protocol == "consumer" else "-")

        state = ok(broker, "--describe", "--group", group, "--state")
        row = next(line.split() for line in state.splitlines() if line.startswith(group))
        assert row[3:] == [assignor, "Stable", "1"]

        rows = json.loads(ok(broker, "--describe", "--group", group, "--output", "json"))
        assert {(r["partition"], r["current_offset"], r["lag"]) for r in rows} == {
            (0, 4, 6),
            (1, 4, 6),
        }
        assert {r["client_id"] for r in rows} == {"cg-live-client"}

        refused = consumer_groups(
            broker,
            "--reset-offsets",
            "--group",
            group,
            "--all-topics",
            "--to-earliest",
            "--execute",
        )
        assert refused.returncode == 1
        assert (
            f"Assignments can only be reset if the group '{group}' is inactive, but the "
            "current state is Stable." in refused.stderr
        )
        assert lag(broker, group)[(topic, 0)][0] == 4

        not_empty = consumer_groups(broker, "--delete", "--group", group)
        assert not_empty.returncode == 1
        assert (
            f"* Group '{group}' could not be deleted due to: NON_EMPTY_GROUP: "
            "The group is not empty." in not_empty.stdout
        )
    finally:
        consumer.close()

    # The member left (epoch -1): the group is Empty, so both work now.
    ok(broker, "--reset-offsets", "--group", group, "--all-topics", "--to-earliest", "--execute")
    assert lag(broker, group) == {(topic, 0): (0, 10, RECORDS), (topic, 1): (0, 10, RECORDS)}
    out = ok(broker, "--delete", "--group", group)
    assert f"Deletion of requested consumer groups ('{group}') was successful." in out
    assert group not in ok(broker, "--list").split()
