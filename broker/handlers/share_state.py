"""The share coordinator on the wire: Initialize/Read/Write/Delete ShareGroupState
and ReadShareGroupStateSummary (api keys 83-87).

Each is answered through the same `Persister` the in-process share-partition leader
uses, so the wire and in-process paths cannot disagree.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import structlog

from broker.server import RequestContext
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


class ShareStateBroker(Protocol):
    """What the share-state RPCs use of the broker: the share coordinator."""

    @property
    def share_persister(self) -> Persister: ...


class _Partition(Protocol):
    @property
    def partition(self) -> int: ...


# A request's partition entry (each RPC has its own kio class for it).
P = TypeVar("P", bound=_Partition)
# One partition's operation: the response fields it adds, or a KafkaError.
PartitionOp = Callable[[Persister, ShareStateKey, P], Awaitable[dict[str, Any]]]


async def _per_partition(
    persister: Persister,
    group_id: str,
    topics: Sequence[tuple[uuid.UUID | None, Sequence[P]]],
    op: PartitionOp[P],
) -> dict[str, Any]:
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
        return {"results": []}
    results = []
    for topic_id, partitions in topics:
        parts = []
        for p in partitions:
            entry: dict[str, Any] = {"partition": p.partition, "error_code": ErrorCode.none}
            try:
                if topic_id is None:
                    # kio reads the zero uuid as None; Kafka's share coordinator
                    # refuses a null topic id with INVALID_REQUEST.
                    raise KafkaError(ErrorCode.invalid_request, "The topic id cannot be null.")
                key = ShareStateKey(group_id, topic_id, p.partition)
                entry.update(await op(persister, key, p))
            except KafkaError as exc:
                # A failed durable write answers NOT_COORDINATOR, as Kafka's share
                # coordinator does; the caller retries.
                exc = for_coordinator_rpc(exc)
                entry.update(error_code=exc.code, error_message=exc.message)
            parts.append(entry)
        results.append({"topic_id": topic_id, "partitions": parts})
    return {"results": results}


async def initialize_share_group_state(
    ctx: RequestContext, req: InitializeShareGroupStateRequest, broker: ShareStateBroker
) -> dict[str, Any]:
    topics = [(t.topic_id, [p for p in t.partitions]) for t in req.topics]
    return await _per_partition(broker.share_persister, req.group_id, topics, _initialize)


async def _initialize(
    persister: Persister, key: ShareStateKey, p: InitializeStatePartition
) -> dict[str, Any]:
    await persister.initialize_state(key, p.state_epoch, p.start_offset)
    return {}


async def read_share_group_state(
    ctx: RequestContext, req: ReadShareGroupStateRequest, broker: ShareStateBroker
) -> dict[str, Any]:
    topics = [(t.topic_id, [p for p in t.partitions]) for t in req.topics]
    return await _per_partition(broker.share_persister, req.group_id, topics, _read)


async def _read(persister: Persister, key: ShareStateKey, p: ReadStatePartition) -> dict[str, Any]:
    state = await persister.read_state(key, p.leader_epoch)
    return {
        "state_epoch": state.state_epoch,
        "start_offset": state.start_offset,
        "state_batches": [b._asdict() for b in state.batches],
    }


async def write_share_group_state(
    ctx: RequestContext, req: WriteShareGroupStateRequest, broker: ShareStateBroker
) -> dict[str, Any]:
    # A comprehension, not list(): mypy keeps the union of the versions' entries.
    topics = [(t.topic_id, [p for p in t.partitions]) for t in req.topics]
    # Every partition's write is checked first, then all go out as one append and one
    # fsync (a request naming 500 partitions is one round, not 500).
    writes: list[StateWrite] = []
    slots: dict[int, int] = {}

    async def collect(
        persister: Persister, key: ShareStateKey, p: WriteStatePartition
    ) -> dict[str, Any]:
        write = _state_write(key, p)  # may refuse the partition (INVALID_REQUEST) first
        slots[id(p)] = len(writes)
        writes.append(write)
        return {}

    response = await _per_partition(broker.share_persister, req.group_id, topics, collect)
    if not writes:
        return response
    outcomes = await write_states(broker.share_persister, writes)
    for (_, partitions), result in zip(topics, response["results"], strict=True):
        for p, entry in zip(partitions, result["partitions"], strict=True):
            slot = slots.get(id(p))
            failure = None if slot is None else outcomes[slot]
            if isinstance(failure, KafkaError):
                exc = for_coordinator_rpc(failure)
                entry.update(error_code=exc.code, error_message=exc.message)
            elif failure is not None:
                raise failure
    return response


def _state_write(key: ShareStateKey, p: WriteStatePartition) -> StateWrite:
    batches = [
        PersistedBatch(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count)
        for b in p.state_batches
    ]
    for b in batches:
        if b.first_offset > b.last_offset or b.delivery_state not in (0, 2, 4):
            raise KafkaError(
                ErrorCode.invalid_request,
                f"State batch {b.first_offset}-{b.last_offset} with delivery state "
                f"{b.delivery_state} is not valid (states are 0, 2 and 4)",
            )
    # v1 (KIP-1226) carries the leader's DeliveryCompleteCount; v0 has none (-1, unknown).
    count = getattr(p, "delivery_complete_count", UNKNOWN_DELIVERY_COMPLETE_COUNT)
    return StateWrite(key, p.state_epoch, p.leader_epoch, p.start_offset, batches, count)


async def delete_share_group_state(
    ctx: RequestContext, req: DeleteShareGroupStateRequest, broker: ShareStateBroker
) -> dict[str, Any]:
    topics = [(t.topic_id, [p for p in t.partitions]) for t in req.topics]
    return await _per_partition(broker.share_persister, req.group_id, topics, _delete)


async def _delete(
    persister: Persister, key: ShareStateKey, p: DeleteStatePartition
) -> dict[str, Any]:
    await persister.delete_state(key)
    return {}


async def read_share_group_state_summary(
    ctx: RequestContext, req: ReadShareGroupStateSummaryRequest, broker: ShareStateBroker
) -> dict[str, Any]:
    topics = [(t.topic_id, [p for p in t.partitions]) for t in req.topics]
    return await _per_partition(broker.share_persister, req.group_id, topics, _read_summary)


async def _read_summary(
    persister: Persister, key: ShareStateKey, p: ReadStateSummaryPartition
) -> dict[str, Any]:
    state = await persister.read_summary(key)
    return {
        "state_epoch": state.state_epoch,
        "leader_epoch": state.leader_epoch,
        "start_offset": state.start_offset,
        # v1 only (build_response leaves it out of v0); -1 when not known.
        "delivery_complete_count": state.delivery_complete_count,
    }
