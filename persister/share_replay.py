"""A share partition's state as a fold of its share-state records.

The one definition of what a record does to a key's state, shared by the share
coordinator's replay (`coordinator.share_coordinator.ShareCoordinatorShard.replay`) and
the Spark compaction (`persister.spark.compact`), so the two cannot drift apart. The
state is expressed as the ShareSnapshot that would stand for it:

- a ShareSnapshot replaces the state whole;
- a ShareTombstone deletes it (None);
- a ShareUpdate moves the start offset and leader epoch (-1 = unchanged), overlays its
  batches on the stored ones (`merge_batches`: newer wins, batches below the start
  offset dropped) and replaces DeliveryCompleteCount, as Kafka's
  ShareCoordinatorShard.merge does; snapshot epoch, state epoch and timestamps stay.
  An update with no state before it (only a log written by something else has one)
  starts from an empty state: state epoch 0, leader epoch -1, start offset -1, the
  update's snapshot epoch, timestamps -1, as Kafka does.

Folding a key's records in offset order therefore gives exactly the state replay leaves,
and a snapshot of that state replays to the same state (except the count of updates
since the last snapshot, which only decides when the next snapshot is written).

`PackedBatches` holds a key's batches as the share coordinator keeps them in memory:
parallel packed arrays, 19 bytes a batch where a StateBatch tuple costs ~150. A
partition acknowledged one type per offset holds one batch per in-flight record
(share.partition.max.record.locks of them, per share partition), so this is what bounds
the coordinator's memory. `merge_packed` is `merge_batches` on that form: it copies the
runs of stored batches an update does not touch as whole array slices.
"""

from __future__ import annotations

import dataclasses
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator

from persister.share_records import (
    NO_EPOCH,
    UNINITIALIZED_START_OFFSET,
    ShareRecord,
    ShareSnapshot,
    ShareTombstone,
    ShareUpdate,
    StateBatch,
    merge_batches,
)
from protocol.records import NO_TIMESTAMP

EMPTY_STATE_EPOCH = 0


def empty_state(update: ShareUpdate) -> ShareSnapshot:
    """The state an update with nothing before it starts from (see the module docstring)."""
    return ShareSnapshot(
        key=update.key,
        snapshot_epoch=update.snapshot_epoch,
        state_epoch=EMPTY_STATE_EPOCH,
        leader_epoch=NO_EPOCH,
        start_offset=UNINITIALIZED_START_OFFSET,
        create_timestamp_ms=NO_TIMESTAMP,
        write_timestamp_ms=NO_TIMESTAMP,
    )


def updated_epoch_and_start(
    leader_epoch: int, start_offset: int, update: ShareUpdate
) -> tuple[int, int]:
    """(leader epoch, start offset) after `update`: its -1s leave the stored ones."""
    return (
        leader_epoch if update.leader_epoch == NO_EPOCH else update.leader_epoch,
        start_offset if update.start_offset == UNINITIALIZED_START_OFFSET else update.start_offset,
    )


def apply_update(state: ShareSnapshot | None, update: ShareUpdate) -> ShareSnapshot:
    """The state after `update` (see the module docstring)."""
    if state is None:
        state = empty_state(update)
    leader_epoch, start = updated_epoch_and_start(state.leader_epoch, state.start_offset, update)
    return dataclasses.replace(
        state,
        key=update.key,
        leader_epoch=leader_epoch,
        start_offset=start,
        batches=tuple(merge_batches(state.batches, update.batches, start)),
        delivery_complete_count=update.delivery_complete_count,
    )


def apply(state: ShareSnapshot | None, record: ShareRecord) -> ShareSnapshot | None:
    """The state after `record`; None when the key has no state."""
    if isinstance(record, ShareTombstone):
        return None
    if isinstance(record, ShareSnapshot):
        return record
    return apply_update(state, record)


def fold(
    records: Iterable[ShareRecord], state: ShareSnapshot | None = None
) -> ShareSnapshot | None:
    """The state of one key after its `records`, in log order, starting from `state`."""
    for record in records:
        state = apply(state, record)
    return state


class PackedBatches:
    """State batches as four parallel packed arrays; never changed once built.

    `disjoint` says whether the batches are ascending without overlaps (always so for what
    spool writes); `merge_packed` splices only such a list.
    """

    __slots__ = ("_counts", "_firsts", "_lasts", "_states", "disjoint")

    def __init__(self, batches: Iterable[tuple[int, int, int, int]] = ()) -> None:
        # In the order given: the order a snapshot holds them in is part of the state.
        listed = list(batches)
        self._firsts = array("q", [b[0] for b in listed])
        self._lasts = array("q", [b[1] for b in listed])
        self._states = array("b", [b[2] for b in listed])
        self._counts = array("h", [b[3] for b in listed])
        self.disjoint = _sorted_disjoint(listed)

    @classmethod
    def _of(
        cls, firsts: array[int], lasts: array[int], states: array[int], counts: array[int]
    ) -> PackedBatches:
        packed = cls.__new__(cls)
        packed._firsts, packed._lasts, packed._states, packed._counts = (
            firsts,
            lasts,
            states,
            counts,
        )
        packed.disjoint = True
        return packed

    def __len__(self) -> int:
        return len(self._firsts)

    def __iter__(self) -> Iterator[StateBatch]:
        return map(StateBatch, self._firsts, self._lasts, self._states, self._counts)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PackedBatches):
            return NotImplemented
        return list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PackedBatches({list(self)!r})"

    def unpack(self) -> tuple[StateBatch, ...]:
        return tuple(self)


def _sorted_disjoint(batches: list[StateBatch] | list[tuple[int, int, int, int]]) -> bool:
    """Whether `batches` ascend, each first <= last, without overlaps."""
    previous_last = -(2**63)
    for batch in batches:
        if not previous_last < batch[0] <= batch[1]:
            return False
        previous_last = batch[1]
    return True


def merge_packed(
    stored: PackedBatches, update: Iterable[StateBatch], start_offset: int
) -> PackedBatches:
    """`merge_batches(list(stored), update, start_offset)`, packed.

    Stored batches wholly outside the update's batches are copied as array slices, so a
    write of a few batches into thousands costs a few bisections and copies, not a Python
    step per stored batch.
    """
    upd = merge_batches((), update, UNINITIALIZED_START_OFFSET)
    if not (stored.disjoint and _sorted_disjoint(upd)):
        return PackedBatches(merge_batches(list(stored), upd, start_offset))
    firsts, lasts, states, counts = stored._firsts, stored._lasts, stored._states, stored._counts
    n = len(firsts)
    of, ol, os_, oc = array("q"), array("q"), array("b"), array("h")

    def copy(lo: int, hi: int) -> None:
        of.extend(firsts[lo:hi])
        ol.extend(lasts[lo:hi])
        os_.extend(states[lo:hi])
        oc.extend(counts[lo:hi])

    def emit(first: int, last: int, state: int, count: int) -> None:
        of.append(first)
        ol.append(last)
        os_.append(state)
        oc.append(count)

    pos = 0  # the first stored batch not yet emitted
    cursor = firsts[0] if n else 0  # where what is left of stored[pos] starts
    for first, last, state, count in upd:
        # Stored batches ending before this update batch: unchanged (the first of them
        # possibly cut at its start by the previous update batch).
        end = bisect_left(lasts, first, pos)
        if end > pos:
            emit(cursor, lasts[pos], states[pos], counts[pos])
            copy(pos + 1, end)
            pos = end
            if pos < n:
                cursor = firsts[pos]
        if pos < n and cursor < first:
            # stored[pos] starts before the update batch and reaches into it.
            emit(cursor, first - 1, states[pos], counts[pos])
        # Stored batches ending inside the update batch are overwritten whole.
        pos = bisect_right(lasts, last, pos)
        if pos < n:
            cursor = max(firsts[pos], last + 1)
        emit(first, last, state, count)
    if pos < n:
        emit(cursor, lasts[pos], states[pos], counts[pos])
        copy(pos + 1, n)
    if start_offset >= 0 and of:
        # Drop what lies below the start offset, cutting the batch it falls in.
        keep = bisect_left(ol, start_offset)
        if keep:
            del of[:keep], ol[:keep], os_[:keep], oc[:keep]
        if of and of[0] < start_offset:
            of[0] = start_offset
    return PackedBatches._of(of, ol, os_, oc)
