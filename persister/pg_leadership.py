"""Leadership by lease in PostgreSQL: who holds each log, claims and releases.

A log (`spool_logs` row) is held by the broker in its `leader_node` column (schema v4)
at its `leader_epoch`, the fencing epoch every commit of the log carries
(persister.pg_commit). A holder counts while its broker's lease in `spool_brokers` has
not expired, by the database's clock (`now()`), so no two brokers' clocks are compared.

- `claim`: in one transaction, with the row locked, take the log if its holder is
  nobody (released), this broker, or a broker whose lease expired: `leader_node` = this
  broker, `leader_epoch` + 1. A live holder refuses the claim (None): the claimer tries
  again at its next reconcile, once the holder released the log or its lease ran out.
  A row of another topic id (a deleted topic of that name whose rows were not dropped
  yet) is emptied first, as PgStorage's own claim does. A log without a row gets one.
- `release`: `leader_node` = NULL where the epoch is still the releaser's: the next
  claim needs no lease to expire.
- `holders`: every log's live holder and epoch, for the cluster view.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import structlog

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class ClaimedLog:
    """A log this broker claimed: its row as of the claim."""

    log_id: int
    epoch: int
    log_start_offset: int
    next_offset: int
    topic_id: str | None


@dataclass(frozen=True, slots=True)
class Holder:
    """A log's live holder and its epoch."""

    node_id: int
    epoch: int


_HOLDERS = """
SELECT l.name, l.leader_node, l.leader_epoch
  FROM spool_logs l
  JOIN spool_brokers b ON b.node_id = l.leader_node AND b.lease_expires_at > now()
"""

_LOCK = """
SELECT l.log_id, l.topic_id, l.leader_node,
       (b.node_id IS NOT NULL) AS holder_live
  FROM spool_logs l
  LEFT JOIN spool_brokers b ON b.node_id = l.leader_node AND b.lease_expires_at > now()
 WHERE l.name = $1
   FOR UPDATE OF l
"""

_TAKE = """
UPDATE spool_logs
   SET leader_node = $2, leader_epoch = leader_epoch + 1,
       topic_id = coalesce($3, topic_id)
 WHERE log_id = $1
RETURNING log_id, leader_epoch, log_start_offset, next_offset, topic_id
"""


class PgLeadershipStore:
    """The leadership statements on a pool's connections (`acquire` is asyncpg's
    `Pool.acquire`)."""

    def __init__(self, acquire: Callable[[], AbstractAsyncContextManager[Any]]) -> None:
        self._acquire = acquire

    async def holders(self) -> Mapping[str, Holder]:
        async with self._acquire() as conn:
            rows = await conn.fetch(_HOLDERS)
        return {
            row["name"]: Holder(int(row["leader_node"]), int(row["leader_epoch"])) for row in rows
        }

    async def claim(self, name: str, node_id: int, topic_id: str | None) -> ClaimedLog | None:
        async with self._acquire() as conn, conn.transaction():
            await conn.execute(
                "INSERT INTO spool_logs (name, topic_id) VALUES ($1, $2) "
                "ON CONFLICT (name) DO NOTHING",
                name,
                topic_id,
            )
            old = await conn.fetchrow(_LOCK, name)
            holder = old["leader_node"]
            if holder is not None and holder != node_id and old["holder_live"]:
                return None
            if topic_id is not None and old["topic_id"] not in (None, topic_id):
                await conn.execute("DELETE FROM spool_batches WHERE log_id = $1", old["log_id"])
                await conn.execute(
                    "UPDATE spool_logs SET next_offset = 0, log_start_offset = 0 WHERE log_id = $1",
                    old["log_id"],
                )
                log.warning("log_of_deleted_topic_emptied", log=name, topic_id=old["topic_id"])
            row = await conn.fetchrow(_TAKE, old["log_id"], node_id, topic_id)
        log.info(
            "log_leadership_claimed",
            log=name,
            epoch=row["leader_epoch"],
            previous_holder=holder,
        )
        return ClaimedLog(
            int(row["log_id"]),
            int(row["leader_epoch"]),
            int(row["log_start_offset"]),
            int(row["next_offset"]),
            row["topic_id"],
        )

    async def release(self, name: str, node_id: int, epoch: int) -> bool:
        async with self._acquire() as conn:
            status = await conn.execute(
                "UPDATE spool_logs SET leader_node = NULL "
                "WHERE name = $1 AND leader_node = $2 AND leader_epoch = $3",
                name,
                node_id,
                epoch,
            )
        released: bool = status.endswith(" 1")
        log.info("log_leadership_released", log=name, epoch=epoch, released=released)
        return released
