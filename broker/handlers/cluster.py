"""ApiVersions, Metadata, DescribeCluster, FindCoordinator, InitProducerId."""

from __future__ import annotations

import datetime
import uuid
from typing import TYPE_CHECKING, Protocol

import structlog
from kio.schema.types import BrokerId, ProducerId, TopicName
from kio.static.primitive import i8, i16, i32, i64, i64Timedelta

from broker.handlers import responses as resp
from broker.handlers.responses import NO_THROTTLE
from broker.handlers.topics import TopicStores, auto_create_topic
from broker.handlers.transactions import TxnBroker, init_transactional_producer_id
from broker.server import Endpoint, RequestContext
from coordinator.metadata import Topic
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
        SaslAuthenticateRequest,
        SaslHandshakeRequest,
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
    def advertised_for(self, listener: str) -> Endpoint: ...
    def api_version_entries(self) -> tuple[resp.api_versions_v4.ApiVersion, ...]: ...


async def api_versions(
    ctx: RequestContext, req: ApiVersionsRequest, broker: ClusterBroker
) -> resp.api_versions_v4.ApiVersionsResponse:
    # The features are v3+ fields: converting to an older version drops them.
    m = resp.api_versions_v4
    return m.ApiVersionsResponse(
        error_code=ErrorCode.none,
        api_keys=broker.api_version_entries(),
        throttle_time=NO_THROTTLE,
        supported_features=tuple(
            m.SupportedFeatureKey(name=name, min_version=i16(lo), max_version=i16(hi))
            for name, lo, hi, _ in FEATURES
        ),
        finalized_features_epoch=i64(1),
        finalized_features=tuple(
            m.FinalizedFeatureKey(
                name=name, min_version_level=i16(level), max_version_level=i16(level)
            )
            for name, _, _, level in FEATURES
        ),
    )


async def sasl_handshake(
    ctx: RequestContext, req: SaslHandshakeRequest, broker: ClusterBroker
) -> resp.sasl_handshake_v1.SaslHandshakeResponse:
    """SaslHandshake reaching the handlers: the connection is past authentication, or
    its listener has no SASL (a SASL listener answers it itself before), so it is out
    of place: ILLEGAL_SASL_STATE, as Kafka's KafkaApis answers."""
    return resp.sasl_handshake_v1.SaslHandshakeResponse(
        error_code=ErrorCode.illegal_sasl_state, mechanisms=()
    )


async def sasl_authenticate(
    ctx: RequestContext, req: SaslAuthenticateRequest, broker: ClusterBroker
) -> resp.sasl_authenticate_v2.SaslAuthenticateResponse:
    """SaslAuthenticate reaching the handlers: ILLEGAL_SASL_STATE (Kafka's KafkaApis;
    re-authentication, KIP-368, is not supported)."""
    return resp.sasl_authenticate_v2.SaslAuthenticateResponse(
        error_code=ErrorCode.illegal_sasl_state,
        error_message="SaslAuthenticate request received after successful authentication",
        auth_bytes=b"",
        session_lifetime=i64Timedelta.parse(datetime.timedelta(0)),
    )


async def metadata(
    ctx: RequestContext, req: MetadataRequest, broker: ClusterBroker
) -> resp.metadata_v13.MetadataResponse:
    # cluster_authorized_operations (v8-10 only) keeps its default, "not requested".
    m = resp.metadata_v13
    state = broker.metadata.state
    version = ctx.api_version
    requested = req.topics
    allow_auto: bool = getattr(req, "allow_auto_topic_creation", True)  # v4+
    wanted: list[tuple[str | None, uuid.UUID | None]]
    if requested is None or (version == 0 and not requested):
        wanted = [(t.name, None) for t in sorted(state.topics.values(), key=lambda t: t.name)]
    else:
        wanted = [(t.name, getattr(t, "topic_id", None)) for t in requested]  # ids v10+
    topics: list[resp.metadata_v13.MetadataResponseTopic] = []

    def failed(code: ErrorCode, name: str | None, topic_id: uuid.UUID | None = None) -> None:
        topics.append(
            m.MetadataResponseTopic(
                error_code=code,
                name=None if name is None else TopicName(name),
                topic_id=topic_id,
                partitions=(),
            )
        )

    for name, topic_id in wanted:
        if name is None and (topic_id is None or version < 12):
            # Kafka refuses a topic with neither name nor id, and ids before v12.
            failed(ErrorCode.invalid_request, None if version >= 12 else "", topic_id)
            continue
        if name is None and topic_id is not None:
            topic = state.topics_by_id.get(topic_id)
            if topic is None:
                failed(ErrorCode.unknown_topic_id, None, topic_id)
                continue
        else:
            topic = state.topics.get(name or "")
        if topic is None:
            assert name is not None
            if allow_auto and broker.config.get("auto.create.topics.enable"):
                try:
                    topic = await auto_create_topic(broker, name)
                except KafkaError as exc:
                    failed(exc.code, name)
                    continue
            else:
                failed(ErrorCode.unknown_topic_or_partition, name)
                continue
        topics.append(_topic_entry(broker.node_id, topic))
    ep = broker.advertised_for(ctx.listener)
    return m.MetadataResponse(
        throttle_time=NO_THROTTLE,
        brokers=(
            m.MetadataResponseBroker(
                node_id=BrokerId(broker.node_id),
                host=ep.host,
                port=i32(ep.port),
                rack=broker.config.get("broker.rack"),
            ),
        ),
        cluster_id=broker.cluster_id,
        controller_id=BrokerId(broker.node_id),
        topics=tuple(topics),
        error_code=ErrorCode.none,
    )


async def describe_cluster(
    ctx: RequestContext, req: DescribeClusterRequest, broker: ClusterBroker
) -> resp.describe_cluster_v2.DescribeClusterResponse:
    m = resp.describe_cluster_v2
    endpoint_type: int = getattr(req, "endpoint_type", 1)  # v1+; 1 is BROKERS
    if endpoint_type not in (1, 2):
        return m.DescribeClusterResponse(
            throttle_time=NO_THROTTLE,
            error_code=ErrorCode.unsupported_endpoint_type,
            error_message=f"Unknown endpoint type {endpoint_type}",
            cluster_id="",
            brokers=(),
        )
    ep = broker.advertised_for(ctx.listener)
    return m.DescribeClusterResponse(
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        endpoint_type=i8(endpoint_type),
        cluster_id=broker.cluster_id,
        controller_id=BrokerId(broker.node_id),
        brokers=(
            m.DescribeClusterBroker(
                broker_id=BrokerId(broker.node_id),
                host=ep.host,
                port=i32(ep.port),
                rack=broker.config.get("broker.rack"),
                is_fenced=False,
            ),
        ),
        cluster_authorized_operations=i32(AUTHORIZED_OPERATIONS_OMITTED),
    )


def _batched(req: FindCoordinatorRequest) -> TypeIs[FindCoordinatorBatchRequest]:
    """FindCoordinator v4+ (KIP-699) asks for several coordinators at once."""
    return req.__version__ >= 4


async def find_coordinator(
    ctx: RequestContext, req: FindCoordinatorRequest, broker: ClusterBroker
) -> (
    resp.find_coordinator_v3.FindCoordinatorResponse
    | resp.find_coordinator_v6.FindCoordinatorResponse
):
    # A single node coordinates every group, transaction and share partition.
    ep = broker.advertised_for(ctx.listener)
    key_type: int = getattr(req, "key_type", 0)  # v1+; 0 is GROUP
    if key_type not in (0, 1, 2):
        code, message = ErrorCode.invalid_request, f"Unknown coordinator key type {key_type}"
    else:
        code, message = ErrorCode.none, None
    node = BrokerId(broker.node_id if code == ErrorCode.none else -1)
    port = i32(ep.port)
    if _batched(req):
        batched = resp.find_coordinator_v6
        return batched.FindCoordinatorResponse(
            throttle_time=NO_THROTTLE,
            coordinators=tuple(
                batched.Coordinator(
                    key=key,
                    node_id=node,
                    host=ep.host,
                    port=port,
                    error_code=code,
                    error_message=message,
                )
                for key in req.coordinator_keys
            ),
        )
    return resp.find_coordinator_v3.FindCoordinatorResponse(
        throttle_time=NO_THROTTLE,
        error_code=code,
        error_message=message,
        node_id=node,
        host=ep.host,
        port=port,
    )


async def init_producer_id(
    ctx: RequestContext, req: InitProducerIdRequest, broker: ClusterBroker
) -> resp.init_producer_id_v5.InitProducerIdResponse:
    if req.transactional_id is not None:
        return await init_transactional_producer_id(ctx, req, broker)
    producer_id: int = getattr(req, "producer_id", -1)  # v3+
    producer_epoch: int = getattr(req, "producer_epoch", -1)  # v3+
    # KIP-360: an idempotent producer may bump its epoch to reset sequences.
    if producer_id < 0 or producer_epoch >= 32766:
        producer_id, producer_epoch = await broker.metadata.allocate_producer_id(), -1
    return resp.init_producer_id_v5.InitProducerIdResponse(
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        producer_id=ProducerId(producer_id),
        producer_epoch=i16(producer_epoch + 1),
    )


def _topic_entry(node: int, topic: Topic) -> resp.metadata_v13.MetadataResponseTopic:
    m = resp.metadata_v13
    leader = BrokerId(node)
    return m.MetadataResponseTopic(
        error_code=ErrorCode.none,
        name=TopicName(topic.name),
        topic_id=topic.topic_id,
        is_internal=False,
        partitions=tuple(
            m.MetadataResponsePartition(
                error_code=ErrorCode.none,
                partition_index=i32(i),
                leader_id=leader,
                leader_epoch=i32(0),
                replica_nodes=(leader,),
                isr_nodes=(leader,),
                offline_replicas=(),
            )
            for i in range(topic.partitions)
        ),
        topic_authorized_operations=i32(AUTHORIZED_OPERATIONS_OMITTED),
    )
