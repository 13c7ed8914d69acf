"""Cluster metadata: topics, topic ids, partition counts, configs, producer ids.

`ClusterState` is the in-memory state and `replay` is the only code that changes it;
`MetadataStore` turns changes into records, appends them durably to `data/meta/`,
then replays them, and on startup replays the whole log. The records are JSON values
in ordinary v2 record batches, keyed by what they describe.
"""

from __future__ import annotations

import base64
import json
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from persister.commit import GroupCommit
from persister.record_log import RecordLog
from protocol.errors import ErrorCode, KafkaError

log = structlog.get_logger("spool.cluster")

# Kafka's legal topic names (Topic.java): at most 249 of [a-zA-Z0-9._-], not . or ..
_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_NAME = 249
# Producer ids are handed out from durable blocks, so a restart never reuses one
# without writing a record per InitProducerId.
PRODUCER_ID_BLOCK = 1000

Record = dict[str, Any]


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
    """Durable cluster metadata: records appended to `data/meta`, then replayed."""

    def __init__(self, directory: Path, commit: GroupCommit) -> None:
        self.state = ClusterState()
        self._log = RecordLog(directory, commit)
        count = 0
        for _, value in self._log.replay():
            if value is not None:
                self.state.replay(json.loads(value))
                count += 1
        self._next_producer_id = self.state.producer_id_limit
        log.info("metadata_loaded", records=count, topics=len(self.state.topics))

    async def commit(self, records: list[Record]) -> None:
        """Append records durably (fsync), then apply them to the live state."""
        await self._log.append(
            [(_key(r).encode(), json.dumps(r, sort_keys=True).encode()) for r in records]
        )
        for r in records:
            self.state.replay(r)

    async def ensure_cluster_id(self) -> str:
        if self.state.cluster_id is None:
            # Kafka cluster ids are 16 random bytes in url-safe base64 without padding.
            cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            await self.commit([{"type": "cluster", "cluster_id": cid}])
        assert self.state.cluster_id is not None
        return self.state.cluster_id

    async def allocate_producer_id(self) -> int:
        if self._next_producer_id >= self.state.producer_id_limit:
            limit = max(self._next_producer_id, self.state.producer_id_limit) + PRODUCER_ID_BLOCK
            await self.commit([{"type": "producer_id_block", "limit": limit}])
        pid = self._next_producer_id
        self._next_producer_id += 1
        return pid

    def close(self) -> None:
        self._log.close()


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
