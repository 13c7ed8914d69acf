"""The handlers ask `broker.cluster` who is live and who leads what (broker.cluster).

A fake ClusterView: this broker is node 1; node 2 leads some partitions, at epoch 5,
with an endpoint on both listeners (PLAINTEXT, SSL); node 3 has a PLAINTEXT endpoint
only.
"""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import pytest

from broker.authorizer import NO_AUTHORIZER
from broker.cluster import BrokerEndpoint, BrokerInfo, Leader
from broker.config import BrokerConfig
from broker.handlers import cluster as cluster_handlers
from coordinator.metadata import Topic
from protocol import api
from protocol.errors import ErrorCode
from tests.unit.cluster_fakes import FakeCluster

NLF = ErrorCode.not_leader_or_follower
TOPIC = "routed"
ME, OTHER, THIRD = 1, 2, 3
OTHER_EPOCH, MY_EPOCH = 5, 3

BROKERS = [
    BrokerInfo(
        ME, (BrokerEndpoint("PLAINTEXT", "one", 9092), BrokerEndpoint("SSL", "one", 9093)), "r1"
    ),
    BrokerInfo(
        OTHER, (BrokerEndpoint("PLAINTEXT", "two", 9192), BrokerEndpoint("SSL", "two", 9193)), "r2"
    ),
    BrokerInfo(THIRD, (BrokerEndpoint("PLAINTEXT", "three", 9292),), None),
]


def ctx(version: int, listener: str = "PLAINTEXT") -> Any:
    return SimpleNamespace(
        api_version=version,
        header=SimpleNamespace(client_id="unit"),
        security=SimpleNamespace(listener=listener),
        listener=listener,
        client_host="127.0.0.1",
        connection_id=1,
    )


def request(api_key: int, version: int, data: dict[str, Any]) -> Any:
    return api.build(api.request_class(api_key, version), data)


# -- Metadata, DescribeCluster ----------------------------------------------------------

META_TOPIC_ID = uuid.uuid4()


def metadata_broker() -> Any:
    topic = Topic(TOPIC, META_TOPIC_ID, 5)
    leaders: dict[tuple[uuid.UUID, int], Leader | None] = {
        (META_TOPIC_ID, 0): Leader(ME, MY_EPOCH),
        (META_TOPIC_ID, 1): Leader(OTHER, OTHER_EPOCH),
        (META_TOPIC_ID, 2): None,  # no leader
        (META_TOPIC_ID, 3): Leader(THIRD, 7),  # live, without an SSL endpoint
        (META_TOPIC_ID, 4): Leader(9, 8),  # not live
    }
    return SimpleNamespace(
        authorizer=NO_AUTHORIZER,
        metadata=SimpleNamespace(
            state=SimpleNamespace(topics={TOPIC: topic}, topics_by_id={META_TOPIC_ID: topic})
        ),
        config=BrokerConfig({}),
        node_id=ME,
        cluster_id="c",
        cluster=FakeCluster(ME, BROKERS, leaders),
    )


def partitions_of(answer: Any) -> dict[int, tuple[Any, ...]]:
    (topic,) = answer.topics
    return {
        p.partition_index: (
            p.error_code,
            p.leader_id,
            getattr(p, "leader_epoch", None),  # v7+
            tuple(p.replica_nodes),
            tuple(p.isr_nodes),
            tuple(getattr(p, "offline_replicas", ())),  # v5+
        )
        for p in topic.partitions
    }


@pytest.mark.parametrize("version", [1, 12, 13])
async def test_metadata_lists_the_live_brokers_on_the_requests_listener(version: int) -> None:
    broker = metadata_broker()
    req = request(3, version, {"topics": [{"name": TOPIC}]})
    plain = await cluster_handlers.metadata(ctx(version), req, broker)
    assert [(b.node_id, b.host, b.port, b.rack) for b in plain.brokers] == [
        (ME, "one", 9092, "r1"),
        (OTHER, "two", 9192, "r2"),
        (THIRD, "three", 9292, None),
    ]
    # Node 3 has no SSL listener: left out of an SSL client's answer.
    ssl = await cluster_handlers.metadata(ctx(version, "SSL"), req, broker)
    assert [(b.node_id, b.host, b.port) for b in ssl.brokers] == [
        (ME, "one", 9093),
        (OTHER, "two", 9193),
    ]
    # A KRaft broker names a random live broker as the controller.
    assert {plain.controller_id, ssl.controller_id} <= {ME, OTHER, THIRD}
    assert plain.cluster_id == "c"


async def test_metadata_partitions_carry_their_leader_and_leader_epoch() -> None:
    broker = metadata_broker()
    req = request(3, 12, {"topics": [{"name": TOPIC}]})
    got = partitions_of(await cluster_handlers.metadata(ctx(12, "SSL"), req, broker))
    assert got == {
        0: (ErrorCode.none, ME, MY_EPOCH, (ME,), (ME,), ()),
        1: (ErrorCode.none, OTHER, OTHER_EPOCH, (OTHER,), (OTHER,), ()),
        2: (ErrorCode.leader_not_available, -1, -1, (), (), ()),
        3: (ErrorCode.listener_not_found, -1, 7, (THIRD,), (THIRD,), (THIRD,)),
        4: (ErrorCode.leader_not_available, -1, 8, (9,), (9,), (9,)),
    }
    # Before v6 a leader without the listener is LEADER_NOT_AVAILABLE (Kafka's
    # errorUnavailableListeners); v0 lists only the replicas a client can reach.
    v5 = partitions_of(
        api.at_version(3, 5, await cluster_handlers.metadata(ctx(5, "SSL"), req, broker))
    )
    assert v5[3][0] == ErrorCode.leader_not_available
    v0 = partitions_of(
        api.at_version(3, 0, await cluster_handlers.metadata(ctx(0, "SSL"), req, broker))
    )
    assert v0[3] == (ErrorCode.leader_not_available, -1, None, (), (), ())
    assert v0[1] == (ErrorCode.none, OTHER, None, (OTHER,), (OTHER,), ())


async def test_describe_cluster_lists_the_live_brokers_on_the_requests_listener() -> None:
    broker = metadata_broker()
    req = request(60, 1, {"endpoint_type": 1})
    plain = await cluster_handlers.describe_cluster(ctx(1), req, broker)
    assert [(b.broker_id, b.host, b.port, b.rack, b.is_fenced) for b in plain.brokers] == [
        (ME, "one", 9092, "r1", False),
        (OTHER, "two", 9192, "r2", False),
        (THIRD, "three", 9292, None, False),
    ]
    assert plain.controller_id in (ME, OTHER, THIRD)
    for _ in range(20):
        ssl = await cluster_handlers.describe_cluster(ctx(1, "SSL"), req, broker)
        assert [(b.broker_id, b.port) for b in ssl.brokers] == [(ME, 9093), (OTHER, 9193)]
        # Kafka answers -1 rather than a controller the list does not name.
        assert ssl.controller_id in (ME, OTHER, -1)
