"""Share groups follow topics that grow, disappear and come back, as Kafka's group
coordinator follows topic metadata."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka.admin import AdminClient, NewPartitions

from protocol.client import KafkaClient
from protocol.errors import ErrorCode
from tests.integration.conftest import (
    ADMIN_TIMEOUT_S,
    Broker,
    admin_config,
    create_topic,
    wait_for_partitions,
)
from tests.integration.share_helpers import (
    accept_all,
    close_quietly,
    consume,
    describe_share_group,
    earliest,
    produce_values,
    share_consumer,
    wait_for_members,
)

pytestmark = pytest.mark.timeout(180)


def _wait_for_assignment(
    broker: Broker, group: str, topic: str, partitions: tuple[int, ...]
) -> None:
    deadline = time.monotonic() + 30
    last = None
    while time.monotonic() < deadline:
        last = describe_share_group(broker, group)
        if last.members and all(m.assignment.get(topic) == partitions for m in last.members):
            return
        time.sleep(0.1)
    raise AssertionError(f"assignment never became {topic}:{partitions}; last {last}")


def test_partitions_added_while_consuming_are_assigned_and_delivered(
    broker: Broker,
) -> None:
    create_topic(broker, "grows", partitions=1)
    earliest(broker, "g-grow")
    consumer = share_consumer(broker, "g-grow", ["grows"])
    try:
        consume(consumer, until=lambda log: False, timeout=2, decide=accept_all)
        wait_for_members(broker, "g-grow", 1)
        admin = AdminClient(admin_config(broker))
        admin.create_partitions([NewPartitions("grows", 3)])["grows"].result(ADMIN_TIMEOUT_S)
        wait_for_partitions(broker, "grows", 3)
        _wait_for_assignment(broker, "g-grow", "grows", (0, 1, 2))
        produce_values(broker, "grows", [b"p2-a", b"p2-b"], partition=2)
        log = consume(
            consumer, until=lambda log: len(log.deliveries) >= 2, timeout=30, decide=accept_all
        )
        assert sorted(log.values()) == [b"p2-a", b"p2-b"]
        assert {d.partition for d in log.deliveries} == {2}
    finally:
        close_quietly(consumer)


def test_recreated_topic_is_a_new_share_partition_with_fresh_state(broker: Broker) -> None:
    create_topic(broker, "phoenix", partitions=1)
    earliest(broker, "g-phoenix")
    produce_values(broker, "phoenix", [b"old-1", b"old-2", b"old-3"])
    consumer = share_consumer(broker, "g-phoenix", ["phoenix"])
    try:
        first = consume(
            consumer, until=lambda log: len(log.deliveries) >= 3, timeout=30, decide=accept_all
        )
        assert sorted(first.values()) == [b"old-1", b"old-2", b"old-3"]
        admin = AdminClient(admin_config(broker))
        admin.delete_topics(["phoenix"])["phoenix"].result(ADMIN_TIMEOUT_S)
        create_topic(broker, "phoenix", partitions=1)
        # The old state had its start offset at 3; a fresh one starts at the new log's 0.
        produce_values(broker, "phoenix", [b"new-1", b"new-2"])
        second = consume(
            consumer, until=lambda log: len(log.deliveries) >= 2, timeout=60, decide=accept_all
        )
        assert sorted(second.values()) == [b"new-1", b"new-2"]
        assert sorted(d.offset for d in second.deliveries) == [0, 1]
    finally:
        close_quietly(consumer)
    assert "request_failed" not in broker.log_path.read_text()


def _run(coro_factory: Callable[[KafkaClient], object], broker: Broker) -> None:
    async def main() -> None:
        client = await KafkaClient.connect(broker.host, broker.port, "spool-it")
        try:
            await coro_factory(client)  # type: ignore[misc]
        finally:
            await client.close()

    asyncio.run(main())


def test_fetch_and_acknowledge_for_an_unknown_topic_id_get_partition_errors(
    broker: Broker,
) -> None:
    create_topic(broker, "known", partitions=1)
    unknown = uuid.uuid4()
    member = uuid.uuid4().hex

    async def scenario(client: KafkaClient) -> None:
        hb = await client.request(
            76,
            1,
            {
                "group_id": "g-unknown",
                "member_id": member,
                "member_epoch": 0,
                "rack_id": None,
                "subscribed_topic_names": ["known"],
            },
        )
        assert hb.error_code == ErrorCode.none
        fetch = await client.request(
            78,
            1,
            {
                "group_id": "g-unknown",
                "member_id": member,
                "share_session_epoch": 0,
                "max_wait": 0,
                "min_bytes": 1,
                "max_bytes": 1 << 20,
                "max_records": 10,
                "batch_size": 10,
                "forgotten_topics_data": [],
                "topics": [
                    {
                        "topic_id": unknown,
                        "partitions": [{"partition_index": 0, "acknowledgement_batches": []}],
                    }
                ],
            },
        )
        assert fetch.error_code == ErrorCode.none
        (topic,) = fetch.responses
        assert topic.topic_id == unknown
        assert topic.partitions[0].error_code == ErrorCode.unknown_topic_id
        ack = await client.request(
            79,
            1,
            {
                "group_id": "g-unknown",
                "member_id": member,
                "share_session_epoch": 1,
                "topics": [
                    {
                        "topic_id": unknown,
                        "partitions": [
                            {
                                "partition_index": 0,
                                "acknowledgement_batches": [
                                    {"first_offset": 0, "last_offset": 0, "acknowledge_types": [1]}
                                ],
                            }
                        ],
                    }
                ],
            },
        )
        assert ack.error_code == ErrorCode.none
        assert ack.responses[0].partitions[0].error_code == ErrorCode.unknown_topic_id
        # The broker keeps serving this connection.
        assert (
            await client.request(
                18, 3, {"client_software_name": "t", "client_software_version": "1"}
            )
        ).error_code == 0

    _run(scenario, broker)
