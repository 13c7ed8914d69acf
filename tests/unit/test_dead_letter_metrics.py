"""/metrics exposes the dead-letter counters (KIP-1191): Kafka's ShareGroupMetrics meters
per group and spool's per share partition, reason and outcome. No sockets."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

from broker.metrics import BrokerMetrics, collect
from coordinator.metadata import Topic
from coordinator.share_state import ShareStateKey
from tests.unit.test_metrics import samples

TOPIC = Topic("orders", uuid.uuid4(), 2)
A0 = ShareStateKey("a", TOPIC.topic_id, 0)
A1 = ShareStateKey("a", TOPIC.topic_id, 1)
B0 = ShareStateKey("b", TOPIC.topic_id, 0)


def broker(metrics: BrokerMetrics) -> Any:
    return SimpleNamespace(
        metrics=metrics,
        server=None,
        node_id=1,
        cluster_id="c",
        metadata=SimpleNamespace(state=SimpleNamespace(topics_by_id={TOPIC.topic_id: TOPIC})),
        groups=SimpleNamespace(groups={}),
        share=SimpleNamespace(partitions={}),
        share_persister=SimpleNamespace(shard=SimpleNamespace(keys=lambda: [])),
    )


def test_dead_letter_counters_per_group_and_per_partition() -> None:
    m = BrokerMetrics()
    share = m.share
    share.dead_lettered(A0, "rejected", 3, copied=True)
    share.dead_lettered(A0, "rejected", 1, copied=False)
    share.dead_lettered(A1, "delivery_limit", 2, copied=True)
    share.dead_lettered(B0, "rejected", 4, copied=False)
    share.dead_letter_produce("a", failed=False)
    share.dead_letter_produce("a", failed=False)
    share.dead_letter_produce("a", failed=True)
    share.dead_letter_produce("b", failed=True)
    got = samples(collect(broker(m)))

    def group(name: str, g: str) -> float:
        return got[(f"kafka_server_sharegroupmetrics_{name}_total", (("group", g),))]

    # Records copied, from the partitions' counts (b had none copied: no series).
    assert group("deadletterqueuerecordcount", "a") == 5
    assert (
        "kafka_server_sharegroupmetrics_deadletterqueuerecordcount_total",
        (("group", "b"),),
    ) not in got
    assert group("deadletterqueuetotalproducerequests", "a") == 3
    assert group("deadletterqueuefailedproducerequests", "a") == 1
    assert group("deadletterqueuetotalproducerequests", "b") == 1
    assert group("deadletterqueuefailedproducerequests", "b") == 1

    def part(key: ShareStateKey, reason: str, outcome: str) -> float:
        labels = {
            "group": key.group_id,
            "topic": "orders",
            "partition": str(key.partition),
            "reason": reason,
            "outcome": outcome,
        }
        return got[("spool_share_records_dead_lettered_total", tuple(sorted(labels.items())))]

    assert part(A0, "rejected", "copied") == 3
    assert part(A0, "rejected", "not_copied") == 1
    assert part(A1, "delivery_limit", "copied") == 2
    assert part(B0, "rejected", "not_copied") == 4
    dead = [k for k in got if k[0] == "spool_share_records_dead_lettered_total"]
    assert len(dead) == 4


def test_no_dead_letters_no_series() -> None:
    got = samples(collect(broker(BrokerMetrics())))
    assert not [k for k in got if "deadletter" in k[0] or "dead_lettered" in k[0]]
