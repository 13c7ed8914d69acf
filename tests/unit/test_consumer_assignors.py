"""The KIP-848 server-side assignors: `uniform` and `range` (coordinator/consumer_assignors.py).

Exact cases are ported from Kafka 4.2's UniformHeterogeneousAssignmentBuilderTest,
OptimizedUniformAssignmentBuilderTest (the homogeneous builder) and RangeAssignorTest,
where the expected result does not depend on Java's hash-map iteration order.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.assignor import TopicMetadata
from coordinator.consumer_assignors import (
    ASSIGNORS,
    DEFAULT_ASSIGNOR,
    AssignmentDict,
    MemberSubscription,
    RangeAssignor,
    UniformAssignor,
)

UNIFORM = UniformAssignor()
RANGE = RangeAssignor()


def kafka_uuid(s: str) -> uuid.UUID:
    """Kafka's Uuid.fromString: URL-safe base64 of the 16 bytes."""
    return uuid.UUID(bytes=base64.urlsafe_b64decode(s + "=="))


T1 = kafka_uuid("T1-A4s3VTwiI5CTbEp6POw")
T2 = kafka_uuid("T2-B4s3VTwiI5YHbPp6YUe")
T3 = kafka_uuid("T3-CU8fVTLCz5YMkLoDQsa")
T4 = kafka_uuid("T4-Tw9fVTLCz5HbPp6YQsa")


def topics_of(**counts: int) -> dict[uuid.UUID, TopicMetadata]:
    ids = {"t1": T1, "t2": T2, "t3": T3, "t4": T4}
    return {ids[n]: TopicMetadata(ids[n], n, c) for n, c in counts.items()}


def member(
    member_id: str,
    subscribed: set[uuid.UUID],
    current: Mapping[uuid.UUID, set[int]] | None = None,
    instance_id: str | None = None,
) -> MemberSubscription:
    return MemberSubscription(
        member_id=member_id,
        instance_id=instance_id,
        rack_id=None,
        subscribed_topic_ids=frozenset(subscribed),
        current={t: frozenset(ps) for t, ps in (current or {}).items()},
    )


def group(*members: MemberSubscription) -> dict[str, MemberSubscription]:
    return {m.member_id: m for m in members}


def A(**parts: set[int]) -> AssignmentDict:
    ids = {"t1": T1, "t2": T2, "t3": T3, "t4": T4}
    return {ids[n]: frozenset(ps) for n, ps in parts.items()}


def test_registry_names_kafkas_assignors() -> None:
    assert DEFAULT_ASSIGNOR == "uniform"
    assert set(ASSIGNORS) == {"uniform", "range"}
    assert all(a.name == n for n, a in ASSIGNORS.items())


# ---------------------------------------------------------------- uniform, exact cases


def test_uniform_one_member_no_subscription_or_missing_topic() -> None:
    topics = topics_of(t1=3)
    for assignor in (UNIFORM, RANGE):
        assert assignor.assign(group(member("A", set())), topics) == {"A": {}}
        assert assignor.assign(group(member("A", {T2})), topics) == {"A": {}}
        assert assignor.assign({}, topics) == {}


def test_uniform_homogeneous_unbalanced_previous_assignment() -> None:
    # OptimizedUniformAssignmentBuilderTest
    # .testReassignmentForTwoMembersTwoTopicsGivenUnbalancedPrevAssignment
    topics = topics_of(t1=3, t2=3)
    members = group(
        member("A", {T1, T2}, A(t1={0, 1}, t2={0, 1})),
        member("B", {T1, T2}, A(t1={2}, t2={2})),
    )
    assert UNIFORM.assign(members, topics) == {
        "A": A(t1={0, 1}, t2={0}),
        "B": A(t1={2}, t2={1, 2}),
    }


def test_uniform_homogeneous_partitions_added() -> None:
    # ...testReassignmentWhenPartitionsAreAddedForTwoMembersTwoTopics
    topics = topics_of(t1=6, t2=5)
    members = group(
        member("A", {T1, T2}, A(t1={0, 2}, t2={0})),
        member("B", {T1, T2}, A(t1={1}, t2={1, 2})),
    )
    # Kafka's test expects A t1={0, 2} t2={0, 3, 4} and B t1={1, 3, 4, 5} t2={1, 2}: the
    # same counts and kept partitions; Kafka hands out the new partitions in its HashSet's
    # topic order, spool in topic id order.
    assert UNIFORM.assign(members, topics) == {
        "A": A(t1={0, 2, 3, 4}, t2={0}),
        "B": A(t1={1, 5}, t2={1, 2, 3, 4}),
    }


def test_uniform_homogeneous_member_added() -> None:
    # ...testReassignmentWhenOneMemberAddedAfterInitialAssignmentWithTwoMembersTwoTopics
    topics = topics_of(t1=3, t2=3)
    members = group(
        member("A", {T1, T2}, A(t1={0, 2}, t2={0})),
        member("B", {T1, T2}, A(t1={1}, t2={1, 2})),
        member("C", {T1, T2}),
    )
    assert UNIFORM.assign(members, topics) == {
        "A": A(t1={0, 2}),
        "B": A(t1={1}, t2={1}),
        "C": A(t2={0, 2}),
    }


def test_uniform_homogeneous_more_members_than_partitions() -> None:
    topics = topics_of(t3=2)
    result = UNIFORM.assign(group(*(member(m, {T3}) for m in "ABC")), topics)
    assert sorted(len(a.get(T3, ())) for a in result.values()) == [0, 1, 1]
    assert set(result) == {"A", "B", "C"}


def test_uniform_heterogeneous_first_assignment() -> None:
    # UniformHeterogeneousAssignmentBuilderTest.testFirstAssignmentTwoMembersTwoTopics
    topics = topics_of(t1=3, t3=6)
    members = group(member("A", {T1, T3}), member("B", {T3}))
    assert UNIFORM.assign(members, topics) == {
        "A": A(t1={0, 1, 2}, t3={4}),
        "B": A(t3={0, 1, 2, 3, 5}),
    }


def test_uniform_heterogeneous_unbalanced_previous_assignment() -> None:
    # ...testReassignmentForTwoMembersThreeTopicsGivenUnbalancedPrevAssignment
    topics = topics_of(t1=6, t2=4, t3=4)
    members = group(
        member("A", {T1}, A(t1={0, 1, 2})),
        member("B", {T1, T2}, A(t1={3}, t2={0})),
        member("C", {T1, T2, T3}, A(t1={4, 5}, t2={1, 2, 3}, t3={0, 1, 2, 3})),
    )
    assert UNIFORM.assign(members, topics) == {
        "A": A(t1={0, 1, 2, 5}),
        "B": A(t1={3}, t2={0, 1, 2, 3}),
        "C": A(t1={4}, t3={0, 1, 2, 3}),
    }


def test_uniform_heterogeneous_partitions_added() -> None:
    # ...testReassignmentWhenPartitionsAreAddedForTwoMembers
    topics = topics_of(t1=6, t2=5, t3=3, t4=3)
    members = group(
        member("A", {T1, T3}, A(t1={0, 1, 2, 3}, t3={0, 1})),
        member("B", {T1, T2, T3, T4}, A(t2={0, 1, 2}, t4={0, 1, 2})),
    )
    assert UNIFORM.assign(members, topics) == {
        "A": A(t1={0, 1, 2, 3, 4, 5}, t3={0, 1, 2}),
        "B": A(t2={0, 1, 2, 3, 4}, t4={0, 1, 2}),
    }


def test_uniform_heterogeneous_member_added_and_partitions_added() -> None:
    # ...testReassignmentWhenOneMemberAddedAndPartitionsAddedTwoMembersTwoTopics
    topics = topics_of(t1=6, t2=7)
    members = group(
        member("A", {T1}, A(t1={0, 2}, t2={0})),
        member("B", {T1, T2}, A(t1={1}, t2={1, 2})),
        member("C", {T1, T2}),
    )
    assert UNIFORM.assign(members, topics) == {
        "A": A(t1={0, 2, 3, 4, 5}),
        "B": A(t1={1}, t2={1, 2, 6}),
        "C": A(t2={0, 3, 4, 5}),
    }


def test_uniform_heterogeneous_member_removed() -> None:
    # ...testReassignmentWhenOneMemberRemovedAfterInitialAssignmentWithThreeMembersThreeTopics
    topics = topics_of(t1=3, t2=8, t3=3)
    members = group(
        member("A", {T1, T3}, A(t1={0, 1, 2}, t3={0, 1})),
        member("B", {T2}, A(t2={3, 4, 5, 6})),
    )
    assert UNIFORM.assign(members, topics) == {
        "A": A(t1={0, 1, 2}, t3={0, 1, 2}),
        "B": A(t2=set(range(8))),
    }


def test_uniform_cleans_a_bad_current_assignment() -> None:
    # A partition held twice, one beyond the topic's count, and a topic not subscribed.
    topics = topics_of(t1=2)
    members = group(
        member("A", {T1}, A(t1={0, 1, 7}, t2={0})),
        member("B", {T1}, A(t1={1})),
    )
    result = UNIFORM.assign(members, topics)
    assert result == {"A": A(t1={0}), "B": A(t1={1})}
    assert_valid(members, topics, result)


# ---------------------------------------------------------------- range, exact cases


def test_range_first_assignment_same_subscriptions() -> None:
    # RangeAssignorTest.testFirstAssignmentTwoMembersTwoTopicsSameSubscriptions
    topics = topics_of(t1=3, t3=2)
    members = group(member("A", {T1, T3}), member("B", {T1, T3}))
    assert RANGE.assign(members, topics) == {
        "A": A(t1={0, 1}, t3={0}),
        "B": A(t1={2}, t3={1}),
    }


def test_range_first_assignment_different_subscriptions() -> None:
    # ...testFirstAssignmentThreeMembersThreeTopicsDifferentSubscriptions
    topics = topics_of(t1=3, t2=3, t3=2)
    members = group(member("A", {T1, T2}), member("B", {T3}), member("C", {T2, T3}))
    assert RANGE.assign(members, topics) == {
        "A": A(t1={0, 1, 2}, t2={0, 1}),
        "B": A(t3={0}),
        "C": A(t2={2}, t3={1}),
    }


def test_range_more_members_than_partitions() -> None:
    # ...testFirstAssignmentNumMembersGreaterThanNumPartitions
    topics = topics_of(t1=3, t3=2)
    members = group(*(member(m, {T1, T3}) for m in "ABC"))
    assert RANGE.assign(members, topics) == {
        "A": A(t1={0}, t3={0}),
        "B": A(t1={1}, t3={1}),
        "C": A(t1={2}),
    }


def test_range_member_added_is_not_sticky() -> None:
    # ...testReassignmentWhenOneMemberAddedAfterInitialAssignmentWithTwoMembersTwoTopics
    topics = topics_of(t1=3, t2=3)
    members = group(
        member("A", {T1, T2}, A(t1={0, 1}, t2={0, 1})),
        member("B", {T1, T2}, A(t1={2}, t2={2})),
        member("C", {T1, T2}),
    )
    assert RANGE.assign(members, topics) == {
        "A": A(t1={0}, t2={0}),
        "B": A(t1={1}, t2={1}),
        "C": A(t1={2}, t2={2}),
    }


def test_range_static_members_keep_their_ranges() -> None:
    # ...testMixedStaticMembership: a static member rejoining with a new member id
    # gets the same range, and so does everyone else.
    topics = topics_of(t1=5)
    before = RANGE.assign(
        group(
            member("A", {T1}, instance_id="instanceA"),
            member("C", {T1}, instance_id="instanceC"),
            member("B", {T1}),
        ),
        topics,
    )
    after = RANGE.assign(
        group(
            member("memberA1", {T1}, instance_id="instanceA"),
            member("C", {T1}, instance_id="instanceC"),
            member("B", {T1}),
        ),
        topics,
    )
    assert after["memberA1"] == before["A"]
    assert after["B"] == before["B"] and after["C"] == before["C"]
    # Static members first (by instance id), then dynamic ones by member id.
    assert before == {"A": A(t1={0, 1}), "C": A(t1={2, 3}), "B": A(t1={4})}


# ---------------------------------------------------------------- properties

TOPIC_IDS = [uuid.UUID(int=i * 0x1_0000_0001 + (1 << 127) * (i % 2)) for i in range(1, 6)]


@st.composite
def scenarios(
    draw: st.DrawFn, homogeneous: bool = False
) -> tuple[dict[str, MemberSubscription], dict[uuid.UUID, TopicMetadata]]:
    n_topics = draw(st.integers(1, len(TOPIC_IDS)))
    topics = {
        t: TopicMetadata(t, f"topic{i}", draw(st.integers(0, 12)))
        for i, t in enumerate(TOPIC_IDS[:n_topics])
    }
    ids = draw(st.lists(st.sampled_from("ABCDEFGHIJ"), min_size=1, max_size=7, unique=True))
    every = [*topics, uuid.UUID(int=99)]  # one subscribed topic that does not exist
    shared = frozenset(draw(st.sets(st.sampled_from(every), min_size=1)))
    members = {}
    taken: set[tuple[uuid.UUID, int]] = set()
    for m in ids:
        subscribed = shared if homogeneous else frozenset(draw(st.sets(st.sampled_from(every))))
        current: dict[uuid.UUID, set[int]] = {}
        for t in subscribed & topics.keys():
            for p in range(topics[t].num_partitions):
                if (t, p) not in taken and draw(st.booleans()):
                    taken.add((t, p))
                    current.setdefault(t, set()).add(p)
        static = draw(st.booleans())
        members[m] = member(m, set(subscribed), current, f"i-{m}" if static else None)
    return members, topics


def assert_valid(
    members: Mapping[str, MemberSubscription],
    topics: Mapping[uuid.UUID, TopicMetadata],
    result: Mapping[str, AssignmentDict],
) -> None:
    assert set(result) == set(members)
    owner: dict[tuple[uuid.UUID, int], str] = {}
    for m, assignment in result.items():
        for t, ps in assignment.items():
            assert ps, "no empty topic entries"
            assert t in members[m].subscribed_topic_ids and t in topics
            for p in ps:
                assert 0 <= p < topics[t].num_partitions
                assert (t, p) not in owner, f"{(t, p)} assigned twice"
                owner[(t, p)] = m
    for t, meta in topics.items():
        if any(t in s.subscribed_topic_ids for s in members.values()):
            assert {p for (tt, p) in owner if tt == t} == set(range(meta.num_partitions))


def count(assignment: AssignmentDict) -> int:
    return sum(len(ps) for ps in assignment.values())


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_every_subscribed_partition_assigned_once(
    scenario: tuple[dict[str, MemberSubscription], dict[uuid.UUID, TopicMetadata]],
) -> None:
    members, topics = scenario
    for assignor in ASSIGNORS.values():
        result = assignor.assign(members, topics)
        assert_valid(members, topics, result)
        assert assignor.assign(members, topics) == result, "deterministic"


@settings(max_examples=300, deadline=None)
@given(scenarios(homogeneous=True))
def test_uniform_homogeneous_is_balanced_and_sticky(
    scenario: tuple[dict[str, MemberSubscription], dict[uuid.UUID, TopicMetadata]],
) -> None:
    members, topics = scenario
    result = UNIFORM.assign(members, topics)
    assert_valid(members, topics, result)
    counts = [count(a) for a in result.values()]
    assert max(counts) - min(counts) <= 1
    # Sticky: each member keeps min(what it held, its share) of its partitions.
    for m, a in result.items():
        held = {(t, p) for t, ps in members[m].current.items() if t in topics for p in ps}
        kept = {(t, p) for t, ps in a.items() for p in ps} & held
        assert len(kept) >= min(len(held), min(counts))


def _as_current(
    members: Mapping[str, MemberSubscription], result: Mapping[str, AssignmentDict]
) -> dict[str, MemberSubscription]:
    return {
        m: MemberSubscription(s.member_id, s.instance_id, None, s.subscribed_topic_ids, result[m])
        for m, s in members.items()
    }


def _moved(before: Mapping[str, AssignmentDict], after: Mapping[str, AssignmentDict]) -> int:
    """Partitions whose owner changed between two assignments (new ones not counted)."""
    owner = {(t, p): m for m, a in before.items() for t, ps in a.items() for p in ps}
    return sum(
        1
        for m, a in after.items()
        for t, ps in a.items()
        for p in ps
        if (t, p) in owner and owner[(t, p)] != m
    )


@settings(max_examples=300, deadline=None)
@given(scenarios(homogeneous=True), st.sampled_from("KLMNZ"))
def test_uniform_join_moves_only_what_the_new_member_takes(
    scenario: tuple[dict[str, MemberSubscription], dict[uuid.UUID, TopicMetadata]],
    joiner: str,
) -> None:
    members, topics = scenario
    balanced = _as_current(members, UNIFORM.assign(members, topics))
    shared = next(iter(members.values())).subscribed_topic_ids
    joined = {**balanced, joiner: member(joiner, set(shared))}
    after = UNIFORM.assign(joined, topics)
    assert_valid(joined, topics, after)
    before = {m: s.current for m, s in balanced.items()}
    # From a balanced group only the partitions the new member gets move (Kafka's
    # homogeneous builder: everyone else keeps what it has up to its new quota).
    assert _moved(before, after) == count(after[joiner])
    counts = [count(a) for a in after.values()]
    assert max(counts) - min(counts) <= 1


@settings(max_examples=300, deadline=None)
@given(scenarios(homogeneous=True), st.data())
def test_uniform_leave_moves_only_the_leavers_partitions(
    scenario: tuple[dict[str, MemberSubscription], dict[uuid.UUID, TopicMetadata]],
    data: st.DataObject,
) -> None:
    members, topics = scenario
    balanced = _as_current(members, UNIFORM.assign(members, topics))
    leaver = data.draw(st.sampled_from(sorted(balanced)))
    rest = {m: s for m, s in balanced.items() if m != leaver}
    after = UNIFORM.assign(rest, topics)
    assert_valid(rest, topics, after)
    before = {m: s.current for m, s in balanced.items() if m != leaver}
    # The remaining members keep everything they had (they were balanced, so each is
    # at most at its new quota) and only the leaver's partitions are spread.
    assert _moved(before, after) == 0
    for m in rest:
        for t, ps in before[m].items():
            assert ps <= after[m].get(t, frozenset())
    if rest:
        counts = [count(a) for a in after.values()]
        assert max(counts) - min(counts) <= 1


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_uniform_heterogeneous_keeps_current_when_already_balanced(
    scenario: tuple[dict[str, MemberSubscription], dict[uuid.UUID, TopicMetadata]],
) -> None:
    members, topics = scenario
    first = UNIFORM.assign(members, topics)
    again = UNIFORM.assign(_as_current(members, first), topics)
    assert again == first, "a computed assignment is a fixed point"


def _range_order(members: Mapping[str, MemberSubscription]) -> list[str]:
    static = sorted(
        (s for s in members.values() if s.instance_id is not None),
        key=lambda s: s.instance_id or "",
    )
    dynamic = sorted(s.member_id for s in members.values() if s.instance_id is None)
    return [s.member_id for s in static] + dynamic


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_range_gives_contiguous_ranges_in_kafkas_member_order(
    scenario: tuple[dict[str, MemberSubscription], dict[uuid.UUID, TopicMetadata]],
) -> None:
    members, topics = scenario
    result = RANGE.assign(members, topics)
    assert_valid(members, topics, result)
    order = _range_order(members)
    for t, meta in topics.items():
        subscribers = [m for m in order if t in members[m].subscribed_topic_ids]
        if not subscribers:
            continue
        quota, extra = divmod(meta.num_partitions, len(subscribers))
        start = 0
        for i, m in enumerate(subscribers):
            size = quota + (1 if i < extra else 0)
            assert result[m].get(t, frozenset()) == frozenset(range(start, start + size))
            start += size
