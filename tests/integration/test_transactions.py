"""Transactions end to end with confluent-kafka's transactional Producer: commits and
aborts over several partitions read back with isolation.level=read_committed, zombie
fencing, the coordinator aborting a transaction past its timeout, and a kill -9 in the
middle of a transaction. (The read_committed share-group side is in the share tests.)"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaException, Producer

from tests.integration.conftest import (
    Broker,
    consume_assigned,
    create_topic,
    module_broker,
    producer_config,
    watermarks,
)

PARTITIONS = 3
WAIT_S = 30.0


@pytest.fixture(scope="module")
def txn_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """One broker for the tests that need no restart; timed-out transactions are looked
    for every 200 ms."""
    settings = {"transaction.abort.timed.out.transaction.cleanup.interval.ms": "200"}
    with module_broker(tmp_path_factory, "transactions", settings) as broker:
        yield broker


def txn_producer(broker: Broker, transactional_id: str, **overrides: Any) -> Producer:
    producer = Producer(
        producer_config(broker, **{"transactional.id": transactional_id, **overrides})
    )
    producer.init_transactions(WAIT_S)
    return producer


def topic_and_producer(broker: Broker, topic: str, transactional_id: str) -> Producer:
    create_topic(broker, topic, PARTITIONS)
    return txn_producer(broker, transactional_id)


def send(producer: Producer, topic: str, values: list[bytes]) -> None:
    """Produce `values` round-robin over the partitions and wait for delivery."""
    for i, value in enumerate(values):
        producer.produce(topic, value=value, partition=i % PARTITIONS)
    assert producer.flush(WAIT_S) == 0


def read(
    broker: Broker, topic: str, expected: int, isolation: str, partitions: int = PARTITIONS
) -> list[bytes]:
    received = consume_assigned(
        broker,
        topic,
        list(range(partitions)),
        expected,
        timeout=WAIT_S,
        **{"isolation.level": isolation},
    )
    return [r.value for r in received if r.value is not None]


def batch(name: str, n: int = 9) -> list[bytes]:
    return [f"{name}-{i}".encode() for i in range(n)]


def test_interleaved_commits_and_aborts_read_committed_sees_exactly_the_committed(
    txn_broker: Broker,
) -> None:
    topic = "txn-interleaved"
    producer = topic_and_producer(txn_broker, topic, "it-interleaved")
    committed: list[bytes] = []
    everything: list[bytes] = []
    for n, commit in enumerate([True, False, True, False, True]):
        values = batch(f"t{n}")
        producer.begin_transaction()
        send(producer, topic, values)
        if commit:
            producer.commit_transaction(WAIT_S)
            committed += values
        else:
            producer.abort_transaction(WAIT_S)
        everything += values
    # Non-transactional records between transactions are visible to both.
    plain = Producer(producer_config(txn_broker))
    send(plain, topic, [b"plain"])
    committed.append(b"plain")
    everything.append(b"plain")

    seen = read(txn_broker, topic, len(committed), "read_committed")
    assert sorted(seen) == sorted(committed)
    uncommitted = read(txn_broker, topic, len(everything), "read_uncommitted")
    assert sorted(uncommitted) == sorted(everything)


def test_a_second_producer_with_the_same_transactional_id_fences_the_first(
    txn_broker: Broker,
) -> None:
    topic = "txn-zombie"
    zombie = topic_and_producer(txn_broker, topic, "it-zombie")
    zombie.begin_transaction()
    send(zombie, topic, batch("zombie"))

    # The new instance's InitProducerId aborts the zombie's open transaction.
    fresh = txn_producer(txn_broker, "it-zombie")
    with pytest.raises(KafkaException) as info:
        zombie.commit_transaction(WAIT_S)
    assert info.value.args[0].fatal(), info.value.args[0]

    fresh.begin_transaction()
    send(fresh, topic, batch("fresh"))
    fresh.commit_transaction(WAIT_S)
    assert sorted(read(txn_broker, topic, 9, "read_committed")) == sorted(batch("fresh"))


def test_a_transaction_past_its_timeout_is_aborted_by_the_coordinator(
    txn_broker: Broker,
) -> None:
    topic = "txn-timeout"
    create_topic(txn_broker, topic, 1)
    producer = txn_producer(
        txn_broker,
        "it-timeout",
        **{
            # librdkafka bounds these by transaction.timeout.ms.
            "transaction.timeout.ms": 2000,
            "message.timeout.ms": 2000,
            "socket.timeout.ms": 2000,
        },
    )
    producer.begin_transaction()
    producer.produce(topic, value=b"never-committed", partition=0)
    assert producer.flush(WAIT_S) == 0
    # The coordinator's abort writes a marker after the record: wait (bounded) for it.
    deadline = time.monotonic() + WAIT_S
    while watermarks(txn_broker, topic, 0)[1] < 2:
        assert time.monotonic() < deadline, "the timed-out transaction was never aborted"
        time.sleep(0.1)
    with pytest.raises(KafkaException):
        producer.commit_transaction(WAIT_S)
    assert read(txn_broker, topic, 0, "read_committed", partitions=1) == []

    # The transactional id itself lives on: a new producer commits.
    again = txn_producer(txn_broker, "it-timeout")
    again.begin_transaction()
    again.produce(topic, value=b"committed", partition=0)
    again.commit_transaction(WAIT_S)
    assert read(txn_broker, topic, 1, "read_committed", partitions=1) == [b"committed"]


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abort"])
def test_kill9_mid_transaction_keeps_it_and_the_producer_can_finish_it(
    broker_factory: Any, commit: bool
) -> None:
    broker: Broker = broker_factory()
    topic = "txn-kill9"
    create_topic(broker, topic, PARTITIONS)
    producer = txn_producer(broker, "it-kill9")
    producer.begin_transaction()
    values = batch("in-flight")
    send(producer, topic, values)

    broker.kill9()
    broker.start()

    if commit:
        producer.commit_transaction(WAIT_S)
        assert sorted(read(broker, topic, len(values), "read_committed")) == sorted(values)
    else:
        producer.abort_transaction(WAIT_S)
        assert read(broker, topic, 0, "read_committed") == []
    # Either way the records are in the log, and the next transaction works.
    assert sorted(read(broker, topic, len(values), "read_uncommitted")) == sorted(values)
    producer.begin_transaction()
    send(producer, topic, [b"after"])
    producer.commit_transaction(WAIT_S)
    expected = (values if commit else []) + [b"after"]
    assert sorted(read(broker, topic, len(expected), "read_committed")) == sorted(expected)
