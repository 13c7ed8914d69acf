"""The transaction coordinator: transactional ids, their producer ids and epochs, and the
state of each one's transaction (Kafka's TransactionCoordinator, TransactionStateManager
and TransactionMetadata, transaction version 1 semantics).

State lives in `data/transactions/` as records keyed like Kafka's `__transaction_state`
(TransactionLogKey / TransactionLogValue, the version 0 layouts Kafka writes while
transaction.version is below 2). Every change is computed from committed state under the
transactional id's lock and applied only once fsynced (`coordinator.runtime`); `replay`
is the one place a record takes effect, live and at startup. Compaction keeps the newest
record per transactional id; an expired id is a tombstone.

States and transitions (Kafka's TransactionState.VALID_PREVIOUS_STATES):

    Empty -> Ongoing                 AddPartitionsToTxn / AddOffsetsToTxn
    Ongoing -> PrepareCommit/Abort   EndTxn
    Prepare* -> Complete*            once every partition's marker is durable
    Empty/Complete* -> Empty         InitProducerId (epoch bump, or a new producer id)
    Ongoing -> PrepareEpochFence     InitProducerId of a new producer instance, or the
                -> PrepareAbort      transaction timed out: the epoch is bumped and the
                                     transaction aborted, fencing the old producer
    Empty/Complete* -> Dead          transactional.id.expiration.ms (a tombstone)

PrepareEpochFence is never written: Kafka keeps it as a pending state and writes the
PrepareAbort that follows; here both steps are computed in one operation and only the
PrepareAbort (with the bumped epoch) is written, so memory never holds an epoch the log
does not. Kafka's `hasFailedEpochFence` bookkeeping is therefore not needed.

Single broker: the markers are written in-process (the `MarkerWriter` the broker hands
in) and EndTxn is answered only after they are durable on every partition of the
transaction and the Complete* record is written. A transaction left in Prepare* (a
failed marker write, a restart) is completed again at startup, on a client's retry and
by the periodic sweep.

Not modelled: two-phase commit (KIP-939), transaction version 2 (KIP-890 part 2:
epoch bump per transaction, implicit AddPartitions from Produce). The previous epoch a
KIP-360 retry of InitProducerId may present is kept in memory only, as in Kafka, whose
log value v0 has no field for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import struct
from collections.abc import Awaitable, Callable, Collection, Hashable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import IntEnum
from typing import Protocol

import structlog

from coordinator.runtime import CoordinatorRuntime, KeyCompaction
from persister.clock import SYSTEM_CLOCK, Clock, Timer
from persister.coordinator_log import KeyValue, MemoryRecordLog
from persister.storage import CoordinatorLog
from protocol.errors import ErrorCode, KafkaError
from protocol.records import NO_PRODUCER_EPOCH, NO_PRODUCER_ID

log = structlog.get_logger("spool.transactions")

SHORT_MAX = 2**15 - 1
# Kafka's offsets.topic.num.partitions default: AddOffsetsToTxn adds the group's
# __consumer_offsets partition to the transaction.
OFFSETS_TOPIC = "__consumer_offsets"
OFFSETS_TOPIC_PARTITIONS = 50

TopicPartition = tuple[str, int]


class TxnState(IntEnum):
    """Kafka's TransactionState with its ids (TransactionLogValue.TransactionStatus)."""

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def state_name(self) -> str:
        """The name DescribeTransactions and Kafka's tools show."""
        return "".join(part.capitalize() for part in self.name.split("_"))


S = TxnState
VALID_PREVIOUS_STATES: dict[TxnState, frozenset[TxnState]] = {
    S.EMPTY: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.ONGOING: frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_COMMIT: frozenset({S.ONGOING}),
    # Empty and Complete* -> PrepareAbort are transaction version 2 only (not served).
    S.PREPARE_ABORT: frozenset({S.ONGOING, S.PREPARE_EPOCH_FENCE}),
    S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
    S.DEAD: frozenset({S.EMPTY, S.COMPLETE_ABORT, S.COMPLETE_COMMIT}),
    S.PREPARE_EPOCH_FENCE: frozenset({S.ONGOING}),
}
EXPIRATION_ALLOWED = frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT})
PREPARE_STATES = frozenset({S.PREPARE_COMMIT, S.PREPARE_ABORT})


def is_epoch_exhausted(epoch: int) -> bool:
    """Kafka keeps Short.MaxValue back so the coordinator can always fence a producer."""
    return epoch >= SHORT_MAX - 1


def offsets_partition(group_id: str) -> int:
    """The __consumer_offsets partition of a group (Kafka's partitionFor: Java's
    String.hashCode, made non-negative, modulo offsets.topic.num.partitions)."""
    units = group_id.encode("utf-16-be")
    h = 0
    for i in range(0, len(units), 2):
        h = (31 * h + (units[i] << 8 | units[i + 1])) & 0xFFFFFFFF
    return (h & 0x7FFFFFFF) % OFFSETS_TOPIC_PARTITIONS


@dataclass(frozen=True, slots=True)
class TxnMetadata:
    """One transactional id's state, as its TransactionLogValue stores it."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    txn_timeout_ms: int
    state: TxnState
    partitions: frozenset[TopicPartition]
    txn_start_ms: int
    txn_last_update_ms: int
    # The epoch before the last InitProducerId bump and the producer id before the
    # last transition, for KIP-360 retries; not in the log (Kafka's value v0 has no
    # fields for them and reloads them as -1), so equality ignores them.
    last_producer_epoch: int = field(default=NO_PRODUCER_EPOCH, compare=False)
    prev_producer_id: int = field(default=NO_PRODUCER_ID, compare=False)

    def transit(self, state: TxnState, **changes: object) -> TxnMetadata:
        """This metadata moved to `state`; IllegalTransition unless Kafka allows it."""
        if self.state not in VALID_PREVIOUS_STATES[state]:
            raise IllegalTransition(self.transactional_id, self.state, state)
        changes.setdefault("prev_producer_id", self.producer_id)
        return replace(self, state=state, **changes)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class TxnTombstone:
    """An expired transactional id (Dead): its key is deleted."""

    transactional_id: str


TxnRecord = TxnMetadata | TxnTombstone


class IllegalTransition(Exception):
    def __init__(self, transactional_id: str, old: TxnState, new: TxnState) -> None:
        super().__init__(
            f"transactional id {transactional_id}: {old.state_name} -> {new.state_name} "
            "is not a valid transition"
        )


# ------------------------------------------------------------------ record codec
#
# Kafka's coordinator record framing: the key is the record type (0, TransactionLogKey)
# as an int16, then the key's fields; the value is its version (0) as an int16, then
# the fields. Strings are int16-length UTF-8; arrays int32-count (-1: null).

KEY_TYPE = 0
VALUE_VERSION = 0


def _string(s: str) -> bytes:
    b = s.encode()
    return struct.pack(">h", len(b)) + b


def encode_key(transactional_id: str) -> bytes:
    return struct.pack(">h", KEY_TYPE) + _string(transactional_id)


def encode_value(m: TxnMetadata) -> bytes:
    out = bytearray(
        struct.pack(
            ">hqhib", VALUE_VERSION, m.producer_id, m.producer_epoch, m.txn_timeout_ms, m.state
        )
    )
    if m.state == S.EMPTY:
        # Kafka writes a null partition list for Empty.
        out += struct.pack(">i", -1)
    else:
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(m.partitions):
            by_topic.setdefault(topic, []).append(partition)
        out += struct.pack(">i", len(by_topic))
        for topic, partitions in by_topic.items():
            out += _string(topic) + struct.pack(
                f">i{len(partitions)}i", len(partitions), *partitions
            )
    out += struct.pack(">qq", m.txn_last_update_ms, m.txn_start_ms)
    return bytes(out)


def encode(record: TxnRecord) -> list[KeyValue]:
    key = encode_key(record.transactional_id)
    if isinstance(record, TxnTombstone):
        return [(key, None)]
    return [(key, encode_value(record))]


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, fmt: str) -> tuple[int, ...]:
        values = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return values

    def string(self) -> str:
        (n,) = self.take(">h")
        s = self.data[self.pos : self.pos + n].decode()
        self.pos += n
        return s


def decode_key(key: bytes | None) -> str:
    if key is None:
        raise ValueError("transaction record has no key")
    reader = _Reader(key)
    (record_type,) = reader.take(">h")
    if record_type != KEY_TYPE:
        raise ValueError(f"record type {record_type} is not a TransactionLogKey ({KEY_TYPE})")
    return reader.string()


def decode(key: bytes | None, value: bytes | None) -> TxnRecord:
    """The record stored as (key, value); ValueError if it is not a transaction record."""
    transactional_id = decode_key(key)
    if value is None:
        return TxnTombstone(transactional_id)
    reader = _Reader(value)
    (version,) = reader.take(">h")
    if version != VALUE_VERSION:
        raise ValueError(
            f"TransactionLogValue version {version} of {transactional_id!r} is not supported "
            f"(only {VALUE_VERSION})"
        )
    producer_id, epoch, timeout_ms, status = reader.take(">qhib")
    (topics,) = reader.take(">i")
    partitions: set[TopicPartition] = set()
    for _ in range(max(topics, 0)):
        topic = reader.string()
        (count,) = reader.take(">i")
        partitions.update((topic, p) for p in reader.take(f">{count}i"))
    last_update_ms, start_ms = reader.take(">qq")
    return TxnMetadata(
        transactional_id,
        producer_id,
        epoch,
        timeout_ms,
        TxnState(status),
        frozenset() if status == S.EMPTY else frozenset(partitions),
        start_ms,
        last_update_ms,
    )


def compaction_keys(key: bytes | None, value: bytes | None) -> list[tuple[Hashable, bool]]:
    return [(decode_key(key), value is None)]


# ------------------------------------------------------------------ transitions (pure)


def _fenced(m: TxnMetadata, producer_id: int, producer_epoch: int) -> KafkaError | None:
    """The error for a request that names another producer or epoch than `m` has."""
    if m.producer_id != producer_id:
        return KafkaError(
            ErrorCode.invalid_producer_id_mapping,
            f"Producer id {producer_id} is not the current producer id {m.producer_id} of "
            f"transactional id {m.transactional_id}",
        )
    if m.producer_epoch != producer_epoch:
        return KafkaError(
            ErrorCode.producer_fenced,
            f"Producer epoch {producer_epoch} of transactional id {m.transactional_id} is "
            f"fenced: its current epoch is {m.producer_epoch} (another producer with the "
            "same transactional.id started, or the transaction timed out)",
        )
    return None


def _concurrent(m: TxnMetadata) -> KafkaError:
    return KafkaError(
        ErrorCode.concurrent_transactions,
        f"Transactional id {m.transactional_id} is completing its transaction "
        f"({m.state.state_name}); retry shortly",
    )


def _unknown(transactional_id: str) -> KafkaError:
    return KafkaError(
        ErrorCode.invalid_producer_id_mapping,
        f"Transactional id {transactional_id} is unknown; call InitProducerId first",
    )


def fence(m: TxnMetadata, now_ms: int) -> TxnMetadata:
    """Ongoing -> PrepareEpochFence -> PrepareAbort with the epoch bumped (Kafka's
    prepareFenceProducerEpoch, then the abort it starts): the old producer is fenced.

    At Short.MaxValue there is no epoch left to bump to (Kafka's prepareFenceProducerEpoch
    refuses to overflow): the transaction is aborted at its own epoch, and completing
    the abort gives the transactional id a new producer id (`prepare_complete`), which
    fences the old producer instead, as Kafka rotates an exhausted producer id."""
    if m.producer_epoch >= SHORT_MAX:
        return m.transit(
            S.PREPARE_ABORT, last_producer_epoch=NO_PRODUCER_EPOCH, txn_last_update_ms=now_ms
        )
    fencing = m.transit(S.PREPARE_EPOCH_FENCE, producer_epoch=m.producer_epoch + 1)
    return fencing.transit(
        S.PREPARE_ABORT, last_producer_epoch=NO_PRODUCER_EPOCH, txn_last_update_ms=now_ms
    )


def prepare_init(
    m: TxnMetadata | None,
    transactional_id: str,
    timeout_ms: int,
    expected: tuple[int, int] | None,
    new_producer_id: int | None,
    now_ms: int,
) -> TxnMetadata:
    """InitProducerId with a transactional id (Kafka's prepareInitProducerIdTransit).

    Returns the metadata to write: Empty with the epoch to hand out, or PrepareAbort
    (an Ongoing transaction is fenced and aborted first: the caller completes it and
    answers CONCURRENT_TRANSACTIONS, so the client retries and gets a second bump).
    `new_producer_id` is a freshly allocated id, used for a new transactional id or
    when the epoch is exhausted; None raises if one is needed (the caller allocates).
    """
    if m is None:
        if new_producer_id is None:
            raise NeedProducerId()
        m = TxnMetadata(
            transactional_id,
            new_producer_id,
            NO_PRODUCER_EPOCH,
            timeout_ms,
            S.EMPTY,
            frozenset(),
            -1,
            now_ms,
        )
    if expected is not None:
        pid, epoch = expected
        # Kafka's isValidProducerId: a fresh id, the current id, or a retry after the
        # epoch was exhausted and the id rotated.
        valid = (
            m.producer_epoch == NO_PRODUCER_EPOCH
            or pid == m.producer_id
            or (pid == m.prev_producer_id and is_epoch_exhausted(epoch))
        )
        if not valid:
            raise KafkaError(
                ErrorCode.producer_fenced,
                f"Producer id {pid} is no longer the producer of transactional id "
                f"{transactional_id}",
            )
    if m.state in PREPARE_STATES:
        raise _concurrent(m)
    if m.state == S.ONGOING:
        return fence(m, now_ms)
    if m.state not in EXPIRATION_ALLOWED:
        raise IllegalTransition(transactional_id, m.state, S.EMPTY)
    reset = {
        "txn_timeout_ms": timeout_ms,
        "partitions": frozenset(),
        "txn_start_ms": -1,
        "txn_last_update_ms": now_ms,
    }
    if is_epoch_exhausted(m.producer_epoch) and (
        expected is None or expected[1] == m.producer_epoch
    ):
        if new_producer_id is None:
            raise NeedProducerId()
        last = m.producer_epoch if expected is not None else NO_PRODUCER_EPOCH
        return m.transit(
            S.EMPTY,
            producer_id=new_producer_id,
            producer_epoch=0,
            last_producer_epoch=last,
            **reset,
        )
    bumped = m.producer_epoch + 1
    if expected is None:
        return m.transit(
            S.EMPTY, producer_epoch=bumped, last_producer_epoch=NO_PRODUCER_EPOCH, **reset
        )
    epoch = expected[1]
    if m.producer_epoch == NO_PRODUCER_EPOCH or epoch == m.producer_epoch:
        return m.transit(
            S.EMPTY, producer_epoch=bumped, last_producer_epoch=m.producer_epoch, **reset
        )
    if epoch == m.last_producer_epoch:
        # A retry of a bump whose answer was lost: the same epoch again.
        return m.transit(S.EMPTY, **reset)
    raise KafkaError(
        ErrorCode.producer_fenced,
        f"Producer epoch {epoch} of transactional id {transactional_id} is fenced: the "
        f"current epoch is {m.producer_epoch}",
    )


class NeedProducerId(Exception):
    """prepare_init needs a new producer id the caller did not allocate."""


def prepare_add_partitions(
    m: TxnMetadata | None,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    partitions: Collection[TopicPartition],
    now_ms: int,
) -> TxnMetadata | None:
    """AddPartitionsToTxn / AddOffsetsToTxn; None when nothing changes (all present)."""
    if m is None:
        raise _unknown(transactional_id)
    error = _fenced(m, producer_id, producer_epoch)
    if error is not None:
        raise error
    if m.state in PREPARE_STATES:
        raise _concurrent(m)
    if m.state == S.ONGOING and m.partitions.issuperset(partitions):
        return None
    start = now_ms if m.state in EXPIRATION_ALLOWED else m.txn_start_ms
    return m.transit(
        S.ONGOING,
        partitions=m.partitions | frozenset(partitions),
        txn_start_ms=start,
        txn_last_update_ms=now_ms,
    )


def prepare_end(
    m: TxnMetadata | None,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    commit: bool,
    now_ms: int,
) -> TxnMetadata | None:
    """EndTxn from a client (transaction version 1, Kafka's endTransactionWithTV1):
    the Prepare* record to write, or None if the transaction already ended this way.
    Raises CONCURRENT_TRANSACTIONS while the same outcome is being completed."""
    if m is None:
        raise _unknown(transactional_id)
    error = _fenced(m, producer_id, producer_epoch)
    if error is not None:
        raise error
    wanted = "commit" if commit else "abort"
    if m.state == S.ONGOING:
        target = S.PREPARE_COMMIT if commit else S.PREPARE_ABORT
        return m.transit(target, txn_last_update_ms=now_ms)
    if m.state == (S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT):
        return None
    if m.state == (S.PREPARE_COMMIT if commit else S.PREPARE_ABORT):
        raise _concurrent(m)
    raise KafkaError(
        ErrorCode.invalid_txn_state,
        f"Cannot {wanted} the transaction of {transactional_id}: it is {m.state.state_name}"
        + (" (no partition was added)" if m.state == S.EMPTY else ""),
    )


def needs_rotation(m: TxnMetadata) -> bool:
    """An abort at Short.MaxValue (see `fence`) ends with a new producer id."""
    return m.state == S.PREPARE_ABORT and m.producer_epoch >= SHORT_MAX


def prepare_complete(
    m: TxnMetadata, now_ms: int, new_producer_id: int | None = None
) -> TxnMetadata:
    """Prepare* -> Complete* once every marker is durable. An abort at the maximum epoch
    moves the id to `new_producer_id` with no epoch yet (the next InitProducerId hands
    out epoch 0), so the old producer gets INVALID_PRODUCER_ID_MAPPING from then on."""
    target = S.COMPLETE_COMMIT if m.state == S.PREPARE_COMMIT else S.COMPLETE_ABORT
    if needs_rotation(m):
        if new_producer_id is None:
            raise NeedProducerId()
        return m.transit(
            target,
            producer_id=new_producer_id,
            producer_epoch=NO_PRODUCER_EPOCH,
            last_producer_epoch=NO_PRODUCER_EPOCH,
            partitions=frozenset(),
            txn_last_update_ms=now_ms,
        )
    return m.transit(target, partitions=frozenset(), txn_last_update_ms=now_ms)


def verify(
    m: TxnMetadata | None,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    partitions: Iterable[TopicPartition],
) -> dict[TopicPartition, ErrorCode]:
    """Whether each partition is in the producer's ongoing transaction (Kafka's
    handleVerifyPartitionsInTransaction: TRANSACTION_ABORTABLE for one that is not)."""
    wanted = list(partitions)
    error: ErrorCode | None = None
    if m is None or m.producer_id != producer_id:
        error = ErrorCode.invalid_producer_id_mapping
    elif m.producer_epoch != producer_epoch:
        error = ErrorCode.producer_fenced
    elif m.state in PREPARE_STATES:
        error = ErrorCode.concurrent_transactions
    if error is not None:
        return dict.fromkeys(wanted, error)
    assert m is not None
    return {
        tp: ErrorCode.none if tp in m.partitions else ErrorCode.transaction_abortable
        for tp in wanted
    }


# ------------------------------------------------------------------ the coordinator


class MarkerWriter(Protocol):
    async def __call__(
        self,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        partitions: frozenset[TopicPartition],
    ) -> None:
        """Write a COMMIT or ABORT marker on every partition and return once all are
        durable; raise KafkaError if any could not be written."""


async def _no_markers(
    producer_id: int, producer_epoch: int, commit: bool, partitions: frozenset[TopicPartition]
) -> None:
    return None


@dataclass(frozen=True, slots=True)
class TransactionConfig:
    """Kafka's transaction coordinator keys (TransactionStateManagerConfig)."""

    max_timeout_ms: int = 900_000
    id_expiration_ms: int = 604_800_000
    abort_timed_out_interval_ms: int = 10_000
    remove_expired_interval_ms: int = 3_600_000

    @classmethod
    def from_mapping(cls, get: Callable[[str], int]) -> TransactionConfig:
        return cls(
            get("transaction.max.timeout.ms"),
            get("transactional.id.expiration.ms"),
            get("transaction.abort.timed.out.transaction.cleanup.interval.ms"),
            get("transaction.remove.expired.transaction.cleanup.interval.ms"),
        )


class TransactionCoordinator:
    """Transactional ids on the coordinator runtime; see the module docstring.

    Methods raise KafkaError with Kafka's codes; a failed write is
    KAFKA_STORAGE_ERROR (handlers answer NOT_COORDINATOR, as Kafka does).
    """

    def __init__(
        self,
        record_log: CoordinatorLog | None = None,
        *,
        allocate_producer_id: Callable[[], Awaitable[int]],
        markers: MarkerWriter = _no_markers,
        config: TransactionConfig | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.config = config or TransactionConfig()
        self.clock = clock
        self.markers = markers
        self._allocate = allocate_producer_id
        self.transactions: dict[str, TxnMetadata] = {}
        self.runtime: CoordinatorRuntime[TxnRecord] = CoordinatorRuntime(
            "transactions",
            record_log if record_log is not None else MemoryRecordLog(),
            encode=encode,
            decode=decode,
            replay=self._replay,
            clock=clock,
            compaction=KeyCompaction(compaction_keys, clock),
        )
        # Transactions whose markers are being written, by transactional id.
        self._completing: dict[str, asyncio.Task[None]] = {}
        self._timers: dict[str, Timer] = {}
        self._sweeps: set[asyncio.Task[None]] = set()
        self._stopped = True

    # -- records and lifecycle ----------------------------------------------------

    def _replay(self, record: TxnRecord) -> None:
        """The one place transaction records take effect, live and at startup."""
        if isinstance(record, TxnTombstone):
            self.transactions.pop(record.transactional_id, None)
        else:
            self.transactions[record.transactional_id] = record

    def load(self) -> int:
        count = self.runtime.load()
        in_doubt = sum(1 for m in self.transactions.values() if m.state in PREPARE_STATES)
        log.info(
            "transactions_loaded",
            records=count,
            transactional_ids=len(self.transactions),
            in_doubt=in_doubt,
        )
        return count

    def start(self) -> None:
        """Complete in-doubt transactions and start the timeout and expiry sweeps."""
        self._stopped = False
        for transactional_id, m in list(self.transactions.items()):
            if m.state in PREPARE_STATES:
                self.complete_in_background(transactional_id)
        self._schedule(self.config.abort_timed_out_interval_ms, self._abort_sweep)
        self._schedule(self.config.remove_expired_interval_ms, self._expire_sweep)

    async def stop(self) -> None:
        self._stopped = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        tasks = [*self._sweeps, *self._completing.values()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self.runtime.stop()

    def close(self) -> None:
        self.runtime.close()

    async def unload(self, reason: str) -> None:
        """This broker no longer leads the transactions log (handed over): requests
        from now on answer NOT_COORDINATOR, those in flight finish, then the sweeps
        stop and the transactional ids leave memory."""
        self.runtime.unload(reason)
        await self.runtime.quiesce()
        await self.stop()
        self.transactions.clear()

    def drop(self, reason: str) -> None:
        """Another broker claimed the transactions log: unload at once."""
        self.runtime.unload(reason)
        self._stopped = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for task in [*self._sweeps, *self._completing.values()]:
            task.cancel()
        self.transactions.clear()

    def reload(self, record_log: CoordinatorLog) -> None:
        """This broker leads the transactions log (again), restored from the database:
        replayed, in-doubt transactions completed, sweeps started."""
        self.transactions.clear()
        self.runtime.reopen(record_log)
        self.load()
        self.start()

    def _schedule(self, interval_ms: int, sweep: Callable[[], Awaitable[object]]) -> None:
        if self._stopped:
            return

        def fire() -> None:
            if self._stopped:
                return
            task = asyncio.ensure_future(self._run_sweep(interval_ms, sweep))
            self._sweeps.add(task)
            task.add_done_callback(self._sweeps.discard)

        name = getattr(sweep, "__name__", repr(sweep))
        self._timers[name] = self.clock.call_at(self.clock.now_ms() + interval_ms, fire)

    async def _run_sweep(self, interval_ms: int, sweep: Callable[[], Awaitable[object]]) -> None:
        try:
            await sweep()
        except Exception:
            log.exception("transaction_sweep_failed", sweep=getattr(sweep, "__name__", "?"))
        finally:
            self._schedule(interval_ms, sweep)

    async def _abort_sweep(self) -> None:
        await self.abort_timed_out()

    async def _expire_sweep(self) -> None:
        await self.expire_transactional_ids()

    def get(self, transactional_id: str) -> TxnMetadata | None:
        return self.transactions.get(transactional_id)

    # -- InitProducerId ------------------------------------------------------------

    def validate_timeout(self, timeout_ms: int) -> None:
        if timeout_ms <= 0 or timeout_ms > self.config.max_timeout_ms:
            raise KafkaError(
                ErrorCode.invalid_transaction_timeout,
                f"transaction.timeout.ms {timeout_ms} must be between 1 and the broker's "
                f"transaction.max.timeout.ms ({self.config.max_timeout_ms})",
            )

    async def init_producer_id(
        self, transactional_id: str, timeout_ms: int, expected: tuple[int, int] | None = None
    ) -> tuple[int, int]:
        """(producer id, epoch) for a transactional producer starting (or bumping)."""
        if not transactional_id:
            raise KafkaError(ErrorCode.invalid_request, "The transactional id must not be empty")
        self.validate_timeout(timeout_ms)
        new_pid: int | None = None
        for _ in range(2):
            now = self.clock.now_ms()

            def op(
                new_pid: int | None = new_pid, now: int = now
            ) -> tuple[list[TxnRecord], TxnMetadata]:
                self._drive_in_doubt(transactional_id)
                m = prepare_init(
                    self.transactions.get(transactional_id),
                    transactional_id,
                    timeout_ms,
                    expected,
                    new_pid,
                    now,
                )
                return [m], m

            try:
                m = await self.runtime.run(transactional_id, op)
            except NeedProducerId:
                # Allocated outside the key's lock: it is a durable write of its own.
                new_pid = await self._allocate()
                continue
            break
        else:  # pragma: no cover - the second round always has an id
            raise KafkaError(ErrorCode.unknown_server_error, "no producer id was allocated")
        if m.state == S.PREPARE_ABORT:
            log.info(
                "transaction_fenced_by_init",
                transactional_id=transactional_id,
                producer_id=m.producer_id,
                producer_epoch=m.producer_epoch,
            )
            self.complete_in_background(transactional_id)
            raise _concurrent(m)
        log.info(
            "producer_id_initialized",
            transactional_id=transactional_id,
            producer_id=m.producer_id,
            producer_epoch=m.producer_epoch,
        )
        return m.producer_id, m.producer_epoch

    # -- AddPartitionsToTxn / AddOffsetsToTxn / verification ------------------------

    async def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Collection[TopicPartition],
    ) -> None:
        if not transactional_id:
            raise KafkaError(ErrorCode.invalid_request, "The transactional id must not be empty")
        now = self.clock.now_ms()

        def op() -> tuple[list[TxnRecord], None]:
            m = self.transactions.get(transactional_id)
            self._drive_in_doubt(transactional_id)
            new = prepare_add_partitions(
                m, transactional_id, producer_id, producer_epoch, partitions, now
            )
            return ([] if new is None else [new]), None

        await self.runtime.run(transactional_id, op)

    def verify(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[TopicPartition],
    ) -> dict[TopicPartition, ErrorCode]:
        return verify(
            self.transactions.get(transactional_id),
            transactional_id,
            producer_id,
            producer_epoch,
            partitions,
        )

    # -- EndTxn and completion ----------------------------------------------------

    async def end_txn(
        self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool
    ) -> None:
        """Commit or abort; returns once the markers are durable on every partition and
        the transaction is Complete*."""
        if not transactional_id:
            raise KafkaError(ErrorCode.invalid_request, "The transactional id must not be empty")
        now = self.clock.now_ms()

        def op() -> tuple[list[TxnRecord], TxnMetadata | None]:
            m = self.transactions.get(transactional_id)
            self._drive_in_doubt(transactional_id)
            new = prepare_end(m, transactional_id, producer_id, producer_epoch, commit, now)
            return ([] if new is None else [new]), new

        prepared = await self.runtime.run(transactional_id, op)
        if prepared is None:
            return
        log.info(
            "transaction_ending",
            transactional_id=transactional_id,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            commit=commit,
            partitions=len(prepared.partitions),
        )
        await asyncio.shield(self.complete_in_background(transactional_id))

    def _drive_in_doubt(self, transactional_id: str) -> None:
        """A request found the transaction in Prepare* (its markers failed, or the
        broker restarted): complete it again, while the request gets
        CONCURRENT_TRANSACTIONS."""
        m = self.transactions.get(transactional_id)
        if m is not None and m.state in PREPARE_STATES:
            self.complete_in_background(transactional_id)

    def complete_in_background(self, transactional_id: str) -> asyncio.Task[None]:
        """Write the markers of a Prepare* transaction and then its Complete* record,
        once (a second caller gets the running task)."""
        task = self._completing.get(transactional_id)
        if task is None:
            task = asyncio.ensure_future(self._complete(transactional_id))
            self._completing[transactional_id] = task

            def done(finished: asyncio.Task[None], tid: str = transactional_id) -> None:
                if self._completing.get(tid) is finished:
                    del self._completing[tid]
                if not finished.cancelled() and finished.exception() is not None:
                    log.warning(
                        "transaction_completion_failed",
                        transactional_id=tid,
                        error=repr(finished.exception()),
                    )

            task.add_done_callback(done)
        return task

    async def _complete(self, transactional_id: str) -> None:
        m = self.transactions.get(transactional_id)
        if m is None or m.state not in PREPARE_STATES:
            return
        commit = m.state == S.PREPARE_COMMIT
        await self.markers(m.producer_id, m.producer_epoch, commit, m.partitions)
        # Allocated outside the key's lock, as for InitProducerId; a restart before the
        # Complete record is durable allocates another (an unused id is harmless).
        new_pid = await self._allocate() if needs_rotation(m) else None

        def op() -> tuple[list[TxnRecord], None]:
            current = self.transactions.get(transactional_id)
            if current != m:
                return [], None  # completed meanwhile
            return [prepare_complete(m, self.clock.now_ms(), new_pid)], None

        await self.runtime.run(transactional_id, op)
        log.info(
            "transaction_completed",
            transactional_id=transactional_id,
            producer_id=m.producer_id,
            producer_epoch=m.producer_epoch,
            result="commit" if commit else "abort",
            partitions=len(m.partitions),
        )

    # -- timeouts and expiry ------------------------------------------------------

    async def _write_if_unchanged(self, seen: TxnMetadata, record: TxnRecord, failed: str) -> bool:
        """Write `record` for a sweep if the transaction is still as the sweep `seen` it
        (a request may have moved it on meanwhile); a failed write is logged as `failed`
        and left for the next sweep. Returns whether it was written."""
        tid = seen.transactional_id

        def op() -> tuple[list[TxnRecord], bool]:
            if self.transactions.get(tid) != seen:
                return [], False
            return [record], True

        try:
            return await self.runtime.run(tid, op)
        except KafkaError as exc:
            log.warning(failed, transactional_id=tid, error=exc.message)
            return False

    async def abort_timed_out(self) -> list[str]:
        """Fence and abort every Ongoing transaction older than its timeout (Kafka's
        abortTimedOutTransactions); drive stuck Prepare* ones again. Returns the ids
        whose transaction was aborted."""
        now = self.clock.now_ms()
        aborted = []
        for transactional_id, m in list(self.transactions.items()):
            if m.state in PREPARE_STATES:
                self.complete_in_background(transactional_id)
                continue
            if m.state != S.ONGOING or m.txn_start_ms + m.txn_timeout_ms >= now:
                continue
            try:
                abort = fence(m, now)
                fenced = await self._write_if_unchanged(
                    m, abort, "transaction_timeout_abort_failed"
                )
            except Exception:
                # One transaction the sweep cannot abort must not keep it from the rest.
                log.exception("transaction_timeout_abort_failed", transactional_id=transactional_id)
                continue
            if fenced:
                log.info(
                    "transaction_timed_out",
                    transactional_id=transactional_id,
                    producer_id=m.producer_id,
                    producer_epoch=abort.producer_epoch,
                    timeout_ms=m.txn_timeout_ms,
                )
                aborted.append(transactional_id)
                self.complete_in_background(transactional_id)
        return aborted

    async def expire_transactional_ids(self) -> list[str]:
        """Delete ids idle for transactional.id.expiration.ms with no transaction open."""
        now = self.clock.now_ms()
        limit = now - self.config.id_expiration_ms
        expired = []
        for transactional_id, m in list(self.transactions.items()):
            if m.state not in EXPIRATION_ALLOWED or m.txn_last_update_ms > limit:
                continue

            m.transit(S.DEAD)  # checks the transition
            if await self._write_if_unchanged(
                m, TxnTombstone(transactional_id), "transactional_id_expiry_failed"
            ):
                expired.append(transactional_id)
        if expired:
            log.info("transactional_ids_expired", count=len(expired), ids=expired[:10])
        return expired

    def describe(self) -> Mapping[str, TxnMetadata]:
        return dict(self.transactions)

    # -- DescribeTransactions / ListTransactions ----------------------------------

    def describe_transaction(self, transactional_id: str) -> TxnMetadata:
        """One transactional id's state, as Kafka's handleDescribeTransactions answers
        it: NOT_COORDINATOR on a broker that does not lead the transactions log (the
        admin client asks its coordinator), COORDINATOR_LOAD_IN_PROGRESS while this one
        loads it, TRANSACTIONAL_ID_NOT_FOUND for an id it does not know (or expiring)."""
        if not transactional_id:
            raise KafkaError(ErrorCode.invalid_request, "The transactional id must not be empty")
        self.runtime.check_led()
        m = self.transactions.get(transactional_id)
        if m is None or m.state == S.DEAD:
            raise KafkaError(
                ErrorCode.transactional_id_not_found,
                f"The transaction coordinator knows no transactional id {transactional_id!r}",
            )
        return m

    def list_transactions(
        self,
        *,
        states: Collection[str] = (),
        producer_ids: Collection[int] = (),
        min_duration_ms: int = -1,
        pattern: str | None = None,
    ) -> ListedTransactions:
        """The transactional ids this broker coordinates that pass every filter, as
        Kafka's TransactionStateManager.listTransactionStates lists those of the
        coordinator partitions the broker leads: none on a broker that does not lead
        the transactions log (the admin client asks every broker and merges),
        COORDINATOR_LOAD_IN_PROGRESS while this one loads it. A state name Kafka does
        not know is returned in `unknown_state_filters`; `min_duration_ms` >= 0 keeps
        transactions running longer than it; `pattern` (a regular expression, matched
        against the whole id) INVALID_REGULAR_EXPRESSION when it does not compile."""
        if self.runtime.loading:
            self.runtime.check_led()
        by_name = {state.state_name: state for state in TxnState}
        wanted = {by_name[name] for name in states if name in by_name}
        unknown = [name for name in states if name not in by_name]
        matcher = None
        if pattern:
            try:
                matcher = re.compile(pattern)
            except re.error as exc:
                raise KafkaError(
                    ErrorCode.invalid_regular_expression,
                    f"Transaction ID pattern `{pattern}` is not a valid regular expression: {exc}.",
                ) from None
        now = self.clock.now_ms()
        found = []
        if self.runtime.fenced is None:
            for m in self.transactions.values():
                if (
                    m.state == S.DEAD
                    or (producer_ids and m.producer_id not in producer_ids)
                    or (states and m.state not in wanted)
                    or (min_duration_ms >= 0 and now - m.txn_start_ms <= min_duration_ms)
                    or (matcher is not None and matcher.fullmatch(m.transactional_id) is None)
                ):
                    continue
                found.append(m)
        return ListedTransactions(sorted(found, key=lambda m: m.transactional_id), tuple(unknown))


@dataclass(frozen=True, slots=True)
class ListedTransactions:
    """What `TransactionCoordinator.list_transactions` found."""

    transactions: list[TxnMetadata]
    unknown_state_filters: tuple[str, ...]
