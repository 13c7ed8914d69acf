"""Topic and config administration through confluent-kafka's AdminClient."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import (
    KafkaError,
    KafkaException,
    Producer,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    ResourceType,
)

from tests.integration.conftest import (
    ADMIN_TIMEOUT_S,
    BOTH_STORAGES,
    Broker,
    admin_config,
    consume_assigned,
    create_topic,
    produce,
    producer_config,
    wait_for_partitions,
    watermarks,
)

_clients: weakref.WeakKeyDictionary[Broker, AdminClient] = weakref.WeakKeyDictionary()


def admin(broker: Broker) -> AdminClient:
    """One AdminClient per broker, kept alive: a destroyed client fails its futures."""
    if broker not in _clients:
        _clients[broker] = AdminClient(admin_config(broker))
    return _clients[broker]


def error_of(future: Any) -> int | None:
    """The Kafka error code a future fails with, or None if it succeeds."""
    try:
        future.result(timeout=ADMIN_TIMEOUT_S)
    except KafkaException as e:
        return int(e.args[0].code())
    return None


def topic_names(broker: Broker) -> set[str]:
    return set(admin(broker).list_topics(timeout=10).topics)


def topic_configs(broker: Broker, topic: str) -> dict[str, ConfigEntry]:
    resource = ConfigResource(ResourceType.TOPIC, topic)
    result: dict[str, ConfigEntry] = (
        admin(broker).describe_configs([resource])[resource].result(timeout=ADMIN_TIMEOUT_S)
    )
    return result


def alter_topic(broker: Broker, topic: str, *entries: ConfigEntry) -> int | None:
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=list(entries))
    return error_of(admin(broker).incremental_alter_configs([resource])[resource])


def topic_id(broker: Broker, topic: str) -> str:
    futures = admin(broker).describe_topics(TopicCollection([topic]))
    return str(futures[topic].result(timeout=ADMIN_TIMEOUT_S).topic_id)


def fill(broker: Broker, topic: str, partitions: int, per_partition: int) -> None:
    records = [
        (p, None, f"p{p}-{i}".encode(), []) for p in range(partitions) for i in range(per_partition)
    ]
    outcome = produce(Producer(producer_config(broker)), topic, records)
    assert outcome.errors == [] and outcome.unflushed == 0


@BOTH_STORAGES
def test_create_topic_and_create_errors(broker: Broker) -> None:
    client = admin(broker)
    new = client.create_topics([NewTopic("orders", 3, 1)], request_timeout=ADMIN_TIMEOUT_S)
    assert error_of(new["orders"]) is None
    wait_for_partitions(broker, "orders", 3)

    again = client.create_topics([NewTopic("orders", 3, 1)], request_timeout=ADMIN_TIMEOUT_S)
    assert error_of(again["orders"]) == KafkaError.TOPIC_ALREADY_EXISTS

    zero = client.create_topics([NewTopic("no-parts", 0, 1)], request_timeout=ADMIN_TIMEOUT_S)
    assert error_of(zero["no-parts"]) == KafkaError.INVALID_PARTITIONS

    # One node: a replication factor of 3 cannot be met.
    rf3 = client.create_topics([NewTopic("rf3", 1, 3)], request_timeout=ADMIN_TIMEOUT_S)
    assert error_of(rf3["rf3"]) == KafkaError.INVALID_REPLICATION_FACTOR

    dry = client.create_topics(
        [NewTopic("dry-run", 2, 1)], validate_only=True, request_timeout=ADMIN_TIMEOUT_S
    )
    assert error_of(dry["dry-run"]) is None

    names = topic_names(broker)
    assert "orders" in names
    assert not {"no-parts", "rf3", "dry-run"} & names


def test_default_partitions_come_from_num_partitions(
    broker_factory: Callable[..., Broker],
) -> None:
    broker = broker_factory({"num.partitions": "4"})
    futures = admin(broker).create_topics(
        [NewTopic("defaulted", -1, -1)], request_timeout=ADMIN_TIMEOUT_S
    )
    assert error_of(futures["defaulted"]) is None
    wait_for_partitions(broker, "defaulted", 4)


@BOTH_STORAGES
def test_delete_topic_removes_it_and_recreated_topic_is_empty_with_new_id(
    broker: Broker,
) -> None:
    create_topic(broker, "doomed", partitions=2)
    fill(broker, "doomed", 2, 10)
    old_id = topic_id(broker, "doomed")

    futures = admin(broker).delete_topics(["doomed"], request_timeout=ADMIN_TIMEOUT_S)
    assert error_of(futures["doomed"]) is None
    assert "doomed" not in topic_names(broker)

    missing = admin(broker).delete_topics(["never-was"], request_timeout=ADMIN_TIMEOUT_S)
    assert error_of(missing["never-was"]) == KafkaError.UNKNOWN_TOPIC_OR_PART

    create_topic(broker, "doomed", partitions=1)
    assert watermarks(broker, "doomed", 0) == (0, 0)
    assert topic_id(broker, "doomed") != old_id


@BOTH_STORAGES
def test_create_partitions_grows_topic_and_rejects_shrinking(broker: Broker) -> None:
    create_topic(broker, "growing", partitions=2)
    client = admin(broker)
    grow = client.create_partitions([NewPartitions("growing", 5)], request_timeout=30)
    assert error_of(grow["growing"]) is None
    wait_for_partitions(broker, "growing", 5)

    outcome = produce(Producer(producer_config(broker)), "growing", [(4, b"k", b"new", [])])
    assert outcome.errors == [] and [(s.partition, s.offset) for s in outcome.acked] == [(4, 0)]

    shrink = client.create_partitions([NewPartitions("growing", 3)], request_timeout=30)
    assert error_of(shrink["growing"]) == KafkaError.INVALID_PARTITIONS
    unknown = client.create_partitions([NewPartitions("nope", 3)], request_timeout=30)
    assert error_of(unknown["nope"]) == KafkaError.UNKNOWN_TOPIC_OR_PART
    wait_for_partitions(broker, "growing", 5)


@BOTH_STORAGES
def test_topic_configs_set_at_create_altered_and_deleted(broker: Broker) -> None:
    create_topic(broker, "configured", config={"retention.ms": "3600000"})
    configs = topic_configs(broker, "configured")
    assert configs["retention.ms"].value == "3600000"
    assert ConfigSource(configs["retention.ms"].source) == ConfigSource.DYNAMIC_TOPIC_CONFIG
    assert configs["cleanup.policy"].value == "delete"
    assert configs["max.message.bytes"].is_default

    err = alter_topic(
        broker,
        "configured",
        ConfigEntry("retention.ms", "7200000", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("segment.bytes", "1048576", incremental_operation=AlterConfigOpType.SET),
    )
    assert err is None
    configs = topic_configs(broker, "configured")
    assert configs["retention.ms"].value == "7200000"
    assert configs["segment.bytes"].value == "1048576"
    assert ConfigSource(configs["segment.bytes"].source) == ConfigSource.DYNAMIC_TOPIC_CONFIG

    err = alter_topic(
        broker,
        "configured",
        ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE),
    )
    assert err is None
    configs = topic_configs(broker, "configured")
    assert configs["retention.ms"].value == "604800000"  # back to log.retention.ms
    assert ConfigSource(configs["retention.ms"].source) != ConfigSource.DYNAMIC_TOPIC_CONFIG


def test_bad_topic_config_alterations_are_rejected(broker: Broker) -> None:
    create_topic(broker, "strict")
    unknown_key = alter_topic(
        broker,
        "strict",
        ConfigEntry("no.such.config", "1", incremental_operation=AlterConfigOpType.SET),
    )
    assert unknown_key == KafkaError.INVALID_CONFIG
    bad_value = alter_topic(
        broker,
        "strict",
        ConfigEntry("retention.ms", "soon", incremental_operation=AlterConfigOpType.SET),
    )
    assert bad_value == KafkaError.INVALID_CONFIG
    unknown_topic = alter_topic(
        broker,
        "absent",
        ConfigEntry("retention.ms", "1000", incremental_operation=AlterConfigOpType.SET),
    )
    assert unknown_topic == KafkaError.UNKNOWN_TOPIC_OR_PART
    # Nothing changed.
    assert topic_configs(broker, "strict")["retention.ms"].value == "604800000"


def test_describe_broker_configs_show_set_and_default_values(
    broker_factory: Callable[..., Broker],
) -> None:
    broker = broker_factory({"num.partitions": "3", "log.segment.bytes": "1048576"})
    resource = ConfigResource(ResourceType.BROKER, "1")
    configs = admin(broker).describe_configs([resource])[resource].result(timeout=30)
    assert configs["num.partitions"].value == "3"
    assert configs["log.segment.bytes"].value == "1048576"
    assert ConfigSource(configs["num.partitions"].source) == ConfigSource.STATIC_BROKER_CONFIG
    assert configs["message.max.bytes"].value == "1048588"
    assert ConfigSource(configs["message.max.bytes"].source) == ConfigSource.DEFAULT_CONFIG


def test_describe_cluster_reports_the_single_node(broker: Broker) -> None:
    cluster = admin(broker).describe_cluster(request_timeout=30).result(timeout=30)
    assert cluster.cluster_id
    assert [(n.id, n.host, n.port) for n in cluster.nodes] == [(1, broker.host, broker.port)]
    assert cluster.controller is not None and cluster.controller.id == 1


@BOTH_STORAGES
def test_delete_records_moves_low_watermark(broker: Broker) -> None:
    create_topic(broker, "trimmed", partitions=2)
    fill(broker, "trimmed", 2, 100)

    futures = admin(broker).delete_records(
        [TopicPartition("trimmed", 0, 40), TopicPartition("trimmed", 1, -1)],  # -1: to the end
        request_timeout=30,
    )
    results = {tp.partition: f.result(timeout=30) for tp, f in futures.items()}
    assert results[0].low_watermark == 40
    assert results[1].low_watermark == 100
    assert watermarks(broker, "trimmed", 0) == (40, 100)
    assert watermarks(broker, "trimmed", 1) == (100, 100)

    got = consume_assigned(broker, "trimmed", [0], 60, timeout=30)
    assert [r.offset for r in got] == list(range(40, 100))
    assert got[0].value == b"p0-40"

    beyond = admin(broker).delete_records([TopicPartition("trimmed", 0, 500)], request_timeout=30)
    [future] = beyond.values()
    assert error_of(future) == KafkaError.OFFSET_OUT_OF_RANGE
    assert watermarks(broker, "trimmed", 0) == (40, 100)


@BOTH_STORAGES
@pytest.mark.timeout(180)
def test_topics_configs_and_log_start_survive_restart(broker: Broker) -> None:
    create_topic(broker, "kept", partitions=2, config={"retention.ms": "3600000"})
    create_topic(broker, "removed")
    fill(broker, "kept", 2, 50)
    assert (
        error_of(
            admin(broker).create_partitions([NewPartitions("kept", 3)], request_timeout=30)["kept"]
        )
        is None
    )
    wait_for_partitions(broker, "kept", 3)
    assert (
        alter_topic(
            broker,
            "kept",
            ConfigEntry(
                "max.message.bytes", "2000000", incremental_operation=AlterConfigOpType.SET
            ),
        )
        is None
    )
    [trim] = admin(broker).delete_records([TopicPartition("kept", 1, 20)]).values()
    trim.result(timeout=30)
    assert error_of(admin(broker).delete_topics(["removed"])["removed"]) is None
    kept_id = topic_id(broker, "kept")

    broker.restart()

    names = topic_names(broker)
    assert "kept" in names and "removed" not in names
    wait_for_partitions(broker, "kept", 3)
    assert topic_id(broker, "kept") == kept_id
    configs = topic_configs(broker, "kept")
    assert configs["retention.ms"].value == "3600000"
    assert configs["max.message.bytes"].value == "2000000"
    assert watermarks(broker, "kept", 0) == (0, 50)
    assert watermarks(broker, "kept", 1) == (20, 50)
    assert watermarks(broker, "kept", 2) == (0, 0)
