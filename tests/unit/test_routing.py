"""The handlers ask `broker.cluster` who is live and who leads what (broker.cluster), and
answer as Kafka 4.2 does a partition this broker does not lead.

A fake ClusterView: this broker is node 1; node 2 leads some partitions, at epoch 5,
with an endpoint on both listeners (PLAINTEXT, SSL); node 3 has a PLAINTEXT endpoint
only. Checked per API: the error, KIP-951's CurrentLeader and NodeEndpoints (only in
the versions that carry them), and that nothing reached the log or a share partition.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from broker.authorizer import NO_AUTHORIZER
from broker.cluster import BrokerEndpoint, BrokerInfo, Leader
from broker.config import BrokerConfig
from broker.handlers import cluster as cluster_handlers
from broker.handlers import share
from broker.handlers.produce_fetch import delete_records, fetch, list_offsets, produce
from broker.partitions import LogManager
from broker.server import CloseConnection
from coordinator.metadata import Topic
from persister.commit import GroupCommit
from protocol import api
from protocol.errors import ErrorCode
from protocol.records import NewRecord, build_batch
from tests.unit.cluster_fakes import FakeCluster
from tests.unit.test_share_fetch_service import BOUND_S, service
from tests.unit.test_share_manager import ACCEPT, KEY, TOPIC_ID

NLF = ErrorCode.not_leader_or_follower
TOPIC = "routed"
ME, OTHER, THIRD = 1, 2, 3
OTHER_EPOCH, MY_EPOCH = 5, 3

BROKERS = [
    BrokerInfo(
        ME, (BrokerEndpoint("PLAINTEXT", "one", 9092), BrokerEndpoint("SSL", "one", 9093)), "r1"
    ),
    BrokerInfo(
        OTHER, (BrokerEndpoint("PLAINTEXT", "two", 9192), BrokerEndpoint("SSL", "two", 9193)), "r2"
    ),
    BrokerInfo(THIRD, (BrokerEndpoint("PLAINTEXT", "three", 9292),), None),
]


def ctx(version: int, listener: str = "PLAINTEXT") -> Any:
    return SimpleNamespace(
        api_version=version,
        header=SimpleNamespace(client_id="unit"),
        security=SimpleNamespace(listener=listener),
        listener=listener,
        client_host="127.0.0.1",
        connection_id=1,
    )


def request(api_key: int, version: int, data: dict[str, Any]) -> Any:
    return api.build(api.request_class(api_key, version), data)


# -- Metadata, DescribeCluster ----------------------------------------------------------

META_TOPIC_ID = uuid.uuid4()


def metadata_broker() -> Any:
    topic = Topic(TOPIC, META_TOPIC_ID, 5)
    leaders: dict[tuple[uuid.UUID, int], Leader | None] = {
        (META_TOPIC_ID, 0): Leader(ME, MY_EPOCH),
        (META_TOPIC_ID, 1): Leader(OTHER, OTHER_EPOCH),
        (META_TOPIC_ID, 2): None,  # no leader
        (META_TOPIC_ID, 3): Leader(THIRD, 7),  # live, without an SSL endpoint
        (META_TOPIC_ID, 4): Leader(9, 8),  # not live
    }
    return SimpleNamespace(
        authorizer=NO_AUTHORIZER,
        metadata=SimpleNamespace(
            state=SimpleNamespace(topics={TOPIC: topic}, topics_by_id={META_TOPIC_ID: topic})
        ),
        config=BrokerConfig({}),
        node_id=ME,
        cluster_id="c",
        cluster=FakeCluster(ME, BROKERS, leaders),
    )


def partitions_of(answer: Any) -> dict[int, tuple[Any, ...]]:
    (topic,) = answer.topics
    return {
        p.partition_index: (
            p.error_code,
            p.leader_id,
            getattr(p, "leader_epoch", None),  # v7+
            tuple(p.replica_nodes),
            tuple(p.isr_nodes),
            tuple(getattr(p, "offline_replicas", ())),  # v5+
        )
        for p in topic.partitions
    }


@pytest.mark.parametrize("version", [1, 12, 13])
async def test_metadata_lists_the_live_brokers_on_the_requests_listener(version: int) -> None:
    broker = metadata_broker()
    req = request(3, version, {"topics": [{"name": TOPIC}]})
    plain = await cluster_handlers.metadata(ctx(version), req, broker)
    assert [(b.node_id, b.host, b.port, b.rack) for b in plain.brokers] == [
        (ME, "one", 9092, "r1"),
        (OTHER, "two", 9192, "r2"),
        (THIRD, "three", 9292, None),
    ]
    # Node 3 has no SSL listener: left out of an SSL client's answer.
    ssl = await cluster_handlers.metadata(ctx(version, "SSL"), req, broker)
    assert [(b.node_id, b.host, b.port) for b in ssl.brokers] == [
        (ME, "one", 9093),
        (OTHER, "two", 9193),
    ]
    # A KRaft broker names a random live broker as the controller.
    assert {plain.controller_id, ssl.controller_id} <= {ME, OTHER, THIRD}
    assert plain.cluster_id == "c"


async def test_metadata_partitions_carry_their_leader_and_leader_epoch() -> None:
    broker = metadata_broker()
    req = request(3, 12, {"topics": [{"name": TOPIC}]})
    got = partitions_of(await cluster_handlers.metadata(ctx(12, "SSL"), req, broker))
    assert got == {
        0: (ErrorCode.none, ME, MY_EPOCH, (ME,), (ME,), ()),
        1: (ErrorCode.none, OTHER, OTHER_EPOCH, (OTHER,), (OTHER,), ()),
        2: (ErrorCode.leader_not_available, -1, -1, (), (), ()),
        3: (ErrorCode.listener_not_found, -1, 7, (THIRD,), (THIRD,), (THIRD,)),
        4: (ErrorCode.leader_not_available, -1, 8, (9,), (9,), (9,)),
    }
    # Before v6 a leader without the listener is LEADER_NOT_AVAILABLE (Kafka's
    # errorUnavailableListeners); v0 lists only the replicas a client can reach.
    v5 = partitions_of(
        api.at_version(3, 5, await cluster_handlers.metadata(ctx(5, "SSL"), req, broker))
    )
    assert v5[3][0] == ErrorCode.leader_not_available
    v0 = partitions_of(
        api.at_version(3, 0, await cluster_handlers.metadata(ctx(0, "SSL"), req, broker))
    )
    assert v0[3] == (ErrorCode.leader_not_available, -1, None, (), (), ())
    assert v0[1] == (ErrorCode.none, OTHER, None, (OTHER,), (OTHER,), ())


async def test_describe_cluster_lists_the_live_brokers_on_the_requests_listener() -> None:
    broker = metadata_broker()
    req = request(60, 1, {"endpoint_type": 1})
    plain = await cluster_handlers.describe_cluster(ctx(1), req, broker)
    assert [(b.broker_id, b.host, b.port, b.rack, b.is_fenced) for b in plain.brokers] == [
        (ME, "one", 9092, "r1", False),
        (OTHER, "two", 9192, "r2", False),
        (THIRD, "three", 9292, None, False),
    ]
    assert plain.controller_id in (ME, OTHER, THIRD)
    for _ in range(20):
        ssl = await cluster_handlers.describe_cluster(ctx(1, "SSL"), req, broker)
        assert [(b.broker_id, b.port) for b in ssl.brokers] == [(ME, 9093), (OTHER, 9193)]
        # Kafka answers -1 rather than a controller the list does not name.
        assert ssl.controller_id in (ME, OTHER, -1)


# -- Produce, Fetch, ListOffsets, DeleteRecords -----------------------------------------


@pytest.fixture
async def data(tmp_path: Path) -> AsyncIterator[Any]:
    """Topic `routed`, 2 partitions: node 2 leads 0 (epoch 5), this broker 1 (epoch 3)."""
    commit = GroupCommit()
    commit.start()
    logs = LogManager(tmp_path, BrokerConfig({}), commit)
    topic_id = uuid.uuid4()
    logs.open_topic(TOPIC, topic_id, 2, {})
    topic = Topic(TOPIC, topic_id, 2)
    broker = SimpleNamespace(
        logs=logs,
        metadata=SimpleNamespace(
            state=SimpleNamespace(topics={TOPIC: topic}, topics_by_id={topic_id: topic})
        ),
        transactions=SimpleNamespace(),
        authorizer=NO_AUTHORIZER,
        topic_id=topic_id,
        cluster=FakeCluster(
            ME,
            BROKERS,
            {(topic_id, 0): Leader(OTHER, OTHER_EPOCH), (topic_id, 1): Leader(ME, MY_EPOCH)},
        ),
    )
    try:
        yield broker
    finally:
        await logs.flush_all()
        logs.close()
        await commit.stop()


def produce_request(version: int, topic_id: uuid.UUID, acks: int = -1) -> Any:
    return request(
        0,
        version,
        {
            "acks": acks,
            "timeout": 5_000,
            "topic_data": [
                {
                    "name": TOPIC,
                    "topic_id": topic_id,
                    "partition_data": [
                        {"index": i, "records": build_batch([NewRecord(None, b"v")])}
                        for i in (0, 1)
                    ],
                }
            ],
        },
    )


def endpoints(answer: Any) -> list[tuple[int, str, int, str | None]]:
    return [(n.node_id, n.host, n.port, n.rack) for n in answer.node_endpoints]


@pytest.mark.parametrize("version", [10, 12, 13])
async def test_produce_to_a_partition_another_broker_leads_names_the_leader(
    data: Any, version: int
) -> None:
    answer = await produce(ctx(version, "SSL"), produce_request(version, data.topic_id), data)
    elsewhere, here = answer.responses[0].partition_responses
    assert (elsewhere.index, elsewhere.error_code) == (0, NLF)
    assert (elsewhere.current_leader.leader_id, elsewhere.current_leader.leader_epoch) == (
        OTHER,
        OTHER_EPOCH,
    )
    # The leader's endpoint on the listener the request came in on.
    assert endpoints(answer) == [(OTHER, "two", 9193, "r2")]
    assert (here.error_code, here.base_offset) == (ErrorCode.none, 0)
    # Nothing reached the log of the partition led elsewhere; the other was appended.
    assert data.logs.get(TOPIC, 0).log_end_offset == 0
    assert data.logs.get(TOPIC, 1).log_end_offset == 1
    # The answer encodes at the request's version, tagged fields included.
    api.at_version(0, version, answer)


async def test_produce_before_v10_gets_the_error_without_the_leader(data: Any) -> None:
    answer = await produce(ctx(9), produce_request(9, data.topic_id), data)
    old = api.at_version(0, 9, answer)
    (elsewhere, _) = old.responses[0].partition_responses
    assert elsewhere.error_code == NLF
    assert not hasattr(elsewhere, "current_leader") and not hasattr(old, "node_endpoints")
    assert data.logs.get(TOPIC, 0).log_end_offset == 0


async def test_produce_with_acks_0_to_a_partition_led_elsewhere_closes_the_connection(
    data: Any,
) -> None:
    with pytest.raises(CloseConnection, match=f"{TOPIC}-0: NOT_LEADER_OR_FOLLOWER"):
        await produce(ctx(11), produce_request(11, data.topic_id, acks=0), data)
    assert data.logs.get(TOPIC, 0).log_end_offset == 0


async def test_a_dropped_log_the_view_still_says_is_led_here_names_no_leader(data: Any) -> None:
    # Another broker took the log (its flush was fenced) before the view learnt of it:
    # the client is told to look the leader up, not to retry here.
    data.logs.drop_partition(TOPIC, 1, "fenced in the test")
    answer = await produce(ctx(13), produce_request(13, data.topic_id), data)
    _, dropped = answer.responses[0].partition_responses
    assert dropped.error_code == NLF
    assert (dropped.current_leader.leader_id, dropped.current_leader.leader_epoch) == (-1, -1)
    assert endpoints(answer) == [(OTHER, "two", 9192, "r2")]  # partition 0's leader only


def fetch_request(version: int, topic_id: uuid.UUID, epochs: tuple[int, int]) -> Any:
    return request(
        1,
        version,
        {
            "max_wait": 10_000,  # an error answers at once: no wait
            "min_bytes": 1,
            "max_bytes": 1 << 20,
            "topics": [
                {
                    "topic": TOPIC,
                    "topic_id": topic_id,
                    "partitions": [
                        {
                            "partition": i,
                            "fetch_offset": 0,
                            "partition_max_bytes": 1 << 20,
                            "current_leader_epoch": epochs[i],
                        }
                        for i in (0, 1)
                    ],
                }
            ],
        },
    )


def fetched(answer: Any) -> dict[int, Any]:
    return {p.partition_index: p for t in answer.responses for p in t.partitions}


async def test_fetch_from_a_partition_another_broker_leads_names_the_leader(data: Any) -> None:
    await produce(ctx(13), produce_request(13, data.topic_id), data)
    answer = await asyncio.wait_for(
        fetch(ctx(17), fetch_request(17, data.topic_id, (-1, -1)), data), BOUND_S
    )
    parts = fetched(answer)
    elsewhere = parts[0]
    assert (elsewhere.error_code, elsewhere.high_watermark, bytes(elsewhere.records)) == (
        NLF,
        -1,
        b"",
    )
    assert (elsewhere.current_leader.leader_id, elsewhere.current_leader.leader_epoch) == (
        OTHER,
        OTHER_EPOCH,
    )
    assert endpoints(answer) == [(OTHER, "two", 9192, "r2")]
    # The partition led here is read as usual, and names no leader.
    assert parts[1].error_code == ErrorCode.none and parts[1].high_watermark == 1
    assert parts[1].current_leader.leader_id == -1
    api.at_version(1, 17, answer)


async def test_fetch_before_v16_gets_the_error_without_the_leader(data: Any) -> None:
    answer = await fetch(ctx(15), fetch_request(15, data.topic_id, (-1, -1)), data)
    old = api.at_version(1, 15, answer)
    elsewhere = fetched(old)[0]
    assert elsewhere.error_code == NLF
    # Fetch v12-15 have the tagged field: Kafka leaves it unset there.
    assert (elsewhere.current_leader.leader_id, elsewhere.current_leader.leader_epoch) == (-1, -1)
    assert not hasattr(old, "node_endpoints")


@pytest.mark.parametrize(
    ("epoch", "code"),
    [
        (MY_EPOCH - 1, ErrorCode.fenced_leader_epoch),
        (MY_EPOCH + 1, ErrorCode.unknown_leader_epoch),
        (MY_EPOCH, ErrorCode.none),
        (-1, ErrorCode.none),  # -1: not checked
    ],
)
async def test_fetch_checks_the_current_leader_epoch(
    data: Any, epoch: int, code: ErrorCode
) -> None:
    answer = await asyncio.wait_for(
        fetch(ctx(17), fetch_request(17, data.topic_id, (-1, epoch)), data), BOUND_S
    )
    here = fetched(answer)[1]
    assert here.error_code == code
    leader = (here.current_leader.leader_id, here.current_leader.leader_epoch)
    if code == ErrorCode.fenced_leader_epoch:
        # KIP-951: a fenced epoch also names the leader (this broker) and its endpoint.
        assert leader == (ME, MY_EPOCH)
        assert (ME, "one", 9092, "r1") in endpoints(answer)
    else:
        assert leader == (-1, -1)


def offsets_request(version: int, epochs: tuple[int, int]) -> Any:
    return request(
        2,
        version,
        {
            "topics": [
                {
                    "name": TOPIC,
                    "partitions": [
                        {"partition_index": i, "timestamp": -1, "current_leader_epoch": epochs[i]}
                        for i in (0, 1)
                    ],
                }
            ]
        },
    )


@pytest.mark.parametrize(
    ("epoch", "code"),
    [
        (MY_EPOCH - 1, ErrorCode.fenced_leader_epoch),
        (MY_EPOCH + 1, ErrorCode.unknown_leader_epoch),
        (-1, ErrorCode.none),
    ],
)
async def test_list_offsets_answers_not_leader_and_checks_the_leader_epoch(
    data: Any, epoch: int, code: ErrorCode
) -> None:
    answer = await list_offsets(ctx(7), offsets_request(7, (-1, epoch)), data)
    elsewhere, here = answer.topics[0].partitions
    assert (elsewhere.error_code, elsewhere.offset, elsewhere.leader_epoch) == (NLF, -1, -1)
    assert here.error_code == code


async def test_delete_records_on_a_partition_led_elsewhere_deletes_nothing(data: Any) -> None:
    await produce(ctx(13), produce_request(13, data.topic_id), data)
    data.cluster.leaders[(data.topic_id, 1)] = Leader(OTHER, OTHER_EPOCH)
    req = request(
        21, 2, {"topics": [{"name": TOPIC, "partitions": [{"partition_index": 1, "offset": 1}]}]}
    )
    answer = await delete_records(ctx(2), req, data)
    assert answer.topics[0].partitions[0].error_code == NLF
    assert data.logs.get(TOPIC, 1).log_start_offset == 0


# -- ShareFetch, ShareAcknowledge -------------------------------------------------------


def share_broker(leader: Leader | None) -> Any:
    svc, _, _ = service()
    topic = Topic(TOPIC, TOPIC_ID, 1)
    return SimpleNamespace(
        authorizer=NO_AUTHORIZER,
        node_id=ME,
        metadata=SimpleNamespace(
            state=SimpleNamespace(topics={TOPIC: topic}, topics_by_id={TOPIC_ID: topic})
        ),
        share_service=svc,
        cluster=FakeCluster(ME, BROKERS, {(TOPIC_ID, 0): leader}),
    )


def share_fetch_request(version: int, epoch: int, acks: list[Any] | None = None) -> Any:
    return request(
        78,
        version,
        {
            "group_id": "g",
            "member_id": "m",
            "share_session_epoch": epoch,
            "max_wait": 0,
            "min_bytes": 1,
            "max_bytes": 1 << 20,
            "max_records": 500,
            "batch_size": 500,
            "topics": [
                {
                    "topic_id": TOPIC_ID,
                    "partitions": [{"partition_index": 0, "acknowledgement_batches": acks or []}],
                }
            ],
        },
    )


def share_partition(answer: Any) -> Any:
    ((part,),) = [t.partitions for t in answer.responses]
    return part


@pytest.mark.parametrize("version", [1, 2])
async def test_share_fetch_from_a_partition_another_broker_leads_acquires_nothing(
    version: int,
) -> None:
    broker = share_broker(Leader(OTHER, OTHER_EPOCH))
    answer = await asyncio.wait_for(
        share.share_fetch(ctx(version, "SSL"), share_fetch_request(version, 0), broker), BOUND_S
    )
    part = share_partition(answer)
    assert (part.error_code, part.acquired_records) == (NLF, ())
    assert (part.current_leader.leader_id, part.current_leader.leader_epoch) == (
        OTHER,
        OTHER_EPOCH,
    )
    assert endpoints(answer) == [(OTHER, "two", 9193, "r2")]
    # No share partition was loaded, nothing acquired.
    assert KEY not in broker.share_service.manager.partitions
    api.at_version(78, version, answer)
    # Once this broker leads it, the same session's next fetch acquires.
    broker.cluster.leaders[(TOPIC_ID, 0)] = Leader(ME, MY_EPOCH)
    answer = await asyncio.wait_for(
        share.share_fetch(ctx(version), share_fetch_request(version, 1), broker), BOUND_S
    )
    part = share_partition(answer)
    assert part.error_code == ErrorCode.none and part.acquired_records
    assert (part.current_leader.leader_id, part.current_leader.leader_epoch) == (ME, MY_EPOCH)
    assert answer.node_endpoints == ()
    broker.share_service.manager.stop()


async def test_share_fetch_from_a_partition_without_a_leader_names_none() -> None:
    broker = share_broker(None)
    answer = await asyncio.wait_for(
        share.share_fetch(ctx(1), share_fetch_request(1, 0), broker), BOUND_S
    )
    part = share_partition(answer)
    assert part.error_code == NLF
    assert (part.current_leader.leader_id, part.current_leader.leader_epoch) == (-1, -1)
    assert answer.node_endpoints == ()
    broker.share_service.manager.stop()


@pytest.mark.parametrize("version", [1, 2])
async def test_share_acknowledge_to_a_partition_another_broker_leads_applies_nothing(
    version: int,
) -> None:
    broker = share_broker(Leader(ME, MY_EPOCH))
    got = await asyncio.wait_for(
        share.share_fetch(ctx(version), share_fetch_request(version, 0), broker), BOUND_S
    )
    assert share_partition(got).acquired_records
    sp = broker.share_service.manager.partitions[KEY]
    before = (sp.spso, sp.acquired_count)
    # Leadership moves to node 2: the member's acknowledgement is not applied here.
    broker.cluster.leaders[(TOPIC_ID, 0)] = Leader(OTHER, OTHER_EPOCH + 1)
    ack = request(
        79,
        version,
        {
            "group_id": "g",
            "member_id": "m",
            "share_session_epoch": 1,
            "topics": [
                {
                    "topic_id": TOPIC_ID,
                    "partitions": [
                        {
                            "partition_index": 0,
                            "acknowledgement_batches": [
                                {"first_offset": 0, "last_offset": 0, "acknowledge_types": [ACCEPT]}
                            ],
                        }
                    ],
                }
            ],
        },
    )
    answer = await share.share_acknowledge(ctx(version), ack, broker)
    part = share_partition(answer)
    assert part.error_code == NLF
    assert (part.current_leader.leader_id, part.current_leader.leader_epoch) == (
        OTHER,
        OTHER_EPOCH + 1,
    )
    assert endpoints(answer) == [(OTHER, "two", 9192, "r2")]
    assert (sp.spso, sp.acquired_count) == before
    api.at_version(79, version, answer)
    # A ShareFetch carrying the acknowledgement: refused the same way, in both codes.
    fetch_ack = share_fetch_request(
        version, 2, [{"first_offset": 0, "last_offset": 0, "acknowledge_types": [ACCEPT]}]
    )
    answer = await asyncio.wait_for(share.share_fetch(ctx(version), fetch_ack, broker), BOUND_S)
    part = share_partition(answer)
    assert (part.error_code, part.acknowledge_error_code) == (NLF, NLF)
    assert part.current_leader.leader_id == OTHER
    assert (sp.spso, sp.acquired_count) == before
    broker.share_service.manager.stop()
