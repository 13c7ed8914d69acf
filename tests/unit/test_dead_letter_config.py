"""KIP-1191's configuration: the group, topic and broker keys of dead-letter topics with
Kafka's names and defaults, and the checks of a group's dead-letter topic when it is set
(IncrementalAlterConfigs on a real `MetadataStore`, fake partition logs and a fake group
coordinator)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from broker.authorizer import NO_AUTHORIZER
from broker.config import BROKER_KEYS, TOPIC_KEYS, BrokerConfig, load_static
from broker.handlers.cluster import FEATURES
from broker.handlers.configs import GROUP, TOPIC, describe_configs, incremental_alter_configs
from broker.handlers.topics import create_topics
from coordinator.group_config import (
    DEFAULT_CONFIG_SOURCE,
    DLQ_AUTO_CREATE_TOPICS_ENABLE,
    DLQ_COPY_RECORD_ENABLE,
    DLQ_GROUP_ENABLE,
    DLQ_TOPIC_NAME,
    DLQ_TOPIC_NAME_PREFIX,
    GROUP_CONFIG_DEFS,
    GROUP_CONFIG_SOURCE,
    SET,
    AlterConfigOp,
    GroupConfig,
    GroupConfigStore,
    dead_letter_topic_problem,
    topic_dead_letter_enabled,
    validate,
)
from coordinator.metadata import MetadataStore
from persister.commit import GroupCommit
from protocol.configs import ConfigType
from protocol.errors import ErrorCode, KafkaError

# -- the keys -------------------------------------------------------------------------


def test_group_keys_have_kafkas_names_types_and_defaults_and_no_broker_synonym() -> None:
    name, copy = GROUP_CONFIG_DEFS[DLQ_TOPIC_NAME], GROUP_CONFIG_DEFS[DLQ_COPY_RECORD_ENABLE]
    assert (name.name, name.type, name.default) == (
        "errors.deadletterqueue.topic.name",
        ConfigType.STRING,
        "",
    )
    assert (copy.name, copy.type, copy.default) == (
        "errors.deadletterqueue.copy.record.enable",
        ConfigType.BOOLEAN,
        False,
    )
    assert name.broker_synonym is None and copy.broker_synonym is None


def test_topic_key_defaults_to_false_with_no_broker_synonym() -> None:
    key = TOPIC_KEYS[DLQ_GROUP_ENABLE]
    assert (key.name, key.type, key.default, key.broker_synonym) == (
        "errors.deadletterqueue.group.enable",
        ConfigType.BOOLEAN,
        False,
        None,
    )
    assert BrokerConfig({}).topic_default(DLQ_GROUP_ENABLE) is False
    assert not topic_dead_letter_enabled({})
    assert not topic_dead_letter_enabled({DLQ_GROUP_ENABLE: "false"})
    assert topic_dead_letter_enabled({DLQ_GROUP_ENABLE: "true"})


def test_broker_keys_default_to_kafkas_and_are_dynamic() -> None:
    prefix, auto = BROKER_KEYS[DLQ_TOPIC_NAME_PREFIX], BROKER_KEYS[DLQ_AUTO_CREATE_TOPICS_ENABLE]
    assert (prefix.name, prefix.type, prefix.default) == (
        "errors.deadletterqueue.topic.name.prefix",
        ConfigType.STRING,
        "dlq.",
    )
    assert (auto.name, auto.type, auto.default) == (
        "errors.deadletterqueue.auto.create.topics.enable",
        ConfigType.BOOLEAN,
        False,
    )
    # Kafka's GroupCoordinatorConfig.RECONFIGURABLE_CONFIGS lists both.
    assert not prefix.read_only and not auto.read_only
    config = BrokerConfig({})
    assert config.get(DLQ_TOPIC_NAME_PREFIX) == "dlq."
    assert config.get(DLQ_AUTO_CREATE_TOPICS_ENABLE) is False


def test_broker_keys_come_from_the_environment_and_set() -> None:
    static = load_static(
        None,
        ["errors.deadletterqueue.auto.create.topics.enable=true"],
        {"SPOOL_ERRORS_DEADLETTERQUEUE_TOPIC_NAME_PREFIX": "dead."},
    )
    config = BrokerConfig(static)
    assert config.get(DLQ_TOPIC_NAME_PREFIX) == "dead."
    assert config.get(DLQ_AUTO_CREATE_TOPICS_ENABLE) is True
    assert BrokerConfig({DLQ_TOPIC_NAME_PREFIX: ""}).get(DLQ_TOPIC_NAME_PREFIX) == ""
    with pytest.raises(KafkaError) as e:
        BrokerConfig({DLQ_AUTO_CREATE_TOPICS_ENABLE: "yes"})
    assert e.value.code is ErrorCode.invalid_config
    assert DLQ_AUTO_CREATE_TOPICS_ENABLE in e.value.message


def test_share_version_is_advertised_and_finalized_at_2() -> None:
    assert FEATURES == [("share.version", 0, 2, 2)]


# -- the group's effective config and describe ------------------------------------------


def test_effective_config_reads_the_overrides_and_defaults_to_no_dead_letter_topic() -> None:
    default = GroupConfig.effective({})
    assert (default.dead_letter_topic, default.dead_letter_copy_record) == ("", False)
    assert not default.dead_letter_enabled
    assert default.value(DLQ_TOPIC_NAME) == "" and default.value(DLQ_COPY_RECORD_ENABLE) is False
    config = GroupConfig.effective({DLQ_TOPIC_NAME: "dlq.t", DLQ_COPY_RECORD_ENABLE: True})
    assert config.dead_letter_enabled and config.dead_letter_copy_record
    assert config.value(DLQ_TOPIC_NAME) == "dlq.t"


def test_store_persists_and_describes_the_dead_letter_keys() -> None:
    store = GroupConfigStore()
    described = {e.name: e for e in store.describe("g")}
    assert (described[DLQ_TOPIC_NAME].value, described[DLQ_TOPIC_NAME].source) == (
        "",
        DEFAULT_CONFIG_SOURCE,
    )
    assert described[DLQ_COPY_RECORD_ENABLE].value == "false"
    records = store.incremental_alter(
        "g",
        [
            AlterConfigOp(DLQ_TOPIC_NAME, SET, "dlq.t"),
            AlterConfigOp(DLQ_COPY_RECORD_ENABLE, SET, "TRUE"),
        ],
    )
    assert {(r.name, r.value) for r in records} == {
        (DLQ_TOPIC_NAME, "dlq.t"),
        (DLQ_COPY_RECORD_ENABLE, "true"),
    }
    for record in records:
        store.replay(record)
    described = {e.name: e for e in store.describe("g")}
    assert (described[DLQ_TOPIC_NAME].value, described[DLQ_TOPIC_NAME].source) == (
        "dlq.t",
        GROUP_CONFIG_SOURCE,
    )
    assert described[DLQ_COPY_RECORD_ENABLE].value == "true"
    assert store.config("g").dead_letter_topic == "dlq.t"


def test_internal_names_and_non_booleans_are_refused_by_the_value_check() -> None:
    with pytest.raises(KafkaError) as e:
        validate(DLQ_TOPIC_NAME, "__consumer_offsets")
    assert e.value.code is ErrorCode.invalid_config
    assert DLQ_TOPIC_NAME in e.value.message and "'__'" in e.value.message
    with pytest.raises(KafkaError) as e:
        validate(DLQ_COPY_RECORD_ENABLE, "maybe")
    assert DLQ_COPY_RECORD_ENABLE in e.value.message
    assert validate(DLQ_TOPIC_NAME, "") == ""


# -- dead_letter_topic_problem --------------------------------------------------------

OPTED_IN = {DLQ_GROUP_ENABLE: "true"}


def problem(
    topic: str,
    configs: dict[str, str] | None = OPTED_IN,
    *,
    prefix: str = "dlq.",
    auto_create: bool = False,
    consumed: frozenset[str] = frozenset({"orders"}),
) -> str | None:
    return dead_letter_topic_problem(
        "g", topic, prefix=prefix, auto_create=auto_create, topic_configs=configs, consumed=consumed
    )


def test_a_prefixed_opted_in_topic_the_group_does_not_consume_is_allowed() -> None:
    assert problem("dlq.orders") is None
    assert problem("") is None  # no dead-letter topic: always allowed
    assert problem("anything", prefix="") is None  # "" = no restriction on names


def test_each_refusal_says_why() -> None:
    assert "'__'" in (problem("__dlq.x", prefix="") or "")
    refused = problem("orders-dlq") or ""
    assert "'dlq.'" in refused and DLQ_TOPIC_NAME_PREFIX in refused
    assert "must start with 'dead.'" in (problem("dlq.x", prefix="dead.") or "")
    missing = problem("dlq.missing", None) or ""
    assert "does not exist" in missing and DLQ_AUTO_CREATE_TOPICS_ENABLE in missing
    assert problem("dlq.missing", None, auto_create=True) is None
    assert DLQ_GROUP_ENABLE in (problem("dlq.x", {}) or "")
    assert DLQ_GROUP_ENABLE in (problem("dlq.x", {DLQ_GROUP_ENABLE: "false"}) or "")
    own = problem("dlq.orders", consumed=frozenset({"dlq.orders"})) or ""
    assert "consumes" in own and "'g'" in own


def test_checks_go_in_kafkas_order_name_then_existence_then_opt_in_then_source() -> None:
    # A missing topic with the wrong prefix is refused for the prefix.
    assert "must start with" in (problem("x", None) or "")
    # A consumed topic without the opt-in is refused for the opt-in.
    assert DLQ_GROUP_ENABLE in (problem("dlq.o", {}, consumed=frozenset({"dlq.o"})) or "")


# -- IncrementalAlterConfigs of a GROUP ---------------------------------------------------


class Logs:
    def ensure_file_headroom(self, topic: str, partitions: int) -> None:
        pass

    def open_topic(self, *args: Any) -> None:
        pass

    def reconfigure_topic(self, name: str, configs: dict[str, str]) -> None:
        pass

    def topic_settings(self, configs: dict[str, str]) -> dict[str, Any]:
        return {name: configs.get(name, key.default) for name, key in TOPIC_KEYS.items()}


class Groups:
    """The group coordinator's view of which topics each share group consumes."""

    def __init__(self) -> None:
        self.subscribed: dict[str, frozenset[str]] = {}
        self.with_state: dict[str, frozenset[uuid.UUID]] = {}

    def share_group_topics(self, group_id: str) -> tuple[frozenset[str], frozenset[uuid.UUID]]:
        return self.subscribed.get(group_id, frozenset()), self.with_state.get(
            group_id, frozenset()
        )


@pytest.fixture
async def commit() -> AsyncIterator[GroupCommit]:
    group = GroupCommit()
    group.start()
    yield group
    await group.stop()


@pytest.fixture
def make_broker(tmp_path: Path, commit: GroupCommit) -> Iterator[Callable[..., Any]]:
    stores: list[MetadataStore] = []

    def make(**static: Any) -> Any:
        if stores:
            stores[-1].close()
        stores.append(MetadataStore(tmp_path / "meta", commit))
        return SimpleNamespace(
            config=BrokerConfig(static),
            node_id=1,
            metadata=stores[-1],
            logs=Logs(),
            groups=Groups(),
            topic_changed_hooks=[],
            topic_deleted_hooks=[],
            authorizer=NO_AUTHORIZER,
            claims_settled=_settled,
        )

    yield make
    if stores:
        stores[-1].close()


async def _settled() -> None:
    pass


def _alter(
    resource_type: int, name: str, configs: dict[str, str | None], validate_only: bool = False
) -> Any:
    entries = [
        SimpleNamespace(name=k, config_operation=0 if v is not None else 1, value=v)
        for k, v in configs.items()
    ]
    resource = SimpleNamespace(resource_type=resource_type, resource_name=name, configs=entries)
    return SimpleNamespace(resources=[resource], validate_only=validate_only)


async def _topic(broker: Any, name: str, opt_in: bool | None = True) -> None:
    request = SimpleNamespace(
        topics=[
            SimpleNamespace(
                name=name, num_partitions=1, replication_factor=1, assignments=[], configs=[]
            )
        ],
        validate_only=False,
    )
    (created,) = (await create_topics(None, request, broker)).topics
    assert created.error_code == ErrorCode.none
    if opt_in is not None:
        value = "true" if opt_in else "false"
        answer = await incremental_alter_configs(
            None, _alter(TOPIC, name, {DLQ_GROUP_ENABLE: value}), broker
        )
        assert answer.responses[0].error_code == ErrorCode.none


async def _set_dlq(
    broker: Any, topic: str | None, group: str = "g", validate_only: bool = False
) -> tuple[ErrorCode, str | None]:
    answer = await incremental_alter_configs(
        None, _alter(GROUP, group, {DLQ_TOPIC_NAME: topic}, validate_only), broker
    )
    (r,) = answer.responses
    return ErrorCode(r.error_code), r.error_message


async def test_a_valid_dead_letter_topic_is_stored_and_described(
    make_broker: Callable[..., Any],
) -> None:
    broker = make_broker()
    await _topic(broker, "dlq.orders")
    assert await _set_dlq(broker, "dlq.orders") == (ErrorCode.none, None)
    assert broker.metadata.state.group_configs.config("g").dead_letter_topic == "dlq.orders"
    describe = SimpleNamespace(
        resources=[
            SimpleNamespace(resource_type=GROUP, resource_name="g", configuration_keys=None)
        ],
        include_synonyms=False,
    )
    (result,) = (await describe_configs(None, describe, broker)).results
    rows = {c.name: c for c in result.configs}
    assert rows[DLQ_TOPIC_NAME].value == "dlq.orders"
    assert rows[DLQ_TOPIC_NAME].config_source == GROUP_CONFIG_SOURCE
    assert (rows[DLQ_COPY_RECORD_ENABLE].value, rows[DLQ_COPY_RECORD_ENABLE].config_source) == (
        "false",
        DEFAULT_CONFIG_SOURCE,
    )
    # The topic describes its opt-in as set for it.
    describe.resources[0] = SimpleNamespace(
        resource_type=TOPIC, resource_name="dlq.orders", configuration_keys=[DLQ_GROUP_ENABLE]
    )
    (result,) = (await describe_configs(None, describe, broker)).results
    (row,) = result.configs
    assert (row.value, row.config_source) == ("true", 1)
    # It survives a restart (the metadata log's replay).
    assert make_broker().metadata.state.group_configs.config("g").dead_letter_topic == (
        "dlq.orders"
    )


async def test_refusals_name_the_key_and_store_nothing(make_broker: Callable[..., Any]) -> None:
    broker = make_broker()
    await _topic(broker, "dlq.closed", opt_in=False)
    await _topic(broker, "orders-dlq")
    await _topic(broker, "dlq.orders")
    broker.groups.subscribed["g"] = frozenset({"dlq.orders"})
    end = broker.metadata.runtime.record_log.end_offset
    cases = {
        "__consumer_offsets": "'__'",
        "orders-dlq": "must start with 'dlq.'",
        "dlq.missing": "does not exist",
        "dlq.closed": f"does not have {DLQ_GROUP_ENABLE}=true",
        "dlq.orders": "share group 'g' consumes",
    }
    for topic, why in cases.items():
        code, message = await _set_dlq(broker, topic)
        assert code is ErrorCode.invalid_config, topic
        assert message is not None and DLQ_TOPIC_NAME in message and why in message, message
    assert broker.metadata.runtime.record_log.end_offset == end
    assert broker.metadata.state.group_configs.overrides("g") == {}


async def test_a_topic_the_group_has_share_state_on_is_refused(
    make_broker: Callable[..., Any],
) -> None:
    broker = make_broker()
    await _topic(broker, "dlq.read")
    broker.groups.with_state["g"] = frozenset({broker.metadata.state.topics["dlq.read"].topic_id})
    code, message = await _set_dlq(broker, "dlq.read")
    assert code is ErrorCode.invalid_config and "consumes" in (message or "")
    # Another group may use it.
    assert await _set_dlq(broker, "dlq.read", group="other") == (ErrorCode.none, None)


async def test_validate_only_answers_the_same_and_stores_nothing(
    make_broker: Callable[..., Any],
) -> None:
    broker = make_broker()
    await _topic(broker, "dlq.x")
    end = broker.metadata.runtime.record_log.end_offset
    code, message = await _set_dlq(broker, "dlq.missing", validate_only=True)
    assert code is ErrorCode.invalid_config and "does not exist" in (message or "")
    assert await _set_dlq(broker, "dlq.x", validate_only=True) == (ErrorCode.none, None)
    assert broker.metadata.runtime.record_log.end_offset == end
    assert broker.metadata.state.group_configs.overrides("g") == {}


async def test_empty_turns_it_off_and_other_keys_are_not_rechecked(
    make_broker: Callable[..., Any],
) -> None:
    broker = make_broker()
    await _topic(broker, "dlq.x")
    assert await _set_dlq(broker, "dlq.x") == (ErrorCode.none, None)
    # The topic loses its opt-in: the group's other configs can still change.
    await _topic(broker, "dlq.y", opt_in=None)
    answer = await incremental_alter_configs(
        None, _alter(TOPIC, "dlq.x", {DLQ_GROUP_ENABLE: "false"}), broker
    )
    assert answer.responses[0].error_code == ErrorCode.none
    answer = await incremental_alter_configs(
        None, _alter(GROUP, "g", {DLQ_COPY_RECORD_ENABLE: "true"}), broker
    )
    assert answer.responses[0].error_code == ErrorCode.none
    assert await _set_dlq(broker, "") == (ErrorCode.none, None)
    assert await _set_dlq(broker, None) == (ErrorCode.none, None)  # DELETE
    assert broker.metadata.state.group_configs.config("g").dead_letter_topic == ""


async def test_the_broker_keys_change_what_is_allowed(make_broker: Callable[..., Any]) -> None:
    broker = make_broker(**{DLQ_TOPIC_NAME_PREFIX: "", DLQ_AUTO_CREATE_TOPICS_ENABLE: "true"})
    await _topic(broker, "errors")
    assert await _set_dlq(broker, "errors") == (ErrorCode.none, None)
    # Auto-create on: a missing topic may be named (created at the first dead letter).
    assert await _set_dlq(broker, "dlq.later", group="h") == (ErrorCode.none, None)
    # Still never an internal topic.
    code, _ = await _set_dlq(broker, "__share_group_state", group="h")
    assert code is ErrorCode.invalid_config
    # A dynamic change of the prefix (the cluster-wide default) applies at once.
    answer = await incremental_alter_configs(
        None, _alter(4, "", {DLQ_TOPIC_NAME_PREFIX: "dead."}), broker
    )
    assert answer.responses[0].error_code == ErrorCode.none
    code, message = await _set_dlq(broker, "errors", group="i")
    assert code is ErrorCode.invalid_config and "must start with 'dead.'" in (message or "")
