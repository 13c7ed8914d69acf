"""`spool share-groups` as an operator runs it, against one broker process shared by this
module and real confluent-kafka ShareConsumers: describe after consumers leave, resets
(dry run, execute, refused with a live member, by datetime), offset deletion and group
deletion that stays deleted across kill -9. Each test has its own topic and group; the
kill -9 test runs last."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType, Message, Producer

from tests.integration import cli_helpers
from tests.integration.conftest import (
    BOTH_STORAGES,
    Broker,
    create_topic,
    module_broker,
    produce,
    producer_config,
    storage_settings_for,
)
from tests.integration.share_helpers import (
    PollLog,
    accept_all,
    close_quietly,
    consume,
    describe_share_group,
    earliest,
    produce_values,
    share_consumer,
    wait_for_members,
)

# The durable paths: each test runs on the file engine and on PostgreSQL.
pytestmark = BOTH_STORAGES


@pytest.fixture(scope="module")
def broker(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest, storage: str
) -> Iterator[Broker]:
    with module_broker(
        tmp_path_factory, "cli-share-groups", storage_settings_for(request, storage)
    ) as broker:
        yield broker


def share_groups(broker: Broker, *argv: str) -> subprocess.CompletedProcess[str]:
    return cli_helpers.spool(broker, "share-groups", *argv, "--timeout", "20000")


def ok(broker: Broker, *argv: str) -> str:
    return cli_helpers.ok(broker, "share-groups", *argv, "--timeout", "20000")


def as_json(broker: Broker, *argv: str) -> Any:
    return json.loads(ok(broker, *argv, "--output", "json"))


def offsets(broker: Broker, group: str) -> dict[tuple[str, int], tuple[int | None, int | None]]:
    """(topic, partition) -> (start offset, lag) from `--describe --offsets --output json`."""
    rows = as_json(broker, "--describe", "--offsets", "--group", group)
    return {(r["topic"], r["partition"]): (r["start_offset"], r["lag"]) for r in rows}


def setup(broker: Broker, topic: str, group: str, n: int, accepted: int) -> None:
    """`n` records in a new topic; an earliest group whose one consumer accepted the
    first `accepted`, released the rest and left (the group is Empty)."""
    create_topic(broker, topic)
    earliest(broker, group)
    produce_values(broker, topic, [f"{topic}-{i}".encode() for i in range(n)])
    accept_below_and_leave(broker, group, topic, accepted)


def accept_below_and_leave(broker: Broker, group: str, topic: str, accepted: int) -> PollLog:
    """One explicit-mode consumer: accept offsets below `accepted`, release the rest, leave."""
    consumer = share_consumer(broker, group, [topic])

    def decide(msg: Message) -> AcknowledgeType:
        return AcknowledgeType.ACCEPT if msg.offset() < accepted else AcknowledgeType.RELEASE

    try:
        log = consume(
            consumer,
            until=lambda lg: {o for _, o in lg.offsets()} >= set(range(accepted)),
            timeout=30,
            decide=decide,
        )
    finally:
        close_quietly(consumer)
    wait_until_empty(broker, group)
    return log


def receive_all(broker: Broker, group: str, topic: str, n: int) -> PollLog:
    consumer = share_consumer(broker, group, [topic])
    try:
        return consume(
            consumer, until=lambda lg: len(set(lg.offsets())) >= n, timeout=30, decide=accept_all
        )
    finally:
        close_quietly(consumer)


def wait_until_empty(broker: Broker, group: str) -> None:
    """Bounded wait until the group has no members (ShareGroupDescribe on the wire)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if describe_share_group(broker, group).state == "Empty":
            return
        time.sleep(0.1)
    raise AssertionError(f"group {group} never became Empty")


@pytest.mark.timeout(120)
def test_describe_after_consumers_leave_shows_start_offset_lag_and_empty_state(
    broker: Broker,
) -> None:
    topic, group = "sg-describe", "g-describe"
    setup(broker, topic, group, 10, accepted=4)

    table = ok(broker, "--describe", "--group", group).strip().splitlines()
    assert table[0].split() == ["GROUP", "TOPIC", "PARTITION", "START-OFFSET", "LAG"]
    assert table[1].split() == [group, topic, "0", "4", "6"]
    verbose = ok(broker, "--describe", "--group", group, "--verbose").strip().splitlines()
    assert verbose[0].split() == [
        "GROUP",
        "TOPIC",
        "PARTITION",
        "LEADER-EPOCH",
        "START-OFFSET",
        "LAG",
    ]

    state = ok(broker, "--describe", "--state", "--group", group).strip().splitlines()
    assert state[0].startswith("GROUP ") and "COORDINATOR (ID)" in state[0]
    assert state[0].split()[-2:] == ["STATE", "#MEMBERS"]
    assert state[1].split()[0] == group and state[1].split()[-2:] == ["Empty", "0"]

    members = share_groups(broker, "--describe", "--members", "--group", group)
    assert members.returncode == 0
    assert f"Share group '{group}' has no active members." in members.stderr

    assert group in ok(broker, "--list").split()
    listed = ok(broker, "--list", "--state", "empty").strip().splitlines()
    assert listed[0].split() == ["GROUP", "STATE"]
    assert [group, "Empty"] in [line.split() for line in listed[1:]]
    assert group not in ok(broker, "--list", "--state", "Stable").split()


@pytest.mark.timeout(150)
def test_reset_to_earliest_dry_run_changes_nothing_and_execute_redelivers_with_count_one(
    broker: Broker,
) -> None:
    topic, group = "sg-reset", "g-reset"
    setup(broker, topic, group, 8, accepted=8)
    assert offsets(broker, group) == {(topic, 0): (8, 0)}

    reset = ("--reset-offsets", "--group", group, "--topic", topic, "--to-earliest")
    plan = ok(broker, *reset, "--dry-run").strip().splitlines()
    assert plan[0].split() == ["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"]
    assert plan[1].split() == [group, topic, "0", "0"]
    assert offsets(broker, group) == {(topic, 0): (8, 0)}, "a dry run changed the offsets"

    assert as_json(broker, *reset, "--execute") == [
        {"group": group, "topic": topic, "partition": 0, "new_offset": 0}
    ]
    assert offsets(broker, group)[(topic, 0)][0] == 0

    log = receive_all(broker, group, topic, 8)
    assert sorted(o for _, o in log.offsets()) == list(range(8))
    assert {d.delivery_count for d in log.deliveries} == {1}


@pytest.mark.timeout(120)
def test_reset_with_a_live_member_fails_non_empty_group_and_changes_nothing(
    broker: Broker,
) -> None:
    topic, group = "sg-live", "g-live"
    setup(broker, topic, group, 5, accepted=5)
    before = offsets(broker, group)

    consumer = share_consumer(broker, group, [topic])
    try:
        consume(consumer, until=lambda _lg: False, timeout=1.0)
        wait_for_members(broker, group, 1)
        refused = share_groups(
            broker,
            "--reset-offsets",
            "--group",
            group,
            "--all-topics",
            "--to-earliest",
            "--execute",
        )
        assert refused.returncode == 1
        assert "NON_EMPTY_GROUP" in refused.stderr
        assert f"Share group '{group}' is not empty." in refused.stderr
        assert offsets(broker, group) == before

        deleted = share_groups(broker, "--delete", "--group", group)
        assert deleted.returncode == 1
        assert "NON_EMPTY_GROUP" in deleted.stderr
        assert group in ok(broker, "--list").split()
    finally:
        close_quietly(consumer)


@pytest.mark.timeout(90)
def test_reset_to_datetime_lands_on_the_first_offset_at_or_after_it(broker: Broker) -> None:
    topic, group = "sg-datetime", "g-datetime"
    create_topic(broker, topic)
    base = 1_767_225_600_000  # 2026-01-01T00:00:00.000Z
    stamps = [base + i * 1000 for i in range(5)]
    outcome = produce(
        Producer(producer_config(broker)),
        topic,
        [(0, None, f"t{i}".encode(), []) for i in range(5)],
        timestamps=stamps,
    )
    assert outcome.errors == [] and outcome.unflushed == 0

    def planned(*when: str) -> int:
        (row,) = as_json(
            broker, "--reset-offsets", "--group", group, "--topic", f"{topic}:0", *when, "--dry-run"
        )
        return int(row["new_offset"])

    assert planned("--to-datetime", "2026-01-01T00:00:02.500") == 3
    assert planned("--to-datetime", "2026-01-01T00:00:02.000") == 2
    assert planned("--to-datetime", "2026-01-01T01:00:02.000+01:00") == 2
    assert planned("--to-datetime", "2025-12-31T00:00:00.000") == 0
    # After the last record: Kafka falls back to the log end offset.
    assert planned("--to-datetime", "2026-01-02T00:00:00.000") == 5
    # Records from 2026-01-01 are more than an hour old: PT1H lands on the log end.
    assert planned("--by-duration", "PT1H") == 5
    assert planned("--to-latest") == 5
    assert planned("--to-offset", "99") == 5  # clamped to the log end, as Kafka does


@pytest.mark.timeout(60)
def test_bad_arguments_are_usage_errors(broker: Broker) -> None:
    proc = share_groups(broker, "--reset-offsets", "--group", "g", "--all-topics", "--to-earliest")
    assert proc.returncode == 2
    assert "--execute or --dry-run" in proc.stderr
    proc = share_groups(broker, "--describe", "--group", "no-such-group")
    assert proc.returncode == 1
    assert "GROUP_ID_NOT_FOUND" in proc.stderr


@pytest.mark.timeout(180)
def test_delete_offsets_and_delete_group_stay_deleted_after_kill9(broker: Broker) -> None:
    topic, group = "sg-delete", "g-delete"
    setup(broker, topic, group, 6, accepted=6)
    assert offsets(broker, group) == {(topic, 0): (6, 0)}

    # --delete-offsets forgets the topic's share-partition state.
    deleted = ok(broker, "--delete-offsets", "--group", group, "--topic", topic).splitlines()
    assert deleted[0].split() == ["TOPIC", "STATUS"]
    assert deleted[1].split() == [topic, "Successful"]
    assert offsets(broker, group) == {}

    # The group again has state, then --delete removes group and state.
    accept_below_and_leave(broker, group, topic, 6)
    out = ok(broker, "--delete", "--group", group)
    assert out.strip() == f"Deletion of requested share groups ('{group}') was successful."

    broker.kill9()
    broker.start()
    assert group not in ok(broker, "--list").split()
    gone = share_groups(broker, "--describe", "--group", group)
    assert gone.returncode == 1
    assert "GROUP_ID_NOT_FOUND" in gone.stderr
    # A new group of that name starts from nothing: every record once more, count 1.
    earliest(broker, group)
    log = receive_all(broker, group, topic, 6)
    assert sorted(o for _, o in log.offsets()) == list(range(6))
    assert {d.delivery_count for d in log.deliveries} == {1}
