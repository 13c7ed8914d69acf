"""The share-partition leader's persister in a cluster (broker.share.remote_persister),
with a fake transport: no sockets.

The fake transport serves each request with spool's own share-state handlers over an
in-memory share coordinator per broker (the requests are built from the persister's
mappings by kio's classes, the responses encoded and decoded as on the wire), so what
the persister sends is what a real broker would answer. A fake cluster view says which
broker leads the share-state log; the clock is a ManualClock, advanced to each backoff.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from structlog.testing import capture_logs

from broker.cluster import BrokerEndpoint, BrokerInfo, Leader
from broker.config import BrokerConfig
from broker.handlers import share_state
from broker.listeners import inter_broker_listener, listeners_from_config
from broker.share.remote_persister import (
    DELETE,
    FIND_COORDINATOR,
    INITIALIZE,
    MAX_ATTEMPTS,
    READ,
    SUMMARY,
    WRITE,
    Backoff,
    RoutedPersister,
    Target,
    TransportError,
    coordinator_key,
)
from coordinator.share_persister import InMemoryPersister, StateWrite, write_states
from coordinator.share_state import PersistedBatch, ShareStateKey
from persister.clock import ManualClock
from protocol import api
from protocol.errors import ErrorCode, KafkaError

TOPIC = uuid.uuid4()
KEY = ShareStateKey("g", TOPIC, 0)
LISTENER = "PLAINTEXT"
HANDLERS = {
    INITIALIZE: share_state.initialize_share_group_state,
    READ: share_state.read_share_group_state,
    WRITE: share_state.write_share_group_state,
    DELETE: share_state.delete_share_group_state,
    SUMMARY: share_state.read_share_group_state_summary,
}


def endpoint(node_id: int) -> BrokerEndpoint:
    return BrokerEndpoint(LISTENER, f"broker-{node_id}", 9092 + node_id)


@dataclass
class View:
    """A ClusterView: brokers 1-3 live, this broker is 1, `leader_id` leads share-state."""

    node_id: int = 1
    leader_id: int | None = 1
    live: tuple[int, ...] = (1, 2, 3)

    def live_brokers(self) -> Sequence[BrokerInfo]:
        return [BrokerInfo(n, (endpoint(n),)) for n in self.live]

    def broker(self, node_id: int) -> BrokerInfo | None:
        return BrokerInfo(node_id, (endpoint(node_id),)) if node_id in self.live else None

    def leader(self, topic_id: uuid.UUID, partition: int) -> Leader | None:
        return Leader(self.node_id, 0)

    def is_local(self, leader: Leader | None) -> bool:
        return leader is not None and leader.node_id == self.node_id

    def coordinator(self, log: str) -> Leader | None:
        assert log == "share-state"
        return None if self.leader_id is None else Leader(self.leader_id, 0)


class _AllowAll:
    def allows(self, *args: Any, **kwargs: Any) -> bool:
        return True


@dataclass
class _RemoteBroker:
    """What the share-state handlers use of a broker."""

    share_persister: InMemoryPersister
    authorizer: _AllowAll = field(default_factory=_AllowAll)


@dataclass
class Sent:
    target: Target
    api_key: int
    body: Mapping[str, Any]


# Decides the fate of one request before it is served: None serves it, an ErrorCode
# answers every partition with it, a TransportError is raised instead of an answer.
Fault = Callable[[Sent], ErrorCode | TransportError | None]


class FakeTransport:
    """Serves requests with the real share-state handlers on one in-memory share
    coordinator per broker id."""

    def __init__(self) -> None:
        self.coordinators: dict[int, InMemoryPersister] = {}
        self.sent: list[Sent] = []
        self.fault: Fault = lambda _: None
        self.find_answer: tuple[ErrorCode, int] = (ErrorCode.none, 2)
        self.closed = False
        # Cleared: requests wait before being served (a slow share coordinator).
        self.gate = asyncio.Event()
        self.gate.set()

    def coordinator(self, node_id: int) -> InMemoryPersister:
        return self.coordinators.setdefault(node_id, InMemoryPersister())

    async def send(
        self, target: Target, api_key: int, version: int, body: Mapping[str, Any]
    ) -> Any:
        sent = Sent(target, api_key, body)
        self.sent.append(sent)
        request = api.build(api.request_class(api_key, version), body)
        api.encode_request(api_key, version, 1, "test", request)  # it encodes
        await self.gate.wait()
        fault = self.fault(sent)
        if isinstance(fault, TransportError):
            raise fault
        if api_key == FIND_COORDINATOR:
            code, node = self.find_answer
            ep = endpoint(node)
            response = api.build_response(
                api_key,
                version,
                {
                    "coordinators": [
                        {
                            "key": body["coordinator_keys"][0],
                            "node_id": node if code == ErrorCode.none else -1,
                            "host": ep.host,
                            "port": ep.port,
                            "error_code": code,
                        }
                    ]
                },
            )
        else:
            served = await HANDLERS[api_key](
                None,  # type: ignore[arg-type]
                request,
                _RemoteBroker(self.coordinator(target.node_id)),  # type: ignore[arg-type]
            )
            response = api.at_version(api_key, version, served)
            if fault is not None:
                response = _all_failed(response, fault)
        frame = api.encode_response(api_key, version, 7, response)
        _, decoded = api.decode_response(api_key, version, frame[4:])
        return decoded

    async def close(self) -> None:
        self.closed = True


def _all_failed(response: Any, code: ErrorCode) -> Any:
    import dataclasses

    return dataclasses.replace(
        response,
        results=tuple(
            dataclasses.replace(
                r,
                partitions=tuple(
                    dataclasses.replace(p, error_code=code, error_message=f"fault {code.name}")
                    for p in r.partitions
                ),
            )
            for r in response.results
        ),
    )


class Harness:
    def __init__(self, leader_id: int | None = 1) -> None:
        self.view = View(leader_id=leader_id)
        self.local = InMemoryPersister()
        self.transport = FakeTransport()
        self.clock = ManualClock()
        self.waits: list[int] = []
        backoff = Backoff(rng=random.Random(7))

        def recorded(attempt: int) -> int:
            wait = backoff(attempt)
            self.waits.append(wait)
            return wait

        self.persister = RoutedPersister(
            self.local,
            lambda: self.view,
            self.transport,
            listener=LISTENER,
            clock=self.clock,
            backoff=recorded,
            rng=random.Random(3),
        )

    async def seed(self, *keys: ShareStateKey) -> None:
        """Initialized state (epoch 0, start offset 0) for `keys` on every share coordinator
        (a write to an uninitialized partition is refused)."""
        for persister in [self.local, *(self.transport.coordinator(n) for n in (2, 3))]:
            for key in keys or (KEY,):
                await persister.initialize_state(key, 0, 0)

    async def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run `coro`, moving the clock to each timer it waits on (its backoffs)."""
        task = asyncio.ensure_future(coro)
        while not task.done():
            for _ in range(5):
                await asyncio.sleep(0)
            if task.done():
                break
            timers = [t for t in self.clock._timers if not t[2].cancelled]
            if not timers:  # the in-memory share coordinators' own turns
                await asyncio.sleep(0.001)
                continue
            self.clock.advance(max(min(t[0] for t in timers) - self.clock.now_ms(), 0))
        return task.result()


def _batches() -> list[PersistedBatch]:
    return [PersistedBatch(0, 4, 2, 1), PersistedBatch(5, 9, 0, 1)]


# --- routing --------------------------------------------------------------------------


async def test_local_coordinator_is_called_directly_with_nothing_sent() -> None:
    h = Harness(leader_id=1)
    assert await h.run(h.persister.initialize_if_absent(KEY, 3)) is True
    await h.run(h.persister.write_state(KEY, 3, 0, 0, _batches(), delivery_complete_count=5))
    state = await h.run(h.persister.read_state(KEY, 0))
    assert (state.state_epoch, state.start_offset, state.batches) == (3, 0, _batches())
    assert (await h.run(h.persister.read_summary(KEY))).delivery_complete_count == 5
    writes = [StateWrite(ShareStateKey("g", TOPIC, p), 3, 0, 0, _batches()) for p in (1, 2)]
    await h.seed(*(w.key for w in writes))
    assert await h.run(write_states(h.persister, writes)) == [None, None]
    assert await h.run(h.persister.reset_state(KEY, 4)) == 4
    await h.run(h.persister.delete_state(KEY))
    assert h.transport.sent == []
    assert h.waits == []
    assert (await h.local.read_state(ShareStateKey("g", TOPIC, 2), 0)).batches == _batches()


async def test_remote_coordinator_gets_every_rpc_and_the_local_one_nothing() -> None:
    h = Harness(leader_id=2)
    remote = h.transport.coordinator(2)
    assert await h.run(h.persister.initialize_if_absent(KEY, 3)) is True
    assert await h.run(h.persister.initialize_if_absent(KEY, 4)) is False  # state kept
    await h.run(h.persister.write_state(KEY, 3, 0, 0, _batches(), delivery_complete_count=5))
    state = await h.run(h.persister.read_state(KEY, 0))
    assert (state.state_epoch, state.start_offset, state.batches) == (3, 0, _batches())
    summary = await h.run(h.persister.read_summary(KEY))
    assert (summary.state_epoch, summary.start_offset, summary.delivery_complete_count) == (
        3,
        0,
        5,
    )
    # The remote share coordinator holds it; this broker's holds nothing.
    assert (await remote.read_summary(KEY)).delivery_complete_count == 5
    assert (await h.local.read_summary(KEY)).state_epoch == 0
    assert {s.target for s in h.transport.sent} == {Target(2, "broker-2", 9094)}
    assert [s.api_key for s in h.transport.sent] == [
        SUMMARY,
        INITIALIZE,
        SUMMARY,
        WRITE,
        READ,
        SUMMARY,
    ]
    assert await h.run(h.persister.reset_state(KEY, 8)) == 4
    assert (await remote.read_summary(KEY)).start_offset == 8
    await h.run(h.persister.delete_state(KEY))
    assert (await remote.read_summary(KEY)).state_epoch == 0
    assert h.waits == []


async def test_remote_errors_that_are_not_retriable_come_back_at_once() -> None:
    h = Harness(leader_id=2)
    await h.transport.coordinator(2).initialize_state(KEY, 5, 0)
    with pytest.raises(KafkaError) as raised:
        await h.run(h.persister.write_state(KEY, 4, 0, 0, _batches()))
    assert raised.value.code == ErrorCode.fenced_state_epoch
    assert len(h.transport.sent) == 1 and h.waits == []


async def test_refused_cluster_action_fails_at_once_and_says_what_to_grant() -> None:
    h = Harness(leader_id=2)
    await h.seed()
    h.transport.fault = lambda _: ErrorCode.cluster_authorization_failed
    with capture_logs() as logs, pytest.raises(KafkaError) as raised:
        await h.run(h.persister.write_state(KEY, 0, 0, 0, _batches()))
    assert raised.value.code == ErrorCode.cluster_authorization_failed
    assert len(h.transport.sent) == 1
    (event,) = [e for e in logs if e["event"] == "share_state_rpc_not_authorized"]
    assert "super.users" in event["hint"] and "User:ANONYMOUS" in event["hint"]


async def test_batched_writes_go_as_one_request_per_group() -> None:
    h = Harness(leader_id=3)
    keys = [
        ShareStateKey("a", TOPIC, 0),
        ShareStateKey("a", TOPIC, 1),
        ShareStateKey("b", TOPIC, 0),
    ]
    writes = [StateWrite(k, 0, 0, 0, _batches(), 10) for k in keys]
    await h.seed(*keys)
    assert await h.run(write_states(h.persister, writes)) == [None, None, None]
    assert sorted((s.api_key, s.body["group_id"]) for s in h.transport.sent) == [
        (WRITE, "a"),
        (WRITE, "b"),
    ]
    (a,) = [s for s in h.transport.sent if s.body["group_id"] == "a"]
    assert [p["partition"] for t in a.body["topics"] for p in t["partitions"]] == [0, 1]
    for k in keys:
        assert (await h.transport.coordinator(3).read_state(k, 0)).batches == _batches()


async def test_writes_made_while_one_is_in_flight_go_together_as_the_next_request() -> None:
    h = Harness(leader_id=2)
    keys = [ShareStateKey("g", TOPIC, p) for p in range(4)]
    await h.seed(*keys)
    h.transport.gate.clear()
    first = asyncio.ensure_future(h.persister.write_state(keys[0], 0, 0, 0, _batches()))
    for _ in range(5):
        await asyncio.sleep(0)
    assert len(h.transport.sent) == 1  # in flight, held
    rest = [
        asyncio.ensure_future(h.persister.write_state(k, 0, 0, 0, _batches())) for k in keys[1:]
    ]
    for _ in range(5):
        await asyncio.sleep(0)
    assert len(h.transport.sent) == 1  # the others wait for it
    h.transport.gate.set()
    await asyncio.gather(first, *rest)
    assert [
        sorted(p["partition"] for t in s.body["topics"] for p in t["partitions"])
        for s in h.transport.sent
    ] == [[0], [1, 2, 3]]
    for k in keys:
        assert (await h.transport.coordinator(2).read_state(k, 0)).batches == _batches()


async def test_stopping_fails_the_calls_waiting_on_a_request() -> None:
    h = Harness(leader_id=2)
    await h.seed()
    h.transport.gate.clear()
    waiting = asyncio.ensure_future(h.persister.read_state(KEY, 0))
    for _ in range(5):
        await asyncio.sleep(0)
    await h.persister.close()
    with pytest.raises(KafkaError) as raised:
        await h.run(waiting)
    assert raised.value.code == ErrorCode.network_exception


# --- retries --------------------------------------------------------------------------


async def test_not_coordinator_finds_the_coordinator_again_and_retries_there() -> None:
    h = Harness(leader_id=2)
    await h.seed()

    def moved(sent: Sent) -> ErrorCode | None:
        if sent.target.node_id == 2:
            h.view.leader_id = 3  # the share-state log moved to broker 3 meanwhile
            return ErrorCode.not_coordinator
        return None

    h.transport.fault = moved
    await h.run(h.persister.write_state(KEY, 0, 0, 0, _batches()))
    assert [s.target.node_id for s in h.transport.sent] == [2, 3]
    assert (await h.transport.coordinator(3).read_state(KEY, 0)).batches == _batches()
    assert (await h.transport.coordinator(2).read_summary(KEY)).batches == []
    # One backoff, Kafka's first: 1 s +- 20 %.
    assert len(h.waits) == 1 and 800 <= h.waits[0] <= 1200


async def test_coordinator_moving_here_is_served_locally_on_retry() -> None:
    h = Harness(leader_id=2)
    await h.seed()

    def moved(sent: Sent) -> ErrorCode | None:
        h.view.leader_id = 1
        return ErrorCode.coordinator_load_in_progress

    h.transport.fault = moved
    await h.run(h.persister.write_state(KEY, 0, 0, 0, _batches()))
    assert len(h.transport.sent) == 1
    assert (await h.local.read_state(KEY, 0)).batches == _batches()


@pytest.mark.parametrize(
    "fault",
    [
        ErrorCode.not_coordinator,
        ErrorCode.coordinator_not_available,
        ErrorCode.coordinator_load_in_progress,
        TransportError(ErrorCode.network_exception, "connection reset"),
        TransportError(ErrorCode.request_timed_out, "no answer"),
    ],
    ids=lambda f: f.name if isinstance(f, ErrorCode) else f.code.name,
)
async def test_retriable_errors_give_up_after_bounded_attempts(
    fault: ErrorCode | TransportError,
) -> None:
    h = Harness(leader_id=2)
    await h.seed()
    h.transport.fault = lambda _: fault
    started = h.clock.now_ms()
    with pytest.raises(KafkaError) as raised:
        await h.run(h.persister.write_state(KEY, 0, 0, 0, _batches()))
    code = fault if isinstance(fault, ErrorCode) else fault.code
    assert raised.value.code == code
    assert "exhausted 5 attempts" in (raised.value.message or "")
    assert len(h.transport.sent) == MAX_ATTEMPTS
    # Kafka's exponential backoff: 1, 2, 4, 8 s, each +- 20 %, on the injected clock.
    assert len(h.waits) == MAX_ATTEMPTS - 1
    for wait, nominal in zip(h.waits, (1000, 2000, 4000, 8000), strict=True):
        assert nominal * 0.8 <= wait <= nominal * 1.2
    assert h.clock.now_ms() - started == sum(h.waits)


async def test_a_backoff_ends_once_another_broker_takes_the_share_state_log_over() -> None:
    """Broker 2 died holding the share-state log: the retry waits for its 1 s backoff only
    until the view names broker 3 (its lease expired and 3 claimed the log), not the
    whole backoff; the exponential ladder would otherwise put the next attempts at 1, 3
    and 7 s after the failure, past a failover of a few seconds."""
    h = Harness(leader_id=2)
    await h.seed()
    sent_at: list[int] = []

    def gone(sent: Sent) -> TransportError | None:
        sent_at.append(h.clock.now_ms())
        if sent.target.node_id == 2:
            return TransportError(ErrorCode.network_exception, "broker 2 is gone")
        return None

    h.transport.fault = gone
    task = asyncio.ensure_future(h.persister.write_state(KEY, 0, 0, 0, _batches()))
    for _ in range(200):
        for _ in range(5):
            await asyncio.sleep(0)
        if task.done():
            break
        if sent_at and h.clock.now_ms() - sent_at[0] >= 300:
            h.view.leader_id = 3
        if any(not t[2].cancelled for t in h.clock._timers):
            h.clock.advance(50)
        else:  # the in-memory share coordinator's own turns
            await asyncio.sleep(0.001)
    await asyncio.wait_for(task, 5)
    assert [s.target.node_id for s in h.transport.sent] == [2, 3]
    assert len(h.waits) == 1 and h.waits[0] >= 800
    # Retried within a check interval of the move, not after the 0.8-1.2 s backoff.
    assert sent_at[1] - sent_at[0] <= 500
    assert (await h.transport.coordinator(3).read_state(KEY, 0)).batches == _batches()


async def test_a_retried_write_succeeds_once_the_coordinator_answers() -> None:
    h = Harness(leader_id=2)
    await h.seed()
    failures = iter([TransportError(ErrorCode.network_exception, "reset"), None])
    h.transport.fault = lambda _: next(failures, None)
    await h.run(h.persister.write_state(KEY, 0, 0, 0, _batches()))
    assert len(h.transport.sent) == 2
    assert (await h.transport.coordinator(2).read_state(KEY, 0)).batches == _batches()


async def test_batched_write_retries_only_the_partitions_that_failed() -> None:
    h = Harness(leader_id=2)
    keys = [ShareStateKey("a", TOPIC, 0), ShareStateKey("b", TOPIC, 0)]
    first = {"a": True}

    def group_a_once(sent: Sent) -> ErrorCode | None:
        if sent.body["group_id"] == "a" and first.pop("a", False):
            return ErrorCode.not_coordinator
        return None

    h.transport.fault = group_a_once
    writes = [StateWrite(k, 0, 0, 0, _batches()) for k in keys]
    await h.seed(*keys)
    assert await h.run(write_states(h.persister, writes)) == [None, None]
    assert sorted(s.body["group_id"] for s in h.transport.sent) == ["a", "a", "b"]


async def test_a_coordinator_leader_not_live_is_retried_then_coordinator_not_available() -> None:
    h = Harness(leader_id=5)  # not among the live brokers
    with pytest.raises(KafkaError) as raised:
        await h.run(h.persister.read_state(KEY, 0))
    assert raised.value.code == ErrorCode.coordinator_not_available
    assert h.transport.sent == [] and len(h.waits) == MAX_ATTEMPTS - 1


async def test_no_leader_known_asks_find_coordinator_with_the_share_key() -> None:
    h = Harness(leader_id=None)
    await h.seed()
    h.transport.find_answer = (ErrorCode.none, 3)
    await h.run(h.persister.write_state(KEY, 0, 0, 0, _batches()))
    find, write = h.transport.sent
    assert find.api_key == FIND_COORDINATOR and find.target.node_id in (2, 3)
    assert find.body == {"key_type": 2, "coordinator_keys": [coordinator_key(KEY)]}
    assert (write.api_key, write.target) == (WRITE, Target(3, "broker-3", 9095))


async def test_find_coordinator_errors_are_retried_and_bounded() -> None:
    h = Harness(leader_id=None)
    h.transport.find_answer = (ErrorCode.coordinator_not_available, -1)
    with pytest.raises(KafkaError) as raised:
        await h.run(h.persister.delete_state(KEY))
    assert raised.value.code == ErrorCode.coordinator_not_available
    assert [s.api_key for s in h.transport.sent] == [FIND_COORDINATOR] * MAX_ATTEMPTS


def test_coordinator_key_is_kafkas_share_partition_key() -> None:
    topic = uuid.UUID(bytes=bytes(range(16)))
    # Kafka prints a Uuid as URL-safe base64 without padding.
    assert coordinator_key(ShareStateKey("grp", topic, 7)) == "grp:AAECAwQFBgcICQoLDA0ODw:7"


async def test_close_closes_the_transport() -> None:
    h = Harness(leader_id=2)
    await h.persister.close()
    assert h.transport.closed


# --- the inter-broker listener ----------------------------------------------------------


def _inter_broker(settings: dict[str, str], clustered: bool = True) -> str:
    config = BrokerConfig(settings)
    return inter_broker_listener(config, listeners_from_config(config), clustered)


def test_inter_broker_listener_defaults_to_plaintext() -> None:
    assert _inter_broker({"listeners": "PLAINTEXT://127.0.0.1:0"}) == "PLAINTEXT"
    named = {
        "listeners": "INTERNAL://127.0.0.1:0,EXTERNAL://127.0.0.1:0",
        "listener.security.protocol.map": "INTERNAL:PLAINTEXT,EXTERNAL:SASL_PLAINTEXT",
        "listener.name.external.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.external.plain.sasl.jaas.config": (
            'org.apache.kafka.common.security.plain.PlainLoginModule required user_admin="secret";'
        ),
        "inter.broker.listener.name": "internal",
    }
    assert _inter_broker(named) == "INTERNAL"


def test_a_clustered_broker_without_its_inter_broker_listener_is_refused() -> None:
    sasl_only = {
        "listeners": "SASL_PLAINTEXT://127.0.0.1:0",
        "sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": (
            'org.apache.kafka.common.security.plain.PlainLoginModule required user_admin="secret";'
        ),
    }
    with pytest.raises(KafkaError) as raised:
        _inter_broker(sasl_only)
    assert raised.value.code == ErrorCode.invalid_config
    assert "security.inter.broker.protocol=PLAINTEXT, the default" in str(raised.value)
    # A SASL inter-broker listener is taken (tests/unit/test_inter_broker_security.py
    # has its checks); Kafka's default mechanism, GSSAPI, is refused.
    with pytest.raises(KafkaError) as raised:
        _inter_broker({**sasl_only, "inter.broker.listener.name": "SASL_PLAINTEXT"})
    assert "sasl.mechanism.inter.broker.protocol is 'GSSAPI' (the default)" in str(raised.value)
    assert "secret" not in str(raised.value)
    # A broker on the file engine is alone: nothing to refuse.
    assert _inter_broker(sasl_only, clustered=False) == "PLAINTEXT"


async def test_a_local_share_coordinator_still_loading_is_retried_after_a_backoff() -> None:
    # This broker claimed the share-state log and loads it: the view names it (as
    # FindCoordinator does) and its share coordinator answers COORDINATOR_LOAD_IN_PROGRESS
    # until loaded, which is retried here, as Kafka's PersisterStateManager retries it.
    h = Harness(leader_id=1)
    await h.seed()
    h.local.runtime.begin_loading("claimed at epoch 2")
    loaded = h.local.runtime.record_log

    def finish_loading() -> None:
        h.local.reload(loaded)

    h.clock.call_at(h.clock.now_ms() + 1, finish_loading)
    await h.run(h.persister.write_state(KEY, 0, 0, 0, _batches()))
    assert h.transport.sent == []
    assert len(h.waits) == 1
    assert (await h.local.read_state(KEY, 0)).batches == _batches()
