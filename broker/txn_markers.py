"""Transactions across brokers: the transaction coordinator's markers reach every
partition's leader, and a partition leader verifies transactional produce with the
coordinator wherever it is.

In Kafka 4.2 the transaction coordinator never appends to another broker's partitions:
its TransactionMarkerChannelManager sends WriteTxnMarkers (API 27) to the leader of each
partition of an ending transaction, one request per leader, and keeps sending what
failed with a retriable error to the partition's current leader until every marker is
written; the transaction stays PREPARE_COMMIT / PREPARE_ABORT meanwhile. The leader
appends the control batch with the coordinator epoch, which fences a coordinator that
lost its transaction log (TRANSACTION_COORDINATOR_FENCED). Likewise a partition leader
that is not the transaction coordinator checks a transactional produce (KIP-890 part 1)
by asking the coordinator's broker with AddPartitionsToTxn v4+ VerifyOnly
(AddPartitionsToTxnManager, one request per coordinator broker for the produce requests
waiting meanwhile).

`MarkerChannel` is the coordinator's `MarkerWriter` in a cluster. For each pending
partition it asks the cluster view who leads it (`plan`):

- this broker: the marker is appended to the local log directly (the path a broker alone
  always takes), and waited for until durable;
- another broker: one WriteTxnMarkers per leader, on its endpoint on the inter-broker
  listener (Kafka's `inter.broker.listener.name`), over the pooled connections share-
  state RPCs use (`broker.share.remote_persister.BrokerConnections`);
- no leader known, or a leader without that listener: waits for the next round;
- `__consumer_offsets` partitions: the group coordinator completes the transaction's
  pending offsets of their groups (TxnOffsetCommit), on this broker when it leads the
  groups log (`complete_offsets`), else at the groups log's leader, which gets them in
  its WriteTxnMarkers as Kafka's offsets partition leaders do;
- a topic no longer in the metadata (deleted): skipped, as Kafka drops markers of a
  partition its metadata no longer has.

Results are read as Kafka's TransactionMarkerRequestCompletionHandler reads them
(`outcome`): NONE is done; UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER_OR_FOLLOWER,
NOT_ENOUGH_REPLICAS(_AFTER_APPEND), REQUEST_TIMED_OUT, KAFKA_STORAGE_ERROR and a lost
connection are retried against the partition's leader of the next round;
INVALID_PRODUCER_EPOCH gives that partition up (a newer epoch of the producer wrote
there, as spool's local path has always done); UNSUPPORTED_VERSION and
UNSUPPORTED_FOR_MESSAGE_FORMAT drop the partition; TRANSACTION_COORDINATOR_FENCED and
anything else raise, leaving the transaction in Prepare* for the coordinator's next
attempt (a retry of the client, the timeout sweep, the next load).

Every round first checks that this broker still leads the transactions log at the same
epoch the markers carry: if not, the channel stops (NOT_COORDINATOR) and the new
coordinator completes the transaction when it loads the log. Rounds are spaced by an
exponential backoff (Kafka's `retry.backoff.ms` 100 doubling to `retry.backoff.max.ms`
1000, 20 % jitter) on the broker's clock and never give up while this broker is the
coordinator; each request waits at most `request.timeout.ms` (30 s) for its answer.

`ProduceVerifier` answers the produce path's question for one transactional id:
locally (`TransactionCoordinator.verify`) when this broker leads the transactions log,
else with AddPartitionsToTxn v5 VerifyOnly to its leader. Requests are batched per
coordinator broker: one is in flight at a time, and the verifications asked meanwhile
go together as the next one (a transactional id asked twice in one batch waits for the
next, as Kafka's manager keeps one entry per id). Errors map as AddPartitionsToTxnManager
maps them: a lost connection or a timeout is NETWORK_EXCEPTION for every partition
(producers retry it), a top-level error is every partition's, CLUSTER_AUTHORIZATION_FAILED
becoming INVALID_TXN_STATE; no coordinator known is COORDINATOR_NOT_AVAILABLE.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

import structlog

from broker.cluster import ClusterView, Leader
from broker.partitions import Partition
from broker.share.remote_persister import (
    Backoff,
    Target,
    Transport,
    TransportError,
    not_authorized_hint,
)
from coordinator.transactions import OFFSETS_TOPIC, TopicPartition, TransactionCoordinator
from persister.clock import SYSTEM_CLOCK, Clock, sleep
from protocol.errors import ErrorCode, KafkaError

log = structlog.get_logger("spool.txn_markers")

TRANSACTIONS_LOG = "transactions"
GROUPS_LOG = "groups"
WRITE_TXN_MARKERS = 27
ADD_PARTITIONS_TO_TXN = 24
# The versions sent: WriteTxnMarkers v1 is Kafka 4's baseline (v2 adds the transaction
# version, 0 here anyway); AddPartitionsToTxn v5 is the newest spool serves.
WRITE_TXN_MARKERS_VERSION = 1
ADD_PARTITIONS_TO_TXN_VERSION = 5

# Kafka's retry.backoff.ms and retry.backoff.max.ms defaults, which the inter-broker send
# threads back off with.
RETRY_BACKOFF_MS = 100
RETRY_BACKOFF_MAX_MS = 1_000
# How long a local marker waits to be durable before the round counts it as failed
# (request.timeout.ms, as a remote leader's append is bounded).
LOCAL_DURABLE_TIMEOUT_S = 30.0


class Outcome(Enum):
    """What a partition's marker result means for the channel."""

    DONE = "done"
    RETRY = "retry"  # send again, to the partition's leader of the next round
    GIVE_UP = "give_up"  # this partition needs no marker any more
    FAIL = "fail"  # stop: the transaction stays in Prepare* for a later attempt


RETRIABLE = frozenset(
    {
        ErrorCode.unknown_topic_or_partition,
        ErrorCode.not_leader_or_follower,
        ErrorCode.not_enough_replicas,
        ErrorCode.not_enough_replicas_after_append,
        ErrorCode.request_timed_out,
        ErrorCode.kafka_storage_error,
        ErrorCode.network_exception,
        # The group coordinator of __consumer_offsets moving (spool's groups log).
        ErrorCode.not_coordinator,
        ErrorCode.coordinator_not_available,
        ErrorCode.coordinator_load_in_progress,
    }
)
GIVEN_UP = frozenset(
    {
        ErrorCode.invalid_producer_epoch,
        ErrorCode.unsupported_version,
        ErrorCode.unsupported_for_message_format,
    }
)


def outcome(code: ErrorCode) -> Outcome:
    """A marker result as Kafka's TransactionMarkerRequestCompletionHandler reads it
    (see the module docstring; INVALID_PRODUCER_EPOCH gives up the one partition)."""
    if code == ErrorCode.none:
        return Outcome.DONE
    if code in RETRIABLE:
        return Outcome.RETRY
    if code in GIVEN_UP:
        return Outcome.GIVE_UP
    return Outcome.FAIL


# A topic's id and partition count by name, from the cluster metadata; None once the
# topic is gone.
TopicLookup = Callable[[str], tuple[uuid.UUID, int] | None]


@dataclass(slots=True)
class Plan:
    """Where each pending partition's marker goes this round."""

    local: list[TopicPartition] = field(default_factory=list)
    # __consumer_offsets partitions whose groups this broker coordinates.
    offsets: list[TopicPartition] = field(default_factory=list)
    remote: dict[Target, list[TopicPartition]] = field(default_factory=dict)
    gone: list[TopicPartition] = field(default_factory=list)
    # No leader to send to this round, with why.
    waiting: dict[TopicPartition, str] = field(default_factory=dict)


def target_of(view: ClusterView, leader: Leader, listener: str) -> Target | str:
    """The endpoint of `leader` on `listener`, or why there is none."""
    info = view.broker(leader.node_id)
    if info is None:
        return f"broker {leader.node_id} is not a live broker"
    endpoint = info.endpoint(listener)
    if endpoint is None:
        return f"broker {leader.node_id} has no {listener} listener (inter.broker.listener.name)"
    return Target(leader.node_id, endpoint.host, endpoint.port)


def plan(
    partitions: Iterable[TopicPartition], view: ClusterView, topics: TopicLookup, listener: str
) -> Plan:
    """Sort the partitions by where their markers go (sans-IO; see the module docstring)."""
    out = Plan()
    for tp in sorted(partitions):
        topic, index = tp
        if topic == OFFSETS_TOPIC:
            leader = view.coordinator(GROUPS_LOG)
        else:
            found = topics(topic)
            if found is None or not 0 <= index < found[1]:
                out.gone.append(tp)
                continue
            leader = view.leader(found[0], index)
        if leader is None:
            out.waiting[tp] = "no leader"
        elif view.is_local(leader):
            (out.offsets if topic == OFFSETS_TOPIC else out.local).append(tp)
        else:
            where = target_of(view, leader, listener)
            if isinstance(where, str):
                out.waiting[tp] = where
            else:
                out.remote.setdefault(where, []).append(tp)
    return out


def markers_body(
    producer_id: int,
    producer_epoch: int,
    commit: bool,
    coordinator_epoch: int,
    partitions: Sequence[TopicPartition],
) -> dict[str, Any]:
    """A WriteTxnMarkers request for one transaction's partitions on one leader."""
    by_topic: dict[str, list[int]] = {}
    for topic, index in partitions:
        by_topic.setdefault(topic, []).append(index)
    return {
        "markers": [
            {
                "producer_id": producer_id,
                "producer_epoch": producer_epoch,
                "transaction_result": commit,
                "coordinator_epoch": coordinator_epoch,
                "topics": [
                    {"name": name, "partition_indexes": indexes}
                    for name, indexes in by_topic.items()
                ],
            }
        ]
    }


def markers_results(
    response: Any, producer_id: int, partitions: Sequence[TopicPartition]
) -> dict[TopicPartition, ErrorCode]:
    """Each partition's code in a WriteTxnMarkers response; a partition it leaves out is
    UNKNOWN_SERVER_ERROR."""
    found: dict[TopicPartition, ErrorCode] = {}
    for marker in response.markers:
        if int(marker.producer_id) != producer_id:
            continue
        for topic in marker.topics:
            for p in topic.partitions:
                found[(str(topic.name), int(p.partition_index))] = ErrorCode(p.error_code)
    return {tp: found.get(tp, ErrorCode.unknown_server_error) for tp in partitions}


class MarkerLogs(Protocol):
    def get(self, topic: str, index: int) -> Partition | None: ...


# The group coordinator's side of a marker: (producer id, commit, __consumer_offsets
# partitions) -> once the pending offsets of their groups are completed.
CompleteOffsets = Callable[[int, bool, frozenset[int]], Awaitable[None]]


async def _no_offsets(producer_id: int, commit: bool, partitions: frozenset[int]) -> None:
    return None


class MarkerChannel:
    """The transaction coordinator's `MarkerWriter` in a cluster (module docstring).

    `cluster` and `topics` are read at every round; `transport` sends WriteTxnMarkers.
    """

    def __init__(
        self,
        logs: MarkerLogs,
        cluster: Callable[[], ClusterView],
        topics: TopicLookup,
        transport: Transport,
        *,
        listener: str,
        principal: str = "User:ANONYMOUS",
        complete_offsets: CompleteOffsets = _no_offsets,
        clock: Clock = SYSTEM_CLOCK,
        backoff: Callable[[int], int] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.logs = logs
        self.complete_offsets = complete_offsets
        self._cluster = cluster
        self._topics = topics
        self.transport = transport
        self.listener = listener
        self.principal = principal
        self.clock = clock
        self.backoff = backoff or Backoff(RETRY_BACKOFF_MS, RETRY_BACKOFF_MAX_MS, rng=rng)
        self._closed = False

    async def close(self) -> None:
        self._closed = True
        await self.transport.close()

    def _coordinator_epoch(self) -> int:
        """This broker's epoch of the transactions log; NOT_COORDINATOR when it lost it."""
        view = self._cluster()
        leader = view.coordinator(TRANSACTIONS_LOG)
        if self._closed or leader is None or not view.is_local(leader):
            raise KafkaError(
                ErrorCode.not_coordinator,
                "This broker no longer leads the transactions log: the coordinator that "
                "loads it completes the transaction",
            )
        return leader.epoch

    async def __call__(
        self,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        partitions: frozenset[TopicPartition],
    ) -> None:
        pending = set(partitions)
        epoch = self._coordinator_epoch()
        attempt = 0
        while True:
            attempt += 1
            view = self._cluster()
            round_ = plan(pending, view, self._topics, self.listener)
            for topic, index in round_.gone:
                log.warning("marker_partition_gone", topic=topic, partition=index)
                pending.discard((topic, index))
            results: dict[TopicPartition, ErrorCode] = {}
            sends = [
                self._remote(target, tps, producer_id, producer_epoch, commit, epoch)
                for target, tps in round_.remote.items()
            ]
            local = self._local(round_.local, producer_id, producer_epoch, commit, epoch)
            offsets = self._offsets(round_.offsets, producer_id, commit)
            for part in await asyncio.gather(local, offsets, *sends):
                results.update(part)
            for tp, code in results.items():
                self._settle(tp, code, pending, producer_id, producer_epoch, epoch)
            if not pending:
                return
            wait = self.backoff(attempt)
            log.info(
                "marker_retry",
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                result="commit" if commit else "abort",
                partitions=len(pending),
                attempt=attempt,
                backoff_ms=wait,
                waiting={f"{t}-{i}": why for (t, i), why in round_.waiting.items()} or None,
                errors={f"{t}-{i}": c.name for (t, i), c in results.items() if c != 0} or None,
            )
            await sleep(self.clock, wait)
            if self._coordinator_epoch() != epoch:
                raise KafkaError(
                    ErrorCode.not_coordinator,
                    f"The transactions log moved to a new epoch (from {epoch}): the "
                    "coordinator that loaded it completes the transaction",
                )

    def _settle(
        self,
        tp: TopicPartition,
        code: ErrorCode,
        pending: set[TopicPartition],
        producer_id: int,
        producer_epoch: int,
        epoch: int,
    ) -> None:
        what = outcome(code)
        if what == Outcome.DONE:
            pending.discard(tp)
        elif what == Outcome.GIVE_UP:
            log.warning(
                "marker_skipped_newer_epoch"
                if code == ErrorCode.invalid_producer_epoch
                else "marker_partition_dropped",
                topic=tp[0],
                partition=tp[1],
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                error=code.name,
            )
            pending.discard(tp)
        elif what == Outcome.FAIL:
            raise KafkaError(
                code,
                f"The marker for {tp[0]}-{tp[1]} of producer {producer_id} epoch "
                f"{producer_epoch} (coordinator epoch {epoch}) failed: {code.name}",
            )

    async def _local(
        self,
        tps: Sequence[TopicPartition],
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        epoch: int,
    ) -> dict[TopicPartition, ErrorCode]:
        """Append to this broker's logs, then wait until durable."""
        results: dict[TopicPartition, ErrorCode] = {}
        waits: list[tuple[TopicPartition, Partition, int]] = []
        for tp in tps:
            part = self.logs.get(*tp)
            if part is None:  # being handed over, or not opened yet
                results[tp] = ErrorCode.not_leader_or_follower
                continue
            try:
                written = part.append_marker(
                    producer_id, producer_epoch, commit=commit, coordinator_epoch=epoch
                )
            except KafkaError as exc:
                results[tp] = exc.code
                continue
            waits.append((tp, part, written.last_offset))
        done = await asyncio.gather(
            *(part.wait_durable(last, LOCAL_DURABLE_TIMEOUT_S) for _, part, last in waits),
            return_exceptions=True,
        )
        for (tp, _, _), result in zip(waits, done, strict=True):
            if isinstance(result, KafkaError):
                results[tp] = result.code
            elif isinstance(result, BaseException):
                raise result
            else:
                results[tp] = ErrorCode.none
        return results

    async def _offsets(
        self, tps: Sequence[TopicPartition], producer_id: int, commit: bool
    ) -> dict[TopicPartition, ErrorCode]:
        """The group coordinator here completes the groups' transactional offsets."""
        if not tps:
            return {}
        try:
            await self.complete_offsets(producer_id, commit, frozenset(i for _, i in tps))
        except KafkaError as exc:
            return dict.fromkeys(tps, exc.code)
        return dict.fromkeys(tps, ErrorCode.none)

    async def _remote(
        self,
        target: Target,
        tps: Sequence[TopicPartition],
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        epoch: int,
    ) -> dict[TopicPartition, ErrorCode]:
        body = markers_body(producer_id, producer_epoch, commit, epoch, tps)
        try:
            response = await self.transport.send(
                target, WRITE_TXN_MARKERS, WRITE_TXN_MARKERS_VERSION, body
            )
        except TransportError as exc:
            log.info("marker_send_failed", broker=target.node_id, error=exc.message)
            return dict.fromkeys(tps, exc.code)
        results = markers_results(response, producer_id, tps)
        if ErrorCode.cluster_authorization_failed in results.values():
            log.error(
                "marker_not_authorized",
                broker=target.node_id,
                listener=self.listener,
                hint="the partition leader refused CLUSTER_ACTION to this broker: "
                + not_authorized_hint(self.principal),
            )
        return results


# ------------------------------------------------------------------ produce verification


def verify_body(
    entries: Sequence[tuple[str, int, int, Sequence[TopicPartition]]],
) -> dict[str, Any]:
    """An AddPartitionsToTxn v4+ VerifyOnly request for (transactional id, producer id,
    epoch, partitions) entries."""
    transactions = []
    for transactional_id, producer_id, producer_epoch, partitions in entries:
        by_topic: dict[str, list[int]] = {}
        for topic, index in partitions:
            by_topic.setdefault(topic, []).append(index)
        transactions.append(
            {
                "transactional_id": transactional_id,
                "producer_id": producer_id,
                "producer_epoch": producer_epoch,
                "verify_only": True,
                "topics": [{"name": n, "partitions": ps} for n, ps in by_topic.items()],
            }
        )
    return {"transactions": transactions}


def verify_results(
    response: Any, transactional_id: str, partitions: Sequence[TopicPartition]
) -> dict[TopicPartition, ErrorCode]:
    """One transactional id's codes in an AddPartitionsToTxn v4+ response, as Kafka's
    AddPartitionsToTxnManager reads them; a partition left out is verified (Kafka counts
    only the errors it finds)."""
    top = ErrorCode(response.error_code)
    if top != ErrorCode.none:
        if top == ErrorCode.cluster_authorization_failed:
            top = ErrorCode.invalid_txn_state
        return dict.fromkeys(partitions, top)
    found: dict[TopicPartition, ErrorCode] = {}
    for result in response.results_by_transaction:
        if str(result.transactional_id) != transactional_id:
            continue
        for topic in result.topic_results:
            for p in topic.results_by_partition:
                found[(str(topic.name), int(p.partition_index))] = ErrorCode(p.partition_error_code)
    return {tp: found.get(tp, ErrorCode.none) for tp in partitions}


@dataclass(slots=True)
class _Waiting:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    partitions: list[TopicPartition]
    answer: asyncio.Future[dict[TopicPartition, ErrorCode]]


@dataclass(slots=True)
class _Lane:
    """The verifications for one coordinator broker: the batch being sent and the next."""

    waiting: list[_Waiting] = field(default_factory=list)
    task: asyncio.Task[None] | None = None


class ProduceVerifier:
    """Produce verification with the transaction coordinator wherever it is (module
    docstring). `coordinator` is this broker's transaction coordinator."""

    def __init__(
        self,
        coordinator: Callable[[], TransactionCoordinator],
        cluster: Callable[[], ClusterView],
        transport: Transport,
        *,
        listener: str,
        principal: str = "User:ANONYMOUS",
    ) -> None:
        self._coordinator = coordinator
        self._cluster = cluster
        self.transport = transport
        self.listener = listener
        self.principal = principal
        self._lanes: dict[Target, _Lane] = {}
        self._closed = False

    async def close(self) -> None:
        self._closed = True
        lanes, self._lanes = list(self._lanes.values()), {}
        for lane in lanes:
            if lane.task is not None:
                lane.task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await lane.task
            for w in lane.waiting:
                if not w.answer.done():
                    w.answer.set_result(dict.fromkeys(w.partitions, ErrorCode.network_exception))
        await self.transport.close()

    async def verify(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Sequence[TopicPartition],
    ) -> dict[TopicPartition, ErrorCode]:
        view = self._cluster()
        leader = view.coordinator(TRANSACTIONS_LOG)
        if leader is not None and view.is_local(leader):
            # No suspension here: a local check and the append that follows it stay
            # one step of the event loop, as before.
            return self._coordinator().verify(
                transactional_id, producer_id, producer_epoch, partitions
            )
        where = (
            "no broker leads the transactions log"
            if leader is None
            else target_of(view, leader, self.listener)
        )
        if isinstance(where, str) or self._closed:
            log.info(
                "produce_verification_unavailable",
                transactional_id=transactional_id,
                reason="the broker is stopping" if self._closed else where,
            )
            return dict.fromkeys(partitions, ErrorCode.coordinator_not_available)
        answer: asyncio.Future[dict[TopicPartition, ErrorCode]]
        answer = asyncio.get_running_loop().create_future()
        lane = self._lanes.setdefault(where, _Lane())
        lane.waiting.append(
            _Waiting(transactional_id, producer_id, producer_epoch, list(partitions), answer)
        )
        if lane.task is None or lane.task.done():
            lane.task = asyncio.ensure_future(self._drain(where, lane))
        return await asyncio.shield(answer)

    async def _drain(self, target: Target, lane: _Lane) -> None:
        """Send the lane's waiting verifications, a batch at a time, until none is left."""
        while lane.waiting:
            batch: list[_Waiting] = []
            later: list[_Waiting] = []
            ids: set[str] = set()
            for w in lane.waiting:
                (later if w.transactional_id in ids else batch).append(w)
                ids.add(w.transactional_id)
            lane.waiting = later
            await self._send(target, batch)

    async def _send(self, target: Target, batch: Sequence[_Waiting]) -> None:
        body = verify_body(
            [(w.transactional_id, w.producer_id, w.producer_epoch, w.partitions) for w in batch]
        )
        try:
            response = await self.transport.send(
                target, ADD_PARTITIONS_TO_TXN, ADD_PARTITIONS_TO_TXN_VERSION, body
            )
        except TransportError as exc:
            log.warning("produce_verification_failed", broker=target.node_id, error=exc.message)
            for w in batch:
                _answer(w, dict.fromkeys(w.partitions, ErrorCode.network_exception))
            return
        except BaseException:
            for w in batch:
                _answer(w, dict.fromkeys(w.partitions, ErrorCode.network_exception))
            raise
        if ErrorCode(response.error_code) != ErrorCode.none:
            code = ErrorCode(response.error_code)
            log.error(
                "produce_verification_refused",
                broker=target.node_id,
                error=code.name,
                **(
                    {
                        "hint": "the transaction coordinator's broker refused "
                        "CLUSTER_ACTION to this broker: " + not_authorized_hint(self.principal)
                    }
                    if code == ErrorCode.cluster_authorization_failed
                    else {}
                ),
            )
        for w in batch:
            _answer(w, verify_results(response, w.transactional_id, w.partitions))


def _answer(w: _Waiting, result: Mapping[TopicPartition, ErrorCode]) -> None:
    if not w.answer.done():
        w.answer.set_result(dict(result))
