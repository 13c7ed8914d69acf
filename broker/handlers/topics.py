"""CreateTopics, DeleteTopics, CreatePartitions, and auto-creation."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from broker.cluster import MetadataStore, Topic, topic_record, validate_topic_name
from broker.config import TOPIC_KEYS, BrokerConfig, format_value, parse_value
from broker.logs import LogManager
from broker.server import RequestContext
from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from typing_extensions import TypeIs

    from broker.handlers.requests import (
        CreatePartitionsRequest,
        CreateTopicsRequest,
        DeleteTopicsByIdRequest,
        DeleteTopicsRequest,
    )

log = structlog.get_logger("spool.topics")


class TopicStores(Protocol):
    """What creating a topic needs: cluster metadata, partition logs, the broker
    config, and whom to tell."""

    @property
    def config(self) -> BrokerConfig: ...
    @property
    def metadata(self) -> MetadataStore: ...
    @property
    def logs(self) -> LogManager: ...
    @property
    def topic_changed_hooks(self) -> list[Callable[[str], None]]: ...


class TopicsBroker(TopicStores, Protocol):
    """What the topic handlers use of the broker."""

    @property
    def node_id(self) -> int: ...
    @property
    def topic_deleted_hooks(self) -> list[Callable[[str, uuid.UUID], None]]: ...


MAX_PARTITIONS = 10_000


def validate_topic_configs(configs: dict[str, str | None]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in configs.items():
        key = TOPIC_KEYS.get(name)
        if key is None:
            raise KafkaError(ErrorCode.invalid_config, f"Unknown topic config name: {name}")
        if value is None:
            raise KafkaError(ErrorCode.invalid_config, f"Null value for topic config {name}")
        out[name] = format_value(parse_value(key, value, resource="topic")) or ""
    return out


def _check_partitions(count: int) -> None:
    if count < 1:
        raise KafkaError(ErrorCode.invalid_partitions, "Number of partitions must be larger than 0")
    if count > MAX_PARTITIONS:
        raise KafkaError(
            ErrorCode.invalid_partitions,
            f"Number of partitions {count} is above spool's limit of {MAX_PARTITIONS}",
        )


def _check_replication(factor: int) -> None:
    if factor not in (-1, 1):
        raise KafkaError(
            ErrorCode.invalid_replication_factor,
            f"Replication factor {factor} is larger than the 1 available broker",
        )


def _check_assignments(node_id: int, assignments: Sequence[tuple[int, Sequence[int]]]) -> None:
    for index, broker_ids in assignments:
        if list(broker_ids) != [node_id]:
            raise KafkaError(
                ErrorCode.invalid_replica_assignment,
                f"Partition {index} is assigned to brokers {list(broker_ids)}; "
                f"the only broker is {node_id}",
            )


async def create_topic(
    broker: TopicStores, name: str, partitions: int, configs: dict[str, str]
) -> Topic:
    topic = Topic(name=name, topic_id=uuid.uuid4(), partitions=partitions, configs=configs)
    broker.logs.ensure_file_headroom(name, partitions)
    await broker.metadata.commit([topic_record(topic)])
    current = broker.metadata.state.topics.get(name)
    if current is None or current.topic_id != topic.topic_id:
        # Deleted (or re-created) by another request while the record was written: it
        # was created, as in Kafka, and is gone; there are no logs of it to open.
        return topic
    try:
        broker.logs.open_topic(name, topic.topic_id, partitions, configs)
    except KafkaError:
        # Out of file descriptors: the logs were rolled back, so is the topic.
        deleted = {"type": "topic_deleted", "name": name, "topic_id": str(topic.topic_id)}
        await broker.metadata.commit([deleted])
        raise
    log.info("topic_created", topic=name, topic_id=str(topic.topic_id), partitions=partitions)
    for hook in broker.topic_changed_hooks:
        hook(name)
    return broker.metadata.state.topics[name]


async def auto_create_topic(broker: TopicStores, name: str) -> Topic:
    validate_topic_name(name)
    existing = broker.metadata.state.topics.get(name)
    if existing is not None:
        return existing
    return await create_topic(broker, name, broker.config.get("num.partitions"), {})


async def create_topics(
    ctx: RequestContext, req: CreateTopicsRequest, broker: TopicsBroker
) -> dict[str, Any]:
    results = []
    seen: set[str] = set()
    for t in req.topics:
        result: dict[str, Any] = {"name": t.name, "error_code": ErrorCode.none}
        try:
            if t.name in seen:
                raise KafkaError(
                    ErrorCode.invalid_request,
                    f"Topic {t.name} appears more than once in the request",
                )
            seen.add(t.name)
            validate_topic_name(t.name)
            if t.name in broker.metadata.state.topics:
                raise KafkaError(
                    ErrorCode.topic_already_exists, f"Topic '{t.name}' already exists."
                )
            assignments = [(a.partition_index, list(a.broker_ids)) for a in t.assignments]
            if assignments:
                if t.num_partitions != -1 or t.replication_factor != -1:
                    raise KafkaError(
                        ErrorCode.invalid_request,
                        "Both numPartitions or replicationFactor and replicasAssignments "
                        "were set. Both cannot be used at the same time.",
                    )
                _check_assignments(broker.node_id, assignments)
                partitions = len(assignments)
            else:
                partitions = (
                    broker.config.get("num.partitions")
                    if t.num_partitions == -1
                    else t.num_partitions
                )
                _check_replication(t.replication_factor)
            _check_partitions(partitions)
            configs = validate_topic_configs({c.name: c.value for c in t.configs})
            if req.validate_only:
                topic_id = None
            else:
                topic = await create_topic(broker, t.name, partitions, configs)
                topic_id = topic.topic_id
            settings = broker.logs.topic_settings(configs)
            result.update(
                topic_id=topic_id,
                num_partitions=partitions,
                replication_factor=1,
                configs=[
                    {
                        "name": name,
                        "value": format_value(settings[name]),
                        "read_only": False,
                        "config_source": 1 if name in configs else 5,
                        "is_sensitive": False,
                    }
                    for name in sorted(TOPIC_KEYS)
                ],
            )
        except KafkaError as exc:
            result.update(
                error_code=exc.code,
                error_message=exc.message,
                num_partitions=-1,
                replication_factor=-1,
            )
        results.append(result)
    return {"throttle_time": 0, "topics": results}


def _by_id(req: DeleteTopicsRequest) -> TypeIs[DeleteTopicsByIdRequest]:
    """DeleteTopics v6+ (KIP-516) names topics by id or name."""
    return req.__version__ >= 6


async def delete_topics(
    ctx: RequestContext, req: DeleteTopicsRequest, broker: TopicsBroker
) -> dict[str, Any]:
    state = broker.metadata.state
    wanted: list[tuple[str | None, uuid.UUID | None]]
    if _by_id(req):
        wanted = [(t.name, t.topic_id) for t in req.topics]
    else:
        wanted = [(name, None) for name in req.topic_names]
    responses = []
    for name, topic_id in wanted:
        entry: dict[str, Any] = {
            "name": name,
            "topic_id": topic_id,
            "error_code": ErrorCode.none,
        }
        try:
            if not broker.config.get("delete.topic.enable"):
                raise KafkaError(
                    ErrorCode.topic_deletion_disabled,
                    "Topic deletion is disabled (delete.topic.enable=false)",
                )
            if name is None and topic_id is not None:
                topic = state.topics_by_id.get(topic_id)
                if topic is None:
                    raise KafkaError(ErrorCode.unknown_topic_id, f"No topic with id {topic_id}")
            else:
                topic = state.topics.get(name or "")
                if topic is None:
                    raise KafkaError(
                        ErrorCode.unknown_topic_or_partition,
                        f"This server does not host topic {name!r}",
                    )
            entry.update(name=topic.name, topic_id=topic.topic_id)
            await broker.metadata.commit(
                [{"type": "topic_deleted", "name": topic.name, "topic_id": str(topic.topic_id)}]
            )
            broker.logs.remove_topic(topic.name)
            log.info("topic_deleted", topic=topic.name, topic_id=str(topic.topic_id))
            for hook in broker.topic_deleted_hooks:
                hook(topic.name, topic.topic_id)
        except KafkaError as exc:
            entry.update(error_code=exc.code, error_message=exc.message)
        responses.append(entry)
    return {"throttle_time": 0, "responses": responses}


async def create_partitions(
    ctx: RequestContext, req: CreatePartitionsRequest, broker: TopicsBroker
) -> dict[str, Any]:
    state = broker.metadata.state
    results = []
    for t in req.topics:
        entry: dict[str, Any] = {"name": t.name, "error_code": ErrorCode.none}
        try:
            topic = state.topics.get(t.name)
            if topic is None:
                raise KafkaError(
                    ErrorCode.unknown_topic_or_partition,
                    f"The topic '{t.name}' does not exist.",
                )
            if t.count <= topic.partitions:
                raise KafkaError(
                    ErrorCode.invalid_partitions,
                    f"Topic currently has {topic.partitions} partitions, which is higher "
                    f"than or equal to the requested {t.count}.",
                )
            _check_partitions(t.count)
            if t.assignments:
                if len(t.assignments) != t.count - topic.partitions:
                    raise KafkaError(
                        ErrorCode.invalid_replica_assignment,
                        f"Increasing the number of partitions by "
                        f"{t.count - topic.partitions} but {len(t.assignments)} "
                        "assignments provided.",
                    )
                added = [list(a.broker_ids) for a in t.assignments]
                _check_assignments(
                    broker.node_id,
                    [(topic.partitions + i, ids) for i, ids in enumerate(added)],
                )
            if not req.validate_only:
                grown = Topic(topic.name, topic.topic_id, t.count, dict(topic.configs))
                broker.logs.ensure_file_headroom(topic.name, t.count - topic.partitions)
                await broker.metadata.commit([topic_record(grown)])
                try:
                    broker.logs.open_topic(topic.name, topic.topic_id, t.count, topic.configs)
                except KafkaError:
                    await broker.metadata.commit([topic_record(topic)])
                    raise
                log.info("partitions_created", topic=topic.name, partitions=t.count)
                for hook in broker.topic_changed_hooks:
                    hook(topic.name)
        except KafkaError as exc:
            entry.update(error_code=exc.code, error_message=exc.message)
        results.append(entry)
    return {"throttle_time": 0, "results": results}
