"""Classic consumer groups with real clients: confluent-kafka Consumers with
`group.protocol=classic` and `subscribe()` against a broker process. Two consumers
split a 6-partition topic, a third joins and each gets 2, one leaves and its partitions
move; every record is consumed, commits go through OffsetCommit. A static member
(`group.instance.id`) restarted within its session timeout gets its partitions back
without a rebalance. DescribeGroups and ListGroups show the group. The rebalance test
runs on both storage engines."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from protocol.client import KafkaClient
from protocol.errors import ErrorCode
from tests.integration.conftest import (
    BOTH_STORAGES,
    Broker,
    consumer_config,
    create_topic,
    produce,
    producer_config,
)

PARTITIONS = 6
PER_PARTITION = 10
SETTINGS = {"group.initial.rebalance.delay.ms": "0"}
DESCRIBE_GROUPS = 15
LIST_GROUPS = 16


class Member:
    """A subscribed consumer and what its rebalance callbacks told it."""

    def __init__(self, broker: Broker, group: str, topic: str, **overrides: Any) -> None:
        self.assigned: set[int] = set()
        self.assigns = 0
        self.revokes = 0
        self.records: list[tuple[int, int]] = []
        self.consumer = Consumer(
            consumer_config(
                broker,
                **{
                    "group.id": group,
                    "group.protocol": "classic",
                    "partition.assignment.strategy": "range",
                    "session.timeout.ms": 6000,
                    "heartbeat.interval.ms": 300,
                    "enable.partition.eof": False,
                    **overrides,
                },
            )
        )
        self.consumer.subscribe([topic], on_assign=self._on_assign, on_revoke=self._on_revoke)

    def _on_assign(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.assigns += 1
        self.assigned = {p.partition for p in partitions}

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.revokes += 1
        self.assigned = set()

    def poll(self) -> None:
        msg = self.consumer.poll(0.05)
        if msg is not None and msg.error() is None:
            self.records.append((msg.partition(), msg.offset()))
            self.consumer.commit(message=msg, asynchronous=False)


def poll_until(members: list[Member], done: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for m in members:
            m.poll()
        if done():
            return
    raise AssertionError(
        f"timed out; assignments {[sorted(m.assigned) for m in members]}, "
        f"records {[len(m.records) for m in members]}"
    )


def split(members: list[Member], each: int) -> Callable[[], bool]:
    def done() -> bool:
        union = set().union(*(m.assigned for m in members))
        return union == set(range(PARTITIONS)) and all(len(m.assigned) == each for m in members)

    return done


async def _describe_and_list(broker: Broker, group: str) -> tuple[Any, Any]:
    client = await KafkaClient.connect("127.0.0.1", broker.port, "spool-it-classic")
    try:
        described = await client.request(DESCRIBE_GROUPS, 5, {"groups": [group]})
        listed = await client.request(LIST_GROUPS, 5, {"types_filter": ["classic"]})
    finally:
        await client.close()
    return described, listed


def _fill(broker: Broker, topic: str) -> None:
    outcome = produce(
        Producer(producer_config(broker)),
        topic,
        [(p, None, b"%d" % i, []) for p in range(PARTITIONS) for i in range(PER_PARTITION)],
    )
    assert not outcome.errors


@BOTH_STORAGES
def test_consumers_split_rebalance_on_join_and_leave(
    broker_factory: Callable[..., Broker],
) -> None:
    broker = broker_factory(SETTINGS)
    topic, group = f"orders-{uuid.uuid4().hex[:6]}", f"app-{uuid.uuid4().hex[:6]}"
    create_topic(broker, topic, partitions=PARTITIONS)
    _fill(broker, topic)
    one, two = Member(broker, group, topic), Member(broker, group, topic)
    try:
        poll_until([one, two], split([one, two], 3))
        assert one.assigned.isdisjoint(two.assigned)
        # Every record is consumed once (each committed as consumed).
        poll_until(
            [one, two], lambda: len(one.records) + len(two.records) >= PARTITIONS * PER_PARTITION
        )
        seen = one.records + two.records
        assert len(seen) == len(set(seen)) == PARTITIONS * PER_PARTITION

        three = Member(broker, group, topic)
        poll_until([one, two, three], split([one, two, three], 2))
        assert one.revokes >= 1 and two.revokes >= 1  # the eager protocol revokes all

        # The group as DescribeGroups and ListGroups show it.
        described, listed = asyncio.run(_describe_and_list(broker, group))
        (g,) = described.groups
        assert (g.error_code, g.group_state, g.protocol_type, g.protocol_data) == (
            ErrorCode.none,
            "Stable",
            "consumer",
            "range",
        )
        assert len(g.members) == 3
        assert [(x.group_id, x.group_type, x.protocol_type) for x in listed.groups] == [
            (group, "classic", "consumer")
        ]

        # One leaves (LeaveGroup on close): the other two take its partitions.
        one.consumer.close()
        poll_until([two, three], split([two, three], 3))
        # Nothing was left behind: produce more and the remaining two get all of it.
        _fill(broker, topic)
        before = len(two.records) + len(three.records)
        poll_until(
            [two, three],
            lambda: len(two.records) + len(three.records) - before >= PARTITIONS * PER_PARTITION,
        )
        # The committed offsets are at the log end for every partition.
        committed = two.consumer.committed(
            [TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=10
        )
        assert [tp.offset for tp in committed] == [2 * PER_PARTITION] * PARTITIONS
        three.consumer.close()
    finally:
        two.consumer.close()


def test_a_static_member_restarts_without_a_rebalance(
    broker_factory: Callable[..., Broker],
) -> None:
    broker = broker_factory(SETTINGS)
    topic, group = f"orders-{uuid.uuid4().hex[:6]}", f"app-{uuid.uuid4().hex[:6]}"
    create_topic(broker, topic, partitions=PARTITIONS)
    one = Member(broker, group, topic, **{"group.instance.id": "one"})
    two = Member(broker, group, topic, **{"group.instance.id": "two"})
    poll_until([one, two], split([one, two], 3))
    kept = set(two.assigned)
    revokes = one.revokes
    # A static member does not leave on close; restarted, it takes its entry back.
    two.consumer.close()
    again = Member(broker, group, topic, **{"group.instance.id": "two"})
    poll_until([one, again], lambda: again.assigned == kept)
    for _ in range(40):  # a while longer: no rebalance reaches the other member
        one.poll()
        again.poll()
    assert one.revokes == revokes and again.assigned == kept
    one.consumer.close()
    again.consumer.close()


JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP, SHARE_GROUP_HEARTBEAT = 11, 12, 13, 14, 76
# A ConsumerProtocolSubscription v0 of topic "t": version, topics, null user data.
SUBSCRIPTION = b"\x00\x00\x00\x00\x00\x01\x00\x01t\xff\xff\xff\xff"


def _join(group: str, member: str = "", **overrides: Any) -> dict[str, Any]:
    return {
        "group_id": group,
        "session_timeout": 10_000,
        "rebalance_timeout": 10_000,
        "member_id": member,
        "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": SUBSCRIPTION}],
        **overrides,
    }


async def _wire_answers(broker: Broker, topic: str) -> None:
    client = await KafkaClient.connect("127.0.0.1", broker.port, "spool-it-classic")
    try:
        call = client.request
        # v4+: a dynamic member first gets its member id (MEMBER_ID_REQUIRED).
        first = await call(JOIN_GROUP, 5, _join("g"))
        assert first.error_code == ErrorCode.member_id_required and first.member_id
        member = first.member_id
        joined = await call(JOIN_GROUP, 5, _join("g", member))
        assert (joined.error_code, joined.generation_id, joined.leader) == (
            ErrorCode.none,
            1,
            member,
        )
        assert joined.protocol_name == "range" and len(joined.members) == 1
        synced = await call(
            SYNC_GROUP,
            3,
            {
                "group_id": "g",
                "generation_id": 1,
                "member_id": member,
                "assignments": [{"member_id": member, "assignment": b"A"}],
            },
        )
        assert (synced.error_code, synced.assignment) == (ErrorCode.none, b"A")
        for generation, member_id, code in [
            (1, member, ErrorCode.none),
            (0, member, ErrorCode.illegal_generation),
            (1, "ghost", ErrorCode.unknown_member_id),
        ]:
            beat = await call(
                HEARTBEAT, 3, {"group_id": "g", "generation_id": generation, "member_id": member_id}
            )
            assert beat.error_code == code
        # Session timeout outside group.min/max.session.timeout.ms; another protocol type.
        bad = await call(JOIN_GROUP, 5, _join("g", session_timeout=1000))
        assert bad.error_code == ErrorCode.invalid_session_timeout
        other = await call(JOIN_GROUP, 5, _join("g", member, protocol_type="connect"))
        assert other.error_code == ErrorCode.inconsistent_group_protocol
        # v0 joins in one round (no rebalance timeout: the session timeout serves).
        old = await call(JOIN_GROUP, 0, _join("g0"))
        assert old.error_code == ErrorCode.none and old.generation_id == 1
        # A share group's id: JoinGroup INCONSISTENT_GROUP_PROTOCOL, the others
        # UNKNOWN_MEMBER_ID, DescribeGroups v6 GROUP_ID_NOT_FOUND and v5 Dead.
        share = await call(
            SHARE_GROUP_HEARTBEAT,
            1,
            {
                "group_id": "queue",
                "member_id": str(uuid.uuid4()),
                "member_epoch": 0,
                "subscribed_topic_names": [topic],
            },
        )
        assert share.error_code == ErrorCode.none
        refused = await call(JOIN_GROUP, 9, _join("queue"))
        assert (refused.error_code, refused.member_id) == (
            ErrorCode.inconsistent_group_protocol,
            "",
        )
        beat = await call(HEARTBEAT, 4, {"group_id": "queue", "generation_id": 1, "member_id": "m"})
        assert beat.error_code == ErrorCode.unknown_member_id
        left = await call(LEAVE_GROUP, 1, {"group_id": "queue", "member_id": "m"})
        assert left.error_code == ErrorCode.unknown_member_id
        d6 = await call(DESCRIBE_GROUPS, 6, {"groups": ["queue", "nope"]})
        assert [(g.error_code, g.group_state) for g in d6.groups] == [
            (ErrorCode.group_id_not_found, "Dead")
        ] * 2
        d5 = await call(DESCRIBE_GROUPS, 5, {"groups": ["queue"]})
        assert [(g.error_code, g.group_state) for g in d5.groups] == [(ErrorCode.none, "Dead")]
        # LeaveGroup v3+: a batch, one error per member.
        left = await call(
            LEAVE_GROUP,
            3,
            {"group_id": "g", "members": [{"member_id": member}, {"member_id": "ghost"}]},
        )
        assert left.error_code == ErrorCode.none
        assert [m.error_code for m in left.members] == [
            ErrorCode.none,
            ErrorCode.unknown_member_id,
        ]
        (empty,) = (await call(DESCRIBE_GROUPS, 5, {"groups": ["g"]})).groups
        assert (empty.group_state, empty.members) == ("Empty", ())
    finally:
        await client.close()


def test_wire_answers_of_the_classic_rpcs(broker_factory: Callable[..., Broker]) -> None:
    broker = broker_factory(SETTINGS)
    topic = f"t-{uuid.uuid4().hex[:6]}"
    create_topic(broker, topic)
    asyncio.run(_wire_answers(broker, topic))


def test_the_group_survives_a_kill_of_its_coordinator(
    broker_factory: Callable[..., Broker],
) -> None:
    """The GroupMetadata record and the commits are durable: after kill -9 and a
    restart the group is back at its stored generation, the consumers carry on and
    nothing committed is consumed again."""
    broker = broker_factory(SETTINGS)
    topic, group = f"orders-{uuid.uuid4().hex[:6]}", f"app-{uuid.uuid4().hex[:6]}"
    create_topic(broker, topic, partitions=PARTITIONS)
    _fill(broker, topic)
    one, two = Member(broker, group, topic), Member(broker, group, topic)
    try:
        poll_until([one, two], split([one, two], 3))
        poll_until(
            [one, two], lambda: len(one.records) + len(two.records) >= PARTITIONS * PER_PARTITION
        )
        described, _ = asyncio.run(_describe_and_list(broker, group))
        (before,) = described.groups
        assert before.group_state == "Stable"
        broker.kill9()
        broker.start()
        (after,) = asyncio.run(_describe_and_list(broker, group))[0].groups
        assert (after.group_state, after.protocol_data) == ("Stable", "range")
        assert {m.member_id for m in after.members} == {m.member_id for m in before.members}
        # The consumers carry on: new records are consumed, none of the old again.
        _fill(broker, topic)
        count = len(one.records) + len(two.records)
        poll_until(
            [one, two],
            lambda: len(one.records) + len(two.records) - count >= PARTITIONS * PER_PARTITION,
        )
        seen = one.records + two.records
        assert len(seen) == len(set(seen)) == 2 * PARTITIONS * PER_PARTITION
    finally:
        one.consumer.close()
        two.consumer.close()


async def _park_a_join(broker: Broker) -> Any:
    client = await KafkaClient.connect("127.0.0.1", broker.port, "spool-it-classic")
    parked = asyncio.ensure_future(client.request(JOIN_GROUP, 3, _join("slow"), timeout_s=60))
    await asyncio.sleep(1.0)
    assert not parked.done()  # waiting for group.initial.rebalance.delay.ms
    return client, parked


def test_a_clean_stop_answers_parked_joins(broker_factory: Callable[..., Broker]) -> None:
    broker = broker_factory({"group.initial.rebalance.delay.ms": "120000"})

    async def scenario() -> tuple[Any, float]:
        client, parked = await _park_a_join(broker)
        started = time.monotonic()
        await asyncio.get_running_loop().run_in_executor(None, broker.stop)  # exit 0
        took = time.monotonic() - started
        try:
            return await asyncio.wait_for(parked, 10), took
        finally:
            await client.close()

    answer, took = asyncio.run(scenario())
    # Answered NOT_COORDINATOR at once, not after the server's 10 s grace for requests.
    assert answer.error_code == ErrorCode.not_coordinator
    assert took < 5, took
