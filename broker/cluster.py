"""Who is in the cluster and who leads what: the seam between the handlers and the
cluster layout.

Kafka's brokers learn the layout from the KRaft metadata log (MetadataCache): the
registered brokers with their endpoints per listener, each partition's leader and
leader epoch. spool has no controller quorum; several spool brokers form a cluster by
sharing one PostgreSQL database, where each registers with a lease renewed by its
heartbeat (`broker.heartbeat.interval.ms`) and is out of the cluster once the lease is
older than `broker.session.timeout.ms`, and where partitions and coordinator partitions
are led by lease (their `leader_epoch` is the fencing epoch every write carries).

The handlers ask a `ClusterView` only:

- `live_brokers()`: the brokers Metadata and DescribeCluster list, with the endpoint of
  the listener the request came in on (Kafka answers each listener with its own
  endpoints; a broker without that listener is left out, as Kafka leaves it out).
- `leader(topic_id, partition)`: the partition's leader and leader epoch, or None while
  it has none (Kafka's LEADER_NOT_AVAILABLE / NOT_LEADER_OR_FOLLOWER).
- `is_local(leader)`: whether this broker serves it; a Produce, Fetch, ListOffsets,
  ShareFetch or ShareAcknowledge for a partition this broker does not lead is answered
  NOT_LEADER_OR_FOLLOWER with the current leader and its endpoint in the response's
  tagged fields (KIP-951), so clients move without a Metadata round trip.

`SingleNode` is the view of a broker alone: itself, leading every partition at epoch 0.
That is every broker on the file engine, and a broker on PostgreSQL with no other
broker registered.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class BrokerEndpoint:
    """One advertised listener of a broker."""

    listener: str  # the listener name, upper-cased as Kafka keys it (PLAINTEXT, SASL_SSL)
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    """A registered, live broker."""

    node_id: int
    endpoints: tuple[BrokerEndpoint, ...]
    rack: str | None = None

    def endpoint(self, listener: str) -> BrokerEndpoint | None:
        return next((e for e in self.endpoints if e.listener == listener), None)


@dataclass(frozen=True, slots=True)
class Leader:
    """A partition's leader and its leader epoch (the fencing epoch of its log)."""

    node_id: int
    epoch: int


class ClusterView(Protocol):
    """What the handlers know of the cluster (see the module docstring)."""

    @property
    def node_id(self) -> int: ...

    def live_brokers(self) -> Sequence[BrokerInfo]: ...

    def broker(self, node_id: int) -> BrokerInfo | None: ...

    def leader(self, topic_id: uuid.UUID, partition: int) -> Leader | None: ...

    def is_local(self, leader: Leader | None) -> bool: ...

    def coordinator(self, log: str) -> Leader | None:
        """The leader of a coordinator's record log (`groups`, `share-state`,
        `transactions`): the broker FindCoordinator names for any key of that kind, and
        the one the share-partition leaders send their share-state RPCs to."""
        ...


class SingleNode:
    """A broker alone: it is the only live broker and leads every partition, epoch 0.

    `endpoints` is called at each look-up, so an advertised port 0 (a listener bound to
    a free port) reads as the port the listener got."""

    def __init__(
        self, node_id: int, endpoints: Callable[[], Sequence[BrokerEndpoint]], rack: str | None
    ) -> None:
        self._node_id = node_id
        self._endpoints = endpoints
        self._rack = rack

    @property
    def node_id(self) -> int:
        return self._node_id

    def _me(self) -> BrokerInfo:
        return BrokerInfo(self._node_id, tuple(self._endpoints()), self._rack)

    def live_brokers(self) -> Sequence[BrokerInfo]:
        return (self._me(),)

    def broker(self, node_id: int) -> BrokerInfo | None:
        return self._me() if node_id == self._node_id else None

    def leader(self, topic_id: uuid.UUID, partition: int) -> Leader | None:
        return Leader(self._node_id, 0)

    def is_local(self, leader: Leader | None) -> bool:
        return leader is not None and leader.node_id == self._node_id

    def coordinator(self, log: str) -> Leader | None:
        return Leader(self._node_id, 0)


@dataclass(frozen=True, slots=True)
class Node:
    """A broker as a response names it on one listener (Kafka's `Node`)."""

    node_id: int
    host: str
    port: int
    rack: str | None = None


def alive_node(cluster: ClusterView, node_id: int, listener: str) -> Node | None:
    """A live broker's endpoint on `listener`, or None when it is not live or has no such
    listener (Kafka's MetadataCache.getAliveBrokerNode)."""
    info = cluster.broker(node_id)
    endpoint = None if info is None else info.endpoint(listener)
    if info is None or endpoint is None:
        return None
    return Node(node_id, endpoint.host, endpoint.port, info.rack)


def alive_nodes(cluster: ClusterView, listener: str) -> list[Node]:
    """The live brokers with an endpoint on `listener`, by node id; a broker without that
    listener is left out (Kafka's MetadataCache.getAliveBrokerNodes)."""
    nodes = []
    for info in cluster.live_brokers():
        endpoint = info.endpoint(listener)
        if endpoint is not None:
            nodes.append(Node(info.node_id, endpoint.host, endpoint.port, info.rack))
    return sorted(nodes, key=lambda n: n.node_id)
