"""spool_commit, spool_append and their migrations against a real PostgreSQL 15
(persister.pg_schema): a v1 database is migrated to v2 and keeps its rows, a commit sent
again after its first attempt was stored (the answer lost) leaves exactly one copy of
each batch, with or without a truncation between (the commits of one log only appending
are spool_append's), a fenced log is left untouched next to an owned one, and an append
racing a claim waits for it and is refused."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from persister.pg_commit import Batch, LogWrite, PgCommitter
from persister.pg_schema import MIGRATIONS, SCHEMA_VERSION, migrate
from tests.integration.pg_helpers import pg_dsn, pg_server

__all__ = ["pg_dsn", "pg_server"]  # the fixtures, from pg_helpers


@pytest.fixture
async def pool(pg_dsn: str) -> AsyncIterator[asyncpg.Pool]:
    conn = await asyncpg.connect(pg_dsn)
    try:
        await migrate(conn)
        await conn.execute(
            "INSERT INTO spool_logs (log_id, name, leader_epoch) VALUES (1, 'a', 5), (2, 'b', 5)"
        )
    finally:
        await conn.close()
    p = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=2)
    try:
        yield p
    finally:
        await p.close()


def b(base: int, data: bytes = b"x") -> Batch:
    return Batch(base, base, 0, data)


async def rows(pool: asyncpg.Pool, log_id: int = 1) -> list[tuple[int, bytes]]:
    got = await pool.fetch(
        "SELECT base_offset, data FROM spool_batches WHERE log_id = $1 ORDER BY base_offset",
        log_id,
    )
    return [(r["base_offset"], bytes(r["data"])) for r in got]


async def test_a_resent_commit_after_the_first_was_stored_leaves_one_copy(
    pool: asyncpg.Pool,
) -> None:
    committer = PgCommitter(pool)
    first = LogWrite(1, 5, "a", [b(0), b(1)], None, 2)
    assert await committer._execute([first]) == []
    # The answer was lost: the same batches go again, with one appended since.
    resend = LogWrite(1, 5, "a", [b(0), b(1), b(2)], None, 3)
    assert await committer._execute([resend]) == []
    assert await rows(pool) == [(0, b"x"), (1, b"x"), (2, b"x")]
    assert await pool.fetchval("SELECT next_offset FROM spool_logs WHERE log_id = 1") == 3
    # A plain next commit after it.
    assert await committer._execute([LogWrite(1, 5, "a", [b(3)], None, 4)]) == []
    assert [o for o, _ in await rows(pool)] == [0, 1, 2, 3]


async def test_a_resent_commit_replaces_rows_past_its_own_from_the_first_attempt(
    pool: asyncpg.Pool,
) -> None:
    committer = PgCommitter(pool)
    await committer._execute([LogWrite(1, 5, "a", [b(0)], None, 1)])
    # Stored, answer lost; then the log was truncated to 1 and other batches appended:
    # the resend carries the truncation.
    await committer._execute([LogWrite(1, 5, "a", [b(1, b"old"), b(2, b"old")], None, 3)])
    resend = LogWrite(1, 5, "a", [b(1, b"new")], 1, 2)
    await committer._execute([resend])
    assert await rows(pool) == [(0, b"x"), (1, b"new")]
    # Without a truncation too (a writer that did not restore the log it claimed): the
    # rows from its first new offset on are its own.
    await committer._execute([LogWrite(1, 5, "a", [b(2, b"x2"), b(3, b"x3")], None, 4)])
    await committer._execute([LogWrite(1, 5, "a", [b(1, b"y")], None, 2)])
    assert await rows(pool) == [(0, b"x"), (1, b"y")]


async def test_a_fenced_log_is_untouched_next_to_an_owned_one(pool: asyncpg.Pool) -> None:
    committer = PgCommitter(pool)
    await committer._execute([LogWrite(2, 5, "b", [b(0)], None, 1)])
    await pool.execute("UPDATE spool_logs SET leader_epoch = 6 WHERE log_id = 2")
    fenced = await committer._execute(
        [LogWrite(1, 5, "a", [b(0), b(1)], None, 2), LogWrite(2, 5, "b", [b(0, b"z")], 0, 1)]
    )
    assert fenced == [2]
    assert await rows(pool, 1) == [(0, b"x"), (1, b"x")]
    assert await rows(pool, 2) == [(0, b"x")]
    # A log the database does not know is fenced too.
    assert await committer._execute([LogWrite(9, 1, "c", [b(0)], None, 1)]) == [9]


async def test_a_v1_database_is_migrated_to_v2_and_keeps_its_rows(pg_dsn: str) -> None:
    conn = await asyncpg.connect(pg_dsn)
    try:
        async with conn.transaction():
            await conn.execute("CREATE TABLE spool_schema_version (version integer NOT NULL)")
            await conn.execute(MIGRATIONS[0])
            await conn.execute("INSERT INTO spool_schema_version VALUES (1)")
        await conn.execute("INSERT INTO spool_logs (log_id, name, leader_epoch) VALUES (1, 'a', 5)")
        # A v1 commit: the caller passed its first offset as the truncation.
        await conn.fetchval(
            "SELECT spool_commit($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            [1],
            [5],
            [0],
            [1],
            [None],
            [1],
            [0],
            [0],
            [0],
            [b"v1"],
        )
        assert await migrate(conn) == SCHEMA_VERSION - 1
        assert await conn.fetchval("SELECT version FROM spool_schema_version") == SCHEMA_VERSION
        assert await migrate(conn) == 0
    finally:
        await conn.close()
    p = await asyncpg.create_pool(pg_dsn, min_size=1, max_size=1)
    try:
        assert await rows(p) == [(0, b"v1")]
        await PgCommitter(p)._execute([LogWrite(1, 5, "a", [b(1)], None, 2)])
        assert await rows(p) == [(0, b"v1"), (1, b"x")]
    finally:
        await p.close()


async def test_a_shared_log_write_goes_in_only_where_the_log_ends(pool: asyncpg.Pool) -> None:
    """Schema v4: a write stating its expected end (a shared log, the cluster metadata)
    is refused when the log ends elsewhere, and the other logs of its commit go in."""
    committer = PgCommitter(pool)
    await pool.execute("INSERT INTO spool_logs (log_id, name) VALUES (3, 'meta')")
    # No epoch is checked: any writer whose expectation holds appends.
    assert await committer._execute([LogWrite(3, 0, "meta", [b(0)], None, 1, None, 0)]) == []
    refused = await committer._execute(
        [
            LogWrite(1, 5, "a", [b(0)], None, 1),
            LogWrite(3, 0, "meta", [b(0, b"late")], None, 1, None, 0),
        ]
    )
    assert refused == [3]
    assert await rows(pool, 3) == [(0, b"x")]
    assert await rows(pool, 1) == [(0, b"x")]
    assert await pool.fetchval("SELECT next_offset FROM spool_logs WHERE log_id = 3") == 1
    assert await committer._execute([LogWrite(3, 0, "meta", [b(1, b"y")], None, 2, None, 1)]) == []
    assert await rows(pool, 3) == [(0, b"x"), (1, b"y")]


async def test_two_writers_at_one_offset_of_a_shared_log_never_both_go_in(pg_dsn: str) -> None:
    """The expected end is read under the row's lock: of writers racing to one offset,
    exactly one appends, however their transactions interleave."""
    conn = await asyncpg.connect(pg_dsn)
    try:
        await migrate(conn)
        await conn.execute("INSERT INTO spool_logs (log_id, name) VALUES (3, 'meta')")
    finally:
        await conn.close()
    p = await asyncpg.create_pool(pg_dsn, min_size=8, max_size=8)
    try:
        committers = [PgCommitter(p) for _ in range(8)]
        for offset in range(20):
            results = await asyncio.gather(
                *(
                    c._execute(
                        [
                            LogWrite(
                                3, 0, "meta", [b(offset, b"%d" % i)], None, offset + 1, None, offset
                            )
                        ]
                    )
                    for i, c in enumerate(committers)
                )
            )
            assert sorted(len(r) for r in results) == [0] + [1] * 7
        got = await rows(p, 3)
        assert [o for o, _ in got] == list(range(20))
    finally:
        await p.close()


async def test_an_append_waits_for_a_claim_in_progress_and_is_then_fenced(
    pool: asyncpg.Pool, pg_dsn: str
) -> None:
    """Schema v6's spool_append checks the epoch on the row it locks: an append racing a
    claim that bumps the epoch waits for the claim's transaction and is refused after
    it, with nothing of it stored; before the claim it goes in."""
    committer = PgCommitter(pool)
    assert await committer._execute([LogWrite(1, 5, "a", [b(0)], None, 1)]) == []
    claimer = await asyncpg.connect(pg_dsn)
    try:
        claim = claimer.transaction()
        await claim.start()
        await claimer.execute("UPDATE spool_logs SET leader_epoch = 6 WHERE log_id = 1")
        append = asyncio.ensure_future(
            committer._execute([LogWrite(1, 5, "a", [b(1, b"stale")], None, 2)])
        )
        await asyncio.sleep(0.2)
        assert not append.done()  # waiting on the claim's row lock
        await claim.commit()
        assert await append == [1]
    finally:
        await claimer.close()
    assert await rows(pool) == [(0, b"x")]
    assert await pool.fetchval("SELECT next_offset FROM spool_logs WHERE log_id = 1") == 1
    # The new holder appends under its epoch.
    assert await committer._execute([LogWrite(1, 6, "a", [b(1, b"new")], None, 2)]) == []
    assert await rows(pool) == [(0, b"x"), (1, b"new")]
