"""The PostgreSQL schema of the storage engine (persister.pg_storage), and its migrations.

Tables:

- `spool_schema_version(version)`: one row, the last migration applied.
- `spool_logs`: one row per log the broker keeps, named as the file engine names its
  directory under the data dir (`topics/<topic>-<partition>`, `meta`, `groups`,
  `share-state`, `transactions`). `leader_epoch` is the fencing epoch: a broker claims a
  log by bumping it and every commit checks it is still its own. `log_start_offset` is
  the first offset kept (DeleteRecords, retention); `next_offset` the log end offset as
  of the last commit; `topic_id` the topic's id for a partition log (a topic deleted
  and created again under its name is another log).
- `spool_batches`: the record batches of each log as the broker wrote them (v2 bytes
  with their assigned base offset, never decoded), one row per append, keyed by
  (log, base offset) with the last offset and max timestamp to find them.
- `spool_logs.leader_node` (v5): the broker holding the log (persister.pg_leadership).
- `spool_brokers` (v3): the brokers sharing the database, one row per node id
  (persister.pg_registry): the incarnation that holds it (a uuid per process start),
  its advertised endpoints per listener, its rack, the data dir it runs on
  (`host:path`), and its lease, an expiry time computed with the database's clock
  (`now()`) so the brokers' clocks never matter.

`spool_commit(...)` is the whole of a commit in one statement, so one round trip (and,
run outside an explicit transaction, one transaction): check the epochs of the logs
written (their `spool_logs` rows read FOR SHARE, so a concurrent claim waits for the
commit or the commit sees the claim), then for the logs still owned remove the rows a
truncation undid, insert the new batches (when a row is already at a batch's offset, left by a
resent commit's first attempt, the rows from the log's first new offset on are
replaced by the new ones), move the log start and end offsets and
drop the rows below the log start. It returns the ids of the logs whose epoch was not
the writer's (fenced), which it leaves untouched. Statements with nothing to do (no
truncation, no new batch, no log start moved) are skipped: each costs an executor
start, and most commits only insert and move the end. A log written by several brokers
(a shared log, the cluster metadata) is checked by the offset it must end at instead of
its epoch, under FOR UPDATE (schema v4), and comes back in the same returned ids when
another broker appended first. `spool_append(...)` (v6) does the same for the commit
most are, one owned log appending, in two statements; it returns false when fenced.

`migrate` applies what is missing under a transaction-scoped advisory lock, so brokers
starting at once against one database take turns and the second finds the work done.
"""

from __future__ import annotations

from typing import Any

import structlog

log = structlog.get_logger(__name__)

# pg_advisory_xact_lock key of the migrations: "spool" in ASCII plus 1.
MIGRATION_LOCK = 0x73706F6F6C01

_V1 = """
CREATE TABLE IF NOT EXISTS spool_logs (
    log_id bigserial PRIMARY KEY,
    name text NOT NULL UNIQUE,
    leader_epoch bigint NOT NULL DEFAULT 0,
    log_start_offset bigint NOT NULL DEFAULT 0,
    next_offset bigint NOT NULL DEFAULT 0,
    topic_id text,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS spool_batches (
    log_id bigint NOT NULL REFERENCES spool_logs (log_id) ON DELETE CASCADE,
    base_offset bigint NOT NULL,
    last_offset bigint NOT NULL,
    max_timestamp bigint NOT NULL,
    data bytea NOT NULL,
    PRIMARY KEY (log_id, base_offset)
);
CREATE OR REPLACE FUNCTION spool_commit(
    p_logs bigint[],
    p_epochs bigint[],
    p_truncate bigint[],
    p_next bigint[],
    p_start bigint[],
    b_logs bigint[],
    b_base bigint[],
    b_last bigint[],
    b_ts bigint[],
    b_data bytea[]
) RETURNS bigint[] LANGUAGE plpgsql AS $fn$
DECLARE
    fenced bigint[];
BEGIN
    PERFORM 1 FROM spool_logs WHERE log_id = ANY (p_logs) ORDER BY log_id FOR SHARE;
    SELECT coalesce(array_agg(t.log_id), '{}') INTO fenced
      FROM unnest(p_logs, p_epochs) AS t (log_id, epoch)
      LEFT JOIN spool_logs l ON l.log_id = t.log_id
     WHERE l.leader_epoch IS DISTINCT FROM t.epoch;
    DELETE FROM spool_batches b
     USING unnest(p_logs, p_truncate) AS t (log_id, from_offset)
     WHERE t.from_offset IS NOT NULL AND b.log_id = t.log_id
       AND b.base_offset >= t.from_offset AND NOT (t.log_id = ANY (fenced));
    INSERT INTO spool_batches (log_id, base_offset, last_offset, max_timestamp, data)
    SELECT x.log_id, x.base, x.last, x.ts, x.data
      FROM unnest(b_logs, b_base, b_last, b_ts, b_data) AS x (log_id, base, last, ts, data)
     WHERE NOT (x.log_id = ANY (fenced));
    UPDATE spool_logs l
       SET next_offset = t.next_offset,
           log_start_offset = greatest(l.log_start_offset, t.start_offset)
      FROM unnest(p_logs, p_next, p_start) AS t (log_id, next_offset, start_offset)
     WHERE l.log_id = t.log_id AND NOT (t.log_id = ANY (fenced));
    DELETE FROM spool_batches b
     USING unnest(p_logs, p_start) AS t (log_id, start_offset)
     WHERE t.start_offset IS NOT NULL AND b.log_id = t.log_id
       AND b.base_offset < t.start_offset AND b.last_offset < t.start_offset
       AND NOT (t.log_id = ANY (fenced));
    RETURN fenced;
END
$fn$;
"""

# v2: the same commit in fewer statements (each costs the function an executor start;
# a commit without truncation nor log start moved went from 5 to 3): the epochs are read
# in the statement that locks their rows (a row updated by a claim that committed
# meanwhile is read as the claim left it, as FOR SHARE does in READ COMMITTED), the
# fenced logs are worked out only when a log is not owned, rows from the truncation
# point on are deleted only when a truncation is given and rows below the log start
# only when it moved. The caller no longer passes its first new offset as a truncation
# to make room for a resend: the insert skips rows already there (ON CONFLICT DO
# NOTHING), and only when it skipped some (a resent commit whose first attempt was
# stored) are the rows from each log's first new offset on deleted and the batches
# inserted again, v1's outcome. A v1 caller (the first offset passed as truncation)
# gets v1's behaviour.
_V2 = """
CREATE OR REPLACE FUNCTION spool_commit(
    p_logs bigint[],
    p_epochs bigint[],
    p_truncate bigint[],
    p_next bigint[],
    p_start bigint[],
    b_logs bigint[],
    b_base bigint[],
    b_last bigint[],
    b_ts bigint[],
    b_data bytea[]
) RETURNS bigint[] LANGUAGE plpgsql AS $fn$
DECLARE
    owned bigint[];
    fenced bigint[] := '{}';
    inserted bigint;
    expected bigint;
BEGIN
    SELECT coalesce(array_agg(s.log_id), '{}') INTO owned
      FROM (SELECT l.log_id, l.leader_epoch FROM spool_logs l
             WHERE l.log_id = ANY (p_logs) ORDER BY l.log_id FOR SHARE) s
      JOIN unnest(p_logs, p_epochs) AS t (log_id, epoch)
        ON t.log_id = s.log_id AND t.epoch = s.leader_epoch;
    IF cardinality(owned) < cardinality(p_logs) THEN
        fenced := ARRAY(SELECT x FROM unnest(p_logs) AS x WHERE NOT (x = ANY (owned)));
    END IF;
    IF array_remove(p_truncate, NULL) <> '{}' THEN
        DELETE FROM spool_batches b
         USING unnest(p_logs, p_truncate) AS t (log_id, from_offset)
         WHERE t.from_offset IS NOT NULL AND b.log_id = t.log_id
           AND b.base_offset >= t.from_offset AND t.log_id = ANY (owned);
    END IF;
    IF cardinality(b_logs) > 0 THEN
        INSERT INTO spool_batches (log_id, base_offset, last_offset, max_timestamp, data)
        SELECT x.log_id, x.base, x.last, x.ts, x.data
          FROM unnest(b_logs, b_base, b_last, b_ts, b_data) AS x (log_id, base, last, ts, data)
         WHERE x.log_id = ANY (owned)
        ON CONFLICT (log_id, base_offset) DO NOTHING;
        GET DIAGNOSTICS inserted = ROW_COUNT;
        IF fenced = '{}' THEN
            expected := cardinality(b_logs);
        ELSE
            expected := (SELECT count(*) FROM unnest(b_logs) AS x WHERE x = ANY (owned));
        END IF;
        IF inserted < expected THEN
            -- A resend (or a writer that did not restore): rows from each log's first
            -- new offset on make way for the new ones, as v1 did on every commit.
            DELETE FROM spool_batches b
             USING (SELECT x.log_id, min(x.base) AS from_offset
                      FROM unnest(b_logs, b_base) AS x (log_id, base)
                     WHERE x.log_id = ANY (owned) GROUP BY x.log_id) AS t
             WHERE b.log_id = t.log_id AND b.base_offset >= t.from_offset;
            INSERT INTO spool_batches (log_id, base_offset, last_offset, max_timestamp, data)
            SELECT x.log_id, x.base, x.last, x.ts, x.data
              FROM unnest(b_logs, b_base, b_last, b_ts, b_data) AS x (log_id, base, last, ts, data)
             WHERE x.log_id = ANY (owned);
        END IF;
    END IF;
    UPDATE spool_logs l
       SET next_offset = t.next_offset,
           log_start_offset = greatest(l.log_start_offset, t.start_offset)
      FROM unnest(p_logs, p_next, p_start) AS t (log_id, next_offset, start_offset)
     WHERE l.log_id = t.log_id AND t.log_id = ANY (owned);
    IF array_remove(p_start, NULL) <> '{}' THEN
        DELETE FROM spool_batches b
         USING unnest(p_logs, p_start) AS t (log_id, start_offset)
         WHERE t.start_offset IS NOT NULL AND b.log_id = t.log_id
           AND b.base_offset < t.start_offset AND b.last_offset < t.start_offset
           AND t.log_id = ANY (owned);
    END IF;
    RETURN fenced;
END
$fn$;
"""

# v3: the broker registry (persister.pg_registry). `endpoints` is a JSON array of
# {"listener", "host", "port"}; the lease is live while `lease_expires_at > now()`.
_V3 = """
CREATE TABLE IF NOT EXISTS spool_brokers (
    node_id integer PRIMARY KEY,
    incarnation_id uuid NOT NULL,
    endpoints jsonb NOT NULL,
    rack text,
    data_dir text,
    registered_at timestamptz NOT NULL DEFAULT now(),
    lease_expires_at timestamptz NOT NULL
);
"""

# v4: shared logs (the cluster metadata, written by every broker of the database). A
# write of a log may state the offset the log must end at (`p_expect`) instead of an
# epoch: such a log is taken FOR UPDATE, before the others and in log order, so its
# writers take turns, and its write goes in only if the log still ends there (read
# after the lock, so two writers can never both append at one offset); otherwise its
# id is returned, as a fenced log's is, and nothing of it is written. The other logs of
# the commit are unaffected. The v2 function (10 arguments) goes: every caller passes
# the expectations now.
_V4 = """
DROP FUNCTION IF EXISTS spool_commit(
    bigint[], bigint[], bigint[], bigint[], bigint[],
    bigint[], bigint[], bigint[], bigint[], bytea[]
);
CREATE OR REPLACE FUNCTION spool_commit(
    p_logs bigint[],
    p_epochs bigint[],
    p_truncate bigint[],
    p_next bigint[],
    p_start bigint[],
    p_expect bigint[],
    b_logs bigint[],
    b_base bigint[],
    b_last bigint[],
    b_ts bigint[],
    b_data bytea[]
) RETURNS bigint[] LANGUAGE plpgsql AS $fn$
DECLARE
    claimed bigint[] := p_logs;
    shared bigint[] := '{}';
    owned bigint[];
    fenced bigint[] := '{}';
    inserted bigint;
    expected bigint;
BEGIN
    IF array_remove(p_expect, NULL) <> '{}' THEN
        SELECT coalesce(array_agg(s.log_id), '{}') INTO shared
          FROM (SELECT l.log_id FROM spool_logs l
                  JOIN unnest(p_logs, p_expect) AS t (log_id, expect)
                    ON t.log_id = l.log_id AND t.expect IS NOT NULL
                 WHERE l.next_offset = t.expect
                 ORDER BY l.log_id FOR UPDATE OF l) s;
        claimed := ARRAY(SELECT t.log_id FROM unnest(p_logs, p_expect) AS t (log_id, expect)
                          WHERE t.expect IS NULL);
    END IF;
    SELECT coalesce(array_agg(s.log_id), '{}') INTO owned
      FROM (SELECT l.log_id, l.leader_epoch FROM spool_logs l
             WHERE l.log_id = ANY (claimed) ORDER BY l.log_id FOR SHARE) s
      JOIN unnest(p_logs, p_epochs) AS t (log_id, epoch)
        ON t.log_id = s.log_id AND t.epoch = s.leader_epoch;
    owned := owned || shared;
    IF cardinality(owned) < cardinality(p_logs) THEN
        fenced := ARRAY(SELECT x FROM unnest(p_logs) AS x WHERE NOT (x = ANY (owned)));
    END IF;
    IF array_remove(p_truncate, NULL) <> '{}' THEN
        DELETE FROM spool_batches b
         USING unnest(p_logs, p_truncate) AS t (log_id, from_offset)
         WHERE t.from_offset IS NOT NULL AND b.log_id = t.log_id
           AND b.base_offset >= t.from_offset AND t.log_id = ANY (owned);
    END IF;
    IF cardinality(b_logs) > 0 THEN
        INSERT INTO spool_batches (log_id, base_offset, last_offset, max_timestamp, data)
        SELECT x.log_id, x.base, x.last, x.ts, x.data
          FROM unnest(b_logs, b_base, b_last, b_ts, b_data) AS x (log_id, base, last, ts, data)
         WHERE x.log_id = ANY (owned)
        ON CONFLICT (log_id, base_offset) DO NOTHING;
        GET DIAGNOSTICS inserted = ROW_COUNT;
        IF fenced = '{}' THEN
            expected := cardinality(b_logs);
        ELSE
            expected := (SELECT count(*) FROM unnest(b_logs) AS x WHERE x = ANY (owned));
        END IF;
        IF inserted < expected THEN
            DELETE FROM spool_batches b
             USING (SELECT x.log_id, min(x.base) AS from_offset
                      FROM unnest(b_logs, b_base) AS x (log_id, base)
                     WHERE x.log_id = ANY (owned) GROUP BY x.log_id) AS t
             WHERE b.log_id = t.log_id AND b.base_offset >= t.from_offset;
            INSERT INTO spool_batches (log_id, base_offset, last_offset, max_timestamp, data)
            SELECT x.log_id, x.base, x.last, x.ts, x.data
              FROM unnest(b_logs, b_base, b_last, b_ts, b_data) AS x (log_id, base, last, ts, data)
             WHERE x.log_id = ANY (owned);
        END IF;
    END IF;
    UPDATE spool_logs l
       SET next_offset = t.next_offset,
           log_start_offset = greatest(l.log_start_offset, t.start_offset)
      FROM unnest(p_logs, p_next, p_start) AS t (log_id, next_offset, start_offset)
     WHERE l.log_id = t.log_id AND t.log_id = ANY (owned);
    IF array_remove(p_start, NULL) <> '{}' THEN
        DELETE FROM spool_batches b
         USING unnest(p_logs, p_start) AS t (log_id, start_offset)
         WHERE t.start_offset IS NOT NULL AND b.log_id = t.log_id
           AND b.base_offset < t.start_offset AND b.last_offset < t.start_offset
           AND t.log_id = ANY (owned);
    END IF;
    RETURN fenced;
END
$fn$;
"""

# v5: leadership by lease (persister.pg_leadership): the node id holding each log, NULL
# once released; a holder counts while its `spool_brokers` lease is live.
_V5 = """
ALTER TABLE spool_logs ADD COLUMN IF NOT EXISTS leader_node integer;
"""

# v6: the common commit, one owned log appending (no truncation, no log start moved, not
# a shared log), in two statements instead of spool_commit's array joins: the UPDATE of
# its row checks the epoch and takes the row lock a claim waits on (a claim that won
# first leaves no row to update: fenced), then the insert, replacing from the first new
# offset on when a resent commit's first attempt left rows there, as spool_commit does.
# About 0.3 ms of the server's time per commit instead of 0.7 on a 2-core machine.
_V6 = """
CREATE OR REPLACE FUNCTION spool_append(
    p_log bigint,
    p_epoch bigint,
    p_next bigint,
    b_base bigint[],
    b_last bigint[],
    b_ts bigint[],
    b_data bytea[]
) RETURNS boolean LANGUAGE plpgsql AS $fn$
DECLARE
    inserted bigint;
BEGIN
    UPDATE spool_logs SET next_offset = p_next
     WHERE log_id = p_log AND leader_epoch = p_epoch;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    IF cardinality(b_base) > 0 THEN
        INSERT INTO spool_batches (log_id, base_offset, last_offset, max_timestamp, data)
        SELECT p_log, x.base, x.last, x.ts, x.data
          FROM unnest(b_base, b_last, b_ts, b_data) AS x (base, last, ts, data)
        ON CONFLICT (log_id, base_offset) DO NOTHING;
        GET DIAGNOSTICS inserted = ROW_COUNT;
        IF inserted < cardinality(b_base) THEN
            DELETE FROM spool_batches
             WHERE log_id = p_log AND base_offset >= (SELECT min(x) FROM unnest(b_base) AS x);
            INSERT INTO spool_batches (log_id, base_offset, last_offset, max_timestamp, data)
            SELECT p_log, x.base, x.last, x.ts, x.data
              FROM unnest(b_base, b_last, b_ts, b_data) AS x (base, last, ts, data);
        END IF;
    END IF;
    RETURN true;
END
$fn$;
"""

# Each migration takes the schema from version i to i + 1; append, never edit.
MIGRATIONS: tuple[str, ...] = (_V1, _V2, _V3, _V4, _V5, _V6)
SCHEMA_VERSION = len(MIGRATIONS)


class SchemaTooNew(RuntimeError):
    """The database was migrated by a newer spool than this one."""


async def migrate(conn: Any) -> int:
    """Bring the schema up to `SCHEMA_VERSION`; return how many migrations this applied.

    Idempotent, and safe when several brokers run it at once: each takes the advisory
    lock in its own transaction, reads the version under it and applies only what is
    missing. `conn` is an asyncpg connection."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK)
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS spool_schema_version (version integer NOT NULL)"
        )
        current = await conn.fetchval("SELECT max(version) FROM spool_schema_version")
        current = 0 if current is None else int(current)
        if current > SCHEMA_VERSION:
            raise SchemaTooNew(
                f"the database schema is at version {current}, newer than this spool's "
                f"{SCHEMA_VERSION}: run a newer spool"
            )
        for version in range(current, SCHEMA_VERSION):
            await conn.execute(MIGRATIONS[version])
        if current < SCHEMA_VERSION:
            await conn.execute("DELETE FROM spool_schema_version")
            await conn.execute("INSERT INTO spool_schema_version VALUES ($1)", SCHEMA_VERSION)
            log.info("storage_schema_migrated", version_from=current, version=SCHEMA_VERSION)
        return SCHEMA_VERSION - current
