"""Transactions across brokers (broker.txn_markers): the coordinator's markers reach the
partitions other brokers lead, and produce verification asks a coordinator on another
broker. No sockets.

Three "brokers" share one LogManager in a temp dir, each serving the partitions it leads
(partition p is led by broker p + 1); broker 1 is the transaction coordinator. The fake
transport serves each request with spool's own handlers (WriteTxnMarkers on the target's
partitions, AddPartitionsToTxn on the coordinator), the request built by kio from the
sender's mapping and the response encoded and decoded as on the wire. The clock is a
ManualClock, moved to each backoff.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from broker.cluster import BrokerEndpoint, BrokerInfo, Leader
from broker.config import BrokerConfig
from broker.handlers.transactions import add_partitions_to_txn
from broker.handlers.txn_markers import write_txn_markers
from broker.partitions import LogManager, Partition, validate_produce_data
from broker.share.remote_persister import Target, TransportError
from broker.txn_markers import (
    ADD_PARTITIONS_TO_TXN,
    WRITE_TXN_MARKERS,
    MarkerChannel,
    Outcome,
    ProduceVerifier,
    outcome,
    plan,
)
from coordinator.transactions import OFFSETS_TOPIC, TransactionCoordinator
from persister.clock import ManualClock
from persister.commit import GroupCommit
from persister.coordinator_log import MemoryRecordLog
from protocol import api
from protocol.errors import ErrorCode, KafkaError
from protocol.records import NewRecord, build_batch

TOPIC = "orders"
TOPIC_ID = uuid.uuid4()
PARTITIONS = 3
LISTENER = "PLAINTEXT"
TID = "txn-cross"


def endpoint(node_id: int) -> BrokerEndpoint:
    return BrokerEndpoint(LISTENER, f"broker-{node_id}", 9092 + node_id)


@dataclass
class View:
    """Brokers 1-3 live; this is broker `node_id`; `leaders` maps partition -> node."""

    node_id: int = 1
    coordinator_id: int | None = 1
    coordinator_epoch: int = 4
    groups_id: int | None = 1
    live: tuple[int, ...] = (1, 2, 3)
    leaders: dict[int, int | None] = field(default_factory=lambda: {0: 1, 1: 2, 2: 3})

    def live_brokers(self) -> Sequence[BrokerInfo]:
        return [BrokerInfo(n, (endpoint(n),)) for n in self.live]

    def broker(self, node_id: int) -> BrokerInfo | None:
        return BrokerInfo(node_id, (endpoint(node_id),)) if node_id in self.live else None

    def leader(self, topic_id: uuid.UUID, partition: int) -> Leader | None:
        node = self.leaders.get(partition)
        return None if node is None else Leader(node, 7)

    def is_local(self, leader: Leader | None) -> bool:
        return leader is not None and leader.node_id == self.node_id

    def coordinator(self, log: str) -> Leader | None:
        if log == "groups":
            return None if self.groups_id is None else Leader(self.groups_id, 2)
        assert log == "transactions"
        if self.coordinator_id is None:
            return None
        return Leader(self.coordinator_id, self.coordinator_epoch)


class NodeLogs:
    """One broker's view of the shared LogManager: the partitions it leads."""

    def __init__(self, logs: LogManager, led: set[int]) -> None:
        self.logs = logs
        self.led = led

    def get(self, topic: str, index: int) -> Partition | None:
        return self.logs.get(topic, index) if index in self.led else None


class FakeGroups:
    """The group coordinator's side of __consumer_offsets markers, as a broker sees it."""

    def __init__(self, node_id: int, cluster: Cluster) -> None:
        self.node_id = node_id
        self.cluster = cluster

    async def complete_transaction(
        self, producer_id: int, commit: bool, offsets_partitions: frozenset[int]
    ) -> None:
        if self.cluster.groups_at != self.node_id:
            raise KafkaError(ErrorCode.not_coordinator, "not the group coordinator")
        self.cluster.completed.append((self.node_id, producer_id, commit, offsets_partitions))


class _Authorizer:
    def __init__(self) -> None:
        self.allow = True

    def allows(self, *args: Any, **kwargs: Any) -> bool:
        return self.allow


@dataclass
class Sent:
    target: Target
    api_key: int
    body: Mapping[str, Any]


class FakeTransport:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.sent: list[Sent] = []
        # Before a request is served: None serves it, a TransportError is raised.
        self.fault: Callable[[Sent], TransportError | None] = lambda _: None
        self.gate = asyncio.Event()
        self.gate.set()
        self.closed = False

    async def send(
        self, target: Target, api_key: int, version: int, body: Mapping[str, Any]
    ) -> Any:
        sent = Sent(target, api_key, body)
        self.sent.append(sent)
        request = api.build(api.request_class(api_key, version), body)
        api.encode_request(api_key, version, 1, "test", request)
        await self.gate.wait()
        fault = self.fault(sent)
        if fault is not None:
            raise fault
        ctx = SimpleNamespace(
            api_version=version, header=SimpleNamespace(client_id="unit"), listener=LISTENER
        )
        handler: Any = write_txn_markers if api_key == WRITE_TXN_MARKERS else add_partitions_to_txn
        served = await handler(ctx, request, self.cluster.remote(target.node_id))
        response = api.at_version(api_key, version, served)
        frame = api.encode_response(api_key, version, 7, response)
        _, decoded = api.decode_response(api_key, version, frame[4:])
        return decoded

    async def close(self) -> None:
        self.closed = True


class Cluster:
    def __init__(self, logs: LogManager) -> None:
        self.shared = logs
        self.view = View()
        self.clock = ManualClock()
        self.authorizer = _Authorizer()
        self.led: dict[int, set[int]] = {1: {0}, 2: {1}, 3: {2}}
        self.transport = FakeTransport(self)
        topic = SimpleNamespace(name=TOPIC, topic_id=TOPIC_ID, partitions=PARTITIONS)
        self.metadata = SimpleNamespace(
            state=SimpleNamespace(topics={TOPIC: topic}, topics_by_id={TOPIC_ID: topic})
        )
        self.topics: dict[str, tuple[uuid.UUID, int]] = {TOPIC: (TOPIC_ID, PARTITIONS)}
        self.waits: list[int] = []
        # Where the groups log really is, and the offsets completions seen.
        self.groups_at = 1
        self.completed: list[tuple[int, int, bool, frozenset[int]]] = []

        async def allocate() -> int:
            return 9000

        self.coordinator = TransactionCoordinator(MemoryRecordLog(), allocate_producer_id=allocate)

        def recorded(attempt: int) -> int:
            wait = 100 * attempt
            self.waits.append(wait)
            return wait

        self.channel = MarkerChannel(
            NodeLogs(logs, self.led[1]),
            lambda: self.view,
            self.topics.get,
            self.transport,
            listener=LISTENER,
            complete_offsets=FakeGroups(1, self).complete_transaction,
            clock=self.clock,
            backoff=recorded,
            rng=random.Random(1),
        )
        self.verifier = ProduceVerifier(
            lambda: self.coordinator, lambda: self.view, self.transport, listener=LISTENER
        )

    def remote(self, node_id: int) -> Any:
        """What the handlers use of broker `node_id`."""
        return SimpleNamespace(
            logs=NodeLogs(self.shared, self.led[node_id]),
            metadata=self.metadata,
            authorizer=self.authorizer,
            transactions=self.coordinator,
            groups=FakeGroups(node_id, self),
        )

    def part(self, index: int) -> Partition:
        part = self.shared.get(TOPIC, index)
        assert part is not None
        return part

    async def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run `coro`, moving the clock to each timer it waits on (its backoffs)."""
        task = asyncio.ensure_future(coro)
        while not task.done():
            for _ in range(5):
                await asyncio.sleep(0)
            if task.done():
                break
            timers = [t for t in self.clock._timers if not t[2].cancelled]
            if not timers:  # an fsync, a gated request
                await asyncio.sleep(0.001)
                continue
            self.clock.advance(max(min(t[0] for t in timers) - self.clock.now_ms(), 0))
        return task.result()


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    commit = GroupCommit()
    commit.start()
    logs = LogManager(tmp_path, BrokerConfig({}), commit)
    logs.open_topic(TOPIC, TOPIC_ID, PARTITIONS, {})
    try:
        yield Cluster(logs)
    finally:
        await logs.flush_all()
        logs.close()
        await commit.stop()


PID, EPOCH = 4242, 3


async def open_txn(c: Cluster, *partitions: int, pid: int = PID, epoch: int = EPOCH) -> None:
    """A transactional batch of `pid` on each partition, durable: its transaction open."""
    for p in partitions:
        part = c.part(p)
        data, batches = validate_produce_data(
            build_batch(
                [NewRecord(None, b"v")],
                producer_id=pid,
                producer_epoch=epoch,
                base_sequence=0,
                is_transactional=True,
            )
        )
        written = part.append(data, batches)
        await part.wait_durable(written.last_offset, 30)
        assert part.last_stable_offset < part.log_end_offset


def stable(c: Cluster, p: int) -> bool:
    part = c.part(p)
    return part.last_stable_offset == part.log_end_offset


async def until(check: Callable[[], bool], task: asyncio.Future[Any]) -> None:
    """Wait (bounded) until `check()`; fail at once if `task` ended first."""
    for _ in range(10_000):
        if check():
            return
        if task.done():
            task.result()
            raise AssertionError("the channel returned before the state awaited")
        await asyncio.sleep(0.001)
    raise AssertionError("timed out")


ALL = frozenset((TOPIC, p) for p in range(PARTITIONS))


# --- plan and outcome -----------------------------------------------------------------


def test_plan_sorts_partitions_by_where_their_marker_goes() -> None:
    view = View(leaders={0: 1, 1: 2, 2: None, 3: 9, 4: 3}, groups_id=2)
    topics = {TOPIC: (TOPIC_ID, 5)}
    found = plan(
        [(TOPIC, p) for p in range(6)] + [("gone", 0), (OFFSETS_TOPIC, 3)],
        view,
        topics.get,
        LISTENER,
    )
    assert found.local == [(TOPIC, 0)] and found.offsets == []
    # __consumer_offsets goes to the group coordinator, the groups log's leader.
    assert found.remote == {
        Target(2, "broker-2", 9094): [(OFFSETS_TOPIC, 3), (TOPIC, 1)],
        Target(3, "broker-3", 9095): [(TOPIC, 4)],
    }
    assert set(found.waiting) == {(TOPIC, 2), (TOPIC, 3)}
    assert "not a live broker" in found.waiting[(TOPIC, 3)]
    # Out of range, and deleted.
    assert sorted(found.gone) == sorted([(TOPIC, 5), ("gone", 0)])
    view.groups_id = 1
    assert plan([(OFFSETS_TOPIC, 3)], view, topics.get, LISTENER).offsets == [(OFFSETS_TOPIC, 3)]


def test_a_leader_without_the_inter_broker_listener_waits() -> None:
    found = plan([(TOPIC, 1)], View(), {TOPIC: (TOPIC_ID, 3)}.get, "INTERNAL")
    assert "no INTERNAL listener" in found.waiting[(TOPIC, 1)]


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (ErrorCode.none, Outcome.DONE),
        (ErrorCode.not_leader_or_follower, Outcome.RETRY),
        (ErrorCode.unknown_topic_or_partition, Outcome.RETRY),
        (ErrorCode.request_timed_out, Outcome.RETRY),
        (ErrorCode.kafka_storage_error, Outcome.RETRY),
        (ErrorCode.network_exception, Outcome.RETRY),
        (ErrorCode.not_enough_replicas, Outcome.RETRY),
        (ErrorCode.invalid_producer_epoch, Outcome.GIVE_UP),
        (ErrorCode.unsupported_version, Outcome.GIVE_UP),
        (ErrorCode.transaction_coordinator_fenced, Outcome.FAIL),
        (ErrorCode.corrupt_message, Outcome.FAIL),
        (ErrorCode.cluster_authorization_failed, Outcome.FAIL),
    ],
)
def test_marker_results_read_as_kafkas_completion_handler(
    code: ErrorCode, expected: Outcome
) -> None:
    assert outcome(code) is expected


# --- markers --------------------------------------------------------------------------


async def test_markers_reach_every_leader_one_request_each_with_the_coordinator_epoch(
    cluster: Cluster,
) -> None:
    c = cluster
    await open_txn(c, 0, 1, 2)
    await c.run(c.channel(PID, EPOCH, True, ALL))
    assert all(stable(c, p) for p in range(PARTITIONS))
    assert sorted((s.target.node_id, s.api_key) for s in c.transport.sent) == [
        (2, WRITE_TXN_MARKERS),
        (3, WRITE_TXN_MARKERS),
    ]
    [marker] = c.transport.sent[0].body["markers"]
    assert marker["coordinator_epoch"] == 4 and marker["transaction_result"] is True
    # The coordinator epoch went with every marker: an older coordinator is fenced.
    with pytest.raises(KafkaError) as fenced:
        c.part(1).append_marker(PID, EPOCH, commit=False, coordinator_epoch=3)
    assert fenced.value.code == ErrorCode.transaction_coordinator_fenced
    assert c.waits == []


async def test_a_broker_alone_writes_locally_and_sends_nothing(cluster: Cluster) -> None:
    c = cluster
    c.view.leaders = {0: 1, 1: 1, 2: 1}
    c.led[1].update({1, 2})
    await open_txn(c, 0, 1, 2)
    await c.run(c.channel(PID, EPOCH, False, ALL))
    assert all(stable(c, p) for p in range(PARTITIONS))
    assert c.transport.sent == []


async def test_a_moved_leader_is_followed_until_the_marker_is_written(cluster: Cluster) -> None:
    c = cluster
    await open_txn(c, 1)
    # The view still names broker 2, which handed partition 1 to broker 3.
    c.led[2].clear()
    c.led[3].add(1)
    task = asyncio.ensure_future(c.run(c.channel(PID, EPOCH, True, frozenset({(TOPIC, 1)}))))
    await until(lambda: len(c.transport.sent) >= 3, task)
    assert not task.done() and not stable(c, 1)  # retried, never given up
    c.view.leaders[1] = 3
    await task
    assert stable(c, 1)
    assert [s.target.node_id for s in c.transport.sent][-1] == 3
    assert c.waits[:3] == [100, 200, 300]


async def test_a_partition_without_a_leader_waits_for_one(cluster: Cluster) -> None:
    c = cluster
    await open_txn(c, 2)
    c.view.leaders[2] = None
    task = asyncio.ensure_future(c.run(c.channel(PID, EPOCH, True, frozenset({(TOPIC, 2)}))))
    await until(lambda: len(c.waits) >= 3, task)
    assert c.transport.sent == []
    c.view.leaders[2] = 3
    await task
    assert stable(c, 2)


async def test_a_lost_connection_is_retried(cluster: Cluster) -> None:
    c = cluster
    await open_txn(c, 1)
    failures = iter([TransportError(ErrorCode.network_exception, "reset")])
    c.transport.fault = lambda _s: next(failures, None)
    await c.run(c.channel(PID, EPOCH, False, frozenset({(TOPIC, 1)})))
    assert stable(c, 1) and len(c.transport.sent) == 2


async def test_the_channel_stops_once_this_broker_is_no_longer_the_coordinator(
    cluster: Cluster,
) -> None:
    """The marker of a partition whose leader refuses it is retried until the transactions
    log moves away (NOT_COORDINATOR), or comes back at a new epoch: the coordinator that
    loads it completes the transaction. Driven on the manual clock alone: the view changes
    inside the transport, at the third send; a channel that never stops fails at the 50th."""
    c = cluster
    await open_txn(c, 1)
    c.led[2].clear()  # broker 2 answers NOT_LEADER_OR_FOLLOWER: the marker is retried

    def change_at_third_send(change: Callable[[], None]) -> Callable[[Sent], None]:
        def fault(_sent: Sent) -> None:
            sends = len(c.transport.sent)
            if sends == 3:
                change()
            assert sends < 50, "the channel kept retrying after it lost the transactions log"

        return fault

    def moved_away() -> None:
        c.view.coordinator_id = 2

    c.transport.fault = change_at_third_send(moved_away)
    with pytest.raises(KafkaError) as stopped:
        await c.run(c.channel(PID, EPOCH, True, frozenset({(TOPIC, 1)})))
    assert stopped.value.code == ErrorCode.not_coordinator
    assert len(c.transport.sent) == 3
    assert not stable(c, 1)

    # A coordinator that lost its log and got it back at a new epoch stops too.
    c.view.coordinator_id = 1
    c.transport.sent.clear()

    def new_epoch() -> None:
        c.view.coordinator_epoch += 1

    c.transport.fault = change_at_third_send(new_epoch)
    with pytest.raises(KafkaError) as moved:
        await c.run(c.channel(PID, EPOCH, True, frozenset({(TOPIC, 1)})))
    assert moved.value.code == ErrorCode.not_coordinator
    assert "new epoch" in str(moved.value)
    assert len(c.transport.sent) == 3


async def test_a_newer_producer_epoch_gives_that_partition_up_only(cluster: Cluster) -> None:
    c = cluster
    await open_txn(c, 0, 2)
    await open_txn(c, 1, epoch=EPOCH + 1)  # a newer epoch wrote on partition 1
    await c.run(c.channel(PID, EPOCH, False, ALL))
    assert stable(c, 0) and stable(c, 2) and not stable(c, 1)


async def test_a_fenced_coordinator_epoch_fails_the_completion(cluster: Cluster) -> None:
    c = cluster
    await open_txn(c, 1)
    c.part(1).append_marker(PID, EPOCH, commit=True, coordinator_epoch=9)
    await open_txn(c, 1)
    with pytest.raises(KafkaError) as failed:
        await c.run(c.channel(PID, EPOCH, True, frozenset({(TOPIC, 1)})))
    assert failed.value.code == ErrorCode.transaction_coordinator_fenced


async def test_write_txn_markers_needs_cluster_action(cluster: Cluster) -> None:
    c = cluster
    await open_txn(c, 1)
    c.authorizer.allow = False
    task = asyncio.ensure_future(c.run(c.channel(PID, EPOCH, True, frozenset({(TOPIC, 1)}))))
    with pytest.raises(KafkaError) as denied:
        await task
    assert denied.value.code == ErrorCode.cluster_authorization_failed
    assert not stable(c, 1)  # nothing written


async def test_write_txn_markers_answers_unknown_and_not_led_partitions(cluster: Cluster) -> None:
    c = cluster
    body = {
        "markers": [
            {
                "producer_id": PID,
                "producer_epoch": EPOCH,
                "transaction_result": True,
                "coordinator_epoch": 1,
                "topics": [
                    {"name": TOPIC, "partition_indexes": [0, 7]},
                    {"name": "nope", "partition_indexes": [0]},
                    {"name": OFFSETS_TOPIC, "partition_indexes": [12]},
                ],
            }
        ]
    }
    response = await c.transport.send(Target(2, "broker-2", 9094), WRITE_TXN_MARKERS, 2, body)
    [marker] = response.markers
    codes = {(t.name, p.partition_index): p.error_code for t in marker.topics for p in t.partitions}
    assert codes == {
        (TOPIC, 0): ErrorCode.not_leader_or_follower,
        (TOPIC, 7): ErrorCode.unknown_topic_or_partition,
        ("nope", 0): ErrorCode.unknown_topic_or_partition,
        (OFFSETS_TOPIC, 12): ErrorCode.not_coordinator,  # broker 1 coordinates groups
    }


# --- produce verification -------------------------------------------------------------


async def begin(c: Cluster, *partitions: int) -> tuple[int, int]:
    pid, epoch = await c.coordinator.init_producer_id(TID, 60_000, None)
    await c.coordinator.add_partitions(TID, pid, epoch, [(TOPIC, p) for p in partitions])
    return pid, epoch


async def test_verification_on_the_coordinator_is_local(cluster: Cluster) -> None:
    c = cluster
    pid, epoch = await begin(c, 0)
    found = await c.verifier.verify(TID, pid, epoch, [(TOPIC, 0), (TOPIC, 1)])
    assert found == {(TOPIC, 0): ErrorCode.none, (TOPIC, 1): ErrorCode.transaction_abortable}
    assert c.transport.sent == []


async def test_verification_elsewhere_asks_the_coordinator_verify_only(cluster: Cluster) -> None:
    c = cluster
    pid, epoch = await begin(c, 1)
    c.view.node_id = 2  # this broker leads partition 1; broker 1 is the coordinator
    found = await c.verifier.verify(TID, pid, epoch, [(TOPIC, 1), (TOPIC, 2)])
    assert found == {(TOPIC, 1): ErrorCode.none, (TOPIC, 2): ErrorCode.transaction_abortable}
    [sent] = c.transport.sent
    assert (sent.target.node_id, sent.api_key) == (1, ADD_PARTITIONS_TO_TXN)
    [txn] = sent.body["transactions"]
    assert txn["verify_only"] is True
    # Nothing was added by the verification.
    current = c.coordinator.get(TID)
    assert current is not None and current.partitions == {(TOPIC, 1)}
    stale = await c.verifier.verify(TID, pid, epoch - 1, [(TOPIC, 1)])
    assert stale == {(TOPIC, 1): ErrorCode.producer_fenced}


async def test_verifications_waiting_meanwhile_go_as_one_request(cluster: Cluster) -> None:
    c = cluster
    pid, epoch = await begin(c, 1)
    c.view.node_id = 2
    c.transport.gate.clear()
    first = asyncio.ensure_future(c.verifier.verify(TID, pid, epoch, [(TOPIC, 1)]))
    await asyncio.sleep(0)
    others = [
        asyncio.ensure_future(c.verifier.verify(f"other-{i}", 1, 0, [(TOPIC, 1)])) for i in range(3)
    ]
    again = [
        asyncio.ensure_future(c.verifier.verify(TID, pid, epoch, [(TOPIC, 1)])) for _ in range(2)
    ]
    await asyncio.sleep(0)
    c.transport.gate.set()
    await asyncio.gather(first, *others, *again)
    ids = [[t["transactional_id"] for t in s.body["transactions"]] for s in c.transport.sent]
    # The first alone; those asked meanwhile together, but an id once per request.
    assert ids == [[TID], ["other-0", "other-1", "other-2", TID], [TID]]
    assert (await others[0]) == {(TOPIC, 1): ErrorCode.invalid_producer_id_mapping}
    assert [await a for a in again] == [{(TOPIC, 1): ErrorCode.none}] * 2


async def test_verification_errors_map_as_kafkas_manager(cluster: Cluster) -> None:
    c = cluster
    pid, epoch = await begin(c, 1)
    c.view.node_id = 2
    c.transport.fault = lambda _s: TransportError(ErrorCode.request_timed_out, "slow")
    assert await c.verifier.verify(TID, pid, epoch, [(TOPIC, 1)]) == {
        (TOPIC, 1): ErrorCode.network_exception
    }
    c.transport.fault = lambda _s: None
    c.authorizer.allow = False
    assert await c.verifier.verify(TID, pid, epoch, [(TOPIC, 1)]) == {
        (TOPIC, 1): ErrorCode.invalid_txn_state
    }
    c.view.coordinator_id = None
    assert await c.verifier.verify(TID, pid, epoch, [(TOPIC, 1)]) == {
        (TOPIC, 1): ErrorCode.coordinator_not_available
    }


async def test_consumer_offsets_markers_reach_the_group_coordinator(cluster: Cluster) -> None:
    c = cluster
    await open_txn(c, 0)
    offsets = frozenset({(OFFSETS_TOPIC, 7), (OFFSETS_TOPIC, 9), (TOPIC, 0)})
    # Here while this broker coordinates the groups: no request.
    await c.run(c.channel(PID, EPOCH, True, offsets))
    assert c.completed == [(1, PID, True, frozenset({7, 9}))] and c.transport.sent == []
    # On broker 3 once the groups log is there; the view lags a round behind.
    c.completed.clear()
    c.groups_at = 3
    c.view.groups_id = 2
    task = asyncio.ensure_future(
        c.run(c.channel(PID, EPOCH, False, frozenset({(OFFSETS_TOPIC, 7)})))
    )
    await until(lambda: len(c.transport.sent) >= 1, task)
    c.view.groups_id = 3
    await task
    assert c.completed == [(3, PID, False, frozenset({7}))]
    assert [s.target.node_id for s in c.transport.sent][-1] == 3
