"""Time for the shells: the one place spool reads the wall clock.

The sans-IO cores take `now_ms` as an argument; the shells around them (the share
partition manager, the coordinator runtime, the persister, the broker's timers) take a
`Clock` instead of calling `time` or `loop.call_later` themselves, so unit tests drive
lock expiry, session timeouts and idle unloading with a `ManualClock` and no sleeps,
as Kafka's tests do with its MockTime and MockTimer.

Waits are built on `call_at`, so every Clock has them: `sleep(clock, ms)` for periodic
loops (retention, compaction) and `wait_all(clock, futures, ms)` for bounded waits on
several tasks (the server's stop grace). Never `asyncio.sleep`, `asyncio.wait_for` or
`time.monotonic` where the time decides what happens; durations measured only for logs,
metrics and traces may use `time.perf_counter`.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    def now_ms(self) -> int:
        """Milliseconds since the epoch."""

    def call_at(self, at_ms: int, callback: Callable[[], None]) -> Timer:
        """Run `callback` on the event loop once `now_ms()` has reached `at_ms`."""


class SystemClock:
    """The wall clock and the running event loop's timers."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def call_at(self, at_ms: int, callback: Callable[[], None]) -> Timer:
        delay_s = max(at_ms - self.now_ms(), 0) / 1000
        return asyncio.get_running_loop().call_later(delay_s, callback)


SYSTEM_CLOCK = SystemClock()


def ms_of(seconds: float) -> int:
    """A timeout in seconds as whole milliseconds on a `Clock`, rounded up (a wait is
    never cut short; float noise such as 1.1 * 1000 == 1100.0000000000002 is not a
    millisecond more) and never negative."""
    return max(math.ceil(round(seconds * 1000, 6)), 0)


async def sleep(clock: Clock, ms: int) -> None:
    """`asyncio.sleep` on `clock`: return once `clock.now_ms()` has moved `ms` on.

    Built on `call_at`, so a loop that sleeps on the broker's clock runs on a
    `ManualClock`'s `advance` in tests (the task resumes on the loop's next turn after
    the timer fires), and on the event loop's timers otherwise. A cancelled sleep cancels
    its timer."""
    woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wake() -> None:
        if not woken.done():
            woken.set_result(None)

    timer = clock.call_at(clock.now_ms() + max(ms, 0), wake)
    try:
        await woken
    finally:
        timer.cancel()


async def wait_all(
    clock: Clock, futures: Iterable[asyncio.Future[Any]], timeout_ms: int
) -> set[asyncio.Future[Any]]:
    """`asyncio.wait(futures, timeout=...)` with the timeout on `clock`: return once every
    future is done or `clock` has moved `timeout_ms` on, with those still pending (none
    is cancelled)."""
    waiting = [future for future in futures if not future.done()]
    if not waiting:
        return set()
    left = len(waiting)
    finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def one_done(_: asyncio.Future[Any]) -> None:
        nonlocal left
        left -= 1
        if left == 0 and not finished.done():
            finished.set_result(None)

    def timed_out() -> None:
        if not finished.done():
            finished.set_result(None)

    for future in waiting:
        future.add_done_callback(one_done)
    timer = clock.call_at(clock.now_ms() + max(timeout_ms, 0), timed_out)
    try:
        await finished
    finally:
        timer.cancel()
        for future in waiting:
            future.remove_done_callback(one_done)
    return {future for future in waiting if not future.done()}


class _ManualTimer:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualClock:
    """A clock that moves only when told to: `advance` fires the timers that fell due,
    in deadline order, synchronously (callbacks that start tasks need the test to await
    them, e.g. with `await asyncio.sleep(0)` or by awaiting what they return)."""

    def __init__(self, now_ms: int = 1_700_000_000_000) -> None:
        self._now_ms = now_ms
        self._timers: list[tuple[int, int, _ManualTimer, Callable[[], None]]] = []
        self._sequence = itertools.count()

    def now_ms(self) -> int:
        return self._now_ms

    def call_at(self, at_ms: int, callback: Callable[[], None]) -> Timer:
        timer = _ManualTimer()
        heapq.heappush(self._timers, (at_ms, next(self._sequence), timer, callback))
        return timer

    def advance(self, ms: int) -> int:
        """Move time forward by `ms` and fire every timer now due; returns how many fired."""
        if ms < 0:
            raise ValueError("a clock does not go back")
        self._now_ms += ms
        fired = 0
        while self._timers and self._timers[0][0] <= self._now_ms:
            _, _, timer, callback = heapq.heappop(self._timers)
            if not timer.cancelled:
                fired += 1
                callback()
        return fired

    @property
    def pending_timers(self) -> int:
        return sum(1 for _, _, timer, _ in self._timers if not timer.cancelled)
