"""Produce, Fetch (with long poll), ListOffsets, DeleteRecords.

Authorization as Kafka 4.2's KafkaApis: Produce needs WRITE on each topic (and WRITE on
the transactional id when its batches are transactional, or the whole request fails),
Fetch READ on each topic, ListOffsets DESCRIBE, DeleteRecords DELETE; a denied topic's
partitions get TOPIC_AUTHORIZATION_FAILED, checked before whether they exist."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple, Protocol, TypeVar

import structlog
from kio.schema.types import BrokerId, ProducerId, TopicName
from kio.static.primitive import Records, TZAware, i32, i64

from broker.cluster import ClusterView
from broker.handlers import responses as resp
from broker.handlers.access import Guarded
from broker.handlers.leaders import MOVED, NOT_LEADER, CurrentLeaders, not_leader_message
from broker.handlers.responses import NO_THROTTLE
from broker.handlers.transactions import (
    ProduceVerifier,
    first_transactional,
    verify_produce,
    verify_transactions,
)
from broker.partitions import LogManager, Partition, validate_produce_data, wait_for_any
from broker.server import CloseConnection, RequestContext
from coordinator.acls import AclOperation, ResourceType
from coordinator.metadata import MetadataStore
from protocol import api
from protocol.errors import CorruptRecordError, ErrorCode, KafkaError
from protocol.records import iter_batches

if TYPE_CHECKING:
    from typing_extensions import TypeIs

    from broker.handlers.requests import (
        DeleteRecordsRequest,
        FetchRequest,
        FetchSessionRequest,
        ListOffsetsRequest,
        ProduceRequest,
    )

log = structlog.get_logger("spool.data")

EARLIEST, LATEST, MAX_TIMESTAMP, EARLIEST_LOCAL, LATEST_TIERED = -2, -1, -3, -4, -5
READ_COMMITTED = 1
NO_EPOCH = -1  # a request's current leader epoch that asks for no check


class DataBroker(Guarded, Protocol):
    """What the data handlers use of the broker: topic names and ids, partition logs."""

    @property
    def metadata(self) -> MetadataStore: ...
    @property
    def logs(self) -> LogManager: ...
    @property
    def txn_verifier(self) -> ProduceVerifier: ...
    @property
    def cluster(self) -> ClusterView: ...


class _Wanted(NamedTuple):
    """A partition a Fetch asks for."""

    name: str | None
    topic_id: uuid.UUID | None
    partition: int
    fetch_offset: int
    partition_max_bytes: int
    denied: bool = False  # no READ on the topic: TOPIC_AUTHORIZATION_FAILED
    current_leader_epoch: int = NO_EPOCH  # v9+; checked against the leader's (KIP-320)


def _topic_name(broker: DataBroker, entry: object) -> tuple[str | None, uuid.UUID | None]:
    """Name and id of a request topic that carries either (newer versions use ids)."""
    topic_id: uuid.UUID | None = getattr(entry, "topic_id", None)  # Produce v13+, Fetch v13+
    name: str | None = getattr(entry, "name", None)  # Produce before v13
    if name is None:  # not `or`: an empty name is a name (unknown), not a missing one
        name = getattr(entry, "topic", None)  # Fetch before v13
    if name is None and topic_id is not None:
        topic = broker.metadata.state.topics_by_id.get(topic_id)
        return (topic.name if topic else None), topic_id
    if topic_id is None and name is not None:
        topic = broker.metadata.state.topics.get(name)
        topic_id = topic.topic_id if topic else None
    return name, topic_id


def _unknown_topic_error(name: str | None) -> ErrorCode:
    return ErrorCode.unknown_topic_id if name is None else ErrorCode.unknown_topic_or_partition


def _not_led(
    broker: DataBroker, name: str | None, partition: int, current_leader_epoch: int = NO_EPOCH
) -> KafkaError | None:
    """Why this broker may not serve a partition of a known topic: NOT_LEADER_OR_FOLLOWER
    when it does not lead it; for one it leads, a request's current leader epoch other
    than the leader's (Kafka's Partition.checkCurrentLeaderEpoch: older is
    FENCED_LEADER_EPOCH, newer UNKNOWN_LEADER_EPOCH, -1 is not checked). None for an
    unknown partition (the caller's UNKNOWN_TOPIC_OR_PARTITION) or one it may serve."""
    topic = broker.metadata.state.topics.get(name) if name is not None else None
    if topic is None or not 0 <= partition < topic.partitions:
        return None
    cluster = broker.cluster
    leader = cluster.leader(topic.topic_id, partition)
    if leader is None or not cluster.is_local(leader):
        return KafkaError(NOT_LEADER, not_leader_message(cluster.node_id, name, partition))
    if current_leader_epoch == NO_EPOCH or current_leader_epoch == leader.epoch:
        return None
    if current_leader_epoch < leader.epoch:
        return KafkaError(
            ErrorCode.fenced_leader_epoch,
            f"The request's leader epoch {current_leader_epoch} of {name}-{partition} is "
            f"older than the leader's, {leader.epoch}: refresh the metadata",
        )
    return KafkaError(
        ErrorCode.unknown_leader_epoch,
        f"The request's leader epoch {current_leader_epoch} of {name}-{partition} is "
        f"newer than the leader's, {leader.epoch}",
    )


class _Produced:
    """One partition's Produce outcome while the request is served (the acks=all
    wait may still turn it into an error)."""

    __slots__ = (
        "base_offset",
        "error_code",
        "error_message",
        "index",
        "leader",
        "log_append_time",
        "log_start_offset",
    )

    def __init__(self, index: int) -> None:
        self.index = index
        self.error_code = ErrorCode.none
        self.error_message: str | None = None
        self.base_offset = -1
        self.log_append_time = -1
        self.log_start_offset = -1
        # KIP-951's CurrentLeader (v10+), for NOT_LEADER_OR_FOLLOWER.
        self.leader = (-1, -1)

    def failed(self, exc: KafkaError) -> None:
        self.error_code, self.error_message = exc.code, exc.message


def _produce_response(
    version: int,
    topics: list[tuple[str | None, uuid.UUID | None, list[_Produced]]],
    leaders: CurrentLeaders,
) -> resp.produce_v12.ProduceResponse | resp.produce_v13.ProduceResponse:
    """Produce names its topics before v13 and gives their ids from v13 (KIP-516). From
    v10 (KIP-951) a partition answered NOT_LEADER_OR_FOLLOWER names its current leader,
    and NodeEndpoints where it is, as Kafka's KafkaApis.handleProduceRequest."""
    if version >= 10:
        for _, topic_id, parts in topics:
            for p in parts:
                if p.error_code == NOT_LEADER:
                    p.leader = leaders.current(topic_id, p.index)
    if version >= 13:
        m = resp.produce_v13
        return m.ProduceResponse(
            responses=tuple(
                m.TopicProduceResponse(
                    topic_id=topic_id,
                    partition_responses=tuple(
                        _produced_entry(m.PartitionProduceResponse, p)
                        if p.error_code != NOT_LEADER
                        else dataclasses.replace(
                            _produced_entry(m.PartitionProduceResponse, p),
                            current_leader=m.LeaderIdAndEpoch(
                                leader_id=BrokerId(p.leader[0]), leader_epoch=i32(p.leader[1])
                            ),
                        )
                        for p in parts
                    ),
                )
                for _, topic_id, parts in topics
            ),
            throttle_time=NO_THROTTLE,
            node_endpoints=leaders.endpoints(m.NodeEndpoint),
        )
    old = resp.produce_v12
    return old.ProduceResponse(
        responses=tuple(
            old.TopicProduceResponse(
                name=TopicName(name or ""),
                partition_responses=tuple(
                    _produced_entry(old.PartitionProduceResponse, p)
                    if p.error_code != NOT_LEADER
                    else dataclasses.replace(
                        _produced_entry(old.PartitionProduceResponse, p),
                        current_leader=old.LeaderIdAndEpoch(
                            leader_id=BrokerId(p.leader[0]), leader_epoch=i32(p.leader[1])
                        ),
                    )
                    for p in parts
                ),
            )
            for name, _, parts in topics
        ),
        throttle_time=NO_THROTTLE,
        node_endpoints=leaders.endpoints(old.NodeEndpoint),
    )


_EPOCH = datetime.datetime.fromtimestamp(0, datetime.UTC)

# Both eras' partition results have the same fields: one builder, checked for each.
PartitionProduced = TypeVar(
    "PartitionProduced",
    "resp.produce_v12.PartitionProduceResponse",
    "resp.produce_v13.PartitionProduceResponse",
)


def _produced_entry(cls: type[PartitionProduced], p: _Produced) -> PartitionProduced:
    return cls(
        index=i32(p.index),
        error_code=p.error_code,
        error_message=p.error_message,
        base_offset=i64(p.base_offset),
        # -1 (None on the wire) unless the topic uses LogAppendTime.
        log_append_time=None
        if p.log_append_time < 0
        else TZAware.parse(_EPOCH + datetime.timedelta(milliseconds=p.log_append_time)),
        log_start_offset=i64(p.log_start_offset),
        record_errors=(),
    )


def _has_transactional_records(req: ProduceRequest) -> bool:
    """Kafka's RequestUtils.hasTransactionalRecords: is any partition's first batch
    transactional? (A malformed one is left to the validation that follows.)"""
    for t in req.topic_data:
        for p in t.partition_data:
            try:
                for _, header in iter_batches(p.records or b"", validate=False):
                    if header.is_transactional:
                        return True
                    break
            except CorruptRecordError:
                continue
    return False


def _transactional_partitions(
    req: ProduceRequest, broker: DataBroker
) -> dict[tuple[str, int], tuple[int, int]]:
    """Each partition with transactional batches, with their producer id and epoch (the
    first transactional batch's, which the verification uses); a malformed partition is
    left to the validation that follows."""
    wanted: dict[tuple[str, int], tuple[int, int]] = {}
    for t in req.topic_data:
        name, _ = _topic_name(broker, t)
        if name is None:
            continue
        for p in t.partition_data:
            try:
                header = first_transactional(
                    h for _, h in iter_batches(p.records or b"", validate=False)
                )
            except CorruptRecordError:
                continue
            if header is not None:
                wanted[(name, p.index)] = (header.producer_id, header.producer_epoch)
    return wanted


async def produce(
    ctx: RequestContext, req: ProduceRequest, broker: DataBroker
) -> resp.produce_v12.ProduceResponse | resp.produce_v13.ProduceResponse | None:
    acks = req.acks
    timeout_s = max(req.timeout.total_seconds(), 0.001)
    az = broker.authorizer
    responses: list[tuple[str | None, uuid.UUID | None, list[_Produced]]] = []
    waits: list[tuple[_Produced, Partition, int]] = []
    if _has_transactional_records(req) and (
        req.transactional_id is None
        or not az.allows(
            ctx, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, req.transactional_id
        )
    ):
        # Kafka fails the whole request: every partition gets the error.
        denied = KafkaError(ErrorCode.transactional_id_authorization_failed)
        for t in req.topic_data:
            name, topic_id = _topic_name(broker, t)
            parts = [_Produced(p.index) for p in t.partition_data]
            for entry in parts:
                entry.failed(denied)
            responses.append((name, topic_id, parts))
        return _produce_answer(ctx, acks, responses, broker.cluster)
    verified: dict[tuple[str, int], ErrorCode] = {}
    if req.transactional_id is not None:
        # Asked before any append, all partitions at once: the coordinator may be on
        # another broker (KIP-890 part 1, Kafka's AddPartitionsToTxnManager).
        wanted = _transactional_partitions(req, broker)
        if wanted:
            verified = await verify_transactions(broker.txn_verifier, req.transactional_id, wanted)
    writable: dict[str, bool] = {}
    for t in req.topic_data:
        name, topic_id = _topic_name(broker, t)
        if name is not None and name not in writable:
            writable[name] = az.allows(ctx, AclOperation.WRITE, ResourceType.TOPIC, name)
        parts = []
        for p in t.partition_data:
            entry = _Produced(p.index)
            try:
                if acks not in (-1, 0, 1):
                    raise KafkaError(
                        ErrorCode.invalid_required_acks, f"acks must be -1, 0 or 1, got {acks}"
                    )
                if name is not None and not writable[name]:
                    raise KafkaError(ErrorCode.topic_authorization_failed)
                # Before the records are read: Kafka's leader checks them (LogValidator).
                not_led = _not_led(broker, name, p.index)
                if not_led is not None:
                    raise not_led
                part = broker.logs.get(name, p.index) if name else None
                if part is None:
                    raise broker.logs.not_leader(name, p.index) or KafkaError(
                        _unknown_topic_error(name),
                        f"This server does not host {name}-{p.index}",
                    )
                data, batches = validate_produce_data(p.records or b"")
                assert name is not None
                verify_produce(
                    verified,
                    req.transactional_id,
                    ctx.api_version,
                    name,
                    p.index,
                    [header for _, header in batches],
                )
                outcome = part.append(data, batches)
                entry.base_offset = outcome.base_offset
                entry.log_append_time = outcome.log_append_time
                entry.log_start_offset = outcome.log_start_offset
                if acks == -1:
                    waits.append((entry, part, outcome.last_offset))
            except KafkaError as exc:
                if exc.code == ErrorCode.corrupt_message:
                    log.warning(
                        "corrupt_batch",
                        topic=name,
                        partition=p.index,
                        client_id=ctx.header.client_id,
                        error=exc.message,
                    )
                entry.failed(exc)
            parts.append(entry)
        responses.append((name, topic_id, parts))
    if len(waits) == 1:
        # One partition (the usual produce): awaited in this task, not a gathered one.
        entry, part, last = waits[0]
        try:
            await part.wait_durable(last, timeout_s)
        except KafkaError as exc:  # not flushed in time, or the fsync failed
            entry.failed(exc)
    elif waits:
        results = await asyncio.gather(
            *(part.wait_durable(last, timeout_s) for _, part, last in waits),
            return_exceptions=True,
        )
        for (entry, _, _), result in zip(waits, results, strict=True):
            if isinstance(result, KafkaError):
                entry.failed(result)
            elif isinstance(result, BaseException):
                raise result
    return _produce_answer(ctx, acks, responses, broker.cluster)


def _produce_answer(
    ctx: RequestContext,
    acks: int,
    responses: list[tuple[str | None, uuid.UUID | None, list[_Produced]]],
    cluster: ClusterView,
) -> resp.produce_v12.ProduceResponse | resp.produce_v13.ProduceResponse | None:
    """The response; None for acks=0, unless a partition failed: then, as Kafka's
    KafkaApis.handleProduceRequest, the connection closes so that the producer, which
    waits for no answer, notices (and refreshes its metadata)."""
    leaders = CurrentLeaders(cluster, ctx.listener)
    if acks != 0:
        return _produce_response(ctx.api_version, responses, leaders)
    failed = [
        f"{topic_id if name is None else name}-{p.index}: {ErrorCode(p.error_code).name.upper()}"
        for name, topic_id, parts in responses
        for p in parts
        if p.error_code != ErrorCode.none
    ]
    if failed:
        raise CloseConnection(
            "error during a produce request with acks=0: " + ", ".join(failed),
            _produce_response(ctx.api_version, responses, leaders),
        )
    return None


def _has_session(req: FetchRequest) -> TypeIs[FetchSessionRequest]:
    """Fetch v7+ (KIP-227) carries a fetch session id and epoch."""
    return req.__version__ >= 7


async def fetch(
    ctx: RequestContext, req: FetchRequest, broker: DataBroker
) -> resp.fetch_v12.FetchResponse | resp.fetch_v18.FetchResponse:
    committed_only = req.isolation_level == READ_COMMITTED
    # MaxWaitMs on the broker's clock (its logs'), so tests drive the long poll with a
    # ManualClock.
    clock = broker.logs.clock
    deadline_ms = clock.now_ms() + max(round(req.max_wait.total_seconds() * 1000), 0)
    if _has_session(req) and (req.session_id != 0 or req.session_epoch > 0):
        # spool answers every fetch in full and never creates a fetch session
        # (KIP-227 allows session id 0); a client asking for one it was never
        # given gets Kafka's error and falls back to full fetches.
        return resp.fetch_v18.FetchResponse(
            throttle_time=NO_THROTTLE,
            error_code=ErrorCode.fetch_session_id_not_found,
            session_id=i32(0),
            responses=(),
        )
    wanted: list[_Wanted] = []
    readable: dict[str, bool] = {}
    # A follower's fetch (replica id >= 0) needs CLUSTER_ACTION instead of READ on each
    # topic; without it every partition is denied (KafkaApis).
    follower = _replica_id(req) >= 0
    replica_allowed = follower and broker.authorizer.allows(
        ctx, AclOperation.CLUSTER_ACTION, ResourceType.CLUSTER
    )
    for t in req.topics:
        name, topic_id = _topic_name(broker, t)
        if name is not None and name not in readable:
            readable[name] = (
                replica_allowed
                if follower
                else broker.authorizer.allows(ctx, AclOperation.READ, ResourceType.TOPIC, name)
            )
        denied = name is not None and not readable[name]
        for p in t.partitions:
            wanted.append(
                _Wanted(
                    name,
                    topic_id,
                    p.partition,
                    p.fetch_offset,
                    p.partition_max_bytes,
                    denied,
                    getattr(p, "current_leader_epoch", NO_EPOCH),  # v9+
                )
            )
    # Denied partitions are answered at once and wait for nothing: the others may still
    # wait for MinBytes, as Kafka waits for the partitions it may read.
    readable_any = any(not w.denied for w in wanted)
    while True:
        responses, total, errors = _fetch_once(
            broker.logs,
            req.max_bytes,
            wanted,
            committed_only,
            lambda w: _not_led(broker, w.name, w.partition, w.current_leader_epoch),
        )
        remaining_ms = deadline_ms - clock.now_ms()
        stopping = broker.logs.stopping  # shutdown: answer now, don't hold it up
        if total >= req.min_bytes or errors or remaining_ms <= 0 or not readable_any or stopping:
            break
        await _wait_for_data(broker.logs, wanted, remaining_ms / 1000)
    return _fetch_response(ctx.api_version, responses, CurrentLeaders(broker.cluster, ctx.listener))


def _replica_id(req: FetchRequest) -> int:
    """Who fetches: a broker's id (a follower) or -1 (a consumer); in ReplicaState from
    v15 (KIP-903)."""
    state = getattr(req, "replica_state", None)
    if state is not None:
        return int(state.replica_id)
    return int(getattr(req, "replica_id", -1))


FetchedTopics = dict[tuple[str | None, uuid.UUID | None], list["resp.fetch_v18.PartitionData"]]


def _fetch_response(
    version: int, topics: FetchedTopics, leaders: CurrentLeaders
) -> resp.fetch_v12.FetchResponse | resp.fetch_v18.FetchResponse:
    """Fetch names its topics before v13 and gives their ids from v13 (KIP-516). From
    v16 (KIP-951) a partition answered NOT_LEADER_OR_FOLLOWER or FENCED_LEADER_EPOCH
    names its current leader, and NodeEndpoints where it is (KafkaApis.handleFetchRequest)."""
    if version >= 13:
        m = resp.fetch_v18
        if version >= 16:
            topics = {
                key: [_with_leader(leaders, key[1], p) for p in parts]
                for key, parts in topics.items()
            }
        return m.FetchResponse(
            throttle_time=NO_THROTTLE,
            error_code=ErrorCode.none,
            session_id=i32(0),
            responses=tuple(
                m.FetchableTopicResponse(topic_id=topic_id, partitions=tuple(parts))
                for (_, topic_id), parts in topics.items()
            ),
            node_endpoints=leaders.endpoints(m.NodeEndpoint),
        )
    old = resp.fetch_v12
    return old.FetchResponse(
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        session_id=i32(0),
        responses=tuple(
            old.FetchableTopicResponse(
                topic=TopicName(name or ""),
                partitions=tuple(api.convert(p, old.PartitionData) for p in parts),
            )
            for (name, _), parts in topics.items()
        ),
    )


def _with_leader(
    leaders: CurrentLeaders, topic_id: uuid.UUID | None, p: resp.fetch_v18.PartitionData
) -> resp.fetch_v18.PartitionData:
    if p.error_code not in MOVED:
        return p
    leader_id, epoch = leaders.current(topic_id, p.partition_index, p.error_code)
    return dataclasses.replace(
        p,
        current_leader=resp.fetch_v18.LeaderIdAndEpoch(
            leader_id=BrokerId(leader_id), leader_epoch=i32(epoch)
        ),
    )


async def list_offsets(
    ctx: RequestContext, req: ListOffsetsRequest, broker: DataBroker
) -> resp.list_offsets_v11.ListOffsetsResponse:
    m = resp.list_offsets_v11
    isolation_level: int = getattr(req, "isolation_level", 0)  # v2+
    committed_only = isolation_level == READ_COMMITTED
    topics = []
    for t in req.topics:
        parts = []
        describable = broker.authorizer.allows(
            ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, t.name
        )
        for p in t.partitions:
            code, offset, ts, epoch = ErrorCode.none, -1, -1, 0
            part = broker.logs.get(t.name, p.partition_index)
            not_led = None
            if describable:
                # v4+ carries the client's leader epoch (KIP-320), checked as Fetch's.
                current = getattr(p, "current_leader_epoch", NO_EPOCH)
                not_led = _not_led(broker, t.name, p.partition_index, current)
            if not describable:
                # Kafka's error entry leaves the leader epoch unknown (-1).
                code, epoch = ErrorCode.topic_authorization_failed, -1
            elif not_led is not None:
                code, epoch = not_led.code, -1
            elif part is None:
                moved = broker.logs.not_leader(t.name, p.partition_index)
                code = ErrorCode.unknown_topic_or_partition if moved is None else moved.code
            else:
                offset, ts = _offset_for(part, p.timestamp, committed_only)
            parts.append(
                m.ListOffsetsPartitionResponse(
                    partition_index=p.partition_index,
                    error_code=code,
                    timestamp=i64(ts),
                    offset=i64(offset),
                    leader_epoch=i32(epoch),
                )
            )
        topics.append(m.ListOffsetsTopicResponse(name=t.name, partitions=tuple(parts)))
    return m.ListOffsetsResponse(throttle_time=NO_THROTTLE, topics=tuple(topics))


async def delete_records(
    ctx: RequestContext, req: DeleteRecordsRequest, broker: DataBroker
) -> resp.delete_records_v2.DeleteRecordsResponse:
    m = resp.delete_records_v2
    topics = []
    for t in req.topics:
        parts = []
        deletable = broker.authorizer.allows(ctx, AclOperation.DELETE, ResourceType.TOPIC, t.name)
        for p in t.partitions:
            low_watermark, code = -1, ErrorCode.none
            part = broker.logs.get(t.name, p.partition_index)
            try:
                if not deletable:
                    raise KafkaError(ErrorCode.topic_authorization_failed)
                not_led = _not_led(broker, t.name, p.partition_index)
                if not_led is not None:
                    raise not_led
                if part is None:
                    raise broker.logs.not_leader(t.name, p.partition_index) or KafkaError(
                        ErrorCode.unknown_topic_or_partition
                    )
                low_watermark = await part.delete_records_before(p.offset)
                log.info(
                    "records_deleted",
                    topic=t.name,
                    partition=p.partition_index,
                    log_start_offset=low_watermark,
                )
            except KafkaError as exc:
                code = exc.code
            parts.append(
                m.DeleteRecordsPartitionResult(
                    partition_index=p.partition_index,
                    low_watermark=i64(low_watermark),
                    error_code=code,
                )
            )
        topics.append(m.DeleteRecordsTopicResult(name=t.name, partitions=tuple(parts)))
    return m.DeleteRecordsResponse(throttle_time=NO_THROTTLE, topics=tuple(topics))


_NO_RECORDS = Records(b"")


def _fetch_once(
    logs: LogManager,
    max_bytes: int,
    wanted: list[_Wanted],
    committed_only: bool,
    refused: Callable[[_Wanted], KafkaError | None] = lambda _: None,
) -> tuple[FetchedTopics, int, bool]:
    """One read of every wanted partition; `refused` says why one may not be read here
    (another broker leads it, or the request's leader epoch is not the leader's)."""
    m = resp.fetch_v18
    budget = max_bytes
    total = 0
    errors = False
    by_topic: FetchedTopics = {}
    for w in wanted:
        # Leadership is looked at each round: a long poll woken later sees a move.
        not_led = None if w.denied else refused(w)
        part = logs.get(w.name, w.partition) if w.name and not w.denied else None
        if not_led is not None:
            # As Kafka's ReplicaManager.readFromLog answers an error: nothing known.
            entry = m.PartitionData(
                partition_index=i32(w.partition),
                error_code=not_led.code,
                high_watermark=i64(-1),
                last_stable_offset=i64(-1),
                log_start_offset=i64(-1),
                aborted_transactions=None,
                preferred_read_replica=BrokerId(-1),
                records=_NO_RECORDS,
            )
            errors = True
        elif part is None:
            moved = None if w.denied else logs.not_leader(w.name, w.partition)
            entry = m.PartitionData(
                partition_index=i32(w.partition),
                error_code=ErrorCode.topic_authorization_failed
                if w.denied
                else _unknown_topic_error(w.name)
                if moved is None
                else moved.code,
                high_watermark=i64(-1),
                last_stable_offset=i64(-1),
                log_start_offset=i64(-1),
                aborted_transactions=None,
                preferred_read_replica=BrokerId(-1),
                records=_NO_RECORDS,
            )
            errors = errors or not w.denied
        else:
            # KIP-74: the first partition returns at least one whole batch even past
            # max_bytes; later ones only what is left of the budget.
            limit = min(w.partition_max_bytes, budget)
            size = max(limit, 1) if total == 0 else limit
            code = ErrorCode.none
            try:
                data = (
                    part.read(w.fetch_offset, size, committed_only=committed_only)
                    if size > 0
                    else b""
                )
            except KafkaError as exc:
                code = exc.code
                errors = True
                data = b""
            aborted: tuple[resp.fetch_v18.AbortedTransaction, ...] | None = None
            if committed_only:
                aborted = _aborted_in(part, w.fetch_offset, data) if data else ()
            entry = m.PartitionData(
                partition_index=i32(w.partition),
                error_code=code,
                high_watermark=i64(part.high_watermark),
                last_stable_offset=i64(part.last_stable_offset),
                log_start_offset=i64(part.log_start_offset),
                aborted_transactions=aborted,
                preferred_read_replica=BrokerId(-1),
                records=Records(data),
            )
            total += len(data)
            budget = max(budget - len(data), 0)
        by_topic.setdefault((w.name, w.topic_id), []).append(entry)
    return by_topic, total, errors


def _aborted_in(
    part: Partition, fetch_offset: int, data: bytes
) -> tuple[resp.fetch_v18.AbortedTransaction, ...]:
    """The aborted transactions a read_committed consumer needs to drop the aborted
    records of `data`: those overlapping [fetch_offset, the offset after the last batch
    returned), as Kafka's LocalLog.addAbortedTransactions bounds them."""
    upper = fetch_offset
    for _, header in iter_batches(data, validate=False):
        upper = header.next_offset
    return tuple(
        resp.fetch_v18.AbortedTransaction(
            producer_id=ProducerId(txn.producer_id), first_offset=i64(txn.first_offset)
        )
        for txn in part.aborted_transactions(fetch_offset, upper)
    )


async def _wait_for_data(logs: LogManager, wanted: list[_Wanted], timeout_s: float) -> None:
    """Park until any fetched partition's high watermark or LSO moves, or the timeout."""
    parts = [logs.get(w.name, w.partition) for w in wanted if w.name and not w.denied]
    await wait_for_any([part for part in parts if part is not None], timeout_s, clock=logs.clock)


def _offset_for(part: Partition, timestamp: int, committed_only: bool) -> tuple[int, int]:
    """ListOffsets: (offset, timestamp) for a special or real target timestamp."""
    upper = part.last_stable_offset if committed_only else part.high_watermark
    if timestamp in (EARLIEST, EARLIEST_LOCAL):
        return part.log_start_offset, -1
    if timestamp == LATEST:
        return upper, -1
    if timestamp == LATEST_TIERED:
        return -1, -1
    if timestamp == MAX_TIMESTAMP:
        found = (
            part.log.max_timestamp_offset() if hasattr(part.log, "max_timestamp_offset") else None
        )
        if not found:
            return -1, -1
        offset, ts = found
        return (offset, ts) if offset < upper else (-1, -1)
    found = part.offset_for_timestamp(timestamp, committed_only=committed_only)
    return found if found is not None else (-1, -1)
