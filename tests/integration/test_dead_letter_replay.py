"""`spool share-groups --replay-dead-letters` against a real broker process: dead-letter
records (KIP-1191's `__dlq.errors.*` headers, written here with confluent-kafka's
Producer, as the broker's dead-letter writer would write them) go back to their source
topic once each: copies from the copy, headers-only records from the source log, other
groups' records passed over, a record whose original is gone skipped; a second run
moves nothing; a run killed with SIGKILL mid-way and run again leaves each record
exactly once in the source topic for a read_committed consumer."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace

import pytest
from confluent_kafka import (
    AcknowledgeType,
    ConsumerGroupTopicPartitions,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from broker.share.dead_letters import (
    HEADER_DELIVERY_COUNT,
    HEADER_GROUP,
    HEADER_MESSAGE,
    HEADER_OFFSET,
    HEADER_PARTITION,
    HEADER_TOPIC,
    DeadLetterReason,
)
from tests.integration import cli_helpers
from tests.integration.conftest import (
    REPO_ROOT,
    Broker,
    Sent,
    admin_config,
    consume_assigned,
    create_topic,
    module_broker,
    produce,
    producer_config,
    watermarks,
)
from tests.integration.share_helpers import (
    accept_all,
    close_quietly,
    consume,
    produce_values,
    set_group_configs,
    share_consumer,
)

TIMEOUT_MS = "20000"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    with module_broker(tmp_path_factory, "dead-letter-replay") as broker:
        yield broker


def replay(broker: Broker, *argv: str) -> subprocess.CompletedProcess[str]:
    return cli_helpers.spool(
        broker, "share-groups", "--replay-dead-letters", *argv, "--timeout", TIMEOUT_MS
    )


def replay_ok(broker: Broker, *argv: str) -> str:
    proc = replay(broker, *argv)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout + proc.stderr


def dlq_headers(group: str, topic: str, partition: int, offset: int) -> list[tuple[str, bytes]]:
    return [
        (HEADER_TOPIC, topic.encode()),
        (HEADER_PARTITION, str(partition).encode()),
        (HEADER_OFFSET, str(offset).encode()),
        (HEADER_GROUP, group.encode()),
        (HEADER_DELIVERY_COUNT, b"5"),
        (HEADER_MESSAGE, DeadLetterReason.REJECTED.value.encode()),
    ]


def copy_of(group: str, topic: str, sent: Sent) -> tuple[None, bytes | None, bytes | None, list]:
    """A dead-letter record with copy.record.enable=true: the context headers first,
    then the original's key, value and headers."""
    headers = dlq_headers(group, topic, sent.partition, sent.offset) + list(sent.headers)
    return (None, sent.key, sent.value, headers)


def headers_only(group: str, topic: str, sent: Sent) -> tuple[None, None, None, list]:
    return (None, None, None, dlq_headers(group, topic, sent.partition, sent.offset))


def produce_ok(broker: Broker, topic: str, records: list) -> list[Sent]:
    outcome = produce(Producer(producer_config(broker)), topic, records)
    assert outcome.errors == [] and outcome.unflushed == 0, outcome.errors
    return sorted(outcome.acked, key=lambda s: (s.partition, s.offset))


def as_record(r: object) -> tuple:
    return (r.partition, r.key, r.value, tuple(r.headers))  # type: ignore[attr-defined]


def test_replay_moves_each_dead_letter_back_once(broker: Broker) -> None:
    create_topic(broker, "orders", partitions=2)
    create_topic(broker, "dlq.orders")
    create_topic(broker, "orders.fixed")
    create_topic(broker, "expired")
    originals = produce_ok(
        broker,
        "orders",
        [(i % 2, f"k{i}".encode(), f"v{i}".encode(), [("h", str(i).encode())]) for i in range(10)],
    )
    # Delivery reports do not carry the headers: put back the ones sent.
    by_key = {s.key: replace(s, headers=(("h", s.key[1:]),)) for s in originals}
    (expired,) = produce_ok(broker, "expired", [(0, b"old", b"gone", [])])
    produce_ok(broker, "expired", [(0, b"new", b"kept", [])])
    admin = AdminClient(admin_config(broker))
    deleted = admin.delete_records([TopicPartition("expired", 0, 1)], request_timeout=20)
    for future in deleted.values():
        future.result(timeout=20)

    dead = [copy_of("G", "orders", by_key[f"k{i}".encode()]) for i in range(4)]
    dead += [headers_only("G", "orders", by_key[f"k{i}".encode()]) for i in range(4, 8)]
    dead += [copy_of("other", "orders", by_key[f"k{i}".encode()]) for i in (8, 9)]
    dead += [headers_only("G", "expired", expired)]
    produce_ok(broker, "dlq.orders", [(0, *d[1:]) for d in dead])
    before = [watermarks(broker, "orders", p)[1] for p in (0, 1)]

    dry = replay_ok(broker, "--group", "G", "--topic", "dlq.orders", "--dry-run")
    assert "Would replay 8 record(s)" in dry and "skipped 1" in dry, dry
    assert "passed over 2 record(s)" in dry, dry
    assert "expired-0 offset 0 is no longer in the log" in dry, dry
    assert [watermarks(broker, "orders", p)[1] for p in (0, 1)] == before

    out = replay_ok(broker, "--group", "G", "--topic", "dlq.orders")
    assert "Replayed 8 record(s)" in out, out
    assert "(4 from their copy, 4 read from the source topic)" in out, out
    assert "skipped 1; passed over 2" in out, out

    got = consume_assigned(broker, "orders", [0, 1], 18, timeout=30)
    assert len(got) == 18
    replayed = [r for r in got if r.offset >= before[r.partition]]
    assert Counter(as_record(r) for r in replayed) == Counter(
        as_record(by_key[f"k{i}".encode()]) for i in range(8)
    )

    again = replay_ok(broker, "--group", "G", "--topic", "dlq.orders")
    assert "Replayed 0 record(s)" in again, again
    assert len(consume_assigned(broker, "orders", [0, 1], 18, timeout=30)) == 18

    # Another group's records, into another topic: its single partition takes both.
    other = replay_ok(
        broker, "--group", "other", "--topic", "dlq.orders", "--to-topic", "orders.fixed"
    )
    assert "Replayed 2 record(s)" in other and "passed over 9" in other, other
    fixed = consume_assigned(broker, "orders.fixed", [0], 2, timeout=30)
    assert sorted((r.key, r.value) for r in fixed) == [(b"k8", b"v8"), (b"k9", b"v9")]


def test_records_a_share_group_rejected_come_back_to_it(broker: Broker) -> None:
    """The user's story end to end: a share group with a dead-letter topic rejects some
    records (the broker copies them there, headers only, Kafka's default); once the bug
    is fixed, the replay puts them back and the same group gets them again."""
    create_topic(broker, "jobs")
    create_topic(broker, "dlq.jobs", config={"errors.deadletterqueue.group.enable": "true"})
    set_group_configs(
        broker,
        "workers",
        {"share.auto.offset.reset": "earliest", "errors.deadletterqueue.topic.name": "dlq.jobs"},
    )
    sent = produce_values(broker, "jobs", [b"job-%d" % i for i in range(20)])
    rejected = {s.offset for s in sent if s.offset % 4 == 0}

    def reject_some(msg: Message) -> AcknowledgeType:
        return AcknowledgeType.REJECT if msg.offset() in rejected else AcknowledgeType.ACCEPT

    consumer = share_consumer(broker, "workers", ["jobs"])
    try:
        consume(
            consumer, until=lambda log: len(log.deliveries) >= 20, timeout=60, decide=reject_some
        )
        deadline = time.monotonic() + 30
        while watermarks(broker, "dlq.jobs", 0)[1] < len(rejected):
            assert time.monotonic() < deadline, "the dead-letter copies never appeared"
            time.sleep(0.1)

        out = replay_ok(broker, "--group", "workers", "--topic", "dlq.jobs")
        assert f"Replayed {len(rejected)} record(s)" in out, out
        assert f"(0 from their copy, {len(rejected)} read from the source topic)" in out, out
        again = consume(
            consumer,
            until=lambda log: len(log.deliveries) >= len(rejected),
            timeout=60,
            decide=accept_all,
        )
    finally:
        close_quietly(consumer)
    assert sorted(again.values()) == sorted(b"job-%d" % o for o in rejected)
    assert all(d.offset >= 20 for d in again.deliveries)


def test_replay_errors_name_the_kafka_error(broker: Broker) -> None:
    proc = replay(broker, "--group", "G", "--topic", "dlq.missing")
    assert proc.returncode == 1
    assert "Error: UNKNOWN_TOPIC_OR_PARTITION" in proc.stderr, proc.stderr
    usage = replay(broker, "--group", "G")
    assert usage.returncode == 2 and "takes one --topic" in usage.stderr


def committed(broker: Broker, group: str) -> int:
    admin = AdminClient(admin_config(broker))
    futures = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])
    result = futures[group].result(timeout=20)
    return sum(tp.offset for tp in result.topic_partitions if tp.offset >= 0)


def test_killed_replay_rerun_replays_each_record_exactly_once(broker: Broker) -> None:
    count = 6000
    create_topic(broker, "bulk")
    create_topic(broker, "dlq.bulk", partitions=2)
    value = b"x" * 200
    dead = [(i % 2, f"r{i}".encode(), value, dlq_headers("K", "bulk", 0, i)) for i in range(count)]
    produce_ok(broker, "dlq.bulk", dead)

    argv = [sys.executable, "-m", "broker", "share-groups", "--replay-dead-letters"]
    argv += ["--group", "K", "--topic", "dlq.bulk", "--bootstrap-server", broker.bootstrap]
    proc = subprocess.Popen(
        argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=os.environ.copy()
    )
    try:
        deadline = time.monotonic() + 60
        while committed(broker, "spool-replay-K") == 0 and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.02)
        assert proc.poll() is None, "the replay finished before it could be killed"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    progress = committed(broker, "spool-replay-K")
    assert 0 < progress < count, progress

    out = replay_ok(broker, "--group", "K", "--topic", "dlq.bulk")
    assert f"Replayed {count - progress} record(s)" in out, out
    got = consume_assigned(broker, "bulk", [0], count, timeout=60, **{"fetch.wait.max.ms": 100})
    keys = Counter(r.key for r in got)
    assert len(got) == count and all(n == 1 for n in keys.values()), (
        len(got),
        [k for k, n in keys.items() if n > 1][:5],
    )
    assert set(keys) == {f"r{i}".encode() for i in range(count)}
