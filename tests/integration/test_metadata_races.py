"""Concurrent cluster-metadata changes from many AdminClients at once.

Every metadata change is one coordinator-runtime operation: its checks and its records
are made in the turn that writes them, so concurrent requests are serialised and each is
answered as the order they ran in says (Kafka's controller runs each request as one
event, ReplicationControlManager / ConfigurationControlManager). Each test fires
CLIENTS requests at the same instant (one AdminClient per thread, a barrier), over
ROUNDS rounds, then checks the answers, the broker's log and what a restart brings back.
"""

from __future__ import annotations

import base64
import re
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
)

from tests.integration.conftest import (
    ADMIN_TIMEOUT_S,
    Broker,
    admin_config,
    create_topic,
)

CLIENTS = 8
ROUNDS = 4

_FIELD = re.compile(r"(\w+)=(\S+)")


def _clients(broker: Broker, n: int = CLIENTS) -> list[AdminClient]:
    """n AdminClients, each already connected (so the requests leave together)."""
    clients = [AdminClient(admin_config(broker)) for _ in range(n)]
    for client in clients:
        client.list_topics(timeout=ADMIN_TIMEOUT_S)
    return clients


def _create_call(client: AdminClient, name: str, partitions: int) -> Callable[[], Future[Any]]:
    topic = NewTopic(name, num_partitions=partitions, replication_factor=1)
    return lambda: client.create_topics([topic], request_timeout=ADMIN_TIMEOUT_S)[name]


def _grow_call(client: AdminClient, name: str, count: int) -> Callable[[], Future[Any]]:
    growth = NewPartitions(name, count)
    return lambda: client.create_partitions([growth], request_timeout=ADMIN_TIMEOUT_S)[name]


def _delete_call(client: AdminClient, name: str) -> Callable[[], Future[Any]]:
    return lambda: client.delete_topics([name], request_timeout=ADMIN_TIMEOUT_S)[name]


def _set_call(
    client: AdminClient,
    name: str,
    key: str,
    value: str,
    kind: ConfigResource.Type = ConfigResource.Type.TOPIC,
) -> Callable[[], Future[Any]]:
    entry = ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)
    change = ConfigResource(kind, name, incremental_configs=[entry])
    resource = ConfigResource(kind, name)
    return lambda: client.incremental_alter_configs([change], request_timeout=ADMIN_TIMEOUT_S)[
        resource
    ]


def _at_once(calls: list[Callable[[], Future[Any]]]) -> list[KafkaError | None]:
    """Run each call on its own thread, released together; each one's error or None."""
    barrier = threading.Barrier(len(calls))
    outcomes: list[KafkaError | None] = [None] * len(calls)

    def run(i: int) -> None:
        barrier.wait(timeout=ADMIN_TIMEOUT_S)
        try:
            calls[i]().result(timeout=ADMIN_TIMEOUT_S)
        except KafkaException as exc:
            outcomes[i] = exc.args[0]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=2 * ADMIN_TIMEOUT_S)
        assert not thread.is_alive(), "an admin call never finished"
    return outcomes


def _events(broker: Broker, event: str, topic: str) -> list[dict[str, str]]:
    """The broker log's `event` lines about `topic`, as their key=value fields."""
    found = []
    for line in broker.log_path.read_text(errors="replace").splitlines():
        words = line.split()
        if event not in words:
            continue
        fields = dict(_FIELD.findall(line))
        if fields.get("topic") == topic:
            found.append(fields)
    return found


def _topic_id(broker: Broker, topic: str) -> str | None:
    admin = AdminClient(admin_config(broker))
    try:
        described = admin.describe_topics(TopicCollection([topic]))[topic].result(
            timeout=ADMIN_TIMEOUT_S
        )
    except KafkaException as exc:
        assert exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART, exc
        return None
    # Kafka prints a Uuid in url-safe base64; the broker's log prints it as a UUID.
    return str(uuid.UUID(bytes=base64.urlsafe_b64decode(str(described.topic_id) + "==")))


def _partitions(broker: Broker, topic: str) -> int:
    md = AdminClient(admin_config(broker)).list_topics(topic=topic, timeout=ADMIN_TIMEOUT_S)
    return len(md.topics[topic].partitions)


def _show(outcomes: list[KafkaError | None]) -> list[str]:
    return ["ok" if e is None else f"{e.name()}: {e.str()}" for e in outcomes]


def _codes(outcomes: list[KafkaError | None]) -> list[int]:
    return sorted(KafkaError.NO_ERROR if e is None else e.code() for e in outcomes)


def test_concurrent_create_topics_of_one_name_create_it_once(broker: Broker) -> None:
    clients = _clients(broker)
    ids: dict[str, str] = {}
    for r in range(ROUNDS):
        name = f"race-create-{r}"
        outcomes = _at_once([_create_call(c, name, 3) for c in clients])
        assert _codes(outcomes) == [KafkaError.NO_ERROR] + [KafkaError.TOPIC_ALREADY_EXISTS] * (
            CLIENTS - 1
        ), _show(outcomes)
        loser = next(e for e in outcomes if e is not None)
        assert loser.str() == f"Topic '{name}' already exists."
        created = _events(broker, "topic_created", name)
        assert len(created) == 1, created
        ids[name] = created[0]["topic_id"]
        assert _topic_id(broker, name) == ids[name]
    broker.restart()
    for name, topic_id in ids.items():
        assert _topic_id(broker, name) == topic_id
        assert _partitions(broker, name) == 3


def test_concurrent_create_partitions_to_one_count_grow_it_once(broker: Broker) -> None:
    clients = _clients(broker)
    names = [f"race-grow-{r}" for r in range(ROUNDS)]
    for name in names:
        create_topic(broker, name, partitions=1)
    for name in names:
        outcomes = _at_once([_grow_call(c, name, 4) for c in clients])
        assert _codes(outcomes) == [KafkaError.NO_ERROR] + [KafkaError.INVALID_PARTITIONS] * (
            CLIENTS - 1
        ), _show(outcomes)
        # Kafka's ReplicationControlManager.createPartitions message.
        for error in outcomes:
            assert error is None or error.str() == "Topic already has 4 partition(s).", error
        assert len(_events(broker, "partitions_created", name)) == 1
        assert _partitions(broker, name) == 4
    broker.restart()
    for name in names:
        assert _partitions(broker, name) == 4


def test_delete_topics_racing_create_topics_answer_in_one_order(broker: Broker) -> None:
    """Half the clients delete the topic, half create it, all at once. Whatever order
    the broker ran them in, creating succeeds only on an absent topic and deleting
    only on a present one, so from a present topic the successes alternate
    delete, create, delete, ...: deletions = creations (the topic is there, the last
    one created) or creations + 1 (it is gone). The log names one topic id per
    creation, deletions in the order of creations."""
    clients = _clients(broker)
    for r in range(ROUNDS):
        name = f"race-churn-{r}"
        create_topic(broker, name, partitions=2)
        calls = [
            _create_call(c, name, 2) if i % 2 else _delete_call(c, name)
            for i, c in enumerate(clients)
        ]
        outcomes = _at_once(calls)
        creates = [e for i, e in enumerate(outcomes) if i % 2]
        deletes = [e for i, e in enumerate(outcomes) if not i % 2]
        assert {e.code() for e in creates if e is not None} <= {KafkaError.TOPIC_ALREADY_EXISTS}
        assert {e.code() for e in deletes if e is not None} <= {KafkaError.UNKNOWN_TOPIC_OR_PART}
        created = sum(e is None for e in creates)
        deleted = sum(e is None for e in deletes)
        assert deleted - created in (0, 1), _show(outcomes)
        created_ids = [e["topic_id"] for e in _events(broker, "topic_created", name)]
        deleted_ids = [e["topic_id"] for e in _events(broker, "topic_deleted", name)]
        assert len(created_ids) == 1 + created, created_ids
        assert len(set(created_ids)) == len(created_ids)
        assert deleted_ids == created_ids[: len(deleted_ids)], (created_ids, deleted_ids)
        assert len(deleted_ids) == deleted
        survivor = _topic_id(broker, name)
        if deleted == created:
            assert survivor == created_ids[-1]
        else:
            assert survivor is None
    expected = {f"race-churn-{r}": _topic_id(broker, f"race-churn-{r}") for r in range(ROUNDS)}
    broker.restart()
    for name, topic_id in expected.items():
        assert _topic_id(broker, name) == topic_id


# Different keys of one topic, one per client (none is another's default).
TOPIC_SETTINGS = {
    "retention.ms": "3600001",
    "retention.bytes": "10485761",
    "segment.bytes": "1048577",
    "segment.ms": "3600002",
    "max.message.bytes": "2000001",
    "index.interval.bytes": "4097",
    "message.timestamp.type": "LogAppendTime",
    "compression.type": "gzip",
}


def _dynamic_topic_configs(broker: Broker, topic: str) -> dict[str, str]:
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    admin = AdminClient(admin_config(broker))
    entries = admin.describe_configs([resource])[resource].result(timeout=ADMIN_TIMEOUT_S)
    return {
        name: entry.value
        for name, entry in entries.items()
        if entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    }


def test_concurrent_config_alters_of_different_keys_all_survive(broker: Broker) -> None:
    assert len(TOPIC_SETTINGS) == CLIENTS
    clients = _clients(broker)
    names = [f"race-config-{r}" for r in range(ROUNDS)]
    for name in names:
        create_topic(broker, name)
    for name in names:
        outcomes = _at_once(
            [
                _set_call(c, name, key, value)
                for c, (key, value) in zip(clients, TOPIC_SETTINGS.items(), strict=True)
            ]
        )
        assert all(e is None for e in outcomes), _show(outcomes)
        assert _dynamic_topic_configs(broker, name) == TOPIC_SETTINGS
    broker.restart()
    for name in names:
        assert _dynamic_topic_configs(broker, name) == TOPIC_SETTINGS


# Different dynamic broker configs, one per client, harmless to the test's broker.
BROKER_SETTINGS = {
    "num.partitions": 2,
    "log.retention.ms": 3_600_000,
    "log.retention.bytes": 10_485_760,
    "log.roll.ms": 3_600_000,
    "log.index.interval.bytes": 8192,
    "producer.id.expiration.ms": 3_600_000,
    "transactional.id.expiration.ms": 3_600_000,
    "group.share.max.size": 150,
}


def _broker_configs(broker: Broker) -> dict[str, str]:
    resource = ConfigResource(ConfigResource.Type.BROKER, "1")
    admin = AdminClient(admin_config(broker))
    entries = admin.describe_configs([resource])[resource].result(timeout=ADMIN_TIMEOUT_S)
    return {name: entry.value for name, entry in entries.items() if name in BROKER_SETTINGS}


def test_concurrent_broker_config_alters_of_different_keys_all_survive(broker: Broker) -> None:
    assert len(BROKER_SETTINGS) == CLIENTS
    clients = _clients(broker)
    for r in range(ROUNDS):
        wanted = {key: str(value + r) for key, value in BROKER_SETTINGS.items()}
        outcomes = _at_once(
            [
                _set_call(c, "1", key, value, ConfigResource.Type.BROKER)
                for c, (key, value) in zip(clients, wanted.items(), strict=True)
            ]
        )
        assert all(e is None for e in outcomes), _show(outcomes)
        assert _broker_configs(broker) == wanted
    broker.restart()
    assert _broker_configs(broker) == wanted
