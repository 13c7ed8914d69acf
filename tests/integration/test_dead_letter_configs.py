"""KIP-1191's configuration against real broker processes: a share group names its
dead-letter topic with IncrementalAlterConfigs on the GROUP resource (confluent-kafka's
AdminClient), and the broker refuses with INVALID_CONFIG, saying which key and why, a
topic without `errors.deadletterqueue.group.enable=true`, without the broker's
`errors.deadletterqueue.topic.name.prefix`, one that does not exist, or one the group
itself consumes; a valid one is stored, described, and shown by `spool share-groups
--describe`; the broker keys change what is allowed."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
)

from tests.integration.cli_helpers import ok
from tests.integration.conftest import (
    ADMIN_TIMEOUT_S,
    BOTH_STORAGES,
    Broker,
    admin_config,
    create_topic,
)
from tests.integration.share_helpers import accept_until, earliest, produce_values

DLQ_TOPIC = "errors.deadletterqueue.topic.name"
COPY_RECORD = "errors.deadletterqueue.copy.record.enable"
OPT_IN = "errors.deadletterqueue.group.enable"
PREFIX = "errors.deadletterqueue.topic.name.prefix"
AUTO_CREATE = "errors.deadletterqueue.auto.create.topics.enable"


def alter(
    broker: Broker,
    kind: str,
    name: str,
    configs: dict[str, str],
    *,
    validate_only: bool = False,
) -> KafkaError | None:
    """IncrementalAlterConfigs SET of `configs` on one resource; its error, if any."""
    admin = AdminClient(admin_config(broker))
    resource = ConfigResource(
        kind,
        name,
        incremental_configs=[
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
            for k, v in configs.items()
        ],
    )
    (future,) = admin.incremental_alter_configs(
        [resource], request_timeout=ADMIN_TIMEOUT_S, validate_only=validate_only
    ).values()
    try:
        future.result(timeout=ADMIN_TIMEOUT_S)
    except KafkaException as exc:
        error: KafkaError = exc.args[0]
        return error
    return None


def refused(broker: Broker, group: str, topic: str, **kw: bool) -> str:
    """Setting `topic` as `group`'s dead-letter topic is refused with INVALID_CONFIG
    naming the key; the message."""
    error = alter(broker, "GROUP", group, {DLQ_TOPIC: topic}, **kw)
    assert error is not None, f"{topic} was accepted"
    assert error.code() == KafkaError.INVALID_CONFIG, error
    message = error.str()
    assert DLQ_TOPIC in message and topic in message, message
    return message


def described(broker: Broker, kind: str, name: str) -> dict[str, ConfigEntry]:
    admin = AdminClient(admin_config(broker))
    (future,) = admin.describe_configs(
        [ConfigResource(kind, name)], request_timeout=ADMIN_TIMEOUT_S
    ).values()
    entries: dict[str, ConfigEntry] = future.result(timeout=ADMIN_TIMEOUT_S)
    return entries


@BOTH_STORAGES
@pytest.mark.timeout(180)
def test_a_group_names_only_an_opted_in_prefixed_topic_it_does_not_consume(
    broker_factory: Callable[..., Broker],
) -> None:
    broker = broker_factory()
    group = "dlq-cfg-group"
    create_topic(broker, "dlq.closed")  # no opt-in
    create_topic(broker, "orders-dead", config={OPT_IN: "true"})  # no prefix
    create_topic(broker, "dlq.source", config={OPT_IN: "true"})  # the group reads it
    create_topic(broker, "dlq.orders", config={OPT_IN: "true"})
    # The group consumes dlq.source: it has share state on it once it has read one record.
    earliest(broker, group)
    produce_values(broker, "dlq.source", [b"one"])
    assert len(accept_until(broker, group, ["dlq.source"], 1).deliveries) == 1

    message = refused(broker, group, "dlq.closed")
    assert f"does not have {OPT_IN}=true" in message
    message = refused(broker, group, "orders-dead")
    assert "must start with 'dlq.'" in message and PREFIX in message
    message = refused(broker, group, "dlq.missing")
    assert "does not exist" in message and AUTO_CREATE in message
    message = refused(broker, group, "dlq.source")
    assert f"share group '{group}' consumes" in message
    message = refused(broker, group, "__consumer_offsets")
    assert "'__'" in message
    # validateOnly answers the same.
    assert "does not exist" in refused(broker, group, "dlq.missing", validate_only=True)
    assert alter(broker, "GROUP", group, {DLQ_TOPIC: "dlq.orders"}, validate_only=True) is None

    # Nothing was stored, and the broker serves on.
    entries = described(broker, "GROUP", group)
    assert entries[DLQ_TOPIC].value == ""
    assert entries[DLQ_TOPIC].source == ConfigSource.DEFAULT_CONFIG.value
    assert entries[COPY_RECORD].value == "false"

    assert alter(broker, "GROUP", group, {DLQ_TOPIC: "dlq.orders", COPY_RECORD: "true"}) is None
    entries = described(broker, "GROUP", group)
    assert entries[DLQ_TOPIC].value == "dlq.orders"
    assert entries[DLQ_TOPIC].source == ConfigSource.GROUP_CONFIG.value
    assert entries[COPY_RECORD].value == "true"
    topic = described(broker, "TOPIC", "dlq.orders")[OPT_IN]
    assert (topic.value, topic.source) == ("true", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert described(broker, "TOPIC", "dlq.closed")[OPT_IN].value == "false"

    # `spool share-groups --describe` names it, under the offsets and the state.
    line = f"Share group '{group}' dead-letter topic: dlq.orders"
    assert line in ok(broker, "share-groups", "--describe", "--group", group).splitlines()
    state = ok(broker, "share-groups", "--describe", "--state", "--group", group)
    assert line in state.splitlines()
    json_state = ok(
        broker, "share-groups", "--describe", "--state", "--group", group, "--output", "json"
    )
    assert '"dead_letter_topic": "dlq.orders"' in json_state

    # It survives a restart; "" turns it off.
    broker.stop()
    broker.start()
    assert described(broker, "GROUP", group)[DLQ_TOPIC].value == "dlq.orders"
    assert alter(broker, "GROUP", group, {DLQ_TOPIC: ""}) is None
    assert described(broker, "GROUP", group)[DLQ_TOPIC].value == ""
    assert "dead-letter topic" not in ok(broker, "share-groups", "--describe", "--group", group)


@pytest.mark.timeout(120)
def test_the_broker_prefix_and_auto_create_change_what_a_group_may_name(
    broker_factory: Callable[..., Broker],
) -> None:
    broker = broker_factory(
        {PREFIX: "dead."}, env={"SPOOL_ERRORS_DEADLETTERQUEUE_AUTO_CREATE_TOPICS_ENABLE": "true"}
    )
    broker_keys = described(broker, "BROKER", "1")
    assert broker_keys[PREFIX].value == "dead."
    assert broker_keys[AUTO_CREATE].value == "true"
    create_topic(broker, "dlq.letters", config={OPT_IN: "true"})
    create_topic(broker, "dead.letters", config={OPT_IN: "true"})

    assert "must start with 'dead.'" in refused(broker, "g1", "dlq.letters")
    assert alter(broker, "GROUP", "g1", {DLQ_TOPIC: "dead.letters"}) is None
    # Auto-create on: a prefixed topic that does not exist yet may be named.
    assert alter(broker, "GROUP", "g2", {DLQ_TOPIC: "dead.later"}) is None

    # The prefix is dynamic: "" for this broker lifts the restriction at once.
    assert alter(broker, "BROKER", "1", {PREFIX: ""}) is None
    assert described(broker, "BROKER", "1")[PREFIX].value == ""
    assert alter(broker, "GROUP", "g1", {DLQ_TOPIC: "dlq.letters"}) is None
    assert described(broker, "GROUP", "g1")[DLQ_TOPIC].value == "dlq.letters"
