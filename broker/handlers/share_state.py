"""The share coordinator on the wire: Initialize/Read/Write/Delete ShareGroupState
and ReadShareGroupStateSummary (api keys 83-87).

Each is answered through the same `Persister` the in-process share-partition leader
uses, so the wire and in-process paths cannot disagree.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import structlog

from broker.server import RequestContext
from coordinator.runtime import for_coordinator_rpc
from coordinator.share_state import PersistedBatch, ShareStateKey
from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from broker.broker import Broker

log = structlog.get_logger("spool.share_coordinator")

PartitionOp = Callable[[ShareStateKey, Any], Awaitable[dict[str, Any]]]


def register(broker: Broker) -> None:
    async def per_partition(req: Any, op: PartitionOp) -> dict[str, Any]:
        # Kafka's ShareCoordinatorService answers an empty response (no results at all)
        # when the group id is empty, or when the request names no topic or a topic with
        # no partitions.
        if not req.group_id or not req.topics or any(not t.partitions for t in req.topics):
            log.info(
                "share_state_request_ignored",
                group=req.group_id,
                topics=len(req.topics or ()),
                reason="empty group id, topics or partitions",
            )
            return {"results": []}
        results = []
        for t in req.topics:
            parts = []
            for p in t.partitions:
                entry: dict[str, Any] = {"partition": p.partition, "error_code": ErrorCode.none}
                try:
                    if t.topic_id is None:
                        # kio reads the zero uuid as None; Kafka's share coordinator
                        # refuses a null topic id with INVALID_REQUEST.
                        raise KafkaError(ErrorCode.invalid_request, "The topic id cannot be null.")
                    entry.update(await op(ShareStateKey(req.group_id, t.topic_id, p.partition), p))
                except KafkaError as exc:
                    # A failed durable write answers NOT_COORDINATOR, as Kafka's share
                    # coordinator does; the caller retries.
                    exc = for_coordinator_rpc(exc)
                    entry.update(error_code=exc.code, error_message=exc.message)
                parts.append(entry)
            results.append({"topic_id": t.topic_id, "partitions": parts})
        return {"results": results}

    async def initialize(ctx: RequestContext, req: Any) -> dict[str, Any]:
        async def op(key: ShareStateKey, p: Any) -> dict[str, Any]:
            await broker.share_persister.initialize_state(key, p.state_epoch, p.start_offset)
            return {}

        return await per_partition(req, op)

    async def read(ctx: RequestContext, req: Any) -> dict[str, Any]:
        async def op(key: ShareStateKey, p: Any) -> dict[str, Any]:
            state = await broker.share_persister.read_state(key, p.leader_epoch)
            return {
                "state_epoch": state.state_epoch,
                "start_offset": state.start_offset,
                "state_batches": [b._asdict() for b in state.batches],
            }

        return await per_partition(req, op)

    async def write(ctx: RequestContext, req: Any) -> dict[str, Any]:
        async def op(key: ShareStateKey, p: Any) -> dict[str, Any]:
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
            await broker.share_persister.write_state(
                key, p.state_epoch, p.leader_epoch, p.start_offset, batches
            )
            return {}

        return await per_partition(req, op)

    async def delete(ctx: RequestContext, req: Any) -> dict[str, Any]:
        async def op(key: ShareStateKey, p: Any) -> dict[str, Any]:
            await broker.share_persister.delete_state(key)
            return {}

        return await per_partition(req, op)

    async def summary(ctx: RequestContext, req: Any) -> dict[str, Any]:
        async def op(key: ShareStateKey, p: Any) -> dict[str, Any]:
            state = await broker.share_persister.read_summary(key)
            return {
                "state_epoch": state.state_epoch,
                "leader_epoch": state.leader_epoch,
                "start_offset": state.start_offset,
                # v1: spool keeps no delivery-complete count; -1 is Kafka's "unknown".
                "delivery_complete_count": -1,
            }

        return await per_partition(req, op)

    broker.table.register(83, 0, 0, initialize)
    broker.table.register(84, 0, 0, read)
    broker.table.register(85, 0, 1, write)
    broker.table.register(86, 0, 0, delete)
    broker.table.register(87, 0, 1, summary)
