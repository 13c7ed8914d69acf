"""PgCommitter without a database (a fake asyncpg pool): one log appending alone goes
through spool_append, anything else through spool_commit; heavy writes that arrive while a
commit is in flight share the next one, light writes of other logs go in a transaction
beside it (up to max_in_flight, never two of one log, one at a time during an outage),
a dead connection is dropped and the commit
sent again on a new one, a refusal by the database fails only the fenced log's writers;
an outage fails commits fast between attempts on a growing backoff, is logged once, and
ends by itself (a probe) once the database answers again."""

from __future__ import annotations

import asyncio
import errno
from typing import Any

import asyncpg
import pytest
import structlog

from persister.pg_commit import _APPEND_SQL as APPEND
from persister.pg_commit import _COMMIT_SQL as COMMIT
from persister.pg_commit import _WRITE_PROBE_SQL as WRITE_PROBE
from persister.pg_commit import Batch, LogWrite, PgCommitter
from persister.storage import Fenced, StorageUnavailable


class FakeConnection:
    def __init__(self, pool: FakePool) -> None:
        self.pool = pool
        self.terminated = False

    async def fetchval(self, sql: str, *args: Any) -> Any:
        appending = sql == APPEND
        self.pool.calls.append(_as_commit_args(args) if appending else args)
        self.pool.statements.append(sql)
        gate = self.pool.gate
        if gate is not None:
            await gate
        if self.pool.failures:
            raise self.pool.failures.pop(0)
        if appending:
            return args[0] not in self.pool.fenced
        return [log_id for log_id in self.pool.fenced if log_id in args[0]]

    def terminate(self) -> None:
        self.terminated = True


def _as_commit_args(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """spool_append's arguments as the spool_commit call of the same write has them."""
    log_id, epoch, next_offset, base, last, ts, data = args
    return (
        [log_id], [epoch], [None], [next_offset], [None], [None],
        [log_id] * len(base), base, last, ts, data,
    )  # fmt: skip


class FakePool:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.statements: list[str] = []
        self.connections: list[FakeConnection] = []
        self.failures: list[BaseException] = []
        self.fenced: list[int] = []
        self.gate: asyncio.Future[None] | None = None

    async def acquire(self) -> FakeConnection:
        conn = FakeConnection(self)
        self.connections.append(conn)
        return conn

    async def release(self, conn: FakeConnection) -> None:
        return None


def write(log_id: int, base: int) -> LogWrite:
    return LogWrite(log_id, 1, f"log-{log_id}", [Batch(base, base, 0, b"x")], None, base + 1)


def heavy(log_id: int, base: int) -> LogWrite:
    return LogWrite(log_id, 1, f"log-{log_id}", [Batch(base, base, 0, b"x" * 100)], None, base + 1)


async def turns() -> None:
    """Let the loop run what is ready (rounds start and reach their connection)."""
    for _ in range(10):
        await asyncio.sleep(0)


async def test_heavy_writes_arriving_during_a_commit_share_the_next_transaction() -> None:
    pool = FakePool()
    committer = PgCommitter(pool, light_write_bytes=10)
    pool.gate = asyncio.get_running_loop().create_future()
    first = asyncio.ensure_future(committer.commit(heavy(1, 0)))
    await turns()
    later = [asyncio.ensure_future(committer.commit(heavy(i, 0))) for i in range(2, 6)]
    await turns()
    assert [call[0] for call in pool.calls] == [[1]]  # queued behind the first
    pool.gate.set_result(None)
    pool.gate = None
    await asyncio.gather(first, *later)
    assert committer.transactions == 2
    assert [sorted(call[0]) for call in pool.calls] == [[1], [2, 3, 4, 5]]


async def test_light_writes_of_other_logs_go_beside_the_commit_in_flight() -> None:
    pool = FakePool()
    committer = PgCommitter(pool, light_write_bytes=10)
    pool.gate = asyncio.get_running_loop().create_future()
    first = asyncio.ensure_future(committer.commit(heavy(1, 0)))
    await turns()
    light = [asyncio.ensure_future(committer.commit(write(i, 0))) for i in (2, 3)]
    late_heavy = asyncio.ensure_future(committer.commit(heavy(4, 0)))
    await turns()
    # The light ones in one transaction beside the first; the heavy one waits.
    assert [sorted(call[0]) for call in pool.calls] == [[1], [2, 3]]
    gate, pool.gate = pool.gate, None
    gate.set_result(None)
    await asyncio.gather(first, *light, late_heavy)
    assert [sorted(call[0]) for call in pool.calls] == [[1], [2, 3], [4]]


async def test_a_logs_next_write_waits_for_its_commit_in_flight() -> None:
    pool = FakePool()
    committer = PgCommitter(pool)
    pool.gate = asyncio.get_running_loop().create_future()
    first = asyncio.ensure_future(committer.commit(write(1, 0)))
    await turns()
    same = asyncio.ensure_future(committer.commit(write(1, 1)))
    other = asyncio.ensure_future(committer.commit(write(2, 0)))
    await turns()
    assert [call[0] for call in pool.calls] == [[1], [2]]
    gate, pool.gate = pool.gate, None
    gate.set_result(None)
    await asyncio.gather(first, same, other)
    # Log 1's second write went after its first commit (call[7]: the batches' offsets).
    assert [(call[0], call[7]) for call in pool.calls] == [([1], [0]), ([2], [0]), ([1], [1])]


async def test_no_more_than_max_in_flight_transactions_run_at_once() -> None:
    pool = FakePool()
    committer = PgCommitter(pool, max_in_flight=2)
    pool.gate = asyncio.get_running_loop().create_future()
    commits = []
    for i in range(1, 5):
        commits.append(asyncio.ensure_future(committer.commit(write(i, 0))))
        await turns()
    assert [call[0] for call in pool.calls] == [[1], [2]]
    gate, pool.gate = pool.gate, None
    gate.set_result(None)
    await asyncio.gather(*commits)
    assert [sorted(call[0]) for call in pool.calls] == [[1], [2], [3, 4]]


async def test_during_an_outage_one_transaction_runs_at_a_time() -> None:
    pool = FakePool()
    clock = Clock()
    committer = PgCommitter(pool, backoff_initial_s=1.0, monotonic=clock)
    committer._probing = _no_probe  # type: ignore[method-assign]
    pool.failures = [asyncpg.DiskFullError("could not extend file")]
    with pytest.raises(StorageUnavailable):
        await committer.commit(write(1, 0))
    clock.now += 1.0  # an attempt is due
    pool.gate = asyncio.get_running_loop().create_future()
    first = asyncio.ensure_future(committer.commit(write(1, 0)))
    await turns()
    second = asyncio.ensure_future(committer.commit(write(2, 0)))
    await turns()
    assert [call[0] for call in pool.calls] == [[1], [1]]  # the second waits its turn
    gate, pool.gate = pool.gate, None
    gate.set_result(None)
    await asyncio.gather(first, second)
    assert committer.unavailable is None
    assert [call[0] for call in pool.calls] == [[1], [1], [2]]


async def test_a_dead_connection_is_dropped_and_the_commit_sent_again() -> None:
    pool = FakePool()
    pool.failures = [asyncpg.ConnectionDoesNotExistError("connection was closed")]
    committer = PgCommitter(pool)
    await committer.commit(write(1, 0))
    assert len(pool.calls) == 2
    assert [c.terminated for c in pool.connections] == [True, False]


async def test_a_refusing_server_fails_the_commit_as_an_io_error() -> None:
    pool = FakePool()
    pool.failures = [asyncpg.DiskFullError("could not extend file")]
    committer = PgCommitter(pool)
    with pytest.raises(OSError) as failed:
        await committer.commit(write(1, 0))
    assert failed.value.errno == errno.EIO
    assert "postgresql" in str(failed.value) and "could not extend" in str(failed.value)
    assert len(pool.calls) == 1


async def test_only_the_fenced_logs_writers_are_refused() -> None:
    pool = FakePool()
    pool.fenced = [2]
    committer = PgCommitter(pool)
    results = await asyncio.gather(
        committer.commit(write(1, 0)), committer.commit(write(2, 0)), return_exceptions=True
    )
    assert results[0] is None
    assert isinstance(results[1], Fenced)


async def test_one_log_appending_alone_commits_with_the_lighter_function() -> None:
    pool = FakePool()
    committer = PgCommitter(pool)
    await committer.commit(write(1, 0))
    assert pool.statements == [APPEND]
    # What spool_append cannot do goes to spool_commit: a truncation, a moved log
    # start, a shared log's expected end, several logs in one transaction.
    truncating = LogWrite(1, 1, "log-1", [Batch(0, 0, 0, b"y")], 0, 1)
    moving_start = LogWrite(1, 1, "log-1", [], None, 1, log_start_offset=1)
    shared = LogWrite(3, 0, "meta", [Batch(0, 0, 0, b"m")], None, 1, expect_end=0)
    for w in (truncating, moving_start, shared):
        await committer.commit(w)
    pool.gate = asyncio.get_running_loop().create_future()
    first = asyncio.ensure_future(committer.commit(heavy(5, 0)))
    await turns()
    together = [asyncio.ensure_future(committer.commit(heavy(i, 0))) for i in (6, 7)]
    await turns()
    gate, pool.gate = pool.gate, None
    gate.set_result(None)
    await asyncio.gather(first, *together)
    assert pool.statements == [APPEND, COMMIT, COMMIT, COMMIT, APPEND, COMMIT]
    assert sorted(pool.calls[-1][0]) == [6, 7]


async def test_a_fenced_append_is_refused_as_fenced() -> None:
    pool = FakePool()
    pool.fenced = [1]
    committer = PgCommitter(pool)
    with pytest.raises(Fenced):
        await committer.commit(write(1, 0))
    assert pool.statements == [APPEND]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_an_outage_fails_commits_fast_and_retries_after_a_growing_backoff() -> None:
    pool = FakePool()
    clock = Clock()
    committer = PgCommitter(pool, backoff_initial_s=1.0, backoff_max_s=4.0, monotonic=clock)
    committer._probing = _no_probe  # type: ignore[method-assign]
    statuses: list[str | None] = []
    committer.on_status = statuses.append
    pool.failures = [asyncpg.DiskFullError("could not extend file")]
    with structlog.testing.capture_logs() as logs:
        with pytest.raises(StorageUnavailable):
            await committer.commit(write(1, 0))
        assert committer.unavailable is not None and "could not extend" in committer.unavailable
        # Within the backoff: failed at once, the database not asked.
        for _ in range(3):
            with pytest.raises(StorageUnavailable) as fast:
                await committer.commit(write(1, 0))
            assert "could not extend" in str(fast.value)
        assert len(pool.calls) == 1
        # Due: one real attempt; it fails and the next is twice as far.
        clock.now += 1.0
        pool.failures = [asyncpg.DiskFullError("could not extend file")]
        with pytest.raises(StorageUnavailable):
            await committer.commit(write(1, 0))
        assert len(pool.calls) == 2
        clock.now += 1.5
        with pytest.raises(StorageUnavailable):
            await committer.commit(write(1, 0))
        assert len(pool.calls) == 2
        clock.now += 0.5
        await committer.commit(write(1, 0))
        assert len(pool.calls) == 3
    assert committer.unavailable is None
    assert committer.failed_commits == 6
    assert statuses == [committer_reason(statuses), None]
    events = [entry["event"] for entry in logs]
    assert events.count("storage_unavailable") == 1
    assert events.count("storage_available") == 1
    assert next(e for e in logs if e["event"] == "storage_available")["failed_commits"] == 6


def committer_reason(statuses: list[str | None]) -> str | None:
    assert statuses and statuses[0] is not None
    assert statuses[0].startswith("storage unavailable: ")
    return statuses[0]


async def _no_probe() -> None:
    return None


async def test_the_probe_ends_a_connection_outage_without_a_commit() -> None:
    pool = FakePool()
    committer = PgCommitter(pool, backoff_initial_s=0.001, backoff_max_s=0.004)
    statuses: list[str | None] = []
    committer.on_status = statuses.append
    refused = ConnectionRefusedError(errno.ECONNREFUSED, "Connect call failed")
    # The commit and its resend on a new connection, then two failed probes.
    pool.failures = [refused, refused, refused, refused]
    with pytest.raises(StorageUnavailable):
        await committer.commit(write(1, 0))
    assert committer.unavailable is not None
    for _ in range(200):
        if committer.unavailable is None:
            break
        await asyncio.sleep(0.002)
    assert committer.unavailable is None
    assert statuses[-1] is None
    assert [call for call in pool.calls[2:]] == [(), (), ()]  # SELECT 1, three times
    await committer.commit(write(1, 0))
    await committer.close()


async def test_refused_writes_end_with_a_probe_that_writes_not_one_that_connects() -> None:
    """An outage of refused writes (disk full, read-only) is probed with a write: a
    probe that only connects does not end it, one whose write goes through does,
    without waiting for a commit (/health recovers on its own)."""
    pool = FakePool()
    committer = PgCommitter(pool, backoff_initial_s=0.001, backoff_max_s=0.004)
    full = asyncpg.DiskFullError("could not extend file")
    # The commit, then the first probe's write, are refused; the second probe's is not.
    pool.failures = [full, full]
    with pytest.raises(StorageUnavailable):
        await committer.commit(write(1, 0))
    for _ in range(200):
        if committer.unavailable is None:
            break
        await asyncio.sleep(0.002)
    assert committer.unavailable is None
    assert committer.transactions == 0  # ended by the probe, not by a commit
    assert pool.statements[1:] == [WRITE_PROBE, WRITE_PROBE]
    await committer.commit(write(1, 0))
    await committer.close()


async def test_a_commit_sent_before_an_outage_began_does_not_end_it() -> None:
    pool = FakePool()
    committer = PgCommitter(pool)
    committer._probing = _no_probe  # type: ignore[method-assign]
    gate = pool.gate = asyncio.get_running_loop().create_future()
    before = asyncio.ensure_future(committer.commit(write(1, 0)))
    await turns()
    pool.gate = None
    pool.failures = [asyncpg.DiskFullError("could not extend file")]
    with pytest.raises(StorageUnavailable):
        await committer.commit(write(2, 0))
    gate.set_result(None)
    await before  # committed, but sent before the outage began
    assert committer.unavailable is not None
