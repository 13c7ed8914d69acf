"""The coordinator runtime: the one place a record-writing state machine's change becomes
durable and then visible.

Every coordinator in spool (share-partition state, share groups and their configs,
cluster metadata, the transaction coordinator to come) is a sans-IO state machine whose
operations read committed state and return `(records, response)`, and whose `replay`
is the only code that changes state, live and on startup alike. `CoordinatorRuntime.run`
executes one operation:

1. wait for the operation's key (a share-state key, a group id, the one cluster-metadata
   key): operations on one key run one at a time, so each is computed from the state
   all earlier ones left;
2. call the operation; if it returned records, write them to the log (one batch);
3. wait until they are fsynced. Operations on other keys write and wait meanwhile, so
   concurrent writers share fsync rounds (group commit, `persister.commit`);
4. replay the records, in order, call the caller's `applied` with the response (the
   shell's own effects of the change, such as opening a new topic's logs, so they too
   happen in the order the operations were serialised), then return the response.

An operation's checks belong inside it: a check made before waiting for the key and
written after would go stale meanwhile (two requests both find a topic absent and
both create it). Everything a request's answer rests on is read in the turn that
writes its records; a validate-only request runs the same operation and keeps none.

Nothing is applied before its fsync succeeded, so no request ever sees a change that a
crash could take back.

`run_many` runs the operations of one request on several keys (WriteShareGroupState
naming 500 partitions, a ShareFetch acknowledging on many) under all their locks and writes
their records as one batch with one fsync; a failed write fails every one of them.

Kafka's CoordinatorRuntime applies records before they are committed and keeps its
state in timeline structures that it reverts to the last committed offset when a write
fails; readers see only committed snapshots. Serializing operations per key gives the
same guarantee more simply: an operation never reads another's uncommitted change,
because changes reach memory only once durable and the next operation on that key
waits for it.

A failed write: if appending (EIO, ENOSPC, ...) or the fsync fails, the log is truncated
back to where the failed records begin, and every operation whose records lie at or
after that point fails as well, even one whose own, later fsync round succeeded (its
records were cut); none of them is replayed. Callers get
KafkaError(KAFKA_STORAGE_ERROR); `for_coordinator_rpc` maps it to NOT_COORDINATOR where
Kafka's coordinator services do (CoordinatorOperationExceptionHelper), which clients
retry. The broker keeps serving, and the next operation after the disk recovers
succeeds. If the truncation itself fails, the log's files may disagree with memory: the
runtime refuses every later write with KAFKA_STORAGE_ERROR until a restart replays the
log.

Leadership (broker.leadership, on a cluster): a runtime whose log this broker does not
lead refuses every operation with NOT_COORDINATOR (`unload`), and one whose log it
claimed and is loading (restoring it from the database, replaying it) with
COORDINATOR_LOAD_IN_PROGRESS (`begin_loading`, until `reopen`), as Kafka's
CoordinatorRuntime answers for a context in state LOADING: the client retries the same
broker rather than looking the coordinator up again.

Compaction: a runtime with a `Compaction` compacts the log's closed segments in the
background after a segment roll, off the event loop, swapping the result in on the loop;
only segments whose records are all committed are touched, and a plan made while a
failed write was being undone is thrown away. `KeyCompaction` keeps per key the newest
record and drops deleted keys; the share-state log has its own (`share_persister`).

Checkpoints (`persister.checkpoint`): a runtime given `Checkpoints` writes its state
machine's state down, with the log offset it covers, once `interval_records` records
(or as many as the state has entries, whichever is more, so the cost stays proportional
to what was written) were replayed since the last one, and at a clean close; `load`
restores the newest usable checkpoint and replays only the log after it, or the whole
log when there is none (missing, corrupt, too new, or outside the log: logged). A
checkpoint covers only records that are fsynced and replayed (`_applied_end`), so a
failed write's truncation never cuts below it. Before a compaction swaps segments that
reach past it, it is removed: a compaction may drop a tombstone after the checkpoint
together with the key's older records, and replaying from the checkpoint would then
miss the deletion.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
from collections.abc import AsyncIterator, Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import structlog

from persister.checkpoint import CheckpointFile
from persister.clock import SYSTEM_CLOCK, Clock
from persister.coordinator_log import CompactionKeys, KeyValue, compact_by_key
from persister.file_log import PartitionLog
from persister.storage import CoordinatorLog, Fenced
from protocol.errors import ErrorCode, KafkaError

log = structlog.get_logger("spool.runtime")

R = TypeVar("R")
T = TypeVar("T")

Operation = Callable[[], tuple[Sequence[R], T]]
# Whether the closed segments a compaction read are still safe to replace: no failed
# write was undone since it started and they hold only committed records.
StillValid = Callable[[Sequence[int]], bool]


class Checkpointable(Protocol):
    """A state machine whose state can be written down and loaded back."""

    def checkpoint_size(self) -> int:
        """Entries a checkpoint holds (how costly one is)."""

    def checkpoint_capture(self) -> Callable[[], bytes]:
        """Capture the state now (on the event loop, cheaply); the returned function
        encodes it and may run in a worker thread while the state moves on."""

    def checkpoint_restore(self, payload: bytes) -> None:
        """Replace the state with the encoded one: all of it or, raising, none of it."""


# Records replayed between checkpoints, at least: the restart replays at most about this
# many (10,000 share-state records replay in well under a second).
DEFAULT_CHECKPOINT_INTERVAL_RECORDS = 10_000


@dataclass(slots=True)
class Checkpoints:
    """Where and how often a runtime checkpoints its state machine."""

    file: CheckpointFile
    state: Checkpointable
    interval_records: int = DEFAULT_CHECKPOINT_INTERVAL_RECORDS


class Compaction(Protocol):
    async def __call__(
        self, plog: PartitionLog, base_offsets: Sequence[int], still_valid: StillValid
    ) -> int:
        """Compact the closed segments `base_offsets`; return how many were rewritten."""


class NotLed(Fenced):
    """Why a runtime refuses every operation while this broker does not lead its log:
    it was never claimed here, or was handed over (`CoordinatorRuntime.unload`)."""

    def __init__(self, name: str, reason: str) -> None:
        OSError.__init__(self, errno.EPERM, f"this broker does not lead the {name} log: {reason}")
        self.log_name = name
        self.epoch = 0


class Loading(NotLed):
    """Why a runtime refuses every operation while this broker, which claimed its log,
    restores and replays it (`CoordinatorRuntime.begin_loading`): Kafka's coordinator in
    state LOADING, whose requests are answered COORDINATOR_LOAD_IN_PROGRESS (the client
    retries the same broker) rather than NOT_COORDINATOR (it looks the coordinator up
    again)."""

    def __init__(self, name: str, reason: str) -> None:
        OSError.__init__(
            self, errno.EAGAIN, f"this broker is loading the {name} log it leads: {reason}"
        )
        self.log_name = name
        self.epoch = 0


def storage_error(message: str) -> KafkaError:
    return KafkaError(ErrorCode.kafka_storage_error, message)


def for_coordinator_rpc(exc: KafkaError) -> KafkaError:
    """The error a coordinator RPC answers for `exc`: Kafka's coordinator services turn
    KAFKA_STORAGE_ERROR into NOT_COORDINATOR, which clients retry after looking the
    coordinator up again (CoordinatorOperationExceptionHelper.handleOperationException)."""
    if exc.code == ErrorCode.kafka_storage_error:
        return KafkaError(ErrorCode.not_coordinator, exc.message)
    return exc


@dataclass(slots=True, eq=False)
class _InflightWrite:
    """A write of the runtime's log under way: records written and not yet replayed or
    undone (held in `_inflight`)."""

    start: int
    # Where its records end (set once appended).
    end: int = -1
    # Why it failed, once a failed write's undo cut it (each waiter raises its own error).
    error: str | None = None


class KeyLocks:
    """One asyncio.Lock per key, existing only while anyone holds or waits for it
    (the runtime's per-key operations, the share-partition leader's pending changes)."""

    def __init__(self) -> None:
        self._locks: dict[Hashable, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: Hashable) -> AsyncIterator[None]:
        lock, users = self._locks.get(key) or (asyncio.Lock(), 0)
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    @contextlib.asynccontextmanager
    async def hold_all(self, keys: Iterable[Hashable]) -> AsyncIterator[None]:
        """Hold every key's lock. Taken in one global order (`lock_order`), so two
        holders of overlapping sets cannot each wait for the other."""
        async with contextlib.AsyncExitStack() as stack:
            for key in sorted(set(keys), key=lock_order):
                await stack.enter_async_context(self.hold(key))
            yield

    def __len__(self) -> int:
        return len(self._locks)

    def __contains__(self, key: object) -> bool:
        """Whether anyone holds or waits for `key`'s lock."""
        return key in self._locks


def lock_order(key: Hashable) -> tuple[str, str]:
    """A total order over lock keys of any type (share-state keys, group ids, ...)."""
    return type(key).__qualname__, repr(key)


def _consume_result(task: asyncio.Task[object]) -> None:
    # The caller went away (cancelled); its operation still finished or failed.
    if not task.cancelled():
        task.exception()


class CoordinatorRuntime(Generic[R]):
    """Runs a state machine's operations against its record log; see the module docstring."""

    def __init__(
        self,
        name: str,
        record_log: CoordinatorLog,
        *,
        encode: Callable[[R], Sequence[KeyValue]],
        decode: Callable[[bytes | None, bytes | None], R | None],
        replay: Callable[[R], None],
        clock: Clock = SYSTEM_CLOCK,
        compaction: Compaction | None = None,
        checkpoints: Checkpoints | None = None,
    ) -> None:
        self.name = name
        self.record_log = record_log
        self.clock = clock
        self._encode = encode
        self._decode = decode
        self._replay = replay
        self._compaction = compaction
        self._locks = KeyLocks()
        self._inflight: list[_InflightWrite] = []
        # Bumped whenever a failed write is undone: compaction plans made before are void.
        self.truncations = 0
        # Why the log refuses writes (its truncation failed), until a restart.
        self.failed: str | None = None
        # Set once the storage refused a write as fenced (another broker claimed the log):
        # this broker is no longer the coordinator, and every later operation answers
        # NOT_COORDINATOR without writing. `on_fenced` (the coordinator's) is told once,
        # to unload what it serves from memory.
        self.fenced: Fenced | None = None
        self.on_fenced: Callable[[], None] | None = None
        self._closed = False
        self._compaction_lock = asyncio.Lock()
        self._compaction_task: asyncio.Task[int] | None = None
        self._compacted: tuple[int, ...] = ()
        self._checkpoints = checkpoints if record_log.partition_log is not None else None
        # The log offset below which every record is fsynced and replayed, in order (None
        # while writes are replayed out of order, until they all are).
        self._applied_end: int | None = None
        self._since_checkpoint = 0
        # The checkpoint write under way, and the offset it covers.
        self._checkpoint_task: asyncio.Task[None] | None = None
        self._pending_checkpoint: int | None = None

    # ------------------------------------------------------------------ startup

    def load(self) -> int:
        """Rebuild the state machine (startup): from the checkpoint and the log after it,
        or by replaying the whole log; return the log records replayed."""
        start = self._restore_checkpoint()
        count = 0
        for key, value in self.record_log.replay(start):
            record = self._decode(key, value)
            if record is not None:
                self._replay(record)
                count += 1
        self._applied_end = self.record_log.end_offset
        self._since_checkpoint = count
        return count

    def _restore_checkpoint(self) -> int | None:
        """Load the checkpoint into the state machine; the offset to replay from, or
        None for a full replay (no usable checkpoint: logged)."""
        cp = self._checkpoints
        plog = self.record_log.partition_log
        if cp is None or plog is None:
            return None
        found = cp.file.read()
        if found is None:
            return None
        if not plog.log_start_offset <= found.offset <= plog.log_end_offset:
            log.warning(
                "checkpoint_outside_log",
                runtime=self.name,
                offset=found.offset,
                log_start_offset=plog.log_start_offset,
                log_end_offset=plog.log_end_offset,
            )
            return None
        try:
            cp.state.checkpoint_restore(found.payload)
        except Exception as exc:
            log.warning("checkpoint_undecodable", runtime=self.name, error=repr(exc))
            return None
        log.info(
            "checkpoint_loaded",
            runtime=self.name,
            offset=found.offset,
            log_end_offset=plog.log_end_offset,
        )
        return found.offset

    # --------------------------------------------------------------- operations

    async def run(
        self, key: Hashable, op: Operation[R, T], *, applied: Callable[[T], None] | None = None
    ) -> T:
        """Run `op` once every earlier operation on `key` is done; make its records
        durable, replay them, return its response. KafkaError from `op` passes through
        (nothing written); a failed write raises KafkaError(KAFKA_STORAGE_ERROR).

        `applied`, if given, is called with the response once the records are replayed
        (or at once when there were none), before the next operation on `key` starts:
        the shell's own effects of a change (opening a new topic's logs) then happen in
        the order the changes were serialised, never one change's after the next's.

        A caller cancelled midway does not stop the operation: once its records are
        written they are replayed or undone, and the key stays held until then.
        """
        task = asyncio.ensure_future(self._run(key, op, applied))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(_consume_result)
            raise

    async def _run(
        self, key: Hashable, op: Operation[R, T], applied: Callable[[T], None] | None = None
    ) -> T:
        async with self._locks.hold(key):
            refused = self._refusal()
            if refused is not None:
                raise refused
            records, response = op()
            if records:
                await self._commit(records)
            if applied is not None:
                applied(response)
            return response

    async def run_many(
        self, ops: Sequence[tuple[Hashable, Operation[R, T]]]
    ) -> list[T | KafkaError]:
        """Run several operations as one write: each op's response, or its KafkaError.

        The keys' locks are all held, every op is computed from committed state, and
        the records of those that succeeded go to the log as one append with one
        fsync (a request naming 500 partitions costs one round, not 500). A failed
        append or fsync fails every op that wrote, and none of them is replayed; an op
        that raised KafkaError wrote nothing and fails alone. Ops on a key named twice
        run in a later write, after the first one's records are replayed. Cancelling
        the caller does not stop the write, as with `run`.
        """
        task = asyncio.ensure_future(self._run_many(ops))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(_consume_result)
            raise

    async def _run_many(
        self, ops: Sequence[tuple[Hashable, Operation[R, T]]]
    ) -> list[T | KafkaError]:
        results: dict[int, T | KafkaError] = {}
        todo = list(enumerate(ops))
        while todo:
            wave: list[tuple[int, Operation[R, T]]] = []
            later: list[tuple[int, tuple[Hashable, Operation[R, T]]]] = []
            keys: set[Hashable] = set()
            for index, (key, op) in todo:
                if key in keys:
                    later.append((index, (key, op)))
                else:
                    keys.add(key)
                    wave.append((index, op))
            async with self._locks.hold_all(keys):
                await self._write_wave(wave, results)
            todo = later
        return [results[index] for index in range(len(ops))]

    async def _write_wave(
        self,
        wave: Sequence[tuple[int, Operation[R, T]]],
        results: dict[int, T | KafkaError],
    ) -> None:
        refused = self._refusal()
        if refused is not None:
            for index, _ in wave:
                results[index] = refused
            return
        writers: list[int] = []
        records: list[R] = []
        for index, op in wave:
            try:
                written, response = op()
            except KafkaError as exc:
                results[index] = exc
                continue
            results[index] = response
            if written:
                writers.append(index)
                records.extend(written)
        if not records:
            return
        try:
            await self._commit(records)
        except KafkaError as exc:
            for index in writers:
                results[index] = exc

    def _fence(self, exc: Fenced) -> None:
        if self.fenced is not None:
            return
        self.fenced = exc
        log.warning("coordinator_fenced", runtime=self.name, error=str(exc))
        if self.on_fenced is not None:
            self.on_fenced()

    def _not_coordinator(self) -> KafkaError:
        if isinstance(self.fenced, Loading):
            return KafkaError(ErrorCode.coordinator_load_in_progress, str(self.fenced.strerror))
        if isinstance(self.fenced, NotLed):
            return KafkaError(ErrorCode.not_coordinator, str(self.fenced.strerror))
        return KafkaError(
            ErrorCode.not_coordinator,
            f"the {self.name} log was claimed by another broker: {self.fenced}",
        )

    # ------------------------------------------------------------- leadership

    def unload(self, reason: str) -> None:
        """This broker does not lead the log (never claimed here, or handed over): every
        operation from now on answers NOT_COORDINATOR without writing, and no checkpoint
        is written of the state the coordinator then clears. `reopen` undoes it. A load
        under way (`begin_loading`) that is given up is unloaded so too."""
        if self.fenced is None or isinstance(self.fenced, Loading):
            self.fenced = NotLed(self.name, reason)
            log.info("coordinator_unloaded", runtime=self.name, reason=reason)
        self._since_checkpoint = 0

    def begin_loading(self, reason: str) -> None:
        """This broker claimed the log and is loading it (restoring it from the database,
        then `reopen` and the state machine's replay): every operation until `reopen`
        answers COORDINATOR_LOAD_IN_PROGRESS without writing, as Kafka's
        CoordinatorRuntime and TransactionStateManager answer for a coordinator
        partition they are loading. `unload` ends it if the load is given up."""
        self.fenced = Loading(self.name, reason)
        self._since_checkpoint = 0
        log.info("coordinator_loading", runtime=self.name, reason=reason)

    @property
    def loading(self) -> bool:
        """Whether the log is being loaded here (`begin_loading`, until `reopen`)."""
        return isinstance(self.fenced, Loading)

    def check_led(self) -> None:
        """Raise what every operation is answered while this broker does not serve the
        log: NOT_COORDINATOR (not led here, or claimed by another broker), or
        COORDINATOR_LOAD_IN_PROGRESS (being loaded). For reads, which do not go
        through `run`."""
        if self.fenced is not None:
            raise self._not_coordinator()

    async def quiesce(self, timeout_s: float = 10.0) -> None:
        """Wait (at most `timeout_s`) for the operations holding or waiting for a key to
        finish: those in flight commit, the later ones are refused (after `unload`)."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while (len(self._locks) or self._inflight) and (
            asyncio.get_running_loop().time() < deadline
        ):
            await asyncio.sleep(0.005)
        if self._checkpoint_task is not None:
            with contextlib.suppress(Exception):
                await self._checkpoint_task

    def reopen(self, record_log: CoordinatorLog) -> None:
        """Lead the log again (claimed by this broker, restored from the database): the
        old log is closed, `record_log` replaces it, writes are taken again. The caller
        clears the state machine and calls `load`: the whole log is replayed (a
        checkpoint of an earlier term here may predate what other brokers compacted)."""
        assert not self._inflight, "reopen with writes in flight"
        if not self._closed:
            self.record_log.close()
        self.record_log = record_log
        self.fenced = None
        self.failed = None
        self._closed = False
        self._compacted = ()
        self.truncations += 1
        self._applied_end = None
        self._since_checkpoint = 0
        self._checkpoints = self._checkpoints if record_log.partition_log is not None else None
        if self._checkpoints is not None:
            self._checkpoints.file.remove()

    def _refusal(self) -> KafkaError | None:
        if self.fenced is not None:
            return self._not_coordinator()
        if self._closed:
            # Shutting down: a late background operation is refused, not an alarm.
            return storage_error(f"the {self.name} log is closed")
        if self.failed is not None:
            return storage_error(self.failed)
        return None

    async def _commit(self, records: Sequence[R]) -> None:
        encoded = [kv for record in records for kv in self._encode(record)]
        write = _InflightWrite(self.record_log.end_offset)
        self._inflight.append(write)
        try:
            try:
                write.start = self.record_log.write(encoded)
                write.end = self.record_log.end_offset
            except Exception as exc:
                self._undo(write.start, exc, "append")
                if _is_storage_failure(exc):
                    raise self._write_error(exc, "append") from exc
                raise
            try:
                await self.record_log.sync()
            except Exception as exc:
                if write.error is None:
                    self._undo(write.start, exc, "fsync")
                assert write.error is not None
                if isinstance(exc, Fenced):
                    # Another broker claimed this log: it is the coordinator now.
                    self._fence(exc)
                    raise self._not_coordinator() from exc
                raise storage_error(write.error) from exc
            if write.error is not None:
                # An earlier write failed and its undo cut these records too.
                raise storage_error(write.error)
            for record in records:
                self._replay(record)
            self._applied(write)
        finally:
            self._inflight.remove(write)
            if not self._inflight and self.failed is None:
                self._applied_end = self.record_log.end_offset
        self._maybe_compact()
        self._maybe_checkpoint()

    def _write_error(self, exc: BaseException, stage: str) -> KafkaError:
        return storage_error(
            f"could not make the {self.name} change durable: {stage} failed ({exc}); "
            "nothing was applied, retry once the disk is healthy"
        )

    def _undo(self, offset: int, exc: BaseException, stage: str) -> None:
        """Cut the log back to `offset` and fail every write that lies there or later."""
        error = self._write_error(exc, stage).message
        failed = 0
        for write in self._inflight:
            if write.start >= offset and write.error is None:
                write.error = error
                failed += 1
        self.truncations += 1
        # A storage outage is logged once where it begins (persister.pg_commit), and a
        # shared log's conflict is routine (its writer catches up and retries).
        report = log.debug if getattr(exc, "reported_once", False) else log.error
        report(
            "coordinator_write_failed",
            runtime=self.name,
            stage=stage,
            offset=offset,
            failed_operations=failed,
            error=repr(exc),
        )
        try:
            self.record_log.truncate(offset)
        except Exception as truncate_exc:
            self.failed = (
                f"the {self.name} log could not be truncated after a failed {stage} "
                f"({truncate_exc}); writes are refused until the broker restarts"
            )
            log.critical(
                "coordinator_log_failed",
                runtime=self.name,
                offset=offset,
                error=repr(truncate_exc),
                write_error=repr(exc),
            )

    def _applied(self, write: _InflightWrite) -> None:
        self._since_checkpoint += write.end - write.start
        # Replayed right after what was replayed before: memory is the log up to its end.
        self._applied_end = write.end if self._applied_end == write.start else None

    @property
    def committed_offset(self) -> int:
        """Below this offset every record is durable and replayed (or being replayed)."""
        return min((w.start for w in self._inflight), default=self.record_log.end_offset)

    @property
    def pending_writes(self) -> int:
        """Writes appended and not yet replayed or undone."""
        return len(self._inflight)

    @property
    def keys_in_use(self) -> int:
        """Keys with an operation running or waiting (for tests and metrics)."""
        return len(self._locks)

    # -------------------------------------------------------------- checkpoints

    @property
    def checkpoint_offset(self) -> int | None:
        """The offset the checkpoint on disk covers (None: none known)."""
        return None if self._checkpoints is None else self._checkpoints.file.offset

    def _checkpoint_due(self) -> bool:
        cp = self._checkpoints
        return (
            cp is not None
            and self._checkpoint_task is None
            and self._since_checkpoint >= max(cp.interval_records, cp.state.checkpoint_size())
        )

    def _capture(self) -> tuple[int, Callable[[], bytes], int] | None:
        """(offset, encoder, generation) of the state now, if memory is exactly the
        durable log up to a known offset; else None."""
        cp = self._checkpoints
        if cp is None or self._closed or self.failed is not None or self._applied_end is None:
            return None
        self._since_checkpoint = 0
        return self._applied_end, cp.state.checkpoint_capture(), cp.file.generation

    def _maybe_checkpoint(self) -> None:
        if not self._checkpoint_due():
            return
        captured = self._capture()
        if captured is not None:
            self._start_checkpoint(captured)

    def _start_checkpoint(
        self, captured: tuple[int, Callable[[], bytes], int]
    ) -> asyncio.Task[None]:
        task = asyncio.ensure_future(asyncio.to_thread(self._write_checkpoint, *captured))
        self._checkpoint_task = task
        self._pending_checkpoint = captured[0]

        def done(finished: asyncio.Task[None]) -> None:
            self._checkpoint_task = None
            self._pending_checkpoint = None
            if not finished.cancelled() and finished.exception() is not None:
                log.error(
                    "checkpoint_write_failed",
                    runtime=self.name,
                    error=repr(finished.exception()),
                )

        task.add_done_callback(done)
        return task

    def _write_checkpoint(self, offset: int, encode: Callable[[], bytes], generation: int) -> None:
        cp = self._checkpoints
        assert cp is not None
        if cp.file.write(offset, encode(), generation):
            log.info("checkpoint_written", runtime=self.name, offset=offset)

    async def checkpoint(self) -> bool:
        """Write a checkpoint now (tests, tools); whether one was written."""
        if self._checkpoint_task is not None:
            with contextlib.suppress(Exception):
                await self._checkpoint_task
        captured = self._capture()
        if captured is None:
            return False
        with contextlib.suppress(Exception):
            await self._start_checkpoint(captured)
        return self.checkpoint_offset == captured[0]

    def before_rewrite(self, limit: int) -> None:
        """A compaction is about to swap segments holding records below `limit`: a
        checkpoint that does not cover them all goes (see the module docstring)."""
        cp = self._checkpoints
        if cp is None:
            return
        pending = self._pending_checkpoint
        void = pending is not None and pending < limit
        written = cp.file.offset
        if not void and written is not None and written >= limit:
            return
        cp.file.remove(void_writes=void)
        if written is not None or void:
            log.info(
                "checkpoint_removed_for_compaction",
                runtime=self.name,
                offset=written,
                pending_offset=pending,
                limit=limit,
            )
            # Write a fresh one soon.
            self._since_checkpoint = max(self._since_checkpoint, cp.interval_records)

    # --------------------------------------------------------------- compaction

    def _committed_closed_segments(self, plog: PartitionLog) -> list[int]:
        bases = plog.segment_base_offsets
        committed = self.committed_offset
        return [b for b, limit in itertools.pairwise(bases) if limit <= committed]

    def _maybe_compact(self) -> None:
        plog = self.record_log.partition_log
        if self._compaction is None or plog is None or self._compaction_task is not None:
            return
        if tuple(self._committed_closed_segments(plog)) == self._compacted:
            return
        task = asyncio.ensure_future(self.compact())
        self._compaction_task = task

        def done(finished: asyncio.Task[int]) -> None:
            self._compaction_task = None
            if not finished.cancelled() and finished.exception() is not None:
                log.error(
                    "coordinator_compaction_failed",
                    runtime=self.name,
                    error=repr(finished.exception()),
                )

        task.add_done_callback(done)

    async def compact(self) -> int:
        """Compact the closed segments not compacted yet; return segments rewritten."""
        plog = self.record_log.partition_log
        if self._compaction is None or plog is None or self.fenced is not None:
            return 0  # not led here: the log is another broker's to compact
        async with self._compaction_lock:
            bases = self._committed_closed_segments(plog)
            if not bases or tuple(bases) == self._compacted:
                return 0
            truncations = self.truncations

            def still_valid(read: Sequence[int]) -> bool:
                closed = self._committed_closed_segments(plog)
                if self.truncations != truncations or not set(read) <= set(closed):
                    return False
                # The swap follows on this same step of the loop.
                segments = plog.segment_base_offsets
                self.before_rewrite(segments[segments.index(max(read)) + 1])
                return True

            rewritten = await self._compaction(plog, bases, still_valid)
            self._compacted = tuple(
                b for b in self._committed_closed_segments(plog) if b <= bases[-1]
            )
            return rewritten

    # ---------------------------------------------------------------- lifecycle

    async def stop(self) -> None:
        """Stop a background compaction (the log stays as it was or fully swapped) and
        let a checkpoint under way finish."""
        task = self._compaction_task
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._checkpoint_task is not None:
            with contextlib.suppress(Exception):
                await self._checkpoint_task

    def close(self) -> None:
        """Close the log; a clean close first checkpoints what was replayed since the
        last checkpoint (blocking: shutdown only)."""
        if (
            not self._closed
            and self.fenced is None
            and self._since_checkpoint
            and self._checkpoint_task is None
        ):
            captured = self._capture()
            if captured is not None:
                try:
                    self._write_checkpoint(*captured)
                except OSError as exc:
                    log.error("checkpoint_write_failed", runtime=self.name, error=repr(exc))
        self._closed = True
        if self._compaction_task is not None:
            self._compaction_task.cancel()
        self.record_log.close()


def _is_storage_failure(exc: BaseException) -> bool:
    return isinstance(exc, OSError) or (
        isinstance(exc, KafkaError) and exc.code == ErrorCode.kafka_storage_error
    )


class KeyCompaction:
    """Compaction for logs whose every record sets its key's whole value: keep the
    newest record per key in the closed segments, drop keys whose newest is a tombstone
    (`persister.coordinator_log.compact_by_key`), and merge the closed segments into one, so
    the log holds the live state plus the active segment."""

    def __init__(self, keys_of: CompactionKeys, clock: Clock = SYSTEM_CLOCK) -> None:
        self._keys_of = keys_of
        self._clock = clock

    async def __call__(
        self, plog: PartitionLog, base_offsets: Sequence[int], still_valid: StillValid
    ) -> int:
        result = await asyncio.to_thread(compact_by_key, plog, base_offsets, self._keys_of)
        if not still_valid(base_offsets):
            if result.cleaned is not None:
                result.cleaned.unlink(missing_ok=True)
            return 0
        if result.cleaned is None:
            # Nothing left: the segments go and the log starts after them.
            bases = plog.segment_base_offsets
            plog.delete_records_before(bases[bases.index(base_offsets[-1]) + 1])
        else:
            plog.replace_closed_segments(base_offsets, result.cleaned, self._clock.now_ms())
        log.info(
            "coordinator_log_compacted",
            directory=str(plog.directory),
            segments=len(base_offsets),
            records_before=result.records_before,
            records_after=result.records_after,
        )
        return len(base_offsets)
