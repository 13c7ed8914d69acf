"""ApiVersions, Metadata, DescribeCluster, FindCoordinator, InitProducerId."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import structlog

from broker.cluster import Topic
from broker.handlers.topics import TopicStores, auto_create_topic
from broker.handlers.transactions import TxnBroker, init_transactional_producer_id
from broker.server import Endpoint, RequestContext
from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from typing_extensions import TypeIs

    from broker.handlers.requests import (
        ApiVersionsRequest,
        DescribeClusterRequest,
        FindCoordinatorBatchRequest,
        FindCoordinatorRequest,
        InitProducerIdRequest,
        MetadataRequest,
    )

log = structlog.get_logger("spool.handlers")

# KIP-932: share groups are on when the `share.version` feature is finalized at 1.
FEATURES = [("share.version", 0, 1, 1)]
# "Not requested" value for authorized-operations fields.
AUTHORIZED_OPERATIONS_OMITTED = -(2**31)


class ClusterBroker(TopicStores, TxnBroker, Protocol):
    """What the cluster handlers use of the broker (and Metadata's auto-creation)."""

    @property
    def node_id(self) -> int: ...
    @property
    def cluster_id(self) -> str: ...
    @property
    def advertised(self) -> Endpoint: ...
    def api_version_entries(self) -> list[dict[str, int]]: ...


async def api_versions(
    ctx: RequestContext, req: ApiVersionsRequest, broker: ClusterBroker
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "error_code": ErrorCode.none,
        "api_keys": broker.api_version_entries(),
        "throttle_time": 0,
    }
    if ctx.api_version >= 3:
        data["supported_features"] = [
            {"name": name, "min_version": lo, "max_version": hi} for name, lo, hi, _ in FEATURES
        ]
        data["finalized_features_epoch"] = 1
        data["finalized_features"] = [
            {"name": name, "min_version_level": level, "max_version_level": level}
            for name, _, _, level in FEATURES
        ]
    return data


async def metadata(
    ctx: RequestContext, req: MetadataRequest, broker: ClusterBroker
) -> dict[str, Any]:
    state = broker.metadata.state
    version = ctx.api_version
    requested = req.topics
    allow_auto: bool = getattr(req, "allow_auto_topic_creation", True)  # v4+
    wanted: list[tuple[str | None, Any]]
    if requested is None or (version == 0 and not requested):
        wanted = [(t.name, None) for t in sorted(state.topics.values(), key=lambda t: t.name)]
    else:
        wanted = [(t.name, getattr(t, "topic_id", None)) for t in requested]  # ids v10+
    topics = []
    for name, topic_id in wanted:
        if name is None and (topic_id is None or version < 12):
            # Kafka refuses a topic with neither name nor id, and ids before v12.
            topics.append(
                {
                    "error_code": ErrorCode.invalid_request,
                    "name": None if version >= 12 else "",
                    "topic_id": topic_id,
                }
            )
            continue
        if name is None and topic_id is not None:
            topic = state.topics_by_id.get(topic_id)
            if topic is None:
                topics.append(
                    {
                        "error_code": ErrorCode.unknown_topic_id,
                        "name": None,
                        "topic_id": topic_id,
                    }
                )
                continue
        else:
            topic = state.topics.get(name or "")
        if topic is None:
            assert name is not None
            if allow_auto and broker.config.get("auto.create.topics.enable"):
                try:
                    topic = await auto_create_topic(broker, name)
                except KafkaError as exc:
                    topics.append({"error_code": exc.code, "name": name})
                    continue
            else:
                topics.append({"error_code": ErrorCode.unknown_topic_or_partition, "name": name})
                continue
        topics.append(_topic_entry(broker.node_id, topic))
    return {
        "throttle_time": 0,
        "brokers": [_broker_entry(broker, "node_id")],
        "cluster_id": broker.cluster_id,
        "controller_id": broker.node_id,
        "topics": topics,
        "cluster_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
    }


async def describe_cluster(
    ctx: RequestContext, req: DescribeClusterRequest, broker: ClusterBroker
) -> dict[str, Any]:
    endpoint_type: int = getattr(req, "endpoint_type", 1)  # v1+; 1 is BROKERS
    if endpoint_type not in (1, 2):
        return {
            "error_code": ErrorCode.unsupported_endpoint_type,
            "error_message": f"Unknown endpoint type {endpoint_type}",
        }
    return {
        "error_code": ErrorCode.none,
        "endpoint_type": endpoint_type,
        "cluster_id": broker.cluster_id,
        "controller_id": broker.node_id,
        "brokers": [_broker_entry(broker, "broker_id")],
        "cluster_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
    }


def _batched(req: FindCoordinatorRequest) -> TypeIs[FindCoordinatorBatchRequest]:
    """FindCoordinator v4+ (KIP-699) asks for several coordinators at once."""
    return req.__version__ >= 4


async def find_coordinator(
    ctx: RequestContext, req: FindCoordinatorRequest, broker: ClusterBroker
) -> dict[str, Any]:
    # A single node coordinates every group, transaction and share partition.
    ep = broker.advertised
    key_type: int = getattr(req, "key_type", 0)  # v1+; 0 is GROUP
    if key_type not in (0, 1, 2):
        code, message = ErrorCode.invalid_request, f"Unknown coordinator key type {key_type}"
    else:
        code, message = ErrorCode.none, None
    node = broker.node_id if code == ErrorCode.none else -1
    if _batched(req):
        return {
            "coordinators": [
                {
                    "key": key,
                    "node_id": node,
                    "host": ep.host,
                    "port": ep.port,
                    "error_code": code,
                    "error_message": message,
                }
                for key in req.coordinator_keys
            ]
        }
    return {
        "error_code": code,
        "error_message": message,
        "node_id": node,
        "host": ep.host,
        "port": ep.port,
    }


async def init_producer_id(
    ctx: RequestContext, req: InitProducerIdRequest, broker: ClusterBroker
) -> dict[str, Any]:
    if req.transactional_id is not None:
        return await init_transactional_producer_id(ctx, req, broker)
    producer_id: int = getattr(req, "producer_id", -1)  # v3+
    producer_epoch: int = getattr(req, "producer_epoch", -1)  # v3+
    # KIP-360: an idempotent producer may bump its epoch to reset sequences.
    if producer_id >= 0 and producer_epoch < 32766:
        return {
            "error_code": ErrorCode.none,
            "producer_id": producer_id,
            "producer_epoch": producer_epoch + 1,
        }
    pid = await broker.metadata.allocate_producer_id()
    return {"error_code": ErrorCode.none, "producer_id": pid, "producer_epoch": 0}


def _broker_entry(broker: ClusterBroker, id_field: str) -> dict[str, Any]:
    """This broker as Metadata (`node_id`) or DescribeCluster (`broker_id`) lists it."""
    ep = broker.advertised
    return {
        id_field: broker.node_id,
        "host": ep.host,
        "port": ep.port,
        "rack": broker.config.get("broker.rack"),
    }


def _topic_entry(node: int, topic: Topic) -> dict[str, Any]:
    return {
        "error_code": ErrorCode.none,
        "name": topic.name,
        "topic_id": topic.topic_id,
        "is_internal": False,
        "partitions": [
            {
                "error_code": ErrorCode.none,
                "partition_index": i,
                "leader_id": node,
                "leader_epoch": 0,
                "replica_nodes": [node],
                "isr_nodes": [node],
                "offline_replicas": [],
            }
            for i in range(topic.partitions)
        ],
        "topic_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
    }
