"""The share coordinator's state machine: share-partition state kept as replayed records.

Like Kafka's `ShareCoordinatorShard`: every operation that may change state checks the
request against the current state and returns `(records, result)` without touching that
state; `replay(record)` is the only mutator, and the runtime calls it for each record
once the records are durably appended, exactly as recovery does when it reads the log
back. No I/O, no clock: the time comes in as `now_ms`.

The rules, in one place:

- initialize_state: FENCED_STATE_EPOCH for an older state epoch. Writes a ShareSnapshot
  with the new state epoch and start offset, no batches, leader epoch 0, the next
  snapshot epoch, CreateTimestamp = WriteTimestamp = now, and DeliveryCompleteCount -1
  for start offset -1 (nothing consumed yet, lag unknown) else 0 (Kafka's
  ShareGroupOffset.fromRequest for Initialize).
- write_state: INVALID_REQUEST for a key never initialized (or deleted), as Kafka's
  "Write operation on uninitialized share partition not allowed"; then FENCED_LEADER_EPOCH
  / FENCED_STATE_EPOCH for an older epoch, in that order (-1 skips either check);
  INVALID_REQUEST for a malformed batch. Writes a ShareUpdate (the delta), or, once the key
  has had `snapshot_update_records_per_snapshot` updates since its last snapshot, a
  ShareSnapshot of the merged state instead (a new snapshot: CreateTimestamp =
  WriteTimestamp = now). Either carries the stored leader epoch (as Kafka's
  generateShareStateRecord: only a read moves it) and the request's
  DeliveryCompleteCount, which the share-partition leader computes.
- read_state: INVALID_REQUEST for a key never initialized (Kafka's "Read operation on
  uninitialized share partition not allowed"); FENCED_LEADER_EPOCH for an older leader
  epoch (-1 too, once one is known). A newer leader epoch is written down first, as a
  write of that epoch with no batches, the current start offset and the stored
  DeliveryCompleteCount (Kafka's readStateAndMaybeUpdateLeaderEpoch).
- read_summary: never an error for a well-formed key: a key with no state answers state
  epoch 0, leader epoch 0, start offset -1 and DeliveryCompleteCount -1 (uninitialized),
  as Kafka's readStateSummary does. A read operation: returns the result alone.
- delete_state: a ShareTombstone; nothing for a key that has no state.

Replay: a snapshot replaces the key's state whole and resets its update count; an update
moves the start offset and leader epoch (-1 = unchanged), replaces the
DeliveryCompleteCount (Kafka's merge takes the update's), merges its batches over the
stored ones (`merge_batches`: newer wins, batches below the start offset dropped) and
counts one more update; a tombstone forgets the key. The state epoch changes only
through a snapshot from initialize (an admin reset); ShareUpdate has no state-epoch field.
Because a snapshot or a tombstone determines a key's state on its own, compaction may
drop everything of a key before its last one (persister.share_compaction).

Checkpoint (`coordinator.runtime.Checkpoints`): per key its state as the ShareSnapshot
that stands for it, in the log's own record encoding, plus its count of updates since
the last snapshot, so a restored key is equal field by field to the replayed one and
writes its next snapshot at the same update.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

from coordinator.share_state import PersistedBatch, ShareState, ShareStateKey
from persister.share_records import (
    NO_EPOCH,
    UNINITIALIZED_START_OFFSET,
    UNKNOWN_DELIVERY_COMPLETE_COUNT,
    ShareKey,
    ShareRecord,
    ShareSnapshot,
    ShareTombstone,
    ShareUpdate,
    StateBatch,
    decode,
    encode,
    merge_batches,
)
from persister.share_replay import (
    PackedBatches,
    apply_update,
    merge_packed,
    updated_epoch_and_start,
)
from protocol.errors import ErrorCode, KafkaError

# share.coordinator.snapshot.update.records.per.snapshot
DEFAULT_SNAPSHOT_UPDATE_RECORDS_PER_SNAPSHOT = 500
# What ReadShareGroupStateSummary answers for a key with no state (Kafka's PartitionFactory).
DEFAULT_STATE_EPOCH = 0
DEFAULT_LEADER_EPOCH = 0
# The leader epoch Initialize writes (Kafka's ShareGroupOffset.UNINITIALIZED_EPOCH).
INITIAL_LEADER_EPOCH = 0
# Available, Acknowledged, Archiving (KIP-1191: waiting for its dead-letter copy), Archived
_DELIVERY_STATES = frozenset({0, 2, 3, 4})
_INT16_MAX = 2**15 - 1
# A checkpoint entry: updates since snapshot, key length, value length.
_CHECKPOINT_ENTRY = struct.Struct(">iii")
_CHECKPOINT_COUNT = struct.Struct(">i")

Records = list[ShareRecord]


@dataclass(frozen=True, slots=True)
class _Entry:
    """What the shard holds per key (never handed out: accessors return copies).

    The batches are packed (`PackedBatches`): a share partition acknowledged one type per
    offset holds one batch per in-flight record, for every share partition of every group.
    """

    state_epoch: int
    leader_epoch: int
    start_offset: int
    batches: PackedBatches
    snapshot_epoch: int
    create_timestamp_ms: int
    write_timestamp_ms: int
    updates_since_snapshot: int
    delivery_complete_count: int = UNKNOWN_DELIVERY_COMPLETE_COUNT

    @classmethod
    def of(cls, state: ShareSnapshot, *, updates_since_snapshot: int) -> _Entry:
        return cls(
            state_epoch=state.state_epoch,
            leader_epoch=state.leader_epoch,
            start_offset=state.start_offset,
            batches=PackedBatches(state.batches),
            snapshot_epoch=state.snapshot_epoch,
            create_timestamp_ms=state.create_timestamp_ms,
            write_timestamp_ms=state.write_timestamp_ms,
            updates_since_snapshot=updates_since_snapshot,
            delivery_complete_count=state.delivery_complete_count,
        )

    def snapshot(self, key: ShareKey) -> ShareSnapshot:
        """The entry as the ShareSnapshot that stands for it (persister.share_replay's form)."""
        return ShareSnapshot(
            key,
            self.snapshot_epoch,
            self.state_epoch,
            self.leader_epoch,
            self.start_offset,
            self.create_timestamp_ms,
            self.write_timestamp_ms,
            self.batches.unpack(),
            self.delivery_complete_count,
        )

    def to_state(self, *, with_batches: bool = True) -> ShareState:
        return ShareState(
            state_epoch=self.state_epoch,
            leader_epoch=self.leader_epoch,
            start_offset=self.start_offset,
            batches=list(self.batches) if with_batches else [],
            delivery_complete_count=self.delivery_complete_count,
        )


def _share_key(key: ShareStateKey) -> ShareKey:
    return ShareKey(key.group_id, key.topic_id, key.partition)


def _state_key(key: ShareKey) -> ShareStateKey:
    return ShareStateKey(key.group_id, key.topic_id, key.partition)


def _to_record_batches(batches: Iterable[PersistedBatch]) -> tuple[StateBatch, ...]:
    # PersistedBatch is StateBatch: only another tuple is built again.
    return tuple(b if type(b) is StateBatch else StateBatch(*b) for b in batches)


def _to_persisted(batches: Iterable[StateBatch]) -> list[PersistedBatch]:
    return [PersistedBatch(*batch) for batch in batches]


def _describe(key: ShareStateKey) -> str:
    return f"group {key.group_id!r} topic {key.topic_id} partition {key.partition}"


class ShareCoordinatorShard:
    """Share-partition state per (group, topic id, partition); see the module docstring."""

    def __init__(
        self,
        snapshot_update_records_per_snapshot: int = DEFAULT_SNAPSHOT_UPDATE_RECORDS_PER_SNAPSHOT,
    ) -> None:
        if snapshot_update_records_per_snapshot < 0:
            raise ValueError(
                "share.coordinator.snapshot.update.records.per.snapshot must be >= 0, got "
                f"{snapshot_update_records_per_snapshot}"
            )
        self.snapshot_update_records_per_snapshot = snapshot_update_records_per_snapshot
        self._entries: dict[ShareStateKey, _Entry] = {}

    def clear(self) -> None:
        """Forget every key's state (the share-state log is unloaded or replayed anew)."""
        self._entries = {}

    # ------------------------------------------------------------ accessors

    def state(self, key: ShareStateKey) -> ShareState | None:
        """A copy of the key's state, or None if it has none."""
        entry = self._entries.get(key)
        return None if entry is None else entry.to_state()

    def keys(self) -> Iterator[ShareStateKey]:
        return iter(list(self._entries))

    def updates_since_snapshot(self, key: ShareStateKey) -> int:
        """ShareUpdate records replayed for the key since its last snapshot (0 if unknown)."""
        entry = self._entries.get(key)
        return 0 if entry is None else entry.updates_since_snapshot

    def snapshot_epoch(self, key: ShareStateKey) -> int | None:
        entry = self._entries.get(key)
        return None if entry is None else entry.snapshot_epoch

    # ----------------------------------------------------------- operations

    def initialize_state(
        self, key: ShareStateKey, state_epoch: int, start_offset: int, now_ms: int
    ) -> tuple[Records, None]:
        """InitializeShareGroupState: a fresh snapshot at `start_offset` with `state_epoch`."""
        self._check_key(key)
        if start_offset < UNINITIALIZED_START_OFFSET:
            raise KafkaError(
                ErrorCode.invalid_request,
                f"start offset {start_offset} for {_describe(key)} is negative",
            )
        entry = self._entries.get(key)
        if entry is not None and state_epoch < entry.state_epoch:
            raise KafkaError(
                ErrorCode.fenced_state_epoch,
                f"state epoch {state_epoch} for {_describe(key)} is older than the stored "
                f"{entry.state_epoch}",
            )
        snapshot = ShareSnapshot(
            key=_share_key(key),
            snapshot_epoch=0 if entry is None else entry.snapshot_epoch + 1,
            state_epoch=state_epoch,
            leader_epoch=INITIAL_LEADER_EPOCH,
            start_offset=start_offset,
            create_timestamp_ms=now_ms,
            write_timestamp_ms=now_ms,
            # Lag is computable from an explicit start offset on (an admin reset), not
            # before the first consumer resolved share.auto.offset.reset.
            delivery_complete_count=(
                UNKNOWN_DELIVERY_COMPLETE_COUNT if start_offset == UNINITIALIZED_START_OFFSET else 0
            ),
        )
        return [snapshot], None

    def write_state(
        self,
        key: ShareStateKey,
        state_epoch: int,
        leader_epoch: int,
        start_offset: int,
        batches: Sequence[PersistedBatch],
        now_ms: int,
        *,
        delivery_complete_count: int = UNKNOWN_DELIVERY_COMPLETE_COUNT,
    ) -> tuple[Records, None]:
        """WriteShareGroupState: merge `batches` over the state, move the start offset
        (-1 = unchanged), store the leader's DeliveryCompleteCount."""
        self._check_key(key)
        entry = self._require(key, "Write")
        # Kafka's maybeGetWriteStateError checks the leader epoch before the state epoch.
        self._check_leader_epoch(key, entry, leader_epoch, allow_none=True)
        if state_epoch != NO_EPOCH and state_epoch < entry.state_epoch:
            raise KafkaError(
                ErrorCode.fenced_state_epoch,
                f"state epoch {state_epoch} for {_describe(key)} is older than the stored "
                f"{entry.state_epoch}",
            )
        if start_offset < UNINITIALIZED_START_OFFSET:
            raise KafkaError(
                ErrorCode.invalid_request,
                f"start offset {start_offset} for {_describe(key)} is negative",
            )
        for batch in batches:
            self._check_batch(key, batch)
        record = self._state_record(
            key, entry, entry.leader_epoch, start_offset, batches, delivery_complete_count, now_ms
        )
        return [record], None

    def read_state(
        self, key: ShareStateKey, leader_epoch: int, now_ms: int
    ) -> tuple[Records, ShareState]:
        """ReadShareGroupState: the state; a newer leader epoch is written down first."""
        self._check_key(key)
        entry = self._require(key, "Read")
        # As Kafka: -1 reads without recording anything, but is fenced once a leader
        # epoch is known.
        self._check_leader_epoch(key, entry, leader_epoch, allow_none=False)
        state = entry.to_state()
        if leader_epoch == NO_EPOCH or leader_epoch == entry.leader_epoch:
            return [], state
        state.leader_epoch = leader_epoch
        record = self._state_record(
            key,
            entry,
            leader_epoch,
            entry.start_offset,
            (),
            entry.delivery_complete_count,
            now_ms,
        )
        return [record], state

    def read_summary(self, key: ShareStateKey) -> ShareState:
        """ReadShareGroupStateSummary: state epoch, leader epoch, start offset (no batches).

        A key with no state (never initialized, or deleted) is not an error: like Kafka's
        readStateSummary it answers the defaults of an uninitialized share partition
        (state epoch 0, leader epoch 0, start offset -1), which is how an admin tells "no
        offset yet" from a failure. A read operation: it never writes, so it returns the
        result alone.
        """
        self._check_key(key)
        entry = self._entries.get(key)
        if entry is None:
            return ShareState(
                state_epoch=DEFAULT_STATE_EPOCH,
                leader_epoch=DEFAULT_LEADER_EPOCH,
                start_offset=UNINITIALIZED_START_OFFSET,
                delivery_complete_count=UNKNOWN_DELIVERY_COMPLETE_COUNT,
            )
        return entry.to_state(with_batches=False)

    def delete_state(self, key: ShareStateKey) -> tuple[Records, None]:
        """DeleteShareGroupState: a tombstone; nothing to write for an unknown key."""
        self._check_key(key)
        if key not in self._entries:
            return [], None
        return [ShareTombstone(_share_key(key))], None

    # ----------------------------------------------------------- checkpoint

    def checkpoint_size(self) -> int:
        return len(self._entries)

    def checkpoint_capture(self) -> Callable[[], bytes]:
        # Entries are immutable: a copy of the mapping is a consistent snapshot.
        entries = list(self._entries.items())

        def encode_all() -> bytes:
            out = bytearray(_CHECKPOINT_COUNT.pack(len(entries)))
            for key, entry in entries:
                k, v = encode(entry.snapshot(_share_key(key)))
                assert v is not None
                out += _CHECKPOINT_ENTRY.pack(entry.updates_since_snapshot, len(k), len(v))
                out += k
                out += v
            return bytes(out)

        return encode_all

    def checkpoint_restore(self, payload: bytes) -> None:
        entries: dict[ShareStateKey, _Entry] = {}
        (count,) = _CHECKPOINT_COUNT.unpack_from(payload)
        pos = _CHECKPOINT_COUNT.size
        for _ in range(count):
            updates, klen, vlen = _CHECKPOINT_ENTRY.unpack_from(payload, pos)
            pos += _CHECKPOINT_ENTRY.size
            key, value = payload[pos : pos + klen], payload[pos + klen : pos + klen + vlen]
            pos += klen + vlen
            record = decode(key, value)
            if not isinstance(record, ShareSnapshot) or len(value) != vlen:
                raise ValueError(f"checkpoint entry at byte {pos} is not a share snapshot")
            entries[_state_key(record.key)] = _Entry.of(record, updates_since_snapshot=updates)
        if pos != len(payload):
            raise ValueError(f"checkpoint has {len(payload) - pos} bytes after its entries")
        self._entries = entries

    # --------------------------------------------------------------- replay

    def replay(self, record: ShareRecord) -> None:
        """Apply one record: the only code that changes the state (live and on recovery)."""
        key = _state_key(record.key)
        if isinstance(record, ShareTombstone):
            self._entries.pop(key, None)
        elif isinstance(record, ShareSnapshot):
            self._entries[key] = _Entry.of(record, updates_since_snapshot=0)
        else:
            # The update rules live in persister.share_replay, shared with the Spark
            # compaction, so a compacted log replays to exactly this state.
            entry = self._entries.get(key)
            if entry is None:
                self._entries[key] = _Entry.of(apply_update(None, record), updates_since_snapshot=1)
                return
            # apply_update on the packed batches: merge_packed is merge_batches.
            leader_epoch, start = updated_epoch_and_start(
                entry.leader_epoch, entry.start_offset, record
            )
            self._entries[key] = replace(
                entry,
                leader_epoch=leader_epoch,
                start_offset=start,
                batches=merge_packed(entry.batches, record.batches, start),
                delivery_complete_count=record.delivery_complete_count,
                updates_since_snapshot=entry.updates_since_snapshot + 1,
            )

    # -------------------------------------------------------------- helpers

    def _state_record(
        self,
        key: ShareStateKey,
        entry: _Entry,
        leader_epoch: int,
        start_offset: int,
        batches: Iterable[PersistedBatch],
        delivery_complete_count: int,
        now_ms: int,
    ) -> ShareSnapshot | ShareUpdate:
        """The one snapshot-or-update decision (Kafka's generateShareStateRecord).

        `leader_epoch` is what the record carries: the stored one for a write, the new
        one for a read that moves it.
        """
        if entry.updates_since_snapshot >= self.snapshot_update_records_per_snapshot:
            start = (
                entry.start_offset if start_offset == UNINITIALIZED_START_OFFSET else start_offset
            )
            return ShareSnapshot(
                key=_share_key(key),
                snapshot_epoch=entry.snapshot_epoch + 1,
                state_epoch=entry.state_epoch,
                leader_epoch=entry.leader_epoch if leader_epoch == NO_EPOCH else leader_epoch,
                start_offset=start,
                # A new snapshot: created and written now, as Kafka's roll.
                create_timestamp_ms=now_ms,
                write_timestamp_ms=now_ms,
                batches=merge_packed(entry.batches, _to_record_batches(batches), start).unpack(),
                delivery_complete_count=delivery_complete_count,
            )
        # The request's batches may overlap each other: normalise them (newer wins), and
        # drop what lies below a new start offset.
        return ShareUpdate(
            key=_share_key(key),
            snapshot_epoch=entry.snapshot_epoch,
            leader_epoch=leader_epoch,
            start_offset=start_offset,
            batches=_to_record_batches(merge_batches((), batches, start_offset)),
            delivery_complete_count=delivery_complete_count,
        )

    def _require(self, key: ShareStateKey, operation: str) -> _Entry:
        entry = self._entries.get(key)
        if entry is None:
            # Kafka answers INVALID_REQUEST here (READ/WRITE_UNINITIALIZED_SHARE_PARTITION).
            raise KafkaError(
                ErrorCode.invalid_request,
                f"{operation} operation on uninitialized share partition not allowed: no "
                f"share state for {_describe(key)} (never initialized, or deleted)",
            )
        return entry

    @staticmethod
    def _check_key(key: ShareStateKey) -> None:
        if key.partition < 0:
            raise KafkaError(
                ErrorCode.invalid_request,
                f"partition {key.partition} of group {key.group_id!r} topic {key.topic_id} "
                "is negative",
            )

    @staticmethod
    def _check_leader_epoch(
        key: ShareStateKey, entry: _Entry, leader_epoch: int, *, allow_none: bool
    ) -> None:
        if allow_none and leader_epoch == NO_EPOCH:
            return
        if leader_epoch < entry.leader_epoch:
            raise KafkaError(
                ErrorCode.fenced_leader_epoch,
                f"leader epoch {leader_epoch} for {_describe(key)} is older than the stored "
                f"{entry.leader_epoch}",
            )

    @staticmethod
    def _check_batch(key: ShareStateKey, batch: PersistedBatch) -> None:
        if not 0 <= batch.first_offset <= batch.last_offset:
            raise KafkaError(
                ErrorCode.invalid_request,
                f"state batch {batch.first_offset}-{batch.last_offset} for {_describe(key)} "
                "is not a valid offset range",
            )
        if batch.delivery_state not in _DELIVERY_STATES:
            raise KafkaError(
                ErrorCode.invalid_request,
                f"state batch {batch.first_offset}-{batch.last_offset} for {_describe(key)} "
                f"has delivery state {batch.delivery_state}; expected 0 (Available), "
                "2 (Acknowledged), 3 (Archiving) or 4 (Archived)",
            )
        if not 0 <= batch.delivery_count <= _INT16_MAX:
            raise KafkaError(
                ErrorCode.invalid_request,
                f"state batch {batch.first_offset}-{batch.last_offset} for {_describe(key)} "
                f"has delivery count {batch.delivery_count}, outside 0..{_INT16_MAX}",
            )
