"""PgCommitter without a database (a fake asyncpg pool): writes that arrive while a
commit is in flight share the next one, a dead connection is dropped and the commit
sent again on a new one, a refusal by the database fails only the fenced log's writers."""

from __future__ import annotations

import asyncio
import errno
from typing import Any

import asyncpg
import pytest

from persister.pg_commit import Batch, LogWrite, PgCommitter
from persister.storage import Fenced


class FakeConnection:
    def __init__(self, pool: FakePool) -> None:
        self.pool = pool
        self.terminated = False

    async def fetchval(self, sql: str, *args: Any) -> list[int]:
        self.pool.calls.append(args)
        gate = self.pool.gate
        if gate is not None:
            await gate
        if self.pool.failures:
            raise self.pool.failures.pop(0)
        return list(self.pool.fenced)

    def terminate(self) -> None:
        self.terminated = True


class FakePool:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
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


async def test_writes_arriving_during_a_commit_share_the_next_transaction() -> None:
    pool = FakePool()
    committer = PgCommitter(pool)
    pool.gate = asyncio.get_running_loop().create_future()
    first = asyncio.ensure_future(committer.commit(write(1, 0)))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    later = [asyncio.ensure_future(committer.commit(write(i, 0))) for i in range(2, 6)]
    await asyncio.sleep(0)
    pool.gate.set_result(None)
    pool.gate = None
    await asyncio.gather(first, *later)
    assert committer.transactions == 2
    assert [sorted(call[0]) for call in pool.calls] == [[1], [2, 3, 4, 5]]


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
