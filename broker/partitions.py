"""Topic partitions on disk: the log, producer state, the high watermark and the LSO.

A `Partition` appends validated batches to its `TopicLog`, keeps the producer
state that de-duplicates idempotent retries and tracks open transactions, and advances
the high watermark once the data is durable by the flush policy (`flush.messages`,
default 1: group-committed fsync before acks=all is answered and before consumers can
see it). The last stable offset (LSO) is the first offset of the earliest transaction
still open or whose marker is not durable yet, else the high watermark; read_committed
readers stop there. The transaction coordinator ends a transaction with
`append_marker`; an abort is indexed (`.txnindex`) so read_committed Fetch responses
list it. Listeners are called whenever the high watermark (and with it the LSO) moves;
long-poll fetches use them.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import os
import resource
import shutil
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import structlog

from broker import trace
from broker.config import TOPIC_KEYS, BrokerConfig, parse_value
from persister.clock import SYSTEM_CLOCK, Clock, ms_of
from persister.commit import GroupCommit
from persister.file_log import AppendResult, LogConfig
from persister.producer_state import CompletedTxn, ProducerStateManager
from persister.storage import (
    FILE_STORAGE,
    Fenced,
    StorageEngine,
    StorageUnavailable,
    TopicLog,
)
from persister.txn_index import AbortedTxn
from protocol.errors import CorruptRecordError, ErrorCode, KafkaError
from protocol.records import (
    BatchHeader,
    EndTxnMarker,
    build_end_txn_marker_batch,
    decode_records,
    iter_batches,
    parse_header,
    set_log_append_time,
)

log = structlog.get_logger("spool.logs")

Listener = Callable[[], None]

# A new partition opens its first segment: the log file and its two index files.
FILES_PER_NEW_PARTITION = 3
# Descriptors left free when creating partitions, for connections and segment rolls
# (a tenth of the limit, at least this many).
MIN_FREE_FILES = 64


class Listeners:
    """Callbacks to run when something happens (a `Subscribable`), in the order they were
    added; those added with `first` (deliveries to consumers) before the others."""

    __slots__ = ("_first", "_rest")

    def __init__(self) -> None:
        # dicts, not sets: the order callbacks run in is the order their waiters resume.
        self._first: dict[Listener, None] = {}
        self._rest: dict[Listener, None] = {}

    def add_listener(self, listener: Listener, *, first: bool = False) -> None:
        (self._first if first else self._rest)[listener] = None

    def remove_listener(self, listener: Listener) -> None:
        self._first.pop(listener, None)
        self._rest.pop(listener, None)

    def __len__(self) -> int:
        return len(self._first) + len(self._rest)

    def notify(self) -> None:
        for listener in list(self._first):
            listener()
        for listener in list(self._rest):
            listener()


@dataclass(slots=True, frozen=True)
class AppendOutcome:
    base_offset: int
    last_offset: int
    log_append_time: int  # -1 unless the topic uses LogAppendTime
    log_start_offset: int
    duplicate: bool = False


class Partition:
    def __init__(
        self,
        topic: str,
        topic_id: uuid.UUID,
        index: int,
        plog: TopicLog,
        commit: GroupCommit,
        settings: dict[str, Any],
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.topic = topic
        self.clock = clock
        self.topic_id = topic_id
        self.index = index
        self.log = plog
        self._commit = commit
        self.settings = settings
        self.producers = ProducerStateManager()
        # Open transactions survive a restart: replay the log (and refill the aborted-
        # transaction index of any segment recovered after a crash).
        plog.load_producer_state(self.producers)
        # Everything on disk at open time survived the last stop, so it is visible.
        self.high_watermark = plog.log_end_offset
        # The log start offset a flush has checkpointed (DeleteRecords answers with it).
        self._durable_log_start = plog.log_start_offset
        self._unflushed = 0
        # Told when the high watermark or the LSO moves, or a flush failed.
        self._listeners = Listeners()
        # Told of every append, before it is durable: a share fetch acquires records while
        # their fsync runs and answers once the high watermark has passed them.
        self.appends = Listeners()
        self._hw_error: BaseException | None = None
        # Set once a flush was refused because another broker claimed the log (a newer
        # epoch, persister.storage.Fenced): this broker no longer leads the partition.
        # Its copy is out of service from then on: appends, reads and DeleteRecords
        # answer NOT_LEADER_OR_FOLLOWER, as Kafka's former leader does, and nothing
        # flushes it again (the storage refuses every later flush of a fenced log).
        self.fenced: Fenced | None = None
        # Told once the partition was fenced (LogManager drops it: `drop_partition`).
        self.on_fenced: Callable[[Partition, Fenced], None] | None = None
        # Why LogManager dropped the partition (`drop_partition`), or None while served.
        self.dropped: str | None = None
        # Set while the partition is handed over (`LogManager.release_partition`): new
        # writes are refused NOT_LEADER_OR_FOLLOWER while the in-flight ones commit.
        self.releasing: str | None = None

    def check_leader(self) -> None:
        """Raise NOT_LEADER_OR_FOLLOWER if the partition's log was claimed by another
        broker (see `fenced`), the partition was dropped or is being handed over."""
        why = self.fenced if self.fenced is not None else self.dropped or self.releasing
        if why is not None:
            raise KafkaError(
                ErrorCode.not_leader_or_follower,
                f"{self.topic}-{self.index} is led by another broker now: {why}",
            )

    @property
    def log_start_offset(self) -> int:
        return self.log.log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self.log.log_end_offset

    @property
    def last_stable_offset(self) -> int:
        """Kafka's LSO: below it every transaction has ended durably."""
        first_unstable = self.producers.first_unstable_offset()
        if first_unstable is None:
            return self.high_watermark
        return min(first_unstable, self.high_watermark)

    def aborted_transactions(self, fetch_offset: int, upper_bound: int) -> list[AbortedTxn]:
        """Aborted transactions overlapping [fetch_offset, upper_bound) (read_committed)."""
        return self.log.aborted_transactions(fetch_offset, upper_bound)

    # -- listeners --------------------------------------------------------------

    def add_listener(self, listener: Listener, *, first: bool = False) -> None:
        self._listeners.add_listener(listener, first=first)

    def remove_listener(self, listener: Listener) -> None:
        self._listeners.remove_listener(listener)

    def _notify(self) -> None:
        self._listeners.notify()

    def _advance_hw(self, offset: int) -> None:
        if offset > self.high_watermark:
            if trace.ENABLED:
                trace.event("hw", topic=self.topic, partition=self.index, offset=offset)
            self.high_watermark = offset
            # Markers now durable make their transactions stable: the LSO moves too.
            self.producers.on_high_watermark(offset)
            self._notify()

    # -- append -----------------------------------------------------------------

    def append(self, data: bytearray, batches: list[tuple[int, BatchHeader]]) -> AppendOutcome:
        """Append validated batches; raises KafkaError for a producer-state violation.

        Offsets are assigned by the log; the result is durable only after
        `wait_durable(outcome.last_offset)`.
        """
        self.check_leader()
        for _, header in batches:
            if header.is_control:
                # As Kafka's LogValidator: only the transaction coordinator writes markers.
                raise KafkaError(
                    ErrorCode.invalid_record,
                    f"Clients are not allowed to write control records to {self.topic}-"
                    f"{self.index}",
                )
            if header.size > self.settings["max.message.bytes"]:
                raise KafkaError(
                    ErrorCode.message_too_large,
                    f"Record batch of {header.size} bytes exceeds max.message.bytes "
                    f"({self.settings['max.message.bytes']}) of topic {self.topic}",
                )
        # Idempotent producers: a retry of one of the producer's last batches is
        # answered with the offsets it got the first time, without a second append.
        checks = self.producers.check_all([header for _, header in batches])
        if any(c is not None for c in checks):
            if len(checks) == 1 and checks[0] is not None:
                dup = checks[0]
                return AppendOutcome(
                    dup.base_offset, dup.last_offset, -1, self.log.log_start_offset, duplicate=True
                )
            raise KafkaError(
                ErrorCode.duplicate_sequence_number,
                "A produce request mixing new and already-written batches was refused",
            )
        ts = self.clock.now_ms()
        append_time = -1
        if self.settings["message.timestamp.type"] == "LogAppendTime":
            append_time = ts
            for pos, header in batches:
                set_log_append_time(data, pos, header, ts)
        result = self._write(data, ts)
        if trace.ENABLED:
            trace.event(
                "append",
                topic=self.topic,
                partition=self.index,
                first=result.first_offset,
                last=result.last_offset,
            )
        records = 0
        for pos, _ in batches:
            assigned = parse_header(data, pos)
            self.producers.update(assigned, ts)
            records += assigned.last_offset_delta + 1
        self._appended(records)
        return AppendOutcome(
            result.first_offset, result.last_offset, append_time, self.log.log_start_offset
        )

    def append_marker(
        self,
        producer_id: int,
        producer_epoch: int,
        *,
        commit: bool,
        coordinator_epoch: int,
        transaction_version: int = 0,
    ) -> AppendOutcome:
        """Write a COMMIT or ABORT marker for `producer_id`'s transaction on this partition.

        For the transaction coordinator (Kafka's WriteTxnMarkers at the partition leader).
        Checks the producer epoch (INVALID_PRODUCER_EPOCH; with `transaction_version` 2
        the marker's epoch must be above the producer's, as the coordinator bumps it) and
        the coordinator epoch (TRANSACTION_COORDINATOR_FENCED), appends one control batch,
        ends the open transaction and, for an abort, indexes it. Durable, and the LSO
        moved past the transaction, once `await wait_durable(outcome.last_offset, timeout)`
        returns; listeners are woken when it moves. A failed write raises
        KafkaError(KAFKA_STORAGE_ERROR) and leaves the transaction open.
        """
        self.check_leader()
        self.producers.check_marker(
            producer_id,
            producer_epoch,
            coordinator_epoch,
            transaction_version=transaction_version,
        )
        ts = self.clock.now_ms()
        data = bytearray(
            build_end_txn_marker_batch(
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                commit=commit,
                coordinator_epoch=coordinator_epoch,
                timestamp=ts,
            )
        )
        entry = self.producers.entry(producer_id)
        txn_first = None if entry is None else entry.current_txn_first_offset
        marker_offset = self.log.log_end_offset
        result = self._write(data, ts)
        if not commit and txn_first is not None:
            completed = CompletedTxn(producer_id, txn_first, marker_offset, aborted=True)
            try:
                self.log.append_aborted_txn(
                    AbortedTxn(
                        producer_id,
                        txn_first,
                        marker_offset,
                        self.producers.last_stable_offset(completed),
                    )
                )
            except KafkaError as exc:
                # Without its index entry the abort would read as committed: take the
                # marker back out, so the transaction stays open and the coordinator retries.
                self._log_write_failed(exc)
                self._undo_write(marker_offset)
                raise
        self.producers.update(
            parse_header(data, 0),
            ts,
            EndTxnMarker(commit=commit, coordinator_epoch=coordinator_epoch),
        )
        log.info(
            "txn_marker_written",
            topic=self.topic,
            partition=self.index,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            commit=commit,
            offset=marker_offset,
            txn_first_offset=txn_first,
        )
        self._appended(1)
        return AppendOutcome(result.first_offset, result.last_offset, -1, self.log.log_start_offset)

    def _write(self, data: bytearray, now_ms: int) -> AppendResult:
        try:
            return self.log.append(data, now_ms)
        except KafkaError as exc:
            self._log_write_failed(exc)
            raise

    def _log_write_failed(self, exc: KafkaError) -> None:
        if exc.code == ErrorCode.kafka_storage_error:
            log.error(
                "partition_write_failed", topic=self.topic, partition=self.index, error=exc.message
            )

    def _undo_write(self, offset: int) -> None:
        try:
            self.log.truncate_to(offset)
        except (OSError, KafkaError) as exc:
            log.error(
                "partition_truncate_failed",
                topic=self.topic,
                partition=self.index,
                offset=offset,
                error=str(exc),
            )

    def _appended(self, records: int) -> None:
        """Apply the flush policy to records just appended: sync now or count them.

        The fsync round starts here, before the appending task goes on, and fetches
        parked on this partition are told of the append once the round has begun on its
        thread: what they do in Python (a share fetch acquires while the fsync runs)
        then overlaps the disk instead of delaying the fsync thread's start."""
        self._unflushed += records
        if self._unflushed >= self.settings["flush.messages"]:
            self._unflushed = 0
            offset = self.log.log_end_offset
            try:
                self._commit.request(
                    self.log,
                    functools.partial(self._synced, offset),
                    started=self.appends.notify,
                )
            except RuntimeError as exc:
                # Stopping: the flush is refused, as if it failed. Told on the loop's next
                # turn, once the appending task waits for it (wait_durable).
                asyncio.get_running_loop().call_soon(self._synced, offset, exc)
        else:
            self._advance_hw(self.log.log_end_offset)

    def _retry_flush(self) -> None:
        self._hw_error = None
        self._unflushed = 0
        offset = self.log.log_end_offset
        try:
            self._commit.request(
                self.log, functools.partial(self._synced, offset), started=self.appends.notify
            )
        except RuntimeError as exc:  # stopping: refused, as in `_appended`
            asyncio.get_running_loop().call_soon(self._synced, offset, exc)

    def _synced(self, offset: int, error: BaseException | None) -> None:
        if isinstance(error, Fenced):
            first = self.fenced is None
            if first:
                log.warning(
                    "partition_fenced", topic=self.topic, partition=self.index, error=str(error)
                )
            self.fenced = error
            self._hw_error = error
            self._notify()
            if first and self.on_fenced is not None:
                self.on_fenced(self, error)
            return
        if error is not None:  # an fsync failure: nothing past HW is durable
            # A storage outage is logged once where it begins (persister.pg_commit).
            report = log.debug if isinstance(error, StorageUnavailable) else log.error
            report("flush_failed", topic=self.topic, partition=self.index, error=repr(error))
            self._hw_error = error
            self._notify()
            return
        if isinstance(self._hw_error, StorageUnavailable):
            # The storage is back and this flush covered what the failed one did.
            self._hw_error = None
        self._advance_hw(offset)

    async def wait_durable(
        self, last_offset: int, timeout_s: float, *, delivery: bool = False
    ) -> None:
        """Wait until `last_offset` is below the high watermark (acks=all).

        A `delivery` (records handed to a consumer once durable) resumes before the
        producers waiting on the same fsync: as Kafka completes a partition's delayed
        fetches before its delayed produces when the high watermark moves, so a record
        reaches its consumer without waiting for its producer's response to be encoded
        and written. Others resume in the order they began waiting."""
        if self.high_watermark > last_offset:
            return
        if isinstance(self._hw_error, StorageUnavailable):
            # What lies past the HW is still pending in the log (the storage did not
            # answer): a writer waiting for it (a retried produce found a duplicate, a
            # share fetch acquired it) asks for another round rather than failing on the
            # old error, or waiting for a round nobody asks for.
            self._retry_flush()
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def on_change() -> None:
            if (
                self.high_watermark > last_offset or self._hw_error or self.dropped
            ) and not done.done():
                done.set_result(None)

        def timed_out() -> None:
            if not done.done():
                done.set_exception(
                    KafkaError(
                        ErrorCode.request_timed_out,
                        f"Write to {self.topic}-{self.index} was not flushed within the "
                        "request timeout",
                    )
                )

        # The listener sets the future the awaiting task resumes on, with no task or
        # callback in between (asyncio.wait_for would add two turns of the loop).
        # The timeout is one of the partition's clock's timers (the broker's), so a
        # ManualClock drives it in tests.
        self.add_listener(on_change, first=delivery)
        timer = self.clock.call_at(self.clock.now_ms() + ms_of(timeout_s), timed_out)
        try:
            await done
        finally:
            timer.cancel()
            self.remove_listener(on_change)
        if self.high_watermark <= last_offset:
            # Another broker claimed the partition's log (fenced), or leads it now
            # (dropped): NOT_LEADER_OR_FOLLOWER.
            self.check_leader()
            if self._hw_error is not None:
                raise KafkaError(ErrorCode.kafka_storage_error, f"fsync failed: {self._hw_error}")

    # -- read -------------------------------------------------------------------

    def read(
        self,
        offset: int,
        max_bytes: int,
        *,
        committed_only: bool = False,
        beyond_high_watermark: bool = False,
    ) -> bytes:
        """Whole batches from `offset`: below the LSO (`committed_only`), the high
        watermark, or, `beyond_high_watermark`, the log end (appended but maybe not yet
        durable: the caller must not hand them out before `wait_durable`)."""
        self.check_leader()
        upper = self.last_stable_offset if committed_only else self.high_watermark
        if beyond_high_watermark and not committed_only:
            upper = self.log.log_end_offset
        if offset > self.log.log_end_offset or offset < self.log.log_start_offset:
            raise KafkaError(
                ErrorCode.offset_out_of_range,
                f"Offset {offset} is outside [{self.log.log_start_offset}, "
                f"{self.log.log_end_offset}] of {self.topic}-{self.index}",
            )
        if offset >= upper:
            return b""
        return bytes(self.log.read(offset, max_bytes, max_offset=upper))

    def offset_for_timestamp(
        self, timestamp: int, *, committed_only: bool = False
    ) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record at or after `timestamp`, below HW."""
        upper = self.last_stable_offset if committed_only else self.high_watermark
        found = self.log.offset_for_timestamp(timestamp)
        if found is None or found[0] >= upper:
            return None
        data = self.log.read(max(found[0], self.log_start_offset), 1, max_offset=upper)
        for pos, header in iter_batches(data, validate=False):
            for record in decode_records(data, pos, header):
                if record.timestamp >= timestamp and record.offset >= self.log_start_offset:
                    return record.offset, record.timestamp
        return None

    async def delete_records_before(self, offset: int) -> int:
        self.check_leader()
        if offset == -1:
            offset = self.high_watermark
        if offset < 0 or offset > self.high_watermark:
            raise KafkaError(
                ErrorCode.offset_out_of_range,
                f"Cannot delete records before {offset}: the high watermark of "
                f"{self.topic}-{self.index} is {self.high_watermark}",
            )
        moved = offset > self.log.log_start_offset
        if moved:
            self.log.delete_records_before(offset)
        start = self.log.log_start_offset
        if start > self._durable_log_start:
            # The new log start offset is checkpointed by the next flush; answer only
            # once it is durable. That holds for a request finding the offset already
            # moved by another DeleteRecords (or retention) whose flush has not ended:
            # it reports that low watermark, so it waits for it too.
            await self._commit.sync(self.log)
            self._durable_log_start = max(self._durable_log_start, start)
        if moved:
            self._notify()
        return self.log.log_start_offset

    async def flush(self) -> None:
        if self.fenced is not None:
            return  # refused by the storage: the new leader has what was committed
        await self._commit.sync(self.log)
        self._advance_hw(self.log.log_end_offset)


# Upper bound on a produce batch's decompressed size, so a small compressed batch that
# expands without end (a decompression bomb) is refused instead of filling memory.
# Producers bound batches by their uncompressed size (batch.size, max.request.size,
# 1 MiB by default), so real batches stay far below it.
MAX_DECOMPRESSED_BATCH_BYTES = 64 * 1024 * 1024


def validate_produce_data(data: bytes) -> tuple[bytearray, list[tuple[int, BatchHeader]]]:
    """Copy produce data into a mutable buffer and check every batch (CRC, framing)."""
    buf = bytearray(data)
    batches = list(iter_batches(buf, validate=True))
    if not batches:
        raise CorruptRecordError("produce request carries no record batch")
    for pos, header in batches:
        if header.compression:
            # As Kafka's LogValidator: the records of a compressed batch are read before
            # it is stored, so one that does not decompress is refused, not kept to
            # fail every later reader (ListOffsets by timestamp).
            decode_records(buf, pos, header, max_decompressed_size=MAX_DECOMPRESSED_BATCH_BYTES)
    return buf, batches


class LogManager:
    """All topic partitions under `data/topics/`, and their retention."""

    def __init__(
        self,
        directory: Path,
        config: BrokerConfig,
        commit: GroupCommit,
        clock: Clock = SYSTEM_CLOCK,
        storage: StorageEngine = FILE_STORAGE,
    ) -> None:
        self.directory = directory
        self.clock = clock
        self.config = config
        self.commit = commit
        self.storage = storage
        self.partitions: dict[tuple[str, int], Partition] = {}
        # Partitions this broker no longer leads (dropped, `drop_partition`): why. They
        # answer NOT_LEADER_OR_FOLLOWER, as Kafka's ReplicaManager.getPartitionOrError
        # answers for a partition the metadata knows and the broker does not host.
        self.not_led: dict[tuple[str, int], str] = {}
        # Told of each partition dropped and why, once its log is closed (its share
        # partitions unload).
        self.on_dropped: Callable[[Partition, str], object] | None = None
        # Set when the broker begins to stop: long-polled Fetches answer at once with what
        # they have instead of holding the shutdown for up to their MaxWaitMs.
        self.stopping = False
        # Leadership by lease (broker.leadership): whether this broker leads a partition;
        # `open_topic` opens only those. None: it leads every partition.
        self.leads: Callable[[str, int], bool] | None = None
        directory.mkdir(parents=True, exist_ok=True)

    def topic_settings(self, overrides: dict[str, str]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, key in TOPIC_KEYS.items():
            if name in overrides:
                out[name] = parse_value(key, overrides[name], resource="topic")
            else:
                out[name] = self.config.topic_default(name)
        return out

    def log_config(self, settings: dict[str, Any]) -> LogConfig:
        return LogConfig(
            segment_bytes=settings["segment.bytes"],
            segment_ms=settings["segment.ms"],
            retention_ms=settings["retention.ms"],
            retention_bytes=settings["retention.bytes"],
            index_interval_bytes=settings["index.interval.bytes"],
            max_message_bytes=settings["max.message.bytes"],
        )

    def _dir(self, topic: str, index: int) -> Path:
        return self.directory / f"{topic}-{index}"

    def ensure_file_headroom(self, topic: str, new_partitions: int) -> None:
        """Refuse creating partitions the open-file limit has no room for.

        Running out of descriptors would leave the broker unable to accept anyone, so
        creation stops while a reserve is still free for connections. Raises
        KafkaError(KAFKA_STORAGE_ERROR) before anything is written.
        """
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if limit == resource.RLIM_INFINITY:
            return
        try:
            used = len(os.listdir("/proc/self/fd"))
        except FileNotFoundError:
            return  # no /proc: only an actual EMFILE is caught (open_topic)
        except OSError:
            used = limit  # EMFILE while counting: nothing is free
        reserve = max(MIN_FREE_FILES, limit // 10)
        needed = new_partitions * FILES_PER_NEW_PARTITION
        if used + needed + reserve > limit:
            log.warning(
                "partitions_refused",
                topic=topic,
                partitions=new_partitions,
                open_files=used,
                open_file_limit=limit,
                kept_free=reserve,
            )
            raise _too_many_open_files(
                topic, limit, f"{used} open, {needed} needed, {reserve} kept free"
            )

    def open_topic(
        self, topic: str, topic_id: uuid.UUID, partitions: int, overrides: dict[str, str]
    ) -> None:
        """Open (creating if new) the partition logs of `topic` not open yet.

        Out of descriptors (or any other OSError, a full disk) part way, the partitions
        this call opened are closed and the directories it created removed, then
        KafkaError(KAFKA_STORAGE_ERROR).
        """
        settings = self.topic_settings(overrides)
        cfg = self.log_config(settings)
        opened: list[tuple[str, int]] = []
        created: list[Path] = []
        try:
            for index in range(partitions):
                if (topic, index) in self.partitions or (topic, index) in self.not_led:
                    continue  # open, or another broker's now: reopening would claim it back
                if self.leads is not None and not self.leads(topic, index):
                    continue  # led by another broker (or not claimed yet)
                path = self._dir(topic, index)
                if not path.exists():
                    created.append(path)
                self._check_topic_id(path, topic_id)
                plog = self.storage.open_topic_log(path, cfg, self.clock.now_ms())
                try:
                    # Loading producer state reads the directory: it needs a descriptor too.
                    partition = Partition(
                        topic, topic_id, index, plog, self.commit, settings, self.clock
                    )
                except BaseException:
                    plog.close(clean=False)
                    raise
                partition.on_fenced = self._fenced
                self.partitions[(topic, index)] = partition
                opened.append((topic, index))
        except OSError as exc:
            for key in opened:
                # Not a clean close: flushing would need descriptors there are none of.
                self.partitions.pop(key).log.close(clean=False)
            for path in created:
                shutil.rmtree(path, ignore_errors=True)
            limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
            log.error("partitions_not_opened", topic=topic, error=str(exc), limit=limit)
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                raise _too_many_open_files(topic, limit, str(exc)) from exc
            raise KafkaError(
                ErrorCode.kafka_storage_error,
                f"Cannot create partitions of {topic}: opening their logs failed ({exc})",
            ) from exc

    def _check_topic_id(self, path: Path, topic_id: uuid.UUID) -> None:
        """Like Kafka's partition.metadata: a directory belongs to one topic id."""
        marker = path / "partition.metadata"
        expected = f"topic_id: {topic_id}"
        if marker.exists():
            found = marker.read_text()
            if expected not in found.splitlines():
                # Left behind by a deleted topic of the same name: discard it.
                log.warning("stale_partition_dir", path=str(path), found=found)
                shutil.rmtree(path)
        path.mkdir(parents=True, exist_ok=True)
        if not marker.exists():
            tmp = marker.with_suffix(".tmp")
            tmp.write_text(f"version: 0\n{expected}\n")
            os.replace(tmp, marker)

    def reconfigure_topic(self, topic: str, overrides: dict[str, str]) -> None:
        settings = self.topic_settings(overrides)
        cfg = self.log_config(settings)
        for (name, _), part in self.partitions.items():
            if name == topic:
                part.settings = settings
                part.log.config = cfg

    def remove_topic(self, topic: str) -> None:
        for key in [key for key in self.not_led if key[0] == topic]:
            # Led elsewhere: its rows are the leader's to drop, its directory is gone.
            del self.not_led[key]
        doomed = [key for key in self.partitions if key[0] == topic]
        for key in doomed:
            part = self.partitions.pop(key)
            part.log.close()
            # Rename first (cheap, atomic) so a re-created topic gets a clean dir.
            path = part.log.directory
            trash = path.with_name(f"{path.name}.{uuid.uuid4().hex}-delete")
            os.replace(path, trash)
            shutil.rmtree(trash, ignore_errors=True)
            self.storage.forget_log(path)
            part._notify()

    def get(self, topic: str, index: int) -> Partition | None:
        return self.partitions.get((topic, index))

    def not_leader(self, topic: str | None, index: int) -> KafkaError | None:
        """NOT_LEADER_OR_FOLLOWER for a partition this broker dropped (`drop_partition`),
        else None: what a request for a partition `get` does not find is answered."""
        reason = None if topic is None else self.not_led.get((topic, index))
        if reason is None:
            return None
        return KafkaError(
            ErrorCode.not_leader_or_follower,
            f"This broker no longer leads {topic}-{index} ({reason}): refresh the metadata",
        )

    def drop_partition(self, topic: str, index: int, reason: str) -> Partition | None:
        """Stop serving a partition another broker leads now: close its log (indexes,
        producer state and all go with the `Partition`), delete the local files where
        the storage keeps them only as a cache, and answer NOT_LEADER_OR_FOLLOWER for it
        from then on (`not_leader`), until the topic is deleted. Waiters on the partition
        are woken (a long-polled Fetch answers) and `on_dropped` is told (its share
        partitions unload). The partition, or None if it was not open."""
        part = self.partitions.pop((topic, index), None)
        self.not_led[(topic, index)] = reason
        if part is None:
            return None
        # A request still holding the partition (a parked Fetch, a produce awaiting its
        # flush) gets NOT_LEADER_OR_FOLLOWER from it too (`check_leader`).
        part.dropped = reason
        part.producers = ProducerStateManager()
        directory = part.log.directory
        try:
            part.log.close(clean=False)
        except OSError as exc:
            log.warning("partition_close_failed", topic=topic, partition=index, error=str(exc))
        self.storage.discard_log(directory)
        log.warning("partition_dropped", topic=topic, partition=index, reason=reason)
        part._notify()
        if self.on_dropped is not None:
            self.on_dropped(part, reason)
        return part

    def open_partition(
        self, topic: str, topic_id: uuid.UUID, index: int, overrides: dict[str, str]
    ) -> None:
        """Open one partition this broker just claimed (broker.leadership), also one it
        had dropped before: it leads it again."""
        self.not_led.pop((topic, index), None)
        leads = self.leads
        self.leads = lambda t, i: t == topic and i == index
        try:
            self.open_topic(topic, topic_id, index + 1, overrides)
        finally:
            self.leads = leads

    async def release_partition(self, topic: str, index: int, reason: str) -> None:
        """Hand a partition over gracefully (broker.leadership): refuse new writes, let
        the ones in flight commit, then drop it (`drop_partition`)."""
        part = self.partitions.get((topic, index))
        if part is None:
            self.not_led[(topic, index)] = reason
            return
        part.releasing = reason
        try:
            await part.flush()
        except Exception as exc:  # refused or failed: what it held was never acked
            log.warning("release_flush_failed", topic=topic, partition=index, error=str(exc))
        if self.partitions.get((topic, index)) is part:
            self.drop_partition(topic, index, reason)

    def _fenced(self, part: Partition, error: Fenced) -> None:
        if self.partitions.get((part.topic, part.index)) is not part:
            return

        def drop() -> None:
            # Still the open one (the topic was not deleted meanwhile).
            if self.partitions.get((part.topic, part.index)) is part:
                self.drop_partition(part.topic, part.index, str(error))

        # After the waiters woken by the refused flush have run (they hold `part`).
        asyncio.get_running_loop().call_soon(drop)

    def wake_fetches(self) -> None:
        """Shutdown: every parked Fetch returns now (see `stopping`)."""
        self.stopping = True
        for part in self.partitions.values():
            part._notify()

    def __iter__(self) -> Iterator[Partition]:
        return iter(list(self.partitions.values()))

    def cleanup_stale(self, live: set[str]) -> None:
        """Remove directories of topics deleted while the broker was down."""
        for path in self.directory.iterdir():
            name = path.name
            if name.endswith("-delete"):
                shutil.rmtree(path, ignore_errors=True)
                continue
            topic, _, index = name.rpartition("-")
            if index.isdigit() and topic not in live:
                shutil.rmtree(path, ignore_errors=True)
                self.storage.forget_log(path)

    def enforce_retention(self) -> int:
        deleted = 0
        ts = self.clock.now_ms()
        for part in self:
            if part.fenced is not None:
                continue  # another broker leads it: its retention is that broker's
            removed = part.log.enforce_retention(ts)
            if removed:
                # Make the new log start durable now, not at the partition's next
                # write (the storage engine drops what lies below it then).
                self._flush_soon(part)
            deleted += removed
        return deleted

    def _flush_soon(self, part: Partition) -> None:
        def done(error: BaseException | None) -> None:
            if error is not None:
                log.warning(
                    "retention_flush_failed",
                    topic=part.topic,
                    partition=part.index,
                    error=str(error),
                )

        with contextlib.suppress(RuntimeError):  # not running (stopping, or a unit test)
            self.commit.request(part.log, done)

    async def flush_all(self) -> None:
        await asyncio.gather(*(p.flush() for p in self))

    def close(self) -> None:
        for part in self:
            part.log.close(clean=True)


def _too_many_open_files(topic: str, limit: int, detail: str) -> KafkaError:
    return KafkaError(
        ErrorCode.kafka_storage_error,
        f"Cannot create partitions of {topic}: too many open files (limit {limit}; "
        f"{detail}); raise the open-file limit or delete topics",
    )


class Subscribable(Protocol):
    def add_listener(self, listener: Listener) -> None: ...
    def remove_listener(self, listener: Listener) -> None: ...


class Wakeup:
    """Listens to `sources` from the moment it is made until closed, so a notification
    that comes between a long poll's look for data and its wait is not lost: the wait
    after it returns at once. Use as a context manager."""

    def __init__(self, sources: Iterable[Subscribable]) -> None:
        self._sources = list(sources)
        self._woken = False
        self._future: asyncio.Future[None] | None = None
        for source in self._sources:
            source.add_listener(self._wake)

    def _wake(self) -> None:
        self._woken = True
        if self._future is not None and not self._future.done():
            self._future.set_result(None)

    async def wait(self, timeout_s: float, *, clock: Clock) -> None:
        """Return once a source has called its listeners since the last wait returned (at
        once if one already has), or once `clock` has moved `timeout_s` on. A listener
        resumes the waiter on the loop's next turn (no timer involved); the timeout is one
        of the clock's timers (the broker's; a ManualClock drives it in tests)."""
        if not self._woken:
            woken = self._future = asyncio.get_running_loop().create_future()
            timer = clock.call_at(clock.now_ms() + ms_of(timeout_s), self._timed_out)
            try:
                await woken
            finally:
                timer.cancel()
            self._future = None
        self._woken = False

    def _timed_out(self) -> None:
        if self._future is not None and not self._future.done():
            self._future.set_result(None)

    def close(self) -> None:
        for source in self._sources:
            source.remove_listener(self._wake)
        self._sources = []

    def __enter__(self) -> Wakeup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def wait_for_any(sources: Iterable[Subscribable], timeout_s: float, *, clock: Clock) -> None:
    """Park until any source calls its listeners, or `clock` passes the timeout (long
    polls)."""
    with Wakeup(sources) as wakeup:
        await wakeup.wait(timeout_s, clock=clock)
