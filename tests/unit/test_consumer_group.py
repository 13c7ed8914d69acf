"""KIP-848 consumer groups, sans-IO (coordinator.consumer_group): member epochs, the
target assignment, reconciliation with revocation before assignment, fencing, static
membership and the errors Kafka 4.2 answers; then the shell (consumer_group_ops) on the
coordinator runtime with a ManualClock for the session and rebalance timeouts."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

import pytest

from coordinator import group_records, topic_regex
from coordinator.assignor import TopicMetadata
from coordinator.consumer_assignors import ASSIGNORS
from coordinator.consumer_group import (
    AssignmentDict,
    ConsumerGroup,
    ConsumerGroupMemberMetadataRecord,
    ConsumerGroupMetadataRecord,
    ConsumerGroupState,
    ConsumerHeartbeat,
    ConsumerHeartbeatResult,
    MemberState,
    validate_heartbeat_request,
)
from coordinator.group_config import GroupConfigStore, GroupCoordinatorConfig
from coordinator.group_coordinator import GroupCoordinator
from coordinator.group_host import GroupType
from coordinator.offsets import OffsetCommitRecord, PartitionCommit
from coordinator.share_persister import InMemoryPersister
from persister.clock import ManualClock
from persister.coordinator_log import MemoryRecordLog
from protocol.errors import ErrorCode, KafkaError

T = uuid.UUID(int=7)
U = uuid.UUID(int=8)
TOPICS = {T: TopicMetadata(T, "orders", 6)}
CONFIG = GroupCoordinatorConfig()
ALL = frozenset(range(6))


def owned(parts: Iterable[int]) -> AssignmentDict:
    parts = frozenset(parts)
    return {T: parts} if parts else {}


class Harness:
    """A group whose heartbeats' records are replayed as the coordinator would."""

    def __init__(self, topics: dict[uuid.UUID, TopicMetadata] | None = None) -> None:
        self.group = ConsumerGroup("g")
        self.topics = dict(TOPICS if topics is None else topics)
        self.now = 0

    def hb(
        self,
        member_id: str,
        epoch: int,
        owns: Iterable[int] | None = None,
        *,
        topics: Iterable[str] | None = None,
        regex: str | None = None,
        instance_id: str | None = None,
        rebalance_timeout_ms: int = 300_000,
    ) -> ConsumerHeartbeatResult:
        if epoch == 0:
            names = (
                None if regex is not None and topics is None else frozenset(topics or ["orders"])
            )
            request = ConsumerHeartbeat(
                member_id,
                0,
                instance_id=instance_id,
                rebalance_timeout_ms=rebalance_timeout_ms,
                subscribed_topic_names=names,
                subscribed_topic_regex=regex,
                owned={},
            )
        else:
            request = ConsumerHeartbeat(
                member_id,
                epoch,
                instance_id=instance_id,
                subscribed_topic_names=None if topics is None else frozenset(topics),
                owned=None if owns is None else owned(owns),
            )
        validate_heartbeat_request("g", request, 1, CONFIG.consumer_group_assignors)
        result = self.group.heartbeat(
            request, self.topics, self.now, CONFIG, ASSIGNORS, topic_regex.resolve
        )
        self.group.replay_all(result.records)
        self.check_exclusive()
        return result

    def check_exclusive(self) -> None:
        """No partition is owned (assigned or pending revocation) by two members."""
        seen: set[tuple[uuid.UUID, int]] = set()
        for member in self.group.members.values():
            for assignment in (member.assigned, member.pending_revocation):
                for tid, parts in assignment.items():
                    for p in parts:
                        assert (tid, p) not in seen, f"{(tid, p)} owned twice"
                        seen.add((tid, p))

    def assigned(self, member_id: str) -> frozenset[int]:
        return self.group.members[member_id].assigned.get(T, frozenset())

    def target(self, member_id: str) -> frozenset[int]:
        return self.group.target.get(member_id, {}).get(T, frozenset())


def refused(code: ErrorCode, call: Any) -> KafkaError:
    with pytest.raises(KafkaError) as info:
        call()
    assert info.value.code == code, info.value.message
    return info.value


def test_first_member_gets_every_partition() -> None:
    h = Harness()
    r = h.hb("a", 0)
    assert (r.member_epoch, r.assignment) == (1, {T: ALL})
    assert h.group.state == ConsumerGroupState.STABLE
    assert (h.group.group_epoch, h.group.assignment_epoch) == (1, 1)
    # A heartbeat with nothing new answers no assignment.
    assert h.hb("a", 1, ALL).assignment is None


def test_three_members_six_partitions_revocation_before_assignment() -> None:
    h = Harness()
    h.hb("a", 0)
    # b joins: group epoch 2, the target splits 3/3, but a still owns b's partitions.
    r = h.hb("b", 0)
    b_target = h.target("b")
    assert len(b_target) == 3 and h.target("a") == ALL - b_target
    assert r.member_epoch == 2 and r.assignment == {}
    assert h.group.members["b"].state == MemberState.UNRELEASED_PARTITIONS
    assert h.group.state == ConsumerGroupState.RECONCILING
    # a is asked to revoke b's partitions first, keeping its epoch.
    r = h.hb("a", 1, ALL)
    assert r.member_epoch == 1 and r.assignment == {T: ALL - b_target}
    assert r.revoking is not None
    assert h.group.members["a"].state == MemberState.UNREVOKED_PARTITIONS
    # b gets nothing while a has not revoked.
    assert h.hb("b", 2, []).assignment is None
    assert h.assigned("b") == frozenset()
    # a still reporting the partitions stays where it is.
    assert h.hb("a", 1, ALL).member_epoch == 1
    # a revoked: it moves to epoch 2; then b gets its partitions.
    r = h.hb("a", 1, ALL - b_target)
    assert (r.member_epoch, r.revoking) == (2, None)
    r = h.hb("b", 2, [])
    assert r.assignment == {T: b_target}
    assert h.group.state == ConsumerGroupState.STABLE

    # c joins: 2/2/2 after a and b revoke one each.
    h.hb("c", 0)
    for member, epoch in (("a", 2), ("b", 2)):
        h.hb(
            member,
            epoch,
            h.assigned(member) | h.group.members[member].pending_revocation.get(T, frozenset()),
        )
        h.hb(member, epoch, h.assigned(member))
    h.hb("c", 3, [])
    assert sorted(len(h.assigned(m)) for m in "abc") == [2, 2, 2]
    assert h.group.state == ConsumerGroupState.STABLE
    assert frozenset().union(*(h.assigned(m) for m in "abc")) == ALL

    # b leaves: its partitions go to a and c, with no revocation needed.
    r = h.hb("b", -1)
    assert (r.member_epoch, r.removed) == (-1, ("b",))
    assert "b" not in h.group.members and h.group.state == ConsumerGroupState.ASSIGNING
    ra = h.hb("a", 3, h.assigned("a"))
    rc = h.hb("c", 3, h.assigned("c"))
    assert ra.member_epoch == rc.member_epoch == h.group.group_epoch
    assert sorted(len(h.assigned(m)) for m in "ac") == [3, 3]
    assert h.assigned("a") | h.assigned("c") == ALL
    assert h.group.state == ConsumerGroupState.STABLE


def test_fenced_member_epoch_and_lost_response() -> None:
    h = Harness()
    h.hb("a", 0)
    h.hb("b", 0)
    r = h.hb("a", 1, ALL)
    h.hb("a", 1, r.assignment[T] if r.assignment else [])
    assert h.group.members["a"].member_epoch == 2
    # Greater than known: fenced.
    refused(ErrorCode.fenced_member_epoch, lambda: h.hb("a", 3, h.assigned("a")))
    # The previous epoch with a subset of the assignment: the response was lost; taken.
    assert h.hb("a", 1, h.assigned("a")).member_epoch == 2
    # The previous epoch still owning partitions it no longer has: fenced.
    refused(ErrorCode.fenced_member_epoch, lambda: h.hb("a", 1, ALL))
    # An epoch that is neither: fenced.
    refused(ErrorCode.fenced_member_epoch, lambda: h.hb("b", 1, []))
    # Unknown members.
    refused(ErrorCode.unknown_member_id, lambda: h.hb("z", 5, []))
    refused(ErrorCode.unknown_member_id, lambda: h.hb("z", -1))


def test_static_member_leaves_and_rejoins_without_rebalance() -> None:
    h = Harness()
    h.hb("a", 0, instance_id="i-a")
    h.hb("b", 0)
    h.hb("a", 1, ALL, instance_id="i-a")
    h.hb("a", 1, h.assigned("a"), instance_id="i-a")
    h.hb("b", 2, [])
    epoch, a_parts, b_parts = h.group.group_epoch, h.assigned("a"), h.assigned("b")
    assert h.group.state == ConsumerGroupState.STABLE
    # A live instance id cannot be taken.
    refused(ErrorCode.unreleased_instance_id, lambda: h.hb("a2", 0, instance_id="i-a"))
    # Another member id heartbeating with the instance id is fenced.
    refused(ErrorCode.fenced_instance_id, lambda: h.hb("x", 2, [], instance_id="i-a"))
    # Temporary leave (-2): it keeps its partitions, the group epoch does not move.
    r = h.hb("a", -2, instance_id="i-a")
    assert r.member_epoch == -2 and r.removed == ()
    assert h.group.group_epoch == epoch
    assert h.group.partition_epoch(T, min(a_parts)) == -2
    # b's heartbeat changes nothing.
    assert h.hb("b", 2, b_parts).assignment is None
    # The instance comes back as a new member: same partitions, no new epoch.
    r = h.hb("a2", 0, instance_id="i-a")
    assert r.removed == ("a",) and r.assignment == {T: a_parts}
    assert r.member_epoch == epoch == h.group.group_epoch
    assert set(h.group.members) == {"a2", "b"}
    assert h.assigned("b") == b_parts
    # Leaving with an unknown instance id.
    refused(ErrorCode.unknown_member_id, lambda: h.hb("q", -2, instance_id="nobody"))


def test_subscription_change_revokes_unsubscribed_topics() -> None:
    h = Harness({**TOPICS, U: TopicMetadata(U, "audit", 2)})
    r = h.hb("a", 0, topics=["orders", "audit"])
    assert r.assignment == {T: ALL, U: frozenset({0, 1})}
    r = h.hb("a", 1, [], topics=["orders"])
    # Not reporting owned partitions: audit's stay pending revocation first.
    member = h.group.members["a"]
    assert member.state in (MemberState.UNREVOKED_PARTITIONS, MemberState.STABLE)
    h.hb("a", member.member_epoch, ALL)
    assert h.group.members["a"].assigned == {T: ALL}


def test_regex_subscription_follows_topic_creation() -> None:
    h = Harness()
    r = h.hb("a", 0, regex="ord.*")
    assert r.assignment == {T: ALL}
    assert h.group.regexes["ord.*"].topics == {"orders"}
    h.topics[U] = TopicMetadata(U, "ordinals", 2)
    records = h.group.refresh_topics(h.topics, 10, topic_regex.resolve)
    h.group.replay_all(records)
    assert h.group.regexes["ord.*"].topics == {"orders", "ordinals"}
    assert h.group.state == ConsumerGroupState.ASSIGNING
    r = h.hb("a", 1, ALL)
    assert r.assignment == {T: ALL, U: frozenset({0, 1})}
    # The last member with the regex leaves: the regex goes too.
    h.hb("a", -1)
    assert h.group.regexes == {}


@pytest.mark.parametrize(
    ("request_", "version", "code"),
    [
        (ConsumerHeartbeat("", 1, owned={}), 0, ErrorCode.invalid_request),
        (
            ConsumerHeartbeat(
                "", 0, rebalance_timeout_ms=1, subscribed_topic_names=frozenset(), owned={}
            ),
            1,
            ErrorCode.invalid_request,
        ),
        (ConsumerHeartbeat("", -1), 0, ErrorCode.invalid_request),
        (
            ConsumerHeartbeat("m", 0, subscribed_topic_names=frozenset(), owned={}),
            1,
            ErrorCode.invalid_request,
        ),
        (
            ConsumerHeartbeat(
                "m",
                0,
                rebalance_timeout_ms=1,
                subscribed_topic_names=frozenset(),
                owned={T: frozenset({1})},
            ),
            1,
            ErrorCode.invalid_request,
        ),
        (
            ConsumerHeartbeat("m", 0, rebalance_timeout_ms=1, subscribed_topic_names=frozenset()),
            1,
            ErrorCode.invalid_request,
        ),
        (ConsumerHeartbeat("m", 0, rebalance_timeout_ms=1, owned={}), 1, ErrorCode.invalid_request),
        (ConsumerHeartbeat("m", -2), 1, ErrorCode.invalid_request),
        (ConsumerHeartbeat("m", -3), 1, ErrorCode.invalid_request),
        (ConsumerHeartbeat("m", 1, instance_id=""), 1, ErrorCode.invalid_request),
        (ConsumerHeartbeat("m", 1, rack_id=" "), 1, ErrorCode.invalid_request),
        (ConsumerHeartbeat("m", 1, server_assignor="sticky"), 1, ErrorCode.unsupported_assignor),
    ],
)
def test_request_validation(request_: ConsumerHeartbeat, version: int, code: ErrorCode) -> None:
    refused(code, lambda: validate_heartbeat_request("g", request_, version, ("uniform", "range")))


def test_request_validation_accepts_v0_join_without_member_id() -> None:
    validate_heartbeat_request(
        "g",
        ConsumerHeartbeat(
            "", 0, rebalance_timeout_ms=1, subscribed_topic_names=frozenset(), owned={}
        ),
        0,
        ("uniform",),
    )
    refused(
        ErrorCode.invalid_request,
        lambda: validate_heartbeat_request("", ConsumerHeartbeat("m", 1), 1, ()),
    )


def test_offset_commit_and_fetch_validation() -> None:
    h = Harness()
    h.hb("a", 0)
    g = h.group
    g.validate_offset_commit("a", None, 1, transactional=False, api_version=9)
    refused(
        ErrorCode.stale_member_epoch,
        lambda: g.validate_offset_commit("a", None, 0, transactional=False, api_version=9),
    )
    refused(
        ErrorCode.unknown_member_id,
        lambda: g.validate_offset_commit("z", None, 1, transactional=False, api_version=9),
    )
    refused(
        ErrorCode.unsupported_version,
        lambda: g.validate_offset_commit("a", None, 1, transactional=False, api_version=8),
    )
    # A transactional commit naming no member is taken.
    g.validate_offset_commit("", None, -1, transactional=True, api_version=3)
    g.validate_offset_fetch(None, None)
    g.validate_offset_fetch("a", 1)
    refused(ErrorCode.stale_member_epoch, lambda: g.validate_offset_fetch("a", 2))
    refused(ErrorCode.unknown_member_id, lambda: g.validate_offset_fetch("z", 1))
    refused(ErrorCode.non_empty_group, g.validate_delete_group)
    assert g.is_subscribed_to_topic("orders") and not g.is_subscribed_to_topic("audit")
    h.hb("a", -1)
    # Empty: an admin commit (epoch -1) is taken, and the group may be deleted.
    g.validate_offset_commit("", None, -1, transactional=False, api_version=9)
    g.validate_delete_group()


def test_group_max_size() -> None:
    h = Harness()
    config = GroupCoordinatorConfig.from_mapping({"group.consumer.max.size": 1})
    h.hb("a", 0)
    request = ConsumerHeartbeat(
        "b", 0, rebalance_timeout_ms=1, subscribed_topic_names=frozenset({"orders"}), owned={}
    )
    refused(
        ErrorCode.group_max_size_reached,
        lambda: h.group.heartbeat(request, h.topics, 0, config, ASSIGNORS, topic_regex.resolve),
    )


# -- the shell on the coordinator runtime ------------------------------------------


def coordinator(clock: ManualClock, log: MemoryRecordLog | None = None) -> GroupCoordinator:
    groups = GroupCoordinator(
        InMemoryPersister(), lambda: TOPICS, GroupConfigStore(), record_log=log, clock=clock
    )
    groups.consumer.config = GroupCoordinatorConfig.from_mapping(
        {
            "group.consumer.min.session.timeout.ms": 1000,
            "group.consumer.session.timeout.ms": 3000,
            "group.consumer.min.heartbeat.interval.ms": 100,
            "group.consumer.heartbeat.interval.ms": 500,
        }
    )
    groups.load()
    return groups


def join(
    member_id: str, instance_id: str | None = None, timeout_ms: int = 10_000
) -> ConsumerHeartbeat:
    return ConsumerHeartbeat(
        member_id,
        0,
        instance_id=instance_id,
        rebalance_timeout_ms=timeout_ms,
        subscribed_topic_names=frozenset({"orders"}),
        owned={},
    )


def beat(member_id: str, epoch: int, parts: Iterable[int]) -> ConsumerHeartbeat:
    return ConsumerHeartbeat(member_id, epoch, owned=owned(parts))


async def test_session_timeout_fences_a_silent_member() -> None:
    clock = ManualClock(0)
    groups = coordinator(clock)
    ops = groups.consumer
    await ops.heartbeat("g", join("a"), 1)
    await ops.heartbeat("g", join("b"), 1)
    clock.advance(2000)
    a = await ops.heartbeat("g", beat("a", 1, ALL), 1)
    a = await ops.heartbeat("g", beat("a", 1, a.assignment[T] if a.assignment else []), 1)
    clock.advance(1500)  # b silent for 3500 ms > 3000
    await ops.timers.drain()
    group = groups.consumer_groups["g"]
    assert isinstance(group, ConsumerGroup)
    assert set(group.members) == {"a"}
    r = await ops.heartbeat(
        "g", beat("a", a.member_epoch, a.assignment[T] if a.assignment else []), 1
    )
    assert r.assignment == {T: ALL}
    assert group.state == ConsumerGroupState.STABLE


async def test_rebalance_timeout_fences_a_member_that_does_not_revoke() -> None:
    clock = ManualClock(0)
    groups = coordinator(clock)
    ops = groups.consumer
    await ops.heartbeat("g", join("a", timeout_ms=1000), 1)
    await ops.heartbeat("g", join("b"), 1)
    r = await ops.heartbeat("g", beat("a", 1, ALL), 1)
    assert r.revoking is not None
    for _ in range(3):  # a keeps heartbeating but never revokes
        clock.advance(400)
        await ops.timers.drain()
        if "a" in groups.consumer_groups["g"].members:  # type: ignore[attr-defined]
            await ops.heartbeat("g", beat("a", 1, ALL), 1)
        await ops.heartbeat("g", beat("b", 2, []), 1)
    assert set(groups.consumer_groups["g"].members) == {"b"}  # type: ignore[attr-defined]


async def test_group_types_share_one_namespace() -> None:
    clock = ManualClock(0)
    groups = coordinator(clock)
    await groups.heartbeat("queue", "m", 0, ["orders"], None, "c", "/127.0.0.1")
    e = await _refused(groups.consumer.heartbeat("queue", join("a"), 1))
    assert (e.code, e.message) == (
        ErrorCode.group_id_not_found,
        "Group queue is not a consumer group.",
    )
    refused(ErrorCode.group_id_not_found, lambda: groups.consumer.describe("queue"))
    refused(ErrorCode.group_id_not_found, lambda: groups.consumer.describe("nothing"))
    await groups.commit_offsets("simple", "", None, -1, [], api_version=9)
    await groups.consumer.heartbeat("g", join("a"), 1)
    assert groups.group_type("g") == GroupType.CONSUMER
    e = await _refused(groups.heartbeat("g", "m", 0, ["orders"], None, "c", "/h"))
    assert e.code == ErrorCode.group_id_not_found
    e = await _refused(groups.consumer.heartbeat("g2", ConsumerHeartbeat("a", 3, owned={}), 1))
    assert e.code == ErrorCode.group_id_not_found


async def _refused(awaitable: Any) -> KafkaError:
    with pytest.raises(KafkaError) as info:
        await awaitable
    return info.value


async def test_reload_rebuilds_the_group_and_rearms_sessions() -> None:
    clock = ManualClock(0)
    log = MemoryRecordLog()
    groups = coordinator(clock, log)
    await groups.consumer.heartbeat("g", join("a"), 1)
    await groups.consumer.heartbeat("g", join("b", instance_id="i-b"), 1)
    before = groups.consumer.describe("g")
    await groups.stop()
    again = coordinator(clock, log)
    assert again.consumer.describe("g") == before
    assert again.consumer.timers.is_scheduled(("session", "g", "a"))
    clock.advance(3001)
    await again.consumer.timers.drain()
    assert again.consumer.describe("g").members == ()


async def test_delete_group_writes_tombstones() -> None:
    clock = ManualClock(0)
    log = MemoryRecordLog()
    groups = coordinator(clock, log)
    r = await groups.consumer.heartbeat(
        "g",
        ConsumerHeartbeat("a", 0, rebalance_timeout_ms=1, subscribed_topic_regex="o.*", owned={}),
        1,
    )
    [(_, error)] = await groups.delete_groups(["g"])
    assert error is not None and error.code == ErrorCode.non_empty_group
    await groups.consumer.heartbeat("g", ConsumerHeartbeat("a", -1), 1)
    assert r.member_epoch == 1
    [(_, error)] = await groups.delete_groups(["g"])
    assert error is None
    assert groups.group_type("g") is None
    await groups.stop()
    again = coordinator(clock, log)
    assert again.group_type("g") is None


async def test_offsets_replayed_before_the_group_records_give_way_to_the_group() -> None:
    # Compaction keeps the newest record per key, so a group's offsets may come before
    # its ConsumerGroupMetadata: the simple group the offsets made gives way.
    log = MemoryRecordLog()
    for record in (
        OffsetCommitRecord("g", "orders", 0, 1),
        ConsumerGroupMetadataRecord("g", 3),
        ConsumerGroupMemberMetadataRecord(
            "g", "m", None, None, "c", "/h", frozenset({"orders"}), None, 1000, None
        ),
    ):
        log.write(group_records.encode(record))
    groups = coordinator(ManualClock(0), log)
    assert groups.group_type("g") == GroupType.CONSUMER
    assert "g" not in groups.classic_groups
    assert groups.consumer.describe("g").group_epoch == 3


async def test_an_empty_classic_group_becomes_a_consumer_group_keeping_its_offsets() -> None:
    groups = coordinator(ManualClock(0))
    await groups.commit_offsets(
        "app", "", None, -1, [PartitionCommit("orders", 0, 42)], api_version=9
    )
    assert groups.group_type("app") == GroupType.CLASSIC
    e = await _refused(groups.consumer.heartbeat("app", ConsumerHeartbeat("a", 1, owned={}), 1))
    assert (e.code, e.message) == (
        ErrorCode.group_id_not_found,
        "Group app is not a consumer group.",
    )
    r = await groups.consumer.heartbeat("app", join("a"), 1)
    assert r.member_epoch == 1
    assert groups.group_type("app") == GroupType.CONSUMER
    [(_, _, [fetched])] = groups.fetch_offsets("app", [("orders", [0], None)])
    assert fetched.offset == 42


async def test_a_classic_group_with_members_is_not_upgraded() -> None:
    groups = coordinator(ManualClock(0))

    class Busy:
        group_type = GroupType.CLASSIC
        is_empty = False

    groups.classic_groups["busy"] = Busy()  # type: ignore[assignment]
    e = await _refused(groups.consumer.heartbeat("busy", join("a"), 1))
    assert e.code == ErrorCode.group_id_not_found
    assert e.message == (
        "Cannot upgrade classic group busy to consumer group because online upgrade is disabled."
    )


async def test_a_regex_resolves_to_the_topics_the_member_may_describe() -> None:
    v, w = uuid.UUID(int=9), uuid.UUID(int=10)
    topics = {**TOPICS, U: TopicMetadata(U, "orders-secret", 1)}
    groups = GroupCoordinator(
        InMemoryPersister(), lambda: topics, GroupConfigStore(), clock=ManualClock(0)
    )
    groups.load()

    def describable(names: list[str]) -> list[str]:
        return [n for n in names if "secret" not in n]

    request = ConsumerHeartbeat(
        "a", 0, rebalance_timeout_ms=1, subscribed_topic_regex="orders.*", owned={}
    )
    r = await groups.consumer.heartbeat("g", request, 1, describable)
    assert r.assignment == {T: ALL}
    # Topics created later are resolved with the same member's permissions.
    topics[v] = TopicMetadata(v, "orders-secret-2", 1)
    topics[w] = TopicMetadata(w, "orders-2", 1)
    await groups.consumer.on_topics_changed()
    group = groups.consumer_groups["g"]
    assert isinstance(group, ConsumerGroup)
    assert group.regexes["orders.*"].topics == {"orders", "orders-2"}
    groups.consumer.unload()


async def test_tombstones_of_a_group_that_is_gone_create_nothing() -> None:
    log = MemoryRecordLog()
    group = ConsumerGroup("gone")
    group.replay(
        ConsumerGroupMemberMetadataRecord(
            "gone", "m", None, None, "c", "/h", frozenset(), None, 1, None
        )
    )
    for record in group.tombstones()[:-1]:  # a compacted log kept these, not the group's
        log.write(group_records.encode(record))
    groups = coordinator(ManualClock(0), log)
    assert groups.group_type("gone") is None


class ConsumerOverrides(GroupConfigStore):
    """A store with consumer.* overrides of group g (served by IncrementalAlterConfigs
    once the group config keys are)."""

    def overrides(self, group_id: str) -> dict[str, Any]:
        if group_id != "g":
            return {}
        return {"consumer.session.timeout.ms": 1500, "consumer.heartbeat.interval.ms": 200}


async def test_the_group_configs_override_the_broker_timeouts() -> None:
    clock = ManualClock(0)
    groups = GroupCoordinator(InMemoryPersister(), lambda: TOPICS, ConsumerOverrides(), clock=clock)
    groups.consumer.config = GroupCoordinatorConfig.from_mapping(
        {
            "group.consumer.min.session.timeout.ms": 1000,
            "group.consumer.session.timeout.ms": 3000,
            "group.consumer.min.heartbeat.interval.ms": 100,
            "group.consumer.heartbeat.interval.ms": 500,
        }
    )
    groups.load()
    assert groups.consumer.group_config("g").heartbeat_interval_ms == 200
    await groups.consumer.heartbeat("g", join("a"), 1)
    assert groups.consumer.timers.deadline(("session", "g", "a")) == 1500
    assert groups.consumer.group_config("other").session_timeout_ms == 3000
    groups.consumer.unload()


def test_a_subscribed_topic_created_later_is_assigned() -> None:
    h = Harness()
    r = h.hb("a", 0, topics=["orders", "later"])
    assert r.assignment == {T: ALL}
    epoch = h.group.group_epoch
    h.topics[U] = TopicMetadata(U, "later", 3)
    h.group.replay_all(h.group.refresh_topics(h.topics, 0, topic_regex.resolve))
    assert h.group.group_epoch == epoch + 1
    r = h.hb("a", epoch, ALL)
    assert r.assignment == {T: ALL, U: frozenset({0, 1, 2})}
    # Growing it moves the epoch again; an unrelated topic does not.
    h.topics[U] = TopicMetadata(U, "later", 4)
    h.topics[uuid.UUID(int=99)] = TopicMetadata(uuid.UUID(int=99), "unrelated", 1)
    h.group.replay_all(h.group.refresh_topics(h.topics, 0, topic_regex.resolve))
    assert h.group.group_epoch == epoch + 2
    assert h.group.refresh_topics(h.topics, 0, topic_regex.resolve) == []
