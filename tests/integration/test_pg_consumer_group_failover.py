"""A consumer group's coordinator killed mid-rebalance, on three broker processes of one
PostgreSQL database (short leases: broker.session.timeout.ms 3000, heartbeat 500), for
both `group.protocol` modes of confluent-kafka Consumers with subscribe().

A 6-partition topic holds records whose values carry their partition and sequence
number. Two consumers consume part of it, committing synchronously after every batch
(and, classic, in on_revoke). A third subscribes; as soon as a member's partitions are
revoked (the rebalance is under way) the broker FindCoordinator names for the group is
killed with SIGKILL. Consumption goes on, and:

- the group re-forms on another broker (FindCoordinator on the survivors names it; the
  three members hold the six partitions 2/2/2) within broker.session.timeout.ms + 30 s;
- every record is consumed;
- committed offsets were kept: a record is consumed twice only at or beyond its
  partition's last offset committed before the kill (nothing restarts from earlier);
- the committed offsets end at the log end of every partition.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from protocol.client import KafkaClient
from tests.integration.conftest import create_topic, produce, producer_config
from tests.integration.pg_helpers import (
    SESSION_MS,
    ClusterBroker,
    cluster,
    pg_dsn,
    pg_server,
    start_brokers,
)

__all__ = ["cluster", "pg_dsn", "pg_server"]  # the fixtures

NODES = (1, 2, 3)
PARTITIONS, PER_PARTITION = 6, 300
ROUND = 10  # records per partition produced (and flushed) at a time
BATCH = 5  # records per consume(): the first two consume part of the topic
BEFORE_JOIN = 10  # records of each partition consumed and committed before the third joins
# Rebalances fast, as in test_classic_group_rpcs and test_consumer_group_rpcs.
SETTINGS = {
    "group.initial.rebalance.delay.ms": "0",
    "group.consumer.min.session.timeout.ms": "1000",
    "group.consumer.session.timeout.ms": "6000",
    "group.consumer.min.heartbeat.interval.ms": "100",
    "group.consumer.heartbeat.interval.ms": "500",
}
CLIENT = {
    "classic": {
        "partition.assignment.strategy": "range",
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 300,
    },
    "consumer": {},
}
REFORM_BOUND_S = SESSION_MS / 1000 + 30.0
WAIT_S = 60.0
FIND_COORDINATOR = 10


def coordinator_of(b: ClusterBroker, group: str) -> int:
    """The node FindCoordinator v6 (GROUP key) on `b` names for `group`; -1 if none."""

    async def ask() -> int:
        client = await KafkaClient.connect(b.host, b.port, "spool-it-cg-failover")
        try:
            response = await client.request(
                FIND_COORDINATOR, 6, {"key_type": 0, "coordinator_keys": [group]}
            )
            (coordinator,) = response.coordinators
            return -1 if coordinator.error_code else int(coordinator.node_id)
        finally:
            await client.close()

    return asyncio.run(ask())


class Run:
    """What every member consumed and committed, with the moment of the kill."""

    def __init__(self) -> None:
        # (partition, offset, value, after the kill) of every record consumed
        self.consumed: list[tuple[int, int, bytes, bool]] = []
        self.committed = [0] * PARTITIONS  # highest offset a commit confirmed
        self.killed = False
        self.revoked_after_join = False
        self.join_started = False
        self.errors: list[str] = []

    def note_commit(self, result: list[TopicPartition] | None) -> None:
        for tp in result or []:
            if tp.error is None and tp.offset >= 0:
                self.committed[tp.partition] = max(self.committed[tp.partition], tp.offset)
            elif tp.error is not None and tp.error.code() != KafkaError._NO_OFFSET:
                self.errors.append(str(tp.error))


class Member:
    """One subscribed consumer: a batch at a time, a synchronous commit after each."""

    def __init__(
        self, run: Run, bootstrap: str, group: str, topic: str, protocol: str, name: str
    ) -> None:
        self.run, self.name, self.protocol = run, name, protocol
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "broker.address.family": "v4",
                "group.id": group,
                "group.protocol": protocol,
                "client.id": name,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "enable.partition.eof": False,
                "fetch.wait.max.ms": 100,
                # Little prefetched per partition: every partition is consumed a bit
                # at a time, so each is partly committed when the third joins.
                "queued.min.messages": 20,
                "max.partition.fetch.bytes": 1024,
                "socket.timeout.ms": 10_000,
                "reconnect.backoff.ms": 50,
                "reconnect.backoff.max.ms": 500,
                **CLIENT[protocol],
            }
        )
        self.consumer.subscribe([topic], on_revoke=self._on_revoke)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if partitions and self.run.join_started:
            self.run.revoked_after_join = True
        if self.protocol == "classic" and partitions:
            self.commit()  # the positions of what it consumed, before it lets go

    def commit(self) -> None:
        try:
            self.run.note_commit(self.consumer.commit(asynchronous=False))
        except KafkaException as exc:  # e.g. no coordinator yet: may come again
            if exc.args[0].code() != KafkaError._NO_OFFSET:  # nothing new to commit
                self.run.errors.append(str(exc))

    def assigned(self) -> set[int]:
        return {tp.partition for tp in self.consumer.assignment()}

    def step(self) -> None:
        batch = self.consumer.consume(num_messages=BATCH, timeout=0.1)
        got = [m for m in batch if m.error() is None]
        self.run.errors.extend(str(m.error()) for m in batch if m.error() is not None)
        if not got:
            return
        for m in got:
            partition, offset = m.partition(), m.offset()
            assert partition is not None and offset is not None
            self.run.consumed.append((partition, offset, m.value() or b"", self.run.killed))
        self.commit()


def run_until(
    members: list[Member], done: Callable[[], bool], what: str, timeout: float = WAIT_S
) -> float:
    """Step every member until `done`; the seconds it took (at most `timeout`)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        for m in members:
            m.step()
        if done():
            return time.monotonic() - started
    run = members[0].run
    raise AssertionError(
        f"never {what} within {timeout}s: assignments "
        f"{[(m.name, sorted(m.assigned())) for m in members]}, consumed "
        f"{len({(p, o) for p, o, _, _ in run.consumed})}, committed {run.committed}, "
        f"errors {run.errors[-5:]}"
    )


def split_evenly(members: list[Member]) -> Callable[[], bool]:
    def done() -> bool:
        held = [p for m in members for p in m.assigned()]
        each = PARTITIONS // len(members)
        return sorted(held) == list(range(PARTITIONS)) and all(
            len(m.assigned()) == each for m in members
        )

    return done


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_the_group_reforms_on_a_new_coordinator_after_kill9_mid_rebalance(
    cluster: Callable[..., ClusterBroker], protocol: str
) -> None:
    made = [cluster(n) for n in NODES]
    for b in made:
        b.settings.update(SETTINGS)
    brokers = start_brokers(made)
    bootstrap = ",".join(b.bootstrap for b in brokers)
    topic, group = f"cgf-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    create_topic(brokers[0], topic, PARTITIONS)
    producer = Producer(producer_config(brokers[0], **{"bootstrap.servers": bootstrap}))
    for first in range(0, PER_PARTITION, ROUND):  # small batches: fetches interleave
        outcome = produce(
            producer,
            topic,
            [
                (p, None, b"%d:%d" % (p, i), [])
                for i in range(first, first + ROUND)
                for p in range(PARTITIONS)
            ],
        )
        assert not outcome.errors and len(outcome.acked) == PARTITIONS * ROUND
    everything = {(p, i) for p in range(PARTITIONS) for i in range(PER_PARTITION)}

    run = Run()
    members = [Member(run, bootstrap, group, topic, protocol, n) for n in ("a", "b")]
    try:
        run_until(members, split_evenly(members), "split 3/3 between two consumers")
        run_until(
            members,
            lambda: all(c >= BEFORE_JOIN for c in run.committed),
            "consumed and committed part of every partition",
        )
        assert not all(c == PER_PARTITION for c in run.committed)

        coordinator = coordinator_of(brokers[0], group)
        assert all(coordinator_of(b, group) == coordinator for b in brokers)
        victim = next(b for b in brokers if b.node_id == coordinator)
        survivors = [b for b in brokers if b is not victim]

        # A third joins: kill the coordinator once a member's partitions are revoked.
        run.join_started = True
        members.append(Member(run, bootstrap, group, topic, protocol, "c"))
        run_until(members, lambda: run.revoked_after_join, "a rebalance under way", 30.0)
        kept = list(run.committed)
        victim.kill9()
        run.killed = True
        killed_at = time.monotonic()

        # The group re-forms on a survivor: named by FindCoordinator, 2/2/2.
        def reformed() -> bool:
            named = {coordinator_of(b, group) for b in survivors}
            return len(named) == 1 and named <= {b.node_id for b in survivors}

        run_until(members, reformed, "a new coordinator named", REFORM_BOUND_S)
        run_until(
            members,
            split_evenly(members),
            "split 2/2/2 on the new coordinator",
            REFORM_BOUND_S - (time.monotonic() - killed_at),
        )
        # Consumption completes: every record consumed and committed up to the log end.
        run_until(
            members,
            lambda: (
                {(p, o) for p, o, _, _ in run.consumed} >= everything
                and run.committed == [PER_PARTITION] * PARTITIONS
            ),
            "consumed and committed everything",
        )
        final = members[0].consumer.committed(
            [TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10
        )
    finally:
        for m in members:
            m.consumer.close()

    # Every record, and its value is its partition and sequence number.
    assert {(p, o) for p, o, _, _ in run.consumed} == everything
    assert all(v == b"%d:%d" % (p, o) for p, o, v, _ in run.consumed)
    assert any(after for *_, after in run.consumed)  # consumption went on after the kill
    # Committed offsets were kept: duplicates only at or beyond the last commit before
    # the kill (that is, in batches not committed before it).
    seen: set[tuple[int, int]] = set()
    again: list[tuple[int, int]] = []
    for p, o, _, _ in run.consumed:
        if (p, o) in seen:
            again.append((p, o))
        seen.add((p, o))
    below = sorted({(p, o) for p, o in again if o < kept[p]})
    assert not below, f"consumed again below the commits kept {kept}: {below[:20]}"
    assert [tp.offset for tp in final] == [PER_PARTITION] * PARTITIONS
    assert [tp.error for tp in final] == [None] * PARTITIONS
