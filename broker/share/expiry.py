"""Acquisition-lock expiry (KIP-932's share.record.lock.duration.ms).

Records a member acquired go back to AVAILABLE (or are archived at the delivery count
limit) when their lock's deadline passes unacknowledged. `LockExpiry` keeps one timer on
the injected clock for the earliest deadline of all share partitions (a heap of (at_ms,
key), at most one entry queued per key before its time), and on firing releases every
due partition's expired records, each with its own share-state write under the
partition's lock (waited for, bounded). A failed write leaves the records acquired and
is tried again `retry_backoff_ms` later.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Coroutine
from typing import Any

import structlog

from broker.metrics import ShareMetrics
from broker.share.locks import FetchLocks
from broker.share.partition import SharePartition
from broker.share.state_writer import StateWriter
from broker.tasks import guarded
from coordinator.share_state import ShareStateKey
from persister.clock import Clock, Timer
from protocol.errors import KafkaError

log = structlog.get_logger("spool.share")


class LockExpiry:
    def __init__(
        self,
        *,
        clock: Clock,
        partitions: dict[ShareStateKey, SharePartition],
        locks: FetchLocks[ShareStateKey],
        writer: StateWriter,
        metrics: ShareMetrics,
        notify: Callable[[ShareStateKey], None],
        spawn: Callable[[Coroutine[Any, Any, None], str], None],
        topic_name: Callable[[ShareStateKey], str | None],
        lock_wait_ms: int,
        retry_backoff_ms: int,
    ) -> None:
        self.clock = clock
        self.partitions = partitions
        self.locks = locks
        self.writer = writer
        self.metrics = metrics
        self.notify = notify
        self.spawn = spawn
        self.topic_name = topic_name
        self.lock_wait_ms = lock_wait_ms
        self.retry_backoff_ms = retry_backoff_ms
        # A heap of (at_ms, key), and per key the earliest one queued.
        self._deadlines: list[tuple[int, ShareStateKey]] = []
        self._armed: dict[ShareStateKey, int] = {}
        self._timer: Timer | None = None
        self._timer_at: int | None = None
        self._stopped = False

    def start(self) -> None:
        self._stopped = False

    def stop(self) -> None:
        self._stopped = True
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._timer_at = None

    def arm(self, key: ShareStateKey, sp: SharePartition) -> None:
        deadline = sp.next_lock_deadline()
        if deadline is not None:
            self.wake_at(key, deadline)

    def wake_at(self, key: ShareStateKey, at_ms: int) -> None:
        """Look at `key`'s locks at `at_ms` (unless a wake-up at or before it is queued)."""
        armed = self._armed.get(key)
        if armed is not None and armed <= at_ms:
            return
        self._armed[key] = at_ms
        heapq.heappush(self._deadlines, (at_ms, key))
        if self._timer_at is None or at_ms < self._timer_at:
            self._schedule(at_ms)

    def _schedule(self, at_ms: int) -> None:
        if self._stopped:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at_ms
        self._timer = self.clock.call_at(
            at_ms, guarded(self._on_timer, what="share_lock_expiry_timer")
        )

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        self.spawn(self.expire_locks(), "share_lock_expiry")

    async def expire_locks(self) -> None:
        """Release the records of every lock that is due; a partition whose write fails is
        tried again `retry_backoff_ms` later."""
        try:
            now = self.clock.now_ms()
            due: dict[ShareStateKey, None] = {}
            while self._deadlines and self._deadlines[0][0] <= now:
                at_ms, key = heapq.heappop(self._deadlines)
                if self._armed.get(key) == at_ms:
                    del self._armed[key]
                due[key] = None
            for key in due:
                try:
                    await self._expire(key)
                except Exception:
                    # A bug, not a failed write (_expire handles those): keep the other
                    # partitions' expiry going, and look at this one again later.
                    log.exception(
                        "share_lock_expiry_failed",
                        group=key.group_id,
                        topic=self.topic_name(key),
                        partition=key.partition,
                    )
                    self.wake_at(key, self.clock.now_ms() + self.retry_backoff_ms)
        finally:
            if self._deadlines and (
                self._timer_at is None or self._deadlines[0][0] < self._timer_at
            ):
                self._schedule(self._deadlines[0][0])

    async def _expire(self, key: ShareStateKey) -> None:
        if not await self.locks.acquire(key, self.lock_wait_ms):
            # Another request kept the partition busy all along: look again shortly.
            self.wake_at(key, self.clock.now_ms() + self.retry_backoff_ms)
            return
        try:
            sp = self.partitions.get(key)
            if sp is None:
                return
            now = self.clock.now_ms()
            deadline = sp.next_lock_deadline()
            if deadline is None:
                return
            if deadline > now:
                self.wake_at(key, deadline)
                return
            result = sp.expire_locks(now)
            try:
                await self.writer.write(key, sp, result.change, "lock_expiry")
            except KafkaError:
                # Logged by the writer. The records stay acquired past their deadline until a
                # write succeeds; a fenced partition was dropped and needs no retry.
                if self.partitions.get(key) is sp:
                    self.wake_at(key, now + self.retry_backoff_ms)
                return
            self.metrics.locks_expired(key, result.released, _count(result.archived))
            self.arm(key, sp)
        finally:
            self.locks.release(key)
        if result.available or result.archived:
            log.info(
                "acquisition_locks_expired",
                group=key.group_id,
                topic_id=str(key.topic_id),
                partition=key.partition,
                available=result.released,
                archived=_count(result.archived),
            )
            self.notify(key)


def _count(ranges: list[tuple[int, int]] | tuple[tuple[int, int], ...]) -> int:
    return sum(last - first + 1 for first, last in ranges)
