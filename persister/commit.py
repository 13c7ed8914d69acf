"""Group commit: many writers waiting for durability share one fsync.

Appends happen on the event-loop thread without fsync; a writer that must not answer
before its data is durable awaits `GroupCommit.sync(log)`. All writers that ask while no
flush of that log is running are served by the next flush; those who ask while one runs
wait for the one after it, since the running flush may have started before their data
was written. The flushes run on worker threads, so the loop never blocks on disk; a
target has at most one round running, but rounds of different targets (a topic
partition's log and the share-state log) run side by side, so a record's fsync does
not queue behind the share-state write of the record before it.

`request(target, done, started=...)` is the same without a task: the round starts
within the call, `done` is told the outcome on the loop, and `started` once a flush
thread has begun the round (a topic partition wakes its parked fetches then, so their
Python runs while the disk syncs rather than keeping the thread from starting).

A target with a `flush_async` coroutine method (`AsyncFlushable`: a log whose durability
is a network round trip, persister.pg_storage) has its rounds run as tasks on the loop
instead of on a thread: same rounds, same waiters, no thread hop, and any number of
targets' rounds in flight at once (their commits share transactions downstream). Such a
round's `started` callbacks run once its flush has begun (reached its first wait): the
fetches they wake then run after the commit's own task has been scheduled, so their
Python runs while the commit is on the network rather than before it is sent.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import structlog

log = structlog.get_logger(__name__)


class Flushable(Protocol):
    def flush(self) -> None:
        """Blocking: make everything written so far durable."""


class AsyncFlushable(Protocol):
    async def flush_async(self) -> None:
        """On the loop: make everything written so far durable."""


@dataclass(slots=True)
class RoundTimes:
    """When a flush round started (loop), its fsync thread began running it (woken and
    holding the GIL), its flush returned (fsync thread) and the loop saw it end:
    `time.perf_counter_ns`, kept only while `on_synced` is set (tracing)."""

    started_ns: int = 0
    entered_ns: int = 0
    flushed_ns: int = 0
    finished_ns: int = 0


# Told, in the context of each request whose flush succeeded, of the round that served it.
SyncedHook = Callable[[Flushable, RoundTimes], None]


# Told, on the loop, how the flush serving a request ended: None, or what it raised.
Done = Callable[[BaseException | None], None]


@dataclass(slots=True)
class _Waiter:
    """A request for a flush: told when the round serving it begins on its thread and
    when it ends. `context` is the requester's (tracing reports the round there)."""

    done: Done
    started: Callable[[], None] | None
    context: contextvars.Context | None


@dataclass(slots=True)
class _Target:
    """Per-target round state; keeps a reference so the identity key stays valid."""

    target: Flushable
    # Requests for a flush that has not started yet.
    pending: list[_Waiter] = field(default_factory=list)
    running: bool = False
    # The times of the round the pending requests will get (tracing only).
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
        # Rounds of `AsyncFlushable` targets running as tasks (kept from collection).
        self._async_rounds: set[asyncio.Task[None]] = set()
        self._stopping = False
        # Told when the last running round has ended (`stop` waits on it).
        self._idle: asyncio.Event | None = None
        # Flush rounds started so far (tests count them: one request, one round).
        self.rounds = 0
        # Tracing (broker.trace): told of each request's round; None costs nothing.
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
            self._idle = asyncio.Event()
            await self._idle.wait()
        if self._executor is not None:
            # Nothing is queued any more, so this does not wait on disk.
            self._executor.shutdown(wait=False)
            self._executor = None

    async def sync(self, target: Flushable) -> None:
        """Return after a `target.flush()` that started after this call; raise what it raised."""
        if self._loop is None:
            raise RuntimeError("GroupCommit is not running")
        waiter: asyncio.Future[None] = self._loop.create_future()

        def done(error: BaseException | None) -> None:
            # A cancelled writer cancels only its own waiter, never the round others share.
            if waiter.done():
                return
            if error is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(error)

        self.request(target, done)
        await waiter

    def request(
        self, target: Flushable, done: Done, *, started: Callable[[], None] | None = None
    ) -> None:
        """Ask for a `target.flush()` that starts after this call, without waiting: `done`
        is called on the loop with None or what the flush raised. `started` is called on
        the loop once that flush has begun on its thread: work the loop does from then on
        overlaps the disk instead of keeping the thread from starting (the GIL).

        A round starts at once when none of `target` is running, so the thread is woken
        before the caller's task goes on."""
        if self._executor is None or self._loop is None or self._stopping:
            raise RuntimeError("GroupCommit is not running")
        key = id(target)
        state = self._targets.get(key)
        if state is None:
            state = self._targets[key] = _Target(target)
        context = None
        if self.on_synced is not None:
            context = contextvars.copy_context()
            if state.times is None:
                state.times = RoundTimes()
        state.pending.append(_Waiter(done, started, context))
        if not state.running:
            self._start_round(key, state)

    def _start_round(self, key: int, state: _Target) -> None:
        assert self._executor is not None and self._loop is not None
        waiters, state.pending = state.pending, []
        times, state.times = state.times, None
        self.rounds += 1
        state.running = True
        if times is not None:
            times.started_ns = time.perf_counter_ns()
        announce = [w.started for w in waiters if w.started is not None]
        flush_async = getattr(state.target, "flush_async", None)
        if flush_async is not None:
            finish = functools.partial(
                self._finish_round, key, state, waiters, self._timer(), times
            )
            task = self._loop.create_task(_run_async_round(flush_async, times, finish))
            self._async_rounds.add(task)
            task.add_done_callback(self._async_rounds.discard)
            if announce:
                # After the round's first step (scheduled just before): see the docstring.
                self._loop.call_soon(_call_each, announce)
            return
        self._executor.submit(
            _run_round,
            self._loop,
            state.target.flush,
            times,
            announce,
            functools.partial(self._finish_round, key, state, waiters, self._timer(), times),
        )

    def _finish_round(
        self,
        key: int,
        state: _Target,
        waiters: list[_Waiter],
        started: float,
        times: RoundTimes | None,
        error: BaseException | None,
    ) -> None:
        if times is not None:
            times.finished_ns = time.perf_counter_ns()
        state.running = False
        if error is not None:
            # A storage outage (persister.storage.StorageUnavailable) is logged once
            # where it begins (persister.pg_commit), not per flush it fails.
            report = log.debug if getattr(error, "reported_once", False) else log.error
            report("flush_failed", target=repr(state.target), error=repr(error))
        if self.on_flush is not None:
            self.on_flush(self._timer() - started, error is not None)
        hook = self.on_synced
        for waiter in waiters:
            try:
                if waiter.context is None:
                    waiter.done(error)
                    continue
                # Tracing: the round and what its requester does next belong to the
                # request that asked for it.
                if hook is not None and times is not None and error is None:
                    waiter.context.run(hook, state.target, times)
                waiter.context.run(waiter.done, error)
            except Exception:  # one requester's bug must not strand the others
                log.exception("flush_callback_failed", target=repr(state.target))
        if state.pending:
            self._start_round(key, state)
        else:
            del self._targets[key]
            if not self._targets and self._idle is not None:
                self._idle.set()


def _call_each(callbacks: list[Callable[[], None]]) -> None:
    for callback in callbacks:
        callback()


def _run_round(
    loop: asyncio.AbstractEventLoop,
    flush: Callable[[], None],
    times: RoundTimes | None,
    announce: list[Callable[[], None]],
    finish: Callable[[BaseException | None], None],
) -> None:
    """On a flush thread: tell the loop the round has begun (`announce`), flush, and hand
    the outcome back to the loop (`finish`). With `times` (tracing), note when the thread
    got here (its wake-up and its wait for the GIL, which a busy loop holds) and when the
    flush returned."""
    if times is not None:
        times.entered_ns = time.perf_counter_ns()
    error: BaseException | None = None
    try:
        if announce:
            loop.call_soon_threadsafe(_call_each, announce)
        flush()
    except BaseException as exc:  # handed to the waiters, as a failed flush
        error = exc
    if times is not None:
        times.flushed_ns = time.perf_counter_ns()
    with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is waiting
        loop.call_soon_threadsafe(finish, error)


async def _run_async_round(
    flush_async: Callable[[], Awaitable[None]],
    times: RoundTimes | None,
    finish: Callable[[BaseException | None], None],
) -> None:
    """On the loop: `_run_round` for a target that flushes with a coroutine (its
    `started` callbacks are called by `_start_round`, right after this task's first step)."""
    if times is not None:
        times.entered_ns = time.perf_counter_ns()
    error: BaseException | None = None
    try:
        await flush_async()
    except Exception as exc:  # handed to the waiters, as a failed flush
        error = exc
    if times is not None:
        times.flushed_ns = time.perf_counter_ns()
    finish(error)
