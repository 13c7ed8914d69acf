"""Group configs over three brokers on one PostgreSQL database: they are records of the
shared cluster metadata log (coordinator.metadata), so a broker that does not lead the
`groups` coordinator log alters them, every broker describes them, and the share
partitions every broker leads start where the group says (`share.auto.offset.reset`).

Each broker is addressed on its own with raw protocol requests (never through a
client's cached view of the cluster).
"""

from __future__ import annotations

from collections.abc import Callable

from confluent_kafka import Producer

from tests.integration.conftest import produce, producer_config
from tests.integration.pg_helpers import ClusterBroker, cluster, pg_dsn, pg_server, wait_for
from tests.integration.share_helpers import accept_all, close_quietly, consume, share_consumer
from tests.integration.test_pg_leadership import PARTITIONS, leaders, start_cluster
from tests.integration.test_pg_remote_share_state import holder
from tests.integration.test_pg_shared_metadata import described, set_config

__all__ = ["cluster", "pg_dsn", "pg_server"]  # the fixtures

GROUP_RESOURCE = 32
GROUP_CONFIG_SOURCE = 8
TOPIC = "configured"
GROUP = "configured-group"
PER_PARTITION = 10


def test_a_group_config_altered_off_the_groups_leader_applies_on_every_broker(
    cluster: Callable[..., ClusterBroker], pg_dsn: str
) -> None:
    brokers = start_cluster(cluster, TOPIC)
    assert set(leaders(brokers[0], TOPIC).values()) == {1, 2, 3}
    wait_for(lambda: holder(pg_dsn, "groups") is not None, "a broker to hold the groups log")
    lead = holder(pg_dsn, "groups")
    other = next(b for b in brokers if b.node_id != lead)

    # Records produced before the group has any member or config.
    producer = Producer(producer_config(brokers[0]))
    sent = [
        (p, None, f"{p}-{i}".encode(), []) for p in range(PARTITIONS) for i in range(PER_PARTITION)
    ]
    outcome = produce(producer, TOPIC, sent)
    assert outcome.errors == [] and len(outcome.acked) == len(sent)

    # Altered on a broker that does not lead `groups` (it answered NOT_COORDINATOR when
    # group configs lived in the groups log), described the same by all three.
    set_config(other, GROUP_RESOURCE, GROUP, "share.auto.offset.reset", "earliest")
    for b in brokers:
        wait_for(
            lambda b=b: (
                described(b, GROUP_RESOURCE, GROUP).get("share.auto.offset.reset")
                == ("earliest", GROUP_CONFIG_SOURCE)
            ),
            f"broker {b.node_id} to describe the group's share.auto.offset.reset",
        )

    # A share consumer of the group gets every record produced before it joined, from
    # the partitions of all three leaders (each read the group's config from its own
    # copy of the metadata).
    consumer = share_consumer(
        brokers[0],
        GROUP,
        [TOPIC],
        **{"bootstrap.servers": ",".join(b.bootstrap for b in brokers)},
    )
    try:
        got = consume(
            consumer,
            until=lambda log: len(log.deliveries) >= len(sent),
            timeout=90,
            decide=accept_all,
        )
    finally:
        close_quietly(consumer)
    assert sorted(got.offsets()) == [
        (p, o) for p in range(PARTITIONS) for o in range(PER_PARTITION)
    ], got.errors[:5]
