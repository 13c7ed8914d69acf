"""The share-partition leader's delivery state machine (KIP-932), sans-IO.

Every rule about what happens to the records of one (share group, topic-partition) lives in
this file, and nothing else does: which records a fetch acquires, who may acknowledge them,
what a lock timeout or a departing member does, when the share-partition start offset (SPSO)
moves, and which state has to be persisted. Nothing here awaits, does I/O, logs or reads a
clock: the current time comes in as ``now_ms`` and every method returns what happened, plus
a `PendingChange` carrying the ``StateUpdate`` the caller must write through the share
coordinator (WriteShareGroupState) BEFORE it answers the client.

Changes are two-phase, as Kafka's SharePartition does with startStateTransition /
completeStateTransition: a call applies its change in memory and journals what it replaced;
the caller `commit()`s once the write succeeded, or `rollback()`s when it failed, which puts
every range, SPSO, SPEO and lock deadline back exactly as before the call. Until then the
partition refuses any other change (`ChangePending`), so nothing is built on state that may
yet be undone.

The in-flight window [spso, speo) is held as a sorted map of offset ranges, each with one
state, so memory and work follow the number of distinct ranges, not the number of records
(Kafka's ``InFlightBatch``). A range is split only where its records' states come to differ
and adjacent ranges in identical state are merged again. The map is packed (`_RangeTable`:
parallel arrays, ~40 bytes a range): acknowledgements of one type per offset leave one range
per in-flight record (up to share.partition.max.record.locks of them, in every share
partition), where Kafka too keeps per-offset state inside a fragmented batch.

Durable view, as KIP-932 defines it: the ACQUIRED state is transient and never written.
An ACQUIRED record is persisted as the AVAILABLE record it was before the acquisition, with
the delivery count it had then (an acquired record with delivery count 1 is AVAILABLE with
count 0), so an acquisition alone changes nothing durable and a fetch writes nothing; the
new count is written when the record is released (lock timeout, RELEASE, a departing
member) or reaches a final state. A crash redelivers what was in flight, never loses it,
and forgets only the in-flight delivery itself, as Kafka 4.2's SharePartition does. An
offset of the window with no state batch means "AVAILABLE, never delivered" (delivery
count 0), as Kafka reads gaps in persisted state.

Dead letters (KIP-1191), with `SharePartitionConfig.dead_letter` on (the group names a
dead-letter topic): a record given up on (rejected, or at share.delivery.count.limit) goes
to ARCHIVING, persisted as delivery state 3, instead of ARCHIVED. ARCHIVING is not final:
SPSO stops before it, it is never acquired, and it is not in delivery_complete_count. The
dead-letter writer takes the runs (`take_dead_letters`), has their copies written, then
archives them (`archive_dead_letters`, a change like any other). A partition loaded with
ARCHIVING runs hands them out again, so a crash between the copy and the archive copies
again rather than loses the record. GAP acknowledgements, aborted and control records go
straight to ARCHIVED: there is nothing to dead-letter.
"""

from __future__ import annotations

import enum
import functools
import uuid
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal, NamedTuple, ParamSpec, TypeVar

from broker.share.dead_letters import DeadLetter, DeadLetterReason
from coordinator.share_state import PersistedBatch
from persister.share_records import UNINITIALIZED_START_OFFSET
from protocol.errors import ErrorCode

__all__ = [
    "NO_CHANGE",
    "TRANSITIONS",
    "UNINITIALIZED_START_OFFSET",
    "AckResult",
    "AcknowledgeType",
    "AcquireResult",
    "AcquiredRange",
    "ChangePending",
    "Event",
    "IllegalStateTransition",
    "InFlightRange",
    "OffsetRange",
    "PendingChange",
    "RecordState",
    "ReleaseResult",
    "ShareAcquireMode",
    "SharePartition",
    "SharePartitionConfig",
    "StateUpdate",
]

# A share partition's leader epoch before it is loaded with one: spool's broker alone
# leads every partition at epoch 0 (broker.cluster.SingleNode).
LEADER_EPOCH_UNSET = 0


class RecordState(enum.IntEnum):
    """A record's delivery state; the values are Kafka's ids (the persisted DeliveryState)."""

    AVAILABLE = 0
    ACQUIRED = 1
    ACKNOWLEDGED = 2
    # KIP-1191: given up on (rejected, or at share.delivery.count.limit) in a group with a
    # dead-letter topic; ARCHIVED once its dead-letter copy is durable. Persisted, not final.
    ARCHIVING = 3
    ARCHIVED = 4


class Event(enum.Enum):
    """What can happen to an in-flight record."""

    ACQUIRE = "acquire"  # a share fetch hands it to a member (delivery count +1)
    ACCEPT = "accept"  # acknowledge type 1
    RELEASE = "release"  # acknowledge type 2
    REJECT = "reject"  # acknowledge type 3
    GAP = "gap"  # acknowledge type 0: the offset holds no record to process
    RENEW = "renew"  # acknowledge type 4 (ShareAcknowledge v2): restart the lock
    LOCK_TIMEOUT = "lock_timeout"  # share.record.lock.duration.ms elapsed
    MEMBER_RELEASE = "member_release"  # member left, timed out or closed its share session
    SKIP = "skip"  # a fetch passes over it: delivery limit reached, aborted or control record
    ARCHIVE = "archive"  # its dead-letter copy is durable (or refused for good): KIP-1191


class ShareAcquireMode(enum.IntEnum):
    """ShareFetch v2's ShareAcquireMode (KIP-1206); the values are Kafka's wire ids, the
    names those of the share consumer's share.acquire.mode config."""

    # MaxRecords is a soft limit: the last range is finished at its log batch boundary.
    BATCH_OPTIMIZED = 0
    # MaxRecords is a hard limit: a log batch may be cut at any offset; the response still
    # carries whole batches and the client skips the offsets it did not acquire.
    RECORD_LIMIT = 1


_AVAILABLE: Final = RecordState.AVAILABLE
_ACQUIRED: Final = RecordState.ACQUIRED
_ACKNOWLEDGED: Final = RecordState.ACKNOWLEDGED
_ARCHIVING: Final = RecordState.ARCHIVING
_ARCHIVED: Final = RecordState.ARCHIVED

# The whole machine. A pair missing from the table is an illegal move. Two rules are applied on
# top (see `_transition`): a record that would become AVAILABLE although its delivery count has
# reached share.delivery.count.limit becomes ARCHIVED instead (Kafka's InFlightState); and in a
# group with a dead-letter topic (`SharePartitionConfig.dead_letter`, KIP-1191) a record given
# up on (REJECT, the delivery-limit rule, a fetch skipping it at the limit) becomes ARCHIVING
# instead of ARCHIVED, until the dead-letter writer has its copy durable (ARCHIVE). A GAP, an
# aborted or control record still goes straight to ARCHIVED: there is nothing to dead-letter.
# ACKNOWLEDGED and ARCHIVED are terminal: SPSO moves over them and their state is forgotten.
# ARCHIVING is not: SPSO stops before it, and it is never acquired again.
TRANSITIONS: Final[Mapping[tuple[RecordState, Event], RecordState]] = {
    (_AVAILABLE, Event.ACQUIRE): _ACQUIRED,
    (_AVAILABLE, Event.SKIP): _ARCHIVED,
    (_ACQUIRED, Event.ACCEPT): _ACKNOWLEDGED,
    (_ACQUIRED, Event.RELEASE): _AVAILABLE,
    (_ACQUIRED, Event.REJECT): _ARCHIVED,
    (_ACQUIRED, Event.GAP): _ARCHIVED,
    (_ACQUIRED, Event.RENEW): _ACQUIRED,
    (_ACQUIRED, Event.LOCK_TIMEOUT): _AVAILABLE,
    (_ACQUIRED, Event.MEMBER_RELEASE): _AVAILABLE,
    (_ARCHIVING, Event.ARCHIVE): _ARCHIVED,
}


class AcknowledgeType(enum.IntEnum):
    """AcknowledgeTypes values of ShareFetch / ShareAcknowledge."""

    GAP = 0
    ACCEPT = 1
    RELEASE = 2
    REJECT = 3
    RENEW = 4


_ACKNOWLEDGE_EVENTS: Final[Mapping[int, Event]] = {
    AcknowledgeType.GAP: Event.GAP,
    AcknowledgeType.ACCEPT: Event.ACCEPT,
    AcknowledgeType.RELEASE: Event.RELEASE,
    AcknowledgeType.REJECT: Event.REJECT,
    AcknowledgeType.RENEW: Event.RENEW,
}

_DONE: Final = frozenset({_ACKNOWLEDGED, _ARCHIVED})
# How an offset past SPEO (no state batch) reads: AVAILABLE, delivery count 0.
_NEVER_DELIVERED: Final = (_AVAILABLE, 0)
_PERSISTED_STATES: Final = frozenset({_AVAILABLE, _ACKNOWLEDGED, _ARCHIVING, _ARCHIVED})


class IllegalStateTransition(RuntimeError):
    """A move that TRANSITIONS does not allow; always a bug in this module, never bad input."""


@dataclass(frozen=True, slots=True)
class SharePartitionConfig:
    """The group configs that drive delivery (Kafka's share.* group config names)."""

    record_lock_duration_ms: int = 30_000  # share.record.lock.duration.ms
    delivery_count_limit: int = 5  # share.delivery.count.limit
    max_in_flight_records: int = 2_000  # share.partition.max.record.locks
    # share.isolation.level: the caller acts on it (reads up to the LSO, passes aborted and
    # control batches as `gaps` to `acquire`); carried here so one object holds the config.
    isolation_level: Literal["read_uncommitted", "read_committed"] = "read_uncommitted"
    # KIP-1191: the group has a dead-letter topic (errors.deadletterqueue.topic.name), so a
    # record given up on goes through ARCHIVING. False is the plain KIP-932 machine.
    dead_letter: bool = False


@dataclass(frozen=True, slots=True)
class StateUpdate:
    """What to write through WriteShareGroupState before answering.

    ``state_batches`` are the changed ranges, newer-wins over what is stored; ``start_offset``
    is the current SPSO, and stored batches below it are dropped. ``delivery_complete_count``
    is the number of in-flight records (at or above SPSO) that are ACKNOWLEDGED or ARCHIVED,
    as Kafka 4.2's leader sends in WriteShareGroupState v1 (KIP-1226, for lag); ARCHIVING
    records count once ARCHIVED.
    """

    start_offset: int
    state_batches: tuple[PersistedBatch, ...]
    delivery_complete_count: int = 0


class AcquiredRange(NamedTuple):
    """One AcquiredRecords entry of a ShareFetch response."""

    first_offset: int
    last_offset: int
    delivery_count: int


class OffsetRange(NamedTuple):
    first_offset: int
    last_offset: int


@dataclass(frozen=True, slots=True)
class InFlightRange:
    """Records [first_offset, last_offset] in one state; member and deadline only when
    ACQUIRED, the dead-letter reason only when ARCHIVING."""

    first_offset: int
    last_offset: int
    state: RecordState
    delivery_count: int
    member_id: str | None = None
    lock_deadline_ms: int | None = None
    reason: DeadLetterReason | None = None

    @property
    def record_count(self) -> int:
        return self.last_offset - self.first_offset + 1

    def same_state_as(self, other: InFlightRange) -> bool:
        """Whether the two ranges could be one (adjacent ranges in the same state merge)."""
        return (
            self.state is other.state
            and self.delivery_count == other.delivery_count
            and self.member_id == other.member_id
            and self.lock_deadline_ms == other.lock_deadline_ms
            and self.reason is other.reason
        )


# RecordState by id, for the packed table (cheaper than calling the enum).
_STATE_OF_ID: Final[Mapping[int, RecordState]] = {int(state): state for state in RecordState}
_NO_DEADLINE: Final = -(2**63)  # packed lock deadline of a range that holds no lock


class _RangeTable:
    """first_offset -> InFlightRange, sorted, as parallel packed arrays.

    About 37 bytes a range (first and last offsets, state, delivery count, lock deadline,
    and a reference to the member id, which all the ranges of one member share; an
    ARCHIVING range, which has no member, holds its DeadLetterReason there), where a
    sorted map of range objects with its lock and availability indexes costs ~240. A range
    is built as an `InFlightRange` when it is read. Inserting or deleting moves the tail of
    each array, a memmove over at most share.partition.max.record.locks entries.
    """

    __slots__ = ("counts", "deadlines", "firsts", "lasts", "members", "states")

    def __init__(self) -> None:
        self.firsts = array("q")
        self.lasts = array("q")
        self.states = bytearray()  # RecordState ids: bytearray.find finds AVAILABLE ranges
        self.counts = array("i")
        self.deadlines = array("q")
        self.members: list[str | DeadLetterReason | None] = []

    def __len__(self) -> int:
        return len(self.firsts)

    def record(self, index: int) -> InFlightRange:
        deadline = self.deadlines[index]
        member = self.members[index]
        if isinstance(member, DeadLetterReason):
            return InFlightRange(
                self.firsts[index],
                self.lasts[index],
                _ARCHIVING,
                self.counts[index],
                None,
                None,
                member,
            )
        return InFlightRange(
            self.firsts[index],
            self.lasts[index],
            _STATE_OF_ID[self.states[index]],
            self.counts[index],
            member,
            None if deadline == _NO_DEADLINE else deadline,
        )

    def records(self, lo: int, hi: int) -> list[InFlightRange]:
        return [self.record(index) for index in range(lo, hi)]

    def index_of(self, first_offset: int) -> int:
        index = bisect_left(self.firsts, first_offset)
        if index == len(self.firsts) or self.firsts[index] != first_offset:
            raise KeyError(first_offset)
        return index

    def index_at(self, offset: int) -> int:
        """The index of the range holding `offset` (of the last one starting at or before)."""
        return bisect_right(self.firsts, offset) - 1

    def index_after(self, offset: int) -> int:
        """The index of the first range starting after `offset`."""
        return bisect_right(self.firsts, offset)

    def __getitem__(self, first_offset: int) -> InFlightRange:
        return self.record(self.index_of(first_offset))

    def keys(self, minimum: int, maximum: int) -> list[int]:
        """First offsets of the ranges starting within [minimum, maximum]."""
        return self.firsts[bisect_left(self.firsts, minimum) : self.index_after(maximum)].tolist()

    def put(self, record: InFlightRange) -> None:
        """Insert `record`, or replace the range starting at its first offset."""
        first = record.first_offset
        deadline = _NO_DEADLINE if record.lock_deadline_ms is None else record.lock_deadline_ms
        member = record.member_id if record.reason is None else record.reason
        index = bisect_left(self.firsts, first)
        if index < len(self.firsts) and self.firsts[index] == first:
            self.lasts[index] = record.last_offset
            self.states[index] = record.state
            self.counts[index] = record.delivery_count
            self.deadlines[index] = deadline
            self.members[index] = member
            return
        self.firsts.insert(index, first)
        self.lasts.insert(index, record.last_offset)
        self.states.insert(index, record.state)
        self.counts.insert(index, record.delivery_count)
        self.deadlines.insert(index, deadline)
        self.members.insert(index, member)

    def delete(self, lo: int, hi: int) -> None:
        """Remove the ranges at indexes [lo, hi)."""
        del self.firsts[lo:hi]
        del self.lasts[lo:hi]
        del self.states[lo:hi]
        del self.counts[lo:hi]
        del self.deadlines[lo:hi]
        del self.members[lo:hi]

    def find_state(self, state: RecordState, lo: int = 0, hi: int | None = None) -> int:
        """The index of the first range in `state` within indexes [lo, hi), or -1."""
        return self.states.find(state, lo, len(self.states) if hi is None else hi)

    def cut(self, lo: int, hi: int) -> _RangeTable:
        """Remove the ranges at indexes [lo, hi) and return them, as a table."""
        out = _RangeTable()
        out.firsts = self.firsts[lo:hi]
        out.lasts = self.lasts[lo:hi]
        out.states = self.states[lo:hi]
        out.counts = self.counts[lo:hi]
        out.deadlines = self.deadlines[lo:hi]
        out.members = self.members[lo:hi]
        self.delete(lo, hi)
        return out

    @property
    def record_count(self) -> int:
        """Records in all the ranges."""
        return sum(self.lasts) - sum(self.firsts) + len(self.firsts)


class _ArchivedInPlace(NamedTuple):
    """A journal entry: the ARCHIVING range [first, last] became ARCHIVED in place
    (`_archive_in_place`); undone by putting the ARCHIVING range back."""

    first_offset: int
    last_offset: int
    delivery_count: int
    reason: DeadLetterReason


# What a change did, to undo it in a rollback: (True, a range put in), (False, a range
# taken out), (False, a table of ranges taken out at once: SPSO moving over them), or
# (False, an ARCHIVING range archived in place).
JournalEntry = tuple[bool, "InFlightRange | _RangeTable | _ArchivedInPlace"]


class ChangePending(RuntimeError):
    """A change was started while the previous one is neither committed nor rolled back.

    Always a bug in the caller: it must serialize the changes of a share partition and finish
    each (commit or rollback) before the next, or a rollback would undo later work too.
    """


class PendingChange:
    """A change applied in memory that is not durable yet.

    Write `state_update` (when not None) through the share coordinator, then `commit()`; if the
    write fails, `rollback()` restores the partition exactly as it was before the call. One of
    the two, once. A call that changed nothing returns `NO_CHANGE`, for which both do nothing.
    """

    __slots__ = (
        "_changed",
        "_journal",
        "_moved_speo",
        "_partition",
        "_speo",
        "_spso",
        "state_update",
    )

    def __init__(
        self,
        partition: SharePartition | None,
        state_update: StateUpdate | None,
        journal: list[JournalEntry],
        spso: int,
        speo: int,
        changed: list[tuple[int, int]] | None = None,
    ) -> None:
        self._partition = partition
        self.state_update = state_update
        # (True, range) for a range put in, (False, range) for one taken out, in order.
        self._journal = journal
        self._spso = spso
        self._speo = speo
        # The offset spans whose durable state it changed: a change stacked on this one
        # (`SharePartition.stack_on`) rewrites them with its own in one state update.
        self._changed = changed or []
        # Whether it moved SPEO (it acquired new records): while it is pending, no fetch
        # acquires beside it (`SharePartition.acquire_beside`).
        self._moved_speo = partition is not None and partition._speo != speo

    @property
    def pending(self) -> bool:
        """Whether the change still waits for commit or rollback."""
        return self._partition is not None and self._partition._pending is self

    def commit(self) -> None:
        """The update is durable: keep the change."""
        if self._partition is not None:
            self._partition._complete(self, commit=True)

    def rollback(self) -> None:
        """The update could not be written: undo the change."""
        if self._partition is not None:
            self._partition._complete(self, commit=False)

    def __repr__(self) -> str:
        state = "pending" if self.pending else "done"
        return f"PendingChange({state}, {self.state_update!r})"


NO_CHANGE: Final = PendingChange(None, None, [], UNINITIALIZED_START_OFFSET, -1)
"""What a call that changed nothing returns: nothing to write, commit and rollback are no-ops."""


@dataclass(frozen=True, slots=True)
class AcquireResult:
    """Records acquired by a fetch, ascending, and the change to persist first.

    The acquisitions hold only once `change` is committed; report them to the client after.
    """

    acquired: tuple[AcquiredRange, ...]
    change: PendingChange

    @property
    def state_update(self) -> StateUpdate | None:
        return self.change.state_update

    @property
    def record_count(self) -> int:
        return sum(r.last_offset - r.first_offset + 1 for r in self.acquired)


@dataclass(frozen=True, slots=True)
class AckResult:
    """Outcome of acknowledging one partition: all batches applied, or none of them."""

    error_code: ErrorCode
    error_message: str | None
    change: PendingChange
    released: int  # records made AVAILABLE again (a waiting fetch may be woken)

    @property
    def state_update(self) -> StateUpdate | None:
        return self.change.state_update


@dataclass(frozen=True, slots=True)
class ReleaseResult:
    """Acquired records given back by a lock timeout or a departing member."""

    available: tuple[OffsetRange, ...]
    # Delivery count had reached the limit: ARCHIVED, or ARCHIVING with a dead-letter topic.
    archived: tuple[OffsetRange, ...]
    change: PendingChange

    @property
    def state_update(self) -> StateUpdate | None:
        return self.change.state_update

    @property
    def released(self) -> int:
        return sum(r.last_offset - r.first_offset + 1 for r in self.available)


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _atomic(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """A change method that raises half way (a bug) leaves the partition as it found it."""

    @functools.wraps(method)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(*args, **kwargs)
        except BaseException:
            partition = args[0]
            assert isinstance(partition, SharePartition)
            partition._abort()
            raise

    return wrapper


def _transition(
    record: InFlightRange,
    event: Event,
    *,
    delivery_count_limit: int,
    dead_letter: bool = False,
    member_id: str | None = None,
    lock_deadline_ms: int | None = None,
) -> InFlightRange:
    """The one place a range changes state: the table, plus the delivery-limit rule and,
    with a dead-letter topic, the ARCHIVING rule (KIP-1191)."""
    state = TRANSITIONS.get((record.state, event))
    if state is None:
        raise IllegalStateTransition(
            f"{record.state.name} records {record.first_offset}-{record.last_offset} "
            f"cannot take {event.value}"
        )
    delivery_count = record.delivery_count + (1 if event is Event.ACQUIRE else 0)
    if state is _AVAILABLE and delivery_count >= delivery_count_limit:
        if dead_letter:
            return InFlightRange(
                record.first_offset,
                record.last_offset,
                _ARCHIVING,
                delivery_count,
                None,
                None,
                DeadLetterReason.DELIVERY_LIMIT,
            )
        state = _ARCHIVED
    elif dead_letter and state is _ARCHIVED:
        reason = None
        if event is Event.REJECT:
            reason = DeadLetterReason.REJECTED
        elif event is Event.SKIP and delivery_count >= delivery_count_limit:
            # A fetch passing over a record at the limit; not a gap (aborted, control).
            reason = DeadLetterReason.DELIVERY_LIMIT
        if reason is not None:
            return InFlightRange(
                record.first_offset,
                record.last_offset,
                _ARCHIVING,
                delivery_count,
                None,
                None,
                reason,
            )
    # Built directly: dataclasses.replace costs several times more, once per range changed.
    if state is _ACQUIRED:
        return InFlightRange(
            record.first_offset,
            record.last_offset,
            state,
            delivery_count,
            member_id if event is Event.ACQUIRE else record.member_id,
            lock_deadline_ms,
        )
    return InFlightRange(record.first_offset, record.last_offset, state, delivery_count)


def _durable(record: InFlightRange) -> tuple[RecordState, int]:
    """How a range is persisted: ACQUIRED as the AVAILABLE range it was before it was
    acquired (KIP-932: the acquisition is transient; its delivery is forgotten in a crash)."""
    if record.state is _ACQUIRED:
        return _AVAILABLE, record.delivery_count - 1
    return record.state, record.delivery_count


def _merge_spans(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for first, last in sorted(spans):
        if merged and first <= merged[-1][1] + 1:
            if last > merged[-1][1]:
                merged[-1] = (merged[-1][0], last)
        else:
            merged.append((first, last))
    return merged


def _first_offset(offset_range: tuple[int, int]) -> int:
    return offset_range[0]


def _check_offset_ranges(what: str, ranges: Sequence[tuple[int, int]]) -> None:
    """Log batches and gaps handed to `acquire` must be ascending and disjoint."""
    previous_last = -1
    for first, last in ranges:
        if first > last or first <= previous_last:
            raise ValueError(f"{what} must be ascending, disjoint and first <= last: {ranges!r}")
        previous_last = last


def _split_by_gaps(
    first: int, last: int, gaps: Sequence[tuple[int, int]]
) -> Iterator[tuple[int, int, bool]]:
    """Cover [first, last] with pieces, each flagged whether it lies inside a gap."""
    index = max(bisect_right(gaps, first, key=_first_offset) - 1, 0)
    cursor = first
    while cursor <= last:
        while index < len(gaps) and gaps[index][1] < cursor:
            index += 1
        if index == len(gaps) or gaps[index][0] > last:
            yield cursor, last, False
            return
        gap_first, gap_last = gaps[index]
        if gap_first > cursor:
            yield cursor, gap_first - 1, False
            cursor = gap_first
        end = min(gap_last, last)
        yield cursor, end, True
        cursor = end + 1


def _acknowledge_runs(
    first: int, last: int, acknowledge_types: Sequence[int]
) -> Iterator[tuple[int, int, int]]:
    """(first, last, type) runs: one type for the whole batch, or one type per offset."""
    if len(acknowledge_types) == 1:
        yield first, last, acknowledge_types[0]
        return
    run_first = first
    for index in range(1, len(acknowledge_types) + 1):
        if (
            index == len(acknowledge_types)
            or acknowledge_types[index] != acknowledge_types[index - 1]
        ):
            yield run_first, first + index - 1, acknowledge_types[index - 1]
            run_first = first + index


def _validate_acknowledgement_batches(
    batches: Sequence[tuple[int, int, Sequence[int]]],
) -> str | None:
    """Kafka's request-level checks (INVALID_REQUEST): the message, or None when well formed."""
    previous_last: int | None = None
    for first, last, acknowledge_types in batches:
        if first > last:
            return f"acknowledgement batch {first}-{last}: first offset is after last offset"
        if previous_last is not None and first <= previous_last:
            return (
                f"acknowledgement batch {first}-{last} is out of order or overlaps the batch "
                f"ending at {previous_last}"
            )
        count = last - first + 1
        if len(acknowledge_types) not in (1, count):
            return (
                f"acknowledgement batch {first}-{last} has {len(acknowledge_types)} acknowledge "
                f"types; expected 1 or {count}"
            )
        for acknowledge_type in acknowledge_types:
            if acknowledge_type not in _ACKNOWLEDGE_EVENTS:
                return f"acknowledgement batch {first}-{last}: unknown type {acknowledge_type}"
        previous_last = last
    return None


class SharePartition:
    """The in-flight window of one (share group, topic-partition): spso, speo and ranges.

    Build it from the share coordinator's ReadShareGroupState answer. A start offset of -1
    (UNINITIALIZED_START_OFFSET) means no SPSO yet: resolve share.auto.offset.reset against the
    log and call `initialize`. A fetch goes: `next_fetch_offset()` -> read the log from there ->
    `acquire(...)` with the batch boundaries read -> persist the change's StateUpdate ->
    `change.commit()` (or `change.rollback()` if the write failed) -> respond.
    """

    def __init__(
        self,
        group_id: str,
        topic_id: uuid.UUID,
        partition: int,
        *,
        config: SharePartitionConfig,
        state_epoch: int,
        start_offset: int,
        state_batches: Iterable[tuple[int, int, int, int]] = (),
    ) -> None:
        self.group_id = group_id
        self.topic_id = topic_id
        self.partition = partition
        # Replaceable at any time (group configs are dynamic); takes effect from the next call.
        self.config = config
        self.state_epoch = state_epoch
        # The topic partition's leader epoch this broker read the state with (Kafka's
        # share-partition leader sends it in every write; the share coordinator fences an
        # older one: a former leader's writes once the new one has read the state).
        self.leader_epoch = LEADER_EPOCH_UNSET
        self._ranges = _RangeTable()  # exactly covers [spso, speo)
        # lock deadline -> ACQUIRED ranges holding it (one acquisition's ranges share one),
        # and the earliest of them, worked out again when it is asked for after a removal.
        self._deadlines: dict[int, int] = {}
        self._earliest_deadline: int | None = None
        self._acquired_count = 0
        self._done_count = 0  # records of [spso, speo) that are ACKNOWLEDGED or ARCHIVED
        self._spso = UNINITIALIZED_START_OFFSET
        self._speo = UNINITIALIZED_START_OFFSET
        # The change being built: ranges put in / taken out, and SPSO/SPEO before it.
        self._journal: list[JournalEntry] = []
        self._spso_before = UNINITIALIZED_START_OFFSET
        self._speo_before = UNINITIALIZED_START_OFFSET
        self._in_change = False
        self._pending: PendingChange | None = None
        # The end (exclusive) of what fetches acquired beside the pending change
        # (`acquire_beside`): its rollback leaves SPEO there.
        self._beside_end: int | None = None
        # `stack_on`: the pending change the next change builds on (then: being built on).
        self._stack_base: PendingChange | None = None
        self._stacked: PendingChange | None = None
        self._changed: list[tuple[int, int]] = []
        self._touched: list[tuple[int, int]] = []
        # ARCHIVING ranges `take_dead_letters` handed out, first offset -> last (ascending,
        # disjoint): on a rescan most ranges are one of these exactly, found by one look-up.
        self._handed: dict[int, int] = {}
        # ARCHIVING ranges put in the table so far, and that count at the last take (None:
        # the next take looks at every range): a take with none put since has nothing new.
        self._archiving_puts = 0
        self._taken_at: int | None = None
        batches = sorted(PersistedBatch(*batch) for batch in state_batches)
        if start_offset == UNINITIALIZED_START_OFFSET:
            if batches:
                raise ValueError("state batches without a start offset")
            return
        if start_offset < 0:
            raise ValueError(f"invalid start offset {start_offset}")
        self._load(start_offset, batches)

    # -- state --------------------------------------------------------------------------

    @property
    def initialized(self) -> bool:
        """False until a start offset is known (see `initialize`)."""
        return self._spso != UNINITIALIZED_START_OFFSET

    @property
    def spso(self) -> int:
        """Share-partition start offset: every record below it is done."""
        return self._spso

    @property
    def speo(self) -> int:
        """Share-partition end offset: the first offset never delivered (exclusive end)."""
        return self._speo

    @property
    def in_flight_count(self) -> int:
        """SPEO - SPSO, the number bounded by share.partition.max.record.locks."""
        return self._speo - self._spso if self.initialized else 0

    @property
    def acquired_count(self) -> int:
        """Records currently ACQUIRED by some member."""
        return self._acquired_count

    @property
    def delivery_complete_count(self) -> int:
        """In-flight records in a terminal state (ACKNOWLEDGED/ARCHIVED) at or above SPSO."""
        return self._done_count

    @property
    def range_count(self) -> int:
        """Distinct in-flight ranges held: the memory cost of this partition."""
        return len(self._ranges)

    def in_flight_ranges(self) -> list[InFlightRange]:
        """All ranges of [spso, speo), ascending."""
        return self._ranges.records(0, len(self._ranges))

    def record_state(self, offset: int) -> InFlightRange | None:
        """The range holding `offset`, or None outside [spso, speo)."""
        if not self._spso <= offset < self._speo:
            return None
        return self._range_at(offset)

    def next_fetch_offset(self) -> int:
        """Where the next log read should start: the first AVAILABLE record, else SPEO."""
        self._require_initialized()
        index = self._ranges.find_state(_AVAILABLE)
        return self._speo if index < 0 else self._ranges.firsts[index]

    def can_acquire(self) -> bool:
        """Whether a fetch could acquire anything (AVAILABLE records, or room for new ones)."""
        if not self.initialized:
            return False
        return (
            self._ranges.find_state(_AVAILABLE) >= 0
            or self.in_flight_count < self.config.max_in_flight_records
        )

    @property
    def change_pending(self) -> bool:
        """Whether a change waits for commit or rollback (no other change may start)."""
        return self._pending is not None

    def stack_on(self, change: PendingChange) -> None:
        """Let the next change start on top of `change`, this partition's pending change,
        instead of refusing it (`ChangePending`).

        That next call returns one PendingChange standing for both: its state update
        carries both changes (one share-state write), its commit keeps both and its
        rollback undoes both. `change` itself must then be left alone. A ShareFetch uses
        this to persist its acknowledgements and its acquisitions with one fsync.
        """
        if change is NO_CHANGE:
            return
        if self._pending is not change:
            raise RuntimeError(f"{change!r} is not this partition's pending change")
        self._stack_base = change

    def next_lock_deadline(self) -> int | None:
        """The earliest acquisition lock deadline (ms), for the caller's timer; None if none."""
        if self._earliest_deadline is None and self._deadlines:
            self._earliest_deadline = min(self._deadlines)
        return self._earliest_deadline

    def snapshot_state(self) -> tuple[int, list[PersistedBatch]]:
        """The full durable state: (SPSO, state batches), as a snapshot would store it."""
        self._require_initialized()
        if self._speo <= self._spso:
            return self._spso, []
        return self._spso, self._durable_batches(self._spso, self._speo - 1)

    # -- transitions --------------------------------------------------------------------

    @_atomic
    def initialize(self, start_offset: int) -> PendingChange:
        """Set the first SPSO, resolved by the caller from share.auto.offset.reset.

        earliest = log start offset, latest = log end offset, by_duration = the first offset
        whose timestamp is at or after now minus the duration. Persist the returned change, so a
        restart does not resolve "latest" again to a later offset and skip records.
        """
        if self.initialized:
            raise RuntimeError(f"share partition already initialized at SPSO {self._spso}")
        if start_offset < 0:
            raise ValueError(f"invalid start offset {start_offset}")
        self._start(stackable=False)
        self._spso = self._speo = start_offset
        return self._pend(StateUpdate(start_offset, ()))

    @_atomic
    def acquire(
        self,
        member_id: str,
        batches: Sequence[tuple[int, int]],
        *,
        max_records: int,
        batch_size: int,
        now_ms: int,
        gaps: Sequence[tuple[int, int]] = (),
        mode: ShareAcquireMode = ShareAcquireMode.BATCH_OPTIMIZED,
    ) -> AcquireResult:
        """Acquire records for `member_id` within the log batches the caller read.

        `batches` are the (base_offset, last_offset) of the record batches read from the log
        starting at `next_fetch_offset()`, ascending. AVAILABLE in-flight records inside them
        are acquired first (delivery count +1; those already at the delivery limit are archived
        instead), then records past SPEO (delivery count 1). SPEO - SPSO never exceeds
        share.partition.max.record.locks, even if that cuts a batch. `gaps` are offset ranges
        never to deliver (aborted transactions, control batches): archived as they are met.
        Each acquisition holds a lock until now_ms + share.record.lock.duration.ms.

        `mode` is ShareFetch v2's ShareAcquireMode (KIP-1206). BATCH_OPTIMIZED: `max_records`
        is a soft limit, the last range is finished at its log batch boundary, as Kafka does,
        so the response carries whole batches, and `batch_size` shapes the returned
        AcquiredRecords (ranges of about that many records, cut at log batch boundaries).
        RECORD_LIMIT: at most `max_records` records are acquired, cutting a log batch
        wherever the limit falls (no decompression: only offsets are involved); the rest of
        the batch stays AVAILABLE (records past SPEO stay past it) for the next fetch, and
        `batch_size` is not applied, as Kafka 4.2's SharePartition splits no batch in that
        mode.
        """
        self._require_initialized()
        self._start()
        _check_offset_ranges("log batches", batches)
        _check_offset_ranges("gaps", gaps)
        if not batches or max_records <= 0:
            return AcquireResult((), self._pend(None))
        limit = self.config.delivery_count_limit
        deadline = now_ms + self.config.record_lock_duration_ms
        span_first = max(batches[0][0], self._spso)
        span_last = batches[-1][1]
        acquired: list[AcquiredRange] = []
        remaining = max_records
        hard_limit = mode is ShareAcquireMode.RECORD_LIMIT

        def cut(first: int, last: int) -> int:
            """Where a range [first, last] ends within the `remaining` records."""
            if last - first + 1 <= remaining:
                return last
            if hard_limit:
                return first + remaining - 1
            return _batch_end(batches, first + remaining - 1, last)

        # 1. In-flight AVAILABLE records the read covers.
        reacquire_last = min(span_last, self._speo - 1)
        for first, last in self._available_spans(span_first, reacquire_last):
            if remaining <= 0:
                break
            current = self._range_at(first)
            if current.delivery_count >= limit:
                # Persisted at (or over a since lowered) limit: never delivered again.
                self._apply(first, last, Event.SKIP)
                continue
            for piece_first, piece_last, in_gap in _split_by_gaps(first, last, gaps):
                if in_gap:
                    self._apply(piece_first, piece_last, Event.SKIP)
                    continue
                if remaining <= 0:
                    break
                piece_last = cut(piece_first, piece_last)
                self._apply(piece_first, piece_last, Event.ACQUIRE, member_id, deadline)
                acquired.append(AcquiredRange(piece_first, piece_last, current.delivery_count + 1))
                remaining -= piece_last - piece_first + 1

        # 2. New records past SPEO.
        if remaining > 0 and span_last >= self._speo:
            if batches[0][0] > self._speo:
                # The log holds nothing between SPEO and its first batch (compacted, deleted).
                self._add_range(InFlightRange(self._speo, batches[0][0] - 1, _ARCHIVED, 0))
                self._speo = batches[0][0]
                self._advance_spso()
            new_first = self._speo
            new_last = cut(new_first, span_last)
            new_last = min(new_last, self._spso + self.config.max_in_flight_records - 1)
            if new_last >= new_first:
                for piece_first, piece_last, in_gap in _split_by_gaps(new_first, new_last, gaps):
                    if in_gap:
                        # Kafka 4.2's SharePartition acquires these first (count 1): aborted
                        # batches are archived at once, control records when the client
                        # acknowledges them as GAP. Archived straight away with count 0 the
                        # client is never handed them and never has to gap-acknowledge; the
                        # count of an ARCHIVED range is never read (the state is final, the
                        # delivery limit applies to AVAILABLE ones), so only that number in
                        # the share-state records differs from Kafka's.
                        self._add_range(InFlightRange(piece_first, piece_last, _ARCHIVED, 0))
                        continue
                    self._add_range(
                        InFlightRange(piece_first, piece_last, _ACQUIRED, 1, member_id, deadline)
                    )
                    acquired.append(AcquiredRange(piece_first, piece_last, 1))
                self._speo = new_last + 1

        change = self._finish()
        shape_size = 0 if hard_limit else batch_size
        return AcquireResult(_shape_acquired(acquired, batches, shape_size), change)

    def can_acquire_beside(self) -> bool:
        """Whether a fetch may acquire new records while another request's change is
        pending (its share-state write in flight), as Kafka's SharePartition lets a fetch
        acquire while an acknowledgement's persister write runs (its fetch lock is not
        held for it). Only records past SPEO, which no pending change can touch: so only
        when the pending change did not move SPEO, and when nothing is AVAILABLE (a
        pending release may yet be undone; AVAILABLE records go first, in order, with
        the partition's lock)."""
        pending = self._pending
        return (
            pending is not None
            and not pending._moved_speo
            and self._stack_base is None
            and not self._in_change
            and self._ranges.find_state(_AVAILABLE) < 0
            and self._speo - min(self._spso, pending._spso) < self.config.max_in_flight_records
        )

    def acquire_beside(
        self,
        member_id: str,
        batches: Sequence[tuple[int, int]],
        *,
        max_records: int,
        batch_size: int,
        now_ms: int,
        mode: ShareAcquireMode = ShareAcquireMode.BATCH_OPTIMIZED,
    ) -> tuple[AcquiredRange, ...]:
        """Acquire records past SPEO (`batches` read from SPEO, with no gap to archive)
        while another request's change is pending (`can_acquire_beside`). Nothing durable
        changes (acquisitions are not written, KIP-932), so this is final at once: no
        PendingChange. The new ranges are put past everything the pending change holds,
        never merged with its ranges, and its rollback leaves them and SPEO past them.
        The record-lock limit counts from the lower of SPSO before and after the pending
        change, so its rollback cannot leave more records locked than the limit."""
        if not self.can_acquire_beside():
            raise ChangePending(
                f"share partition {self.group_id}:{self.topic_id}:{self.partition}: no "
                "acquisition beside the pending change"
            )
        _check_offset_ranges("log batches", batches)
        if not batches or max_records <= 0 or batches[0][0] != self._speo:
            return ()
        assert self._pending is not None
        spso = min(self._spso, self._pending._spso)
        hard_limit = mode is ShareAcquireMode.RECORD_LIMIT
        first = self._speo
        last = batches[-1][1]
        if last - first + 1 > max_records:
            last = (
                first + max_records - 1
                if hard_limit
                else _batch_end(batches, first + max_records - 1, last)
            )
        last = min(last, spso + self.config.max_in_flight_records - 1)
        if last < first:
            return ()
        record = InFlightRange(
            first, last, _ACQUIRED, 1, member_id, now_ms + self.config.record_lock_duration_ms
        )
        self._ranges.put(record)
        self._counted_in(record)
        self._speo = last + 1
        self._beside_end = self._speo
        shape_size = 0 if hard_limit else batch_size
        return _shape_acquired([AcquiredRange(first, last, 1)], batches, shape_size)

    @_atomic
    def acknowledge(
        self,
        member_id: str,
        batches: Sequence[tuple[int, int, Sequence[int]]],
        now_ms: int,
    ) -> AckResult:
        """Apply a partition's AcknowledgementBatches (first, last, acknowledge_types).

        Atomic, as Kafka rolls back a partial acknowledgement: either every batch applies, or
        nothing changes and the error says why. Malformed batches (first > last, out of order,
        overlapping, wrong number of types, unknown type, offsets at or past SPEO) get
        INVALID_REQUEST; records not ACQUIRED by `member_id` get INVALID_RECORD_STATE. Offsets
        below SPSO are already done (log start moved past them) and are skipped.
        """
        self._require_initialized()
        self._start()
        message = _validate_acknowledgement_batches(batches)
        if message is not None:
            return AckResult(ErrorCode.invalid_request, message, self._pend(None), 0)
        for first, last, _ in batches:
            first = max(first, self._spso)
            if first > last:
                continue
            if last >= self._speo:
                return AckResult(
                    ErrorCode.invalid_request,
                    f"offsets {max(first, self._speo)}-{last} were never delivered "
                    f"(share-partition end offset is {self._speo})",
                    self._pend(None),
                    0,
                )
            for record in self._ranges_overlapping(first, last):
                if record.state is not _ACQUIRED:
                    return AckResult(
                        ErrorCode.invalid_record_state,
                        f"offset {max(record.first_offset, first)} is {record.state.name}, "
                        "not acquired",
                        self._pend(None),
                        0,
                    )
                if record.member_id != member_id:
                    return AckResult(
                        ErrorCode.invalid_record_state,
                        f"offset {max(record.first_offset, first)} is acquired by another member",
                        self._pend(None),
                        0,
                    )

        deadline = now_ms + self.config.record_lock_duration_ms
        released = 0
        for first, last, acknowledge_types in batches:
            first = max(first, self._spso)
            if first > last:
                continue
            runs = [
                (run_first, run_last, _ACKNOWLEDGE_EVENTS[acknowledge_type])
                for run_first, run_last, acknowledge_type in _acknowledge_runs(
                    first, last, acknowledge_types[-(last - first + 1) :]
                )
            ]
            for new in self._apply_runs(first, last, runs, member_id, deadline):
                if new.state is _AVAILABLE:
                    released += new.record_count
        return AckResult(ErrorCode.none, None, self._finish(), released)

    @_atomic
    def expire_locks(self, now_ms: int) -> ReleaseResult:
        """Release every acquisition whose lock deadline is at or before `now_ms`.

        The records become AVAILABLE again, or ARCHIVED if their delivery count has reached
        share.delivery.count.limit.
        """
        self._require_initialized()
        self._start()
        firsts: list[int] = []
        earliest = self.next_lock_deadline()
        if earliest is not None and earliest <= now_ms:
            table = self._ranges
            index = table.find_state(_ACQUIRED)
            while index >= 0:
                if table.deadlines[index] <= now_ms:
                    firsts.append(table.firsts[index])
                index = table.find_state(_ACQUIRED, index + 1)
        return self._release(firsts, Event.LOCK_TIMEOUT)

    @_atomic
    def release_member(self, member_id: str, now_ms: int) -> ReleaseResult:
        """A member left, timed out or closed its share session: release what it holds.

        Delivery counts are unchanged; a record at the delivery limit is archived rather than
        made available (Kafka's releaseAcquiredRecords goes through the same rule). `now_ms`
        is accepted for a uniform call shape; the outcome does not depend on it.
        """
        del now_ms
        self._require_initialized()
        self._start()
        table = self._ranges
        held = [table.firsts[i] for i, member in enumerate(table.members) if member == member_id]
        return self._release(held, Event.MEMBER_RELEASE)

    @_atomic
    def update_log_start_offset(self, log_start_offset: int) -> PendingChange:
        """Retention or DeleteRecords moved the log start: SPSO follows, state below is dropped.

        Acquisitions below the new start are dropped with it; their later acknowledgements are
        skipped as already done, as Kafka does.
        """
        self._require_initialized()
        self._start()
        if log_start_offset <= self._spso:
            return self._pend(None)
        self._split_before(log_start_offset)
        self._pop_indexes(0, self._ranges.index_after(log_start_offset - 1))
        self._spso = log_start_offset
        self._speo = max(self._speo, log_start_offset)
        return self._finish()

    # -- dead letters (KIP-1191) ---------------------------------------------------------

    @property
    def has_dead_letters(self) -> bool:
        """Whether any record is ARCHIVING (its dead-letter copy not yet durable)."""
        return self._ranges.find_state(_ARCHIVING) >= 0

    def take_dead_letters(self) -> list[DeadLetter]:
        """The ARCHIVING runs not handed out by an earlier call, ascending, now handed out.

        A run is one range: one delivery count and one reason (exact for a record given up
        on here; for one loaded from the share state, which does not keep it, DELIVERY_LIMIT
        if its count has reached share.delivery.count.limit, else REJECTED, as Kafka infers
        it). Refused (`ChangePending`) while a change waits for commit or rollback: its
        ARCHIVING records may yet be undone, so take them only once it is committed.
        Nothing changes in the state: `archive_dead_letter` does, once the copy is durable;
        `return_dead_letters` makes everything ARCHIVING be handed out again.
        """
        if self._pending is not None or self._in_change:
            raise ChangePending(
                f"share partition {self.group_id}:{self.topic_id}:{self.partition} has a change "
                "waiting for commit or rollback; its dead letters are not durable yet"
            )
        if self._taken_at == self._archiving_puts:
            return []  # no ARCHIVING range came (or changed) since the last take
        table = self._ranges
        handed = self._handed
        now_handed: dict[int, int] = {}
        spans: list[tuple[int, int]] | None = None  # `handed` in order, for partial overlaps
        position = 0
        letters: list[DeadLetter] = []
        firsts, lasts, counts, reasons = table.firsts, table.lasts, table.counts, table.members
        states = table.states  # find_state's search, without a call per range
        group_id, topic_id, partition = self.group_id, self.topic_id, self.partition
        index = states.find(_ARCHIVING)
        while index >= 0:
            first, last = firsts[index], lasts[index]
            now_handed[first] = last
            handed_last = handed.get(first)
            if handed_last is None or handed_last < last:
                # Not a range handed out whole: the parts of it no handed range covers (all
                # of it, or the new part of a range merged or grown since), as runs. Read
                # from the packed table (no range built): an ARCHIVING range holds its
                # DeadLetterReason in the member slot.
                count, reason = counts[index], reasons[index]
                assert isinstance(reason, DeadLetterReason)
                if spans is None:
                    spans = list(handed.items())
                uncovered, position = _uncovered(spans, position, first, last)
                letters += [
                    DeadLetter(group_id, topic_id, partition, lo, hi, count, reason)
                    for lo, hi in uncovered
                ]
            index = states.find(_ARCHIVING, index + 1)
        self._handed = now_handed
        self._taken_at = self._archiving_puts
        return letters

    def return_dead_letters(self) -> None:
        """Forget what `take_dead_letters` handed out (its writer gave up on it): the next
        call hands out every ARCHIVING run again."""
        self._handed = {}
        self._taken_at = None

    def archive_dead_letter(self, first_offset: int, last_offset: int) -> PendingChange:
        """ARCHIVING -> ARCHIVED for the records of [first_offset, last_offset] still
        ARCHIVING (the dead-letter copy is durable, or refused for good): persist the
        change, then commit it, or roll it back and they stay ARCHIVING (handed out)."""
        return self.archive_dead_letters([(first_offset, last_offset)])

    @_atomic
    def archive_dead_letters(self, spans: Iterable[tuple[int, int]]) -> PendingChange:
        """`archive_dead_letter` of several (first, last) spans as one change (one write)."""
        self._require_initialized()
        self._start(stackable=False)
        table = self._ranges
        firsts, lasts, states = table.firsts, table.lasts, table.states
        for first_offset, last_offset in sorted(spans):
            first, last = max(first_offset, self._spso), min(last_offset, self._speo - 1)
            if first > last:
                continue
            index = table.index_at(first)
            if (
                index >= 0
                and firsts[index] == first
                and lasts[index] == last
                and states[index] == _ARCHIVING
            ):
                # A run as taken, still one range: the usual case.
                self._archive_in_place(index)
                continue
            for span_first, span_last in self._state_spans(_ARCHIVING, first, last):
                index = table.index_at(span_first)
                if firsts[index] == span_first and lasts[index] == span_last:
                    self._archive_in_place(index)
                else:
                    self._apply(span_first, span_last, Event.ARCHIVE)
        return self._finish()

    # -- internals ----------------------------------------------------------------------

    def _archive_in_place(self, index: int) -> None:
        """The whole ARCHIVING range at `index` made ARCHIVED in place, without `_apply`'s
        splits and searches and without building a range (journalled as `_ArchivedInPlace`)."""
        table = self._ranges
        first, last, reason = table.firsts[index], table.lasts[index], table.members[index]
        assert isinstance(reason, DeadLetterReason)  # an ARCHIVING range holds its reason
        table.states[index] = _ARCHIVED
        table.members[index] = None  # the reason goes
        self._journal.append((False, _ArchivedInPlace(first, last, table.counts[index], reason)))
        self._done_count += last - first + 1
        self._mark_changed(first, last)
        self._touch(first, last)

    def _require_initialized(self) -> None:
        if not self.initialized:
            raise RuntimeError(
                f"share partition {self.group_id}:{self.topic_id}:{self.partition} has no start "
                "offset yet; call initialize() with the share.auto.offset.reset offset"
            )

    def _load(self, start_offset: int, batches: list[PersistedBatch]) -> None:
        self._spso = self._speo = start_offset
        cursor = start_offset
        for batch in batches:
            if batch.first_offset > batch.last_offset:
                raise ValueError(f"state batch with first offset after last offset: {batch}")
            if batch.delivery_state not in _PERSISTED_STATES:
                raise ValueError(f"state batch with delivery state {batch.delivery_state}")
            first = max(batch.first_offset, start_offset)
            if batch.last_offset < first:
                continue
            if first < cursor:
                raise ValueError(f"overlapping state batches at offset {first}")
            if first > cursor:
                # Offsets with no persisted state were never delivered.
                self._put(InFlightRange(cursor, first - 1, _AVAILABLE, 0))
            state = RecordState(batch.delivery_state)
            reason = None
            if state is _ARCHIVING:
                # The reason is not persisted: inferred as Kafka does when it resumes.
                reason = (
                    DeadLetterReason.DELIVERY_LIMIT
                    if batch.delivery_count >= self.config.delivery_count_limit
                    else DeadLetterReason.REJECTED
                )
            self._put(
                InFlightRange(
                    first, batch.last_offset, state, batch.delivery_count, None, None, reason
                )
            )
            cursor = batch.last_offset + 1
        self._speo = cursor
        self._advance_spso()
        self._coalesce(start_offset, cursor)
        self._journal = []  # loading is not a change: nothing to roll back

    def _range_at(self, offset: int) -> InFlightRange:
        return self._ranges.record(self._ranges.index_at(offset))

    def _ranges_overlapping(self, first: int, last: int) -> list[InFlightRange]:
        table = self._ranges
        return table.records(table.index_at(first), table.index_after(last))

    def _available_spans(self, first: int, last: int) -> list[tuple[int, int]]:
        """AVAILABLE ranges within [first, last], clipped; taken before anything changes."""
        return self._state_spans(_AVAILABLE, first, last)

    def _state_spans(self, state: RecordState, first: int, last: int) -> list[tuple[int, int]]:
        """The ranges in `state` within [first, last], clipped."""
        if first > last:
            return []
        table = self._ranges
        stop = table.index_after(last)
        spans = []
        index = table.find_state(state, table.index_at(first), stop)
        while index >= 0:
            spans.append((max(table.firsts[index], first), min(table.lasts[index], last)))
            index = table.find_state(state, index + 1, stop)
        return spans

    def _counted_in(self, record: InFlightRange) -> None:
        """Count a range that enters the table (counters and lock deadlines)."""
        if record.state is _ACQUIRED:
            self._acquired_count += record.record_count
            deadline = record.lock_deadline_ms
            assert deadline is not None
            self._deadlines[deadline] = self._deadlines.get(deadline, 0) + 1
            if self._earliest_deadline is not None and deadline < self._earliest_deadline:
                self._earliest_deadline = deadline
        elif record.state is _ACKNOWLEDGED or record.state is _ARCHIVED:
            self._done_count += record.record_count
        elif record.state is _ARCHIVING:
            self._archiving_puts += 1

    def _counted_out(self, record: InFlightRange) -> None:
        """Uncount a range that leaves the table."""
        if record.state is _ACQUIRED:
            self._acquired_count -= record.record_count
            deadline = record.lock_deadline_ms
            assert deadline is not None
            held = self._deadlines[deadline] - 1
            if held:
                self._deadlines[deadline] = held
            else:
                del self._deadlines[deadline]
                if deadline == self._earliest_deadline:
                    self._earliest_deadline = None  # found again when next asked
        elif record.state is _ACKNOWLEDGED or record.state is _ARCHIVED:
            self._done_count -= record.record_count

    def _put(self, record: InFlightRange) -> None:
        self._journal.append((True, record))
        self._ranges.put(record)
        self._counted_in(record)

    def _pop(self, first_offset: int) -> InFlightRange:
        index = self._ranges.index_of(first_offset)
        record = self._ranges.record(index)
        self._ranges.delete(index, index + 1)
        self._journal.append((False, record))
        self._counted_out(record)
        return record

    def _pop_indexes(self, lo: int, hi: int) -> list[InFlightRange]:
        """`_pop` of the ranges at indexes [lo, hi), in one cut of the table."""
        records = self._ranges.records(lo, hi)
        self._ranges.delete(lo, hi)
        for record in records:
            self._journal.append((False, record))
            self._counted_out(record)
        return records

    def _add_range(self, record: InFlightRange) -> None:
        """A new range past SPEO. Past SPEO nothing is persisted (AVAILABLE, never
        delivered): only a range whose durable view differs from that is a change to write."""
        self._put(record)
        if _durable(record) != _NEVER_DELIVERED:
            self._mark_changed(record.first_offset, record.last_offset)
        self._touch(record.first_offset, record.last_offset)

    def _split_before(self, offset: int) -> None:
        """Make `offset` the first offset of a range, if a range spans across it."""
        if not self._spso < offset < self._speo:
            return
        table = self._ranges
        index = table.index_at(offset)
        if table.firsts[index] == offset:
            return  # a range starts there already (most calls): nothing built
        record = table.record(index)
        self._pop(record.first_offset)
        self._put(_spanning(record, record.first_offset, offset - 1))
        self._put(_spanning(record, offset, record.last_offset))

    def _apply(
        self,
        first: int,
        last: int,
        event: Event,
        member_id: str | None = None,
        lock_deadline_ms: int | None = None,
    ) -> list[tuple[InFlightRange, InFlightRange]]:
        """Apply `event` to every record of [first, last]; returns (old, new) per range."""
        self._split_before(first)
        self._split_before(last + 1)
        changes = []
        for key in self._ranges.keys(first, last):
            old = self._ranges[key]
            new = _transition(
                old,
                event,
                delivery_count_limit=self.config.delivery_count_limit,
                dead_letter=self.config.dead_letter,
                member_id=member_id,
                lock_deadline_ms=lock_deadline_ms,
            )
            if new != old:
                self._pop(key)
                self._put(new)
                if _durable(old) != _durable(new):
                    self._mark_changed(new.first_offset, new.last_offset)
            changes.append((old, new))
        self._touch(first, last)
        return changes

    def _apply_runs(
        self,
        first: int,
        last: int,
        runs: Sequence[tuple[int, int, Event]],
        member_id: str,
        lock_deadline_ms: int,
    ) -> list[InFlightRange]:
        """Apply each run's event to its records, [first, last] covered by `runs` in order;
        returns the new ranges.

        One pass, as `_apply` per run would split and rebuild the ranges once per run: a
        batch acknowledged one type per offset (accept, release, accept, ...) is thousands
        of runs over one acquired range.
        """
        self._split_before(first)
        self._split_before(last + 1)
        table = self._ranges
        olds = self._pop_indexes(table.index_at(first), table.index_after(last))
        limit = self.config.delivery_count_limit
        dead_letter = self.config.dead_letter
        news: list[InFlightRange] = []
        index = 0
        for run_first, run_last, event in runs:
            while olds[index].last_offset < run_first:
                index += 1
            cursor = run_first
            while cursor <= run_last:
                old = olds[index]
                piece_last = min(run_last, old.last_offset)
                # A single-offset piece shares one int object for both ends.
                piece = InFlightRange(
                    cursor,
                    cursor if piece_last == cursor else piece_last,
                    old.state,
                    old.delivery_count,
                    old.member_id,
                    old.lock_deadline_ms,
                )
                new = _transition(
                    piece,
                    event,
                    delivery_count_limit=limit,
                    dead_letter=dead_letter,
                    member_id=member_id,
                    lock_deadline_ms=lock_deadline_ms,
                )
                self._put(new)
                if _durable(old) != _durable(new):
                    self._mark_changed(new.first_offset, new.last_offset)
                news.append(new)
                cursor = piece_last + 1
                if piece_last == old.last_offset:
                    index += 1
        self._touch(first, last)
        return news

    def _advance_spso(self) -> None:
        """Move SPSO over the leading run of ACKNOWLEDGED/ARCHIVED records and forget them."""
        table = self._ranges
        done = 0
        while done < len(table) and table.states[done] in _DONE:
            done += 1
        if done:
            self._spso = table.lasts[done - 1] + 1
            # Cut in one piece and journalled packed: ranges are built only on a rollback.
            popped = table.cut(0, done)
            self._journal.append((False, popped))
            self._done_count -= popped.record_count  # all ACKNOWLEDGED or ARCHIVED
        if not table:
            self._spso = self._speo

    def _coalesce(self, first: int, last: int) -> None:
        """Merge adjacent ranges in the same state around [first, last]."""
        if not self._ranges:
            return
        table = self._ranges
        firsts, lasts, states = table.firsts, table.lasts, table.states
        counts, deadlines, members = table.counts, table.deadlines, table.members
        index = max(table.index_after(first) - 2, 0)
        stop = min(table.index_after(last) + 1, len(table))
        # Compared in the packed arrays (the fields `same_state_as` compares; the member
        # slot holds an ARCHIVING range's reason): a range is built only to merge.
        while index + 1 < stop:
            following = index + 1
            if (
                lasts[index] + 1 == firsts[following]
                and states[index] == states[following]
                and counts[index] == counts[following]
                and deadlines[index] == deadlines[following]
                and members[index] == members[following]
            ):
                previous = self._pop(firsts[index])
                current = self._pop(firsts[index])
                self._put(_spanning(previous, previous.first_offset, current.last_offset))
                stop -= 1  # the merged range stays at `index`: try it with the next one
            else:
                index = following

    def _mark_changed(self, first: int, last: int) -> None:
        self._changed.append((first, last))

    def _touch(self, first: int, last: int) -> None:
        self._touched.append((first, last))

    def _start(self, *, stackable: bool = True) -> None:
        """Begin a change: only one at a time, and only once the previous one is finished,
        unless the previous one was offered to build on (`stack_on`)."""
        base, self._stack_base = self._stack_base, None
        if self._pending is not None and (base is None or not stackable):
            raise ChangePending(
                f"share partition {self.group_id}:{self.topic_id}:{self.partition} has a change "
                "waiting for commit or rollback"
            )
        self._stacked = base
        self._in_change = True
        self._journal = []
        self._changed = []
        self._touched = []
        self._spso_before = self._spso
        self._speo_before = self._speo

    def _finish(self) -> PendingChange:
        """Advance SPSO, merge what was touched, and build the update to persist (if any)."""
        self._advance_spso()
        spso = self._spso
        for first, last in _merge_spans(self._touched):
            if last >= spso:  # below SPSO the ranges are gone: nothing to merge
                self._coalesce(first, last)
        own = self._changed
        self._touched = []
        self._changed = []
        if self._spso == self._spso_before and not own:
            return self._pend(None)
        if self._stacked is not None:
            # Stacked: one update rewrites what both changes touched, from the state now.
            own = own + self._stacked._changed
        changed = _merge_spans(own)
        spans = [
            (max(first, self._spso), min(last, self._speo - 1))
            for first, last in changed
            if max(first, self._spso) <= min(last, self._speo - 1)
        ]
        # One walk over the ranges the spans cover (coalesced as it goes).
        return self._pend(
            StateUpdate(self._spso, tuple(self._durable_batches_of(spans)), self._done_count),
            changed,
        )

    def _pend(
        self, state_update: StateUpdate | None, changed: list[tuple[int, int]] | None = None
    ) -> PendingChange:
        """End building a change: it now waits for commit or rollback, unless it is empty.
        Stacked on a pending change, the two become one."""
        self._in_change = False
        base, self._stacked = self._stacked, None
        if (
            state_update is None
            and not self._journal
            and self._spso == self._spso_before
            and self._speo == self._speo_before
        ):
            return NO_CHANGE if base is None else base
        journal, spso, speo = self._journal, self._spso_before, self._speo_before
        if base is not None:
            # Nothing durable changed on top (state_update None): the base's update stands.
            state_update = state_update or base.state_update
            changed = changed if changed is not None else base._changed
            journal, spso, speo = base._journal + journal, base._spso, base._speo
            base._partition, base._journal = None, []
        change = PendingChange(self, state_update, journal, spso, speo, changed)
        self._journal = []
        self._pending = change
        return change

    def _complete(self, change: PendingChange, *, commit: bool) -> None:
        if self._pending is not change:
            raise RuntimeError(f"{change!r} is not this partition's pending change")
        self._pending = None
        beside, self._beside_end = self._beside_end, None
        if not commit:
            self._undo(change._journal, change._spso, change._speo)
            if beside is not None:
                # What fetches acquired beside it is past everything it changed: kept.
                self._speo = max(self._speo, beside)
        change._journal = []

    def _undo(self, journal: list[JournalEntry], spso: int, speo: int) -> None:
        """Replay the journal backwards: take out what was put in, put back what was taken."""
        for was_put, record in reversed(journal):
            if isinstance(record, _RangeTable):
                for index in range(len(record)):
                    self._put(record.record(index))
            elif isinstance(record, _ArchivedInPlace):
                first, last, count, reason = record
                self._pop(first)
                self._put(InFlightRange(first, last, _ARCHIVING, count, None, None, reason))
            elif was_put:
                self._pop(record.first_offset)
            else:
                self._put(record)
        self._spso = spso
        self._speo = speo
        self._journal = []

    def _abort(self) -> None:
        """An exception escaped while a change was being built: undo what it did so far."""
        if self._in_change:
            self._in_change = False
            # A change stacked on a pending one undoes only itself: the base stays pending.
            self._stacked = None
            self._undo(self._journal, self._spso_before, self._speo_before)
            self._changed = []
            self._touched = []

    def _durable_batches(self, first: int, last: int) -> list[PersistedBatch]:
        return self._durable_batches_of([(first, last)])

    def _durable_batches_of(self, spans: Sequence[tuple[int, int]]) -> list[PersistedBatch]:
        """The state batches of ascending, disjoint `spans` of [spso, speo), by one walk
        over the packed table (no range built), adjacent ones of one state and delivery
        count coalesced."""
        if not spans:
            return []
        table = self._ranges
        firsts, lasts, states, counts = table.firsts, table.lasts, table.states, table.counts
        acquired, available = int(_ACQUIRED), int(_AVAILABLE)
        index = table.index_at(spans[0][0])
        end = len(table)
        # The batches as (first, last, state, count) lists while they may still grow.
        out: list[list[int]] = []
        previous: list[int] = [0, -2, -1, -1]  # one no batch follows
        for first, last in spans:
            while index < end and lasts[index] < first:
                index += 1
            while index < end and firsts[index] <= last:
                state, count = states[index], counts[index]
                if state == acquired:  # persisted as the AVAILABLE range it was (_durable)
                    state, count = available, count - 1
                # AVAILABLE with delivery count 0 was never delivered: no state batch needed.
                if state != available or count != 0:
                    lo = firsts[index] if firsts[index] > first else first
                    hi = lasts[index] if lasts[index] < last else last
                    if previous[1] + 1 == lo and previous[2] == state and previous[3] == count:
                        previous[1] = hi
                    else:
                        previous = [lo, hi, state, count]
                        out.append(previous)
                if lasts[index] > last:
                    break  # the range goes on into the next span
                index += 1
        return [PersistedBatch(*batch) for batch in out]

    def _release(self, firsts: list[int], event: Event) -> ReleaseResult:
        """Give back the ACQUIRED ranges starting at `firsts` (ascending) in one pass.

        A member leaving, or the locks expiring, after per-offset acknowledgements holds
        thousands of single-offset ranges: each is transitioned and merged with its equal
        neighbours here, the maps are updated once for all of them (`_swap`), and one
        state update covers every archived range. The outcome is what `_apply` per range
        followed by `_finish` would give; the pieces reported are joined where they touch.
        """
        ranges = self._ranges
        limit = self.config.delivery_count_limit
        dead_letter = self.config.dead_letter
        removed: list[InFlightRange] = []
        added: list[InFlightRange] = []
        available: list[OffsetRange] = []
        archived: list[OffsetRange] = []
        before_keys = self._keys_before(firsts)
        for index, first in enumerate(firsts):
            old = ranges[first]
            new = _transition(old, event, delivery_count_limit=limit, dead_letter=dead_letter)
            removed.append(old)
            # Durably the range was AVAILABLE with the count before its acquisition: made
            # AVAILABLE again it carries the delivery that was made, or it is ARCHIVED.
            self._mark_changed(first, new.last_offset)
            if new.state is not _AVAILABLE:
                _extend_spans(archived, first, new.last_offset)
            else:
                _extend_spans(available, first, new.last_offset)
            # Merge with the range before: a new one (released or merged just now), or an
            # untouched one.
            if added and added[-1].last_offset + 1 == first:
                before = added[-1]
                if before.same_state_as(new):
                    added[-1] = _joined(before, new)
                else:
                    added.append(new)
            elif first > self._spso:
                before = ranges[before_keys[index]]
                if before.same_state_as(new):
                    removed.append(before)
                    added.append(_joined(before, new))
                else:
                    added.append(new)
            else:
                added.append(new)
            # Merge with an untouched range after (a released one is merged on its turn).
            after_first = added[-1].last_offset + 1
            if after_first < self._speo and (
                index + 1 == len(firsts) or firsts[index + 1] != after_first
            ):
                after = ranges[after_first]
                if after.same_state_as(added[-1]):
                    removed.append(after)
                    added[-1] = _joined(added[-1], after)
        self._swap(removed, added)
        return ReleaseResult(tuple(available), tuple(archived), self._finish())

    def _keys_before(self, firsts: list[int]) -> list[int]:
        """The first offset of the range before each of `firsts` (ascending range starts;
        -1 for one at SPSO), by one walk over the keys between them, not a search each."""
        if not firsts:
            return []
        start = self._range_at(firsts[0] - 1).first_offset if firsts[0] > self._spso else -1
        keys: list[int] = []
        previous = start
        index = 0
        for key in self._ranges.keys(firsts[0], firsts[-1]):
            if key == firsts[index]:
                keys.append(previous)
                index += 1
            previous = key
        return keys

    def _swap(self, removed: list[InFlightRange], added: list[InFlightRange]) -> None:
        """Take `removed` out and put `added` in: the same as `_pop` of each removed range
        and `_put` of each added one (journal included). Each added range starts where a
        removed one did, so a kept start is replaced in place rather than moved."""
        self._journal.extend([(False, record) for record in removed])
        self._journal.extend([(True, record) for record in added])
        table = self._ranges
        kept = {record.first_offset for record in added}
        for record in removed:
            self._counted_out(record)
            if record.first_offset not in kept:
                index = table.index_of(record.first_offset)
                table.delete(index, index + 1)
        for record in added:
            table.put(record)
            self._counted_in(record)


def _spanning(record: InFlightRange, first: int, last: int) -> InFlightRange:
    """`record` over [first, last]: `dataclasses.replace` without its per-call overhead."""
    return InFlightRange(
        first,
        last,
        record.state,
        record.delivery_count,
        record.member_id,
        record.lock_deadline_ms,
        record.reason,
    )


def _joined(first: InFlightRange, second: InFlightRange) -> InFlightRange:
    """Two adjacent ranges in the same state as one."""
    return InFlightRange(
        first.first_offset,
        second.last_offset,
        first.state,
        first.delivery_count,
        first.member_id,
        first.lock_deadline_ms,
        first.reason,
    )


def _uncovered(
    spans: Sequence[tuple[int, int]], position: int, first: int, last: int
) -> tuple[list[tuple[int, int]], int]:
    """The parts of [first, last] that no span of ascending, disjoint `spans` covers, and
    the index of the first span from `position` not ending before `first` (where the
    search for a later range starts)."""
    while position < len(spans) and spans[position][1] < first:
        position += 1
    out: list[tuple[int, int]] = []
    cursor = first
    for scan in range(position, len(spans)):
        taken_first, taken_last = spans[scan]
        if taken_first > last:
            break
        if taken_first > cursor:
            out.append((cursor, taken_first - 1))
        cursor = max(cursor, taken_last + 1)
        if cursor > last:
            return out, position
    out.append((cursor, last))
    return out, position


def _extend_spans(spans: list[OffsetRange], first: int, last: int) -> None:
    """Append [first, last] to ascending `spans`, joined to the last one if they touch."""
    if spans and spans[-1].last_offset + 1 == first:
        spans[-1] = OffsetRange(spans[-1].first_offset, last)
    else:
        spans.append(OffsetRange(first, last))


def _batch_end(batches: Sequence[tuple[int, int]], offset: int, bound: int) -> int:
    """The last offset of the log batch holding `offset` (at most `bound`); `offset` if none."""
    index = bisect_right(batches, offset, key=_first_offset) - 1
    if index >= 0 and offset <= batches[index][1]:
        return min(batches[index][1], bound)
    return offset


def _shape_acquired(
    acquired: list[AcquiredRange], batches: Sequence[tuple[int, int]], batch_size: int
) -> tuple[AcquiredRange, ...]:
    """Join touching ranges of equal delivery count, then cut them into about `batch_size`
    records each at log batch boundaries (ShareFetch BatchSize)."""
    joined: list[AcquiredRange] = []
    for record in acquired:
        if joined:
            previous = joined[-1]
            if (
                previous.last_offset + 1 == record.first_offset
                and previous.delivery_count == record.delivery_count
            ):
                joined[-1] = previous._replace(last_offset=record.last_offset)
                continue
        joined.append(record)
    if batch_size <= 0:
        return tuple(joined)
    shaped: list[AcquiredRange] = []
    for record in joined:
        first = record.first_offset
        while first <= record.last_offset:
            last = record.last_offset
            if last - first + 1 > batch_size:
                last = _batch_end(batches, first + batch_size - 1, last)
            shaped.append(AcquiredRange(first, last, record.delivery_count))
            first = last + 1
    return tuple(shaped)
