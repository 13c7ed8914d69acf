"""Brokers sharing one PostgreSQL database share the cluster metadata (the `meta` log,
coordinator.metadata): a topic created on one is served by the others with its topic
id, deleted on one it is gone from all, concurrent CreateTopics of one name spread over
the brokers create it once, configs altered on one are described by another, and
producer ids are never handed out twice. Every broker follows the others within
`storage.metadata.poll.interval.ms`.

Clients of a cluster send their requests to any broker (Metadata lists them all, and
the controller id is a live broker at random, as in Kafka), so what one broker serves
is checked here over a connection to that broker alone (`protocol.client`).

Partitions are led by one broker each (broker.leadership; produce and fetch across
brokers are tested in test_pg_leadership). The brokers are pg_helpers' `cluster`
brokers, with short leases.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from confluent_kafka.admin import AdminClient

from protocol.client import KafkaClient
from protocol.errors import ErrorCode
from tests.integration.conftest import ADMIN_TIMEOUT_S, Broker, admin_config
from tests.integration.pg_helpers import (
    ClusterBroker,
    cluster,
    db_rows,
    pg_dsn,
    pg_server,
    start_brokers,
)

__all__ = ["cluster", "pg_dsn", "pg_server"]  # the fixtures, from pg_helpers

# How long a change may take to reach another broker here: its poll interval (500 ms)
# many times over, for a loaded machine.
FOLLOW_S = 15.0
ROUNDS = 20
METADATA, CREATE_TOPICS, DELETE_TOPICS, INIT_PRODUCER_ID = 3, 19, 20, 22
DESCRIBE_CONFIGS, INCREMENTAL_ALTER_CONFIGS = 32, 44
TOPIC, BROKER = 2, 4
DYNAMIC_TOPIC_CONFIG, DYNAMIC_BROKER, DYNAMIC_DEFAULT_BROKER = 1, 2, 3

T = TypeVar("T")


@pytest.fixture
def brokers(cluster: Callable[..., ClusterBroker]) -> list[ClusterBroker]:
    """Three brokers on the test's database, started one after another."""
    return start_brokers([cluster(n) for n in (1, 2, 3)])


def on(broker: Broker, scenario: Callable[[KafkaClient], Awaitable[T]]) -> T:
    """`scenario` over one connection to `broker` (and only to it)."""

    async def main() -> T:
        client = await KafkaClient.connect(broker.host, broker.port, "shared-metadata-test")
        try:
            return await scenario(client)
        finally:
            await client.close()

    return asyncio.run(main())


def eventually(check: Callable[[], T], what: str) -> T:
    """`check()` once it returns something true, within FOLLOW_S."""
    deadline = time.monotonic() + FOLLOW_S
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"{what}: never happened (last {last!r})")


async def served(client: KafkaClient, topic: str) -> tuple[uuid.UUID, int] | None:
    """(topic id, partitions) of `topic` as the broker serves it (Metadata v12), or
    None if it does not know it."""
    answer = await client.request(
        METADATA,
        12,
        {
            "topics": [{"topic_id": None, "name": topic}],
            "allow_auto_topic_creation": False,
            "include_topic_authorized_operations": False,
        },
    )
    [found] = answer.topics
    if found.error_code != ErrorCode.none:
        assert found.error_code == ErrorCode.unknown_topic_or_partition, found
        return None
    return found.topic_id, len(found.partitions)


def served_by(broker: Broker, topic: str) -> tuple[uuid.UUID, int] | None:
    return on(broker, lambda c: served(c, topic))


async def create(client: KafkaClient, topic: str, partitions: int) -> Any:
    """CreateTopics v7 of one topic; its result."""
    answer = await client.request(
        CREATE_TOPICS,
        7,
        {
            "topics": [
                {
                    "name": topic,
                    "num_partitions": partitions,
                    "replication_factor": 1,
                    "assignments": [],
                    "configs": [],
                }
            ],
            "timeout": 30_000,
            "validate_only": False,
        },
    )
    [result] = answer.topics
    return result


def create_on(broker: Broker, topic: str, partitions: int) -> uuid.UUID:
    result = on(broker, lambda c: create(c, topic, partitions))
    assert result.error_code == ErrorCode.none, result
    return uuid.UUID(str(result.topic_id))


def delete_on(broker: Broker, topic: str) -> None:
    async def delete(client: KafkaClient) -> None:
        answer = await client.request(DELETE_TOPICS, 5, {"topic_names": [topic], "timeout": 30_000})
        [result] = answer.responses
        assert result.error_code == ErrorCode.none, result

    on(broker, delete)


def set_config(broker: Broker, resource_type: int, name: str, key: str, value: str) -> None:
    """IncrementalAlterConfigs v1 SET of one key, on `broker`."""

    async def alter(client: KafkaClient) -> None:
        answer = await client.request(
            INCREMENTAL_ALTER_CONFIGS,
            1,
            {
                "resources": [
                    {
                        "resource_type": resource_type,
                        "resource_name": name,
                        "configs": [{"name": key, "config_operation": 0, "value": value}],
                    }
                ],
                "validate_only": False,
            },
        )
        [result] = answer.responses
        assert result.error_code == ErrorCode.none, result

    on(broker, alter)


def described(broker: Broker, resource_type: int, name: str) -> dict[str, tuple[str, int]]:
    """DescribeConfigs v4 on `broker`: key -> (value, config source); nothing for a
    topic it does not know."""

    async def describe(client: KafkaClient) -> dict[str, tuple[str, int]]:
        answer = await client.request(
            DESCRIBE_CONFIGS,
            4,
            {
                "resources": [
                    {
                        "resource_type": resource_type,
                        "resource_name": name,
                        "configuration_keys": None,
                    }
                ],
                "include_synonyms": False,
                "include_documentation": False,
            },
        )
        [result] = answer.results
        if result.error_code == ErrorCode.unknown_topic_or_partition:
            return {}  # not (yet) known to this broker
        assert result.error_code == ErrorCode.none, result
        return {c.name: (c.value, c.config_source) for c in result.configs}

    return on(broker, describe)


def test_brokers_started_at_once_on_an_empty_database_share_one_cluster_id(
    cluster: Callable[..., ClusterBroker], pg_dsn: str
) -> None:
    brokers = start_brokers([cluster(n) for n in (1, 2, 3)], at_once=True)
    assert all(b.running for b in brokers)
    admins = [AdminClient(admin_config(b)) for b in brokers]
    ids = {a.describe_cluster().result(timeout=ADMIN_TIMEOUT_S).cluster_id for a in admins}
    assert len(ids) == 1, ids
    # One record in the metadata log: the first broker's cluster id.
    [row] = db_rows(pg_dsn, "SELECT next_offset FROM spool_logs WHERE name = 'meta'")
    assert row["next_offset"] == 1


def test_a_topic_created_on_one_broker_is_served_by_the_others_and_deleted_from_all(
    brokers: list[ClusterBroker],
) -> None:
    a, b, c = brokers
    topic_id = create_on(a, "orders", 3)
    assert served_by(a, "orders") == (topic_id, 3)
    for other in (b, c):
        eventually(lambda other=other: served_by(other, "orders"), "orders elsewhere")
        assert served_by(other, "orders") == (topic_id, 3)

    # Each partition's log is opened by the broker leading it (broker.leadership), one
    # each once the three see each other, whoever created the topic.
    def opened() -> list[list[str]]:
        return [sorted(p.name for p in (x.data_dir / "topics").iterdir()) for x in (a, b, c)]

    eventually(
        lambda: (
            sorted(n for names in opened() for n in names) == ["orders-0", "orders-1", "orders-2"]
            and all(len(names) == 1 for names in opened())
        ),
        "one partition opened by each broker",
    )

    # Deleted on b: gone from a and c, their logs removed.
    delete_on(b, "orders")
    assert served_by(b, "orders") is None
    for other in (a, c):
        eventually(lambda other=other: served_by(other, "orders") is None, "orders gone")
        eventually(
            lambda other=other: not any((other.data_dir / "topics").iterdir()),
            "the deleted topic's logs removed",
        )
    # Created again on c, with a new id every broker serves.
    new_id = create_on(c, "orders", 1)
    assert new_id != topic_id
    for other in (a, b):
        eventually(lambda other=other: served_by(other, "orders") == (new_id, 1), "the new id")


def test_concurrent_create_topics_of_one_name_over_three_brokers_create_it_once(
    brokers: list[ClusterBroker],
) -> None:
    """Each round, two connections to each broker send CreateTopics of one new name at
    once: one creates it, the five others answer TOPIC_ALREADY_EXISTS, and every broker
    then serves the one topic id."""

    async def rounds() -> list[list[Any]]:
        clients = [
            await KafkaClient.connect(b.host, b.port, f"race-{i}")
            for i, b in enumerate(brokers)
            for _ in range(2)
        ]
        try:
            return [
                await asyncio.gather(*(create(client, f"race-{r}", 2) for client in clients))
                for r in range(ROUNDS)
            ]
        finally:
            for client in clients:
                await client.close()

    for r, results in enumerate(asyncio.run(rounds())):
        codes = sorted(result.error_code for result in results)
        assert codes == [ErrorCode.none] + [ErrorCode.topic_already_exists] * 5, results
        [winner] = [res for res in results if res.error_code == ErrorCode.none]
        for b in brokers:
            got = eventually(lambda b=b, r=r: served_by(b, f"race-{r}"), "the topic elsewhere")
            assert got == (winner.topic_id, 2), (b.port, r)
    # The races were run: brokers wrote at once and were refused, then retried; every
    # broker applied the metadata log up to one offset.
    assert sum(b.metric_sum("spool_metadata_conflicts_total") for b in brokers) > 0
    last = "kafka_server_broker_metadata_metrics_last_applied_record_offset"
    offsets = eventually(
        lambda: (lambda o: o if len(set(o)) == 1 else None)([b.metric_sum(last) for b in brokers]),
        "every broker at one offset",
    )
    assert offsets[0] >= ROUNDS
    assert sum(b.metric_sum("spool_metadata_records_followed_total") for b in brokers) > 0


def test_configs_altered_on_one_broker_are_described_by_another(
    brokers: list[ClusterBroker],
) -> None:
    a, b, _ = brokers
    create_on(a, "orders", 1)
    # Altered on b at once after a created it: b catches up before the change (it does
    # not answer UNKNOWN_TOPIC_OR_PARTITION), and a follows b's change.
    set_config(b, TOPIC, "orders", "retention.ms", "3600000")
    set_config(a, TOPIC, "orders", "cleanup.policy", "compact")
    wanted = {"retention.ms": "3600000", "cleanup.policy": "compact"}

    def dynamic(broker: Broker) -> dict[str, str]:
        configs = described(broker, TOPIC, "orders")
        return {k: v for k, (v, source) in configs.items() if source == DYNAMIC_TOPIC_CONFIG}

    for broker in brokers:
        eventually(lambda broker=broker: dynamic(broker) == wanted, "the topic configs")
    # The cluster-wide dynamic broker configs (resource ""), set on b, apply on a; a
    # broker's own (resource "2", b's) apply on it alone, over the cluster's.
    set_config(b, BROKER, "", "num.partitions", "4")
    eventually(
        lambda: described(a, BROKER, "1")["num.partitions"] == ("4", DYNAMIC_DEFAULT_BROKER),
        "num.partitions on a",
    )
    set_config(b, BROKER, "2", "num.partitions", "6")
    set_config(a, BROKER, "", "log.retention.ms", "7200000")  # a later change, seen by b
    eventually(lambda: described(b, BROKER, "2")["log.retention.ms"][0] == "7200000", "b follows a")
    assert described(b, BROKER, "2")["num.partitions"] == ("6", DYNAMIC_BROKER)
    assert described(a, BROKER, "1")["num.partitions"] == ("4", DYNAMIC_DEFAULT_BROKER)


def test_producer_ids_are_never_handed_out_twice_across_brokers(
    brokers: list[ClusterBroker],
) -> None:
    async def init(client: KafkaClient) -> int:
        answer = await client.request(
            INIT_PRODUCER_ID,
            4,
            {
                "transactional_id": None,
                "transaction_timeout": 60_000,
                "producer_id": -1,
                "producer_epoch": -1,
            },
        )
        assert answer.error_code == ErrorCode.none, answer
        return int(answer.producer_id)

    async def main() -> list[int]:
        clients = [
            await KafkaClient.connect(b.host, b.port, f"pid-{i}") for i, b in enumerate(brokers)
        ]
        try:
            got: list[int] = []
            for _ in range(40):
                got.extend(await asyncio.gather(*(init(c) for c in clients for _ in range(3))))
            return got
        finally:
            for client in clients:
                await client.close()

    got = asyncio.run(main())
    assert len(got) == len(set(got)) == 40 * 9
