"""The acquisition reader: a share fetch's records, read from the log and acquired.

Under the share partition's lock, `AcquisitionReader.prepare_acquire` moves the SPSO past
the log start, reads batch headers from the next fetch offset (at most
PARTITION_READ_BYTES, up to the log end, or the LSO for read_committed), archives control
batches and aborted transactions as gaps, and acquires records for the member
(`SharePartition.acquire`) on top of the partition's pending change, spending the
request's MaxRecords and MaxBytes. Once the change is committed and the locks let go,
`until_durable` holds what was handed out until its log fsync has finished (records are
acquired as soon as they are appended, so the fetch's work overlaps that fsync).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from broker import trace
from broker.metrics import ShareMetrics
from broker.share.partition import (
    AcquiredRange,
    PendingChange,
    ShareAcquireMode,
    SharePartition,
)
from coordinator.share_state import ShareStateKey
from persister.clock import Clock
from persister.txn_index import AbortedTxn, aborted_batch_ranges
from protocol.errors import ErrorCode, KafkaError
from protocol.records import iter_batches

log = structlog.get_logger("spool.share")

# Bytes read from one partition's log per share fetch, like Kafka's default
# max.partition.fetch.bytes: a fetch needs only MaxRecords records, and reading (and
# parsing the batch headers of) the whole MaxBytes would make every fetch cost as much
# as the backlog.
PARTITION_READ_BYTES = 1024 * 1024
# How long a fetch waits for records it acquired before their log fsync finished.
DURABLE_WAIT_S = 30.0


class LogPartition(Protocol):
    """What the manager needs of a topic partition (broker.partitions.Partition)."""

    topic: str
    index: int

    @property
    def log_start_offset(self) -> int: ...
    @property
    def high_watermark(self) -> int: ...
    @property
    def last_stable_offset(self) -> int: ...
    @property
    def log_end_offset(self) -> int: ...

    def read(
        self,
        offset: int,
        max_bytes: int,
        *,
        committed_only: bool = False,
        beyond_high_watermark: bool = False,
    ) -> bytes: ...
    async def wait_durable(
        self, last_offset: int, timeout_s: float, *, delivery: bool = False
    ) -> None: ...
    def aborted_transactions(self, fetch_offset: int, upper_bound: int) -> list[AbortedTxn]: ...


@dataclass(slots=True)
class FetchedPartition:
    records: bytes = b""
    acquired: list[AcquiredRange] = field(default_factory=list)
    error_code: ErrorCode = ErrorCode.none
    error_message: str | None = None


@dataclass(slots=True, eq=False)
class Prepared:
    """A partition's part of a request, applied in memory, its change not yet durable:
    acknowledgements and/or an acquisition (stacked into one change) and its batches."""

    key: ShareStateKey
    sp: SharePartition
    change: PendingChange
    operation: str = "acquire"
    acknowledged: bool = False
    released: int = 0  # records the acknowledgements made AVAILABLE again
    acquired: tuple[AcquiredRange, ...] | None = None  # None: nothing was acquired
    records: bytes = b""


class AcquisitionReader:
    def __init__(
        self,
        log_partition: Callable[[uuid.UUID, int], LogPartition | None],
        clock: Clock,
        metrics: ShareMetrics,
        not_leader: Callable[[uuid.UUID, int], KafkaError | None] = lambda _t, _p: None,
    ) -> None:
        self.log_partition = log_partition
        self.not_leader = not_leader
        self.clock = clock
        self.metrics = metrics

    async def prepare_acquire(
        self,
        prepared: Prepared,
        member_id: str,
        budget: list[int],
        batch_size: int,
        fetched: dict[ShareStateKey, FetchedPartition],
        mode: ShareAcquireMode = ShareAcquireMode.BATCH_OPTIMIZED,
    ) -> None:
        """Acquire in memory (not yet durable) on top of `prepared.change`, holding the
        partition's lock; spends `budget` ([records, bytes]). What the fetch got without
        a write to wait for goes straight into `fetched`."""
        key, sp = prepared.key, prepared.sp
        log_part = self.log_partition(key.topic_id, key.partition)
        if log_part is None:
            fetched[key] = self._gone(key)
            return
        if getattr(log_part, "fenced", None) is not None:
            # Another broker leads the partition now (its log was claimed: Partition.fenced).
            fetched[key] = FetchedPartition(error_code=ErrorCode.not_leader_or_follower)
            return
        # Retention or DeleteRecords moved the log start: SPSO follows first.
        sp.stack_on(prepared.change)
        prepared.change = sp.update_log_start_offset(log_part.log_start_offset)
        if not sp.can_acquire():
            fetched[key] = FetchedPartition()
            return
        committed_only = sp.config.isolation_level == "read_committed"
        # read_uncommitted acquires up to the log end: handed out once durable (see
        # `until_durable`), the fetch's work overlaps the records' fsync.
        upper = log_part.last_stable_offset if committed_only else log_part.log_end_offset
        offset = sp.next_fetch_offset()
        if offset >= upper:
            fetched[key] = FetchedPartition()
            return
        data = log_part.read(
            offset,
            max(min(budget[1], PARTITION_READ_BYTES), 1),
            committed_only=committed_only,
            beyond_high_watermark=not committed_only,
        )
        headers = [(pos, h) for pos, h in iter_batches(data, validate=False)]
        if not headers:
            fetched[key] = FetchedPartition()
            return
        # Control batches (transaction markers) are never delivered: archived as gaps; so
        # are, for share.isolation.level=read_committed, the batches of aborted transactions.
        gaps = [(h.base_offset, h.last_offset) for _, h in headers if h.is_control]
        if committed_only:
            aborted = log_part.aborted_transactions(offset, headers[-1][1].next_offset)
            if aborted:
                gaps = sorted(gaps + aborted_batch_ranges((h for _, h in headers), aborted))
        sp.stack_on(prepared.change)
        result = sp.acquire(
            member_id,
            [(h.base_offset, h.last_offset) for _, h in headers],
            max_records=budget[0],
            batch_size=batch_size,
            now_ms=self.clock.now_ms(),
            gaps=gaps,
            mode=mode,
        )
        prepared.change = result.change
        chunks = []
        for pos, h in headers:
            if any(
                r.first_offset <= h.last_offset and r.last_offset >= h.base_offset
                for r in result.acquired
            ):
                chunks.append(data[pos : pos + h.size])
        prepared.acquired = result.acquired
        prepared.records = b"".join(chunks)
        prepared.operation = "acknowledge_and_acquire" if prepared.acknowledged else "acquire"
        budget[0] -= result.record_count
        budget[1] -= len(prepared.records)

    def acquire_beside(
        self,
        key: ShareStateKey,
        sp: SharePartition,
        member_id: str,
        budget: list[int],
        batch_size: int,
        fetched: dict[ShareStateKey, FetchedPartition],
        mode: ShareAcquireMode = ShareAcquireMode.BATCH_OPTIMIZED,
    ) -> bool:
        """Acquire new records of a partition whose lock another request holds while its
        change is pending (an acknowledgement's share-state write in flight), as Kafka
        lets a fetch acquire then: only records past SPEO, read from the log end of the
        share partition, with nothing to archive in them (`SharePartition
        .acquire_beside`). Final at once (nothing durable changes), so what it got goes
        straight into `fetched`. False when it cannot (the caller skips the partition,
        and the lock's release wakes the fetch, as before)."""
        if not sp.initialized or not sp.can_acquire_beside():
            return False
        log_part = self.log_partition(key.topic_id, key.partition)
        if log_part is None or getattr(log_part, "fenced", None) is not None:
            return False
        if log_part.log_start_offset > sp.spso:
            return False  # the log start moved: SPSO follows it first, a durable change
        committed_only = sp.config.isolation_level == "read_committed"
        upper = log_part.last_stable_offset if committed_only else log_part.log_end_offset
        offset = sp.speo
        if offset >= upper:
            return False
        data = log_part.read(
            offset,
            max(min(budget[1], PARTITION_READ_BYTES), 1),
            committed_only=committed_only,
            beyond_high_watermark=not committed_only,
        )
        headers = [(pos, h) for pos, h in iter_batches(data, validate=False)]
        if not headers or any(h.is_control for _, h in headers):
            return False  # control batches are archived: a durable change
        if committed_only and log_part.aborted_transactions(offset, headers[-1][1].next_offset):
            return False
        acquired = sp.acquire_beside(
            member_id,
            [(h.base_offset, h.last_offset) for _, h in headers],
            max_records=budget[0],
            batch_size=batch_size,
            now_ms=self.clock.now_ms(),
            mode=mode,
        )
        if not acquired:
            return False
        chunks = [
            data[pos : pos + h.size]
            for pos, h in headers
            if any(
                r.first_offset <= h.last_offset and r.last_offset >= h.base_offset for r in acquired
            )
        ]
        records = b"".join(chunks)
        fetched[key] = FetchedPartition(records=records, acquired=list(acquired))
        budget[0] -= sum(r.last_offset - r.first_offset + 1 for r in acquired)
        budget[1] -= len(records)
        if trace.ENABLED:
            trace.event("acquired_beside")
        return True

    def _gone(self, key: ShareStateKey) -> FetchedPartition:
        """A partition whose log is not here: led by another broker, or unknown."""
        moved = self.not_leader(key.topic_id, key.partition)
        if moved is None:
            return FetchedPartition(error_code=ErrorCode.unknown_topic_or_partition)
        return FetchedPartition(error_code=moved.code, error_message=moved.message)

    def acquired(self, key: ShareStateKey, p: Prepared) -> FetchedPartition:
        """An acquisition now committed, to hand out once its records are durable (the
        caller arms the partition's lock timer once for the whole change)."""
        if not p.acquired:
            return FetchedPartition()
        return FetchedPartition(records=p.records, acquired=list(p.acquired))

    async def until_durable(self, fetched: dict[ShareStateKey, FetchedPartition]) -> None:
        """Return once every record handed out is durable in its log.

        A fetch acquires records as soon as they are appended, so that its work (and the
        write of any acknowledgements it carries) is done while the records' own fsync
        runs; nothing is handed out before the high watermark has passed it. When the
        log's fsync failed, the partition answers with the error and its records stay
        acquired until their lock expires. Records are counted as acquired (metrics)
        when they are handed out."""
        for key, got in fetched.items():
            if not got.acquired:
                continue
            log_part = self.log_partition(key.topic_id, key.partition)
            last = got.acquired[-1].last_offset
            if log_part is None:
                # Gone meanwhile (led by another broker now, or deleted): its share
                # partition was unloaded with what it acquired; nothing is handed out.
                fetched[key] = self._gone(key)
                continue
            if log_part.high_watermark > last:
                self.metrics.acquired(key, got.acquired)
                continue
            try:
                await log_part.wait_durable(last, DURABLE_WAIT_S, delivery=True)
            except KafkaError as exc:
                log.error(
                    "acquired_records_not_durable",
                    group=key.group_id,
                    topic=log_part.topic,
                    partition=key.partition,
                    last_offset=last,
                    error=exc.code.name,
                    reason=exc.message,
                )
                fetched[key] = FetchedPartition(error_code=exc.code, error_message=exc.message)
            else:
                self.metrics.acquired(key, got.acquired)
