"""The share-partition leader runtime: owns the `SharePartition`s of every share group.

It loads a share partition's state from the persister the first time it is used
(resolving `share.auto.offset.reset` when the state has no start offset yet), reads
log batches for acquisition, persists every durable change before the caller
answers, fires acquisition-lock timeouts, and wakes parked share fetches when
records become available again.
"""

from __future__ import annotations

import asyncio
import heapq
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from broker.share.partition import (
    AcquiredRange,
    SharePartition,
    SharePartitionConfig,
    StateUpdate,
)
from coordinator.group_config import GroupConfig
from coordinator.share_state import Persister, ShareStateKey
from protocol.errors import ErrorCode, KafkaError
from protocol.records import iter_batches

log = structlog.get_logger("spool.share")

Listener = Callable[[], None]
# Kafka's leader epoch for share state writes; spool is one node and never changes leader.
LEADER_EPOCH = 0
# Bytes read from one partition's log per share fetch, like Kafka's default
# max.partition.fetch.bytes: a fetch needs only MaxRecords records, and reading (and
# parsing the batch headers of) the whole MaxBytes would make every fetch cost as much
# as the backlog.
PARTITION_READ_BYTES = 1024 * 1024
# A share partition holding no acquired records and unused this long is unloaded; its
# state is durable and is read back on next use, so memory follows the active ones.
IDLE_UNLOAD_MS = 60_000


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class LogPartition(Protocol):
    """What the manager needs of a topic partition (broker.logs.Partition)."""

    topic: str
    index: int

    @property
    def log_start_offset(self) -> int: ...
    @property
    def high_watermark(self) -> int: ...
    @property
    def last_stable_offset(self) -> int: ...

    def read(self, offset: int, max_bytes: int, *, committed_only: bool = False) -> bytes: ...


class GroupConfigs(Protocol):
    def config(self, group_id: str) -> GroupConfig: ...
    async def ensure_initialized(
        self, group_id: str, topic_id: uuid.UUID, partition: int
    ) -> None: ...


@dataclass(slots=True)
class FetchedPartition:
    records: bytes = b""
    acquired: list[AcquiredRange] = field(default_factory=list)
    error_code: ErrorCode = ErrorCode.none
    error_message: str | None = None


def partition_config(config: GroupConfig) -> SharePartitionConfig:
    return SharePartitionConfig(
        record_lock_duration_ms=config.record_lock_duration_ms,
        delivery_count_limit=config.delivery_count_limit,
        max_in_flight_records=config.partition_max_record_locks,
        isolation_level=config.isolation_level,
    )


class SharePartitionManager:
    def __init__(
        self,
        persister: Persister,
        groups: GroupConfigs,
        log_partition: Callable[[uuid.UUID, int], LogPartition | None],
        offset_for_timestamp: Callable[[LogPartition, int], int | None],
    ) -> None:
        self.persister = persister
        self.groups = groups
        self.log_partition = log_partition
        self.offset_for_timestamp = offset_for_timestamp
        self.partitions: dict[ShareStateKey, SharePartition] = {}
        self._loading: dict[ShareStateKey, asyncio.Future[SharePartition]] = {}
        self._listeners: dict[ShareStateKey, set[Listener]] = {}
        self._deadlines: list[tuple[int, ShareStateKey]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: int | None = None
        self._expiring: asyncio.Future[None] | None = None
        self._last_used: dict[ShareStateKey, int] = {}

    # -- loading ----------------------------------------------------------------

    async def get(self, key: ShareStateKey) -> SharePartition:
        self._last_used[key] = now_ms()
        sp = self.partitions.get(key)
        if sp is not None:
            sp.config = partition_config(self.groups.config(key.group_id))
            return sp
        pending = self._loading.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[SharePartition] = asyncio.get_running_loop().create_future()
        self._loading[key] = future
        try:
            sp = await self._load(key)
            self.partitions[key] = sp
            future.set_result(sp)
            return sp
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: waiters re-raise it, nobody else must
            raise
        finally:
            del self._loading[key]

    async def _load(self, key: ShareStateKey) -> SharePartition:
        log_part = self.log_partition(key.topic_id, key.partition)
        if log_part is None:
            raise KafkaError(
                ErrorCode.unknown_topic_or_partition,
                f"Partition {key.partition} of topic id {key.topic_id} does not exist",
            )
        await self.groups.ensure_initialized(key.group_id, key.topic_id, key.partition)
        config = self.groups.config(key.group_id)
        state = await self.persister.read_state(key, LEADER_EPOCH)
        sp = SharePartition(
            key.group_id,
            key.topic_id,
            key.partition,
            config=partition_config(config),
            state_epoch=state.state_epoch,
            start_offset=state.start_offset,
            state_batches=state.batches,
        )
        if not sp.initialized:
            start = self._reset_offset(config, log_part)
            await self._persist(key, sp, sp.initialize(start))
            log.info(
                "share_partition_initialized",
                group=key.group_id,
                topic=log_part.topic,
                partition=key.partition,
                spso=start,
                reset=str(config.auto_offset_reset),
            )
        else:
            log.info(
                "share_partition_loaded",
                group=key.group_id,
                topic=log_part.topic,
                partition=key.partition,
                spso=sp.spso,
                speo=sp.speo,
            )
        return sp

    def _reset_offset(self, config: GroupConfig, log_part: LogPartition) -> int:
        """share.auto.offset.reset: latest, earliest, or by_duration:<ISO-8601>."""
        target = config.auto_offset_reset.timestamp(now_ms())
        if target == -1:
            return log_part.high_watermark
        if target == -2:
            return log_part.log_start_offset
        found = self.offset_for_timestamp(log_part, target)
        return log_part.high_watermark if found is None else found

    async def _persist(
        self, key: ShareStateKey, sp: SharePartition, update: StateUpdate | None
    ) -> None:
        if update is None:
            return
        await self.persister.write_state(
            key,
            sp.state_epoch,
            LEADER_EPOCH,
            update.start_offset,
            update.state_batches,
        )

    # -- fetch ------------------------------------------------------------------

    async def acquire(
        self,
        key: ShareStateKey,
        member_id: str,
        *,
        max_records: int,
        batch_size: int,
        max_bytes: int,
    ) -> FetchedPartition:
        """Acquire records of one partition for a member and read their batches."""
        try:
            sp = await self.get(key)
        except KafkaError as exc:
            return FetchedPartition(error_code=exc.code, error_message=exc.message)
        log_part = self.log_partition(key.topic_id, key.partition)
        if log_part is None:
            return FetchedPartition(error_code=ErrorCode.unknown_topic_or_partition)
        await self._persist(key, sp, sp.update_log_start_offset(log_part.log_start_offset))
        if not sp.can_acquire():
            return FetchedPartition()
        committed_only = sp.config.isolation_level == "read_committed"
        upper = log_part.last_stable_offset if committed_only else log_part.high_watermark
        offset = sp.next_fetch_offset()
        if offset >= upper:
            return FetchedPartition()
        try:
            data = log_part.read(
                offset,
                max(min(max_bytes, PARTITION_READ_BYTES), 1),
                committed_only=committed_only,
            )
        except KafkaError as exc:
            return FetchedPartition(error_code=exc.code, error_message=exc.message)
        headers = [(pos, h) for pos, h in iter_batches(data, validate=False)]
        if not headers:
            return FetchedPartition()
        # Control batches (transaction markers) are never delivered: archived as gaps.
        gaps = [(h.base_offset, h.last_offset) for _, h in headers if h.is_control]
        result = sp.acquire(
            member_id,
            [(h.base_offset, h.last_offset) for _, h in headers],
            max_records=max_records,
            batch_size=batch_size,
            now_ms=now_ms(),
            gaps=gaps,
        )
        await self._persist(key, sp, result.state_update)
        if not result.acquired:
            return FetchedPartition()
        self._arm(key, sp)
        chunks = []
        ranges = result.acquired
        for pos, h in headers:
            if any(
                r.first_offset <= h.last_offset and r.last_offset >= h.base_offset for r in ranges
            ):
                chunks.append(data[pos : pos + h.size])
        return FetchedPartition(records=b"".join(chunks), acquired=list(ranges))

    # -- acknowledge --------------------------------------------------------------

    async def acknowledge(
        self,
        key: ShareStateKey,
        member_id: str,
        batches: list[tuple[int, int, tuple[int, ...]]],
    ) -> tuple[ErrorCode, str | None]:
        try:
            sp = await self.get(key)
        except KafkaError as exc:
            return exc.code, exc.message
        result = sp.acknowledge(member_id, batches, now_ms())
        log.debug(
            "acknowledge",
            group=key.group_id,
            member=member_id,
            partition=key.partition,
            batches=len(batches),
            error=result.error_code.name,
        )
        if result.error_code != ErrorCode.none:
            log.info(
                "acknowledge_refused",
                group=key.group_id,
                member=member_id,
                topic_id=str(key.topic_id),
                partition=key.partition,
                error=result.error_code.name,
                reason=result.error_message,
            )
            return result.error_code, result.error_message
        try:
            await self._persist(key, sp, result.state_update)
        except KafkaError as exc:
            return exc.code, exc.message
        self._arm(key, sp)
        if result.released:
            self._notify(key)
        return ErrorCode.none, None

    async def release_member(
        self, group_id: str, member_id: str, keys: list[ShareStateKey] | None = None
    ) -> int:
        """Give back every record `member_id` holds (it left, timed out or closed)."""
        released = 0
        targets = (
            keys if keys is not None else [k for k in self.partitions if k.group_id == group_id]
        )
        for key in targets:
            sp = self.partitions.get(key)
            if sp is None:
                continue
            result = sp.release_member(member_id, now_ms())
            await self._persist(key, sp, result.state_update)
            if result.available or result.archived:
                released += result.released
                self._notify(key)
        if released:
            log.info("member_records_released", group=group_id, member=member_id, records=released)
        return released

    def unload_idle(self, at_ms: int, idle_ms: int = IDLE_UNLOAD_MS) -> int:
        """Drop share partitions nobody uses and nothing holds; returns how many."""
        idle = [
            key
            for key, sp in self.partitions.items()
            if sp.acquired_count == 0
            and key not in self._listeners
            and at_ms - self._last_used.get(key, 0) >= idle_ms
        ]
        for key in idle:
            del self.partitions[key]
            self._last_used.pop(key, None)
        if idle:
            log.info("share_partitions_unloaded", count=len(idle), loaded=len(self.partitions))
        return len(idle)

    def drop(self, group_id: str | None, topic_id: uuid.UUID) -> None:
        """Forget share partitions of a deleted topic (or a group's deleted state)."""
        for key in [
            k
            for k in self.partitions
            if k.topic_id == topic_id and (group_id is None or k.group_id == group_id)
        ]:
            del self.partitions[key]
            self._last_used.pop(key, None)
            self._notify(key)

    # -- acquisition lock timeouts ---------------------------------------------------

    def _arm(self, key: ShareStateKey, sp: SharePartition) -> None:
        deadline = sp.next_lock_deadline()
        if deadline is None:
            return
        heapq.heappush(self._deadlines, (deadline, key))
        if self._timer_at is None or deadline < self._timer_at:
            self._schedule(deadline)

    def _schedule(self, deadline: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        delay = max(deadline - now_ms(), 0) / 1000
        self._timer_at = deadline
        self._timer = loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        self._expiring = asyncio.ensure_future(self.expire_locks())

    async def expire_locks(self) -> None:
        current = now_ms()
        due: set[ShareStateKey] = set()
        while self._deadlines and self._deadlines[0][0] <= current:
            due.add(heapq.heappop(self._deadlines)[1])
        for key in due:
            sp = self.partitions.get(key)
            if sp is None:
                continue
            result = sp.expire_locks(current)
            try:
                await self._persist(key, sp, result.state_update)
            except KafkaError as exc:
                log.error("share_state_write_failed", group=key.group_id, error=exc.message)
            if result.available or result.archived:
                log.info(
                    "acquisition_locks_expired",
                    group=key.group_id,
                    topic_id=str(key.topic_id),
                    partition=key.partition,
                    available=result.released,
                    archived=sum(r.last_offset - r.first_offset + 1 for r in result.archived),
                )
                self._notify(key)
            self._arm(key, sp)
        if self._deadlines and self._timer_at is None:
            self._schedule(self._deadlines[0][0])

    # -- wake-ups for parked share fetches -----------------------------------------

    def add_listener(self, key: ShareStateKey, listener: Listener) -> None:
        self._listeners.setdefault(key, set()).add(listener)

    def remove_listener(self, key: ShareStateKey, listener: Listener) -> None:
        listeners = self._listeners.get(key)
        if listeners is not None:
            listeners.discard(listener)
            if not listeners:
                del self._listeners[key]

    def listeners(self, key: ShareStateKey) -> _KeyListeners:
        """The wake-ups of one share partition, as a source for `wait_for_any`."""
        return _KeyListeners(self, key)

    def _notify(self, key: ShareStateKey) -> None:
        for listener in list(self._listeners.get(key, ())):
            listener()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


@dataclass(frozen=True, slots=True)
class _KeyListeners:
    manager: SharePartitionManager
    key: ShareStateKey

    def add_listener(self, listener: Listener) -> None:
        self.manager.add_listener(self.key, listener)

    def remove_listener(self, listener: Listener) -> None:
        self.manager.remove_listener(self.key, listener)
