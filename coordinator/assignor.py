"""The simple assignor for share groups (Kafka's `SimpleAssignor`, KIP-932).

Share groups do not own partitions exclusively, so the rules differ from a consumer
group's assignor:

- every subscribed partition is assigned to at least one subscribed member;
- with fewer members than partitions each partition goes to exactly one member and
  members' counts differ by at most one;
- with more members than partitions each member gets exactly one partition and
  the partitions are shared by as even a number of members as possible;
- the current assignment is kept where the balance allows, so a member joining or
  leaving moves only the partitions it must (balance first, then stickiness, as in
  Kafka's `SimpleHomogeneousAssignmentBuilder`).

Members with the same set of subscribed topics are balanced together over all the
partitions of those topics; topics with different subscriber sets are balanced
separately (as Kafka's heterogeneous builder does per topic), with ties broken
towards the member that has the least work so far. The function is pure and
deterministic: the same input always gives the same output.

Only assignable partitions are assigned: Kafka 4.2 builds a share group's target
assignment from the partitions whose share state is initialized
(`TargetAssignmentBuilder.withTopicAssignablePartitionsMap`, KAFKA-18827), so
`assign` takes them as `assignable`; a subscribed topic with none is left out.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = [
    "SIMPLE_ASSIGNOR_NAME",
    "Assignment",
    "AssignorMember",
    "TopicMetadata",
    "assign",
]

SIMPLE_ASSIGNOR_NAME = "simple"

# topic id -> partitions; what one member is assigned.
Assignment = Mapping[uuid.UUID, frozenset[int]]

_TopicIdPartition = tuple[uuid.UUID, int]


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    """What the assignor needs to know about one topic."""

    topic_id: uuid.UUID
    name: str
    num_partitions: int


@dataclass(frozen=True, slots=True)
class AssignorMember:
    """One member as the assignor sees it: its subscription and current assignment."""

    member_id: str
    subscribed_topic_names: frozenset[str]
    current_assignment: Assignment = field(default_factory=dict)


def assign(
    members: Iterable[AssignorMember],
    topics: Mapping[uuid.UUID, TopicMetadata],
    assignable: Mapping[uuid.UUID, Iterable[int]] | None = None,
) -> dict[str, dict[uuid.UUID, frozenset[int]]]:
    """Compute the target assignment: member id -> {topic id: partitions}.

    `topics` is the cluster's topic metadata keyed by topic id; subscribed names that
    are not in it are ignored (the topic does not exist yet). `assignable`, if given,
    limits each topic to those of its partitions (Kafka's assignable partitions map:
    a topic not in it has none). Every member appears in the result, with an empty
    mapping when it has nothing to do.
    """
    members = sorted(members, key=lambda m: m.member_id)
    topic_id_by_name = {t.name: t.topic_id for t in topics.values()}

    def partitions_of(topic_id: uuid.UUID) -> list[int]:
        every = range(topics[topic_id].num_partitions)
        if assignable is None:
            return list(every)
        allowed = frozenset(assignable.get(topic_id, ()))
        return [p for p in every if p in allowed]

    # Subscribers of each existing topic with partitions to assign.
    subscribers: dict[uuid.UUID, list[str]] = {}
    for member in members:
        for name in sorted(member.subscribed_topic_names):
            topic_id = topic_id_by_name.get(name)
            if topic_id is not None and partitions_of(topic_id):
                subscribers.setdefault(topic_id, []).append(member.member_id)

    # Topics with identical subscriber sets are balanced as one pool.
    pools: dict[tuple[str, ...], list[_TopicIdPartition]] = {}
    for topic_id in sorted(subscribers):
        key = tuple(subscribers[topic_id])
        pool = pools.setdefault(key, [])
        pool.extend((topic_id, p) for p in partitions_of(topic_id))

    current: dict[str, set[_TopicIdPartition]] = {
        m.member_id: {(t, p) for t, parts in m.current_assignment.items() for p in parts}
        for m in members
    }
    result: dict[str, set[_TopicIdPartition]] = {m.member_id: set() for m in members}
    load = dict.fromkeys(result, 0)

    # Bigger pools first, so the small ones can even out the load they leave.
    for pool_members, partitions in sorted(pools.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        partitions.sort()
        if len(pool_members) <= len(partitions):
            chosen = _assign_exclusive(list(pool_members), partitions, current, load)
        else:
            chosen = _assign_shared(list(pool_members), partitions, current, load)
        for member_id, tps in chosen.items():
            result[member_id] |= tps
            load[member_id] += len(tps)

    return {member_id: _by_topic(tps) for member_id, tps in result.items()}


def _assign_exclusive(
    members: list[str],
    partitions: list[_TopicIdPartition],
    current: Mapping[str, set[_TopicIdPartition]],
    load: Mapping[str, int],
) -> dict[str, set[_TopicIdPartition]]:
    """Members <= partitions: each partition to exactly one member, counts within one."""
    in_pool = set(partitions)
    kept_candidates = {m: sorted(current[m] & in_pool) for m in members}
    base, extra = divmod(len(partitions), len(members))
    # Members already holding the most keep the larger quotas: fewest moves.
    order = sorted(members, key=lambda m: (-len(kept_candidates[m]), load[m], m))
    quota = {m: base + (1 if i < extra else 0) for i, m in enumerate(order)}

    chosen: dict[str, set[_TopicIdPartition]] = {m: set() for m in members}
    taken: set[_TopicIdPartition] = set()
    for m in order:
        for tp in kept_candidates[m]:
            if len(chosen[m]) >= quota[m]:
                break
            if tp not in taken:
                chosen[m].add(tp)
                taken.add(tp)

    unassigned = iter(tp for tp in partitions if tp not in taken)
    for m in order:
        while len(chosen[m]) < quota[m]:
            chosen[m].add(next(unassigned))
    return chosen


def _assign_shared(
    members: list[str],
    partitions: list[_TopicIdPartition],
    current: Mapping[str, set[_TopicIdPartition]],
    load: Mapping[str, int],
) -> dict[str, set[_TopicIdPartition]]:
    """Members > partitions: each member gets one partition, sharing counts within one."""
    in_pool = set(partitions)
    holders = {tp: 0 for tp in partitions}
    for m in members:
        for tp in current[m] & in_pool:
            holders[tp] += 1
    base, extra = divmod(len(members), len(partitions))
    # Partitions already shared the most keep the larger capacities: fewest moves.
    order = sorted(partitions, key=lambda tp: (-holders[tp], tp))
    capacity = {tp: base + (1 if i < extra else 0) for i, tp in enumerate(order)}

    chosen: dict[str, set[_TopicIdPartition]] = {}
    # Members holding fewer candidates choose first, so they are not crowded out.
    by_choice = sorted(members, key=lambda m: (len(current[m] & in_pool), load[m], m))
    waiting: list[str] = []
    for m in by_choice:
        for tp in sorted(current[m] & in_pool, key=lambda tp: (-capacity[tp], tp)):
            if capacity[tp] > 0:
                capacity[tp] -= 1
                chosen[m] = {tp}
                break
        else:
            waiting.append(m)

    free = (tp for tp in order for _ in range(capacity[tp]))
    for m in sorted(waiting, key=lambda m: (load[m], m)):
        chosen[m] = {next(free)}
    return chosen


def _by_topic(tps: Iterable[_TopicIdPartition]) -> dict[uuid.UUID, frozenset[int]]:
    grouped: dict[uuid.UUID, set[int]] = {}
    for topic_id, partition in tps:
        grouped.setdefault(topic_id, set()).add(partition)
    return {topic_id: frozenset(parts) for topic_id, parts in sorted(grouped.items())}
