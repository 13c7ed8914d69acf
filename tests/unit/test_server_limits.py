"""The socket server's resource bounds without sockets: idle connections on a manual
clock, the request byte budget, and the settings that must agree."""

from __future__ import annotations

import asyncio
import errno
import os
import resource
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.config import BrokerConfig
from broker.partitions import MIN_FREE_FILES, LogManager
from broker.server import (
    INT_MAX,
    ByteBudget,
    IdleTracker,
    Server,
    ServerLimits,
    parse_ip_overrides,
)
from persister.clock import ManualClock
from persister.commit import GroupCommit
from persister.segment import LogSegment
from protocol.errors import ErrorCode, KafkaError

MAX_IDLE_MS = 1000


class Closed:
    """Records what the tracker reports idle: (connection id, idle ms)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def __call__(self, conn: int, idle_ms: int) -> None:
        self.calls.append((conn, idle_ms))

    @property
    def ids(self) -> list[int]:
        return [conn for conn, _ in self.calls]


def tracker(max_idle_ms: int = MAX_IDLE_MS) -> tuple[IdleTracker, ManualClock, Closed]:
    clock = ManualClock()
    closed = Closed()
    idle = IdleTracker(clock, max_idle_ms, closed)
    idle.start()
    return idle, clock, closed


# -- idle connections -------------------------------------------------------------------


def test_silent_connection_is_closed_once_max_idle_ms_has_passed() -> None:
    idle, clock, closed = tracker()
    idle.opened(1)
    clock.advance(MAX_IDLE_MS - 1)
    assert closed.calls == []
    clock.advance(1)
    assert closed.calls == [(1, MAX_IDLE_MS)]


def test_complete_request_restarts_the_idle_time() -> None:
    idle, clock, closed = tracker()
    idle.opened(1)
    clock.advance(600)
    idle.request_received(1)
    idle.request_done(1)
    clock.advance(MAX_IDLE_MS - 1)
    assert closed.calls == []
    clock.advance(1)
    assert closed.calls == [(1, MAX_IDLE_MS)]


def test_connection_with_a_request_in_flight_is_never_idle() -> None:
    # A long-poll Fetch or ShareFetch parked for MaxWaitMs is in flight, not idle.
    idle, clock, closed = tracker()
    idle.opened(1)
    idle.request_received(1)
    clock.advance(10 * MAX_IDLE_MS)
    assert closed.calls == []
    idle.request_done(1)  # the response is sent: idle time starts now
    clock.advance(MAX_IDLE_MS - 1)
    assert closed.calls == []
    clock.advance(1)
    assert closed.ids == [1]


def test_pipelined_requests_keep_a_connection_busy_until_the_last_is_done() -> None:
    idle, clock, closed = tracker()
    idle.opened(1)
    idle.request_received(1)
    idle.request_received(1)
    idle.request_done(1)
    clock.advance(5 * MAX_IDLE_MS)
    assert closed.calls == []
    idle.request_done(1)
    clock.advance(MAX_IDLE_MS)
    assert closed.ids == [1]


def test_connection_that_never_completes_a_request_ages_like_a_silent_one() -> None:
    # A slowloris trickles bytes of a frame: nothing reaches the tracker until the
    # frame is complete, so its idle time runs from when it connected.
    idle, clock, closed = tracker()
    idle.opened(1)
    idle.opened(2)
    for _ in range(4):
        clock.advance(MAX_IDLE_MS // 4)
        idle.request_received(2)
        idle.request_done(2)
    assert closed.ids == [1]


def test_idle_connections_are_closed_oldest_first_and_active_ones_kept() -> None:
    idle, clock, closed = tracker()
    idle.opened(1)
    clock.advance(100)
    idle.opened(2)
    clock.advance(100)
    idle.opened(3)
    clock.advance(500)
    idle.request_received(3)
    idle.request_done(3)
    clock.advance(300)
    assert closed.calls == [(1, 1000)]
    clock.advance(100)
    assert closed.calls == [(1, 1000), (2, 1000)]
    assert clock.pending_timers == 1
    clock.advance(599)  # 3 was active at 700
    assert closed.ids == [1, 2]
    clock.advance(1)
    assert closed.calls[-1] == (3, 1000)


def test_sweep_keeps_running_for_connections_opened_later() -> None:
    idle, clock, closed = tracker()
    clock.advance(5 * MAX_IDLE_MS + 123)  # sweeps with nobody connected
    idle.opened(7)
    clock.advance(MAX_IDLE_MS)
    assert closed.ids == [7]


def test_closed_connection_is_forgotten() -> None:
    idle, clock, closed = tracker()
    idle.opened(1)
    idle.request_received(1)
    idle.closed(1)
    idle.request_done(1)  # its sender finishing after the close changes nothing
    idle.opened(2)
    idle.closed(2)
    clock.advance(3 * MAX_IDLE_MS)
    assert closed.calls == []


def test_negative_max_idle_ms_never_closes_and_arms_no_timer() -> None:
    idle, clock, closed = tracker(max_idle_ms=-1)
    idle.opened(1)
    clock.advance(10**9)
    assert closed.calls == []
    assert clock.pending_timers == 0


def test_stop_cancels_the_sweep() -> None:
    idle, clock, closed = tracker()
    idle.opened(1)
    idle.stop()
    clock.advance(3 * MAX_IDLE_MS)
    assert closed.calls == []
    assert clock.pending_timers == 0


# -- the request byte budget ------------------------------------------------------------


def test_budget_grants_while_requests_fit_and_refuses_past_the_limit() -> None:
    budget: ByteBudget[str] = ByteBudget(100)
    assert budget.try_acquire(60)
    assert budget.try_acquire(40)
    assert not budget.try_acquire(1)
    assert budget.reserved == 100


def test_waiting_reservation_is_granted_when_enough_bytes_are_released() -> None:
    budget: ByteBudget[str] = ByteBudget(100)
    assert budget.try_acquire(70)
    assert not budget.try_acquire(50)
    budget.wait(50, "b")
    assert budget.waiting == 1  # its connection is not read now
    assert budget.release(10) == []  # 60 + 50 still does not fit
    assert budget.release(30) == ["b"]
    assert budget.waiting == 0  # reading resumes
    assert budget.reserved == 80


def test_small_request_does_not_overtake_a_waiting_large_one() -> None:
    budget: ByteBudget[str] = ByteBudget(100)
    assert budget.try_acquire(90)
    assert not budget.try_acquire(80)
    budget.wait(80, "large")
    # 5 bytes would fit, but the large request came first.
    assert not budget.try_acquire(5)
    budget.wait(5, "small")
    assert budget.release(90) == ["large", "small"]
    assert budget.reserved == 85


def test_request_larger_than_the_limit_is_granted_when_nothing_is_reserved() -> None:
    budget: ByteBudget[str] = ByteBudget(100)
    assert budget.try_acquire(10)
    assert not budget.try_acquire(150)
    budget.wait(150, "huge")
    assert budget.release(10) == ["huge"]
    assert budget.reserved == 150


def test_withdrawn_reservation_is_never_granted() -> None:
    budget: ByteBudget[str] = ByteBudget(100)
    assert budget.try_acquire(100)
    budget.wait(50, "gone")
    budget.wait(50, "next")
    assert budget.cancel("gone")
    assert budget.release(100) == ["next"]
    assert not budget.cancel("next")  # already granted: its owner must release it


def test_unbounded_budget_never_waits_and_records_the_high_water_mark() -> None:
    budget: ByteBudget[str] = ByteBudget(-1)
    for _ in range(5):
        assert budget.try_acquire(100 << 20)
    budget.release(300 << 20)
    assert budget.reserved == 200 << 20
    assert budget.max_reserved == 500 << 20


async def _no_dispatch(*_: object) -> bytes | None:
    return None


async def test_server_reserve_waits_until_handled_requests_release_bytes() -> None:
    server = Server("127.0.0.1", 0, _no_dispatch, limits=ServerLimits(100, 100))
    await server.reserve(80)
    waiting = asyncio.create_task(server.reserve(50))
    await asyncio.sleep(0)
    assert not waiting.done()
    server.release(80)
    await asyncio.wait_for(waiting, 1)
    assert (server.stats.queued_bytes, server.stats.queued_bytes_max) == (50, 80)


async def test_cancelled_reserve_leaves_nothing_reserved() -> None:
    # A connection closed while waiting for the budget must not hold bytes.
    server = Server("127.0.0.1", 0, _no_dispatch, limits=ServerLimits(100, 100))
    await server.reserve(100)
    waiting = asyncio.create_task(server.reserve(100))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    server.release(100)
    assert server.budget.reserved == 0
    await asyncio.wait_for(server.reserve(100), 1)


async def test_reserve_cancelled_as_it_is_granted_gives_the_bytes_back() -> None:
    server = Server("127.0.0.1", 0, _no_dispatch, limits=ServerLimits(100, 100))
    await server.reserve(100)
    waiting = asyncio.create_task(server.reserve(60))
    await asyncio.sleep(0)
    server.release(100)  # grants the waiter ...
    waiting.cancel()  # ... which is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert server.budget.reserved == 0


# -- accepting ----------------------------------------------------------------------------


def test_connection_on_one_of_the_last_descriptors_is_refused() -> None:
    # The last hundredth of the open-file limit (at least 16) stays for the broker's
    # own files: descriptors are allocated lowest first, so a high number means full.
    server = Server("127.0.0.1", 0, _no_dispatch)
    server.open_file_limit = 1000
    assert server.refusal("10.0.0.1", 983) is None
    assert server.refusal("10.0.0.1", 984) == ("open.files", 1000)
    server.open_file_limit = 100_000
    assert server.refusal("10.0.0.1", 98_999) is None
    assert server.refusal("10.0.0.1", 99_000) == ("open.files", 100_000)


def test_connection_over_a_count_limit_is_refused_with_its_reason() -> None:
    server = Server("127.0.0.1", 0, _no_dispatch, limits=ServerLimits(max_connections=0))
    assert server.refusal("10.0.0.1", 5) == ("max.connections", 0)
    server = Server(
        "127.0.0.1",
        0,
        _no_dispatch,
        limits=ServerLimits(
            max_connections_per_ip=0, max_connections_per_ip_overrides={"10.0.0.2": 1}
        ),
    )
    assert server.refusal("10.0.0.1", 5) == ("max.connections.per.ip", 0)
    assert server.refusal("10.0.0.2", 5) is None


# -- settings ----------------------------------------------------------------------------


def test_defaults_are_kafkas() -> None:
    limits = ServerLimits.from_config(BrokerConfig({}))
    assert limits == ServerLimits(
        max_request_bytes=104857600,
        queued_max_request_bytes=-1,
        connections_max_idle_ms=600000,
        max_connections=INT_MAX,
        max_connections_per_ip=INT_MAX,
        max_connections_per_ip_overrides={},
    )


def test_queued_max_request_bytes_below_socket_request_max_bytes_is_refused() -> None:
    config = BrokerConfig({"queued.max.request.bytes": "1000", "socket.request.max.bytes": "1001"})
    with pytest.raises(KafkaError) as err:
        ServerLimits.from_config(config)
    assert err.value.code == ErrorCode.invalid_config
    assert "queued.max.request.bytes" in str(err.value)
    ServerLimits.from_config(BrokerConfig({"queued.max.request.bytes": "104857600"}))
    ServerLimits.from_config(BrokerConfig({"queued.max.request.bytes": "-1"}))


def test_zero_connections_per_ip_needs_overrides() -> None:
    with pytest.raises(KafkaError, match=r"max\.connections\.per\.ip\.overrides"):
        ServerLimits.from_config(BrokerConfig({"max.connections.per.ip": "0"}))
    limits = ServerLimits.from_config(
        BrokerConfig(
            {"max.connections.per.ip": "0", "max.connections.per.ip.overrides": "10.0.0.1:5"}
        )
    )
    assert limits.max_connections_for("10.0.0.1") == 5
    assert limits.max_connections_for("10.0.0.2") == 0


def test_ip_overrides_parse_addresses_and_refuse_garbage() -> None:
    assert parse_ip_overrides("127.0.0.1:200, [::1]:3,::ffff:10.1.2.3:4") == {
        "127.0.0.1": 200,
        "::1": 3,
        "10.1.2.3": 4,
    }
    assert parse_ip_overrides("") == {}
    for bad in ("127.0.0.1", "127.0.0.1:x", ":5"):
        with pytest.raises(KafkaError, match="expected host:count"):
            parse_ip_overrides(bad)


# -- partitions and the open-file limit ------------------------------------------------


@pytest.fixture
def soft_file_limit() -> Iterator[Callable[[int], None]]:
    """Lower this process's soft RLIMIT_NOFILE for one test, restored after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    yield lambda n: resource.setrlimit(resource.RLIMIT_NOFILE, (n, hard))
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_partitions_are_refused_while_a_reserve_of_files_is_still_free(
    tmp_path: Path, soft_file_limit: Callable[[int], None]
) -> None:
    logs = LogManager(tmp_path, BrokerConfig({}), GroupCommit())
    # Room for exactly 10 partitions (3 files each) above the reserve, which is a tenth
    # of the limit when that is more than MIN_FREE_FILES (a process with many files
    # open, as late in a long test session).
    used = open_files()
    limit = used + 30
    while limit - used - max(MIN_FREE_FILES, limit // 10) < 30:
        limit += 1
    soft_file_limit(limit)
    logs.ensure_file_headroom("fits", 8)
    with pytest.raises(KafkaError) as err:
        logs.ensure_file_headroom("too-big", 12)
    assert err.value.code == ErrorCode.kafka_storage_error
    assert "too many open files" in str(err.value)
    assert "raise the open-file limit or delete topics" in str(err.value)


def test_running_out_of_files_part_way_rolls_back_the_partitions_opened(
    tmp_path: Path, soft_file_limit: Callable[[int], None]
) -> None:
    logs = LogManager(tmp_path, BrokerConfig({}), GroupCommit())
    logs.open_topic("kept", uuid.uuid4(), 1, {})
    before = open_files()
    soft_file_limit(before + 4)  # one partition fits, the second does not
    with pytest.raises(KafkaError) as err:
        logs.open_topic("t", uuid.uuid4(), 5, {})
    assert err.value.code == ErrorCode.kafka_storage_error
    assert f"limit {before + 4}" in str(err.value)
    assert [key for key in logs.partitions if key[0] == "t"] == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept-0"]
    assert open_files() == before  # nothing half-open left behind
    assert logs.get("kept", 0) is not None


def test_a_disk_error_part_way_rolls_back_the_partitions_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CreateTopics opens the new topic's logs after its record is durable; any OSError
    there (a full disk, not only running out of descriptors) must leave nothing half
    open and reach the handler as KAFKA_STORAGE_ERROR, which undoes the creation."""
    logs = LogManager(tmp_path, BrokerConfig({}), GroupCommit())
    logs.open_topic("kept", uuid.uuid4(), 1, {})
    before = open_files()
    real_open = logs.storage.open_topic_log
    calls = 0

    def open_or_full(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(*args, **kwargs)

    monkeypatch.setattr(logs.storage, "open_topic_log", open_or_full)
    with pytest.raises(KafkaError) as err:
        logs.open_topic("t", uuid.uuid4(), 3, {})
    assert err.value.code == ErrorCode.kafka_storage_error
    assert "No space left on device" in str(err.value)
    assert [key for key in logs.partitions if key[0] == "t"] == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept-0"]
    assert open_files() == before


@pytest.mark.parametrize("refused", [1, 2, 3])
def test_a_segment_whose_files_cannot_all_be_opened_leaves_no_fd_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refused: int
) -> None:
    # The fd limit counts descriptor numbers, not descriptors: with holes below it, the
    # refusal can land on the .log, the .index or the .timeindex. Each is refused here in turn.
    real_open = os.open
    opened = 0

    def open_until_refused(*args: Any, **kwargs: Any) -> int:
        nonlocal opened
        opened += 1
        if opened == refused:
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(*args, **kwargs)

    before = open_files()
    monkeypatch.setattr(os, "open", open_until_refused)
    with pytest.raises(OSError):
        LogSegment.create(tmp_path, 0, 0)
    monkeypatch.undo()
    assert opened == refused
    assert open_files() == before


def test_a_partition_whose_producer_state_cannot_be_read_closes_its_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fd limit may be hit after the log opened, while its producer state is loaded
    # (that lists the directory); the opened log must not be left behind.
    from persister.file_log import PartitionLog

    logs = LogManager(tmp_path, BrokerConfig({}), GroupCommit())
    before = open_files()

    def refuse(self: PartitionLog, producers: object) -> None:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(PartitionLog, "load_producer_state", refuse)
    with pytest.raises(KafkaError) as err:
        logs.open_topic("t", uuid.uuid4(), 2, {})
    assert err.value.code == ErrorCode.kafka_storage_error
    assert open_files() == before
    assert list(tmp_path.iterdir()) == []
