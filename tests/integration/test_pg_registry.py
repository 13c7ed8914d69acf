"""Brokers sharing one PostgreSQL database register with a lease (broker.registry):
three broker processes see three live brokers; a graceful stop is seen at once; a
kill -9'd broker drops out once its lease expires; a second broker started with a live
broker's node.id is refused, naming the other; one started right after the holder was
killed takes the node id over (at once on the holder's data dir, after the lease
expired on another); a broker paused (SIGSTOP) past its lease whose node id
was taken is fenced when it resumes and stops.

The brokers are pg_helpers' `cluster` brokers: each has its own node id, data dir and
ports; leases are short (broker.session.timeout.ms 3000, broker.heartbeat.interval.ms
500) to keep it fast.
What each broker sees is read from its /metrics (ActiveBrokerCount) and asked of it in
DescribeCluster and Metadata, what the registry holds from the `spool_brokers` table.
Until partitions are led by lease, every broker on one database claims every log it
opens, fencing the others' writes: no test here relies on writes from more than one
broker.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest

from persister.pg_registry import PgRegistryStore
from persister.pg_schema import migrate
from protocol.client import KafkaClient
from tests.integration.conftest import Broker, BrokerError
from tests.integration.pg_helpers import (
    INTERVAL_MS,
    ClusterBroker,
    cluster,
    db_rows,
    pg_dsn,
    pg_server,
    start_brokers,
    wait_for,
)

__all__ = ["cluster", "pg_dsn", "pg_server"]  # the fixtures, from pg_helpers

WAIT_S = 20.0  # for a broker to exit


def with_signal(b: Broker, sig: signal.Signals) -> None:
    assert b.process is not None
    b.process.send_signal(sig)


def registrations(dsn: str) -> dict[int, dict[str, object]]:
    rows = db_rows(
        dsn,
        "SELECT node_id, incarnation_id, endpoints::text AS endpoints, "
        "lease_expires_at > now() AS live, "
        "extract(epoch FROM lease_expires_at - now()) AS left_s FROM spool_brokers",
    )
    return {r["node_id"]: dict(r) for r in rows}


def listed(b: Broker) -> tuple[dict[int, int], dict[int, int]]:
    """The brokers `b` lists, node id -> port, in DescribeCluster and in Metadata."""

    async def ask() -> tuple[dict[int, int], dict[int, int]]:
        client = await KafkaClient.connect(b.host, b.port, "spool-it-registry")
        try:
            described = await client.request(
                60, 0, {"include_cluster_authorized_operations": False}
            )
            metadata = await client.request(
                3,
                12,
                {
                    "topics": [],
                    "allow_auto_topic_creation": False,
                    "include_topic_authorized_operations": False,
                },
            )
        finally:
            await client.close()
        return (
            {int(n.broker_id): int(n.port) for n in described.brokers},
            {int(n.node_id): int(n.port) for n in metadata.brokers},
        )

    return asyncio.run(ask())


def exit_code(b: Broker, timeout: float = WAIT_S) -> int:
    assert b.process is not None
    return b.process.wait(timeout=timeout)


def test_three_brokers_see_each_other_and_see_them_leave(
    cluster: Callable[..., ClusterBroker], pg_dsn: str
) -> None:
    brokers = start_brokers([cluster(n) for n in (1, 2, 3)])
    held = registrations(pg_dsn)
    assert sorted(held) == [1, 2, 3]
    assert all(r["live"] for r in held.values())
    assert len({r["incarnation_id"] for r in held.values()}) == 3
    for b in brokers:
        assert f'"port": {b.port}' in str(held[b.node_id]["endpoints"])
    one, two, three = brokers
    ports = {b.node_id: b.port for b in brokers}
    for b in brokers:
        assert listed(b) == (ports, ports)

    # A graceful stop deregisters: gone from the registry as the process exits, and
    # from the others' view at their next heartbeat.
    three.stop()
    assert sorted(registrations(pg_dsn)) == [1, 2]
    for b in (one, two):
        wait_for(lambda b=b: b.sees() == 2, f"broker {b.node_id} to see broker 3 gone", 5.0)
    del ports[3]
    assert listed(one) == (ports, ports)

    # kill -9: the row stays until its lease runs out; then the others drop it.
    two.kill9()
    killed_at = time.monotonic()
    row = registrations(pg_dsn)[2]
    assert row["live"]
    lease_left_s = float(row["left_s"])  # by the database's clock, as the others read it
    wait_for(lambda: one.sees() == 1, "broker 1 to drop the killed broker 2")
    took = time.monotonic() - killed_at
    # Not before its lease ran out; within a heartbeat of broker 1 after (and slack).
    assert lease_left_s - 0.1 <= took <= lease_left_s + INTERVAL_MS / 1000 + 5.0, took
    assert not registrations(pg_dsn)[2]["live"]
    assert listed(one) == ({1: one.port}, {1: one.port})
    assert (one.metric("spool_broker_lease_renewals_total") or 0) > 0


def test_a_duplicate_node_id_is_refused_while_the_holder_lives(
    cluster: Callable[..., ClusterBroker], pg_dsn: str
) -> None:
    holder = cluster(1)
    holder.start()
    incarnation = registrations(pg_dsn)[1]["incarnation_id"]
    twin = cluster(1, "twin")
    with pytest.raises(BrokerError, match="exited with 1 during start"):
        twin.start()
    log = twin.log_path.read_text()
    assert "node.id 1 is registered by another live broker" in log
    assert f"PLAINTEXT://127.0.0.1:{holder.port}" in log
    assert holder.running
    assert registrations(pg_dsn)[1]["incarnation_id"] == incarnation
    wait_for(lambda: holder.sees() == 1, "the holder to see itself alone")


def test_a_broker_restarted_after_kill9_takes_its_node_id_over(
    cluster: Callable[..., ClusterBroker], pg_dsn: str
) -> None:
    # A lease long enough to outlast a broker's start-up on a busy machine, so the one on
    # another data dir below starts while it is live (with the cluster's 3 s lease, a
    # start slowed by other tests let the lease expire first: no wait to check). Both
    # brokers have it: the second waits for the first's lease at most its own.
    lease = {"broker.session.timeout.ms": "15000"}
    first = cluster(1)
    first.settings.update(lease)
    first.start()
    old = registrations(pg_dsn)[1]["incarnation_id"]
    # On its own data dir: its lock proves the old incarnation gone, no wait.
    first.kill9()
    first.start()
    held = registrations(pg_dsn)[1]
    assert held["incarnation_id"] != old and held["live"]
    log = first.log_path.read_text()
    assert "registered from this data dir" in log
    assert "node_id_registered_by_another_broker" not in log
    # On another data dir (another machine): it waits for the old lease to expire.
    old = held["incarnation_id"]
    first.kill9()
    again = cluster(1, "again")
    again.settings.update(lease)
    again.start()
    held = registrations(pg_dsn)[1]
    assert held["incarnation_id"] != old and held["live"]
    log = again.log_path.read_text()
    assert "node_id_registered_by_another_broker" in log and "its lease expired" in log


def test_a_broker_paused_past_its_lease_is_fenced_when_another_took_its_node_id(
    cluster: Callable[..., ClusterBroker], pg_dsn: str
) -> None:
    paused = cluster(1)
    paused.start()
    with_signal(paused, signal.SIGSTOP)
    wait_for(lambda: not registrations(pg_dsn)[1]["live"], "the paused broker's lease to expire")
    taker = cluster(1, "taker")
    taker.start()
    new = registrations(pg_dsn)[1]["incarnation_id"]
    with_signal(paused, signal.SIGCONT)
    # Its next heartbeat finds the node id taken: it stops, exit code 1.
    try:
        code = exit_code(paused)
    except subprocess.TimeoutExpired:
        raise BrokerError(f"the fenced broker kept running\n{paused.log_tail()}") from None
    assert code == 1
    log = paused.log_path.read_text()
    assert "broker_fenced" in log and f"PLAINTEXT://127.0.0.1:{taker.port}" in log
    held = registrations(pg_dsn)[1]
    assert held["incarnation_id"] == new and held["live"]
    assert taker.running


# -- the SQL alone (persister.pg_registry), against the same PostgreSQL -----------------


def test_the_registry_statements_on_postgresql(pg_dsn: str) -> None:
    """Leases by the database's clock, without brokers: a live lease refuses another
    incarnation, an expired one (lease 0) is taken over, five registrations of one node
    id at once have one winner, a renewal by a replaced incarnation names the holder, a
    deregistration removes only the holder's row."""

    async def run() -> None:
        conn = await asyncpg.connect(pg_dsn)
        try:
            await migrate(conn)
        finally:
            await conn.close()

        async def connect(timeout_s: float) -> Any:
            return await asyncpg.connect(pg_dsn, timeout=timeout_s)

        stores = [PgRegistryStore(connect, timeout_s=10.0) for _ in range(5)]
        a, b = uuid.uuid4(), uuid.uuid4()
        ep_a, ep_b = [("PLAINTEXT", "h", 1)], [("PLAINTEXT", "h", 2)]
        try:
            s0, s1 = stores[0], stores[1]
            assert (await s0.register(1, a, ep_a, "r1", 60_000)).holder is None
            refused = await s1.register(1, b, ep_b, None, 60_000)
            assert refused.holder is not None and refused.holder.incarnation_id == a
            assert refused.holder.address() == "PLAINTEXT://h:1"
            assert 50_000 < refused.holder.lease_left_ms <= 60_000
            # A re-registration of the same incarnation, or from the same data dir, is
            # its own: taken at once.
            assert (await s0.register(1, a, ep_a, "r1", 60_000)).holder is None
            renewal = await s0.renew(1, a, ep_a, "r1", 0)  # a lease of 0: expired now
            assert renewal.renewed and renewal.live == ()
            taken = await s1.register(1, b, ep_b, None, 60_000)
            assert taken.holder is None
            assert taken.replaced is not None and taken.replaced.incarnation_id == a
            fenced = await s0.renew(1, a, ep_a, "r1", 60_000)
            assert not fenced.renewed
            assert fenced.holder is not None and fenced.holder.incarnation_id == b
            assert not await s0.deregister(1, a)
            assert [r.node_id for r in await s0.live()] == [1]

            # Five brokers registering node id 2 at once: exactly one wins.
            outcomes = await asyncio.gather(
                *(s.register(2, uuid.uuid4(), ep_a, None, 60_000) for s in stores)
            )
            assert sum(o.holder is None for o in outcomes) == 1
            same_dir = await s0.register(3, a, ep_a, None, 60_000, "host:/d")
            assert same_dir.holder is None
            restarted = await s1.register(3, b, ep_b, None, 60_000, "host:/d")
            assert restarted.holder is None and restarted.replaced is not None
            elsewhere = await s0.register(3, uuid.uuid4(), ep_a, None, 60_000, "other:/d")
            assert elsewhere.holder is not None and elsewhere.holder.incarnation_id == b
            assert await s1.deregister(1, b)
            assert [r.node_id for r in await s1.live()] == [2, 3]
        finally:
            for s in stores:
                await s.close()

    asyncio.run(run())
