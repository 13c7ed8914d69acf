"""`spool migrate`: copy a stopped file broker's data directory into an empty PostgreSQL
database, so `spool serve --storage postgresql://... --data-dir <empty dir>` serves the
same state (persister.pg_storage restores the data dir from the database at start).

What is copied: every log of the data dir, as the storage engine keys them
(`meta`, `groups`, `share-state`, `transactions`, `topics/<topic>-<partition>`), each
with its record batches as they are on disk: same offsets, gaps left by compaction
kept, the log start offset, and a partition's topic id (its `partition.metadata`). The
cluster metadata (topics, configs, SCRAM credentials, ACLs, producer ids), groups,
share state and transactions are records of the coordinator logs, so they come along
byte for byte. Directories of deleted topics (`-delete`) and stray files are not logs
and stay behind; checkpoints are not copied (the broker replays the logs instead).

How (`Migration`):

1. Lock the data dir as a broker does (persister.dirlock): a running broker's dir is
   refused. Each log is opened as the broker opens it (a crash's torn tail is cut, an
   interrupted compaction finished) and closed cleanly; nothing else in it changes.
2. Plan, in one transaction, under an advisory lock (one migrate per database at a
   time): the database must hold no spool log; the `spool_logs` rows of every log are
   created with their final offsets (`next_offset` = the log end) and epoch 0, and a
   `spool_migration` row records the source and that the copy is unfinished.
3. Copy: each log's batches are read a chunk at a time (`rows_of`) and sent with COPY,
   in transactions of about `TXN_BYTES`, so memory stays bounded whatever the size of
   the data dir. Progress is printed every few seconds.
4. Finish: one transaction marks the `spool_migration` row finished.

A broker started on the database before the copy finished refuses to start: the
engine finds the `spool_migration` row unfinished (and its restore would find a log
whose rows end below its recorded end). The plan takes the schema migrations' advisory
lock, so a broker starting during the plan waits for it and then refuses; one that got
past its check just before the plan began could still claim the copied logs (its claim
waits for the plan), and the copy then fails on its rows: do not start a broker on the
database until migrate has finished. A migrate that was interrupted (killed, connection lost) is
resumed by running it again with the same arguments: each log goes on after its last
copied row, once the data dir is checked unchanged (same logs, same offsets, and its
bytes of that last row equal the database's). If the data dir changed meanwhile (a
broker ran on it), `--restart` drops the unfinished copy (only while no broker has
claimed any of its logs) and copies again. A database that holds spool logs of anything
else (a broker's, or a finished migrate's) is refused: migrate only fills empty
databases and never deletes a broker's data.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from persister.clock import SYSTEM_CLOCK
from persister.coordinator_log import internal_log_config
from persister.dirlock import DataDirLock
from persister.file_log import LogConfig, PartitionLog
from persister.pg_schema import MIGRATION_LOCK
from persister.pg_schema import migrate as migrate_schema
from persister.pg_storage import COORDINATOR_LOGS, read_topic_id
from persister.pg_url import mask_password
from protocol.records import NO_TIMESTAMP, parse_header

# Bytes read from a log per call, and bytes of batches per database transaction.
CHUNK_BYTES = 1 << 20
TXN_BYTES = 16 << 20
# Small batches are stored several to a row, up to this many bytes (one row per append,
# as the engine writes them, would cost a row per tiny coordinator batch).
ROW_BYTES = 64 << 10
PROGRESS_INTERVAL_S = 2.0
# pg_try_advisory_lock key: one migrate per database at a time ("spool" + 2).
MIGRATE_LOCK = 0x73706F6F6C02
_PARTITION_DIR = re.compile(r"^(.+)-(\d+)$")

MIGRATION_TABLE = """
CREATE TABLE IF NOT EXISTS spool_migration (
    id integer PRIMARY KEY CHECK (id = 1),
    source text NOT NULL,
    started_at timestamptz NOT NULL DEFAULT now(),
    finished_at timestamptz
)
"""


class MigrateError(Exception):
    """Why the migrate cannot go on: printed as it is, exit 1."""


@dataclass(frozen=True, slots=True)
class SourceLog:
    """One log of the data dir: its engine name, directory and topic id (partitions)."""

    name: str
    directory: Path
    topic_id: str | None

    @property
    def coordinator(self) -> bool:
        return self.name in COORDINATOR_LOGS

    def config(self) -> LogConfig:
        return internal_log_config() if self.coordinator else LogConfig()


@dataclass(frozen=True, slots=True)
class Row:
    """One `spool_batches` row: whole batches, their first and last offsets."""

    base_offset: int
    last_offset: int
    max_timestamp: int
    data: bytes
    batches: int = 1


@dataclass(slots=True)
class Totals:
    logs: int = 0
    rows: int = 0
    batches: int = 0
    bytes: int = 0
    transactions: int = 0


def source_logs(data_dir: Path) -> list[SourceLog]:
    """The logs of a broker's data dir, named as persister.pg_storage names them, in
    name order; raises MigrateError if it is not a spool data dir."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise MigrateError(f"{data_dir} is not a directory")
    if not (data_dir / "meta").is_dir():
        raise MigrateError(
            f"{data_dir} holds no metadata log (meta/): not the data dir of a spool broker"
        )
    found = [
        SourceLog(name, data_dir / name, None)
        for name in COORDINATOR_LOGS
        if (data_dir / name).is_dir()
    ]
    topics = data_dir / "topics"
    if topics.is_dir():
        for entry in sorted(os.listdir(topics)):
            path = topics / entry
            if entry.endswith("-delete") or not _PARTITION_DIR.match(entry) or not path.is_dir():
                continue
            found.append(SourceLog(f"topics/{entry}", path, read_topic_id(path)))
    return sorted(found, key=lambda s: s.name)


def rows_of(
    read: Callable[[int, int], bytes],
    start: int,
    end: int,
    *,
    chunk_bytes: int = CHUNK_BYTES,
    row_bytes: int = ROW_BYTES,
) -> Iterator[Row]:
    """The batches of a log holding offsets in [start, end), as rows, in order.

    `read(offset, max_bytes)` returns whole batches from the one holding `offset` (or the
    first one after it, across a gap), at least one (PartitionLog.read). Small batches
    are grouped into rows of up to `row_bytes`; gaps between batches are kept as they
    are (the next batch keeps its own base offset)."""
    offset = start
    parts: list[bytes] = []
    size = count = 0
    first = last = 0
    max_ts = NO_TIMESTAMP
    while offset < end:
        data = read(offset, chunk_bytes)
        if not data:
            raise MigrateError(f"no record batch at offset {offset}, below the log end {end}")
        view = memoryview(data)
        pos = 0
        while pos < len(data):
            header = parse_header(data, pos)
            if pos + header.size > len(data):
                raise MigrateError(
                    f"record batch at offset {header.base_offset} is cut short "
                    f"({len(data) - pos} of {header.size} bytes)"
                )
            if header.last_offset >= end:
                break  # written after the plan: not part of this copy
            if not parts:
                first = header.base_offset
                max_ts = NO_TIMESTAMP
            parts.append(bytes(view[pos : pos + header.size]))
            count += 1
            size += header.size
            last = header.last_offset
            max_ts = max(max_ts, header.max_timestamp)
            if size >= row_bytes:
                yield Row(first, last, max_ts, b"".join(parts), count)
                parts, size, count = [], 0, 0
            pos += header.size
            offset = header.next_offset
        else:
            continue
        break
    if parts:
        yield Row(first, last, max_ts, b"".join(parts), count)


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"


@dataclass(slots=True)
class _Planned:
    source: SourceLog
    log_start_offset: int
    log_end_offset: int
    size_bytes: int
    log_id: int = 0
    resume_from: int = 0


@dataclass
class Migration:
    """One `spool migrate` run; see the module docstring. `out` gets the progress lines
    and the summary; the password (URL, `password`, or PGPASSWORD) is never printed."""

    data_dir: Path
    url: str
    password: str | None = None
    restart: bool = False
    out: TextIO | None = None
    progress: bool = True
    txn_bytes: int = TXN_BYTES
    row_bytes: int = ROW_BYTES
    totals: Totals = field(default_factory=Totals)

    def say(self, text: str) -> None:
        if self.out is not None:
            print(text, file=self.out, flush=True)

    async def run(self) -> Totals:
        lock = DataDirLock(Path(self.data_dir))
        if not Path(self.data_dir).is_dir():
            raise MigrateError(f"{self.data_dir} is not a directory")
        lock.acquire()  # DataDirInUse (an OSError) if a broker runs on it
        try:
            sources = source_logs(self.data_dir)
            planned = [await asyncio.to_thread(_measure, s) for s in sources]
            try:
                return await self._copy_all(planned)
            except MigrateError:
                raise
            except Exception as exc:  # the server refused, or went away (OSError)
                raise MigrateError(
                    f"copy into {mask_password(self.url)} failed: {exc}; what was committed "
                    "stays, and running the same migrate again resumes"
                ) from exc
        finally:
            lock.release()

    async def _connect(self) -> Any:
        import asyncpg

        try:
            return await asyncpg.connect(self.url, password=self.password, timeout=10.0)
        except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
            raise MigrateError(
                f"cannot reach the database {mask_password(self.url)}: {exc}"
            ) from exc

    async def _copy_all(self, planned: list[_Planned]) -> Totals:
        started = time.monotonic()
        conn = await self._connect()
        try:
            await migrate_schema(conn)
            if not await conn.fetchval("SELECT pg_try_advisory_lock($1)", MIGRATE_LOCK):
                raise MigrateError(
                    f"another spool migrate is copying into {mask_password(self.url)}"
                )
            resumed = await self._plan(conn, planned)
            total = sum(p.size_bytes for p in planned)
            if self.progress:
                self.say(
                    f"{'resuming' if resumed else 'migrating'} {len(planned)} logs "
                    f"({_human(total)}) from {self.data_dir} to {mask_password(self.url)}"
                )
            await self._copy(conn, planned, total)
            async with conn.transaction():
                await self._check_copied(conn)
                await conn.execute("UPDATE spool_migration SET finished_at = now() WHERE id = 1")
        finally:
            await conn.close()
        seconds = time.monotonic() - started
        t = self.totals
        t.logs = len(planned)
        rate = t.bytes / (1 << 20) / seconds if seconds > 0 else 0.0
        self.say(
            f"migrated {t.logs} logs: {t.batches} batches in {t.rows} rows, "
            f"{_human(t.bytes)}, {t.transactions} transactions, {seconds:.1f} s "
            f"({rate:.1f} MB/s)"
        )
        return t

    # -- plan -------------------------------------------------------------------------

    async def _plan(self, conn: Any, planned: list[_Planned]) -> bool:
        """Create the log rows, or check an unfinished migrate's; whether it resumes."""
        async with conn.transaction():
            # The schema migrations' lock: a broker starting now waits for the plan in
            # its own schema check, then finds the migrate unfinished and refuses.
            await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK)
            await conn.execute(MIGRATION_TABLE)
            await conn.execute("LOCK TABLE spool_logs IN EXCLUSIVE MODE")
            migration = await conn.fetchrow(
                "SELECT source, finished_at FROM spool_migration WHERE id = 1"
            )
            rows = await conn.fetch(
                "SELECT log_id, name, leader_epoch, log_start_offset, next_offset, topic_id "
                "FROM spool_logs ORDER BY name"
            )
            claimed = [r["name"] for r in rows if r["leader_epoch"] != 0]
            where = mask_password(self.url)
            if migration is not None and migration["finished_at"] is not None:
                raise MigrateError(
                    f"{where} already holds a finished migrate (from {migration['source']}): "
                    "migrate copies into an empty database only"
                )
            if rows and migration is None:
                raise MigrateError(
                    f"{where} already holds {len(rows)} spool logs (e.g. {rows[0]['name']}): "
                    "migrate copies into an empty database only; give it a new database"
                )
            if migration is not None and claimed:
                raise MigrateError(
                    f"{where} holds an unfinished migrate (from {migration['source']}) that a "
                    f"broker has used since (it claimed {claimed[0]}): not touching it; give "
                    "migrate a new database"
                )
            if migration is not None and self.restart:
                await conn.execute("DELETE FROM spool_logs")
                await conn.execute("DELETE FROM spool_migration")
                self.say(f"dropped the unfinished migrate from {migration['source']}")
                migration, rows = None, []
            if migration is None:
                await conn.execute(
                    "INSERT INTO spool_migration (id, source) VALUES (1, $1)",
                    str(Path(self.data_dir).resolve()),
                )
                ids = await conn.fetch(
                    "INSERT INTO spool_logs "
                    "(name, leader_epoch, log_start_offset, next_offset, topic_id) "
                    "SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[], "
                    "$4::bigint[], $5::text[]) RETURNING log_id, name",
                    [p.source.name for p in planned],
                    [0] * len(planned),
                    [p.log_start_offset for p in planned],
                    [p.log_end_offset for p in planned],
                    [p.source.topic_id for p in planned],
                )
                by_name = {r["name"]: int(r["log_id"]) for r in ids}
                for p in planned:
                    p.log_id = by_name[p.source.name]
                    p.resume_from = p.log_start_offset
                return False
            await self._check_resume(conn, planned, rows, str(migration["source"]))
            return True

    async def _check_resume(
        self, conn: Any, planned: list[_Planned], rows: list[Any], source: str
    ) -> None:
        def changed(why: str) -> MigrateError:
            return MigrateError(
                f"{mask_password(self.url)} holds an unfinished migrate from {source}, and "
                f"the data dir is not what it copied ({why}): run again with --restart to "
                "drop that copy and start over"
            )

        by_name = {r["name"]: r for r in rows}
        names = {p.source.name for p in planned}
        if set(by_name) != names:
            extra = sorted(set(by_name) ^ names)
            raise changed(f"the logs differ: {', '.join(extra[:3])}")
        for p in planned:
            row = by_name[p.source.name]
            if (
                int(row["log_start_offset"]) != p.log_start_offset
                or int(row["next_offset"]) != p.log_end_offset
                or row["topic_id"] != p.source.topic_id
            ):
                raise changed(
                    f"{p.source.name} was offsets [{row['log_start_offset']}, "
                    f"{row['next_offset']}), now [{p.log_start_offset}, {p.log_end_offset})"
                )
            p.log_id = int(row["log_id"])
            tail = await conn.fetchrow(
                "SELECT base_offset, last_offset, data FROM spool_batches WHERE log_id = $1 "
                "ORDER BY base_offset DESC LIMIT 1",
                p.log_id,
            )
            if tail is None:
                p.resume_from = p.log_start_offset
                continue
            base, data = int(tail["base_offset"]), bytes(tail["data"])
            same = await asyncio.to_thread(_holds, p.source, base, data)
            if not same:
                raise changed(f"{p.source.name}'s batches at offset {base} differ")
            p.resume_from = int(tail["last_offset"]) + 1

    async def _check_copied(self, conn: Any) -> None:
        """Before the copy is marked finished: every log's last row ends where the log
        does (a log without rows is empty: its start is its end), as the broker's restore
        requires (persister.pg_storage)."""
        wrong = await conn.fetch(
            "SELECT l.name, l.log_start_offset, l.next_offset, t.last_offset "
            "FROM spool_logs l LEFT JOIN LATERAL (SELECT b.last_offset FROM spool_batches b "
            "WHERE b.log_id = l.log_id ORDER BY b.base_offset DESC LIMIT 1) t ON true "
            "WHERE coalesce(t.last_offset + 1, l.log_start_offset) <> l.next_offset"
        )
        if wrong:
            row = wrong[0]
            ends = row["log_start_offset"] if row["last_offset"] is None else row["last_offset"] + 1
            raise MigrateError(
                f"the copy of {row['name']} ends at offset {ends}, its log at "
                f"{row['next_offset']}, and a broker could not restore it: did the data dir "
                "change during the copy? Run again with --restart"
            )

    # -- copy -------------------------------------------------------------------------

    async def _send(self, conn: Any, rows: list[tuple[int, int, int, int, bytes]]) -> None:
        """One transaction: COPY `rows` (log_id, base, last, max timestamp, data)."""
        await _send_rows(conn, rows)
        self.totals.transactions += 1

    async def _copy(self, conn: Any, planned: list[_Planned], total: int) -> None:
        pending: list[tuple[int, int, int, int, bytes]] = []
        pending_bytes = 0
        last_report = time.monotonic()
        started = last_report
        # One transaction in flight while the next one's rows are read (memory: two
        # transactions' worth at most).
        inflight: asyncio.Task[None] | None = None

        async def send() -> None:
            nonlocal pending, pending_bytes, inflight
            if inflight is not None:
                task, inflight = inflight, None
                await task
            if pending:
                rows, pending, pending_bytes = pending, [], 0
                inflight = asyncio.create_task(self._send(conn, rows))

        try:
            for p in planned:
                if p.resume_from >= p.log_end_offset:
                    continue
                plog = await asyncio.to_thread(
                    PartitionLog.open, p.source.directory, p.source.config(), SYSTEM_CLOCK.now_ms()
                )
                try:
                    start = max(p.resume_from, plog.log_start_offset)
                    rows = rows_of(plog.read, start, p.log_end_offset, row_bytes=self.row_bytes)
                    while True:
                        row = await asyncio.to_thread(next, rows, None)
                        if row is None:
                            break
                        pending.append(
                            (
                                p.log_id,
                                row.base_offset,
                                row.last_offset,
                                row.max_timestamp,
                                row.data,
                            )
                        )
                        pending_bytes += len(row.data)
                        self.totals.rows += 1
                        self.totals.batches += row.batches
                        self.totals.bytes += len(row.data)
                        if pending_bytes >= self.txn_bytes:
                            await send()
                        now = time.monotonic()
                        if self.progress and now - last_report >= PROGRESS_INTERVAL_S:
                            last_report = now
                            rate = self.totals.bytes / (1 << 20) / (now - started)
                            self.say(
                                f"  {_human(self.totals.bytes)} of {_human(total)} copied "
                                f"({rate:.1f} MB/s), at {p.source.name} offset {row.last_offset}"
                            )
                finally:
                    plog.close(clean=True)
            await send()
            await send()  # the last one's outcome
        finally:
            if inflight is not None:
                inflight.cancel()
                with contextlib.suppress(BaseException):
                    await inflight


async def _send_rows(conn: Any, rows: list[tuple[int, int, int, int, bytes]]) -> None:
    async with conn.transaction():
        await conn.copy_records_to_table(
            "spool_batches",
            records=rows,
            columns=["log_id", "base_offset", "last_offset", "max_timestamp", "data"],
        )


def _measure(source: SourceLog) -> _Planned:
    plog = PartitionLog.open(source.directory, source.config(), SYSTEM_CLOCK.now_ms())
    try:
        return _Planned(source, plog.log_start_offset, plog.log_end_offset, plog.size_bytes)
    finally:
        plog.close(clean=True)


def _holds(source: SourceLog, base: int, data: bytes) -> bool:
    """Whether the log at `source` holds exactly `data` from offset `base` on."""
    plog = PartitionLog.open(source.directory, source.config(), SYSTEM_CLOCK.now_ms())
    try:
        if base < plog.log_start_offset:
            return False
        return plog.read(base, len(data))[: len(data)] == data
    except Exception:
        return False
    finally:
        plog.close(clean=True)
