"""DescribeConfigs and IncrementalAlterConfigs for TOPIC, BROKER and GROUP resources.

Authorization as Kafka 4.2 (ConfigHelper, ControllerApis): describing needs
DESCRIBE_CONFIGS and altering ALTER_CONFIGS, on the cluster for a broker, on the topic
or the group for theirs; a denied resource is answered CLUSTER_, TOPIC_ or
GROUP_AUTHORIZATION_FAILED and the others are served.

Setting a share group's dead-letter topic (KIP-1191's `errors.deadletterqueue.topic.name`)
is checked against the cluster as it is in the same metadata turn: the topic must carry
the brokers' `errors.deadletterqueue.topic.name.prefix`, exist (unless
`errors.deadletterqueue.auto.create.topics.enable`), have
`errors.deadletterqueue.group.enable=true`, and not be a topic the group consumes (as
this broker's group coordinator knows it: subscriptions and share state), else
INVALID_CONFIG says which and why and nothing is stored. Kafka checks most of this only
when it writes a dead letter; spool refuses the config up front, and the dead-letter
writer checks again (`coordinator.group_config.dead_letter_topic_problem`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import structlog
from kio.static.primitive import i8

from broker.config import (
    BROKER_KEYS,
    SOURCE_DEFAULT,
    SOURCE_DYNAMIC_TOPIC,
    TOPIC_KEYS,
    BrokerConfig,
    format_value,
    parse_value,
)
from broker.handlers import responses as resp
from broker.handlers.access import CLUSTER_DENIED, GROUP_DENIED, TOPIC_DENIED, Guarded
from broker.handlers.responses import NO_THROTTLE
from broker.handlers.topics import validate_topic_configs
from broker.partitions import LogManager
from broker.server import RequestContext
from coordinator.acls import AclOperation, ResourceType
from coordinator.group_config import (
    DLQ_AUTO_CREATE_TOPICS_ENABLE,
    DLQ_TOPIC_NAME,
    DLQ_TOPIC_NAME_PREFIX,
    AlterConfigOp,
    check_dead_letter_topic,
)
from coordinator.metadata import ClusterState, MetadataStore, Record, Topic
from protocol.configs import ConfigDef, ConfigType
from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from broker.handlers.requests import DescribeConfigsRequest, IncrementalAlterConfigsRequest
    from coordinator.group_coordinator import GroupCoordinator

log = structlog.get_logger("spool.configs")


class ConfigsBroker(Guarded, Protocol):
    """What the config handlers use of the broker."""

    @property
    def config(self) -> BrokerConfig: ...
    @property
    def node_id(self) -> int: ...
    @property
    def metadata(self) -> MetadataStore: ...
    @property
    def logs(self) -> LogManager: ...
    @property
    def groups(self) -> GroupCoordinator: ...


# ConfigResource types.
TOPIC, BROKER, GROUP = 2, 4, 32
# Per config resource type: the ACL resource checked (by the config resource's name, or
# the cluster's), and the code and message of a denial.
_GUARDS: dict[int, tuple[ResourceType, ErrorCode, str]] = {
    TOPIC: (ResourceType.TOPIC, ErrorCode.topic_authorization_failed, TOPIC_DENIED),
    BROKER: (ResourceType.CLUSTER, ErrorCode.cluster_authorization_failed, CLUSTER_DENIED),
    GROUP: (ResourceType.GROUP, ErrorCode.group_authorization_failed, GROUP_DENIED),
}


def _check_access(
    ctx: RequestContext,
    broker: ConfigsBroker,
    operation: AclOperation,
    resource_type: int,
    name: str,
) -> None:
    """Raise the resource's *_AUTHORIZATION_FAILED unless `operation` is allowed on it
    (resource types spool does not serve are left to the caller's INVALID_REQUEST)."""
    guard = _GUARDS.get(resource_type)
    if guard is None:
        return
    acl_type, code, message = guard
    allowed = (
        broker.authorizer.allows(ctx, operation, acl_type)
        if acl_type is ResourceType.CLUSTER
        else broker.authorizer.allows(ctx, operation, acl_type, name)
    )
    if not allowed:
        raise KafkaError(code, message)


# IncrementalAlterConfigs operations.
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3


class _Detail(NamedTuple):
    """What a DescribeConfigs request asks for beyond names and values."""

    synonyms: bool
    documentation: bool  # v3+


if TYPE_CHECKING:
    # For annotations only: reading them at import would load the schema module.
    Described = resp.describe_configs_v4.DescribeConfigsResourceResult
    Synonym = resp.describe_configs_v4.DescribeConfigsSynonym


def _synonym(name: str, value: str | None, source: int) -> Synonym:
    return resp.describe_configs_v4.DescribeConfigsSynonym(
        name=name, value=value, source=i8(source)
    )


def _entry(
    key: ConfigDef, value: Any, source: int, synonyms: list[Synonym], detail: _Detail
) -> Described:
    return resp.describe_configs_v4.DescribeConfigsResourceResult(
        name=key.name,
        # Kafka never sends a password's value (ssl.key.password, ...), nor its synonyms'.
        value=None if key.sensitive else format_value(value),
        read_only=key.read_only,
        config_source=i8(source),
        is_sensitive=key.sensitive,
        synonyms=() if key.sensitive or not detail.synonyms else tuple(synonyms),
        config_type=i8(key.type),
        documentation=key.doc if detail.documentation else None,
    )


def apply_ops(
    current: dict[str, str], ops: Sequence[AlterConfigOp], keys: dict[str, ConfigDef], resource: str
) -> dict[str, str]:
    """Apply IncrementalAlterConfigs operations to a copy of `current`."""
    updated = dict(current)
    for op in ops:
        key = keys.get(op.name)
        if key is None:
            raise KafkaError(ErrorCode.invalid_config, f"Unknown {resource} config name: {op.name}")
        if key.read_only:
            raise KafkaError(
                ErrorCode.invalid_config,
                f"Cannot update {resource} config {op.name}: it is read-only",
            )
        if op.op == SET:
            if op.value is None:
                raise KafkaError(ErrorCode.invalid_config, f"Null value for {op.name}")
            updated[op.name] = format_value(parse_value(key, op.value, resource=resource)) or ""
        elif op.op == DELETE:
            updated.pop(op.name, None)
        elif op.op in (APPEND, SUBTRACT):
            if key.type != ConfigType.LIST:
                raise KafkaError(
                    ErrorCode.invalid_config,
                    f"Config {op.name} is not a list, so APPEND/SUBTRACT do not apply",
                )
            items = [v for v in updated.get(op.name, str(key.default or "")).split(",") if v]
            values = [v.strip() for v in (op.value or "").split(",") if v.strip()]
            if op.op == APPEND:
                items += [v for v in values if v not in items]
            else:
                items = [v for v in items if v not in values]
            joined = ",".join(items)
            updated[op.name] = format_value(parse_value(key, joined, resource=resource)) or ""
        else:
            raise KafkaError(
                ErrorCode.invalid_request,
                f"Unknown config operation {op.op} for {op.name}",
            )
    return updated


def _check_broker_name(broker: ConfigsBroker, name: str) -> None:
    if name not in ("", str(broker.node_id)):
        raise KafkaError(
            ErrorCode.invalid_request,
            f"Unexpected broker id {name!r}; this is broker {broker.node_id}",
        )


def _describe_topic(broker: ConfigsBroker, name: str, detail: _Detail) -> list[Described]:
    topic = broker.metadata.state.topics.get(name)
    if topic is None:
        raise KafkaError(ErrorCode.unknown_topic_or_partition, f"Topic {name!r} does not exist")
    settings = broker.logs.topic_settings(topic.configs)
    out = []
    for config, key in sorted(TOPIC_KEYS.items()):
        synonyms = []
        if config in topic.configs:
            source = SOURCE_DYNAMIC_TOPIC
            synonyms.append(_synonym(config, topic.configs[config], SOURCE_DYNAMIC_TOPIC))
        else:
            source = SOURCE_DEFAULT
        if key.broker_synonym:
            bsrc = broker.config.source(key.broker_synonym)
            if bsrc != SOURCE_DEFAULT:
                if config not in topic.configs:
                    source = bsrc
                synonyms.append(
                    _synonym(
                        key.broker_synonym,
                        format_value(broker.config.get(key.broker_synonym)),
                        bsrc,
                    )
                )
            synonyms.append(
                _synonym(
                    key.broker_synonym,
                    format_value(BROKER_KEYS[key.broker_synonym].default),
                    SOURCE_DEFAULT,
                )
            )
        out.append(_entry(key, settings[config], source, synonyms, detail))
    return out


def _describe_broker(broker: ConfigsBroker, name: str, detail: _Detail) -> list[Described]:
    _check_broker_name(broker, name)
    out = []
    for config, key in sorted(BROKER_KEYS.items()):
        source = broker.config.source(config)
        synonyms = [_synonym(config, format_value(broker.config.get(config)), source)]
        out.append(_entry(key, broker.config.get(config), source, synonyms, detail))
    return out


def _describe_group(broker: ConfigsBroker, name: str, detail: _Detail) -> list[Described]:
    if not name:
        raise KafkaError(ErrorCode.invalid_group_id, "Group id must not be empty")
    out = []
    # From the cluster metadata, which every broker follows: any broker answers.
    for e in broker.metadata.state.group_configs.describe(name):
        out.append(
            resp.describe_configs_v4.DescribeConfigsResourceResult(
                name=e.name,
                value=e.value,
                read_only=False,
                config_source=i8(e.source),
                is_sensitive=False,
                synonyms=(_synonym(e.name, e.value, e.source),) if detail.synonyms else (),
                config_type=i8(e.type),
                documentation=e.doc if detail.documentation else None,
            )
        )
    return out


async def describe_configs(
    ctx: RequestContext, req: DescribeConfigsRequest, broker: ConfigsBroker
) -> resp.describe_configs_v4.DescribeConfigsResponse:
    m = resp.describe_configs_v4
    detail = _Detail(req.include_synonyms, getattr(req, "include_documentation", False))
    results = []
    for res in req.resources:
        configs: list[Described] = []
        code, message = ErrorCode.none, None
        try:
            _check_access(
                ctx, broker, AclOperation.DESCRIBE_CONFIGS, res.resource_type, res.resource_name
            )
            if res.resource_type == TOPIC:
                configs = _describe_topic(broker, res.resource_name, detail)
            elif res.resource_type == BROKER:
                configs = _describe_broker(broker, res.resource_name, detail)
            elif res.resource_type == GROUP:
                configs = _describe_group(broker, res.resource_name, detail)
            else:
                raise KafkaError(
                    ErrorCode.invalid_request, f"Unsupported resource type {res.resource_type}"
                )
            if res.configuration_keys is not None:
                wanted = set(res.configuration_keys)
                configs = [c for c in configs if c.name in wanted]
        except KafkaError as exc:
            configs, code, message = [], exc.code, exc.message
        results.append(
            m.DescribeConfigsResult(
                error_code=code,
                error_message=message,
                resource_type=res.resource_type,
                resource_name=res.resource_name,
                configs=tuple(configs),
            )
        )
    return m.DescribeConfigsResponse(throttle_time=NO_THROTTLE, results=tuple(results))


async def _alter_topic(
    broker: ConfigsBroker, name: str, ops: list[AlterConfigOp], validate_only: bool
) -> None:
    """One metadata operation: the ops apply to the topic's configs as the changes
    before this one left them, checked and written in one turn, so requests altering
    different keys at once all keep theirs (Kafka writes one ConfigRecord per key from
    the configs as they are at the request's controller event,
    ConfigurationControlManager.incrementalAlterConfigResource). validate_only checks
    in the same turn and writes nothing (QuorumController.incrementalAlterConfigs)."""
    state = broker.metadata.state

    def update(configs: dict[str, str]) -> dict[str, str]:
        return validate_topic_configs(dict(apply_ops(configs, ops, TOPIC_KEYS, "topic")))

    def op() -> tuple[list[Record], Topic | None]:
        topic, record = state.topic_configs_record(name, update)
        if validate_only or record is None:
            return [], None
        return [record], topic

    def applied(topic: Topic | None) -> None:
        if topic is not None:
            broker.logs.reconfigure_topic(topic.name, topic.configs)
            log.info("topic_config_altered", topic=topic.name, configs=topic.configs)

    await broker.metadata.run(op, applied=applied)


async def _alter_broker(
    broker: ConfigsBroker, name: str, ops: list[AlterConfigOp], validate_only: bool
) -> None:
    """One metadata operation, as `_alter_topic`, over the dynamic broker configs: the
    cluster-wide defaults for the resource "" (every broker of the cluster applies
    them), this broker's own for its node id (taking precedence over the defaults)."""
    _check_broker_name(broker, name)
    state = broker.metadata.state

    def op() -> tuple[list[Record], dict[str, str] | None]:
        updated, record = state.broker_configs_record(
            lambda configs: apply_ops(configs, ops, BROKER_KEYS, "broker"), name or None
        )
        return ([], None) if validate_only else ([record], updated)

    def applied(updated: dict[str, str] | None) -> None:
        if updated is not None:
            apply_dynamic_broker_config(broker)
            log.info("broker_config_altered", configs=updated)

    await broker.metadata.run(op, applied=applied)


async def _alter_group(
    broker: ConfigsBroker, name: str, ops: list[AlterConfigOp], validate_only: bool
) -> None:
    """A metadata change (Kafka forwards it to its controller): any broker. Setting the
    dead-letter topic also checks the topic (see the module docstring)."""
    dead_letter = next((op for op in ops if op.name == DLQ_TOPIC_NAME and op.op == SET), None)
    check = None
    if dead_letter is not None and dead_letter.value:
        topic_name = dead_letter.value

        def check(state: ClusterState) -> None:
            topic = state.topics.get(topic_name)
            subscribed, with_state = broker.groups.share_group_topics(name)
            consumed = subscribed | {
                state.topics_by_id[topic_id].name
                for topic_id in with_state
                if topic_id in state.topics_by_id
            }
            check_dead_letter_topic(
                name,
                topic_name,
                prefix=broker.config.get(DLQ_TOPIC_NAME_PREFIX),
                auto_create=broker.config.get(DLQ_AUTO_CREATE_TOPICS_ENABLE),
                topic_configs=None if topic is None else topic.configs,
                consumed=consumed,
            )

    await broker.metadata.alter_group_configs(name, ops, validate_only, check)


async def incremental_alter_configs(
    ctx: RequestContext, req: IncrementalAlterConfigsRequest, broker: ConfigsBroker
) -> resp.incremental_alter_configs_v1.IncrementalAlterConfigsResponse:
    m = resp.incremental_alter_configs_v1
    responses = []
    for res in req.resources:
        code, message = ErrorCode.none, None
        try:
            _check_access(
                ctx, broker, AclOperation.ALTER_CONFIGS, res.resource_type, res.resource_name
            )
            ops = [AlterConfigOp(c.name, c.config_operation, c.value) for c in res.configs]
            names = [op.name for op in ops]
            if len(names) != len(set(names)):
                raise KafkaError(
                    ErrorCode.invalid_request,
                    "A config name appears more than once for one resource",
                )
            if res.resource_type == TOPIC:
                await _alter_topic(broker, res.resource_name, ops, req.validate_only)
            elif res.resource_type == BROKER:
                await _alter_broker(broker, res.resource_name, ops, req.validate_only)
            elif res.resource_type == GROUP:
                await _alter_group(broker, res.resource_name, ops, req.validate_only)
            else:
                raise KafkaError(
                    ErrorCode.invalid_request, f"Unsupported resource type {res.resource_type}"
                )
        except KafkaError as exc:
            code, message = exc.code, exc.message
        responses.append(
            m.AlterConfigsResourceResponse(
                error_code=code,
                error_message=message,
                resource_type=res.resource_type,
                resource_name=res.resource_name,
            )
        )
    return m.IncrementalAlterConfigsResponse(throttle_time=NO_THROTTLE, responses=tuple(responses))


def apply_dynamic_broker_config(broker: ConfigsBroker) -> None:
    """Make the stored dynamic broker configs live (the cluster-wide defaults and this
    broker's own), and re-derive topic settings."""
    state = broker.metadata.state

    def parsed(configs: dict[str, str]) -> dict[str, Any]:
        return {
            name: parse_value(BROKER_KEYS[name], value, resource="broker")
            for name, value in configs.items()
            if name in BROKER_KEYS
        }

    broker.config.dynamic_default = parsed(state.broker_configs)
    broker.config.dynamic = parsed(state.node_broker_configs.get(str(broker.node_id), {}))
    for topic in broker.metadata.state.topics.values():
        broker.logs.reconfigure_topic(topic.name, topic.configs)
    # The group.share.* defaults and bounds the group configs are read and checked with.
    state.group_configs.broker = broker.config.share_groups()
    # And the group.consumer.* ones for the consumer.* group configs.
    state.group_configs.coordinator = broker.config.group_coordinator()
