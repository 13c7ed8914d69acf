"""WriteTxnMarkers (API 27): a transaction coordinator on another broker asks this
partition leader to end a transaction on its partitions (broker.txn_markers sends it).

As Kafka 4.2's KafkaApis.handleWriteTxnMarkersRequest: only brokers and super users may
send it (CLUSTER_ACTION on the cluster, else CLUSTER_AUTHORIZATION_FAILED on every
partition, nothing written); each marker's partitions get a COMMIT or ABORT control
batch carrying the coordinator epoch, which the partition checks against the last
marker's (TRANSACTION_COORDINATOR_FENCED) as it checks the producer epoch
(INVALID_PRODUCER_EPOCH). A partition not in the metadata is UNKNOWN_TOPIC_OR_PARTITION,
one this broker does not lead NOT_LEADER_OR_FOLLOWER (the coordinator sends it again to
the current leader); the answer comes once every written marker is durable (the
partition's last stable offset has moved past the transaction), a marker not durable
in time being REQUEST_TIMED_OUT and a failed write KAFKA_STORAGE_ERROR, both retried by
the coordinator. For `__consumer_offsets` partitions the group coordinator commits or
drops the transaction's pending offsets of their groups (TxnOffsetCommit); a broker not
leading the groups log answers NOT_COORDINATOR, and the coordinator sends them again
to the one that does.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol

import structlog
from kio.schema.types import ProducerId, TopicName
from kio.static.primitive import i32

from broker.handlers import responses as resp
from broker.handlers.access import Guarded
from broker.server import RequestContext
from coordinator.acls import AclOperation, ResourceType
from coordinator.runtime import for_coordinator_rpc
from coordinator.transactions import OFFSETS_TOPIC
from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from broker.handlers.requests import WriteTxnMarkersRequest
    from broker.partitions import LogManager, Partition
    from coordinator.group_coordinator import GroupCoordinator
    from coordinator.metadata import MetadataStore

log = structlog.get_logger("spool.transactions")

# How long a marker waits to be durable (Kafka's request.timeout.ms default, which
# bounds the coordinator's marker requests).
MARKER_DURABLE_TIMEOUT_S = 30.0


class MarkersBroker(Guarded, Protocol):
    """What WriteTxnMarkers uses of the broker: the metadata and the partition logs."""

    @property
    def metadata(self) -> MetadataStore: ...
    @property
    def logs(self) -> LogManager: ...
    @property
    def groups(self) -> GroupCoordinator: ...


def _append(
    broker: MarkersBroker, topic: str, index: int, marker: Any, transaction_version: int
) -> tuple[Partition, int] | ErrorCode:
    """Append one marker: the partition and the marker's offset, or the error code."""
    known = broker.metadata.state.topics.get(topic)
    if known is None or not 0 <= index < known.partitions:
        return ErrorCode.unknown_topic_or_partition
    part = broker.logs.get(topic, index)
    if part is None:
        return ErrorCode.not_leader_or_follower
    try:
        written = part.append_marker(
            int(marker.producer_id),
            int(marker.producer_epoch),
            commit=bool(marker.transaction_result),
            coordinator_epoch=int(marker.coordinator_epoch),
            transaction_version=transaction_version,
        )
    except KafkaError as exc:
        log.info(
            "marker_refused",
            topic=topic,
            partition=index,
            producer_id=int(marker.producer_id),
            producer_epoch=int(marker.producer_epoch),
            coordinator_epoch=int(marker.coordinator_epoch),
            error=exc.code.name,
            reason=exc.message,
        )
        return exc.code
    return part, written.last_offset


async def _complete_offsets(
    broker: MarkersBroker, marker: Any, partitions: frozenset[int]
) -> ErrorCode:
    """The group coordinator's side of a marker for __consumer_offsets partitions."""
    try:
        await broker.groups.complete_transaction(
            int(marker.producer_id), bool(marker.transaction_result), partitions
        )
    except KafkaError as exc:
        return for_coordinator_rpc(exc).code
    return ErrorCode.none


async def _durable(part: Partition, last: int) -> ErrorCode:
    try:
        await part.wait_durable(last, MARKER_DURABLE_TIMEOUT_S)
    except KafkaError as exc:
        return exc.code
    return ErrorCode.none


async def write_txn_markers(
    ctx: RequestContext, req: WriteTxnMarkersRequest, broker: MarkersBroker
) -> resp.write_txn_markers_v2.WriteTxnMarkersResponse:
    m = resp.write_txn_markers_v2
    allowed = broker.authorizer.allows(ctx, AclOperation.CLUSTER_ACTION, ResourceType.CLUSTER)
    if not allowed:
        log.warning("write_txn_markers_denied", client_id=ctx.header.client_id)
    # Per marker, per topic, per partition: a code now, or a durability wait.
    layout: list[tuple[Any, list[tuple[str, list[tuple[int, ErrorCode | int]]]]]] = []
    waits: list[Any] = []
    for marker in req.markers:
        version = int(getattr(marker, "transaction_version", 0))  # v2+
        topics = []
        for t in marker.topics:
            parts: list[tuple[int, ErrorCode | int]] = []
            if allowed and str(t.name) == OFFSETS_TOPIC:
                # One completion for the topic's partitions: each gets its outcome.
                parts = [(int(index), len(waits)) for index in t.partition_indexes]
                waits.append(_complete_offsets(broker, marker, frozenset(i for i, _ in parts)))
                topics.append((str(t.name), parts))
                continue
            for index in t.partition_indexes:
                if not allowed:
                    parts.append((int(index), ErrorCode.cluster_authorization_failed))
                    continue
                done = _append(broker, str(t.name), int(index), marker, version)
                if isinstance(done, ErrorCode):
                    parts.append((int(index), done))
                else:
                    parts.append((int(index), len(waits)))  # the wait's position
                    waits.append(_durable(*done))
            topics.append((str(t.name), parts))
        layout.append((marker, topics))
    durable: list[ErrorCode] = list(await asyncio.gather(*waits)) if waits else []

    def code(found: ErrorCode | int) -> ErrorCode:
        return found if isinstance(found, ErrorCode) else durable[found]

    return m.WriteTxnMarkersResponse(
        markers=tuple(
            m.WritableTxnMarkerResult(
                producer_id=ProducerId(int(marker.producer_id)),
                topics=tuple(
                    m.WritableTxnMarkerTopicResult(
                        name=TopicName(name),
                        partitions=tuple(
                            m.WritableTxnMarkerPartitionResult(
                                partition_index=i32(index), error_code=code(found)
                            )
                            for index, found in parts
                        ),
                    )
                    for name, parts in topics
                ),
            )
            for marker, topics in layout
        )
    )
