"""Cluster metadata: topics, topic ids, partition counts, configs, producer ids.

`ClusterState` is the in-memory state and `replay` is the only code that changes it;
`MetadataStore` runs changes through the coordinator runtime: records are appended to
`data/meta/`, fsynced, then replayed, and on startup the whole log is replayed. The
records are JSON values in ordinary v2 record batches, keyed by what they describe;
closed segments are compacted to the newest record per key.

Every change is one runtime operation (`MetadataStore.run`): the checks a request's
answer rests on (does the topic exist, how many partitions has it, what are its configs)
and the records they lead to are made by `ClusterState`'s `*_record` methods inside the
operation, in the turn that writes them, so concurrent requests are serialised and no
check goes stale across the fsync. That is Kafka's controller model: each CreateTopics,
DeleteTopics, CreatePartitions or IncrementalAlterConfigs is one controller event
whose checks read the state every earlier event left (ReplicationControlManager,
ConfigurationControlManager). A validate-only request runs the same operation and
keeps no record (QuorumController: `result.withoutRecords()`).

Shared by brokers (the PostgreSQL engine: every broker of one database writes the one
`meta` log, persister.pg_storage's `PgSharedLog`): a write is optimistic. It goes in only
if the log still ends, in the database, where this broker's copy ends; if another
broker appended first the write is refused (`LogConflict`) and undone, and
`MetadataStore.run` catches up (appends the others' batches to the local copy and
replays them) and runs the operation again on the new state, so its checks see the
other broker's change: of two brokers creating one topic name at once one creates it
and the other answers TOPIC_ALREADY_EXISTS, and both hold the one topic id. It also
catches up before an operation's first run, so the operation sees every change
committed before it began, whichever broker made it. This is
Kafka's controller, serialising every change in one log, with the log's tail as the
lock. After `MAX_CONFLICT_RETRIES` refusals in a row the change fails with
NOT_CONTROLLER, which clients retry. An operation may therefore run more than once: it
must compute its records and response from the state alone. Brokers follow each other
by calling `catch_up` on a timer (broker.broker); `on_replayed` is told of the topics
and broker configs another broker changed, for the broker to act on them as on its own
(open or remove logs). The file engine has one writer and none of this runs.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import re
import uuid
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import structlog

from coordinator.acls import AclBinding, AclSet
from coordinator.group_config import AlterConfigOp, GroupConfigRecord, GroupConfigStore
from coordinator.runtime import CoordinatorRuntime, KeyCompaction
from coordinator.scram import (
    MAX_ITERATIONS,
    MECHANISM_BY_TYPE,
    MIN_ITERATIONS,
    MIN_SALT_BYTES,
    ScramCredential,
    ScramDeletion,
    ScramUpsertion,
    credential_from_salted,
)
from persister.clock import SYSTEM_CLOCK, Clock
from persister.commit import GroupCommit
from persister.coordinator_log import (
    INTERNAL_SEGMENT_BYTES,
    KeyValue,
    RecordLog,
    internal_log_config,
)
from persister.storage import FILE_STORAGE, LogConflict, SharedLog, StorageEngine
from protocol.errors import ErrorCode, KafkaError

log = structlog.get_logger("spool.cluster")

# Kafka's legal topic names (Topic.java): at most 249 of [a-zA-Z0-9._-], not . or ..
_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_TOPIC_NAME = 249
# Producer ids are handed out from durable blocks, so a restart never reuses one
# without writing a record per InitProducerId.
PRODUCER_ID_BLOCK = 1000
# Attempts of one change refused because other brokers appended first, after the first.
MAX_CONFLICT_RETRIES = 10

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
    # Dynamic broker configs: the cluster-wide defaults (Kafka's resource "") and each
    # broker's own (resource "<node id>"), which take precedence on that broker.
    broker_configs: dict[str, str] = field(default_factory=dict)
    node_broker_configs: dict[str, dict[str, str]] = field(default_factory=dict)
    producer_id_limit: int = 0
    # ACLs (KIP-11), as Kafka keeps them in its metadata log (AccessControlEntryRecord).
    acls: AclSet = field(default_factory=AclSet)
    # SCRAM credentials (KIP-554; Kafka's UserScramCredentialRecord): (user, mechanism)
    # -> {"salt", "stored_key", "server_key" (base64), "iterations"}. Never a password.
    scram_credentials: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    # Group configs (share.*), as Kafka keeps them in its metadata log (ConfigRecord of
    # resource type GROUP): one record per (group, key), applied by every broker. Its
    # `broker` (the group.share.* defaults and bounds) is set by the broker.
    group_configs: GroupConfigStore = field(default_factory=GroupConfigStore)
    # The group configs a groups log held before they moved here were copied once
    # (`MetadataStore.adopt_group_configs`); the groups log's own are ignored since.
    group_configs_adopted: bool = False

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
            node = record.get("node")
            if node is None:
                self.broker_configs = dict(record["configs"])
            else:
                self.node_broker_configs[node] = dict(record["configs"])
        elif kind == "producer_id_block":
            self.producer_id_limit = max(self.producer_id_limit, record["limit"])
        elif kind == "acl":
            self.acls.add(AclBinding.from_record(record["acl"]))
        elif kind == "acl_deleted":
            self.acls.remove(AclBinding.from_record(record["acl"]))
        elif kind == "scram_credential":
            self.scram_credentials[(record["user"], record["mechanism"])] = dict(
                record["credential"]
            )
        elif kind == "scram_credential_deleted":
            self.scram_credentials.pop((record["user"], record["mechanism"]), None)
        elif kind == "group_config":
            self.group_configs.replay(
                GroupConfigRecord(record["group"], record["name"], record["value"])
            )
        elif kind == "group_configs_adopted":
            self.group_configs_adopted = True
        else:
            raise ValueError(f"unknown metadata record type {kind!r}")

    # -- checks and records of changes: called inside a runtime operation ------------

    def check_topic_absent(self, name: str) -> None:
        """TOPIC_ALREADY_EXISTS with Kafka's message if `name` exists (checked right
        after the name itself, as ReplicationControlManager.createTopics does)."""
        if name in self.topics:
            raise KafkaError(ErrorCode.topic_already_exists, f"Topic '{name}' already exists.")

    def new_topic_record(
        self, name: str, partitions: int, configs: dict[str, str], topic_id: uuid.UUID
    ) -> tuple[Topic, Record]:
        """CreateTopics of one topic: the topic and its record, or TOPIC_ALREADY_EXISTS."""
        self.check_topic_absent(name)
        topic = Topic(name=name, topic_id=topic_id, partitions=partitions, configs=dict(configs))
        return topic, topic_record(topic)

    def find_topic(self, name: str | None, topic_id: uuid.UUID | None) -> Topic:
        """The topic DeleteTopics names: by id (v6+, KIP-516) UNKNOWN_TOPIC_ID if no
        topic has it, by name UNKNOWN_TOPIC_OR_PARTITION (Kafka's findTopicIds /
        findTopicNames)."""
        if name is None and topic_id is not None:
            found = self.topics_by_id.get(topic_id)
            if found is None:
                raise KafkaError(ErrorCode.unknown_topic_id, f"No topic with id {topic_id}")
            return found
        found = self.topics.get(name or "")
        if found is None:
            raise KafkaError(
                ErrorCode.unknown_topic_or_partition,
                f"This server does not host topic {name!r}",
            )
        return found

    @staticmethod
    def delete_topic_record(topic: Topic) -> Record:
        return {"type": "topic_deleted", "name": topic.name, "topic_id": str(topic.topic_id)}

    def undo_creation_record(self, created: Topic) -> Record | None:
        """The deletion of a topic whose logs could not be opened, if it is still the
        topic that was created (None: an operation in between deleted it)."""
        current = self.topics.get(created.name)
        if current is None or current.topic_id != created.topic_id:
            return None
        return self.delete_topic_record(current)

    def undo_growth_record(self, grown: Topic, partitions: int) -> Record | None:
        """The topic back at `partitions` after its new partitions' logs could not be
        opened, if it is still as grown (None: deleted or changed since)."""
        current = self.topics.get(grown.name)
        if (
            current is None
            or current.topic_id != grown.topic_id
            or current.partitions != grown.partitions
        ):
            return None
        return topic_record(
            Topic(current.name, current.topic_id, partitions, dict(current.configs))
        )

    def grow_topic_record(
        self, name: str, count: int, assignments: int | None
    ) -> tuple[Topic, Topic, Record]:
        """CreatePartitions of one topic to `count` partitions: (the topic now, the
        topic grown, its record). Kafka's checks in Kafka's order and words
        (ReplicationControlManager.createPartitions): an unknown topic is
        UNKNOWN_TOPIC_OR_PARTITION; a count equal to the current one (a second request
        racing to the same count) or below it is INVALID_PARTITIONS; assignments for
        another number of new partitions are INVALID_REPLICA_ASSIGNMENT."""
        topic = self.topics.get(name)
        if topic is None:
            raise KafkaError(
                ErrorCode.unknown_topic_or_partition, f"The topic '{name}' does not exist."
            )
        if count == topic.partitions:
            raise KafkaError(
                ErrorCode.invalid_partitions,
                f"Topic already has {topic.partitions} partition(s).",
            )
        if count < topic.partitions:
            raise KafkaError(
                ErrorCode.invalid_partitions,
                f"The topic {name} currently has {topic.partitions} partition(s); "
                f"{count} would not be an increase.",
            )
        additional = count - topic.partitions
        if assignments is not None and assignments != additional:
            raise KafkaError(
                ErrorCode.invalid_replica_assignment,
                f"Attempted to add {additional} additional partition(s), but only "
                f"{assignments} assignment(s) were specified.",
            )
        grown = Topic(topic.name, topic.topic_id, count, dict(topic.configs))
        return topic, grown, topic_record(grown)

    def topic_configs_record(
        self, name: str, update: Callable[[dict[str, str]], dict[str, str]]
    ) -> tuple[Topic, Record | None]:
        """IncrementalAlterConfigs of a TOPIC: `update` turns the topic's configs as
        they are now into the new ones (raising KafkaError for a bad op); returns the
        topic as altered and its record (None: nothing changes). Computed from the
        configs every earlier change left, so two requests altering different keys
        both keep theirs, as Kafka's one ConfigRecord per key does."""
        topic = self.topics.get(name)
        if topic is None:
            raise KafkaError(ErrorCode.unknown_topic_or_partition, f"Topic {name!r} does not exist")
        updated = update(dict(topic.configs))
        if updated == topic.configs:
            return topic, None
        changed = Topic(topic.name, topic.topic_id, topic.partitions, updated)
        return changed, topic_record(changed)

    def broker_configs_record(
        self, update: Callable[[dict[str, str]], dict[str, str]], node: str | None = None
    ) -> tuple[dict[str, str], Record]:
        """IncrementalAlterConfigs of the BROKER: the dynamic configs `update` makes of
        the current ones, the cluster-wide defaults (`node` None, Kafka's resource "")
        or one broker's own, and their record (written even when unchanged, as Kafka
        does for broker resources, KAFKA-14136, so the change is applied again)."""
        if node is None:
            updated = update(dict(self.broker_configs))
            return updated, {"type": "broker_config", "configs": updated}
        updated = update(dict(self.node_broker_configs.get(node, {})))
        return updated, {"type": "broker_config", "configs": updated, "node": node}

    def group_configs_records(self, group_id: str, ops: Sequence[AlterConfigOp]) -> list[Record]:
        """IncrementalAlterConfigs of a GROUP: one record per key the ops set or delete,
        validated as today (`GroupConfigStore.incremental_alter`: Kafka's fixed floors,
        the broker's group.share.min/max bounds, session timeout above heartbeat) against
        the group's configs as every earlier change left them, on whichever broker, as
        Kafka's controller validates a GROUP ConfigRecord (ConfigurationControlManager)."""
        if not group_id:
            # Kafka's controller (ControllerConfigurationValidator.validateGroupName).
            raise KafkaError(
                ErrorCode.invalid_request,
                "Default group resources are not allowed: name the group.",
            )
        return [group_config_record(r) for r in self.group_configs.incremental_alter(group_id, ops)]

    def adopt_group_configs_records(self, legacy: GroupConfigStore) -> list[Record]:
        """The group configs a groups log held (spool before they moved to the metadata
        log), copied once: each key the metadata does not set already (the metadata
        wins), then the marker that they were adopted. Nothing if adopted before or if
        there is nothing to adopt."""
        if self.group_configs_adopted or not legacy.group_ids():
            return []
        records: list[Record] = []
        for group_id in legacy.group_ids():
            have = self.group_configs.overrides(group_id)
            for name, value in legacy.overrides(group_id).items():
                if name not in have:
                    text = GroupConfigStore.text(value)
                    records.append(group_config_record(GroupConfigRecord(group_id, name, text)))
        return [*records, {"type": "group_configs_adopted"}]

    # -- SCRAM credentials (KIP-554; Kafka's ScramControlManager) ---------------------

    def scram_credential(self, user: str, mechanism: str) -> ScramCredential | None:
        data = self.scram_credentials.get((user, mechanism))
        return None if data is None else ScramCredential.from_record(data)

    def alter_scram_records(
        self, deletions: Sequence[ScramDeletion], upsertions: Sequence[ScramUpsertion]
    ) -> tuple[list[Record], list[ScramResult]]:
        """AlterUserScramCredentials: the records and one result per user, with Kafka's
        checks and order (ScramControlManager.alterCredentials): a user named twice in
        the request (whatever the mechanisms) is DUPLICATE_RESOURCE; an empty name or
        bad iterations UNACCEPTABLE_CREDENTIAL; an unknown mechanism
        UNSUPPORTED_SASL_MECHANISM; deleting a credential that does not exist
        RESOURCE_NOT_FOUND; a salt shorter than 12 bytes (which no login could use)
        UNACCEPTABLE_CREDENTIAL, where Kafka takes it. Results: deletions, then
        upsertions, then errors."""
        to_delete: dict[str, ScramDeletion] = {}
        to_upsert: dict[str, ScramUpsertion] = {}
        errors: dict[str, tuple[ErrorCode, str]] = {}
        duplicate = (
            ErrorCode.duplicate_resource,
            "A user credential cannot be altered twice in the same request",
        )
        for deletion in deletions:
            if deletion.user in errors:
                continue
            if to_delete.pop(deletion.user, None) is not None:
                errors[deletion.user] = duplicate
                continue
            error = _check_scram_name(deletion.user, deletion.mechanism)
            mechanism = MECHANISM_BY_TYPE.get(deletion.mechanism, "")
            if error is None and (deletion.user, mechanism) not in self.scram_credentials:
                error = (
                    ErrorCode.resource_not_found,
                    "Attempt to delete a user credential that does not exist",
                )
            if error is not None:
                errors[deletion.user] = error
            else:
                to_delete[deletion.user] = deletion
        for upsertion in upsertions:
            if upsertion.user in errors:
                continue
            if (
                to_delete.pop(upsertion.user, None) is not None
                or to_upsert.pop(upsertion.user, None) is not None
            ):
                errors[upsertion.user] = duplicate
                continue
            error = _check_scram_name(upsertion.user, upsertion.mechanism)
            if error is None and upsertion.iterations < MIN_ITERATIONS:
                error = (ErrorCode.unacceptable_credential, "Too few iterations")
            elif error is None and upsertion.iterations > MAX_ITERATIONS:
                error = (ErrorCode.unacceptable_credential, "Too many iterations")
            elif error is None and len(upsertion.salt) < MIN_SALT_BYTES:
                error = (
                    ErrorCode.unacceptable_credential,
                    f"Salt must be at least {MIN_SALT_BYTES} bytes",
                )
            if error is not None:
                errors[upsertion.user] = error
            else:
                to_upsert[upsertion.user] = upsertion
        records: list[Record] = []
        results: list[ScramResult] = []
        for deletion in to_delete.values():
            records.append(
                {
                    "type": "scram_credential_deleted",
                    "user": deletion.user,
                    "mechanism": MECHANISM_BY_TYPE[deletion.mechanism],
                }
            )
            results.append((deletion.user, ErrorCode.none, None))
        for upsertion in to_upsert.values():
            mechanism = MECHANISM_BY_TYPE[upsertion.mechanism]
            credential = credential_from_salted(
                mechanism, upsertion.salt, upsertion.salted_password, upsertion.iterations
            )
            records.append(scram_record(upsertion.user, mechanism, credential))
            results.append((upsertion.user, ErrorCode.none, None))
        results.extend((user, code, message) for user, (code, message) in errors.items())
        return records, results


@dataclass(frozen=True, slots=True)
class TopicChange:
    """A topic as another broker's records changed it: created (`before` None), deleted
    (`after` None), replaced by a topic of another id, grown or reconfigured."""

    name: str
    before: Topic | None
    after: Topic | None


@dataclass(frozen=True, slots=True)
class BrokerConfigsChange:
    """The dynamic broker configs another broker set: the cluster-wide defaults (`node`
    None) or one broker's own."""

    configs: dict[str, str]
    node: str | None = None


MetadataChange = TopicChange | BrokerConfigsChange


def replay_change(state: ClusterState, record: Record) -> MetadataChange | None:
    """Replay `record` into `state`; what it changed that a broker acts on (logs to open
    or remove, configs to apply), or None (ACLs, credentials, producer ids and the
    cluster id are read from the state where they are used)."""
    kind = record["type"]
    name = record.get("name")
    before = state.topics.get(name) if kind in ("topic", "topic_deleted") and name else None
    state.replay(record)
    if kind in ("topic", "topic_deleted") and name:
        after = state.topics.get(name)
        return None if after is before else TopicChange(name, before, after)
    if kind == "broker_config":
        return BrokerConfigsChange(dict(record["configs"]), record.get("node"))
    return None


def conflicted(exc: BaseException) -> bool:
    """Whether `exc` (a failed write) was refused because another writer appended first."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, LogConflict):
            return True
        seen = seen.__cause__
    return False


# (user, error code, error message) of one AlterUserScramCredentials result.
ScramResult = tuple[str, ErrorCode, str | None]


def _check_scram_name(user: str, mechanism: int) -> tuple[ErrorCode, str] | None:
    """Kafka's validateScramUsernameAndMechanism."""
    if not user:
        return ErrorCode.unacceptable_credential, "Username must not be empty"
    if mechanism not in MECHANISM_BY_TYPE:
        return ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism"
    return None


def scram_record(user: str, mechanism: str, credential: ScramCredential) -> Record:
    return {
        "type": "scram_credential",
        "user": user,
        "mechanism": mechanism,
        "credential": credential.to_record(),
    }


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
        storage: StorageEngine = FILE_STORAGE,
    ) -> None:
        self.state = ClusterState()
        self.runtime: CoordinatorRuntime[Record] = CoordinatorRuntime(
            "cluster-metadata",
            RecordLog(
                directory,
                commit,
                internal_log_config(segment_bytes),
                clock=clock,
                open_log=storage.open_log,
            ),
            encode=_encode,
            decode=_decode,
            replay=self.state.replay,
            clock=clock,
            compaction=KeyCompaction(_compaction_keys, clock),
        )
        count = self.runtime.load()
        # The producer id block this broker took (ids [next, end) are its to hand out);
        # none yet: the first InitProducerId takes one past every block taken so far.
        self._next_producer_id = 0
        self._producer_id_block_end = 0
        plog = self.runtime.record_log.partition_log
        # Written by other brokers too (PostgreSQL): see the module docstring.
        self.shared: SharedLog | None = plog if isinstance(plog, SharedLog) else None
        # Metadata operations and catch-ups of a shared log, one at a time.
        self._turn = asyncio.Lock()
        # Told of what other brokers changed, after each catch-up that brought any.
        self.on_replayed: Callable[[list[MetadataChange]], None] | None = None
        # Changes refused because another broker appended first, and records of other
        # brokers replayed (tests, metrics).
        self.conflicts = 0
        self.followed = 0
        log.info("metadata_loaded", records=count, topics=len(self.state.topics))

    async def run(
        self,
        op: Callable[[], tuple[list[Record], T]],
        *,
        applied: Callable[[T], None] | None = None,
    ) -> T:
        """Run a metadata operation: `op` reads `state`, checks and returns (records,
        response) in one turn; the records are made durable, then replayed. `applied`
        (opening or removing logs, telling listeners) runs after the replay, before the
        next metadata operation (`CoordinatorRuntime.run`). On a shared log a write
        another broker got in first is undone, the log caught up and `op` run again
        (see the module docstring): `op` may run more than once. A caller cancelled
        midway does not stop the operation, as with `CoordinatorRuntime.run`: the
        retries and catch-ups go on, and no catch-up runs beside them."""
        if self.shared is None:
            return await self.runtime.run(METADATA_KEY, op, applied=applied)
        task = asyncio.ensure_future(self._run_shared(op, applied))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(_consume_result)
            raise

    async def _run_shared(
        self, op: Callable[[], tuple[list[Record], T]], applied: Callable[[T], None] | None
    ) -> T:
        async with self._turn:
            try:
                # What other brokers committed first: a change sees every change made
                # before it began, on any broker (a check that only reads, such as a
                # config change's "does the topic exist", has no write to be refused).
                await self._catch_up()
            except KafkaError as exc:
                # The database unreadable: the op runs on what this broker has (one that
                # writes fails or is refused as it would have).
                log.debug("metadata_catch_up_failed", error=exc.message)
            for attempt in itertools.count():
                try:
                    return await self.runtime.run(METADATA_KEY, op, applied=applied)
                except KafkaError as exc:
                    if not conflicted(exc):
                        raise
                    self.conflicts += 1
                    if attempt >= MAX_CONFLICT_RETRIES:
                        raise KafkaError(
                            ErrorCode.not_controller,
                            f"the cluster metadata changed under this request "
                            f"{attempt + 1} times in a row (other brokers writing it); "
                            "retry",
                        ) from exc
                await self._catch_up()
            raise AssertionError("unreachable")

    async def catch_up(self) -> int:
        """Apply what other brokers appended to a shared metadata log since this broker
        last looked (its timer's call); how many records. Raises KafkaError
        (KAFKA_STORAGE_ERROR) if the storage cannot be read. Nothing on the file engine."""
        if self.shared is None:
            return 0
        async with self._turn:
            return await self._catch_up()

    async def _catch_up(self) -> int:
        assert self.shared is not None
        try:
            start = await self.shared.catch_up()
        except OSError as exc:
            raise KafkaError(
                ErrorCode.kafka_storage_error,
                f"could not read the cluster metadata other brokers wrote: {exc}",
            ) from exc
        changes: list[MetadataChange] = []
        count = 0
        for key, value in self.runtime.record_log.replay(start):
            record = _decode(key, value)
            if record is None:
                continue
            count += 1
            change = replay_change(self.state, record)
            if change is not None:
                changes.append(change)
        if count:
            self.followed += count
            log.info("metadata_caught_up", records=count, offset=start)
        if changes and self.on_replayed is not None:
            self.on_replayed(changes)
        return count

    async def ensure_cluster_id(self) -> str:
        """The cluster id, written by the first broker of the cluster to start (on a
        shared log, a second broker's write at the same time is refused, and it reads
        the first one's)."""

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
        """A producer id no one got before: the next of this broker's block, or the
        first of a new block past every block taken so far (by any broker: on a shared
        log, two brokers taking a block at once cannot both write theirs, and the one
        refused takes the block after). Kafka's ProducerIdControlManager hands out
        blocks the same way."""

        def op() -> tuple[list[Record], tuple[int, int | None]]:
            if self._next_producer_id < self._producer_id_block_end:
                return [], (self._next_producer_id, None)
            first = self.state.producer_id_limit
            end = first + PRODUCER_ID_BLOCK
            return [{"type": "producer_id_block", "limit": end}], (first, end)

        def taken(result: tuple[int, int | None]) -> None:
            # Handed out under the metadata key, so no two callers get the same id; a
            # block whose record failed to be written is never used.
            pid, block_end = result
            if block_end is not None:
                self._producer_id_block_end = block_end
            self._next_producer_id = pid + 1

        pid, _ = await self.run(op, applied=taken)
        return pid

    async def alter_scram_credentials(
        self, deletions: Sequence[ScramDeletion], upsertions: Sequence[ScramUpsertion]
    ) -> list[ScramResult]:
        """AlterUserScramCredentials as one metadata operation (`alter_scram_records`)."""

        def op() -> tuple[list[Record], list[ScramResult]]:
            return self.state.alter_scram_records(deletions, upsertions)

        return await self.run(op)

    async def put_scram_credentials(
        self, credentials: Sequence[tuple[str, str, ScramCredential]]
    ) -> None:
        """Store (user, mechanism, credential) triples as they are (`spool format
        --add-scram`, which checks them first)."""

        def op() -> tuple[list[Record], None]:
            return [scram_record(u, m, c) for u, m, c in credentials], None

        await self.run(op)

    async def alter_group_configs(
        self,
        group_id: str,
        ops: Sequence[AlterConfigOp],
        validate_only: bool,
        check: Callable[[ClusterState], None] | None = None,
    ) -> list[Record]:
        """IncrementalAlterConfigs of a GROUP as one metadata operation, on any broker;
        validate_only checks in the same turn and writes nothing. `check` (raising
        KafkaError) runs in that turn too, after the values are validated, on the state
        the records would apply to (a dead-letter topic's existence and configs). The
        records written."""

        def op() -> tuple[list[Record], list[Record]]:
            records = self.state.group_configs_records(group_id, ops)
            if check is not None:
                check(self.state)
            return ([] if validate_only else records), records

        records = await self.run(op)
        if not validate_only:
            log.info(
                "group_config_altered",
                group=group_id,
                configs={r["name"]: r["value"] for r in records},
            )
        return records

    async def adopt_group_configs(self, legacy: GroupConfigStore) -> int:
        """Move group configs a groups log held into the metadata log, once (see
        `ClusterState.adopt_group_configs_records`); how many configs were copied."""

        def op() -> tuple[list[Record], int]:
            records = self.state.adopt_group_configs_records(legacy)
            return records, max(0, len(records) - 1)

        copied = await self.run(op)
        if copied:
            log.info("group_configs_adopted", configs=copied)
        return copied

    async def compact(self) -> int:
        return await self.runtime.compact()

    def close(self) -> None:
        self.runtime.close()


METADATA_KEY = "cluster-metadata"


def _consume_result(task: asyncio.Task[Any]) -> None:
    # The caller went away (cancelled); its operation still finished or failed.
    if not task.cancelled():
        task.exception()


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
    if kind == "broker_config":
        # One key per resource: the cluster-wide defaults, and each broker's own.
        node = record.get("node")
        return [((kind,) if node is None else (kind, node), False)]
    if kind in ("cluster", "producer_id_block"):
        return [((kind,), False)]
    if kind in ("acl", "acl_deleted"):
        acl = AclBinding.from_record(record["acl"])
        return [(("acl", acl.key()), kind == "acl_deleted")]
    if kind in ("scram_credential", "scram_credential_deleted"):
        return [
            (("scram", record["user"], record["mechanism"]), kind == "scram_credential_deleted")
        ]
    if kind == "group_config":
        # One key per (group, config), a deletion its tombstone: Kafka's ConfigRecord.
        return [((kind, record["group"], record["name"]), record["value"] is None)]
    if kind == "group_configs_adopted":
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


def group_config_record(record: GroupConfigRecord) -> Record:
    """A group config change (value None: deleted) as a metadata record."""
    return {
        "type": "group_config",
        "group": record.group_id,
        "name": record.name,
        "value": record.value,
    }


def _key(record: Record) -> str:
    if record["type"] == "group_config":
        return f"group_config:{record['group']}:{record['name']}"
    return f"{record['type']}:{record.get('name', '')}"
