"""Server-side assignors of KIP-848 consumer groups: `uniform` (the default) and `range`.

The group coordinator computes a consumer group's target assignment itself (KIP-848);
the member's `ServerAssignor` (or `group.consumer.assignors`' first entry) names the
assignor. Kafka 4.2 ships these two, and spool follows their behaviour:

- **uniform** (Kafka's `UniformAssignor`): balance first, stickiness second. When
  every member subscribes to the same topics (a *homogeneous* group) each member
  gets `total // members` partitions and `total % members` of them one more; a
  member keeps the partitions it holds up to its quota, gives up only the excess
  and the partitions of topics it no longer subscribes to, and the freed and
  never-assigned partitions fill the members below quota in member order. So a
  member joining takes only what it needs from the others, and a member leaving
  only spreads its own partitions. When subscriptions differ (*heterogeneous*),
  each member keeps what it holds of its topics, the unassigned partitions of each
  topic go to its least-loaded subscribers (topics with the most partitions per
  subscriber first), then partitions move from the most- to the least-loaded
  subscribers of each topic until no move improves the balance (at most 16
  passes over the topics, as Kafka bounds it).
- **range** (Kafka's `RangeAssignor`): for every topic the subscribers, sorted with
  static members first by `group.instance.id` and then dynamic members by member
  id, each take a contiguous range: `partitions // subscribers`, and the first
  `partitions % subscribers` of them one more. It is not sticky (as in Kafka: the
  current assignment is not an input), but it is stable: the same members get the
  same ranges, and co-partitioned topics are assigned alike.

Where Kafka iterates hash maps (member ids, topic ids, partitions of a set), spool
sorts: members by member id and topic ids as Kafka's `Uuid.compareTo` orders them
(most then least significant 64 bits, signed), and partitions ascending, so the
result is deterministic for the same input. String order is Java's (UTF-16 code
units). Where Kafka's own output depends on hash order (which topic's free
partitions are handed out first, which members take the extra partition), spool's
may differ in *which* partitions a member gets, never in how many or in what a
member keeps.

Racks are ignored: neither Kafka assignor in 4.2 balances by rack for consumer
groups, and spool runs as one rack, so `rack_id` is carried but unused.

Input rules: only subscribed topics present in `topics` are assigned (a subscription
to a topic that does not exist yet assigns nothing); a member's current assignment
is cleaned before use (topics it does not subscribe to, partitions beyond the
topic's count and partitions also held by a member earlier in member order are
dropped), since Kafka's assignors assume the current target assignment is exact.
Every member appears in the result, with an empty mapping when it gets nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from coordinator.assignor import TopicMetadata

__all__ = [
    "ASSIGNORS",
    "DEFAULT_ASSIGNOR",
    "AssignmentDict",
    "ConsumerAssignor",
    "MemberSubscription",
    "RangeAssignor",
    "UniformAssignor",
]

# topic id -> partitions: one member's assignment (as coordinator/consumer_group.py has it).
AssignmentDict = dict[uuid.UUID, frozenset[int]]

# Kafka's bound on the heterogeneous balancing passes (UniformHeterogeneousAssignmentBuilder).
_MAX_BALANCE_ITERATIONS = 16


@dataclass(frozen=True, slots=True)
class MemberSubscription:
    """One member as an assignor sees it (Kafka's `MemberSubscriptionAndAssignment`)."""

    member_id: str
    instance_id: str | None
    rack_id: str | None
    subscribed_topic_ids: frozenset[uuid.UUID]
    current: AssignmentDict  # the member's current target assignment, for stickiness


class ConsumerAssignor(Protocol):
    """A server-side assignor: members and topic metadata in, target assignment out."""

    name: str

    def assign(
        self,
        members: Mapping[str, MemberSubscription],
        topics: Mapping[uuid.UUID, TopicMetadata],
    ) -> dict[str, AssignmentDict]: ...


def _java_string_key(s: str) -> bytes:
    """Sort key giving Java's `String.compareTo` order (UTF-16 code units)."""
    return s.encode("utf-16-be", "surrogatepass")


def _to_signed64(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


def _uuid_key(topic_id: uuid.UUID) -> tuple[int, int]:
    """Sort key giving Kafka's `Uuid.compareTo` order (signed 64-bit halves)."""
    return _to_signed64(topic_id.int >> 64), _to_signed64(topic_id.int & ((1 << 64) - 1))


def _member_order(members: Mapping[str, MemberSubscription]) -> list[str]:
    return sorted(members, key=_java_string_key)


def _subscriptions(
    members: Mapping[str, MemberSubscription],
    order: list[str],
    topics: Mapping[uuid.UUID, TopicMetadata],
) -> dict[str, frozenset[uuid.UUID]]:
    """Each member's subscribed topic ids that exist (with at least one partition)."""
    return {
        m: frozenset(
            t
            for t in members[m].subscribed_topic_ids
            if t in topics and topics[t].num_partitions > 0
        )
        for m in order
    }


def _clean_current(
    members: Mapping[str, MemberSubscription],
    order: list[str],
    subs: Mapping[str, frozenset[uuid.UUID]],
    topics: Mapping[uuid.UUID, TopicMetadata],
) -> dict[str, dict[uuid.UUID, list[int]]]:
    """Each member's current partitions of its subscribed topics, sorted, each partition at
    most once in the group (the first member in `order` keeps a partition held twice)."""
    taken: set[tuple[uuid.UUID, int]] = set()
    cleaned: dict[str, dict[uuid.UUID, list[int]]] = {}
    for m in order:
        own: dict[uuid.UUID, list[int]] = {}
        for t in sorted(members[m].current, key=_uuid_key):
            if t not in subs[m]:
                continue
            count = topics[t].num_partitions
            kept = []
            for p in sorted(members[m].current[t]):
                if 0 <= p < count and (t, p) not in taken:
                    taken.add((t, p))
                    kept.append(p)
            if kept:
                own[t] = kept
        cleaned[m] = own
    return cleaned


def _freeze(assignment: Mapping[uuid.UUID, Iterable[int]]) -> AssignmentDict:
    return {t: frozenset(ps) for t, ps in assignment.items() if ps}


class UniformAssignor:
    """Kafka's `uniform` assignor: balanced, then sticky (see the module docstring)."""

    name: str = "uniform"

    def assign(
        self,
        members: Mapping[str, MemberSubscription],
        topics: Mapping[uuid.UUID, TopicMetadata],
    ) -> dict[str, AssignmentDict]:
        order = _member_order(members)
        if not order:
            return {}
        subs = _subscriptions(members, order, topics)
        current = _clean_current(members, order, subs, topics)
        if len(set(subs.values())) == 1:
            result = _uniform_homogeneous(order, subs[order[0]], current, topics)
        else:
            result = _uniform_heterogeneous(order, subs, current, topics)
        return {m: _freeze(result.get(m, {})) for m in order}


def _uniform_homogeneous(
    order: list[str],
    subscribed: frozenset[uuid.UUID],
    current: Mapping[str, Mapping[uuid.UUID, list[int]]],
    topics: Mapping[uuid.UUID, TopicMetadata],
) -> dict[str, dict[uuid.UUID, list[int]]]:
    """Kafka's UniformHomogeneousAssignmentBuilder: quotas of total // members, the
    first members by need keep an extra one, members keep their partitions up to quota."""
    if not subscribed:
        return {}
    held = {(t, p) for own in current.values() for t, ps in own.items() for p in ps}
    unassigned: list[tuple[uuid.UUID, int]] = []
    total = 0
    for t in sorted(subscribed, key=_uuid_key):
        count = topics[t].num_partitions
        unassigned.extend((t, p) for p in range(count) if (t, p) not in held)
        total += count
    min_quota, extra_left = divmod(total, len(order))

    target: dict[str, dict[uuid.UUID, list[int]]] = {}
    unfilled: list[tuple[str, int]] = []
    for index, m in enumerate(order):
        quota = min_quota
        has_extra = extra_left > 0
        if has_extra:
            quota += 1
        kept: dict[uuid.UUID, list[int]] = {}
        for t, ps in current[m].items():  # sorted by topic id, partitions ascending
            if len(ps) <= quota:
                kept[t] = list(ps)
                quota -= len(ps)
            else:
                kept_ps = ps[:quota]
                unassigned.extend((t, p) for p in ps[quota:])
                quota = 0
                if kept_ps:
                    kept[t] = kept_ps
        # Give up the extra slot for a later member to claim, unless this member is
        # one of the last `extra_left` and must take it.
        if quota > 0 and has_extra and len(order) - index > extra_left:
            quota -= 1
            has_extra = False
        if quota > 0:
            unfilled.append((m, quota))
        if has_extra:
            extra_left -= 1
        target[m] = kept

    next_index = 0
    for m, quota in unfilled:
        for _ in range(quota):
            if next_index >= len(unassigned):
                break
            t, p = unassigned[next_index]
            next_index += 1
            target[m].setdefault(t, []).append(p)
    if next_index < len(unassigned):  # pragma: no cover - the quotas add up to the total
        raise AssertionError("uniform assignor left partitions unassigned")
    return target


class _Balancer:
    """Kafka's MemberAssignmentBalancer: walks a topic's subscribers by load, handing
    out the least-loaded (rising level by level) and the most-loaded (falling)."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes
        self.sorted: list[int] = []
        self.least_end = 0
        self.least_count = -1
        self.next_least = 0
        self.most_start = 0
        self.most_end = 0
        self.most_count = 1
        self.next_most = -1

    def initialize(self, members: list[int]) -> int:
        sizes = self.sizes
        self.sorted = sorted(members, key=lambda i: (sizes[i], i))
        self.least_end = 0
        self.least_count = sizes[self.sorted[0]] - 1
        self.next_least = 0
        n = len(self.sorted)
        self.most_start = n
        self.most_end = n
        self.most_count = sizes[self.sorted[-1]] + 1
        self.next_most = n - 1
        return sizes[self.sorted[-1]] - sizes[self.sorted[0]]

    def next_least_loaded(self) -> int:
        if self.next_least >= self.least_end:
            self.least_count += 1
            while (
                self.least_end < len(self.sorted)
                and self.sizes[self.sorted[self.least_end]] == self.least_count
            ):
                self.least_end += 1
            self.next_least = 0
        member = self.sorted[self.next_least]
        self.next_least += 1
        return member

    def next_most_loaded(self) -> int:
        if self.next_most < self.most_start:
            if self.most_end <= self.most_start and self.most_start > 0:
                self.most_count = self.sizes[self.sorted[self.most_start - 1]]
            else:
                self.most_count -= 1
            while (
                self.most_start > 0
                and self.sizes[self.sorted[self.most_start - 1]] == self.most_count
            ):
                self.most_start -= 1
            self.next_most = self.most_end - 1
        if self.next_most < 0:
            return -1
        member = self.sorted[self.next_most]
        self.next_most -= 1
        return member

    def exclude_most_loaded(self) -> None:
        i = self.next_most + 1
        s = self.sorted
        s[i], s[self.most_end - 1] = s[self.most_end - 1], s[i]
        self.most_end -= 1

    def is_balanced(self) -> bool:
        return self.most_count - self.least_count <= 1


def _uniform_heterogeneous(
    order: list[str],
    subs: Mapping[str, frozenset[uuid.UUID]],
    current: Mapping[str, Mapping[uuid.UUID, list[int]]],
    topics: Mapping[uuid.UUID, TopicMetadata],
) -> dict[str, dict[uuid.UUID, list[int]]]:
    """Kafka's UniformHeterogeneousAssignmentBuilder (see the module docstring)."""
    subscribers: dict[uuid.UUID, list[int]] = {}
    for index, m in enumerate(order):
        for t in sorted(subs[m], key=_uuid_key):
            subscribers.setdefault(t, []).append(index)
    if not subscribers:
        return {}
    sizes = [0] * len(order)
    owners: dict[uuid.UUID, list[int]] = {t: [-1] * topics[t].num_partitions for t in subscribers}
    target: dict[str, dict[uuid.UUID, set[int]]] = {}
    for index, m in enumerate(order):
        own: dict[uuid.UUID, set[int]] = {}
        for t, ps in current[m].items():
            own[t] = set(ps)
            sizes[index] += len(ps)
            for p in ps:
                owners[t][p] = index
        target[m] = own

    def topic_key(t: uuid.UUID) -> tuple[float, int, tuple[int, int]]:
        n = len(subscribers[t])
        return (-topics[t].num_partitions / n, n, _uuid_key(t))

    def move(t: uuid.UUID, p: int, to: int) -> None:
        old = owners[t][p]
        if old != -1:
            old_parts = target[order[old]][t]
            old_parts.discard(p)
            if not old_parts:
                del target[order[old]][t]
            sizes[old] -= 1
        target[order[to]].setdefault(t, set()).add(p)
        owners[t][p] = to
        sizes[to] += 1

    # Assign what no member holds to the least-loaded subscribers.
    balancer = _Balancer(sizes)
    unassigned = {t: [p for p, owner in enumerate(owners[t]) if owner == -1] for t in subscribers}
    for t in sorted((t for t, ps in unassigned.items() if ps), key=topic_key):
        balancer.initialize(subscribers[t])
        for p in unassigned[t]:
            move(t, p, balancer.next_least_loaded())

    # Then move partitions from the most- to the least-loaded subscribers, topic by topic.
    movable = sorted((t for t in subscribers if len(subscribers[t]) >= 2), key=topic_key)
    last_moved = -1
    for _ in range(_MAX_BALANCE_ITERATIONS):
        for topic_index, t in enumerate(movable):
            if topic_index == last_moved:
                return _lists(target)
            moved = _balance_topic(t, balancer, subscribers[t], owners[t], move)
            if moved > 0 or last_moved == -1:
                last_moved = topic_index
    return _lists(target)


def _balance_topic(
    t: uuid.UUID,
    balancer: _Balancer,
    subscribers: list[int],
    owner_of: list[int],
    move: _Move,
) -> int:
    moved = 0
    if balancer.initialize(subscribers) <= 1:
        return moved
    # Partitions grouped by owner, each owner's slice [start, end) in this list.
    partitions = sorted(range(len(owner_of)), key=lambda p: (owner_of[p], p))
    start: dict[int, int] = {}
    end: dict[int, int] = {}
    for i, p in enumerate(partitions):
        start.setdefault(owner_of[p], i)
        end[owner_of[p]] = i + 1
    while not balancer.is_balanced():
        while True:
            most = balancer.next_most_loaded()
            if most == -1:
                break
            if most not in end or end[most] - start[most] <= 0:
                balancer.exclude_most_loaded()
                continue
            break
        if most == -1:
            break
        end[most] -= 1
        p = partitions[end[most]]
        least = balancer.next_least_loaded()
        if balancer.is_balanced():
            break
        move(t, p, least)
        moved += 1
    return moved


class _Move(Protocol):
    def __call__(self, t: uuid.UUID, p: int, to: int) -> None: ...


def _lists(
    target: Mapping[str, Mapping[uuid.UUID, set[int]]],
) -> dict[str, dict[uuid.UUID, list[int]]]:
    return {m: {t: sorted(ps) for t, ps in own.items()} for m, own in target.items()}


def _range_order(members: Mapping[str, MemberSubscription]) -> list[str]:
    """Kafka's RangeAssignor member order: static members first by instance id, then
    dynamic members by member id."""

    def key(m: str) -> tuple[int, bytes]:
        instance_id = members[m].instance_id
        if instance_id is not None:
            return (0, _java_string_key(instance_id))
        return (1, _java_string_key(m))

    return sorted(members, key=key)


class RangeAssignor:
    """Kafka's `range` assignor: contiguous ranges per topic (see the module docstring)."""

    name: str = "range"

    def assign(
        self,
        members: Mapping[str, MemberSubscription],
        topics: Mapping[uuid.UUID, TopicMetadata],
    ) -> dict[str, AssignmentDict]:
        order = _range_order(members)
        subs = _subscriptions(members, order, topics)
        counts: dict[uuid.UUID, int] = {}
        for m in order:
            for t in subs[m]:
                counts[t] = counts.get(t, 0) + 1
        # Per topic: [next range start, partitions per member, members left with an extra one].
        state = {t: [0, *divmod(topics[t].num_partitions, n)] for t, n in counts.items()}
        result: dict[str, AssignmentDict] = {}
        for m in order:
            own: AssignmentDict = {}
            for t in sorted(subs[m], key=_uuid_key):
                st = state[t]
                quota = st[1]
                if st[2] > 0:
                    quota += 1
                    st[2] -= 1
                begin = st[0]
                stop = min(begin + quota, topics[t].num_partitions)
                st[0] = stop
                if begin < stop:
                    own[t] = frozenset(range(begin, stop))
            result[m] = own
        return {m: result[m] for m in _member_order(members)}


DEFAULT_ASSIGNOR = "uniform"

ASSIGNORS: dict[str, ConsumerAssignor] = {
    UniformAssignor.name: UniformAssignor(),
    RangeAssignor.name: RangeAssignor(),
}
