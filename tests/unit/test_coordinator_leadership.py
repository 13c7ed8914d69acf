"""Coordinator logs led by the layout (broker.leadership with a `CoordinatorHost`),
without a database or a socket: `groups`, `share-state` and `transactions` are placed
by the same stable hash as partitions over the live brokers (all three on a broker
alone, one each on three), claimed conditionally (a live holder refuses until it
released), released when the layout moves them, taken over with epoch + 1 once a dead
holder's lease expired, unloaded at once when another broker claimed them, and
released after the partitions at a graceful stop.

The store is test_leadership's `MemoryStore` (the claims as PostgreSQL makes them).
"""

from __future__ import annotations

from collections import Counter

from broker.cluster import Leader
from broker.leadership import COORDINATOR_LOGS, Leadership, coordinator_layout
from persister.pg_leadership import ClaimedLog
from tests.unit.test_leadership import TOPIC, Host, MemoryStore


class Coordinators:
    """The broker's side: which coordinators are loaded, and what happened, in order."""

    def __init__(self, events: list[tuple[str, str]]) -> None:
        self.loaded: dict[str, int] = {}
        self.events = events

    async def open_coordinator(self, name: str, claimed: ClaimedLog) -> None:
        self.loaded[name] = claimed.epoch
        self.events.append(("load", name))

    async def release_coordinator(self, name: str, reason: str) -> None:
        del self.loaded[name]
        self.events.append(("unload", name))

    def drop_coordinator(self, name: str, reason: str) -> None:
        self.loaded.pop(name, None)
        self.events.append(("dropped", name))


def _broker(
    store: MemoryStore, node: int, live: list[int]
) -> tuple[Leadership, Host, Coordinators]:
    host = Host()
    coordinators = Coordinators(host.events)
    leadership = Leadership(store, node, lambda: live, lambda: [TOPIC], host, coordinators)
    return leadership, host, coordinators


def test_the_coordinator_layout_puts_all_on_one_and_one_each_on_three() -> None:
    assert coordinator_layout([4]) == dict.fromkeys(COORDINATOR_LOGS, 4)
    assert coordinator_layout([]) == {}
    for nodes in ([1, 2, 3], [2, 5, 9], [10, 11, 12]):
        placed = coordinator_layout(nodes)
        assert set(placed) == set(COORDINATOR_LOGS)
        assert Counter(placed.values()) == dict.fromkeys(nodes, 1)
        assert coordinator_layout(list(reversed(nodes))) == placed
    two = coordinator_layout([1, 2])
    assert sorted(Counter(two.values()).values()) == [1, 2]


async def test_a_broker_alone_loads_all_three_before_the_partitions() -> None:
    store = MemoryStore()
    store.live = {1}
    one, host, coordinators = _broker(store, 1, [1])
    await one.reconcile()
    assert coordinators.loaded == dict.fromkeys(COORDINATOR_LOGS, 1)
    assert [e for e in host.events[:3]] == [("load", name) for name in COORDINATOR_LOGS]
    for name in COORDINATOR_LOGS:
        assert one.coordinator(name) == Leader(1, 1)


async def test_three_brokers_each_hold_the_log_the_layout_names() -> None:
    store = MemoryStore()
    store.live = {1}
    live = [1]
    one, _, c1 = _broker(store, 1, live)
    await one.reconcile()
    store.live |= {2, 3}
    live[:] = [1, 2, 3]
    two, _, c2 = _broker(store, 2, live)
    three, _, c3 = _broker(store, 3, live)
    await two.reconcile()
    await three.reconcile()
    # Broker 1 holds them, alive: the claims are refused, nothing is loaded twice.
    assert c2.loaded == {} and c3.loaded == {}
    target = coordinator_layout([1, 2, 3])
    # Broker 1 releases the two the layout moves (unloading them first)...
    await one.reconcile()
    assert set(c1.loaded) == {n for n, node in target.items() if node == 1}
    # ...and the others claim them at their next heartbeat, at epoch 2.
    await two.reconcile()
    await three.reconcile()
    for leadership in (one, two, three):
        await leadership.reconcile()
        for name, node in target.items():
            leader = leadership.coordinator(name)
            assert leader is not None and leader.node_id == node, (leadership.node_id, name)
    by_node = {1: c1, 2: c2, 3: c3}
    for name, node in target.items():
        assert name in by_node[node].loaded
        if node != 1:
            assert by_node[node].loaded[name] == 2


async def test_a_dead_holders_coordinator_log_is_taken_over_after_its_lease() -> None:
    store = MemoryStore()
    store.live = {1, 2, 3}
    live = [1, 2, 3]
    brokers = {n: _broker(store, n, live) for n in (1, 2, 3)}
    for _ in range(2):
        for leadership, _, _ in brokers.values():
            await leadership.reconcile()
    target = coordinator_layout([1, 2, 3])
    dead = target["share-state"]
    survivors = [n for n in (1, 2, 3) if n != dead]
    # Until the lease expires the survivors leave it alone (a claim would be refused).
    for n in survivors:
        await brokers[n][0].reconcile()
    assert store.rows["share-state"][0] == dead
    # Lease expired: the layout over the two survivors names a new holder, who claims
    # the log at its next reconcile with epoch + 1 and loads the coordinator.
    store.live = set(survivors)
    live[:] = survivors
    for n in survivors:
        await brokers[n][0].reconcile()
    new = coordinator_layout(survivors)["share-state"]
    holder, epoch = store.rows["share-state"]
    assert holder == new and epoch == 2
    assert "share-state" in brokers[new][2].loaded
    for n in survivors:
        assert brokers[n][0].coordinator("share-state") == Leader(new, 2)


async def test_a_coordinator_log_claimed_by_another_broker_is_dropped() -> None:
    store = MemoryStore()
    store.live = {1}
    one, host, coordinators = _broker(store, 1, [1])
    await one.reconcile()
    # Broker 1 was paused past its lease; broker 2 claimed the groups log meanwhile.
    store.rows["groups"] = (2, 7)
    store.live = {1, 2}
    await one.reconcile()
    assert ("dropped", "groups") in host.events
    assert "groups" not in coordinators.loaded
    assert one.coordinator("groups") == Leader(2, 7)
    assert not one.is_local(one.coordinator("groups"))


async def test_a_released_log_is_named_by_no_one_here_until_the_next_holder() -> None:
    store = MemoryStore()
    store.live = {1}
    live = [1]
    one, _, _ = _broker(store, 1, live)
    await one.reconcile()
    store.live = {1, 2, 3}
    live[:] = [1, 2, 3]
    await one.reconcile()
    moved = [n for n, node in coordinator_layout([1, 2, 3]).items() if node != 1]
    for name in moved:
        assert store.rows[name][0] is None  # released in the database
        assert one.coordinator(name) is None  # FindCoordinator: not available yet


async def test_stop_releases_the_partitions_then_the_coordinators() -> None:
    store = MemoryStore()
    store.live = {1}
    one, host, coordinators = _broker(store, 1, [1])
    await one.reconcile()
    host.events.clear()
    await one.stop()
    assert coordinators.loaded == {} and host.open == {}
    assert all(node is None for node, _ in store.rows.values())
    kinds = [kind for kind, _ in host.events]
    assert kinds == ["release"] * TOPIC.partitions + ["unload"] * len(COORDINATOR_LOGS)


async def test_without_a_coordinator_host_the_coordinator_logs_are_not_placed() -> None:
    store = MemoryStore()
    store.live = {1}
    host = Host()
    one = Leadership(store, 1, lambda: [1], lambda: [TOPIC], host)
    await one.reconcile()
    assert not set(COORDINATOR_LOGS) & set(store.rows)


async def test_a_broker_back_from_an_expired_lease_claims_its_logs_again() -> None:
    """Paused past its lease, a taker claimed and then released its logs (the layout
    gave them back): held by nobody, they are dropped and claimed again, epoch + 1."""
    store = MemoryStore()
    store.live = {1}
    one, host, coordinators = _broker(store, 1, [1])
    await one.reconcile()
    for name in [*COORDINATOR_LOGS, "topics/orders-0"]:
        store.rows[name] = (None, 3)
    await one.reconcile()
    assert ("dropped", "groups") in host.events and ("drop", "topics/orders-0") in host.events
    assert coordinators.loaded["groups"] == 4 and host.open["topics/orders-0"] == 4
    assert store.rows["groups"] == (1, 4)
    assert one.coordinator("groups") == Leader(1, 4)
