"""A broker on PostgreSQL (`spool serve --storage postgresql://...`): what it
acknowledged is in the database, so it survives kill -9 and the loss of the data dir.

The machine-loss case: the broker is killed, its data directory deleted, and a new
broker with an empty data directory on the same database serves the same topics,
records, share state and groups (with their configs): no acknowledged record lost,
and a record whose ACCEPT was confirmed is never delivered again.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import asyncpg
from confluent_kafka import AcknowledgeType, Producer
from confluent_kafka.admin import AdminClient, ConfigResource

from broker.leadership import TopicRef, layout
from protocol.client import KafkaClient
from protocol.errors import ErrorCode
from tests.integration.conftest import (
    Broker,
    admin_config,
    consume_assigned,
    create_topic,
    produce,
    producer_config,
    wait_for_partitions,
    watermarks,
)
from tests.integration.pg_helpers import db_rows, pg_dsn, pg_server, take_over_while_paused
from tests.integration.share_helpers import (
    accept_until,
    close_quietly,
    consume,
    earliest,
    heartbeat,
    log_lines,
    produce_values,
    run_wire,
    share_consumer,
    topic_id,
)
from tests.postgres import PostgresServer

GROUP = "pg-share"

__all__ = ["pg_dsn", "pg_server"]  # the fixtures, from pg_helpers


def test_acknowledged_records_and_accepts_survive_kill9_and_the_loss_of_the_data_dir(
    broker_factory: Callable[..., Broker], pg_dsn: str, tmp_path: Path
) -> None:
    broker = broker_factory({"storage": pg_dsn})
    create_topic(broker, "orders", partitions=2)
    earliest(broker, GROUP)
    first = [b"first-%d" % i for i in range(200)]
    produce_values(broker, "orders", first, partition=0, batch=20)
    produce_values(broker, "orders", first, partition=1, batch=50)

    # Explicit mode: each poll's ACCEPTs are committed with commit_sync before the next.
    log = accept_until(broker, GROUP, ["orders"], 400)  # each commit_sync answered
    accepted = [d.key for d in log.deliveries]
    assert len(set(accepted)) == 400, log.errors

    # kill -9 with the data dir kept: nothing acknowledged is lost.
    broker.kill9()
    broker.start()
    second = [b"second-%d" % i for i in range(100)]
    produce_values(broker, "orders", second, partition=0, batch=10)
    got = consume_assigned(broker, "orders", [0], 300, timeout=30)
    assert [r.value for r in got] == first + second

    # The machine is lost: kill -9 and delete the data dir; a new broker on the same
    # database starts from an empty one.
    broker.kill9()
    shutil.rmtree(broker.data_dir)
    broker.start()
    wait_for_partitions(broker, "orders", 2)
    got0 = consume_assigned(broker, "orders", [0], 300, timeout=30)
    got1 = consume_assigned(broker, "orders", [1], 200, timeout=30)
    assert [r.value for r in got0] == first + second
    assert [r.value for r in got1] == first
    assert [r.offset for r in got0] == list(range(300))

    # The group's config came back with the groups log.
    admin = AdminClient(admin_config(broker))
    resource = ConfigResource("GROUP", GROUP)
    described = admin.describe_configs([resource], request_timeout=30)[resource].result(30)
    assert described["share.auto.offset.reset"].value == "earliest"

    # The share group's state came back: only the records never accepted are delivered.
    delivered = accept_until(broker, GROUP, ["orders"], 100, settle_s=3).offsets()
    assert sorted(delivered) == [(0, o) for o in range(200, 300)]
    assert not set(delivered) & set(accepted)


def test_the_database_holds_what_the_broker_acknowledged(
    broker_factory: Callable[..., Broker], pg_dsn: str
) -> None:
    """The broker's logs are rows of the database: a topic partition's and the metadata's."""

    broker = broker_factory({"storage": pg_dsn})
    create_topic(broker, "t")
    produce_values(broker, "t", [b"x%d" % i for i in range(30)], batch=10)

    async def rows() -> dict[str, int]:
        conn = await asyncpg.connect(pg_dsn)
        try:
            found = await conn.fetch("SELECT name, next_offset FROM spool_logs")
            return {r["name"]: r["next_offset"] for r in found}
        finally:
            await conn.close()

    logs = asyncio.run(rows())
    assert logs["topics/t-0"] == 30
    assert logs["meta"] > 0
    assert "storage_connecting" in broker.log_path.read_text()

    # A deleted topic's rows go (in the background, after the deletion answered).
    admin = AdminClient(admin_config(broker))
    admin.delete_topics(["t"], request_timeout=30)["t"].result(timeout=30)
    deadline = time.monotonic() + 30
    while "topics/t-0" in (logs := asyncio.run(rows())) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "topics/t-0" not in logs and "meta" in logs


def test_serve_takes_the_storage_url_as_a_flag() -> None:
    from broker.cli import build_parser

    url = "postgresql://spool@127.0.0.1:5432/spool"
    assert build_parser().parse_args(["serve", "--storage", url]).storage == url


def test_a_broker_whose_logs_another_broker_claimed_answers_not_leader(
    broker_factory: Callable[..., Broker], pg_dsn: str
) -> None:
    """Two brokers on one database: the first paused (SIGSTOP) past its lease, the
    second claims every partition at its start (broker.leadership, a newer epoch).
    Resumed, the first answers its producer NOT_LEADER_OR_FOLLOWER (its write refused by
    PostgreSQL, or the partition already dropped), the producer follows to the new
    leader, and nothing the first wrote after the claim is in the database."""
    short = {
        "storage": pg_dsn,
        "broker.session.timeout.ms": "3000",
        "broker.heartbeat.interval.ms": "500",
    }
    first = broker_factory(short)
    create_topic(first, "t", 2)
    ids: list[uuid.UUID] = []

    async def read_id(client: KafkaClient) -> None:
        ids.append(await topic_id(client, "t"))

    run_wire(first, read_id)
    target = layout([TopicRef("t", ids[0], 2)], [1, 2])
    partition = next(p for p in range(2) if target[f"topics/t-{p}"] == 2)

    # librdkafka logs what the broker answered in its debug log.
    seen: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    client_log = logging.getLogger("pg-fenced-producer")
    client_log.addHandler(Collect())
    client_log.setLevel(logging.DEBUG)
    config = producer_config(first, **{"debug": "msg,protocol"})
    # One producer throughout: it learns the first leads the partition before the
    # pause, so its next write goes there whatever the resumed first has learnt by then
    # (a new producer's metadata, asked of a first that had already seen the claim on a
    # busy machine, sent it straight to the second: no NOT_LEADER to check).
    producer = Producer(config, logger=client_log)
    produce_values(first, "t", [b"before"], partition=partition, producer=producer)

    def start_second() -> Broker:
        second = broker_factory({**short, "node.id": "2"})
        wait_for_partitions(second, "t", 2)
        return second

    second = take_over_while_paused(first, pg_dsn, start_second)

    outcome = produce(producer, "t", [(partition, None, b"moved", [])], flush_timeout=30)
    assert outcome.errors == [] and [s.offset for s in outcome.acked] == [1]
    assert any("Not leader for partition" in line for line in seen), seen[-20:]

    produce_values(second, "t", [b"after"], partition=partition)
    got = consume_assigned(second, "t", [partition], 3, timeout=30)
    assert [r.value for r in got] == [b"before", b"moved", b"after"]
    first.stop()  # a fenced log is not flushed again at stop: the exit is still clean


def test_retention_moves_the_log_start_in_the_database_without_a_new_write(
    broker_factory: Callable[..., Broker], pg_dsn: str
) -> None:
    broker = broker_factory({"storage": pg_dsn, "log.retention.check.interval.ms": "300"})
    create_topic(broker, "r", config={"segment.bytes": "1000", "retention.bytes": "2000"})
    produce_values(broker, "r", [b"v" * 100 for _ in range(100)], batch=5)

    async def start_and_rows() -> tuple[int, int]:
        conn = await asyncpg.connect(pg_dsn)
        try:
            row = await conn.fetchrow(
                "SELECT log_id, log_start_offset FROM spool_logs WHERE name = 'topics/r-0'"
            )
            below = await conn.fetchval(
                "SELECT count(*) FROM spool_batches WHERE log_id = $1 AND last_offset < $2",
                row["log_id"],
                row["log_start_offset"],
            )
            return int(row["log_start_offset"]), int(below)
        finally:
            await conn.close()

    deadline = time.monotonic() + 30
    while (found := asyncio.run(start_and_rows()))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    start, below = found
    assert start > 0 and below == 0
    assert watermarks(broker, "r", 0)[0] == start


def test_produce_fails_while_the_database_is_down_and_works_again_without_a_restart(
    broker_factory: Callable[..., Broker], pg_server: PostgresServer, pg_dsn: str
) -> None:
    broker = broker_factory({"storage": pg_dsn})
    create_topic(broker, "down")
    before = produce_values(broker, "down", [b"before"])
    pg_server.stop("immediate")
    try:
        producer = Producer(producer_config(broker, **{"message.timeout.ms": 3_000}))
        outcome = produce(producer, "down", [(0, None, b"while down", [])], flush_timeout=10)
        assert outcome.acked == [] and outcome.errors
    finally:
        pg_server.start()
    after = produce_values(broker, "down", [b"after"])
    got = consume_assigned(broker, "down", [0], 2, timeout=30)
    values = [r.value for r in got]
    # Acknowledged ones are all there; the unacknowledged one may be too (its batch
    # stayed in the log and went with the next commit), as a produce that timed out may.
    assert {s.value for s in before + after} <= set(values)
    assert values[0] == b"before" and values[-1] == b"after"
    broker.kill9()
    shutil.rmtree(broker.data_dir)
    broker.start()
    assert [r.value for r in consume_assigned(broker, "down", [0], 2, timeout=30)] == values


def test_a_broker_whose_coordinator_logs_another_broker_claimed_answers_not_coordinator(
    broker_factory: Callable[..., Broker], pg_dsn: str
) -> None:
    """Two brokers on one database: the first, holding every coordinator log, is paused
    (SIGSTOP) past its lease; the second, started meanwhile, is the only live broker and
    claims them all (with the partition). Resumed, the first answers share group joins
    (the groups log) with NOT_COORDINATOR, twice (its memory is unloaded, it never writes
    again), and FindCoordinator on it names the second; the second serves the share state
    as it was committed: what was confirmed accepted on the first is not delivered again,
    and everything else is."""
    short = {
        "storage": pg_dsn,
        "broker.session.timeout.ms": "3000",
        "broker.heartbeat.interval.ms": "500",
    }
    first = broker_factory(short)
    create_topic(first, "claimed")
    earliest(first, GROUP)
    produce_values(first, "claimed", [b"v-%d" % i for i in range(40)], batch=5)
    consumer = share_consumer(first, GROUP, ["claimed"], **{"max.poll.records": 10})
    try:
        log = consume(
            consumer,
            until=lambda log: len(log.deliveries) >= 10,
            timeout=60,
            decide=lambda _m: AcknowledgeType.ACCEPT,
        )
    finally:
        close_quietly(consumer)
    confirmed = {d.offset for d in log.deliveries}
    assert confirmed, log.errors

    def start_second() -> Broker:
        second = broker_factory({**short, "node.id": "2"})
        wait_for_partitions(second, "claimed", 1)
        return second

    second = take_over_while_paused(first, pg_dsn, start_second)
    holders = db_rows(
        pg_dsn,
        "SELECT name, leader_node FROM spool_logs "
        "WHERE name IN ('groups', 'share-state', 'transactions')",
    )
    assert sorted(tuple(row) for row in holders) == [
        ("groups", 2),
        ("share-state", 2),
        ("transactions", 2),
    ]

    # The groups log: a member joining the share group on the first broker.
    async def join(client: KafkaClient) -> None:
        for _ in range(2):  # the first refusal unloads the groups; the second finds none
            response = await heartbeat(client, GROUP, str(uuid.uuid4()), 0, ["claimed"])
            assert response.error_code == ErrorCode.not_coordinator, response
        # FindCoordinator names the second once the first read the holders again (its
        # next heartbeat).
        deadline = time.monotonic() + 10
        while True:
            found = await client.request(10, 4, {"key_type": 0, "coordinator_keys": [GROUP]})
            if [c.node_id for c in found.coordinators] == [2]:
                break
            assert time.monotonic() < deadline, found
            await asyncio.sleep(0.1)

    run_wire(first, join)
    assert log_lines(first, "groups_unloaded")

    # The second broker has the committed share state.
    consumer = share_consumer(second, GROUP, ["claimed"])
    try:
        later = consume(
            consumer,
            until=lambda log: {d.offset for d in log.deliveries} >= set(range(40)) - confirmed,
            timeout=90,
            decide=lambda _m: AcknowledgeType.ACCEPT,
        )
    finally:
        close_quietly(consumer)
    delivered = {d.offset for d in later.deliveries}
    assert delivered == set(range(40)) - confirmed, (sorted(delivered), sorted(confirmed))
    first.stop()  # fenced logs are not flushed at stop: the exit is still clean
