"""Share-partition state as the share coordinator stores it, and the persister interface.

The share-partition leader reads and writes its durable state only through
`Persister`, whose calls mirror the share coordinator's RPCs
(InitializeShareGroupState, ReadShareGroupState, WriteShareGroupState,
DeleteShareGroupState, ReadShareGroupStateSummary). `InMemoryPersister` keeps the
state in a dict; the durable share coordinator implements the same interface.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from protocol.errors import ErrorCode, KafkaError

UNINITIALIZED_START_OFFSET = -1


class ShareStateKey(NamedTuple):
    group_id: str
    topic_id: uuid.UUID
    partition: int


class PersistedBatch(NamedTuple):
    """A state batch: offsets, delivery state (0 Available, 2 Acknowledged, 4 Archived),
    delivery count."""

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


class InMemoryPersister:
    """A Persister that keeps state in memory (lost on restart)."""

    def __init__(self) -> None:
        self.states: dict[ShareStateKey, ShareState] = {}

    async def initialize_state(
        self, key: ShareStateKey, state_epoch: int, start_offset: int
    ) -> None:
        current = self.states.get(key)
        if current is not None and state_epoch < current.state_epoch:
            raise KafkaError(
                ErrorCode.fenced_state_epoch,
                f"state epoch {state_epoch} is older than {current.state_epoch}",
            )
        self.states[key] = ShareState(state_epoch=state_epoch, start_offset=start_offset)

    async def read_state(self, key: ShareStateKey, leader_epoch: int) -> ShareState:
        current = self.states.get(key)
        if current is None:
            raise KafkaError(
                ErrorCode.unknown_topic_or_partition,
                f"no share state for {key.group_id} {key.topic_id}-{key.partition}",
            )
        if leader_epoch < current.leader_epoch:
            raise KafkaError(
                ErrorCode.fenced_leader_epoch,
                f"leader epoch {leader_epoch} is older than {current.leader_epoch}",
            )
        current.leader_epoch = leader_epoch
        return ShareState(
            current.state_epoch, current.leader_epoch, current.start_offset, list(current.batches)
        )

    async def write_state(
        self,
        key: ShareStateKey,
        state_epoch: int,
        leader_epoch: int,
        start_offset: int,
        batches: Sequence[PersistedBatch],
    ) -> None:
        current = self.states.get(key)
        if current is None:
            raise KafkaError(
                ErrorCode.unknown_topic_or_partition,
                f"no share state for {key.group_id} {key.topic_id}-{key.partition}",
            )
        if state_epoch < current.state_epoch:
            raise KafkaError(
                ErrorCode.fenced_state_epoch,
                f"state epoch {state_epoch} is older than {current.state_epoch}",
            )
        if leader_epoch < current.leader_epoch:
            raise KafkaError(
                ErrorCode.fenced_leader_epoch,
                f"leader epoch {leader_epoch} is older than {current.leader_epoch}",
            )
        if start_offset != UNINITIALIZED_START_OFFSET:
            current.start_offset = start_offset
        current.leader_epoch = leader_epoch
        current.batches = merge_batches(current.batches, batches, current.start_offset)

    async def delete_state(self, key: ShareStateKey) -> None:
        self.states.pop(key, None)

    async def read_summary(self, key: ShareStateKey) -> ShareState:
        current = self.states.get(key)
        if current is None:
            raise KafkaError(
                ErrorCode.unknown_topic_or_partition,
                f"no share state for {key.group_id} {key.topic_id}-{key.partition}",
            )
        return ShareState(current.state_epoch, current.leader_epoch, current.start_offset, [])
