"""GroupTimers: the group coordinator's timed operations (Kafka's CoordinatorTimer) on
the coordinator runtime and a ManualClock: they fire at their deadline under the
group's key, a rescheduled or cancelled timer's operation never runs (not even one
that had fired and was waiting for the group), failures are retried or dropped as
Kafka's timer does."""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Callable, MutableMapping
from typing import Any

import pytest
from structlog.testing import capture_logs

from coordinator.group_timers import DEFAULT_RETRY_BACKOFF_MS, GroupTimers
from coordinator.runtime import CoordinatorRuntime
from persister.clock import ManualClock
from persister.coordinator_log import KeyValue, MemoryRecordLog
from protocol.errors import ErrorCode, KafkaError


class GatedLog(MemoryRecordLog):
    """Records in memory; a sync waits while the gate is closed, and fails with EIO
    as many times as `failures` says."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()
        self.failures = 0

    async def sync(self) -> None:
        await self.gate.wait()
        if self.failures:
            self.failures -= 1
            raise OSError(errno.EIO, "injected")


def timer_logs(logs: list[MutableMapping[str, Any]]) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"].startswith("group_timer_")]


class Harness:
    def __init__(self) -> None:
        self.clock = ManualClock()
        self.log = GatedLog()
        self.replayed: list[KeyValue] = []
        self.runtime: CoordinatorRuntime[KeyValue] = CoordinatorRuntime(
            "groups",
            self.log,
            encode=lambda kv: [kv],
            decode=lambda k, v: (k, v),
            replay=self.replayed.append,
            clock=self.clock,
        )
        self.runtime.load()
        self.timers: GroupTimers[KeyValue] = GroupTimers(self.runtime, self.clock)
        self.ran: list[str] = []

    def op(self, name: str) -> Callable[[], tuple[list[KeyValue], str]]:
        def run() -> tuple[list[KeyValue], str]:
            self.ran.append(name)
            return [(name.encode(), b"1")], name

        return run

    async def advance(self, ms: int) -> None:
        self.clock.advance(ms)
        await self.timers.drain()

    def at(self, ms: int) -> int:
        return self.clock.now_ms() + ms


@pytest.fixture
def h() -> Harness:
    return Harness()


async def test_fires_at_its_deadline_under_the_groups_key(h: Harness) -> None:
    h.timers.schedule(("session", "g", "m"), "g", h.at(1000), h.op("expire"))
    assert h.timers.is_scheduled(("session", "g", "m"))
    assert h.timers.deadline(("session", "g", "m")) == h.at(1000)
    await h.advance(999)
    assert h.ran == []
    await h.advance(1)
    assert h.ran == ["expire"]
    assert h.replayed == [(b"expire", b"1")]  # written and replayed as a request's
    assert len(h.timers) == 0 and not h.timers.is_scheduled(("session", "g", "m"))


async def test_applied_gets_the_response_after_replay(h: Harness) -> None:
    seen: list[tuple[str, int]] = []
    h.timers.schedule(
        ("join", "g"),
        "g",
        h.at(10),
        h.op("join"),
        applied=lambda r: seen.append((r, len(h.replayed))),
    )
    await h.advance(10)
    assert seen == [("join", 1)]


async def test_schedule_replaces_the_timer_with_the_same_key(h: Harness) -> None:
    key = ("session", "g", "m")
    h.timers.schedule(key, "g", h.at(1000), h.op("first"))
    await h.advance(500)
    h.timers.schedule(key, "g", h.at(1000), h.op("second"))  # a heartbeat pushed it out
    await h.advance(500)
    assert h.ran == []
    await h.advance(500)
    assert h.ran == ["second"]
    assert h.clock.pending_timers == 0


async def test_schedule_if_absent_keeps_the_scheduled_one(h: Harness) -> None:
    h.timers.schedule_if_absent(("regex", "g"), "g", h.at(100), h.op("first"))
    h.timers.schedule_if_absent(("regex", "g"), "g", h.at(50), h.op("second"))
    await h.advance(100)
    assert h.ran == ["first"]


async def test_cancel_cancel_group_and_cancel_all(h: Harness) -> None:
    h.timers.schedule(("session", "a", "m1"), "a", h.at(10), h.op("a-m1"))
    h.timers.schedule(("session", "a", "m2"), "a", h.at(10), h.op("a-m2"))
    h.timers.schedule(("join", "a"), "a", h.at(10), h.op("a-join"))
    h.timers.schedule(("session", "b", "m1"), "b", h.at(10), h.op("b-m1"))
    h.timers.schedule(("retention",), "", h.at(10), h.op("retention"))
    h.timers.cancel(("session", "a", "m1"))
    h.timers.cancel(("nothing",))  # unknown keys are no error
    h.timers.cancel_group("a")
    assert len(h.timers) == 2
    await h.advance(10)
    assert sorted(h.ran) == ["b-m1", "retention"]

    h.timers.schedule(("session", "b", "m1"), "b", h.at(10), h.op("again"))
    h.timers.schedule(("retention",), "", h.at(10), h.op("again"))
    h.timers.cancel_all()
    assert len(h.timers) == 0 and h.clock.pending_timers == 0
    await h.advance(10)
    assert sorted(h.ran) == ["b-m1", "retention"]


async def _hold_group(h: Harness, group_id: str) -> asyncio.Task[str]:
    """A request on `group_id` whose write waits for the gate: it holds the key."""
    h.log.gate.clear()
    holding = asyncio.ensure_future(h.runtime.run(group_id, h.op("request")))
    for _ in range(3):
        await asyncio.sleep(0)
    assert h.ran == ["request"]
    return holding


async def test_a_fired_timer_cancelled_while_it_waits_for_the_group_does_not_run(
    h: Harness,
) -> None:
    holding = await _hold_group(h, "g")
    h.timers.schedule(("session", "g", "m"), "g", h.at(10), h.op("expire"))
    h.clock.advance(10)
    await asyncio.sleep(0)
    assert h.timers.running == 1  # fired, queued behind the request
    assert h.timers.is_scheduled(("session", "g", "m"))  # until its operation starts
    h.timers.cancel(("session", "g", "m"))  # e.g. the member left meanwhile
    h.log.gate.set()
    await holding
    await h.timers.drain()
    assert h.ran == ["request"]


async def test_a_fired_timer_rescheduled_while_it_waits_runs_only_at_its_new_deadline(
    h: Harness,
) -> None:
    holding = await _hold_group(h, "g")
    h.timers.schedule(("session", "g", "m"), "g", h.at(10), h.op("stale"))
    h.clock.advance(10)
    await asyncio.sleep(0)
    h.timers.schedule(("session", "g", "m"), "g", h.at(1000), h.op("fresh"))  # a heartbeat
    h.log.gate.set()
    await holding
    await h.timers.drain()
    assert h.ran == ["request"]
    await h.advance(1000)
    assert h.ran == ["request", "fresh"]


async def test_an_operation_may_reschedule_its_own_key(h: Harness) -> None:
    def periodic() -> tuple[list[KeyValue], None]:
        h.ran.append("retention")
        h.timers.schedule(("retention",), "", h.at(100), periodic)
        return [], None

    h.timers.schedule(("retention",), "", h.at(100), periodic)
    await h.advance(100)
    await h.advance(100)
    assert h.ran == ["retention", "retention"]
    assert h.timers.is_scheduled(("retention",))


async def test_a_failed_write_is_retried_after_the_backoff(h: Harness) -> None:
    h.log.failures = 1
    with capture_logs() as logs:
        h.timers.schedule(("join", "g"), "g", h.at(10), h.op("complete-join"))
        await h.advance(10)
    assert h.ran == ["complete-join"] and h.replayed == []
    assert h.timers.deadline(("join", "g")) == h.at(DEFAULT_RETRY_BACKOFF_MS)
    assert [e["event"] for e in timer_logs(logs)] == ["group_timer_retried"]
    await h.advance(DEFAULT_RETRY_BACKOFF_MS)
    assert h.ran == ["complete-join", "complete-join"]
    assert h.replayed == [(b"complete-join", b"1")]
    assert len(h.timers) == 0


async def test_without_retry_a_failure_is_logged_and_dropped(h: Harness) -> None:
    h.log.failures = 1
    with capture_logs() as logs:
        h.timers.schedule(("sync", "g"), "g", h.at(10), h.op("sync"), retry=False)
        await h.advance(10)
    assert len(h.timers) == 0 and h.clock.pending_timers == 0
    assert [(e["event"], e["log_level"], e["group"]) for e in timer_logs(logs)] == [
        ("group_timer_failed", "error", "g")
    ]


async def test_an_operation_raising_is_logged_and_the_timers_go_on(h: Harness) -> None:
    def broken() -> tuple[list[KeyValue], None]:
        raise ValueError("a bug")

    with capture_logs() as logs:
        h.timers.schedule(("rebalance", "g", "m"), "g", h.at(10), broken, retry=False)
        h.timers.schedule(("rebalance", "g", "n"), "g", h.at(10), h.op("other"))
        await h.advance(10)
    assert h.ran == ["other"]
    assert [e["event"] for e in timer_logs(logs)] == ["group_timer_failed"]


async def test_an_inactive_coordinator_drops_the_operation_without_retry(h: Harness) -> None:
    h.timers.schedule(("session", "g", "m"), "g", h.at(10), h.op("expire"))
    h.runtime.unload("another broker leads the groups log")
    with capture_logs() as logs:
        await h.advance(10)
    assert h.ran == [] and len(h.timers) == 0
    assert not [e for e in timer_logs(logs) if e["log_level"] in ("info", "error")]


async def test_a_kafka_error_from_the_operation_is_retried(h: Harness) -> None:
    attempts: list[int] = []

    def flaky() -> tuple[list[KeyValue], None]:
        attempts.append(h.clock.now_ms())
        if len(attempts) == 1:
            raise KafkaError(ErrorCode.unknown_server_error, "once")
        return [], None

    start = h.clock.now_ms()
    h.timers.schedule(("initial-delay", "g"), "g", h.at(3000), flaky, retry_backoff_ms=50)
    await h.advance(3000)
    await h.advance(50)
    assert attempts == [start + 3000, start + 3050]
