"""What each API checks, sans-IO: the handlers against an Authorizer over a hand-built
AclSet, with fakes for the stores a denied request must not reach.

As Kafka 4.2's KafkaApis / ControllerApis: the *_AUTHORIZATION_FAILED code, at the
granularity Kafka answers it (partition, topic, group, resource or whole request).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from broker.authorizer import NO_AUTHORIZER, Authorizer
from broker.config import BrokerConfig
from broker.handlers import cluster, configs, consumer, share, share_admin, share_state, topics
from broker.handlers.access import authorized_operations
from broker.handlers.produce_fetch import delete_records, fetch, list_offsets, produce
from broker.handlers.transactions import end_txn, txn_offset_commit
from broker.partitions import LogManager
from broker.server import CloseConnection, Endpoint
from broker.share.fetch import ShareAcknowledgeParams
from coordinator.acls import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AclSet,
    PatternType,
    ResourceType,
)
from coordinator.group_coordinator import GroupListing
from coordinator.metadata import MetadataStore, Topic
from persister.commit import GroupCommit
from protocol import api
from protocol.errors import ErrorCode
from protocol.records import NewRecord, build_batch
from tests.unit.cluster_fakes import alone
from tests.unit.test_metadata_ops import Logs
from tests.unit.test_share_fetch_service import BOUND_S, TP, params, service

ALICE = "User:alice"
ADMIN = "User:admin"
TAF = ErrorCode.topic_authorization_failed
GAF = ErrorCode.group_authorization_failed
CAF = ErrorCode.cluster_authorization_failed
TXN_AF = ErrorCode.transactional_id_authorization_failed


def allow(
    rtype: ResourceType,
    name: str,
    op: AclOperation,
    pattern: PatternType = PatternType.LITERAL,
    principal: str = ALICE,
) -> AclBinding:
    return AclBinding(rtype, name, pattern, principal, "*", op, AclPermissionType.ALLOW)


def authorizer(*acls: AclBinding) -> Authorizer:
    stored = AclSet()
    for a in acls:
        stored.add(a)
    return Authorizer(enabled=True, acls=lambda: stored, super_users=frozenset({ADMIN}))


def ctx(version: int, principal: str = ALICE) -> Any:
    return SimpleNamespace(
        api_version=version,
        header=SimpleNamespace(client_id="unit"),
        security=SimpleNamespace(principal=principal, listener="SASL_PLAINTEXT"),
        client_host="127.0.0.1",
        connection_id=1,
        listener="SASL_PLAINTEXT",
    )


def request(api_key: int, version: int, data: dict[str, Any]) -> Any:
    return api.build(api.request_class(api_key, version), data)


def untouchable() -> Any:
    """A store a denied request must not reach: any use fails the test."""

    class Untouchable:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"a denied request used {name}")

    return Untouchable()


# -- the authorized-operations bit field (KIP-430) ---------------------------------------


def test_authorized_operations_sets_one_bit_per_allowed_operation() -> None:
    az = authorizer(allow(ResourceType.TOPIC, "t", AclOperation.READ))
    # READ implies DESCRIBE.
    bits = authorized_operations(az, ctx(0), ResourceType.TOPIC, "t")
    assert bits == (1 << AclOperation.READ) | (1 << AclOperation.DESCRIBE)
    assert authorized_operations(az, ctx(0), ResourceType.TOPIC, "other") == 0
    # With no authorizer, every supported operation (Kafka's AuthHelper).
    everything = authorized_operations(NO_AUTHORIZER, ctx(0), ResourceType.GROUP, "g")
    assert everything == sum(
        1 << op
        for op in (
            AclOperation.READ,
            AclOperation.DESCRIBE,
            AclOperation.DELETE,
            AclOperation.DESCRIBE_CONFIGS,
            AclOperation.ALTER_CONFIGS,
        )
    )


# -- share-state RPCs 83-87: CLUSTER_ACTION ----------------------------------------------

TOPIC_ID = uuid.uuid4()
SHARE_STATE_RPCS = [
    (83, 0, share_state.initialize_share_group_state),
    (84, 0, share_state.read_share_group_state),
    (85, 1, share_state.write_share_group_state),
    (86, 0, share_state.delete_share_group_state),
    (87, 1, share_state.read_share_group_state_summary),
]


@pytest.mark.parametrize(("key", "version", "handler"), SHARE_STATE_RPCS)
async def test_share_state_rpcs_need_cluster_action(
    key: int, version: int, handler: Callable[..., Any]
) -> None:
    req = request(
        key,
        version,
        {"group_id": "g", "topics": [{"topic_id": TOPIC_ID, "partitions": [{"partition": 0}]}]},
    )
    broker = SimpleNamespace(authorizer=authorizer(), share_persister=untouchable())
    answer = await handler(ctx(version), req, broker)
    (result,) = answer.results
    assert result.topic_id == TOPIC_ID
    assert [(p.partition, p.error_code) for p in result.partitions] == [(0, CAF)]
    # CLUSTER_ACTION lets it through (an empty group id is then ignored, as Kafka does,
    # before the persister is used).
    broker.authorizer = authorizer(
        allow(ResourceType.CLUSTER, "kafka-cluster", AclOperation.CLUSTER_ACTION)
    )
    empty = request(key, version, {"group_id": "", "topics": []})
    assert (await handler(ctx(version), empty, broker)).results == ()
    # A super user too.
    broker.authorizer = authorizer()
    assert (await handler(ctx(version, ADMIN), empty, broker)).results == ()


# -- Metadata ----------------------------------------------------------------------------


def metadata_broker(az: Authorizer, names: list[str]) -> Any:
    state = SimpleNamespace(topics={}, topics_by_id={})
    for n in names:
        t = Topic(n, uuid.uuid4(), 1)
        state.topics[n] = t
        state.topics_by_id[t.topic_id] = t
    return SimpleNamespace(
        authorizer=az,
        metadata=SimpleNamespace(state=state),
        config=BrokerConfig({}),
        node_id=1,
        cluster_id="c",
        advertised_for=lambda listener: Endpoint("h", 9092),
        cluster=alone(1, "SASL_PLAINTEXT"),
    )


async def test_metadata_leaves_out_topics_alice_may_not_describe() -> None:
    az = authorizer(
        allow(ResourceType.TOPIC, "pay-", AclOperation.DESCRIBE, PatternType.PREFIXED),
        allow(ResourceType.TOPIC, "orders", AclOperation.READ),
    )
    broker = metadata_broker(az, ["orders", "pay-in", "pay-out", "payroll", "secret"])
    answer = await cluster.metadata(ctx(12), request(3, 12, {"topics": None}), broker)
    # The prefix "pay-" covers pay-in and pay-out, not payroll.
    assert sorted(t.name for t in answer.topics) == ["orders", "pay-in", "pay-out"]
    assert all(t.error_code == ErrorCode.none for t in answer.topics)
    # Left out without a log line, but counted for /metrics.
    assert az.denials[("DESCRIBE", "TOPIC")] == 2


async def test_metadata_answers_a_named_topic_alice_may_not_describe_as_denied() -> None:
    az = authorizer(allow(ResourceType.TOPIC, "orders", AclOperation.DESCRIBE))
    broker = metadata_broker(az, ["orders", "secret"])
    req = request(3, 12, {"topics": [{"name": "secret"}, {"name": "orders"}, {"name": "nope"}]})
    answer = await cluster.metadata(ctx(12), req, broker)
    got = {t.name: (t.error_code, t.topic_id, len(t.partitions)) for t in answer.topics}
    # Existing or not, an undescribable topic is TOPIC_AUTHORIZATION_FAILED, no id.
    assert got["secret"] == (TAF, None, 0)
    assert got["nope"] == (TAF, None, 0)
    assert got["orders"][0] == ErrorCode.none and got["orders"][2] == 1


async def test_metadata_auto_creation_needs_create() -> None:
    # DESCRIBE on the missing topic but no CREATE: denied before anything is created.
    az = authorizer(allow(ResourceType.TOPIC, "new", AclOperation.DESCRIBE))
    broker = metadata_broker(az, [])
    req = request(3, 12, {"topics": [{"name": "new"}], "allow_auto_topic_creation": True})
    (topic,) = (await cluster.metadata(ctx(12), req, broker)).topics
    assert topic.error_code == TAF


async def test_metadata_reports_topic_authorized_operations_when_asked() -> None:
    az = authorizer(allow(ResourceType.TOPIC, "orders", AclOperation.WRITE))
    broker = metadata_broker(az, ["orders"])
    req = request(
        3, 12, {"topics": [{"name": "orders"}], "include_topic_authorized_operations": True}
    )
    (topic,) = (await cluster.metadata(ctx(12), req, broker)).topics
    assert topic.topic_authorized_operations == (1 << AclOperation.WRITE) | (
        1 << AclOperation.DESCRIBE
    )


@pytest.mark.parametrize("version", [8, 9, 10])
async def test_metadata_reports_cluster_authorized_operations_in_v8_to_v10(version: int) -> None:
    broker = metadata_broker(authorizer(), [])
    req = request(3, version, {"topics": [], "include_cluster_authorized_operations": True})
    answer = await cluster.metadata(ctx(version), req, broker)
    # Without DESCRIBE on the cluster: none (Kafka answers 0, not "omitted").
    assert api.at_version(3, version, answer).cluster_authorized_operations == 0
    broker.authorizer = authorizer(
        allow(ResourceType.CLUSTER, "kafka-cluster", AclOperation.DESCRIBE),
        allow(ResourceType.CLUSTER, "kafka-cluster", AclOperation.IDEMPOTENT_WRITE),
    )
    answer = await cluster.metadata(ctx(version), req, broker)
    assert api.at_version(3, version, answer).cluster_authorized_operations == (
        1 << AclOperation.DESCRIBE
    ) | (1 << AclOperation.IDEMPOTENT_WRITE)
    unasked = request(3, version, {"topics": []})
    answer = await cluster.metadata(ctx(version), unasked, broker)
    assert api.at_version(3, version, answer).cluster_authorized_operations == -(2**31)


async def test_describe_cluster_reports_authorized_operations_only() -> None:
    # Kafka 4.2 answers DescribeCluster to anyone; DESCRIBE on the cluster decides only
    # whether its authorized operations are told.
    broker = metadata_broker(authorizer(), [])
    req = request(60, 1, {"include_cluster_authorized_operations": True, "endpoint_type": 1})
    answer = await cluster.describe_cluster(ctx(1), req, broker)
    assert (answer.error_code, answer.cluster_authorized_operations) == (ErrorCode.none, 0)
    assert [b.broker_id for b in answer.brokers] == [1]
    broker.authorizer = authorizer(allow(ResourceType.CLUSTER, "kafka-cluster", AclOperation.ALTER))
    answer = await cluster.describe_cluster(ctx(1), req, broker)
    # ALTER implies DESCRIBE.
    assert answer.cluster_authorized_operations == (1 << AclOperation.ALTER) | (
        1 << AclOperation.DESCRIBE
    )


# -- FindCoordinator, InitProducerId ------------------------------------------------------


async def test_find_coordinator_needs_describe_on_each_key() -> None:
    az = authorizer(allow(ResourceType.GROUP, "mine", AclOperation.DESCRIBE))
    broker = metadata_broker(az, [])
    req = request(10, 4, {"key_type": 0, "coordinator_keys": ["mine", "theirs"]})
    answer = await cluster.find_coordinator(ctx(4), req, broker)
    got = {c.key: (c.error_code, c.node_id) for c in answer.coordinators}
    assert got == {"mine": (ErrorCode.none, 1), "theirs": (GAF, -1)}
    txn = request(10, 3, {"key_type": 1, "key": "tx"})
    assert (await cluster.find_coordinator(ctx(3), txn, broker)).error_code == TXN_AF
    share_key = request(10, 6, {"key_type": 2, "coordinator_keys": ["g:" + str(TOPIC_ID) + ":0"]})
    (c,) = (await cluster.find_coordinator(ctx(6), share_key, broker)).coordinators
    assert c.error_code == CAF


async def test_init_producer_id_needs_idempotent_write_or_write_on_a_topic() -> None:
    broker = metadata_broker(authorizer(), [])
    broker.metadata.allocate_producer_id = untouchable()
    req = request(22, 5, {"transactional_id": None, "producer_id": -1, "producer_epoch": -1})
    assert (await cluster.init_producer_id(ctx(5), req, broker)).error_code == CAF
    tx = request(22, 5, {"transactional_id": "tx", "producer_id": -1, "producer_epoch": -1})
    assert (await cluster.init_producer_id(ctx(5), tx, broker)).error_code == TXN_AF

    async def allocate() -> int:
        return 42

    # WRITE on any topic is enough for an idempotent producer (Kafka 3.0+, KIP-679).
    broker.authorizer = authorizer(
        allow(ResourceType.TOPIC, "t-", AclOperation.WRITE, PatternType.PREFIXED)
    )
    broker.metadata.allocate_producer_id = allocate
    answer = await cluster.init_producer_id(ctx(5), req, broker)
    assert (answer.error_code, answer.producer_id) == (ErrorCode.none, 42)


# -- Produce, Fetch, ListOffsets, DeleteRecords ------------------------------------------

TOPIC = "orders"


@pytest.fixture
async def data(tmp_path: Path) -> AsyncIterator[Any]:
    commit = GroupCommit()
    commit.start()
    logs = LogManager(tmp_path, BrokerConfig({}), commit)
    topic_id = uuid.uuid4()
    logs.open_topic(TOPIC, topic_id, 1, {})
    topic = SimpleNamespace(name=TOPIC, topic_id=topic_id, partitions=1)
    broker = SimpleNamespace(
        logs=logs,
        metadata=SimpleNamespace(
            state=SimpleNamespace(topics={TOPIC: topic}, topics_by_id={topic_id: topic})
        ),
        transactions=untouchable(),
        authorizer=authorizer(),
        cluster=alone(1, "SASL_PLAINTEXT"),
    )
    try:
        yield broker
    finally:
        await logs.flush_all()
        logs.close()
        await commit.stop()


def produce_request(version: int = 9, acks: int = 1) -> Any:
    batch = build_batch([NewRecord(None, b"v")])
    return request(
        0,
        version,
        {
            "acks": acks,
            "timeout": 5_000,
            "topic_data": [{"name": TOPIC, "partition_data": [{"index": 0, "records": batch}]}],
        },
    )


async def test_produce_needs_write_on_the_topic(data: Any) -> None:
    answer = await produce(ctx(9), produce_request(), data)
    (part,) = answer.responses[0].partition_responses
    assert part.error_code == TAF
    assert data.logs.get(TOPIC, 0).high_watermark == 0
    data.authorizer = authorizer(allow(ResourceType.TOPIC, TOPIC, AclOperation.WRITE))
    answer = await produce(ctx(9), produce_request(), data)
    assert answer.responses[0].partition_responses[0].error_code == ErrorCode.none


async def test_a_denied_produce_with_acks_0_closes_the_connection(data: Any) -> None:
    # Kafka's handleProduceRequest: no answer is expected, so the connection closes for
    # the producer to notice; the response it would have had goes to the metrics.
    with pytest.raises(CloseConnection, match=f"{TOPIC}-0: TOPIC_AUTHORIZATION_FAILED") as exc:
        await produce(ctx(9), produce_request(acks=0), data)
    assert exc.value.response.responses[0].partition_responses[0].error_code == TAF
    assert data.logs.get(TOPIC, 0).high_watermark == 0
    data.authorizer = authorizer(allow(ResourceType.TOPIC, TOPIC, AclOperation.WRITE))
    assert await produce(ctx(9), produce_request(acks=0), data) is None
    assert data.logs.get(TOPIC, 0).log_end_offset == 1


async def test_transactional_produce_needs_write_on_the_transactional_id(data: Any) -> None:
    data.authorizer = authorizer(allow(ResourceType.TOPIC, TOPIC, AclOperation.WRITE))
    batch = build_batch(
        [NewRecord(None, b"v")], producer_id=1, producer_epoch=0, is_transactional=True
    )
    req = request(
        0,
        9,
        {
            "transactional_id": "tx",
            "acks": 1,
            "timeout": 5_000,
            "topic_data": [{"name": TOPIC, "partition_data": [{"index": 0, "records": batch}]}],
        },
    )
    answer = await produce(ctx(9), req, data)
    assert answer.responses[0].partition_responses[0].error_code == TXN_AF
    assert data.logs.get(TOPIC, 0).high_watermark == 0


async def test_fetch_list_offsets_and_delete_records_per_topic(data: Any) -> None:
    fetch_req = request(
        1,
        12,
        {
            "max_wait": 0,
            "min_bytes": 1,
            "max_bytes": 1 << 20,
            "topics": [
                {
                    "topic": TOPIC,
                    "partitions": [
                        {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}
                    ],
                }
            ],
        },
    )
    got = await fetch(ctx(12), fetch_req, data)
    assert got.responses[0].partitions[0].error_code == TAF
    offsets_req = request(
        2, 7, {"topics": [{"name": TOPIC, "partitions": [{"partition_index": 0, "timestamp": -1}]}]}
    )
    offsets = await list_offsets(ctx(7), offsets_req, data)
    denied = offsets.topics[0].partitions[0]
    assert (denied.error_code, denied.offset, denied.leader_epoch) == (TAF, -1, -1)
    delete_req = request(
        21, 2, {"topics": [{"name": TOPIC, "partitions": [{"partition_index": 0, "offset": 0}]}]}
    )
    deleted = await delete_records(ctx(2), delete_req, data)
    assert deleted.topics[0].partitions[0].error_code == TAF
    # READ gives Fetch and (implied DESCRIBE) ListOffsets, not DeleteRecords.
    data.authorizer = authorizer(allow(ResourceType.TOPIC, TOPIC, AclOperation.READ))
    got = await fetch(ctx(12), fetch_req, data)
    assert got.responses[0].partitions[0].error_code == ErrorCode.none
    offsets = await list_offsets(ctx(7), offsets_req, data)
    assert offsets.topics[0].partitions[0].error_code == ErrorCode.none
    deleted = await delete_records(ctx(2), delete_req, data)
    assert deleted.topics[0].partitions[0].error_code == TAF


def fetch_request(version: int, topic_id: uuid.UUID, **more: Any) -> Any:
    return request(
        1,
        version,
        {
            "max_wait": 0,
            "min_bytes": 1,
            "max_bytes": 1 << 20,
            "topics": [
                {
                    "topic": TOPIC,
                    "topic_id": topic_id,
                    "partitions": [
                        {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}
                    ],
                }
            ],
            **more,
        },
    )


@pytest.mark.parametrize(
    ("version", "replica"),
    [(12, {"replica_id": 1}), (15, {"replica_state": {"replica_id": 1, "replica_epoch": -1}})],
)
async def test_a_follower_fetch_needs_cluster_action_not_read(
    data: Any, version: int, replica: dict[str, Any]
) -> None:
    data.authorizer = authorizer(allow(ResourceType.TOPIC, TOPIC, AclOperation.READ))
    topic_id = data.metadata.state.topics[TOPIC].topic_id
    follower = fetch_request(version, topic_id, **replica)

    def code(answer: Any) -> ErrorCode:
        return ErrorCode(answer.responses[0].partitions[0].error_code)

    assert code(await fetch(ctx(version), follower, data)) == TAF
    data.authorizer = authorizer(
        allow(ResourceType.CLUSTER, "kafka-cluster", AclOperation.CLUSTER_ACTION)
    )
    assert code(await fetch(ctx(version), follower, data)) == ErrorCode.none
    # A consumer's fetch still needs READ.
    assert code(await fetch(ctx(version), fetch_request(version, topic_id), data)) == TAF


# -- CreateTopics, DeleteTopics, CreatePartitions, configs --------------------------------


async def settled() -> None:
    """A broker's claims_settled with nothing to wait for (no cluster)."""


@pytest.fixture
async def meta(tmp_path: Path) -> AsyncIterator[Any]:
    commit = GroupCommit()
    commit.start()
    store = MetadataStore(tmp_path / "meta", commit)
    broker = SimpleNamespace(
        config=BrokerConfig({}),
        node_id=1,
        metadata=store,
        logs=Logs(),
        topic_changed_hooks=[],
        topic_deleted_hooks=[],
        authorizer=NO_AUTHORIZER,
        groups=untouchable(),
        claims_settled=settled,
    )
    try:
        yield broker
    finally:
        store.close()
        await commit.stop()


def create(*names: str) -> Any:
    return request(
        19,
        7,
        {
            "topics": [{"name": n, "num_partitions": 1, "replication_factor": 1} for n in names],
            "timeout": 5_000,
        },
    )


async def test_create_topics_needs_create_and_describe_configs_for_configs(meta: Any) -> None:
    meta.authorizer = authorizer(
        allow(ResourceType.TOPIC, "mine-", AclOperation.CREATE, PatternType.PREFIXED),
        allow(ResourceType.TOPIC, "mine-seen", AclOperation.DESCRIBE_CONFIGS),
    )
    answer = await topics.create_topics(ctx(7), create("mine-seen", "mine-blind", "other"), meta)
    got = {t.name: t for t in answer.topics}
    assert got["other"].error_code == TAF
    assert "other" not in meta.metadata.state.topics
    assert got["mine-seen"].error_code == ErrorCode.none and got["mine-seen"].configs
    blind = got["mine-blind"]
    assert (blind.error_code, blind.topic_config_error_code) == (ErrorCode.none, TAF)
    assert (blind.num_partitions, blind.replication_factor, blind.configs) == (-1, -1, ())
    # CREATE on the cluster creates any topic.
    meta.authorizer = authorizer(allow(ResourceType.CLUSTER, "kafka-cluster", AclOperation.CREATE))
    (t,) = (await topics.create_topics(ctx(7), create("other"), meta)).topics
    assert t.error_code == ErrorCode.none


async def test_a_duplicated_create_topics_name_is_refused_whole_and_answered_once(
    meta: Any,
) -> None:
    # Kafka's ControllerApis.createTopics: a name given twice creates nothing and is
    # answered once, INVALID_REQUEST "Duplicate topic name.", authorized or not.
    meta.authorizer = authorizer(allow(ResourceType.TOPIC, "mine", AclOperation.CREATE))
    answer = await topics.create_topics(ctx(7), create("mine", "other", "mine", "fine"), meta)
    got = [(t.name, t.error_code, t.error_message) for t in answer.topics]
    assert got[:3] == [
        ("mine", ErrorCode.invalid_request, "Duplicate topic name."),
        ("other", TAF, "Authorization failed."),
        ("fine", TAF, "Authorization failed."),
    ]
    assert len(got) == 3
    meta.authorizer = authorizer()
    answer = await topics.create_topics(ctx(7), create("other", "other"), meta)
    assert [(t.name, t.error_code) for t in answer.topics] == [("other", ErrorCode.invalid_request)]
    assert "mine" not in meta.metadata.state.topics
    assert "other" not in meta.metadata.state.topics


async def test_delete_topics_discloses_nothing_without_describe(meta: Any) -> None:
    await topics.create_topics(ctx(7), create("seen", "hidden"), meta)
    meta.authorizer = authorizer(allow(ResourceType.TOPIC, "seen", AclOperation.DESCRIBE))
    req = request(20, 6, {"topics": [{"name": "seen"}, {"name": "hidden"}, {"name": "absent"}]})
    answer = await topics.delete_topics(ctx(6), req, meta)
    got = {r.name: r.error_code for r in answer.responses}
    # Undescribable: denied whether it exists or not; describable: denied for DELETE.
    assert got == {"seen": TAF, "hidden": TAF, "absent": TAF}
    assert set(meta.metadata.state.topics) == {"seen", "hidden"}
    # By id: the name only to whom may describe the topic.
    by_id = request(
        20,
        6,
        {
            "topics": [
                {"topic_id": meta.metadata.state.topics["seen"].topic_id},
                {"topic_id": meta.metadata.state.topics["hidden"].topic_id},
            ]
        },
    )
    answer = await topics.delete_topics(ctx(6), by_id, meta)
    assert sorted((r.name or "", r.error_code) for r in answer.responses) == [
        ("", TAF),
        ("seen", TAF),
    ]
    meta.authorizer = authorizer(allow(ResourceType.TOPIC, "seen", AclOperation.DELETE))
    answer = await topics.delete_topics(
        ctx(6), request(20, 6, {"topics": [{"name": "seen"}, {"name": "absent"}]}), meta
    )
    got = {r.name: r.error_code for r in answer.responses}
    # DELETE implies DESCRIBE: the absent topic stays denied, "seen" goes.
    assert got == {"seen": ErrorCode.none, "absent": TAF}


async def test_create_partitions_needs_alter(meta: Any) -> None:
    await topics.create_topics(ctx(7), create("t"), meta)
    meta.authorizer = authorizer(allow(ResourceType.TOPIC, "t", AclOperation.DESCRIBE))
    req = request(37, 3, {"topics": [{"name": "t", "count": 2, "assignments": None}], "timeout": 1})
    (r,) = (await topics.create_partitions(ctx(3), req, meta)).results
    assert r.error_code == TAF
    assert meta.metadata.state.topics["t"].partitions == 1


async def test_configs_are_authorized_per_resource_type(meta: Any) -> None:
    await topics.create_topics(ctx(7), create("t"), meta)
    meta.authorizer = authorizer(allow(ResourceType.TOPIC, "t", AclOperation.DESCRIBE_CONFIGS))
    resources = [
        {"resource_type": configs.TOPIC, "resource_name": "t"},
        {"resource_type": configs.TOPIC, "resource_name": "u"},
        {"resource_type": configs.BROKER, "resource_name": "1"},
        {"resource_type": configs.GROUP, "resource_name": "g"},
    ]
    described = await configs.describe_configs(
        ctx(4), request(32, 4, {"resources": resources}), meta
    )
    assert [r.error_code for r in described.results] == [ErrorCode.none, TAF, CAF, GAF]
    alter = [
        {**r, "configs": [{"name": "retention.ms", "config_operation": 0, "value": "1"}]}
        for r in resources
    ]
    altered = await configs.incremental_alter_configs(
        ctx(1), request(44, 1, {"resources": alter}), meta
    )
    # DESCRIBE_CONFIGS does not imply ALTER_CONFIGS.
    assert [r.error_code for r in altered.responses] == [TAF, TAF, CAF, GAF]
    assert meta.metadata.state.topics["t"].configs == {}


# -- share groups -------------------------------------------------------------------------


class Groups:
    """The group coordinator as the share handlers see it, recording what reached it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.runtime = SimpleNamespace(loading=False)  # its log loaded

    async def heartbeat(self, *args: Any) -> Any:
        self.calls.append(("heartbeat", args[0]))
        return SimpleNamespace(
            member_id="m", member_epoch=1, heartbeat_interval_ms=5000, assignment=None
        )

    def list_groups(self) -> list[Any]:
        return [GroupListing(g, "Empty") for g in ("mine", "theirs")]

    async def delete_groups(self, names: list[str]) -> list[tuple[str, None]]:
        self.calls.append(("delete_groups", names))
        return [(n, None) for n in names]

    async def alter_offsets(self, group_id: str, topics: Any) -> list[Any]:
        self.calls.append(("alter_offsets", [name for name, _ in topics]))
        return []

    async def delete_offsets(self, group_id: str, names: list[str]) -> list[Any]:
        self.calls.append(("delete_offsets", names))
        return []

    async def describe_offsets(self, group_id: str, wanted: Any, end_offset: Any) -> list[Any]:
        self.calls.append(("describe_offsets", wanted))
        return []


def share_broker(az: Authorizer) -> Any:
    return SimpleNamespace(
        authorizer=az,
        groups=Groups(),
        node_id=1,
        metadata=SimpleNamespace(state=SimpleNamespace(topics={}, topics_by_id={})),
        share_service=untouchable(),
        log_partition=lambda tid, p: None,
        cluster=alone(1, "SASL_PLAINTEXT"),
    )


async def test_share_group_heartbeat_needs_read_on_the_group_and_describe_on_topics() -> None:
    broker = share_broker(authorizer(allow(ResourceType.TOPIC, "a", AclOperation.DESCRIBE)))
    hb = request(
        76,
        1,
        {
            "group_id": "g",
            "member_id": "m",
            "member_epoch": 0,
            "subscribed_topic_names": ["a", "b"],
        },
    )
    assert (await share.share_group_heartbeat(ctx(1), hb, broker)).error_code == GAF
    broker.authorizer = authorizer(
        allow(ResourceType.GROUP, "g", AclOperation.READ),
        allow(ResourceType.TOPIC, "a", AclOperation.DESCRIBE),
    )
    assert (await share.share_group_heartbeat(ctx(1), hb, broker)).error_code == TAF
    assert broker.groups.calls == []
    broker.authorizer = authorizer(
        allow(ResourceType.GROUP, "g", AclOperation.READ),
        allow(ResourceType.TOPIC, "", AclOperation.DESCRIBE, PatternType.PREFIXED),
    )
    assert (await share.share_group_heartbeat(ctx(1), hb, broker)).error_code == ErrorCode.none


async def test_share_fetch_and_acknowledge_need_read_on_the_group() -> None:
    broker = share_broker(authorizer())
    req = request(78, 1, {"group_id": "g", "member_id": "m", "share_session_epoch": 0})
    answer = await share.share_fetch(ctx(1), req, broker)
    assert (answer.error_code, answer.responses) == (GAF, ())
    ack = request(79, 1, {"group_id": "g", "member_id": "m", "share_session_epoch": 1})
    assert (await share.share_acknowledge(ctx(1), ack, broker)).error_code == GAF


async def test_share_fetch_passes_read_on_each_topic_to_the_service() -> None:
    readable, secret = uuid.uuid4(), uuid.uuid4()
    broker = share_broker(
        authorizer(
            allow(ResourceType.GROUP, "g", AclOperation.READ),
            allow(ResourceType.TOPIC, "r", AclOperation.READ),
        )
    )
    for tid, name in ((readable, "r"), (secret, "s")):
        broker.metadata.state.topics_by_id[tid] = Topic(name, tid, 1)
    seen: list[Any] = []

    class Service:
        async def share_acknowledge(self, p: ShareAcknowledgeParams) -> Any:
            seen.append(p)
            return SimpleNamespace(
                error_code=ErrorCode.none,
                error_message=None,
                acquisition_lock_timeout_ms=1,
                partitions={},
            )

    broker.share_service = Service()
    ack = request(79, 1, {"group_id": "g", "member_id": "m", "share_session_epoch": 1})
    await share.share_acknowledge(ctx(1), ack, broker)
    (p,) = seen
    assert p.readable(readable) and not p.readable(secret)
    assert p.readable(uuid.uuid4())  # unknown: left to UNKNOWN_TOPIC_ID


async def test_a_share_fetch_answers_an_unreadable_topic_denied_and_acquires_nothing() -> None:
    svc, _, _ = service()
    denied = params(0, readable=lambda tid: False)
    result = await asyncio.wait_for(svc.share_fetch(denied), BOUND_S)
    entry = result.partitions[TP]
    assert (entry.error_code, entry.acquired) == (TAF, [])
    acked = await svc.share_acknowledge(
        ShareAcknowledgeParams(
            group_id="g",
            member_id="m",
            member_id_raw="m",
            epoch=1,
            acks={TP: [(0, 0, (1,))]},
            readable=lambda tid: False,
        )
    )
    assert acked.partitions[TP][0] == TAF
    svc.manager.stop()


async def test_share_group_describe_and_list_groups_need_describe() -> None:
    broker = share_broker(authorizer(allow(ResourceType.GROUP, "mine", AclOperation.DESCRIBE)))
    listed = await share.list_groups(ctx(5), request(16, 5, {}), broker)
    assert [g.group_id for g in listed.groups] == ["mine"]
    broker.authorizer = authorizer(
        allow(ResourceType.CLUSTER, "kafka-cluster", AclOperation.DESCRIBE)
    )
    listed = await share.list_groups(ctx(5), request(16, 5, {}), broker)
    assert [g.group_id for g in listed.groups] == ["mine", "theirs"]
    described = await share.share_group_describe(
        ctx(1), request(77, 1, {"group_ids": ["theirs"]}), broker
    )
    assert described.groups[0].error_code == GAF


async def test_share_group_admin_rpcs_check_group_then_topics() -> None:
    broker = share_broker(authorizer(allow(ResourceType.GROUP, "g", AclOperation.DESCRIBE)))
    deleted = await share_admin.delete_groups(
        ctx(2), request(42, 2, {"groups_names": ["g", "h"]}), broker
    )
    assert [(r.group_id, r.error_code) for r in deleted.results] == [("g", GAF), ("h", GAF)]
    assert broker.groups.calls == []
    # Alter: READ on the group; READ per topic.
    alter = request(
        91,
        0,
        {
            "group_id": "g",
            "topics": [
                {"topic_name": "r", "partitions": [{"partition_index": 0, "start_offset": 0}]},
                {"topic_name": "s", "partitions": [{"partition_index": 0, "start_offset": 0}]},
            ],
        },
    )
    assert (await share_admin.alter_share_group_offsets(ctx(0), alter, broker)).error_code == GAF
    broker.authorizer = authorizer(
        allow(ResourceType.GROUP, "g", AclOperation.READ),
        allow(ResourceType.TOPIC, "r", AclOperation.READ),
    )
    altered = await share_admin.alter_share_group_offsets(ctx(0), alter, broker)
    assert [(t.topic_name, t.partitions[0].error_code) for t in altered.responses] == [("s", TAF)]
    assert broker.groups.calls == [("alter_offsets", ["r"])]
    # Delete: DELETE on the group (READ is not enough).
    delete = request(92, 0, {"group_id": "g", "topics": [{"topic_name": "r"}, {"topic_name": "s"}]})
    assert (await share_admin.delete_share_group_offsets(ctx(0), delete, broker)).error_code == GAF
    broker.authorizer = authorizer(
        allow(ResourceType.GROUP, "g", AclOperation.DELETE),
        allow(ResourceType.TOPIC, "r", AclOperation.READ),
    )
    got = await share_admin.delete_share_group_offsets(ctx(0), delete, broker)
    assert [(t.topic_name, t.error_code) for t in got.responses] == [("s", TAF)]
    assert broker.groups.calls[-1] == ("delete_offsets", ["r"])
    # Describe: DESCRIBE on the group; a named topic not describable is denied per partition.
    describe = request(
        90,
        1,
        {"groups": [{"group_id": "g", "topics": [{"topic_name": "s", "partitions": [0, 1]}]}]},
    )
    (group,) = (await share_admin.describe_share_group_offsets(ctx(1), describe, broker)).groups
    assert group.error_code == ErrorCode.none
    assert [p.error_code for p in group.topics[0].partitions] == [TAF, TAF]
    assert broker.groups.calls[-1] == ("describe_offsets", [])


# -- transactions -------------------------------------------------------------------------


async def test_end_txn_and_txn_offset_commit_need_write_on_the_transactional_id() -> None:
    broker = SimpleNamespace(
        authorizer=authorizer(allow(ResourceType.GROUP, "g", AclOperation.READ)),
        transactions=untouchable(),
        metadata=SimpleNamespace(state=SimpleNamespace(topics={})),
    )
    end = request(26, 4, {"transactional_id": "tx", "producer_id": 1, "producer_epoch": 0})
    assert (await end_txn(ctx(4), end, broker)).error_code == TXN_AF
    commit = request(
        28,
        3,
        {
            "transactional_id": "tx",
            "group_id": "g",
            "topics": [{"name": "t", "partitions": [{"partition_index": 0}]}],
        },
    )
    answer = await txn_offset_commit(ctx(3), commit, broker)
    assert answer.topics[0].partitions[0].error_code == TXN_AF


async def test_consumer_group_heartbeat_needs_read_on_the_group_and_describe_on_topics() -> None:
    broker = share_broker(authorizer(allow(ResourceType.TOPIC, "a", AclOperation.DESCRIBE)))
    seen: list[Any] = []

    async def heartbeat(group_id: str, req: Any, version: int, describable: Any) -> Any:
        seen.append(describable)
        return SimpleNamespace(member_id="m", member_epoch=1, assignment=None)

    broker.groups.consumer = SimpleNamespace(
        heartbeat=heartbeat,
        group_config=lambda group_id: SimpleNamespace(heartbeat_interval_ms=5000),
    )
    hb = request(
        68,
        1,
        {
            "group_id": "g",
            "member_id": "m",
            "member_epoch": 0,
            "rebalance_timeout": 1000,
            "subscribed_topic_names": ["a", "b"],
            "topic_partitions": [],
        },
    )
    answer = await consumer.consumer_group_heartbeat(ctx(1), hb, broker)
    assert (answer.error_code, answer.member_epoch) == (GAF, -1)
    broker.authorizer = authorizer(
        allow(ResourceType.GROUP, "g", AclOperation.READ),
        allow(ResourceType.TOPIC, "a", AclOperation.DESCRIBE),
    )
    assert (await consumer.consumer_group_heartbeat(ctx(1), hb, broker)).error_code == TAF
    assert seen == []
    broker.authorizer = authorizer(
        allow(ResourceType.GROUP, "g", AclOperation.READ),
        allow(ResourceType.TOPIC, "a", AclOperation.DESCRIBE),
        allow(ResourceType.TOPIC, "b", AclOperation.DESCRIBE),
    )
    assert (
        await consumer.consumer_group_heartbeat(ctx(1), hb, broker)
    ).error_code == ErrorCode.none
    # A regex resolves only to the topics the member may DESCRIBE.
    [describable] = seen
    assert describable(["a", "b", "c"]) == ["a", "b"]
