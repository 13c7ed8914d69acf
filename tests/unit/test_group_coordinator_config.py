"""The group coordinator's broker keys (Kafka 4.2's GroupCoordinatorConfig: consumer
and classic groups, committed offsets) and the consumer group configs: Kafka's names,
defaults, fixed bounds, the relations checked between keys, and the one frozen object
that carries them."""

from __future__ import annotations

import dataclasses
import re

import pytest

from broker.config import BROKER_KEYS, BrokerConfig
from coordinator.group_config import (
    CONSUMER_GROUP_CONFIG_DEFS,
    GROUP_CONFIG_DEFS,
    GROUP_COORDINATOR_CONFIG_DEFS,
    SET,
    AlterConfigOp,
    ConsumerGroupConfig,
    GroupConfigStore,
    GroupCoordinatorConfig,
    ShareGroupBrokerConfig,
    validate_consumer_configs,
)
from protocol.errors import ErrorCode, KafkaError

INT_MAX = 2**31 - 1

# Kafka 4.2 GroupCoordinatorConfig: key -> default.
KAFKA_DEFAULTS: dict[str, int | str] = {
    "group.consumer.session.timeout.ms": 45000,
    "group.consumer.min.session.timeout.ms": 45000,
    "group.consumer.max.session.timeout.ms": 60000,
    "group.consumer.heartbeat.interval.ms": 5000,
    "group.consumer.min.heartbeat.interval.ms": 5000,
    "group.consumer.max.heartbeat.interval.ms": 15000,
    "group.consumer.max.size": INT_MAX,
    "group.consumer.assignors": "uniform,range",
    "group.consumer.migration.policy": "bidirectional",
    "group.consumer.regex.refresh.interval.ms": 600000,
    "group.min.session.timeout.ms": 6000,
    "group.max.session.timeout.ms": 1800000,
    "group.initial.rebalance.delay.ms": 3000,
    "group.max.size": INT_MAX,
    "offsets.retention.minutes": 10080,
    "offsets.retention.check.interval.ms": 600000,
    "offset.metadata.max.bytes": 4096,
    "offsets.commit.timeout.ms": 5000,
}


def refused(values: dict[str, str], words: str) -> None:
    with pytest.raises(KafkaError) as err:
        BrokerConfig(values)
    assert err.value.code == ErrorCode.invalid_config
    assert words in str(err.value), str(err.value)


def test_keys_and_defaults_are_kafkas() -> None:
    assert set(GROUP_COORDINATOR_CONFIG_DEFS) == set(KAFKA_DEFAULTS)
    config = BrokerConfig({}).group_coordinator()
    assert config == GroupCoordinatorConfig()
    for key, default in KAFKA_DEFAULTS.items():
        assert GROUP_COORDINATOR_CONFIG_DEFS[key].default == default, key
        assert config.value(key) == default, key
    assert config.offsets_retention_ms == 7 * 24 * 3600 * 1000
    assert config.consumer_group_default_assignor == "uniform"
    assert config.share == ShareGroupBrokerConfig()


def test_the_broker_reads_them_from_the_same_table_and_none_is_dynamic() -> None:
    # Kafka 4.2 reconfigures none of them at run time: IncrementalAlterConfigs on a
    # broker refuses them as read-only.
    for key, definition in GROUP_COORDINATOR_CONFIG_DEFS.items():
        assert BROKER_KEYS[key] is definition
        assert definition.read_only, key


def test_values_are_parsed_by_type() -> None:
    config = BrokerConfig(
        {
            "group.consumer.session.timeout.ms": "30000",
            "group.consumer.min.session.timeout.ms": "1000",
            "group.consumer.heartbeat.interval.ms": "500",
            "group.consumer.min.heartbeat.interval.ms": "100",
            "group.consumer.assignors": "range, uniform",
            "group.consumer.migration.policy": "DISABLED",
            "group.initial.rebalance.delay.ms": "0",
            "offsets.retention.minutes": "2",
            "offsets.retention.check.interval.ms": str(2**40),  # a LONG in Kafka
            "group.share.heartbeat.interval.ms": "6000",
        }
    ).group_coordinator()
    assert config.consumer_group_session_timeout_ms == 30000
    assert config.consumer_group_heartbeat_interval_ms == 500
    assert config.consumer_group_assignors == ("range", "uniform")
    assert config.consumer_group_default_assignor == "range"
    assert config.value("group.consumer.assignors") == "range,uniform"
    assert config.consumer_group_migration_policy == "disabled"
    assert config.classic_group_initial_rebalance_delay_ms == 0
    assert config.offsets_retention_ms == 120_000
    assert config.offsets_retention_check_interval_ms == 2**40
    assert config.share.heartbeat_interval_ms == 6000
    assert config.value("group.share.heartbeat.interval.ms") == 6000
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.classic_group_max_size = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("group.consumer.session.timeout.ms", "soon", "group.consumer.session.timeout.ms"),
        ("group.consumer.max.size", "0", "must be at least 1"),
        ("group.max.size", "0", "must be at least 1"),
        ("group.consumer.regex.refresh.interval.ms", "9999", "must be at least 10000"),
        ("offsets.retention.minutes", "0", "must be at least 1"),
        ("offsets.retention.check.interval.ms", "0", "must be at least 1"),
        ("offsets.commit.timeout.ms", "0", "must be at least 1"),
        ("group.consumer.assignors", "uniform,uniform", "listed twice"),
        ("group.consumer.assignors", "", "at least one assignor"),
        ("group.consumer.assignors", "uniform,sticky", "unknown assignor 'sticky'"),
        ("group.consumer.migration.policy", "sideways", "must be one of disabled, upgrade"),
    ],
)
def test_bad_values_name_the_key_and_the_reason(key: str, value: str, words: str) -> None:
    refused({key: value}, words)
    refused({key: value}, key)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"group.consumer.min.heartbeat.interval.ms": "20000"},
            "group.consumer.max.heartbeat.interval.ms must be greater than or equal to "
            "group.consumer.min.heartbeat.interval.ms",
        ),
        (
            {"group.consumer.min.heartbeat.interval.ms": "6000"},
            "group.consumer.heartbeat.interval.ms must be greater than or equal to "
            "group.consumer.min.heartbeat.interval.ms",
        ),
        (
            {"group.consumer.heartbeat.interval.ms": "16000"},
            "group.consumer.heartbeat.interval.ms must be less than or equal to "
            "group.consumer.max.heartbeat.interval.ms",
        ),
        (
            {"group.consumer.max.session.timeout.ms": "40000"},
            "group.consumer.max.session.timeout.ms must be greater than or equal to "
            "group.consumer.min.session.timeout.ms",
        ),
        (
            {"group.consumer.session.timeout.ms": "44000"},
            "group.consumer.session.timeout.ms must be greater than or equal to "
            "group.consumer.min.session.timeout.ms",
        ),
        (
            {"group.consumer.session.timeout.ms": "61000"},
            "group.consumer.session.timeout.ms must be less than or equal to "
            "group.consumer.max.session.timeout.ms",
        ),
        (
            {
                "group.consumer.session.timeout.ms": "5000",
                "group.consumer.min.session.timeout.ms": "5000",
            },
            "group.consumer.heartbeat.interval.ms must be less than "
            "group.consumer.session.timeout.ms",
        ),
    ],
)
def test_the_consumer_keys_must_agree_as_kafka_requires(
    values: dict[str, str], message: str
) -> None:
    refused(values, message)


def test_a_broker_with_share_keys_that_disagree_still_says_so_first() -> None:
    # The share keys' own check is unchanged and runs first.
    refused(
        {"group.share.record.lock.duration.ms": "2000"}, "group.share.min.record.lock.duration.ms"
    )


# -- consumer group configs (consumer.*) ---------------------------------------


def test_consumer_group_configs_are_kafkas_and_served_by_the_store() -> None:
    assert set(CONSUMER_GROUP_CONFIG_DEFS) == {
        "consumer.session.timeout.ms",
        "consumer.heartbeat.interval.ms",
    }
    for definition in CONSUMER_GROUP_CONFIG_DEFS.values():
        assert definition.broker_synonym is not None
        assert definition.broker_synonym in GROUP_COORDINATOR_CONFIG_DEFS
        assert GROUP_COORDINATOR_CONFIG_DEFS[definition.broker_synonym].default == (
            definition.default
        )
    # Apart from the share keys, but altered and described through the same store.
    assert not set(CONSUMER_GROUP_CONFIG_DEFS) & set(GROUP_CONFIG_DEFS)
    [record] = GroupConfigStore().incremental_alter(
        "g", [AlterConfigOp("consumer.session.timeout.ms", SET, "50000")]
    )
    assert (record.name, record.value) == ("consumer.session.timeout.ms", "50000")


def test_consumer_configs_within_the_broker_bounds_are_accepted() -> None:
    assert validate_consumer_configs({}) == {}
    assert validate_consumer_configs(
        {"consumer.session.timeout.ms": "60000", "consumer.heartbeat.interval.ms": 15000}
    ) == {"consumer.session.timeout.ms": 60000, "consumer.heartbeat.interval.ms": 15000}
    assert validate_consumer_configs({"consumer.session.timeout.ms": "45000"}) == {
        "consumer.session.timeout.ms": 45000
    }


@pytest.mark.parametrize(
    ("configs", "words"),
    [
        ({"consumer.session.timeout.ms": "44999"}, "group.consumer.min.session.timeout.ms"),
        ({"consumer.session.timeout.ms": "60001"}, "group.consumer.max.session.timeout.ms"),
        ({"consumer.heartbeat.interval.ms": "4999"}, "group.consumer.min.heartbeat.interval.ms"),
        ({"consumer.heartbeat.interval.ms": "15001"}, "group.consumer.max.heartbeat.interval.ms"),
        ({"consumer.heartbeat.interval.ms": "0"}, "at least 1"),
        ({"consumer.session.timeout.ms": "soon"}, "expected an integer"),
        ({"consumer.rebalance.timeout.ms": "1"}, "Unknown group config name"),
        ({"share.session.timeout.ms": "45000"}, "Unknown group config name"),
    ],
)
def test_consumer_configs_outside_their_bounds_are_refused(
    configs: dict[str, str], words: str
) -> None:
    with pytest.raises(KafkaError) as err:
        validate_consumer_configs(configs)
    assert err.value.code == ErrorCode.invalid_config
    assert words in str(err.value)


def test_the_session_timeout_must_exceed_the_heartbeat_interval() -> None:
    # Bounds wide enough to overlap: then the relation between the two decides, with
    # the broker's value for the one not overridden (Kafka validates the merged set).
    wide = BrokerConfig(
        {
            "group.consumer.min.session.timeout.ms": "1000",
            "group.consumer.max.heartbeat.interval.ms": "60000",
        }
    ).group_coordinator()
    both = {"consumer.session.timeout.ms": "8000", "consumer.heartbeat.interval.ms": "8000"}
    with pytest.raises(KafkaError, match=re.escape("must be greater than")):
        validate_consumer_configs(both, wide)
    with pytest.raises(KafkaError, match=re.escape("(4000) must be greater than")):
        validate_consumer_configs({"consumer.session.timeout.ms": "4000"}, wide)
    with pytest.raises(KafkaError, match=re.escape("(45000) must be greater than")):
        validate_consumer_configs({"consumer.heartbeat.interval.ms": "50000"}, wide)
    assert validate_consumer_configs({"consumer.session.timeout.ms": "6000"}, wide)


def test_effective_consumer_group_config() -> None:
    coordinator = BrokerConfig(
        {
            "group.consumer.heartbeat.interval.ms": "3000",
            "group.consumer.min.heartbeat.interval.ms": "1000",
        }
    ).group_coordinator()
    assert ConsumerGroupConfig.effective({}, coordinator) == ConsumerGroupConfig(45000, 3000)
    assert ConsumerGroupConfig.effective(
        {"consumer.session.timeout.ms": 50000}, coordinator
    ) == ConsumerGroupConfig(50000, 3000)
