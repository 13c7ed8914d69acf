"""The dead-letter sink against a real broker, driven with confluent-kafka.

The broker (file engine; PostgreSQL too for the first test) runs in this test's event
loop (the DeadLetterWriter that calls the sink in production is tested with
ShareConsumers in test_dead_letters.py); confluent-kafka's blocking calls run in threads
beside it. Checked: a copy written through the broker's own sink is read back by a
librdkafka consumer with its headers, key, value and timestamp; a copy for a DLQ
partition another broker leads goes as Produce acks=-1 over a real connection to that
broker (here: the in-loop broker as the leader), and the leader's refusal
(MESSAGE_TOO_LARGE) is a refusal of the copy.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import Producer

from broker.broker import Broker
from broker.cli import storage_engine
from broker.cluster import BrokerEndpoint, BrokerInfo, Leader
from broker.config import BrokerConfig, load_static
from broker.metrics import ShareMetrics
from broker.partitions import LogManager, validate_produce_data
from broker.server import Endpoint
from broker.share.dead_letter_sink import DeadLetterTopicSink
from broker.share.dead_letters import (
    HEADER_DELIVERY_COUNT,
    HEADER_GROUP,
    HEADER_MESSAGE,
    HEADER_OFFSET,
    HEADER_PARTITION,
    HEADER_TOPIC,
    DeadLetter,
    DeadLetterReason,
    DeadLetterRefused,
)
from broker.share.remote_persister import BrokerConnections
from coordinator.group_config import GroupConfig
from coordinator.metadata import Topic
from persister.clock import SYSTEM_CLOCK
from persister.commit import GroupCommit
from protocol.records import NewRecord, build_batch
from tests.integration.conftest import (
    BOTH_STORAGES,
    consume_assigned,
    create_topic,
    produce,
    producer_config,
    storage_settings_for,
)
from tests.integration.share_helpers import set_group_configs
from tests.unit.cluster_fakes import FakeCluster

OPT_IN = {"errors.deadletterqueue.group.enable": "true"}


@pytest.fixture
def settings(request: pytest.FixtureRequest, storage: str) -> dict[str, str]:
    """Outside the event loop: the PostgreSQL database is made with a loop of its own."""
    return storage_settings_for(request, storage)


@pytest.fixture
async def broker(settings: dict[str, str], tmp_path: Path) -> AsyncIterator[Broker]:
    env = {"SPOOL_STORAGE": settings["storage"]} if settings else {}
    config = BrokerConfig(load_static(None, [], env))
    b = Broker(
        config,
        tmp_path / "data",
        Endpoint("127.0.0.1", 0),
        storage=storage_engine(config),
    )
    await b.start()
    try:
        yield b
    finally:
        await b.stop()


def client_view(b: Broker) -> Any:
    """What the conftest helpers need of a broker: where to connect."""
    return SimpleNamespace(bootstrap=f"127.0.0.1:{b.advertised.port}")


@BOTH_STORAGES
async def test_a_copy_reaches_a_consumer_with_its_headers(broker: Broker) -> None:
    view = client_view(broker)
    await asyncio.to_thread(create_topic, view, "orders", 2)
    await asyncio.to_thread(create_topic, view, "dlq.orders", 3, OPT_IN)
    await asyncio.to_thread(
        set_group_configs,
        view,
        "billing",
        {
            "errors.deadletterqueue.topic.name": "dlq.orders",
            "errors.deadletterqueue.copy.record.enable": "true",
        },
    )

    def send() -> None:
        producer = Producer(producer_config(view))
        records = [(1, f"k{i}".encode(), f"v{i}".encode(), [("trace", b"t")]) for i in range(3)]
        outcome = produce(producer, "orders", records, timestamps=[1_000, 2_000, 3_000])
        assert len(outcome.acked) == 3 and not outcome.errors

    await asyncio.to_thread(send)
    source = broker.metadata.state.topics["orders"]
    letter = DeadLetter("billing", source.topic_id, 1, 1, 2, 4, DeadLetterReason.DELIVERY_LIMIT)
    assert await broker.dead_letter_sink.write(letter) == 2
    # Source partition 1 of 2: DLQ partition 1 % 3 = 1.
    got = await asyncio.to_thread(consume_assigned, view, "dlq.orders", [0, 1, 2], 2)
    assert [(r.partition, r.offset) for r in got] == [(1, 0), (1, 1)]
    for i, r in zip((1, 2), got, strict=True):
        assert (r.key, r.value, r.timestamp) == (
            f"k{i}".encode(),
            f"v{i}".encode(),
            1_000 * (i + 1),
        )
        assert r.headers == (
            (HEADER_TOPIC, b"orders"),
            (HEADER_PARTITION, b"1"),
            (HEADER_OFFSET, str(i).encode()),
            (HEADER_GROUP, b"billing"),
            (HEADER_DELIVERY_COUNT, b"4"),
            (HEADER_MESSAGE, b"Offset delivery count exceeded the threshold."),
            ("trace", b"t"),
        )
    assert broker.metrics.share.dead_letter_writes == {"billing": [1, 0]}


async def test_a_copy_for_a_partition_led_elsewhere_goes_by_produce(
    broker: Broker, tmp_path: Path
) -> None:
    """This test's own sink, on node 1, reads its source log under tmp_path; the cluster
    view says node 2, the broker in the loop, leads the DLQ topic's partitions."""
    view = client_view(broker)
    await asyncio.to_thread(create_topic, view, "dlq.remote", 1, OPT_IN)
    await asyncio.to_thread(
        create_topic, view, "dlq.tiny", 1, {**OPT_IN, "max.message.bytes": "200"}
    )
    remote = broker.metadata.state.topics
    commit = GroupCommit()
    commit.start()
    logs = LogManager(tmp_path / "here", BrokerConfig({}), commit)
    source = Topic("payments", uuid.uuid4(), 1)
    logs.open_topic(source.name, source.topic_id, 1, {})
    part = logs.get(source.name, 0)
    assert part is not None
    data, headers = validate_produce_data(
        build_batch([NewRecord(b"k", bytes(300), timestamp=7) for _ in range(2)])
    )
    await part.wait_durable(part.append(data, headers).last_offset, 5)
    topics = {source.name: source, **remote}
    config = GroupConfig(dead_letter_topic="dlq.remote", dead_letter_copy_record=True)
    endpoint = BrokerEndpoint("PLAINTEXT", "127.0.0.1", broker.advertised.port)
    transport = BrokerConnections("dead-letter-test")
    sink = DeadLetterTopicSink(
        group_config=lambda _g: config,
        topics=lambda: SimpleNamespace(
            topics=topics, topics_by_id={t.topic_id: t for t in topics.values()}
        ),
        log_partition=lambda topic_id, p: (
            logs.get(source.name, p) if topic_id == source.topic_id else None
        ),
        cluster=lambda: FakeCluster(
            1,
            [BrokerInfo(1, ()), BrokerInfo(2, (endpoint,))],
            {
                (remote["dlq.remote"].topic_id, 0): Leader(2, 0),
                (remote["dlq.tiny"].topic_id, 0): Leader(2, 0),
            },
        ),
        transport=transport,
        listener="PLAINTEXT",
        metrics=ShareMetrics(),
        clock=SYSTEM_CLOCK,
        # The sink believes the topic takes large batches; its leader knows better.
        max_message_bytes=lambda _t: 1 << 20,
    )
    try:
        letter = DeadLetter("audit", source.topic_id, 0, 0, 1, 1, DeadLetterReason.REJECTED)
        assert await sink.write(letter) == 2
        got = await asyncio.to_thread(consume_assigned, view, "dlq.remote", [0], 2)
        assert [(r.offset, r.key, len(r.value or b"")) for r in got] == [
            (0, b"k", 300),
            (1, b"k", 300),
        ]
        assert [dict(r.headers)[HEADER_OFFSET] for r in got] == [b"0", b"1"]
        assert all(dict(r.headers)[HEADER_TOPIC] == b"payments" for r in got)

        config = GroupConfig(dead_letter_topic="dlq.tiny", dead_letter_copy_record=True)
        with pytest.raises(DeadLetterRefused, match="MESSAGE_TOO_LARGE"):
            await sink.write(letter)
        assert sink.metrics.dead_letter_writes == {"audit": [2, 1]}
    finally:
        await sink.close()
        await logs.flush_all()
        logs.close()
        await commit.stop()
