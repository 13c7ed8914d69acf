"""What an audit of the share-state log finds: its record rows, its violations and its
result. `persister.spark.audit` produces them and `persister.spark.report` writes them
out; both take them from here, so the report needs nothing of the audit job.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

from persister.share_records import ShareRecord, StateBatch

ShareKeyTuple = tuple[str, str, int]  # group id, topic id (text), partition


class LogRecord(NamedTuple):
    """One decoded share-state record and where it sits: the record rows of the audit.

    `state_epoch` is -1 for an update or a tombstone (ShareUpdate has no such field);
    `segment` is the file name (relative to the share-state dir for compacted output).
    """

    source: str
    segment: str
    byte_position: int
    offset: int
    record_type: str
    group_id: str
    topic_id: str
    partition: int
    snapshot_epoch: int
    state_epoch: int
    leader_epoch: int
    start_offset: int
    batches: tuple[StateBatch, ...]
    share: ShareRecord

    @property
    def key(self) -> ShareKeyTuple:
        return (self.group_id, self.topic_id, self.partition)


@dataclass(frozen=True, slots=True)
class Violation:
    """One failed check, with the key (None where a bad batch names none) and position."""

    rule: str
    message: str
    group_id: str | None
    topic_id: str | None
    partition: int | None
    segment: str
    offset: int | None
    byte_position: int | None = None
    topic: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class AuditResult:
    checks: list[dict[str, Any]]
    violations: list[Violation]
    partitions: list[dict[str, Any]]
    summary: dict[str, Any]

    @property
    def passed(self) -> bool:
        return not self.violations
