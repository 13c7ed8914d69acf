"""Timed operations of the group coordinator: session and rebalance timeouts, the
classic join and sync deadlines, the initial rebalance delay, offset retention.

Kafka's group coordinator schedules these on its CoordinatorTimer: a timer names a key
("session", group, member), and when it expires its operation runs as a write event of
the coordinator runtime, serialised with the requests on the same group.
`GroupTimers` is that timer on spool's runtime and injected clock:

- `schedule(key, group_id, at_ms, op)` arms `op` for `at_ms`, replacing any timer with
  the same key (a heartbeat pushing a member's session deadline out reschedules it).
  When the clock reaches `at_ms`, `runtime.run(group_id, op)` runs it under the group's
  key, so it is computed from the state every earlier operation on the group left, and
  its records are made durable and replayed like a request's.
- A timer that fired is still scheduled until its operation starts. If its key was
  rescheduled or cancelled while the operation waited for the group, the stale
  operation does not run (Kafka rejects it: "overridden or cancelled"). The entry is
  removed just before the operation runs, so an operation may reschedule its own key.
- A failed operation is logged. NOT_COORDINATOR and COORDINATOR_LOAD_IN_PROGRESS mean
  the coordinator moved or is loading, and are ignored (`on_loaded` re-arms what the
  new state needs). Any other failure (a failed write) is retried after
  `retry_backoff_ms` (500 ms, Kafka's default) unless the timer was scheduled with
  `retry=False`, as Kafka's EventBasedCoordinatorTimer does.
- `cancel(key)`, `cancel_group(group_id)` (a group deleted or converted) and
  `cancel_all()` (the coordinator unloads: another broker leads the log now).

Time is the injected `Clock` (`persister.clock`), so unit tests drive expiry with a
`ManualClock` and no sleeps. The operations run in tasks the timers keep until they
end; `drain()` awaits them (tests, and a coordinator's stop).

Keys used by the group coordinator: ("session", g, m), ("rebalance", g, m),
("join", g), ("initial-delay", g), ("sync", g), ("classic-hb", g, m), ("retention",),
("regex", g).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import structlog

from coordinator.runtime import CoordinatorRuntime, Operation
from persister.clock import Clock, Timer
from protocol.errors import ErrorCode, KafkaError

log = structlog.get_logger("spool.groups")

R = TypeVar("R")

# Kafka's EventBasedCoordinatorTimer retries a failed timeout operation after 500 ms.
DEFAULT_RETRY_BACKOFF_MS = 500

# The coordinator is not (or not yet) active: the timer's work is the next holder's.
_INACTIVE = frozenset({ErrorCode.not_coordinator, ErrorCode.coordinator_load_in_progress})

# An operation's response when its timer was replaced or cancelled before it ran.
_STALE = object()


@dataclass(eq=False, slots=True)
class _Scheduled(Generic[R]):
    key: Hashable
    group_id: str
    at_ms: int
    op: Operation[R, Any]
    applied: Callable[[Any], None] | None
    retry: bool
    retry_backoff_ms: int
    timer: Timer | None = field(default=None)


class GroupTimers(Generic[R]):
    """Timers whose operations run on the group coordinator's runtime; see the module
    docstring."""

    def __init__(self, runtime: CoordinatorRuntime[R], clock: Clock) -> None:
        self._runtime = runtime
        self._clock = clock
        self._scheduled: dict[Hashable, _Scheduled[R]] = {}
        self._running: set[asyncio.Task[None]] = set()

    def schedule(
        self,
        key: Hashable,
        group_id: str,
        at_ms: int,
        op: Operation[R, Any],
        *,
        applied: Callable[[Any], None] | None = None,
        retry: bool = True,
        retry_backoff_ms: int = DEFAULT_RETRY_BACKOFF_MS,
    ) -> None:
        """Run `op` on `group_id`'s key once the clock reaches `at_ms` (on the clock's
        next round of timers if it has), replacing the timer `key` if there is one.
        `applied` is handed to `runtime.run`: called with the response once the records
        are replayed."""
        entry = _Scheduled(key, group_id, at_ms, op, applied, retry, retry_backoff_ms)
        previous = self._scheduled.pop(key, None)
        if previous is not None and previous.timer is not None:
            previous.timer.cancel()
        self._scheduled[key] = entry
        entry.timer = self._clock.call_at(at_ms, lambda: self._fire(entry))

    def schedule_if_absent(
        self,
        key: Hashable,
        group_id: str,
        at_ms: int,
        op: Operation[R, Any],
        *,
        applied: Callable[[Any], None] | None = None,
        retry: bool = True,
    ) -> None:
        """`schedule`, unless a timer `key` is scheduled already (it is kept)."""
        if key not in self._scheduled:
            self.schedule(key, group_id, at_ms, op, applied=applied, retry=retry)

    def is_scheduled(self, key: Hashable) -> bool:
        return key in self._scheduled

    def deadline(self, key: Hashable) -> int | None:
        """When timer `key` fires (or fired, its operation not yet started), or None."""
        entry = self._scheduled.get(key)
        return None if entry is None else entry.at_ms

    def cancel(self, key: Hashable) -> None:
        entry = self._scheduled.pop(key, None)
        if entry is not None and entry.timer is not None:
            entry.timer.cancel()

    def cancel_group(self, group_id: str) -> None:
        """Cancel every timer of `group_id` (the group was deleted or changed type)."""
        for key in [k for k, e in self._scheduled.items() if e.group_id == group_id]:
            self.cancel(key)

    def cancel_all(self) -> None:
        """Cancel every timer (the coordinator unloads). Operations already running
        finish; those waiting for their group's key no longer run."""
        for entry in self._scheduled.values():
            if entry.timer is not None:
                entry.timer.cancel()
        self._scheduled.clear()

    def __len__(self) -> int:
        return len(self._scheduled)

    @property
    def running(self) -> int:
        """Operations fired and not yet finished."""
        return len(self._running)

    async def drain(self) -> None:
        """Wait for every operation fired so far (and any they fire at once) to end."""
        while self._running:
            await asyncio.gather(*self._running, return_exceptions=True)

    # ------------------------------------------------------------------ firing

    def _fire(self, entry: _Scheduled[R]) -> None:
        if self._scheduled.get(entry.key) is not entry:
            return  # replaced or cancelled after the clock queued this callback
        task = asyncio.ensure_future(self._execute(entry))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _execute(self, entry: _Scheduled[R]) -> None:
        def op() -> tuple[Any, Any]:
            if self._scheduled.get(entry.key) is not entry:
                return (), _STALE  # replaced or cancelled while waiting for the group
            del self._scheduled[entry.key]
            return entry.op()

        def applied(response: Any) -> None:
            if response is not _STALE and entry.applied is not None:
                entry.applied(response)

        try:
            await self._runtime.run(entry.group_id, op, applied=applied)
        except Exception as exc:
            if self._scheduled.get(entry.key) is entry:
                del self._scheduled[entry.key]  # refused before the operation started
            if isinstance(exc, KafkaError) and exc.code in _INACTIVE:
                log.debug(
                    "group_timer_dropped",
                    key=entry.key,
                    group=entry.group_id,
                    error=exc.code.name,
                )
                return
            self._failed(entry, exc)  # a failed write, or a bug in the operation

    def _failed(self, entry: _Scheduled[R], exc: Exception) -> None:
        bug = not isinstance(exc, KafkaError)  # not a failed write: logged with its trace
        if not entry.retry:
            log.error(
                "group_timer_failed",
                key=entry.key,
                group=entry.group_id,
                error=str(exc),
                exc_info=bug,
            )
            return
        (log.error if bug else log.info)(
            "group_timer_retried",
            key=entry.key,
            group=entry.group_id,
            error=str(exc),
            retry_in_ms=entry.retry_backoff_ms,
            exc_info=bug,
        )
        # As Kafka's timer: the retry replaces whatever the failed operation scheduled
        # under its own key (that was computed from a change that was not applied).
        self.schedule(
            entry.key,
            entry.group_id,
            self._clock.now_ms() + entry.retry_backoff_ms,
            entry.op,
            applied=entry.applied,
            retry=True,
            retry_backoff_ms=entry.retry_backoff_ms,
        )
