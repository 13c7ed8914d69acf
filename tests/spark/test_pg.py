"""The Spark pipeline on PostgreSQL: `spool audit --storage` and `spool compact --storage`
on the database of a real broker (`spool serve --storage postgresql://...`).

The database's share-state log is read through Spark's JDBC source (the session the
tests share has the PostgreSQL JDBC driver on its class path, as every spool session
has when the jar is installed). The audit of what a broker wrote under share traffic
passes; a row whose bytes were flipped and a row holding out-of-order state batches
fail their rules at their rows. Compaction, run while the broker appends share state,
removes rows without changing what the log replays to, and a broker started on that
database with an empty data dir (a restore across the gaps) has the same share state
and redelivers nothing that was accepted.
"""

from __future__ import annotations

import itertools
import json
import shutil
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from broker.cli import main as spool_main
from coordinator.share_coordinator import ShareCoordinatorShard
from persister.share_records import ShareKey, ShareUpdate, StateBatch, decode, encode
from persister.spark import audit
from persister.spark.pg import PgTarget
from persister.spark.pg_compact import compact_pg
from protocol.records import NewRecord, build_batch, decode_records, iter_batches
from tests.integration.conftest import Broker
from tests.integration.pg_helpers import create_database, db_rows, pg_server
from tests.integration.share_helpers import (
    accept_until,
    earliest,
    produce_values,
)
from tests.postgres import PostgresServer
from tests.spark.helpers import replay_dir, states_of
from tests.spark.test_audit import _run_share_traffic

__all__ = ["pg_server"]  # the fixture, from pg_helpers

PER_SNAPSHOT = "3"  # snapshots often: updates before them are superseded
_databases = itertools.count()


def _broker(root: Path, dsn: str, per_snapshot: str = PER_SNAPSHOT) -> Broker:
    return Broker(
        root / "data",
        root / "broker.log",
        {
            "storage": dsn,
            "share.coordinator.snapshot.update.records.per.snapshot": per_snapshot,
        },
    )


def accept_in_small_polls(broker: Broker, group: str, topic: str, count: int) -> None:
    """Consume `count` records accepting each, two a poll: one share-state write per
    poll and partition, so the log has many rows."""
    log = accept_until(broker, group, [topic], count, **{"max.poll.records": 2})
    assert len(log.deliveries) >= count, log.errors


def share_rows(dsn: str) -> dict[int, bytes]:
    """The share-state log's rows: base offset -> batch bytes."""
    rows = db_rows(
        dsn,
        "SELECT b.base_offset, b.data FROM spool_batches b JOIN spool_logs l USING (log_id) "
        "WHERE l.name = 'share-state' ORDER BY b.base_offset",
    )
    return {int(r["base_offset"]): bytes(r["data"]) for r in rows}


def replay_rows(rows: dict[int, bytes]) -> dict[Any, Any]:
    """The share coordinator's state after replaying `rows` in offset order."""
    shard = ShareCoordinatorShard()
    for base in sorted(rows):
        data = rows[base]
        for pos, header in iter_batches(data, validate=True):
            for record in decode_records(data, pos, header):
                assert record.key is not None
                shard.replay(decode(record.key, record.value))
    return states_of(shard)


@pytest.fixture(scope="module")
def traffic_db(
    pg_server: PostgresServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, dict[str, Any]]]:
    """A database a broker wrote under share traffic (accepts, releases, rejects), the
    broker stopped; each test that damages it works on a copy (`copy_db`)."""
    dsn = create_database(pg_server, f"spool_spark_traffic_{uuid.uuid4().hex[:8]}")
    broker = _broker(tmp_path_factory.mktemp("pg-traffic"), dsn)
    broker.start()
    try:
        traffic = _run_share_traffic(broker)
    finally:
        broker.stop()
    yield dsn, traffic


def copy_db(pg_server: PostgresServer, dsn: str) -> str:
    name = f"spool_spark_copy_{next(_databases)}"
    source = dsn.rsplit("/", 1)[1]
    db_rows(pg_server.dsn, f'CREATE DATABASE "{name}" TEMPLATE "{source}"')
    return dsn.rsplit("/", 1)[0] + f"/{name}"


def with_password(dsn: str, password: str) -> str:
    """The URL with a password (the test server trusts loopback, so any is accepted)."""
    scheme, rest = dsn.split("://", 1)
    user, host = rest.split("@", 1)
    return f"{scheme}://{user}:{password}@{host}"


# ------------------------------------------------------------------ audit


def test_audit_of_a_brokers_database_passes_and_never_shows_the_password(
    spark: SparkSession,
    traffic_db: tuple[str, dict[str, Any]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    dsn, traffic = traffic_db
    out = tmp_path / "out"
    url = with_password(dsn, "s3cret-pw")
    # The command as an operator runs it (in this process: it shares the test session).
    code = spool_main(["audit", "--storage", url, "--out", str(out), "--master", "local[2]"])
    err = capsys.readouterr().err
    assert code == 0, err[-4000:]
    assert "[5/5]" in err and "s3cret-pw" not in err
    text = (out / "report.json").read_text()
    assert "s3cret-pw" not in text and "s3cret-pw" not in (out / "report.html").read_text()
    report = json.loads(text)
    assert report["passed"] and all(c["passed"] for c in report["checks"])
    summary = report["summary"]
    assert summary["rows"] > 1 and summary["storage"].endswith("***@" + url.split("@")[1])
    parts = [p for p in report["partitions"] if p["group_id"] == traffic["group"]]
    assert sorted(p["partition"] for p in parts) == [0, 1]
    for p in parts:
        rejected = sum(1 for q, _ in traffic["rejected"] if q == p["partition"])
        assert p["lag"] == 0 and p["topic"] == traffic["topic"]
        assert p["archived"] <= rejected
    # The Parquet tables name each record's row.
    records = spark.read.parquet(str(out / "records"))
    assert records.where("segment NOT LIKE 'spool_batches[%]'").count() == 0


def test_audit_catches_a_corrupted_row_and_an_out_of_order_state_batch(
    spark: SparkSession,
    pg_server: PostgresServer,
    traffic_db: tuple[str, dict[str, Any]],
    tmp_path: Path,
) -> None:
    dsn = copy_db(pg_server, traffic_db[0])
    rows = share_rows(dsn)
    (log_id, next_offset), *_ = (
        (int(r["log_id"]), int(r["next_offset"]))
        for r in db_rows(
            dsn, "SELECT log_id, next_offset FROM spool_logs WHERE name = 'share-state'"
        )
    )
    # A row's bytes flipped under the CRC (its last record's value).
    corrupt = max(rows)
    data = bytearray(rows[corrupt])
    data[-3] ^= 0x55
    db_rows(
        dsn,
        "UPDATE spool_batches SET data = $3 WHERE log_id = $1 AND base_offset = $2",
        log_id,
        corrupt,
        bytes(data),
    )
    # A new row, as the broker appends one, whose update of a live key lists its state
    # batches out of order.
    key = next(
        k for k in replay_rows(rows) if k.group_id == traffic_db[1]["group"] and k.partition == 0
    )
    bad = ShareUpdate(
        ShareKey(key.group_id, key.topic_id, key.partition),
        0,
        -1,
        -1,
        (StateBatch(25, 26, 0, 1), StateBatch(21, 22, 0, 1)),
    )
    batch = build_batch([NewRecord(*encode(bad))], base_offset=next_offset)
    db_rows(
        dsn,
        "INSERT INTO spool_batches (log_id, base_offset, last_offset, max_timestamp, data) "
        "VALUES ($1, $2, $2, 0, $3)",
        log_id,
        next_offset,
        bytes(batch),
    )
    db_rows(
        dsn, "UPDATE spool_logs SET next_offset = $2 WHERE log_id = $1", log_id, next_offset + 1
    )

    result = audit.run_audit_pg(spark, PgTarget(dsn), tmp_path / "out", tables=False)
    assert audit.exit_code(result) == 1
    framing = [v for v in result.violations if v.rule == audit.CRC_AND_FRAMING]
    assert [(v.segment, v.offset) for v in framing] == [(f"spool_batches[{corrupt}]", corrupt)]
    assert "CRC32C" in framing[0].message
    ordered = [v for v in result.violations if v.rule == audit.STATE_BATCHES_ORDERED]
    assert [(v.group_id, v.partition, v.segment, v.offset) for v in ordered] == [
        (key.group_id, 0, f"spool_batches[{next_offset}]", next_offset)
    ], result.violations
    assert "out of order" in ordered[0].message


def test_a_database_without_spool_tables_is_a_usage_error(
    pg_server: PostgresServer, tmp_path: Path
) -> None:
    dsn = create_database(pg_server, f"spool_spark_empty_{uuid.uuid4().hex[:8]}")
    code = spool_main(["audit", "--storage", dsn, "--out", str(tmp_path / "out")])
    assert code == 2


# ------------------------------------------------------------------ compaction


@pytest.mark.timeout(300)
def test_compaction_under_share_traffic_keeps_the_replay_and_a_restore_serves_it(
    spark: SparkSession, pg_server: PostgresServer, tmp_path: Path
) -> None:
    dsn = create_database(pg_server, f"spool_spark_compact_{uuid.uuid4().hex[:8]}")
    # A snapshot every other write: most rows end up superseded.
    broker = _broker(tmp_path, dsn, per_snapshot="1")
    broker.start()
    try:
        traffic = _run_share_traffic(broker)
        topic, group = traffic["topic"], traffic["group"]
        # A group that consumes once and never again: its state's rows stay, below rows
        # of the busy group that go, so the compaction leaves gaps between kept rows.
        earliest(broker, "once")
        accept_in_small_polls(broker, "once", topic, 4)
        for p in range(2):
            produce_values(broker, topic, [b"w"] * 20, partition=p)
        accept_in_small_polls(broker, group, topic, 40)
        before = share_rows(dsn)

        # More share traffic while the compaction runs: the broker appends rows above
        # the rows the compaction reads.
        def more() -> None:
            produce_values(broker, topic, [b"y"] * 10, partition=0)
            accept_in_small_polls(broker, group, topic, 10)

        worker = threading.Thread(target=more)
        worker.start()
        try:
            result = compact_pg(spark, PgTarget(dsn))
        finally:
            worker.join(timeout=90)
        assert not worker.is_alive()
        after = share_rows(dsn)
        removed = set(before) - set(after)
        assert result.rows_deleted == len(removed) > 0, result
        assert all(base < result.bound for base in removed)
        assert any(base > min(after) for base in removed)  # a gap between kept rows
        # What went changes nothing: the log with its removed rows put back replays to
        # the state the log replays to now (concurrent appends included).
        now = replay_rows(after)
        assert replay_rows({**after, **{b: before[b] for b in removed}}) == now
        assert now  # the group's share partitions have state
        # Again as an operator runs it: what is left replays the same.
        assert spool_main(["compact", "--storage", dsn, "--master", "local[2]"]) == 0
        assert replay_rows(share_rows(dsn)) == replay_rows({**share_rows(dsn), **before})
    finally:
        broker.stop()

    # The machine is lost: a broker with an empty data dir restores from the database,
    # across the gaps the compaction left, to the same share state.
    shutil.rmtree(broker.data_dir)
    broker.start()
    broker.stop()
    assert replay_dir(broker.data_dir / "share-state") is not None
    assert states_of(replay_dir(broker.data_dir / "share-state")) == replay_rows(share_rows(dsn))
    assert replay_rows(share_rows(dsn)) == now

    # And serves it: every record was accepted, so only new ones are delivered.
    broker.start()
    try:
        sent = produce_values(broker, topic, [b"z"] * 5, partition=1)
        delivered = sorted(accept_until(broker, group, [topic], 5, settle_s=3).offsets())
        assert delivered == sorted((s.partition, s.offset) for s in sent)
    finally:
        broker.stop()
