"""The share-partition leader runtime: owns the `SharePartition`s of every share group.

It loads a share partition's state from the persister the first time it is used
(resolving `share.auto.offset.reset` when the state has no start offset yet), applies a
request's acknowledgements and acquisitions across its partitions, releases a leaving
member's records, unloads idle partitions, and wakes parked share fetches when records
become available again. Its parts, each in its own module:

- `broker.share.locks`: one change of a share partition at a time; a fetch only
  try-acquires (Kafka's maybeAcquireFetchLock), every other wait is bounded, so no
  request waits on another for ever.
- `broker.share.state_writer`: every change is two-phase, applied in memory, written
  through the persister, then committed or rolled back, so memory is never ahead of the
  share coordinator; one request's changes over many partitions are one write (one fsync).
- `broker.share.reader`: log batches read and acquired for a fetch, handed out once
  durable in their log.
- `broker.share.expiry`: acquisition-lock timeouts on the clock.
- `broker.share.dead_letter`: KIP-1191's second phase, in the background: the ARCHIVING
  runs a committed change (or a load) leaves are copied to the group's dead-letter topic
  through the `DeadLetterSink`, then archived.

An acquisition alone changes nothing durable (KIP-932: the Acquired state is transient)
and commits at once: a ShareFetch writes only the acknowledgements it carries.
Time comes from an injected `Clock`.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any, Protocol

import structlog

from broker import trace
from broker.metrics import ShareMetrics
from broker.partitions import Listener, Listeners
from broker.share.dead_letter import DeadLetterWriter, RefusingSink
from broker.share.dead_letters import DeadLetterSink
from broker.share.expiry import LockExpiry
from broker.share.locks import FetchLocks
from broker.share.partition import (
    NO_CHANGE,
    ReleaseResult,
    ShareAcquireMode,
    SharePartition,
    SharePartitionConfig,
)
from broker.share.reader import (
    AcquisitionReader,
    Prepared,
)
from broker.share.reader import FetchedPartition as FetchedPartition
from broker.share.reader import LogPartition as LogPartition
from broker.share.state_writer import (
    LEADER_EPOCH,
    PendingWrite,
    StateWriter,
    reraise_as,
)
from broker.share.state_writer import persister_error as persister_error
from broker.tasks import guarded, spawn
from coordinator.group_config import GroupConfig
from coordinator.share_state import Persister, ShareStateKey
from persister.clock import SYSTEM_CLOCK, Clock, Timer
from protocol.errors import ErrorCode, KafkaError

log = structlog.get_logger("spool.share")

# A partition's AcknowledgementBatches: (first offset, last offset, acknowledge types).
AckBatches = list[tuple[int, int, tuple[int, ...]]]
# An acknowledgement's outcome: error code and message.
AckOutcome = tuple[ErrorCode, str | None]
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


class GroupConfigs(Protocol):
    def config(self, group_id: str) -> GroupConfig: ...
    async def ensure_initialized(
        self, group_id: str, topic_id: uuid.UUID, partition: int
    ) -> None: ...


def partition_config(config: GroupConfig) -> SharePartitionConfig:
    return SharePartitionConfig(
        record_lock_duration_ms=config.record_lock_duration_ms,
        delivery_count_limit=config.delivery_count_limit,
        max_in_flight_records=config.partition_max_record_locks,
        isolation_level=config.isolation_level,
        # Follows the group config at every use (`_get`): runs already ARCHIVING drain
        # either way.
        dead_letter=config.dead_letter_enabled,
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
        not_leader: Callable[[uuid.UUID, int], KafkaError | None] | None = None,
        leader_epoch: Callable[[uuid.UUID, int], int] | None = None,
        dead_letter_sink: DeadLetterSink | None = None,
    ) -> None:
        self.persister = persister
        # The topic partition's leader epoch (broker.cluster), read and written with the
        # share state so the share coordinator fences a former leader; 0 for a broker alone.
        self.leader_epoch = leader_epoch if leader_epoch is not None else _epoch_zero
        # NOT_LEADER_OR_FOLLOWER for a topic partition another broker leads now (whose
        # log `log_partition` no longer gives), else None.
        self.not_leader = not_leader if not_leader is not None else _led_here
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
        self._listeners: dict[ShareStateKey, Listeners] = {}
        self._sweep_timer: Timer | None = None
        self._background: set[asyncio.Future[Any]] = set()
        self._last_used: dict[ShareStateKey, int] = {}
        self._stopped = False
        self.reader = AcquisitionReader(log_partition, clock, self.metrics, self.not_leader)
        self.writer = StateWriter(
            persister, self._topic_name, self._unload, on_committed=self._committed
        )
        # Without a sink, ARCHIVING runs (left by an earlier broker) are archived uncopied.
        self.dead_letters = DeadLetterWriter(
            clock=clock,
            sink=dead_letter_sink if dead_letter_sink is not None else RefusingSink(),
            partitions=self.partitions,
            locks=self._locks,
            writer=self.writer,
            metrics=self.metrics,
            notify=self._notify,
            spawn=self._spawn,
            topic_name=self._topic_name,
            lock_wait_ms=lock_wait_ms,
        )
        self.expiry = LockExpiry(
            clock=clock,
            partitions=self.partitions,
            locks=self._locks,
            writer=self.writer,
            metrics=self.metrics,
            notify=self._notify,
            spawn=self._spawn,
            topic_name=self._topic_name,
            lock_wait_ms=lock_wait_ms,
            retry_backoff_ms=expiry_retry_backoff_ms,
        )

    def start(self) -> None:
        """Start the idle-unload sweep (lock-expiry timers start as records are acquired)."""
        self._stopped = False
        self.expiry.start()
        self.dead_letters.start()
        self._schedule_sweep()

    def stop(self) -> None:
        self._stopped = True
        self.expiry.stop()
        self.dead_letters.stop()
        if self._sweep_timer is not None:
            self._sweep_timer.cancel()
        self._sweep_timer = None
        for task in list(self._background):
            task.cancel()

    def _spawn(self, coro: Coroutine[Any, Any, None], what: str) -> None:
        spawn(coro, what=what, tasks=self._background)

    async def expire_locks(self) -> None:
        """Release the records of every acquisition lock that is due (`LockExpiry`)."""
        await self.expiry.expire_locks()

    async def settle(self) -> None:
        """Wait until the background work started so far (lock expiry) has finished."""
        while pending := [task for task in self._background if not task.done()]:
            await asyncio.gather(*pending, return_exceptions=True)

    # -- serialization and persistence ------------------------------------------------

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

    def _committed(self, key: ShareStateKey, sp: SharePartition) -> None:
        """A change of `sp` is durable: have its new ARCHIVING runs dead-lettered."""
        self.dead_letters.poke(key, sp)

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
                reraise_as(persister_error(exc), exc)
            except Exception as exc:
                failed = self.writer.failed(
                    key, None, "load", exc, {}, event="share_state_read_failed"
                )
                reraise_as(failed, exc)
            self.partitions[key] = sp
            # ARCHIVING runs an earlier owner left: copied again, then archived.
            self.dead_letters.poke(key, sp)
        self._last_used[key] = self.clock.now_ms()
        return sp

    async def _load(self, key: ShareStateKey) -> SharePartition:
        log_part = self.log_partition(key.topic_id, key.partition)
        if log_part is None:
            # Led by another broker now: as Kafka's getOrCreateSharePartition, which
            # finds the partition not led here (ShareFetchUtils.partition).
            raise self.not_leader(key.topic_id, key.partition) or KafkaError(
                ErrorCode.unknown_topic_or_partition,
                f"Partition {key.partition} of topic id {key.topic_id} does not exist",
            )
        await self.groups.ensure_initialized(key.group_id, key.topic_id, key.partition)
        config = self.groups.config(key.group_id)
        leader_epoch = self.leader_epoch(key.topic_id, key.partition)
        state = await self.persister.read_state(key, leader_epoch)
        sp = SharePartition(
            key.group_id,
            key.topic_id,
            key.partition,
            config=partition_config(config),
            state_epoch=state.state_epoch,
            start_offset=state.start_offset,
            state_batches=state.batches,
        )
        sp.leader_epoch = leader_epoch
        if not sp.initialized:
            start = self._reset_offset(config, log_part)
            await self.writer.write(key, sp, sp.initialize(start), "initialize")
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
        prepared: list[Prepared] = []
        try:
            for key in list(keys) + [key for key in held if key not in fetching]:
                if key in busy:
                    continue
                if key not in acks:
                    if budget[0] <= 0 or budget[1] <= 0:
                        continue  # MaxRecords or MaxBytes used up: left for the next fetch
                    if not self._locks.try_acquire(key):
                        # Another request's, its change pending: new records past SPEO
                        # are acquired beside it; else skipped, woken when it is let go.
                        sp = self.partitions.get(key)
                        if sp is not None and self.reader.acquire_beside(
                            key, sp, member_id, budget, batch_size, fetched, mode
                        ):
                            self.expiry.arm(key, sp)
                        continue
                    held.append(key)
                p = await self._prepare(
                    key, acks, fetching, member_id, budget, batch_size, ack_results, fetched, mode
                )
                if p is not None:
                    prepared.append(p)
            outcomes = await self.writer.write_many(
                [
                    PendingWrite(p.key, p.sp, p.change, p.operation, {"member": member_id})
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
        await self.reader.until_durable(fetched)
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
    ) -> Prepared | None:
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
        prepared = Prepared(key, sp, NO_CHANGE)
        try:
            if key in acks:
                self._prepare_acknowledge(prepared, acks[key], member_id, ack_results)
            if key in fetching and budget[0] > 0 and budget[1] > 0:
                await self.reader.prepare_acquire(
                    prepared, member_id, budget, batch_size, fetched, mode
                )
        except BaseException:
            # A failed log read after the acknowledgements were applied: undo them, or the
            # change left pending would refuse every later change of the partition.
            if prepared.change.pending:
                prepared.change.rollback()
            raise
        if prepared.change is NO_CHANGE and prepared.acquired is None and not prepared.acknowledged:
            return None
        return prepared

    def _written(
        self,
        p: Prepared,
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
            fetched[p.key] = self.reader.acquired(p.key, p)
        self.expiry.arm(p.key, p.sp)

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
        prepared: Prepared,
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
        prepared: Prepared,
        batches: AckBatches,
        results: dict[ShareStateKey, AckOutcome],
        released: list[ShareStateKey],
    ) -> None:
        """Acknowledgements now durable: report and count them, and have the partition's
        parked fetches look again. Not only a RELEASE makes records acquirable: an
        ACCEPT or REJECT archives records, which may move the start offset and frees room
        under share.partition.max.record.locks for a fetch that found none (Kafka's
        SharePartitionManager.acknowledge re-checks the delayed share fetches of every
        partition it acknowledged)."""
        results[prepared.key] = (ErrorCode.none, None)
        self.metrics.acknowledged(prepared.key, batches, prepared.released)
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
        # Every partition's lock, loaded or not: a fetch of this member already under way
        # may load one (first use) before or while the release waits, and the records it
        # acquires there must be released too, not stay locked to a gone member until
        # their lock expires. A partition still not loaded once locked is skipped.
        held, busy = await self._locks.ordered(targets, self.lock_wait_ms)
        for key in busy:
            self._release_busy(key, member_id)
        now = self.clock.now_ms()
        changes: list[tuple[PendingWrite, ReleaseResult]] = []
        notify: list[ShareStateKey] = []
        released = 0
        try:
            for key in held:
                sp = self.partitions.get(key)
                if sp is None:
                    continue
                result = sp.release_member(member_id, now)
                context: dict[str, object] = {"member": member_id}
                changes.append(
                    (PendingWrite(key, sp, result.change, "release_member", context), result)
                )
            outcomes = await self.writer.write_many([w for w, _ in changes])
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
            and not self._listeners.get(key)
            and key not in self._locks
            and not sp.has_dead_letters
            and at_ms - self._last_used.get(key, 0) >= idle_for
        ]
        for key in idle:
            del self.partitions[key]
            self._last_used.pop(key, None)
        # Wake-up entries whose parked fetches have all gone (`listeners` keeps them).
        for key in [key for key, listeners in self._listeners.items() if not listeners]:
            del self._listeners[key]
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

    def drop_all(self) -> None:
        """Forget every loaded share partition: the share-state log was claimed by another
        broker (a write refused as fenced), whose share state it is now. A later fetch
        loads afresh, which the refusing persister answers as a moved coordinator."""
        keys = list(self.partitions)
        for key in keys:
            del self.partitions[key]
            self._last_used.pop(key, None)
            self._notify(key)
        log.warning("share_partitions_unloaded_fenced", count=len(keys))

    def drop_partition(self, topic_id: uuid.UUID, partition: int, reason: str) -> int:
        """Unload every group's share partition of a topic partition this broker no
        longer leads (Kafka's SharePartitionListener.onBecomingFollower): the records
        it acquired are released with the memory that held them (the acquired state is
        transient, KIP-932), and the durable share state is what the new leader loads.
        Parked share fetches are woken. Returns how many were unloaded."""
        keys = [k for k in self.partitions if k.topic_id == topic_id and k.partition == partition]
        for key in keys:
            del self.partitions[key]
            self._last_used.pop(key, None)
            self._notify(key)
        if keys:
            log.warning(
                "share_partitions_unloaded_not_leader",
                topic_id=str(topic_id),
                partition=partition,
                count=len(keys),
                reason=reason,
            )
        return len(keys)

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

    # -- wake-ups for parked share fetches -----------------------------------------

    def add_listener(self, key: ShareStateKey, listener: Listener) -> None:
        self.listeners(key).add_listener(listener)

    def remove_listener(self, key: ShareStateKey, listener: Listener) -> None:
        listeners = self._listeners.get(key)
        if listeners is not None:
            listeners.remove_listener(listener)
            if not listeners:
                del self._listeners[key]

    def listeners(self, key: ShareStateKey) -> Listeners:
        """The wake-ups of one share partition (the same `Listeners` a topic partition
        keeps), as a source for `wait_for_any`; an emptied entry is dropped when the
        partition is unloaded."""
        listeners = self._listeners.get(key)
        if listeners is None:
            listeners = self._listeners[key] = Listeners()
        return listeners

    def _notify(self, key: ShareStateKey) -> None:
        listeners = self._listeners.get(key)
        if listeners is not None:
            listeners.notify()


def _epoch_zero(topic_id: uuid.UUID, partition: int) -> int:
    return LEADER_EPOCH


def _led_here(_topic_id: uuid.UUID, _partition: int) -> KafkaError | None:
    return None


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
