"""Dead-letter topics (KIP-1191) end to end: real broker processes, real ShareConsumers.

A share group with `errors.deadletterqueue.topic.name` set (the topic opted in with
`errors.deadletterqueue.group.enable=true` and named with the broker's prefix, "dlq.")
gets a copy of every record it gives up on in that topic: rejected records, and records
that reach `share.delivery.count.limit` by RELEASE or by lock expiry. Each copy carries
Kafka's `__dlq.errors.*` headers; with `errors.deadletterqueue.copy.record.enable=true`
also the record's key, value, headers and timestamp.

- exactly once each, with the headers, copy on and off, on both storage engines;
- a kill -9 at each step of the copy (crash points `dead-letter.before-copy`, after the
  ARCHIVING state is durable, and `dead-letter.after-copy`, after the copy is durable
  but before ARCHIVED is), armed with SPOOL_CRASH_AT (broker.faults): after a restart
  on the same data (the same database on PostgreSQL) no rejected record is lost, none is
  delivered again, the delivery counts are kept, and a second copy exists only after the
  `after-copy` crash, with the same headers as the first;
- a group without a dead-letter topic archives as before and writes nowhere;
- /metrics counts the dead letters per group and reason.

Most tests share one broker per engine (module scope); the crash tests start their own.
Record counts are small and every wait is bounded.
"""

from __future__ import annotations

import signal
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient
from prometheus_client.parser import text_string_to_metric_families

from protocol.client import KafkaClient
from protocol.errors import ErrorCode
from tests.integration.conftest import (
    _LOGS_KEY,
    BOTH_STORAGES,
    Broker,
    Sent,
    admin_config,
    consume_assigned,
    create_topic,
    free_port,
    produce,
    producer_config,
    started,
    storage_settings_for,
)
from tests.integration.share_helpers import (
    Delivery,
    PollLog,
    close_quietly,
    consume,
    heartbeat,
    log_lines,
    never,
    poll_once,
    run_wire,
    set_group_configs,
    share_consumer,
    share_fetch_body,
    topic_id,
)

pytestmark = [BOTH_STORAGES, pytest.mark.timeout(180)]

DLQ = "dlq.orders"
DLQ_PARTITIONS = 2
CRASH_AT_ENV = "SPOOL_CRASH_AT"  # broker.faults.CRASH_AT_ENV

# Kafka's context headers (ShareGroupDLQStateManager) and their messages.
H_TOPIC = "__dlq.errors.topic"
H_PARTITION = "__dlq.errors.partition"
H_OFFSET = "__dlq.errors.offset"
H_GROUP = "__dlq.errors.group"
H_COUNT = "__dlq.errors.delivery.count"
H_MESSAGE = "__dlq.errors.message"
DLQ_HEADERS = (H_TOPIC, H_PARTITION, H_OFFSET, H_GROUP, H_COUNT, H_MESSAGE)
REJECTED = "Offset rejected by client."
DELIVERY_LIMIT = "Offset delivery count exceeded the threshold."

# Locks as short as the broker allows a group to ask for; the broker default stays long
# so that only the groups that want expiry see it.
SETTINGS = {
    "group.share.min.record.lock.duration.ms": "1000",
    "group.share.record.lock.duration.ms": "15000",
}
SHORT_LOCK_MS = 1000
LIMIT = 2  # share.delivery.count.limit: Kafka's minimum
BASE_TS = 1_700_000_000_000  # record timestamps well in the past, so a copy's is telling
WAIT_S = 30.0

FETCH = 78
GAP, ACCEPT, RELEASE, REJECT = 0, 1, 2, 3


# --- brokers --------------------------------------------------------------------------


class MetricsBroker(Broker):
    """The harness's broker with `--metrics 127.0.0.1:<free port>`."""

    def __init__(self, data_dir: Path, log_path: Path, settings: dict[str, str]) -> None:
        super().__init__(data_dir, log_path, dict(settings))
        self.metrics_port = free_port()

    def command(self) -> list[str]:
        return [*super().command(), "--metrics", f"127.0.0.1:{self.metrics_port}"]

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                body = response.read()
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"/metrics answered {exc.code}") from exc
        out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for family in text_string_to_metric_families(body.decode()):
            for s in family.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out


@pytest.fixture(scope="module")
def dlq_broker(
    request: pytest.FixtureRequest, storage: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MetricsBroker]:
    """One broker per engine for the tests that need no crash, with the dead-letter
    topic `dlq.orders` (opted in, 2 partitions) created."""
    root = tmp_path_factory.mktemp(f"dead-letters-{storage}")
    settings = {**SETTINGS, **storage_settings_for(request, storage)}
    with started(MetricsBroker(root / "data", root / "broker.log", settings)) as broker:
        create_dlq(broker, DLQ, DLQ_PARTITIONS)
        yield broker


@pytest.fixture
def logs_on_failure(request: pytest.FixtureRequest, dlq_broker: MetricsBroker) -> None:
    """Attach the module broker's log to this test's failure report too."""
    request.node.stash[_LOGS_KEY] = [dlq_broker.log_path]


# --- setup helpers --------------------------------------------------------------------


def create_dlq(broker: Broker, name: str, partitions: int = 1) -> None:
    create_topic(broker, name, partitions, {"errors.deadletterqueue.group.enable": "true"})


def dlq_group(broker: Broker, group: str, *, copy: bool, **configs: str) -> None:
    """`group` from the earliest offset, dead-lettering to DLQ (copies of the records
    when `copy`), with more group configs given as dotted names."""
    set_group_configs(
        broker,
        group,
        {
            "share.auto.offset.reset": "earliest",
            "errors.deadletterqueue.topic.name": DLQ,
            "errors.deadletterqueue.copy.record.enable": "true" if copy else "false",
            **configs,
        },
    )


def produce_orders(broker: Broker, topic: str, count: int, partitions: int = 1) -> list[Sent]:
    """`count` records round-robin over `partitions`: key, value, two headers and a
    timestamp of their own (BASE_TS + i), all telling which record it is; the list is
    in production order (record i at index i)."""
    producer = Producer(producer_config(broker))
    records = [
        (
            i % partitions,
            f"key-{i}".encode(),
            f"order-{i}".encode(),
            list(headers_of(i)),
        )
        for i in range(count)
    ]
    timestamps = [BASE_TS + i for i in range(count)]
    outcome = produce(producer, topic, records, flush_timeout=30, timestamps=timestamps)
    assert outcome.errors == [] and outcome.unflushed == 0, outcome.errors
    assert len(outcome.acked) == count
    # In production order (delivery reports of several partitions come in any order).
    return sorted(outcome.acked, key=lambda s: int((s.value or b"").split(b"-")[1]))


def headers_of(i: int) -> tuple[tuple[str, bytes], ...]:
    """The headers `produce_orders` gives its `i`th record (a delivery report has none)."""
    return (("origin", b"shop"), ("n", str(i).encode()))


# --- reading the dead-letter topic ----------------------------------------------------


@dataclass(frozen=True)
class Copy:
    """One record of the dead-letter topic."""

    dlq_partition: int
    dlq_offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int
    context: dict[str, str]  # the __dlq.errors.* headers
    headers: tuple[tuple[str, bytes | None], ...]  # all headers, in order

    @property
    def source(self) -> tuple[str, int, int]:
        c = self.context
        return (c[H_TOPIC], int(c[H_PARTITION]), int(c[H_OFFSET]))

    @property
    def original_headers(self) -> tuple[tuple[str, bytes | None], ...]:
        return tuple((k, v) for k, v in self.headers if not k.startswith("__dlq."))


def read_dlq(broker: Broker, topic: str = DLQ, partitions: int = DLQ_PARTITIONS) -> list[Copy]:
    """Every record of the dead-letter topic, from the start to the end."""
    out = []
    for r in consume_assigned(broker, topic, list(range(partitions)), 0, timeout=WAIT_S):
        context = {k: (v or b"").decode() for k, v in r.headers if k.startswith("__dlq.errors.")}
        out.append(Copy(r.partition, r.offset, r.key, r.value, r.timestamp, context, r.headers))
    return out


def copies_of(broker: Broker, group: str, expected: set[tuple[str, int, int]]) -> list[Copy]:
    """The group's copies once all of `expected` (source topic, partition, offset) are in
    the dead-letter topic (30 s at most), read again a moment later so that a copy
    written twice shows up twice."""
    deadline = time.monotonic() + WAIT_S
    seen: set[tuple[str, int, int]] = set()
    while time.monotonic() < deadline:
        seen = {c.source for c in read_dlq(broker) if c.context.get(H_GROUP) == group}
        if expected <= seen:
            break
        time.sleep(0.2)
    else:
        raise AssertionError(
            f"dead-letter copies missing after {WAIT_S}s: {sorted(expected - seen)}\n"
            + "\n".join(log_lines(broker, "dead")[-20:])
        )
    time.sleep(1.0)
    return [c for c in read_dlq(broker) if c.context.get(H_GROUP) == group]


def assert_context(
    copy: Copy, topic: str, partition: int, offset: int, group: str, count: int, why: str
) -> None:
    """The six context headers, first and in Kafka's order, with these values."""
    names = [k for k, _ in copy.headers[: len(DLQ_HEADERS)]]
    assert names == list(DLQ_HEADERS), copy.headers
    assert copy.context == {
        H_TOPIC: topic,
        H_PARTITION: str(partition),
        H_OFFSET: str(offset),
        H_GROUP: group,
        H_COUNT: str(count),
        H_MESSAGE: why,
    }, copy


def assert_copied_record(copy: Copy, sent: Sent, i: int) -> None:
    """`copy` carries the key, value, headers and timestamp of the `i`th record sent."""
    assert (copy.key, copy.value) == (sent.key, sent.value), copy
    assert copy.original_headers == headers_of(i), copy
    assert copy.timestamp == BASE_TS + i, copy


def assert_headers_only(copy: Copy, written_after_ms: int) -> None:
    assert (copy.key, copy.value, copy.original_headers) == (None, None, ()), copy
    # Kafka stamps a headers-only copy with the time it was written.
    assert written_after_ms - 5_000 <= copy.timestamp <= time.time() * 1000 + 5_000, copy


# --- consuming ------------------------------------------------------------------------


def deliveries_by_offset(log: PollLog) -> dict[tuple[int, int], list[Delivery]]:
    out: dict[tuple[int, int], list[Delivery]] = {}
    for d in log.deliveries:
        out.setdefault(d.key, []).append(d)
    return out


# --- 1. rejected records: exactly once each, with the headers -------------------------


@pytest.mark.parametrize("copy", [True, False], ids=["copy", "headers-only"])
def test_rejected_records_are_in_the_dead_letter_topic_once_each_with_the_headers(
    dlq_broker: MetricsBroker, logs_on_failure: None, copy: bool
) -> None:
    broker = dlq_broker
    topic, group = f"orders-rejected-{copy}", f"g-rejected-{copy}"
    partitions = 3  # a copy goes to DLQ partition = source partition % 2
    create_topic(broker, topic, partitions)
    dlq_group(broker, group, copy=copy)
    started_ms = int(time.time() * 1000)
    sent = produce_orders(broker, topic, 12, partitions)
    by_key = {(s.partition, s.offset): (i, s) for i, s in enumerate(sent)}
    rejected = {k for k, (i, _) in by_key.items() if i % 3 == 0}

    def decide(msg: Message) -> AcknowledgeType:
        if (msg.partition(), msg.offset()) in rejected:
            return AcknowledgeType.REJECT
        return AcknowledgeType.ACCEPT

    consumer = share_consumer(broker, group, [topic])
    try:
        log = consume(
            consumer, until=lambda lg: len(lg.deliveries) >= 12, timeout=WAIT_S, decide=decide
        )
        # Nothing comes back: not the rejected records (ARCHIVING is never acquired) and
        # not the accepted ones.
        consume(consumer, until=never, timeout=1.5, decide=decide, log=log)
    finally:
        close_quietly(consumer)
    assert Counter(log.offsets()) == Counter(set(by_key)), log

    copies = copies_of(broker, group, {(topic, p, o) for p, o in rejected})
    assert Counter(c.source for c in copies) == Counter({(topic, p, o) for p, o in rejected})
    for c in copies:
        _, p, o = c.source
        i, s = by_key[(p, o)]
        assert c.dlq_partition == p % DLQ_PARTITIONS, c
        assert_context(c, topic, p, o, group, 1, REJECTED)
        if copy:
            assert_copied_record(c, s, i)
        else:
            assert_headers_only(c, started_ms)


# --- 2. the delivery limit: by RELEASE, and by lock expiry ----------------------------


def test_records_released_up_to_the_delivery_limit_are_dead_lettered_once(
    dlq_broker: MetricsBroker, logs_on_failure: None
) -> None:
    broker = dlq_broker
    topic, group = "orders-released", "g-released"
    create_topic(broker, topic)
    dlq_group(broker, group, copy=True, **{"share.delivery.count.limit": str(LIMIT)})
    sent = produce_orders(broker, topic, 6)
    released = {s.offset for i, s in enumerate(sent) if i % 2 == 0}

    def decide(msg: Message) -> AcknowledgeType:
        return AcknowledgeType.RELEASE if msg.offset() in released else AcknowledgeType.ACCEPT

    consumer = share_consumer(broker, group, [topic])
    try:
        log = consume(
            consumer,
            until=lambda lg: all(lg.offsets().count((0, o)) >= LIMIT for o in released),
            timeout=WAIT_S,
            decide=decide,
        )
        consume(consumer, until=never, timeout=1.5, decide=decide, log=log)
    finally:
        close_quietly(consumer)
    seen = deliveries_by_offset(log)
    for s in sent:
        counts = [d.delivery_count for d in seen[(0, s.offset)]]
        assert counts == ([1, 2] if s.offset in released else [1]), (s.offset, counts)

    copies = copies_of(broker, group, {(topic, 0, o) for o in released})
    assert Counter(c.source for c in copies) == Counter({(topic, 0, o) for o in released})
    for c in copies:
        i = c.source[2]
        assert_context(c, topic, 0, i, group, LIMIT, DELIVERY_LIMIT)
        assert_copied_record(c, sent[i], i)


def test_records_whose_lock_expires_at_the_delivery_limit_are_dead_lettered(
    dlq_broker: MetricsBroker, logs_on_failure: None
) -> None:
    """A member acquires the records and never acknowledges them (on the wire, so no
    client releases anything): the lock expires, they come back with delivery count 2,
    the lock expires again, and at the limit they go to the dead-letter topic."""
    broker = dlq_broker
    topic, group, member = "orders-expired", "g-expired", "m-sleepy"
    create_topic(broker, topic)
    dlq_group(
        broker,
        group,
        copy=False,
        **{
            "share.delivery.count.limit": str(LIMIT),
            "share.record.lock.duration.ms": str(SHORT_LOCK_MS),
        },
    )
    started_ms = int(time.time() * 1000)
    sent = produce_orders(broker, topic, 3)
    acquisitions: list[tuple[int, int, int]] = []

    async def scenario(client: KafkaClient) -> None:
        hb = await heartbeat(client, group, member, 0, [topic])
        assert hb.error_code == ErrorCode.none, hb
        tid: uuid.UUID = await topic_id(client, topic)
        epoch = 0
        deadline = time.monotonic() + WAIT_S
        # Fetch (never acknowledging) until both deliveries of every record were seen,
        # then a few lock durations more: nothing may be acquired a third time.
        quiet_until: float | None = None
        while time.monotonic() < deadline:
            if quiet_until is not None and time.monotonic() >= quiet_until:
                return
            r = await client.request(
                FETCH, 1, share_fetch_body(group, member, epoch, {(tid, 0): []}, max_wait=200)
            )
            assert r.error_code == ErrorCode.none, r
            epoch += 1
            for t in r.responses:
                for p in t.partitions:
                    assert p.error_code == ErrorCode.none, p
                    for a in p.acquired_records:
                        acquisitions.append((a.first_offset, a.last_offset, a.delivery_count))
            if quiet_until is None and {dc for _, _, dc in acquisitions} >= {1, LIMIT}:
                quiet_until = time.monotonic() + 3 * SHORT_LOCK_MS / 1000
        raise AssertionError(f"the records were not acquired twice: {acquisitions}")

    run_wire(broker, scenario)
    counts = Counter((o, dc) for first, last, dc in acquisitions for o in range(first, last + 1))
    assert counts == Counter({(s.offset, dc): 1 for s in sent for dc in (1, LIMIT)}), acquisitions

    copies = copies_of(broker, group, {(topic, 0, s.offset) for s in sent})
    assert Counter(c.source for c in copies) == Counter({(topic, 0, s.offset) for s in sent})
    for c in copies:
        assert_context(c, topic, 0, c.source[2], group, LIMIT, DELIVERY_LIMIT)
        assert_headers_only(c, started_ms)


# --- 3. a group without a dead-letter topic -------------------------------------------


def test_a_group_without_a_dead_letter_topic_archives_as_before_and_writes_nowhere(
    dlq_broker: MetricsBroker, logs_on_failure: None
) -> None:
    broker = dlq_broker
    topic, group = "orders-plain", "g-plain"
    create_topic(broker, topic)
    set_group_configs(
        broker,
        group,
        {
            "share.auto.offset.reset": "earliest",
            "share.delivery.count.limit": str(LIMIT),
            "share.record.lock.duration.ms": str(SHORT_LOCK_MS),
        },
    )
    before = {t: read_dlq(broker, t, n) for t, n in dlq_topics(broker).items()}
    sent = produce_orders(broker, topic, 6)
    rejected, released = {sent[0].offset, sent[3].offset}, {sent[1].offset}

    def decide(msg: Message) -> AcknowledgeType:
        if msg.offset() in rejected:
            return AcknowledgeType.REJECT
        if msg.offset() in released:
            return AcknowledgeType.RELEASE
        return AcknowledgeType.ACCEPT

    consumer = share_consumer(broker, group, [topic])
    try:
        log = consume(
            consumer,
            until=lambda lg: all(lg.offsets().count((0, o)) >= LIMIT for o in released),
            timeout=WAIT_S,
            decide=decide,
        )
        # Well over a lock duration: a lost Reject or Accept would bring a record back.
        consume(consumer, until=never, timeout=3 * SHORT_LOCK_MS / 1000, decide=decide, log=log)
    finally:
        close_quietly(consumer)
    counts = Counter(o for _, o in log.offsets())
    assert counts == Counter({s.offset: LIMIT if s.offset in released else 1 for s in sent}), log

    after = {t: read_dlq(broker, t, n) for t, n in dlq_topics(broker).items()}
    assert set(after) == set(before), "a dead-letter topic appeared"
    for t, records in after.items():
        assert [c for c in records if c.context.get(H_GROUP) == group] == [], t
        assert len(records) == len(before[t]), t


def dlq_topics(broker: Broker) -> dict[str, int]:
    """Every topic named with the dead-letter prefix, and its partition count."""
    md = AdminClient(admin_config(broker)).list_topics(timeout=10)
    return {name: len(t.partitions) for name, t in md.topics.items() if name.startswith("dlq.")}


# --- 4. /metrics ----------------------------------------------------------------------


def metric(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    """The sum of `name`'s samples (a counter's `_total` too) whose labels include
    `labels`."""
    wanted = set(labels.items())
    return sum(
        v for (n, ls), v in samples.items() if n in (name, f"{name}_total") and wanted <= set(ls)
    )


def test_metrics_count_dead_letters_per_group_and_reason(
    dlq_broker: MetricsBroker, logs_on_failure: None
) -> None:
    broker = dlq_broker
    topic, group = "orders-metrics", "g-metrics"
    create_topic(broker, topic)
    dlq_group(broker, group, copy=True, **{"share.delivery.count.limit": str(LIMIT)})
    sent = produce_orders(broker, topic, 8)
    rejected = {s.offset for s in sent[:3]}
    released = {s.offset for s in sent[3:5]}

    def decide(msg: Message) -> AcknowledgeType:
        if msg.offset() in rejected:
            return AcknowledgeType.REJECT
        if msg.offset() in released:
            return AcknowledgeType.RELEASE
        return AcknowledgeType.ACCEPT

    consumer = share_consumer(broker, group, [topic])
    try:
        consume(
            consumer,
            until=lambda lg: (
                all(lg.offsets().count((0, o)) >= LIMIT for o in released)
                and len(lg.deliveries) >= len(sent) + len(released)
            ),
            timeout=WAIT_S,
            decide=decide,
        )
    finally:
        close_quietly(consumer)
    copies_of(broker, group, {(topic, 0, o) for o in rejected | released})

    # The sink counts before the run is archived: wait for the archive's counters.
    by_reason = "spool_share_records_dead_lettered"
    labels = {"group": group, "topic": topic, "partition": "0", "outcome": "copied"}
    deadline = time.monotonic() + WAIT_S
    samples = broker.metrics()
    while time.monotonic() < deadline:
        if metric(samples, by_reason, group=group) >= len(rejected) + len(released):
            break
        time.sleep(0.2)
        samples = broker.metrics()
    assert metric(samples, by_reason, reason="rejected", **labels) == len(rejected)
    assert metric(samples, by_reason, reason="delivery_limit", **labels) == len(released)
    assert metric(samples, by_reason, group=group, outcome="not_copied") == 0
    kafka = "kafka_server_sharegroupmetrics_deadletterqueue"
    assert metric(samples, f"{kafka}recordcount", group=group) == len(rejected | released)
    assert metric(samples, f"{kafka}totalproducerequests", group=group) >= 1
    assert metric(samples, f"{kafka}failedproducerequests", group=group) == 0
    # A group that dead-letters nothing has no dead letters counted.
    assert metric(samples, by_reason, group="g-plain") == 0
    assert metric(samples, f"{kafka}recordcount", group="g-plain") == 0


# --- 5. kill -9 at each step of the copy ----------------------------------------------


@dataclass
class Decision:
    ack: AcknowledgeType
    delivery_count: int
    committed: bool  # commit_sync answered: the broker had it durably


@pytest.mark.parametrize("crash_at", ["dead-letter.before-copy", "dead-letter.after-copy"])
def test_a_kill_during_the_copy_loses_no_dead_letter_and_keeps_the_delivery_counts(
    broker_factory: Callable[..., Broker], crash_at: str
) -> None:
    broker = broker_factory(SETTINGS, env={CRASH_AT_ENV: crash_at})
    topic, group = "orders-crash", "g-crash"
    create_dlq(broker, DLQ, DLQ_PARTITIONS)
    create_topic(broker, topic)
    dlq_group(broker, group, copy=True)
    sent = produce_orders(broker, topic, 9)
    should_reject = {s.offset for i, s in enumerate(sent) if i % 3 == 0}
    decisions: dict[int, list[Decision]] = {}
    redelivered_after_commit: list[Delivery] = []

    def decide_all(consumer: Any, msgs: list[Message]) -> list[Decision]:
        made = []
        for msg in msgs:
            past = decisions.get(msg.offset(), [])
            if any(d.committed for d in past):
                redelivered_after_commit.append(
                    Delivery(msg.partition(), msg.offset(), msg.value(), msg.delivery_count())
                )
            ack = (
                AcknowledgeType.REJECT if msg.offset() in should_reject else AcknowledgeType.ACCEPT
            )
            consumer.acknowledge(msg, ack)
            d = Decision(ack, msg.delivery_count(), committed=False)
            decisions.setdefault(msg.offset(), []).append(d)
            made.append(d)
        return made

    # Until the crash: the first commit carrying a rejection kills the broker at the
    # crash point, right after the rejection's ARCHIVING state is durable.
    consumer = share_consumer(broker, group, [topic])
    log = PollLog()
    deadline = time.monotonic() + WAIT_S
    while broker.running and time.monotonic() < deadline:
        msgs = poll_once(consumer, log)
        if not msgs:
            continue
        made = decide_all(consumer, msgs)
        try:
            consumer.commit_sync(10.0)
        except KafkaException:
            continue  # the broker died under the commit: durable or not, unknown
        for d in made:
            d.committed = True
    assert broker.process is not None
    try:
        code = broker.process.wait(timeout=WAIT_S)
    except Exception as exc:
        raise AssertionError(f"the broker never reached {crash_at}\n{broker.log_tail()}") from exc
    assert code == -signal.SIGKILL, f"the broker exited with {code}, not at {crash_at}"
    assert any(d.ack == AcknowledgeType.REJECT for ds in decisions.values() for d in ds)

    # Restart without the crash point, on the same data (the same database).
    broker.env.pop(CRASH_AT_ENV)
    broker.start()
    close_quietly(consumer)

    consumer = share_consumer(broker, group, [topic])
    try:
        log = PollLog()
        deadline = time.monotonic() + WAIT_S
        quiet_until: float | None = None
        while time.monotonic() < deadline:
            if quiet_until is not None and time.monotonic() >= quiet_until:
                break
            msgs = poll_once(consumer, log)
            if msgs:
                made = decide_all(consumer, msgs)
                consumer.commit_sync(10.0)
                for d in made:
                    d.committed = True
            # Every record decided (a decision whose commit died may still be durable:
            # then the record never comes back), and a quiet while in which one that
            # was not would come back.
            if quiet_until is None and all(s.offset in decisions for s in sent):
                quiet_until = time.monotonic() + 2.0
        else:
            raise AssertionError(f"not every record was decided: {decisions}")
    finally:
        close_quietly(consumer)

    assert redelivered_after_commit == [], (
        f"records delivered again after a committed Accept/Reject: {redelivered_after_commit}"
    )
    # A decision whose commit died with the broker may come again, once: then the last
    # decision is the one that stands.
    final = {o: ds[-1] for o, ds in decisions.items()}
    rejected = {o for o, d in final.items() if d.ack == AcknowledgeType.REJECT}
    assert rejected == should_reject
    copies = copies_of(broker, group, {(topic, 0, o) for o in rejected})
    per_record = Counter(c.source[2] for c in copies)
    assert set(per_record) == rejected, f"copies of accepted records: {per_record}"
    if crash_at == "dead-letter.before-copy":
        assert set(per_record.values()) == {1}, per_record
    else:
        # The copy written before the crash is written again when ARCHIVING resumes.
        assert set(per_record.values()) <= {1, 2}, per_record
        assert 2 in per_record.values(), f"no copy was written twice: {per_record}"
    for c in copies:
        o = c.source[2]
        assert_context(c, topic, 0, o, group, final[o].delivery_count, REJECTED)
        assert_copied_record(c, sent[o], o)
    # Duplicates are the same record: same context headers, key, value, headers, time.
    for o, n in per_record.items():
        if n > 1:
            same = [c for c in copies if c.source[2] == o]
            assert len({(c.key, c.value, c.headers, c.timestamp) for c in same}) == 1, same
