"""What the share-partition leader and the dead-letter writer agree on (KIP-1191).

A share group with a dead-letter topic (group config `errors.deadletterqueue.topic.name`)
does not archive a record it gives up on at once: a rejected record, or one that reached
`share.delivery.count.limit`, goes ACQUIRED -> ARCHIVING, durably, then its copy is
written to the dead-letter topic, durably, and only then does it go ARCHIVING -> ARCHIVED.
A crash between the two writes leaves ARCHIVING in the share state, and whoever loads the
share partition next writes the copy again: never lost, at worst copied twice, and a
second copy names the same source topic, partition, offset and group in its headers.

`DeadLetter` is one run of ARCHIVING offsets of one share partition. The runs the leader
takes at once are handed to a `DeadLetterSink` together (`write_all`: one call per take,
so what a write costs apart from its records is paid once per take, not once per run);
the sink writes their copies (or refuses some for good) and the leader then archives
them.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Protocol

__all__ = [
    "HEADER_DELIVERY_COUNT",
    "HEADER_GROUP",
    "HEADER_MESSAGE",
    "HEADER_OFFSET",
    "HEADER_PARTITION",
    "HEADER_TOPIC",
    "DeadLetter",
    "DeadLetterOutcome",
    "DeadLetterReason",
    "DeadLetterRefused",
    "DeadLetterRetriable",
    "DeadLetterSink",
]

# The context headers of a dead-letter record, as Kafka's share-group DLQ writes them
# (values are UTF-8 text; numbers in decimal).
HEADER_TOPIC: Final = "__dlq.errors.topic"
HEADER_PARTITION: Final = "__dlq.errors.partition"
HEADER_OFFSET: Final = "__dlq.errors.offset"
HEADER_GROUP: Final = "__dlq.errors.group"
HEADER_DELIVERY_COUNT: Final = "__dlq.errors.delivery.count"
HEADER_MESSAGE: Final = "__dlq.errors.message"


class DeadLetterReason(enum.Enum):
    """Why a record is dead-lettered; the value is the `__dlq.errors.message` header
    Kafka writes, the name (lower case) the metrics' `reason` label."""

    REJECTED = "Offset rejected by client."
    DELIVERY_LIMIT = "Offset delivery count exceeded the threshold."

    @property
    def label(self) -> str:
        return self.name.lower()


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """Offsets [first_offset, last_offset] of one share partition, all ARCHIVING with one
    delivery count and one reason. Offsets in the run that hold no record (compacted
    away, or past the log start) get no copy."""

    group_id: str
    topic_id: uuid.UUID
    partition: int
    first_offset: int
    last_offset: int
    delivery_count: int
    reason: DeadLetterReason

    @property
    def record_count(self) -> int:
        return self.last_offset - self.first_offset + 1


class DeadLetterRetriable(Exception):
    """The copy could not be written now (storage error, leader moved, database down):
    the run stays ARCHIVING and is tried again after a backoff."""


class DeadLetterRefused(Exception):
    """The copy can never be written (no dead-letter topic configured any more, the topic
    is gone or lacks `errors.deadletterqueue.group.enable` or the required prefix, it is
    the source topic itself, a copy is larger than the topic accepts): the run is
    archived without a copy, as Kafka does when its DLQ write fails, and the message
    says why (logged, counted as a failed dead-letter write)."""


# What became of one letter: the number of copies written (durable), or why not.
DeadLetterOutcome = int | DeadLetterRefused | DeadLetterRetriable


class DeadLetterSink(Protocol):
    async def write_all(self, letters: Sequence[DeadLetter]) -> list[DeadLetterOutcome]:
        """Write the copies of the records of `letters` (runs of one share partition,
        ascending) to their group's dead-letter topic, durable (committed as an acks=all
        produce is) before returning; one outcome per letter, in order: the number of
        records written, or the DeadLetterRetriable / DeadLetterRefused that concerns it
        (returned, not raised)."""
        ...
