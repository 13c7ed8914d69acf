"""The PostgreSQL storage engine: the database is the durable copy, the data dir a cache.

Every log (topic partitions and the coordinator record logs) is still a `PartitionLog`
of segment files under the data dir, so reads, indexes, producer state, checkpoints and
compaction work as on the file engine. What changes is durability: `PgPartitionLog`
remembers the batches appended since its last commit, and its flush round (GroupCommit
runs `flush_async` on the loop) hands them to the shared `PgCommitter`, which writes the
pending batches of every log in one transaction (persister.pg_commit). A write is
acknowledged only once that commit returned, so nothing acknowledged is only in the
data dir. The local files are not fsynced on the write path (only when a segment
rolls, to move the recovery point): a crash of the machine that loses them, or their
tail, is repaired from the database at the next start.

Start (`PgStorage.start`, before the broker opens anything): connect, migrate the
schema (persister.pg_schema), then bring the data dir in line with the database, log
by log: a log the data dir lacks or holds less of gets the missing batches fetched and
appended (through `PartitionLog`, so indexes follow); what the data dir holds beyond
the database's end (written, never committed, never acknowledged) is truncated; the log
start offset is the database's. The cluster metadata comes back with the `meta` log,
so the broker then opens everything as usual. A coordinator log with data in the data
dir but no row in the database is refused (a data dir of the file engine: moving it is
`spool migrate`'s job), rather than silently emptied. A log whose last batches differ from the
database's (the data dir was another database's cache) is rebuilt from the database.

Fencing: opening a log claims it, bumping its `leader_epoch` in `spool_logs`; every
commit carries that epoch and is refused (`Fenced`) once another writer claimed the
log. A fenced log refuses every later flush too; the broker then closes it and
`discard_log` deletes its directory (broker.partitions.LogManager.drop_partition): the
rows are the new owner's, and a later claim restores them.

Shared logs (`SHARED_LOGS`: the cluster metadata, `meta`) are written by every broker
of the database and claimed by none (`PgSharedLog`): opening one only makes sure its
row exists, and a commit of its new batches states the offset they begin at, which
must still be the log's end in the database (`spool_commit` checks it under a row lock,
so two brokers never both append at one offset); otherwise the write is refused with
`LogConflict`, and nothing of it is kept. The writer undoes its append and calls
`catch_up`, which appends what the others committed to the local copy at their
offsets (coordinator.metadata replays it and reruns the change on the new state); the
brokers also call it on a timer to follow each other. Its truncations (a failed write
undone) stay local, and so do its log start moves (compaction of the local copy): the
database's rows are the other brokers' as well, and keeps them all.

Leadership (broker.leadership, persister.pg_leadership): among brokers sharing the
database a topic partition is opened only by the broker that claimed it, conditionally
(no live holder), so the claim happens before the open: `restore_claimed` brings the
log's local copy up to date from the database (the previous leader wrote meanwhile) and
hands the claim to the open, which then claims nothing more. The coordinator logs
(`groups`, `share-state`, `transactions`) are placed by the same layout: a broker that
does not lead one opens its local copy with a refused claim (`claim_on_open` with None:
it never writes), and the broker the layout names claims it, restores it and reopens
it. `_claim` (an unconditional claim, recording the claimer in `leader_node`) is left
for a log opened outside leadership.

Truncation and retention: a truncation (a failed write undone) is recorded and its
rows deleted by the log's next commit; DeleteRecords and retention move the log start
offset, sent with the next commit, which deletes the rows wholly below it. A deleted
topic's rows go when `forget_log` runs (LogManager calls it as it removes the
directory), in the background; `spool_logs.topic_id` holds the topic id of a partition
log (from the directory's `partition.metadata`), and a claim by another topic id empties
the rows a deleted topic of that name left, so a re-created topic never inherits them.

Compaction: the broker's compaction of a coordinator log rewrites its local segments
only, never the rows. The rows of the share-state log are compacted in the database by
`spool compact --storage` (persister.spark.pg_compact), which deletes rows whose every
record is superseded while the broker runs; the other coordinator logs keep every
committed batch (a restore replays more, to the same state). A restore steps over the
gaps of offsets the deleted rows leave.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import os
import shutil
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from persister.clock import SYSTEM_CLOCK, Clock
from persister.commit import GroupCommit
from persister.coordinator_log import RecordLog, internal_log_config
from persister.file_log import (
    LOG_START_OFFSET_CHECKPOINT,
    AppendResult,
    LogConfig,
    PartitionLog,
    _write_checkpoint,
)
from persister.pg_commit import Batch, LogWrite, PgCommitter, storage_error
from persister.pg_leadership import ClaimedLog, PgLeadershipStore
from persister.pg_schema import migrate
from persister.pg_url import mask_password
from persister.producer_state import ProducerStateManager
from persister.segment import LOG_SUFFIX
from persister.storage import CoordinatorLog, Fenced, StorageUnavailable, TopicLog

log = structlog.get_logger(__name__)

# The coordinator logs, by directory name under the data dir.
COORDINATOR_LOGS = ("meta", "groups", "share-state", "transactions")
# Logs every broker of the database writes (`PgSharedLog`), unclaimed.
SHARED_LOGS = ("meta",)
# Rows fetched per query while restoring a log.
_RESTORE_ROWS = 256
# max.message.bytes while restoring: Kafka's limit is an int.
_NO_BATCH_LIMIT = 2**31 - 1
POOL_MAX_SIZE = 8
CONNECT_TIMEOUT_S = 10.0
# TCP keepalives on the pool's connections (libpq's keepalives_idle, keepalives_interval,
# keepalives_count), and a TCP user timeout: a connection to a database that stopped
# answering (a host gone, packets dropped) dies within about this many seconds even while
# idle or with data unacknowledged, instead of the kernel's two hours / fifteen minutes.
KEEPALIVE_IDLE_S = 5
KEEPALIVE_INTERVAL_S = 2
KEEPALIVE_COUNT = 3
TCP_USER_TIMEOUT_MS = 10_000
# How long a shared log's catch-up may take before it counts as failed.
CATCH_UP_TIMEOUT_S = 10.0
# How long a stop waits for pending claims and drops, then for the pool to close.
STOP_TIMEOUT_S = 5.0


@dataclass(slots=True)
class _Claim:
    log_id: int
    epoch: int


class PgPartitionLog(PartitionLog):
    """A `PartitionLog` whose flush commits its new batches to PostgreSQL."""

    _engine: PgStorage
    _name: str

    def _attach(self, engine: PgStorage, name: str, topic_id: str | None) -> None:
        self._engine = engine
        self._name = name
        self._pending: list[Batch] = []
        self._truncate_from: int | None = None
        self._committed_start = self.log_start_offset
        self._fenced: Fenced | None = None
        self._topic_id = topic_id
        granted = engine._granted.pop(name, None)
        pending = engine._pending_claims.pop(name, None)
        self._claim: asyncio.Future[_Claim]
        if pending is not None:
            # Claimed by leadership as it opens (a new partition): usable once the claim
            # is granted and the database's copy is what this one holds.
            self._claim = asyncio.ensure_future(
                _checked_claim(name, pending, self.log_start_offset, self.log_end_offset)
            )
            # A refusal is the partition's to act on at its next flush, if any.
            self._claim.add_done_callback(_retrieve)
        elif granted is None:
            self._claim = engine._claim_later(name, topic_id)
        else:
            # Claimed by leadership (broker.leadership) and restored before this open.
            self._claim = asyncio.get_running_loop().create_future()
            self._claim.set_result(granted)

    def __repr__(self) -> str:
        return f"PgPartitionLog({self._name})"

    # -- writes remembered for the next commit ----------------------------------

    def append(self, data: bytearray | memoryview, now_ms: int) -> AppendResult:
        result = super().append(data, now_ms)
        self._remember(data, result)
        return result

    def append_raw(self, data: bytearray | memoryview, now_ms: int) -> AppendResult:
        result = super().append_raw(data, now_ms)
        self._remember(data, result)
        return result

    def _remember(self, data: bytearray | memoryview, result: AppendResult) -> None:
        self._pending.append(
            Batch(result.first_offset, result.last_offset, result.max_timestamp, bytes(data))
        )

    def truncate_to(self, offset: int) -> int:
        removed = super().truncate_to(offset)
        self._pending = [b for b in self._pending if b.base_offset < offset]
        if self._truncate_from is None or offset < self._truncate_from:
            self._truncate_from = offset
        return removed

    # -- durability ---------------------------------------------------------------

    async def flush_async(self) -> None:
        """Commit what was written since the last commit (GroupCommit's round)."""
        if self._fenced is not None:
            raise self._fenced
        claim = await self._claimed()
        batches, self._pending = self._pending, []
        truncate_from, self._truncate_from = self._truncate_from, None
        start = self.log_start_offset
        write = LogWrite(
            claim.log_id,
            claim.epoch,
            self._name,
            batches,
            truncate_from,
            self.log_end_offset,
            start if start != self._committed_start else None,
        )
        try:
            await self._engine.committer.commit(write)
        except Fenced as exc:
            self._fenced = exc
            raise
        except BaseException:
            # Not committed: sent again with the next round, unless truncated meanwhile
            # (the truncation filtered `_pending`; these were cut as well, or are older).
            cut = self._truncate_from
            kept = [b for b in batches if cut is None or b.base_offset < cut]
            self._pending[:0] = kept
            if truncate_from is not None:
                self._truncate_from = min(truncate_from, cut if cut is not None else truncate_from)
            raise
        self._committed_start = start
        if self._unflushed:
            # A segment rolled: fsync the closed ones and move the recovery point, so
            # a start after a crash validates only the segments from there on (the
            # database has the data; this only keeps restarts short).
            try:
                await asyncio.to_thread(PartitionLog.flush, self)
            except OSError as exc:
                log.warning("local_flush_failed", log=self._name, error=str(exc))

    async def _claimed(self) -> _Claim:
        try:
            return await asyncio.shield(self._claim)
        except Fenced:
            raise
        except Exception as exc:
            # The claim failed (database unreachable at open): try again next round.
            self._claim = self._engine._claim_later(self._name, self._topic_id)
            raise storage_error(exc) from exc


class PgSharedLog(PgPartitionLog):
    """A log every broker of the database appends to (`SHARED_LOGS`), committed by the
    offset its new batches begin at rather than by epoch: see the module docstring."""

    def __repr__(self) -> str:
        return f"PgSharedLog({self._name})"

    def truncate_to(self, offset: int) -> int:
        # Local only: what is cut was never committed (a refused or failed write), or
        # its commit's outcome is unknown and `catch_up` brings it back if it went in;
        # the database's rows from there on may be another broker's.
        removed = PartitionLog.truncate_to(self, offset)
        self._pending = [b for b in self._pending if b.base_offset < offset]
        return removed

    async def flush_async(self) -> None:
        """Commit the batches written since the last commit, if the log still ends
        where they begin in the database; `LogConflict` if another broker appended
        first. A failed commit is not sent again: the writer undoes its append."""
        claim = await self._claimed()
        batches, self._pending = self._pending, []
        if batches:
            write = LogWrite(
                claim.log_id,
                claim.epoch,
                self._name,
                batches,
                None,
                self.log_end_offset,
                None,
                expect_end=batches[0].base_offset,
            )
            await self._engine.committer.commit(write)
        await self._fsync_rolled()

    async def catch_up(self) -> int:
        """`SharedLog.catch_up`: append the batches committed past the local end. Not
        tried during a storage outage (the committer's probe ends it), and bounded by
        CATCH_UP_TIMEOUT_S: a database that does not answer fails it (StorageUnavailable
        or TimeoutError, OSErrors both) rather than holding the metadata's turn."""
        start = self.log_end_offset
        if self._pending:
            return start  # a write of this broker is in flight: its commit goes first
        unavailable = self._engine.unavailable
        if unavailable is not None:
            raise StorageUnavailable(errno.EIO, unavailable)
        try:
            async with asyncio.timeout(CATCH_UP_TIMEOUT_S):
                await self._append_committed()
        except OSError:
            raise
        except Exception as exc:
            raise storage_error(exc) from exc
        await self._fsync_rolled()
        return start

    async def _append_committed(self) -> None:
        claim = await self._claimed()
        now = SYSTEM_CLOCK.now_ms()
        async for base, last, data in self._engine._rows(claim.log_id, self.log_end_offset):
            end = self.log_end_offset
            if last < end:
                continue
            if base != end:
                raise OSError(
                    errno.EIO,
                    f"the storage database's copy of {self._name} has a batch at "
                    f"offset {base} where the local copy ends at {end}",
                )
            PartitionLog.append_raw(self, bytearray(data), now)

    async def _fsync_rolled(self) -> None:
        if self._unflushed:
            # As PgPartitionLog: fsync rolled segments only to move the recovery point.
            try:
                await asyncio.to_thread(PartitionLog.flush, self)
            except OSError as exc:
                log.warning("local_flush_failed", log=self._name, error=str(exc))


class PgStorage:
    """The PostgreSQL engine: see the module docstring. `url` is a libpq URL
    (postgresql://user@host:port/db); the password comes from it, `password`, or
    PGPASSWORD (asyncpg reads it), and is never logged."""

    def __init__(self, url: str, *, password: str | None = None) -> None:
        self.url = url
        self._password = password
        self._pool: Any = None
        self.committer: PgCommitter
        self._data_dir: Path | None = None
        # Claims and drops of a log name, in the order they were asked for.
        self._name_ops: dict[str, asyncio.Task[Any]] = {}
        self._background: set[asyncio.Task[Any]] = set()
        # The topic id each open partition log was opened with, by name: a log is
        # dropped only while its row is still that topic's (`forget_log`).
        self._topic_ids: dict[str, str] = {}
        # The broker's node.id, recorded as the holder of the logs it claims (the
        # cluster view's `coordinator` reads it), or None.
        self.node_id: int | None = None
        # Logs claimed by leadership (`restore_claimed`), for their next open.
        self._granted: dict[str, _Claim] = {}
        # Logs leadership is claiming as they open (`claim_on_open`).
        self._pending_claims: dict[str, asyncio.Future[ClaimedLog | None]] = {}

    def __repr__(self) -> str:
        return f"PgStorage({mask_password(self.url)})"

    # -- health --------------------------------------------------------------------

    @property
    def unavailable(self) -> str | None:
        """Why commits fail now (persister.pg_commit's outage), or None: `/health`."""
        committer = getattr(self, "committer", None)
        return None if committer is None else committer.unavailable

    @property
    def failed_commits(self) -> int:
        committer = getattr(self, "committer", None)
        return 0 if committer is None else committer.failed_commits

    # -- lifecycle -----------------------------------------------------------------

    async def start(self, data_dir: Path) -> None:
        import asyncpg

        self._data_dir = Path(data_dir).resolve()
        log.info("storage_connecting", storage=mask_password(self.url))
        try:
            self._pool = await asyncpg.create_pool(
                self.url,
                password=self._password,
                # No floor: asyncpg would keep reconnecting to one during an outage,
                # with a traceback in the log per attempt; the committer's probe
                # (persister.pg_commit) is what reconnects, on its backoff, logged once.
                min_size=0,
                max_size=POOL_MAX_SIZE,
                timeout=CONNECT_TIMEOUT_S,
                init=_keep_alive,
                # One statement per commit: no need for asyncpg's prepared-statement
                # cache to grow with the schema.
                statement_cache_size=32,
            )
        except (TimeoutError, OSError, asyncpg.PostgresError) as exc:
            raise OSError(
                f"cannot reach the storage database {mask_password(self.url)}: {exc}"
            ) from exc
        self.committer = PgCommitter(self._pool)
        try:
            async with self._pool.acquire() as conn:
                await migrate(conn)
                await _refuse_unfinished_migration(conn, self.url)
            await self._restore(self._data_dir)
        except asyncpg.PostgresError as exc:
            await self.stop()
            raise OSError(
                f"storage database {mask_password(self.url)}: start failed: {exc}"
            ) from exc
        except BaseException:
            await self.stop()
            raise

    async def connect(self, timeout_s: float = CONNECT_TIMEOUT_S) -> Any:
        """A connection of its own to the storage database, outside the pool: for the
        broker registry's lease (persister.pg_registry), whose renewals must not wait
        behind commits for a pooled connection."""
        import asyncpg

        return await asyncpg.connect(self.url, password=self._password, timeout=timeout_s)

    async def stop(self) -> None:
        """Let pending claims and drops finish (a bounded wait: with the database away
        they are given up; a dropped topic's rows are then emptied by the next claim of
        its name), then close the connections."""
        pending = list(self._background)
        if pending:
            _, late = await asyncio.wait(pending, timeout=STOP_TIMEOUT_S)
            for task in late:
                task.cancel()
            for task in late:
                with contextlib.suppress(BaseException):
                    await task
        committer = getattr(self, "committer", None)
        if committer is not None:
            await committer.close()
        if self._pool is not None:
            pool, self._pool = self._pool, None
            try:
                async with asyncio.timeout(STOP_TIMEOUT_S):
                    await pool.close()
            except (TimeoutError, OSError):
                pool.terminate()

    # -- opening -------------------------------------------------------------------

    def _name(self, directory: Path) -> str:
        if self._data_dir is None:
            raise RuntimeError("PgStorage.start has not run")
        return Path(directory).resolve().relative_to(self._data_dir).as_posix()

    def _open(self, directory: Path, config: LogConfig, now_ms: int) -> PgPartitionLog:
        kind = PgSharedLog if self._name(directory) in SHARED_LOGS else PgPartitionLog
        plog = kind.open(directory, config, now_ms)
        assert isinstance(plog, PgPartitionLog)
        name, topic_id = self._name(directory), read_topic_id(directory)
        if topic_id is not None:
            self._topic_ids[name] = topic_id
        plog._attach(self, name, topic_id)
        return plog

    def open_log(self, directory: Path, config: LogConfig, now_ms: int) -> PartitionLog:
        return self._open(directory, config, now_ms)

    def open_topic_log(self, directory: Path, config: LogConfig, now_ms: int) -> TopicLog:
        return self._open(directory, config, now_ms)

    def open_coordinator_log(
        self,
        directory: Path,
        commit: GroupCommit,
        config: LogConfig | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
    ) -> CoordinatorLog:
        return RecordLog(directory, commit, config, clock=clock, open_log=self.open_log)

    def forget_log(self, directory: Path) -> None:
        """Drop the log's row (and so its batches), if it is still of the topic id the
        log was opened with: brokers sharing the database each forget a deleted topic's
        logs when they learn of the deletion, and one that learns late must not drop
        the logs of a topic created again under the name meanwhile."""
        try:
            name = self._name(directory)
        except ValueError:
            return
        self._after(name, self._drop(name, self._topic_ids.pop(name, None)))

    def discard_log(self, directory: Path) -> None:
        """A log another broker claimed, closed: its local files are a cache of rows
        that are the new owner's now, so they go (a later claim restores them)."""
        try:
            self._name(directory)
        except ValueError:
            return  # not under the data dir: not one of ours
        shutil.rmtree(directory, ignore_errors=True)
        log.info("log_cache_discarded", log=self._name(directory), reason="claimed elsewhere")

    # -- leadership (broker.leadership) ------------------------------------------------

    def leadership_store(self) -> PgLeadershipStore:
        """The leadership statements (persister.pg_leadership) on this engine's pool."""
        return PgLeadershipStore(lambda: self._pool.acquire())

    def claim_on_open(self, name: str, claim: asyncio.Future[ClaimedLog | None]) -> None:
        """The next open of `name` uses `claim` (leadership's, running): a new partition
        opens at once, and its first commit waits for the claim. A claim refused (None),
        or one finding more in the database than the local copy holds (written by
        another broker meanwhile), fences the log: it is dropped and claimed again,
        restored, by the next reconcile."""
        self._pending_claims[name] = claim

    async def settle(self) -> None:
        """Wait for the claims and drops asked for so far (their failures are logged)."""
        for task in list(self._name_ops.values()):
            with contextlib.suppress(Exception):
                await asyncio.shield(task)

    async def restore_claimed(self, name: str, claimed: ClaimedLog) -> None:
        """A log leadership just claimed (closed here): bring its local copy in line
        with the database, as a start does, and hand the claim to its next open, so the
        open neither claims again nor writes past a stale cache. Ordered after the
        name's pending claims and drops."""
        if self._data_dir is None or not _safe_name(name):
            raise OSError(f"cannot restore log {name!r}")
        directory = self._data_dir / name
        await self._after(
            name,
            self._restore_log(
                directory,
                name,
                claimed.log_id,
                claimed.log_start_offset,
                claimed.next_offset,
                claimed.topic_id,
            ),
        )
        self._granted[name] = _Claim(claimed.log_id, claimed.epoch)

    # -- claims and drops ------------------------------------------------------------

    def _claim_later(self, name: str, topic_id: str | None) -> asyncio.Task[_Claim]:
        if name in SHARED_LOGS:
            return self._after(name, self._register(name))
        return self._after(name, self._claim(name, topic_id))

    def _after(self, name: str, coro: Any) -> asyncio.Task[Any]:
        """Run `coro` once the previous claim or drop of `name` is over."""
        previous = self._name_ops.get(name)

        async def run() -> Any:
            if previous is not None:
                with contextlib.suppress(Exception):
                    await previous
            return await coro

        task = asyncio.get_running_loop().create_task(run())
        self._name_ops[name] = task
        self._background.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._background.discard(t)
            if self._name_ops.get(name) is t:
                del self._name_ops[name]
            if not t.cancelled() and t.exception() is not None:
                log.warning("storage_log_op_failed", log=name, error=str(t.exception()))

        task.add_done_callback(done)
        return task

    async def _claim(self, name: str, topic_id: str | None) -> _Claim:
        """Take `name` for this broker: a new epoch (creating the row if new). A row of
        another topic id (a deleted topic's, its rows not dropped yet) is emptied first."""
        async with self._pool.acquire() as conn, conn.transaction():
            old = await conn.fetchrow(
                "SELECT log_id, topic_id FROM spool_logs WHERE name = $1 FOR UPDATE", name
            )
            if (
                old is not None
                and topic_id is not None
                and old["topic_id"] is not None
                and old["topic_id"] != topic_id
            ):
                await conn.execute("DELETE FROM spool_batches WHERE log_id = $1", old["log_id"])
                await conn.execute(
                    "UPDATE spool_logs SET next_offset = 0, log_start_offset = 0 WHERE log_id = $1",
                    old["log_id"],
                )
                log.warning("log_of_deleted_topic_emptied", log=name, topic_id=old["topic_id"])
            row = await conn.fetchrow(
                "INSERT INTO spool_logs (name, leader_epoch, topic_id, leader_node) "
                "VALUES ($1, 1, $2, $3) "
                "ON CONFLICT (name) DO UPDATE SET leader_epoch = spool_logs.leader_epoch + 1, "
                "topic_id = coalesce(EXCLUDED.topic_id, spool_logs.topic_id), "
                "leader_node = EXCLUDED.leader_node "
                "RETURNING log_id, leader_epoch",
                name,
                topic_id,
                None if name == "meta" else self.node_id,
            )
        log.info("log_claimed", log=name, epoch=row["leader_epoch"])
        return _Claim(int(row["log_id"]), int(row["leader_epoch"]))

    async def _register(self, name: str) -> _Claim:
        """A shared log's row, created if new; its epoch is never bumped (no one claims
        it: `PgSharedLog` commits by expected end offset instead)."""
        async with self._pool.acquire() as conn:
            await conn.execute(
                "INSERT INTO spool_logs (name) VALUES ($1) ON CONFLICT (name) DO NOTHING", name
            )
            row = await conn.fetchrow(
                "SELECT log_id, leader_epoch FROM spool_logs WHERE name = $1", name
            )
        return _Claim(int(row["log_id"]), int(row["leader_epoch"]))

    async def _drop(self, name: str, topic_id: str | None = None) -> None:
        async with self._pool.acquire() as conn:
            if topic_id is None:
                await conn.execute("DELETE FROM spool_logs WHERE name = $1", name)
            else:
                await conn.execute(
                    "DELETE FROM spool_logs WHERE name = $1 "
                    "AND (topic_id IS NULL OR topic_id = $2)",
                    name,
                    topic_id,
                )
        log.info("log_dropped", log=name)

    # -- restore -------------------------------------------------------------------

    async def _restore(self, data_dir: Path) -> None:
        async with self._pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT log_id, name, log_start_offset, next_offset, topic_id "
                "FROM spool_logs ORDER BY name"
            )
        known = {row["name"] for row in rows}
        for name in COORDINATOR_LOGS:
            directory = data_dir / name
            if name not in known and _holds_data(directory):
                raise OSError(
                    f"{directory} holds a {name} log the storage database "
                    f"{mask_password(self.url)} does not know: it is a data dir of another "
                    "storage; start with an empty data dir, or copy it into the database "
                    "first"
                )
        restored = 0
        for row in rows:
            name = row["name"]
            if not _safe_name(name):
                log.warning("storage_log_name_skipped", log=name)
                continue
            if await self._restore_log(
                data_dir / name,
                name,
                int(row["log_id"]),
                int(row["log_start_offset"]),
                int(row["next_offset"]),
                row["topic_id"],
            ):
                restored += 1
        log.info("storage_restored", logs=len(rows), repaired=restored)

    async def _restore_log(
        self, directory: Path, name: str, log_id: int, start: int, end: int, topic_id: str | None
    ) -> bool:
        """Bring `directory`'s log in line with the database's copy; whether it changed."""
        config = internal_log_config() if name in COORDINATOR_LOGS else LogConfig()
        # What is restored was accepted under the topic's own max.message.bytes, which
        # may be above the default: replaying it checks framing, never that limit.
        config = dataclasses.replace(config, max_message_bytes=_NO_BATCH_LIMIT)
        now = SYSTEM_CLOCK.now_ms()
        local_id = read_topic_id(directory)
        if topic_id is not None and local_id is not None and local_id != topic_id:
            # The data dir's log is of another topic of that name: not this one's cache.
            shutil.rmtree(directory)
        plog = PartitionLog.open(directory, config, now)
        if topic_id is not None:
            _write_topic_id(directory, topic_id)
        changed = False
        try:
            if plog.log_end_offset > end:
                if end >= plog.log_start_offset:
                    plog.truncate_to(end)
                else:
                    plog = self._rebuild(plog, directory, config, start)
                changed = True
            if not await self._tail_matches(plog, log_id, name):
                # Not this database's log (a data dir reused with another database).
                log.warning("log_cache_discarded", log=name, reason="differs from storage")
                plog = self._rebuild(plog, directory, config, start)
                changed = True
            if plog.log_end_offset < start:
                # Everything the data dir holds is below the log start (or it holds
                # nothing): start at the log start, which may be the end (no rows).
                plog = self._rebuild(plog, directory, config, start)
                changed = True
            if plog.log_end_offset == end and plog.log_start_offset >= start:
                return changed
            first_restored: int | None = None
            fetched = self._rows(log_id, plog.log_end_offset)
            async for base, last, data in fetched:
                local_end = plog.log_end_offset
                if last < local_end:
                    continue
                if base < local_end:
                    # The data dir holds part of this append: take it whole.
                    if base >= plog.log_start_offset:
                        plog.truncate_to(base)
                    else:
                        plog = self._rebuild(plog, directory, config, base)
                elif base > local_end and local_end < start:
                    # A gap below the log start (the database dropped rows the data dir
                    # never had). Above it a gap is the log's own (a compacted log copied
                    # by `spool migrate`): append_raw keeps it.
                    plog = self._rebuild(plog, directory, config, base)
                plog.append_raw(bytearray(data), now)
                if first_restored is None:
                    first_restored = base
                changed = True
            if plog.log_end_offset < end:
                raise OSError(
                    f"the storage database's copy of {name} ends at offset "
                    f"{plog.log_end_offset}, below its recorded end {end}"
                )
            if start > plog.log_start_offset:
                plog.delete_records_before(min(start, plog.log_end_offset))
                changed = True
            if first_restored is not None:
                # Index the aborted transactions of what came back, and snapshot the
                # producer state at the clean close below.
                plog.rebuild_txn_index_from(first_restored)
                plog.load_producer_state(ProducerStateManager())
        finally:
            plog.close(clean=True)
        if changed:
            log.warning(
                "log_restored_from_storage",
                log=name,
                log_start_offset=start,
                log_end_offset=end,
            )
        return changed

    async def _tail_matches(self, plog: PartitionLog, log_id: int, name: str) -> bool:
        """Whether the data dir's last batches are the database's (the bytes of the
        last row below the local log end), where they can be compared: not in a
        closed segment of a coordinator log, which compaction may have rewritten."""
        local_end = plog.log_end_offset
        if local_end == plog.log_start_offset:
            return True
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(
                "SELECT base_offset, last_offset, data FROM spool_batches "
                "WHERE log_id = $1 AND base_offset < $2 ORDER BY base_offset DESC LIMIT 1",
                log_id,
                local_end,
            )
        if row is None:
            return True
        base, last, data = int(row["base_offset"]), int(row["last_offset"]), bytes(row["data"])
        if last >= local_end or base < plog.log_start_offset:
            return True  # the data dir holds part of it: the restore takes it whole
        if name in COORDINATOR_LOGS and base < plog.segment_base_offsets[-1]:
            return True
        return plog.read(base, len(data), max_offset=last + 1)[: len(data)] == data

    def _rebuild(
        self, plog: PartitionLog, directory: Path, config: LogConfig, first: int
    ) -> PartitionLog:
        """Empty `directory`'s log and start it at offset `first`."""
        plog.close(clean=False)
        marker = directory / _TOPIC_ID_MARKER
        kept = marker.read_bytes() if marker.exists() else None
        shutil.rmtree(directory)
        directory.mkdir(parents=True)
        if kept is not None:
            # The topic id marker (broker.partitions.LogManager writes it).
            marker.write_bytes(kept)
        _write_checkpoint(directory / LOG_START_OFFSET_CHECKPOINT, first)
        return PartitionLog.open(directory, config, SYSTEM_CLOCK.now_ms())

    async def _rows(self, log_id: int, from_offset: int) -> AsyncIterator[tuple[int, int, bytes]]:
        """(base, last, data) of the rows holding offsets from `from_offset` on, in order,
        a few at a time."""
        after = from_offset
        first = True
        while True:
            async with self._pool.acquire() as conn:
                if first:
                    rows = await conn.fetch(
                        "SELECT base_offset, last_offset, data FROM spool_batches "
                        "WHERE log_id = $1 AND last_offset >= $2 "
                        "ORDER BY base_offset LIMIT $3",
                        log_id,
                        after,
                        _RESTORE_ROWS,
                    )
                else:
                    rows = await conn.fetch(
                        "SELECT base_offset, last_offset, data FROM spool_batches "
                        "WHERE log_id = $1 AND base_offset > $2 "
                        "ORDER BY base_offset LIMIT $3",
                        log_id,
                        after,
                        _RESTORE_ROWS,
                    )
            first = False
            if not rows:
                return
            for row in rows:
                yield int(row["base_offset"]), int(row["last_offset"]), bytes(row["data"])
            after = int(rows[-1]["base_offset"])


_TOPIC_ID_MARKER = "partition.metadata"


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


async def _checked_claim(
    name: str, pending: asyncio.Future[ClaimedLog | None], start: int, end: int
) -> _Claim:
    """The claim leadership made as `name` opened (PgStorage.claim_on_open), or Fenced
    (epoch 0: no claim of this log's is current) when it was refused or failed (the log
    is never claimed unconditionally instead), or when the database holds other offsets
    than the local copy ([start, end)): the log is restored before it is served."""
    try:
        claimed = await asyncio.shield(pending)
    except Exception as exc:
        log.warning("log_claim_failed", log=name, error=str(exc))
        raise Fenced(name, 0) from exc
    if claimed is None:
        raise Fenced(name, 0)
    if (claimed.log_start_offset, claimed.next_offset) != (start, end):
        log.info(
            "log_claimed_stale",
            log=name,
            database=[claimed.log_start_offset, claimed.next_offset],
            local=[start, end],
        )
        raise Fenced(name, claimed.epoch)
    return _Claim(claimed.log_id, claimed.epoch)


async def _refuse_unfinished_migration(conn: Any, url: str) -> None:
    """Raise OSError if `spool migrate` (persister.pg_migrate) is copying into the
    database, or was interrupted: its `spool_migration` row is unfinished until every log
    is in, and a broker must not serve (nor write) a partial copy."""
    if not await conn.fetchval("SELECT to_regclass('spool_migration') IS NOT NULL"):
        return
    source = await conn.fetchval(
        "SELECT source FROM spool_migration WHERE id = 1 AND finished_at IS NULL"
    )
    if source is not None:
        raise OSError(
            f"the storage database {mask_password(url)} holds an unfinished `spool migrate` "
            f"of {source}: run that migrate again to finish it (it resumes)"
        )


async def _keep_alive(conn: Any) -> None:
    """Set TCP keepalives and a user timeout on a new connection's socket (asyncpg has
    no setting for them); a connection not over TCP (a Unix socket) is left as it is."""
    transport = getattr(conn, "_transport", None)
    sock = None if transport is None else transport.get_extra_info("socket")
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    options = [
        (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPIDLE", None), KEEPALIVE_IDLE_S),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPINTVL", None), KEEPALIVE_INTERVAL_S),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPCNT", None), KEEPALIVE_COUNT),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_USER_TIMEOUT", None), TCP_USER_TIMEOUT_MS),
    ]
    for level, option, value in options:
        if option is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(level, option, value)


def read_topic_id(directory: Path) -> str | None:
    """The topic id in a partition directory's `partition.metadata` (Kafka's marker,
    which LogManager writes before opening the log), or None."""
    try:
        text = (Path(directory) / _TOPIC_ID_MARKER).read_text()
    except (FileNotFoundError, NotADirectoryError):
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "topic_id":
            return value.strip()
    return None


def _write_topic_id(directory: Path, topic_id: str) -> None:
    marker = directory / _TOPIC_ID_MARKER
    if not marker.exists():
        tmp = marker.with_suffix(".tmp")
        tmp.write_text(f"version: 0\ntopic_id: {topic_id}\n")
        os.replace(tmp, marker)


def _holds_data(directory: Path) -> bool:
    try:
        return any(
            entry.name.endswith(LOG_SUFFIX) and entry.stat().st_size > 0
            for entry in os.scandir(directory)
        )
    except FileNotFoundError:
        return False


def _safe_name(name: str) -> bool:
    parts = name.split("/")
    return all(part not in ("", ".", "..") for part in parts)
