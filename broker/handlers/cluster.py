"""ApiVersions, Metadata, DescribeCluster, FindCoordinator, InitProducerId."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import structlog

from broker.handlers.topics import auto_create_topic
from broker.server import RequestContext
from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from broker.broker import Broker

log = structlog.get_logger("spool.handlers")

# KIP-932: share groups are on when the `share.version` feature is finalized at 1.
FEATURES = [("share.version", 0, 1, 1)]
# "Not requested" value for authorized-operations fields.
AUTHORIZED_OPERATIONS_OMITTED = -(2**31)


def register(broker: Broker) -> None:
    async def api_versions(ctx: RequestContext, req: Any) -> dict[str, Any]:
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

    async def metadata(ctx: RequestContext, req: Any) -> dict[str, Any]:
        state = broker.metadata.state
        version = ctx.api_version
        requested = req.topics
        allow_auto = getattr(req, "allow_auto_topic_creation", True)
        if requested is None or (version == 0 and not requested):
            wanted: list[tuple[str | None, Any]] = [
                (t.name, None) for t in sorted(state.topics.values(), key=lambda t: t.name)
            ]
        else:
            wanted = [(t.name, getattr(t, "topic_id", None)) for t in requested]
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
                    topics.append(
                        {"error_code": ErrorCode.unknown_topic_or_partition, "name": name}
                    )
                    continue
            topics.append(_topic_entry(broker, topic))
        return {
            "throttle_time": 0,
            "brokers": [broker.broker_entry()],
            "cluster_id": broker.cluster_id,
            "controller_id": broker.node_id,
            "topics": topics,
            "cluster_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
        }

    async def describe_cluster(ctx: RequestContext, req: Any) -> dict[str, Any]:
        endpoint_type = getattr(req, "endpoint_type", 1)
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
            "brokers": [broker.broker_entry()],
            "cluster_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
        }

    async def find_coordinator(ctx: RequestContext, req: Any) -> dict[str, Any]:
        # A single node coordinates every group, transaction and share partition.
        ep = broker.advertised
        key_type = getattr(req, "key_type", 0)
        if key_type not in (0, 1, 2):
            code, message = ErrorCode.invalid_request, f"Unknown coordinator key type {key_type}"
        else:
            code, message = ErrorCode.none, None
        node = broker.node_id if code == ErrorCode.none else -1
        if ctx.api_version >= 4:
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

    async def init_producer_id(ctx: RequestContext, req: Any) -> dict[str, Any]:
        if req.transactional_id is not None:
            log.warning(
                "transactions_unsupported",
                transactional_id=req.transactional_id,
                client_id=ctx.header.client_id,
            )
            return {
                "error_code": ErrorCode.transactional_id_authorization_failed,
                "producer_id": -1,
                "producer_epoch": -1,
            }
        producer_id = getattr(req, "producer_id", -1)
        producer_epoch = getattr(req, "producer_epoch", -1)
        # KIP-360: an idempotent producer may bump its epoch to reset sequences.
        if producer_id >= 0 and producer_epoch < 32766:
            return {
                "error_code": ErrorCode.none,
                "producer_id": producer_id,
                "producer_epoch": producer_epoch + 1,
            }
        pid = await broker.metadata.allocate_producer_id()
        return {"error_code": ErrorCode.none, "producer_id": pid, "producer_epoch": 0}

    broker.table.register(18, 0, 4, api_versions)
    broker.table.register(3, 0, 13, metadata)
    broker.table.register(60, 0, 2, describe_cluster)
    broker.table.register(10, 0, 6, find_coordinator)
    # v6 (KIP-939) is latestVersionUnstable in Kafka 4.2: a default broker stops at v5.
    broker.table.register(22, 0, 5, init_producer_id)


def _topic_entry(broker: Broker, topic: Any) -> dict[str, Any]:
    node = broker.node_id
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
