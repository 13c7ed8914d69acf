"""Produce, Fetch (with long poll), ListOffsets, DeleteRecords."""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import structlog

from broker.cluster import MetadataStore
from broker.handlers.transactions import verify_produce
from broker.logs import LogManager, Partition, validate_produce_data, wait_for_any
from broker.server import RequestContext
from coordinator.transactions import TransactionCoordinator
from protocol.errors import ErrorCode, KafkaError
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


class DataBroker(Protocol):
    """What the data handlers use of the broker: topic names and ids, partition logs."""

    @property
    def metadata(self) -> MetadataStore: ...
    @property
    def logs(self) -> LogManager: ...
    @property
    def transactions(self) -> TransactionCoordinator: ...


class _Wanted(NamedTuple):
    """A partition a Fetch asks for."""

    name: str | None
    topic_id: uuid.UUID | None
    partition: int
    fetch_offset: int
    partition_max_bytes: int


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


async def produce(
    ctx: RequestContext, req: ProduceRequest, broker: DataBroker
) -> dict[str, Any] | None:
    acks = req.acks
    timeout_s = max(req.timeout.total_seconds(), 0.001)
    responses = []
    waits: list[tuple[dict[str, Any], Partition, int]] = []
    for t in req.topic_data:
        name, topic_id = _topic_name(broker, t)
        parts = []
        for p in t.partition_data:
            entry: dict[str, Any] = {
                "index": p.index,
                "error_code": ErrorCode.none,
                "base_offset": -1,
                "log_append_time": -1,
                "log_start_offset": -1,
            }
            try:
                if acks not in (-1, 0, 1):
                    raise KafkaError(
                        ErrorCode.invalid_required_acks, f"acks must be -1, 0 or 1, got {acks}"
                    )
                part = broker.logs.get(name, p.index) if name else None
                if part is None:
                    raise KafkaError(
                        _unknown_topic_error(name),
                        f"This server does not host {name}-{p.index}",
                    )
                data, batches = validate_produce_data(p.records or b"")
                assert name is not None
                verify_produce(
                    broker.transactions,
                    req.transactional_id,
                    ctx.api_version,
                    name,
                    p.index,
                    [header for _, header in batches],
                )
                outcome = part.append(data, batches)
                entry.update(
                    base_offset=outcome.base_offset,
                    log_append_time=outcome.log_append_time,
                    log_start_offset=outcome.log_start_offset,
                )
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
                entry.update(error_code=exc.code, error_message=exc.message)
            parts.append(entry)
        responses.append({"name": name, "topic_id": topic_id, "partition_responses": parts})
    if len(waits) == 1:
        # One partition (the usual produce): awaited in this task, not a gathered one.
        entry, part, last = waits[0]
        try:
            await part.wait_durable(last, timeout_s)
        except KafkaError as exc:  # not flushed in time, or the fsync failed
            entry.update(error_code=exc.code, error_message=exc.message)
    elif waits:
        results = await asyncio.gather(
            *(part.wait_durable(last, timeout_s) for _, part, last in waits),
            return_exceptions=True,
        )
        for (entry, _, _), result in zip(waits, results, strict=True):
            if isinstance(result, KafkaError):
                entry.update(error_code=result.code, error_message=result.message)
            elif isinstance(result, BaseException):
                raise result
    if acks == 0:
        return None
    return {"responses": responses, "throttle_time": 0}


def _has_session(req: FetchRequest) -> TypeIs[FetchSessionRequest]:
    """Fetch v7+ (KIP-227) carries a fetch session id and epoch."""
    return req.__version__ >= 7


async def fetch(ctx: RequestContext, req: FetchRequest, broker: DataBroker) -> dict[str, Any]:
    committed_only = req.isolation_level == READ_COMMITTED
    # MaxWaitMs on the broker's clock (its logs'), so tests drive the long poll with a
    # ManualClock.
    clock = broker.logs.clock
    deadline_ms = clock.now_ms() + max(round(req.max_wait.total_seconds() * 1000), 0)
    if _has_session(req) and (req.session_id != 0 or req.session_epoch > 0):
        # spool answers every fetch in full and never creates a fetch session
        # (KIP-227 allows session id 0); a client asking for one it was never
        # given gets Kafka's error and falls back to full fetches.
        return {
            "error_code": ErrorCode.fetch_session_id_not_found,
            "session_id": 0,
            "responses": [],
        }
    wanted: list[_Wanted] = []
    for t in req.topics:
        name, topic_id = _topic_name(broker, t)
        for p in t.partitions:
            wanted.append(
                _Wanted(name, topic_id, p.partition, p.fetch_offset, p.partition_max_bytes)
            )
    while True:
        responses, total, errors = _fetch_once(broker.logs, req.max_bytes, wanted, committed_only)
        remaining_ms = deadline_ms - clock.now_ms()
        if total >= req.min_bytes or errors or remaining_ms <= 0 or not wanted:
            break
        await _wait_for_data(broker.logs, wanted, remaining_ms / 1000)
    return {
        "throttle_time": 0,
        "error_code": ErrorCode.none,
        "session_id": 0,
        "responses": responses,
    }


async def list_offsets(
    ctx: RequestContext, req: ListOffsetsRequest, broker: DataBroker
) -> dict[str, Any]:
    isolation_level: int = getattr(req, "isolation_level", 0)  # v2+
    committed_only = isolation_level == READ_COMMITTED
    topics = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            entry: dict[str, Any] = {
                "partition_index": p.partition_index,
                "error_code": ErrorCode.none,
                "timestamp": -1,
                "offset": -1,
                "leader_epoch": 0,
            }
            part = broker.logs.get(t.name, p.partition_index)
            if part is None:
                entry.update(error_code=ErrorCode.unknown_topic_or_partition)
            else:
                offset, ts = _offset_for(part, p.timestamp, committed_only)
                entry.update(offset=offset, timestamp=ts)
            parts.append(entry)
        topics.append({"name": t.name, "partitions": parts})
    return {"throttle_time": 0, "topics": topics}


async def delete_records(
    ctx: RequestContext, req: DeleteRecordsRequest, broker: DataBroker
) -> dict[str, Any]:
    topics = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            entry: dict[str, Any] = {
                "partition_index": p.partition_index,
                "low_watermark": -1,
                "error_code": ErrorCode.none,
            }
            part = broker.logs.get(t.name, p.partition_index)
            try:
                if part is None:
                    raise KafkaError(ErrorCode.unknown_topic_or_partition)
                entry["low_watermark"] = await part.delete_records_before(p.offset)
                log.info(
                    "records_deleted",
                    topic=t.name,
                    partition=p.partition_index,
                    log_start_offset=entry["low_watermark"],
                )
            except KafkaError as exc:
                entry["error_code"] = exc.code
            parts.append(entry)
        topics.append({"name": t.name, "partitions": parts})
    return {"throttle_time": 0, "topics": topics}


def _fetch_once(
    logs: LogManager, max_bytes: int, wanted: list[_Wanted], committed_only: bool
) -> tuple[list[dict[str, Any]], int, bool]:
    budget = max_bytes
    total = 0
    errors = False
    by_topic: dict[tuple[str | None, uuid.UUID | None], list[dict[str, Any]]] = {}
    for w in wanted:
        entry: dict[str, Any] = {
            "partition_index": w.partition,
            "error_code": ErrorCode.none,
            "high_watermark": -1,
            "last_stable_offset": -1,
            "log_start_offset": -1,
            "aborted_transactions": None,
            "preferred_read_replica": -1,
            "records": b"",
        }
        part = logs.get(w.name, w.partition) if w.name else None
        if part is None:
            entry["error_code"] = _unknown_topic_error(w.name)
            errors = True
        else:
            entry.update(
                high_watermark=part.high_watermark,
                last_stable_offset=part.last_stable_offset,
                log_start_offset=part.log_start_offset,
                aborted_transactions=[] if committed_only else None,
            )
            # KIP-74: the first partition returns at least one whole batch even past
            # max_bytes; later ones only what is left of the budget.
            limit = min(w.partition_max_bytes, budget)
            size = max(limit, 1) if total == 0 else limit
            try:
                data = (
                    part.read(w.fetch_offset, size, committed_only=committed_only)
                    if size > 0
                    else b""
                )
            except KafkaError as exc:
                entry["error_code"] = exc.code
                errors = True
                data = b""
            entry["records"] = data
            if committed_only and data:
                entry["aborted_transactions"] = _aborted_in(part, w.fetch_offset, data)
            total += len(data)
            budget = max(budget - len(data), 0)
        by_topic.setdefault((w.name, w.topic_id), []).append(entry)
    responses = [
        {"topic": name, "topic_id": topic_id, "partitions": parts}
        for (name, topic_id), parts in by_topic.items()
    ]
    return responses, total, errors


def _aborted_in(part: Partition, fetch_offset: int, data: bytes) -> list[dict[str, int]]:
    """The aborted transactions a read_committed consumer needs to drop the aborted
    records of `data`: those overlapping [fetch_offset, the offset after the last batch
    returned), as Kafka's LocalLog.addAbortedTransactions bounds them."""
    upper = fetch_offset
    for _, header in iter_batches(data, validate=False):
        upper = header.next_offset
    return [
        {"producer_id": txn.producer_id, "first_offset": txn.first_offset}
        for txn in part.aborted_transactions(fetch_offset, upper)
    ]


async def _wait_for_data(logs: LogManager, wanted: list[_Wanted], timeout_s: float) -> None:
    """Park until any fetched partition's high watermark or LSO moves, or the timeout."""
    parts = [logs.get(w.name, w.partition) for w in wanted if w.name]
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
