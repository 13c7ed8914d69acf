"""A coordinator log this broker claimed and is still loading (broker.broker's
`CoordinatorLogsHost.open_coordinator`, the restore from the database held open here):
every RPC that reaches its coordinator answers COORDINATOR_LOAD_IN_PROGRESS (ListGroups
and ListTransactions as a whole), as Kafka 4.2's CoordinatorRuntime (a context in state
LOADING) and TransactionStateManager (a partition in `loadingPartitions`) answer, so
clients retry the same broker; once loaded they are served from the state the log holds.
A broker that does not lead the logs answers NOT_COORDINATOR instead (clients look the
coordinator up again; the listings list nothing), and so does one whose load failed.

The coordinators are the real ones on in-memory logs; the handlers are called as the
broker calls them, with a stand-in broker holding just what they use.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from types import SimpleNamespace
from typing import Any

import pytest

from broker.authorizer import NO_AUTHORIZER
from broker.broker import CoordinatorLogsHost
from broker.cluster import BrokerEndpoint, BrokerInfo, Leader
from broker.handlers import cluster as cluster_handlers
from broker.handlers import share, share_state, transactions
from broker.leadership import COORDINATOR_LOGS, Leadership
from coordinator.assignor import TopicMetadata
from coordinator.group_config import GroupConfigStore
from coordinator.group_coordinator import GroupCoordinator
from coordinator.metadata import Topic
from coordinator.share_persister import InMemoryPersister
from coordinator.share_state import ShareStateKey
from coordinator.transactions import TransactionCoordinator
from persister.clock import ManualClock
from persister.coordinator_log import MemoryRecordLog
from persister.pg_leadership import ClaimedLog
from protocol import api
from protocol.errors import ErrorCode
from tests.unit.cluster_fakes import alone
from tests.unit.test_leadership import Host, MemoryStore

T1 = uuid.UUID(int=1)
TOPIC = "t1"
GROUP = "g"
TID = "tx"
LOADING = ErrorCode.coordinator_load_in_progress
NOT_COORDINATOR = ErrorCode.not_coordinator


def ctx(version: int) -> Any:
    return SimpleNamespace(
        api_version=version,
        header=SimpleNamespace(client_id="unit"),
        listener="PLAINTEXT",
        client_host="127.0.0.1",
        connection_id=1,
    )


def request(api_key: int, version: int, data: dict[str, Any]) -> Any:
    return api.build(api.request_class(api_key, version), data)


class HeldRestore:
    """The database side of a claim: `restore_claimed` waits until `release` is set
    (or fails with `error`), as a restore of a large log from PostgreSQL takes a while."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.waiting: set[str] = set()
        self.error: Exception | None = None

    async def restore_claimed(self, name: str, claimed: ClaimedLog) -> None:
        self.waiting.add(name)
        await self.release.wait()
        if self.error is not None:
            raise self.error


class MemoryLogsHost(CoordinatorLogsHost):
    """The broker's CoordinatorLogsHost, its logs the in-memory ones the broker had."""

    def _log(self, name: str) -> Any:
        return self.broker.record_logs[name]


_PIDS = itertools.count(1000)


async def _allocate() -> int:
    return next(_PIDS)


def _broker() -> Any:
    clock = ManualClock()
    logs = {name: MemoryRecordLog() for name in COORDINATOR_LOGS}
    persister = InMemoryPersister(record_log=logs["share-state"], clock=clock)
    groups = GroupCoordinator(
        persister,
        lambda: {T1: TopicMetadata(T1, TOPIC, 2)},
        GroupConfigStore(),
        logs["groups"],
        clock=clock,
    )
    txns = TransactionCoordinator(logs["transactions"], allocate_producer_id=_allocate, clock=clock)
    persister.load()
    groups.load()
    groups.start()
    txns.load()
    txns.start()
    return SimpleNamespace(
        node_id=1,
        clock=clock,
        record_logs=logs,
        groups=groups,
        transactions=txns,
        share_persister=persister,
        share=SimpleNamespace(drop_all=lambda: None),
        authorizer=NO_AUTHORIZER,
        cluster=alone(),
        metadata=SimpleNamespace(state=SimpleNamespace(topics={TOPIC: Topic(TOPIC, T1, 2)})),
        logs=SimpleNamespace(get=lambda topic, index: object() if topic == TOPIC else None),
    )


async def _state_before(b: Any) -> tuple[int, int]:
    """A share group with a member, its share state, an ongoing transaction."""
    await b.groups.heartbeat(GROUP, "m1", 0, [TOPIC], None, "c", "/127.0.0.1")
    await b.share_persister.initialize_state(ShareStateKey(GROUP, T1, 0), 0, 0)
    pid, epoch = await b.transactions.init_producer_id(TID, 60_000)
    await b.transactions.add_partitions(TID, pid, epoch, [(TOPIC, 0)])
    return pid, epoch


def _unload(b: Any) -> None:
    """Another broker led the logs meanwhile (its claims fenced this one's)."""
    b.groups.drop("claimed by broker 2")
    b.transactions.drop("claimed by broker 2")
    b.share_persister.unload("claimed by broker 2")


async def _answers(b: Any, pid: int, epoch: int) -> dict[str, list[ErrorCode]]:
    """The error codes of every RPC that reaches a coordinator, by API."""
    out: dict[str, list[ErrorCode]] = {}
    hb = await share.share_group_heartbeat(
        ctx(1),
        request(
            76,
            1,
            {
                "group_id": GROUP,
                "member_id": "m2",
                "member_epoch": 0,
                "subscribed_topic_names": [TOPIC],
            },
        ),
        b,
    )
    out["ShareGroupHeartbeat"] = [hb.error_code]
    described = await share.share_group_describe(ctx(1), request(77, 1, {"group_ids": [GROUP]}), b)
    out["ShareGroupDescribe"] = [g.error_code for g in described.groups]
    groups = await share.list_groups(ctx(5), request(16, 5, {}), b)
    out["ListGroups"] = [groups.error_code]

    def parts(answer: Any) -> list[ErrorCode]:
        return [p.error_code for r in answer.results for p in r.partitions]

    one = [{"topic_id": T1, "partitions": [{"partition": 0, "leader_epoch": 1}]}]
    read = await share_state.read_share_group_state(
        ctx(0), request(84, 0, {"group_id": GROUP, "topics": one}), b
    )
    out["ReadShareGroupState"] = parts(read)
    summary = await share_state.read_share_group_state_summary(
        ctx(1), request(87, 1, {"group_id": GROUP, "topics": one}), b
    )
    out["ReadShareGroupStateSummary"] = parts(summary)
    written = await share_state.write_share_group_state(
        ctx(1),
        request(
            85,
            1,
            {
                "group_id": GROUP,
                "topics": [
                    {
                        "topic_id": T1,
                        "partitions": [
                            {
                                "partition": 0,
                                "state_epoch": 0,
                                "leader_epoch": 1,
                                "start_offset": 0,
                                "state_batches": [],
                            }
                        ],
                    }
                ],
            },
        ),
        b,
    )
    out["WriteShareGroupState"] = parts(written)
    initialized = await share_state.initialize_share_group_state(
        ctx(0),
        request(
            83,
            0,
            {
                "group_id": "other",
                "topics": [
                    {
                        "topic_id": T1,
                        "partitions": [{"partition": 1, "state_epoch": 0, "start_offset": 0}],
                    }
                ],
            },
        ),
        b,
    )
    out["InitializeShareGroupState"] = parts(initialized)
    deleted = await share_state.delete_share_group_state(
        ctx(0),
        request(
            86,
            0,
            {"group_id": "other", "topics": [{"topic_id": T1, "partitions": [{"partition": 1}]}]},
        ),
        b,
    )
    out["DeleteShareGroupState"] = parts(deleted)

    init = await transactions.init_transactional_producer_id(
        ctx(5),
        request(
            22,
            5,
            {
                "transactional_id": "tx2",
                "transaction_timeout": 60_000,
                "producer_id": -1,
                "producer_epoch": -1,
            },
        ),
        b,
    )
    out["InitProducerId"] = [init.error_code]
    topics = [{"name": TOPIC, "partitions": [0]}]
    added = await transactions.add_partitions_to_txn(
        ctx(3),
        request(
            24,
            3,
            {
                "v3_and_below_transactional_id": TID,
                "v3_and_below_producer_id": pid,
                "v3_and_below_producer_epoch": epoch,
                "v3_and_below_topics": topics,
            },
        ),
        b,
    )
    out["AddPartitionsToTxn"] = [
        p.partition_error_code
        for t in added.results_by_topic_v3_and_below
        for p in t.results_by_partition
    ]
    verified = await transactions.add_partitions_to_txn(
        ctx(5),
        request(
            24,
            5,
            {
                "transactions": [
                    {
                        "transactional_id": TID,
                        "producer_id": pid,
                        "producer_epoch": epoch,
                        "verify_only": True,
                        "topics": topics,
                    }
                ]
            },
        ),
        b,
    )
    out["AddPartitionsToTxn(verify)"] = [
        p.partition_error_code
        for r in verified.results_by_transaction
        for t in r.topic_results
        for p in t.results_by_partition
    ]
    offsets = await transactions.add_offsets_to_txn(
        ctx(4),
        request(
            25,
            4,
            {
                "transactional_id": TID,
                "producer_id": pid,
                "producer_epoch": epoch,
                "group_id": "cg",
            },
        ),
        b,
    )
    out["AddOffsetsToTxn"] = [offsets.error_code]
    described_txn = await transactions.describe_transactions(
        ctx(0), request(65, 0, {"transactional_ids": [TID]}), b
    )
    out["DescribeTransactions"] = [t.error_code for t in described_txn.transaction_states]
    listed = await transactions.list_transactions(ctx(2), request(66, 2, {}), b)
    out["ListTransactions"] = [listed.error_code]
    return out


async def _claim(b: Any, held: HeldRestore) -> list[asyncio.Task[None]]:
    host = MemoryLogsHost(b, held)  # type: ignore[arg-type]
    loads = [
        asyncio.ensure_future(
            host.open_coordinator(name, ClaimedLog(i, 3, 0, len(b.record_logs[name].records), None))
        )
        for i, name in enumerate(COORDINATOR_LOGS)
    ]
    while held.waiting != set(COORDINATOR_LOGS):
        await asyncio.sleep(0)
    return loads


async def test_a_coordinator_being_loaded_answers_load_in_progress_then_serves() -> None:
    b = _broker()
    pid, epoch = await _state_before(b)
    _unload(b)
    not_led = await _answers(b, pid, epoch)
    # Not led here: every coordinator RPC sends the client to look it up again, and
    # ListTransactions lists nothing (the admin client asks every broker).
    assert not_led.pop("ListTransactions") == [ErrorCode.none]
    assert not_led.pop("ListGroups") == [ErrorCode.none]
    assert not_led == {name: [NOT_COORDINATOR] for name in not_led}

    held = HeldRestore()
    loads = await _claim(b, held)
    assert b.groups.runtime.loading and b.transactions.runtime.loading
    assert b.share_persister.runtime.loading
    during = await _answers(b, pid, epoch)
    assert during == {name: [LOADING] for name in during}
    assert all(not load.done() for load in loads)

    held.release.set()
    await asyncio.gather(*loads)
    after = await _answers(b, pid, epoch)
    assert all(LOADING not in codes and NOT_COORDINATOR not in codes for codes in after.values())
    assert after["ShareGroupHeartbeat"] == [ErrorCode.none]
    assert after["ShareGroupDescribe"] == [ErrorCode.none]
    assert after["ReadShareGroupState"] == [ErrorCode.none]
    assert after["DescribeTransactions"] == [ErrorCode.none]
    assert after["ListTransactions"] == [ErrorCode.none]
    # The state the log held before is what is served.
    assert {m.member_id for m in b.groups.describe(GROUP).members} >= {"m1"}
    assert b.transactions.describe_transaction(TID).state.state_name == "Ongoing"
    await b.groups.stop()
    await b.transactions.stop()


async def test_a_load_that_fails_leaves_the_coordinator_not_coordinator() -> None:
    b = _broker()
    pid, epoch = await _state_before(b)
    _unload(b)
    held = HeldRestore()
    loads = await _claim(b, held)
    held.error = OSError("the database went away")
    held.release.set()
    for load in loads:
        with pytest.raises(OSError):
            await load
    answers = await _answers(b, pid, epoch)
    assert answers.pop("ListTransactions") == [ErrorCode.none]
    assert answers.pop("ListGroups") == [ErrorCode.none]
    assert answers == {name: [NOT_COORDINATOR] for name in answers}


class HeldCoordinators:
    """broker.leadership's CoordinatorHost whose loads wait until `release` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.loading: set[str] = set()
        self.loaded: set[str] = set()

    async def open_coordinator(self, name: str, claimed: ClaimedLog) -> None:
        self.loading.add(name)
        await self.release.wait()
        self.loading.discard(name)
        self.loaded.add(name)

    async def release_coordinator(self, name: str, reason: str) -> None:
        self.loaded.discard(name)

    def drop_coordinator(self, name: str, reason: str) -> None:
        self.loaded.discard(name)


async def test_find_coordinator_names_the_claimer_while_it_loads() -> None:
    # As Kafka's FindCoordinator names a coordinator partition's leader whether it has
    # loaded it or not: the client then gets COORDINATOR_LOAD_IN_PROGRESS from it and
    # retries there, instead of COORDINATOR_NOT_AVAILABLE and a new look-up.
    store = MemoryStore()
    store.live = {1}
    held = HeldCoordinators()
    leadership = Leadership(store, 1, lambda: [1], lambda: [], Host(), held)
    reconcile = asyncio.ensure_future(leadership.reconcile())
    while not held.loading:
        await asyncio.sleep(0)
    (first,) = held.loading
    assert leadership.coordinator(first) == Leader(1, 1)
    view = SimpleNamespace(
        node_id=1,
        coordinator=leadership.coordinator,
        broker=lambda node_id: BrokerInfo(1, (BrokerEndpoint("PLAINTEXT", "one", 9092),)),
        is_local=leadership.is_local,
    )
    b = SimpleNamespace(
        authorizer=NO_AUTHORIZER,
        cluster=view,
        advertised_for=lambda listener: SimpleNamespace(host="one", port=9092),
    )
    key_type = {"groups": 0, "transactions": 1, "share-state": 2}[first]
    found = await cluster_handlers.find_coordinator(
        ctx(6), request(10, 6, {"key_type": key_type, "coordinator_keys": ["k"]}), b
    )
    ((c,),) = [found.coordinators]
    assert (c.error_code, int(c.node_id), c.host, int(c.port)) == (ErrorCode.none, 1, "one", 9092)
    held.release.set()
    await reconcile
    assert held.loaded == set(COORDINATOR_LOGS)
    assert all(leadership.coordinator(name) == Leader(1, 1) for name in COORDINATOR_LOGS)


async def test_a_claim_whose_load_fails_names_no_coordinator_here() -> None:
    store = MemoryStore()
    store.live = {1}

    class Failing(HeldCoordinators):
        async def open_coordinator(self, name: str, claimed: ClaimedLog) -> None:
            raise OSError("the restore failed")

    leadership = Leadership(store, 1, lambda: [1], lambda: [], Host(), Failing())
    with pytest.raises(OSError):
        await leadership.reconcile()
    assert all(leadership.coordinator(name) is None for name in COORDINATOR_LOGS)


async def test_list_transactions_filters_as_kafka_does() -> None:
    b = _broker()
    pid, epoch = await _state_before(b)  # TID: Ongoing
    await b.transactions.init_producer_id("idle", 60_000)  # Empty
    b.clock.advance(5_000)

    async def listed(**data: Any) -> tuple[ErrorCode, list[str], tuple[str, ...]]:
        answer = await transactions.list_transactions(ctx(2), request(66, 2, data), b)
        ids = [t.transactional_id for t in answer.transaction_states]
        return answer.error_code, ids, answer.unknown_state_filters

    none = ErrorCode.none
    assert await listed() == (none, ["idle", TID], ())
    assert await listed(state_filters=["Ongoing", "Nope"]) == (none, [TID], ("Nope",))
    assert await listed(producer_id_filters=[pid]) == (none, [TID], ())
    # Running longer than 4 s: the ongoing one (the idle one has no start, -1, as Kafka).
    assert (await listed(duration_filter=4_000))[1] == ["idle", TID]
    assert (await listed(duration_filter=6_000))[1] == ["idle"]
    assert (await listed(transactional_id_pattern="t."))[1] == [TID]
    assert (await listed(transactional_id_pattern="t"))[1] == []  # the whole id must match
    assert (await listed(transactional_id_pattern="("))[0] == ErrorCode.invalid_regular_expression
    described = await transactions.describe_transactions(
        ctx(0), request(65, 0, {"transactional_ids": [TID, "idle", "unknown", ""]}), b
    )
    got = [(t.error_code, t.transaction_state) for t in described.transaction_states]
    assert got == [
        (none, "Ongoing"),
        (none, "Empty"),
        (ErrorCode.transactional_id_not_found, ""),
        (ErrorCode.invalid_request, ""),
    ]
    (ongoing, *_) = described.transaction_states
    assert [(t.topic, t.partitions) for t in ongoing.topics] == [(TOPIC, (0,))]
    assert (int(ongoing.producer_id), int(ongoing.producer_epoch)) == (pid, epoch)
    await b.groups.stop()
    await b.transactions.stop()
