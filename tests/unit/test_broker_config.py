"""Broker config: Kafka keys, precedence, validation messages."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from broker.config import BrokerConfig, load_static
from protocol.errors import ErrorCode, KafkaError


def test_set_beats_environment_beats_file(tmp_path: Path) -> None:
    f = tmp_path / "spool.toml"
    f.write_text('"num.partitions" = 2\n[log]\n"retention.ms" = 1000\n')
    merged = load_static(
        f, ["num.partitions=5"], {"SPOOL_NUM_PARTITIONS": "4", "SPOOL_LOG_RETENTION_MS": "2000"}
    )
    config = BrokerConfig(merged)
    assert config.get("num.partitions") == 5
    assert config.get("log.retention.ms") == 2000


def test_topic_defaults_follow_their_broker_synonyms() -> None:
    config = BrokerConfig({"log.retention.ms": "1234", "log.segment.bytes": "2048"})
    assert config.topic_default("retention.ms") == 1234
    assert config.topic_default("segment.bytes") == 2048
    assert config.topic_config({"retention.ms": 5}, "retention.ms") == 5


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("num.partitions", "zero", "num.partitions"),
        ("num.partitions", "0", "at least 1"),
        ("auto.create.topics.enable", "maybe", "true or false"),
        ("log.message.timestamp.type", "Whenever", "CreateTime"),
    ],
)
def test_bad_values_name_the_key_and_the_reason(key: str, value: str, words: str) -> None:
    with pytest.raises(KafkaError) as err:
        BrokerConfig({key: value})
    assert err.value.code == ErrorCode.invalid_config
    assert words in str(err.value)


def test_unknown_keys_are_refused() -> None:
    with pytest.raises(KafkaError, match="Unknown broker config"):
        BrokerConfig({"no.such.key": "1"})


def test_share_group_keys_must_agree_with_their_bounds() -> None:
    with pytest.raises(KafkaError, match=re.escape("group.share.min.record.lock.duration.ms")):
        BrokerConfig({"group.share.record.lock.duration.ms": "2000"})
    config = BrokerConfig(
        {
            "group.share.record.lock.duration.ms": "2000",
            "group.share.min.record.lock.duration.ms": "1000",
        }
    )
    assert config.share_groups().record_lock_duration_ms == 2000


def test_share_group_broker_keys_are_the_group_config_table_itself() -> None:
    """One definition per key: the broker reads and describes the group.share.* keys
    from the same table that bounds the share.* group configs."""
    from broker.config import BROKER_KEYS
    from coordinator.group_config import BROKER_CONFIG_DEFS

    for name, definition in BROKER_CONFIG_DEFS.items():
        assert BROKER_KEYS[name] is definition
    with pytest.raises(KafkaError, match=re.escape("group.share.max.size")):
        BrokerConfig({"group.share.max.size": 0})
