"""Share-partition state as the share coordinator stores it, and the persister interface.

The share-partition leader reads and writes its durable state only through
`Persister`, whose calls mirror the share coordinator's RPCs
(InitializeShareGroupState, ReadShareGroupState, WriteShareGroupState,
DeleteShareGroupState, ReadShareGroupStateSummary); `coordinator.share_persister`
implements it, durably or in memory.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from persister.share_records import (
    UNINITIALIZED_START_OFFSET,
    UNKNOWN_DELIVERY_COMPLETE_COUNT,
    StateBatch,
)


class ShareStateKey(NamedTuple):
    group_id: str
    topic_id: uuid.UUID
    partition: int


# A state batch: offsets, delivery state (0 Available, 2 Acknowledged, 3 Archiving, 4 Archived),
# delivery count; as in Read/WriteShareGroupState and in the share-state records. The one
# batch type of share state: the share-partition leader builds its StateUpdates from it,
# the coordinator stores it and the records carry it.
PersistedBatch = StateBatch


@dataclass(slots=True)
class ShareState:
    """The durable state of one share partition (the value of a ShareSnapshot)."""

    state_epoch: int = 0
    leader_epoch: int = -1
    start_offset: int = UNINITIALIZED_START_OFFSET
    batches: list[PersistedBatch] = field(default_factory=list)
    # Offsets at or above start_offset in a terminal state (KIP-1226); -1 when not known.
    delivery_complete_count: int = UNKNOWN_DELIVERY_COMPLETE_COUNT


class Persister(Protocol):
    """The share coordinator as the share-partition leader and group coordinator see it.

    Every method raises KafkaError with the share coordinator's error codes
    (FENCED_STATE_EPOCH, FENCED_LEADER_EPOCH, UNKNOWN_TOPIC_OR_PARTITION, ...).
    """

    async def initialize_state(
        self, key: ShareStateKey, state_epoch: int, start_offset: int
    ) -> None: ...

    async def initialize_if_absent(self, key: ShareStateKey, state_epoch: int = 0) -> bool:
        """Fresh state (`state_epoch`, start offset -1) unless the key has state worth
        keeping; checked in the turn that writes it. Whether it wrote."""

    async def reset_state(self, key: ShareStateKey, start_offset: int) -> int:
        """Fresh state at `start_offset` with the stored state epoch + 1, read in the
        turn that writes it; returns that epoch."""

    async def read_state(self, key: ShareStateKey, leader_epoch: int) -> ShareState: ...

    async def write_state(
        self,
        key: ShareStateKey,
        state_epoch: int,
        leader_epoch: int,
        start_offset: int,
        batches: Sequence[PersistedBatch],
        delivery_complete_count: int = UNKNOWN_DELIVERY_COMPLETE_COUNT,
    ) -> None: ...

    async def delete_state(self, key: ShareStateKey) -> None: ...

    async def read_summary(self, key: ShareStateKey) -> ShareState: ...
