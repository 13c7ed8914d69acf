"""Share-group admin RPCs on the wire, against a real broker: DescribeShareGroupOffsets
(90, v0-1), AlterShareGroupOffsets (91), DeleteShareGroupOffsets (92), DeleteGroups
(42, v0-2), with real confluent-kafka ShareConsumers for the consuming side.

One broker serves the module; the kill -9 test runs last and restarts it.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from protocol.client import KafkaClient
from protocol.errors import ErrorCode
from tests.integration.conftest import Broker, create_topic, module_broker
from tests.integration.share_helpers import (
    accept_all,
    close_quietly,
    consume,
    earliest,
    heartbeat,
    produce_values,
    share_consumer,
    wait_for_members,
)
from tests.integration.test_share_state_rpcs import call

DELETE_GROUPS, DESCRIBE, ALTER, DELETE = 42, 90, 91, 92
ZERO = uuid.UUID(int=0)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    with module_broker(tmp_path_factory, "share-admin") as b:
        yield b


def describe(
    broker: Broker, group: str, topics: list[tuple[str, list[int]]] | None, version: int = 1
) -> Any:
    wanted = None if topics is None else [{"topic_name": n, "partitions": p} for n, p in topics]
    (result,) = call(
        broker, DESCRIBE, version, {"groups": [{"group_id": group, "topics": wanted}]}
    ).groups
    return result


def offsets_of(group: Any) -> dict[tuple[str, int], tuple[int, int, int]]:
    return {
        (t.topic_name, p.partition_index): (p.start_offset, p.leader_epoch, getattr(p, "lag", None))
        for t in group.topics
        for p in t.partitions
    }


def alter(broker: Broker, group: str, topics: list[tuple[str, list[tuple[int, int]]]]) -> Any:
    body = {
        "group_id": group,
        "topics": [
            {
                "topic_name": name,
                "partitions": [{"partition_index": p, "start_offset": o} for p, o in parts],
            }
            for name, parts in topics
        ],
    }
    return call(broker, ALTER, 0, body)


def delete_offsets(broker: Broker, group: str, topics: list[str]) -> Any:
    body = {"group_id": group, "topics": [{"topic_name": t} for t in topics]}
    return call(broker, DELETE, 0, body)


def delete_groups(broker: Broker, groups: list[str], version: int = 2) -> dict[str, int]:
    response = call(broker, DELETE_GROUPS, version, {"groups_names": groups})
    return {r.group_id: r.error_code for r in response.results}


def join_and_leave(broker: Broker, group: str, topic: str) -> None:
    """A member joins over the wire (its partitions get share state) and leaves."""

    async def scenario() -> None:
        client = await KafkaClient.connect(broker.host, broker.port, "spool-it-share-admin")
        try:
            member = str(uuid.uuid4())
            joined = await heartbeat(client, group, member, 0, [topic])
            assert joined.error_code == ErrorCode.none
            left = await heartbeat(client, group, member, -1)
            assert left.error_code == ErrorCode.none
        finally:
            await client.close()

    asyncio.run(scenario())
    # The join's share-state initialization runs in the background: wait (bounded).
    deadline = time.monotonic() + 10
    while not describe(broker, group, None).topics and time.monotonic() < deadline:
        time.sleep(0.05)


# ------------------------------------------------------------- error shapes, per RPC


@pytest.mark.parametrize("version", [0, 1])
def test_describe_unknown_group_topic_and_partition(broker: Broker, version: int) -> None:
    create_topic(broker, f"desc-{version}", partitions=2)
    # Kafka: an unknown group has no topics when all are asked for, no error.
    everything = describe(broker, "no-such-group", None, version)
    assert (everything.error_code, list(everything.topics)) == (ErrorCode.none, [])
    named = describe(broker, "no-such-group", [(f"desc-{version}", [0, 5]), ("nope", [1])], version)
    assert named.error_code == ErrorCode.none
    expected_lag = -1 if version == 1 else None
    assert offsets_of(named) == {
        (f"desc-{version}", 0): (-1, 0, expected_lag),
        (f"desc-{version}", 5): (-1, 0, expected_lag),
        ("nope", 1): (-1, 0, expected_lag),
    }
    ids = {t.topic_name: t.topic_id for t in named.topics}
    assert ids["nope"] in (None, ZERO) and ids[f"desc-{version}"] not in (None, ZERO)


def test_alter_whole_request_and_per_partition_errors(broker: Broker) -> None:
    create_topic(broker, "alter-errors", partitions=1)
    empty = alter(broker, "", [("alter-errors", [(0, 0)])])
    assert empty.error_code == ErrorCode.invalid_group_id and list(empty.responses) == []
    twice = alter(broker, "g-alter-errors", [("alter-errors", [(0, 0), (0, 3)])])
    assert twice.error_code == ErrorCode.invalid_request
    assert twice.error_message and list(twice.responses) == []
    mixed = alter(broker, "g-alter-errors", [("alter-errors", [(0, 2)]), ("nope", [(0, 0)])])
    assert mixed.error_code == ErrorCode.none
    codes = {
        (t.topic_name, p.partition_index): p.error_code
        for t in mixed.responses
        for p in t.partitions
    }
    assert codes == {
        ("alter-errors", 0): ErrorCode.none,
        ("nope", 0): ErrorCode.unknown_topic_or_partition,
    }
    bad = alter(broker, "g-alter-errors-2", [("alter-errors", [(3, 0)])])
    ((partition,),) = [t.partitions for t in bad.responses]
    assert partition.error_code == ErrorCode.unknown_topic_or_partition
    negative = alter(broker, "g-alter-errors-3", [("alter-errors", [(0, -5)])])
    ((partition,),) = [t.partitions for t in negative.responses]
    assert (
        partition.error_code == ErrorCode.invalid_request and "negative" in partition.error_message
    )


def test_delete_offsets_errors(broker: Broker) -> None:
    create_topic(broker, "del-errors", partitions=1)
    unknown = delete_offsets(broker, "no-such-group", ["del-errors"])
    assert unknown.error_code == ErrorCode.group_id_not_found
    assert "no-such-group" in unknown.error_message and list(unknown.responses) == []
    join_and_leave(broker, "g-del-errors", "del-errors")
    result = delete_offsets(broker, "g-del-errors", ["nope", "del-errors"])
    assert result.error_code == ErrorCode.none
    codes = {t.topic_name: t.error_code for t in result.responses}
    assert codes == {"nope": ErrorCode.unknown_topic_or_partition, "del-errors": ErrorCode.none}
    again = delete_offsets(broker, "g-del-errors", ["del-errors"])
    ((topic,),) = [list(again.responses)]
    assert topic.error_code == ErrorCode.unknown_topic_or_partition


@pytest.mark.parametrize("version", [0, 1, 2])
def test_delete_groups_per_group_results(broker: Broker, version: int) -> None:
    create_topic(broker, f"dg-{version}", partitions=1)
    join_and_leave(broker, f"dg-empty-{version}", f"dg-{version}")
    codes = delete_groups(broker, [f"dg-empty-{version}", f"dg-missing-{version}"], version)
    assert codes == {
        f"dg-empty-{version}": ErrorCode.none,
        f"dg-missing-{version}": ErrorCode.group_id_not_found,
    }


# ---------------------------------------------------------- with real ShareConsumers


def test_describe_alter_and_non_empty_with_share_consumers(broker: Broker) -> None:
    topic, group = "admin-consumers", "g-admin-consumers"
    create_topic(broker, topic, partitions=1)
    earliest(broker, group)
    produce_values(broker, topic, [f"v{i}".encode() for i in range(10)])
    consumer = share_consumer(broker, group, [topic])
    try:
        # Accept 4 records, then leave.
        log = consume(
            consumer,
            until=lambda log: len(log.deliveries) >= 4,
            timeout=30,
            decide=accept_all,
        )
        assert len(log.deliveries) >= 4
        accepted = len(log.deliveries)
        # A live member: NON_EMPTY_GROUP naming the group, and nothing changes.
        before = offsets_of(describe(broker, group, None))
        refused = alter(broker, group, [(topic, [(0, 0)])])
        assert refused.error_code == ErrorCode.non_empty_group
        assert group in refused.error_message and list(refused.responses) == []
        assert offsets_of(describe(broker, group, None)) == before
    finally:
        consumer.close()
    wait_for_members(broker, group, 0)
    (start, _epoch, lag) = offsets_of(describe(broker, group, None))[(topic, 0)]
    # Everything up to `start` is done; the rest is lag (10 records produced).
    assert start == accepted and lag == 10 - accepted
    # Reset to earliest: a new consumer gets every record again, delivery count 1.
    reset = alter(broker, group, [(topic, [(0, 0)])])
    assert reset.error_code == ErrorCode.none
    assert [p.error_code for t in reset.responses for p in t.partitions] == [ErrorCode.none]
    assert offsets_of(describe(broker, group, None))[(topic, 0)] == (0, 0, 10)
    again = share_consumer(broker, group, [topic])
    try:
        log = consume(
            again, until=lambda log: len(log.deliveries) >= 10, timeout=30, decide=accept_all
        )
    finally:
        close_quietly(again)
    assert sorted(d.offset for d in log.deliveries) == list(range(10))
    assert {d.delivery_count for d in log.deliveries} == {1}


def test_delete_groups_then_kill9_and_restart_stays_deleted(broker: Broker) -> None:
    topic, group = "admin-kill9", "g-admin-kill9"
    create_topic(broker, topic, partitions=2)
    join_and_leave(broker, group, topic)
    assert set(offsets_of(describe(broker, group, None))) == {(topic, 0), (topic, 1)}
    assert delete_groups(broker, [group]) == {group: ErrorCode.none}
    broker.kill9()
    broker.start()
    assert delete_groups(broker, [group]) == {group: ErrorCode.group_id_not_found}
    assert list(describe(broker, group, None).topics) == []
