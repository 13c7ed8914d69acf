"""The storage seam: what the code above persister/ asks of the logs it writes.

Two kinds of log sit under the broker, and the layers above reach them only through the
Protocols here:

- `TopicLog`: the log of one topic partition, as `broker.partitions.Partition` and
  `LogManager` drive it (Kafka's UnifiedLog as its ReplicaManager and LogManager use it):
  append validated batches, read whole batches, offsets, the producer state and the
  aborted-transaction index, DeleteRecords and retention, undo a failed write, flush
  (`persister.commit.GroupCommit` makes it durable: flush is the fsync), close.
- `CoordinatorLog`: the record log of one coordinator (group metadata, transactions,
  cluster metadata, share state), as `coordinator.runtime.CoordinatorRuntime` drives it:
  write a batch of key/value records, wait for them to be durable, undo a failed write,
  replay on startup (from a checkpoint's offset), close.

A `StorageEngine` opens both. `FileStorage` is the default engine: segment files under
the data directory (`persister.file_log.PartitionLog`, `persister.coordinator_log.RecordLog`), which
mypy checks against these Protocols where `FileStorage` returns them and where
`FILE_STORAGE` is typed. `persister.coordinator_log.MemoryRecordLog` is a `CoordinatorLog`
for unit tests. `persister.pg_storage.PgStorage` keeps the same files as a cache and
commits every log's writes to PostgreSQL, the durable copy (see its docstring).

What is still the file backend's own, and the next backend has to answer for:
- `TopicLog.directory`: `broker.partitions.LogManager` lays out the topic directories itself
  (`<topic>-<partition>`, the `partition.metadata` topic-id marker, deleted topics
  renamed and removed, directories of topics deleted while the broker was down).
- `CoordinatorLog.partition_log`: the segmented file log under a record log, for the
  features that work on segment files (checkpoints bounded by its offsets, compaction of
  closed segments, adopting a Spark compaction). A log without one (None) runs with
  neither, as `MemoryRecordLog` does.
- `coordinator.metadata.MetadataStore` and `coordinator.share_persister.DurablePersister`
  build their `RecordLog` themselves, on the engine's `open_log`.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from persister.clock import SYSTEM_CLOCK, Clock
from persister.commit import GroupCommit
from persister.coordinator_log import KeyValue, RecordLog
from persister.file_log import AppendResult, LogConfig, PartitionLog
from persister.producer_state import ProducerStateManager
from persister.txn_index import AbortedTxn


class StorageUnavailable(OSError):
    """A flush that failed while the log stays intact: what it covered is still pending
    and the next flush makes it durable (a database that did not answer). Unlike a
    failed fsync, after which the file's pages may be gone, a later successful flush
    covers everything written before it again."""

    # The outage is logged where it begins and ends (persister.pg_commit), so the
    # layers a flush failure passes through log it at debug level only.
    reported_once = True


class Fenced(OSError):
    """A flush refused because the log belongs to a newer epoch: another writer claimed
    it, and this one must stop writing it. An OSError, so a caller that only knows
    failed fsyncs still fails safe; the partition answers NOT_LEADER_OR_FOLLOWER and a
    coordinator NOT_COORDINATOR."""

    # Logged where it is found (persister.pg_commit's log_fenced, the partition or the
    # coordinator being fenced), not again by each flush it fails.
    reported_once = True

    def __init__(self, name: str, epoch: int) -> None:
        super().__init__(
            errno.EPERM, f"log {name} was claimed by another writer (epoch {epoch} is stale)"
        )
        self.log_name = name
        self.epoch = epoch


class LogConflict(OSError):
    """A flush of a shared log refused because another writer appended to it first: the
    log no longer ends where this writer's batches begin. Nothing of the write is kept;
    the writer undoes its append, catches up (`SharedLog.catch_up`) and tries again on
    the new state (coordinator.metadata)."""

    def __init__(self, name: str, expected: int) -> None:
        super().__init__(
            errno.EAGAIN,
            f"log {name} no longer ends at offset {expected}: another writer appended first",
        )
        self.log_name = name
        self.expected = expected

    # Routine, not an alarm: logged at debug level by the layers a flush passes through.
    reported_once = True


@runtime_checkable
class SharedLog(Protocol):
    """A log several writers append to (the cluster metadata of brokers sharing one
    PostgreSQL database): a flush is refused with `LogConflict` when another writer
    appended first, and `catch_up` brings in what the others committed."""

    async def catch_up(self) -> int:
        """Append, at their own offsets, the batches other writers committed past this
        log's end; return the end offset it had before (where the new records begin).
        Raises OSError if the storage cannot be read."""


class TopicLog(Protocol):
    """The log of one topic partition, as the broker uses it (see the module docstring).

    Offsets are Kafka's: `log_start_offset` is the first offset still readable,
    `log_end_offset` the one the next record gets. Nothing is durable until a `flush`
    that started after the write returned.
    """

    # The topic's log settings; `LogManager.reconfigure_topic` replaces them.
    config: LogConfig

    @property
    def directory(self) -> Path: ...
    @property
    def log_start_offset(self) -> int: ...
    @property
    def log_end_offset(self) -> int: ...
    @property
    def size_bytes(self) -> int: ...

    def append(self, data: bytearray | memoryview, now_ms: int) -> AppendResult:
        """Assign offsets to validated v2 batches (rewriting their base offsets in
        `data`) and write them, not yet durably."""

    def read(self, offset: int, max_bytes: int, *, max_offset: int | None = None) -> bytes:
        """Whole batches from the one holding `offset`, up to `max_bytes` (at least one
        batch), stopping before `max_offset`."""

    def load_producer_state(self, producers: ProducerStateManager) -> None:
        """Fill `producers` from the log (idempotence and open transactions), at open."""

    def append_aborted_txn(self, entry: AbortedTxn) -> None:
        """Index an aborted transaction, its marker written (durable with the next flush)."""

    def aborted_transactions(self, fetch_offset: int, upper_bound: int) -> list[AbortedTxn]:
        """Aborted transactions overlapping [fetch_offset, upper_bound)."""

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """(base offset, max timestamp) of the first batch whose max timestamp is at or
        after `timestamp_ms`."""

    def max_timestamp_offset(self) -> tuple[int, int] | None:
        """(base offset, timestamp) of the batch with the largest timestamp."""

    def delete_records_before(self, offset: int) -> int:
        """Move the log start offset up to `offset` (DeleteRecords); the new one."""

    def enforce_retention(self, now_ms: int) -> int:
        """Drop what retention.ms / retention.bytes no longer keep; how many pieces."""

    def truncate_to(self, offset: int) -> int:
        """Remove everything from `offset` (a batch boundary) on: a failed write undone."""

    def flush(self) -> None:
        """Make everything written so far durable. Blocking: run off the event loop."""

    def close(self, clean: bool = True) -> None:
        """Close; `clean` flushes first."""


class CoordinatorLog(Protocol):
    """The record log of one coordinator, as `CoordinatorRuntime` uses it (see the module
    docstring). Offsets count records; keys and values are the coordinator's bytes."""

    @property
    def partition_log(self) -> PartitionLog | None:
        """The segmented file log underneath, or None (no checkpoints, no compaction)."""

    @property
    def end_offset(self) -> int:
        """Where the next write begins."""

    def write(self, records: Sequence[KeyValue]) -> int:
        """Append `records` as one batch, not yet durably; the offset they begin at."""

    async def sync(self) -> None:
        """Return once everything written so far is durable."""

    def truncate(self, offset: int) -> None:
        """Remove everything written from `offset` on (a failed write and what followed)."""

    def replay(self, start: int | None = None) -> Iterator[KeyValue]:
        """Every record from the log start, or from `start` on, in order."""

    def close(self) -> None: ...


class StorageEngine(Protocol):
    """Opens the logs of one broker. The file engine keys them by directory under the
    data dir (`topics/<topic>-<partition>`, `groups`, `transactions`, ...).

    `start` runs before any log is opened (PostgreSQL: connect, migrate, bring the data
    dir up to date with the database) and `stop` after the last is closed."""

    async def start(self, data_dir: Path) -> None: ...

    async def stop(self) -> None: ...

    def open_log(self, directory: Path, config: LogConfig, now_ms: int) -> PartitionLog:
        """Open the segmented log under a coordinator's `RecordLog`, creating it if new."""

    def forget_log(self, directory: Path) -> None:
        """A log is gone for good (its topic was deleted): drop what the engine keeps of
        it besides the directory, which the caller removes."""

    def open_topic_log(self, directory: Path, config: LogConfig, now_ms: int) -> TopicLog:
        """Open the log of a topic partition, creating it if new."""

    def discard_log(self, directory: Path) -> None:
        """A closed log this broker no longer owns (another one claimed it): drop the
        local copy if the engine keeps it only as a cache of a durable copy elsewhere."""

    def open_coordinator_log(
        self,
        directory: Path,
        commit: GroupCommit,
        config: LogConfig | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
    ) -> CoordinatorLog:
        """Open a coordinator's record log, creating it if new; `sync` waits for
        `commit`'s rounds. `config` None: the internal logs' settings."""


class FileStorage:
    """The file engine: segment files under the data directory, fsynced by `GroupCommit`."""

    async def start(self, data_dir: Path) -> None:
        return None

    async def stop(self) -> None:
        return None

    def open_log(self, directory: Path, config: LogConfig, now_ms: int) -> PartitionLog:
        return PartitionLog.open(directory, config, now_ms)

    def forget_log(self, directory: Path) -> None:
        return None

    def discard_log(self, directory: Path) -> None:
        return None  # the files are the only copy: kept

    def open_topic_log(self, directory: Path, config: LogConfig, now_ms: int) -> TopicLog:
        return PartitionLog.open(directory, config, now_ms)

    def open_coordinator_log(
        self,
        directory: Path,
        commit: GroupCommit,
        config: LogConfig | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
    ) -> CoordinatorLog:
        return RecordLog(directory, commit, config, clock=clock, open_log=self.open_log)


# Typed as the Protocol, so mypy checks FileStorage against it.
FILE_STORAGE: StorageEngine = FileStorage()
