"""Metadata and DescribeCluster come from the broker's ClusterView (broker.cluster): the
live brokers with the endpoint of the listener each request came in on, each
partition's leader and leader epoch.

One broker with two PLAINTEXT listeners advertised under different host names, asked
through each by confluent-kafka clients; a client of either listener then produces and
reads through the endpoint its Metadata gave.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.integration.conftest import (
    Broker,
    admin_config,
    consumer_config,
    create_topic,
    free_port,
    producer_config,
    started,
)

NODE_ID = 7
RACK = "rack-a"


class TwoListenersBroker(Broker):
    """INTERNAL on `port` (advertised as 127.0.0.1), EXTERNAL on `external_port`
    (advertised as localhost), both PLAINTEXT, set with Kafka's keys."""

    def __init__(self, root: Path) -> None:
        super().__init__(root / "data", root / "broker.log", {})
        self.external_port = free_port()
        self.settings.update(
            {
                "node.id": str(NODE_ID),
                "broker.rack": RACK,
                "listeners": f"INTERNAL://127.0.0.1:{self.port},"
                f"EXTERNAL://127.0.0.1:{self.external_port}",
                "advertised.listeners": f"INTERNAL://127.0.0.1:{self.port},"
                f"EXTERNAL://localhost:{self.external_port}",
                "listener.security.protocol.map": "INTERNAL:PLAINTEXT,EXTERNAL:PLAINTEXT",
            }
        )


@pytest.fixture(scope="module")
def two_listeners(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoListenersBroker]:
    with started(TwoListenersBroker(tmp_path_factory.mktemp("two-plain-listeners"))) as broker:
        yield broker


def configs(broker: TwoListenersBroker) -> list[tuple[dict[str, Any], str, int]]:
    """Per listener: a client config bootstrapping on it, and the endpoint it must be
    told."""
    return [
        (admin_config(broker), "127.0.0.1", broker.port),
        (
            admin_config(
                broker,
                **{
                    "bootstrap.servers": f"127.0.0.1:{broker.external_port}",
                    "broker.address.family": "v4",  # localhost: the IPv4 address it binds
                },
            ),
            "localhost",
            broker.external_port,
        ),
    ]


def test_metadata_answers_each_listener_with_its_own_endpoint(
    two_listeners: TwoListenersBroker,
) -> None:
    topic = "routed-metadata"
    create_topic(two_listeners, topic, partitions=3)
    for config, host, port in configs(two_listeners):
        admin = AdminClient(config)  # kept: a dropped client cancels what it awaits
        metadata = admin.list_topics(timeout=15)
        assert {b.id: (b.host, b.port) for b in metadata.brokers.values()} == {
            NODE_ID: (host, port)
        }
        # A KRaft broker names a live broker as the controller: here, itself.
        assert metadata.controller_id == NODE_ID
        partitions = metadata.topics[topic].partitions
        assert sorted(partitions) == [0, 1, 2]
        for p in partitions.values():
            assert (p.leader, p.replicas, p.isrs, p.error) == (NODE_ID, [NODE_ID], [NODE_ID], None)
        cluster = admin.describe_cluster(request_timeout=15).result(timeout=15)
        assert [(n.id, n.host, n.port, n.rack) for n in cluster.nodes] == [
            (NODE_ID, host, port, RACK)
        ]
        assert cluster.controller is not None and cluster.controller.id == NODE_ID


def test_clients_of_either_listener_produce_and_fetch_through_its_endpoint(
    two_listeners: TwoListenersBroker,
) -> None:
    topic = "routed-data"
    create_topic(two_listeners, topic)
    values = []
    for i, (config, _, _) in enumerate(configs(two_listeners)):
        bootstrap = config["bootstrap.servers"]
        family = {k: v for k, v in config.items() if k == "broker.address.family"}
        producer = Producer(
            {**producer_config(two_listeners), "bootstrap.servers": bootstrap, **family}
        )
        value = f"through-{i}".encode()
        producer.produce(topic, value)
        assert producer.flush(30) == 0
        values.append(value)
        consumer = Consumer(
            consumer_config(two_listeners, **{"bootstrap.servers": bootstrap, **family})
        )
        try:
            consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
            got: list[bytes] = []
            for _ in range(60):
                msg = consumer.poll(0.5)
                if msg is not None and msg.error() is None:
                    got.append(msg.value())
                if len(got) == len(values):
                    break
            assert got == values
        finally:
            consumer.close()
