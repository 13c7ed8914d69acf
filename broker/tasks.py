"""Background work that cannot fail silently.

An exception in a task nobody awaits, or in a timer callback, is otherwise reported late
(when the task is garbage collected) or stops a loop for good. `spawn` and `guarded` log it
at once, with what the work was and for whom, and let the rest of the broker carry on.

Stopping is bounded: `bounded_step` gives a step of the broker's stop a time limit (on the
broker's clock) and, past it, logs where every task of the loop waits; `cancel_all` ends
tasks even if one swallows a cancellation (Python 3.11's `asyncio.wait_for` can, when the
wait it is in completes as the cancellation arrives: why spool uses `asyncio.timeout`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

import structlog

from persister.clock import Clock, wait_all

log = structlog.get_logger("spool.tasks")

_T = TypeVar("_T")


def spawn(
    coro: Coroutine[Any, Any, _T],
    *,
    what: str,
    tasks: set[asyncio.Future[Any]] | None = None,
    **context: object,
) -> asyncio.Task[_T]:
    """Run `coro` in the background; its exception is logged as `background_task_failed`
    with `task=what` and `context`. `tasks`, if given, holds the task while it runs (the event
    loop keeps only weak references to tasks)."""
    task = asyncio.ensure_future(coro)
    if tasks is not None:
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    task.add_done_callback(lambda done: _log_failure(done, what, context))
    return task


def _log_failure(task: asyncio.Task[Any], what: str, context: dict[str, object]) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        log.error("background_task_failed", task=what, **context, exc_info=exc)


def guarded(callback: Callable[[], None], *, what: str, **context: object) -> Callable[[], None]:
    """`callback` for a timer: an exception is logged as `background_task_failed` and
    swallowed, so it neither reaches the event loop's handler nor a test's clock."""

    def run() -> None:
        try:
            callback()
        except Exception:
            log.exception("background_task_failed", task=what, **context)

    return run


# How often `cancel_all` cancels again a task that went on after a cancellation.
RECANCEL_MS = 100


async def bounded_step(clock: Clock, step: str, work: Awaitable[Any], timeout_ms: int) -> None:
    """Await `work` for at most `timeout_ms` on `clock`, raising what it raised. Past the
    limit it is cancelled and `stop_step_timed_out` logged with the stack of every task of
    the loop (`task_stacks`), so the wait that did not end can be named; no error."""
    task = asyncio.ensure_future(work)
    if await wait_all(clock, [task], timeout_ms):
        log.error("stop_step_timed_out", step=step, timeout_ms=timeout_ms, tasks=task_stacks())
        task.cancel()
        await wait_all(clock, [task], RECANCEL_MS)
        return
    if not task.cancelled():
        task.result()


async def cancel_all(clock: Clock, tasks: Sequence[asyncio.Future[Any]]) -> None:
    """Cancel `tasks` and wait for them to end, cancelling again every RECANCEL_MS any
    that went on (it swallowed the cancellation)."""
    while pending := [task for task in tasks if not task.done()]:
        for task in pending:
            task.cancel()
        await wait_all(clock, pending, RECANCEL_MS)
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            log.error("background_task_failed", task="stopping", exc_info=task.exception())


def task_stacks() -> list[str]:
    """Where each task of the running loop waits: its name and the chain of awaits,
    outermost first."""
    stacks = []
    for task in asyncio.all_tasks():
        where: list[str] = []
        step: Any = task.get_coro()
        while step is not None and len(where) < 12:
            frame = getattr(step, "cr_frame", None) or getattr(step, "gi_frame", None)
            if frame is None:
                where.append(type(step).__name__)
                break
            code = frame.f_code
            where.append(f"{code.co_name}@{Path(code.co_filename).name}:{frame.f_lineno}")
            step = getattr(step, "cr_await", None) or getattr(step, "gi_yieldfrom", None)
        stacks.append(f"{task.get_name()}: {' -> '.join(where)}")
    return stacks
