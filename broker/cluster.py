"""Cluster metadata: topics, topic ids, partition counts, configs, producer ids.

`ClusterState` is the in-memory state and `replay` is the only code that changes it;
`MetadataStore` runs changes through the coordinator runtime: records are appended to
`data/meta/`, fsynced, then replayed, and on startup the whole log is replayed. The
records are JSON values in ordinary v2 record batches, keyed by what they describe;
closed segments are compacted to the newest record per key.
"""

from __future__ import annotations

import base64
import json
import re
import uuid
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import structlog

from coordinator.runtime import CoordinatorRuntime, KeyCompaction
from persister.clock import SYSTEM_CLOCK, Clock
from persister.commit import GroupCommit
from persister.record_log import (
    INTERNAL_SEGMENT_BYTES,
    KeyValue,
    RecordLog,
    internal_log_config,
)
from protocol.errors import ErrorCode, KafkaError

log = structlog.get_logger("spool.cluster")

# Kafka's legal topic names (Topic.java): at most 249 of [a-zA-Z0-9._-], not . or ..
_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_NAME = 249
# Producer ids are handed out from durable blocks, so a restart never reuses one
# without writing a record per InitProducerId.
PRODUCER_ID_BLOCK = 1000

Record = dict[str, Any]
T = TypeVar("T")


def validate_topic_name(name: str | None) -> None:
    if not name:
        raise KafkaError(ErrorCode.invalid_topic_exception, "Topic name is empty")
    if name in (".", ".."):
        raise KafkaError(ErrorCode.invalid_topic_exception, f"Topic name {name!r} is illegal")
    if len(name) > MAX_TOPIC_NAME:
        raise KafkaError(
            ErrorCode.invalid_topic_exception,
            f"Topic name is {len(name)} characters long; the limit is {MAX_TOPIC_NAME}",
        )
    if not _LEGAL_TOPIC.match(name):
        raise KafkaError(
            ErrorCode.invalid_topic_exception,
            f"Topic name {name!r} may only contain ASCII letters, digits, '.', '_' and '-'",
        )


@dataclass(slots=True)
class Topic:
    name: str
    topic_id: uuid.UUID
    partitions: int
    configs: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class ClusterState:
    cluster_id: str | None = None
    topics: dict[str, Topic] = field(default_factory=dict)
    topics_by_id: dict[uuid.UUID, Topic] = field(default_factory=dict)
    broker_configs: dict[str, str] = field(default_factory=dict)
    producer_id_limit: int = 0

    def replay(self, record: Record) -> None:
        kind = record["type"]
        if kind == "cluster":
            self.cluster_id = record["cluster_id"]
        elif kind == "topic":
            topic = Topic(
                name=record["name"],
                topic_id=uuid.UUID(record["topic_id"]),
                partitions=record["partitions"],
                configs=dict(record.get("configs", {})),
            )
            old = self.topics.get(topic.name)
            if old is not None and old.topic_id != topic.topic_id:
                self.topics_by_id.pop(old.topic_id, None)
            self.topics[topic.name] = topic
            self.topics_by_id[topic.topic_id] = topic
        elif kind == "topic_deleted":
            old = self.topics.get(record["name"])
            if old is not None and str(old.topic_id) == record["topic_id"]:
                del self.topics[old.name]
                self.topics_by_id.pop(old.topic_id, None)
        elif kind == "broker_config":
            self.broker_configs = dict(record["configs"])
        elif kind == "producer_id_block":
            self.producer_id_limit = max(self.producer_id_limit, record["limit"])
        else:
            raise ValueError(f"unknown metadata record type {kind!r}")


class MetadataStore:
    """Durable cluster metadata: `ClusterState` run by the coordinator runtime over
    `data/meta/` (one key: metadata changes are serialized, each computed from the
    committed state, fsynced, then replayed). A failed write raises
    KafkaError(KAFKA_STORAGE_ERROR) and changes nothing."""

    def __init__(
        self,
        directory: Path,
        commit: GroupCommit,
        *,
        clock: Clock = SYSTEM_CLOCK,
        segment_bytes: int = INTERNAL_SEGMENT_BYTES,
    ) -> None:
        self.state = ClusterState()
        self.runtime: CoordinatorRuntime[Record] = CoordinatorRuntime(
            "cluster-metadata",
            RecordLog(directory, commit, internal_log_config(segment_bytes), clock=clock),
            encode=_encode,
            decode=_decode,
            replay=self.state.replay,
            clock=clock,
            compaction=KeyCompaction(_compaction_keys, clock),
        )
        count = self.runtime.load()
        self._next_producer_id = self.state.producer_id_limit
        log.info("metadata_loaded", records=count, topics=len(self.state.topics))

    async def run(self, op: Callable[[], tuple[list[Record], T]]) -> T:
        """Run a metadata operation: `op` reads `state` and returns (records, response)."""
        return await self.runtime.run(METADATA_KEY, op)

    async def commit(self, records: list[Record]) -> None:
        """Make records durable (fsync), then apply them to the live state.

        The caller built them from state it read before waiting its turn; a deletion of
        a topic that is no longer the one named (deleted or re-created meanwhile) would
        change nothing and is dropped, so the log holds only effective changes.
        """

        def op() -> tuple[list[Record], None]:
            return [r for r in records if self._changes(r)], None

        await self.run(op)

    def _changes(self, record: Record) -> bool:
        if record["type"] == "topic_deleted":
            topic = self.state.topics.get(record["name"])
            return topic is not None and str(topic.topic_id) == record["topic_id"]
        return True

    async def ensure_cluster_id(self) -> str:
        def op() -> tuple[list[Record], None]:
            if self.state.cluster_id is not None:
                return [], None
            # Kafka cluster ids are 16 random bytes in url-safe base64 without padding.
            cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            return [{"type": "cluster", "cluster_id": cid}], None

        await self.run(op)
        assert self.state.cluster_id is not None
        return self.state.cluster_id

    async def allocate_producer_id(self) -> int:
        def op() -> tuple[list[Record], int]:
            records: list[Record] = []
            if self._next_producer_id >= self.state.producer_id_limit:
                limit = (
                    max(self._next_producer_id, self.state.producer_id_limit) + PRODUCER_ID_BLOCK
                )
                records.append({"type": "producer_id_block", "limit": limit})
            # Handed out under the metadata key, so no two callers get the same id; an
            # id whose block failed to be written is skipped, never reused.
            pid = self._next_producer_id
            self._next_producer_id += 1
            return records, pid

        return await self.run(op)

    async def compact(self) -> int:
        return await self.runtime.compact()

    def close(self) -> None:
        self.runtime.close()


METADATA_KEY = "cluster-metadata"


def _encode(record: Record) -> list[KeyValue]:
    return [(_key(record).encode(), json.dumps(record, sort_keys=True).encode())]


def _decode(key: bytes | None, value: bytes | None) -> Record | None:
    if value is None:
        return None
    record: Record = json.loads(value)
    return record


def _compaction_keys(key: bytes | None, value: bytes | None) -> list[tuple[Hashable, bool]]:
    """Each record sets its key's whole value: the cluster id, a topic (by name; deleting
    it is its tombstone), the dynamic broker configs, the producer id limit (which only
    grows, so the newest is the largest)."""
    record = _decode(key, value)
    if record is None:
        raise ValueError("cluster metadata record has no value")
    kind = record["type"]
    if kind in ("topic", "topic_deleted"):
        return [(("topic", record["name"]), kind == "topic_deleted")]
    if kind in ("cluster", "broker_config", "producer_id_block"):
        return [((kind,), False)]
    raise ValueError(f"unknown metadata record type {kind!r}")


def topic_record(topic: Topic) -> Record:
    return {
        "type": "topic",
        "name": topic.name,
        "topic_id": str(topic.topic_id),
        "partitions": topic.partitions,
        "configs": topic.configs,
    }


def _key(record: Record) -> str:
    return f"{record['type']}:{record.get('name', '')}"
