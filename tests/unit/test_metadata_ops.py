"""Cluster-metadata changes as coordinator-runtime operations: the topic and config
handlers against a real `MetadataStore` (its log in a temp dir) and fake partition logs.

Requests running at once are serialised by the runtime, each checked in the turn that
writes its records, as Kafka's controller runs each request as one event
(ReplicationControlManager, ConfigurationControlManager)."""

from __future__ import annotations

import asyncio
import errno
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from broker.authorizer import NO_AUTHORIZER
from broker.config import TOPIC_KEYS, BrokerConfig
from broker.handlers.configs import TOPIC as TOPIC_RESOURCE
from broker.handlers.configs import incremental_alter_configs
from broker.handlers.topics import (
    auto_create_topic,
    create_partitions,
    create_topics,
    delete_topics,
)
from coordinator.metadata import MetadataStore
from persister.commit import GroupCommit
from protocol.errors import ErrorCode, KafkaError

N = 8


class Logs:
    """The partition logs: what was opened, reconfigured and removed, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, Any]] = []
        self.fail_open: set[str] = set()
        self.fail_remove: set[str] = set()

    def ensure_file_headroom(self, topic: str, partitions: int) -> None:
        pass

    def open_topic(
        self, name: str, topic_id: uuid.UUID, partitions: int, configs: dict[str, str]
    ) -> None:
        if name in self.fail_open:
            raise KafkaError(ErrorCode.kafka_storage_error, "Too many open files")
        self.events.append(("open", name, (topic_id, partitions)))

    def reconfigure_topic(self, name: str, configs: dict[str, str]) -> None:
        self.events.append(("reconfigure", name, dict(configs)))

    def remove_topic(self, name: str) -> None:
        if name in self.fail_remove:
            raise OSError(errno.EIO, "Input/output error")
        self.events.append(("remove", name, None))

    def topic_settings(self, configs: dict[str, str]) -> dict[str, Any]:
        return {name: configs.get(name, key.default) for name, key in TOPIC_KEYS.items()}


class Settled:
    """The broker's `claims_settled`: how many log events there were at each call (an
    answer waits for the claims of the partitions it opened)."""

    def __init__(self, logs: Logs) -> None:
        self.logs = logs
        self.calls: list[int] = []

    async def __call__(self) -> None:
        self.calls.append(len(self.logs.events))


class Broker(SimpleNamespace):
    metadata: MetadataStore
    logs: Logs
    claims_settled: Settled


@pytest.fixture
async def commit() -> AsyncIterator[GroupCommit]:
    group = GroupCommit()
    group.start()
    yield group
    await group.stop()


@pytest.fixture
def open_broker(tmp_path: Path, commit: GroupCommit) -> Callable[[], Broker]:
    """A broker over the metadata log in tmp_path; calling it again reopens the log
    (a restart: the state is what the replay rebuilds)."""
    opened: list[MetadataStore] = []

    def make() -> Broker:
        if opened:
            opened[-1].close()
        store = MetadataStore(tmp_path / "meta", commit)
        opened.append(store)
        logs = Logs()
        return Broker(
            config=BrokerConfig({}),
            node_id=1,
            metadata=store,
            logs=logs,
            topic_changed_hooks=[],
            topic_deleted_hooks=[],
            authorizer=NO_AUTHORIZER,
            claims_settled=Settled(logs),
        )

    return make


def _request(**fields: Any) -> Any:
    return SimpleNamespace(**fields)


def _new_topic(name: str, partitions: int = 3) -> Any:
    return SimpleNamespace(
        name=name,
        num_partitions=partitions,
        replication_factor=1,
        assignments=[],
        configs=[],
    )


def _create(name: str, *, validate_only: bool = False) -> Any:
    return _request(topics=[_new_topic(name)], validate_only=validate_only)


def _delete(name: str) -> Any:
    return _request(**{"__version__": 5, "topic_names": [name]})


def _grow(name: str, count: int, *, validate_only: bool = False) -> Any:
    topic = SimpleNamespace(name=name, count=count, assignments=None)
    return _request(topics=[topic], validate_only=validate_only)


def _set_config(name: str, key: str, value: str) -> Any:
    config = SimpleNamespace(name=key, config_operation=0, value=value)
    resource = SimpleNamespace(resource_type=TOPIC_RESOURCE, resource_name=name, configs=[config])
    return _request(resources=[resource], validate_only=False)


def _entries(answer: Any) -> Any:
    """The per-topic (or per-resource) results of a CreateTopics, CreatePartitions,
    DeleteTopics or IncrementalAlterConfigs response entity."""
    for field in ("topics", "results", "responses"):
        if hasattr(answer, field):
            return getattr(answer, field)
    raise AssertionError(f"no results in {answer!r}")


def _code(answer: Any) -> ErrorCode:
    (entry,) = _entries(answer)
    return ErrorCode(entry.error_code)


async def test_concurrent_creates_of_one_name_create_it_once(
    open_broker: Callable[[], Broker],
) -> None:
    broker = open_broker()
    answers = await asyncio.gather(*(create_topics(None, _create("t"), broker) for _ in range(N)))
    codes = sorted(_code(a) for a in answers)
    assert codes == [ErrorCode.none] + [ErrorCode.topic_already_exists] * (N - 1)
    loser = next(a.topics[0] for a in answers if a.topics[0].error_code)
    assert loser.error_message == "Topic 't' already exists."
    (winner,) = (a.topics[0] for a in answers if not a.topics[0].error_code)
    assert broker.metadata.state.topics["t"].topic_id == winner.topic_id
    assert broker.logs.events == [("open", "t", (winner.topic_id, 3))]
    assert open_broker().metadata.state.topics["t"].topic_id == winner.topic_id


async def test_auto_creation_racing_creates_gets_the_one_topic(
    open_broker: Callable[[], Broker],
) -> None:
    broker = open_broker()
    topics = await asyncio.gather(*(auto_create_topic(broker, "auto") for _ in range(N)))
    assert len({t.topic_id for t in topics}) == 1
    assert [e[0] for e in broker.logs.events] == ["open"]


async def test_creations_and_growths_answer_once_their_claims_settled(
    open_broker: Callable[[], Broker],
) -> None:
    """CreateTopics, CreatePartitions and auto-creation wait for the broker's
    claims_settled after opening their logs (a cluster's leaders known before the
    answer)."""
    broker = open_broker()
    await create_topics(None, _create("t"), broker)
    await create_partitions(None, _grow("t", 5), broker)
    await auto_create_topic(broker, "auto")
    assert [e[0] for e in broker.logs.events] == ["open", "open", "open"]
    assert broker.claims_settled.calls == [1, 2, 3]


async def test_deletes_and_creates_run_in_the_order_they_came(
    open_broker: Callable[[], Broker],
) -> None:
    """Serialised first come, first served: each answer and each effect on the logs
    follows from the ones before it, whatever their fsyncs did meanwhile."""
    broker = open_broker()
    await create_topics(None, _create("t"), broker)
    calls = [
        delete_topics(None, _delete("t"), broker),
        create_topics(None, _create("t"), broker),
        create_topics(None, _create("t"), broker),
        delete_topics(None, _delete("t"), broker),
        delete_topics(None, _delete("t"), broker),
    ]
    codes = [_code(a) for a in await asyncio.gather(*calls)]
    assert codes == [
        ErrorCode.none,
        ErrorCode.none,
        ErrorCode.topic_already_exists,
        ErrorCode.none,
        ErrorCode.unknown_topic_or_partition,
    ]
    assert [e[:2] for e in broker.logs.events] == [
        ("open", "t"),
        ("remove", "t"),
        ("open", "t"),
        ("remove", "t"),
    ]
    assert "t" not in broker.metadata.state.topics
    assert "t" not in open_broker().metadata.state.topics


async def test_concurrent_growths_to_one_count_grow_once(
    open_broker: Callable[[], Broker],
) -> None:
    broker = open_broker()
    await create_topics(None, _create("t"), broker)
    grows = (create_partitions(None, _grow("t", 5), broker) for _ in range(N))
    answers = await asyncio.gather(*grows)
    codes = sorted(_code(a) for a in answers)
    assert codes == [ErrorCode.none] + [ErrorCode.invalid_partitions] * (N - 1)
    messages = {a.results[0].error_message for a in answers}
    # Kafka's ReplicationControlManager.createPartitions.
    assert messages == {None, "Topic already has 5 partition(s)."}
    answer = await create_partitions(None, _grow("t", 4), broker)
    assert answer.results[0].error_message == (
        "The topic t currently has 5 partition(s); 4 would not be an increase."
    )
    assert open_broker().metadata.state.topics["t"].partitions == 5


async def test_validate_only_checks_in_turn_and_writes_nothing(
    open_broker: Callable[[], Broker],
) -> None:
    broker = open_broker()
    end = broker.metadata.runtime.record_log.end_offset
    checked, created = await asyncio.gather(
        create_topics(None, _create("t", validate_only=True), broker),
        create_topics(None, _create("t"), broker),
    )
    assert _code(checked) == ErrorCode.none and _code(created) == ErrorCode.none
    # Queued behind the creation, a validate-only request sees it.
    created_end = broker.metadata.runtime.record_log.end_offset
    assert created_end == end + 1
    again = await create_topics(None, _create("t", validate_only=True), broker)
    assert _code(again) == ErrorCode.topic_already_exists
    grown = await create_partitions(None, _grow("t", 6, validate_only=True), broker)
    assert _code(grown) == ErrorCode.none
    assert broker.metadata.runtime.record_log.end_offset == created_end
    assert broker.metadata.state.topics["t"].partitions == 3


async def test_concurrent_alters_of_different_keys_keep_every_key(
    open_broker: Callable[[], Broker],
) -> None:
    broker = open_broker()
    await create_topics(None, _create("t"), broker)
    settings = {
        "retention.ms": "3600001",
        "retention.bytes": "10485761",
        "segment.bytes": "1048577",
        "segment.ms": "3600002",
    }
    answers = await asyncio.gather(
        *(
            incremental_alter_configs(None, _set_config("t", k, v), broker)
            for k, v in settings.items()
        )
    )
    assert all(a.responses[0].error_code == ErrorCode.none for a in answers)
    assert broker.metadata.state.topics["t"].configs == settings
    # The logs were reconfigured in the order of the writes, the last with every key.
    assert broker.logs.events[-1] == ("reconfigure", "t", settings)
    assert open_broker().metadata.state.topics["t"].configs == settings


async def test_a_topic_whose_logs_cannot_open_is_not_created(
    open_broker: Callable[[], Broker],
) -> None:
    broker = open_broker()
    broker.logs.fail_open.add("t")
    answer = await create_topics(None, _create("t"), broker)
    assert _code(answer) == ErrorCode.kafka_storage_error
    assert "t" not in broker.metadata.state.topics
    broker.logs.fail_open.clear()
    assert _code(await create_topics(None, _create("t"), broker)) == ErrorCode.none
    assert "t" in open_broker().metadata.state.topics


async def test_an_existing_name_is_answered_before_the_other_checks(
    open_broker: Callable[[], Broker],
) -> None:
    """Kafka's createTopics checks the name, then whether it exists, then the rest."""
    broker = open_broker()
    await create_topics(None, _create("t"), broker)
    bad = _new_topic("t", partitions=0)
    answer = await create_topics(None, _request(topics=[bad], validate_only=False), broker)
    assert _code(answer) == ErrorCode.topic_already_exists
    bad.name = "u"
    answer = await create_topics(None, _request(topics=[bad], validate_only=False), broker)
    assert _code(answer) == ErrorCode.invalid_partitions


async def test_a_deleted_topic_whose_logs_cannot_be_removed_is_still_answered_deleted(
    open_broker: Callable[[], Broker],
) -> None:
    """The deletion is durable once its records are replayed; removing the logs after it
    (the `applied` hook) failing for one topic must not fail the request, skip the other
    topics' logs or the deletion hooks (share groups forget the topic's state there)."""
    broker = open_broker()
    await create_topics(None, _create("a"), broker)
    await create_topics(None, _create("b"), broker)
    gone: list[str] = []
    broker.topic_deleted_hooks.append(lambda name, topic_id: gone.append(name))
    broker.logs.fail_remove.add("a")
    answer = await delete_topics(
        None, _request(**{"__version__": 5, "topic_names": ["a", "b"]}), broker
    )
    assert [ErrorCode(r.error_code) for r in answer.responses] == [ErrorCode.none] * 2
    assert ("remove", "b", None) in broker.logs.events
    assert gone == ["a", "b"]
    assert not {"a", "b"} & set(open_broker().metadata.state.topics)
