"""GroupCommit: concurrent sync() calls share fsync rounds; errors reach their waiters."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from persister.commit import GroupCommit
from persister.file_log import LogConfig, PartitionLog
from tests.unit.test_log import NOW, make_batch, read_all


class GatedTarget:
    """A flush target whose flushes block until the test opens a gate, one per round."""

    def __init__(self) -> None:
        self.started = 0
        self.finished = 0
        self.gates: list[threading.Event] = []
        self.errors: dict[int, Exception] = {}
        self._lock = threading.Lock()

    def gate(self, round_number: int) -> threading.Event:
        with self._lock:
            while len(self.gates) < round_number:
                self.gates.append(threading.Event())
            return self.gates[round_number - 1]

    def flush(self) -> None:
        with self._lock:
            self.started += 1
            round_number = self.started
        self.gate(round_number).wait()
        self.finished += 1
        if round_number in self.errors:
            raise self.errors[round_number]


class CountingTarget:
    def __init__(self) -> None:
        self.flushes = 0

    def flush(self) -> None:
        self.flushes += 1

    def __eq__(self, other: object) -> bool:  # every instance "equal": identity must decide
        return isinstance(other, CountingTarget)

    def __hash__(self) -> int:
        return 0


async def until(condition: Callable[[], bool]) -> None:
    """Yield to the loop and the worker thread until `condition` holds (no timing assertion)."""
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition never became true")


@pytest.fixture
async def commit() -> AsyncIterator[GroupCommit]:
    group = GroupCommit()
    group.start()
    yield group
    await group.stop()


async def test_concurrent_syncs_share_fsync_rounds(commit: GroupCommit) -> None:
    target = GatedTarget()
    first = asyncio.create_task(commit.sync(target))
    await until(lambda: target.started == 1)
    rest = [asyncio.create_task(commit.sync(target)) for _ in range(99)]
    await asyncio.sleep(0)
    target.gate(1).set()
    target.gate(2).set()
    await asyncio.gather(first, *rest)
    assert target.started == 2  # 100 sync() calls, two fsync rounds
    assert commit.rounds == 2


async def test_sync_started_during_a_flush_waits_for_the_next_round(commit: GroupCommit) -> None:
    target = GatedTarget()
    early = asyncio.create_task(commit.sync(target))
    await until(lambda: target.started == 1)
    late = asyncio.create_task(commit.sync(target))
    await asyncio.sleep(0)
    target.gate(1).set()
    await early
    assert not late.done()
    await until(lambda: target.started == 2)
    assert not late.done()
    target.gate(2).set()
    await late
    assert target.finished == 2


async def test_flush_error_reaches_every_waiter_of_that_round(commit: GroupCommit) -> None:
    target = GatedTarget()
    target.errors[2] = OSError(5, "Input/output error")
    first = asyncio.create_task(commit.sync(target))
    await until(lambda: target.started == 1)
    failing = [asyncio.create_task(commit.sync(target)) for _ in range(5)]
    target.gate(1).set()
    await first
    await until(lambda: target.started == 2)
    after = asyncio.create_task(commit.sync(target))  # asks during the failing round
    await asyncio.sleep(0)
    target.gate(2).set()
    results = await asyncio.gather(*failing, return_exceptions=True)
    assert all(isinstance(r, OSError) for r in results)
    target.gate(3).set()
    await after  # the next round succeeds and serves later waiters
    assert target.started == 3


async def test_targets_are_told_apart_by_identity(commit: GroupCommit) -> None:
    a, b = CountingTarget(), CountingTarget()
    assert a == b
    await asyncio.gather(commit.sync(a), commit.sync(b))
    assert (a.flushes, b.flushes) == (1, 1)


async def test_cancelled_waiter_does_not_disturb_the_round(commit: GroupCommit) -> None:
    target = GatedTarget()
    first = asyncio.create_task(commit.sync(target))
    await until(lambda: target.started == 1)
    cancelled = asyncio.create_task(commit.sync(target))
    kept = asyncio.create_task(commit.sync(target))
    await asyncio.sleep(0)
    cancelled.cancel()
    target.gate(1).set()
    target.gate(2).set()
    await asyncio.gather(first, kept)
    assert cancelled.cancelled()
    assert target.started == 2


async def test_stop_finishes_running_rounds_and_refuses_new_syncs() -> None:
    commit = GroupCommit()
    with pytest.raises(RuntimeError):
        await commit.sync(CountingTarget())
    commit.start()
    target = GatedTarget()
    waiting = asyncio.create_task(commit.sync(target))
    await until(lambda: target.started == 1)
    stopping = asyncio.create_task(commit.stop())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError):
        await commit.sync(target)
    target.gate(1).set()
    await asyncio.gather(waiting, stopping)
    assert target.finished == 1


async def test_group_commit_makes_log_appends_durable(commit: GroupCommit, tmp_path: Path) -> None:
    plog = PartitionLog.open(tmp_path / "share-state", LogConfig(segment_bytes=500), NOW)

    async def produce(i: int) -> int:
        result = plog.append(make_batch(payload=40 + i), NOW)
        await commit.sync(plog)
        return result.first_offset

    offsets = await asyncio.gather(*(produce(i) for i in range(50)))
    assert sorted(offsets) == list(range(50))
    assert commit.rounds < 50
    content = read_all(plog)
    plog.close(clean=False)
    reopened = PartitionLog.open(tmp_path / "share-state", LogConfig(segment_bytes=500), NOW)
    assert read_all(reopened) == content
    reopened.close()


class Calls:
    """Records what a `request` is told, on the loop, in order."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.errors: list[BaseException | None] = []

    def started(self) -> None:
        self.events.append("started")

    def done(self, error: BaseException | None) -> None:
        self.events.append("done")
        self.errors.append(error)


async def test_request_is_told_when_its_round_has_begun_on_the_thread_then_its_outcome(
    commit: GroupCommit,
) -> None:
    target = GatedTarget()
    calls = Calls()
    commit.request(target, calls.done, started=calls.started)
    # The round started within the call: the thread is already asked to flush.
    assert commit.rounds == 1
    await until(lambda: calls.events == ["started"])
    # Told just before the thread enters flush(): the flush is not over, nor is it told.
    await until(lambda: target.started == 1)
    assert target.finished == 0 and calls.events == ["started"]
    target.gate(1).set()
    await until(lambda: calls.events == ["started", "done"])
    assert calls.errors == [None]


async def test_request_during_a_round_is_told_when_the_next_round_begins(
    commit: GroupCommit,
) -> None:
    target = GatedTarget()
    first, second = Calls(), Calls()
    commit.request(target, first.done, started=first.started)
    await until(lambda: first.events == ["started"])
    commit.request(target, second.done, started=second.started)
    await asyncio.sleep(0.01)
    assert second.events == []  # the running round may have begun before its data
    target.gate(1).set()
    await until(lambda: second.events == ["started"])
    assert first.events == ["started", "done"]
    await until(lambda: target.started == 2)
    assert second.events == ["started"]
    target.gate(2).set()
    await until(lambda: second.events == ["started", "done"])
    assert second.errors == [None]


async def test_request_of_a_failing_flush_is_started_then_told_the_error(
    commit: GroupCommit,
) -> None:
    target = GatedTarget()
    target.errors[1] = OSError(28, "No space left on device")
    calls = Calls()
    commit.request(target, calls.done, started=calls.started)
    target.gate(1).set()
    await until(lambda: "done" in calls.events)
    assert calls.events == ["started", "done"]
    assert isinstance(calls.errors[0], OSError) and calls.errors[0].errno == 28


async def test_a_callback_that_raises_does_not_strand_the_rounds_other_requests(
    commit: GroupCommit,
) -> None:
    target = GatedTarget()

    def broken(_error: BaseException | None) -> None:
        raise ValueError("a requester's bug")

    first = asyncio.create_task(commit.sync(target))
    await until(lambda: target.started == 1)
    # Both wait for round 2; the broken callback is told first.
    commit.request(target, broken)
    waiting = asyncio.create_task(commit.sync(target))
    await asyncio.sleep(0)
    target.gate(1).set()
    await first
    await until(lambda: target.started == 2)
    target.gate(2).set()
    await waiting
    # The round ended cleanly: the next request gets a round of its own.
    later = asyncio.create_task(commit.sync(target))
    await until(lambda: target.started == 3)
    target.gate(3).set()
    await later
