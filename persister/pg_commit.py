"""Group commit to PostgreSQL: the writes of many logs in one transaction, one round trip.

`PgCommitter.commit(write)` hands over what one log wrote since its last commit (a
`LogWrite`: new batches, a truncation to undo, a moved log start) and returns once it
is committed. The writes that arrive while a commit is in flight wait and go together in
the next one, as `persister.commit.GroupCommit` shares one fsync among the writers of a
log; here one transaction serves every log. The transaction is a single call of
`spool_commit` (persister.pg_schema), sent outside an explicit transaction block, so it
costs one round trip and one WAL flush on the server; a transaction of one log that only
appends calls the lighter `spool_append` instead.

Light writes (at most LIGHT_WRITE_BYTES of batches each: a record produced with linger 0,
a share-state or group write) do not wait: they go in a transaction of their own beside
the ones in flight, up to MAX_IN_FLIGHT at once, so a delivery's commit never queues
behind another log's (the server flushes the WAL of concurrent commits together). Heavy
writes (a producer's linger-sized batches) keep waiting and batching, so a busy broker
still commits many logs' batches per transaction. A log never has two commits in flight
(GroupCommit runs one round per log at a time; a write of a log in flight would wait),
so each log's commits apply in order. During an outage one transaction runs at a time.

Failures surface as a failed fsync does: StorageUnavailable (an OSError, EIO,
"... postgresql: <reason>"),
for every write of the failed transaction (none of it is committed, unless the
connection broke during the commit itself, when it may be: the next commit of that log
sends those batches again and they replace the stored ones, so a retry never collides
nor leaves two copies). A
write whose log has a newer epoch in the database than the writer's is refused with
`Fenced` (an OSError too, so a caller that knows only fsync failures still fails safe).
A write of a shared log (one every broker of the database appends to: the cluster
metadata) states where the log must end instead of an epoch, and is refused with
`LogConflict` when another broker appended first; the other logs of that transaction
are committed all the same.

Connections come from an asyncpg pool on the broker's event loop. A connection that
failed is closed (`terminate`), so the pool opens a new one on the next acquire, and a
commit that failed because its connection was dead (the database restarted since) is
sent once more on a new one: a database restart heals without restarting the broker,
and one that is over before the next commit is not seen at all.

Outages: the first failed commit starts one (`unavailable` holds its reason; logged
once, as `storage_unavailable`, and `storage_available` with its length and the commits
it failed once it ends; `on_status` is told both). During it, commits fail at once with
that reason (no connection attempt: the clients get their retriable error promptly and
the database is not hammered), except one attempt per backoff interval, which goes
through for real (a half-open circuit); the interval starts at BACKOFF_INITIAL_S and
doubles up to BACKOFF_MAX_S, as Kafka's reconnect.backoff.ms / reconnect.backoff.max.ms.
A probe task (`SELECT 1` on the same schedule) ends an outage of a lost or refused
connection without waiting for a client, so `/health` turns back to serving on its own;
an outage of refused writes (disk full, read-only) is probed with a write of nothing,
and ends with it or with the first commit that goes through. An unreachable database
(packets dropped: no error, no answer) is noticed by COMMIT_TIMEOUT_S: the commit's
connection is closed and the outage begins; the pool's connections also probe with TCP
keepalives and a TCP user timeout (persister.pg_storage), so idle ones die too. The
batches of failed commits stay pending in their logs (see pg_storage), so nothing is
lost by failing fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from persister.storage import Fenced, LogConflict, StorageUnavailable

log = structlog.get_logger(__name__)

# How long one commit may take (acquire included) before it counts as failed: the
# connection is then closed and the outage begins (backoff, probe, /health). A database
# whose packets are dropped answers nothing, and no TCP error comes for minutes, so this
# is what notices it: well within a client's request.timeout.ms (30 s), as Kafka bounds
# a coordinator's write by share.coordinator.write.timeout.ms / offsets.commit.timeout.ms
# (5000). A commit on a healthy database takes milliseconds; a large one (the backlog
# after an outage) gets COMMIT_BYTES_PER_S more time per byte it sends.
COMMIT_TIMEOUT_S = 5.0
COMMIT_BYTES_PER_S = 8 * 1024 * 1024
# Between attempts during an outage (Kafka's reconnect.backoff.ms and
# reconnect.backoff.max.ms defaults are 50 ms and 1 s).
BACKOFF_INITIAL_S = 0.05
BACKOFF_MAX_S = 1.0
# How long a probe of the database may take.
PROBE_TIMEOUT_S = 5.0
# The probe of an outage of refused writes (read-only, disk full): a write, of nothing
# (a committed update of the one row of the schema version, to itself).
_WRITE_PROBE_SQL = "UPDATE spool_schema_version SET version = version"
# Transactions in flight at once (each on its own connection of the pool), and the
# batch bytes under which a write is light enough to start one beside those in flight.
MAX_IN_FLIGHT = 3
LIGHT_WRITE_BYTES = 16 * 1024

_COMMIT_SQL = "SELECT spool_commit($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"
# One owned log appending (most commits): schema v6's lighter function.
_APPEND_SQL = "SELECT spool_append($1, $2, $3, $4, $5, $6, $7)"


def storage_error(exc: BaseException) -> StorageUnavailable:
    """What a failed PostgreSQL call becomes: an I/O error, as a failed fsync is, but one
    the next commit retries (the batches stay pending)."""
    reason = str(exc) or type(exc).__name__
    return StorageUnavailable(errno.EIO, f"commit to postgresql failed: {reason}")


@dataclass(slots=True)
class Batch:
    """Record batches of one append, as written to the log: bytes and offsets."""

    base_offset: int
    last_offset: int
    max_timestamp: int
    data: bytes


@dataclass(slots=True)
class LogWrite:
    """What one log commits: rows to insert, where a truncation began (rows from there on
    are removed first), the log end offset, and the log start offset if it moved.

    `expect_end` is set for a shared log (persister.pg_storage's `PgSharedLog`): the
    offset the log must end at in the database for the write to go in, checked instead
    of the epoch; a mismatch is refused with `LogConflict`."""

    log_id: int
    epoch: int
    name: str
    batches: list[Batch] = field(default_factory=list)
    truncate_from: int | None = None
    next_offset: int = 0
    log_start_offset: int | None = None
    expect_end: int | None = None


@dataclass(slots=True)
class _Pending:
    write: LogWrite
    future: asyncio.Future[None]
    size: int = 0


# Told of each change of the storage's state: the outage's reason, or None once it ended.
StatusListener = Callable[[str | None], None]


class PgCommitter:
    """Commits in flight (one, or more for light writes), the next collecting; see the
    module docstring."""

    def __init__(
        self,
        pool: Any,
        *,
        timeout_s: float = COMMIT_TIMEOUT_S,
        backoff_initial_s: float = BACKOFF_INITIAL_S,
        backoff_max_s: float = BACKOFF_MAX_S,
        monotonic: Callable[[], float] = time.monotonic,
        max_in_flight: int = MAX_IN_FLIGHT,
        light_write_bytes: int = LIGHT_WRITE_BYTES,
    ) -> None:
        self._pool = pool
        self._timeout_s = timeout_s
        self._queue: list[_Pending] = []
        self._max_in_flight = max_in_flight
        self._light_write_bytes = light_write_bytes
        # The logs with a commit in flight, and the transactions in flight.
        self._busy: set[int] = set()
        self._in_flight = 0
        # A round task created that has not taken its writes yet (it takes what is
        # queued when it runs, so the writes of one turn of the loop share it).
        self._starting = False
        self._rounds: set[asyncio.Task[None]] = set()
        # Transactions run so far (tests check many writes share one).
        self.transactions = 0
        # Commits (transactions, or rounds failed fast) that failed, ever.
        self.failed_commits = 0
        # The current outage's reason, None while commits go through.
        self.unavailable: str | None = None
        self.on_status: StatusListener | None = None
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self._monotonic = monotonic
        self._backoff_s = backoff_initial_s
        self._retry_at = 0.0
        self._outage_since = 0.0
        # Outages begun so far (a commit ends the outage only if sent after it began).
        self._outages = 0
        self._outage_failures = 0
        # Whether the outage is of the connection (a probe can end it) or of writes.
        self._connection_outage = False
        self._probe: asyncio.Task[None] | None = None

    async def commit(self, write: LogWrite) -> None:
        """Return once `write` is committed; raise OSError (or `Fenced`) if it was not."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        size = sum(len(b.data) for b in write.batches)
        self._queue.append(_Pending(write, future, size))
        self._maybe_start()
        await future

    def _ready(self) -> list[_Pending]:
        """The queued writes a round started now would take: those of logs without a
        commit in flight; only the light ones while others are in flight, none during an
        outage (one attempt at a time) or with MAX_IN_FLIGHT in flight."""
        if self._in_flight == 0:
            return [p for p in self._queue if p.write.log_id not in self._busy]
        if self._in_flight >= self._max_in_flight or self.unavailable is not None:
            return []
        light = self._light_write_bytes
        return [p for p in self._queue if p.size <= light and p.write.log_id not in self._busy]

    def _maybe_start(self) -> None:
        if self._starting or not self._queue or not self._ready():
            return
        self._starting = True
        task = asyncio.get_running_loop().create_task(self._round())
        self._rounds.add(task)
        task.add_done_callback(self._rounds.discard)

    async def _round(self) -> None:
        self._starting = False
        pending = self._ready()
        if not pending:
            self._maybe_start()
            return
        taken = {id(p) for p in pending}
        self._queue = [p for p in self._queue if id(p) not in taken]
        logs = {p.write.log_id for p in pending}
        self._busy |= logs
        self._in_flight += 1
        try:
            await self._run(pending)
        finally:
            self._busy -= logs
            self._in_flight -= 1
            # _run settles every future; should it not have (cancelled as the broker
            # stops), its writers fail as a failed commit's do rather than wait forever.
            for item in pending:
                if not item.future.done():
                    item.future.set_exception(StorageUnavailable(errno.EIO, "commit not run"))
            self._maybe_start()

    async def _run(self, pending: list[_Pending]) -> None:
        # Several writes of one log in one round (a second flush while the first was
        # queued) merge: later rows follow, the lowest truncation wins, the last end wins.
        merged: dict[int, LogWrite] = {}
        for item in pending:
            w = item.write
            m = merged.get(w.log_id)
            if m is None:
                merged[w.log_id] = LogWrite(
                    w.log_id,
                    w.epoch,
                    w.name,
                    list(w.batches),
                    w.truncate_from,
                    w.next_offset,
                    w.log_start_offset,
                    w.expect_end,
                )
                continue
            if w.truncate_from is not None:
                m.batches = [b for b in m.batches if b.base_offset < w.truncate_from]
                m.truncate_from = (
                    w.truncate_from
                    if m.truncate_from is None
                    else min(m.truncate_from, w.truncate_from)
                )
            m.batches.extend(w.batches)
            m.next_offset = w.next_offset
            if w.log_start_offset is not None:
                m.log_start_offset = max(m.log_start_offset or 0, w.log_start_offset)
            m.epoch = w.epoch
        writes = list(merged.values())
        if self.unavailable is not None and self._monotonic() < self._retry_at:
            # Failing fast: the next real attempt is due at `_retry_at`.
            self._fail(pending, StorageUnavailable(errno.EIO, self.unavailable))
            return
        size = sum(len(b.data) for w in writes for b in w.batches)
        outages = self._outages
        try:
            # asyncio.timeout, not wait_for: no task of its own (3.11), so no loop turns
            # added to every commit.
            async with asyncio.timeout(self._timeout_s + size / COMMIT_BYTES_PER_S):
                fenced = await self._execute_retrying(writes)
        except Exception as exc:
            error = storage_error(exc)
            self._outage(error, connection=_connection_lost(exc) or isinstance(exc, TimeoutError))
            self._fail(pending, error)
            return
        if outages == self._outages:
            # Sent once the outage (if any) had begun: it is over. A commit sent before
            # it began (in flight beside the one that failed) does not end it.
            self._available()
        self.transactions += 1
        refused = set(fenced)
        for item in pending:
            if item.future.done():
                continue
            if item.write.log_id in refused and item.write.expect_end is not None:
                log.info("log_conflict", log=item.write.name, expected=item.write.expect_end)
                item.future.set_exception(LogConflict(item.write.name, item.write.expect_end))
            elif item.write.log_id in refused:
                log.warning("log_fenced", log=item.write.name, epoch=item.write.epoch)
                item.future.set_exception(Fenced(item.write.name, item.write.epoch))
            else:
                item.future.set_result(None)

    def _fail(self, pending: list[_Pending], error: StorageUnavailable) -> None:
        self.failed_commits += 1
        self._outage_failures += 1
        for item in pending:
            if not item.future.done():
                item.future.set_exception(error)

    # -- outages ---------------------------------------------------------------------

    def _outage(self, error: StorageUnavailable, *, connection: bool) -> None:
        """A real attempt failed: start an outage, or back off further in this one."""
        reason = f"storage unavailable: {error.strerror or error}"
        now = self._monotonic()
        if self.unavailable is None:
            log.error("storage_unavailable", reason=reason)
            self._outages += 1
            self._outage_since = now
            self._outage_failures = 0
            self._backoff_s = self._backoff_initial_s
            self._expire_connections()
        else:
            self._backoff_s = min(self._backoff_s * 2, self._backoff_max_s)
        changed = reason != self.unavailable
        self.unavailable = reason
        self._connection_outage = connection
        self._retry_at = now + self._backoff_s
        if changed and self.on_status is not None:
            self.on_status(reason)
        if self._probe is None:
            self._probe = asyncio.get_running_loop().create_task(self._probing())

    def _available(self) -> None:
        if self.unavailable is None:
            return
        log.warning(
            "storage_available",
            outage_s=round(self._monotonic() - self._outage_since, 3),
            failed_commits=self._outage_failures,
        )
        self.unavailable = None
        self._backoff_s = self._backoff_initial_s
        if self.on_status is not None:
            self.on_status(None)

    def _expire_connections(self) -> None:
        # The pool's idle connections are likely as dead as the one that failed.
        expire = getattr(self._pool, "expire_connections", None)
        if expire is not None:
            task = asyncio.get_running_loop().create_task(expire())
            task.add_done_callback(_quiet)

    async def _probing(self) -> None:
        """Try the database on the backoff schedule until the outage ends."""
        try:
            while self.unavailable is not None:
                await asyncio.sleep(max(0.0, self._retry_at - self._monotonic()))
                if self.unavailable is None:
                    return
                if self._monotonic() < self._retry_at:
                    continue  # a failed commit meanwhile moved the next attempt
                # An outage of refused writes is over once a write goes through: the
                # probe writes then (nothing), so /health recovers without a commit.
                writes = not self._connection_outage
                try:
                    async with asyncio.timeout(PROBE_TIMEOUT_S):
                        await self._ping(write=writes)
                except Exception as exc:
                    lost = _connection_lost(exc) or isinstance(exc, TimeoutError)
                    self._outage(storage_error(exc), connection=lost or not writes)
                    continue
                self._available()
        finally:
            self._probe = None

    async def _ping(self, *, write: bool = False) -> None:
        conn = await self._pool.acquire()
        try:
            await conn.fetchval(_WRITE_PROBE_SQL if write else "SELECT 1")
        except BaseException:
            await self._discard(conn)
            raise
        await self._pool.release(conn)

    async def _discard(self, conn: Any) -> None:
        """Drop `conn`, its state unknown (broken, or a statement left running), so the
        pool opens a fresh one. asyncpg refuses the terminate when the pool took it back
        already (it noticed the connection was lost): it is then closed anyway."""
        with contextlib.suppress(Exception):
            conn.terminate()
        with contextlib.suppress(Exception):
            await self._pool.release(conn)

    async def close(self) -> None:
        """Stop probing (the broker is stopping)."""
        probe = self._probe
        if probe is not None:
            probe.cancel()
            with contextlib.suppress(BaseException):
                await probe

    async def _execute_retrying(self, writes: list[LogWrite]) -> list[int]:
        """`_execute`, once more on a new connection if the first one was dead (the
        database restarted since it was opened). A commit can be sent twice: its rows
        replace the ones stored at their offsets and it sets the offsets outright."""
        try:
            return await self._execute(writes)
        except Exception as exc:
            if not _connection_lost(exc):
                raise
            if self.unavailable is None:  # during an outage, its start was logged
                log.warning("postgresql_connection_lost", error=str(exc) or type(exc).__name__)
        # The pool's other connections were opened before the restart too: the resend
        # gets a new one (and the error of a connection that failed mid-statement is not
        # mistaken for the reason of an outage).
        expire = getattr(self._pool, "expire_connections", None)
        if expire is not None:
            await expire()
        return await self._execute(writes)

    async def _execute(self, writes: list[LogWrite]) -> list[int]:
        if len(writes) == 1 and _appends_only(writes[0]):
            return await self._execute_append(writes[0])
        p_logs, p_epochs, p_truncate, p_next, p_start, p_expect = [], [], [], [], [], []
        b_logs, b_base, b_last, b_ts, b_data = [], [], [], [], []
        for w in writes:
            p_logs.append(w.log_id)
            p_epochs.append(w.epoch)
            # Only a truncation deletes rows first: the rows of a commit whose outcome
            # was unknown (the connection broke during it) are replaced by the resend's
            # (spool_commit, schema v2, sees its insert collide and makes room).
            p_truncate.append(w.truncate_from)
            p_next.append(w.next_offset)
            p_start.append(w.log_start_offset)
            p_expect.append(w.expect_end)
            for b in w.batches:
                b_logs.append(w.log_id)
                b_base.append(b.base_offset)
                b_last.append(b.last_offset)
                b_ts.append(b.max_timestamp)
                b_data.append(b.data)
        conn = await self._pool.acquire()
        try:
            fenced: list[int] = await conn.fetchval(
                _COMMIT_SQL,
                p_logs,
                p_epochs,
                p_truncate,
                p_next,
                p_start,
                p_expect,
                b_logs,
                b_base,
                b_last,
                b_ts,
                b_data,
            )
        except BaseException:
            await self._discard(conn)
            raise
        await self._pool.release(conn)
        return list(fenced or [])

    async def _execute_append(self, w: LogWrite) -> list[int]:
        """One owned log appending: `spool_append`, the same outcome as spool_commit's
        for it in less of the server's time; [its id] when fenced."""
        conn = await self._pool.acquire()
        try:
            owned = await conn.fetchval(
                _APPEND_SQL,
                w.log_id,
                w.epoch,
                w.next_offset,
                [b.base_offset for b in w.batches],
                [b.last_offset for b in w.batches],
                [b.max_timestamp for b in w.batches],
                [b.data for b in w.batches],
            )
        except BaseException:
            await self._discard(conn)
            raise
        await self._pool.release(conn)
        return [] if owned else [w.log_id]


def _appends_only(w: LogWrite) -> bool:
    """Whether `w` only appends to a log this broker owns (`spool_append`'s case)."""
    return w.truncate_from is None and w.log_start_offset is None and w.expect_end is None


def _quiet(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.debug("postgresql_expire_failed", error=str(task.exception()))


def _connection_lost(exc: BaseException) -> bool:
    """Whether `exc` says the connection is gone, rather than the server refusing."""
    import asyncpg

    return isinstance(
        exc,
        (
            OSError,
            ConnectionError,
            asyncpg.ConnectionDoesNotExistError,
            asyncpg.InterfaceError,
            asyncpg.exceptions.AdminShutdownError,
            asyncpg.exceptions.CannotConnectNowError,
        ),
    )
