"""`spool cluster` as an operator runs it (a subprocess): on three broker processes of
one PostgreSQL database it lists the three brokers, the leader of each partition of a
6-partition topic as each broker's own Metadata answers (2/2/2), and the group, share
and transaction coordinators as the database holds them; on one file-engine broker,
that broker leads everything and coordinates everything.

Leaders are compared with a Metadata request of the test's own (test_pg_leadership's
`leaders`), coordinators with the `spool_logs` rows of the coordinator logs.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from typing import Any

from tests.integration.cli_helpers import ok
from tests.integration.conftest import Broker, create_topic
from tests.integration.pg_helpers import ClusterBroker, cluster, db_rows, pg_dsn, pg_server
from tests.integration.test_pg_leadership import PARTITIONS, leaders, start_cluster

__all__ = ["cluster", "pg_dsn", "pg_server"]  # the fixtures

COORDINATOR_LOGS = {"GROUP": "groups", "SHARE": "share-state", "TRANSACTION": "transactions"}


def cluster_json(b: Broker, *argv: str) -> dict[str, Any]:
    view: dict[str, Any] = json.loads(ok(b, "cluster", "--output", "json", *argv))
    return view


def test_three_brokers_their_leaders_and_coordinators(
    cluster: Callable[..., ClusterBroker], pg_dsn: str
) -> None:
    brokers = start_cluster(cluster, "shown")
    one = brokers[0]
    view = cluster_json(one, "--topic", "shown", "--group", "g1", "--transactional-id", "tx1")

    assert [(b["id"], b["port"]) for b in view["brokers"]] == [(b.node_id, b.port) for b in brokers]
    assert view["controller_id"] in (1, 2, 3)
    (topic,) = view["topics"]
    shown = {p["partition"]: p["leader"] for p in topic["partitions"]}
    assert shown == leaders(one, "shown")
    assert sorted(Counter(shown.values()).values()) == [2, 2, 2]
    assert all(p["replicas"] == [p["leader"]] == p["isr"] for p in topic["partitions"])

    held = {
        r["name"]: r["leader_node"]
        for r in db_rows(pg_dsn, "SELECT name, leader_node FROM spool_logs")
    }
    coordinators = view["coordinators"]
    assert [c["type"] for c in coordinators] == ["GROUP"] + ["SHARE"] * PARTITIONS + ["TRANSACTION"]
    assert coordinators[0]["key"] == "g1" and coordinators[-1]["key"] == "tx1"
    assert {c["key"] for c in coordinators[1:-1]} == {
        f"g1:{topic['topic_id']}:{p}" for p in range(PARTITIONS)
    }
    ports = {b.node_id: b.port for b in brokers}
    for c in coordinators:
        assert c["error"] is None, c
        assert c["id"] == held[COORDINATOR_LOGS[c["type"]]], (c, held)
        assert c["endpoint"] == f"127.0.0.1:{ports[c['id']]}"

    # The table names the same: one line per broker, per partition, per coordinator.
    text = ok(one, "cluster", "--topic", "shown")
    for b in brokers:
        assert f"Broker: {b.node_id}\tEndpoint: 127.0.0.1:{b.port}\tRack: null" in text
    for p, leader in shown.items():
        assert f"\tTopic: shown\tPartition: {p}\tLeader: {leader}\t" in text
    assert "Leaders: 1=2,2=2,3=2" in text
    for kind in COORDINATOR_LOGS:
        assert (
            f"Coordinator: {kind}\tKey: spool-cluster\tBroker: {held[COORDINATOR_LOGS[kind]]}"
            in text
        )

    # kafka-topics.sh's describe shows the same leaders, from Metadata.
    described = ok(brokers[1], "topics", "--describe", "--topic", "shown")
    for p, leader in shown.items():
        assert f"\tPartition: {p}\tLeader: {leader}\tReplicas: {leader}\tIsr: {leader}" in described


def test_one_file_broker_leads_and_coordinates_everything(
    broker_factory: Callable[..., Broker],
) -> None:
    b = broker_factory()
    create_topic(b, "solo", PARTITIONS)
    view = cluster_json(b, "--group", "g")
    assert [(n["id"], n["port"]) for n in view["brokers"]] == [(1, b.port)]
    assert view["controller_id"] == 1
    (topic,) = [t for t in view["topics"] if t["topic"] == "solo"]
    assert [p["leader"] for p in topic["partitions"]] == [1] * PARTITIONS
    assert {c["type"] for c in view["coordinators"]} == set(COORDINATOR_LOGS)
    assert all(c["id"] == 1 and c["error"] is None for c in view["coordinators"])

    text = ok(b, "cluster")
    assert text.splitlines()[1] == f"Broker: 1\tEndpoint: 127.0.0.1:{b.port}\tRack: null"
    assert "Topic: solo\t" in text and "Leaders: 1=6" in text
