"""The broker registry in PostgreSQL: which brokers share the database, with leases.

Kafka's brokers register with the controller (BrokerRegistration, with an incarnation
id per process start) and keep their session alive with BrokerHeartbeat; the controller
expires a broker whose heartbeats stop for `broker.session.timeout.ms`, and refuses a
registration of a node id that a live session of another incarnation holds
(DUPLICATE_BROKER_REGISTRATION). spool has no controller: the `spool_brokers` table
(persister.pg_schema, v3) is the registry, and the database's clock is the controller's
clock. A row's lease is live while `lease_expires_at > now()`; every expiry is computed
as `now() + <lease>` in the statement that writes it, so the brokers' own clocks (which
may disagree by seconds) never decide who is live.

`PgRegistryStore` is the SQL, over one connection of its own (not the storage engine's
pool: a renewal must not wait behind commits for a connection). A statement that fails
drops the connection; the next call opens a new one. The lease loop and the cluster view
built on it are the broker's (broker.registry).

- `register`: take the node id unless a live lease of another incarnation holds it (one
  conditional upsert, so two brokers registering one node id at once cannot both win).
  A live lease registered from the same data dir (`host:path`) is taken at once: the
  caller holds that data dir's lock (persister.dirlock, dropped by the kernel when a
  process dies), which proves the incarnation that registered from it is gone (a
  broker restarted after kill -9 need not wait for its old lease). A refusal whose
  holder is gone when it is read (it deregistered in between) is tried again, up to
  `REGISTER_ATTEMPTS` times in all, then fails (`RegistrationContended`).
- `renew`: move this incarnation's lease on and read the live brokers, or say who took
  the node id (this broker was paused past its lease and another took over: fenced).
- `deregister`: a graceful stop removes the row, so the others see the broker gone at
  their next heartbeat instead of after the session timeout.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

# (listener, host, port): one advertised listener of a broker.
Endpoint = tuple[str, str, int]

# How many times `register` tries when a refusal's holder is gone by the time it is read.
REGISTER_ATTEMPTS = 3


class RegistrationContended(OSError):
    """`register` was refused and found the holder gone, `REGISTER_ATTEMPTS` times in a
    row. An OSError, so `spool serve` reports it as a failed start (exit code 1)."""


@dataclass(frozen=True, slots=True)
class BrokerRow:
    """A registration as the database holds it; `lease_left_ms` by the database's clock
    (0 or less: expired)."""

    node_id: int
    incarnation_id: uuid.UUID
    endpoints: tuple[Endpoint, ...]
    rack: str | None
    lease_left_ms: int

    def address(self) -> str:
        """Its endpoints as Kafka writes listeners (PLAINTEXT://host:port,...)."""
        return ",".join(f"{name}://{host}:{port}" for name, host, port in self.endpoints) or "?"


@dataclass(frozen=True, slots=True)
class Registered:
    """The outcome of a registration: `holder` is the live registration of another
    incarnation that refused it (None: registered); `replaced` the expired one it took
    the node id from, if any."""

    holder: BrokerRow | None
    replaced: BrokerRow | None = None


@dataclass(frozen=True, slots=True)
class Renewal:
    """The outcome of a renewal: renewed with the live brokers (this one among them), or
    not, with the registration that holds the node id now (None: the row is gone)."""

    renewed: bool
    live: tuple[BrokerRow, ...] = ()
    holder: BrokerRow | None = None


_COLUMNS = (
    "node_id, incarnation_id, endpoints::text AS endpoints, rack, "
    "(extract(epoch FROM lease_expires_at - now()) * 1000)::bigint AS lease_left_ms"
)
_ROW = f"SELECT {_COLUMNS} FROM spool_brokers WHERE node_id = $1"
_LIVE = f"SELECT {_COLUMNS} FROM spool_brokers WHERE lease_expires_at > now() ORDER BY node_id"
# The upsert takes the row only when its lease has expired or it is this incarnation's
# (checked under the row lock ON CONFLICT takes, so concurrent registrations serialise).
_REGISTER = """
INSERT INTO spool_brokers AS b
       (node_id, incarnation_id, endpoints, rack, data_dir, lease_expires_at)
VALUES ($1, $2, $3::jsonb, $4, $6, now() + $5::bigint * interval '1 millisecond')
ON CONFLICT (node_id) DO UPDATE
   SET incarnation_id = EXCLUDED.incarnation_id,
       endpoints = EXCLUDED.endpoints,
       rack = EXCLUDED.rack,
       data_dir = EXCLUDED.data_dir,
       registered_at = now(),
       lease_expires_at = EXCLUDED.lease_expires_at
 WHERE b.lease_expires_at <= now() OR b.incarnation_id = EXCLUDED.incarnation_id
    OR b.data_dir = EXCLUDED.data_dir
RETURNING node_id
"""
_RENEW = """
UPDATE spool_brokers
   SET lease_expires_at = now() + $3::bigint * interval '1 millisecond',
       endpoints = $4::jsonb,
       rack = $5
 WHERE node_id = $1 AND incarnation_id = $2
RETURNING node_id
"""
_DEREGISTER = "DELETE FROM spool_brokers WHERE node_id = $1 AND incarnation_id = $2"


def _endpoints_json(endpoints: Sequence[Endpoint]) -> str:
    return json.dumps([{"listener": n, "host": h, "port": p} for n, h, p in endpoints])


def _row(record: Any) -> BrokerRow:
    endpoints = tuple(
        (str(e["listener"]), str(e["host"]), int(e["port"]))
        for e in json.loads(record["endpoints"])
    )
    return BrokerRow(
        int(record["node_id"]),
        uuid.UUID(str(record["incarnation_id"])),
        endpoints,
        record["rack"],
        int(record["lease_left_ms"]),
    )


class PgRegistryStore:
    """The registry's statements over one connection of its own (see the module
    docstring). `connect(timeout_s)` opens an asyncpg connection to the database;
    `timeout_s` bounds each call (connecting included), so a database that does not
    answer fails the call instead of holding the lease loop."""

    def __init__(self, connect: Callable[[float], Awaitable[Any]], timeout_s: float) -> None:
        self._connect = connect
        self.timeout_s = timeout_s
        self._conn: Any = None

    async def _connection(self) -> Any:
        if self._conn is None or self._conn.is_closed():
            self._conn = await self._connect(self.timeout_s)
        return self._conn

    @contextlib.asynccontextmanager
    async def _session(self) -> Any:
        conn = await self._connection()
        try:
            yield conn
        except BaseException:
            # Its state is unknown (broken, or a statement left running): a new one next.
            self._conn = None
            with contextlib.suppress(Exception):
                conn.terminate()
            raise

    async def register(
        self,
        node_id: int,
        incarnation_id: uuid.UUID,
        endpoints: Sequence[Endpoint],
        rack: str | None,
        lease_ms: int,
        data_dir: str | None = None,
    ) -> Registered:
        """Register; `data_dir` is `host:path` of the data dir whose lock the caller
        holds (see the module docstring), or None."""
        t = self.timeout_s
        for _ in range(REGISTER_ATTEMPTS):
            async with self._session() as conn:
                before = await conn.fetchrow(_ROW, node_id, timeout=t)
                taken = await conn.fetchval(
                    _REGISTER,
                    node_id,
                    incarnation_id,
                    _endpoints_json(endpoints),
                    rack,
                    lease_ms,
                    data_dir,
                    timeout=t,
                )
                holder = None
                if taken is None:
                    holder = await conn.fetchrow(_ROW, node_id, timeout=t)
            if taken is not None:
                previous = None if before is None else _row(before)
                if previous is not None and previous.incarnation_id == incarnation_id:
                    previous = None
                return Registered(None, previous)
            if holder is not None:
                return Registered(_row(holder))
            # Refused, then the row was gone: its holder deregistered between the two
            # statements, so the node id is free now; try again.
        raise RegistrationContended(
            f"node.id {node_id}: registering it was refused {REGISTER_ATTEMPTS} times by "
            "a live registration that was gone a moment later (brokers with this node.id "
            "starting and stopping at once); start this broker again once the others "
            "with this node.id have settled"
        )

    async def renew(
        self,
        node_id: int,
        incarnation_id: uuid.UUID,
        endpoints: Sequence[Endpoint],
        rack: str | None,
        lease_ms: int,
    ) -> Renewal:
        t = self.timeout_s
        async with self._session() as conn:
            renewed = await conn.fetchval(
                _RENEW,
                node_id,
                incarnation_id,
                lease_ms,
                _endpoints_json(endpoints),
                rack,
                timeout=t,
            )
            if renewed is None:
                holder = await conn.fetchrow(_ROW, node_id, timeout=t)
                return Renewal(False, holder=None if holder is None else _row(holder))
            live = await conn.fetch(_LIVE, timeout=t)
        return Renewal(True, tuple(_row(r) for r in live))

    async def live(self) -> tuple[BrokerRow, ...]:
        async with self._session() as conn:
            rows = await conn.fetch(_LIVE, timeout=self.timeout_s)
        return tuple(_row(r) for r in rows)

    async def deregister(self, node_id: int, incarnation_id: uuid.UUID) -> bool:
        """Remove this incarnation's row; whether there was one (a fenced broker's node
        id is another's: its row is left alone)."""
        async with self._session() as conn:
            status = await conn.execute(
                _DEREGISTER, node_id, incarnation_id, timeout=self.timeout_s
            )
        return bool(status == "DELETE 1")

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await conn.close(timeout=self.timeout_s)
            except Exception:
                conn.terminate()
