"""DescribeConfigs and IncrementalAlterConfigs for TOPIC and BROKER resources."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import structlog

from broker.cluster import Topic, topic_record
from broker.config import (
    BOOLEAN,
    BROKER_KEYS,
    INT,
    SOURCE_DEFAULT,
    SOURCE_DYNAMIC_TOPIC,
    STRING,
    TOPIC_KEYS,
    ConfigKey,
    format_value,
    parse_value,
)
from broker.handlers.topics import validate_topic_configs
from broker.server import RequestContext
from coordinator.group_config import AlterConfigOp
from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from broker.broker import Broker

log = structlog.get_logger("spool.configs")

_GROUP_TYPES = {"boolean": BOOLEAN, "string": STRING, "int": INT}

# ConfigResource types.
TOPIC, BROKER, GROUP = 2, 4, 32
# IncrementalAlterConfigs operations.
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3


def _entry(
    key: ConfigKey, value: Any, source: int, synonyms: list[dict[str, Any]], req: Any
) -> dict[str, Any]:
    return {
        "name": key.name,
        "value": format_value(value),
        "read_only": key.read_only,
        "config_source": source,
        "is_sensitive": False,
        "synonyms": synonyms if getattr(req, "include_synonyms", False) else [],
        "config_type": key.type,
        "documentation": key.doc if getattr(req, "include_documentation", False) else None,
    }


def apply_ops(
    current: dict[str, str], ops: list[Any], keys: dict[str, ConfigKey], resource: str
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
        if op.config_operation == SET:
            if op.value is None:
                raise KafkaError(ErrorCode.invalid_config, f"Null value for {op.name}")
            updated[op.name] = format_value(parse_value(key, op.value, resource=resource)) or ""
        elif op.config_operation == DELETE:
            updated.pop(op.name, None)
        elif op.config_operation in (APPEND, SUBTRACT):
            if key.type != 7:
                raise KafkaError(
                    ErrorCode.invalid_config,
                    f"Config {op.name} is not a list, so APPEND/SUBTRACT do not apply",
                )
            items = [v for v in updated.get(op.name, str(key.default or "")).split(",") if v]
            values = [v.strip() for v in (op.value or "").split(",") if v.strip()]
            if op.config_operation == APPEND:
                items += [v for v in values if v not in items]
            else:
                items = [v for v in items if v not in values]
            joined = ",".join(items)
            updated[op.name] = format_value(parse_value(key, joined, resource=resource)) or ""
        else:
            raise KafkaError(
                ErrorCode.invalid_request,
                f"Unknown config operation {op.config_operation} for {op.name}",
            )
    return updated


def register(broker: Broker) -> None:
    def check_broker_name(name: str) -> None:
        if name not in ("", str(broker.node_id)):
            raise KafkaError(
                ErrorCode.invalid_request,
                f"Unexpected broker id {name!r}; this is broker {broker.node_id}",
            )

    def describe_topic(req: Any, res: Any) -> list[dict[str, Any]]:
        topic = broker.metadata.state.topics.get(res.resource_name)
        if topic is None:
            raise KafkaError(
                ErrorCode.unknown_topic_or_partition, f"Topic {res.resource_name!r} does not exist"
            )
        settings = broker.logs.topic_settings(topic.configs)
        out = []
        for name, key in sorted(TOPIC_KEYS.items()):
            synonyms = []
            if name in topic.configs:
                source = SOURCE_DYNAMIC_TOPIC
                synonyms.append(
                    {"name": name, "value": topic.configs[name], "source": SOURCE_DYNAMIC_TOPIC}
                )
            else:
                source = SOURCE_DEFAULT
            if key.broker_synonym:
                bsrc = broker.config.source(key.broker_synonym)
                if bsrc != SOURCE_DEFAULT:
                    if name not in topic.configs:
                        source = bsrc
                    synonyms.append(
                        {
                            "name": key.broker_synonym,
                            "value": format_value(broker.config.get(key.broker_synonym)),
                            "source": bsrc,
                        }
                    )
                synonyms.append(
                    {
                        "name": key.broker_synonym,
                        "value": format_value(BROKER_KEYS[key.broker_synonym].default),
                        "source": SOURCE_DEFAULT,
                    }
                )
            out.append(_entry(key, settings[name], source, synonyms, req))
        return out

    def describe_broker(req: Any, res: Any) -> list[dict[str, Any]]:
        check_broker_name(res.resource_name)
        out = []
        for name, key in sorted(BROKER_KEYS.items()):
            source = broker.config.source(name)
            synonyms = [
                {"name": name, "value": format_value(broker.config.get(name)), "source": source}
            ]
            out.append(_entry(key, broker.config.get(name), source, synonyms, req))
        return out

    def describe_group(req: Any, res: Any) -> list[dict[str, Any]]:
        if not res.resource_name:
            raise KafkaError(ErrorCode.invalid_group_id, "Group id must not be empty")
        out = []
        for e in broker.groups.configs.describe(res.resource_name):
            out.append(
                {
                    "name": e.name,
                    "value": e.value,
                    "read_only": False,
                    "config_source": e.source,
                    "is_sensitive": False,
                    "synonyms": [{"name": e.name, "value": e.value, "source": e.source}]
                    if getattr(req, "include_synonyms", False)
                    else [],
                    "config_type": _GROUP_TYPES.get(e.type, 2),
                    "documentation": e.doc
                    if getattr(req, "include_documentation", False)
                    else None,
                }
            )
        return out

    async def describe_configs(ctx: RequestContext, req: Any) -> dict[str, Any]:
        results = []
        for res in req.resources:
            entry: dict[str, Any] = {
                "resource_type": res.resource_type,
                "resource_name": res.resource_name,
                "error_code": ErrorCode.none,
            }
            try:
                if res.resource_type == TOPIC:
                    configs = describe_topic(req, res)
                elif res.resource_type == BROKER:
                    configs = describe_broker(req, res)
                elif res.resource_type == GROUP:
                    configs = describe_group(req, res)
                else:
                    raise KafkaError(
                        ErrorCode.invalid_request, f"Unsupported resource type {res.resource_type}"
                    )
                if res.configuration_keys is not None:
                    wanted = set(res.configuration_keys)
                    configs = [c for c in configs if c["name"] in wanted]
                entry["configs"] = configs
            except KafkaError as exc:
                entry.update(error_code=exc.code, error_message=exc.message)
            results.append(entry)
        return {"throttle_time": 0, "results": results}

    async def alter_topic(res: Any, validate_only: bool) -> None:
        topic = broker.metadata.state.topics.get(res.resource_name)
        if topic is None:
            raise KafkaError(
                ErrorCode.unknown_topic_or_partition, f"Topic {res.resource_name!r} does not exist"
            )
        updated = validate_topic_configs(
            dict(apply_ops(topic.configs, res.configs, TOPIC_KEYS, "topic"))
        )
        if validate_only or updated == topic.configs:
            return
        changed = Topic(topic.name, topic.topic_id, topic.partitions, updated)
        await broker.metadata.commit([topic_record(changed)])
        broker.logs.reconfigure_topic(topic.name, updated)
        log.info("topic_config_altered", topic=topic.name, configs=updated)

    async def alter_broker(res: Any, validate_only: bool) -> None:
        check_broker_name(res.resource_name)
        updated = apply_ops(
            broker.metadata.state.broker_configs, res.configs, BROKER_KEYS, "broker"
        )
        if validate_only:
            return
        await broker.metadata.commit([{"type": "broker_config", "configs": updated}])
        apply_dynamic_broker_config(broker)
        log.info("broker_config_altered", configs=updated)

    async def incremental_alter_configs(ctx: RequestContext, req: Any) -> dict[str, Any]:
        responses = []
        for res in req.resources:
            entry: dict[str, Any] = {
                "resource_type": res.resource_type,
                "resource_name": res.resource_name,
                "error_code": ErrorCode.none,
            }
            try:
                names = [c.name for c in res.configs]
                if len(names) != len(set(names)):
                    raise KafkaError(
                        ErrorCode.invalid_request,
                        "A config name appears more than once for one resource",
                    )
                if res.resource_type == TOPIC:
                    await alter_topic(res, req.validate_only)
                elif res.resource_type == BROKER:
                    await alter_broker(res, req.validate_only)
                elif res.resource_type == GROUP:
                    await broker.groups.alter_configs(
                        res.resource_name,
                        [AlterConfigOp(c.name, c.config_operation, c.value) for c in res.configs],
                        req.validate_only,
                    )
                else:
                    raise KafkaError(
                        ErrorCode.invalid_request, f"Unsupported resource type {res.resource_type}"
                    )
            except KafkaError as exc:
                entry.update(error_code=exc.code, error_message=exc.message)
            responses.append(entry)
        return {"throttle_time": 0, "responses": responses}

    broker.table.register(32, 1, 4, describe_configs)
    broker.table.register(44, 0, 1, incremental_alter_configs)


def apply_dynamic_broker_config(broker: Broker) -> None:
    """Make the stored dynamic broker configs live, and re-derive topic settings."""
    broker.config.dynamic = {
        name: parse_value(BROKER_KEYS[name], value, resource="broker")
        for name, value in broker.metadata.state.broker_configs.items()
        if name in BROKER_KEYS
    }
    for topic in broker.metadata.state.topics.values():
        broker.logs.reconfigure_topic(topic.name, topic.configs)
    if hasattr(broker, "groups"):
        broker.groups.configs.broker = broker.config.share_groups()
