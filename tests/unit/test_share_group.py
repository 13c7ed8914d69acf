"""ShareGroup membership: ShareGroupHeartbeat rules, epochs, expiry, topics, replay."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.group_config import GroupConfig, GroupConfigStore
from coordinator.group_coordinator import GroupCoordinator
from coordinator.share_group import (
    HeartbeatResult,
    ShareGroup,
    ShareGroupMetadataRecord,
    ShareGroupState,
    ShareGroupStatePartitionMetadataRecord,
    TopicMetadata,
    member_id_valid,
    validate_heartbeat_request,
)
from coordinator.share_persister import InMemoryPersister
from protocol.errors import ErrorCode, KafkaError

T1 = uuid.UUID(int=1)
T2 = uuid.UUID(int=2)
CONFIG = GroupConfig()


def meta(**counts: int) -> dict[uuid.UUID, TopicMetadata]:
    ids = {"t1": T1, "t2": T2}
    return {ids[name]: TopicMetadata(ids[name], name, n) for name, n in counts.items()}


TOPICS = meta(t1=4, t2=2)


def heartbeat(
    group: ShareGroup,
    member_id: str,
    epoch: int,
    names: list[str] | None = None,
    *,
    topics: dict[uuid.UUID, TopicMetadata] = TOPICS,
    now_ms: int = 0,
    config: GroupConfig = CONFIG,
    rack_id: str | None = None,
) -> HeartbeatResult:
    """Heartbeat and replay the records, as the runtime does."""
    result = group.heartbeat(
        member_id, epoch, names, rack_id, "client", "/127.0.0.1", topics, now_ms, config
    )
    group.replay_all(result.records)
    return result


def ready_group(group_id: str = "g", topics: dict[uuid.UUID, TopicMetadata] = TOPICS) -> ShareGroup:
    """A group whose share state is initialized for every partition of `topics`, so
    its members are assigned them at once (the tests of membership and balance)."""
    group = ShareGroup(group_id)
    group.replay(
        ShareGroupStatePartitionMetadataRecord(
            group_id, {}, {t.topic_id: frozenset(range(t.num_partitions)) for t in topics.values()}
        )
    )
    return group


def join(group: ShareGroup, member_id: str, names=("t1",), **kw) -> HeartbeatResult:
    return heartbeat(group, member_id, 0, list(names), **kw)


def code_of(excinfo: pytest.ExceptionInfo[KafkaError]) -> ErrorCode:
    return excinfo.value.code


# -- joining ---------------------------------------------------------------


def test_first_heartbeat_creates_the_member_and_bumps_the_group_epoch() -> None:
    group = ready_group()
    assert group.state is ShareGroupState.EMPTY
    result = join(group, "a", ("t1", "t2"))
    assert result.member_epoch == 1 == group.group_epoch == group.assignment_epoch
    assert result.assignment == {T1: frozenset(range(4)), T2: frozenset(range(2))}
    assert result.heartbeat_interval_ms == 5000
    assert group.state is ShareGroupState.STABLE
    assert group.members["a"].assignment == result.assignment


@pytest.mark.parametrize("member_id", ["", "   "])
def test_empty_member_id_is_invalid_request(member_id: str) -> None:
    with pytest.raises(KafkaError) as e:
        join(ShareGroup("g"), member_id)
    assert code_of(e) is ErrorCode.invalid_request


@pytest.mark.parametrize("names", [None, []])
def test_join_without_subscribed_topics_is_invalid_request(names: list[str] | None) -> None:
    with pytest.raises(KafkaError) as e:
        heartbeat(ShareGroup("g"), "a", 0, names)
    assert code_of(e) is ErrorCode.invalid_request


def test_member_epoch_below_minus_one_is_invalid_request() -> None:
    group = ready_group()
    join(group, "a")
    with pytest.raises(KafkaError) as e:
        heartbeat(group, "a", -2)
    assert code_of(e) is ErrorCode.invalid_request


def test_empty_rack_is_invalid_request() -> None:
    with pytest.raises(KafkaError) as e:
        heartbeat(ShareGroup("g"), "a", 0, ["t1"], rack_id="")
    assert code_of(e) is ErrorCode.invalid_request


# -- request validation (Kafka's KafkaApis and GroupCoordinatorService) -------

UUID_MEMBER = str(uuid.UUID(int=5))  # 36 characters, the longest valid member id


@pytest.mark.parametrize(
    ("member_id", "valid"),
    [("", False), (None, False), ("m", True), (UUID_MEMBER, True), (UUID_MEMBER + "x", False)],
)
def test_member_id_is_valid_when_non_empty_and_at_most_36_characters(
    member_id: str | None, valid: bool
) -> None:
    assert member_id_valid(member_id) is valid


@pytest.mark.parametrize(
    ("group_id", "member_id", "epoch", "names", "rack", "message"),
    [
        ("g", UUID_MEMBER + "x", 0, ["t1"], None, "Invalid member id in the request."),
        ("g", "", 0, ["t1"], None, "Invalid member id in the request."),
        ("g", "  ", 0, ["t1"], None, "MemberId can't be empty."),
        ("", "m", 0, ["t1"], None, "GroupId can't be empty."),
        (" ", "m", 3, None, None, "GroupId can't be empty."),
        ("g", "m", 3, None, " ", "RackId can't be empty."),
        ("g", "m", 0, None, None, "SubscribedTopicNames must be set in first request."),
        ("g", "m", 0, [], None, "SubscribedTopicNames must be set in first request."),
        ("g", "m", -2, None, None, "MemberEpoch is invalid."),
    ],
)
def test_invalid_heartbeat_requests_are_invalid_request_with_kafkas_message(
    group_id: str,
    member_id: str,
    epoch: int,
    names: list[str] | None,
    rack: str | None,
    message: str,
) -> None:
    with pytest.raises(KafkaError) as e:
        validate_heartbeat_request(group_id, member_id, epoch, names, rack)
    assert code_of(e) is ErrorCode.invalid_request
    assert e.value.message == message


def test_valid_heartbeat_requests_pass_validation() -> None:
    validate_heartbeat_request("g", UUID_MEMBER, 0, ["t1"], "rack-a")
    validate_heartbeat_request("g", "m", 7, None, None)  # unchanged subscription: null
    validate_heartbeat_request("g", "m", 7, [], None)  # not a join: an empty list is allowed
    validate_heartbeat_request("g", "m", -1, None, None)


def test_a_deleted_group_still_validates_the_request_first() -> None:
    group = ready_group()
    group.replay_all(group.delete())
    with pytest.raises(KafkaError) as e:
        heartbeat(group, "a", -2)
    assert code_of(e) is ErrorCode.invalid_request
    with pytest.raises(KafkaError) as e:
        heartbeat(group, "a", 3)
    assert code_of(e) is ErrorCode.group_id_not_found


def coordinator() -> GroupCoordinator:
    return GroupCoordinator(InMemoryPersister(), lambda: TOPICS, GroupConfigStore())


async def coordinator_heartbeat(
    groups: GroupCoordinator,
    group_id: str,
    member_id: str,
    epoch: int,
    names: list[str] | None = None,
) -> HeartbeatResult:
    return await groups.heartbeat(group_id, member_id, epoch, names, None, "c", "/127.0.0.1")


@pytest.mark.parametrize("epoch", [1, 5, -1])
async def test_unknown_group_is_group_id_not_found_unless_the_member_joins(epoch: int) -> None:
    groups = coordinator()
    with pytest.raises(KafkaError) as e:
        await coordinator_heartbeat(groups, "nobody", "m", epoch)
    assert code_of(e) is ErrorCode.group_id_not_found
    assert groups.list_groups() == []
    joined = await coordinator_heartbeat(groups, "nobody", "m", 0, ["t1"])
    assert joined.member_epoch > 0
    await groups.stop()


@pytest.mark.parametrize(
    ("group_id", "member_id", "epoch"),
    [("", "m", 0), ("", "m", 3), ("g", "m", -2), ("g", "", 3), ("g", "m" * 37, 0)],
)
async def test_coordinator_validates_before_looking_the_group_up(
    group_id: str, member_id: str, epoch: int
) -> None:
    groups = coordinator()
    with pytest.raises(KafkaError) as e:
        await coordinator_heartbeat(groups, group_id, member_id, epoch, ["t1"])
    assert code_of(e) is ErrorCode.invalid_request
    assert groups.list_groups() == []
    await groups.stop()


async def test_unknown_member_of_an_existing_group_is_unknown_member_id() -> None:
    groups = coordinator()
    await coordinator_heartbeat(groups, "g", "a", 0, ["t1"])
    for epoch in (1, -1):
        with pytest.raises(KafkaError) as e:
            await coordinator_heartbeat(groups, "g", "stranger", epoch)
        assert code_of(e) is ErrorCode.unknown_member_id
    await groups.stop()


def test_group_max_size_reached() -> None:
    group = ready_group()
    small = GroupConfig(max_size=2)
    join(group, "a", config=small)
    join(group, "b", config=small)
    with pytest.raises(KafkaError) as e:
        join(group, "c", config=small)
    assert code_of(e) is ErrorCode.group_max_size_reached
    # Existing members still heartbeat.
    assert heartbeat(group, "a", group.members["a"].member_epoch, config=small).member_epoch > 0


def test_existing_member_can_rejoin_with_epoch_zero_and_gets_its_assignment() -> None:
    group = ready_group()
    join(group, "a")
    join(group, "b")
    heartbeat(group, "a", group.members["a"].member_epoch)
    epoch_before = group.group_epoch
    result = join(group, "a")
    assert group.group_epoch == epoch_before
    assert result.member_epoch == group.members["a"].member_epoch
    assert result.assignment == group.members["a"].assignment


# -- epochs and fencing ------------------------------------------------------


def test_unknown_member_gets_unknown_member_id() -> None:
    group = ready_group()
    join(group, "a")
    with pytest.raises(KafkaError) as e:
        heartbeat(group, "zzz", 1)
    assert code_of(e) is ErrorCode.unknown_member_id


@pytest.mark.parametrize("epoch", [3, 10])
def test_greater_member_epoch_is_fenced(epoch: int) -> None:
    group = ready_group()
    join(group, "a")
    join(group, "b")
    heartbeat(group, "a", 1)  # a moves to epoch 2, previous 1
    assert group.members["a"].member_epoch == 2
    with pytest.raises(KafkaError) as e:
        heartbeat(group, "a", epoch)
    assert code_of(e) is ErrorCode.fenced_member_epoch


def test_smaller_epoch_than_previous_is_fenced() -> None:
    group = ready_group()
    join(group, "a")
    join(group, "b")
    join(group, "c")
    heartbeat(group, "a", 1)  # a: epoch 3, previous 1
    heartbeat(group, "a", 3)
    join(group, "d")
    heartbeat(group, "a", 3)  # a: epoch 4, previous 3
    with pytest.raises(KafkaError) as e:
        heartbeat(group, "a", 1)
    assert code_of(e) is ErrorCode.fenced_member_epoch


def test_previous_member_epoch_is_accepted_when_the_response_was_lost() -> None:
    group = ready_group()
    join(group, "a")
    join(group, "b")
    heartbeat(group, "a", 1)  # response "epoch 2" lost
    result = heartbeat(group, "a", 1)
    assert result.member_epoch == 2


def test_heartbeat_without_change_returns_no_assignment() -> None:
    group = ready_group()
    first = join(group, "a")
    again = heartbeat(group, "a", first.member_epoch)
    assert again.assignment is None
    assert again.member_epoch == first.member_epoch
    assert again.records == []


def test_second_member_rebalances_and_first_member_moves_on_its_next_heartbeat() -> None:
    group = ready_group()
    join(group, "a")
    b = join(group, "b")
    assert group.group_epoch == 2
    assert b.member_epoch == 2
    a = heartbeat(group, "a", 1)
    assert a.member_epoch == 2
    assert a.assignment is not None
    assert b.assignment is not None
    assert set(a.assignment[T1]) | set(b.assignment[T1]) == set(range(4))
    assert not set(a.assignment[T1]) & set(b.assignment[T1])


def test_subscription_change_bumps_the_group_epoch() -> None:
    group = ready_group()
    join(group, "a", ("t1",))
    result = heartbeat(group, "a", 1, ["t1", "t2"])
    assert group.group_epoch == 2
    assert result.member_epoch == 2
    assert result.assignment == {T1: frozenset(range(4)), T2: frozenset(range(2))}


def test_rack_or_client_change_does_not_bump_the_group_epoch() -> None:
    group = ready_group()
    join(group, "a")
    heartbeat(group, "a", 1, rack_id="rack-1")
    assert group.group_epoch == 1
    assert group.members["a"].rack_id == "rack-1"


def test_leave_removes_the_member_and_bumps_the_group_epoch() -> None:
    group = ready_group()
    join(group, "a")
    join(group, "b")
    result = heartbeat(group, "b", -1)
    assert result.member_epoch == -1
    assert result.assignment is None
    assert "b" not in group.members
    assert group.group_epoch == 3 == group.assignment_epoch
    assert group.target_assignment["a"] == {T1: frozenset(range(4))}


def test_last_member_leaving_empties_the_group_and_epochs_catch_up() -> None:
    group = ready_group()
    join(group, "a")
    heartbeat(group, "a", -1)
    assert group.state is ShareGroupState.EMPTY
    assert group.group_epoch == group.assignment_epoch == 2
    assert group.target_assignment == {}


def test_unknown_member_leaving_gets_unknown_member_id() -> None:
    with pytest.raises(KafkaError) as e:
        heartbeat(ShareGroup("g"), "a", -1)
    assert code_of(e) is ErrorCode.unknown_member_id


def test_heartbeat_changes_nothing_until_its_records_are_replayed() -> None:
    group = ready_group()
    result = group.heartbeat("a", 0, ["t1"], None, "c", "h", TOPICS, 0, CONFIG)
    assert result.records
    assert group.members == {} and group.group_epoch == 0
    group.replay_all(result.records)
    assert "a" in group.members and group.group_epoch == 1


# -- session timeout ---------------------------------------------------------


def test_expire_members_removes_silent_members_and_bumps_the_epoch() -> None:
    group = ready_group()
    join(group, "a", now_ms=0)
    join(group, "b", now_ms=10_000)
    assert group.expire_members(44_999).expired == []
    result = group.expire_members(45_000)
    assert [m.member_id for m in result.expired] == ["a"]
    epoch = group.group_epoch
    group.replay_all(result.records)
    assert list(group.members) == ["b"]
    assert group.group_epoch == epoch + 1
    assert group.target_assignment == {"b": {T1: frozenset(range(4))}}


def test_heartbeat_extends_the_session() -> None:
    group = ready_group()
    join(group, "a", now_ms=0)
    heartbeat(group, "a", 1, now_ms=40_000)
    assert group.expire_members(60_000).expired == []
    assert group.session_deadline_ms("a") == 85_000


def test_session_timeout_comes_from_the_group_config() -> None:
    group = ready_group()
    join(group, "a", config=GroupConfig(session_timeout_ms=50_000))
    assert group.expire_members(49_999).expired == []
    assert len(group.expire_members(50_000).expired) == 1


def test_on_loaded_restarts_session_timers() -> None:
    group = ready_group()
    join(group, "a")
    fresh = ShareGroup("g")
    fresh.replay_all(group.heartbeat("b", 0, ["t1"], None, "c", "h", TOPICS, 0, CONFIG).records)
    fresh.on_loaded(100_000, CONFIG)
    assert fresh.expire_members(144_999).expired == []
    assert len(fresh.expire_members(145_000).expired) == 1


# -- topics changing ---------------------------------------------------------


def test_deleted_topic_leaves_the_target_assignment() -> None:
    group = ready_group()
    join(group, "a", ("t1", "t2"))
    result = group.on_topics_changed(meta(t1=4))
    group.replay_all(result.records)
    assert group.group_epoch == 2
    assert group.target_assignment["a"] == {T1: frozenset(range(4))}
    assert heartbeat(group, "a", 1, topics=meta(t1=4)).assignment == {T1: frozenset(range(4))}


def initialize_all(group: ShareGroup, now_ms: int = 0) -> None:
    """What the group coordinator does: initialize what needs it, then mark it."""
    pending = group.partitions_to_initialize(now_ms, CONFIG.initialize_retry_interval_ms)
    group.replay_all(group.mark_initializing(pending, now_ms))
    group.replay_all(group.mark_initialized(pending))


def test_recreated_topic_with_new_id_is_assigned_once_initialized() -> None:
    group = ready_group()
    join(group, "a")
    new_id = uuid.UUID(int=99)
    group.replay_all(group.on_topics_changed({new_id: TopicMetadata(new_id, "t1", 1)}).records)
    assert group.target_assignment["a"] == {}
    initialize_all(group)
    assert group.target_assignment["a"] == {new_id: frozenset({0})}


def test_new_partitions_are_assigned_once_initialized() -> None:
    group = ready_group()
    join(group, "a")
    group.replay_all(group.on_topics_changed(meta(t1=6, t2=2)).records)
    assert group.target_assignment["a"] == {T1: frozenset(range(4))}
    assert group.partitions_to_initialize(0, 30_000) == {T1: frozenset({4, 5})}
    epoch = group.group_epoch
    initialize_all(group)
    assert group.target_assignment["a"] == {T1: frozenset(range(6))}
    assert group.group_epoch == group.assignment_epoch == epoch + 1


def test_unchanged_topics_do_not_bump_the_epoch() -> None:
    group = ready_group()
    join(group, "a")
    assert group.on_topics_changed(TOPICS).records == []


def test_subscribing_to_a_topic_not_created_yet_assigns_it_once_it_exists() -> None:
    group = ready_group()
    join(group, "a", ("later",))
    assert group.target_assignment["a"] == {}
    later = uuid.UUID(int=7)
    topics = {**TOPICS, later: TopicMetadata(later, "later", 2)}
    group.replay_all(group.on_topics_changed(topics).records)
    assert group.target_assignment["a"] == {}
    initialize_all(group)
    assert group.target_assignment["a"] == {later: frozenset({0, 1})}


# -- share-partition state bookkeeping --------------------------------------


def test_partitions_needing_initialization_follow_initializing_and_initialized() -> None:
    group = ShareGroup("g")
    join(group, "a", ("t1", "t2"))
    group.replay_all(group.mark_uninitialized({T1: range(4), T2: range(2)}))
    assert group.partitions_to_initialize(0, 30_000) == {
        T1: frozenset(range(4)),
        T2: frozenset({0, 1}),
    }
    group.replay_all(group.mark_initializing({T1: [0, 1]}, 0))
    assert group.partitions_to_initialize(0, 30_000) == {
        T1: frozenset({2, 3}),
        T2: frozenset({0, 1}),
    }
    group.replay_all(group.mark_initialized({T1: [0, 1]}))
    assert group.initialized == {T1: frozenset({0, 1})}
    assert group.initializing == {}
    group.replay_all(group.mark_initialized({T1: [2, 3], T2: [0, 1]}))
    assert group.partitions_to_initialize(0, 30_000) == {}
    assert group.mark_initialized({T1: [0]}) == []


def test_deleted_topic_is_forgotten_by_share_state_bookkeeping() -> None:
    group = ShareGroup("g")
    join(group, "a", ("t1", "t2"))
    group.replay_all(group.mark_initialized({T1: [0], T2: [0, 1]}))
    result = group.on_topics_changed(meta(t1=4))
    assert result.deleted_topic_ids == {T2}
    group.replay_all(result.records)
    assert group.initialized == {T1: frozenset({0})}
    assert group.initializing == {T1: frozenset({1, 2, 3})}
    assert group.target_assignment["a"] == {T1: frozenset({0})}


def test_mark_uninitialized_forgets_state() -> None:
    group = ShareGroup("g")
    join(group, "a")
    group.replay_all(group.mark_initialized({T1: range(4)}))
    group.replay_all(group.mark_uninitialized({T1: [3]}))
    assert group.partitions_to_initialize(0, 30_000) == {T1: frozenset({3})}


# -- describe, delete, replay ------------------------------------------------


def test_describe_reports_members_epochs_and_assignor() -> None:
    group = ready_group()
    join(group, "b", ("t2",))
    join(group, "a", ("t1",), rack_id="r1")
    d = group.describe()
    assert (d.group_id, d.group_state, d.group_epoch, d.assignor_name) == (
        "g",
        "Stable",
        2,
        "simple",
    )
    assert [m.member_id for m in d.members] == ["a", "b"]
    a = d.members[0]
    assert (a.rack_id, a.member_epoch, a.subscribed_topic_names) == ("r1", 2, ("t1",))
    assert a.assignment == {T1: frozenset(range(4))}


def test_delete_needs_an_empty_group_and_leaves_it_dead() -> None:
    group = ready_group()
    join(group, "a")
    with pytest.raises(KafkaError) as e:
        group.delete()
    assert code_of(e) is ErrorCode.non_empty_group
    heartbeat(group, "a", -1)
    group.replay_all(group.delete())
    assert group.state is ShareGroupState.DEAD
    assert group.describe().group_state == "Dead"


def test_replaying_the_log_rebuilds_the_same_group() -> None:
    group = ready_group()
    log = []

    def run(result: HeartbeatResult) -> None:
        log.extend(result.records)

    for member, names in [("a", ["t1"]), ("b", ["t1", "t2"]), ("c", ["t2"])]:
        r = group.heartbeat(member, 0, names, None, "c", "h", TOPICS, 0, CONFIG)
        group.replay_all(r.records)
        run(r)
    r = group.heartbeat("a", 1, None, None, "c", "h", TOPICS, 0, CONFIG)
    group.replay_all(r.records)
    run(r)
    r2 = group.heartbeat("c", -1, None, None, "c", "h", TOPICS, 0, CONFIG)
    group.replay_all(r2.records)
    run(r2)
    assert_same(group, replayed(log))


def replayed(log) -> ShareGroup:
    fresh = ready_group()
    fresh.replay_all(log)
    return fresh


def assert_same(live: ShareGroup, fresh: ShareGroup) -> None:
    assert fresh.members == live.members
    assert fresh.target_assignment == live.target_assignment
    assert fresh.group_epoch == live.group_epoch
    assert fresh.assignment_epoch == live.assignment_epoch
    assert fresh.subscription_metadata == live.subscription_metadata
    assert fresh.initialized == live.initialized


# -- properties -----------------------------------------------------------------

operations = st.lists(
    st.tuples(
        st.sampled_from(["join", "heartbeat", "subscribe", "leave", "expire", "stale"]),
        st.sampled_from(["a", "b", "c", "d", "e"]),
        st.integers(0, 30_000),
        st.sets(st.sampled_from(["t1", "t2", "t3"]), min_size=1),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(ops=operations)
def test_random_membership_keeps_the_group_consistent(ops) -> None:
    group = ready_group()
    log: list = []
    now = 0
    last_group_epoch = 0
    for op, member, dt, names in ops:
        now += dt
        current = group.members.get(member)
        try:
            if op == "join":
                result = group.heartbeat(member, 0, names, None, "c", "h", TOPICS, now, CONFIG)
            elif op in ("heartbeat", "subscribe"):
                epoch = current.member_epoch if current else 1
                sub = names if op == "subscribe" else None
                result = group.heartbeat(member, epoch, sub, None, "c", "h", TOPICS, now, CONFIG)
            elif op == "leave":
                result = group.heartbeat(member, -1, None, None, "c", "h", TOPICS, now, CONFIG)
            elif op == "stale":
                epoch = (current.member_epoch if current else 0) + 7
                result = group.heartbeat(member, epoch, None, None, "c", "h", TOPICS, now, CONFIG)
            else:
                expiry = group.expire_members(now)
                for m in expiry.expired:
                    assert group.session_deadline_ms(m.member_id) <= now  # type: ignore[operator]
                group.replay_all(expiry.records)
                log += expiry.records
                assert all(m.member_id not in group.members for m in expiry.expired)
                continue
        except KafkaError as e:
            assert e.code in {
                ErrorCode.unknown_member_id,
                ErrorCode.fenced_member_epoch,
            }, e
            if op == "stale":
                assert current is None or e.code is ErrorCode.fenced_member_epoch
            continue
        assert op != "stale"
        group.replay_all(result.records)
        log += result.records
        if op != "leave":
            assert result.member_epoch == group.members[member].member_epoch
            assert result.member_epoch <= group.group_epoch
        if op == "join":
            assert result.assignment is not None
        # Group epochs only increase; each record states a larger epoch.
        for record in result.records:
            if isinstance(record, ShareGroupMetadataRecord):
                assert record.epoch > last_group_epoch
                last_group_epoch = record.epoch
        assert group.group_epoch == group.assignment_epoch
        # Every subscribed, existing partition has at least one member in the target.
        targeted = {
            (t, p) for a in group.target_assignment.values() for t, ps in a.items() for p in ps
        }
        subscribed = {
            (t.topic_id, p)
            for t in group.subscription_metadata.values()
            for p in range(t.num_partitions)
        }
        assert targeted == subscribed
        assert group.state is (ShareGroupState.STABLE if group.members else ShareGroupState.EMPTY)
    assert_same(group, replayed(log))
