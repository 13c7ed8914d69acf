"""Bounded stopping (broker.tasks): a step that does not end is given up and named, and
a task that swallows a cancellation is cancelled again. On a ManualClock, no sleeps."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import structlog

from broker.tasks import RECANCEL_MS, bounded_step, cancel_all
from persister.clock import ManualClock, sleep


async def turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_a_step_that_ends_in_time_returns_and_raises_what_it_raised() -> None:
    clock = ManualClock()

    async def quick() -> None:
        await sleep(clock, 10)

    step = asyncio.ensure_future(bounded_step(clock, "quick", quick(), 1_000))
    await turns()
    clock.advance(10)
    await turns()
    assert step.done() and step.result() is None

    async def failing() -> None:
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        await bounded_step(clock, "failing", failing(), 1_000)


async def test_a_step_that_does_not_end_is_cancelled_and_logged_with_every_task() -> None:
    clock = ManualClock()
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def waits_forever() -> None:
        await never

    with structlog.testing.capture_logs() as logs:
        step = asyncio.ensure_future(bounded_step(clock, "registry", waits_forever(), 3_000))
        await turns()
        clock.advance(2_999)
        await turns()
        assert not step.done()
        clock.advance(1)
        await turns()
        clock.advance(RECANCEL_MS)
        await turns()
        assert step.done() and step.result() is None
    assert never.cancelled()
    (entry,) = [e for e in logs if e["event"] == "stop_step_timed_out"]
    assert entry["step"] == "registry" and entry["timeout_ms"] == 3_000
    assert any("waits_forever@test_tasks.py" in t for t in entry["tasks"]), entry["tasks"]


async def test_cancel_all_cancels_again_a_task_that_swallowed_the_cancellation() -> None:
    clock = ManualClock()
    swallowed: list[str] = []

    async def stubborn() -> None:
        # As a loop whose wait swallowed one cancellation: it goes on to its next sleep.
        try:
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            swallowed.append("first")
        await sleep(clock, 60_000)

    async def plain() -> None:
        await sleep(clock, 60_000)

    tasks: list[asyncio.Future[Any]] = [
        asyncio.ensure_future(stubborn()),
        asyncio.ensure_future(plain()),
    ]
    await turns()
    stopping = asyncio.ensure_future(cancel_all(clock, tasks))
    await turns()
    assert swallowed == ["first"]
    assert tasks[1].cancelled() and not tasks[0].done()
    clock.advance(RECANCEL_MS)
    await turns()
    assert tasks[0].cancelled()
    assert stopping.done() and stopping.result() is None
