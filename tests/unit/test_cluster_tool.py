"""`spool cluster`'s table (broker.tools.cluster.format_view), from plain data: no
broker, no socket."""

from __future__ import annotations

import uuid

from broker.tools.cluster import cluster_view, format_view
from protocol.admin import (
    BrokerInfo,
    ClusterDescription,
    CoordinatorInfo,
    Node,
    PartitionInfo,
    TopicInfo,
)

TOPIC_ID = uuid.UUID("5ea1bdfa-4c06-4d6d-b9cd-34c2bd3054a7")


def test_brokers_leaders_and_coordinators_one_line_each() -> None:
    described = ClusterDescription(
        "abc", 2, (BrokerInfo(1, "h1", 9092, None), BrokerInfo(2, "h2", 9092, "r2"))
    )
    topic = TopicInfo(
        "jobs",
        TOPIC_ID,
        False,
        (
            PartitionInfo(0, 2, 3, (2,), (2,)),
            PartitionInfo(1, 1, 1, (1,), (1,)),
            PartitionInfo(2, -1, 4, (), ()),  # no live leader now
        ),
    )
    coordinators = [
        CoordinatorInfo("g", 0, Node(2, "h2", 9092)),
        CoordinatorInfo(
            "g", 2, None, "COORDINATOR_NOT_AVAILABLE", "The share-state coordinator has none"
        ),
        CoordinatorInfo("spool-cluster", 1, Node(1, "h1", 9092)),
    ]
    lines = format_view(cluster_view(described, [topic], coordinators)).splitlines()
    assert lines == [
        "ClusterId: abc\tController: 2\tBrokers: 2",
        "Broker: 1\tEndpoint: h1:9092\tRack: null",
        "Broker: 2\tEndpoint: h2:9092\tRack: r2",
        f"Topic: jobs\tTopicId: {TOPIC_ID}\tPartitionCount: 3\tLeaders: 1=1,2=1,none=1",
        "\tTopic: jobs\tPartition: 0\tLeader: 2\tLeaderEpoch: 3\tReplicas: 2\tIsr: 2",
        "\tTopic: jobs\tPartition: 1\tLeader: 1\tLeaderEpoch: 1\tReplicas: 1\tIsr: 1",
        "\tTopic: jobs\tPartition: 2\tLeader: none\tLeaderEpoch: 4\tReplicas: \tIsr: ",
        "Coordinator: GROUP\tKey: g\tBroker: 2\tEndpoint: h2:9092",
        "Coordinator: SHARE\tKey: g\tBroker: none\tError: COORDINATOR_NOT_AVAILABLE: "
        "The share-state coordinator has none",
        "Coordinator: TRANSACTION\tKey: spool-cluster\tBroker: 1\tEndpoint: h1:9092",
    ]
