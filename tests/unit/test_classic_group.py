"""Classic groups (coordinator.classic_group, classic_group_ops) on the group
coordinator's runtime and a ManualClock: the JoinGroup/SyncGroup rebalance with several
members, the initial rebalance delay, session and rebalance timeouts, static members
rejoining without a rebalance, LeaveGroup, the GroupMetadata record and its reload,
and Kafka 4.2's answer to every classic-group error case."""

from __future__ import annotations

import asyncio
import errno
import struct
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import pytest

from coordinator.assignor import TopicMetadata
from coordinator.classic_group import (
    ClassicGroup,
    ClassicGroupConfig,
    ClassicGroupTombstone,
    GroupMetadataRecord,
    JoinResult,
    SyncResult,
    subscribed_topics,
)
from coordinator.classic_group_ops import JoinRequest, LeavingMember, SyncRequest
from coordinator.group_config import GroupConfigStore
from coordinator.group_coordinator import GroupCoordinator
from coordinator.group_host import GroupType
from coordinator.share_persister import InMemoryPersister
from persister.clock import ManualClock
from persister.coordinator_log import MemoryRecordLog
from protocol.errors import ErrorCode, KafkaError

T = TypeVar("T")
T1 = uuid.UUID(int=1)
TOPICS = {T1: TopicMetadata(T1, "t1", 6)}
DELAY = 3000
SESSION = 10000
REBALANCE = 30000


def subscription(*topics: str) -> bytes:
    """A ConsumerProtocolSubscription v0: version, topics, null user data."""
    out = struct.pack(">hi", 0, len(topics))
    for t in topics:
        out += struct.pack(">h", len(t)) + t.encode()
    return out + struct.pack(">i", -1)


SUB = subscription("t1")


def join_request(
    member: str = "",
    *,
    group: str = "g",
    instance: str | None = None,
    version: int = 5,
    protocols: tuple[tuple[str, bytes], ...] = (("range", SUB),),
    session: int = SESSION,
    protocol_type: str = "consumer",
) -> JoinRequest:
    return JoinRequest(
        group,
        member,
        instance,
        protocol_type,
        protocols,
        session,
        REBALANCE,
        "app",
        "/10.0.0.1",
        version,
    )


@dataclass
class Harness:
    clock: ManualClock
    log: MemoryRecordLog
    coordinator: GroupCoordinator

    @property
    def ops(self) -> Any:
        return self.coordinator.classic

    def group(self, group_id: str = "g") -> ClassicGroup:
        group = self.coordinator.classic_groups[group_id]
        assert isinstance(group, ClassicGroup)
        return group

    async def settle(self) -> None:
        for _ in range(30):
            await asyncio.sleep(0)
        await self.ops.timers.drain()
        for _ in range(10):
            await asyncio.sleep(0)

    async def advance(self, ms: int) -> None:
        self.clock.advance(ms)
        await self.settle()

    async def start(self, coro: Awaitable[T]) -> asyncio.Future[T]:
        """Send a request that may be parked; returns once it ran (answered or not)."""
        task = asyncio.ensure_future(coro)
        await self.settle()
        return task

    async def member_id(self, **kwargs: Any) -> str:
        """The v4+ first round: MEMBER_ID_REQUIRED with the member id to join with."""
        result = await self.ops.join(join_request(**kwargs))
        assert result.error == ErrorCode.member_id_required
        return str(result.member_id)


def make(log: MemoryRecordLog | None = None, clock: ManualClock | None = None) -> Harness:
    clock = clock or ManualClock()
    log = log if log is not None else MemoryRecordLog()
    coordinator = GroupCoordinator(
        InMemoryPersister(), lambda: TOPICS, GroupConfigStore(), log, clock=clock
    )
    coordinator.classic.config = ClassicGroupConfig(initial_rebalance_delay_ms=DELAY)
    coordinator.load()
    coordinator.classic.start()
    return Harness(clock, log, coordinator)


@pytest.fixture
def h() -> Harness:
    return make()


def stored(h: Harness) -> list[GroupMetadataRecord | ClassicGroupTombstone]:
    """The classic-group records written to the groups log, in order."""
    from coordinator import group_records

    out = []
    for key, value in h.log.replay():
        record = group_records.decode(key, value)
        if isinstance(record, GroupMetadataRecord | ClassicGroupTombstone):
            out.append(record)
    return out


async def stable_pair(h: Harness) -> tuple[str, str]:
    """Two members, a and b (the leader), joined and synced: generation 1, Stable."""
    a = await h.member_id()
    b = await h.member_id()
    ja = await h.start(h.ops.join(join_request(a)))
    jb = await h.start(h.ops.join(join_request(b)))
    await h.settle()
    assert not ja.done() and not jb.done()  # the initial rebalance waits its delay
    await h.advance(DELAY)
    await h.advance(DELAY)  # b joined during the delay: one more delay
    ra, rb = ja.result(), jb.result()
    leader = ra.leader
    follower = b if leader == a else a
    assert {ra.generation_id, rb.generation_id} == {1}
    sf = await h.start(h.ops.sync(SyncRequest("g", 1, follower, None, None, None, {})))
    await h.settle()
    assert not sf.done()  # parked until the leader's assignment is durable
    sl = await h.ops.sync(
        SyncRequest("g", 1, leader, None, "consumer", "range", {a: b"A", b: b"B"})
    )
    await h.settle()
    assert sl.error == ErrorCode.none
    assert sf.result().error == ErrorCode.none
    return a, b


async def test_two_members_join_sync_and_the_assignment_is_stored(h: Harness) -> None:
    a = await h.member_id()
    b = await h.member_id()
    assert a.startswith("app-") and a != b
    assert h.group().state_name == "Empty"
    ja = await h.start(h.ops.join(join_request(a)))
    await h.settle()
    assert h.group().state_name == "PreparingRebalance"
    jb = await h.start(h.ops.join(join_request(b)))
    await h.advance(DELAY)
    # b joined during the delay (group.initial.rebalance.delay.ms): it is extended once
    # more, within the rebalance timeout.
    assert not ja.done() and not jb.done()
    await h.advance(DELAY)
    ra, rb = ja.result(), jb.result()
    assert ra.error == rb.error == ErrorCode.none
    assert ra.generation_id == rb.generation_id == 1
    assert ra.leader == rb.leader == a  # the first member to join leads
    assert ra.protocol_name == "range" and ra.protocol_type == "consumer"
    assert {m.member_id for m in ra.members} == {a, b}  # the leader gets the members
    assert rb.members == ()
    assert h.group().state_name == "CompletingRebalance"
    sb = await h.start(h.ops.sync(SyncRequest("g", 1, b, None, None, None, {})))
    await h.settle()
    assert not sb.done()
    sa = await h.ops.sync(SyncRequest("g", 1, a, None, "consumer", "range", {a: b"A", b: b"B"}))
    await h.settle()
    assert sa == SyncResult(ErrorCode.none, "consumer", "range", b"A")
    assert sb.result() == SyncResult(ErrorCode.none, "consumer", "range", b"B")
    assert h.group().state_name == "Stable"
    record = stored(h)[-1]
    assert isinstance(record, GroupMetadataRecord)
    assert record.generation == 1 and record.leader == a and record.protocol == "range"
    assert {m.member_id: m.assignment for m in record.members} == {a: b"A", b: b"B"}
    await h.ops.heartbeat("g", 1, a, None)
    assert h.group().is_subscribed_to_topic("t1")
    assert not h.group().is_subscribed_to_topic("other")


async def test_a_third_member_rebalances_the_group(h: Harness) -> None:
    a, b = await stable_pair(h)
    c = await h.member_id()
    jc = await h.start(h.ops.join(join_request(c)))
    await h.settle()
    assert h.group().state_name == "PreparingRebalance"
    # The others learn of the rebalance from their heartbeats, then rejoin.
    with pytest.raises(KafkaError) as err:
        await h.ops.heartbeat("g", 1, a, None)
    assert err.value.code == ErrorCode.rebalance_in_progress
    sync = await h.ops.sync(SyncRequest("g", 1, a, None, None, None, {}))
    assert sync.error == ErrorCode.rebalance_in_progress
    ja = await h.start(h.ops.join(join_request(a)))
    await h.settle()
    assert not jc.done()  # b has not rejoined yet
    jb = await h.start(h.ops.join(join_request(b)))
    await h.settle()
    results = [ja.result(), jb.result(), jc.result()]
    assert {r.generation_id for r in results} == {2}
    assert sum(1 for r in results if r.members) == 1
    assert len(next(r for r in results if r.members).members) == 3


async def test_a_member_that_does_not_rejoin_is_removed_after_the_rebalance_timeout(
    h: Harness,
) -> None:
    a, b = await stable_pair(h)
    c = await h.member_id()
    await h.start(h.ops.join(join_request(c)))
    ja = await h.start(h.ops.join(join_request(a)))
    await h.settle()
    # b heartbeats (so its session lasts) but never rejoins.
    for _ in range(REBALANCE // 5000 - 1):
        await h.advance(5000)
        with pytest.raises(KafkaError) as err:
            await h.ops.heartbeat("g", 1, b, None)
        assert err.value.code == ErrorCode.rebalance_in_progress
    await h.advance(4999)
    assert not ja.done()
    await h.advance(1)
    assert ja.result().generation_id == 2
    assert set(h.group().members) == {a, c}  # b never rejoined


async def test_session_timeout_removes_a_silent_member_and_rebalances(h: Harness) -> None:
    a, b = await stable_pair(h)
    await h.advance(SESSION // 2)
    await h.ops.heartbeat("g", 1, a, None)
    await h.advance(SESSION // 2)  # b's session ends
    assert b not in h.group().members
    assert h.group().state_name == "PreparingRebalance"
    with pytest.raises(KafkaError) as err:
        await h.ops.heartbeat("g", 1, b, None)
    assert err.value.code == ErrorCode.unknown_member_id
    with pytest.raises(KafkaError) as err:
        await h.ops.heartbeat("g", 1, a, None)
    assert err.value.code == ErrorCode.rebalance_in_progress
    ra = await h.ops.join(join_request(a))  # all remaining members joined: completes
    assert ra.generation_id == 2 and [m.member_id for m in ra.members] == [a]


async def test_a_pending_member_that_never_joins_expires(h: Harness) -> None:
    pending = await h.member_id()
    assert h.group().is_pending_member(pending)
    await h.advance(SESSION)
    assert not h.group().is_pending_member(pending)


async def test_leave_rebalances_and_the_last_leave_empties_the_group(h: Harness) -> None:
    a, b = await stable_pair(h)
    outcomes = await h.ops.leave("g", [LeavingMember(b), LeavingMember("nobody")])
    assert [o.error for o in outcomes] == [ErrorCode.none, ErrorCode.unknown_member_id]
    assert h.group().state_name == "PreparingRebalance"
    ra = await h.ops.join(join_request(a))
    assert ra.generation_id == 2 and ra.leader == a
    await h.ops.sync(SyncRequest("g", 2, a, None, None, None, {a: b"AB"}))
    await h.ops.leave("g", [LeavingMember(a)])
    await h.settle()
    group = h.group()
    assert group.state_name == "Empty" and group.generation_id == 3
    assert group.is_empty
    last = stored(h)[-1]
    assert isinstance(last, GroupMetadataRecord) and last.members == ()
    group.validate_delete_group()  # Empty: may be deleted
    assert group.tombstones() == [ClassicGroupTombstone("g")]


async def test_a_static_member_rejoins_without_a_rebalance(h: Harness) -> None:
    ja = await h.start(h.ops.join(join_request(instance="i-a", version=9)))
    jb = await h.start(h.ops.join(join_request(instance="i-b", version=9)))
    await h.advance(DELAY)
    await h.advance(DELAY)
    ra, rb = ja.result(), jb.result()
    assert ra.error == ErrorCode.none and ra.member_id.startswith("i-a-")  # no 2-step join
    leader = ra.leader
    assert leader == ra.member_id
    await h.start(h.ops.sync(SyncRequest("g", 1, rb.member_id, "i-b", None, None, {})))
    await h.ops.sync(
        SyncRequest("g", 1, leader, "i-a", None, None, {ra.member_id: b"A", rb.member_id: b"B"})
    )
    await h.settle()
    before = len(stored(h))
    # b restarts: same instance id, no member id. The group stays Stable, generation 1.
    again = await h.ops.join(join_request(instance="i-b", version=9))
    assert again.error == ErrorCode.none
    assert again.member_id != rb.member_id and again.generation_id == 1
    assert not again.skip_assignment and again.members == ()
    assert h.group().state_name == "Stable"
    sync = await h.ops.sync(SyncRequest("g", 1, again.member_id, "i-b", None, None, {}))
    assert sync.assignment == b"B"  # its assignment is kept
    assert len(stored(h)) == before + 1  # the replacement is stored
    # The old member id is fenced.
    with pytest.raises(KafkaError) as err:
        await h.ops.heartbeat("g", 1, rb.member_id, "i-b")
    assert err.value.code == ErrorCode.fenced_instance_id
    # The leader rejoining (v9) is told to skip the assignment, with the members.
    lead = await h.ops.join(join_request(instance="i-a", version=9))
    assert lead.skip_assignment and len(lead.members) == 2 and lead.generation_id == 1
    assert h.group().state_name == "Stable"
    # Before v9 the leader's answer names the old leader id: it acts as a follower.
    old_leader = lead.member_id
    lead8 = await h.ops.join(join_request(instance="i-a", version=8))
    assert lead8.leader == old_leader and lead8.member_id != old_leader
    assert not lead8.skip_assignment and lead8.members == ()


async def test_a_static_member_is_kept_across_a_rebalance_it_misses(h: Harness) -> None:
    ja = await h.start(h.ops.join(join_request(instance="i-a")))
    jb = await h.start(h.ops.join(join_request(instance="i-b")))
    await h.advance(DELAY)
    await h.advance(DELAY)
    a, b = ja.result().member_id, jb.result().member_id
    outcomes = await h.ops.leave("g", [LeavingMember("", "i-b")])  # an admin removes i-b
    assert [(o.member_id, o.error) for o in outcomes] == [("", ErrorCode.none)]
    assert set(h.group().members) == {a} and b not in h.group().members
    assert set(h.group().static_members) == {"i-a"}


async def test_offset_commit_checks_of_a_classic_group(h: Harness) -> None:
    a = await h.member_id()
    ja = await h.start(h.ops.join(join_request(a)))
    await h.advance(DELAY)
    assert ja.result().generation_id == 1
    group = h.group()

    def commit(member: str, generation: int, **kw: Any) -> ErrorCode:
        try:
            group.validate_offset_commit(
                member, None, generation, transactional=kw.get("txn", False), api_version=9
            )
        except KafkaError as exc:
            return exc.code
        return ErrorCode.none

    # CompletingRebalance: REBALANCE_IN_PROGRESS (not for transactional commits).
    assert commit(a, 1) == ErrorCode.rebalance_in_progress
    assert commit(a, 1, txn=True) == ErrorCode.none
    assert commit(a, 0) == ErrorCode.illegal_generation
    assert commit("nobody", 1) == ErrorCode.unknown_member_id
    assert commit("", -1) == ErrorCode.unknown_member_id  # not Empty: members only
    await h.ops.sync(SyncRequest("g", 1, a, None, None, None, {a: b"A"}))
    assert commit(a, 1) == ErrorCode.none
    with pytest.raises(KafkaError) as err:
        group.validate_delete_group()
    assert err.value.code == ErrorCode.non_empty_group
    with pytest.raises(KafkaError) as err:
        group.validate_offset_commit(a, "i-x", 1, transactional=False, api_version=9)
    assert err.value.code == ErrorCode.unknown_member_id


async def test_errors_kafka_answers(h: Harness) -> None:
    a, b = await stable_pair(h)
    # A session timeout outside group.min/max.session.timeout.ms.
    r = await h.ops.join(join_request(session=10))
    assert r.error == ErrorCode.invalid_session_timeout
    r = await h.ops.join(join_request(session=1800001))
    assert r.error == ErrorCode.invalid_session_timeout
    # Another protocol type, or no common protocol.
    r = await h.ops.join(join_request(protocol_type="connect"))
    assert r.error == ErrorCode.inconsistent_group_protocol and r.member_id == ""
    r = await h.ops.join(join_request(a, protocols=(("roundrobin", SUB),)))
    assert r.error == ErrorCode.inconsistent_group_protocol
    # An empty group id.
    assert (await h.ops.join(join_request(group=""))).error == ErrorCode.invalid_group_id
    # A member id the group does not know, and an unknown group named with a member id.
    r = await h.ops.join(join_request("ghost"))
    assert r.error == ErrorCode.unknown_member_id
    r = await h.ops.join(join_request("ghost", group="nope"))
    assert r.error == ErrorCode.unknown_member_id
    assert "nope" not in h.coordinator.classic_groups
    # Heartbeat: generation, member, group.
    for args, code in [
        (("g", 0, a, None), ErrorCode.illegal_generation),
        (("g", 1, "ghost", None), ErrorCode.unknown_member_id),
        (("nope", 1, a, None), ErrorCode.unknown_member_id),
        (("g", 1, a, "i-x"), ErrorCode.unknown_member_id),
    ]:
        with pytest.raises(KafkaError) as err:
            await h.ops.heartbeat(*args)
        assert err.value.code == code, args
    # SyncGroup: generation, member, protocol.
    for req, code in [
        (SyncRequest("g", 7, a, None, None, None, {}), ErrorCode.illegal_generation),
        (SyncRequest("g", 1, "ghost", None, None, None, {}), ErrorCode.unknown_member_id),
        (SyncRequest("nope", 1, a, None, None, None, {}), ErrorCode.unknown_member_id),
        (SyncRequest("g", 1, a, None, "connect", None, {}), ErrorCode.inconsistent_group_protocol),
        (SyncRequest("g", 1, a, None, None, "sticky", {}), ErrorCode.inconsistent_group_protocol),
    ]:
        assert (await h.ops.sync(req)).error == code, req
    # LeaveGroup of an unknown group.
    with pytest.raises(KafkaError) as err:
        await h.ops.leave("nope", [LeavingMember(a)])
    assert err.value.code == ErrorCode.unknown_member_id
    # DescribeGroups of an unknown group: v6 GROUP_ID_NOT_FOUND, v5 Dead only.
    d6 = h.ops.describe("nope", 6)
    assert (d6.error, d6.state) == (ErrorCode.group_id_not_found, "Dead")
    d5 = h.ops.describe("nope", 5)
    assert (d5.error, d5.state) == (ErrorCode.none, "Dead")
    d = h.ops.describe("g", 6)
    assert d.state == "Stable" and d.protocol_data == "range"
    assert {m.member_id: m.assignment for m in d.members} == {a: b"A", b: b"B"}
    assert all(m.metadata == SUB and m.client_host == "/10.0.0.1" for m in d.members)


async def test_group_max_size(h: Harness) -> None:
    h.ops.config = replace(h.ops.config, max_size=1)
    a = await h.member_id()
    await h.start(h.ops.join(join_request(a)))
    await h.advance(DELAY)
    r = await h.ops.join(join_request())
    assert r.error == ErrorCode.group_max_size_reached and r.member_id == ""


async def test_the_initial_rebalance_waits_while_members_arrive(h: Harness) -> None:
    a = await h.member_id()
    ja = await h.start(h.ops.join(join_request(a)))
    await h.advance(DELAY - 100)
    b = await h.member_id()
    jb = await h.start(h.ops.join(join_request(b)))
    await h.advance(100)
    assert not ja.done()  # a new member extended the delay
    await h.advance(DELAY)
    assert ja.result().generation_id == jb.result().generation_id == 1


async def test_share_and_consumer_group_ids(h: Harness) -> None:
    await h.coordinator.heartbeat("queue", "m", 0, ["t1"], None, "c", "/127.0.0.1")
    r = await h.ops.join(join_request(group="queue"))
    assert r.error == ErrorCode.inconsistent_group_protocol and r.member_id == ""
    s = await h.ops.sync(SyncRequest("queue", 1, "m", None, None, None, {}))
    assert s.error == ErrorCode.unknown_member_id
    with pytest.raises(KafkaError) as err:
        await h.ops.heartbeat("queue", 1, "m", None)
    assert err.value.code == ErrorCode.unknown_member_id
    with pytest.raises(KafkaError) as err:
        await h.ops.leave("queue", [LeavingMember("m")])
    assert err.value.code == ErrorCode.unknown_member_id
    d = h.ops.describe("queue", 6)
    assert d.error == ErrorCode.group_id_not_found and d.state == "Dead"
    assert d.message == "Group queue is not a classic group."
    assert h.ops.describe("queue", 5).error == ErrorCode.none
    listed = {g.group_id: g for g in h.coordinator.list_groups()}
    assert listed["queue"].group_type == "share"


@dataclass
class StandIn:
    """A consumer or simple group as the namespace sees one."""

    group_id: str
    group_type: GroupType
    protocol_type: str = ""
    state_name: str = "Empty"
    is_empty: bool = True

    def tombstones(self) -> list[Any]:
        return [ClassicGroupTombstone("marker-" + self.group_id)]


async def test_a_simple_group_becomes_a_classic_group_on_join(h: Harness) -> None:
    h.coordinator.classic_groups["simple"] = StandIn("simple", GroupType.CLASSIC)  # type: ignore[assignment]
    listed = {g.group_id: g for g in h.coordinator.list_groups()}
    assert (listed["simple"].group_type, listed["simple"].protocol_type) == ("classic", "")
    # Heartbeats and syncs of a simple group: it has no members.
    with pytest.raises(KafkaError) as err:
        await h.ops.heartbeat("simple", 0, "m", None)
    assert err.value.code == ErrorCode.unknown_member_id
    member = await h.member_id(group="simple")
    assert isinstance(h.coordinator.classic_groups["simple"], ClassicGroup)
    join = await h.start(h.ops.join(join_request(member, group="simple")))
    await h.advance(DELAY)
    assert join.result().generation_id == 1


async def test_an_empty_consumer_group_is_converted_non_empty_refused(h: Harness) -> None:
    h.coordinator.consumer_groups["busy"] = StandIn("busy", GroupType.CONSUMER, is_empty=False)  # type: ignore[assignment]
    r = await h.ops.join(join_request(group="busy"))
    assert r.error == ErrorCode.inconsistent_group_protocol
    assert "migration is disabled" in (r.message or "")
    h.coordinator.consumer_groups["idle"] = StandIn("idle", GroupType.CONSUMER)  # type: ignore[assignment]
    r = await h.ops.join(join_request(group="idle"))
    assert r.error == ErrorCode.member_id_required
    assert h.coordinator.group_type("idle") == GroupType.CLASSIC
    # The consumer group's tombstones and the new group's record: one batch.
    assert stored(h)[-2:] == [
        ClassicGroupTombstone("marker-idle"),
        GroupMetadataRecord("idle", "", 0, None, None, stored(h)[-1].current_state_timestamp),  # type: ignore[union-attr]
    ]


async def test_reload_restores_the_last_stored_generation_and_expires_members() -> None:
    clock = ManualClock()
    log = MemoryRecordLog()
    first = make(log, clock)
    a, b = await stable_pair(first)
    first.coordinator.classic.unload()
    again = make(log, clock)
    group = again.group()
    assert group.state_name == "Stable" and group.generation_id == 1
    assert set(group.members) == {a, b} and group.members[a].assignment == b"A"
    await again.ops.heartbeat("g", 1, a, None)
    # b never heartbeats to the new coordinator: its session expires, then a's.
    await again.advance(SESSION)
    assert b not in again.group().members
    assert a not in again.group().members  # a did not rejoin either: it is gone too
    assert again.group().state_name == "Empty" and again.group().generation_id == 2
    # A v3 client joins in one round (no MEMBER_ID_REQUIRED before v4).
    join = await again.start(again.ops.join(join_request(version=3)))
    await again.advance(DELAY)
    assert join.result().error == ErrorCode.none and join.result().generation_id == 3


async def test_unload_answers_parked_requests_not_coordinator(h: Harness) -> None:
    a = await h.member_id()
    ja = await h.start(h.ops.join(join_request(a)))
    await h.settle()
    h.coordinator.drop("moved")
    await h.settle()
    assert ja.result().error == ErrorCode.not_coordinator
    assert h.coordinator.classic_groups == {}


def test_subscribed_topics_parses_every_version_prefix() -> None:
    assert subscribed_topics(subscription("a", "b")) == {"a", "b"}
    assert subscribed_topics(b"\x00") is None
    assert subscribed_topics(struct.pack(">hi", 3, 1) + b"\x00\x05ab") is None


def test_join_result_defaults() -> None:
    assert JoinResult().generation_id == -1


class FailingLog(MemoryRecordLog):
    """Records in memory; the next `failures` syncs fail with EIO."""

    def __init__(self) -> None:
        super().__init__()
        self.failures = 0

    async def sync(self) -> None:
        if self.failures:
            self.failures -= 1
            raise OSError(errno.EIO, "injected")


async def test_a_failed_conversion_write_keeps_the_consumer_group() -> None:
    log = FailingLog()
    h = make(log)
    idle = StandIn("idle", GroupType.CONSUMER)
    h.coordinator.consumer_groups["idle"] = idle  # type: ignore[assignment]
    log.failures = 1
    r = await h.ops.join(join_request(group="idle", version=3))  # parked: no member id round
    assert r.error == ErrorCode.not_coordinator
    await h.settle()
    assert h.coordinator.consumer_groups["idle"] is idle
    assert "idle" not in h.coordinator.classic_groups


async def test_a_failed_assignment_write_rebalances() -> None:
    log = FailingLog()
    h = make(log)
    a = await h.member_id()
    b = await h.member_id()
    ja = await h.start(h.ops.join(join_request(a)))
    jb = await h.start(h.ops.join(join_request(b)))
    await h.advance(DELAY)
    await h.advance(DELAY)
    assert ja.result().generation_id == jb.result().generation_id == 1
    sb = await h.start(h.ops.sync(SyncRequest("g", 1, b, None, None, None, {})))
    log.failures = 1
    sa = await h.ops.sync(SyncRequest("g", 1, a, None, None, None, {a: b"A", b: b"B"}))
    await h.settle()
    # Both answered the error; the group rebalances (its members rejoin).
    assert sa.error == sb.result().error == ErrorCode.not_coordinator
    assert h.group().state_name == "PreparingRebalance"
    assert all(m.assignment == b"" for m in h.group().members.values())
