"""Background work that cannot fail silently.

An exception in a task nobody awaits, or in a timer callback, is otherwise reported late
(when the task is garbage collected) or stops a loop for good. `spawn` and `guarded` log it
at once, with what the work was and for whom, and let the rest of the broker carry on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import structlog

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
