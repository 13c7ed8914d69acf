"""Group commit: many writers waiting for durability share one fsync.

Appends happen on the event-loop thread without fsync; a writer that must not answer
before its data is durable awaits `GroupCommit.sync(log)`. All writers that ask while no
flush of that log is running are served by the next flush; those who ask while one runs
wait for the one after it, since the running flush may have started before their data
was written. The flushes run on one worker thread, so the loop never blocks on disk.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
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
class _Target:
    """Per-target round state; keeps a reference so the identity key stays valid."""

    target: Flushable
    # Waiters for a flush that has not started yet.
    pending: list[asyncio.Future[None]] = field(default_factory=list)
    running: asyncio.Future[None] | None = None


class GroupCommit:
    """Runs `flush()` of sync targets on one worker thread, one round per target at a time."""

    def __init__(
        self, *, thread_name: str = "spool-fsync", timer: Callable[[], float] = time.perf_counter
    ) -> None:
        self._thread_name = thread_name
        # Monotonic seconds, to time rounds for `on_flush` (the broker's metrics).
        self._timer = timer
        # Called on the loop as each round ends: (seconds from its start, whether it failed).
        self.on_flush: Callable[[float, bool], None] | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._targets: dict[int, _Target] = {}
        self._stopping = False
        self.rounds = 0

    def start(self) -> None:
        """Start the worker thread; call from the event loop that will await `sync`."""
        if self._executor is not None:
            raise RuntimeError("GroupCommit already started")
        self._loop = asyncio.get_running_loop()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=self._thread_name
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
        if state.running is None:
            self._start_round(key, state)
        # A cancelled writer cancels only its own waiter, never the round others share.
        await waiter

    def _start_round(self, key: int, state: _Target) -> None:
        assert self._executor is not None and self._loop is not None
        waiters, state.pending = state.pending, []
        self.rounds += 1
        started = self._timer()
        running = self._loop.run_in_executor(self._executor, state.target.flush)
        state.running = running
        running.add_done_callback(
            lambda done: self._finish_round(key, state, waiters, done, started)
        )

    def _finish_round(
        self,
        key: int,
        state: _Target,
        waiters: list[asyncio.Future[None]],
        done: asyncio.Future[None],
        started: float,
    ) -> None:
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
