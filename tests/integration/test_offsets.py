"""Committed offsets with real clients (OffsetCommit, OffsetFetch, OffsetDelete): a
confluent-kafka Consumer that assigns partitions by hand commits and reads back its
offsets, they survive a kill -9 of the broker and a restarted consumer resumes there;
the AdminClient lists, alters and deletes a group's offsets; a share group's id is not
a consumer group's. On both storage engines."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaException,
    Producer,
    ShareConsumer,
    TopicPartition,
)
from confluent_kafka import KafkaError as ClientError
from confluent_kafka.admin import AdminClient

from protocol.client import KafkaClient
from protocol.errors import ErrorCode
from tests.integration.conftest import (
    ADMIN_TIMEOUT_S,
    BOTH_STORAGES,
    Broker,
    admin_config,
    consumer_config,
    create_topic,
    produce,
    producer_config,
)

pytestmark = BOTH_STORAGES
OFFSET_DELETE = 47


def _fill(broker: Broker, topic: str, counts: dict[int, int]) -> None:
    outcome = produce(
        Producer(producer_config(broker)),
        topic,
        [(p, None, b"%d" % i, []) for p, n in counts.items() for i in range(n)],
    )
    assert not outcome.errors


def _consume(consumer: Consumer, count: int, timeout_s: float = 30.0) -> list[tuple[int, int]]:
    """(partition, offset) of the next `count` records."""
    got: list[tuple[int, int]] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is None or msg.error() is not None:
            continue
        got.append((msg.partition(), msg.offset()))
    return got


def test_a_consumer_commits_and_resumes_there_after_a_kill(
    broker_factory: Callable[..., Broker],
) -> None:
    broker = broker_factory()
    topic, group = f"orders-{uuid.uuid4().hex[:6]}", f"app-{uuid.uuid4().hex[:6]}"
    create_topic(broker, topic, partitions=2)
    _fill(broker, topic, {0: 40, 1: 40})

    consumer = Consumer(consumer_config(broker, **{"group.id": group}))
    consumer.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
    seen = _consume(consumer, 50)
    assert len(seen) == 50
    next_of = {p: max(o for q, o in seen if q == p) + 1 for p in (0, 1)}
    committed = consumer.commit(
        offsets=[TopicPartition(topic, p, o) for p, o in next_of.items()], asynchronous=False
    )
    assert all(tp.error is None for tp in committed)
    back = consumer.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=30)
    assert {tp.partition: tp.offset for tp in back} == next_of
    consumer.close()

    broker.kill9()  # kill -9: what was answered as committed must be durable
    broker.start()

    resumed = Consumer(consumer_config(broker, **{"group.id": group}))
    try:
        back = resumed.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)], timeout=30)
        assert {tp.partition: tp.offset for tp in back} == next_of
        # No explicit position: the consumer starts at the committed offsets.
        resumed.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
        rest = _consume(resumed, 30)
        assert sorted(rest) == sorted((p, o) for p in (0, 1) for o in range(next_of[p], 40))
    finally:
        resumed.close()


def test_the_admin_client_lists_alters_and_deletes_a_groups_offsets(broker: Broker) -> None:
    topic, group = f"audit-{uuid.uuid4().hex[:6]}", f"tool-{uuid.uuid4().hex[:6]}"
    create_topic(broker, topic, partitions=3)
    _fill(broker, topic, {0: 10})
    admin = AdminClient(admin_config(broker))
    # A group nobody joined: the commit (generation -1) makes a simple group.
    altered = admin.alter_consumer_group_offsets(
        [
            ConsumerGroupTopicPartitions(
                group, [TopicPartition(topic, 0, 7), TopicPartition(topic, 2, 3)]
            )
        ]
    )[group].result(timeout=ADMIN_TIMEOUT_S)
    assert all(tp.error is None for tp in altered.topic_partitions)

    listed = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(
        timeout=ADMIN_TIMEOUT_S
    )
    assert {(tp.partition, tp.offset) for tp in listed.topic_partitions} == {(0, 7), (2, 3)}

    # OffsetDelete (the AdminClient of this confluent-kafka has no call for it).
    deleted = asyncio.run(_offset_delete(broker, group, topic, [0]))
    assert [(p.partition_index, p.error_code) for p in deleted.topics[0].partitions] == [
        (0, ErrorCode.none)
    ]
    listed = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(
        timeout=ADMIN_TIMEOUT_S
    )
    assert {(tp.partition, tp.offset) for tp in listed.topic_partitions} == {(2, 3)}

    # The (simple) group can be deleted, with its offsets.
    admin.delete_consumer_groups([group])[group].result(timeout=ADMIN_TIMEOUT_S)
    listed = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(
        timeout=ADMIN_TIMEOUT_S
    )
    assert listed.topic_partitions == []


async def _offset_delete(broker: Broker, group: str, topic: str, partitions: list[int]) -> Any:
    client = await KafkaClient.connect("127.0.0.1", broker.port, "spool-it-offsets")
    try:
        response = await client.request(
            OFFSET_DELETE,
            0,
            {
                "group_id": group,
                "topics": [
                    {"name": topic, "partitions": [{"partition_index": p} for p in partitions]}
                ],
            },
        )
    finally:
        await client.close()
    assert response.error_code == ErrorCode.none
    return response


def test_an_unknown_topic_is_refused_and_others_are_committed(broker: Broker) -> None:
    topic, group = f"known-{uuid.uuid4().hex[:6]}", f"app-{uuid.uuid4().hex[:6]}"
    create_topic(broker, topic)
    consumer = Consumer(consumer_config(broker, **{"group.id": group}))
    try:
        with pytest.raises(KafkaException) as refused:
            consumer.commit(
                offsets=[
                    TopicPartition(topic, 0, 5),
                    TopicPartition("no-such-topic", 0, 1),
                ],
                asynchronous=False,
            )
        partitions = refused.value.args[0] if refused.value.args else None
        assert partitions is not None
        back = consumer.committed([TopicPartition(topic, 0)], timeout=30)
        assert back[0].offset == 5
    finally:
        consumer.close()


def test_a_share_groups_id_has_no_consumer_offsets(broker: Broker) -> None:
    topic = f"queue-{uuid.uuid4().hex[:6]}"
    create_topic(broker, topic)
    _fill(broker, topic, {0: 3})
    group = f"workers-{uuid.uuid4().hex[:6]}"
    share = ShareConsumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    share.subscribe([topic])
    try:
        # The share group exists once its member has been given a record (produced
        # after it joined: a new share group starts at the log end).
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            _fill(broker, topic, {0: 1})
            if share.poll(0.5) is not None:
                break
        else:
            pytest.fail("the share consumer got no record")
        consumer = Consumer(consumer_config(broker, **{"group.id": group}))
        try:
            with pytest.raises(KafkaException) as refused:
                consumer.commit(offsets=[TopicPartition(topic, 0, 1)], asynchronous=False)
            assert refused.value.args[0].code() == ClientError.GROUP_ID_NOT_FOUND
            # OffsetFetch answers a share group with no offsets, no error (Kafka 4.2).
            back = consumer.committed([TopicPartition(topic, 0)], timeout=30)
            assert back[0].offset < 0
        finally:
            consumer.close()
    finally:
        share.close()
