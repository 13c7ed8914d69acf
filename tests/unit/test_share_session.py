"""The share session cache: epochs, partitions, limits and removal."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.share.session import (
    DEFAULT_MAX_SHARE_SESSIONS,
    FINAL_EPOCH,
    INT32_MAX,
    ShareSessionCache,
    next_epoch,
)
from protocol.errors import ErrorCode, KafkaError

T1 = uuid.UUID(int=1)
T2 = uuid.UUID(int=2)
P0, P1, Q0 = (T1, 0), (T1, 1), (T2, 0)


def error(fn, *args, **kwargs) -> ErrorCode:
    with pytest.raises(KafkaError) as e:
        fn(*args, **kwargs)
    return e.value.code


def opened(cache: ShareSessionCache, member: str = "m", parts=(P0, P1), **kw):
    return cache.share_fetch("g", member, 0, parts, (), 0, **kw)


def test_epoch_zero_opens_a_session_expecting_epoch_one() -> None:
    cache = ShareSessionCache()
    context = opened(cache)
    assert context.is_new and not context.is_final
    assert context.session.epoch == 1
    assert context.partitions == [P0, P1]
    assert context.added == (P0, P1)
    assert len(cache) == 1 and cache.total_partitions() == 2


def test_default_limit_is_kafkas() -> None:
    assert ShareSessionCache().max_entries == DEFAULT_MAX_SHARE_SESSIONS == 2000


def test_each_request_must_carry_the_next_epoch() -> None:
    cache = ShareSessionCache()
    opened(cache)
    assert cache.share_fetch("g", "m", 1, (), (), 1).session.epoch == 2
    assert error(cache.share_fetch, "g", "m", 1, (), (), 2) is ErrorCode.invalid_share_session_epoch
    assert error(cache.share_fetch, "g", "m", 3, (), (), 2) is ErrorCode.invalid_share_session_epoch
    assert cache.share_fetch("g", "m", 2, (), (), 3).session.epoch == 3


def test_wrong_epoch_does_not_change_the_session() -> None:
    cache = ShareSessionCache()
    opened(cache)
    error(cache.share_fetch, "g", "m", 5, [Q0], [P0], 1)
    session = cache.get("g", "m")
    assert session is not None
    assert session.epoch == 1 and session.partitions == [P0, P1]


def test_unknown_session_is_not_found() -> None:
    cache = ShareSessionCache()
    assert error(cache.share_fetch, "g", "m", 1, (), (), 0) is ErrorCode.share_session_not_found
    assert error(cache.share_fetch, "g", "m", -1, (), (), 0) is ErrorCode.share_session_not_found
    assert error(cache.share_acknowledge, "g", "m", 1, 0) is ErrorCode.share_session_not_found


def test_sessions_are_keyed_by_group_and_member() -> None:
    cache = ShareSessionCache()
    opened(cache, "m")
    cache.share_fetch("other", "m", 0, [Q0], (), 0)
    assert len(cache) == 2
    assert cache.get("other", "m").partitions == [Q0]  # type: ignore[union-attr]


def test_acknowledgements_are_not_allowed_when_opening() -> None:
    cache = ShareSessionCache()
    assert error(opened, cache, has_acknowledgements=True) is ErrorCode.invalid_request
    assert len(cache) == 0


def test_epoch_zero_replaces_the_members_session() -> None:
    cache = ShareSessionCache(max_entries=1)
    opened(cache)
    cache.share_fetch("g", "m", 1, (), (), 0)
    context = opened(cache, parts=[Q0])
    assert context.session.epoch == 1
    assert context.partitions == [Q0]
    assert len(cache) == 1


def test_cache_full_is_share_session_limit_reached() -> None:
    cache = ShareSessionCache(max_entries=2)
    opened(cache, "a")
    opened(cache, "b")
    assert error(opened, cache, "c") is ErrorCode.share_session_limit_reached
    cache.remove("g", "a")
    assert opened(cache, "c").is_new


def test_request_adds_partitions_and_forgets_others() -> None:
    cache = ShareSessionCache()
    opened(cache)
    context = cache.share_fetch("g", "m", 1, [Q0, P0], [P1], 0)
    assert context.added == (Q0,)
    assert context.removed == (P1,)
    assert context.partitions == [P0, Q0]
    # A partition both added and forgotten ends up forgotten, as in Kafka.
    context = cache.share_fetch("g", "m", 2, [P1], [P1], 0)
    assert context.partitions == [P0, Q0]


def test_final_epoch_returns_a_final_context_and_remove_closes() -> None:
    cache = ShareSessionCache()
    opened(cache)
    context = cache.share_fetch("g", "m", FINAL_EPOCH, [Q0], (), 5)
    assert context.is_final and context.partitions == []
    assert context.session.partitions == [P0, P1]
    removed = cache.remove("g", "m")
    assert removed is not None and removed.partitions == [P0, P1]
    assert cache.get("g", "m") is None
    assert cache.remove("g", "m") is None


def test_a_session_closed_with_the_final_epoch_is_not_closed_again_by_its_disconnect() -> None:
    # Kafka marks the connection's entry stale when the session is removed first, so the
    # disconnect releases nothing twice.
    cache = ShareSessionCache()
    opened(cache, connection_id="c1")
    assert cache.share_acknowledge("g", "m", FINAL_EPOCH, 0).partitions == [P0, P1]
    assert cache.remove("g", "m") is not None
    assert cache.remove_connection("c1") == []


def test_a_session_reopened_on_a_new_connection_survives_the_old_connection_closing() -> None:
    cache = ShareSessionCache()
    opened(cache, connection_id="c1")
    reopened = opened(cache, parts=(Q0,), connection_id="c2")
    assert cache.remove_connection("c1") == []
    assert cache.get("g", "m") is reopened.session
    assert [s.key for s in cache.remove_connection("c2")] == [("g", "m")]


def test_share_acknowledge_epoch_rules() -> None:
    cache = ShareSessionCache()
    opened(cache)
    assert error(cache.share_acknowledge, "g", "m", 0, 0) is ErrorCode.invalid_share_session_epoch
    assert error(cache.share_acknowledge, "g", "m", 2, 0) is ErrorCode.invalid_share_session_epoch
    assert cache.share_acknowledge("g", "m", 1, 0).epoch == 2
    assert cache.share_acknowledge("g", "m", FINAL_EPOCH, 0).epoch == 2
    assert cache.share_fetch("g", "m", 2, (), (), 0).session.epoch == 3


def test_last_used_time_is_recorded() -> None:
    cache = ShareSessionCache()
    cache.share_fetch("g", "m", 0, (), (), 100)
    cache.share_fetch("g", "m", 1, (), (), 250)
    session = cache.get("g", "m")
    assert session is not None
    assert (session.creation_ms, session.last_used_ms) == (100, 250)


def test_epoch_wraps_to_one_like_kafka() -> None:
    assert next_epoch(0) == 1
    assert next_epoch(41) == 42
    assert next_epoch(INT32_MAX) == 1
    assert next_epoch(FINAL_EPOCH) == FINAL_EPOCH
    cache = ShareSessionCache()
    opened(cache)
    cache.get("g", "m").epoch = INT32_MAX  # type: ignore[union-attr]
    assert cache.share_fetch("g", "m", INT32_MAX, (), (), 0).session.epoch == 1


def test_remove_group_and_connection() -> None:
    cache = ShareSessionCache()
    opened(cache, "a", connection_id="c1")
    opened(cache, "b", connection_id="c2")
    cache.share_fetch("h", "a", 0, (), (), 0, connection_id="c1")
    assert sorted(s.key for s in cache.remove_connection("c1")) == [("g", "a"), ("h", "a")]
    assert cache.remove_connection("c1") == []
    assert [s.member_id for s in cache.remove_group("g")] == ["b"]
    assert len(cache) == 0


def test_remove_member_removes_its_session() -> None:
    cache = ShareSessionCache()
    opened(cache, "a")
    assert cache.remove_member("g", "a") is not None
    assert cache.get("g", "a") is None


@settings(max_examples=200, deadline=None)
@given(epochs=st.lists(st.integers(-2, 8), max_size=40))
def test_only_the_exact_next_epoch_is_accepted(epochs: list[int]) -> None:
    cache = ShareSessionCache()
    expected: int | None = None  # the model: epoch the session expects, None if no session
    for epoch in epochs:
        try:
            context = cache.share_fetch("g", "m", epoch, [P0], (), 0)
        except KafkaError as e:
            if expected is None:
                assert e.code is ErrorCode.share_session_not_found
            else:
                assert e.code is ErrorCode.invalid_share_session_epoch
                assert epoch not in (0, -1, expected)
            continue
        if epoch == 0:
            expected = 1
        elif epoch == FINAL_EPOCH:
            assert expected is not None and context.is_final
            cache.remove("g", "m")
            expected = None
        else:
            assert epoch == expected
            expected = next_epoch(epoch)
        session = cache.get("g", "m")
        assert (session.epoch if session else None) == expected


@settings(max_examples=100, deadline=None)
@given(members=st.lists(st.sampled_from("abcdefgh"), max_size=30), limit=st.integers(1, 5))
def test_the_cache_never_exceeds_its_limit(members: list[str], limit: int) -> None:
    cache = ShareSessionCache(max_entries=limit)
    for member in members:
        try:
            opened(cache, member)
        except KafkaError as e:
            assert e.code is ErrorCode.share_session_limit_reached
            assert len(cache) == limit
            assert cache.get("g", member) is None
        assert len(cache) <= limit
