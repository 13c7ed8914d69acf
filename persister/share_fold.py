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
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from persister.share_records import (
    ShareRecord,
    ShareSnapshot,
    ShareTombstone,
    ShareUpdate,
    merge_batches,
)

NO_EPOCH = -1
NO_TIMESTAMP = -1
UNINITIALIZED_START_OFFSET = -1
EMPTY_STATE_EPOCH = 0


def apply_update(state: ShareSnapshot | None, update: ShareUpdate) -> ShareSnapshot:
    """The state after `update` (see the module docstring)."""
    if state is None:
        state = ShareSnapshot(
            key=update.key,
            snapshot_epoch=update.snapshot_epoch,
            state_epoch=EMPTY_STATE_EPOCH,
            leader_epoch=NO_EPOCH,
            start_offset=UNINITIALIZED_START_OFFSET,
            create_timestamp_ms=NO_TIMESTAMP,
            write_timestamp_ms=NO_TIMESTAMP,
        )
    start = (
        state.start_offset
        if update.start_offset == UNINITIALIZED_START_OFFSET
        else (update.start_offset)
    )
    return dataclasses.replace(
        state,
        key=update.key,
        leader_epoch=state.leader_epoch if update.leader_epoch == NO_EPOCH else update.leader_epoch,
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
