"""Share-partition state as the share coordinator stores it, and the persister interface.

The share-partition leader reads and writes its durable state only through
`Persister`, whose calls mirror the share coordinator's RPCs
(InitializeShareGroupState, ReadShareGroupState, WriteShareGroupState,
DeleteShareGroupState, ReadShareGroupStateSummary); `coordinator.share_persister`
implements it, durably or in memory.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

UNINITIALIZED_START_OFFSET = -1


class ShareStateKey(NamedTuple):
    group_id: str
    topic_id: uuid.UUID
    partition: int


class PersistedBatch(NamedTuple):
    """A state batch: offsets, delivery state (0 Available, 2 Acknowledged, 4 Archived),
    delivery count; as in Read/WriteShareGroupState. The one batch type of share state: the
    share-partition leader builds its StateUpdates from it and the coordinator stores it."""

    first_offset: int
    last_offset: int
    delivery_state: int
    delivery_count: int


@dataclass(slots=True)
class ShareState:
    """The durable state of one share partition (the value of a ShareSnapshot)."""

    state_epoch: int = 0
    leader_epoch: int = -1
    start_offset: int = UNINITIALIZED_START_OFFSET
    batches: list[PersistedBatch] = field(default_factory=list)


def merge_batches(
    stored: Sequence[PersistedBatch], update: Iterable[PersistedBatch], start_offset: int
) -> list[PersistedBatch]:
    """Overlay `update` on `stored` (newer wins where they overlap), drop what lies
    below `start_offset`, and return the batches sorted and non-overlapping."""
    result: list[PersistedBatch] = list(stored)
    for new in sorted(update):
        pieces: list[PersistedBatch] = []
        for old in result:
            if old.last_offset < new.first_offset or old.first_offset > new.last_offset:
                pieces.append(old)
                continue
            if old.first_offset < new.first_offset:
                pieces.append(old._replace(last_offset=new.first_offset - 1))
            if old.last_offset > new.last_offset:
                pieces.append(old._replace(first_offset=new.last_offset + 1))
        pieces.append(new)
        result = sorted(pieces)
    if start_offset >= 0:
        trimmed = []
        for b in result:
            if b.last_offset < start_offset:
                continue
            trimmed.append(
                b if b.first_offset >= start_offset else b._replace(first_offset=start_offset)
            )
        result = trimmed
    return result


class Persister(Protocol):
    """The share coordinator as the share-partition leader and group coordinator see it.

    Every method raises KafkaError with the share coordinator's error codes
    (FENCED_STATE_EPOCH, FENCED_LEADER_EPOCH, UNKNOWN_TOPIC_OR_PARTITION, ...).
    """

    async def initialize_state(
        self, key: ShareStateKey, state_epoch: int, start_offset: int
    ) -> None: ...

    async def read_state(self, key: ShareStateKey, leader_epoch: int) -> ShareState: ...

    async def write_state(
        self,
        key: ShareStateKey,
        state_epoch: int,
        leader_epoch: int,
        start_offset: int,
        batches: Sequence[PersistedBatch],
    ) -> None: ...

    async def delete_state(self, key: ShareStateKey) -> None: ...

    async def read_summary(self, key: ShareStateKey) -> ShareState: ...
