"""Time that decides behaviour is the broker's injected clock, never the wall clock: the
plain Fetch long poll (MaxWaitMs), acks=all's request timeout, the log retention check
(log.retention.check.interval.ms, retention.ms), the share-state compaction loop
(log.cleaner.backoff.ms) and the socket server's stop grace run on a ManualClock here,
with no sleeps.

The ManualClock starts years away from the wall clock's time and moves only when a test
advances it, so each test fails if the code read the real clock instead: a real timer
would not have fired after the advance, and a real `now` would be far past every
deadline before it.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from broker.authorizer import NO_AUTHORIZER, Authorizer
from broker.broker import compaction_loop, retention_loop
from broker.cluster import ClusterView
from broker.config import BrokerConfig
from broker.handlers.produce_fetch import fetch, produce
from broker.metrics import BrokerMetrics
from broker.partitions import LogManager, Partition, validate_produce_data
from broker.server import Server
from coordinator.transactions import TransactionCoordinator
from persister.clock import ManualClock, ms_of, sleep, wait_all
from persister.commit import GroupCommit
from persister.coordinator_log import MemoryRecordLog
from protocol import api
from protocol.errors import ErrorCode
from protocol.records import NewRecord, build_batch
from tests.unit.cluster_fakes import alone

TOPIC = "clocked"
# 2001-09-09: far from any wall clock a test runs under.
FAR_FROM_NOW_MS = 1_000_000_000_000


async def turns(n: int = 8) -> None:
    """Let the event loop run what is ready: a ManualClock fires its timers within
    `advance`, and the tasks they resume run on the loop's next turns."""
    for _ in range(n):
        await asyncio.sleep(0)


@dataclass
class Setup:
    clock: ManualClock
    logs: LogManager
    metadata: Any
    transactions: TransactionCoordinator
    authorizer: Authorizer = NO_AUTHORIZER
    cluster: ClusterView = field(default_factory=alone)

    @property
    def part(self) -> Partition:
        found = self.logs.get(TOPIC, 0)
        assert found is not None
        return found


@pytest.fixture(name="s")
async def setup(tmp_path: Path) -> AsyncIterator[Setup]:
    clock = ManualClock(now_ms=FAR_FROM_NOW_MS)
    commit = GroupCommit()
    commit.start()
    logs = LogManager(tmp_path, BrokerConfig({}), commit, clock)
    topic_id = uuid.uuid4()
    logs.open_topic(TOPIC, topic_id, 1, {"retention.ms": "60000", "segment.ms": "1000"})
    topic = SimpleNamespace(name=TOPIC, topic_id=topic_id, partitions=1)
    metadata = SimpleNamespace(
        state=SimpleNamespace(topics={TOPIC: topic}, topics_by_id={topic_id: topic})
    )
    ids = iter(range(7000, 8000))

    async def allocate() -> int:
        return next(ids)

    transactions = TransactionCoordinator(
        MemoryRecordLog(), allocate_producer_id=allocate, clock=clock
    )
    try:
        yield Setup(clock, logs, metadata, transactions)
    finally:
        part = logs.get(TOPIC, 0)
        if part is not None:
            vars(part.log).pop("flush", None)  # the real flush again, for the final one
        await logs.flush_all()
        logs.close()
        await commit.stop()


def ctx(version: int) -> Any:
    return SimpleNamespace(
        api_version=version, header=SimpleNamespace(client_id="unit"), listener="PLAINTEXT"
    )


def batch(clock: ManualClock) -> bytes:
    return build_batch([NewRecord(key=None, value=b"v")], default_timestamp=clock.now_ms())


async def append(s: Setup) -> int:
    data, batches = validate_produce_data(batch(s.clock))
    last = s.part.append(data, batches).last_offset
    await s.part.wait_durable(last, timeout_s=10)
    return last


# -- the helpers ---------------------------------------------------------------------


async def test_sleep_returns_when_the_clock_has_moved_on_and_not_before() -> None:
    clock = ManualClock(now_ms=FAR_FROM_NOW_MS)
    sleeping = asyncio.create_task(sleep(clock, 300_000))
    await turns()
    clock.advance(299_999)
    await turns()
    assert not sleeping.done()
    clock.advance(1)
    await turns()
    assert sleeping.done()
    # A cancelled sleep leaves no timer behind.
    cancelled = asyncio.create_task(sleep(clock, 1_000))
    await turns()
    assert clock.pending_timers == 1
    cancelled.cancel()
    await turns()
    assert cancelled.cancelled()
    assert clock.pending_timers == 0


async def test_wait_all_returns_when_all_are_done_or_with_the_pending_at_the_timeout() -> None:
    clock = ManualClock(now_ms=FAR_FROM_NOW_MS)
    loop = asyncio.get_running_loop()
    quick: asyncio.Future[None] = loop.create_future()
    stuck: asyncio.Future[None] = loop.create_future()
    waiting = asyncio.create_task(wait_all(clock, [quick, stuck], 5_000))
    await turns()
    quick.set_result(None)
    clock.advance(4_999)
    await turns()
    assert not waiting.done()
    clock.advance(1)
    await turns()
    assert waiting.result() == {stuck}
    assert not stuck.cancelled()  # left to the caller
    # All done before the timeout: returns at once, its timer cancelled.
    again = asyncio.create_task(wait_all(clock, [stuck], 5_000))
    await turns()
    stuck.set_result(None)
    await turns()
    assert again.result() == set()
    assert clock.pending_timers == 0


def test_a_timeout_in_seconds_is_whole_milliseconds_rounded_up() -> None:
    assert ms_of(0.5) == 500
    assert ms_of(1.1) == 1100  # not 1101: 1.1 * 1000 is 1100.0000000000002
    assert ms_of(0.0001) == 1  # never cut short to 0
    assert ms_of(-3) == 0


# -- Fetch long poll -----------------------------------------------------------------


def long_poll_fetch() -> Any:
    """Fetch v12 (names, no session) of partition 0 from offset 0: MinBytes 1, MaxWaitMs
    60 s, so with nothing to read it parks."""
    return api.build(
        api.request_class(1, 12),
        {
            "replica_id": -1,
            "max_wait": 60_000,
            "min_bytes": 1,
            "max_bytes": 1 << 20,
            "isolation_level": 0,
            "session_id": 0,
            "session_epoch": -1,
            "topics": [
                {
                    "topic": TOPIC,
                    "partitions": [
                        {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}
                    ],
                }
            ],
        },
    )


async def test_a_fetch_long_poll_is_answered_at_max_wait_ms_on_the_clock(s: Setup) -> None:
    req = long_poll_fetch()
    polling = asyncio.create_task(fetch(ctx(12), req, s))  # type: ignore[arg-type]
    await turns()
    s.clock.advance(59_999)
    await turns()
    assert not polling.done()  # parked until MaxWaitMs
    assert s.clock.pending_timers == 1  # its timeout is the clock's timer
    s.clock.advance(1)
    await turns()
    assert polling.done()
    assert polling.result() is not None  # answered (empty), not failed
    assert s.clock.pending_timers == 0


async def test_a_fetch_long_poll_ends_early_when_records_come(s: Setup) -> None:
    req = long_poll_fetch()
    polling = asyncio.create_task(fetch(ctx(12), req, s))  # type: ignore[arg-type]
    await turns()
    s.clock.advance(1_000)
    await append(s)  # the clock does not reach MaxWaitMs: the records end the wait
    await asyncio.wait_for(polling, timeout=10)  # a bound only, never reached when right
    assert s.clock.pending_timers == 0  # the timeout timer was cancelled


async def test_a_fetch_long_poll_is_answered_at_once_when_the_broker_stops(s: Setup) -> None:
    # A parked Fetch must not hold a shutdown for its MaxWaitMs: librdkafka consumers wait
    # 500 ms, but read_committed and hand-written clients ask for up to 30 s and more.
    req = long_poll_fetch()
    polling = asyncio.create_task(fetch(ctx(12), req, s))  # type: ignore[arg-type]
    await turns()
    s.clock.advance(1_000)
    await turns()
    assert not polling.done()
    s.logs.wake_fetches()  # Broker.stop's first step
    await turns()
    assert polling.done()  # the clock never reached MaxWaitMs
    assert polling.result() is not None  # answered (empty), not failed
    assert s.clock.pending_timers == 0


# -- acks=all request timeout ----------------------------------------------------------


class HeldFlush:
    """Stands in for the partition log's flush: holds every fsync until released."""

    def __init__(self, real: Callable[[], None]) -> None:
        self.real = real
        self.gate = threading.Event()
        self.error: OSError | None = None

    def __call__(self) -> None:
        self.gate.wait(10)
        if self.error is not None:
            raise self.error
        self.real()


def produce_request(s: Setup, timeout_ms: int) -> Any:
    return api.build(
        api.request_class(0, 9),
        {
            "acks": -1,
            "timeout": timeout_ms,
            "topic_data": [
                {"name": TOPIC, "partition_data": [{"index": 0, "records": batch(s.clock)}]}
            ],
        },
    )


async def test_acks_all_times_out_when_the_clock_passes_the_request_timeout(s: Setup) -> None:
    held = HeldFlush(s.part.log.flush)
    s.part.log.flush = held  # type: ignore[method-assign]
    req = produce_request(s, 30_000)
    producing = asyncio.create_task(produce(ctx(9), req, s))  # type: ignore[arg-type]
    try:
        await turns()
        s.clock.advance(29_999)
        await turns()
        assert not producing.done()  # the fsync is held: acks=all waits
        s.clock.advance(1)
        await turns()
        assert producing.done()
        answer = producing.result()
        assert answer is not None
        [topic] = answer.responses
        [entry] = topic.partition_responses
        assert entry.error_code == ErrorCode.request_timed_out
    finally:
        held.gate.set()
        await asyncio.wait_for(asyncio.shield(producing), timeout=10)
    await s.part.wait_durable(0, timeout_s=10)  # the write itself did complete
    assert s.part.high_watermark == 1


# -- log retention check -------------------------------------------------------------


async def test_retention_deletes_a_segment_at_the_first_check_past_retention_ms(
    s: Setup,
) -> None:
    await append(s)
    s.clock.advance(2_000)  # past segment.ms: the next append rolls a segment
    await append(s)
    checks: list[int] = []
    enforce = s.logs.enforce_retention

    def counted() -> int:
        checks.append(s.clock.now_ms())
        return enforce()

    s.logs.enforce_retention = counted  # type: ignore[method-assign]
    looping = asyncio.create_task(retention_loop(s.logs, s.clock, 10_000))
    try:
        await turns()
        # Checks at +10 s .. +50 s after the second append: the first record is 52 s
        # old at the last of them, inside retention.ms (60 s), so nothing is deleted.
        for check in range(1, 6):
            s.clock.advance(9_999)
            await turns()
            assert len(checks) == check - 1  # not before log.retention.check.interval.ms
            s.clock.advance(1)
            await turns()
            assert len(checks) == check
            assert s.part.log_start_offset == 0
        # The next check, 62 s after the first record: its segment goes.
        s.clock.advance(10_000)
        await turns()
        assert len(checks) == 6
        assert s.part.log_start_offset == 1
    finally:
        looping.cancel()
        await turns()
    assert looping.cancelled()
    assert s.clock.pending_timers == 0


# -- share-state compaction loop -----------------------------------------------------


class Compactions:
    def __init__(self) -> None:
        self.runs = 0
        self.fail_next = False

    async def compact(self) -> int:
        self.runs += 1
        if self.fail_next:
            self.fail_next = False
            raise OSError("disk full")
        return 2


async def test_share_state_compaction_runs_every_cleaner_backoff_on_the_clock() -> None:
    clock = ManualClock(now_ms=FAR_FROM_NOW_MS)
    compactions, metrics = Compactions(), BrokerMetrics()
    looping = asyncio.create_task(compaction_loop(compactions, clock, 15_000, metrics))
    try:
        await turns()
        clock.advance(14_999)
        await turns()
        assert compactions.runs == 0
        clock.advance(1)
        await turns()
        assert compactions.runs == 1
        assert metrics.compaction_segments_rewritten == 2
        # A failed run is counted and the loop goes on.
        compactions.fail_next = True
        clock.advance(15_000)
        await turns()
        assert (compactions.runs, metrics.compaction_failures) == (2, 1)
        clock.advance(15_000)
        await turns()
        assert (compactions.runs, metrics.compaction_runs) == (3, 3)
    finally:
        looping.cancel()
        await turns()
    assert clock.pending_timers == 0


async def test_a_one_partition_acks_all_produce_whose_fsync_fails_is_not_acknowledged(
    s: Setup,
) -> None:
    # The one-partition path awaits the durable wait in the request's own task; its
    # failure must reach the response as it does for a multi-partition produce.
    held = HeldFlush(s.part.log.flush)
    held.error = OSError(5, "Input/output error")
    held.gate.set()
    s.part.log.flush = held  # type: ignore[method-assign]
    answer = await asyncio.wait_for(produce(ctx(9), produce_request(s, 30_000), s), 10)  # type: ignore[arg-type]
    assert answer is not None
    [topic] = answer.responses
    [entry] = topic.partition_responses
    assert entry.error_code == ErrorCode.kafka_storage_error
    assert s.part.high_watermark == 0


# -- the socket server's stop grace ------------------------------------------------------


async def test_server_stop_cancels_requests_still_running_at_the_grace_on_the_clock() -> None:
    async def no_dispatch(*_: object) -> bytes | None:
        return None

    clock = ManualClock(now_ms=FAR_FROM_NOW_MS)
    server = Server("127.0.0.1", 0, no_dispatch, clock=clock)  # never started: no socket
    in_flight = asyncio.create_task(asyncio.Event().wait())  # a request that never ends
    server._tasks.add(in_flight)
    stopping = asyncio.create_task(server.stop(grace_s=10))
    await turns()
    clock.advance(9_999)
    await turns()
    assert not in_flight.done() and not stopping.done()  # still within the grace
    clock.advance(1)
    await turns()
    assert in_flight.cancelled()
    assert stopping.done()
    assert clock.pending_timers == 0
