"""The simple assignor: coverage, balance, sharing and stickiness."""

from __future__ import annotations

import uuid
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.assignor import AssignorMember, TopicMetadata, assign

T1 = uuid.UUID(int=1)
T2 = uuid.UUID(int=2)
T3 = uuid.UUID(int=3)


def topics(*counts: int) -> dict[uuid.UUID, TopicMetadata]:
    return {
        uuid.UUID(int=i + 1): TopicMetadata(uuid.UUID(int=i + 1), f"t{i + 1}", n)
        for i, n in enumerate(counts)
    }


def members(n: int, subscription: frozenset[str], current=None) -> list[AssignorMember]:
    current = current or {}
    return [
        AssignorMember(f"m{i:02d}", subscription, current.get(f"m{i:02d}", {})) for i in range(n)
    ]


def pairs(assignment) -> set[tuple[uuid.UUID, int]]:
    return {(t, p) for parts in assignment.values() for t, ps in parts.items() for p in ps}


def member_pairs(parts) -> set[tuple[uuid.UUID, int]]:
    return {(t, p) for t, ps in parts.items() for p in ps}


def all_partitions(meta) -> set[tuple[uuid.UUID, int]]:
    return {(t.topic_id, p) for t in meta.values() for p in range(t.num_partitions)}


# -- examples ---------------------------------------------------------------


def test_single_member_gets_every_partition() -> None:
    result = assign(members(1, frozenset({"t1", "t2"})), topics(3, 2))
    assert result == {"m00": {T1: frozenset({0, 1, 2}), T2: frozenset({0, 1})}}


def test_partitions_split_evenly_between_members() -> None:
    result = assign(members(2, frozenset({"t1"})), topics(4))
    assert sorted(len(a[T1]) for a in result.values()) == [2, 2]
    assert pairs(result) == {(T1, p) for p in range(4)}


def test_more_members_than_partitions_share_partitions() -> None:
    result = assign(members(5, frozenset({"t1"})), topics(2))
    assert all(len(member_pairs(a)) == 1 for a in result.values())
    sharing = Counter(p for a in result.values() for p in a[T1])
    assert sorted(sharing.values()) == [2, 3]


def test_one_partition_is_shared_by_every_member() -> None:
    result = assign(members(3, frozenset({"t1"})), topics(1))
    assert all(a == {T1: frozenset({0})} for a in result.values())


def test_unknown_topic_is_ignored_and_member_gets_nothing() -> None:
    result = assign(members(1, frozenset({"missing"})), topics(2))
    assert result == {"m00": {}}


def test_members_only_get_partitions_of_topics_they_subscribe_to() -> None:
    meta = topics(2, 3)
    result = assign(
        [AssignorMember("a", frozenset({"t1"})), AssignorMember("b", frozenset({"t2"}))], meta
    )
    assert result == {"a": {T1: frozenset({0, 1})}, "b": {T2: frozenset({0, 1, 2})}}


def test_heterogeneous_subscriptions_cover_every_partition() -> None:
    meta = topics(2, 2, 1)
    result = assign(
        [
            AssignorMember("a", frozenset({"t1", "t2"})),
            AssignorMember("b", frozenset({"t2", "t3"})),
            AssignorMember("c", frozenset({"t1"})),
        ],
        meta,
    )
    assert pairs(result) == all_partitions(meta)
    assert all(member_pairs(a) for a in result.values())


def test_assignment_is_deterministic_whatever_the_input_order() -> None:
    ms = members(4, frozenset({"t1", "t2"}))
    assert assign(ms, topics(5, 3)) == assign(list(reversed(ms)), topics(5, 3))


def test_current_assignment_is_kept_when_nothing_changes() -> None:
    current = {"m00": {T1: frozenset({3, 1})}, "m01": {T1: frozenset({0, 2})}}
    result = assign(members(2, frozenset({"t1"}), current), topics(4))
    assert result == current


# -- properties ---------------------------------------------------------------

partition_counts = st.lists(st.integers(1, 8), min_size=1, max_size=3)


@settings(max_examples=200, deadline=None)
@given(counts=partition_counts, n=st.integers(1, 14))
def test_every_subscribed_partition_is_assigned(counts: list[int], n: int) -> None:
    meta = topics(*counts)
    result = assign(members(n, frozenset(t.name for t in meta.values())), meta)
    assert pairs(result) == all_partitions(meta)


@settings(max_examples=200, deadline=None)
@given(counts=partition_counts, n=st.integers(1, 14))
def test_balance_within_one_when_members_at_most_partitions(counts: list[int], n: int) -> None:
    meta = topics(*counts)
    total = sum(counts)
    if n > total:
        n = total
    result = assign(members(n, frozenset(t.name for t in meta.values())), meta)
    sizes = [len(member_pairs(a)) for a in result.values()]
    assert max(sizes) - min(sizes) <= 1
    # No sharing needed: each partition goes to exactly one member.
    assert sum(sizes) == total


@settings(max_examples=200, deadline=None)
@given(counts=partition_counts, extra=st.integers(1, 10))
def test_every_member_gets_work_when_members_exceed_partitions(
    counts: list[int], extra: int
) -> None:
    meta = topics(*counts)
    n = sum(counts) + extra
    result = assign(members(n, frozenset(t.name for t in meta.values())), meta)
    assert all(len(member_pairs(a)) == 1 for a in result.values())
    sharing = Counter(tp for a in result.values() for tp in member_pairs(a))
    assert len(sharing) == sum(counts)
    assert max(sharing.values()) - min(sharing.values()) <= 1


@settings(max_examples=200, deadline=None)
@given(
    counts=partition_counts,
    subscriptions=st.lists(st.sets(st.sampled_from(["t1", "t2", "t3", "nope"])), max_size=10),
)
def test_heterogeneous_groups_cover_subscribed_partitions_and_give_everyone_work(
    counts: list[int], subscriptions: list[set[str]]
) -> None:
    meta = topics(*counts)
    names = {t.name: t.topic_id for t in meta.values()}
    ms = [AssignorMember(f"m{i}", frozenset(s)) for i, s in enumerate(subscriptions)]
    result = assign(ms, meta)
    subscribed = {names[n] for m in ms for n in m.subscribed_topic_names if n in names}
    assert pairs(result) == {tp for tp in all_partitions(meta) if tp[0] in subscribed}
    for m in ms:
        allowed = {names[n] for n in m.subscribed_topic_names if n in names}
        assert set(result[m.member_id]) <= allowed
        assert bool(result[m.member_id]) == bool(allowed)


@settings(max_examples=300, deadline=None)
@given(counts=partition_counts, n=st.integers(1, 14))
def test_a_joining_member_moves_only_its_share(counts: list[int], n: int) -> None:
    meta = topics(*counts)
    subscription = frozenset(t.name for t in meta.values())
    total = sum(counts)
    before = assign(members(n, subscription), meta)
    after = assign(members(n + 1, subscription, before), meta)
    lost = sum(len(member_pairs(before[m]) - member_pairs(after[m])) for m in before)
    bound = -(-total // (n + 1)) if n + 1 <= total else 0
    assert lost <= bound
    assert after[f"m{n:02d}"]


@settings(max_examples=300, deadline=None)
@given(counts=partition_counts, n=st.integers(2, 14), data=st.data())
def test_a_leaving_member_moves_at_most_one_other_partition(
    counts: list[int], n: int, data: st.DataObject
) -> None:
    meta = topics(*counts)
    subscription = frozenset(t.name for t in meta.values())
    before = assign(members(n, subscription), meta)
    leaver = data.draw(st.sampled_from(sorted(before)))
    remaining = [m for m in members(n, subscription, before) if m.member_id != leaver]
    after = assign(remaining, meta)
    lost = sum(
        len(member_pairs(before[m.member_id]) - member_pairs(after[m.member_id])) for m in remaining
    )
    assert lost <= 1
    assert pairs(after) == all_partitions(meta)


@settings(max_examples=200, deadline=None)
@given(counts=partition_counts, n=st.integers(1, 14))
def test_reassigning_a_stable_assignment_changes_nothing(counts: list[int], n: int) -> None:
    meta = topics(*counts)
    subscription = frozenset(t.name for t in meta.values())
    first = assign(members(n, subscription), meta)
    assert assign(members(n, subscription, first), meta) == first


# -- assignable partitions (Kafka 4.2: only initialized share partitions) ----------


def test_only_assignable_partitions_are_assigned_and_balanced() -> None:
    meta = topics(4, 2)
    result = assign(members(2, frozenset({"t1", "t2"})), meta, {T1: [0, 2, 3]})
    assert pairs(result) == {(T1, 0), (T1, 2), (T1, 3)}
    assert sorted(len(member_pairs(parts)) for parts in result.values()) == [1, 2]


def test_no_assignable_partitions_assigns_nothing_but_lists_every_member() -> None:
    result = assign(members(3, frozenset({"t1"})), topics(4), {})
    assert result == {"m00": {}, "m01": {}, "m02": {}}


def test_assignable_partitions_outside_the_topic_are_ignored() -> None:
    result = assign(members(1, frozenset({"t1"})), topics(2), {T1: [0, 1, 7], T3: [0]})
    assert pairs(result) == {(T1, 0), (T1, 1)}
