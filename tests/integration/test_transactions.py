"""Transactions end to end with confluent-kafka's transactional Producer: commits and
aborts over several partitions read back with isolation.level=read_committed, zombie
fencing, the coordinator aborting a transaction past its timeout, and a kill -9 in the
middle of a transaction. (The read_committed share-group side is in the share tests.)"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from protocol.client import KafkaClient
from protocol.errors import ErrorCode
from protocol.records import NewRecord, build_batch
from tests.integration.conftest import (
    BOTH_STORAGES,
    Broker,
    consume_assigned,
    consumer_config,
    create_topic,
    module_broker,
    producer_config,
    storage_settings_for,
    watermarks,
)
from tests.integration.share_helpers import run_wire

PARTITIONS = 3
WAIT_S = 30.0


@pytest.fixture(scope="module")
def txn_broker(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest, storage: str
) -> Iterator[Broker]:
    """One broker for the tests that need no restart, on the module's storage engine;
    timed-out transactions are looked for every 200 ms."""
    settings = {
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": "200",
        **storage_settings_for(request, storage),
    }
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


@BOTH_STORAGES
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


@BOTH_STORAGES
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


@BOTH_STORAGES
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


@BOTH_STORAGES
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


# ------------------------------------------------------------------ raw requests

INIT_PRODUCER_ID, ADD_PARTITIONS, ADD_OFFSETS, END_TXN, TXN_OFFSET_COMMIT = 22, 24, 25, 26, 28
OFFSET_FETCH = 9
PRODUCE = 0


async def wire_init(client: KafkaClient, transactional_id: str) -> tuple[int, int]:
    answer = await client.request(
        INIT_PRODUCER_ID,
        4,
        {
            "transactional_id": transactional_id,
            "transaction_timeout": 60_000,
            "producer_id": -1,
            "producer_epoch": -1,
        },
    )
    assert answer.error_code == ErrorCode.none, answer
    return answer.producer_id, answer.producer_epoch


async def wire_add(
    client: KafkaClient, transactional_id: str, pid: int, epoch: int, topic: str, partition: int
) -> ErrorCode:
    answer = await client.request(
        ADD_PARTITIONS,
        3,
        {
            "v3_and_below_transactional_id": transactional_id,
            "v3_and_below_producer_id": pid,
            "v3_and_below_producer_epoch": epoch,
            "v3_and_below_topics": [{"name": topic, "partitions": [partition]}],
        },
    )
    [topic_result] = answer.results_by_topic_v3_and_below
    [partition_result] = topic_result.results_by_partition
    return ErrorCode(partition_result.partition_error_code)


async def wire_begin(client: KafkaClient, transactional_id: str, topic: str) -> tuple[int, int]:
    """InitProducerId, then partition 0 of `topic` added to a new transaction."""
    pid, epoch = await wire_init(client, transactional_id)
    assert await wire_add(client, transactional_id, pid, epoch, topic, 0) == ErrorCode.none
    return pid, epoch


async def wire_produce(
    client: KafkaClient,
    version: int,
    transactional_id: str,
    pid: int,
    epoch: int,
    topic: str,
    partition: int,
    values: list[bytes],
    seq: int = 0,
) -> Any:
    """A transactional batch as a transactional producer sends it; its partition answer."""
    records = build_batch(
        [NewRecord(None, v) for v in values],
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        is_transactional=True,
    )
    answer = await client.request(
        PRODUCE,
        version,
        {
            "transactional_id": transactional_id,
            "acks": -1,
            "timeout": 10_000,
            "topic_data": [
                {"name": topic, "partition_data": [{"index": partition, "records": records}]}
            ],
        },
    )
    [topic_answer] = answer.responses
    [partition_answer] = topic_answer.partition_responses
    return partition_answer


async def wire_end(
    client: KafkaClient, transactional_id: str, pid: int, epoch: int, commit: bool
) -> ErrorCode:
    answer = await client.request(
        END_TXN,
        3,
        {
            "transactional_id": transactional_id,
            "producer_id": pid,
            "producer_epoch": epoch,
            "committed": commit,
        },
    )
    return ErrorCode(answer.error_code)


@pytest.mark.parametrize(
    ("version", "expected"),
    [(10, ErrorCode.invalid_txn_state), (11, ErrorCode.transaction_abortable)],
)
def test_produce_to_a_partition_not_in_the_transaction_is_refused_and_nothing_is_appended(
    txn_broker: Broker, version: int, expected: ErrorCode
) -> None:
    topic = tid = f"txn-guard-v{version}"
    create_topic(txn_broker, topic, 2)

    async def scenario(client: KafkaClient) -> None:
        pid, epoch = await wire_begin(client, tid, topic)
        outside = await wire_produce(client, version, tid, pid, epoch, topic, 1, [b"stray"])
        assert (outside.error_code, outside.base_offset) == (expected, -1)
        inside = await wire_produce(client, version, tid, pid, epoch, topic, 0, [b"kept"])
        assert (inside.error_code, inside.base_offset) == (ErrorCode.none, 0)
        assert await wire_end(client, tid, pid, epoch, True) == ErrorCode.none

    run_wire(txn_broker, scenario, "it-guard")
    assert watermarks(txn_broker, topic, 1) == (0, 0)
    # The batch and its commit marker, nothing else.
    assert watermarks(txn_broker, topic, 0) == (0, 2)
    assert read(txn_broker, topic, 1, "read_committed", partitions=2) == [b"kept"]


@pytest.mark.parametrize("version", [10, 11])
def test_produce_from_a_fenced_epoch_is_invalid_producer_epoch_and_nothing_is_appended(
    txn_broker: Broker, version: int
) -> None:
    topic = tid = f"txn-guard-fenced-v{version}"
    create_topic(txn_broker, topic, 1)

    async def scenario(client: KafkaClient) -> None:
        pid, old_epoch = await wire_begin(client, tid, topic)
        # A new instance of the producer: the open transaction is aborted (the client
        # is told to retry while it completes) and the epoch bumped twice.
        deadline = time.monotonic() + WAIT_S
        while True:
            answer = await client.request(
                INIT_PRODUCER_ID,
                4,
                {"transactional_id": tid, "transaction_timeout": 60_000},
            )
            if answer.error_code != ErrorCode.concurrent_transactions:
                break
            assert time.monotonic() < deadline
        assert answer.error_code == ErrorCode.none and answer.producer_epoch > old_epoch
        stale = await wire_produce(client, version, tid, pid, old_epoch, topic, 0, [b"zombie"])
        assert (stale.error_code, stale.base_offset) == (ErrorCode.invalid_producer_epoch, -1)

    run_wire(txn_broker, scenario, "it-guard-fenced")
    # Only the fencing abort's marker is in the log.
    assert watermarks(txn_broker, topic, 0) == (0, 1)
    assert read(txn_broker, topic, 0, "read_uncommitted", partitions=1) == []


def test_txn_offset_commit_is_pending_until_the_transaction_commits(
    txn_broker: Broker,
) -> None:
    """AddOffsetsToTxn joins the group's __consumer_offsets partition to the
    transaction; TxnOffsetCommit stores pending offsets (a simple group for generation
    -1, UNKNOWN_MEMBER_ID for a generation it has no member of, as Kafka 4.2's classic
    group answers); OffsetFetch with RequireStable sees them as unstable until EndTxn,
    whose marker commits them."""
    topic = tid = "txn-offsets-wire"
    create_topic(txn_broker, topic, 1)

    async def scenario(client: KafkaClient) -> None:
        pid, epoch = await wire_begin(client, tid, topic)
        produced = await wire_produce(client, 11, tid, pid, epoch, topic, 0, [b"a", b"b"])
        assert produced.error_code == ErrorCode.none
        for version in (0, 3, 4):
            added = await client.request(
                ADD_OFFSETS,
                version,
                {
                    "transactional_id": tid,
                    "producer_id": pid,
                    "producer_epoch": epoch,
                    "group_id": "it-offsets-group",
                },
            )
            assert added.error_code == ErrorCode.none
        fenced = await client.request(
            ADD_OFFSETS,
            1,
            {
                "transactional_id": tid,
                "producer_id": pid,
                "producer_epoch": epoch + 5,
                "group_id": "it-offsets-group",
            },
        )
        # PRODUCER_FENCED is INVALID_PRODUCER_EPOCH before v2.
        assert fenced.error_code == ErrorCode.invalid_producer_epoch

        def commit_body(generation: int, partition: int) -> dict[str, Any]:
            return {
                "transactional_id": tid,
                "group_id": "it-offsets-group",
                "producer_id": pid,
                "producer_epoch": epoch,
                "generation_id": generation,
                "member_id": "" if generation < 0 else "member-1",
                "topics": [
                    {
                        "name": topic,
                        "partitions": [
                            {"partition_index": partition, "committed_offset": 2},
                        ],
                    }
                ],
            }

        for version, generation, partition, expected in [
            (0, -1, 0, ErrorCode.none),
            (3, -1, 0, ErrorCode.none),
            (3, 4, 0, ErrorCode.unknown_member_id),
            (5, -1, 7, ErrorCode.unknown_topic_or_partition),
        ]:
            answer = await client.request(
                TXN_OFFSET_COMMIT, version, commit_body(generation, partition)
            )
            [topic_answer] = answer.topics
            [partition_answer] = topic_answer.partitions
            assert (partition_answer.partition_index, partition_answer.error_code) == (
                partition,
                expected,
            ), (version, generation)

        async def fetched(require_stable: bool) -> tuple[int, ErrorCode]:
            answer = await client.request(
                OFFSET_FETCH,
                7,
                {
                    "group_id": "it-offsets-group",
                    "topics": [{"name": topic, "partition_indexes": [0]}],
                    "require_stable": require_stable,
                },
            )
            [p] = answer.topics[0].partitions
            return p.committed_offset, p.error_code

        assert await fetched(True) == (-1, ErrorCode.unstable_offset_commit)
        assert await fetched(False) == (-1, ErrorCode.none)
        assert await wire_end(client, tid, pid, epoch, True) == ErrorCode.none
        assert await fetched(True) == (2, ErrorCode.none)

    run_wire(txn_broker, scenario, "it-offsets-wire")
    assert sorted(read(txn_broker, topic, 2, "read_committed", partitions=1)) == [b"a", b"b"]


def test_send_offsets_to_transaction_commits_with_the_transaction(
    txn_broker: Broker,
) -> None:
    """confluent-kafka's send_offsets_to_transaction (AddOffsetsToTxn, then
    TxnOffsetCommit): the offsets are the group's once the transaction commits, and an
    aborted transaction's are dropped."""
    topic = "txn-send-offsets"
    group = "it-send-offsets-group"
    producer = topic_and_producer(txn_broker, topic, "it-send-offsets")
    consumer = Consumer(consumer_config(txn_broker, **{"group.id": group}))
    try:
        producer.begin_transaction()
        send(producer, topic, batch("aborted", 3))
        producer.send_offsets_to_transaction(
            [TopicPartition(topic, 0, 7)], consumer.consumer_group_metadata(), WAIT_S
        )
        producer.abort_transaction(WAIT_S)
        [back] = consumer.committed([TopicPartition(topic, 0)], timeout=WAIT_S)
        assert back.offset < 0  # the aborted transaction's offset is gone

        producer.begin_transaction()
        send(producer, topic, batch("with-offsets", 3))
        producer.send_offsets_to_transaction(
            [TopicPartition(topic, 0, 3)], consumer.consumer_group_metadata(), WAIT_S
        )
        producer.commit_transaction(WAIT_S)
        [back] = consumer.committed([TopicPartition(topic, 0)], timeout=WAIT_S)
        assert back.offset == 3
    finally:
        consumer.close()
    assert sorted(read(txn_broker, topic, 3, "read_committed")) == sorted(batch("with-offsets", 3))
