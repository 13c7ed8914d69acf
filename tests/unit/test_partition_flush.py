"""A topic partition's append starts its fsync round at once; parked fetches are told of
the append once that round has begun on its thread, and the high watermark moves only
when it has ended well (flush.messages=1, the default)."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from broker.config import BrokerConfig
from broker.partitions import LogManager, Partition, validate_produce_data
from persister.clock import ManualClock
from persister.commit import GroupCommit
from protocol.errors import ErrorCode, KafkaError
from protocol.records import NewRecord, build_batch
from tests.unit.test_commit import until


class GatedFlush:
    """Stands in for the log's flush: each round waits for the test to open it."""

    def __init__(self, real: Callable[[], None]) -> None:
        self.real = real
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.error: OSError | None = None

    def __call__(self) -> None:
        self.entered.set()
        self.gate.wait(10)
        if self.error is not None:
            raise self.error
        self.real()

    def flush(self) -> None:  # a flush target of its own
        self()


@pytest.fixture
async def commit() -> AsyncIterator[GroupCommit]:
    # One flush thread: a test can keep it busy with another target's round.
    group = GroupCommit(threads=1)
    group.start()
    yield group
    await group.stop()


@pytest.fixture
async def partition(tmp_path: Path, commit: GroupCommit) -> AsyncIterator[Partition]:
    logs = LogManager(tmp_path, BrokerConfig({}), commit, ManualClock(now_ms=1_000_000))
    logs.open_topic("t", uuid.uuid4(), 1, {})
    found = logs.get("t", 0)
    assert found is not None
    try:
        yield found
    finally:
        vars(found.log).pop("flush", None)  # the real flush again, for the final one
        await logs.flush_all()
        logs.close()


def gate(partition: Partition) -> GatedFlush:
    """Hold the partition's log flush until the test opens the gate."""
    flush = GatedFlush(partition.log.flush)
    partition.log.flush = flush  # type: ignore[method-assign]
    return flush


async def turns(n: int = 5) -> None:
    """Let the event loop run what is ready (a ManualClock's timers fire synchronously
    in `advance`; the tasks they resume run on the next turns)."""
    for _ in range(n):
        await asyncio.sleep(0)


def append_one(partition: Partition) -> int:
    data, batches = validate_produce_data(build_batch([NewRecord(key=None, value=b"v")]))
    return partition.append(data, batches).last_offset


async def test_fetches_hear_of_an_append_once_its_fsync_has_begun(
    partition: Partition, commit: GroupCommit
) -> None:
    # The only flush thread is busy with another target's round.
    other = GatedFlush(lambda: None)
    busy = asyncio.create_task(commit.sync(other))
    await until(other.entered.is_set)
    flush = gate(partition)
    heard: list[int] = []
    partition.appends.add_listener(lambda: heard.append(partition.high_watermark))

    last = append_one(partition)
    assert commit.rounds == 2  # asked for at once, within the append
    await asyncio.sleep(0.05)
    assert heard == []  # no thread has the round yet: parked fetches are not told
    other.gate.set()
    await busy
    await until(lambda: bool(heard))
    assert heard == [0]  # told while the fsync runs, before the record is visible
    await until(flush.entered.is_set)
    assert partition.high_watermark == 0
    flush.gate.set()
    await partition.wait_durable(last, timeout_s=10)
    assert partition.high_watermark == last + 1


async def test_a_failed_fsync_leaves_the_high_watermark_and_fails_acks_all(
    partition: Partition,
) -> None:
    flush = gate(partition)
    flush.error = OSError(5, "Input/output error")
    told: list[int] = []
    partition.add_listener(lambda: told.append(partition.high_watermark))
    last = append_one(partition)
    flush.gate.set()
    with pytest.raises(KafkaError) as failure:
        await partition.wait_durable(last, timeout_s=10)
    assert failure.value.code == ErrorCode.kafka_storage_error
    assert partition.high_watermark == 0
    assert told == [0]  # listeners (parked fetches) told of the failure


async def test_an_append_while_the_flush_threads_stop_is_not_acknowledged(
    partition: Partition, commit: GroupCommit
) -> None:
    await commit.stop()
    last = append_one(partition)  # the flush is refused: the append itself still returns
    with pytest.raises(KafkaError) as failure:
        await partition.wait_durable(last, timeout_s=10)
    assert failure.value.code == ErrorCode.kafka_storage_error
    assert partition.high_watermark == 0
    commit.start()  # for the fixture's final flush


async def test_deliveries_resume_before_the_producers_waiting_on_the_same_fsync(
    partition: Partition,
) -> None:
    # As Kafka completes a partition's delayed fetches before its delayed produces when
    # the high watermark moves: a share fetch's records go out before the producers'
    # acks=all responses are built, however late the fetch began to wait.
    flush = gate(partition)
    last = append_one(partition)
    resumed: list[str] = []

    async def wait(name: str, *, delivery: bool) -> None:
        await partition.wait_durable(last, timeout_s=10, delivery=delivery)
        resumed.append(name)

    waiters = [
        asyncio.create_task(wait("producer 1", delivery=False)),
        asyncio.create_task(wait("producer 2", delivery=False)),
    ]
    await asyncio.sleep(0)
    waiters += [
        asyncio.create_task(wait("delivery 1", delivery=True)),
        asyncio.create_task(wait("delivery 2", delivery=True)),
    ]
    await asyncio.sleep(0)
    assert resumed == []
    flush.gate.set()
    await asyncio.gather(*waiters)
    assert resumed == ["delivery 1", "delivery 2", "producer 1", "producer 2"]


async def test_a_wait_for_an_fsync_that_does_not_end_times_out_and_stops_listening(
    partition: Partition,
) -> None:
    # The timeout is on the partition's (the broker's) clock: a ManualClock far from the
    # wall clock's time, which only the test moves.
    clock = partition.clock
    assert isinstance(clock, ManualClock)
    flush = gate(partition)
    last = append_one(partition)
    for delivery in (False, True):
        waiting = asyncio.create_task(partition.wait_durable(last, timeout_s=30, delivery=delivery))
        await turns()
        clock.advance(29_999)
        await turns()
        assert not waiting.done()  # the fsync is held: still waiting, 1 ms before
        clock.advance(1)
        await turns()
        assert waiting.done()
        with pytest.raises(KafkaError) as failure:
            waiting.result()
        assert failure.value.code == ErrorCode.request_timed_out
        assert "t-0" in (failure.value.message or "")
        assert clock.pending_timers == 0
    assert not partition._listeners._first and not partition._listeners._rest
    # A waiter cancelled with its request stops listening too.
    cancelled = asyncio.create_task(partition.wait_durable(last, timeout_s=10, delivery=True))
    await asyncio.sleep(0)
    assert partition._listeners._first
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert not partition._listeners._first
    assert clock.pending_timers == 0  # and its timeout timer is cancelled
    flush.gate.set()
    await partition.wait_durable(last, timeout_s=10)
    assert partition.high_watermark == last + 1


async def test_delete_records_answers_a_low_watermark_only_once_it_is_durable(
    partition: Partition,
) -> None:
    """Two DeleteRecords at once: the one finding the log start already moved by the
    other reports that low watermark, so it too waits for the flush that checkpoints it
    (it answered at once before, with a start offset a crash could take back)."""
    for _ in range(20):
        last = append_one(partition)
    await partition.wait_durable(last, timeout_s=10)
    flush = gate(partition)
    first = asyncio.ensure_future(partition.delete_records_before(10))
    await until(flush.entered.is_set)
    second = asyncio.ensure_future(partition.delete_records_before(5))
    await turns()
    assert not first.done() and not second.done()
    flush.gate.set()
    assert await asyncio.gather(first, second) == [10, 10]
    # Nothing left to make durable: a third answers without a flush.
    flush.entered.clear()
    assert await partition.delete_records_before(3) == 10
    assert not flush.entered.is_set()
