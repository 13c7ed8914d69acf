"""`spool migrate --from DATA_DIR --to postgresql://...`: a stopped file broker's data dir
copied into an empty database, and a broker on that database (with an empty data dir)
serving the same state: topics with their ids and offsets, records, share state,
configs, transactions, SCRAM credentials and ACLs.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from confluent_kafka import AcknowledgeType, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ConfigResource,
    ResourcePatternType,
    ResourceType,
)

from tests.integration.cli_helpers import ok
from tests.integration.conftest import (
    REPO_ROOT,
    Broker,
    BrokerError,
    admin_config,
    consume_assigned,
    create_topic,
    producer_config,
    watermarks,
)
from tests.integration.pg_helpers import db_rows, pg_dsn, pg_server
from tests.integration.share_helpers import (
    accept_until,
    close_quietly,
    consume,
    earliest,
    produce_values,
    share_consumer,
)

__all__ = ["pg_dsn", "pg_server"]  # the fixtures, from pg_helpers

GROUP = "migrated-share"
WAIT_S = 30.0
AUTHORIZER = {
    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "allow.everyone.if.no.acl.found": "true",
}


def migrate(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker", "migrate", *argv],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def spool_format(data_dir: Path, *argv: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "broker", "format", "--data-dir", str(data_dir), *argv],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


def topic_ids(broker: Broker) -> dict[str, str]:
    admin = AdminClient(admin_config(broker))
    names = [t for t in admin.list_topics(timeout=10).topics if not t.startswith("__")]
    from confluent_kafka import TopicCollection

    described = admin.describe_topics(TopicCollection(names), request_timeout=WAIT_S)
    return {name: str(f.result(timeout=WAIT_S).topic_id) for name, f in described.items()}


def acls(broker: Broker) -> list[AclBinding]:
    admin = AdminClient(admin_config(broker))
    any_filter = AclBindingFilter(
        ResourceType.ANY,
        None,
        ResourcePatternType.ANY,
        None,
        None,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    return sorted(admin.describe_acls(any_filter).result(timeout=WAIT_S), key=str)


def config_value(broker: Broker, kind: str, name: str, key: str) -> str:
    admin = AdminClient(admin_config(broker))
    resource = ConfigResource(kind, name)
    configs = admin.describe_configs([resource], request_timeout=WAIT_S)[resource].result(
        timeout=WAIT_S
    )
    return str(configs[key].value)


def scram_users(broker: Broker) -> dict[str, list[tuple[str, int]]]:
    admin = AdminClient(admin_config(broker))
    found = admin.describe_user_scram_credentials(request_timeout=WAIT_S).result(timeout=WAIT_S)
    return {
        user: sorted((i.mechanism.name, i.iterations) for i in d.scram_credential_infos)
        for user, d in found.items()
    }


def test_a_file_brokers_state_is_served_from_postgresql_after_migrate(
    broker_factory: Callable[..., Broker], pg_dsn: str, tmp_path: Path
) -> None:
    source_dir = tmp_path / "data0"
    spool_format(source_dir, "--add-scram", "SCRAM-SHA-256=[name=alice,password=alice-secret]")
    source = broker_factory(AUTHORIZER)
    assert source.data_dir == source_dir
    create_topic(source, "orders", partitions=2, config={"retention.ms": "987654321"})
    create_topic(source, "empty")
    earliest(source, GROUP)
    values0 = [b"p0-%d" % i for i in range(200)]
    values1 = [b"p1-%d" % i for i in range(100)]
    produce_values(source, "orders", values0, partition=0, batch=20)
    produce_values(source, "orders", values1, partition=1, batch=7)
    # DeleteRecords: partition 1 starts at 10.
    admin = AdminClient(admin_config(source))
    from confluent_kafka import TopicPartition

    deleted = admin.delete_records([TopicPartition("orders", 1, 10)], request_timeout=WAIT_S)
    for future in deleted.values():
        future.result(timeout=WAIT_S)

    # Share group: accept everything but partition 1's offsets 50 on, which are released
    # (delivery count 1, available again).
    consumer = share_consumer(source, GROUP, ["orders"])
    try:
        log = consume(
            consumer,
            until=lambda log: len(log.deliveries) >= 290,
            timeout=60,
            decide=lambda m: (
                AcknowledgeType.RELEASE
                if m.partition() == 1 and m.offset() >= 50
                else AcknowledgeType.ACCEPT
            ),
        )
    finally:
        close_quietly(consumer)
    assert len({d.key for d in log.deliveries}) == 290, log.errors

    # Transactions: committed, aborted, committed.
    create_topic(source, "tx")
    producer = Producer(producer_config(source, **{"transactional.id": "migrate-tx"}))
    producer.init_transactions(WAIT_S)
    committed: list[bytes] = []
    for n, commit in enumerate([True, False, True]):
        producer.begin_transaction()
        values = [b"tx%d-%d" % (n, i) for i in range(5)]
        for v in values:
            producer.produce("tx", value=v, partition=0)
        assert producer.flush(WAIT_S) == 0
        if commit:
            producer.commit_transaction(WAIT_S)
            committed += values
        else:
            producer.abort_transaction(WAIT_S)

    # An ACL (SCRAM credentials came from spool format).
    binding = AclBinding(
        ResourceType.TOPIC,
        "secret",
        ResourcePatternType.LITERAL,
        "User:alice",
        "*",
        AclOperation.READ,
        AclPermissionType.ALLOW,
    )
    admin.create_acls([binding])[binding].result(timeout=WAIT_S)

    ids = topic_ids(source)
    marks = {p: watermarks(source, "orders", p) for p in (0, 1)}
    tx_marks = watermarks(source, "tx", 0)
    source_acls = acls(source)
    source_described = ok(source, "topics", "--describe", "--topic", "orders")
    source.stop()

    proc = migrate("--from", str(source_dir), "--to", pg_dsn)
    assert proc.returncode == 0, proc.stderr
    assert "migrated" in proc.stdout and "logs" in proc.stdout, proc.stdout

    target = broker_factory({"storage": pg_dsn, **AUTHORIZER})
    assert target.data_dir != source_dir and target.starts == 1
    assert topic_ids(target) == ids
    assert {p: watermarks(target, "orders", p) for p in (0, 1)} == marks
    assert marks[1][0] == 10
    assert watermarks(target, "tx", 0) == tx_marks
    assert watermarks(target, "empty", 0) == (0, 0)
    got0 = consume_assigned(target, "orders", [0], 200, timeout=WAIT_S)
    assert [r.value for r in got0] == values0
    assert [r.offset for r in got0] == list(range(200))
    got1 = consume_assigned(target, "orders", [1], 90, timeout=WAIT_S)
    assert [r.value for r in got1] == values1[10:]
    read_committed = consume_assigned(
        target, "tx", [0], len(committed), timeout=WAIT_S, **{"isolation.level": "read_committed"}
    )
    assert [r.value for r in read_committed] == committed
    assert config_value(target, "TOPIC", "orders", "retention.ms") == "987654321"
    assert config_value(target, "GROUP", GROUP, "share.auto.offset.reset") == "earliest"
    assert acls(target) == source_acls and len(source_acls) == 1
    assert scram_users(target) == {"alice": [("SCRAM_SHA_256", 4096)]}
    described = ok(target, "topics", "--describe", "--topic", "orders")
    assert described == source_described and "TopicId" in described

    # The share group goes on where it was: only the released records, a second time.
    deliveries = accept_until(target, GROUP, ["orders"], 50, settle_s=3).deliveries
    assert sorted(d.key for d in deliveries) == [(1, o) for o in range(50, 100)]
    assert {d.delivery_count for d in deliveries} == {2}

    # The new broker writes on: the database is its own now.
    produce_values(target, "orders", [b"after"], partition=0)
    target.restart()
    assert watermarks(target, "orders", 0) == (0, 201)


def test_a_running_brokers_data_dir_is_refused(
    broker_factory: Callable[..., Broker], pg_dsn: str
) -> None:
    running = broker_factory()
    create_topic(running, "t")
    proc = migrate("--from", str(running.data_dir), "--to", pg_dsn)
    assert proc.returncode == 1
    assert "A spool broker in another process is using this directory" in proc.stderr
    assert db_rows(pg_dsn, "SELECT to_regclass('spool_logs') AS t")[0]["t"] is None


def test_a_database_holding_spool_logs_is_refused(
    broker_factory: Callable[..., Broker], pg_dsn: str
) -> None:
    source = broker_factory()
    create_topic(source, "t")
    produce_values(source, "t", [b"one"])
    source.stop()
    first = migrate("--from", str(source.data_dir), "--to", pg_dsn)
    assert first.returncode == 0, first.stderr
    again = migrate("--from", str(source.data_dir), "--to", pg_dsn)
    assert again.returncode == 1
    assert "already holds a finished migrate" in again.stderr
    # The data dir is left as a broker leaves it: the file broker starts on it again.
    source.start()
    assert watermarks(source, "t", 0) == (0, 1)
    source.stop()

    # A broker's own database (never migrated into) is refused too.
    other = broker_factory({"storage": pg_dsn.rsplit("/", 1)[0] + "/spool"})
    other.stop()
    # (A password in the URL, which the server's trust authentication ignores: never
    # printed.)
    with_password = other.settings["storage"].replace("spool@", "spool:s3cret-pw@")
    into_brokers = migrate("--from", str(source.data_dir), "--to", with_password)
    assert into_brokers.returncode == 1
    assert "already holds" in into_brokers.stderr and "spool logs" in into_brokers.stderr
    assert "s3cret-pw" not in into_brokers.stderr + into_brokers.stdout
    assert "spool:***@" in into_brokers.stderr


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["kill9", "ctrl-c"])
def test_an_interrupted_migrate_is_refused_by_the_broker_and_resumed_by_a_rerun(
    broker_factory: Callable[..., Broker], pg_dsn: str, tmp_path: Path, sig: signal.Signals
) -> None:
    source = broker_factory()
    create_topic(source, "big", partitions=2)
    values = [os.urandom(1000) for _ in range(2000)]
    produce_values(source, "big", values, partition=0, batch=100)
    produce_values(source, "big", values[:500], partition=1, batch=100)
    marks = watermarks(source, "big", 0)
    source.stop()

    # Hold the batch table so the migrate stops at its first copy, then kill it there.
    async def blocked_migrate() -> None:
        conn = await asyncpg.connect(pg_dsn)
        # Activity is read outside the locking transaction (its statistics are a
        # snapshot taken once per transaction).
        watch = await asyncpg.connect(pg_dsn)
        try:
            from persister.pg_schema import migrate as migrate_schema

            await migrate_schema(conn)
            async with conn.transaction():
                await conn.execute("LOCK TABLE spool_batches IN SHARE MODE")
                argv = ["migrate", "--from", str(source.data_dir), "--to", pg_dsn]
                proc = subprocess.Popen(
                    [sys.executable, "-m", "broker", *argv],
                    cwd=REPO_ROOT,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                )
                deadline = time.monotonic() + WAIT_S
                while time.monotonic() < deadline:
                    waiting = await watch.fetchval(
                        "SELECT count(*) FROM pg_stat_activity "
                        "WHERE wait_event_type = 'Lock' AND query LIKE 'COPY%'"
                    )
                    if waiting:
                        break
                    await asyncio.sleep(0.05)
                else:
                    proc.kill()
                    raise AssertionError("the migrate never reached its copy")
                proc.send_signal(sig)
                _, err = proc.communicate(timeout=10)
                if sig == signal.SIGINT:
                    assert proc.returncode == 130
                    assert b"running the same migrate again resumes" in err
                else:
                    assert proc.returncode == -signal.SIGKILL
        finally:
            await watch.close()
            await conn.close()

    asyncio.run(blocked_migrate())
    planned = db_rows(pg_dsn, "SELECT name FROM spool_logs")
    assert "topics/big-0" in {r["name"] for r in planned}

    # A broker on the unfinished copy refuses to start, and says why.
    early = Broker(tmp_path / "early", tmp_path / "early.log", {"storage": pg_dsn})
    with pytest.raises(BrokerError):
        early.start()
    assert "spool migrate" in early.log_tail()

    rerun = migrate("--from", str(source.data_dir), "--to", pg_dsn)
    assert rerun.returncode == 0, rerun.stderr
    assert "resuming" in rerun.stdout
    target = broker_factory({"storage": pg_dsn})
    assert watermarks(target, "big", 0) == marks
    got = consume_assigned(target, "big", [0], 2000, timeout=WAIT_S)
    assert [r.value for r in got] == values


def _build_source(data_dir: Path) -> dict[str, tuple[int, int, bytes]]:
    """A data dir of logs with gaps (as compaction leaves them), a moved log start, and
    a log emptied to its end; what each holds, (start, end, bytes from the start)."""
    from persister.file_log import LogConfig, PartitionLog
    from protocol.records import NewRecord, build_batch

    def batch(base: int, count: int) -> bytearray:
        return bytearray(
            build_batch(
                [NewRecord(b"k%d" % i, b"v" * 50) for i in range(count)],
                base_offset=base,
                default_timestamp=1000 + base,
            )
        )

    layouts = {
        "meta": [(0, 3), (3, 1)],
        "share-state": [(0, 2), (7, 3), (30, 1), (31, 4), (90, 2)],
        "topics/gappy-0": [(5, 5), (20, 5), (25, 200)],
        "topics/emptied-0": [(0, 10)],
    }
    found = {}
    for name, layout in layouts.items():
        plog = PartitionLog.open(data_dir / name, LogConfig(), 0)
        for base, count in layout:
            plog.append_raw(batch(base, count), 0)
        if name == "topics/gappy-0":
            plog.delete_records_before(22)
        if name == "topics/emptied-0":
            plog.delete_records_before(10)
        found[name] = (
            plog.log_start_offset,
            plog.log_end_offset,
            plog.read(plog.log_start_offset, 1 << 20) if plog.log_start_offset < 10**6 else b"",
        )
        plog.close()
    return found


def _restored(data_dir: Path, dsn: str) -> dict[str, tuple[int, int, bytes]]:
    from persister.file_log import LogConfig, PartitionLog
    from persister.pg_storage import PgStorage

    async def start() -> None:
        storage = PgStorage(dsn)
        await storage.start(data_dir)
        await storage.stop()

    asyncio.run(start())
    found = {}
    for name in ("meta", "share-state", "topics/gappy-0", "topics/emptied-0"):
        plog = PartitionLog.open(data_dir / name, LogConfig(), 0)
        found[name] = (
            plog.log_start_offset,
            plog.log_end_offset,
            plog.read(plog.log_start_offset, 1 << 20),
        )
        plog.close()
    return found


def test_gaps_log_starts_and_emptied_logs_come_back_as_they_were(
    pg_dsn: str, tmp_path: Path
) -> None:
    from persister.pg_migrate import Migration

    source = _build_source(tmp_path / "source")
    assert source["topics/emptied-0"][:2] == (10, 10)
    # A row per batch, so gaps lie between rows too.
    migration = Migration(tmp_path / "source", pg_dsn, txn_bytes=1, row_bytes=1)
    totals = asyncio.run(migration.run())
    assert totals.logs == 4 and totals.rows == totals.batches == 9
    assert _restored(tmp_path / "target", pg_dsn) == source


def test_a_copy_that_failed_midway_resumes_after_its_last_row(pg_dsn: str, tmp_path: Path) -> None:
    from persister.pg_migrate import MigrateError, Migration

    source = _build_source(tmp_path / "source")

    class Failing(Migration):
        async def _send(self, conn: Any, rows: list[tuple[int, int, int, int, bytes]]) -> None:
            if self.totals.transactions == 2:
                raise ConnectionResetError("the connection broke")
            await super()._send(conn, rows)

    small = {"txn_bytes": 1, "row_bytes": 1, "out": sys.stdout}
    with pytest.raises(MigrateError, match="resumes"):
        asyncio.run(Failing(tmp_path / "source", pg_dsn, **small).run())  # type: ignore[arg-type]
    copied = db_rows(pg_dsn, "SELECT count(*) AS n FROM spool_batches")[0]["n"]
    assert copied == 2
    resumed = asyncio.run(Migration(tmp_path / "source", pg_dsn, **small).run())  # type: ignore[arg-type]
    assert resumed.transactions >= 1 and resumed.rows >= 1
    assert db_rows(pg_dsn, "SELECT count(*) AS n FROM spool_batches")[0]["n"] == 2 + resumed.rows
    assert _restored(tmp_path / "target", pg_dsn) == source


def test_a_transaction_open_at_the_stop_is_aborted_at_its_timeout_after_migrate(
    broker_factory: Callable[..., Broker], pg_dsn: str
) -> None:
    """As after a restart of the file broker: the transaction is in the migrated
    transactions log, Ongoing; the coordinator on PostgreSQL aborts it once its
    transaction.timeout.ms has passed, and read_committed never sees its records."""
    source = broker_factory()
    create_topic(source, "open")
    produce_values(source, "open", [b"plain"])
    producer = Producer(
        producer_config(
            source,
            **{
                "transactional.id": "left-open",
                "transaction.timeout.ms": 3000,
                "message.timeout.ms": 3000,
                "socket.timeout.ms": 3000,
            },
        )
    )
    producer.init_transactions(WAIT_S)
    producer.begin_transaction()
    producer.produce("open", value=b"in-flight", partition=0)
    assert producer.flush(WAIT_S) == 0
    source.stop()
    proc = migrate("--from", str(source.data_dir), "--to", pg_dsn)
    assert proc.returncode == 0, proc.stderr

    target = broker_factory(
        {
            "storage": pg_dsn,
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "200",
        }
    )
    deadline = time.monotonic() + WAIT_S
    while watermarks(target, "open", 0)[1] < 3:  # plain, in-flight, the abort marker
        assert time.monotonic() < deadline, "the open transaction was never aborted"
        time.sleep(0.1)
    committed = consume_assigned(
        target, "open", [0], 1, timeout=WAIT_S, **{"isolation.level": "read_committed"}
    )
    assert [r.value for r in committed] == [b"plain"]
    everything = consume_assigned(
        target, "open", [0], 2, timeout=WAIT_S, **{"isolation.level": "read_uncommitted"}
    )
    assert [r.value for r in everything] == [b"plain", b"in-flight"]


def test_a_data_dir_changed_after_an_interrupted_migrate_needs_restart(
    pg_dsn: str, tmp_path: Path
) -> None:
    from persister.file_log import LogConfig, PartitionLog
    from persister.pg_migrate import MigrateError, Migration
    from protocol.records import NewRecord, build_batch

    _build_source(tmp_path / "source")

    class Failing(Migration):
        async def _send(self, conn: Any, rows: list[tuple[int, int, int, int, bytes]]) -> None:
            if self.totals.transactions == 2:
                raise ConnectionResetError("the connection broke")
            await super()._send(conn, rows)

    small = {"txn_bytes": 1, "row_bytes": 1}
    with pytest.raises(MigrateError):
        asyncio.run(Failing(tmp_path / "source", pg_dsn, **small).run())  # type: ignore[arg-type]

    # A broker ran on the data dir meanwhile: a log grew.
    plog = PartitionLog.open(tmp_path / "source" / "meta", LogConfig(), 0)
    plog.append(bytearray(build_batch([NewRecord(b"k", b"new")])), 0)
    plog.close()
    with pytest.raises(MigrateError, match="--restart") as refused:
        asyncio.run(Migration(tmp_path / "source", pg_dsn, **small).run())  # type: ignore[arg-type]
    assert "meta was offsets [0, 4), now [0, 5)" in str(refused.value)

    restarted = Migration(tmp_path / "source", pg_dsn, restart=True, **small)  # type: ignore[arg-type]
    totals = asyncio.run(restarted.run())
    assert totals.batches == 10
    restored = _restored(tmp_path / "target", pg_dsn)
    assert restored["meta"][:2] == (0, 5)


def test_a_compacted_share_state_log_is_copied_as_it_is(
    broker_factory: Callable[..., Broker], pg_dsn: str
) -> None:
    """Small share-state segments, compacted as they close: batches with offsets
    missing, copied as they are; the share group on PostgreSQL gets only what was
    never accepted."""
    source = broker_factory(
        {
            "share.coordinator.state.topic.segment.bytes": "1024",
            "share.coordinator.snapshot.update.records.per.snapshot": "2",
            "log.cleaner.backoff.ms": "100",
        }
    )
    create_topic(source, "work")
    earliest(source, GROUP)
    produce_values(source, "work", [b"w%d" % i for i in range(300)], batch=10)
    log = accept_until(source, GROUP, ["work"], 250, **{"max.poll.records": 10})
    accepted = {d.key for d in log.deliveries}
    deadline = time.monotonic() + WAIT_S
    while not re.search(r"share_state_compacted +rewritten=[1-9]", source.log_tail(2000)):
        assert time.monotonic() < deadline, "the share-state log was never compacted"
        time.sleep(0.2)
    source.stop()

    proc = migrate("--from", str(source.data_dir), "--to", pg_dsn)
    assert proc.returncode == 0, proc.stderr
    rows = db_rows(
        pg_dsn,
        "SELECT b.base_offset, b.last_offset, b.data FROM spool_batches b "
        "JOIN spool_logs l USING (log_id) WHERE l.name = 'share-state' ORDER BY b.base_offset",
    )
    from protocol.records import iter_batches

    (log,) = db_rows(
        pg_dsn, "SELECT log_start_offset, next_offset FROM spool_logs WHERE name = 'share-state'"
    )
    # Compaction keeps the offsets of the records it keeps: the ones it dropped are
    # missing from the copy too.
    records = sum(h.records_count for r in rows for _, h in iter_batches(r["data"]))
    assert records < log["next_offset"] - log["log_start_offset"], "nothing was compacted"

    target = broker_factory({"storage": pg_dsn})
    again = set(accept_until(target, GROUP, ["work"], 300 - len(accepted), settle_s=3).offsets())
    assert again == {(0, o) for o in range(300)} - accepted


def test_a_copy_whose_rows_fall_short_of_a_log_end_is_not_marked_finished(
    pg_dsn: str, tmp_path: Path
) -> None:
    from persister.pg_migrate import MigrateError, Migration

    _build_source(tmp_path / "source")

    class Losing(Migration):
        async def _copy(self, conn: Any, planned: Any, total: int) -> None:
            await super()._copy(conn, planned, total)
            await conn.execute(
                "DELETE FROM spool_batches WHERE (log_id, base_offset) = (SELECT log_id, "
                "max(base_offset) FROM spool_batches JOIN spool_logs USING (log_id) "
                "WHERE name = 'share-state' GROUP BY log_id)"
            )

    with pytest.raises(MigrateError, match="copy of share-state ends at offset 35, its log at 92"):
        asyncio.run(Losing(tmp_path / "source", pg_dsn, row_bytes=1).run())
    (row,) = db_rows(pg_dsn, "SELECT finished_at FROM spool_migration")
    assert row["finished_at"] is None
