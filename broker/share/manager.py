"""The share-partition leader runtime: owns the `SharePartition`s of every share group.

It loads a share partition's state from the persister the first time it is used
(resolving `share.auto.offset.reset` when the state has no start offset yet), reads
log batches for acquisition, persists every durable change before the caller
answers, fires acquisition-lock timeouts, unloads idle partitions, and wakes parked
share fetches when records become available again.

Every change of a share partition is two-phase: the core applies it in memory, the
manager writes its StateUpdate through the persister, then commits it, or rolls it
back when the write fails, so memory is never ahead of the share coordinator. Changes
of one share partition are serialized (one lock per partition held from the call into
the core until commit or rollback), so none is built on one that may yet be undone; a
fetch only try-acquires those locks and skips a busy partition, and every other wait for
one is bounded (`broker.share.locks`), so no request waits on another for ever.
An acquisition alone changes nothing durable (KIP-932: the Acquired state is transient)
and commits at once: a ShareFetch writes only the acknowledgements it carries.
Time comes from an injected `Clock`.
"""

from __future__ import annotations

import asyncio
import heapq
import uuid
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol

import structlog

from broker import trace
from broker.metrics import ShareMetrics
from broker.share.locks import FetchLocks
from broker.share.partition import (
    NO_CHANGE,
    AcquiredRange,
    PendingChange,
    ReleaseResult,
    ShareAcquireMode,
    SharePartition,
    SharePartitionConfig,
)
from broker.tasks import guarded, spawn
from coordinator.group_config import GroupConfig
from coordinator.share_persister import StateWrite, write_states
from coordinator.share_state import Persister, ShareStateKey
from persister.clock import SYSTEM_CLOCK, Clock, Timer
from persister.txn_index import AbortedTxn, aborted_batch_ranges
from protocol.errors import ErrorCode, KafkaError
from protocol.records import iter_batches

log = structlog.get_logger("spool.share")

Listener = Callable[[], None]
# A partition's AcknowledgementBatches: (first offset, last offset, acknowledge types).
AckBatches = list[tuple[int, int, tuple[int, ...]]]
# An acknowledgement's outcome: error code and message.
AckOutcome = tuple[ErrorCode, str | None]
# Kafka's leader epoch for share state writes; spool is one node and never changes leader.
LEADER_EPOCH = 0
# Bytes read from one partition's log per share fetch, like Kafka's default
# max.partition.fetch.bytes: a fetch needs only MaxRecords records, and reading (and
# parsing the batch headers of) the whole MaxBytes would make every fetch cost as much
# as the backlog.
PARTITION_READ_BYTES = 1024 * 1024
# How long a fetch waits for records it acquired before their log fsync finished.
DURABLE_WAIT_S = 30.0
# A share partition holding no acquired records and unused this long is unloaded; its
# state is durable and is read back on next use, so memory follows the active ones.
IDLE_UNLOAD_MS = 60_000
# How often idle share partitions are looked for.
UNLOAD_CHECK_INTERVAL_MS = 10_000
# When the write releasing expired locks fails, the records stay acquired (memory must not
# run ahead of the share coordinator) and the expiry is tried again this much later.
EXPIRY_RETRY_BACKOFF_MS = 1_000

# The longest a request waits for a share partition another request is changing: its
# acknowledgements, a member's release, a lock expiry. The holder does at most one load and
# one share-state write, which Kafka bounds by share.coordinator.write.timeout.ms (5000).
# Past it an acknowledgement fails with REQUEST_TIMED_OUT and its records stay acquired.
LOCK_WAIT_MS = 5_000

# Share coordinator errors after which the leader's view of the partition cannot be trusted:
# it is dropped and read afresh on next use (Kafka's fencedSharePartitionHandler).
_FENCED = frozenset({ErrorCode.fenced_state_epoch, ErrorCode.fenced_leader_epoch})
_DROP_STATE = frozenset(
    {
        ErrorCode.not_leader_or_follower,
        ErrorCode.group_id_not_found,
        ErrorCode.unknown_topic_or_partition,
    }
)
_PASSED_ON = frozenset(
    {
        ErrorCode.kafka_storage_error,
        ErrorCode.not_leader_or_follower,
        ErrorCode.group_id_not_found,
        ErrorCode.unknown_topic_or_partition,
    }
)
_COORDINATOR_UNAVAILABLE = frozenset(
    {
        ErrorCode.not_coordinator,
        ErrorCode.coordinator_not_available,
        ErrorCode.coordinator_load_in_progress,
    }
)


def persister_error(exc: Exception) -> KafkaError:
    """What a share client is told when the share coordinator failed a call.

    As Kafka's SharePartition.fetchPersisterError: a fenced state or leader epoch becomes
    NOT_LEADER_OR_FOLLOWER (the client refreshes metadata and retries), coordinator errors
    COORDINATOR_NOT_AVAILABLE, GROUP_ID_NOT_FOUND and UNKNOWN_TOPIC_OR_PARTITION stay, and
    any other code is UNKNOWN_SERVER_ERROR (it is no fault of the client's request). A failed
    durable write (KAFKA_STORAGE_ERROR, or an OSError reaching us raw) is KAFKA_STORAGE_ERROR.
    """
    if isinstance(exc, KafkaError):
        if exc.code in _FENCED:
            return KafkaError(
                ErrorCode.not_leader_or_follower,
                f"share-partition state was fenced ({exc.code.name}): {exc.message or ''}",
            )
        if exc.code in _COORDINATOR_UNAVAILABLE:
            return KafkaError(ErrorCode.coordinator_not_available, exc.message)
        if exc.code in _PASSED_ON:
            return exc
        return KafkaError(
            ErrorCode.unknown_server_error,
            f"share coordinator failed with {exc.code.name}: {exc.message or ''}",
        )
    if isinstance(exc, OSError):
        return KafkaError(
            ErrorCode.kafka_storage_error, f"share-state write failed: {exc.strerror or exc}"
        )
    return KafkaError(ErrorCode.unknown_server_error, "share-state write failed: server error")


def _reraise_as(error: KafkaError, cause: Exception) -> NoReturn:
    if error is cause:
        raise error
    raise error from cause


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
        *,
        clock: Clock = SYSTEM_CLOCK,
        idle_unload_ms: int = IDLE_UNLOAD_MS,
        unload_check_interval_ms: int = UNLOAD_CHECK_INTERVAL_MS,
        expiry_retry_backoff_ms: int = EXPIRY_RETRY_BACKOFF_MS,
        lock_wait_ms: int = LOCK_WAIT_MS,
        metrics: ShareMetrics | None = None,
    ) -> None:
        self.persister = persister
        # Counted only once a change is durable, so metrics never run ahead of the state.
        self.metrics = metrics if metrics is not None else ShareMetrics()
        self.groups = groups
        self.log_partition = log_partition
        self.offset_for_timestamp = offset_for_timestamp
        self.clock = clock
        self.idle_unload_ms = idle_unload_ms
        self.unload_check_interval_ms = unload_check_interval_ms
        self.expiry_retry_backoff_ms = expiry_retry_backoff_ms
        self.partitions: dict[ShareStateKey, SharePartition] = {}
        # One change at a time per share partition, held from the core until commit.
        self.lock_wait_ms = lock_wait_ms
        self._locks: FetchLocks[ShareStateKey] = FetchLocks(clock, on_free=self._notify)
        self._listeners: dict[ShareStateKey, set[Listener]] = {}
        # Lock-expiry wake-ups: a heap of (at_ms, key), and per key the earliest one queued.
        self._deadlines: list[tuple[int, ShareStateKey]] = []
        self._armed: dict[ShareStateKey, int] = {}
        self._timer: Timer | None = None
        self._timer_at: int | None = None
        self._sweep_timer: Timer | None = None
        self._background: set[asyncio.Future[Any]] = set()
        self._last_used: dict[ShareStateKey, int] = {}
        self._stopped = False

    def start(self) -> None:
        """Start the idle-unload sweep (lock-expiry timers start as records are acquired)."""
        self._stopped = False
        self._schedule_sweep()

    def stop(self) -> None:
        self._stopped = True
        for timer in (self._timer, self._sweep_timer):
            if timer is not None:
                timer.cancel()
        self._timer = self._timer_at = self._sweep_timer = None
        for task in list(self._background):
            task.cancel()

    async def settle(self) -> None:
        """Wait until the background work started so far (lock expiry) has finished."""
        while pending := [task for task in self._background if not task.done()]:
            await asyncio.gather(*pending, return_exceptions=True)

    # -- serialization and persistence ------------------------------------------------

    async def _write(
        self,
        key: ShareStateKey,
        sp: SharePartition,
        change: PendingChange,
        operation: str,
        **context: object,
    ) -> None:
        """Persist `change` and commit it; on failure roll it back and raise the KafkaError
        the client gets (the partition is dropped when its state was fenced)."""
        update = change.state_update
        if update is None:
            change.commit()
            return
        if trace.ENABLED:
            trace.event("state_write", partitions=1, operation=operation)
        try:
            await self.persister.write_state(
                key,
                sp.state_epoch,
                LEADER_EPOCH,
                update.start_offset,
                update.state_batches,
                delivery_complete_count=update.delivery_complete_count,
            )
        except BaseException as exc:
            # Memory must not run ahead of the share coordinator: undo, whatever went wrong
            # (a cancelled caller included, or the partition would stay locked forever).
            change.rollback()
            if not isinstance(exc, Exception):
                raise
            _reraise_as(self._failed(key, sp, operation, exc, context), exc)
        change.commit()

    async def _write_many(self, writes: list[_Write]) -> list[KafkaError | None]:
        """Persist several partitions' changes as one share-state write (one append, one
        fsync) and commit each; on failure roll each back. Per change, the KafkaError the
        client gets or None. The caller holds every partition's lock."""
        todo = [w for w in writes if w.change.state_update is not None]
        for w in writes:
            if w.change.state_update is None:
                w.change.commit()
        if not todo:
            return [None] * len(writes)
        if len(todo) == 1:
            # One partition: the plain path (and any persister double's write_state).
            w = todo[0]
            try:
                await self._write(w.key, w.sp, w.change, w.operation, **w.context)
            except KafkaError as exc:
                return [exc if x is w else None for x in writes]
            return [None] * len(writes)
        state_writes = []
        for w in todo:
            update = w.change.state_update
            assert update is not None
            state_writes.append(
                StateWrite(
                    w.key,
                    w.sp.state_epoch,
                    LEADER_EPOCH,
                    update.start_offset,
                    update.state_batches,
                    update.delivery_complete_count,
                )
            )
        if trace.ENABLED:
            trace.event("state_write", partitions=len(state_writes))
        try:
            outcomes = await write_states(self.persister, state_writes)
        except BaseException:
            # Memory must not run ahead of the share coordinator (a cancelled caller too).
            for w in todo:
                w.change.rollback()
            raise
        errors: dict[int, KafkaError] = {}
        for w, outcome in zip(todo, outcomes, strict=True):
            if outcome is None:
                w.change.commit()
                continue
            w.change.rollback()
            errors[id(w)] = self._failed(w.key, w.sp, w.operation, outcome, w.context)
        return [errors.get(id(w)) for w in writes]

    def _failed(
        self,
        key: ShareStateKey,
        sp: SharePartition | None,
        operation: str,
        exc: Exception,
        context: dict[str, object],
        event: str = "share_state_write_failed",
    ) -> KafkaError:
        """Log a failed share coordinator call with its context; the error for the client."""
        error = persister_error(exc)
        # A fenced epoch is the share coordinator doing its job; anything else is a failure.
        emit = log.warning if error.code in _DROP_STATE else log.error
        emit(
            event,
            group=key.group_id,
            topic=self._topic_name(key),
            topic_id=str(key.topic_id),
            partition=key.partition,
            operation=operation,
            error=error.code.name,
            reason=error.message,
            **context,
            exc_info=None if isinstance(exc, KafkaError | OSError) else exc,
        )
        if error.code in _DROP_STATE:
            self._unload(key, sp)
        return error

    def _unload(self, key: ShareStateKey, sp: SharePartition | None) -> None:
        """Forget a share partition whose state was fenced: the next use reads it afresh."""
        if sp is not None and self.partitions.get(key) is sp:
            del self.partitions[key]
            self._last_used.pop(key, None)
            log.info(
                "share_partition_fenced",
                group=key.group_id,
                topic=self._topic_name(key),
                partition=key.partition,
            )
            self._notify(key)

    def _topic_name(self, key: ShareStateKey) -> str | None:
        log_part = self.log_partition(key.topic_id, key.partition)
        return None if log_part is None else log_part.topic

    # -- loading ----------------------------------------------------------------

    async def _get(self, key: ShareStateKey) -> SharePartition:
        """The loaded share partition of `key`, loading it if needed; hold its lock."""
        sp = self.partitions.get(key)
        if sp is not None:
            sp.config = partition_config(self.groups.config(key.group_id))
        else:
            try:
                sp = await self._load(key)
            except KafkaError as exc:
                _reraise_as(persister_error(exc), exc)
            except Exception as exc:
                failed = self._failed(key, None, "load", exc, {}, event="share_state_read_failed")
                _reraise_as(failed, exc)
            self.partitions[key] = sp
        self._last_used[key] = self.clock.now_ms()
        return sp

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
            await self._write(key, sp, sp.initialize(start), "initialize")
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
        target = config.auto_offset_reset.timestamp(self.clock.now_ms())
        if target == -1:
            return log_part.high_watermark
        if target == -2:
            return log_part.log_start_offset
        found = self.offset_for_timestamp(log_part, target)
        return log_part.high_watermark if found is None else found

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
        """Acquire records of one partition for a member and read their batches.

        The acquisition itself is not written (KIP-932); records are handed out only once
        durable in their log, and a failed log fsync is the partition's error.
        """
        fetched = await self.acquire_many(
            [key], member_id, max_records=max_records, batch_size=batch_size, max_bytes=max_bytes
        )
        return fetched.get(key, FetchedPartition())

    async def acquire_many(
        self,
        keys: Sequence[ShareStateKey],
        member_id: str,
        *,
        max_records: int,
        batch_size: int,
        max_bytes: int,
    ) -> dict[ShareStateKey, FetchedPartition]:
        """`acquire` over several partitions, in order, sharing MaxRecords and MaxBytes;
        what changes durably with them (archived gaps, a moved SPSO) is one share-state
        write. Partitions left out once MaxRecords or MaxBytes is used up are not in the
        result."""
        _, fetched = await self.acknowledge_and_acquire(
            {}, keys, member_id, max_records=max_records, batch_size=batch_size, max_bytes=max_bytes
        )
        return fetched

    async def acknowledge_and_acquire(
        self,
        acks: Mapping[ShareStateKey, AckBatches],
        keys: Sequence[ShareStateKey],
        member_id: str,
        *,
        max_records: int = 0,
        batch_size: int = 1,
        max_bytes: int = 0,
        mode: ShareAcquireMode = ShareAcquireMode.BATCH_OPTIMIZED,
    ) -> tuple[dict[ShareStateKey, AckOutcome], dict[ShareStateKey, FetchedPartition]]:
        """A ShareFetch's work: apply the member's acknowledgements (`acks`), then acquire on
        `keys` in order, sharing MaxRecords and MaxBytes; whatever changed durably is
        persisted as one share-state write (one fsync) before either result is reported.
        Acquisitions alone change nothing durable (KIP-932) and need no write. `mode` is
        the ShareFetch's ShareAcquireMode (KIP-1206): with RECORD_LIMIT, MaxRecords is a
        hard limit across the request, as Kafka 4.2 passes each partition what is left.

        On a partition with both, the acquisition is stacked on the acknowledgement
        (`SharePartition.stack_on`): one change, so a failed write undoes both and each
        result carries the error. Each partition's lock is held from its change until the
        shared write is committed or rolled back (`FetchLocks`): the acknowledged
        partitions' locks are waited for, at most `lock_wait_ms` (REQUEST_TIMED_OUT past
        it, the records stay acquired), in one global order; a partition only fetched from
        is skipped while another request holds it, as Kafka skips a share partition whose
        fetch lock it cannot take, so no request waits on another unboundedly. Returns per
        acknowledged partition its error code and message, and per fetched partition what
        it got (left out once MaxRecords or MaxBytes is used up or while busy).
        """
        ack_results: dict[ShareStateKey, AckOutcome] = {}
        fetched: dict[ShareStateKey, FetchedPartition] = {}
        released: list[ShareStateKey] = []
        budget = [max_records, max_bytes]
        fetching = set(keys)
        # Acknowledgements must be applied: their locks are waited for, bounded, in one
        # global order. Acquisitions only try-acquire (Kafka's maybeAcquireFetchLock): a
        # partition another request holds is skipped, and its release wakes this fetch.
        held, busy = await self._locks.ordered(acks, self.lock_wait_ms)
        for key in busy:
            ack_results[key] = _busy(key, self.lock_wait_ms)
        prepared: list[_Prepared] = []
        try:
            for key in list(keys) + [key for key in held if key not in fetching]:
                if key in busy:
                    continue
                if key not in acks:
                    if budget[0] <= 0 or budget[1] <= 0:
                        continue  # MaxRecords or MaxBytes used up: left for the next fetch
                    if not self._locks.try_acquire(key):
                        continue  # another request's: skipped, woken when it is let go
                    held.append(key)
                p = await self._prepare(
                    key, acks, fetching, member_id, budget, batch_size, ack_results, fetched, mode
                )
                if p is not None:
                    prepared.append(p)
            outcomes = await self._write_many(
                [
                    _Write(p.key, p.sp, p.change, p.operation, {"member": member_id})
                    for p in prepared
                ]
            )
            for p, error in zip(prepared, outcomes, strict=True):
                self._written(p, error, acks, ack_results, fetched, released)
        except BaseException:
            # Interrupted (cancelled) before the write: memory goes back as it was.
            for p in prepared:
                if p.change.pending:
                    p.change.rollback()
            raise
        finally:
            self._locks.release_all(held)
        if trace.ENABLED:
            trace.event("acquire_done")
        # The locks are let go: fetches parked on these partitions may take them.
        for key in released:
            self._notify(key)
        await self._until_durable(fetched)
        return ack_results, fetched

    async def _prepare(
        self,
        key: ShareStateKey,
        acks: Mapping[ShareStateKey, AckBatches],
        fetching: set[ShareStateKey],
        member_id: str,
        budget: list[int],
        batch_size: int,
        ack_results: dict[ShareStateKey, AckOutcome],
        fetched: dict[ShareStateKey, FetchedPartition],
        mode: ShareAcquireMode = ShareAcquireMode.BATCH_OPTIMIZED,
    ) -> _Prepared | None:
        """A partition's part of the request in memory, under its lock: the member's
        acknowledgements, then an acquisition stacked on them. None when there is nothing
        to write or report (its outcome, a failed load or a refusal, is given already)."""
        try:
            sp = await self._get(key)
        except KafkaError as exc:
            if key in acks:
                ack_results[key] = (exc.code, exc.message)
            if key in fetching:
                fetched[key] = FetchedPartition(error_code=exc.code, error_message=exc.message)
            return None
        prepared = _Prepared(key, sp, NO_CHANGE)
        if key in acks:
            self._prepare_acknowledge(prepared, acks[key], member_id, ack_results)
        if key in fetching and budget[0] > 0 and budget[1] > 0:
            await self._prepare_acquire(prepared, member_id, budget, batch_size, fetched, mode)
        if prepared.change is NO_CHANGE and prepared.acquired is None and not prepared.acknowledged:
            return None
        return prepared

    async def _until_durable(self, fetched: dict[ShareStateKey, FetchedPartition]) -> None:
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
            if log_part is None or log_part.high_watermark > last:
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

    def _written(
        self,
        p: _Prepared,
        error: KafkaError | None,
        acks: Mapping[ShareStateKey, AckBatches],
        ack_results: dict[ShareStateKey, AckOutcome],
        fetched: dict[ShareStateKey, FetchedPartition],
        released: list[ShareStateKey],
    ) -> None:
        """A partition's part of the request is durable (or failed with `error`):
        report it, and arm its lock timer for what it acquired."""
        if error is not None:
            if p.acknowledged:
                ack_results[p.key] = (error.code, error.message)
            if p.acquired is not None:
                fetched[p.key] = FetchedPartition(
                    error_code=error.code, error_message=error.message
                )
            return
        if p.acknowledged:
            self._acknowledged(p, acks[p.key], ack_results, released)
        if p.acquired is not None:
            fetched[p.key] = self._acquired(p.key, p)
        self._arm(p.key, p.sp)

    async def _prepare_acquire(
        self,
        prepared: _Prepared,
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
            fetched[key] = FetchedPartition(error_code=ErrorCode.unknown_topic_or_partition)
            return
        # Retention or DeleteRecords moved the log start: SPSO follows first.
        sp.stack_on(prepared.change)
        prepared.change = sp.update_log_start_offset(log_part.log_start_offset)
        if not sp.can_acquire():
            fetched[key] = FetchedPartition()
            return
        committed_only = sp.config.isolation_level == "read_committed"
        # read_uncommitted acquires up to the log end: handed out once durable (see
        # `_until_durable`), the fetch's work overlaps the records' fsync.
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

    def _acquired(self, key: ShareStateKey, p: _Prepared) -> FetchedPartition:
        """An acquisition now committed, to hand out once its records are durable (the
        caller arms the partition's lock timer once for the whole change)."""
        if not p.acquired:
            return FetchedPartition()
        return FetchedPartition(records=p.records, acquired=list(p.acquired))

    # -- acknowledge --------------------------------------------------------------

    async def acknowledge(
        self,
        key: ShareStateKey,
        member_id: str,
        batches: list[tuple[int, int, tuple[int, ...]]],
    ) -> tuple[ErrorCode, str | None]:
        """Apply a member's acknowledgements of one partition; durable before it returns.

        When the write fails the records stay acquired by the member under their lock, so
        the same acknowledgement succeeds once retried (or the lock expires and they are
        delivered again).
        """
        return (await self.acknowledge_many({key: batches}, member_id))[key]

    async def acknowledge_many(
        self, acks: Mapping[ShareStateKey, AckBatches], member_id: str
    ) -> dict[ShareStateKey, tuple[ErrorCode, str | None]]:
        """`acknowledge` over several partitions of one request, persisted as one
        share-state write (one fsync); per partition its error code and message. A failed
        write fails every partition in it and leaves each as it was."""
        results, _ = await self.acknowledge_and_acquire(acks, [], member_id)
        return results

    def _prepare_acknowledge(
        self,
        prepared: _Prepared,
        batches: AckBatches,
        member_id: str,
        results: dict[ShareStateKey, AckOutcome],
    ) -> None:
        """Apply acknowledgements in memory (not yet durable); a refusal goes to `results`."""
        key = prepared.key
        result = prepared.sp.acknowledge(member_id, batches, self.clock.now_ms())
        log.debug(
            "acknowledge",
            group=key.group_id,
            member=member_id,
            partition=key.partition,
            batches=len(batches),
            error=result.error_code.name,
        )
        if result.error_code != ErrorCode.none:
            result.change.commit()  # refused: nothing changed
            log.info(
                "acknowledge_refused",
                group=key.group_id,
                member=member_id,
                topic_id=str(key.topic_id),
                partition=key.partition,
                error=result.error_code.name,
                reason=result.error_message,
            )
            results[key] = (result.error_code, result.error_message)
            return
        prepared.change = result.change
        prepared.acknowledged = True
        prepared.released = result.released
        prepared.operation = "acknowledge"

    def _acknowledged(
        self,
        prepared: _Prepared,
        batches: AckBatches,
        results: dict[ShareStateKey, AckOutcome],
        released: list[ShareStateKey],
    ) -> None:
        """Acknowledgements now durable: report and count them."""
        results[prepared.key] = (ErrorCode.none, None)
        self.metrics.acknowledged(prepared.key, batches, prepared.released)
        if prepared.released:
            released.append(prepared.key)

    async def release_member(
        self, group_id: str, member_id: str, keys: list[ShareStateKey] | None = None
    ) -> int:
        """Give back every record `member_id` holds (it left, timed out or closed), over
        all its partitions with one share-state write (one fsync), as Kafka's
        SharePartitionManager.releaseSession releases a closing session's partitions.

        The partitions' locks are taken in one global order, bounded by `lock_wait_ms`; a
        partition still busy past it, or whose write fails, keeps the member's records
        acquired: their locks expire and the expiry releases them.
        """
        targets = (
            keys if keys is not None else [k for k in self.partitions if k.group_id == group_id]
        )
        held, busy = await self._locks.ordered(
            [k for k in targets if k in self.partitions], self.lock_wait_ms
        )
        for key in busy:
            self._release_busy(key, member_id)
        now = self.clock.now_ms()
        changes: list[tuple[_Write, ReleaseResult]] = []
        notify: list[ShareStateKey] = []
        released = 0
        try:
            for key in held:
                sp = self.partitions.get(key)
                if sp is None:
                    continue
                result = sp.release_member(member_id, now)
                context: dict[str, object] = {"member": member_id}
                changes.append((_Write(key, sp, result.change, "release_member", context), result))
            outcomes = await self._write_many([w for w, _ in changes])
        except BaseException:
            for w, _ in changes:
                if w.change.pending:
                    w.change.rollback()
            raise
        finally:
            self._locks.release_all(held)
        for (w, result), error in zip(changes, outcomes, strict=True):
            if error is not None:
                continue  # logged by _write_many
            self.metrics.member_released(w.key, result.released, _count(result.archived))
            if result.available or result.archived:
                released += result.released
                notify.append(w.key)
        for key in notify:
            self._notify(key)
        if released:
            log.info(
                "member_records_released",
                group=group_id,
                member=member_id,
                records=released,
                partitions=len(notify),
            )
        return released

    def _release_busy(self, key: ShareStateKey, member_id: str) -> None:
        log.warning(
            "member_release_skipped_busy",
            group=key.group_id,
            topic=self._topic_name(key),
            partition=key.partition,
            member=member_id,
            waited_ms=self.lock_wait_ms,
            hint="the member's records stay acquired until their acquisition lock expires",
        )

    # -- idle unloading -----------------------------------------------------------

    def unload_idle(self, at_ms: int, idle_ms: int | None = None) -> int:
        """Drop share partitions nobody uses and nothing holds; returns how many."""
        idle_for = self.idle_unload_ms if idle_ms is None else idle_ms
        idle = [
            key
            for key, sp in self.partitions.items()
            if sp.acquired_count == 0
            and key not in self._listeners
            and key not in self._locks
            and at_ms - self._last_used.get(key, 0) >= idle_for
        ]
        for key in idle:
            del self.partitions[key]
            self._last_used.pop(key, None)
        if idle:
            log.info("share_partitions_unloaded", count=len(idle), loaded=len(self.partitions))
        return len(idle)

    def _schedule_sweep(self, at_ms: int | None = None) -> None:
        if at_ms is None:
            at_ms = self.clock.now_ms() + self.unload_check_interval_ms
        self._sweep_timer = self.clock.call_at(
            at_ms, guarded(lambda: self._sweep(at_ms), what="share_partition_unload")
        )

    def _sweep(self, at_ms: int) -> None:
        self._sweep_timer = None
        try:
            self.unload_idle(self.clock.now_ms())
        finally:
            if not self._stopped:
                # The next point of the sweep's fixed grid after now: late ticks do not
                # shift it, and a long stall does not fire a burst of catch-up sweeps.
                interval = self.unload_check_interval_ms
                behind = self.clock.now_ms() - at_ms
                self._schedule_sweep(at_ms + interval * (max(behind, 0) // interval + 1))

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
        if deadline is not None:
            self._wake_at(key, deadline)

    def _wake_at(self, key: ShareStateKey, at_ms: int) -> None:
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
        self._spawn(self.expire_locks(), "share_lock_expiry")

    def _spawn(self, coro: Coroutine[Any, Any, None], what: str, **context: object) -> None:
        spawn(coro, what=what, tasks=self._background, **context)

    async def expire_locks(self) -> None:
        """Release the records of every lock that is due; a partition whose write fails is
        tried again `expiry_retry_backoff_ms` later."""
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
                        topic=self._topic_name(key),
                        partition=key.partition,
                    )
                    self._wake_at(key, self.clock.now_ms() + self.expiry_retry_backoff_ms)
        finally:
            if self._deadlines and (
                self._timer_at is None or self._deadlines[0][0] < self._timer_at
            ):
                self._schedule(self._deadlines[0][0])

    async def _expire(self, key: ShareStateKey) -> None:
        if not await self._locks.acquire(key, self.lock_wait_ms):
            # Another request kept the partition busy all along: look again shortly.
            self._wake_at(key, self.clock.now_ms() + self.expiry_retry_backoff_ms)
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
                self._wake_at(key, deadline)
                return
            result = sp.expire_locks(now)
            try:
                await self._write(key, sp, result.change, "lock_expiry")
            except KafkaError:
                # Logged by _write. The records stay acquired past their deadline until a
                # write succeeds; a fenced partition was dropped and needs no retry.
                if self.partitions.get(key) is sp:
                    self._wake_at(key, now + self.expiry_retry_backoff_ms)
                return
            self.metrics.locks_expired(key, result.released, _count(result.archived))
            self._arm(key, sp)
        finally:
            self._locks.release(key)
        if result.available or result.archived:
            log.info(
                "acquisition_locks_expired",
                group=key.group_id,
                topic_id=str(key.topic_id),
                partition=key.partition,
                available=result.released,
                archived=_count(result.archived),
            )
            self._notify(key)

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


@dataclass(slots=True, eq=False)
class _Write:
    """A share partition's pending change, to persist with others (`_write_many`)."""

    key: ShareStateKey
    sp: SharePartition
    change: PendingChange
    operation: str
    context: dict[str, object]


@dataclass(slots=True, eq=False)
class _Prepared:
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


def _busy(key: ShareStateKey, waited_ms: int) -> AckOutcome:
    return (
        ErrorCode.request_timed_out,
        f"Share partition {key.topic_id}-{key.partition} of group {key.group_id} stayed "
        f"busy with another request for {waited_ms} ms; the acknowledgement was not "
        "applied and its records stay acquired until acknowledged again or their "
        "acquisition lock expires.",
    )


def _count(ranges: Iterable[tuple[int, int]]) -> int:
    return sum(last - first + 1 for first, last in ranges)


@dataclass(frozen=True, slots=True)
class _KeyListeners:
    manager: SharePartitionManager
    key: ShareStateKey

    def add_listener(self, listener: Listener) -> None:
        self.manager.add_listener(self.key, listener)

    def remove_listener(self, listener: Listener) -> None:
        self.manager.remove_listener(self.key, listener)
