"""Brokers sharing one PostgreSQL database share the cluster metadata (the `meta` log,
coordinator.metadata): a topic created on one is served by the others with its topic
id, deleted on one it is gone from all, concurrent CreateTopics of one name spread over
the brokers create it once, configs altered on one are described by another, and
producer ids are never handed out twice. Every broker follows the others within
`storage.metadata.poll.interval.ms`.

Partitions are led by one broker each (broker.leadership; produce and fetch across
brokers are tested in test_pg_leadership).
"""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError
from confluent_kafka.admin import AdminClient, ConfigResource
from prometheus_client.parser import text_string_to_metric_families

from protocol.client import KafkaClient
from protocol.errors import ErrorCode
from tests.integration.conftest import (
    ADMIN_TIMEOUT_S,
    Broker,
    admin_config,
    create_topic,
    free_port,
    wait_for_partitions,
)
from tests.integration.pg_helpers import db_rows, pg_dsn, pg_server
from tests.integration.share_helpers import run_wire
from tests.integration.test_metadata_races import (
    _at_once,
    _codes,
    _create_call,
    _dynamic_topic_configs,
    _set_call,
    _show,
    _topic_id,
)

__all__ = ["pg_dsn", "pg_server"]  # the fixtures, from pg_helpers

# How long a change may take to reach another broker here: its poll interval (500 ms)
# many times over, for a loaded machine.
FOLLOW_S = 15.0
ROUNDS = 20
INIT_PRODUCER_ID = 22


def cluster(factory: Callable[..., Broker], dsn: str, n: int) -> list[Broker]:
    return [factory({"storage": dsn, "node.id": str(i + 1)}) for i in range(n)]


def eventually(check: Callable[[], Any], what: str) -> Any:
    """`check()` once it returns something true, within FOLLOW_S."""
    deadline = time.monotonic() + FOLLOW_S
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"{what}: never happened (last {last!r})")


def listed(broker: Broker, topic: str) -> bool:
    md = AdminClient(admin_config(broker)).list_topics(timeout=ADMIN_TIMEOUT_S)
    return topic in md.topics


def test_brokers_started_at_once_on_an_empty_database_share_one_cluster_id(
    pg_dsn: str, tmp_path: Path
) -> None:
    brokers = [
        Broker(
            tmp_path / f"data{i}",
            tmp_path / f"broker{i}.log",
            {"storage": pg_dsn, "node.id": str(i + 1)},
        )
        for i in range(3)
    ]
    threads = [threading.Thread(target=b.start) for b in brokers]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=2 * ADMIN_TIMEOUT_S)
        assert all(b.running for b in brokers)
        admins = [AdminClient(admin_config(b)) for b in brokers]
        ids = {a.describe_cluster().result(timeout=ADMIN_TIMEOUT_S).cluster_id for a in admins}
        assert len(ids) == 1, ids
        # One record in the metadata log: the first broker's cluster id.
        [row] = db_rows(pg_dsn, "SELECT next_offset FROM spool_logs WHERE name = 'meta'")
        assert row["next_offset"] == 1
    finally:
        for b in brokers:
            if b.running:
                b.stop()


def test_a_topic_created_on_one_broker_is_served_by_the_others_and_deleted_from_all(
    broker_factory: Callable[..., Broker], pg_dsn: str
) -> None:
    a, b, c = cluster(broker_factory, pg_dsn, 3)
    create_topic(a, "orders", partitions=3)
    topic_id = _topic_id(a, "orders")
    assert topic_id is not None
    for other in (b, c):
        eventually(lambda other=other: listed(other, "orders"), f"orders on {other.port}")
        wait_for_partitions(other, "orders", 3)
        assert _topic_id(other, "orders") == topic_id

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
    admin = AdminClient(admin_config(b))
    admin.delete_topics(["orders"])["orders"].result(timeout=ADMIN_TIMEOUT_S)
    for other in (a, c):
        eventually(lambda other=other: not listed(other, "orders"), f"orders gone {other.port}")
        eventually(
            lambda other=other: not any((other.data_dir / "topics").iterdir()),
            "the deleted topic's logs removed",
        )
    # Created again on c, with a new id everyone agrees on.
    create_topic(c, "orders", partitions=1)
    new_id = _topic_id(c, "orders")
    assert new_id not in (None, topic_id)
    for other in (a, b):
        eventually(lambda other=other: _topic_id(other, "orders") == new_id, "the new id")


class MetricsBroker(Broker):
    """A broker of the cluster serving /metrics too."""

    def __init__(self, data_dir: Path, log_path: Path, settings: dict[str, str | None]) -> None:
        super().__init__(data_dir, log_path, settings)
        self.metrics_port = free_port()

    def command(self) -> list[str]:
        return [*super().command(), "--metrics", f"127.0.0.1:{self.metrics_port}"]

    def metric(self, name: str) -> float:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            body = response.read().decode()
        for family in text_string_to_metric_families(body):
            for sample in family.samples:
                if sample.name == name:
                    return float(sample.value)
        raise AssertionError(f"no {name} in /metrics")


@pytest.fixture
def metrics_cluster(pg_dsn: str, tmp_path: Path) -> Iterator[list[MetricsBroker]]:
    brokers = [
        MetricsBroker(
            tmp_path / f"data{i}",
            tmp_path / f"broker{i}.log",
            {"storage": pg_dsn, "node.id": str(i + 1)},
        )
        for i in range(3)
    ]
    try:
        for b in brokers:
            b.start()
        yield brokers
    finally:
        for b in brokers:
            if b.running:
                b.stop()


LAST_APPLIED = "kafka_server_broker_metadata_metrics_last_applied_record_offset"


def test_concurrent_create_topics_of_one_name_over_three_brokers_create_it_once(
    metrics_cluster: list[MetricsBroker],
) -> None:
    brokers = metrics_cluster
    clients = [AdminClient(admin_config(b)) for b in brokers for _ in range(2)]
    for client in clients:
        client.list_topics(timeout=ADMIN_TIMEOUT_S)
    for r in range(ROUNDS):
        name = f"race-{r}"
        outcomes = _at_once([_create_call(client, name, 2) for client in clients])
        assert _codes(outcomes) == [KafkaError.NO_ERROR] + [KafkaError.TOPIC_ALREADY_EXISTS] * (
            len(clients) - 1
        ), _show(outcomes)
        ids = {
            eventually(lambda b=b, name=name: _topic_id(b, name), f"{name} on {b.port}")
            for b in brokers
        }
        assert len(ids) == 1, ids
    # Every broker's copy of the metadata is one: each lists the same topics, once.
    for b in brokers:
        topics = AdminClient(admin_config(b)).list_topics(timeout=ADMIN_TIMEOUT_S).topics
        assert sorted(t for t in topics if t.startswith("race-")) == sorted(
            f"race-{r}" for r in range(ROUNDS)
        )
    # The races were run: brokers wrote at once and were refused, then retried.
    assert sum(b.metric("spool_metadata_conflicts_total") for b in brokers) > 0
    offsets = [b.metric(LAST_APPLIED) for b in brokers]
    assert len(set(offsets)) == 1 and offsets[0] >= ROUNDS, offsets
    assert sum(b.metric("spool_metadata_records_followed_total") for b in brokers) > 0


def test_configs_altered_on_one_broker_are_described_by_another(
    broker_factory: Callable[..., Broker], pg_dsn: str
) -> None:
    a, b = cluster(broker_factory, pg_dsn, 2)
    create_topic(a, "orders")
    eventually(lambda: listed(b, "orders"), "orders on b")
    # Two keys at once from the two brokers: both kept.
    outcomes = _at_once(
        [
            _set_call(AdminClient(admin_config(a)), "orders", "retention.ms", "3600000"),
            _set_call(AdminClient(admin_config(b)), "orders", "cleanup.policy", "compact"),
        ]
    )
    assert outcomes == [None, None], _show(outcomes)
    wanted = {"retention.ms": "3600000", "cleanup.policy": "compact"}
    for broker in (a, b):
        eventually(lambda broker=broker: _dynamic_topic_configs(broker, "orders") == wanted, "")
    # The cluster-wide dynamic broker configs (resource ""), set on b, apply on a.
    set_cluster_default(b, "num.partitions", "4")
    eventually(lambda: broker_config(a, "num.partitions") == "4", "num.partitions on a")


INCREMENTAL_ALTER_CONFIGS = 44


def set_cluster_default(broker: Broker, key: str, value: str) -> None:
    """IncrementalAlterConfigs SET of the cluster-wide default broker config `key`
    (resource name "", which confluent-kafka's AdminClient does not send)."""

    async def scenario(client: KafkaClient) -> None:
        answer = await client.request(
            INCREMENTAL_ALTER_CONFIGS,
            1,
            {
                "resources": [
                    {
                        "resource_type": 4,
                        "resource_name": "",
                        "configs": [{"name": key, "config_operation": 0, "value": value}],
                    }
                ],
                "validate_only": False,
            },
        )
        [result] = answer.responses
        assert result.error_code == ErrorCode.none, result

    run_wire(broker, scenario)


BROKER = ConfigResource.Type.BROKER


def broker_config(broker: Broker, key: str) -> str:
    resource = ConfigResource(BROKER, "1")
    admin = AdminClient(admin_config(broker))
    entries = admin.describe_configs([resource])[resource].result(timeout=ADMIN_TIMEOUT_S)
    return str(entries[key].value)


def test_producer_ids_are_never_handed_out_twice_across_brokers(
    broker_factory: Callable[..., Broker], pg_dsn: str
) -> None:
    brokers = cluster(broker_factory, pg_dsn, 3)

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
