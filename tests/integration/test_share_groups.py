"""KIP-932 share groups end to end: the real broker process and real ShareConsumers.

Each test starts its own broker (settings through `broker_factory`), produces with a
plain Producer and consumes with confluent-kafka's ShareConsumer. Consumers shared by
threads are never shared between threads: one ShareConsumer per thread. Waits are
bounded; nothing here measures speed.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable

import pytest
from confluent_kafka import AcknowledgeType, Message, Producer

from tests.integration.conftest import (
    BOTH_STORAGES,
    REPO_ROOT,
    Broker,
    create_topic,
    producer_config,
)
from tests.integration.share_helpers import (
    Delivery,
    PollLog,
    accept_all,
    close_quietly,
    consume,
    describe_share_group,
    earliest,
    log_lines,
    never,
    poll_once,
    produce_values,
    set_group_configs,
    share_consumer,
    share_consumer_config,
    wait_for_members,
)

SHORT_LOCK = {
    "group.share.min.record.lock.duration.ms": "1000",
    "group.share.record.lock.duration.ms": "2000",
}
SHORT_LOCK_S = 2.0


def values(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(n)]


def diagnostics(broker: Broker, group: str) -> str:
    """The broker's share-group log lines for `group`, for assertion messages."""
    lines = log_lines(broker, f"group={group}")
    return "\nbroker log for the group:\n" + "\n".join(lines[-40:])


def run_consumer_threads(
    count: int,
    body: Callable[[int, threading.Event], PollLog],
    stop: threading.Event,
    join_timeout: float,
) -> list[PollLog]:
    """Run `body(index, stop)` in `count` threads; each builds and owns its consumer."""
    logs: list[PollLog | None] = [None] * count
    failures: list[BaseException] = []

    def run(i: int) -> None:
        try:
            logs[i] = body(i, stop)
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)
            stop.set()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + join_timeout
    for t in threads:
        t.join(max(deadline - time.monotonic(), 0.1))
    stop.set()
    assert not any(t.is_alive() for t in threads), "consumer threads did not finish"
    if failures:
        raise failures[0]
    return [lg for lg in logs if lg is not None]


def shared_consumption(
    broker: Broker,
    group: str,
    topic: str,
    consumers: int,
    records: list[bytes],
    partitions: int,
) -> list[PollLog]:
    """`consumers` explicit-mode ShareConsumers (threads) accept everything they get.

    The records are produced only once every consumer is an assigned member, in small
    flushed batches, and each consumer takes at most 10 records a poll and pauses a
    little after each, so a single fast consumer cannot take all the work by itself.
    Stops once every record was accepted, plus a short quiet period that would show
    duplicates.
    """
    earliest(broker, group)
    stop = threading.Event()
    lock = threading.Lock()
    accepted: set[bytes | None] = set()
    everything = set(records)
    all_done = threading.Event()

    def body(_i: int, stop: threading.Event) -> PollLog:
        consumer = share_consumer(broker, group, [topic], **{"max.poll.records": 10})

        def decide(msg: Message) -> AcknowledgeType:
            with lock:
                accepted.add(msg.value())
                if accepted >= everything:
                    all_done.set()
            return AcknowledgeType.ACCEPT

        try:
            return consume(
                consumer,
                until=lambda _log: stop.is_set(),
                timeout=90,
                decide=decide,
                after_poll=lambda: time.sleep(0.02),
            )
        finally:
            close_quietly(consumer)

    def producer() -> None:
        wait_for_members(broker, group, consumers)
        producer = Producer(producer_config(broker))
        for start in range(0, len(records), 10):
            chunk = records[start : start + 10]
            partition = (start // 10) % partitions
            produce_values(broker, topic, chunk, partition=partition, producer=producer)
        all_done.wait(60)
        time.sleep(1.5)  # a quiet period in which a duplicate delivery would show up
        stop.set()

    feeder = threading.Thread(target=producer, daemon=True)
    feeder.start()
    logs = run_consumer_threads(consumers, body, stop, join_timeout=120)
    feeder.join(10)
    return logs


@BOTH_STORAGES
@pytest.mark.timeout(180)
def test_consumers_sharing_one_partition_each_record_is_accepted_exactly_once(
    broker: Broker,
) -> None:
    topic, group = "shared-one", "g-shared-one"
    create_topic(broker, topic, partitions=1)
    records = values("r", 300)
    logs = shared_consumption(broker, group, topic, 3, records, partitions=1)

    assert len(logs) == 3
    delivered = Counter(v for lg in logs for v in lg.values())
    duplicates = {v: n for v, n in delivered.items() if n > 1}
    missing = set(records) - set(delivered)
    assert not missing, f"{len(missing)} records never delivered{diagnostics(broker, group)}"
    assert not duplicates, f"delivered more than once: {list(duplicates.items())[:10]}"
    assert sorted(delivered) == sorted(records)
    assert all(d.delivery_count == 1 for lg in logs for d in lg.deliveries)
    busy = [len(lg.deliveries) for lg in logs]
    assert sum(1 for n in busy if n > 0) > 1, f"only one consumer got work: {busy}"


@BOTH_STORAGES
@pytest.mark.timeout(120)
def test_released_record_returns_with_count_two_and_rejected_record_never_returns(
    broker_factory: Callable[..., Broker],
) -> None:
    # A short lock: a record whose Reject or Accept was lost would come back in 2 s.
    broker = broker_factory(SHORT_LOCK)
    topic, group = "release-reject", "g-release-reject"
    create_topic(broker, topic)
    earliest(broker, group)
    sent = produce_values(broker, topic, values("m", 10))
    release_at, reject_at = sent[2].offset, sent[5].offset

    consumer = share_consumer(broker, group, [topic])
    try:

        def decide(msg: Message) -> AcknowledgeType:
            if msg.offset() == release_at and msg.delivery_count() == 1:
                return AcknowledgeType.RELEASE
            if msg.offset() == reject_at:
                return AcknowledgeType.REJECT
            return AcknowledgeType.ACCEPT

        log = consume(
            consumer,
            until=lambda lg: (0, release_at) in lg.offsets()[10:],
            timeout=30,
            decide=decide,
        )
        first_ten = sorted(d.offset for d in log.deliveries[:10])
        assert first_ten == [s.offset for s in sent], f"{log}{diagnostics(broker, group)}"
        redelivered = [d for d in log.deliveries[10:] if d.offset == release_at]
        assert redelivered, f"released record never came back: {log}"
        assert redelivered[0].delivery_count == 2
        assert redelivered[0].value == sent[2].value

        # A record produced now arrives; by then, and for well over a lock duration
        # after it, neither the rejected nor the accepted records come back.
        tail = produce_values(broker, topic, [b"sentinel"])[0]
        after = len(log.deliveries)
        consume(
            consumer,
            until=lambda lg: (0, tail.offset) in lg.offsets()[after:],
            timeout=30,
            decide=accept_all,
            log=log,
        )
        consume(
            consumer, until=lambda _lg: False, timeout=3 * SHORT_LOCK_S, decide=accept_all, log=log
        )
        later = [d.offset for d in log.deliveries[after:]]
        assert later == [tail.offset], (
            f"records came back after Accept/Reject: {later}{diagnostics(broker, group)}"
        )
        assert Counter(d.offset for d in log.deliveries) == Counter(
            {**{s.offset: 1 for s in sent}, release_at: 2, tail.offset: 1}
        )
    finally:
        close_quietly(consumer)


HOLD_AND_DIE = r"""
import json, os, signal, sys, time
from confluent_kafka import ShareConsumer
conf, topic = json.loads(sys.argv[1]), sys.argv[2]
consumer = ShareConsumer(conf)
consumer.subscribe([topic])
got = []
deadline = time.monotonic() + 30
while not got and time.monotonic() < deadline:
    for m in consumer.poll(0.5):
        if m.error() is None:
            got.append([m.partition(), m.offset(), m.delivery_count()])
print(json.dumps(got), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@BOTH_STORAGES
@pytest.mark.timeout(120)
def test_records_held_by_a_killed_consumer_are_redelivered_to_another(
    broker_factory: Callable[..., Broker],
) -> None:
    # A short lock, so they come back soon even if the broker waits for it to expire
    # (it may release them earlier, when the dead connection is noticed).
    broker = broker_factory(SHORT_LOCK)
    topic, group = "killed-holder", "g-killed-holder"
    create_topic(broker, topic)
    earliest(broker, group)
    sent = produce_values(broker, topic, values("h", 20))

    conf = share_consumer_config(broker, group, "explicit")
    proc = subprocess.run(
        [sys.executable, "-c", HOLD_AND_DIE, json.dumps(conf), topic],
        cwd=REPO_ROOT,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == -9, proc.stderr.decode(errors="replace")[-2000:]
    held = {(p, o): dc for p, o, dc in json.loads(proc.stdout.decode().strip().splitlines()[-1])}
    assert held, "the doomed consumer got nothing"
    assert set(held.values()) == {1}

    consumer = share_consumer(broker, group, [topic])
    try:
        log = consume(
            consumer,
            until=lambda lg: set(held) <= set(lg.offsets()),
            timeout=30,
            decide=accept_all,
        )
    finally:
        close_quietly(consumer)
    got = {d.key: d for d in log.deliveries}
    missing = sorted(set(held) - set(got))
    assert not missing, f"held records never redelivered: {missing}{diagnostics(broker, group)}"
    assert all(got[k].delivery_count == 2 for k in held), [got[k] for k in held]
    assert {d.key for d in log.deliveries} == {(0, s.offset) for s in sent}


@BOTH_STORAGES
@pytest.mark.timeout(120)
def test_record_released_every_time_is_delivered_limit_times_then_archived(
    broker_factory: Callable[..., Broker],
) -> None:
    limit = 3
    broker = broker_factory({**SHORT_LOCK, "group.share.delivery.count.limit": str(limit)})
    topic, group = "release-loop", "g-release-loop"
    create_topic(broker, topic)
    set_group_configs(
        broker,
        group,
        {"share.auto.offset.reset": "earliest", "share.delivery.count.limit": str(limit)},
    )
    sent = produce_values(broker, topic, values("x", 5))
    offsets = [s.offset for s in sent]

    consumer = share_consumer(broker, group, [topic])
    try:
        log = consume(
            consumer,
            until=lambda lg: all(lg.offsets().count((0, o)) >= limit for o in offsets),
            timeout=30,
            decide=lambda _m: AcknowledgeType.RELEASE,
        )
        counts = Counter(d.offset for d in log.deliveries)
        assert counts == Counter({o: limit for o in offsets}), (
            f"{counts}{diagnostics(broker, group)}"
        )
        for o in offsets:
            seen = [d.delivery_count for d in log.deliveries if d.offset == o]
            assert seen == list(range(1, limit + 1)), (o, seen)

        # Archived: a record produced now is delivered, the archived ones never again,
        # not even after several lock durations.
        tail = produce_values(broker, topic, [b"after"])[0]
        before = len(log.deliveries)
        consume(
            consumer,
            until=lambda lg: (0, tail.offset) in lg.offsets()[before:],
            timeout=30,
            decide=lambda _m: AcknowledgeType.RELEASE,
            log=log,
        )
        consume(
            consumer,
            until=lambda _lg: False,
            timeout=3 * SHORT_LOCK_S,
            decide=lambda m: (
                AcknowledgeType.RELEASE if m.offset() == tail.offset else AcknowledgeType.ACCEPT
            ),
            log=log,
        )
        later = [d.offset for d in log.deliveries[before:]]
        assert [o for o in later if o in offsets] == [], (
            f"archived records delivered again: {later}{diagnostics(broker, group)}"
        )
        assert tail.offset in later
    finally:
        close_quietly(consumer)


@pytest.mark.timeout(120)
def test_latest_group_sees_only_new_records_and_earliest_group_sees_all(
    broker: Broker,
) -> None:
    topic = "reset"
    create_topic(broker, topic)
    old = values("old", 10)
    produce_values(broker, topic, old)
    earliest(broker, "g-earliest")

    latest_c = share_consumer(broker, "g-latest", [topic], "implicit")
    earliest_c = share_consumer(broker, "g-earliest", [topic], "implicit")
    try:
        latest_log, earliest_log = PollLog(), PollLog()
        # Both groups exist and have fetched (their share-partitions are initialized)
        # before anything new is produced.
        for group, consumer, log in (
            ("g-latest", latest_c, latest_log),
            ("g-earliest", earliest_c, earliest_log),
        ):
            wait_for_members(broker, group, 1)
            for _ in range(40):
                if log_lines(broker, "share_partition_initialized", f"group={group}"):
                    break
                poll_once(consumer, log)
            else:
                raise AssertionError(f"{group} never initialized{diagnostics(broker, group)}")
        new = values("new", 10)
        produce_values(broker, topic, new)
        consume(latest_c, until=lambda lg: len(lg.deliveries) >= 10, timeout=30, log=latest_log)
        consume(earliest_c, until=lambda lg: len(lg.deliveries) >= 20, timeout=30, log=earliest_log)
        # Keep polling briefly: nothing else may turn up.
        consume(latest_c, until=lambda _lg: False, timeout=1.5, log=latest_log)
        consume(earliest_c, until=lambda _lg: False, timeout=1.5, log=earliest_log)
        assert latest_log.values() == new, diagnostics(broker, "g-latest")
        assert earliest_log.values() == old + new, diagnostics(broker, "g-earliest")
    finally:
        close_quietly(latest_c)
        close_quietly(earliest_c)


@pytest.mark.timeout(180)
def test_more_consumers_than_partitions_all_get_work(broker: Broker) -> None:
    topic, group = "shared-two", "g-shared-two"
    create_topic(broker, topic, partitions=2)
    records = values("p", 400)
    logs = shared_consumption(broker, group, topic, 4, records, partitions=2)

    assert len(logs) == 4
    busy = [len(lg.deliveries) for lg in logs]
    assert all(n > 0 for n in busy), (
        f"deliveries per consumer {busy}; group {describe_share_group(broker, group)}"
    )
    delivered = Counter(v for lg in logs for v in lg.values())
    assert sorted(delivered) == sorted(records), (
        f"missing {len(set(records) - set(delivered))}, "
        f"duplicates {[v for v, n in delivered.items() if n > 1][:10]}"
    )


@BOTH_STORAGES
@pytest.mark.timeout(120)
def test_member_leaving_releases_its_records_at_once(
    broker_factory: Callable[..., Broker],
) -> None:
    lock_ms = 60_000
    broker = broker_factory(
        {
            "group.share.record.lock.duration.ms": str(lock_ms),
            "group.share.max.record.lock.duration.ms": str(2 * lock_ms),
        }
    )
    topic, group = "leaver", "g-leaver"
    create_topic(broker, topic)
    earliest(broker, group)
    sent = produce_values(broker, topic, values("l", 20))

    holder = share_consumer(broker, group, [topic])
    taker = share_consumer(broker, group, [topic])
    held: list[Delivery] = []
    try:
        held_log = consume(holder, until=lambda lg: bool(lg.deliveries), timeout=30)
        held = held_log.deliveries
        assert held, f"the holder got nothing{diagnostics(broker, group)}"
    finally:
        # close() without acknowledging: the share session closes and the member leaves.
        close_quietly(holder)
    closed_at = time.monotonic()
    assert {d.delivery_count for d in held} == {1}

    try:
        log = consume(
            taker,
            until=lambda lg: {d.key for d in held} <= set(lg.offsets()),
            timeout=10,
            decide=accept_all,
        )
        waited = time.monotonic() - closed_at
    finally:
        close_quietly(taker)
    got = {d.key: d for d in log.deliveries}
    missing = sorted({d.key for d in held} - set(got))
    assert not missing, (
        f"{len(missing)} of {len(held)} records of the departed member not redelivered "
        f"within 10 s of its close (lock {lock_ms} ms): {missing[:10]}"
        f"{diagnostics(broker, group)}"
    )
    assert waited < lock_ms / 1000
    assert all(got[d.key].delivery_count == 2 for d in held)
    assert {d.key for d in log.deliveries} | {d.key for d in held} == {(0, s.offset) for s in sent}


@pytest.mark.timeout(60)
def test_share_fetches_that_acquire_nothing_are_answered_without_server_error(
    broker: Broker,
) -> None:
    """An idle session-opening ShareFetch, and acknowledgements riding on a ShareFetch
    that then finds nothing new, must both get a normal (empty) answer."""
    topic, group = "idle", "g-idle"
    create_topic(broker, topic)
    earliest(broker, group)
    consumer = share_consumer(broker, group, [topic], "implicit")
    try:
        log = consume(consumer, until=never, timeout=2.0)  # nothing to fetch yet
        produce_values(broker, topic, values("i", 5))
        consume(consumer, until=lambda lg: len(lg.deliveries) >= 5, timeout=30, log=log)
        # The next fetches carry the implicit Accepts; no records are left to acquire.
        consume(consumer, until=never, timeout=2.0, log=log)
    finally:
        close_quietly(consumer)
    failures = log_lines(broker, "request_failed")
    assert failures == [], (
        f"{len(failures)} requests failed inside the broker:\n"
        + "\n".join(failures[:5])
        + "\n"
        + "\n".join(log_lines(broker, "Error")[:5])
    )
    assert log.errors == []
    assert log.values() == values("i", 5)


@pytest.mark.timeout(60)
def test_records_acquired_on_one_partition_arrive_when_another_partition_is_empty(
    broker_factory: Callable[..., Broker],
) -> None:
    """One ShareFetch covers both partitions of the session: records acquired on the
    busy one must reach the consumer then, not after their lock expires."""
    lock_ms = 30_000
    broker = broker_factory({"group.share.record.lock.duration.ms": str(lock_ms)})
    topic, group = "half-empty", "g-half-empty"
    create_topic(broker, topic, partitions=2)
    earliest(broker, group)
    sent = produce_values(broker, topic, values("b", 20), partition=0)
    consumer = share_consumer(broker, group, [topic], "implicit")
    try:
        start = time.monotonic()
        log = consume(consumer, until=lambda lg: len(lg.deliveries) >= 20, timeout=10)
        waited = time.monotonic() - start
    finally:
        close_quietly(consumer)
    assert sorted(log.offsets()) == [(0, s.offset) for s in sent], (
        f"got {len(log.deliveries)} of 20 records within 10 s (lock {lock_ms} ms)"
        f"{diagnostics(broker, group)}\n" + "\n".join(log_lines(broker, "request_failed")[:3])
    )
    assert waited < lock_ms / 1000


@pytest.mark.timeout(120)
def test_describe_shows_members_assignments_and_state(broker: Broker) -> None:
    """confluent-kafka 2.16 has no share-group admin call (no describe_share_groups;
    list_consumer_groups leaves share groups out), so ShareGroupDescribe goes over the
    wire with spool's own codec."""
    topic, group = "described", "g-described"
    create_topic(broker, topic, partitions=2)
    consumers = [share_consumer(broker, group, [topic], "implicit") for _ in range(2)]
    try:
        stop = threading.Event()

        def keep_polling(i: int, stop: threading.Event) -> PollLog:
            log = PollLog()
            deadline = time.monotonic() + 60
            while not stop.is_set() and time.monotonic() < deadline:
                poll_once(consumers[i], log, 0.2)
            return log

        poller = threading.Thread(
            target=run_consumer_threads, args=(2, keep_polling, stop, 70), daemon=True
        )
        poller.start()
        try:
            info = wait_for_members(broker, group, 2)
            # Both members reach the final assignment once they have heartbeated.
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                parts = sorted(p for m in info.members for p in m.assignment.get(topic, ()))
                if parts == [0, 1]:
                    break
                time.sleep(0.2)
                info = describe_share_group(broker, group)
        finally:
            stop.set()
            poller.join(30)
        assert info.error_code == 0
        assert info.group_id == group
        assert info.state.lower() == "stable"
        assert info.assignor == "simple"
        assert len({m.member_id for m in info.members}) == 2
        assert all(m.subscribed == (topic,) for m in info.members)
        assert all(m.member_epoch > 0 for m in info.members)
        assert sorted(p for m in info.members for p in m.assignment[topic]) == [0, 1]
    finally:
        for c in consumers:
            close_quietly(c)
    # Empty once both left (Kafka keeps the group).
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        info = describe_share_group(broker, group)
        if not info.members:
            break
        time.sleep(0.2)
    assert info.members == () and info.state.lower() == "empty", info
