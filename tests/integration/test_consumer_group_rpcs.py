"""KIP-848 consumer groups with real clients: confluent-kafka Consumers with
`group.protocol=consumer` and subscribe() split a 6-partition topic, rebalance when a
third joins and one leaves, and consume every record with synchronous commits, none
twice except records of a batch whose commit failed. The client speaks
ConsumerGroupHeartbeat v1 (checked in its protocol debug log); ListGroups and
ConsumerGroupDescribe show the group. A static member (group.instance.id) closes and
comes back with the same partitions and no new group epoch; a regex subscription takes
a matching topic created later. Kafka's answers in the notable cases, on the wire. The
client tests run on both storage engines where the group's records matter."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, ConsumerGroupState, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from protocol.client import KafkaClient
from protocol.errors import ErrorCode
from tests.integration.conftest import (
    ADMIN_TIMEOUT_S,
    BOTH_STORAGES,
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


@BOTH_STORAGES
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


# -- the wire: Kafka 4.2's answers in the notable cases -------------------------------

HEARTBEAT, DESCRIBE, OFFSET_COMMIT, LIST_GROUPS, DELETE_GROUPS, SHARE_HEARTBEAT = (
    68,
    69,
    8,
    16,
    42,
    76,
)


def _join(group: str, member_id: str, **fields: Any) -> dict[str, Any]:
    return {
        "group_id": group,
        "member_id": member_id,
        "member_epoch": 0,
        "rebalance_timeout": 30_000,
        "subscribed_topic_names": [],
        "topic_partitions": [],
        **fields,
    }


def _parts(response: Any) -> dict[uuid.UUID, list[int]]:
    assert response.assignment is not None
    return {t.topic_id: sorted(t.partitions) for t in response.assignment.topic_partitions}


def _commit(group: str, member_id: str, epoch: int, topic: str) -> dict[str, Any]:
    return {
        "group_id": group,
        "generation_id_or_member_epoch": epoch,
        "member_id": member_id,
        "topics": [
            {
                "name": topic,
                "partitions": [
                    {"partition_index": 0, "committed_offset": 1, "committed_metadata": ""}
                ],
            }
        ],
    }


async def test_heartbeat_describe_and_errors_on_the_wire(
    broker_factory: Callable[..., Broker],
) -> None:
    broker = broker_factory(SETTINGS)
    topic, group = f"w-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    create_topic(broker, topic, 2)
    client = await KafkaClient.connect("127.0.0.1", broker.port, "spool-it-cg")
    try:
        # v0: the coordinator makes the member id.
        r = await client.request(HEARTBEAT, 0, _join(group, "", subscribed_topic_names=[topic]))
        assert r.error_code == ErrorCode.none and r.member_id and r.member_epoch == 1
        assert r.heartbeat_interval.total_seconds() == 0.5
        assert sorted(_parts(r).values()) == [[0, 1]]
        member = r.member_id

        # v1: the client's member id, a regex subscription resolved on the spot.
        r = await client.request(
            HEARTBEAT,
            1,
            _join(
                group,
                "m-regex",
                subscribed_topic_names=None,
                subscribed_topic_regex=f"{topic[:4]}.*",
            ),
        )
        assert r.error_code == ErrorCode.none and r.member_epoch == 2

        for version, fields, code in [
            (1, _join(group, ""), ErrorCode.invalid_request),
            (1, _join(group, "x", rebalance_timeout=-1), ErrorCode.invalid_request),
            (1, _join(group, "x", server_assignor="sticky"), ErrorCode.unsupported_assignor),
            (
                1,
                _join(group, "x", subscribed_topic_regex="(unclosed"),
                ErrorCode.invalid_regular_expression,
            ),
            (1, {**_join(group, member), "member_epoch": 9}, ErrorCode.fenced_member_epoch),
            (1, {**_join(group, "nobody"), "member_epoch": 3}, ErrorCode.unknown_member_id),
            (1, {**_join("nothing-here", "x"), "member_epoch": 3}, ErrorCode.group_id_not_found),
        ]:
            r = await client.request(HEARTBEAT, version, fields)
            assert (r.error_code, r.member_epoch) == (code, -1), (fields, r.error_message)

        # OffsetCommit from a member: v9+ with its epoch; v8 is too old for it.
        ok = await client.request(OFFSET_COMMIT, 9, _commit(group, member, 1, topic))
        assert ok.topics[0].partitions[0].error_code == ErrorCode.none
        for version, epoch, who, code in [
            (9, 0, member, ErrorCode.stale_member_epoch),
            (9, 1, "nobody", ErrorCode.unknown_member_id),
            (8, 1, member, ErrorCode.unsupported_version),
        ]:
            r = await client.request(OFFSET_COMMIT, version, _commit(group, who, epoch, topic))
            assert r.topics[0].partitions[0].error_code == code, (version, epoch, who)

        # A share group's id is not a consumer group's, nor the other way round.
        share = f"s-{uuid.uuid4().hex[:8]}"
        r = await client.request(
            SHARE_HEARTBEAT,
            1,
            {
                "group_id": share,
                "member_id": "sm-1",
                "member_epoch": 0,
                "subscribed_topic_names": [topic],
            },
        )
        assert r.error_code == ErrorCode.none
        r = await client.request(HEARTBEAT, 1, _join(share, "x"))
        assert (r.error_code, r.error_message) == (
            ErrorCode.group_id_not_found,
            f"Group {share} is not a consumer group.",
        )

        # ConsumerGroupDescribe (v0 as librdkafka sends it, v1 as Java does).
        for version in (0, 1):
            d = await client.request(
                DESCRIBE,
                version,
                {
                    "group_ids": [group, share, "nothing-here"],
                    "include_authorized_operations": True,
                },
            )
            ours, theirs, missing = d.groups
            assert ours.error_code == ErrorCode.none and ours.group_state in (
                "Stable",
                "Reconciling",
            )
            assert sorted(m.member_id for m in ours.members) == sorted([member, "m-regex"])
            regex_member = next(m for m in ours.members if m.member_id == "m-regex")
            assert regex_member.subscribed_topic_regex == f"{topic[:4]}.*"
            if version == 1:
                assert {m.member_type for m in ours.members} == {1}
            assert theirs.error_code == missing.error_code == ErrorCode.group_id_not_found

        # ListGroups names it a consumer group.
        listed = await client.request(LIST_GROUPS, 5, {"types_filter": ["consumer"]})
        assert [(g.group_id, g.group_type, g.protocol_type) for g in listed.groups] == [
            (group, "consumer", "consumer")
        ]

        # DeleteGroups: not while it has members; then the group and its offsets go.
        r = await client.request(DELETE_GROUPS, 2, {"groups_names": [group]})
        assert r.results[0].error_code == ErrorCode.non_empty_group
        for who in (member, "m-regex"):
            r = await client.request(
                HEARTBEAT, 1, {"group_id": group, "member_id": who, "member_epoch": -1}
            )
            assert (r.error_code, r.member_epoch) == (ErrorCode.none, -1)
        r = await client.request(DELETE_GROUPS, 2, {"groups_names": [group]})
        assert r.results[0].error_code == ErrorCode.none
        d = await client.request(DESCRIBE, 1, {"group_ids": [group]})
        assert d.groups[0].error_code == ErrorCode.group_id_not_found
    finally:
        await client.close()


def _group_epoch(broker: Broker, group: str) -> tuple[int, int]:
    """(group epoch, assignment epoch) by ConsumerGroupDescribe."""

    async def describe() -> tuple[int, int]:
        client = await KafkaClient.connect("127.0.0.1", broker.port, "spool-it-cg")
        try:
            d = await client.request(DESCRIBE, 1, {"group_ids": [group]})
        finally:
            await client.close()
        g = d.groups[0]
        assert g.error_code == ErrorCode.none, g.error_message
        return int(g.group_epoch), int(g.assignment_epoch)

    return asyncio.run(describe())


@BOTH_STORAGES
def test_a_static_member_rejoins_without_a_rebalance(
    broker_factory: Callable[..., Broker],
) -> None:
    broker = broker_factory(SETTINGS)
    topic, group = f"st-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    create_topic(broker, topic, PARTITIONS)
    a = Member(broker, group, "a", **{"group.instance.id": "instance-a"})
    b = Member(broker, group, "b")
    for m in (a, b):
        m.subscribe(topic)
    run_until([a, b], split([a, b], [3, 3]), "split 3/3")
    a_parts, b_parts = a.assigned(), b.assigned()
    epochs = _group_epoch(broker, group)
    a.close()  # a static member's close is a temporary leave (member epoch -2)
    run_until([b], lambda: True, "polled")
    assert b.assigned() == b_parts
    again = Member(broker, group, "a-again", **{"group.instance.id": "instance-a"})
    again.subscribe(topic)
    run_until([again, b], lambda: again.assigned() == a_parts, "the same partitions back")
    assert b.assigned() == b_parts
    assert _group_epoch(broker, group) == epochs
    for m in (again, b):
        m.close()


def test_a_regex_subscription_follows_new_topics(broker_factory: Callable[..., Broker]) -> None:
    broker = broker_factory(SETTINGS)
    prefix = f"rx{uuid.uuid4().hex[:6]}"
    create_topic(broker, f"{prefix}-one", 2)
    create_topic(broker, f"other{prefix}", 2)
    c = Member(broker, f"g-{prefix}", "c")
    c.consumer.subscribe([f"^{prefix}-.*"])

    def topics() -> set[tuple[str, int]]:
        return {(tp.topic, tp.partition) for tp in c.consumer.assignment()}

    run_until([c], lambda: topics() == {(f"{prefix}-one", 0), (f"{prefix}-one", 1)}, "one")
    create_topic(broker, f"{prefix}-two", 1)
    run_until([c], lambda: (f"{prefix}-two", 0) in topics(), "the new topic assigned")
    assert all(t.startswith(f"{prefix}-") for t, _ in topics())
    c.close()


async def test_a_groups_consumer_configs_reach_its_members(
    broker_factory: Callable[..., Broker],
) -> None:
    """consumer.heartbeat.interval.ms and consumer.session.timeout.ms set on a group with
    IncrementalAlterConfigs (Kafka's GroupConfig) are described and given to its members
    in ConsumerGroupHeartbeat; a value outside the broker's group.consumer.* bounds is
    INVALID_CONFIG naming the bound, and changes nothing."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    broker = broker_factory(SETTINGS)
    topic, group = f"w-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    create_topic(broker, topic, 1)
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{broker.port}"})

    def alter(**configs: str) -> None:
        resource = ConfigResource(
            ConfigResource.Type.GROUP,
            group,
            incremental_configs=[
                ConfigEntry(k.replace("_", "."), v, incremental_operation=AlterConfigOpType.SET)
                for k, v in configs.items()
            ],
        )
        admin.incremental_alter_configs([resource])[resource].result(timeout=30)

    alter(consumer_heartbeat_interval_ms="700", consumer_session_timeout_ms="7000")
    resource = ConfigResource(ConfigResource.Type.GROUP, group)
    described = admin.describe_configs([resource])[resource].result(timeout=30)
    assert described["consumer.heartbeat.interval.ms"].value == "700"
    assert described["consumer.session.timeout.ms"].value == "7000"
    assert described["share.heartbeat.interval.ms"].is_default  # apart from these

    with pytest.raises(KafkaException) as refused:
        alter(consumer_heartbeat_interval_ms="20000")
    error = refused.value.args[0]
    assert error.code() == KafkaError.INVALID_CONFIG
    assert "group.consumer.max.heartbeat.interval.ms (15000)" in error.str()

    client = await KafkaClient.connect("127.0.0.1", broker.port, "spool-it-cg")
    try:
        r = await client.request(HEARTBEAT, 1, _join(group, "m-1", subscribed_topic_names=[topic]))
        assert r.error_code == ErrorCode.none
        assert r.heartbeat_interval.total_seconds() == 0.7
    finally:
        await client.close()
