"""Failures of a cluster of three broker processes on one real PostgreSQL, with
confluent-kafka clients (issue 25's "Show"):

- share groups across the cluster: share consumers with explicit acknowledgements read
  a 6-partition topic led 2/2/2 and a 2-partition topic led by two brokers, each
  partition's records handed out by the broker leading it; every record delivered, none
  again once its ACCEPT was confirmed;
- kill -9 of the broker leading the busiest partition, and of the one holding the share
  coordinator, under an idempotent acks=all producer and share consumers acknowledging
  explicitly: traffic on that partition resumes within broker.session.timeout.ms + 5 s,
  no record acknowledged to the producer is lost, none is delivered again after its
  ACCEPT was confirmed, no delivery count goes back;
- a zombie: a partition leader paused (SIGSTOP) past its lease while another takes the
  partition over with epoch + 1, then resumed: a write it is sent as it resumes is
  refused, never visible to a consumer of the new leader; it rejoins the layout;
- a rolling restart (SIGTERM, exit, start on the same data dir and node id) of all three
  brokers under an idempotent producer and a consumer: nothing lost or duplicated, no
  error at the producer;
- a network cut between one broker and the rest: broker 3 runs in an `ip netns`
  namespace joined to this one by a veth pair (PostgreSQL, on the loopback, reached
  through a relay on the veth address), brokers 1 and 2 listen on this side's veth
  address; taking the veth down cuts broker 3 off from the database, the other brokers
  and the clients. Skipped where the machine does not allow namespaces (not root, no
  iproute2).

Leases are short (broker.session.timeout.ms 3000, broker.heartbeat.interval.ms 500).
Every wait is bounded; timing assertions are against the configured lease, measured from
the kill to the first record acknowledged (producer) or delivered (share consumer) on the
partition the killed broker led. An ACCEPT counts as confirmed once commit_sync answered
no error for its partition; a delivery count going back is seen on a record delivered
again (librdkafka's delivery_count).

The share coordinator's broker is found in spool_logs (the live holder of `share-state`);
the coordinator logs fail over as partitions do (broker.leadership).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    AcknowledgeType,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    ShareConsumer,
    TopicPartition,
)

from protocol.client import KafkaClient
from protocol.errors import ErrorCode
from protocol.records import NewRecord, build_batch
from tests.integration.conftest import (
    CLIENT_LOGGER,
    Broker,
    consume_assigned,
    create_topic,
    producer_config,
)
from tests.integration.pg_helpers import (
    SESSION_MS,
    ClusterBroker,
    cluster,
    db_rows,
    pg_dsn,
    pg_server,
    start_brokers,
)
from tests.integration.share_helpers import close_quietly, log_lines, share_consumer
from tests.integration.test_pg_leadership import PARTITIONS, leaders, settled, start_cluster
from tests.integration.test_pg_registry import with_signal

__all__ = ["cluster", "pg_dsn", "pg_server"]  # the fixtures

WAIT_S = 30.0
# The bound: traffic resumes within the lease plus 5 s after a kill -9.
RESUME_BOUND_S = SESSION_MS / 1000 + 5.0


def wait_for(check: Callable[[], Any], what: str, timeout: float = WAIT_S) -> Any:
    """Poll `check` until it returns something true (returned); bounded by `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def bootstrap(brokers: list[ClusterBroker]) -> str:
    return ",".join(b.bootstrap for b in brokers)


def holder(dsn: str, log: str) -> tuple[int, int] | None:
    """(node id, epoch) of the live broker holding `log` in spool_logs, or None."""
    rows = db_rows(
        dsn,
        "SELECT l.leader_node, l.leader_epoch FROM spool_logs l "
        "JOIN spool_brokers b ON b.node_id = l.leader_node AND b.lease_expires_at > now() "
        "WHERE l.name = $1",
        log,
    )
    return (int(rows[0]["leader_node"]), int(rows[0]["leader_epoch"])) if rows else None


def epoch_of(dsn: str, log: str) -> tuple[int | None, int]:
    rows = db_rows(dsn, "SELECT leader_node, leader_epoch FROM spool_logs WHERE name = $1", log)
    return rows[0]["leader_node"], int(rows[0]["leader_epoch"])


def initialized(brokers: list[ClusterBroker], group: str, topic: str) -> dict[int, set[int]]:
    """Node id -> the partitions of `topic` whose share partition for `group` it loaded
    (initialized or loaded from the share state), by the brokers' logs."""
    out: dict[int, set[int]] = {}
    for b in brokers:
        for event in ("share_partition_initialized", "share_partition_loaded"):
            for line in log_lines(b, event, group, topic):
                found = re.search(r"partition\W+(\d+)", line)
                if found:
                    out.setdefault(b.node_id, set()).add(int(found.group(1)))
    return out


# -- traffic -----------------------------------------------------------------------


class Traffic:
    """An idempotent acks=all producer in a thread: record i (value b"<prefix>-i") goes
    to `busiest` every other record, else round-robin over the other partitions, about
    `rate` records a second. Acknowledged records are kept with their offset and the
    time of their delivery report; any delivery error is kept too."""

    def __init__(
        self,
        brokers: list[ClusterBroker],
        topic: str,
        prefix: str,
        busiest: int | None = None,
        rate: float = 300.0,
    ) -> None:
        self.topic = topic
        self.prefix = prefix
        self.busiest = busiest
        self.rate = rate
        self.producer = Producer(
            producer_config(
                brokers[0],
                **{
                    "bootstrap.servers": bootstrap(brokers),
                    "linger.ms": 2,
                    "message.timeout.ms": 60_000,
                    "topic.metadata.refresh.interval.ms": 1000,
                },
            )
        )
        self.lock = threading.Lock()
        self.acked: dict[bytes, tuple[int, int, float]] = {}
        self.errors: list[str] = []
        self.sent = 0
        self.unflushed = -1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _partition(self, i: int) -> int:
        if self.busiest is None:
            return i % PARTITIONS
        if i % 2 == 0:
            return self.busiest
        others = [p for p in range(PARTITIONS) if p != self.busiest]
        return others[(i // 2) % len(others)]

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        now = time.monotonic()
        with self.lock:
            if err is not None:
                self.errors.append(f"{msg.partition()}: {err}")
            else:
                self.acked[msg.value()] = (msg.partition(), msg.offset(), now)

    def _run(self) -> None:
        try:
            self._produce()
        except Exception as exc:  # a fatal producer error (idempotence broken, ...)
            with self.lock:
                self.errors.append(f"producer raised {exc!r}")
        finally:
            self.unflushed = self.producer.flush(90)

    def _produce(self) -> None:
        i = 0
        period = 1.0 / self.rate
        next_at = time.monotonic()
        while not self._stop.is_set():
            value = f"{self.prefix}-{i}".encode()
            try:
                self.producer.produce(
                    self.topic,
                    value=value,
                    partition=self._partition(i),
                    on_delivery=self._on_delivery,
                )
            except BufferError:
                self.producer.poll(0.05)
                continue
            i += 1
            self.sent = i
            self.producer.poll(0)
            next_at += period
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)

    def start(self) -> Traffic:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)
        assert not self._thread.is_alive(), "the producer thread did not finish"

    def acked_on(self, partition: int) -> list[tuple[int, float]]:
        with self.lock:
            return [(o, t) for p, o, t in self.acked.values() if p == partition]

    def values(self) -> set[bytes]:
        with self.lock:
            return set(self.acked)


@dataclass
class ShareLedger:
    """What share consumers were handed and which ACCEPTs were confirmed (commit_sync
    answered without an error for the record's partition)."""

    deliveries: list[tuple[float, str, int, int, bytes | None, int | None]] = field(
        default_factory=list
    )
    confirmed: dict[tuple[str, int, int], float] = field(default_factory=dict)
    redelivered_after_accept: list[tuple[str, int, int]] = field(default_factory=list)
    count_went_back: list[tuple[str, int, int, int, int]] = field(default_factory=list)
    last_count: dict[tuple[str, int, int], int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    values: set[bytes] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def delivered(self, msg: Message) -> None:
        key = (msg.topic(), msg.partition(), msg.offset())
        count = msg.delivery_count() if hasattr(msg, "delivery_count") else None
        with self.lock:
            self.deliveries.append((time.monotonic(), *key, msg.value(), count))
            if key in self.confirmed:
                self.redelivered_after_accept.append(key)
            if count is not None:
                before = self.last_count.get(key)
                if before is not None and count < before:
                    self.count_went_back.append((*key, before, count))
                self.last_count[key] = max(count, before or 0)

    def accepted(self, keys: list[tuple[str, int, int]], values: list[bytes | None]) -> None:
        now = time.monotonic()
        with self.lock:
            for key, value in zip(keys, values, strict=True):
                self.confirmed.setdefault(key, now)
                if value is not None:
                    self.values.add(value)

    def delivered_values(self) -> set[bytes]:
        with self.lock:
            return {v for _t, _topic, _p, _o, v, _c in self.deliveries if v is not None}

    def accepted_values(self) -> set[bytes]:
        with self.lock:
            return set(self.values)

    def first_after(self, partition: int, since: float, above: int) -> float | None:
        """The first delivery time after `since` of a record of `partition` at an offset
        above `above`."""
        with self.lock:
            return next(
                (
                    t
                    for t, _topic, p, o, _v, _c in self.deliveries
                    if p == partition and t > since and o > above
                ),
                None,
            )


class ShareReaders:
    """Share consumers of one group in explicit mode, polled in turn by one thread:
    every record handed out is ACCEPTed and committed with commit_sync before the
    consumer's next poll."""

    def __init__(
        self, brokers: list[ClusterBroker], group: str, topics: list[str], count: int
    ) -> None:
        self.ledger = ShareLedger()
        self.consumers: list[ShareConsumer] = [
            share_consumer(
                brokers[0],
                group,
                topics,
                **{
                    "bootstrap.servers": bootstrap(brokers),
                    "client.id": f"{group}-{i}",
                    "logger": CLIENT_LOGGER,
                    "topic.metadata.refresh.interval.ms": 1000,
                },
            )
            for i in range(count)
        ]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _poll(self, consumer: ShareConsumer) -> None:
        msgs = consumer.poll(0.2)
        data = []
        for msg in msgs:
            err = msg.error()
            if err is not None:
                self.ledger.errors.append(str(err))
                continue
            self.ledger.delivered(msg)
            consumer.acknowledge(msg, AcknowledgeType.ACCEPT)
            data.append(msg)
        if not data:
            return
        try:
            result = consumer.commit_sync(15)
        except KafkaException as exc:
            self.ledger.errors.append(f"commit_sync: {exc}")
            return
        ok = {(tp.topic, tp.partition) for tp, err in result.items() if err is None}
        for tp, err in result.items():
            if err is not None:
                self.ledger.errors.append(f"commit_sync {tp.topic}-{tp.partition}: {err}")
        done = [m for m in data if (m.topic(), m.partition()) in ok]
        self.ledger.accepted(
            [(m.topic(), m.partition(), m.offset()) for m in done], [m.value() for m in done]
        )

    def _run(self) -> None:
        while not self._stop.is_set():
            for consumer in self.consumers:
                self._poll(consumer)

    def start(self) -> ShareReaders:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive(), "the share consumer thread did not finish"
        for consumer in self.consumers:
            close_quietly(consumer)


def wait_initialized(
    brokers: list[ClusterBroker], group: str, topic: str, partitions: int, timeout: float = 60
) -> dict[int, set[int]]:
    """Wait until every partition of `topic` has a share partition for `group` loaded on
    some broker (share.auto.offset.reset latest: records produced before are skipped)."""
    return wait_for(
        lambda: (
            (found := initialized(brokers, group, topic))
            and set().union(*found.values()) == set(range(partitions))
            and found
        ),
        f"the share partitions of {topic} initialized",
        timeout,
    )


def read_all(b: ClusterBroker, topic: str, expected: int) -> list[bytes]:
    got = consume_assigned(b, topic, list(range(PARTITIONS)), expected, timeout=30)
    return [r.value for r in got if r.value is not None]


# -- 1. share groups across the cluster ----------------------------------------------


def test_share_consumers_read_every_partition_from_the_broker_leading_it(
    cluster: Callable[..., ClusterBroker],
) -> None:
    brokers = start_cluster(cluster, "spread-share")
    one = brokers[0]
    create_topic(one, "pair", 2)
    pair = wait_for(
        lambda: (m := leaders(one, "pair")) and len(m) == 2 and -1 not in m.values() and m,
        "the two-partition topic led",
    )
    assert len(set(pair.values())) == 2, f"one broker leads both partitions: {pair}"
    layout = leaders(one, "spread-share")
    assert sorted(Counter(layout.values()).values()) == [2, 2, 2], layout

    group = "spread-group"
    readers = ShareReaders(brokers, group, ["spread-share", "pair"], 3).start()
    try:
        on_six = wait_initialized(brokers, group, "spread-share", PARTITIONS)
        on_two = wait_initialized(brokers, group, "pair", 2)
        producer = Producer(producer_config(one, **{"bootstrap.servers": bootstrap(brokers)}))
        values = []
        for topic, partitions, n in (("spread-share", PARTITIONS, 600), ("pair", 2, 100)):
            for i in range(n):
                value = f"{topic}-{i}".encode()
                values.append(value)
                producer.produce(topic, value=value, partition=i % partitions)
        assert producer.flush(60) == 0
        wait_for(
            lambda: len(readers.ledger.accepted_values()) >= len(values),
            "every record ACCEPTed",
            90,
        )
        time.sleep(2)  # nothing more should come
    finally:
        readers.stop()
    ledger = readers.ledger
    assert ledger.redelivered_after_accept == [], ledger.redelivered_after_accept[:10]
    assert ledger.accepted_values() == set(values)
    # Each share partition lives on the broker leading its partition, so the partitions
    # came from all three brokers (and the pair's from two).
    for topic, found, want in (("spread-share", on_six, layout), ("pair", on_two, pair)):
        by_node = {p: node for node, ps in found.items() for p in ps}
        assert by_node == want, (topic, found, want)
    assert set(on_six) == {1, 2, 3} and len(on_two) == 2


# -- 2. kill -9 under load -------------------------------------------------------------


@pytest.mark.parametrize("victim", ["partition-leader", "share-coordinator"])
def test_kill9_under_produce_and_share_load_loses_and_redelivers_nothing(
    cluster: Callable[..., ClusterBroker], pg_dsn: str, victim: str
) -> None:
    brokers = start_cluster(cluster, "busy")
    by_id = {b.node_id: b for b in brokers}
    coordinator = holder(pg_dsn, "share-state")
    assert coordinator is not None
    layout = leaders(brokers[0], "busy")
    if victim == "share-coordinator":
        dead = coordinator[0]
    else:
        dead = next(n for n in (1, 2, 3) if n != coordinator[0])
    busiest = min(p for p, leader in layout.items() if leader == dead)
    survivors = [b for b in brokers if b.node_id != dead]

    group = f"busy-{victim}"
    readers = ShareReaders(brokers, group, ["busy"], 2).start()
    traffic: Traffic | None = None
    try:
        wait_initialized(brokers, group, "busy", PARTITIONS)
        traffic = Traffic(brokers, "busy", "r", busiest=busiest).start()
        wait_for(lambda: len(readers.ledger.accepted_values()) >= 300, "share traffic flowing")
        by_id[dead].kill9()
        killed_at = time.monotonic()
        # What the dead broker acknowledged has reached the producer's callbacks by now:
        # a record acknowledged above this offset was written by the new leader.
        time.sleep(0.3)
        acked_before = max(o for o, _ in traffic.acked_on(busiest))
        produced = wait_for(
            lambda: next((t for o, t in traffic.acked_on(busiest) if o > acked_before), None),
            f"a record acknowledged on partition {busiest} after the kill",
            RESUME_BOUND_S + 10,
        )
        delivered = wait_for(
            lambda: readers.ledger.first_after(busiest, killed_at, acked_before),
            f"a record of partition {busiest} delivered after the kill",
            RESUME_BOUND_S + 10,
        )
        time.sleep(2)  # traffic on the new leaders for a while
        traffic.stop()
        acked = traffic.values()
        with contextlib.suppress(AssertionError):  # checked below, after redeliveries
            wait_for(lambda: acked <= readers.ledger.delivered_values(), "all delivered", 60)
        time.sleep(2)  # nothing ACCEPTed should come back
    finally:
        if traffic is not None:
            traffic.stop()
        readers.stop()
    ledger = readers.ledger
    assert traffic.errors == [] and traffic.unflushed == 0, traffic.errors[:5]
    assert ledger.redelivered_after_accept == [], ledger.redelivered_after_accept[:10]
    assert ledger.count_went_back == [], ledger.count_went_back[:10]
    # Lost: acknowledged to the producer, never handed to a share consumer. (A record
    # whose ACCEPT commit_sync could not confirm, its request in flight as a broker
    # died, may have been accepted all the same: it need not come back.)
    missing = acked - ledger.delivered_values()
    where = sorted(traffic.acked[v][:2] for v in missing)
    assert not missing, (
        f"{len(missing)} acknowledged records never delivered, (partition, offset): "
        f"{where[:10]}; killed the leader of partition {busiest}, layout {layout}; "
        f"consumer errors {ledger.errors[:5]}"
    )
    times = Counter((d[1], d[2], d[3]) for d in ledger.deliveries)
    again = [(d[2], d[3], d[5]) for d in ledger.deliveries if times[(d[1], d[2], d[3])] > 1]
    print(f"records delivered more than once: {len(again)}; (partition, offset, count) {again[:8]}")
    # Resumed once the lease ran out, within the lease plus 5 s.
    print(f"resumed: produce {produced - killed_at:.2f} s, share {delivered - killed_at:.2f} s")
    assert produced - killed_at <= RESUME_BOUND_S, ("produce", produced - killed_at)
    assert delivered - killed_at <= RESUME_BOUND_S, ("share", delivered - killed_at)
    # Every acknowledged record is in the log once (idempotence across the failover).
    logged = read_all(survivors[0], "busy", len(acked))
    assert set(logged) >= acked, sorted(acked - set(logged))[:10]
    duplicates = [v for v, n in Counter(logged).items() if n > 1]
    assert duplicates == [], duplicates[:10]


# -- 3. the zombie -----------------------------------------------------------------


async def _produce_while_paused(b: ClusterBroker, topic: str, partition: int, value: bytes) -> Any:
    """Send a Produce (acks=all) to `b`, paused, then resume it: the request is the first
    thing it reads, before its timers notice the lease it lost. The partition's answer."""
    client = await KafkaClient.connect(b.host, b.port, "spool-it-zombie")
    try:
        batch = bytes(build_batch([NewRecord(key=None, value=value)]))
        body = {
            "transactional_id": None,
            "acks": -1,
            "timeout": 30_000,
            "topic_data": [
                {"name": topic, "partition_data": [{"index": partition, "records": batch}]}
            ],
        }
        # The connection is made; now pause it again and queue the request.
        with_signal(b, signal.SIGSTOP)
        request = asyncio.ensure_future(client.request(0, 9, body, timeout_s=60))
        await asyncio.sleep(0.3)
        with_signal(b, signal.SIGCONT)
        response = await request
        return response.responses[0].partition_responses[0]
    finally:
        await client.close()


def test_a_leader_paused_past_its_lease_is_fenced_and_rejoins(
    cluster: Callable[..., ClusterBroker], pg_dsn: str
) -> None:
    brokers = start_cluster(cluster, "zombie")
    coordinator = holder(pg_dsn, "share-state")
    assert coordinator is not None
    layout = leaders(brokers[0], "zombie")
    zombie = next(b for b in brokers if b.node_id != coordinator[0])
    others = [b for b in brokers if b is not zombie]
    partition = min(p for p, leader in layout.items() if leader == zombie.node_id)
    name = f"topics/zombie-{partition}"
    node, epoch = epoch_of(pg_dsn, name)
    assert node == zombie.node_id

    producer = Producer(producer_config(others[0], **{"bootstrap.servers": bootstrap(others)}))
    acked: list[bytes] = []
    for i in range(100):
        producer.produce(
            "zombie",
            value=f"before-{i}".encode(),
            partition=i % PARTITIONS,
            on_delivery=lambda err, msg: err is None and acked.append(msg.value()),
        )
    assert producer.flush(30) == 0 and len(acked) == 100

    with_signal(zombie, signal.SIGSTOP)
    try:
        wait_for(
            settled(others, "zombie", {o.node_id for o in others}),
            "the others to lead the paused broker's partitions",
        )
        taken = epoch_of(pg_dsn, name)
        assert taken[0] != zombie.node_id and taken[1] == epoch + 1, (taken, epoch)
        for i in range(100):
            producer.produce(
                "zombie",
                value=f"during-{i}".encode(),
                partition=i % PARTITIONS,
                on_delivery=lambda err, msg: err is None and acked.append(msg.value()),
            )
        assert producer.flush(30) == 0 and len(acked) == 200
        with_signal(zombie, signal.SIGCONT)  # (paused again around the write)
        answer = asyncio.run(_produce_while_paused(zombie, "zombie", partition, b"zombie-write"))
    finally:
        with_signal(zombie, signal.SIGCONT)
    print(f"the paused leader answered the write with error {answer.error_code}")
    assert answer.error_code != ErrorCode.none, answer
    # The new leader never shows it; the zombie's own log is dropped (fenced).
    assert b"zombie-write" not in read_all(others[0], "zombie", 200)
    # It rejoins: its lease renewed (or re-registered), the layout spread over three again.
    assert zombie.running
    wait_for(lambda: all(b.sees() == 3 for b in brokers), "the resumed broker to rejoin")
    wait_for(settled(brokers, "zombie", {1, 2, 3}), "the layout over three brokers again")
    assert epoch_of(pg_dsn, name)[1] >= epoch + 1
    logged = read_all(zombie, "zombie", 200)
    assert sorted(logged) == sorted(acked), "a record lost, duplicated or the zombie's"
    # It dropped its stale copy of the partition (fenced, or claimed by another).
    assert log_lines(zombie, "partition_dropped", f"partition={partition} ", "topic=zombie")
    assert b"zombie-write" not in logged


# -- 4. rolling restart --------------------------------------------------------------


def test_a_rolling_restart_under_load_loses_and_duplicates_nothing(
    cluster: Callable[..., ClusterBroker],
) -> None:
    brokers = start_cluster(cluster, "rolling")
    seen: list[bytes] = []
    consumer_errors: list[str] = []
    stop = threading.Event()

    def read() -> None:
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap(brokers),
                "logger": CLIENT_LOGGER,
                "broker.address.family": "v4",
                "group.id": "rolling-reader",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": 100,
                "topic.metadata.refresh.interval.ms": 1000,
                "reconnect.backoff.ms": 50,
                "reconnect.backoff.max.ms": 500,
            }
        )
        consumer.assign([TopicPartition("rolling", p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        try:
            while not stop.is_set():
                for msg in consumer.consume(num_messages=500, timeout=0.2):
                    err = msg.error()
                    if err is None:
                        seen.append(msg.value())
                    elif err.code() != KafkaError._PARTITION_EOF:
                        consumer_errors.append(str(err))
        finally:
            consumer.close()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    traffic = Traffic(brokers, "rolling", "rr").start()
    try:
        for b in brokers:
            time.sleep(1.5)
            b.stop()  # SIGTERM: hands its partitions over, exit 0 required
            b.start()  # same data dir, node id and port
            wait_for(
                settled(brokers, "rolling", {1, 2, 3}),
                f"the layout over three brokers again after restarting broker {b.node_id}",
            )
        time.sleep(1.5)
    finally:
        traffic.stop()
    acked = traffic.values()
    try:
        wait_for(lambda: len(set(seen)) >= len(acked), "the consumer to read everything", 60)
    finally:
        stop.set()
        reader.join(30)
    assert traffic.errors == [] and traffic.unflushed == 0, traffic.errors[:5]
    assert len(acked) == traffic.sent
    assert set(seen) == acked
    assert len(seen) == len(set(seen)), "the consumer was handed a record twice"
    logged = read_all(brokers[0], "rolling", len(acked))
    assert sorted(logged) == sorted(acked), "lost or duplicated in the log"


# -- 5. a network cut (ip netns) -----------------------------------------------------


def _netns_unavailable() -> str | None:
    """Why brokers cannot be put in network namespaces here, or None."""
    if os.geteuid() != 0:
        return "needs root for ip netns"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    probe = f"spool-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` refused: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)
    assert done.returncode == 0, f"ip {' '.join(args)}: {done.stderr.strip()}"


@dataclass
class Veth:
    """A network namespace joined to this one by a veth pair: `host_ip` on this side,
    `ns_ip` inside; `cut()` takes this side's end down (nothing passes either way) and
    `mend()` brings it up. Addresses of this side stay reachable from here meanwhile."""

    ns: str
    host_if: str
    host_ip: str
    ns_ip: str

    def cut(self) -> None:
        _ip("link", "set", self.host_if, "down")

    def mend(self) -> None:
        _ip("link", "set", self.host_if, "up")


@pytest.fixture
def veth() -> Iterator[Veth]:
    reason = _netns_unavailable()
    if reason is not None:
        pytest.skip(f"network namespaces are not available here: {reason}")
    tag = os.getpid() % 10_000
    net = Veth(f"spool-cut-{tag}", f"spc{tag}h", f"10.213.{tag % 250}.1", f"10.213.{tag % 250}.2")
    peer = f"spc{tag}n"
    _ip("netns", "add", net.ns)
    try:
        _ip("link", "add", net.host_if, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", net.ns)
        _ip("addr", "add", f"{net.host_ip}/24", "dev", net.host_if)
        _ip("link", "set", net.host_if, "up")
        inside = ("netns", "exec", net.ns, "ip")
        _ip(*inside, "addr", "add", f"{net.ns_ip}/24", "dev", peer)
        _ip(*inside, "link", "set", peer, "up")
        _ip(*inside, "link", "set", "lo", "up")
        yield net
    finally:
        subprocess.run(["ip", "link", "del", net.host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", net.ns], capture_output=True)


class TcpRelay:
    """Forwards connections accepted on (host, any port) to `upstream`, one thread per
    direction: PostgreSQL listens on the loopback only, a broker in a namespace reaches
    it through this relay on the veth address."""

    def __init__(self, host: str, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.listener = socket.create_server((host, 0))
        self.listener.settimeout(0.1)
        self.port = int(self.listener.getsockname()[1])
        self.stopped = threading.Event()
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            server = socket.create_connection(self.upstream, timeout=10)
            server.settimeout(None)
            client.settimeout(None)
            self.sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.stopped.set()
        self.listener.close()
        for sock in self.sockets:
            with contextlib.suppress(OSError):
                sock.close()


class NetBroker(ClusterBroker):
    """A cluster broker listening (and serving /metrics) on `host`, run inside the
    network namespace `ns` when given."""

    def __init__(
        self, root: Path, name: str, dsn: str, node_id: int, host: str, ns: str | None
    ) -> None:
        super().__init__(root, name, dsn, node_id)
        self.host = host
        self.ns = ns

    def command(self) -> list[str]:
        cmd = [
            *Broker.command(self),
            *("--node-id", str(self.node_id)),
            *("--metrics", f"{self.host}:{self.metrics_port}"),
        ]
        return cmd if self.ns is None else ["ip", "netns", "exec", self.ns, *cmd]

    def metric(self, name: str) -> float | None:
        url = f"http://{self.host}:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
        return None if found is None else float(found.group(1))


def test_a_broker_cut_off_by_the_network_is_replaced_and_rejoins(
    veth: Veth, tmp_path: Path, pg_dsn: str
) -> None:
    """Brokers 1 and 2 listen on this side's veth address, broker 3 in the namespace
    (PostgreSQL reached through a relay on the veth): cutting the veth leaves broker 3
    without the database and the others; they lead its partitions once its lease ran
    out, the producer follows, and when the link is back broker 3 rejoins the layout.
    Nothing acknowledged is lost or duplicated."""
    pg_host, pg_port = pg_dsn.split("@", 1)[1].split("/", 1)[0].split(":")
    relay = TcpRelay(veth.host_ip, (pg_host, int(pg_port)))
    ns_dsn = pg_dsn.replace(f"@{pg_host}:{pg_port}/", f"@{veth.host_ip}:{relay.port}/")
    brokers: list[ClusterBroker] = [
        NetBroker(tmp_path, "broker1", pg_dsn, 1, veth.host_ip, None),
        NetBroker(tmp_path, "broker2", pg_dsn, 2, veth.host_ip, None),
        NetBroker(tmp_path, "broker3", ns_dsn, 3, veth.ns_ip, veth.ns),
    ]
    cut = brokers[2]
    traffic: Traffic | None = None
    try:
        start_brokers(brokers, timeout=WAIT_S)
        create_topic(brokers[0], "netcut", PARTITIONS)
        wait_for(settled(brokers, "netcut", {1, 2, 3}), "the leaders spread over three")
        busiest = min(p for p, leader in leaders(brokers[0], "netcut").items() if leader == 3)
        traffic = Traffic(brokers, "netcut", "n", busiest=busiest).start()
        wait_for(lambda: len(traffic.acked_on(busiest)) >= 200, "traffic on broker 3")
        veth.cut()
        cut_at = time.monotonic()
        time.sleep(0.3)  # acknowledgements in flight reach the callbacks
        acked_before = max(o for o, _ in traffic.acked_on(busiest))
        try:
            produced = wait_for(
                lambda: next((t for o, t in traffic.acked_on(busiest) if o > acked_before), None),
                f"a record acknowledged on partition {busiest} after the cut",
                RESUME_BOUND_S + 10,
            )
            wait_for(settled(brokers[:2], "netcut", {1, 2}), "brokers 1 and 2 to lead all six")
            time.sleep(1)
        finally:
            veth.mend()
        # Back on the network: fenced (its lease expired, its logs claimed by others),
        # it rejoins, and the layout spreads over three brokers again.
        wait_for(lambda: all(b.sees() == 3 for b in brokers[:2]), "broker 3 to rejoin")
        wait_for(settled(brokers, "netcut", {1, 2, 3}), "the layout over three again")
        time.sleep(1)
        traffic.stop()
        acked = traffic.values()
        assert traffic.errors == [] and traffic.unflushed == 0, traffic.errors[:5]
        assert produced - cut_at <= RESUME_BOUND_S, ("produce", produced - cut_at)
        logged = read_all(brokers[0], "netcut", len(acked))
        assert set(logged) >= acked, sorted(acked - set(logged))[:10]
        duplicates = [v for v, n in Counter(logged).items() if n > 1]
        assert duplicates == [], duplicates[:10]
        assert cut.running or log_lines(cut, "broker_fenced")
    finally:
        if traffic is not None:
            traffic.stop()
        for b in brokers:
            if b.running:
                b.stop()
        relay.close()
