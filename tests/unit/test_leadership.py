"""Leadership by lease (broker.leadership) without a database or a socket: the layout
spreads a topic's partitions evenly and moves few of them when a broker joins or
leaves; reconciling claims what the layout gives this broker (a live holder refuses the
claim until it released the log or its lease expired), releases what it gives another,
drops what another broker claimed, and a stop releases everything.

`MemoryStore` holds the claims as persister.pg_leadership's SQL does: a claim is
refused while another live broker holds the log; the test says which brokers are live
(the registry's leases).
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Mapping

from broker.cluster import Leader
from broker.leadership import (
    Leadership,
    PartitionRef,
    TopicRef,
    layout,
    partition_log,
    spread,
    stable_hash,
)
from persister.pg_leadership import ClaimedLog, Holder

TOPIC = TopicRef("orders", uuid.UUID(int=7), 6)


def test_stable_hash_is_the_same_in_every_process() -> None:
    # A fixed value: Python's hash() of a str is salted per process (PYTHONHASHSEED).
    assert stable_hash("a", "1") == int.from_bytes(
        __import__("hashlib").blake2b(b"a\x001", digest_size=8).digest(), "big"
    )
    assert stable_hash("a", "1") != stable_hash("a1")


def test_six_partitions_on_three_brokers_two_each() -> None:
    for topic_int in range(50):
        topic = TopicRef("t", uuid.UUID(int=topic_int), 6)
        target = layout([topic], [1, 2, 3])
        assert len(target) == 6
        assert sorted(Counter(target.values()).values()) == [2, 2, 2]


def test_uneven_counts_differ_by_one_at_most() -> None:
    for partitions in (1, 2, 5, 7, 10):
        for nodes in ([1], [1, 2], [1, 2, 3], [4, 7, 9, 11]):
            target = layout([TopicRef("t", uuid.UUID(int=partitions), partitions)], nodes)
            counts = Counter(target.values())
            assert sum(counts.values()) == partitions
            room = -(-partitions // len(nodes))
            assert max(counts.values()) <= room
            assert set(counts) <= set(nodes)


def test_same_layout_whatever_order_the_brokers_are_listed_in() -> None:
    assert layout([TOPIC], [3, 1, 2]) == layout([TOPIC], [1, 2, 3])
    assert layout([TOPIC], [1, 2, 3, 3]) == layout([TOPIC], [1, 2, 3])


def test_a_broker_alone_leads_everything_and_none_when_nobody_lives() -> None:
    assert set(layout([TOPIC], [5]).values()) == {5}
    assert layout([TOPIC], []) == {}


def test_a_joining_broker_moves_about_one_nth() -> None:
    for topic_int in range(20):
        topic = TopicRef("big", uuid.UUID(int=topic_int), 120)
        before = layout([topic], [1, 2, 3])
        after = layout([topic], [1, 2, 3, 4])
        moved = [name for name in before if before[name] != after[name]]
        # 30 of 120 must move to the new broker; a placement by hash modulo the broker
        # count would move about 90.
        assert 30 <= len(moved) <= 40
        assert Counter(after.values()) == {1: 30, 2: 30, 3: 30, 4: 30}


def test_a_leaving_broker_moves_only_its_own() -> None:
    topic = TopicRef("big", uuid.UUID(int=98), 120)
    before = layout([topic], [1, 2, 3, 4])
    after = layout([topic], [1, 2, 3])
    moved = {name for name in before if before[name] != after[name]}
    own = {name for name in before if before[name] == 4}
    assert own <= moved
    assert len(moved) <= len(own) + 12


def test_spread_places_every_key() -> None:
    keys = [f"k{i}" for i in range(10)]
    placed = spread(keys, [1, 2])
    assert set(placed) == set(keys)
    assert sorted(Counter(placed.values()).values()) == [5, 5]


class MemoryStore:
    """Claims as in PostgreSQL: a live holder other than the claimer refuses."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[int | None, int]] = {}  # name -> (holder, epoch)
        self.live: set[int] = set()

    async def holders(self) -> Mapping[str, Holder]:
        return {
            name: Holder(node, epoch)
            for name, (node, epoch) in self.rows.items()
            if node is not None and node in self.live
        }

    async def claim(self, name: str, node_id: int, topic_id: str | None) -> ClaimedLog | None:
        holder, epoch = self.rows.get(name, (None, 0))
        if holder is not None and holder != node_id and holder in self.live:
            return None
        self.rows[name] = (node_id, epoch + 1)
        return ClaimedLog(1, epoch + 1, 0, 0, topic_id)

    async def release(self, name: str, node_id: int, epoch: int) -> bool:
        if self.rows.get(name) == (node_id, epoch):
            self.rows[name] = (None, epoch)
            return True
        return False


class Host:
    def __init__(self) -> None:
        self.open: dict[str, int] = {}
        self.events: list[tuple[str, str]] = []

    async def open_partition(self, ref: PartitionRef, claimed: ClaimedLog) -> None:
        self.open[ref.name] = claimed.epoch
        self.events.append(("open", ref.name))

    async def release_partition(self, ref: PartitionRef, reason: str) -> None:
        del self.open[ref.name]
        self.events.append(("release", ref.name))

    def drop_partition(self, ref: PartitionRef, reason: str) -> None:
        self.open.pop(ref.name, None)
        self.events.append(("drop", ref.name))

    def claim_on_open(self, ref: PartitionRef, claim: asyncio.Future[ClaimedLog | None]) -> None:
        self.open[ref.name] = 0
        self.events.append(("open on claim", ref.name))


def _broker(store: MemoryStore, node: int, live: list[int]) -> tuple[Leadership, Host]:
    host = Host()
    return Leadership(store, node, lambda: live, lambda: [TOPIC], host), host


async def test_three_brokers_claim_two_each_after_a_hand_over() -> None:
    store = MemoryStore()
    store.live = {1}
    live = [1]
    one, host1 = _broker(store, 1, live)
    await one.reconcile()
    assert len(host1.open) == 6  # alone: everything
    assert one.leader(TOPIC.topic_id, 0) == Leader(1, 1)
    # Two brokers join: their claims are refused while broker 1 holds the logs.
    store.live |= {2, 3}
    live[:] = [1, 2, 3]
    two, host2 = _broker(store, 2, live)
    three, host3 = _broker(store, 3, live)
    await two.reconcile()
    await three.reconcile()
    assert host2.open == {} and host3.open == {}
    assert two.claims_refused > 0
    # Broker 1 sees them at its heartbeat and releases four partitions...
    await one.reconcile()
    assert len(host1.open) == 2 and one.releases == 4
    # ...which the others claim at theirs, at epoch 2.
    await two.reconcile()
    await three.reconcile()
    assert len(host2.open) == 2 and len(host3.open) == 2
    assert set(host2.open.values()) == {2}
    target = layout([TOPIC], [1, 2, 3])
    for index in range(6):
        name = partition_log(TOPIC.name, index)
        for leadership in (one, two, three):
            await leadership.reconcile()  # nothing to do: reads the holders
            leader = leadership.leader(TOPIC.topic_id, index)
            assert leader is not None and leader.node_id == target[name]


async def test_a_dead_brokers_partitions_are_claimed_once_its_lease_expired() -> None:
    store = MemoryStore()
    store.live = {1, 2}
    live = [1, 2]
    one, host1 = _broker(store, 1, live)
    two, host2 = _broker(store, 2, live)
    await one.reconcile()
    await two.reconcile()
    await one.reconcile()
    await two.reconcile()
    assert len(host1.open) == 3 and len(host2.open) == 3
    # Broker 2 dies: until its lease expires broker 1 still sees it and leaves its
    # partitions alone.
    await one.reconcile()
    assert len(host1.open) == 3
    store.live = {1}
    live[:] = [1]
    await one.reconcile()
    assert len(host1.open) == 6
    assert all(node == 1 for node, _ in store.rows.values())
    # Broker 2's three at a new epoch: its writes, at the old one, are fenced.
    assert sorted(epoch for _, epoch in store.rows.values()) == [1, 1, 1, 2, 2, 2]


async def test_a_claim_by_another_broker_drops_the_partition() -> None:
    store = MemoryStore()
    store.live = {1}
    one, host1 = _broker(store, 1, [1])
    await one.reconcile()
    name = partition_log(TOPIC.name, 0)
    # Broker 1 was paused past its lease; broker 2 claimed the log meanwhile.
    store.rows[name] = (2, 5)
    store.live = {1, 2}
    await one.reconcile()
    assert ("drop", name) in host1.events
    assert one.leader(TOPIC.topic_id, 0) == Leader(2, 5)
    assert not one.is_local(one.leader(TOPIC.topic_id, 0))


async def test_stop_releases_everything() -> None:
    store = MemoryStore()
    store.live = {1}
    one, host1 = _broker(store, 1, [1])
    await one.reconcile()
    await one.stop()
    assert host1.open == {}
    assert all(node is None for node, _ in store.rows.values())
    one.request()  # stopped: no more reconciles
    assert one.mine == {}


async def test_a_new_topic_is_claimed_as_it_opens_and_stale_data_drops_it() -> None:
    store = MemoryStore()
    store.live = {1}
    topics = [TOPIC]
    host = Host()
    one = Leadership(store, 1, lambda: [1], lambda: topics, host)
    assert not one.leads(TOPIC.name, 0)  # before the first reconcile: never on open
    await one.reconcile()
    grown = TopicRef("new", uuid.UUID(int=8), 2)
    topics.append(grown)
    # Another broker wrote partition 1 before: the claim finds data the new copy lacks.
    store.rows[partition_log("new", 1)] = (None, 4)
    data = {partition_log("new", 1)}
    original = store.claim

    async def claim(name: str, node_id: int, topic_id: str | None) -> ClaimedLog | None:
        got = await original(name, node_id, topic_id)
        if got is not None and name in data:
            return ClaimedLog(got.log_id, got.epoch, 0, 10, topic_id)
        return got

    store.claim = claim  # type: ignore[method-assign]
    assert one.leads("new", 0) and one.leads("new", 1)
    assert one.leader(grown.topic_id, 0) is None  # until the claim is in
    for _ in range(5):
        await asyncio.sleep(0)
    assert one.leader(grown.topic_id, 0) == Leader(1, 1)
    assert one.mine[partition_log("new", 0)] == 1
    # Dropped at once; the reconcile it asked for claims it again and restores it
    # (open_partition), at the next epoch.
    await one.reconcile()
    events = [e for e in host.events if e[1] == partition_log("new", 1)]
    assert [kind for kind, _ in events] == ["open on claim", "drop", "open"]
    assert one.mine[partition_log("new", 1)] == 6


async def test_a_claim_on_open_that_lands_while_a_reconcile_reads_holders_is_kept() -> None:
    """A reconcile reads the holders; meanwhile a partition of a topic just created is
    claimed on open. The holders it read predate that claim: the partition must stay led
    (not dropped as "no live holder", not shown leaderless in Metadata until the next
    reconcile). Seen as a first produce after CreateTopics waiting ~1 s (librdkafka
    retrying LEADER_NOT_AVAILABLE) once in four creations on a broker alone."""
    store = MemoryStore()
    store.live = {1}
    topics = [TOPIC]
    host = Host()
    one = Leadership(store, 1, lambda: [1], lambda: topics, host)
    await one.reconcile()
    read = asyncio.Event()
    go_on = asyncio.Event()
    original = store.holders

    async def slow_holders() -> Mapping[str, Holder]:
        got = await original()  # read before the claim below commits
        read.set()
        await go_on.wait()
        return got

    store.holders = slow_holders  # type: ignore[method-assign]
    grown = TopicRef("new", uuid.UUID(int=8), 1)
    topics.append(grown)
    reconciling = asyncio.ensure_future(one.reconcile())
    await asyncio.wait_for(read.wait(), 5)
    assert one.leads("new", 0)  # claimed on open, while the reconcile waits
    for _ in range(5):
        await asyncio.sleep(0)
    assert one.leader(grown.topic_id, 0) == Leader(1, 1)
    go_on.set()
    await asyncio.wait_for(reconciling, 5)
    assert one.leader(grown.topic_id, 0) == Leader(1, 1)
    assert ("drop", partition_log("new", 0)) not in host.events
    assert one.mine[partition_log("new", 0)] == 1


async def test_claims_settled_waits_for_the_claims_on_open_and_is_bounded() -> None:
    """CreateTopics answers after Broker.claims_settled: once the claims of the partitions
    it opened are in, Metadata names their leader (before, a producer's first Metadata
    could read LEADER_NOT_AVAILABLE and librdkafka retried ~1 s later: a topic's first
    produce on a broker alone on PostgreSQL took 1.1 s instead of 0.1 s)."""
    store = MemoryStore()
    store.live = {1}
    topics = [TOPIC]
    one = Leadership(store, 1, lambda: [1], lambda: topics, Host())
    await one.reconcile()
    gate = asyncio.Event()
    original = store.claim

    async def slow_claim(name: str, node_id: int, topic_id: str | None) -> ClaimedLog | None:
        await gate.wait()
        return await original(name, node_id, topic_id)

    store.claim = slow_claim  # type: ignore[method-assign]
    grown = TopicRef("new", uuid.UUID(int=8), 2)
    topics.append(grown)
    assert one.leads("new", 0) and one.leads("new", 1)
    settled = asyncio.ensure_future(one.claims_settled(5.0))
    for _ in range(5):
        await asyncio.sleep(0)
    assert not settled.done() and one.leader(grown.topic_id, 0) is None
    gate.set()
    await asyncio.wait_for(settled, 5)
    assert one.leader(grown.topic_id, 0) == Leader(1, 1)
    assert one.leader(grown.topic_id, 1) == Leader(1, 1)
    # Bounded: a claim that never answers does not hold CreateTopics past the timeout.
    gate.clear()
    topics.append(TopicRef("stuck", uuid.UUID(int=9), 1))
    assert one.leads("stuck", 0)
    await asyncio.wait_for(one.claims_settled(0.05), 5)
    assert one.leader(uuid.UUID(int=9), 0) is None
    gate.set()
