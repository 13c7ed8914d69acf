"""The share coordinator as the share-partition leader reaches it in a cluster: on this
broker, or over the network on the broker leading the share-state log.

Kafka's share-partition leader and group coordinator never write share state
themselves: they send the share coordinator's RPCs (InitializeShareGroupState,
ReadShareGroupState, WriteShareGroupState, DeleteShareGroupState,
ReadShareGroupStateSummary, api keys 83-87) to the broker that coordinates the
share-partition key, found through the metadata cache or FindCoordinator with key type
SHARE and key `group:topicId:partition` (Kafka's PersisterStateManager). spool's brokers
share one share-state log, led by one broker at a time (`ClusterView.coordinator(
"share-state")`), so `RoutedPersister` asks the cluster view at each call:

- this broker leads it (always so for a broker alone): the call goes straight to the local
  share coordinator (`DurablePersister`), exactly as before, with no retry and no copy;
- another broker leads it: the RPC goes to that broker's endpoint on the inter-broker
  listener (Kafka's `inter.broker.listener.name`) over a pooled, pipelined connection
  (`BrokerConnections`, secured as that listener is: TLS and SASL with this broker's
  own credentials, `broker.listeners.inter_broker_client`); the answer comes only once
  the remote share coordinator has made the change durable (on PostgreSQL: committed),
  so the share-partition leader, which commits its in-memory change only after this
  returns, is never ahead of it;
- nobody leads it as far as the view knows: FindCoordinator(SHARE) to another live broker,
  as Kafka does when its metadata cache names no coordinator.

Errors are retried as PersisterStateManager retries them: NOT_COORDINATOR,
COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS and UNKNOWN_TOPIC_OR_PARTITION in a
partition's result, and a connection lost or a request timed out (NETWORK_EXCEPTION,
REQUEST_TIMED_OUT), each time looking the coordinator up again, after an exponential
backoff (1 s doubling to at most 30 s, 20 % jitter), 5 attempts in all; a backoff ends
early once the view names another share coordinator (a failover: the broker that took
the log over after the old one's lease expired), so a retry does not sleep past the new
coordinator being ready. Then, and for any
other error, the call raises `KafkaError` with the share coordinator's code; the
share-partition leader maps it for its client as Kafka's SharePartition does
(`broker.share.state_writer.persister_error`: coordinator errors become
COORDINATOR_NOT_AVAILABLE, fenced epochs NOT_LEADER_OR_FOLLOWER).

Requests are batched as Kafka's PersisterStateManager batches them: per broker, RPC
and group one request is in flight at a time, and the calls made meanwhile go together
as the next one (the share coordinator makes one append and one commit of it); writes
of several partitions (`route_write_states`, used by
`coordinator.share_persister.write_states`) go as one WriteShareGroupState per group id.
A partition whose result is retriable is retried alone with the others still pending.

`initialize_if_absent` and `reset_state` are one turn of the share coordinator locally; on
the wire they are a ReadShareGroupStateSummary then an InitializeShareGroupState, whose
state epoch the share coordinator fences (an initialization with an epoch below the
stored one is FENCED_STATE_EPOCH).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import random
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from broker.cluster import ClusterView
from coordinator.share_persister import StateWrite, write_states
from coordinator.share_state import PersistedBatch, Persister, ShareState, ShareStateKey
from persister.clock import SYSTEM_CLOCK, Clock, sleep
from persister.share_records import UNINITIALIZED_START_OFFSET, UNKNOWN_DELIVERY_COMPLETE_COUNT
from protocol.client import (
    AuthenticationError,
    ClientError,
    ClientSecurity,
    KafkaClient,
    SecurityConfigError,
    TlsError,
)
from protocol.errors import ErrorCode, KafkaError

log = structlog.get_logger("spool.share_persister")

SHARE_STATE_LOG = "share-state"
FIND_COORDINATOR, INITIALIZE, READ, WRITE, DELETE, SUMMARY = 10, 83, 84, 85, 86, 87
# The versions sent: the newest spool serves (Write v1 and Summary v1 carry KIP-1226's
# DeliveryCompleteCount; FindCoordinator v4+ takes a list of keys).
VERSIONS = {FIND_COORDINATOR: 6, INITIALIZE: 0, READ: 0, WRITE: 1, DELETE: 0, SUMMARY: 1}
SHARE_KEY_TYPE = 2  # FindCoordinator's CoordinatorType.SHARE

# Kafka's PersisterStateManager: REQUEST_BACKOFF_MS, REQUEST_BACKOFF_MAX_MS,
# MAX_FIND_COORD_ATTEMPTS, and the clients' retry.backoff exponent base and jitter.
REQUEST_BACKOFF_MS = 1_000
REQUEST_BACKOFF_MAX_MS = 30_000
MAX_ATTEMPTS = 5
# How often a backoff looks whether the share coordinator moved (an in-memory read).
PLACEMENT_CHECK_MS = 100
BACKOFF_EXP_BASE = 2
BACKOFF_JITTER = 0.2
# One request's wait for its answer (Kafka's inter-broker send thread uses 30 s), and for
# a connection to be set up (socket.connection.setup.timeout.ms).
REQUEST_TIMEOUT_MS = 30_000
CONNECT_TIMEOUT_MS = 10_000

# Retried after a new look-up of the coordinator (PersisterStateManager's handlers).
RETRIABLE = frozenset(
    {
        ErrorCode.not_coordinator,
        ErrorCode.coordinator_not_available,
        ErrorCode.coordinator_load_in_progress,
        ErrorCode.unknown_topic_or_partition,
        ErrorCode.network_exception,
        ErrorCode.request_timed_out,
    }
)


@dataclass(frozen=True, slots=True)
class Target:
    """A broker the RPCs go to: its node id and endpoint on the inter-broker listener."""

    node_id: int
    host: str
    port: int


class TransportError(Exception):
    """The request got no answer: the connection failed or closed (NETWORK_EXCEPTION),
    or the answer did not come in time (REQUEST_TIMED_OUT). Retriable."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Transport(Protocol):
    """Sends one request to a broker and returns the decoded response entity; raises
    TransportError when no answer comes. Concurrent sends to one broker may share one
    connection (pipelined)."""

    async def send(
        self, target: Target, api_key: int, version: int, body: Mapping[str, Any]
    ) -> Any: ...

    async def close(self) -> None: ...


def not_authorized_hint(principal: str) -> str:
    """What to do when another broker refused CLUSTER_ACTION to this one (Kafka's rule
    for the inter-broker RPCs): `principal` is who this broker is to the others."""
    return (
        f"this broker reaches the others as {principal} (the principal of the "
        "inter-broker listener: User:ANONYMOUS on PLAINTEXT, the SASL username, or the "
        "certificate's subject DN on SSL with ssl.client.auth); add it to super.users or "
        f"allow it ClusterAction on the cluster (spool acls --add --allow-principal "
        f"{principal} --operation ClusterAction --cluster)"
    )


# A connection the other broker refused at TLS or SASL: what to check.
_REFUSED_HINT = (
    "check the inter-broker listener's settings on both brokers: for TLS the trust store "
    "(ssl.truststore.*) and ssl.endpoint.identification.algorithm (the certificate must "
    "name the advertised host); for SASL sasl.mechanism.inter.broker.protocol and the "
    "username/password of listener.name.<listener>.<mechanism>.sasl.jaas.config (a PLAIN "
    "user_<name> entry, or a SCRAM credential made with spool users / spool format "
    "--add-scram)"
)


class BrokerConnections:
    """`Transport` over spool's `KafkaClient`: one connection per broker, opened on first
    use, shared by every request to it (pipelined: responses matched by correlation id),
    dropped when it fails or a request on it times out (its next request reconnects, as
    Kafka's NetworkClient disconnects a connection whose request timed out).

    `security` secures each connection as the inter-broker listener asks (TLS, SASL with
    this broker's credentials; `broker.listeners.inter_broker_client`); None is
    PLAINTEXT. A connection refused at TLS or SASL fails like a lost one (retried by
    the callers) and is logged with what to check."""

    def __init__(
        self,
        client_id: str,
        *,
        security: ClientSecurity | None = None,
        request_timeout_ms: int = REQUEST_TIMEOUT_MS,
        connect_timeout_ms: int = CONNECT_TIMEOUT_MS,
    ) -> None:
        self.client_id = client_id
        self.security = security
        self.request_timeout_ms = request_timeout_ms
        self.connect_timeout_ms = connect_timeout_ms
        self._clients: dict[Target, KafkaClient] = {}
        self._connecting: dict[Target, asyncio.Future[KafkaClient]] = {}
        self._closed = False

    async def send(
        self, target: Target, api_key: int, version: int, body: Mapping[str, Any]
    ) -> Any:
        client = await self._client(target)
        try:
            return await client.request(
                api_key, version, body, timeout_s=self.request_timeout_ms / 1000
            )
        except TimeoutError:
            await self._drop(target, client)
            raise TransportError(
                ErrorCode.request_timed_out,
                f"broker {target.node_id} at {target.host}:{target.port} did not answer "
                f"within {self.request_timeout_ms} ms",
            ) from None
        except (ClientError, OSError) as exc:
            await self._drop(target, client)
            raise TransportError(
                ErrorCode.network_exception,
                f"connection to broker {target.node_id} at {target.host}:{target.port} "
                f"failed: {exc}",
            ) from None

    async def _client(self, target: Target) -> KafkaClient:
        if self._closed:
            raise TransportError(ErrorCode.network_exception, "the broker is stopping")
        client = self._clients.get(target)
        if client is not None and not client.closed:
            return client
        if client is not None:
            await self._drop(target, client)
        pending = self._connecting.get(target)
        if pending is None:
            pending = asyncio.ensure_future(self._connect(target))
            self._connecting[target] = pending
            pending.add_done_callback(lambda _: self._connecting.pop(target, None))
        # Shielded: one caller giving up does not cut the connection short for the others.
        return await asyncio.shield(pending)

    async def _connect(self, target: Target) -> KafkaClient:
        try:
            async with asyncio.timeout(self.connect_timeout_ms / 1000):
                client = await KafkaClient.connect(
                    target.host, target.port, self.client_id, security=self.security
                )
        except TimeoutError:
            raise TransportError(
                ErrorCode.network_exception,
                f"no connection to broker {target.node_id} at {target.host}:{target.port} "
                f"within {self.connect_timeout_ms} ms",
            ) from None
        except (ClientError, OSError, SecurityConfigError) as exc:
            # SecurityConfigError: the trust or key store cannot be read now (mid-rotation):
            # a failed connection like any other, retried by whoever sent.
            if isinstance(exc, AuthenticationError | TlsError | SecurityConfigError):
                log.error(
                    "inter_broker_connection_refused",
                    broker=target.node_id,
                    address=f"{target.host}:{target.port}",
                    protocol=self.security.protocol if self.security else "PLAINTEXT",
                    error=str(exc),
                    hint=_REFUSED_HINT,
                )
            raise TransportError(
                ErrorCode.network_exception,
                f"cannot connect to broker {target.node_id} at {target.host}:{target.port}: {exc}",
            ) from None
        if self._closed:
            await client.close()
            raise TransportError(ErrorCode.network_exception, "the broker is stopping")
        self._clients[target] = client
        return client

    async def _drop(self, target: Target, client: KafkaClient) -> None:
        if self._clients.get(target) is client:
            del self._clients[target]
        with contextlib.suppress(Exception):
            await client.close()

    async def close(self) -> None:
        self._closed = True
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            with contextlib.suppress(Exception):
                await client.close()


class Backoff:
    """Kafka's ExponentialBackoff: base * 2^(attempt-1), at most `max_ms`, +-jitter."""

    def __init__(
        self,
        base_ms: int = REQUEST_BACKOFF_MS,
        max_ms: int = REQUEST_BACKOFF_MAX_MS,
        jitter: float = BACKOFF_JITTER,
        rng: random.Random | None = None,
    ) -> None:
        self.base_ms = base_ms
        self.max_ms = max_ms
        self.jitter = jitter
        self.rng = rng or random.Random()

    def __call__(self, attempt: int) -> int:
        term = min(self.base_ms * BACKOFF_EXP_BASE ** max(attempt - 1, 0), self.max_ms)
        spread = self.rng.uniform(1 - self.jitter, 1 + self.jitter) if self.jitter else 1.0
        return int(term * spread)


def _loading(persister: Persister) -> bool:
    """Whether the local share coordinator is loading its log (coordinator.runtime's
    `begin_loading`); a persister without a runtime never is."""
    runtime = getattr(persister, "runtime", None)
    return bool(getattr(runtime, "loading", False))


class _Retry(Exception):
    """The coordinator could not be found this time (retriable)."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error = KafkaError(code, message)


# One key's outcome: its result, or the error it failed with.
Outcome = Any


@dataclass(frozen=True, slots=True)
class _Rpc:
    """One share-state RPC: how a key's call runs locally, goes in a request, and is read
    from the response."""

    name: str
    api_key: int
    # The local share coordinator's answer for each item: a result or an Exception.
    local: Callable[[Persister, Sequence[Any]], Awaitable[list[Outcome]]]
    # The request's partition entry for an item.
    entry: Callable[[Any], dict[str, Any]]
    # The result of a partition entry of the response whose error code is NONE.
    result: Callable[[Any], Any]

    @property
    def version(self) -> int:
        return VERSIONS[self.api_key]


def _key_of(item: _Item | StateWrite) -> ShareStateKey:
    return item.key


@dataclass(frozen=True, slots=True)
class _Item:
    """A call's arguments for one key (write calls use StateWrite)."""

    key: ShareStateKey
    state_epoch: int = 0
    start_offset: int = UNINITIALIZED_START_OFFSET
    leader_epoch: int = -1


async def _each(
    persister: Persister,
    items: Sequence[Any],
    call: Callable[[Persister, Any], Awaitable[Any]],
) -> list[Outcome]:
    out: list[Outcome] = []
    for item in items:
        try:
            out.append(await call(persister, item))
        except KafkaError as exc:
            out.append(exc)
    return out


def _state(p: Any) -> ShareState:
    return ShareState(
        state_epoch=int(p.state_epoch),
        start_offset=int(p.start_offset),
        batches=[
            PersistedBatch(
                int(b.first_offset),
                int(b.last_offset),
                int(b.delivery_state),
                int(b.delivery_count),
            )
            for b in p.state_batches
        ],
    )


def _summary(p: Any) -> ShareState:
    return ShareState(
        state_epoch=int(p.state_epoch),
        leader_epoch=int(p.leader_epoch),
        start_offset=int(p.start_offset),
        delivery_complete_count=int(
            getattr(p, "delivery_complete_count", UNKNOWN_DELIVERY_COMPLETE_COUNT)
        ),
    )


async def _local_writes(persister: Persister, writes: Sequence[Any]) -> list[Outcome]:
    return list(await write_states(persister, writes))


_INITIALIZE = _Rpc(
    "initialize state",
    INITIALIZE,
    lambda p, items: _each(
        p, items, lambda q, i: q.initialize_state(i.key, i.state_epoch, i.start_offset)
    ),
    lambda i: {
        "partition": i.key.partition,
        "state_epoch": i.state_epoch,
        "start_offset": i.start_offset,
    },
    lambda _p: None,
)
_READ = _Rpc(
    "read state",
    READ,
    lambda p, items: _each(p, items, lambda q, i: q.read_state(i.key, i.leader_epoch)),
    lambda i: {"partition": i.key.partition, "leader_epoch": i.leader_epoch},
    _state,
)
_WRITE = _Rpc(
    "write state",
    WRITE,
    _local_writes,
    lambda w: {
        "partition": w.key.partition,
        "state_epoch": w.state_epoch,
        "leader_epoch": w.leader_epoch,
        "start_offset": w.start_offset,
        "delivery_complete_count": w.delivery_complete_count,
        "state_batches": [
            {
                "first_offset": b.first_offset,
                "last_offset": b.last_offset,
                "delivery_state": b.delivery_state,
                "delivery_count": b.delivery_count,
            }
            for b in w.batches
        ],
    },
    lambda _p: None,
)
_DELETE = _Rpc(
    "delete state",
    DELETE,
    lambda p, items: _each(p, items, lambda q, i: q.delete_state(i.key)),
    lambda i: {"partition": i.key.partition},
    lambda _p: None,
)
_SUMMARY = _Rpc(
    "read state summary",
    SUMMARY,
    lambda p, items: _each(p, items, lambda q, i: q.read_summary(i.key)),
    lambda i: {"partition": i.key.partition, "leader_epoch": -1},
    _summary,
)


@dataclass(eq=False)
class _Batch:
    """Partition entries waiting to go as one request, and its answer."""

    entries: dict[tuple[uuid.UUID, int], dict[str, Any]]
    answer: asyncio.Future[Any]


class _Lane:
    """The requests of one RPC to one broker for one group, as Kafka's
    PersisterStateManager sends them: one at a time; the calls made while one is in
    flight wait and go together as the next request (one append and one commit on the
    share coordinator for all of them). A call sees the whole combined response and
    reads its own partitions from it. Every wait is bounded by the transport's request
    timeout of the requests ahead of it."""

    def __init__(self, transport: Transport, target: Target, rpc: _Rpc, group: str) -> None:
        self.transport = transport
        self.target = target
        self.rpc = rpc
        self.group = group
        self.queue: list[_Batch] = []
        self.driver: asyncio.Task[None] | None = None

    async def send(self, entries: Sequence[tuple[ShareStateKey, dict[str, Any]]]) -> Any:
        keys = [(key.topic_id, key.partition) for key, _ in entries]
        batch = self.queue[-1] if self.queue else None
        if batch is None or any(k in batch.entries for k in keys):
            # A partition named twice in one request would be ambiguous: a new one.
            batch = _Batch({}, asyncio.get_running_loop().create_future())
            self.queue.append(batch)
        for k, (_, entry) in zip(keys, entries, strict=True):
            batch.entries[k] = entry
        if self.driver is None or self.driver.done():
            self.driver = asyncio.ensure_future(self._drive())
        # Shielded: a caller giving up does not cancel the request the others wait on.
        return await asyncio.shield(batch.answer)

    async def _drive(self) -> None:
        batch: _Batch | None = None
        try:
            while self.queue:
                # Out of the queue before it is sent: later calls start the next one.
                batch = self.queue.pop(0)
                topics: dict[uuid.UUID, list[dict[str, Any]]] = {}
                for (topic_id, _), entry in batch.entries.items():
                    topics.setdefault(topic_id, []).append(entry)
                body = {
                    "group_id": self.group,
                    "topics": [{"topic_id": t, "partitions": ps} for t, ps in topics.items()],
                }
                try:
                    response = await self.transport.send(
                        self.target, self.rpc.api_key, self.rpc.version, body
                    )
                except Exception as exc:
                    _settle(batch.answer, exc)
                else:
                    _settle(batch.answer, response)
                batch = None
        finally:
            # Cancelled (the broker stopping): nobody waits for ever.
            for left in [*([batch] if batch is not None else []), *self.queue]:
                _settle(
                    left.answer,
                    TransportError(ErrorCode.network_exception, "the broker is stopping"),
                )
            self.queue.clear()

    async def close(self) -> None:
        if self.driver is not None and not self.driver.done():
            self.driver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.driver


def _settle(answer: asyncio.Future[Any], outcome: Any) -> None:
    if answer.done():
        return
    if isinstance(outcome, BaseException):
        answer.set_exception(outcome)
        answer.exception()  # retrieved: a caller that gave up leaves no warning
    else:
        answer.set_result(outcome)


def coordinator_key(key: ShareStateKey) -> str:
    """FindCoordinator's key for a share partition (Kafka's SharePartitionKey
    .asCoordinatorKey): group id, topic id as Kafka prints a Uuid, partition."""
    topic = base64.urlsafe_b64encode(key.topic_id.bytes).decode().rstrip("=")
    return f"{key.group_id}:{topic}:{key.partition}"


class RoutedPersister:
    """`Persister` that sends each call to the share coordinator wherever it is (see the
    module docstring). `local` is this broker's share coordinator; `cluster` is read at
    each call (the broker's view is replaced when it joins a cluster)."""

    def __init__(
        self,
        local: Persister,
        cluster: Callable[[], ClusterView],
        transport: Transport,
        *,
        listener: str,
        principal: str = "User:ANONYMOUS",
        clock: Clock = SYSTEM_CLOCK,
        backoff: Callable[[int], int] | None = None,
        max_attempts: int = MAX_ATTEMPTS,
        rng: random.Random | None = None,
    ) -> None:
        self.local = local
        self._cluster = cluster
        self.transport = transport
        self.listener = listener
        self.principal = principal
        self.clock = clock
        self.backoff = backoff or Backoff(rng=rng)
        self.max_attempts = max_attempts
        self._rng = rng or random.Random()
        # One lane per (broker, RPC, group): the requests in flight and waiting.
        self._lanes: dict[tuple[Target, int, str], _Lane] = {}
        self._closed = False

    # -- Persister --------------------------------------------------------------------

    async def initialize_state(
        self, key: ShareStateKey, state_epoch: int, start_offset: int
    ) -> None:
        if await self._is_local():
            return await self.local.initialize_state(key, state_epoch, start_offset)
        await self._one(_INITIALIZE, _Item(key, state_epoch, start_offset))

    async def initialize_if_absent(self, key: ShareStateKey, state_epoch: int = 0) -> bool:
        if await self._is_local():
            return await self.local.initialize_if_absent(key, state_epoch)
        summary: ShareState = await self._one(_SUMMARY, _Item(key))
        if summary.start_offset != UNINITIALIZED_START_OFFSET or summary.state_epoch > 0:
            return False
        await self._one(_INITIALIZE, _Item(key, state_epoch, UNINITIALIZED_START_OFFSET))
        return True

    async def reset_state(self, key: ShareStateKey, start_offset: int) -> int:
        if await self._is_local():
            return await self.local.reset_state(key, start_offset)
        summary: ShareState = await self._one(_SUMMARY, _Item(key))
        epoch = summary.state_epoch + 1
        await self._one(_INITIALIZE, _Item(key, epoch, start_offset))
        return epoch

    async def read_state(self, key: ShareStateKey, leader_epoch: int) -> ShareState:
        if await self._is_local():
            return await self.local.read_state(key, leader_epoch)
        state: ShareState = await self._one(_READ, _Item(key, leader_epoch=leader_epoch))
        return state

    async def write_state(
        self,
        key: ShareStateKey,
        state_epoch: int,
        leader_epoch: int,
        start_offset: int,
        batches: Sequence[PersistedBatch],
        delivery_complete_count: int = UNKNOWN_DELIVERY_COMPLETE_COUNT,
    ) -> None:
        if await self._is_local():
            return await self.local.write_state(
                key,
                state_epoch,
                leader_epoch,
                start_offset,
                batches,
                delivery_complete_count=delivery_complete_count,
            )
        write = StateWrite(
            key, state_epoch, leader_epoch, start_offset, batches, delivery_complete_count
        )
        await self._one(_WRITE, write)

    async def delete_state(self, key: ShareStateKey) -> None:
        if await self._is_local():
            return await self.local.delete_state(key)
        await self._one(_DELETE, _Item(key))

    async def read_summary(self, key: ShareStateKey) -> ShareState:
        if await self._is_local():
            return await self.local.read_summary(key)
        state: ShareState = await self._one(_SUMMARY, _Item(key))
        return state

    async def route_write_states(self, writes: Sequence[StateWrite]) -> list[Exception | None]:
        """Several partitions' writes (`coordinator.share_persister.write_states`): one
        append locally, else one WriteShareGroupState per group id. Per write, what it
        failed with or None."""
        if await self._is_local():
            return list(await write_states(self.local, writes))
        outcomes = await self._run(_WRITE, writes)
        return [o if isinstance(o, Exception) else None for o in outcomes]

    async def close(self) -> None:
        self._closed = True
        lanes, self._lanes = list(self._lanes.values()), {}
        for lane in lanes:
            await lane.close()
        await self.transport.close()

    def _lane(self, target: Target, rpc: _Rpc, group: str) -> _Lane:
        lane = self._lanes.get((target, rpc.api_key, group))
        if lane is None:
            lane = self._lanes[(target, rpc.api_key, group)] = _Lane(
                self.transport, target, rpc, group
            )
        return lane

    # -- routing ----------------------------------------------------------------------

    async def _is_local(self) -> bool:
        """Whether this broker leads the share-state log (no look-up over the network:
        the common case, and a broker alone, costs one view look-up) and has loaded it.
        While it loads the log it claimed, calls take the retrying path (`_run`): the
        local share coordinator answers COORDINATOR_LOAD_IN_PROGRESS until loaded."""
        view = self._cluster()
        leader = view.coordinator(SHARE_STATE_LOG)
        return leader is not None and view.is_local(leader) and not _loading(self.local)

    async def _target(self, key: ShareStateKey) -> Target | None:
        """Where the share coordinator is now: None for this broker, else the leader's
        endpoint on the inter-broker listener. _Retry when it cannot be said."""
        view = self._cluster()
        leader = view.coordinator(SHARE_STATE_LOG)
        if leader is None:
            return await self._find_coordinator(view, key)
        if view.is_local(leader):
            return None
        info = view.broker(leader.node_id)
        if info is None:
            raise _Retry(
                ErrorCode.coordinator_not_available,
                f"broker {leader.node_id}, the share coordinator, is not a live broker",
            )
        endpoint = info.endpoint(self.listener)
        if endpoint is None:
            raise _Retry(
                ErrorCode.coordinator_not_available,
                f"broker {leader.node_id}, the share coordinator, has no {self.listener} "
                "listener (inter.broker.listener.name)",
            )
        return Target(leader.node_id, endpoint.host, endpoint.port)

    async def _find_coordinator(self, view: ClusterView, key: ShareStateKey) -> Target | None:
        """FindCoordinator(SHARE) to another live broker, as Kafka asks a random node
        when its metadata cache names no share coordinator."""
        others = [
            b
            for b in view.live_brokers()
            if b.node_id != view.node_id and b.endpoint(self.listener) is not None
        ]
        if not others:
            raise _Retry(
                ErrorCode.coordinator_not_available,
                "no broker leads the share-state log, and no other live broker to ask",
            )
        ask = self._rng.choice(others)
        endpoint = ask.endpoint(self.listener)
        assert endpoint is not None
        body = {"key_type": SHARE_KEY_TYPE, "coordinator_keys": [coordinator_key(key)]}
        try:
            response = await self.transport.send(
                Target(ask.node_id, endpoint.host, endpoint.port),
                FIND_COORDINATOR,
                VERSIONS[FIND_COORDINATOR],
                body,
            )
        except TransportError as exc:
            raise _Retry(exc.code, exc.message) from None
        if len(response.coordinators) != 1:
            raise _Retry(
                ErrorCode.unknown_server_error,
                f"FindCoordinator answered {len(response.coordinators)} coordinators for one key",
            )
        (found,) = response.coordinators
        code = ErrorCode(found.error_code)
        if code != ErrorCode.none:
            raise _Retry(code, found.error_message or f"FindCoordinator failed: {code.name}")
        if int(found.node_id) == view.node_id:
            return None
        return Target(int(found.node_id), found.host, int(found.port))

    async def _one(self, rpc: _Rpc, item: Any) -> Any:
        (outcome,) = await self._run(rpc, [item])
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def _run(self, rpc: _Rpc, items: Sequence[Any]) -> list[Outcome]:
        """`rpc` for each item, retried as PersisterStateManager retries it; per item its
        result or the KafkaError it finally failed with."""
        outcomes: list[Outcome] = [None] * len(items)
        pending = list(range(len(items)))
        last: dict[int, KafkaError] = {}
        attempt = 0
        while True:
            attempt += 1
            retry: list[int] = []
            if self._closed:
                stopping = KafkaError(ErrorCode.network_exception, "the broker is stopping")
                for i in pending:
                    outcomes[i] = stopping
                return outcomes
            try:
                target = await self._target(_key_of(items[pending[0]]))
            except _Retry as exc:
                for i in pending:
                    last[i] = exc.error
                retry = pending
            else:
                if target is None:
                    results = await rpc.local(self.local, [items[i] for i in pending])
                    for i, result in zip(pending, results, strict=True):
                        if isinstance(result, KafkaError) and (
                            result.code == ErrorCode.coordinator_load_in_progress
                            or (
                                result.code == ErrorCode.not_coordinator
                                and not await self._is_local()
                            )
                        ):
                            # This broker is still loading the share-state log it
                            # claimed, or the log moved while the call ran here: retry.
                            last[i] = result
                            retry.append(i)
                        else:
                            outcomes[i] = result
                else:
                    for i, result in await self._send(rpc, target, items, pending):
                        if isinstance(result, KafkaError) and result.code in RETRIABLE:
                            last[i] = result
                            retry.append(i)
                        else:
                            outcomes[i] = result
            if not retry:
                return outcomes
            if attempt >= self.max_attempts:
                for i in retry:
                    error = last[i]
                    log.warning(
                        "share_state_rpc_gave_up",
                        rpc=rpc.name,
                        key=str(_key_of(items[i])),
                        attempts=attempt,
                        error=error.code.name,
                        reason=error.message,
                    )
                    outcomes[i] = KafkaError(
                        error.code,
                        f"Error in {rpc.name} RPC: exhausted {attempt} attempts without "
                        f"success; last: {error.message or error.code.name}",
                    )
                return outcomes
            wait = self.backoff(attempt)
            log.debug(
                "share_state_rpc_retry",
                rpc=rpc.name,
                partitions=len(retry),
                attempt=attempt,
                backoff_ms=wait,
                error=last[retry[0]].code.name,
            )
            pending = retry
            await self._back_off(wait)

    async def _back_off(self, wait_ms: int) -> None:
        """Sleep `wait_ms` on the clock, or less once the view names another share
        coordinator than it did when the wait began (it moved while this call failed)."""
        before = self._cluster().coordinator(SHARE_STATE_LOG)
        deadline = self.clock.now_ms() + wait_ms
        while (left := deadline - self.clock.now_ms()) > 0 and not self._closed:
            await sleep(self.clock, min(left, PLACEMENT_CHECK_MS))
            now = self._cluster().coordinator(SHARE_STATE_LOG)
            if now is not None and now != before:
                return

    async def _send(
        self, rpc: _Rpc, target: Target, items: Sequence[Any], pending: Sequence[int]
    ) -> list[tuple[int, Outcome]]:
        """One request per group id (the RPCs carry one group each), sent together on the
        target's connection; per pending item, its result or KafkaError."""
        groups: dict[str, list[int]] = {}
        for i in pending:
            groups.setdefault(_key_of(items[i]).group_id, []).append(i)
        answers = await asyncio.gather(
            *(self._send_group(rpc, target, group, items, idx) for group, idx in groups.items())
        )
        return [pair for answer in answers for pair in answer]

    async def _send_group(
        self, rpc: _Rpc, target: Target, group: str, items: Sequence[Any], idx: Sequence[int]
    ) -> list[tuple[int, Outcome]]:
        entries = [(_key_of(items[i]), rpc.entry(items[i])) for i in idx]
        try:
            response = await self._lane(target, rpc, group).send(entries)
        except TransportError as exc:
            error = KafkaError(exc.code, exc.message)
            return [(i, error) for i in idx]
        found: dict[tuple[uuid.UUID | None, int], Any] = {}
        if any(
            p.error_code == ErrorCode.cluster_authorization_failed
            for result in response.results
            for p in result.partitions
        ):
            log.error(
                "share_state_rpc_not_authorized",
                rpc=rpc.name,
                broker=target.node_id,
                listener=self.listener,
                hint="the share coordinator's broker refused CLUSTER_ACTION to this broker: "
                + not_authorized_hint(self.principal),
            )
        for result in response.results:
            for p in result.partitions:
                found[(result.topic_id, int(p.partition))] = p
        out: list[tuple[int, Outcome]] = []
        for i in idx:
            key = _key_of(items[i])
            p = found.get((key.topic_id, key.partition))
            if p is None:
                out.append(
                    (
                        i,
                        KafkaError(
                            ErrorCode.unknown_server_error,
                            f"broker {target.node_id} answered {rpc.name} without a result "
                            f"for {key.group_id}:{key.topic_id}:{key.partition}",
                        ),
                    )
                )
                continue
            code = ErrorCode(p.error_code)
            if code != ErrorCode.none:
                out.append((i, KafkaError(code, p.error_message or code.name)))
            else:
                out.append((i, rpc.result(p)))
        return out
