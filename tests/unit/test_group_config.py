"""Share-group configs: Kafka's names, defaults, bounds, by_duration parsing, the store."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.group_config import (
    APPEND,
    BROKER_CONFIG_DEFS,
    CONSUMER_GROUP_CONFIG_DEFS,
    DELETE,
    GROUP_CONFIG_DEFS,
    SET,
    AlterConfigOp,
    AutoOffsetReset,
    GroupConfig,
    GroupConfigRecord,
    GroupConfigStore,
    GroupCoordinatorConfig,
    ShareGroupBrokerConfig,
    parse_auto_offset_reset,
    parse_iso8601_duration_ms,
    validate,
    validate_all,
)
from protocol.errors import ErrorCode, KafkaError

BROKER = ShareGroupBrokerConfig()

# Group key -> the range it accepts with the broker defaults.
INT_RANGES = {
    "share.session.timeout.ms": (45000, 60000),
    "share.heartbeat.interval.ms": (5000, 15000),
    "share.record.lock.duration.ms": (15000, 60000),
    "share.delivery.count.limit": (2, 10),
    "share.partition.max.record.locks": (100, 4000),
}


def rejected(name: str, value: object, broker: ShareGroupBrokerConfig = BROKER) -> KafkaError:
    with pytest.raises(KafkaError) as e:
        validate(name, value, broker)
    assert e.value.code is ErrorCode.invalid_config
    return e.value


# -- names and defaults ------------------------------------------------------


def test_group_config_names_are_kafkas() -> None:
    assert set(GROUP_CONFIG_DEFS) == {
        "share.session.timeout.ms",
        "share.heartbeat.interval.ms",
        "share.record.lock.duration.ms",
        "share.delivery.count.limit",
        "share.partition.max.record.locks",
        "share.auto.offset.reset",
        "share.isolation.level",
        "share.renew.acknowledge.enable",
        "errors.deadletterqueue.topic.name",
        "errors.deadletterqueue.copy.record.enable",
    }


def test_broker_defaults_are_kafkas() -> None:
    assert BROKER.value("group.share.session.timeout.ms") == 45000
    assert BROKER.value("group.share.heartbeat.interval.ms") == 5000
    assert BROKER.value("group.share.record.lock.duration.ms") == 30000
    assert BROKER.value("group.share.delivery.count.limit") == 5
    assert BROKER.value("group.share.partition.max.record.locks") == 2000
    assert BROKER.value("group.share.max.size") == 200
    assert BROKER.value("group.share.max.share.sessions") == 2000
    assert {k for k, _ in BROKER.items()} == set(BROKER_CONFIG_DEFS)


def test_effective_defaults_follow_the_broker() -> None:
    config = GroupConfig.effective({}, BROKER)
    assert config == GroupConfig()
    assert config.auto_offset_reset.type == "latest"
    assert config.isolation_level == "read_uncommitted"
    broker = ShareGroupBrokerConfig(delivery_count_limit=7, record_lock_duration_ms=20000)
    config = GroupConfig.effective({}, broker)
    assert (config.delivery_count_limit, config.record_lock_duration_ms) == (7, 20000)


def test_unknown_name_is_invalid_config_naming_it() -> None:
    error = rejected("share.no.such.thing", "1")
    assert "share.no.such.thing" in str(error)


# -- integer configs ---------------------------------------------------------


@pytest.mark.parametrize("name", sorted(INT_RANGES))
@pytest.mark.parametrize("value", ["not_a_number", "-0.1", "1.2", "", True, 3.0, None])
def test_integer_configs_reject_non_integers(name: str, value: object) -> None:
    assert name in str(rejected(name, value))


@pytest.mark.parametrize("name", sorted(INT_RANGES))
def test_integer_configs_reject_values_outside_the_broker_bounds(name: str) -> None:
    lo, hi = INT_RANGES[name]
    below, above = rejected(name, lo - 1), rejected(name, hi + 1)
    # Below: Kafka's fixed floor or the broker minimum, whichever is hit first.
    assert name in str(below) and ("group.share.min." in str(below) or "at least" in str(below))
    assert name in str(above) and "group.share.max." in str(above)


def test_values_below_kafkas_fixed_floor_are_rejected_even_with_loose_broker_bounds() -> None:
    broker = ShareGroupBrokerConfig(min_delivery_count_limit=2)
    assert "at least 2" in str(rejected("share.delivery.count.limit", 1, broker))
    assert "at least 1000" in str(rejected("share.record.lock.duration.ms", 999, broker))


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_every_integer_in_range_is_accepted(data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(sorted(INT_RANGES)))
    lo, hi = INT_RANGES[name]
    value = data.draw(st.integers(lo, hi))
    as_text = data.draw(st.booleans())
    assert validate(name, str(value) if as_text else value) == value


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_every_integer_out_of_range_is_rejected_naming_the_key(data: st.DataObject) -> None:
    name = data.draw(st.sampled_from(sorted(INT_RANGES)))
    lo, hi = INT_RANGES[name]
    value = data.draw(st.integers(max_value=lo - 1) | st.integers(min_value=hi + 1))
    with pytest.raises(KafkaError) as e:
        validate(name, str(value))
    assert e.value.code is ErrorCode.invalid_config
    assert name in str(e.value)


def test_session_timeout_must_exceed_heartbeat_interval() -> None:
    broker = ShareGroupBrokerConfig(min_session_timeout_ms=1000, max_heartbeat_interval_ms=60000)
    assert validate_all({"share.session.timeout.ms": "50000"}, broker)
    with pytest.raises(KafkaError) as e:
        validate_all(
            {"share.session.timeout.ms": "10000", "share.heartbeat.interval.ms": "10000"}, broker
        )
    assert e.value.code is ErrorCode.invalid_config
    assert "share.session.timeout.ms" in str(e.value)
    # The broker default heartbeat (5000) counts when only the session is set.
    with pytest.raises(KafkaError):
        validate_all({"share.session.timeout.ms": "5000"}, broker)


# -- string and boolean configs ---------------------------------------------


@pytest.mark.parametrize("value", ["latest", "earliest", "by_duration:PT1H", "by_duration:P2D"])
def test_auto_offset_reset_accepts_kafkas_values(value: str) -> None:
    assert validate("share.auto.offset.reset", value) == value


@pytest.mark.parametrize(
    "value",
    [
        "hello",
        "1.0",
        "LATEST",
        "EARLIEST",
        "none",
        "",
        "by_duration",
        "by_duration:",
        "by_duration:invalid",
        "by_duration:-PT1H",
        1,
    ],
)
def test_auto_offset_reset_rejects_other_values(value: object) -> None:
    assert "share.auto.offset.reset" in str(rejected("share.auto.offset.reset", value))


@pytest.mark.parametrize("value", ["read_committed", "read_uncommitted"])
def test_isolation_level_accepts_both_levels(value: str) -> None:
    assert validate("share.isolation.level", value) == value


@pytest.mark.parametrize("value", ["hello", "1.0", "READ_COMMITTED", ""])
def test_isolation_level_rejects_other_values(value: str) -> None:
    assert "share.isolation.level" in str(rejected("share.isolation.level", value))


def test_renew_acknowledge_enable_is_a_boolean() -> None:
    assert validate("share.renew.acknowledge.enable", "false") is False
    assert validate("share.renew.acknowledge.enable", "TRUE") is True
    assert "share.renew.acknowledge.enable" in str(
        rejected("share.renew.acknowledge.enable", "yes")
    )


# -- by_duration -------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("PT1H", 3_600_000),
        ("P2D", 172_800_000),
        ("PT1H30M", 5_400_000),
        ("PT0.5S", 500),
        ("PT0S", 0),
        ("P1DT2H3M4.005S", 93_784_005),
        ("pt15m", 900_000),
        ("P-1DT25H", 3_600_000),
        ("PT1.0009S", 1000),
        ("+PT1S", 1000),
    ],
)
def test_iso8601_durations_parse_to_milliseconds(text: str, ms: int) -> None:
    assert parse_iso8601_duration_ms(text) == ms


@pytest.mark.parametrize(
    "text", ["", "P", "PT", "1H", "PT1H2D", "P1Y", "P1W", "PT-1H", "-PT1S", "P1DT", "PT1.5H"]
)
def test_bad_or_negative_durations_are_rejected(text: str) -> None:
    with pytest.raises(ValueError):
        parse_iso8601_duration_ms(text)


@given(
    d=st.integers(0, 1000),
    h=st.integers(0, 100),
    m=st.integers(0, 100),
    s=st.integers(0, 100),
    ms=st.integers(0, 999),
)
def test_durations_from_parts_round_trip(d: int, h: int, m: int, s: int, ms: int) -> None:
    text = f"P{d}DT{h}H{m}M{s}.{ms:03d}S"
    expected = (((d * 24 + h) * 60 + m) * 60 + s) * 1000 + ms
    assert parse_iso8601_duration_ms(text) == expected
    reset = parse_auto_offset_reset(f"by_duration:{text}")
    assert reset.timestamp(10**13) == 10**13 - expected


def test_auto_offset_reset_maps_to_list_offsets_timestamps() -> None:
    assert parse_auto_offset_reset("latest").timestamp(123) == -1
    assert parse_auto_offset_reset("earliest").timestamp(123) == -2
    reset = parse_auto_offset_reset("by_duration:PT1S")
    assert reset == AutoOffsetReset("by_duration", 1000, "by_duration:PT1S")
    assert reset.timestamp(5000) == 4000
    assert str(reset) == "by_duration:PT1S"


# -- the broker config -------------------------------------------------------


def test_broker_config_from_mapping_reads_kafka_keys() -> None:
    broker = ShareGroupBrokerConfig.from_mapping(
        {"group.share.max.size": "50", "group.share.delivery.count.limit": 3, "other.key": 1}
    )
    assert (broker.max_size, broker.delivery_count_limit) == (50, 3)


@pytest.mark.parametrize(
    ("values", "key"),
    [
        ({"group.share.delivery.count.limit": 11}, "group.share.delivery.count.limit"),
        ({"group.share.max.size": 0}, "group.share.max.size"),
        (
            {"group.share.delivery.count.limit": 9, "group.share.max.delivery.count.limit": 8},
            "group.share.max.delivery.count.limit",
        ),
        (
            {"group.share.max.size": 1000, "group.share.max.share.sessions": 999},
            "group.share.max.share.sessions",
        ),
        (
            {"group.share.session.timeout.ms": 45000, "group.share.min.session.timeout.ms": 46000},
            "group.share.session.timeout.ms",
        ),
    ],
)
def test_broker_config_rejects_bad_values_and_relations(values: dict, key: str) -> None:
    with pytest.raises(KafkaError) as e:
        ShareGroupBrokerConfig.from_mapping(values)
    assert e.value.code is ErrorCode.invalid_config
    assert key in str(e.value)


# -- the store ---------------------------------------------------------------


def apply(store: GroupConfigStore, records: list[GroupConfigRecord]) -> None:
    for record in records:
        store.replay(record)


def test_configs_can_be_set_for_a_group_that_does_not_exist_yet() -> None:
    store = GroupConfigStore()
    apply(
        store,
        store.incremental_alter("future", [AlterConfigOp("share.delivery.count.limit", SET, "3")]),
    )
    assert store.config("future").delivery_count_limit == 3
    assert store.config("other").delivery_count_limit == 5
    assert store.group_ids() == ["future"]


def test_incremental_alter_sets_and_deletes() -> None:
    store = GroupConfigStore()
    apply(
        store,
        store.incremental_alter(
            "g",
            [
                AlterConfigOp("share.record.lock.duration.ms", SET, "20000"),
                AlterConfigOp("share.auto.offset.reset", SET, "earliest"),
            ],
        ),
    )
    assert store.overrides("g") == {
        "share.record.lock.duration.ms": 20000,
        "share.auto.offset.reset": "earliest",
    }
    apply(store, store.incremental_alter("g", [AlterConfigOp("share.auto.offset.reset", DELETE)]))
    assert store.config("g").auto_offset_reset.type == "latest"
    assert store.config("g").record_lock_duration_ms == 20000


def test_incremental_alter_validates_before_changing_anything() -> None:
    store = GroupConfigStore()
    with pytest.raises(KafkaError) as e:
        store.incremental_alter(
            "g",
            [
                AlterConfigOp("share.delivery.count.limit", SET, "3"),
                AlterConfigOp("share.isolation.level", SET, "dirty"),
            ],
        )
    assert "share.isolation.level" in str(e.value)
    assert store.overrides("g") == {}


def test_append_is_not_allowed_for_scalar_configs() -> None:
    with pytest.raises(KafkaError) as e:
        GroupConfigStore().incremental_alter(
            "g", [AlterConfigOp("share.delivery.count.limit", APPEND, "3")]
        )
    assert e.value.code is ErrorCode.invalid_config
    assert "share.delivery.count.limit" in str(e.value)


def test_alter_replaces_the_whole_set() -> None:
    store = GroupConfigStore()
    apply(store, store.alter("g", {"share.delivery.count.limit": "3"}))
    apply(store, store.alter("g", {"share.isolation.level": "read_committed"}))
    assert store.overrides("g") == {"share.isolation.level": "read_committed"}


def test_describe_marks_overrides_and_defaults() -> None:
    store = GroupConfigStore()
    apply(
        store, store.incremental_alter("g", [AlterConfigOp("share.delivery.count.limit", SET, "4")])
    )
    entries = {e.name: e for e in store.describe("g")}
    # Every group config, consumer.* too, whatever the group's type (Kafka's GroupConfig).
    assert set(entries) == set(GROUP_CONFIG_DEFS) | set(CONSUMER_GROUP_CONFIG_DEFS)
    assert (
        entries["share.delivery.count.limit"].value,
        entries["share.delivery.count.limit"].is_default,
    ) == ("4", False)
    assert (
        entries["share.session.timeout.ms"].value,
        entries["share.session.timeout.ms"].is_default,
    ) == ("45000", True)
    assert entries["share.renew.acknowledge.enable"].value == "true"


def test_stored_values_outside_narrowed_broker_bounds_are_clamped() -> None:
    store = GroupConfigStore()
    apply(
        store,
        store.incremental_alter("g", [AlterConfigOp("share.delivery.count.limit", SET, "10")]),
    )
    store.broker = ShareGroupBrokerConfig(max_delivery_count_limit=6)
    assert store.config("g").delivery_count_limit == 6


def test_replaying_records_rebuilds_the_store() -> None:
    store = GroupConfigStore()
    log: list[GroupConfigRecord] = []
    for ops in (
        [AlterConfigOp("share.delivery.count.limit", SET, "3")],
        [AlterConfigOp("share.auto.offset.reset", SET, "by_duration:PT5M")],
        [AlterConfigOp("share.delivery.count.limit", DELETE)],
    ):
        records = store.incremental_alter("g", ops)
        apply(store, records)
        log += records
    fresh = GroupConfigStore()
    apply(fresh, log)
    assert fresh.overrides("g") == store.overrides("g")
    assert fresh.config("g").auto_offset_reset.duration_ms == 300_000


# --- consumer.* group configs (KIP-848 consumer groups) ---------------------------------


def test_consumer_group_configs_are_altered_and_described() -> None:
    store = GroupConfigStore()
    apply(
        store,
        store.incremental_alter(
            "g",
            [
                AlterConfigOp("consumer.session.timeout.ms", SET, "50000"),
                AlterConfigOp("consumer.heartbeat.interval.ms", SET, "6000"),
            ],
        ),
    )
    assert store.overrides("g") == {
        "consumer.session.timeout.ms": 50000,
        "consumer.heartbeat.interval.ms": 6000,
    }
    entries = {e.name: e for e in store.describe("g")}
    assert (
        entries["consumer.session.timeout.ms"].value,
        entries["consumer.session.timeout.ms"].is_default,
    ) == ("50000", False)
    assert entries["consumer.heartbeat.interval.ms"].value == "6000"
    # The share keys are untouched by them.
    assert entries["share.session.timeout.ms"].value == "45000"
    assert store.config("g") == GroupConfig()
    # The defaults are the broker's group.consumer.* values.
    wide = GroupCoordinatorConfig.from_mapping(
        {
            "group.consumer.min.session.timeout.ms": 6000,
            "group.consumer.session.timeout.ms": 30000,
        }
    )
    other = GroupConfigStore(coordinator=wide)
    assert {e.name: e.value for e in other.describe("h")}["consumer.session.timeout.ms"] == (
        "30000"
    )


@pytest.mark.parametrize(
    ("ops", "message"),
    [
        (
            [("consumer.session.timeout.ms", "1000")],
            "consumer.session.timeout.ms must be greater than or equal to "
            "group.consumer.min.session.timeout.ms (45000)",
        ),
        (
            [("consumer.heartbeat.interval.ms", "90000")],
            "consumer.heartbeat.interval.ms must be less than or equal to "
            "group.consumer.max.heartbeat.interval.ms (15000)",
        ),
        ([("consumer.session.timeout.ms", "abc")], "consumer.session.timeout.ms"),
    ],
)
def test_consumer_group_configs_are_checked_against_the_broker_bounds(
    ops: list[tuple[str, str]], message: str
) -> None:
    store = GroupConfigStore()
    with pytest.raises(KafkaError) as e:
        store.incremental_alter("g", [AlterConfigOp(n, SET, v) for n, v in ops])
    assert e.value.code is ErrorCode.invalid_config
    assert message in str(e.value)
    assert store.overrides("g") == {}
