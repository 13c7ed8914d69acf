"""KIP-951: a partition's current leader in the answer of a broker that does not lead it.

Produce (v10+), Fetch (v16+), ShareFetch and ShareAcknowledge answer a partition whose
error is NOT_LEADER_OR_FOLLOWER (Fetch, ShareFetch and ShareAcknowledge also
FENCED_LEADER_EPOCH) with its leader and leader epoch in the partition's CurrentLeader,
and the response's NodeEndpoints lists where those leaders are on the listener the
request came in on, so a client moves without a Metadata round trip. As Kafka 4.2's
KafkaApis.getCurrentLeader: (-1, -1) for a partition without a leader, and a leader
that is not live or has no endpoint on that listener is named without an endpoint.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, TypeVar

from kio.schema.types import BrokerId
from kio.static.primitive import i32

from broker.cluster import ClusterView, Node, alive_node
from protocol.errors import ErrorCode

if TYPE_CHECKING:
    from broker.handlers import responses as resp

# The errors whose partitions carry CurrentLeader (KafkaApis: Produce only the first).
NOT_LEADER = ErrorCode.not_leader_or_follower
MOVED = frozenset({ErrorCode.not_leader_or_follower, ErrorCode.fenced_leader_epoch})

NodeEndpoint = TypeVar(
    "NodeEndpoint",
    "resp.produce_v12.NodeEndpoint",
    "resp.produce_v13.NodeEndpoint",
    "resp.fetch_v18.NodeEndpoint",
    "resp.share_fetch_v2.NodeEndpoint",
    "resp.share_acknowledge_v2.NodeEndpoint",
)


class CurrentLeaders:
    """One request's look-ups of the leaders its answer names: each `current` call
    remembers the leader's endpoint for the response's NodeEndpoints."""

    def __init__(self, cluster: ClusterView, listener: str) -> None:
        self.cluster = cluster
        self.listener = listener
        self._nodes: dict[int, Node] = {}

    def current(
        self, topic_id: uuid.UUID | None, partition: int, code: ErrorCode = NOT_LEADER
    ) -> tuple[int, int]:
        """(leader id, leader epoch) of a partition answered `code`; (-1, -1) without a
        leader, or for NOT_LEADER_OR_FOLLOWER when the view still names this broker (its
        log was taken by another broker before the view learnt of it): the client looks
        the leader up again rather than retry here."""
        leader = None if topic_id is None else self.cluster.leader(topic_id, partition)
        if leader is None or (code == NOT_LEADER and self.cluster.is_local(leader)):
            return -1, -1
        node = alive_node(self.cluster, leader.node_id, self.listener)
        if node is not None:
            self._nodes[node.node_id] = node
        return leader.node_id, leader.epoch

    def local(self, topic_id: uuid.UUID, partition: int) -> tuple[int, int]:
        """(leader id, leader epoch) of a partition answered without a leader error: this
        broker and its epoch when it leads it, else (-1, -1); no endpoint is listed."""
        leader = self.cluster.leader(topic_id, partition)
        if leader is None or not self.cluster.is_local(leader):
            return -1, -1
        return leader.node_id, leader.epoch

    def endpoints(self, cls: type[NodeEndpoint]) -> tuple[NodeEndpoint, ...]:
        """The NodeEndpoints of the leaders named so far, by node id."""
        return tuple(
            cls(node_id=BrokerId(n.node_id), host=n.host, port=i32(n.port), rack=n.rack)
            for n in sorted(self._nodes.values(), key=lambda n: n.node_id)
        )


def not_leader_message(node_id: int, name: str | None, partition: int) -> str:
    return f"Broker {node_id} is not the leader of {name}-{partition}"
