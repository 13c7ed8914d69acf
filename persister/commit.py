"""Group commit: many writers waiting for durability share one fsync.

Appends happen on the event-loop thread without fsync; a writer that must not answer
before its data is durable awaits `GroupCommit.sync(log)`. All writers that ask while no
flush of that log is running are served by the next flush; those who ask while one runs
wait for the one after it, since the running flush may have started before their data
was written. The flushes run on worker threads, so the loop never blocks on disk; a
target has at most one round running, but rounds of different targets (a topic
partition's log and the share-state log) run side by side, so a record's fsync does
not queue behind the share-state write of the record before it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import structlog

log = structlog.get_logger(__name__)


class Flushable(Protocol):
    def flush(self) -> None:
        """Blocking: make everything written so far durable."""


@dataclass(slots=True)
class RoundTimes:
    """When a flush round started (loop), its fsync thread began running it (woken and
    holding the GIL), its flush returned (fsync thread) and the loop saw it end:
    `time.perf_counter_ns`, kept only while `on_synced` is set (tracing)."""

    started_ns: int = 0
    entered_ns: int = 0
    flushed_ns: int = 0
    finished_ns: int = 0


# Told, in the task of each writer whose `sync` returned, of the round that served it.
SyncedHook = Callable[[Flushable, RoundTimes], None]


@dataclass(slots=True)
class _Target:
    """Per-target round state; keeps a reference so the identity key stays valid."""

    target: Flushable
    # Waiters for a flush that has not started yet.
    pending: list[asyncio.Future[None]] = field(default_factory=list)
    running: asyncio.Future[None] | None = None
    # The times of the round the pending waiters will get (tracing only).
    times: RoundTimes | None = None


# Flush rounds of different targets running at once. fsync waits on the disk without
# the GIL, so a few threads overlap the produce path's and the share state's fsyncs.
FLUSH_THREADS = 4


class GroupCommit:
    """Runs `flush()` of sync targets on worker threads, one round per target at a time."""

    def __init__(
        self,
        *,
        thread_name: str = "spool-fsync",
        timer: Callable[[], float] = time.perf_counter,
        threads: int = FLUSH_THREADS,
    ) -> None:
        self._thread_name = thread_name
        self._threads = threads
        # Monotonic seconds, to time rounds for `on_flush` (the broker's metrics).
        self._timer = timer
        # Called on the loop as each round ends: (seconds from its start, whether it failed).
        self.on_flush: Callable[[float, bool], None] | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._targets: dict[int, _Target] = {}
        self._stopping = False
        # Flush rounds started so far (tests count them: one request, one round).
        self.rounds = 0
        # Tracing (broker.trace): told of each writer's round; None costs nothing.
        self.on_synced: SyncedHook | None = None

    def start(self) -> None:
        """Start the worker thread; call from the event loop that will await `sync`."""
        if self._executor is not None:
            raise RuntimeError("GroupCommit already started")
        self._loop = asyncio.get_running_loop()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=self._threads, thread_name_prefix=self._thread_name
        )
        self._stopping = False

    async def stop(self) -> None:
        """Let the rounds already asked for finish, then stop the worker thread."""
        self._stopping = True
        while self._targets:
            rounds = [s.running for s in self._targets.values() if s.running is not None]
            if not rounds:
                break
            await asyncio.wait(rounds)
        if self._executor is not None:
            # Nothing is queued any more, so this does not wait on disk.
            self._executor.shutdown(wait=False)
            self._executor = None

    async def sync(self, target: Flushable) -> None:
        """Return after a `target.flush()` that started after this call; raise what it raised."""
        if self._executor is None or self._loop is None or self._stopping:
            raise RuntimeError("GroupCommit is not running")
        key = id(target)
        state = self._targets.get(key)
        if state is None:
            state = self._targets[key] = _Target(target)
        waiter: asyncio.Future[None] = self._loop.create_future()
        state.pending.append(waiter)
        hook = self.on_synced
        if hook is not None and state.times is None:
            state.times = RoundTimes()
        times = state.times
        if state.running is None:
            self._start_round(key, state)
        # A cancelled writer cancels only its own waiter, never the round others share.
        await waiter
        if hook is not None and times is not None:
            hook(target, times)

    def _start_round(self, key: int, state: _Target) -> None:
        assert self._executor is not None and self._loop is not None
        waiters, state.pending = state.pending, []
        times, state.times = state.times, None
        self.rounds += 1
        started = self._timer()
        flush = state.target.flush
        if times is not None:
            times.started_ns = time.perf_counter_ns()
            flush = functools.partial(_timed_flush, flush, times)
        running = self._loop.run_in_executor(self._executor, flush)
        state.running = running
        running.add_done_callback(
            lambda done: self._finish_round(key, state, waiters, done, started, times)
        )

    def _finish_round(
        self,
        key: int,
        state: _Target,
        waiters: list[asyncio.Future[None]],
        done: asyncio.Future[None],
        started: float,
        times: RoundTimes | None,
    ) -> None:
        if times is not None:
            times.finished_ns = time.perf_counter_ns()
        state.running = None
        cancelled = done.cancelled()
        error = None if cancelled else done.exception()
        if error is not None:
            log.error("flush_failed", target=repr(state.target), error=repr(error))
        if self.on_flush is not None and not cancelled:
            self.on_flush(self._timer() - started, error is not None)
        for waiter in waiters:
            if waiter.done():
                continue
            if cancelled:
                waiter.cancel()
            elif error is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(error)
        if state.pending:
            self._start_round(key, state)
        else:
            del self._targets[key]


def _timed_flush(flush: Callable[[], None], times: RoundTimes) -> None:
    """On the fsync thread: note when it got here (the thread's wake-up and its wait for
    the GIL, which the busy loop holds), flush, and note when the flush returned."""
    times.entered_ns = time.perf_counter_ns()
    try:
        flush()
    finally:
        times.flushed_ns = time.perf_counter_ns()
