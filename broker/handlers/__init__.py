"""Request handlers, one module per API family; each registers its APIs on the table."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from broker.broker import Broker


def register_all(broker: Broker) -> None:
    from broker.handlers import cluster, configs, produce_fetch, share, share_state, topics

    cluster.register(broker)
    topics.register(broker)
    configs.register(broker)
    produce_fetch.register(broker)
    share.register(broker)
    share_state.register(broker)
