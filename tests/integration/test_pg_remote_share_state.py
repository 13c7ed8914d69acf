"""A share-partition leader whose share coordinator is another broker
(broker.share.remote_persister), with two broker processes on one real PostgreSQL.

Broker A (node A_ID) starts first, broker B (node 2) second: the coordinator logs follow
the layout (broker.leadership.coordinator_layout), and A's node id is picked so that it
gives B the share-state log, while the topic's partitions are spread over both
(broker.leadership). Share consumers with explicit acknowledgements read every record of
the partitions A leads: A's share-partition leader sends its ReadShareGroupState and
WriteShareGroupState to B, which answers once its write is committed to PostgreSQL. The
test checks the records were each delivered once, that B's share coordinator holds the
state of A's partitions (its ReadShareGroupStateSummary), that B served the writes (its
request metrics), and that after both brokers restart no ACCEPTed record comes back
while records produced since do, their acknowledgements durable on B. A second test
kills B with -9 and starts it again: A's connection to it died with it, and A's
share-partition leader reaches the new B (the acknowledgements of new records are on
B, nothing ACCEPTed comes back).

Needs partition leadership by lease (broker.leadership): without it every broker leads
every partition and the test is skipped. It also needs FindCoordinator to name the
broker holding a coordinator log (share consumers join their group on B): while it
answers with the broker asked, the test skips itself, saying so. The share partitions
start at the log end (`share.auto.offset.reset` latest, the default; a group config set
on one broker is not seen by the other yet), so records are produced once every share
partition has been loaded.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from broker.leadership import coordinator_layout
from protocol.client import KafkaClient
from tests.integration.conftest import ADMIN_TIMEOUT_S, create_topic
from tests.integration.pg_helpers import (
    ClusterBroker,
    cluster,
    db_rows,
    pg_dsn,
    pg_server,
    start_brokers,
    wait_all_live,
)
from tests.integration.share_helpers import (
    PollLog,
    accept_all,
    close_quietly,
    consume,
    log_lines,
    never,
    produce_values,
    share_consumer,
)

__all__ = ["cluster", "pg_dsn", "pg_server"]  # the fixtures, from pg_helpers

try:
    import broker.leadership  # noqa: F401

    HAS_LEADERSHIP = True
except ImportError:
    HAS_LEADERSHIP = False

WAIT_S = 30.0
PARTITIONS = 4
PER_PARTITION = 20
SUMMARY = 87
FIND_COORDINATOR = 10
WRITES = r'kafka_network_requestmetrics_requests_total\{request="WriteShareGroupState"[^}]*\}'


def wait_for(check: Callable[[], Any], what: str, timeout: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _initialized(*brokers: ClusterBroker) -> int:
    """Share partitions loaded so far, by the brokers' logs."""
    return sum(len(log_lines(b, "share_partition_initialized")) for b in brokers)


def bootstrap(*brokers: ClusterBroker) -> str:
    return ",".join(b.bootstrap for b in brokers)


def leaders(brokers: list[ClusterBroker], topic: str) -> dict[int, int]:
    """Partition -> leader node id, from Metadata (-1 while a partition has none)."""
    admin = AdminClient({"bootstrap.servers": bootstrap(*brokers)})
    md = admin.list_topics(topic, timeout=ADMIN_TIMEOUT_S)
    t = md.topics.get(topic)
    if t is None or t.error is not None:
        return {}
    return {p.id: p.leader for p in t.partitions.values()}


def holder(dsn: str, log: str) -> int | None:
    """The node id holding a coordinator log (`spool_logs.leader_node`)."""
    rows = db_rows(dsn, "SELECT leader_node FROM spool_logs WHERE name = $1", log)
    return rows[0]["leader_node"] if rows else None


async def _find_group_coordinator(broker: ClusterBroker, group: str) -> int:
    client = await KafkaClient.connect(broker.host, broker.port, "spool-it-remote-share")
    try:
        response = await client.request(
            FIND_COORDINATOR, 6, {"key_type": 0, "coordinator_keys": [group]}, timeout_s=30
        )
    finally:
        await client.close()
    (found,) = response.coordinators
    return int(found.node_id)


async def _summaries(
    broker: ClusterBroker, group: str, topic_id: uuid.UUID, partitions: list[int]
) -> dict[int, Any]:
    client = await KafkaClient.connect(broker.host, broker.port, "spool-it-remote-share")
    try:
        response = await client.request(
            SUMMARY,
            1,
            {
                "group_id": group,
                "topics": [
                    {
                        "topic_id": topic_id,
                        "partitions": [{"partition": p, "leader_epoch": -1} for p in partitions],
                    }
                ],
            },
            timeout_s=30,
        )
    finally:
        await client.close()
    (result,) = response.results
    return {int(p.partition): p for p in result.partitions}


async def _topic_id(broker: ClusterBroker, topic: str) -> uuid.UUID:
    from tests.integration.share_helpers import topic_id

    client = await KafkaClient.connect(broker.host, broker.port, "spool-it-remote-share")
    try:
        return await topic_id(client, topic)
    finally:
        await client.close()


NEEDS_LEADERSHIP = pytest.mark.skipif(
    not HAS_LEADERSHIP,
    reason="waits for partition leadership by lease (broker.leadership, helper "
    "`leadership`): without it every broker leads every partition, so no share-partition "
    "leader is ever on another broker than the share coordinator",
)
SHARE_LOG = "share-state"
TOPIC, GROUP = "remote-share", "remote-share-group"
# B is node 2; A the first node id for which the coordinator layout over the two gives
# B the share-state log (coordinator logs are placed by a stable hash of the node ids).
B_ID = 2
A_ID = next(
    n for n in range(1, 100) if n != B_ID and coordinator_layout([n, B_ID])[SHARE_LOG] == B_ID
)


def _accepted_on_two_brokers(
    cluster: Callable[..., ClusterBroker], pg_dsn: str
) -> tuple[ClusterBroker, ClusterBroker, list[int]]:
    """A and B up, B the share coordinator, TOPIC's partitions on both, and every record
    of them delivered once and ACCEPTed by GROUP. Returns A, B and A's partitions."""
    # B started second: the layout gives it the share-state log, A hands it over.
    a, b = start_brokers([cluster(A_ID, "a"), cluster(B_ID, "b")], timeout=WAIT_S)
    create_topic(a, TOPIC, PARTITIONS)
    layout = wait_for(
        lambda: (lambda m: m if len(m) == PARTITIONS and set(m.values()) == {A_ID, B_ID} else None)(
            leaders([a, b], TOPIC)
        ),
        "the partitions spread over both brokers",
    )
    wait_for(lambda: holder(pg_dsn, SHARE_LOG) == B_ID, "B holding the share-state log")
    wait_for(
        lambda: asyncio.run(_find_group_coordinator(a, GROUP)) == holder(pg_dsn, "groups"),
        "FindCoordinator on A naming the holder of the groups log",
    )
    on_a = sorted(p for p, leader in layout.items() if leader == A_ID)
    assert on_a, layout

    consumer = share_consumer(a, GROUP, [TOPIC], **{"bootstrap.servers": bootstrap(a, b)})
    try:
        # The share partitions start at the log end (share.auto.offset.reset latest, the
        # default: group configs are not shared between brokers yet); produce once each
        # partition's share-partition leader has loaded it.
        log = PollLog()
        wait_for(
            lambda: (
                consume(consumer, until=never, timeout=0.5, log=log) is not None
                and _initialized(a, b) >= PARTITIONS
            ),
            "every share partition initialized",
            timeout=60,
        )
        for p in range(PARTITIONS):
            produce_values(a, TOPIC, [f"{p}-{i}".encode() for i in range(PER_PARTITION)], p)
        consume(
            consumer,
            until=lambda log: len(log.deliveries) >= PARTITIONS * PER_PARTITION,
            timeout=90,
            decide=accept_all,
            log=log,
        )
        consume(consumer, until=never, timeout=2, log=log)  # nothing more should come
    finally:
        close_quietly(consumer)
    delivered = log.offsets()
    assert len(delivered) == len(set(delivered)), "a record was delivered twice"
    assert sorted(delivered) == [(p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION)], (
        log.errors[:5]
    )
    return a, b, on_a


def _only_new_records_delivered(a: ClusterBroker, b: ClusterBroker) -> None:
    """One record more per partition: a new consumer of GROUP gets exactly those, no
    record ACCEPTed before."""
    for p in range(PARTITIONS):
        produce_values(a, TOPIC, [f"{p}-new".encode()], p)
    consumer = share_consumer(a, GROUP, [TOPIC], **{"bootstrap.servers": bootstrap(a, b)})
    try:
        after = consume(
            consumer,
            until=lambda log: len(log.deliveries) >= PARTITIONS,
            timeout=90,
            decide=accept_all,
        )
        consume(consumer, until=never, timeout=3, log=after)
    finally:
        close_quietly(consumer)
    assert sorted(after.offsets()) == [(p, PER_PARTITION) for p in range(PARTITIONS)], (
        "records ACCEPTed before were delivered again"
        if any(o < PER_PARTITION for _, o in after.offsets())
        else after.errors[:5]
    )
    # ... and their acknowledgements are durable with the share coordinator, B.
    topic_id = asyncio.run(_topic_id(b, TOPIC))
    wait_for(
        lambda: all(
            s.error_code == 0 and s.start_offset == PER_PARTITION + 1
            for s in asyncio.run(_summaries(b, GROUP, topic_id, list(range(PARTITIONS)))).values()
        ),
        "every partition's new record acknowledged on B",
        timeout=10,
    )


@NEEDS_LEADERSHIP
def test_share_partitions_led_by_a_write_their_state_to_the_coordinator_on_b(
    cluster: Callable[..., ClusterBroker], pg_dsn: str
) -> None:
    a, b, on_a = _accepted_on_two_brokers(cluster, pg_dsn)
    topic, group = TOPIC, GROUP

    # B's share coordinator holds the state of A's partitions: all acknowledged.
    topic_id = asyncio.run(_topic_id(b, topic))
    summaries = asyncio.run(_summaries(b, group, topic_id, on_a))
    for p in on_a:
        assert summaries[p].error_code == 0, summaries[p]
        assert summaries[p].start_offset == PER_PARTITION, (p, summaries[p])
        # ... at the partition's leader epoch (claims start at 1), which fences a former
        # leader's writes.
        assert summaries[p].leader_epoch >= 1, (p, summaries[p])
    # ... written by A's share-partition leader over the wire: no client sends these.
    assert b.metric_sum(WRITES) > 0

    # Both restart: nothing ACCEPTed comes back; what is produced since is delivered.
    a.stop()
    b.stop()
    a.start()
    b.start()
    wait_all_live([a, b], WAIT_S)
    wait_for(
        lambda: (lambda m: len(m) == PARTITIONS and -1 not in m.values())(leaders([a, b], topic)),
        "every partition led again",
    )
    _only_new_records_delivered(a, b)


@NEEDS_LEADERSHIP
def test_a_share_coordinator_killed_and_restarted_is_reached_again(
    cluster: Callable[..., ClusterBroker], pg_dsn: str
) -> None:
    """B (the share coordinator) kill -9'd and restarted: A's pooled connection to it
    died with it; A's share-partition leader reconnects to the new B and reads and writes
    its state there (nothing ACCEPTed comes back)."""
    a, b, _ = _accepted_on_two_brokers(cluster, pg_dsn)
    b.kill9()
    b.start()  # the layout gives B the share-state log again (A held it meanwhile)
    wait_for(lambda: holder(pg_dsn, SHARE_LOG) == B_ID, "B holding the share-state log")
    wait_all_live([a, b], WAIT_S)
    wait_for(
        lambda: (lambda m: len(m) == PARTITIONS and -1 not in m.values())(leaders([a, b], TOPIC)),
        "every partition led again",
    )
    _only_new_records_delivered(a, b)
