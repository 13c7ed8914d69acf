"""The pure parts of the Spark jobs on PostgreSQL (persister.spark.pg, pg_compact, and
audit's row scan): the database URL and its password, which rows a compaction removes,
and what the audit says of a row. No Spark, no database."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from persister.share_records import (
    ShareKey,
    ShareRecord,
    ShareSnapshot,
    ShareTombstone,
    ShareUpdate,
    StateBatch,
    encode,
)
from persister.spark import audit
from persister.spark.findings import Violation
from persister.spark.pg import PgTarget, target
from persister.spark.pg_compact import _last_reset, relied_on, resets, summarize, superseded
from protocol.records import NewRecord, build_batch

A = ShareKey("g", uuid.UUID(int=1), 0)
B = ShareKey("g", uuid.UUID(int=1), 1)


def snap(key: ShareKey) -> ShareSnapshot:
    return ShareSnapshot(key, 0, 1, 0, 0, 1, 1, (StateBatch(0, 1, 2, 1),))


def upd(key: ShareKey) -> ShareUpdate:
    return ShareUpdate(key, 0, -1, -1, (StateBatch(2, 2, 2, 1),))


def row(base: int, *records: ShareRecord) -> tuple[int, int, bytes]:
    data = build_batch([NewRecord(*encode(r)) for r in records], base_offset=base)
    return (base, base + len(records) - 1, data)


# ------------------------------------------------------------------ the URL


def test_the_password_goes_to_the_driver_and_nowhere_else() -> None:
    db = PgTarget("postgresql://app:p%40ss@db.example:5433/spool?sslmode=require")
    assert db.jdbc_url() == "jdbc:postgresql://db.example:5433/spool?sslmode=require"
    assert db.jdbc_properties() == {
        "driver": "org.postgresql.Driver",
        "user": "app",
        "password": "p@ss",
    }
    assert "p%40ss" not in db.masked and "p@ss" not in repr(db) and "***" in db.masked


def test_the_password_from_a_file_then_pgpassword(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGPASSWORD", "from-env")
    secret = tmp_path / "pw"
    secret.write_text("from-file\nignored\n")
    assert target("postgresql://app@h/db", secret).secret() == "from-file"
    assert target("postgresql://app@h/db").secret() == "from-env"
    with pytest.raises(ValueError, match="postgresql://"):
        target("mysql://app@h/db")
    with pytest.raises(ValueError) as missing:
        target("postgresql://app:hidden@h/db", tmp_path / "none")
    assert "hidden" not in str(missing.value)


# ------------------------------------------------------------------ compaction's choice


def test_a_row_goes_only_when_every_record_lies_before_its_keys_last_reset() -> None:
    rows = [
        summarize((*row(0, snap(A), snap(B)), "")),  # both superseded later
        summarize((*row(2, upd(A), snap(B)), "")),  # B's snapshot superseded, A's update too
        summarize((*row(4, snap(A)), "")),  # A's last reset: kept
        summarize((*row(5, upd(B)), "")),  # B has no later reset: kept
        summarize((*row(6, ShareTombstone(B)), "")),  # B's last reset, a tombstone: kept
    ]
    last = _last_reset(pair for s in rows for pair in resets(s))
    assert last == {(A.group_id, str(A.topic_id), 0): 4, (B.group_id, str(B.topic_id), 1): 6}
    assert [superseded(s, last) for s in rows] == [True, True, False, True, False]
    assert [relied_on(s, last) for s in rows] == [False, False, True, False, True]


# ------------------------------------------------------------------ the audit's row scan


def test_a_row_that_overlaps_or_misstates_its_base_offset_is_a_framing_violation() -> None:
    good = row(0, snap(A), upd(A))
    overlapping = row(1, upd(A))
    _base, last, data = row(7, upd(B))
    misplaced = (5, last, data)  # says 5, holds a batch at 7
    items = list(audit.scan_rows(0, [good, overlapping, misplaced]))
    found = [v for k, (_order, v) in items if k is None]
    assert all(isinstance(v, Violation) for v in found)
    assert [(v.segment, v.offset) for v in found] == [
        ("spool_batches[1]", 1),
        ("spool_batches[5]", 5),
    ]
    assert "overlaps" in found[0].message and "base offset 7" in found[1].message
    grouped = {k: parts for k, parts in items if k is not None}
    # Records keep their row and byte position: (row base offset, position in the row).
    index, records = grouped[(A.group_id, str(A.topic_id), 0)]
    assert index == 0 and [(o, where) for o, where, _k, _v in records] == [
        (0, (0, 0)),
        (1, (0, 0)),
        (1, (1, 0)),
    ]
