"""PgRegistryStore.register without a database (a fake asyncpg connection): a refusal
whose holder deregistered before it was read is tried again, and a registration that
keeps meeting that race gives up after REGISTER_ATTEMPTS with an error naming the node
id. The statements themselves run against PostgreSQL in
tests/integration/test_pg_registry.py."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from persister.pg_registry import (
    _REGISTER,
    _ROW,
    REGISTER_ATTEMPTS,
    PgRegistryStore,
    RegistrationContended,
)

ENDPOINTS = [("PLAINTEXT", "h", 1)]
OTHER = uuid.uuid4()


def row(node_id: int, incarnation_id: uuid.UUID) -> dict[str, Any]:
    return {
        "node_id": node_id,
        "incarnation_id": incarnation_id,
        "endpoints": '[{"listener": "PLAINTEXT", "host": "h", "port": 2}]',
        "rack": None,
        "lease_left_ms": 5000,
    }


class FakeConnection:
    """Answers each statement with the next of `answers` (kept in the order sent)."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.sent: list[str] = []

    def is_closed(self) -> bool:
        return False

    def terminate(self) -> None:
        pass

    async def fetchrow(self, sql: str, *args: Any, timeout: float) -> Any:
        return self._answer(sql)

    async def fetchval(self, sql: str, *args: Any, timeout: float) -> Any:
        return self._answer(sql)

    def _answer(self, sql: str) -> Any:
        self.sent.append("register" if sql == _REGISTER else "row" if sql == _ROW else sql)
        return self.answers.pop(0)


def store(conn: FakeConnection) -> PgRegistryStore:
    async def connect(timeout_s: float) -> FakeConnection:
        return conn

    return PgRegistryStore(connect, timeout_s=1.0)


def test_a_refusal_whose_holder_deregistered_meanwhile_is_tried_again() -> None:
    # Refused by OTHER's live row, which is gone when read: the second try takes it.
    conn = FakeConnection([row(1, OTHER), None, None, None, 1])
    me = uuid.uuid4()
    outcome = asyncio.run(store(conn).register(1, me, ENDPOINTS, None, 9000))
    assert outcome.holder is None and outcome.replaced is None
    assert conn.sent == ["row", "register", "row", "row", "register"]
    assert conn.answers == []


def test_a_refusal_by_a_holder_still_there_is_not_tried_again() -> None:
    conn = FakeConnection([row(1, OTHER), None, row(1, OTHER)])
    outcome = asyncio.run(store(conn).register(1, uuid.uuid4(), ENDPOINTS, None, 9000))
    assert outcome.holder is not None and outcome.holder.incarnation_id == OTHER
    assert conn.sent == ["row", "register", "row"]


def test_a_registration_that_keeps_losing_the_race_gives_up() -> None:
    conn = FakeConnection([row(1, OTHER), None, None] * REGISTER_ATTEMPTS)
    with pytest.raises(RegistrationContended, match=r"^node\.id 1: registering it was refused"):
        asyncio.run(store(conn).register(1, uuid.uuid4(), ENDPOINTS, None, 9000))
    assert conn.sent == ["row", "register", "row"] * REGISTER_ATTEMPTS
    assert conn.answers == []
    assert isinstance(RegistrationContended("x"), OSError)  # a failed start, exit code 1
