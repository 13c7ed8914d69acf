"""The PostgreSQL storage engine against a real PostgreSQL 15 (persister.pg_storage):
schema migrations, one transaction for many logs' writes, fencing, restore of a data dir
from the database, and a database restart healing without reopening anything."""

from __future__ import annotations

import asyncio
import errno
import shutil
from pathlib import Path

import asyncpg
import pytest

from persister.commit import GroupCommit
from persister.file_log import LogConfig, PartitionLog
from persister.pg_schema import SCHEMA_VERSION, migrate
from persister.pg_storage import PgPartitionLog, PgStorage
from persister.pg_url import mask_password
from persister.storage import Fenced
from persister.txn_index import AbortedTxn
from protocol.records import NewRecord, build_batch, build_end_txn_marker_batch, iter_batches
from tests.integration.pg_helpers import pg_dsn, pg_server
from tests.postgres import PostgresServer

NOW = 1_700_000_000_000

__all__ = ["pg_dsn", "pg_server"]  # the fixtures, from pg_helpers


def batch(*values: bytes) -> bytearray:
    return bytearray(build_batch([NewRecord(key=None, value=v) for v in values]))


def values(plog: PartitionLog) -> list[bytes | None]:
    data = plog.read(plog.log_start_offset, 1 << 24)
    out: list[bytes | None] = []
    from protocol.records import decode_records

    for pos, header in iter_batches(data, validate=True):
        out += [r.value for r in decode_records(data, pos, header)]
    return out


async def open_topic(engine: PgStorage, data: Path, name: str) -> PgPartitionLog:
    plog = engine.open_topic_log(data / "topics" / name, LogConfig(), NOW)
    assert isinstance(plog, PgPartitionLog)
    await plog._claimed()
    return plog


async def start_with_topic(pg_dsn: str, data: Path) -> tuple[PgStorage, PgPartitionLog]:
    """An engine on the database started with the data dir `data`, topic t-0 open."""
    engine = PgStorage(pg_dsn)
    await engine.start(data)
    return engine, await open_topic(engine, data, "t-0")


async def test_migrations_are_idempotent_and_safe_when_two_brokers_start_at_once(
    pg_dsn: str,
) -> None:
    first, second = await asyncpg.connect(pg_dsn), await asyncpg.connect(pg_dsn)
    try:
        applied = await asyncio.gather(migrate(first), migrate(second))
        assert sorted(applied) == [0, SCHEMA_VERSION]
        assert await migrate(first) == 0
        assert await first.fetchval("SELECT version FROM spool_schema_version") == SCHEMA_VERSION
        assert await first.fetchval("SELECT count(*) FROM spool_schema_version") == 1
    finally:
        await first.close()
        await second.close()


async def test_many_logs_flushed_at_once_share_one_transaction(pg_dsn: str, tmp_path: Path) -> None:
    engine = PgStorage(pg_dsn)
    await engine.start(tmp_path)
    try:
        logs = [await open_topic(engine, tmp_path, f"t-{i}") for i in range(8)]
        for i, plog in enumerate(logs):
            plog.append(batch(b"a%d" % i, b"b%d" % i), NOW)
        before = engine.committer.transactions
        async with engine._pool.acquire() as conn:
            xacts = await conn.fetchval(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
            )
        await asyncio.gather(*(plog.flush_async() for plog in logs))
        assert engine.committer.transactions == before + 1
        async with engine._pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT l.name, b.base_offset, b.last_offset FROM spool_batches b "
                "JOIN spool_logs l USING (log_id) ORDER BY l.name"
            )
            assert [(r["name"], r["base_offset"], r["last_offset"]) for r in rows] == [
                (f"topics/t-{i}", 0, 1) for i in range(8)
            ]
            await asyncio.sleep(0.6)  # pg_stat is reported at most every 500 ms
            after = await conn.fetchval(
                "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
            )
        # The commit, plus this connection's own statements (each its own transaction).
        assert after - xacts <= 3
        for plog in logs:
            plog.close()
    finally:
        await engine.stop()


async def test_a_log_claimed_by_another_engine_refuses_the_first_ones_next_commit(
    pg_dsn: str, tmp_path: Path
) -> None:
    first, second = PgStorage(pg_dsn), PgStorage(pg_dsn)
    await first.start(tmp_path / "one")
    await second.start(tmp_path / "two")
    try:
        mine = await open_topic(first, tmp_path / "one", "t-0")
        mine.append(batch(b"one"), NOW)
        await mine.flush_async()
        theirs = await open_topic(second, tmp_path / "two", "t-0")
        mine.append(batch(b"stale"), NOW)
        with pytest.raises(Fenced):
            await mine.flush_async()
        with pytest.raises(Fenced):  # and every later one
            await mine.flush_async()
        theirs.append(batch(b"new"), NOW)
        await theirs.flush_async()
        async with first._pool.acquire() as conn:
            data = await conn.fetch("SELECT data FROM spool_batches ORDER BY base_offset")
        got = [next(iter_batches(bytes(r["data"]), validate=True))[1].base_offset for r in data]
        # The new owner's log starts at 0 here (no restore in this test): its commit
        # replaces the rows from there on.
        assert got == [0]
        mine.close()
        theirs.close()
    finally:
        await first.stop()
        await second.stop()


async def test_a_new_data_dir_is_restored_and_an_uncommitted_tail_is_cut(
    pg_dsn: str, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    engine, plog = await start_with_topic(pg_dsn, data)
    for i in range(5):
        plog.append(batch(b"r%d" % i, b"s%d" % i), NOW)
    plog.truncate_to(8)  # the last one undone before any commit
    await plog.flush_async()
    plog.delete_records_before(3)  # DeleteRecords inside the second batch
    plog.append(batch(b"r4"), NOW)
    await plog.flush_async()
    plog.append(batch(b"never committed"), NOW)
    plog.close(clean=False)
    await engine.stop()

    # The same data dir: the tail nobody acknowledged goes.
    engine, plog = await start_with_topic(pg_dsn, data)
    assert (plog.log_start_offset, plog.log_end_offset) == (3, 9)
    assert values(plog)[-1] == b"r4"
    plog.close()
    await engine.stop()

    # A lost machine: an empty data dir gets everything back from the database.
    shutil.rmtree(data)
    engine, plog = await start_with_topic(pg_dsn, data)
    assert (plog.log_start_offset, plog.log_end_offset) == (3, 9)
    assert values(plog) == [b"r1", b"s1", b"r2", b"s2", b"r3", b"s3", b"r4"]
    plog.close()
    await engine.stop()


async def test_a_topic_created_again_under_its_name_does_not_inherit_the_old_rows(
    pg_dsn: str, tmp_path: Path
) -> None:
    engine = PgStorage(pg_dsn)
    await engine.start(tmp_path)
    try:
        for topic_id, value in (("id-old", b"old"), ("id-new", b"new")):
            directory = tmp_path / "topics" / "t-0"
            directory.mkdir(parents=True)
            (directory / "partition.metadata").write_text(f"version: 0\ntopic_id: {topic_id}\n")
            plog = await open_topic(engine, tmp_path, "t-0")
            plog.append(batch(value, value), NOW)
            if value == b"old":
                plog.delete_records_before(1)
            await plog.flush_async()
            plog.close()
            # Deleted while its rows could not be dropped (the database was away).
            shutil.rmtree(directory)
        async with engine._pool.acquire() as conn:
            row = await conn.fetchrow("SELECT log_start_offset, next_offset FROM spool_logs")
            count = await conn.fetchval("SELECT count(*) FROM spool_batches")
        assert (row["log_start_offset"], row["next_offset"], count) == (0, 2, 1)
    finally:
        await engine.stop()


async def test_a_data_dir_of_the_file_engine_is_refused_not_emptied(
    pg_dsn: str, tmp_path: Path
) -> None:
    log = PartitionLog.open(tmp_path / "meta", LogConfig(), NOW)
    log.append(batch(b"cluster"), NOW)
    log.close()
    engine = PgStorage(pg_dsn)
    with pytest.raises(OSError, match="does not know"):
        await engine.start(tmp_path)
    await engine.stop()
    assert (tmp_path / "meta").exists()


async def test_a_database_restart_fails_commits_then_heals_without_reopening(
    pg_server: PostgresServer, pg_dsn: str, tmp_path: Path
) -> None:
    engine = PgStorage(pg_dsn)
    await engine.start(tmp_path)
    commit = GroupCommit()
    commit.start()
    try:
        plog = await open_topic(engine, tmp_path, "t-0")
        plog.append(batch(b"before"), NOW)
        await commit.sync(plog)
        # A restart between two commits: the pool's connection is dead, the commit is
        # sent again on a new one, and nobody sees a failure.
        await asyncio.to_thread(pg_server.restart, "immediate")
        plog.append(batch(b"across a restart"), NOW)
        await commit.sync(plog)
        plog.truncate_to(1)
        await asyncio.to_thread(pg_server.stop, "immediate")
        plog.append(batch(b"while down"), NOW)
        with pytest.raises(OSError) as failed:
            await commit.sync(plog)
        assert failed.value.errno == errno.EIO
        assert "postgresql" in str(failed.value)
        assert engine.unavailable is not None  # an outage began (/health says so)
        plog.truncate_to(1)  # as the broker undoes a write whose flush failed
        await asyncio.to_thread(pg_server.start)
        # Commits fail fast during the outage; the committer's probe ends it once the
        # database answers (on its backoff, at most BACKOFF_MAX_S apart).
        for _ in range(300):
            if engine.unavailable is None:
                break
            await asyncio.sleep(0.1)
        assert engine.unavailable is None
        plog.append(batch(b"after"), NOW)
        await commit.sync(plog)
        async with engine._pool.acquire() as conn:
            rows = await conn.fetch("SELECT base_offset FROM spool_batches ORDER BY 1")
        assert [r["base_offset"] for r in rows] == [0, 1]
        assert values(plog) == [b"before", b"after"]
        plog.close()
    finally:
        await commit.stop()
        await engine.stop()


def test_the_password_never_shows_in_what_is_logged() -> None:
    assert mask_password("postgresql://u:s3cret@h:5432/db") == "postgresql://u:***@h:5432/db"
    assert mask_password("postgresql://u@h/db") == "postgresql://u@h/db"
    assert "s3cret" not in repr(PgStorage("postgresql://u:s3cret@h/db"))


async def test_a_rolled_segment_is_fsynced_locally_so_restarts_stay_short(
    pg_dsn: str, tmp_path: Path
) -> None:
    engine = PgStorage(pg_dsn)
    await engine.start(tmp_path)
    try:
        directory = tmp_path / "topics" / "t-0"
        plog = engine.open_topic_log(directory, LogConfig(segment_bytes=300), NOW)
        assert isinstance(plog, PgPartitionLog)
        checkpoint = directory / "recovery-point-offset-checkpoint"
        plog.append(batch(b"x" * 150), NOW)
        await plog.flush_async()
        assert not checkpoint.exists()  # no roll: the database alone keeps it durable
        plog.append(batch(b"y" * 150), NOW)  # rolls
        await plog.flush_async()
        assert checkpoint.read_text().split() == ["0", "1"]
        plog.close()
    finally:
        await engine.stop()


async def test_a_data_dir_of_another_database_is_replaced_by_this_ones_log(
    pg_dsn: str, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    engine, plog = await start_with_topic(pg_dsn, data)
    plog.append(batch(b"ours", b"ours"), NOW)
    await plog.flush_async()
    plog.close()
    await engine.stop()
    # The same offsets, other bytes: a data dir that was another database's cache.
    shutil.rmtree(data / "topics" / "t-0")
    other = PartitionLog.open(data / "topics" / "t-0", LogConfig(), NOW)
    other.append(batch(b"theirs", b"theirs"), NOW)
    other.close()

    engine, plog = await start_with_topic(pg_dsn, data)
    assert values(plog) == [b"ours", b"ours"]
    plog.close()
    await engine.stop()


async def test_a_restored_log_indexes_its_aborted_transactions(pg_dsn: str, tmp_path: Path) -> None:
    data = tmp_path / "data"
    engine, plog = await start_with_topic(pg_dsn, data)
    plog.append(batch(b"plain"), NOW)
    txn = build_batch(
        [NewRecord(key=None, value=b"aborted")],
        producer_id=7,
        producer_epoch=0,
        base_sequence=0,
        is_transactional=True,
    )
    plog.append(bytearray(txn), NOW)
    marker = build_end_txn_marker_batch(
        producer_id=7, producer_epoch=0, commit=False, coordinator_epoch=0, timestamp=NOW
    )
    plog.append(bytearray(marker), NOW)
    plog.append_aborted_txn(AbortedTxn(7, 1, 2, 1))
    assert plog.aborted_transactions(0, 3) == [AbortedTxn(7, 1, 2, 1)]
    await plog.flush_async()
    plog.close(clean=False)
    await engine.stop()

    shutil.rmtree(data)
    engine, plog = await start_with_topic(pg_dsn, data)
    assert plog.log_end_offset == 3
    assert [
        (a.producer_id, a.first_offset, a.last_offset) for a in plog.aborted_transactions(0, 3)
    ] == [(7, 1, 2)]
    plog.close()
    await engine.stop()


async def test_rows_with_a_gap_of_offsets_are_restored_around_it(
    pg_dsn: str, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    engine, plog = await start_with_topic(pg_dsn, data)
    for value in (b"a", b"b", b"c"):
        plog.append(batch(value), NOW)
    await plog.flush_async()
    plog.close()
    async with engine._pool.acquire() as conn:  # as a compaction of the rows would
        await conn.execute("DELETE FROM spool_batches WHERE base_offset = 1")
    await engine.stop()

    shutil.rmtree(data)
    engine, plog = await start_with_topic(pg_dsn, data)
    assert (plog.log_start_offset, plog.log_end_offset) == (0, 3)
    assert values(plog) == [b"a", b"c"]
    plog.close()
    await engine.stop()


async def test_a_batch_larger_than_the_default_max_message_bytes_is_restored(
    pg_dsn: str, tmp_path: Path
) -> None:
    # A topic whose max.message.bytes was raised took a 2 MB batch; the restore replays
    # what was accepted then and must not judge it by the default limit (1 MB).
    data = tmp_path / "data"
    engine = PgStorage(pg_dsn)
    await engine.start(data)
    big = LogConfig(max_message_bytes=4 << 20)
    plog = engine.open_topic_log(data / "topics" / "big-0", big, NOW)
    assert isinstance(plog, PgPartitionLog)
    await plog._claimed()
    plog.append(batch(b"x" * (2 << 20)), NOW)
    await plog.flush_async()
    plog.close()
    await engine.stop()

    shutil.rmtree(data)
    engine = PgStorage(pg_dsn)
    await engine.start(data)
    plog = engine.open_topic_log(data / "topics" / "big-0", big, NOW)
    assert isinstance(plog, PgPartitionLog)
    assert (plog.log_start_offset, plog.log_end_offset) == (0, 1)
    assert values(plog) == [b"x" * (2 << 20)]
    plog.close()
    await engine.stop()


async def test_a_late_forget_of_a_deleted_topic_leaves_the_topic_created_again(
    pg_dsn: str, tmp_path: Path
) -> None:
    """Brokers sharing the database each forget a deleted topic's logs: one that learns
    of the deletion after another broker created the topic again (the row holds the
    new topic id by then) leaves the new topic's row and batches alone."""
    engine = PgStorage(pg_dsn)
    await engine.start(tmp_path)
    directory = tmp_path / "topics" / "t-0"

    async def open_forget(created_again: bool) -> int:
        """Open t-0 of topic id-old, write, delete it; the rows of t-0 left after."""
        directory.mkdir(parents=True)
        (directory / "partition.metadata").write_text("version: 0\ntopic_id: id-old\n")
        plog = await open_topic(engine, tmp_path, "t-0")
        plog.append(batch(b"old"), NOW)
        await plog.flush_async()
        plog.close()
        if created_again:
            async with engine._pool.acquire() as conn:
                await conn.execute("UPDATE spool_logs SET topic_id = 'id-new'")
        shutil.rmtree(directory)
        engine.forget_log(directory)
        await asyncio.gather(*engine._background)
        async with engine._pool.acquire() as conn:
            return int(
                await conn.fetchval("SELECT count(*) FROM spool_logs WHERE name = $1", "topics/t-0")
            )

    try:
        assert await open_forget(created_again=True) == 1
        async with engine._pool.acquire() as conn:
            await conn.execute("DELETE FROM spool_logs WHERE name = 'topics/t-0'")
        # Still the deleted topic's row: dropped.
        assert await open_forget(created_again=False) == 0
    finally:
        await engine.stop()
