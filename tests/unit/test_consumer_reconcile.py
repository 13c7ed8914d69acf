"""Reconciliation of one member towards its target (coordinator.consumer_group.reconcile,
Kafka's CurrentAssignmentBuilder): the transitions between STABLE, UNREVOKED_PARTITIONS
and UNRELEASED_PARTITIONS, in the cases Kafka 4.2's CurrentAssignmentBuilderTest covers."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from coordinator.consumer_group import (
    AssignmentDict,
    ConsumerMember,
    MemberState,
    reconcile,
)
from protocol.errors import ErrorCode, KafkaError

T1, T2 = uuid.UUID(int=1), uuid.UUID(int=2)
BOTH = frozenset({T1, T2})


def a(t1: set[int] | None = None, t2: set[int] | None = None) -> AssignmentDict:
    out: AssignmentDict = {}
    if t1:
        out[T1] = frozenset(t1)
    if t2:
        out[T2] = frozenset(t2)
    return out


def member(
    state: MemberState,
    epoch: int,
    assigned: AssignmentDict,
    pending: AssignmentDict | None = None,
    previous: int | None = None,
) -> ConsumerMember:
    return ConsumerMember(
        "m",
        subscribed_topic_names=frozenset({"t1", "t2"}),
        member_epoch=epoch,
        previous_member_epoch=epoch if previous is None else previous,
        state=state,
        assigned=assigned,
        pending_revocation=pending or {},
    )


def owners(held: dict[tuple[uuid.UUID, int], int]) -> Callable[[uuid.UUID, int], int]:
    return lambda tid, p: held.get((tid, p), -1)


NOBODY = owners({})


def test_stable_to_stable_with_new_partitions() -> None:
    m = member(MemberState.STABLE, 10, a({1, 2, 3}, {4, 5, 6}))
    out = reconcile(
        m,
        11,
        a({1, 2, 3, 4}, {4, 5, 6, 7}),
        BOTH,
        NOBODY,
        a({1, 2, 3}, {4, 5, 6}),
        subscription_changed=False,
    )
    assert (out.state, out.member_epoch, out.previous_member_epoch) == (MemberState.STABLE, 11, 10)
    assert out.assigned == a({1, 2, 3, 4}, {4, 5, 6, 7})


def test_stable_to_unrevoked_partitions() -> None:
    m = member(MemberState.STABLE, 10, a({1, 2, 3}, {4, 5, 6}))
    out = reconcile(
        m,
        11,
        a({2, 3, 4}, {5, 6, 7}),
        BOTH,
        NOBODY,
        a({1, 2, 3}, {4, 5, 6}),
        subscription_changed=False,
    )
    # Revocation first: the epoch stays, nothing new is given.
    assert (out.state, out.member_epoch) == (MemberState.UNREVOKED_PARTITIONS, 10)
    assert out.assigned == a({2, 3}, {5, 6})
    assert out.pending_revocation == a({1}, {4})


def test_stable_to_unreleased_partitions() -> None:
    m = member(MemberState.STABLE, 10, a({1, 2, 3}, {4, 5, 6}))
    out = reconcile(
        m,
        11,
        a({1, 2, 3, 4}, {4, 5, 6, 7}),
        BOTH,
        owners({(T1, 4): 10, (T2, 7): 10}),
        {},
        subscription_changed=False,
    )
    assert (out.state, out.member_epoch) == (MemberState.UNRELEASED_PARTITIONS, 11)
    assert out.assigned == a({1, 2, 3}, {4, 5, 6})


def test_revoked_partitions_no_longer_owned_are_not_waited_for() -> None:
    # Kafka's ...WithOwnedPartitionsNotHavingRevokedPartitions: the member already let
    # partition 6 go, so it moves on at once (with 7 unreleased).
    m = member(MemberState.STABLE, 10, a({1, 2, 3}, {4, 5, 6}))
    held = {(T2, p): 10 for p in range(10)}
    out = reconcile(
        m, 11, a({1, 2, 3}, {4, 5, 7}), BOTH, owners(held), {}, subscription_changed=False
    )
    assert (out.state, out.member_epoch) == (MemberState.UNRELEASED_PARTITIONS, 11)
    assert out.assigned == a({1, 2, 3}, {4, 5})


def test_remains_in_unrevoked_while_it_owns_a_revoked_partition() -> None:
    m = member(MemberState.UNREVOKED_PARTITIONS, 10, a({2, 3}, {5, 6}), a({1}, {4}))
    for owned in (a({1, 2, 3}, {5, 6}), None):  # reported, or not reported at all
        out = reconcile(
            m, 11, a({2, 3, 4}, {5, 6, 7}), BOTH, NOBODY, owned, subscription_changed=False
        )
        assert out == m


def test_unrevoked_to_stable_once_revoked() -> None:
    m = member(MemberState.UNREVOKED_PARTITIONS, 10, a({2, 3}, {5, 6}), a({1}, {4}))
    out = reconcile(
        m,
        11,
        a({2, 3, 4}, {5, 6, 7}),
        BOTH,
        NOBODY,
        a({2, 3}, {5, 6}),
        subscription_changed=False,
    )
    assert (out.state, out.member_epoch, out.previous_member_epoch) == (MemberState.STABLE, 11, 10)
    assert out.assigned == a({2, 3, 4}, {5, 6, 7}) and out.pending_revocation == {}


def test_a_partition_pending_revocation_back_in_the_target_is_not_unreleased() -> None:
    m = member(MemberState.UNREVOKED_PARTITIONS, 10, a({2, 3}, {5, 6}), a({4}))
    held = {(T1, 2): 10, (T1, 3): 10, (T1, 4): 10, (T2, 5): 10, (T2, 6): 10}
    out = reconcile(
        m,
        12,
        a({2, 3, 4}, {5, 6, 7}),
        BOTH,
        owners(held),
        a({2, 3}, {5, 6}),
        subscription_changed=False,
    )
    assert (out.state, out.member_epoch) == (MemberState.STABLE, 12)
    assert out.assigned == a({2, 3, 4}, {5, 6, 7})


def test_unreleased_to_stable_when_released() -> None:
    m = member(MemberState.UNRELEASED_PARTITIONS, 11, a({2, 3}, {5, 6}), previous=10)
    out = reconcile(
        m,
        11,
        a({2, 3, 4}, {5, 6, 7}),
        BOTH,
        NOBODY,
        a({2, 3}, {5, 6}),
        subscription_changed=False,
    )
    assert (out.state, out.member_epoch) == (MemberState.STABLE, 11)
    assert out.assigned == a({2, 3, 4}, {5, 6, 7})


def test_unreleased_stays_while_held() -> None:
    m = member(MemberState.UNRELEASED_PARTITIONS, 11, a({2, 3}, {5, 6}), previous=10)
    out = reconcile(
        m,
        11,
        a({2, 3, 4}, {5, 6, 7}),
        BOTH,
        owners({(T1, 4): 10, (T2, 7): 10}),
        a({2, 3}, {5, 6}),
        subscription_changed=False,
    )
    assert (out.state, out.member_epoch, out.assigned) == (
        MemberState.UNRELEASED_PARTITIONS,
        11,
        a({2, 3}, {5, 6}),
    )


def test_unreleased_to_unrevoked_when_the_target_moves_on() -> None:
    m = member(MemberState.UNRELEASED_PARTITIONS, 11, a({2, 3}, {5, 6}), previous=10)
    out = reconcile(m, 12, a({3}, {6}), BOTH, NOBODY, a({2, 3}, {5, 6}), subscription_changed=False)
    assert (out.state, out.member_epoch) == (MemberState.UNREVOKED_PARTITIONS, 11)
    assert out.assigned == a({3}, {6}) and out.pending_revocation == a({2}, {5})


def test_unknown_state_fences_a_member_that_owns_partitions() -> None:
    m = member(MemberState.UNKNOWN, 11, a({2, 3}, {5, 6}))
    with pytest.raises(KafkaError) as info:
        reconcile(m, 11, a({2, 3}), BOTH, NOBODY, a({2}), subscription_changed=False)
    assert info.value.code == ErrorCode.fenced_member_epoch
    out = reconcile(m, 12, a({2, 3}), BOTH, NOBODY, {}, subscription_changed=False)
    assert (out.state, out.member_epoch) == (MemberState.STABLE, 12)


def test_a_topic_no_longer_subscribed_is_revoked_at_once() -> None:
    m = member(MemberState.STABLE, 10, a({1, 2}, {4, 5}))
    # Same epoch, subscription changed to T1 only: T2's partitions go to revocation.
    out = reconcile(
        m,
        10,
        a({1, 2}, {4, 5}),
        frozenset({T1}),
        NOBODY,
        a({1, 2}, {4, 5}),
        subscription_changed=True,
    )
    assert (out.state, out.member_epoch) == (MemberState.UNREVOKED_PARTITIONS, 10)
    assert out.assigned == a({1, 2}) and out.pending_revocation == a(None, {4, 5})
    # Already let go: just shrinks, stays STABLE.
    out = reconcile(
        m, 10, a({1, 2}, {4, 5}), frozenset({T1}), NOBODY, a({1, 2}), subscription_changed=True
    )
    assert (out.state, out.assigned, out.pending_revocation) == (MemberState.STABLE, a({1, 2}), {})
