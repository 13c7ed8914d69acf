"""A `ClusterView` the handler unit tests set up by hand (broker.cluster): which brokers
are live, with which endpoints, and who leads each partition at which epoch."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from broker.cluster import BrokerEndpoint, BrokerInfo, Leader, SingleNode


def alone(node_id: int = 1, listener: str = "PLAINTEXT") -> SingleNode:
    """The view of a broker alone, with one endpoint on `listener`."""
    return SingleNode(node_id, lambda: [BrokerEndpoint(listener, "h", 9092)], None)


class FakeCluster:
    """Brokers and leaders as a test sets them; a partition not in `leaders` is led by
    `default_leader` (None: no leader) at epoch 0."""

    def __init__(
        self,
        node_id: int,
        brokers: Sequence[BrokerInfo],
        leaders: dict[tuple[uuid.UUID, int], Leader | None] | None = None,
        default_leader: int | None = None,
    ) -> None:
        self._node_id = node_id
        self.brokers = list(brokers)
        self.leaders = dict(leaders or {})
        self.default_leader = node_id if default_leader is None else default_leader
        self.asked: list[tuple[uuid.UUID, int]] = []

    @property
    def node_id(self) -> int:
        return self._node_id

    def live_brokers(self) -> Sequence[BrokerInfo]:
        return tuple(self.brokers)

    def broker(self, node_id: int) -> BrokerInfo | None:
        return next((b for b in self.brokers if b.node_id == node_id), None)

    def leader(self, topic_id: uuid.UUID, partition: int) -> Leader | None:
        self.asked.append((topic_id, partition))
        if (topic_id, partition) in self.leaders:
            return self.leaders[(topic_id, partition)]
        return Leader(self.default_leader, 0)

    def is_local(self, leader: Leader | None) -> bool:
        return leader is not None and leader.node_id == self._node_id

    def coordinator(self, log: str) -> Leader | None:
        return Leader(self._node_id, 0)
