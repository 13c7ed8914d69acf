"""Many share consumers over many one-partition topics at once: no ShareFetch waits on
another, every one is answered by its MaxWaitMs, and every record is delivered.

Each round: a fresh share group over eight fresh one-partition topics; a producer
starts writing to all of them while consumers join one after another, one leaves part
way (its close releases what it holds) and another joins, the consumers acknowledge
implicitly (on their next ShareFetch) or explicitly (ShareAcknowledge), so share
partitions are loaded, written and released by several requests at once, with session
partitions overlapping while the assignment moves. This is what once deadlocked two
ShareFetches, each holding share-partition locks the other waited for (Kafka's
SharePartition.maybeAcquireFetchLock only ever try-acquires a fetch lock).

The broker runs with `SPOOL_TRACE` set: after a clean stop, its trace has, per request,
when it was received and when its handler returned, so every ShareFetch and
ShareAcknowledge is checked broker-side: answered, and within MaxWaitMs plus a margin
for the machine being busy. A hung one is never answered (and then the broker cannot
stop cleanly, nor are the records of its partitions delivered).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import Producer, ShareConsumer

from tests.integration import share_helpers as share
from tests.integration.conftest import (
    CLIENT_LOGGER,
    Broker,
    BrokerError,
    create_topic,
    producer_config,
)

SHARE_FETCH = 78
SHARE_ACKNOWLEDGE = 79
ROUNDS = 3
TOPICS = 8
MAX_WAIT_MS = 500  # the consumers' fetch.wait.max.ms: ShareFetch MaxWaitMs
# Slack over MaxWaitMs for a broker sharing a busy machine (fsyncs, event-loop turns).
MARGIN_MS = 2_000
PRODUCE_S = 3.0
RECORDS_PER_TOPIC_PER_TICK = 2
TICK_S = 0.02
DELIVER_TIMEOUT_S = 20.0


@dataclass
class Round:
    topics: list[str]
    group: str
    produced: set[bytes] = field(default_factory=set)
    delivered: set[bytes] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def missing(self) -> set[bytes]:
        with self.lock:
            return self.produced - self.delivered


def _produce(broker: Broker, rnd: Round, stop: threading.Event) -> None:
    producer = Producer(producer_config(broker, **{"linger.ms": 2}))

    def delivered(err: object, msg: object) -> None:
        if err is None:
            with rnd.lock:
                rnd.produced.add(msg.value())  # type: ignore[attr-defined]
        else:
            rnd.errors.append(f"produce: {err}")

    i = 0
    deadline = time.monotonic() + PRODUCE_S
    while time.monotonic() < deadline and not stop.is_set():
        for topic in rnd.topics:
            for _ in range(RECORDS_PER_TOPIC_PER_TICK):
                value = f"{topic}:{i}".encode()
                i += 1
                producer.produce(topic, value, partition=0, on_delivery=delivered)
        producer.poll(0)
        time.sleep(TICK_S)
    assert producer.flush(30) == 0, "producer could not flush within 30 s"


def _consume(
    broker: Broker,
    rnd: Round,
    mode: str,
    leave: threading.Event,
    ready: threading.Event,
) -> None:
    consumer: ShareConsumer = share.share_consumer(
        broker,
        rnd.group,
        rnd.topics,
        mode,
        **{"fetch.wait.max.ms": MAX_WAIT_MS, "logger": CLIENT_LOGGER},
    )
    log = share.PollLog()
    try:
        ready.set()
        while not leave.is_set():
            msgs = share.poll_once(consumer, log, share.POLL_S)
            if mode == "explicit" and msgs:
                for msg in msgs:
                    consumer.acknowledge(msg)
                consumer.commit_sync()
            with rnd.lock:
                rnd.delivered.update(m.value() for m in msgs)
    finally:
        rnd.errors += [f"consumer: {e}" for e in log.errors]
        share.close_quietly(consumer)


def _start(target: Callable[[], None]) -> threading.Thread:
    failures: list[BaseException] = []

    def run() -> None:
        try:
            target()
        except BaseException as exc:  # reported by the round
            failures.append(exc)
            raise

    thread = threading.Thread(target=run, daemon=True)
    thread.failures = failures  # type: ignore[attr-defined]
    thread.start()
    return thread


def _run_round(broker: Broker, n: int) -> Round:
    rnd = Round([f"conc-{n}-{t}" for t in range(TOPICS)], f"conc-group-{n}")
    for topic in rnd.topics:
        create_topic(broker, topic)
    share.earliest(broker, rnd.group)
    stop = threading.Event()
    consumers: list[tuple[threading.Thread, threading.Event]] = []

    def join(mode: str) -> None:
        leave, ready = threading.Event(), threading.Event()
        thread = _start(lambda: _consume(broker, rnd, mode, leave, ready))
        consumers.append((thread, leave))
        assert ready.wait(10), "a ShareConsumer did not start"

    # Members join while the producer starts; one leaves part way and another joins.
    producer = _start(lambda: _produce(broker, rnd, stop))
    for mode in ("implicit", "explicit", "implicit"):
        join(mode)
        time.sleep(0.3)
    time.sleep(0.5)
    consumers[0][1].set()  # the first member leaves (close: its records are released)
    join("explicit")
    time.sleep(0.5)
    join("implicit")
    producer.join(PRODUCE_S + 40)
    assert not producer.is_alive(), "the producer did not finish"
    assert not producer.failures, producer.failures  # type: ignore[attr-defined]
    deadline = time.monotonic() + DELIVER_TIMEOUT_S
    while rnd.missing() and time.monotonic() < deadline:
        time.sleep(0.1)
    for _, leave in consumers:
        leave.set()
    for thread, _ in consumers:
        thread.join(40)
        assert not thread.is_alive(), "a ShareConsumer did not stop"
        assert not thread.failures, thread.failures  # type: ignore[attr-defined]
    return rnd


def _answer_times(trace_path: Path) -> tuple[dict[int, list[float]], list[tuple[int, int, int]]]:
    """Per api key (ShareFetch, ShareAcknowledge) the handler times in ms; and the
    requests received that were never answered."""
    received: dict[tuple[int, int, int], int] = {}
    handled: dict[tuple[int, int, int], int] = {}
    for line in trace_path.read_text().splitlines():
        event = json.loads(line)
        request = event.get("r")
        if request is None or request[2] not in (SHARE_FETCH, SHARE_ACKNOWLEDGE):
            continue
        key = (request[0], request[1], request[2])
        if event["e"] == "request_received":
            received[key] = event["t"]
        elif event["e"] == "handled":
            handled[key] = event["t"]
    times: dict[int, list[float]] = {SHARE_FETCH: [], SHARE_ACKNOWLEDGE: []}
    unanswered = []
    for key, at in received.items():
        if key not in handled:
            unanswered.append(key)
            continue
        times[key[2]].append((handled[key] - at) / 1e6)
    return times, unanswered


def test_concurrent_share_fetches_are_answered_by_max_wait_and_deliver_everything(
    broker_factory: Callable[..., Broker], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace_path = tmp_path / "trace.jsonl"
    monkeypatch.setenv("SPOOL_TRACE", str(trace_path))
    broker = broker_factory()
    monkeypatch.delenv("SPOOL_TRACE")
    missing = {}
    for n in range(ROUNDS):
        rnd = _run_round(broker, n)
        assert rnd.produced, "nothing was produced"
        if rnd.missing():
            missing[n] = (len(rnd.missing()), len(rnd.produced), sorted(rnd.missing())[:3])
    # A clean stop writes the trace; a ShareFetch hung on a lock may keep it from stopping.
    try:
        broker.stop(timeout=20)
    except BrokerError as exc:
        pytest.fail(f"the broker did not stop cleanly; undelivered per round {missing}: {exc}")
    times, unanswered = _answer_times(trace_path)
    assert not unanswered and not missing, (
        f"{len(unanswered)} share requests never answered (connection, correlation id, api "
        f"key): {unanswered[:5]}; undelivered records per round (count, of, e.g.): {missing}"
    )
    fetches = times[SHARE_FETCH]
    assert len(fetches) > 100, f"only {len(fetches)} ShareFetches: the test drove too little"
    late = sorted(t for t in fetches if t > MAX_WAIT_MS + MARGIN_MS)
    assert not late, (
        f"{len(late)} of {len(fetches)} ShareFetches answered after MaxWaitMs "
        f"{MAX_WAIT_MS} + {MARGIN_MS} ms: {late[-5:]}"
    )
    late_acks = sorted(t for t in times[SHARE_ACKNOWLEDGE] if t > MARGIN_MS)
    assert not late_acks, f"ShareAcknowledges answered after {MARGIN_MS} ms: {late_acks[-5:]}"
    print(
        f"ShareFetch answers: {len(fetches)}, slowest {max(fetches):.0f} ms; "
        f"ShareAcknowledge answers: {len(times[SHARE_ACKNOWLEDGE])}, slowest "
        f"{max(times[SHARE_ACKNOWLEDGE], default=0):.0f} ms"
    )
