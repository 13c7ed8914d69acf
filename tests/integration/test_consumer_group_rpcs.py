"""KIP-848 consumer groups with real clients: confluent-kafka Consumers with
`group.protocol=consumer` and subscribe() split a 6-partition topic, rebalance when a
third joins and one leaves, and consume every record with synchronous commits, none
twice except records of a batch whose commit failed. The client speaks
ConsumerGroupHeartbeat v1 (checked in its protocol debug log); ListGroups and
ConsumerGroupDescribe show the group."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, ConsumerGroupState, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from tests.integration.conftest import (
    ADMIN_TIMEOUT_S,
    Broker,
    admin_config,
    create_topic,
    produce,
    producer_config,
)

SETTINGS = {
    "group.consumer.min.session.timeout.ms": "1000",
    "group.consumer.session.timeout.ms": "6000",
    "group.consumer.min.heartbeat.interval.ms": "100",
    "group.consumer.heartbeat.interval.ms": "500",
}
PARTITIONS = 6
WAIT_S = 60.0


class Captured(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


class Member:
    """One consumer of the group: it commits synchronously after every batch."""

    def __init__(self, broker: Broker, group: str, name: str, **extra: Any) -> None:
        self.name = name
        self.consumer = Consumer(
            {
                "bootstrap.servers": broker.bootstrap,
                "group.id": group,
                "group.protocol": "consumer",
                "client.id": name,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": 100,
                **extra,
            }
        )
        self.consumed: list[tuple[int, int, bool]] = []  # partition, offset, committed
        self.closed = False

    def subscribe(self, topic: str) -> None:
        self.consumer.subscribe([topic])

    def assigned(self) -> set[int]:
        return {tp.partition for tp in self.consumer.assignment()}

    def step(self) -> int:
        batch = self.consumer.consume(num_messages=50, timeout=0.1)
        got = [(m.partition(), m.offset()) for m in batch if m.error() is None]
        if not got:
            return 0
        committed = True
        try:
            self.consumer.commit(asynchronous=False)
        except KafkaException:
            committed = False  # e.g. a partition revoked meanwhile: may come again
        self.consumed += [(p, o, committed) for p, o in got]
        return len(got)

    def close(self) -> None:
        self.consumer.close()
        self.closed = True


def run_until(members: list[Member], done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        for member in members:
            if not member.closed:
                member.step()
        # Revocation before assignment: a partition is never held by two consumers
        # (assignments change only inside consume(), so this sample is consistent).
        held = [p for m in members if not m.closed for p in m.assigned()]
        assert len(held) == len(set(held)), f"a partition assigned twice: {sorted(held)}"
        if done():
            return
    live = [(m.name, sorted(m.assigned())) for m in members if not m.closed]
    raise AssertionError(f"never {what}: assignments {live}")


def split(members: list[Member], sizes: list[int]) -> Callable[[], bool]:
    def done() -> bool:
        live = [m.assigned() for m in members if not m.closed]
        union = set().union(*live)
        return (
            sorted(len(a) for a in live) == sizes
            and union == set(range(PARTITIONS))
            and sum(len(a) for a in live) == PARTITIONS
        )

    return done


def test_consumers_split_rebalance_and_consume_everything_once(
    broker_factory: Callable[..., Broker],
) -> None:
    broker = broker_factory(SETTINGS)
    topic, group = f"cg-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    create_topic(broker, topic, PARTITIONS)
    sent: list[tuple[int, int]] = []

    def send(first: int, count: int) -> None:
        outcome = produce(
            Producer(producer_config(broker)),
            topic,
            [(i % PARTITIONS, None, b"%d" % i, []) for i in range(first, first + count)],
        )
        assert not outcome.errors
        sent.extend((s.partition, s.offset) for s in outcome.acked)

    protocol_log = Captured()
    logger = logging.getLogger(f"rdkafka-{group}")
    logger.addHandler(protocol_log)
    logger.setLevel(logging.DEBUG)
    a = Member(broker, group, "a", debug="protocol", logger=logger)
    b = Member(broker, group, "b")
    members = [a, b]
    for m in members:
        m.subscribe(topic)
    run_until(members, split(members, [3, 3]), "split 3/3 between two consumers")

    send(0, 300)
    total = lambda: sum(len(m.consumed) for m in members)  # noqa: E731
    run_until(members, lambda: total() >= 300, "consumed the first 300")

    c = Member(broker, group, "c")
    c.subscribe(topic)
    members.append(c)
    run_until(members, split(members, [2, 2, 2]), "split 2/2/2 after a third joined")

    send(300, 300)
    run_until(members, lambda: total() >= 450, "consumed more")
    b.close()  # leaves the group (member epoch -1)
    run_until(members, split(members, [3, 3]), "split 3/3 after one left")
    run_until(
        members,
        lambda: {(p, o) for m in members for p, o, _ in m.consumed} >= set(sent),
        "consumed everything",
    )

    # Nothing lost; a record read twice only if its first read was not committed.
    consumed = [(p, o, ok) for m in members for p, o, ok in m.consumed]
    assert {(p, o) for p, o, _ in consumed} == set(sent)
    first: dict[tuple[int, int], bool] = {}
    for p, o, ok in consumed:
        if (p, o) in first:
            assert not first[(p, o)], f"{(p, o)} consumed again after a commit"
        else:
            first[(p, o)] = ok

    # The group as admin clients see it (ListGroups, ConsumerGroupDescribe).
    admin = AdminClient(admin_config(broker))
    listed = admin.list_consumer_groups(request_timeout=ADMIN_TIMEOUT_S).result(
        timeout=ADMIN_TIMEOUT_S
    )
    ours = [g for g in listed.valid if g.group_id == group]
    assert ours and ours[0].state == ConsumerGroupState.STABLE
    described = admin.describe_consumer_groups([group], request_timeout=ADMIN_TIMEOUT_S)[
        group
    ].result(timeout=ADMIN_TIMEOUT_S)
    assert sorted(m.client_id for m in described.members) == ["a", "c"]

    # librdkafka speaks ConsumerGroupHeartbeat v1 (KIP-848, client-made member ids).
    for m in members:
        if not m.closed:
            m.close()
    heartbeats = [line for line in protocol_log.lines if "ConsumerGroupHeartbeat" in line]
    sends = [line for line in heartbeats if "Sent ConsumerGroupHeartbeatRequest" in line]
    assert sends and all("(v1," in line for line in sends), sends[:3]
