"""Transactions: InitProducerId with a transactional id, AddPartitionsToTxn,
AddOffsetsToTxn, TxnOffsetCommit, EndTxn, DescribeTransactions, ListTransactions, the
produce-side verification guard, and the markers EndTxn writes
(`coordinator.transactions` holds the state).

On a cluster, one broker leads the transactions log (broker.leadership): the others
answer its requests NOT_COORDINATOR, and the claimer COORDINATOR_LOAD_IN_PROGRESS while
it loads the log (coordinator.runtime's `begin_loading`), as Kafka's
TransactionStateManager does for a partition in `loadingPartitions`. ListTransactions
lists what the asked broker coordinates, none elsewhere: `spool transactions --list`
asks every broker, as kafka-transactions.sh does.

As Kafka 4.2 with transaction.version 1 (spool does not finalize transaction.version 2,
KIP-890 part 2): EndTxn is served up to v4, since v5 means an epoch bump per transaction;
AddPartitionsToTxn v4+ (the batched broker-to-broker form, with VerifyOnly) is served
as Kafka serves it, with version-1 semantics.

Offsets in a transaction (consume-transform-produce): AddOffsetsToTxn adds the group's
__consumer_offsets partition to the transaction, as Kafka does; TxnOffsetCommit checks
with the transaction coordinator that the producer's transaction holds it, then the
group coordinator stores the offsets as pending (coordinator.offsets); the transaction's
marker for that partition commits or drops them (`marker_writer`'s `complete_offsets`),
so they are visible exactly when the transaction's records are.

Authorization as Kafka 4.2's KafkaApis: each request needs WRITE on its transactional
id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED); AddPartitionsToTxn up to v3 WRITE on each
topic (a denied topic fails the transaction's request, the other partitions are
OPERATION_NOT_ATTEMPTED), v4+ CLUSTER_ACTION (only brokers send it); AddOffsetsToTxn
and TxnOffsetCommit READ on the group, TxnOffsetCommit READ on each topic.
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

import structlog
from kio.schema.types import ProducerId, TopicName, TransactionalId
from kio.static.primitive import TZAware, i16, i32, i32Timedelta

from broker.handlers import responses as resp
from broker.handlers.access import Guarded
from broker.handlers.responses import NO_THROTTLE
from broker.server import RequestContext
from coordinator.acls import AclOperation, ResourceType
from coordinator.group_coordinator import GroupCoordinator
from coordinator.offsets import PartitionCommit
from coordinator.runtime import for_coordinator_rpc
from coordinator.transactions import (
    OFFSETS_TOPIC,
    TopicPartition,
    TransactionCoordinator,
    offsets_partition,
)
from protocol import api
from protocol.errors import ErrorCode, KafkaError
from protocol.records import NO_PRODUCER_EPOCH, NO_PRODUCER_ID, BatchHeader

if TYPE_CHECKING:
    from typing_extensions import TypeIs

    from broker.handlers.requests import (
        AddOffsetsToTxnRequest,
        AddPartitionsToTxnBatchRequest,
        AddPartitionsToTxnRequest,
        DescribeTransactionsRequest,
        EndTxnRequest,
        InitProducerIdRequest,
        ListTransactionsRequest,
        TxnOffsetCommitRequest,
    )
    from broker.partitions import LogManager, Partition
    from coordinator.metadata import MetadataStore

log = structlog.get_logger("spool.transactions")

# How long EndTxn waits for a marker to be durable (Kafka's request.timeout.ms default,
# which bounds its marker requests).
MARKER_TIMEOUT_S = 30.0


class TxnBroker(Guarded, Protocol):
    """What the transaction handlers use of the broker."""

    @property
    def transactions(self) -> TransactionCoordinator: ...
    @property
    def groups(self) -> GroupCoordinator: ...
    @property
    def txn_verifier(self) -> ProduceVerifier: ...
    @property
    def metadata(self) -> MetadataStore: ...
    @property
    def logs(self) -> LogManager: ...


def _code(exc: KafkaError, version: int, fenced_from: int) -> ErrorCode:
    """The code a request of `version` gets for `exc`: a failed write is NOT_COORDINATOR
    (Kafka's coordinator services), and PRODUCER_FENCED is INVALID_PRODUCER_EPOCH for
    versions before `fenced_from`, which older clients do not know (KafkaApis)."""
    code = for_coordinator_rpc(exc).code
    if code == ErrorCode.producer_fenced and version < fenced_from:
        return ErrorCode.invalid_producer_epoch
    return code


def _log_refused(api: str, transactional_id: str | None, exc: KafkaError, client: str) -> None:
    log.info(
        "transaction_request_refused",
        api=api,
        transactional_id=transactional_id,
        error=exc.code.name,
        reason=exc.message,
        client_id=client,
    )


# ------------------------------------------------------------------ InitProducerId


async def init_transactional_producer_id(
    ctx: RequestContext, req: InitProducerIdRequest, broker: TxnBroker
) -> resp.init_producer_id_v5.InitProducerIdResponse:
    """InitProducerId with a transactional id (the idempotent path is in `cluster`)."""
    transactional_id = req.transactional_id
    assert transactional_id is not None
    producer_id: int = getattr(req, "producer_id", NO_PRODUCER_ID)  # v3+
    producer_epoch: int = getattr(req, "producer_epoch", NO_PRODUCER_EPOCH)  # v3+

    def answer(
        code: ErrorCode, pid: int = NO_PRODUCER_ID, epoch: int = NO_PRODUCER_EPOCH
    ) -> resp.init_producer_id_v5.InitProducerIdResponse:
        return resp.init_producer_id_v5.InitProducerIdResponse(
            throttle_time=NO_THROTTLE,
            error_code=code,
            producer_id=ProducerId(pid),
            producer_epoch=i16(epoch),
        )

    expected: tuple[int, int] | None = None
    if (producer_id == NO_PRODUCER_ID) != (producer_epoch == NO_PRODUCER_EPOCH):
        # Kafka refuses a producer id without an epoch and the other way round.
        return answer(ErrorCode.invalid_request)
    if producer_id != NO_PRODUCER_ID:
        expected = (producer_id, producer_epoch)
    timeout_ms = int(req.transaction_timeout.total_seconds() * 1000)
    try:
        pid, epoch = await broker.transactions.init_producer_id(
            transactional_id, timeout_ms, expected
        )
    except KafkaError as exc:
        _log_refused("InitProducerId", transactional_id, exc, ctx.header.client_id or "")
        return answer(_code(exc, ctx.api_version, 4))
    return answer(ErrorCode.none, pid, epoch)


# ------------------------------------------------------------------ AddPartitionsToTxn


def _partition_results(
    errors: dict[TopicPartition, ErrorCode],
) -> tuple[resp.add_partitions_to_txn_v5.AddPartitionsToTxnTopicResult, ...]:
    m = resp.add_partitions_to_txn_v5
    by_topic: dict[str, list[resp.add_partitions_to_txn_v5.AddPartitionsToTxnPartitionResult]]
    by_topic = {}
    for (topic, partition), code in errors.items():
        by_topic.setdefault(topic, []).append(
            m.AddPartitionsToTxnPartitionResult(
                partition_index=i32(partition), partition_error_code=code
            )
        )
    return tuple(
        m.AddPartitionsToTxnTopicResult(name=TopicName(topic), results_by_partition=tuple(parts))
        for topic, parts in by_topic.items()
    )


async def _add_one(
    broker: TxnBroker,
    transactional_id: str,
    producer_id: int,
    producer_epoch: int,
    topics: Any,
    *,
    verify_only: bool,
    version: int,
    client: str,
    ctx: RequestContext | None = None,
) -> dict[TopicPartition, ErrorCode]:
    """One transaction's partitions: their error codes (Kafka's
    handleAddPartitionsToTxnRequest for one transaction). With `ctx` (a client's
    request, v3 and before) the transactional id and the topics are authorized."""
    wanted = [(t.name, int(p)) for t in topics for p in t.partitions]
    denied: set[str] = set()
    if ctx is not None:
        az = broker.authorizer
        if not az.allows(ctx, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id):
            return dict.fromkeys(wanted, ErrorCode.transactional_id_authorization_failed)
        names = sorted({name for name, _ in wanted})
        denied = set(names) - set(
            az.filter(ctx, AclOperation.WRITE, ResourceType.TOPIC, names, log_denied=True)
        )
    # Known to the cluster's metadata (Kafka's metadataCache.contains): on a cluster the
    # partition is usually led by another broker than the transaction coordinator.
    topics = broker.metadata.state.topics
    unknown = {
        (name, index)
        for name, index in wanted
        if name not in denied
        and name != OFFSETS_TOPIC
        and (name not in topics or not 0 <= index < topics[name].partitions)
    }
    if unknown or denied:
        # Any denied or unknown partition fails the whole request; the others were not
        # attempted.
        return {
            tp: ErrorCode.topic_authorization_failed
            if tp[0] in denied
            else ErrorCode.unknown_topic_or_partition
            if tp in unknown
            else ErrorCode.operation_not_attempted
            for tp in wanted
        }
    coordinator = broker.transactions
    if verify_only:
        try:
            # Kafka's handleVerifyPartitionsInTransaction: NOT_COORDINATOR, or
            # COORDINATOR_LOAD_IN_PROGRESS while the transactions log loads here.
            coordinator.runtime.check_led()
        except KafkaError as exc:
            return dict.fromkeys(wanted, exc.code)
        return coordinator.verify(transactional_id, producer_id, producer_epoch, wanted)
    try:
        await coordinator.add_partitions(transactional_id, producer_id, producer_epoch, wanted)
    except KafkaError as exc:
        _log_refused("AddPartitionsToTxn", transactional_id, exc, client)
        return dict.fromkeys(wanted, _code(exc, version, 2))
    return dict.fromkeys(wanted, ErrorCode.none)


def _batched(req: AddPartitionsToTxnRequest) -> TypeIs[AddPartitionsToTxnBatchRequest]:
    """AddPartitionsToTxn v4+ (KIP-890) is the batched broker-to-broker form."""
    return req.__version__ >= 4


async def add_partitions_to_txn(
    ctx: RequestContext, req: AddPartitionsToTxnRequest, broker: TxnBroker
) -> (
    resp.add_partitions_to_txn_v3.AddPartitionsToTxnResponse
    | resp.add_partitions_to_txn_v5.AddPartitionsToTxnResponse
):
    client = ctx.header.client_id or ""
    if not _batched(req):
        errors = await _add_one(
            broker,
            req.v3_and_below_transactional_id,
            req.v3_and_below_producer_id,
            req.v3_and_below_producer_epoch,
            req.v3_and_below_topics,
            verify_only=False,
            version=ctx.api_version,
            client=client,
            ctx=ctx,
        )
        v3 = resp.add_partitions_to_txn_v3
        return v3.AddPartitionsToTxnResponse(
            throttle_time=NO_THROTTLE,
            results_by_topic_v3_and_below=tuple(
                api.convert(topic, v3.AddPartitionsToTxnTopicResult)
                for topic in _partition_results(errors)
            ),
        )
    transactions: list[Any] = list(req.transactions)  # v4 or v5 entries, same fields
    m = resp.add_partitions_to_txn_v5
    if not broker.authorizer.allows(ctx, AclOperation.CLUSTER_ACTION, ResourceType.CLUSTER):
        # Brokers send the batched form: anyone else fails as a whole.
        return m.AddPartitionsToTxnResponse(
            throttle_time=NO_THROTTLE,
            error_code=ErrorCode.cluster_authorization_failed,
            results_by_transaction=(),
        )
    results = await asyncio.gather(
        *(
            _add_one(
                broker,
                t.transactional_id,
                t.producer_id,
                t.producer_epoch,
                t.topics,
                verify_only=t.verify_only,
                version=ctx.api_version,
                client=client,
            )
            for t in transactions
        )
    )
    return m.AddPartitionsToTxnResponse(
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        results_by_transaction=tuple(
            m.AddPartitionsToTxnResult(
                transactional_id=TransactionalId(t.transactional_id),
                topic_results=_partition_results(errors),
            )
            for t, errors in zip(transactions, results, strict=True)
        ),
    )


# ------------------------------------------------------------------ offsets in a transaction


async def add_offsets_to_txn(
    ctx: RequestContext, req: AddOffsetsToTxnRequest, broker: TxnBroker
) -> resp.add_offsets_to_txn_v4.AddOffsetsToTxnResponse:
    partition = (OFFSETS_TOPIC, offsets_partition(req.group_id))
    code = ErrorCode.none
    az = broker.authorizer
    try:
        if not az.allows(
            ctx, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, req.transactional_id
        ):
            code = ErrorCode.transactional_id_authorization_failed
        elif not az.allows(ctx, AclOperation.READ, ResourceType.GROUP, req.group_id):
            code = ErrorCode.group_authorization_failed
        else:
            await broker.transactions.add_partitions(
                req.transactional_id, req.producer_id, req.producer_epoch, [partition]
            )
    except KafkaError as exc:
        _log_refused("AddOffsetsToTxn", req.transactional_id, exc, ctx.header.client_id or "")
        code = _code(exc, ctx.api_version, 2)
    return resp.add_offsets_to_txn_v4.AddOffsetsToTxnResponse(
        throttle_time=NO_THROTTLE, error_code=code
    )


async def txn_offset_commit(
    ctx: RequestContext, req: TxnOffsetCommitRequest, broker: TxnBroker
) -> resp.txn_offset_commit_v5.TxnOffsetCommitResponse:
    m = resp.txn_offset_commit_v5
    az = broker.authorizer
    denied = None
    if not az.allows(ctx, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, req.transactional_id):
        denied = ErrorCode.transactional_id_authorization_failed
    elif not az.allows(ctx, AclOperation.READ, ResourceType.GROUP, req.group_id):
        denied = ErrorCode.group_authorization_failed
    if denied is not None:
        # Kafka fails every partition of the request with it.
        return m.TxnOffsetCommitResponse(
            throttle_time=NO_THROTTLE,
            topics=tuple(
                m.TxnOffsetCommitResponseTopic(
                    name=t.name,
                    partitions=tuple(
                        m.TxnOffsetCommitResponsePartition(
                            partition_index=p.partition_index, error_code=denied
                        )
                        for p in t.partitions
                    ),
                )
                for t in req.topics
            ),
        )
    # Unknown topics and partitions, and topics the principal may not read, are
    # answered on their own (KafkaApis); the rest go to the group coordinator.
    errors: dict[tuple[str, int], ErrorCode] = {}
    wanted: list[PartitionCommit] = []
    for t in req.topics:
        known = broker.metadata.state.topics.get(t.name)
        readable = az.allows(ctx, AclOperation.READ, ResourceType.TOPIC, t.name)
        for p in t.partitions:
            index = int(p.partition_index)
            if not readable:
                errors[(t.name, index)] = ErrorCode.topic_authorization_failed
            elif known is None or not 0 <= index < known.partitions:
                errors[(t.name, index)] = ErrorCode.unknown_topic_or_partition
            else:
                wanted.append(
                    PartitionCommit(
                        t.name,
                        index,
                        int(p.committed_offset),
                        int(getattr(p, "committed_leader_epoch", -1)),
                        p.committed_metadata,
                    )
                )
    generation: int = getattr(req, "generation_id", -1)  # v3+
    failed: ErrorCode | None = None
    if wanted:
        # The producer's transaction must hold the group's __consumer_offsets partition
        # (AddOffsetsToTxn), at its epoch: Kafka's group coordinator verifies this with
        # the transaction coordinator before it writes, on its broker or another's
        # (AddPartitionsToTxn VerifyOnly, as a partition leader verifies a produce).
        partition = (OFFSETS_TOPIC, offsets_partition(req.group_id))
        verified = (
            await broker.txn_verifier.verify(
                req.transactional_id, req.producer_id, req.producer_epoch, [partition]
            )
        )[partition]
        if verified != ErrorCode.none:
            failed = verified
            if verified == ErrorCode.producer_fenced:
                failed = ErrorCode.invalid_producer_epoch
            elif verified == ErrorCode.transaction_abortable and ctx.api_version < 5:
                failed = ErrorCode.invalid_txn_state
            log.info(
                "txn_offset_commit_refused",
                group=req.group_id,
                transactional_id=req.transactional_id,
                error=failed.name,
                reason="the group's offsets are not part of the producer's transaction",
            )
        else:
            try:
                outcomes = await broker.groups.commit_transactional_offsets(
                    req.group_id,
                    getattr(req, "member_id", ""),
                    getattr(req, "group_instance_id", None),
                    generation,
                    req.producer_id,
                    req.producer_epoch,
                    wanted,
                    api_version=ctx.api_version,
                )
            except KafkaError as exc:
                _log_refused(
                    "TxnOffsetCommit", req.transactional_id, exc, ctx.header.client_id or ""
                )
                failed = exc.code
            else:
                for commit, code in outcomes:
                    errors[(commit.topic, commit.partition)] = code
    if failed is not None:
        for commit in wanted:
            errors[(commit.topic, commit.partition)] = failed
    return m.TxnOffsetCommitResponse(
        throttle_time=NO_THROTTLE,
        topics=tuple(
            m.TxnOffsetCommitResponseTopic(
                name=t.name,
                partitions=tuple(
                    m.TxnOffsetCommitResponsePartition(
                        partition_index=p.partition_index,
                        error_code=errors.get((t.name, int(p.partition_index)), ErrorCode.none),
                    )
                    for p in t.partitions
                ),
            )
            for t in req.topics
        ),
    )


# ------------------------------------------------------------------ EndTxn


async def end_txn(
    ctx: RequestContext, req: EndTxnRequest, broker: TxnBroker
) -> resp.end_txn_v4.EndTxnResponse:
    code = ErrorCode.none
    try:
        if not broker.authorizer.allows(
            ctx, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, req.transactional_id
        ):
            code = ErrorCode.transactional_id_authorization_failed
        else:
            await broker.transactions.end_txn(
                req.transactional_id, req.producer_id, req.producer_epoch, req.committed
            )
    except KafkaError as exc:
        _log_refused("EndTxn", req.transactional_id, exc, ctx.header.client_id or "")
        code = _code(exc, ctx.api_version, 2)
    return resp.end_txn_v4.EndTxnResponse(throttle_time=NO_THROTTLE, error_code=code)


# ------------------------------------------------------------------ DescribeTransactions


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


async def describe_transactions(
    ctx: RequestContext, req: DescribeTransactionsRequest, broker: TxnBroker
) -> resp.describe_transactions_v0.DescribeTransactionsResponse:
    """Each transactional id's state, as Kafka's handleDescribeTransactionsRequest: DESCRIBE
    on the id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED), then the coordinator's answer,
    NOT_COORDINATOR on a broker that does not lead the transactions log (the admin
    client asks the id's coordinator, FindCoordinator), COORDINATOR_LOAD_IN_PROGRESS
    while this one loads it; the partitions of topics the principal may not DESCRIBE
    are left out."""
    m = resp.describe_transactions_v0
    az = broker.authorizer

    def failed(transactional_id: str, code: ErrorCode) -> Any:
        # Kafka sets only the id and the error: the other fields keep their zero defaults.
        return m.TransactionState(
            error_code=code,
            transactional_id=TransactionalId(transactional_id),
            transaction_state="",
            transaction_timeout=i32Timedelta.parse(datetime.timedelta(0)),
            transaction_start_time=TZAware.parse(_EPOCH),
            producer_id=ProducerId(0),
            producer_epoch=i16(0),
            topics=(),
        )

    states = []
    for transactional_id in req.transactional_ids:
        if not az.allows(
            ctx, AclOperation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, transactional_id
        ):
            states.append(failed(transactional_id, ErrorCode.transactional_id_authorization_failed))
            continue
        try:
            t = broker.transactions.describe_transaction(transactional_id)
        except KafkaError as exc:
            states.append(failed(transactional_id, exc.code))
            continue
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(t.partitions):
            by_topic.setdefault(topic, []).append(partition)
        visible = set(az.filter(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, sorted(by_topic)))
        states.append(
            m.TransactionState(
                error_code=ErrorCode.none,
                transactional_id=TransactionalId(transactional_id),
                transaction_state=t.state.state_name,
                transaction_timeout=i32Timedelta.parse(
                    datetime.timedelta(milliseconds=t.txn_timeout_ms)
                ),
                # -1 before the first transaction, as Kafka sends it (kio's type
                # checks a timestamp on reading only).
                transaction_start_time=cast(
                    TZAware, _EPOCH + datetime.timedelta(milliseconds=t.txn_start_ms)
                ),
                producer_id=ProducerId(t.producer_id),
                producer_epoch=i16(t.producer_epoch),
                topics=tuple(
                    m.TopicData(topic=TopicName(topic), partitions=tuple(i32(p) for p in parts))
                    for topic, parts in by_topic.items()
                    if topic in visible
                ),
            )
        )
    return m.DescribeTransactionsResponse(
        throttle_time=NO_THROTTLE, transaction_states=tuple(states)
    )


# ------------------------------------------------------------------ ListTransactions


async def list_transactions(
    ctx: RequestContext, req: ListTransactionsRequest, broker: TxnBroker
) -> resp.list_transactions_v2.ListTransactionsResponse:
    """The transactions this broker coordinates, as Kafka's handleListTransactionsRequest:
    only those of the transactions log it leads (none elsewhere: the admin client and
    kafka-transactions.sh ask every broker and merge), COORDINATOR_LOAD_IN_PROGRESS
    while it loads it, and only ids the principal may DESCRIBE. v1 adds the duration
    filter (KIP-994), v2 the transactional id pattern (KIP-1152)."""
    m = resp.list_transactions_v2
    try:
        listed = broker.transactions.list_transactions(
            states=list(req.state_filters),
            producer_ids={int(pid) for pid in req.producer_id_filters},
            min_duration_ms=int(getattr(req, "duration_filter", -1)),  # v1+
            pattern=getattr(req, "transactional_id_pattern", None),  # v2+
        )
    except KafkaError as exc:
        log.info(
            "list_transactions_refused",
            error=exc.code.name,
            reason=exc.message,
            client_id=ctx.header.client_id or "",
        )
        return m.ListTransactionsResponse(
            throttle_time=NO_THROTTLE, error_code=exc.code, transaction_states=()
        )
    ids = [t.transactional_id for t in listed.transactions]
    allowed = set(
        broker.authorizer.filter(ctx, AclOperation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, ids)
    )
    return m.ListTransactionsResponse(
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        unknown_state_filters=listed.unknown_state_filters,
        transaction_states=tuple(
            m.TransactionState(
                transactional_id=TransactionalId(t.transactional_id),
                producer_id=ProducerId(t.producer_id),
                transaction_state=t.state.state_name,
            )
            for t in listed.transactions
            if t.transactional_id in allowed
        ),
    )


# ------------------------------------------------------------------ markers


class MarkerLogs(Protocol):
    def get(self, topic: str, index: int) -> Partition | None: ...


CompleteOffsets = Callable[[int, bool, frozenset[int]], Awaitable[None]]


def marker_writer(logs: MarkerLogs, complete_offsets: CompleteOffsets | None = None) -> Any:
    """A MarkerWriter over this broker's partitions only (tests, a broker's logs
    alone; a broker uses `broker.txn_markers.MarkerChannel`, which sends the markers of
    partitions other brokers lead to them): one control batch per partition of the
    transaction, returning once all are durable. The
    __consumer_offsets partitions go to the group coordinator (`complete_offsets`: the
    transaction's pending offsets of those partitions' groups are committed or dropped).

    Skipped: partitions with no log here (a deleted topic, whose markers Kafka drops
    too), and a partition that has seen a newer epoch of the producer
    (INVALID_PRODUCER_EPOCH: Kafka's marker handler gives that partition up).
    """

    async def write(
        producer_id: int, producer_epoch: int, commit: bool, partitions: frozenset[TopicPartition]
    ) -> None:
        waits: list[tuple[Partition, int]] = []
        offsets = frozenset(index for topic, index in partitions if topic == OFFSETS_TOPIC)
        if offsets and complete_offsets is not None:
            await complete_offsets(producer_id, commit, offsets)
        for topic, index in sorted(partitions):
            if topic == OFFSETS_TOPIC:
                continue
            part = logs.get(topic, index)
            if part is None:
                log.warning("marker_partition_gone", topic=topic, partition=index)
                continue
            try:
                outcome = part.append_marker(
                    producer_id, producer_epoch, commit=commit, coordinator_epoch=0
                )
            except KafkaError as exc:
                if exc.code != ErrorCode.invalid_producer_epoch:
                    raise
                log.warning(
                    "marker_skipped_newer_epoch",
                    topic=topic,
                    partition=index,
                    producer_id=producer_id,
                    producer_epoch=producer_epoch,
                    error=exc.message,
                )
                continue
            waits.append((part, outcome.last_offset))
        await asyncio.gather(*(part.wait_durable(last, MARKER_TIMEOUT_S) for part, last in waits))

    return write


# ------------------------------------------------------------------ produce verification


class ProduceVerifier(Protocol):
    """The transaction coordinator's answer on transactional produce, wherever it is
    (`broker.txn_markers.ProduceVerifier`: this broker's coordinator, or the
    coordinator's broker over AddPartitionsToTxn v4+ VerifyOnly)."""

    async def verify(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Sequence[TopicPartition],
    ) -> dict[TopicPartition, ErrorCode]: ...


def first_transactional(headers: Iterable[BatchHeader]) -> BatchHeader | None:
    """The batch whose producer id and epoch a partition's verification uses."""
    return next((h for h in headers if h.is_transactional and not h.is_control), None)


async def verify_transactions(
    verifier: ProduceVerifier,
    transactional_id: str,
    wanted: Mapping[TopicPartition, tuple[int, int]],
) -> dict[TopicPartition, ErrorCode]:
    """Verify a produce request's transactional partitions (partition -> producer id
    and epoch of its batches) at once: one question per producer id and epoch, which a
    remote coordinator answers in one request."""
    by_producer: dict[tuple[int, int], list[TopicPartition]] = {}
    for tp, producer in wanted.items():
        by_producer.setdefault(producer, []).append(tp)
    found: dict[TopicPartition, ErrorCode] = {}
    for (producer_id, producer_epoch), tps in by_producer.items():
        found.update(await verifier.verify(transactional_id, producer_id, producer_epoch, tps))
    return found


def verify_produce(
    verified: Mapping[TopicPartition, ErrorCode],
    transactional_id: str | None,
    produce_version: int,
    topic: str,
    partition: int,
    headers: list[BatchHeader],
) -> None:
    """Refuse transactional batches for a partition outside the producer's ongoing
    transaction, as Kafka's verification guard does (KIP-890 part 1), given what the
    coordinator answered (`verify_transactions`): PRODUCER_FENCED becomes
    INVALID_PRODUCER_EPOCH, and TRANSACTION_ABORTABLE is INVALID_TXN_STATE for Produce
    versions before 11, which do not know it (AddPartitionsToTxnManager)."""
    header = first_transactional(headers)
    if header is None:
        return
    if transactional_id is None:
        raise KafkaError(
            ErrorCode.transactional_id_authorization_failed,
            "Transactional records need the request's transactional id",
        )
    found = verified.get((topic, partition), ErrorCode.invalid_txn_state)
    if found == ErrorCode.none:
        return
    reason = {
        ErrorCode.transaction_abortable: "is not part of its ongoing transaction "
        "(AddPartitionsToTxn first)",
        ErrorCode.producer_fenced: "comes from a fenced epoch",
        ErrorCode.concurrent_transactions: "arrived while its transaction is completing",
        ErrorCode.network_exception: "could not be verified: the transaction "
        "coordinator's broker did not answer",
        ErrorCode.coordinator_not_available: "could not be verified: no broker leads "
        "the transaction coordinator's log",
    }.get(found, f"failed verification ({found.name})")
    code = found
    if found == ErrorCode.producer_fenced:
        code = ErrorCode.invalid_producer_epoch
    elif found == ErrorCode.transaction_abortable and produce_version <= 10:
        code = ErrorCode.invalid_txn_state
    raise KafkaError(
        code,
        f"The transactional batch of producer {header.producer_id} epoch "
        f"{header.producer_epoch} (transactional id {transactional_id}) for "
        f"{topic}-{partition} {reason}",
    )
