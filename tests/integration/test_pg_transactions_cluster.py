"""Transactions on a cluster of three brokers on one PostgreSQL database: one broker
leads the transactions log (broker.leadership) and coordinates every transactional id.

As Kafka 4.2: DescribeTransactions on another broker answers NOT_COORDINATOR per
transactional id and the coordinator describes it; ListTransactions on another broker
lists nothing (error NONE) and the coordinator lists its transactions; so
`spool transactions list`, which asks every broker as kafka-transactions.sh does, shows
every ongoing transaction with its coordinator whichever broker it is pointed at.

The transactions are opened with the protocol (InitProducerId and AddPartitionsToTxn
to the coordinator FindCoordinator names) on partitions led by any broker.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from protocol.client import KafkaClient
from tests.integration.cli_helpers import ok
from tests.integration.conftest import Broker, create_topic
from tests.integration.pg_helpers import ClusterBroker, cluster, pg_dsn, pg_server, start_brokers

__all__ = ["cluster", "pg_dsn", "pg_server"]  # the fixtures

NODES = (1, 2, 3)
TOPIC = "txn-cluster"
IDS = ("tx-a", "tx-b", "tx-c")
WAIT_S = 30.0


@pytest.fixture
def brokers(cluster: Callable[..., ClusterBroker]) -> list[ClusterBroker]:
    return start_brokers([cluster(n) for n in NODES])


def ask(b: Broker, call: Callable[[KafkaClient], Any]) -> Any:
    async def main() -> Any:
        client = await KafkaClient.connect(b.host, b.port, "spool-it-txn-cluster")
        try:
            return await call(client)
        finally:
            await client.close()

    return asyncio.run(main())


def wait_for(check: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def coordinator_of(b: Broker, transactional_id: str) -> int:
    async def call(client: KafkaClient) -> int:
        resp = await client.request(10, 6, {"key_type": 1, "coordinator_keys": [transactional_id]})
        (c,) = resp.coordinators
        return int(c.node_id)

    return int(ask(b, call))


def test_every_ongoing_transaction_is_listed_whichever_broker_is_asked(
    brokers: list[ClusterBroker],
) -> None:
    by_id = {b.node_id: b for b in brokers}

    def one_coordinator() -> int | None:
        # Every broker live and naming the same coordinator (the layout over three).
        named = {coordinator_of(b, IDS[0]) for b in brokers}
        return named.pop() if len(named) == 1 and -1 not in named else None

    def three_live() -> bool:
        async def call(client: KafkaClient) -> int:
            return len((await client.request(60, 0, {})).brokers)

        return all(ask(b, call) == 3 for b in brokers)

    wait_for(three_live, "three live brokers")
    coordinator = by_id[wait_for(one_coordinator, "one transaction coordinator")]
    others = [b for b in brokers if b is not coordinator]
    create_topic(brokers[0], TOPIC, 3)

    async def open_transactions(client: KafkaClient) -> dict[str, int]:
        pids = {}
        for index, tid in enumerate(IDS):
            init = await client.request(
                22,
                4,
                {
                    "transactional_id": tid,
                    "transaction_timeout": 60_000,
                    "producer_id": -1,
                    "producer_epoch": -1,
                },
            )
            assert init.error_code == 0, init
            added = await client.request(
                24,
                3,
                {
                    "v3_and_below_transactional_id": tid,
                    "v3_and_below_producer_id": init.producer_id,
                    "v3_and_below_producer_epoch": init.producer_epoch,
                    # One partition each: led by the three brokers between them.
                    "v3_and_below_topics": [{"name": TOPIC, "partitions": [index]}],
                },
            )
            codes = [
                p.partition_error_code
                for t in added.results_by_topic_v3_and_below
                for p in t.results_by_partition
            ]
            assert codes == [0], added
            pids[tid] = int(init.producer_id)
        return pids

    pids = ask(coordinator, open_transactions)

    async def listed(client: KafkaClient) -> tuple[int, list[str]]:
        resp = await client.request(66, 2, {})
        return int(resp.error_code), sorted(t.transactional_id for t in resp.transaction_states)

    async def described(client: KafkaClient) -> list[tuple[int, str]]:
        resp = await client.request(65, 0, {"transactional_ids": list(IDS)})
        return [(int(t.error_code), t.transaction_state) for t in resp.transaction_states]

    assert ask(coordinator, listed) == (0, sorted(IDS))
    assert ask(coordinator, described) == [(0, "Ongoing")] * len(IDS)
    for b in others:
        assert ask(b, listed) == (0, [])  # it coordinates none of them
        assert ask(b, described) == [(16, "")] * len(IDS)  # NOT_COORDINATOR

    expected = [
        {
            "transactional_id": tid,
            "coordinator": coordinator.node_id,
            "producer_id": pids[tid],
            "state": "Ongoing",
        }
        for tid in IDS
    ]
    for b in brokers:
        out = ok(b, "transactions", "list", "--output", "json")
        assert json.loads(out) == expected, (b.node_id, out)
    table = ok(others[0], "transactions", "--list").splitlines()
    assert table[0].split() == ["TransactionalId", "Coordinator", "ProducerId", "TransactionState"]
    assert [line.split() for line in table[1:]] == [
        [tid, str(coordinator.node_id), str(pids[tid]), "Ongoing"] for tid in IDS
    ]
    pattern = ok(others[1], "transactions", "list", "--transactional-id-pattern", "tx-[ab]")
    assert [line.split()[0] for line in pattern.splitlines()[1:]] == ["tx-a", "tx-b"]
