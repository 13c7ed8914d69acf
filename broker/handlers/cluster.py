"""ApiVersions, Metadata, DescribeCluster, FindCoordinator, InitProducerId."""

from __future__ import annotations

import dataclasses
import datetime
import random
import uuid
from typing import TYPE_CHECKING, Protocol

import structlog
from kio.schema.types import BrokerId, ProducerId, TopicName
from kio.static.primitive import i8, i16, i32, i64, i64Timedelta

from broker.cluster import ClusterView, Node, alive_node, alive_nodes
from broker.handlers import responses as resp
from broker.handlers.access import (
    CLUSTER_DENIED,
    GROUP_DENIED,
    TRANSACTIONAL_ID_DENIED,
    Guarded,
    authorized_operations,
)
from broker.handlers.responses import NO_THROTTLE
from broker.handlers.topics import TopicStores, auto_create_topic
from broker.handlers.transactions import TxnBroker, init_transactional_producer_id
from broker.server import Endpoint, RequestContext
from coordinator.acls import AclOperation, ResourceType
from coordinator.metadata import Topic
from protocol import api
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

# `share.version`, finalized at 2: share groups (KIP-932, level 1) with dead-letter
# topics (KIP-1191, level 2, Kafka's ShareVersion.SV_2).
FEATURES = [("share.version", 0, 2, 2)]
# The coordinator record log of each FindCoordinator key type (group, transaction,
# share): its leader coordinates every key of that type.
COORDINATOR_LOGS = {0: "groups", 1: "transactions", 2: "share-state"}
# "Not requested" value for authorized-operations fields.
AUTHORIZED_OPERATIONS_OMITTED = -(2**31)


class ClusterBroker(TopicStores, TxnBroker, Guarded, Protocol):
    """What the cluster handlers use of the broker (and Metadata's auto-creation)."""

    @property
    def node_id(self) -> int: ...
    @property
    def cluster_id(self) -> str: ...
    @property
    def cluster(self) -> ClusterView: ...
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
) -> resp.metadata_v13.MetadataResponse | resp.metadata_v10.MetadataResponse:
    """Topics the principal may not DESCRIBE are left out of an all-topics answer
    (without logging the denials) and answered TOPIC_AUTHORIZATION_FAILED when named;
    creating a missing topic needs CREATE on the cluster or the topic (KafkaApis'
    handleTopicMetadataRequest)."""
    m = resp.metadata_v13
    az = broker.authorizer
    state = broker.metadata.state
    version = ctx.api_version
    requested = req.topics
    allow_auto: bool = getattr(req, "allow_auto_topic_creation", True)  # v4+
    # KIP-430 (v8+); the cluster's operations are in v8-10 only.
    topic_ops: bool = version >= 8 and getattr(req, "include_topic_authorized_operations", False)
    wanted: list[tuple[str | None, uuid.UUID | None]]
    all_topics = requested is None or (version == 0 and not requested)
    if all_topics:
        names = sorted(state.topics)
        wanted = [
            (n, None) for n in az.filter(ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, names)
        ]
    else:
        assert requested is not None
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

    def may_create(name: str) -> bool:
        return az.allows(
            ctx, AclOperation.CREATE, ResourceType.CLUSTER, log_denied=False
        ) or az.allows(ctx, AclOperation.CREATE, ResourceType.TOPIC, name)

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
            if not all_topics and not az.allows(
                ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, topic.name
            ):
                # Kafka: an id is not secret, the name behind it is.
                failed(ErrorCode.topic_authorization_failed, None, topic_id)
                continue
        else:
            assert name is not None
            if not all_topics and not az.allows(
                ctx, AclOperation.DESCRIBE, ResourceType.TOPIC, name
            ):
                # Whether it exists is not disclosed: no id, no partitions.
                failed(ErrorCode.topic_authorization_failed, name)
                continue
            topic = state.topics.get(name)
        if topic is None:
            assert name is not None
            if allow_auto and broker.config.get("auto.create.topics.enable"):
                if not may_create(name):
                    failed(ErrorCode.topic_authorization_failed, name)
                    continue
                try:
                    topic = await auto_create_topic(broker, name)
                except KafkaError as exc:
                    failed(exc.code, name)
                    continue
            else:
                failed(ErrorCode.unknown_topic_or_partition, name)
                continue
        operations = AUTHORIZED_OPERATIONS_OMITTED
        if topic_ops:
            operations = authorized_operations(az, ctx, ResourceType.TOPIC, topic.name)
        topics.append(_topic_entry(broker.cluster, ctx.listener, version, topic, operations))
    answer = m.MetadataResponse(
        throttle_time=NO_THROTTLE,
        brokers=tuple(
            m.MetadataResponseBroker(
                node_id=BrokerId(n.node_id), host=n.host, port=i32(n.port), rack=n.rack
            )
            for n in alive_nodes(broker.cluster, ctx.listener)
        ),
        cluster_id=broker.cluster_id,
        controller_id=BrokerId(_random_live_broker(broker.cluster)),
        topics=tuple(topics),
        error_code=ErrorCode.none,
    )
    if 8 <= version <= 10 and getattr(req, "include_cluster_authorized_operations", False):
        old = api.convert(answer, resp.metadata_v10.MetadataResponse)
        return dataclasses.replace(
            old, cluster_authorized_operations=i32(_cluster_operations(ctx, broker))
        )
    return answer


def _cluster_operations(ctx: RequestContext, broker: ClusterBroker) -> int:
    """KIP-430's cluster field: the operations allowed on the cluster, or none at all
    without DESCRIBE on it (AuthHelper)."""
    az = broker.authorizer
    if not az.allows(ctx, AclOperation.DESCRIBE, ResourceType.CLUSTER):
        return 0
    return authorized_operations(az, ctx, ResourceType.CLUSTER)


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
    nodes = alive_nodes(broker.cluster, ctx.listener)
    controller_id = _random_live_broker(broker.cluster)
    if all(n.node_id != controller_id for n in nodes):
        controller_id = -1  # not listed: Kafka answers -1 rather than an unknown id
    return m.DescribeClusterResponse(
        throttle_time=NO_THROTTLE,
        error_code=ErrorCode.none,
        endpoint_type=i8(endpoint_type),
        cluster_id=broker.cluster_id,
        controller_id=BrokerId(controller_id),
        # Every listed broker is live: a broker whose lease expired is out of the cluster
        # (Kafka would list a fenced one only when IncludeFencedBrokers asks).
        brokers=tuple(
            m.DescribeClusterBroker(
                broker_id=BrokerId(n.node_id),
                host=n.host,
                port=i32(n.port),
                rack=n.rack,
                is_fenced=False,
            )
            for n in nodes
        ),
        cluster_authorized_operations=i32(
            _cluster_operations(ctx, broker)
            if getattr(req, "include_cluster_authorized_operations", False)
            else AUTHORIZED_OPERATIONS_OMITTED
        ),
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
    """The broker leading a key type's coordinator log (`groups`, `transactions`,
    `share-state`: ClusterView.coordinator) coordinates every key of it;
    COORDINATOR_NOT_AVAILABLE while that log has no live leader. As
    Kafka's getCoordinator: a group key needs DESCRIBE on the group, a transactional id
    DESCRIBE on it (each key answered on its own), a share-partition key CLUSTER_ACTION
    (only brokers ask; the whole request fails)."""
    ep = broker.advertised_for(ctx.listener)
    az = broker.authorizer
    key_type: int = getattr(req, "key_type", 0)  # v1+; 0 is GROUP
    keys = list(req.coordinator_keys) if _batched(req) else [req.key]
    answers: list[tuple[ErrorCode, str | None]] = []
    if key_type not in (0, 1, 2):
        answers = [(ErrorCode.invalid_request, f"Unknown coordinator key type {key_type}")] * len(
            keys
        )
    elif key_type == 2 and not az.allows(ctx, AclOperation.CLUSTER_ACTION, ResourceType.CLUSTER):
        answers = [(ErrorCode.cluster_authorization_failed, CLUSTER_DENIED)] * len(keys)
    else:
        for key in keys:
            if key_type == 0 and not az.allows(ctx, AclOperation.DESCRIBE, ResourceType.GROUP, key):
                answers.append((ErrorCode.group_authorization_failed, GROUP_DENIED))
            elif key_type == 1 and not az.allows(
                ctx, AclOperation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, key
            ):
                answers.append(
                    (ErrorCode.transactional_id_authorization_failed, TRANSACTIONAL_ID_DENIED)
                )
            else:
                answers.append((ErrorCode.none, None))

    # The broker leading the key type's coordinator log coordinates every key of it.
    coordinator = None
    if any(code == ErrorCode.none for code, _ in answers):
        leader = broker.cluster.coordinator(COORDINATOR_LOGS[key_type])
        if leader is not None:
            coordinator = alive_node(broker.cluster, leader.node_id, ctx.listener)
        if coordinator is None:
            unavailable = (
                ErrorCode.coordinator_not_available,
                f"The {COORDINATOR_LOGS[key_type]} coordinator has no live leader now: try again",
            )
            answers = [unavailable if a[0] == ErrorCode.none else a for a in answers]

    def node(code: ErrorCode) -> tuple[BrokerId, str, i32]:
        if code == ErrorCode.none and coordinator is not None:
            return BrokerId(coordinator.node_id), coordinator.host, i32(coordinator.port)
        if code == ErrorCode.invalid_request:
            return BrokerId(-1), ep.host, i32(ep.port)
        return BrokerId(-1), "", i32(-1)  # Kafka's Node.noNode

    if _batched(req):
        batched = resp.find_coordinator_v6
        coordinators = []
        for key, (code, message) in zip(keys, answers, strict=True):
            node_id, host, port = node(code)
            coordinators.append(
                batched.Coordinator(
                    key=key,
                    node_id=node_id,
                    host=host,
                    port=port,
                    error_code=code,
                    error_message=message,
                )
            )
        return batched.FindCoordinatorResponse(
            throttle_time=NO_THROTTLE, coordinators=tuple(coordinators)
        )
    ((code, message),) = answers
    node_id, host, port = node(code)
    return resp.find_coordinator_v3.FindCoordinatorResponse(
        throttle_time=NO_THROTTLE,
        error_code=code,
        error_message=message,
        node_id=node_id,
        host=host,
        port=port,
    )


async def init_producer_id(
    ctx: RequestContext, req: InitProducerIdRequest, broker: ClusterBroker
) -> resp.init_producer_id_v5.InitProducerIdResponse:
    az = broker.authorizer
    if req.transactional_id is not None:
        if not az.allows(
            ctx, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, req.transactional_id
        ):
            return _init_producer_id_refused(ErrorCode.transactional_id_authorization_failed)
        return await init_transactional_producer_id(ctx, req, broker)
    # An idempotent producer needs IDEMPOTENT_WRITE on the cluster or, since Kafka 3.0
    # (KIP-679), WRITE on any topic.
    if not az.allows(
        ctx, AclOperation.IDEMPOTENT_WRITE, ResourceType.CLUSTER, log_denied=False
    ) and not az.allows_any(ctx, AclOperation.WRITE, ResourceType.TOPIC):
        return _init_producer_id_refused(ErrorCode.cluster_authorization_failed)
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


def _init_producer_id_refused(code: ErrorCode) -> resp.init_producer_id_v5.InitProducerIdResponse:
    return resp.init_producer_id_v5.InitProducerIdResponse(
        throttle_time=NO_THROTTLE,
        error_code=code,
        producer_id=ProducerId(-1),
        producer_epoch=i16(-1),
    )


def _random_live_broker(cluster: ClusterView) -> int:
    """The controller id a KRaft broker answers: a live broker picked at random (Kafka's
    MetadataCache.getRandomAliveBrokerId; clients send it controller-bound requests,
    which any broker forwards), -1 with none."""
    live = [b.node_id for b in cluster.live_brokers()]
    return random.choice(live) if live else -1


def _topic_entry(
    cluster: ClusterView,
    listener: str,
    version: int,
    topic: Topic,
    operations: int = AUTHORIZED_OPERATIONS_OMITTED,
) -> resp.metadata_v13.MetadataResponseTopic:
    m = resp.metadata_v13
    return m.MetadataResponseTopic(
        error_code=ErrorCode.none,
        name=TopicName(topic.name),
        topic_id=topic.topic_id,
        is_internal=False,
        partitions=tuple(
            _partition_entry(cluster, listener, version, topic.topic_id, i)
            for i in range(topic.partitions)
        ),
        topic_authorized_operations=i32(operations),
    )


def _partition_entry(
    cluster: ClusterView, listener: str, version: int, topic_id: uuid.UUID, index: int
) -> resp.metadata_v13.MetadataResponsePartition:
    """One partition as Kafka's KRaftMetadataCache.getPartitionMetadata answers it: its
    one replica is its leader (spool keeps no follower copies: replication factor 1).
    Without a leader, or with one that is not live: LEADER_NOT_AVAILABLE and leader -1;
    a live leader without the request's listener: LISTENER_NOT_FOUND (v6+). Metadata
    v0 lists only the replicas a client can reach."""
    m = resp.metadata_v13
    leader = cluster.leader(topic_id, index)
    if leader is None:
        return m.MetadataResponsePartition(
            error_code=ErrorCode.leader_not_available,
            partition_index=i32(index),
            leader_id=BrokerId(-1),
            leader_epoch=i32(-1),
            replica_nodes=(),
            isr_nodes=(),
            offline_replicas=(),
        )
    node: Node | None = alive_node(cluster, leader.node_id, listener)
    replicas = (BrokerId(leader.node_id),)
    offline: tuple[BrokerId, ...]
    if node is not None:
        code, leader_id, offline = ErrorCode.none, BrokerId(leader.node_id), ()
    else:
        live = cluster.broker(leader.node_id) is not None
        code = (
            ErrorCode.listener_not_found
            if live and version >= 6
            else ErrorCode.leader_not_available
        )
        leader_id, offline = BrokerId(-1), replicas
    listed = () if version == 0 and node is None else replicas
    return m.MetadataResponsePartition(
        error_code=code,
        partition_index=i32(index),
        leader_id=leader_id,
        leader_epoch=i32(leader.epoch),
        replica_nodes=listed,
        isr_nodes=listed,
        offline_replicas=offline,
    )
