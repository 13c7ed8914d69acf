"""PostgreSQL for the storage tests: one throwaway server per test session
(tests/postgres.py), a fresh database per test.

Import the fixtures where they are used and name them in the module's `__all__`
(`from tests.integration.pg_helpers import pg_dsn, pg_server`): pytest finds fixtures
imported into a test module.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest

from tests.postgres import PostgresServer, postgres_server

_databases = itertools.count()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    with postgres_server() as server:
        yield server


def create_database(server: PostgresServer, name: str) -> str:
    """A new empty database on `server`; its URL."""

    async def create() -> None:
        conn = await asyncpg.connect(server.dsn)
        try:
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()

    asyncio.run(create())
    return server.dsn.rsplit("/", 1)[0] + f"/{name}"


def db_rows(dsn: str, query: str, *args: Any) -> list[Any]:
    """Run `query` on the database at `dsn` (one connection of its own); its rows."""

    async def run() -> list[Any]:
        conn = await asyncpg.connect(dsn)
        try:
            return list(await conn.fetch(query, *args))
        finally:
            await conn.close()

    return asyncio.run(run())


def new_database(server: PostgresServer) -> str:
    """The URL of a new empty database on `server`, named for no one else."""
    return create_database(server, f"spool_test_{next(_databases)}")


@pytest.fixture
def pg_dsn(pg_server: PostgresServer) -> str:
    """The URL of a database of its own for this test."""
    return new_database(pg_server)
