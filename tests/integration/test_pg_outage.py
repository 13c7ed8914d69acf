"""PostgreSQL going away under share traffic, with the broker left running.

A producer thread and two ShareConsumers in explicit mode (ACCEPT, commit_sync after
each poll) run while the storage database is stopped and started again. A record is
"acknowledged" when the producer's delivery report said so, and its ACCEPT is
"confirmed" when commit_sync answered no error for its partition. Whatever the outage:

- every acknowledged record is consumed at some point;
- a record is never handed out again after its ACCEPT was confirmed;
- while the database is down, `/health` is 503 and says why, Metadata is answered, and
  the metric of failed commits counts;
- once it is back, traffic resumes (records produced after it are acknowledged and
  consumed) and `/health` is 200 again, without restarting the broker.

(a) stops it with `immediate` (as a crash) for a few seconds: clients ride it out on
their retries. (b) stops it for longer than the producer's message.timeout.ms: records
produced meanwhile fail at the producer, and the broker still recovers by itself.
Every wait is bounded; nothing here measures durations.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import socket
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from confluent_kafka import AcknowledgeType, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from protocol.client import KafkaClient
from protocol.errors import ErrorCode
from protocol.records import NewRecord, build_batch
from tests.integration.conftest import (
    Broker,
    admin_config,
    create_topic,
    free_port,
    produce,
    producer_config,
)
from tests.integration.pg_helpers import pg_dsn, pg_server
from tests.integration.share_helpers import (
    close_quietly,
    heartbeat,
    heartbeat_until_assigned,
    log_lines,
    run_wire,
    set_group_configs,
    share_ack_body,
    share_consumer,
    share_fetch_body,
    topic_id,
)
from tests.postgres import PostgresServer

__all__ = ["pg_dsn", "pg_server"]  # the fixtures, from pg_helpers

TOPIC = "outage"
GROUP = "outage-share"
PARTITIONS = 2
WAIT_S = 60.0


class HealthBroker(Broker):
    """The harness's broker process with `--metrics 127.0.0.1:<free port>`."""

    def __init__(self, data_dir: Path, log_path: Path, settings: dict[str, str]) -> None:
        super().__init__(data_dir, log_path, settings)
        self.metrics_port = free_port()

    def command(self) -> list[str]:
        return [*super().command(), "--metrics", f"127.0.0.1:{self.metrics_port}"]

    def get(self, path: str) -> tuple[int, bytes]:
        url = f"http://127.0.0.1:{self.metrics_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def health(self) -> tuple[int, dict[str, Any]]:
        status, body = self.get("/health")
        return status, json.loads(body)

    def failed_commits(self) -> float:
        _, body = self.get("/metrics")
        for line in body.decode().splitlines():
            if line.startswith("spool_storage_commit_failures_total "):
                return float(line.split()[1])
        raise AssertionError("no spool_storage_commit_failures_total in /metrics")


@pytest.fixture
def broker(request: pytest.FixtureRequest, tmp_path: Path, pg_dsn: str) -> Iterator[HealthBroker]:
    # Records whose ACCEPT failed come back after 5 s, not Kafka's 30 s, unless a test
    # asks for another lock duration (indirect parametrisation).
    lock_ms: int = getattr(request, "param", 5000)
    b = HealthBroker(
        tmp_path / "data",
        tmp_path / "broker.log",
        {
            "storage": pg_dsn,
            "group.share.min.record.lock.duration.ms": "1000",
            "group.share.record.lock.duration.ms": str(lock_ms),
        },
    )
    b.start()
    try:
        yield b
    finally:
        if b.running:
            b.stop()  # a clean exit (code 0) is part of the test


@dataclass
class Ledger:
    """What the clients saw, in the order they saw it (one lock for all threads)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    acked: set[bytes] = field(default_factory=set)
    acked_after_outage: set[bytes] = field(default_factory=set)
    produce_errors: list[str] = field(default_factory=list)
    consumed: set[bytes] = field(default_factory=set)
    confirmed: set[tuple[int, int]] = field(default_factory=set)
    # A record handed out again after its ACCEPT was confirmed.
    redelivered: list[tuple[int, int]] = field(default_factory=list)
    commit_errors: list[str] = field(default_factory=list)
    outage_over = False


def run_producer(
    broker: Broker, ledger: Ledger, stop: threading.Event, **config: Any
) -> Callable[[], None]:
    producer = Producer(producer_config(broker, **config))
    counter = itertools.count()

    def on_delivery(err: Any, msg: Any) -> None:
        with ledger.lock:
            if err is not None:
                ledger.produce_errors.append(str(err))
            else:
                ledger.acked.add(msg.value())
                if ledger.outage_over:
                    ledger.acked_after_outage.add(msg.value())

    def body() -> None:
        deadline = time.monotonic() + 240
        while not stop.is_set() and time.monotonic() < deadline:
            with contextlib.suppress(BufferError):  # queue full: poll below makes room
                producer.produce(TOPIC, value=b"r-%d" % next(counter), on_delivery=on_delivery)
            producer.poll(0.02)
        producer.flush(60)

    return body


def run_consumer(broker: Broker, ledger: Ledger, stop: threading.Event) -> Callable[[], None]:
    def body() -> None:
        consumer = share_consumer(
            broker,
            GROUP,
            [TOPIC],
            **{"max.poll.records": 20, "socket.timeout.ms": 5_000},
        )
        deadline = time.monotonic() + 240
        try:
            while not stop.is_set() and time.monotonic() < deadline:
                try:
                    msgs = [m for m in consumer.poll(0.3) if m.error() is None]
                except KafkaException:
                    time.sleep(0.1)
                    continue
                if not msgs:
                    continue
                with ledger.lock:
                    for m in msgs:
                        key = (m.partition(), m.offset())
                        if key in ledger.confirmed:
                            ledger.redelivered.append(key)
                        ledger.consumed.add(m.value())
                for m in msgs:
                    consumer.acknowledge(m, AcknowledgeType.ACCEPT)
                try:
                    result = consumer.commit_sync(10.0)
                except KafkaException as exc:
                    with ledger.lock:
                        ledger.commit_errors.append(str(exc))
                    continue
                ok = {tp.partition for tp, err in result.items() if err is None}
                with ledger.lock:
                    ledger.commit_errors += [str(err) for err in result.values() if err]
                    for m in msgs:
                        if m.partition() in ok:
                            ledger.confirmed.add((m.partition(), m.offset()))
        finally:
            close_quietly(consumer)

    return body


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def metadata_answers(broker: Broker, partitions: int = PARTITIONS) -> bool:
    admin = AdminClient(admin_config(broker))
    topics = admin.list_topics(timeout=10).topics
    return TOPIC in topics and len(topics[TOPIC].partitions) == partitions


def outage_under_share_traffic(
    broker: HealthBroker,
    server: PostgresServer,
    *,
    down_s: float,
    producer: dict[str, Any],
    mode: str = "immediate",
) -> Ledger:
    create_topic(broker, TOPIC, partitions=PARTITIONS)
    set_group_configs(broker, GROUP, {"share.auto.offset.reset": "earliest"})
    ledger = Ledger()
    stop_producing, stop_consuming = threading.Event(), threading.Event()
    threads = [threading.Thread(target=run_producer(broker, ledger, stop_producing, **producer))]
    threads += [
        threading.Thread(target=run_consumer(broker, ledger, stop_consuming)) for _ in range(2)
    ]
    for thread in threads:
        thread.daemon = True
        thread.start()
    try:
        wait_for(lambda: len(ledger.confirmed) >= 50, "share traffic before the outage")
        assert broker.health()[0] == 200
        failed_before = broker.failed_commits()

        server.stop(mode)
        try:
            # The broker notices at its next commit, answers Metadata all along and says
            # on /health why it does not serve.
            wait_for(lambda: broker.health()[0] == 503, "/health to report the outage")
            _, doc = broker.health()
            assert doc["status"] == "storage_unavailable", doc
            assert doc["reason"].startswith("storage unavailable: "), doc
            assert metadata_answers(broker)
            deadline = time.monotonic() + down_s
            while time.monotonic() < deadline:
                time.sleep(0.2)
            assert broker.failed_commits() > failed_before
            assert broker.health()[0] == 503
        finally:
            server.start()

        wait_for(lambda: broker.health()[0] == 200, "/health to be serving again")
        with ledger.lock:
            ledger.outage_over = True
        wait_for(lambda: len(ledger.acked_after_outage) >= 100, "produce after the outage")
        stop_producing.set()
        threads[0].join(90)
        assert not threads[0].is_alive()

        def all_consumed() -> bool:
            with ledger.lock:
                return ledger.acked <= ledger.consumed

        wait_for(all_consumed, "every acknowledged record to be consumed", timeout=90)
    finally:
        stop_producing.set()
        stop_consuming.set()
        for thread in threads:
            thread.join(60)
    assert not any(t.is_alive() for t in threads), "a client thread did not finish"
    assert ledger.redelivered == [], ledger.redelivered[:10]
    assert ledger.acked_after_outage <= ledger.consumed
    # Logged once when the outage began and once when it ended, not per attempt (nor
    # by asyncpg's pool, restoring a connection floor).
    assert log_lines(broker, "Failed to restore the pool connection floor") == []
    assert len(log_lines(broker, "storage_unavailable")) == 1, log_lines(broker, "storage_")
    assert len(log_lines(broker, "storage_available")) == 1, log_lines(broker, "storage_")
    return ledger


def test_a_database_restart_under_share_traffic_loses_nothing_acknowledged(
    broker: HealthBroker, pg_server: PostgresServer
) -> None:
    ledger = outage_under_share_traffic(
        broker, pg_server, down_s=3.0, producer={"message.timeout.ms": 120_000}
    )
    # The producer rode it out on its retries.
    assert ledger.produce_errors == []


def test_a_database_down_longer_than_the_client_timeouts_recovers_without_a_restart(
    broker: HealthBroker, pg_server: PostgresServer
) -> None:
    ledger = outage_under_share_traffic(
        broker,
        pg_server,
        down_s=15.0,
        mode="fast",
        # Records produced while it is down time out at the producer (not idempotent:
        # an idempotent producer may treat timed-out in-flight batches as fatal).
        producer={"message.timeout.ms": 5_000, "enable.idempotence": False, "retries": 1_000},
    )
    assert ledger.produce_errors, "the producer should have timed out during the outage"


def test_a_database_refusing_writes_is_an_outage_until_it_accepts_them_again(
    broker: HealthBroker, pg_dsn: str
) -> None:
    """PostgreSQL up but refusing writes (here read-only, as a full disk or a standby
    refuses them): produce fails with a retriable error, /health is 503 with the
    database's reason, and once it accepts writes again the next produce is
    acknowledged, without restarting the broker."""
    create_topic(broker, TOPIC)
    produce_one(broker, b"before")
    database = pg_dsn.rsplit("/", 1)[1]
    set_read_only(pg_dsn, database, True)
    try:
        producer = Producer(producer_config(broker, **{"message.timeout.ms": 3_000}))
        outcome = produce(producer, TOPIC, [(0, None, b"refused", [])], flush_timeout=10)
        assert outcome.acked == [] and outcome.errors
        status, doc = broker.health()
        assert status == 503 and doc["status"] == "storage_unavailable", doc
        assert "read-only transaction" in doc["reason"], doc
        assert metadata_answers(broker, partitions=1)
    finally:
        set_read_only(pg_dsn, database, False)
    produce_one(broker, b"after")
    wait_for(lambda: broker.health()[0] == 200, "/health to be serving again")


def produce_one(broker: Broker, value: bytes) -> None:
    producer = Producer(producer_config(broker, **{"message.timeout.ms": 60_000}))
    outcome = produce(producer, TOPIC, [(0, None, value, [])], flush_timeout=70)
    assert outcome.errors == [] and len(outcome.acked) == 1, outcome.errors


def set_read_only(dsn: str, database: str, on: bool) -> None:
    """Make `database` refuse (or accept) writes: the setting applies to new sessions,
    so the broker's are ended (it reconnects)."""

    async def run() -> None:
        conn = await asyncpg.connect(dsn.rsplit("/", 1)[0] + "/postgres")
        try:
            setting = "SET default_transaction_read_only = on" if on else "RESET ALL"
            await conn.execute(f'ALTER DATABASE "{database}" {setting}')
            await conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = $1 AND pid <> pg_backend_pid()",
                database,
            )
        finally:
            await conn.close()

    asyncio.run(run())


SHARE_FETCH, SHARE_ACK, ACCEPT = 78, 79, 1


# Kafka's 30 s acquisition lock: the records must stay acquired through the outage and
# the database's restart (with 5 s, a restart slowed by other tests let them go first).
@pytest.mark.parametrize("broker", [30_000], ids=["lock-30s"], indirect=True)
def test_an_acknowledgement_while_the_database_is_down_is_coordinator_not_available(
    broker: HealthBroker, pg_server: PostgresServer
) -> None:
    """A share acknowledgement whose share-state write fails because PostgreSQL is down
    is answered as Kafka answers one whose share coordinator failed its log write:
    COORDINATOR_NOT_AVAILABLE (retriable), in ShareAcknowledge and in a ShareFetch
    carrying it; the records stay acquired, and the same acknowledgement succeeds once
    the database is back."""
    create_topic(broker, TOPIC)
    set_group_configs(broker, GROUP, {"share.auto.offset.reset": "earliest"})
    produce_one(broker, b"one")
    produce_one(broker, b"two")

    async def scenario(client: KafkaClient) -> None:
        member = uuid.uuid4().hex[:22]
        joined = await heartbeat(client, GROUP, member, 0, [TOPIC])
        assert joined.error_code == ErrorCode.none, joined
        await heartbeat_until_assigned(client, GROUP, member, joined.member_epoch)
        tid = await topic_id(client, TOPIC)
        epoch = 0
        acquired: set[int] = set()
        deadline = time.monotonic() + WAIT_S
        while acquired != {0, 1}:
            assert time.monotonic() < deadline, acquired
            body = share_fetch_body(GROUP, member, epoch, {(tid, 0): []}, max_wait=500)
            fetched = await client.request(SHARE_FETCH, 1, body)
            epoch += 1
            for r in fetched.responses[0].partitions[0].acquired_records:
                acquired.update(range(r.first_offset, r.last_offset + 1))

        def accept(offset: int) -> list[dict[str, Any]]:
            return [{"first_offset": offset, "last_offset": offset, "acknowledge_types": [ACCEPT]}]

        pg_server.stop("immediate")
        try:
            acked = await client.request(
                SHARE_ACK, 1, share_ack_body(GROUP, member, epoch, {(tid, 0): accept(0)})
            )
            epoch += 1
            assert acked.error_code == ErrorCode.none, acked
            code = acked.responses[0].partitions[0].error_code
            assert code == ErrorCode.coordinator_not_available, ErrorCode(code)

            body = share_fetch_body(GROUP, member, epoch, {(tid, 0): accept(1)})
            fetched = await client.request(SHARE_FETCH, 1, body)
            epoch += 1
            code = fetched.responses[0].partitions[0].acknowledge_error_code
            assert code == ErrorCode.coordinator_not_available, ErrorCode(code)
        finally:
            pg_server.start()

        # Back: the same acknowledgements go through (the records stayed acquired).
        for offset in (0, 1):
            deadline = time.monotonic() + WAIT_S
            while True:
                acked = await client.request(
                    SHARE_ACK,
                    1,
                    share_ack_body(GROUP, member, epoch, {(tid, 0): accept(offset)}),
                )
                epoch += 1
                code = acked.responses[0].partitions[0].error_code
                if code == ErrorCode.none:
                    break
                assert code == ErrorCode.coordinator_not_available, ErrorCode(code)
                assert time.monotonic() < deadline, "the acknowledgement never went through"
                await asyncio.sleep(0.2)

    run_wire(broker, scenario)


class BlackholeProxy:
    """A TCP proxy between the broker and PostgreSQL that can stop forwarding without
    closing anything (`blackhole`), as a network dropping packets does: connections stay
    open, new ones are accepted, and nothing reaches either side until `forward`."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)
        self.port = self.listener.getsockname()[1]
        self.forwarding = threading.Event()
        self.forwarding.set()
        self.stopped = threading.Event()
        self.sockets: list[socket.socket] = []
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def dsn(self, dsn: str) -> str:
        """`dsn` through the proxy."""
        host, port = self.upstream
        return dsn.replace(f"@{host}:{port}/", f"@127.0.0.1:{self.port}/")

    def blackhole(self) -> None:
        self.forwarding.clear()

    def forward(self) -> None:
        self.forwarding.set()

    def close(self) -> None:
        self.stopped.set()
        for thread in self.threads:
            thread.join(5)
        for sock in [self.listener, *self.sockets]:
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()
                continue
            self.sockets += [client, server]
            for src, dst in ((client, server), (server, client)):
                thread = threading.Thread(target=self._pump, args=(src, dst), daemon=True)
                self.threads.append(thread)
                thread.start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        src.settimeout(0.1)
        while not self.stopped.is_set():
            if not self.forwarding.is_set():
                time.sleep(0.05)  # nothing read, nothing sent, nothing closed
                continue
            try:
                data = src.recv(1 << 16)
            except TimeoutError:
                continue
            except OSError:
                break
            if not data:
                break
            try:
                dst.sendall(data)
            except OSError:
                break
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


# Well below the 30 s a client's request.timeout.ms allows (and the 30 s a commit could
# take before it was bounded): an unreachable database is noticed within this.
NOTICED_WITHIN_S = 15.0


def test_an_unreachable_database_is_noticed_in_seconds_and_traffic_resumes(
    tmp_path: Path, pg_server: PostgresServer, pg_dsn: str
) -> None:
    """PostgreSQL unreachable with packets dropped (no refused connection, no error):
    the broker's commit waits for an answer that never comes. It is bounded: /health is
    503 with the reason well within a client's request timeout, the produce waiting on
    it gets a retriable error, and once packets flow again traffic resumes and /health
    is 200, without a restart."""
    proxy = BlackholeProxy(pg_server.host, pg_server.port)
    broker = HealthBroker(
        tmp_path / "data", tmp_path / "broker.log", {"storage": proxy.dsn(pg_dsn)}
    )
    broker.start()
    try:
        create_topic(broker, TOPIC)
        produce_one(broker, b"before")
        assert broker.health()[0] == 200

        proxy.blackhole()
        started = time.monotonic()
        outcome: list[Any] = []

        async def produce_raw(client: KafkaClient) -> None:
            outcome.append(await produce_request(client, b"while unreachable"))

        producing = threading.Thread(target=run_wire, args=(broker, produce_raw), daemon=True)
        producing.start()
        wait_for(lambda: broker.health()[0] == 503, "/health to report", NOTICED_WITHIN_S)
        _, doc = broker.health()
        assert doc["status"] == "storage_unavailable", doc
        assert doc["reason"].startswith("storage unavailable: "), doc
        producing.join(NOTICED_WITHIN_S)
        assert outcome, "the produce was not answered"
        assert time.monotonic() - started < NOTICED_WITHIN_S + 5
        # Retriable for a producer (Kafka's KafkaStorageException is retriable).
        assert outcome[0].error_code == ErrorCode.kafka_storage_error, outcome[0]
        assert metadata_answers(broker, partitions=1)

        proxy.forward()
        wait_for(lambda: broker.health()[0] == 200, "/health to be serving again")
        produce_one(broker, b"after")
        assert len(log_lines(broker, "storage_available")) == 1
    finally:
        if broker.running:
            broker.stop()
        proxy.close()


def test_health_recovers_after_refused_writes_without_a_write_from_a_client(
    broker: HealthBroker, pg_dsn: str
) -> None:
    """The database refused writes (read-only) and accepts them again, but nothing was
    produced since: the broker's probe finds out by itself, and /health is 200."""
    create_topic(broker, TOPIC)
    produce_one(broker, b"before")
    database = pg_dsn.rsplit("/", 1)[1]
    set_read_only(pg_dsn, database, True)
    try:
        producer = Producer(producer_config(broker, **{"message.timeout.ms": 3_000}))
        outcome = produce(producer, TOPIC, [(0, None, b"refused", [])], flush_timeout=10)
        assert outcome.acked == [] and outcome.errors
        status, doc = broker.health()
        assert status == 503 and "read-only transaction" in doc["reason"], doc
        # Still refused a while later: the probe does not end it by only connecting.
        time.sleep(1.5)
        assert broker.health()[0] == 503
    finally:
        set_read_only(pg_dsn, database, False)
    wait_for(lambda: broker.health()[0] == 200, "/health to recover by itself", 20)
    produce_one(broker, b"after")


async def produce_request(client: KafkaClient, value: bytes, partition: int = 0) -> Any:
    """Produce v9 with acks=all of one record to `TOPIC`: the partition's response."""
    batch = bytes(build_batch([NewRecord(key=None, value=value)]))
    body = {
        "transactional_id": None,
        "acks": -1,
        "timeout": 30_000,
        "topic_data": [{"name": TOPIC, "partition_data": [{"index": partition, "records": batch}]}],
    }
    response = await client.request(0, 9, body, timeout_s=60)
    return response.responses[0].partition_responses[0]
