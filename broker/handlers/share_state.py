"""The share coordinator on the wire: Initialize/Read/Write/Delete ShareGroupState
and ReadShareGroupStateSummary (api keys 83-87).

Each is answered through the same `Persister` the in-process share-partition leader
uses, so the wire and in-process paths cannot disagree.

Only brokers and super users may call them: they need CLUSTER_ACTION on the cluster,
and anyone else gets CLUSTER_AUTHORIZATION_FAILED on every partition named, as Kafka
4.2's KafkaApis answers (`toGlobalErrorResponse`), before anything is read or written.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

import structlog
from kio.static.primitive import i8, i16, i32, i64

from broker.handlers import responses as resp
from broker.handlers.access import CLUSTER_DENIED, Guarded
from broker.server import RequestContext
from coordinator.acls import AclOperation, ResourceType
from coordinator.runtime import for_coordinator_rpc
from coordinator.share_persister import StateWrite, write_states
from coordinator.share_state import (
    PersistedBatch,
    Persister,
    ShareStateKey,
)
from persister.share_records import UNKNOWN_DELIVERY_COMPLETE_COUNT
from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from broker.handlers.requests import (
        DeleteShareGroupStateRequest,
        DeleteStatePartition,
        InitializeShareGroupStateRequest,
        InitializeStatePartition,
        ReadShareGroupStateRequest,
        ReadShareGroupStateSummaryRequest,
        ReadStatePartition,
        ReadStateSummaryPartition,
        WriteShareGroupStateRequest,
        WriteStatePartition,
    )

log = structlog.get_logger("spool.share_coordinator")


class ShareStateBroker(Guarded, Protocol):
    """What the share-state RPCs use of the broker: the share coordinator."""

    @property
    def share_persister(self) -> Persister: ...


class _Partition(Protocol):
    @property
    def partition(self) -> int: ...


# A request's partition entry (each RPC has its own kio class for it).
P = TypeVar("P", bound=_Partition)
# A response's partition result (each RPC has its own kio class for it).
R = TypeVar("R")
# One topic's partition results, in the request's order.
Results = list[tuple[uuid.UUID | None, list[R]]]


async def _per_partition(
    persister: Persister,
    group_id: str,
    topics: Sequence[tuple[uuid.UUID | None, Sequence[P]]],
    op: Callable[[Persister, ShareStateKey, P], Awaitable[R]],
    failed: Callable[[int, KafkaError], R],
    ctx: RequestContext,
    broker: ShareStateBroker,
) -> Results[R]:
    """`op` on each partition: its result, or `failed`'s for the KafkaError it raised;
    `failed`'s for CLUSTER_AUTHORIZATION_FAILED on every partition if the requester
    may not call the share coordinator."""
    if not broker.authorizer.allows(ctx, AclOperation.CLUSTER_ACTION, ResourceType.CLUSTER):
        denied = KafkaError(ErrorCode.cluster_authorization_failed, CLUSTER_DENIED)
        return [
            (topic_id, [failed(p.partition, denied) for p in partitions])
            for topic_id, partitions in topics
        ]
    # Kafka's ShareCoordinatorService answers an empty response (no results at all)
    # when the group id is empty, or when the request names no topic or a topic with
    # no partitions.
    if not group_id or not topics or any(not partitions for _, partitions in topics):
        log.info(
            "share_state_request_ignored",
            group=group_id,
            topics=len(topics),
            reason="empty group id, topics or partitions",
        )
        return []
    results: Results[R] = []
    for topic_id, partitions in topics:
        parts = []
        for p in partitions:
            try:
                if topic_id is None:
                    # kio reads the zero uuid as None; Kafka's share coordinator
                    # refuses a null topic id with INVALID_REQUEST.
                    raise KafkaError(ErrorCode.invalid_request, "The topic id cannot be null.")
                key = ShareStateKey(group_id, topic_id, p.partition)
                entry = await op(persister, key, p)
            except KafkaError as exc:
                # A failed durable write answers NOT_COORDINATOR, as Kafka's share
                # coordinator does; the caller retries.
                entry = failed(p.partition, for_coordinator_rpc(exc))
            parts.append(entry)
        results.append((topic_id, parts))
    return results


async def initialize_share_group_state(
    ctx: RequestContext, req: InitializeShareGroupStateRequest, broker: ShareStateBroker
) -> resp.initialize_share_group_state_v0.InitializeShareGroupStateResponse:
    m = resp.initialize_share_group_state_v0
    topics = [(t.topic_id, [p for p in t.partitions]) for t in req.topics]
    results = await _per_partition(
        broker.share_persister, req.group_id, topics, _initialize, _initialize_failed, ctx, broker
    )
    return m.InitializeShareGroupStateResponse(
        results=tuple(
            m.InitializeStateResult(topic_id=topic_id, partitions=tuple(parts))
            for topic_id, parts in results
        )
    )


async def _initialize(
    persister: Persister, key: ShareStateKey, p: InitializeStatePartition
) -> resp.initialize_share_group_state_v0.PartitionResult:
    await persister.initialize_state(key, p.state_epoch, p.start_offset)
    return resp.initialize_share_group_state_v0.PartitionResult(
        partition=p.partition, error_code=ErrorCode.none
    )


def _initialize_failed(
    partition: int, exc: KafkaError
) -> resp.initialize_share_group_state_v0.PartitionResult:
    return resp.initialize_share_group_state_v0.PartitionResult(
        partition=i32(partition), error_code=exc.code, error_message=exc.message
    )


async def read_share_group_state(
    ctx: RequestContext, req: ReadShareGroupStateRequest, broker: ShareStateBroker
) -> resp.read_share_group_state_v0.ReadShareGroupStateResponse:
    m = resp.read_share_group_state_v0
    topics = [(t.topic_id, [p for p in t.partitions]) for t in req.topics]
    results = await _per_partition(
        broker.share_persister, req.group_id, topics, _read, _read_failed, ctx, broker
    )
    return m.ReadShareGroupStateResponse(
        results=tuple(
            m.ReadStateResult(topic_id=topic_id, partitions=tuple(parts))
            for topic_id, parts in results
        )
    )


async def _read(
    persister: Persister, key: ShareStateKey, p: ReadStatePartition
) -> resp.read_share_group_state_v0.PartitionResult:
    m = resp.read_share_group_state_v0
    state = await persister.read_state(key, p.leader_epoch)
    return m.PartitionResult(
        partition=p.partition,
        error_code=ErrorCode.none,
        state_epoch=i32(state.state_epoch),
        start_offset=i64(state.start_offset),
        state_batches=tuple(
            m.StateBatch(
                first_offset=i64(b.first_offset),
                last_offset=i64(b.last_offset),
                delivery_state=i8(b.delivery_state),
                delivery_count=i16(b.delivery_count),
            )
            for b in state.batches
        ),
    )


def _read_failed(partition: int, exc: KafkaError) -> resp.read_share_group_state_v0.PartitionResult:
    return resp.read_share_group_state_v0.PartitionResult(
        partition=i32(partition),
        error_code=exc.code,
        error_message=exc.message,
        state_epoch=i32(0),
        start_offset=i64(0),
        state_batches=(),
    )


async def write_share_group_state(
    ctx: RequestContext, req: WriteShareGroupStateRequest, broker: ShareStateBroker
) -> resp.write_share_group_state_v1.WriteShareGroupStateResponse:
    m = resp.write_share_group_state_v1
    # A comprehension, not list(): mypy keeps the union of the versions' entries.
    topics = [(t.topic_id, [p for p in t.partitions]) for t in req.topics]
    # Every partition's write is checked first, then all go out as one append and one
    # fsync (a request naming 500 partitions is one round, not 500).
    writes: list[StateWrite] = []
    slots: dict[int, int] = {}

    async def collect(
        persister: Persister, key: ShareStateKey, p: WriteStatePartition
    ) -> resp.write_share_group_state_v1.PartitionResult:
        write = _state_write(key, p)  # may refuse the partition (INVALID_REQUEST) first
        slots[id(p)] = len(writes)
        writes.append(write)
        return m.PartitionResult(partition=p.partition, error_code=ErrorCode.none)

    def failed(partition: int, exc: KafkaError) -> resp.write_share_group_state_v1.PartitionResult:
        return m.PartitionResult(
            partition=i32(partition), error_code=exc.code, error_message=exc.message
        )

    results = await _per_partition(
        broker.share_persister, req.group_id, topics, collect, failed, ctx, broker
    )
    if writes:
        outcomes = await write_states(broker.share_persister, writes)
        for (_, partitions), (_, parts) in zip(topics, results, strict=True):
            for i, p in enumerate(partitions):
                slot = slots.get(id(p))
                failure = None if slot is None else outcomes[slot]
                if isinstance(failure, KafkaError):
                    parts[i] = failed(p.partition, for_coordinator_rpc(failure))
                elif failure is not None:
                    raise failure
    return m.WriteShareGroupStateResponse(
        results=tuple(
            m.WriteStateResult(topic_id=topic_id, partitions=tuple(parts))
            for topic_id, parts in results
        )
    )


def _state_write(key: ShareStateKey, p: WriteStatePartition) -> StateWrite:
    batches = [
        PersistedBatch(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count)
        for b in p.state_batches
    ]
    for b in batches:
        if b.first_offset > b.last_offset or b.delivery_state not in (0, 2, 3, 4):
            raise KafkaError(
                ErrorCode.invalid_request,
                f"State batch {b.first_offset}-{b.last_offset} with delivery state "
                f"{b.delivery_state} is not valid (states are 0, 2, 3 and 4)",
            )
    # v1 (KIP-1226) carries the leader's DeliveryCompleteCount; v0 has none (-1, unknown).
    count = getattr(p, "delivery_complete_count", UNKNOWN_DELIVERY_COMPLETE_COUNT)
    return StateWrite(key, p.state_epoch, p.leader_epoch, p.start_offset, batches, count)


async def delete_share_group_state(
    ctx: RequestContext, req: DeleteShareGroupStateRequest, broker: ShareStateBroker
) -> resp.delete_share_group_state_v0.DeleteShareGroupStateResponse:
    m = resp.delete_share_group_state_v0
    topics = [(t.topic_id, [p for p in t.partitions]) for t in req.topics]
    results = await _per_partition(
        broker.share_persister, req.group_id, topics, _delete, _delete_failed, ctx, broker
    )
    return m.DeleteShareGroupStateResponse(
        results=tuple(
            m.DeleteStateResult(topic_id=topic_id, partitions=tuple(parts))
            for topic_id, parts in results
        )
    )


async def _delete(
    persister: Persister, key: ShareStateKey, p: DeleteStatePartition
) -> resp.delete_share_group_state_v0.PartitionResult:
    await persister.delete_state(key)
    return resp.delete_share_group_state_v0.PartitionResult(
        partition=p.partition, error_code=ErrorCode.none
    )


def _delete_failed(
    partition: int, exc: KafkaError
) -> resp.delete_share_group_state_v0.PartitionResult:
    return resp.delete_share_group_state_v0.PartitionResult(
        partition=i32(partition), error_code=exc.code, error_message=exc.message
    )


async def read_share_group_state_summary(
    ctx: RequestContext, req: ReadShareGroupStateSummaryRequest, broker: ShareStateBroker
) -> resp.read_share_group_state_summary_v1.ReadShareGroupStateSummaryResponse:
    m = resp.read_share_group_state_summary_v1
    topics = [(t.topic_id, [p for p in t.partitions]) for t in req.topics]
    results = await _per_partition(
        broker.share_persister,
        req.group_id,
        topics,
        _read_summary,
        _read_summary_failed,
        ctx,
        broker,
    )
    return m.ReadShareGroupStateSummaryResponse(
        results=tuple(
            m.ReadStateSummaryResult(topic_id=topic_id, partitions=tuple(parts))
            for topic_id, parts in results
        )
    )


async def _read_summary(
    persister: Persister, key: ShareStateKey, p: ReadStateSummaryPartition
) -> resp.read_share_group_state_summary_v1.PartitionResult:
    state = await persister.read_summary(key)
    return resp.read_share_group_state_summary_v1.PartitionResult(
        partition=p.partition,
        error_code=ErrorCode.none,
        state_epoch=i32(state.state_epoch),
        leader_epoch=i32(state.leader_epoch),
        start_offset=i64(state.start_offset),
        # v1 only (converting to v0 drops it); -1 when not known.
        delivery_complete_count=i32(state.delivery_complete_count),
    )


def _read_summary_failed(
    partition: int, exc: KafkaError
) -> resp.read_share_group_state_summary_v1.PartitionResult:
    return resp.read_share_group_state_summary_v1.PartitionResult(
        partition=i32(partition),
        error_code=exc.code,
        error_message=exc.message,
        state_epoch=i32(0),
        leader_epoch=i32(0),
        start_offset=i64(0),
    )
