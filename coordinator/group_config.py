"""Group configs (Kafka's `GroupConfig`) and the group coordinator's broker keys.

Share groups: `GroupConfig`'s share.* keys and `ShareGroupConfig`'s group.share.*.

A group config (`share.record.lock.duration.ms`, ...) is set per group with
IncrementalAlterConfigs on resource type GROUP; when a group has no override the
broker's `group.share.*` value applies. Kafka bounds some group configs twice: a
fixed floor in `GroupConfig` (e.g. `atLeast(1000)`) and the broker's
`group.share.min.*` / `group.share.max.*` keys; a value outside either is rejected
with INVALID_CONFIG naming the key and the bound. Values stored before the broker
bounds were narrowed are clamped when the effective config is built, as Kafka's
`GroupConfig.evaluate` does.

As in Kafka, configs may be stored for a group that does not exist yet, and deleting a
group keeps them (Kafka 4.2's DeleteGroups leaves the group's ConfigRecords alone);
`GroupConfigStore` is keyed by group id only and knows nothing of group state.

Where they live: as Kafka keeps them in its metadata log (ConfigRecord, resource type
GROUP, applied by every broker's GroupConfigManager), the store the brokers read is
`coordinator.metadata.ClusterState.group_configs`, changed by `group_config` records of
the cluster metadata log, so any broker alters and describes them and every broker's
share partitions see them. spool before that kept them in the `groups` log; a broker
loading such a log copies them to the metadata log once
(`MetadataStore.adopt_group_configs`).

Dead-letter topics (KIP-1191, after Kafka 4.2, `share.version` 2): a share group's
`errors.deadletterqueue.topic.name` ("" = none) and `errors.deadletterqueue.copy.record.enable`
are group configs with no broker synonym; the broker's
`errors.deadletterqueue.topic.name.prefix` and `errors.deadletterqueue.auto.create.topics.enable`
(`DLQ_BROKER_CONFIG_DEFS`) and the topic's `errors.deadletterqueue.group.enable` say which
topics a group may name, as `dead_letter_topic_problem` checks.

The group coordinator's own broker keys (Kafka's `GroupCoordinatorConfig`, 4.2):
`group.consumer.*` for KIP-848 consumer groups, `group.min/max.session.timeout.ms`,
`group.initial.rebalance.delay.ms` and `group.max.size` for classic groups, and the
`offsets.*` keys of committed offsets, are `GROUP_COORDINATOR_CONFIG_DEFS`, read-only
(Kafka cannot change them dynamically either) and checked against each other as
Kafka's constructor does; `GroupCoordinatorConfig` carries them, with the share keys,
as one frozen object. The consumer group configs `consumer.session.timeout.ms` and
`consumer.heartbeat.interval.ms` (`CONSUMER_GROUP_CONFIG_DEFS`, bounded by the
`group.consumer.min/max.*` keys as Kafka's `GroupConfig` validates them) are altered and
described through the same `GroupConfigStore` as the share keys, in one namespace: as in
Kafka, a group's DescribeConfigs lists them all whatever the group's type.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from protocol.configs import ConfigDef, ConfigType
from protocol.errors import ErrorCode, KafkaError

__all__ = [
    "BROKER_CONFIG_DEFS",
    "CONSUMER_GROUP_CONFIG_DEFS",
    "DLQ_AUTO_CREATE_TOPICS_ENABLE",
    "DLQ_BROKER_CONFIG_DEFS",
    "DLQ_COPY_RECORD_ENABLE",
    "DLQ_GROUP_ENABLE",
    "DLQ_TOPIC_NAME",
    "DLQ_TOPIC_NAME_PREFIX",
    "EARLIEST_TIMESTAMP",
    "GROUP_CONFIG_DEFS",
    "GROUP_COORDINATOR_CONFIG_DEFS",
    "LATEST_TIMESTAMP",
    "MIGRATION_POLICIES",
    "AlterConfigOp",
    "AutoOffsetReset",
    "ConfigDef",
    "ConfigValue",
    "ConsumerGroupConfig",
    "GroupConfig",
    "GroupConfigEntry",
    "GroupConfigRecord",
    "GroupConfigStore",
    "GroupCoordinatorConfig",
    "ShareGroupBrokerConfig",
    "check_dead_letter_topic",
    "dead_letter_topic_problem",
    "parse_auto_offset_reset",
    "parse_iso8601_duration_ms",
    "topic_dead_letter_enabled",
    "validate",
    "validate_all",
    "validate_consumer_configs",
]

ConfigValue = int | str | bool

INT = ConfigType.INT
LONG = ConfigType.LONG
LIST = ConfigType.LIST
STRING = ConfigType.STRING
BOOLEAN = ConfigType.BOOLEAN
INT32_MAX = 2**31 - 1

# ListOffsets sentinel timestamps that `share.auto.offset.reset` maps to.
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2


def _broker(name: str, default: int, doc: str, lo: int, hi: int | None = None) -> ConfigDef:
    return ConfigDef(name, INT, default, doc, min=lo, max=hi)


# Kafka's `ShareGroupConfig` and the share part of `GroupCoordinatorConfig` (4.2).
BROKER_CONFIG_DEFS: dict[str, ConfigDef] = {
    d.name: d
    for d in [
        _broker(
            "group.share.session.timeout.ms",
            45000,
            "The timeout to detect client failures when using the share group protocol.",
            1,
        ),
        _broker(
            "group.share.min.session.timeout.ms",
            45000,
            "The minimum allowed session timeout for share group members.",
            1,
        ),
        _broker(
            "group.share.max.session.timeout.ms",
            60000,
            "The maximum allowed session timeout for share group members.",
            1,
        ),
        _broker(
            "group.share.heartbeat.interval.ms",
            5000,
            "The heartbeat interval given to the members of a share group.",
            1,
        ),
        _broker(
            "group.share.min.heartbeat.interval.ms",
            5000,
            "The minimum heartbeat interval for share group members.",
            1,
        ),
        _broker(
            "group.share.max.heartbeat.interval.ms",
            15000,
            "The maximum heartbeat interval for share group members.",
            1,
        ),
        _broker(
            "group.share.max.size",
            200,
            "The maximum number of members that a single share group can accommodate.",
            1,
            1000,
        ),
        _broker(
            "group.share.record.lock.duration.ms",
            30000,
            "The record acquisition lock duration in milliseconds for share groups.",
            1000,
            3600000,
        ),
        _broker(
            "group.share.min.record.lock.duration.ms",
            15000,
            "The minimum value of a group configuration for record acquisition lock "
            "duration in milliseconds.",
            1000,
            30000,
        ),
        _broker(
            "group.share.max.record.lock.duration.ms",
            60000,
            "The maximum value of a group configuration for record acquisition lock "
            "duration in milliseconds.",
            30000,
            3600000,
        ),
        _broker(
            "group.share.delivery.count.limit",
            5,
            "The maximum number of delivery attempts for a record delivered to a share group.",
            2,
            10,
        ),
        _broker(
            "group.share.min.delivery.count.limit",
            2,
            "The minimum value of a group configuration for the maximum number of delivery "
            "attempts.",
            2,
            5,
        ),
        _broker(
            "group.share.max.delivery.count.limit",
            10,
            "The maximum value of a group configuration for the maximum number of delivery "
            "attempts.",
            5,
            25,
        ),
        _broker(
            "group.share.partition.max.record.locks",
            2000,
            "Share-group record lock limit per share-partition.",
            100,
            10000,
        ),
        _broker(
            "group.share.min.partition.max.record.locks",
            100,
            "The minimum value of a group configuration for the record lock limit per "
            "share-partition.",
            100,
            2000,
        ),
        _broker(
            "group.share.max.partition.max.record.locks",
            4000,
            "The maximum value of a group configuration for the record lock limit per "
            "share-partition.",
            2000,
            10000,
        ),
        _broker(
            "group.share.max.share.sessions",
            2000,
            "The maximum number of share sessions per broker.",
            1,
        ),
        _broker(
            "group.share.initialize.retry.interval.ms",
            30000,
            "Time elapsed before retrying initialize share group state request. If below "
            "offsets.commit.timeout.ms, then value of offsets.commit.timeout.ms is used.",
            1,
        ),
    ]
}

# Kafka's `offsets.commit.timeout.ms` default: the floor of the initialize retry interval
# (GroupCoordinatorConfig.shareGroupInitializeRetryIntervalMs).
OFFSETS_COMMIT_TIMEOUT_MS = 5000


# KIP-1191's keys (Kafka's GroupConfig, GroupCoordinatorConfig and TopicConfig after
# 4.2): the group's dead-letter topic and whether copies carry the record, the broker's
# required prefix of dead-letter topic names and whether a missing one is created, and
# the topic's opt-in to being one.
DLQ_TOPIC_NAME = "errors.deadletterqueue.topic.name"
DLQ_COPY_RECORD_ENABLE = "errors.deadletterqueue.copy.record.enable"
DLQ_TOPIC_NAME_PREFIX = "errors.deadletterqueue.topic.name.prefix"
DLQ_AUTO_CREATE_TOPICS_ENABLE = "errors.deadletterqueue.auto.create.topics.enable"
DLQ_GROUP_ENABLE = "errors.deadletterqueue.group.enable"

# Kafka's `GroupConfig`, share and dead-letter keys (spool serves no consumer or streams
# group configs yet).
GROUP_CONFIG_DEFS: dict[str, ConfigDef] = {
    d.name: d
    for d in [
        ConfigDef(
            "share.session.timeout.ms",
            INT,
            45000,
            "The timeout to detect client failures when using the share group protocol.",
            min=1,
            broker_synonym="group.share.session.timeout.ms",
            broker_min="group.share.min.session.timeout.ms",
            broker_max="group.share.max.session.timeout.ms",
        ),
        ConfigDef(
            "share.heartbeat.interval.ms",
            INT,
            5000,
            "The heartbeat interval given to the members.",
            min=1,
            broker_synonym="group.share.heartbeat.interval.ms",
            broker_min="group.share.min.heartbeat.interval.ms",
            broker_max="group.share.max.heartbeat.interval.ms",
        ),
        ConfigDef(
            "share.record.lock.duration.ms",
            INT,
            30000,
            "The record acquisition lock duration in milliseconds.",
            min=1000,
            broker_synonym="group.share.record.lock.duration.ms",
            broker_min="group.share.min.record.lock.duration.ms",
            broker_max="group.share.max.record.lock.duration.ms",
        ),
        ConfigDef(
            "share.delivery.count.limit",
            INT,
            5,
            "The maximum number of delivery attempts for a record delivered to a share group.",
            min=2,
            broker_synonym="group.share.delivery.count.limit",
            broker_min="group.share.min.delivery.count.limit",
            broker_max="group.share.max.delivery.count.limit",
        ),
        ConfigDef(
            "share.partition.max.record.locks",
            INT,
            2000,
            "Share-group record lock limit per share-partition.",
            min=100,
            broker_synonym="group.share.partition.max.record.locks",
            broker_min="group.share.min.partition.max.record.locks",
            broker_max="group.share.max.partition.max.record.locks",
        ),
        ConfigDef(
            "share.auto.offset.reset",
            STRING,
            "latest",
            "The strategy to initialize the share-partition start offset: earliest, "
            "latest, or by_duration:<ISO-8601 duration> (PnDTnHnMn.nS).",
        ),
        ConfigDef(
            "share.isolation.level",
            STRING,
            "read_uncommitted",
            "Controls how to read records written transactionally: read_committed or "
            "read_uncommitted.",
        ),
        ConfigDef(
            "share.renew.acknowledge.enable",
            BOOLEAN,
            True,
            "Whether the renew acknowledge type is enabled for the share group.",
        ),
        # KIP-1191 (Kafka's GroupConfig after 4.2, share.version 2): no broker synonym.
        ConfigDef(
            DLQ_TOPIC_NAME,
            STRING,
            "",
            "The topic this share group writes the records it gives up on to (rejected, "
            "or at share.delivery.count.limit), its dead-letter queue. Empty (the "
            "default): the group has none and archives them. The topic must carry the "
            f"broker's {DLQ_TOPIC_NAME_PREFIX} and have {DLQ_GROUP_ENABLE}=true.",
        ),
        ConfigDef(
            DLQ_COPY_RECORD_ENABLE,
            BOOLEAN,
            False,
            "Whether a dead-letter record carries the original record's key, value, "
            "headers and timestamp, or only the headers naming where it came from and why.",
        ),
    ]
}

ISOLATION_LEVELS = ("read_committed", "read_uncommitted")


# ---------------------------------------------------------------------------
# share.auto.offset.reset


# Java's `Duration.parse` grammar: [-+]P[nD][T[nH][nM][n[.n]S]], letters in any case,
# each number optionally signed, at most nine fraction digits.
_DURATION = re.compile(
    r"([-+]?)P(?:([-+]?\d+)D)?"
    r"(T(?:([-+]?\d+)H)?(?:([-+]?\d+)M)?(?:([-+]?\d+)(?:[.,](\d{0,9}))?S)?)?",
    re.IGNORECASE,
)


def parse_iso8601_duration_ms(text: str) -> int:
    """Parse an ISO-8601 duration (`PnDTnHnMn.nS`) to whole milliseconds.

    Follows Java's `Duration.parse`, which Kafka uses for `by_duration:`: days are the
    largest unit, and a negative total is rejected (Kafka refuses to reset into the
    future). Raises ValueError saying what is wrong.
    """
    match = _DURATION.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not an ISO-8601 duration of the form PnDTnHnMn.nS")
    sign, days, t_part, hours, minutes, seconds, fraction = match.groups()
    if days is None and t_part is None:
        raise ValueError(f"{text!r} has no duration parts")
    if t_part is not None and hours is None and minutes is None and seconds is None:
        raise ValueError(f"{text!r} has a 'T' with no hours, minutes or seconds after it")
    nanos = (
        int(days or 0) * 86_400 * 10**9
        + int(hours or 0) * 3_600 * 10**9
        + int(minutes or 0) * 60 * 10**9
    )
    if seconds is not None:
        fraction_nanos = int((fraction or "").ljust(9, "0"))
        whole = int(seconds)
        nanos += whole * 10**9 + (-fraction_nanos if seconds.startswith("-") else fraction_nanos)
    if sign == "-":
        nanos = -nanos
    if nanos < 0:
        raise ValueError(f"{text!r} is negative; a negative duration is not allowed")
    return nanos // 10**6


@dataclass(frozen=True, slots=True)
class AutoOffsetReset:
    """A parsed `share.auto.offset.reset`: where a new share-partition starts."""

    type: Literal["latest", "earliest", "by_duration"]
    duration_ms: int | None = None
    # The text as configured, so describe shows what the user wrote.
    text: str = ""

    def __str__(self) -> str:
        return self.text or self.type

    def timestamp(self, now_ms: int) -> int:
        """The ListOffsets timestamp to look up: -1 latest, -2 earliest, or now - duration."""
        if self.type == "latest":
            return LATEST_TIMESTAMP
        if self.type == "earliest":
            return EARLIEST_TIMESTAMP
        assert self.duration_ms is not None
        return now_ms - self.duration_ms


def parse_auto_offset_reset(value: str) -> AutoOffsetReset:
    """Parse `latest`, `earliest` or `by_duration:<ISO-8601 duration>`; ValueError if bad.

    Matching is case-sensitive, as in Kafka (`LATEST` is rejected).
    """
    if value in ("latest", "earliest"):
        return AutoOffsetReset(value, None, value)  # type: ignore[arg-type]
    if value == "by_duration":
        raise ValueError("the <duration> part is missing after by_duration")
    if value.startswith("by_duration:"):
        duration_ms = parse_iso8601_duration_ms(value.removeprefix("by_duration:"))
        return AutoOffsetReset("by_duration", duration_ms, value)
    raise ValueError(
        "the value must be either 'earliest', 'latest' or of the format "
        "'by_duration:<PnDTnHnMn.nS>'"
    )


# ---------------------------------------------------------------------------
# Parsing and validation


def _invalid(name: str, value: object, why: str) -> KafkaError:
    return KafkaError(
        ErrorCode.invalid_config, f"Invalid value {value!r} for configuration {name}: {why}"
    )


def _parse_int(name: str, value: object) -> int:
    if isinstance(value, bool):
        raise _invalid(name, value, "expected an integer")
    if isinstance(value, int):
        parsed = value
    elif isinstance(value, str) and re.fullmatch(r"[-+]?\d+", value.strip()):
        parsed = int(value.strip())
    else:
        raise _invalid(name, value, "expected an integer")
    if not -(2**31) <= parsed <= INT32_MAX:
        raise _invalid(name, value, "not a 32-bit integer")
    return parsed


def _parse_bool(name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise _invalid(name, value, "expected a boolean (true or false)")


def _parse(definition: ConfigDef, value: object) -> ConfigValue:
    """Parse by type and check the fixed bounds; broker bounds are checked separately."""
    name = definition.name
    if value is None:
        raise _invalid(name, value, "a value is required")
    if definition.type == BOOLEAN:
        return _parse_bool(name, value)
    if definition.type == STRING:
        if not isinstance(value, str):
            raise _invalid(name, value, "expected a string")
        if name == "share.auto.offset.reset":
            try:
                parse_auto_offset_reset(value)
            except ValueError as e:
                raise _invalid(name, value, str(e)) from None
        elif name == "share.isolation.level" and value not in ISOLATION_LEVELS:
            raise _invalid(name, value, f"must be one of {', '.join(ISOLATION_LEVELS)}")
        elif name == DLQ_TOPIC_NAME and value.startswith("__"):
            # Kafka's GroupConfig.validate: the names of internal topics.
            raise _invalid(name, value, INTERNAL_TOPIC_PROBLEM)
        return value
    parsed = _parse_int(name, value)
    if definition.min is not None and parsed < definition.min:
        raise _invalid(name, value, f"value must be at least {definition.min}")
    if definition.max is not None and parsed > definition.max:
        raise _invalid(name, value, f"value must be no more than {definition.max}")
    return parsed


def _definition(name: str) -> ConfigDef:
    """A group config's definition: a share group's (`GROUP_CONFIG_DEFS`) or a consumer
    group's (`CONSUMER_GROUP_CONFIG_DEFS`); both live in one namespace, as Kafka's
    GroupConfig holds them all."""
    definition = GROUP_CONFIG_DEFS.get(name) or CONSUMER_GROUP_CONFIG_DEFS.get(name)
    if definition is None:
        raise KafkaError(ErrorCode.invalid_config, f"Unknown group config name: {name}")
    return definition


def validate(name: str, value: object, broker: ShareGroupBrokerConfig | None = None) -> ConfigValue:
    """Check one group config value and return it parsed (int, str or bool).

    Raises KafkaError(INVALID_CONFIG) naming the key and the reason: unknown name,
    wrong type, below Kafka's floor, or outside the broker's `group.share.min.*` /
    `group.share.max.*` bounds.
    """
    broker = broker or ShareGroupBrokerConfig()
    definition = _definition(name)
    parsed = _parse(definition, value)
    if isinstance(parsed, int) and not isinstance(parsed, bool):
        if definition.broker_min is not None and parsed < broker.value(definition.broker_min):
            raise _invalid(
                name,
                value,
                f"must be greater than or equal to {definition.broker_min} "
                f"({broker.value(definition.broker_min)})",
            )
        if definition.broker_max is not None and parsed > broker.value(definition.broker_max):
            raise _invalid(
                name,
                value,
                f"must be less than or equal to {definition.broker_max} "
                f"({broker.value(definition.broker_max)})",
            )
    return parsed


def validate_all(
    configs: Mapping[str, object], broker: ShareGroupBrokerConfig | None = None
) -> dict[str, ConfigValue]:
    """Validate a group's whole set of overrides, including rules across keys.

    As Kafka does, the session timeout must exceed the heartbeat interval, taking the
    broker default for whichever of the two is not overridden.
    """
    broker = broker or ShareGroupBrokerConfig()
    parsed = {name: validate(name, value, broker) for name, value in configs.items()}
    session = parsed.get("share.session.timeout.ms", broker.session_timeout_ms)
    heartbeat = parsed.get("share.heartbeat.interval.ms", broker.heartbeat_interval_ms)
    assert isinstance(session, int) and isinstance(heartbeat, int)
    if session <= heartbeat:
        raise KafkaError(
            ErrorCode.invalid_config,
            f"share.session.timeout.ms ({session}) must be greater than "
            f"share.heartbeat.interval.ms ({heartbeat})",
        )
    return parsed


# ---------------------------------------------------------------------------
# Broker-level defaults and the effective per-group config


def _field_name(key: str) -> str:
    return key.removeprefix("group.share.").replace(".", "_")


@dataclass(frozen=True, slots=True)
class ShareGroupBrokerConfig:
    """The broker's `group.share.*` values: group defaults, their bounds, and limits."""

    session_timeout_ms: int = 45000
    min_session_timeout_ms: int = 45000
    max_session_timeout_ms: int = 60000
    heartbeat_interval_ms: int = 5000
    min_heartbeat_interval_ms: int = 5000
    max_heartbeat_interval_ms: int = 15000
    max_size: int = 200
    record_lock_duration_ms: int = 30000
    min_record_lock_duration_ms: int = 15000
    max_record_lock_duration_ms: int = 60000
    delivery_count_limit: int = 5
    min_delivery_count_limit: int = 2
    max_delivery_count_limit: int = 10
    partition_max_record_locks: int = 2000
    min_partition_max_record_locks: int = 100
    max_partition_max_record_locks: int = 4000
    max_share_sessions: int = 2000
    initialize_retry_interval_ms: int = 30000

    def value(self, key: str) -> int:
        """The value of a broker key by its Kafka name, e.g. `group.share.max.size`."""
        if key not in BROKER_CONFIG_DEFS:
            raise KeyError(key)
        result: int = getattr(self, _field_name(key))
        return result

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> ShareGroupBrokerConfig:
        """Build from broker config values keyed by Kafka name; other keys are ignored.

        Checks each value's range and the relations Kafka requires between them
        (min <= default <= max, `group.share.max.share.sessions` >= `group.share.max.size`,
        heartbeat interval below session timeout); raises KafkaError(INVALID_CONFIG).
        """
        kwargs: dict[str, int] = {}
        for key, definition in BROKER_CONFIG_DEFS.items():
            if key in values:
                parsed = _parse(definition, values[key])
                assert isinstance(parsed, int)
                kwargs[_field_name(key)] = parsed
        config = cls(**kwargs)
        config._check()
        return config

    def _check(self) -> None:
        def require(ok: bool, message: str) -> None:
            if not ok:
                raise KafkaError(ErrorCode.invalid_config, message)

        for name in (
            "session.timeout.ms",
            "heartbeat.interval.ms",
            "record.lock.duration.ms",
            "delivery.count.limit",
            "partition.max.record.locks",
        ):
            lo, value, hi = (self.value(f"group.share.{p}{name}") for p in ("min.", "", "max."))
            require(
                lo <= value,
                f"group.share.{name} must be greater than or equal to group.share.min.{name}",
            )
            require(
                value <= hi,
                f"group.share.max.{name} must be greater than or equal to group.share.{name}",
            )
        require(
            self.heartbeat_interval_ms < self.session_timeout_ms,
            "group.share.heartbeat.interval.ms must be less than group.share.session.timeout.ms",
        )
        require(
            self.max_share_sessions >= self.max_size,
            "group.share.max.share.sessions must be greater than or equal to group.share.max.size",
        )

    def items(self) -> list[tuple[str, int]]:
        """Every broker key with its value, in Kafka names (for DescribeConfigs BROKER)."""
        return [(key, self.value(key)) for key in BROKER_CONFIG_DEFS]


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """The effective share configs of one group: its overrides over the broker defaults."""

    session_timeout_ms: int = 45000
    heartbeat_interval_ms: int = 5000
    record_lock_duration_ms: int = 30000
    delivery_count_limit: int = 5
    partition_max_record_locks: int = 2000
    auto_offset_reset: AutoOffsetReset = field(
        default_factory=lambda: AutoOffsetReset("latest", None, "latest")
    )
    isolation_level: Literal["read_uncommitted", "read_committed"] = "read_uncommitted"
    renew_acknowledge_enable: bool = True
    # `group.share.max.size`: broker-wide, carried here so a group needs one object.
    max_size: int = 200
    # `group.share.initialize.retry.interval.ms` (broker-wide), at least
    # `offsets.commit.timeout.ms` as Kafka uses it.
    initialize_retry_interval_ms: int = 30000
    # KIP-1191: `errors.deadletterqueue.topic.name` ("" = no dead-letter topic) and
    # `errors.deadletterqueue.copy.record.enable` (copy key and value, not only headers).
    dead_letter_topic: str = ""
    dead_letter_copy_record: bool = False

    @property
    def dead_letter_enabled(self) -> bool:
        """Whether records this group gives up on go through ARCHIVING to a dead-letter
        topic (KIP-1191) instead of straight to ARCHIVED."""
        return self.dead_letter_topic != ""

    @classmethod
    def effective(
        cls, overrides: Mapping[str, ConfigValue], broker: ShareGroupBrokerConfig | None = None
    ) -> GroupConfig:
        """Combine a group's (already parsed) overrides with the broker defaults.

        An override outside the broker's current min/max is clamped into it, as
        Kafka's `GroupConfig.evaluate` does for values stored before a bound changed.
        """
        broker = broker or ShareGroupBrokerConfig()

        def number(name: str) -> int:
            definition = GROUP_CONFIG_DEFS[name]
            assert definition.broker_synonym and definition.broker_min and definition.broker_max
            raw = overrides.get(name, broker.value(definition.broker_synonym))
            assert isinstance(raw, int)
            lo, hi = broker.value(definition.broker_min), broker.value(definition.broker_max)
            return max(lo, min(hi, raw))

        reset = overrides.get("share.auto.offset.reset", "latest")
        isolation = overrides.get("share.isolation.level", "read_uncommitted")
        renew = overrides.get("share.renew.acknowledge.enable", True)
        dlq_topic = overrides.get("errors.deadletterqueue.topic.name", "")
        dlq_copy = overrides.get("errors.deadletterqueue.copy.record.enable", False)
        assert isinstance(reset, str) and isinstance(renew, bool)
        assert isinstance(dlq_topic, str) and isinstance(dlq_copy, bool)
        assert isolation in ISOLATION_LEVELS
        return cls(
            session_timeout_ms=number("share.session.timeout.ms"),
            heartbeat_interval_ms=number("share.heartbeat.interval.ms"),
            record_lock_duration_ms=number("share.record.lock.duration.ms"),
            delivery_count_limit=number("share.delivery.count.limit"),
            partition_max_record_locks=number("share.partition.max.record.locks"),
            auto_offset_reset=parse_auto_offset_reset(reset),
            isolation_level=isolation,  # type: ignore[arg-type]
            renew_acknowledge_enable=renew,
            max_size=broker.max_size,
            initialize_retry_interval_ms=max(
                broker.initialize_retry_interval_ms, OFFSETS_COMMIT_TIMEOUT_MS
            ),
            dead_letter_topic=dlq_topic,
            dead_letter_copy_record=dlq_copy,
        )

    def value(self, name: str) -> ConfigValue:
        """The effective value of a group config by its Kafka name."""
        _definition(name)
        attr = _DLQ_FIELDS.get(name) or name.removeprefix("share.").replace(".", "_")
        result: ConfigValue | AutoOffsetReset = getattr(self, attr)
        return str(result) if isinstance(result, AutoOffsetReset) else result


# GroupConfig fields of the keys not named share.*.
_DLQ_FIELDS = {
    DLQ_TOPIC_NAME: "dead_letter_topic",
    DLQ_COPY_RECORD_ENABLE: "dead_letter_copy_record",
}


# ---------------------------------------------------------------------------
# Dead-letter topics (KIP-1191): the broker's keys and the checks of a group's topic


# Kafka's GroupCoordinatorConfig keys of KIP-1191; reconfigurable, as Kafka lists them in
# GroupCoordinatorConfig.RECONFIGURABLE_CONFIGS.
DLQ_BROKER_CONFIG_DEFS: dict[str, ConfigDef] = {
    d.name: d
    for d in [
        ConfigDef(
            DLQ_TOPIC_NAME_PREFIX,
            STRING,
            "dlq.",
            "The prefix every share group's dead-letter topic name must start with; empty "
            "for no restriction on the names.",
        ),
        ConfigDef(
            DLQ_AUTO_CREATE_TOPICS_ENABLE,
            BOOLEAN,
            False,
            "Whether a share group may name a dead-letter topic that does not exist yet: "
            "it is created (with errors.deadletterqueue.group.enable=true) when the "
            "first record is dead-lettered.",
        ),
    ]
}

INTERNAL_TOPIC_PROBLEM = "a dead-letter topic name must not start with '__' (internal topics)"


def topic_dead_letter_enabled(topic_configs: Mapping[str, str]) -> bool:
    """A topic's effective `errors.deadletterqueue.group.enable` from its stored
    overrides (the key has no broker synonym: false unless set)."""
    return topic_configs.get(DLQ_GROUP_ENABLE, "false").strip().lower() == "true"


def dead_letter_topic_problem(
    group_id: str,
    topic: str,
    *,
    prefix: str,
    auto_create: bool,
    topic_configs: Mapping[str, str] | None,
    consumed: Collection[str] = (),
) -> str | None:
    """Why share group `group_id` may not write dead letters to `topic`, or None if it
    may; "" (no dead-letter topic) is always allowed.

    `prefix` and `auto_create` are the broker's `errors.deadletterqueue.topic.name.prefix`
    and `errors.deadletterqueue.auto.create.topics.enable`; `topic_configs` the topic's
    stored overrides, None if it does not exist; `consumed` the topics the group reads
    (its members' subscriptions and the topics it has share state on). KIP-1191 has a
    group write only into a topic made for it, so no group can write into an arbitrary
    topic: checked, in this order, when the group config is set (INVALID_CONFIG) and
    again when a copy is written (the copy is refused).
    """
    if topic == "":
        return None
    if topic.startswith("__"):
        return INTERNAL_TOPIC_PROBLEM
    if prefix and not topic.startswith(prefix):
        return (
            f"the topic name must start with {prefix!r}, the prefix the brokers' "
            f"{DLQ_TOPIC_NAME_PREFIX} requires of dead-letter topics"
        )
    if topic_configs is None:
        if auto_create:
            return None
        return (
            f"topic {topic!r} does not exist; create it with {DLQ_GROUP_ENABLE}=true "
            f"(the brokers' {DLQ_AUTO_CREATE_TOPICS_ENABLE} is false)"
        )
    if not topic_dead_letter_enabled(topic_configs):
        return (
            f"topic {topic!r} does not have {DLQ_GROUP_ENABLE}=true; set it on the "
            "topic to let share groups write dead letters to it"
        )
    if topic in consumed:
        return (
            f"topic {topic!r} is a topic share group {group_id!r} consumes; a group "
            "cannot write its dead letters to its own source topic"
        )
    return None


def check_dead_letter_topic(
    group_id: str,
    topic: str,
    *,
    prefix: str,
    auto_create: bool,
    topic_configs: Mapping[str, str] | None,
    consumed: Collection[str] = (),
) -> None:
    """`dead_letter_topic_problem` as Kafka's error: INVALID_CONFIG naming
    `errors.deadletterqueue.topic.name`, the value and why."""
    problem = dead_letter_topic_problem(
        group_id,
        topic,
        prefix=prefix,
        auto_create=auto_create,
        topic_configs=topic_configs,
        consumed=consumed,
    )
    if problem is not None:
        raise _invalid(DLQ_TOPIC_NAME, topic, problem)


# ---------------------------------------------------------------------------
# The store


# IncrementalAlterConfigs operations (Kafka's `AlterConfigOp.OpType`).
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3

# DescribeConfigs ConfigSource values.
DEFAULT_CONFIG_SOURCE = 5
GROUP_CONFIG_SOURCE = 8


@dataclass(frozen=True, slots=True)
class AlterConfigOp:
    """One IncrementalAlterConfigs entry for a GROUP resource."""

    name: str
    op: int
    value: str | None = None


@dataclass(frozen=True, slots=True)
class GroupConfigRecord:
    """A durable change of one group config (Kafka's ConfigRecord); value None deletes."""

    group_id: str
    name: str
    value: str | None


@dataclass(frozen=True, slots=True)
class GroupConfigEntry:
    """One row of DescribeConfigs for a GROUP resource."""

    name: str
    value: str
    source: int
    is_default: bool
    type: ConfigType
    doc: str
    read_only: bool = False


def _to_text(value: ConfigValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class GroupConfigStore:
    """Group config overrides keyed by group id, for groups that may not exist yet.

    Alter methods validate and return records without changing anything; `replay`
    is the only mutator, so the store recovers by replaying its records.
    """

    def __init__(
        self,
        broker: ShareGroupBrokerConfig | None = None,
        coordinator: GroupCoordinatorConfig | None = None,
    ) -> None:
        self.broker = broker or ShareGroupBrokerConfig()
        # The group.consumer.* defaults and bounds the consumer.* keys are checked with.
        self.coordinator = coordinator or GroupCoordinatorConfig()
        self._overrides: dict[str, dict[str, ConfigValue]] = {}

    def _validate(self, configs: Mapping[str, object]) -> dict[str, ConfigValue]:
        """A group's whole set of overrides checked: the share keys (`validate_all`) and
        the consumer keys (`validate_consumer_configs`), each with its broker bounds."""
        consumer = {n: v for n, v in configs.items() if n in CONSUMER_GROUP_CONFIG_DEFS}
        share = {n: v for n, v in configs.items() if n not in CONSUMER_GROUP_CONFIG_DEFS}
        parsed: dict[str, ConfigValue] = dict(validate_all(share, self.broker))
        parsed.update(validate_consumer_configs(consumer, self.coordinator))
        return parsed

    def group_ids(self) -> list[str]:
        """Groups that have at least one override."""
        return sorted(self._overrides)

    def overrides(self, group_id: str) -> dict[str, ConfigValue]:
        """The group's own values (no defaults)."""
        return dict(self._overrides.get(group_id, {}))

    def config(self, group_id: str) -> GroupConfig:
        """The effective config of a group (overrides over broker defaults)."""
        return GroupConfig.effective(self._overrides.get(group_id, {}), self.broker)

    def incremental_alter(
        self, group_id: str, ops: Iterable[AlterConfigOp]
    ) -> list[GroupConfigRecord]:
        """Validate IncrementalAlterConfigs ops; return the records that apply them.

        The resulting set of overrides is validated as a whole; nothing is changed
        until the records are replayed (validate_only callers simply drop them).
        """
        current: dict[str, object] = dict(self._overrides.get(group_id, {}))
        changed: dict[str, str | None] = {}
        for op in ops:
            _definition(op.name)
            if op.op == SET:
                current[op.name] = op.value
                changed[op.name] = op.value
            elif op.op == DELETE:
                current.pop(op.name, None)
                changed[op.name] = None
            elif op.op in (APPEND, SUBTRACT):
                verb = "append" if op.op == APPEND else "subtract"
                raise KafkaError(
                    ErrorCode.invalid_config,
                    f"Config value {verb} is not allowed for config key: {op.name}",
                )
            else:
                raise KafkaError(ErrorCode.invalid_request, f"Unknown config operation {op.op}")
        parsed = self._validate(current)
        return [
            GroupConfigRecord(group_id, name, None if value is None else _to_text(parsed[name]))
            for name, value in changed.items()
        ]

    def alter(self, group_id: str, configs: Mapping[str, str | None]) -> list[GroupConfigRecord]:
        """Validate a legacy AlterConfigs: the given set replaces all overrides."""
        wanted = {name: value for name, value in configs.items() if value is not None}
        for name in configs:
            _definition(name)
        parsed = self._validate(wanted)
        records = [
            GroupConfigRecord(group_id, name, None)
            for name in self._overrides.get(group_id, {})
            if name not in parsed
        ]
        records += [GroupConfigRecord(group_id, n, _to_text(v)) for n, v in parsed.items()]
        return records

    @staticmethod
    def text(value: ConfigValue) -> str:
        """A parsed value as a record stores it."""
        return _to_text(value)

    def replay(self, record: GroupConfigRecord) -> None:
        """Apply one record; the only method that changes the store."""
        if record.value is None:
            group = self._overrides.get(record.group_id)
            if group is not None:
                group.pop(record.name, None)
                if not group:
                    del self._overrides[record.group_id]
            return
        # Stored values are parsed by type only: broker bounds may since have changed,
        # and GroupConfig.effective clamps.
        value = _parse(_definition(record.name), record.value)
        self._overrides.setdefault(record.group_id, {})[record.name] = value

    def describe(self, group_id: str, names: Iterable[str] | None = None) -> list[GroupConfigEntry]:
        """DescribeConfigs rows for a group: every group config (consumer.* and share.*,
        as Kafka lists all of GroupConfig's keys whatever the group's type), or `names`."""
        overrides = self._overrides.get(group_id, {})
        effective = self.config(group_id)
        consumer = ConsumerGroupConfig.effective(overrides, self.coordinator)
        entries = []
        every = [*CONSUMER_GROUP_CONFIG_DEFS, *GROUP_CONFIG_DEFS]
        for name in every if names is None else names:
            definition = _definition(name)
            is_override = name in overrides
            value = (
                consumer.value(name)
                if name in CONSUMER_GROUP_CONFIG_DEFS
                else effective.value(name)
            )
            entries.append(
                GroupConfigEntry(
                    name=name,
                    value=_to_text(value),
                    source=GROUP_CONFIG_SOURCE if is_override else DEFAULT_CONFIG_SOURCE,
                    is_default=not is_override,
                    type=definition.type,
                    doc=definition.doc,
                )
            )
        return entries


# Keep the dataclass fields and the broker keys in step.
assert {f.name for f in fields(ShareGroupBrokerConfig)} == {
    _field_name(k) for k in BROKER_CONFIG_DEFS
}


# ---------------------------------------------------------------------------
# The group coordinator's broker keys: consumer and classic groups, offsets


# The server-side assignors spool offers: Kafka's built-in `UniformAssignor` and
# `RangeAssignor`. Kafka also loads assignor classes by name; spool has none to load.
BUILTIN_CONSUMER_ASSIGNORS = ("uniform", "range")
# Kafka's `ConsumerGroupMigrationPolicy`, matched without regard to case.
MIGRATION_POLICIES = ("disabled", "upgrade", "downgrade", "bidirectional")


def _assignors_problem(value: str) -> str | None:
    names = [name.strip() for name in value.split(",")]
    if names == [""]:
        return "at least one assignor is required"
    if len(set(names)) != len(names):
        return "an assignor is listed twice"
    unknown = [name for name in names if name not in BUILTIN_CONSUMER_ASSIGNORS]
    if unknown:
        return (
            f"unknown assignor {unknown[0]!r}: the built-in assignors are "
            f"{', '.join(BUILTIN_CONSUMER_ASSIGNORS)} (spool loads no assignor classes)"
        )
    return None


def _migration_policy_problem(value: str) -> str | None:
    if value.strip().lower() in MIGRATION_POLICIES:
        return None
    return f"must be one of {', '.join(MIGRATION_POLICIES)} (in any case)"


def _coordinator_key(
    name: str,
    kind: ConfigType,
    default: Any,
    doc: str,
    *,
    min: int | None = None,
    validator: Callable[[Any], str | None] | None = None,
) -> ConfigDef:
    # Read-only: Kafka 4.2 does not reconfigure any of them dynamically.
    return ConfigDef(name, kind, default, doc, validator, read_only=True, min=min)


# Kafka 4.2's `GroupCoordinatorConfig` keys for consumer and classic groups and offsets,
# with its defaults and fixed bounds.
GROUP_COORDINATOR_CONFIG_DEFS: dict[str, ConfigDef] = {
    d.name: d
    for d in [
        _coordinator_key(
            "group.consumer.session.timeout.ms",
            INT,
            45000,
            "How long a consumer group member (consumer protocol) may go without a "
            "heartbeat before it is removed from the group.",
            min=1,
        ),
        _coordinator_key(
            "group.consumer.min.session.timeout.ms",
            INT,
            45000,
            "The smallest session timeout a consumer group may be configured with.",
            min=1,
        ),
        _coordinator_key(
            "group.consumer.max.session.timeout.ms",
            INT,
            60000,
            "The largest session timeout a consumer group may be configured with.",
            min=1,
        ),
        _coordinator_key(
            "group.consumer.heartbeat.interval.ms",
            INT,
            5000,
            "The heartbeat interval the coordinator tells consumer group members to use.",
            min=1,
        ),
        _coordinator_key(
            "group.consumer.min.heartbeat.interval.ms",
            INT,
            5000,
            "The smallest heartbeat interval a consumer group may be configured with.",
            min=1,
        ),
        _coordinator_key(
            "group.consumer.max.heartbeat.interval.ms",
            INT,
            15000,
            "The largest heartbeat interval a consumer group may be configured with.",
            min=1,
        ),
        _coordinator_key(
            "group.consumer.max.size",
            INT,
            INT32_MAX,
            "The most members a consumer group (consumer protocol) may have; classic "
            "groups are bounded by group.max.size.",
            min=1,
        ),
        _coordinator_key(
            "group.consumer.assignors",
            LIST,
            ",".join(BUILTIN_CONSUMER_ASSIGNORS),
            "The server-side assignors of consumer groups, by name; the first is used "
            "for members that ask for none. Built in: uniform, range.",
            validator=_assignors_problem,
        ),
        _coordinator_key(
            "group.consumer.migration.policy",
            STRING,
            "bidirectional",
            "Whether a non-empty classic group may become a consumer group and back as "
            "members switch protocols: disabled, upgrade, downgrade or bidirectional. "
            "Empty groups are always converted.",
            validator=_migration_policy_problem,
        ),
        _coordinator_key(
            "group.consumer.regex.refresh.interval.ms",
            INT,
            600000,
            "How often the topics matching a consumer group's subscribed regular "
            "expressions are looked up again.",
            min=10000,
        ),
        _coordinator_key(
            "group.min.session.timeout.ms",
            INT,
            6000,
            "The smallest session timeout a classic group member may ask for.",
        ),
        _coordinator_key(
            "group.max.session.timeout.ms",
            INT,
            1800000,
            "The largest session timeout a classic group member may ask for.",
        ),
        _coordinator_key(
            "group.initial.rebalance.delay.ms",
            INT,
            3000,
            "How long a new classic group waits for more members to join before its "
            "first rebalance.",
        ),
        _coordinator_key(
            "group.max.size",
            INT,
            INT32_MAX,
            "The most members a classic group may have.",
            min=1,
        ),
        _coordinator_key(
            "offsets.retention.minutes",
            INT,
            7 * 24 * 60,
            "How long committed offsets are kept once their group is empty (or, for a "
            "group no longer subscribed to the topic or a group without members, since "
            "the last commit).",
            min=1,
        ),
        _coordinator_key(
            "offsets.retention.check.interval.ms",
            LONG,
            600000,
            "How often expired committed offsets are looked for.",
            min=1,
        ),
        _coordinator_key(
            "offset.metadata.max.bytes",
            INT,
            4096,
            "The longest metadata string an offset commit may carry.",
        ),
        _coordinator_key(
            "offsets.commit.timeout.ms",
            INT,
            OFFSETS_COMMIT_TIMEOUT_MS,
            "How long a write of the group coordinator may take before it is answered "
            "with a timeout.",
            min=1,
        ),
    ]
}

# GroupCoordinatorConfig field -> the Kafka key it holds.
_COORDINATOR_FIELDS = {
    "consumer_group_session_timeout_ms": "group.consumer.session.timeout.ms",
    "consumer_group_min_session_timeout_ms": "group.consumer.min.session.timeout.ms",
    "consumer_group_max_session_timeout_ms": "group.consumer.max.session.timeout.ms",
    "consumer_group_heartbeat_interval_ms": "group.consumer.heartbeat.interval.ms",
    "consumer_group_min_heartbeat_interval_ms": "group.consumer.min.heartbeat.interval.ms",
    "consumer_group_max_heartbeat_interval_ms": "group.consumer.max.heartbeat.interval.ms",
    "consumer_group_max_size": "group.consumer.max.size",
    "consumer_group_assignors": "group.consumer.assignors",
    "consumer_group_migration_policy": "group.consumer.migration.policy",
    "consumer_group_regex_refresh_interval_ms": "group.consumer.regex.refresh.interval.ms",
    "classic_group_min_session_timeout_ms": "group.min.session.timeout.ms",
    "classic_group_max_session_timeout_ms": "group.max.session.timeout.ms",
    "classic_group_initial_rebalance_delay_ms": "group.initial.rebalance.delay.ms",
    "classic_group_max_size": "group.max.size",
    "offsets_retention_minutes": "offsets.retention.minutes",
    "offsets_retention_check_interval_ms": "offsets.retention.check.interval.ms",
    "offset_metadata_max_bytes": "offset.metadata.max.bytes",
    "offsets_commit_timeout_ms": "offsets.commit.timeout.ms",
}


def _coordinator_value(definition: ConfigDef, value: object) -> int | str:
    """A broker key's value parsed by type and checked against its fixed rules."""
    name = definition.name
    parsed: int | str
    if definition.type in (INT, LONG):
        if isinstance(value, bool) or not (
            isinstance(value, int)
            or (isinstance(value, str) and re.fullmatch(r"[-+]?\d+", value.strip()))
        ):
            raise _invalid(name, value, "expected an integer")
        parsed = int(value)
        limit = INT32_MAX if definition.type == INT else 2**63 - 1
        if not -limit - 1 <= parsed <= limit:
            raise _invalid(name, value, "out of range")
    elif isinstance(value, str):
        parsed = value.strip()
    else:
        raise _invalid(name, value, "expected a string")
    problem = definition.problem(parsed)
    if problem:
        raise _invalid(name, value, problem)
    return parsed


@dataclass(frozen=True, slots=True)
class GroupCoordinatorConfig:
    """The group coordinator's broker keys, one frozen object (Kafka's
    `GroupCoordinatorConfig`): consumer groups, classic groups, offsets, and the
    `group.share.*` keys (`share`)."""

    consumer_group_session_timeout_ms: int = 45000
    consumer_group_min_session_timeout_ms: int = 45000
    consumer_group_max_session_timeout_ms: int = 60000
    consumer_group_heartbeat_interval_ms: int = 5000
    consumer_group_min_heartbeat_interval_ms: int = 5000
    consumer_group_max_heartbeat_interval_ms: int = 15000
    consumer_group_max_size: int = INT32_MAX
    consumer_group_assignors: tuple[str, ...] = BUILTIN_CONSUMER_ASSIGNORS
    consumer_group_migration_policy: str = "bidirectional"
    consumer_group_regex_refresh_interval_ms: int = 600000
    classic_group_min_session_timeout_ms: int = 6000
    classic_group_max_session_timeout_ms: int = 1800000
    classic_group_initial_rebalance_delay_ms: int = 3000
    classic_group_max_size: int = INT32_MAX
    offsets_retention_minutes: int = 7 * 24 * 60
    offsets_retention_check_interval_ms: int = 600000
    offset_metadata_max_bytes: int = 4096
    offsets_commit_timeout_ms: int = OFFSETS_COMMIT_TIMEOUT_MS
    share: ShareGroupBrokerConfig = field(default_factory=ShareGroupBrokerConfig)

    @property
    def offsets_retention_ms(self) -> int:
        return self.offsets_retention_minutes * 60_000

    @property
    def consumer_group_default_assignor(self) -> str:
        """The assignor of members that name none: the first listed."""
        return self.consumer_group_assignors[0]

    def value(self, key: str) -> int | str:
        """A key's value by its Kafka name, e.g. `group.consumer.max.size` (a list as
        Kafka writes it, comma-separated)."""
        if key in BROKER_CONFIG_DEFS:
            return self.share.value(key)
        for attr, name in _COORDINATOR_FIELDS.items():
            if name == key:
                result: int | str | tuple[str, ...] = getattr(self, attr)
                return ",".join(result) if isinstance(result, tuple) else result
        raise KeyError(key)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> GroupCoordinatorConfig:
        """Build from broker config values keyed by Kafka name (other keys are
        ignored), checking each value's own rules and the relations Kafka requires
        between them; raises KafkaError(INVALID_CONFIG)."""
        kwargs: dict[str, Any] = {}
        for attr, key in _COORDINATOR_FIELDS.items():
            if key in values:
                kwargs[attr] = _coordinator_value(GROUP_COORDINATOR_CONFIG_DEFS[key], values[key])
        if "consumer_group_assignors" in kwargs:
            kwargs["consumer_group_assignors"] = tuple(
                name.strip() for name in kwargs["consumer_group_assignors"].split(",")
            )
        if "consumer_group_migration_policy" in kwargs:
            kwargs["consumer_group_migration_policy"] = kwargs[
                "consumer_group_migration_policy"
            ].lower()
        config = cls(share=ShareGroupBrokerConfig.from_mapping(values), **kwargs)
        config._check()
        return config

    def _check(self) -> None:
        # Kafka's GroupCoordinatorConfig constructor, consumer group part, in its order.
        def require(ok: bool, message: str) -> None:
            if not ok:
                raise KafkaError(ErrorCode.invalid_config, message)

        for name in ("heartbeat.interval.ms", "session.timeout.ms"):
            lo, value, hi = (self.value(f"group.consumer.{p}{name}") for p in ("min.", "", "max."))
            assert isinstance(lo, int) and isinstance(value, int) and isinstance(hi, int)
            require(
                hi >= lo,
                f"group.consumer.max.{name} must be greater than or equal to "
                f"group.consumer.min.{name}",
            )
            require(
                value >= lo,
                f"group.consumer.{name} must be greater than or equal to group.consumer.min.{name}",
            )
            require(
                value <= hi,
                f"group.consumer.{name} must be less than or equal to group.consumer.max.{name}",
            )
        require(
            self.consumer_group_heartbeat_interval_ms < self.consumer_group_session_timeout_ms,
            "group.consumer.heartbeat.interval.ms must be less than "
            "group.consumer.session.timeout.ms",
        )


assert set(_COORDINATOR_FIELDS.values()) == set(GROUP_COORDINATOR_CONFIG_DEFS)
assert set(_COORDINATOR_FIELDS) | {"share"} == {f.name for f in fields(GroupCoordinatorConfig)}


# ---------------------------------------------------------------------------
# Consumer group configs (Kafka's GroupConfig consumer.*)


CONSUMER_GROUP_CONFIG_DEFS: dict[str, ConfigDef] = {
    d.name: d
    for d in [
        ConfigDef(
            "consumer.session.timeout.ms",
            INT,
            45000,
            "How long a member of this consumer group may go without a heartbeat before "
            "it is removed.",
            min=1,
            broker_synonym="group.consumer.session.timeout.ms",
            broker_min="group.consumer.min.session.timeout.ms",
            broker_max="group.consumer.max.session.timeout.ms",
        ),
        ConfigDef(
            "consumer.heartbeat.interval.ms",
            INT,
            5000,
            "The heartbeat interval given to the members of this consumer group.",
            min=1,
            broker_synonym="group.consumer.heartbeat.interval.ms",
            broker_min="group.consumer.min.heartbeat.interval.ms",
            broker_max="group.consumer.max.heartbeat.interval.ms",
        ),
    ]
}


def validate_consumer_configs(
    configs: Mapping[str, object], coordinator: GroupCoordinatorConfig | None = None
) -> dict[str, int]:
    """Check a consumer group's `consumer.*` overrides as Kafka's `GroupConfig.validate`
    does and return them parsed: each within its floor and the broker's
    `group.consumer.min/max.*` keys, and the session timeout above the heartbeat
    interval (the broker's value standing in for whichever is not overridden).
    Raises KafkaError(INVALID_CONFIG) naming the key and the bound."""
    coordinator = coordinator or GroupCoordinatorConfig()
    parsed: dict[str, int] = {}
    for name, value in configs.items():
        definition = CONSUMER_GROUP_CONFIG_DEFS.get(name)
        if definition is None:
            raise KafkaError(ErrorCode.invalid_config, f"Unknown group config name: {name}")
        number = _parse(definition, value)
        assert isinstance(number, int)
        parsed[name] = number
    # Kafka checks the heartbeat interval's bounds, then the session timeout's.
    for name in ("consumer.heartbeat.interval.ms", "consumer.session.timeout.ms"):
        definition = CONSUMER_GROUP_CONFIG_DEFS[name]
        assert definition.broker_min and definition.broker_max
        if name not in parsed:
            continue
        if parsed[name] < int(coordinator.value(definition.broker_min)):
            raise _invalid(
                name,
                configs[name],
                f"{name} must be greater than or equal to {definition.broker_min} "
                f"({coordinator.value(definition.broker_min)})",
            )
        if parsed[name] > int(coordinator.value(definition.broker_max)):
            raise _invalid(
                name,
                configs[name],
                f"{name} must be less than or equal to {definition.broker_max} "
                f"({coordinator.value(definition.broker_max)})",
            )
    session = parsed.get(
        "consumer.session.timeout.ms", coordinator.consumer_group_session_timeout_ms
    )
    heartbeat = parsed.get(
        "consumer.heartbeat.interval.ms", coordinator.consumer_group_heartbeat_interval_ms
    )
    if session <= heartbeat:
        raise KafkaError(
            ErrorCode.invalid_config,
            f"consumer.session.timeout.ms ({session}) must be greater than "
            f"consumer.heartbeat.interval.ms ({heartbeat})",
        )
    return parsed


@dataclass(frozen=True, slots=True)
class ConsumerGroupConfig:
    """The effective `consumer.*` configs of one consumer group: its overrides, else
    the broker's `group.consumer.*` values. Kafka 4.2 reads a stored override as it
    is (no clamping into bounds narrowed since)."""

    session_timeout_ms: int = 45000
    heartbeat_interval_ms: int = 5000

    @classmethod
    def effective(
        cls, overrides: Mapping[str, ConfigValue], coordinator: GroupCoordinatorConfig
    ) -> ConsumerGroupConfig:
        session = overrides.get(
            "consumer.session.timeout.ms", coordinator.consumer_group_session_timeout_ms
        )
        heartbeat = overrides.get(
            "consumer.heartbeat.interval.ms", coordinator.consumer_group_heartbeat_interval_ms
        )
        assert isinstance(session, int) and isinstance(heartbeat, int)
        return cls(session_timeout_ms=session, heartbeat_interval_ms=heartbeat)

    def value(self, name: str) -> int:
        """The effective value of a `consumer.*` group config by its Kafka name."""
        if name == "consumer.session.timeout.ms":
            return self.session_timeout_ms
        if name == "consumer.heartbeat.interval.ms":
            return self.heartbeat_interval_ms
        raise KeyError(name)
