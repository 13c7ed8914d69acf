"""Coordinator logs led by the layout (broker.leadership) over three broker processes on
one PostgreSQL database: `groups`, `share-state` and `transactions` are each held by the
broker `coordinator_layout` names (one each on three), and FindCoordinator on every
broker names that holder for a group, a transactional id and a share-partition key.
After kill -9 of the broker holding the share-state log, or the groups log, another
broker holds it once the dead one's lease expired (broker.session.timeout.ms, 3000
here), and a ShareConsumer (confluent-kafka, explicit acknowledgements) goes on
consuming and acknowledging through the cluster: every record is delivered, and no
record whose ACCEPT was confirmed by commit_sync is delivered again.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import AcknowledgeType, KafkaException

from broker.leadership import COORDINATOR_LOGS, coordinator_layout
from protocol.client import KafkaClient
from tests.integration.conftest import create_topic
from tests.integration.pg_helpers import (
    ClusterBroker,
    cluster,
    db_rows,
    pg_dsn,
    pg_server,
    start_brokers,
    wait_for,
)
from tests.integration.share_helpers import (
    close_quietly,
    earliest,
    produce_values,
    share_consumer,
    topic_id,
)

__all__ = ["cluster", "pg_dsn", "pg_server"]  # the fixtures

NODES = (1, 2, 3)
TOPIC, GROUP, TXN = "coord", "coord-group", "coord-txn"
PARTITIONS, PER_PARTITION = 2, 60
# FindCoordinator key type of each coordinator log.
KEY_TYPES = {"groups": 0, "transactions": 1, "share-state": 2}


def holders(dsn: str) -> dict[str, int | None]:
    """Each coordinator log's holder in the database (`spool_logs.leader_node`)."""
    rows = db_rows(
        dsn,
        "SELECT name, leader_node FROM spool_logs WHERE name = ANY($1::text[])",
        list(COORDINATOR_LOGS),
    )
    return {r["name"]: r["leader_node"] for r in rows}


def found(b: ClusterBroker, keys: dict[str, str]) -> dict[str, int]:
    """The node FindCoordinator v6 on `b` names per coordinator log (-1: none)."""

    async def ask() -> dict[str, int]:
        client = await KafkaClient.connect(b.host, b.port, "spool-it-coordinators")
        try:
            answers = {}
            for log, key in keys.items():
                response = await client.request(
                    10, 6, {"key_type": KEY_TYPES[log], "coordinator_keys": [key]}
                )
                (coordinator,) = response.coordinators
                answers[log] = int(coordinator.node_id)
            return answers
        finally:
            await client.close()

    return asyncio.run(ask())


def placed_as_the_layout(
    dsn: str, brokers: list[ClusterBroker], keys: dict[str, str]
) -> Callable[[], bool]:
    live = sorted(b.node_id for b in brokers)
    target = coordinator_layout(live)

    def check() -> bool:
        if holders(dsn) != target:
            return False
        return all(found(b, keys) == target for b in brokers)

    return check


@pytest.mark.parametrize("victim_log", ["share-state", "groups"])
def test_coordinator_logs_follow_the_layout_and_fail_over_after_kill9(
    cluster: Callable[..., ClusterBroker], pg_dsn: str, victim_log: str
) -> None:
    brokers = start_brokers([cluster(n) for n in NODES])
    create_topic(brokers[0], TOPIC, PARTITIONS)
    ids: list[uuid.UUID] = []

    async def read_id(client: KafkaClient) -> None:
        ids.append(await topic_id(client, TOPIC))

    async def main() -> None:
        client = await KafkaClient.connect(brokers[0].host, brokers[0].port, "spool-it")
        try:
            await read_id(client)
        finally:
            await client.close()

    asyncio.run(main())
    keys = {"groups": GROUP, "transactions": TXN, "share-state": f"{GROUP}:{ids[0]}:0"}
    wait_for(
        placed_as_the_layout(pg_dsn, brokers, keys),
        "the coordinator logs held as the layout says, named by FindCoordinator everywhere",
    )
    target = coordinator_layout(list(NODES))
    assert sorted(target.values()) == [1, 2, 3]  # one each

    earliest(brokers[0], GROUP)
    for p in range(PARTITIONS):
        values = [f"{p}-{i}".encode() for i in range(PER_PARTITION)]
        produce_values(brokers[0], TOPIC, values, partition=p, batch=10)
    everything = {(p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION)}

    consumer = share_consumer(
        brokers[0],
        GROUP,
        [TOPIC],
        **{"bootstrap.servers": ",".join(b.bootstrap for b in brokers), "max.poll.records": 10},
    )
    delivered: list[tuple[int, int]] = []
    confirmed: set[tuple[int, int]] = set()
    redelivered: list[tuple[int, int]] = []
    errors: list[str] = []

    def consume_until(done: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, (len(confirmed), errors[-5:])
            try:
                msgs = [m for m in consumer.poll(0.5) if m.error() is None]
            except KafkaException as exc:
                errors.append(str(exc))
                continue
            if not msgs:
                continue
            keys_polled = []
            for m in msgs:
                key = (m.partition(), m.offset())
                keys_polled.append(key)
                delivered.append(key)
                if key in confirmed:
                    redelivered.append(key)
                consumer.acknowledge(m, AcknowledgeType.ACCEPT)
            try:
                result = consumer.commit_sync(10.0)
            except KafkaException as exc:
                errors.append(str(exc))
                continue
            ok = {tp.partition for tp, err in result.items() if err is None}
            errors.extend(str(err) for err in result.values() if err is not None)
            confirmed.update(k for k in keys_polled if k[0] in ok)

    try:
        consume_until(lambda: len(confirmed) >= 40, timeout=90)
        victim = next(b for b in brokers if b.node_id == target[victim_log])
        survivors = [b for b in brokers if b is not victim]
        victim.kill9()
        wait_for(
            placed_as_the_layout(pg_dsn, survivors, keys),
            f"the {victim_log} log taken over by a survivor after the dead one's lease",
            timeout=30,
        )
        assert holders(pg_dsn)[victim_log] != victim.node_id
        consume_until(lambda: confirmed >= everything, timeout=120)
    finally:
        close_quietly(consumer)
    assert not redelivered, f"confirmed ACCEPTs delivered again: {sorted(set(redelivered))}"
    assert set(delivered) == everything
