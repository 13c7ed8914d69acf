"""The share coordinator as a `Persister`: `ShareCoordinatorShard` run by the coordinator
runtime.

Implements `Persister` for the share-partition leader, the group coordinator and the
wire RPCs (83-87). Each call is a runtime operation keyed by the share-partition key:
the shard computes records from committed state, the runtime writes them to the log,
waits for the fsync, then replays them (the same `replay` recovery uses), so an
acknowledged write survives kill -9 and a failed one changes nothing
(KAFKA_STORAGE_ERROR). `DurablePersister` keeps the log in `data/share-state/` and
compacts its closed segments in a worker thread (`persister.share_compaction`); only
the swap of a compacted segment runs on the event loop. `InMemoryPersister` runs the
same runtime over an in-memory log, for unit tests of its callers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from coordinator.runtime import (
    DEFAULT_CHECKPOINT_INTERVAL_RECORDS,
    Checkpoints,
    CoordinatorRuntime,
    StillValid,
)
from coordinator.share_coordinator import (
    DEFAULT_SNAPSHOT_UPDATE_RECORDS_PER_SNAPSHOT,
    ShareCoordinatorShard,
)
from coordinator.share_state import (
    PersistedBatch,
    Persister,
    ShareState,
    ShareStateKey,
)
from persister import share_records
from persister.checkpoint import CheckpointFile
from persister.clock import SYSTEM_CLOCK, Clock
from persister.commit import GroupCommit
from persister.coordinator_log import KeyValue, MemoryRecordLog, RecordLog, internal_log_config
from persister.file_log import PartitionLog
from persister.share_compaction import plan_share_compaction, write_cleaned_segment
from persister.share_records import UNINITIALIZED_START_OFFSET, UNKNOWN_DELIVERY_COMPLETE_COUNT
from persister.spark import adopt as spark_adopt
from persister.storage import FILE_STORAGE, CoordinatorLog, StorageEngine
from protocol.errors import KafkaError

log = structlog.get_logger("spool.share_coordinator")

# share.coordinator.state.topic.segment.bytes
DEFAULT_SEGMENT_BYTES = 104857600


def _encode(record: share_records.ShareRecord) -> list[KeyValue]:
    return [share_records.encode(record)]


def _decode(key: bytes | None, value: bytes | None) -> share_records.ShareRecord:
    if key is None:
        raise ValueError("share-state record has no key")
    return share_records.decode(key, value)


class _ShardPersister:
    """`Persister` over a `ShareCoordinatorShard` run by a `CoordinatorRuntime`."""

    def __init__(
        self,
        record_log: CoordinatorLog,
        snapshot_update_records_per_snapshot: int,
        clock: Clock,
        checkpoint_file: CheckpointFile | None = None,
        checkpoint_interval_records: int = DEFAULT_CHECKPOINT_INTERVAL_RECORDS,
        compaction_enabled: bool = True,
    ) -> None:
        self.shard = ShareCoordinatorShard(snapshot_update_records_per_snapshot)
        self.clock = clock
        self.compaction = _ShareCompaction(clock)
        self.compaction_enabled = compaction_enabled
        checkpoints = (
            None
            if checkpoint_file is None
            else Checkpoints(checkpoint_file, self.shard, checkpoint_interval_records)
        )
        self.runtime: CoordinatorRuntime[share_records.ShareRecord] = CoordinatorRuntime(
            "share-state",
            record_log,
            encode=_encode,
            decode=_decode,
            replay=self.shard.replay,
            clock=clock,
            compaction=(
                self.compaction
                if record_log.partition_log is not None and compaction_enabled
                else None
            ),
            checkpoints=checkpoints,
        )

    async def initialize_state(
        self, key: ShareStateKey, state_epoch: int, start_offset: int
    ) -> None:
        await self.runtime.run(
            key,
            lambda: self.shard.initialize_state(
                key, state_epoch, start_offset, self.clock.now_ms()
            ),
        )

    async def initialize_if_absent(self, key: ShareStateKey, state_epoch: int = 0) -> bool:
        """Give `key` fresh share state (`state_epoch`, start offset -1; the group
        coordinator passes the group epoch, as Kafka's heartbeat does) unless it has
        state worth keeping (a start offset, or a state epoch above 0: a reset's, a
        consumer's or an earlier initialization's); whether it wrote. Checked in the
        key's turn, so a reset running meanwhile is never overwritten by a state read
        as absent before it."""
        now = self.clock.now_ms()

        def op() -> tuple[list[share_records.ShareRecord], bool]:
            summary = self.shard.read_summary(key)
            if summary.start_offset != UNINITIALIZED_START_OFFSET or summary.state_epoch > 0:
                return [], False
            records, _ = self.shard.initialize_state(
                key, state_epoch, UNINITIALIZED_START_OFFSET, now
            )
            return records, True

        return await self.runtime.run(key, op)

    async def reset_state(self, key: ShareStateKey, start_offset: int) -> int:
        """InitializeShareGroupState at `start_offset` with a state epoch one above the
        stored one, read in the same turn that writes it (AlterShareGroupOffsets):
        concurrent resets get distinct, rising epochs, so each fences the state every
        earlier one handed out. Returns the new state epoch."""
        now = self.clock.now_ms()

        def op() -> tuple[list[share_records.ShareRecord], int]:
            epoch = self.shard.read_summary(key).state_epoch + 1
            records, _ = self.shard.initialize_state(key, epoch, start_offset, now)
            return records, epoch

        return await self.runtime.run(key, op)

    async def read_state(self, key: ShareStateKey, leader_epoch: int) -> ShareState:
        return await self.runtime.run(
            key, lambda: self.shard.read_state(key, leader_epoch, self.clock.now_ms())
        )

    async def write_state(
        self,
        key: ShareStateKey,
        state_epoch: int,
        leader_epoch: int,
        start_offset: int,
        batches: Sequence[PersistedBatch],
        delivery_complete_count: int = UNKNOWN_DELIVERY_COMPLETE_COUNT,
    ) -> None:
        await self.runtime.run(
            key,
            lambda: self.shard.write_state(
                key,
                state_epoch,
                leader_epoch,
                start_offset,
                batches,
                self.clock.now_ms(),
                delivery_complete_count=delivery_complete_count,
            ),
        )

    async def write_states(self, writes: Sequence[StateWrite]) -> list[KafkaError | None]:
        """Several write_state calls as one append and one fsync; per write its error
        or None. A failed append or fsync fails them all and applies none."""
        now = self.clock.now_ms()

        def op(w: StateWrite) -> Callable[[], tuple[list[share_records.ShareRecord], None]]:
            return lambda: self.shard.write_state(
                w.key,
                w.state_epoch,
                w.leader_epoch,
                w.start_offset,
                w.batches,
                now,
                delivery_complete_count=w.delivery_complete_count,
            )

        results = await self.runtime.run_many([(w.key, op(w)) for w in writes])
        return [r if isinstance(r, KafkaError) else None for r in results]

    async def delete_state(self, key: ShareStateKey) -> None:
        await self.runtime.run(key, lambda: self.shard.delete_state(key))

    async def read_summary(self, key: ShareStateKey) -> ShareState:
        # A read: committed state only, nothing to write. NOT_COORDINATOR, or
        # COORDINATOR_LOAD_IN_PROGRESS while the log loads here.
        self.runtime.check_led()
        return self.shard.read_summary(key)

    def load(self) -> int:
        """Rebuild the shard by replaying the log; returns the records replayed."""
        started = self.clock.now_ms()
        count = self.runtime.load()
        log.info(
            "share_state_loaded",
            records=count,
            keys=len(tuple(self.shard.keys())),
            seconds=round((self.clock.now_ms() - started) / 1000, 3),
        )
        return count

    async def compact(self) -> int:
        """Compact closed segments not compacted yet; returns segments rewritten."""
        return await self.runtime.compact()

    def unload(self, reason: str) -> None:
        """This broker no longer leads the share-state log: every call answers
        NOT_COORDINATOR, the state is dropped from memory."""
        self.runtime.unload(reason)
        self.shard.clear()

    def reload(self, record_log: CoordinatorLog) -> int:
        """This broker leads the share-state log (again), restored from the database:
        the state is rebuilt by replaying `record_log`."""
        self.shard.clear()
        self.runtime.reopen(record_log)
        return self.load()

    async def stop(self) -> None:
        await self.runtime.stop()

    def close(self) -> None:
        self.runtime.close()


@dataclass(frozen=True, slots=True)
class StateWrite:
    """The arguments of one `Persister.write_state` call, for `write_states`."""

    key: ShareStateKey
    state_epoch: int
    leader_epoch: int
    start_offset: int
    batches: Sequence[PersistedBatch]
    delivery_complete_count: int = UNKNOWN_DELIVERY_COMPLETE_COUNT


async def write_states(
    persister: Persister, writes: Sequence[StateWrite]
) -> list[Exception | None]:
    """Write several keys' share state: one append and one fsync when the persister is
    the share coordinator (`_ShardPersister.write_states`), else one call per key (other
    persisters, and subclasses that wrap write_state, e.g. to inject failures). Per
    write, what it raised or None."""
    routed = getattr(persister, "route_write_states", None)
    if routed is not None:
        # The broker's persister in a cluster (broker.share.remote_persister): one
        # append here, or one WriteShareGroupState per group to the remote coordinator.
        outcomes: list[Exception | None] = await routed(writes)
        return outcomes
    if (
        isinstance(persister, _ShardPersister)
        and type(persister).write_state is _ShardPersister.write_state
    ):
        return list(await persister.write_states(writes))
    results: list[Exception | None] = []
    for w in writes:
        try:
            await persister.write_state(
                w.key,
                w.state_epoch,
                w.leader_epoch,
                w.start_offset,
                w.batches,
                delivery_complete_count=w.delivery_complete_count,
            )
        except Exception as exc:
            results.append(exc)
        else:
            results.append(None)
    return results


class InMemoryPersister(_ShardPersister):
    """The share coordinator over an in-memory log: for unit tests of its callers."""

    def __init__(
        self,
        snapshot_update_records_per_snapshot: int = DEFAULT_SNAPSHOT_UPDATE_RECORDS_PER_SNAPSHOT,
        *,
        record_log: CoordinatorLog | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        super().__init__(
            MemoryRecordLog() if record_log is None else record_log,
            snapshot_update_records_per_snapshot,
            clock,
        )


class DurablePersister(_ShardPersister):
    """The share coordinator on `data/share-state/`: every change fsynced first."""

    def __init__(
        self,
        directory: Path,
        commit: GroupCommit,
        *,
        snapshot_update_records_per_snapshot: int = DEFAULT_SNAPSHOT_UPDATE_RECORDS_PER_SNAPSHOT,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        clock: Clock = SYSTEM_CLOCK,
        checkpoints: bool = True,
        checkpoint_interval_records: int = DEFAULT_CHECKPOINT_INTERVAL_RECORDS,
        compaction_enabled: bool = True,
        storage: StorageEngine = FILE_STORAGE,
    ) -> None:
        """`checkpoints=False` replays the whole log and writes no checkpoint (to check
        a checkpointed restart against a full replay). `compaction_enabled=False`
        (`log.cleaner.enable=false`): the broker never compacts the log itself; only
        `spool compact` output is adopted."""
        checkpoint_file = CheckpointFile(directory, "share-state") if checkpoints else None
        if (
            checkpoint_file is not None
            and directory.is_dir()
            and spark_adopt.staging_dirs(directory)
        ):
            # An adoption may drop tombstones past the checkpoint (persister.checkpoint).
            checkpoint_file.remove()
        # A `spool compact` output left for a stopped broker goes in before the replay.
        spark_adopt.adopt_at_start(directory)
        self.records = RecordLog(
            directory,
            commit,
            internal_log_config(segment_bytes),
            clock=clock,
            open_log=storage.open_log,
        )
        super().__init__(
            self.records,
            snapshot_update_records_per_snapshot,
            clock,
            checkpoint_file,
            checkpoint_interval_records,
            compaction_enabled,
        )

    def reload(self, record_log: CoordinatorLog) -> int:
        if isinstance(record_log, RecordLog):
            self.records = record_log
        return super().reload(record_log)

    async def compact(self) -> int:
        """Adopt a finished `spool compact` output, then compact what is left to do
        (unless the broker's own compaction is off)."""
        await self.adopt_compactions()
        if not self.compaction_enabled:
            return 0
        return await super().compact()

    async def adopt_compactions(self) -> bool:
        """Swap in the newest `spool compact` output that still fits the log (stale ones
        are discarded, persister.spark.adopt). Its CRCs are checked in a worker; the
        check of the files and the swap run together on the event loop, with the
        broker's own compaction held off, so no write or compaction comes between."""
        plog = self.records.partition_log
        if self.runtime.fenced is not None:
            return False  # not led here (broker.leadership): nothing to swap in
        async with self.compaction.lock:
            for staging in spark_adopt.staging_dirs(plog.directory):
                result = await asyncio.to_thread(spark_adopt.check, staging, plog.directory)
                if isinstance(result, str):
                    spark_adopt.discard(staging, result)
                    continue
                committed = self.runtime.committed_offset
                if result.limit <= committed:
                    self.runtime.before_rewrite(result.limit)
                return spark_adopt.adopt_live(plog, result, committed, self.clock.now_ms())
        return False


class _ShareCompaction:
    """The share-state log's compaction (`persister.share_compaction`): per key, what
    precedes its last snapshot or tombstone goes; segments are swapped one at a time."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        # Held while compacting or adopting a Spark output: one rewrite of the log at a time.
        self.lock = asyncio.Lock()

    async def __call__(
        self, plog: PartitionLog, base_offsets: Sequence[int], still_valid: StillValid
    ) -> int:
        async with self.lock:
            return await self._compact(plog, still_valid)

    async def _compact(self, plog: PartitionLog, still_valid: StillValid) -> int:
        # The plan reads the closed segments as they are when it runs (perhaps more than
        # `base_offsets`, if one rolled meanwhile); it is used only while every segment it
        # read still holds committed records alone.
        plan = await asyncio.to_thread(plan_share_compaction, plog)
        rewritten = 0
        for base_offset in plan.base_offsets:
            cleaned = await asyncio.to_thread(write_cleaned_segment, plog, base_offset, plan)
            if not still_valid(plan.base_offsets):
                if cleaned is not None:
                    cleaned.unlink(missing_ok=True)
                log.info("share_state_compaction_abandoned", base_offset=base_offset)
                break
            if cleaned is not None:
                plog.replace_closed_segment(base_offset, cleaned, self._clock.now_ms())
                rewritten += 1
        log.info("share_state_compacted", segments=len(plan.base_offsets), rewritten=rewritten)
        return rewritten
