"""The throwaway PostgreSQL the storage tests run against (tests/postgres.py): it starts
from Debian's package as a user would run it, keeps a committed row across an immediate
(crash-like) restart, and is gone after cleanup."""

from __future__ import annotations

import asyncio

import asyncpg

from tests.postgres import PostgresServer


def test_a_throwaway_server_keeps_committed_rows_across_a_crash_and_is_removed() -> None:
    server = PostgresServer()
    try:
        server.start()

        async def write() -> None:
            conn = await asyncpg.connect(server.dsn)
            try:
                await conn.execute("CREATE TABLE t (id int PRIMARY KEY, v bytea)")
                await conn.execute("INSERT INTO t VALUES (1, $1)", b"\x00\x01")
                assert await conn.fetchval("SHOW fsync") == "on"
                assert await conn.fetchval("SHOW synchronous_commit") == "on"
            finally:
                await conn.close()

        async def read() -> bytes:
            conn = await asyncpg.connect(server.dsn)
            try:
                value: bytes = await conn.fetchval("SELECT v FROM t WHERE id = 1")
                return value
            finally:
                await conn.close()

        asyncio.run(write())
        server.restart("immediate")  # as after a crash: recovery replays the WAL
        assert asyncio.run(read()) == b"\x00\x01"
    finally:
        server.cleanup()
    assert not server.root.exists()
