"""CreateTopics, DeleteTopics, CreatePartitions, and auto-creation.

Authorization as Kafka 4.2's ControllerApis (a KRaft broker forwards these to its
controller, which checks them): CreateTopics needs CREATE on the cluster or the topic,
and returns a created topic's configs only with DESCRIBE_CONFIGS on it; DeleteTopics
needs DELETE on the cluster or the topic, and a topic the principal may not DESCRIBE
is TOPIC_AUTHORIZATION_FAILED whether it exists or not; CreatePartitions needs ALTER
on the topic. The checks run in the request's metadata turn, beside the others."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import structlog
from kio.schema.types import TopicName
from kio.static.primitive import i8, i16, i32

from broker.config import TOPIC_KEYS, BrokerConfig, format_value, parse_value
from broker.handlers import responses as resp
from broker.handlers.access import Guarded
from broker.handlers.responses import NO_THROTTLE
from broker.partitions import LogManager
from broker.server import RequestContext
from coordinator.acls import AclOperation, ResourceType
from coordinator.metadata import MetadataStore, Record, Topic, TopicChange, validate_topic_name
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
    config, whom to tell, and when the new partitions are led."""

    @property
    def config(self) -> BrokerConfig: ...
    @property
    def metadata(self) -> MetadataStore: ...
    @property
    def logs(self) -> LogManager: ...
    @property
    def topic_changed_hooks(self) -> list[Callable[[str], None]]: ...

    async def claims_settled(self) -> None:
        """Return once the partitions just opened are claimed: on a cluster's database
        they are claimed as they open, and the answer waits for their leaders to be
        known, so the client's next Metadata names them (broker.broker.Broker)."""


class TopicsBroker(TopicStores, Guarded, Protocol):
    """What the topic handlers use of the broker."""

    @property
    def node_id(self) -> int: ...
    @property
    def topic_deleted_hooks(self) -> list[Callable[[str, uuid.UUID], None]]: ...


MAX_PARTITIONS = 10_000
# CreateTopics answers a topic it did not create with the zero id.
ZERO_UUID = uuid.UUID(int=0)


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


# What one CreateTopics entry came to: the topic (created, or checked only), or why not.
Outcome = Topic | KafkaError


def _new_topic(
    broker: TopicStores, name: str, partitions: int, configs: dict[str, str], pending: int
) -> tuple[Topic, Record]:
    """Inside a metadata operation: the checks of the state and the record of a new
    topic. `pending` partitions are created by the same operation before this one."""
    topic, record = broker.metadata.state.new_topic_record(name, partitions, configs, uuid.uuid4())
    broker.logs.ensure_file_headroom(name, pending + partitions)
    return topic, record


def _open_created(
    broker: TopicStores, outcomes: list[Outcome], created: set[int], failed: list[Topic]
) -> None:
    """After the records' replay, in the same turn: open the new topics' logs. A topic
    whose logs cannot be opened (out of descriptors; the logs rolled themselves back)
    becomes that error in `outcomes` and goes to `failed`, whose creation the caller
    undoes."""
    for i in sorted(created):
        topic = outcomes[i]
        assert isinstance(topic, Topic)
        try:
            open_topic_logs(broker, topic, "topic_created")
        except KafkaError as exc:
            outcomes[i] = exc
            failed.append(topic)


def open_topic_logs(broker: TopicStores, topic: Topic, event: str) -> None:
    """Open the logs of `topic`'s partitions not open yet (a topic created, or grown,
    here or by another broker), log `event` and tell the topic_changed_hooks. Raises
    KafkaError if they cannot be opened (those this call opened are closed again)."""
    broker.logs.open_topic(topic.name, topic.topic_id, topic.partitions, topic.configs)
    log.info(event, topic=topic.name, topic_id=str(topic.topic_id), partitions=topic.partitions)
    for hook in broker.topic_changed_hooks:
        hook(topic.name)


def remove_topic_logs(broker: TopicsBroker, topic: Topic) -> None:
    """A topic is deleted (here or by another broker): remove its logs and run the
    topic_deleted_hooks. A topic whose logs cannot be removed (an I/O error) is logged
    and the hooks run all the same (the broker's restart removes what is left)."""
    try:
        broker.logs.remove_topic(topic.name)
    except OSError as exc:
        log.error(
            "topic_logs_not_removed",
            topic=topic.name,
            topic_id=str(topic.topic_id),
            error=repr(exc),
            hint="the topic is deleted; its log directories are removed on restart",
        )
    log.info("topic_deleted", topic=topic.name, topic_id=str(topic.topic_id))
    for hook in broker.topic_deleted_hooks:
        hook(topic.name, topic.topic_id)


def apply_topic_change(broker: TopicsBroker, change: TopicChange) -> None:
    """A topic another broker created, deleted, grew or reconfigured, as this broker's
    copy of the metadata replayed it (`MetadataStore.on_replayed`): act on it as on a
    change of this broker's own, with the same code. Logs that cannot be opened are
    logged (the topic exists all the same, as the other broker answered)."""
    before, after = change.before, change.after
    if before is not None and (after is None or after.topic_id != before.topic_id):
        remove_topic_logs(broker, before)
    if after is None:
        return
    if before is None or before.topic_id != after.topic_id:
        event = "topic_created"
    elif after.partitions > before.partitions:
        event = "partitions_created"
    else:
        if after.configs != before.configs:
            broker.logs.reconfigure_topic(after.name, after.configs)
            log.info("topic_config_altered", topic=after.name, configs=after.configs)
        return
    try:
        open_topic_logs(broker, after, event)
    except KafkaError as exc:
        log.error(
            "topic_logs_not_opened",
            topic=after.name,
            topic_id=str(after.topic_id),
            error=exc.message,
            hint="the topic was changed by another broker; this one serves it after a restart",
        )


async def _undo_creations(broker: TopicStores, topics: list[Topic]) -> None:
    """Delete topics whose logs could not be opened, those still the topic created (an
    operation in between may have deleted it already)."""
    if not topics:
        return
    state = broker.metadata.state

    def op() -> tuple[list[Record], None]:
        undone = (state.undo_creation_record(t) for t in topics)
        return [r for r in undone if r is not None], None

    try:
        await broker.metadata.run(op)
    except KafkaError as exc:
        log.error("topic_creation_not_undone", topics=[t.name for t in topics], error=exc.message)


async def auto_create_topic(
    broker: TopicStores, name: str, configs: dict[str, str] | None = None
) -> Topic:
    """Metadata's auto-creation (auto.create.topics.enable): the topic, created with
    num.partitions (and `configs`: a dead-letter topic's opt-in) unless it exists by
    this request's turn."""
    validate_topic_name(name)
    created: set[int] = set()
    failed: list[Topic] = []

    def op() -> tuple[list[Record], list[Outcome]]:
        existing = broker.metadata.state.topics.get(name)
        if existing is not None:
            return [], [existing]
        topic, record = _new_topic(
            broker, name, broker.config.get("num.partitions"), dict(configs or {}), 0
        )
        created.add(0)
        return [record], [topic]

    outcomes = await broker.metadata.run(
        op, applied=lambda outcomes: _open_created(broker, outcomes, created, failed)
    )
    await _undo_creations(broker, failed)
    await broker.claims_settled()
    outcome = outcomes[0]
    if isinstance(outcome, KafkaError):
        raise outcome
    return outcome


def _check_new_topic(
    broker: TopicsBroker, t: Any, duplicated: set[str], creatable: Callable[[str], bool]
) -> tuple[int, dict[str, str]]:
    """The checks of a CreateTopics entry, in Kafka's order (duplicates, authorization,
    the name, whether it exists, then the rest): (partitions, configs). Inside the
    operation: the existence check is made in the turn that writes the topic."""
    if t.name in duplicated:
        raise KafkaError(ErrorCode.invalid_request, "Duplicate topic name.")
    if not creatable(t.name):
        raise KafkaError(ErrorCode.topic_authorization_failed, "Authorization failed.")
    validate_topic_name(t.name)
    broker.metadata.state.check_topic_absent(t.name)
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
            broker.config.get("num.partitions") if t.num_partitions == -1 else t.num_partitions
        )
        _check_replication(t.replication_factor)
    _check_partitions(partitions)
    return partitions, validate_topic_configs({c.name: c.value for c in t.configs})


async def create_topics(
    ctx: RequestContext, req: CreateTopicsRequest, broker: TopicsBroker
) -> resp.create_topics_v7.CreateTopicsResponse:
    """The whole request is one metadata operation, as in Kafka's controller (one
    event, ReplicationControlManager.createTopics): each topic is checked against the
    state every earlier operation left, so of concurrent requests creating one name
    exactly one succeeds and the others get TOPIC_ALREADY_EXISTS; validate_only runs
    the same checks in the same turn and writes nothing.

    A name given more than once is created under none of its entries and answered once,
    INVALID_REQUEST, with no authorization check (Kafka's ControllerApis.createTopics);
    the other answers are one per name in the order of the request."""
    first: dict[str, Any] = {}
    for t in req.topics:
        first.setdefault(t.name, t)
    entries = list(first.values())
    counts = Counter(t.name for t in req.topics)
    duplicated: set[str] = {name for name, n in counts.items() if n > 1}
    created: set[int] = set()
    failed: list[Topic] = []
    outcomes: list[Outcome] = []
    az = broker.authorizer
    any_topic = az.allows(ctx, AclOperation.CREATE, ResourceType.CLUSTER, log_denied=False)

    def creatable(name: str) -> bool:
        return any_topic or az.allows(ctx, AclOperation.CREATE, ResourceType.TOPIC, name)

    def op() -> tuple[list[Record], list[Outcome]]:
        # Run again when another broker changed the metadata first (MetadataStore.run).
        outcomes.clear()
        created.clear()
        records: list[Record] = []
        pending = 0
        for t in entries:
            try:
                partitions, configs = _check_new_topic(broker, t, duplicated, creatable)
                topic, record = _new_topic(broker, t.name, partitions, configs, pending)
            except KafkaError as exc:
                outcomes.append(exc)
                continue
            if not req.validate_only:
                records.append(record)
                created.add(len(outcomes))
                pending += partitions
            outcomes.append(topic)
        return records, outcomes

    try:
        await broker.metadata.run(
            op, applied=lambda outcomes: _open_created(broker, outcomes, created, failed)
        )
    except KafkaError as exc:
        # The write failed or was refused (KAFKA_STORAGE_ERROR): no topic was created.
        if len(outcomes) != len(entries):
            outcomes[:] = [exc for _ in entries]
        for i in created:
            outcomes[i] = exc
    await _undo_creations(broker, failed)
    await broker.claims_settled()
    m = resp.create_topics_v7
    results = []
    for t, outcome in zip([t.name for t in entries], outcomes, strict=True):
        if isinstance(outcome, KafkaError):
            results.append(
                m.CreatableTopicResult(
                    name=t,
                    topic_id=ZERO_UUID,
                    error_code=outcome.code,
                    error_message=outcome.message,
                    num_partitions=i32(-1),
                    replication_factor=i16(-1),
                    configs=(),
                )
            )
            continue
        if not az.allows(
            ctx, AclOperation.DESCRIBE_CONFIGS, ResourceType.TOPIC, t, log_denied=False
        ):
            # Created, but its configs and layout are not the principal's to see.
            results.append(
                m.CreatableTopicResult(
                    name=t,
                    topic_id=None if req.validate_only else outcome.topic_id,
                    error_code=ErrorCode.none,
                    error_message=None,
                    num_partitions=i32(-1),
                    replication_factor=i16(-1),
                    configs=(),
                    topic_config_error_code=i16(ErrorCode.topic_authorization_failed),
                )
            )
            continue
        settings = broker.logs.topic_settings(outcome.configs)
        results.append(
            m.CreatableTopicResult(
                name=t,
                topic_id=None if req.validate_only else outcome.topic_id,
                error_code=ErrorCode.none,
                error_message=None,
                num_partitions=i32(outcome.partitions),
                replication_factor=i16(1),
                configs=tuple(
                    m.CreatableTopicConfigs(
                        name=name,
                        value=format_value(settings[name]),
                        read_only=False,
                        # TOPIC_CONFIG (1) when set for the topic, else DEFAULT_CONFIG (5).
                        config_source=i8(1 if name in outcome.configs else 5),
                        is_sensitive=False,
                    )
                    for name in sorted(TOPIC_KEYS)
                ),
            )
        )
    return m.CreateTopicsResponse(throttle_time=NO_THROTTLE, topics=tuple(results))


def _by_id(req: DeleteTopicsRequest) -> TypeIs[DeleteTopicsByIdRequest]:
    """DeleteTopics v6+ (KIP-516) names topics by id or name."""
    return req.__version__ >= 6


async def delete_topics(
    ctx: RequestContext, req: DeleteTopicsRequest, broker: TopicsBroker
) -> resp.delete_topics_v6.DeleteTopicsResponse:
    """The whole request is one metadata operation: each name (or id) is resolved and
    its topic deleted in the turn that writes the deletion, so a DeleteTopics racing a
    CreateTopics of the name deletes the topic that exists at its turn, or answers
    UNKNOWN_TOPIC_OR_PARTITION (UNKNOWN_TOPIC_ID by id) if none does. Kafka resolves
    names to ids in one controller event and deletes the ids in the next
    (ControllerApis.deleteTopics); spool does both in one turn, the order Kafka's
    takes whenever nothing runs between its two events."""
    wanted: list[tuple[str | None, uuid.UUID | None]]
    if _by_id(req):
        wanted = [(t.name, t.topic_id) for t in req.topics]
    else:
        wanted = [(name, None) for name in req.topic_names]
    state = broker.metadata.state
    outcomes: list[Outcome] = []
    az = broker.authorizer
    any_topic = az.allows(ctx, AclOperation.DELETE, ResourceType.CLUSTER, log_denied=False)

    def describable(name: str) -> bool:
        return any_topic or az.allows(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, name)

    def deletable(name: str) -> bool:
        return any_topic or az.allows(ctx, AclOperation.DELETE, ResourceType.TOPIC, name)

    def op() -> tuple[list[Record], list[Outcome]]:
        outcomes.clear()  # run again after another broker's change (MetadataStore.run)
        records: list[Record] = []
        deleted: set[uuid.UUID] = set()
        for name, topic_id in wanted:
            try:
                if not broker.config.get("delete.topic.enable"):
                    raise KafkaError(
                        ErrorCode.topic_deletion_disabled,
                        "Topic deletion is disabled (delete.topic.enable=false)",
                    )
                if name is not None and not describable(name):
                    # Whether it exists is not disclosed.
                    raise KafkaError(ErrorCode.topic_authorization_failed)
                topic = state.find_topic(name, topic_id)
                if not deletable(topic.name):
                    # By id, the name is told only to whom may describe the topic.
                    denied = KafkaError(ErrorCode.topic_authorization_failed)
                    if name is None and describable(topic.name):
                        denied = _Named(topic.name, denied)
                    raise denied
                if topic.topic_id in deleted:
                    # Kafka's ControllerApis.deleteTopics refuses a topic named twice.
                    raise KafkaError(
                        ErrorCode.invalid_request,
                        "Duplicate topic id." if name is None else "Duplicate topic name.",
                    )
            except KafkaError as exc:
                outcomes.append(exc)
                continue
            deleted.add(topic.topic_id)
            records.append(state.delete_topic_record(topic))
            outcomes.append(topic)
        return records, outcomes

    try:
        await broker.metadata.run(op, applied=lambda outcomes: _remove_deleted(broker, outcomes))
    except KafkaError as exc:
        # The write failed or was refused: no topic was deleted.
        outcomes[:] = [o if isinstance(o, KafkaError) else exc for o in outcomes] or [
            exc for _ in wanted
        ]
    m = resp.delete_topics_v6
    responses = []
    for (name, topic_id), outcome in zip(wanted, outcomes, strict=True):
        if isinstance(outcome, _Named):
            name = outcome.name
        if isinstance(outcome, KafkaError):
            code, message = outcome.code, outcome.message
        else:
            code, message = ErrorCode.none, None
            name, topic_id = outcome.name, outcome.topic_id
        responses.append(
            m.DeletableTopicResult(
                name=None if name is None else TopicName(name),
                topic_id=topic_id,
                error_code=code,
                error_message=message,
            )
        )
    return m.DeleteTopicsResponse(throttle_time=NO_THROTTLE, responses=tuple(responses))


class _Named(KafkaError):
    """A DeleteTopics refusal by id that may name the topic in its answer."""

    def __init__(self, name: str, exc: KafkaError) -> None:
        super().__init__(exc.code, exc.message)
        self.name = name


def _remove_deleted(broker: TopicsBroker, outcomes: list[Outcome]) -> None:
    """After the deletions' replay, in the same turn: remove the topics' logs. The
    deletions are durable by now: a topic whose logs cannot be removed (an I/O error)
    is logged and still answered deleted, the other topics' logs are removed and the
    deletion hooks run for every topic (the broker's restart removes what is left)."""
    for topic in outcomes:
        if not isinstance(topic, KafkaError):
            remove_topic_logs(broker, topic)


# What one CreatePartitions entry came to: (the topic before, the topic grown), or why not.
Growth = tuple[Topic, Topic] | KafkaError


async def create_partitions(
    ctx: RequestContext, req: CreatePartitionsRequest, broker: TopicsBroker
) -> resp.create_partitions_v3.CreatePartitionsResponse:
    """The whole request is one metadata operation, as Kafka's controller runs it (one
    event, ReplicationControlManager.createPartitions): the count is checked against
    the partitions the topic has at this request's turn, so of concurrent requests
    growing a topic to one count exactly one succeeds and the others get
    INVALID_PARTITIONS "Topic already has N partition(s)."; validate_only runs the same
    checks in the same turn and writes nothing."""
    state = broker.metadata.state
    names = [t.name for t in req.topics]
    duplicates = {name for name, n in Counter(names).items() if n > 1}
    outcomes: list[Growth] = []
    az = broker.authorizer

    def op() -> tuple[list[Record], list[Growth]]:
        outcomes.clear()  # run again after another broker's change (MetadataStore.run)
        records: list[Record] = []
        pending = 0
        for t in req.topics:
            try:
                if t.name in duplicates:
                    # Kafka's ControllerApis.createPartitions.
                    raise KafkaError(ErrorCode.invalid_request, "Duplicate topic name.")
                if not az.allows(ctx, AclOperation.ALTER, ResourceType.TOPIC, t.name):
                    raise KafkaError(ErrorCode.topic_authorization_failed)
                assignments = None if t.assignments is None else len(t.assignments)
                topic, grown, record = state.grow_topic_record(t.name, t.count, assignments)
                _check_partitions(t.count)
                if t.assignments:
                    added_ids = [list(a.broker_ids) for a in t.assignments]
                    _check_assignments(
                        broker.node_id,
                        [(topic.partitions + i, ids) for i, ids in enumerate(added_ids)],
                    )
                added = t.count - topic.partitions
                broker.logs.ensure_file_headroom(t.name, pending + added)
            except KafkaError as exc:
                outcomes.append(exc)
                continue
            if not req.validate_only:
                records.append(record)
                pending += added
            outcomes.append((topic, grown))
        return records, outcomes

    failed: list[tuple[Topic, Topic]] = []
    try:
        await broker.metadata.run(
            op,
            applied=lambda outcomes: (
                None if req.validate_only else _open_grown(broker, outcomes, failed)
            ),
        )
    except KafkaError as exc:
        # The write failed or was refused: no topic grew.
        outcomes[:] = [o if isinstance(o, KafkaError) else exc for o in outcomes] or [
            exc for _ in req.topics
        ]
    await _undo_growths(broker, failed)
    await broker.claims_settled()
    m = resp.create_partitions_v3
    results = tuple(
        m.CreatePartitionsTopicResult(
            name=name, error_code=outcome.code, error_message=outcome.message
        )
        if isinstance(outcome, KafkaError)
        else m.CreatePartitionsTopicResult(name=name, error_code=ErrorCode.none)
        for name, outcome in zip(names, outcomes, strict=True)
    )
    return m.CreatePartitionsResponse(throttle_time=NO_THROTTLE, results=results)


def _open_grown(
    broker: TopicsBroker, outcomes: list[Growth], failed: list[tuple[Topic, Topic]]
) -> None:
    """After the records' replay, in the same turn: open the new partitions' logs. A
    topic whose new logs cannot be opened (out of descriptors) becomes that error and
    goes to `failed`, whose growth the caller undoes."""
    for i, outcome in enumerate(outcomes):
        if isinstance(outcome, KafkaError):
            continue
        _, grown = outcome
        try:
            open_topic_logs(broker, grown, "partitions_created")
        except KafkaError as exc:
            outcomes[i] = exc
            failed.append(outcome)


async def _undo_growths(broker: TopicsBroker, failed: list[tuple[Topic, Topic]]) -> None:
    """Shrink back topics whose new partitions could not be opened, those still as
    grown (an operation in between may have deleted or changed them)."""
    if not failed:
        return
    state = broker.metadata.state

    def op() -> tuple[list[Record], None]:
        undone = (state.undo_growth_record(grown, before.partitions) for before, grown in failed)
        return [r for r in undone if r is not None], None

    try:
        await broker.metadata.run(op)
    except KafkaError as exc:
        log.error(
            "partition_creation_not_undone",
            topics=[grown.name for _, grown in failed],
            error=exc.message,
        )
