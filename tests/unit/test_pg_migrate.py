"""The streaming half of `spool migrate` (persister.pg_migrate), without a database: which
directories are logs, and how a log's batches become rows (gaps kept, small batches
grouped, a resume starting after the last copied row)."""

from __future__ import annotations

from pathlib import Path

import pytest

from persister.file_log import LogConfig, PartitionLog
from persister.pg_migrate import MigrateError, Row, rows_of, source_logs
from protocol.records import NewRecord, build_batch, iter_batches


def batch(base: int, count: int, size: int = 10, ts: int = 1000) -> bytes:
    return build_batch(
        [NewRecord(None, b"v" * size) for _ in range(count)],
        base_offset=base,
        default_timestamp=ts + base,
    )


def gappy_log(tmp_path: Path) -> PartitionLog:
    """A log with gaps between its batches, as compaction leaves one: offsets 0-2, 10-11,
    12, 40-44."""
    plog = PartitionLog.open(tmp_path / "log", LogConfig(), 0)
    for base, count in ((0, 3), (10, 2), (12, 1), (40, 5)):
        plog.append_raw(bytearray(batch(base, count)), 0)
    return plog


def bases(rows: list[Row]) -> list[list[int]]:
    """The base offsets of the batches in each row."""
    return [[h.base_offset for _, h in iter_batches(r.data)] for r in rows]


def test_gaps_are_kept_and_each_row_says_its_first_and_last_offsets(tmp_path: Path) -> None:
    plog = gappy_log(tmp_path)
    rows = list(rows_of(plog.read, 0, plog.log_end_offset, row_bytes=1))
    assert bases(rows) == [[0], [10], [12], [40]]
    assert [(r.base_offset, r.last_offset) for r in rows] == [(0, 2), (10, 11), (12, 12), (40, 44)]
    assert [r.max_timestamp for r in rows] == [1000, 1010, 1012, 1040]
    assert b"".join(r.data for r in rows) == plog.read(0, 1 << 20)


def test_small_batches_share_a_row_and_a_chunk_boundary_changes_nothing(tmp_path: Path) -> None:
    plog = gappy_log(tmp_path)
    whole = plog.read(0, 1 << 20)
    grouped = list(rows_of(plog.read, 0, plog.log_end_offset))
    assert len(grouped) == 1 and grouped[0].data == whole
    assert (grouped[0].base_offset, grouped[0].last_offset) == (0, 44)
    assert grouped[0].max_timestamp == 1040
    # One batch per read: the same rows.
    tiny = list(rows_of(plog.read, 0, plog.log_end_offset, chunk_bytes=1))
    assert tiny == grouped


def test_a_resume_starts_at_the_batch_after_the_last_copied_row(tmp_path: Path) -> None:
    plog = gappy_log(tmp_path)
    # The last copied row ended at 11: the copy goes on from 12 (no batch is sent twice).
    rows = list(rows_of(plog.read, 12, plog.log_end_offset, row_bytes=1))
    assert bases(rows) == [[12], [40]]
    # From inside a gap: the next batch after it.
    rows = list(rows_of(plog.read, 13, plog.log_end_offset, row_bytes=1))
    assert bases(rows) == [[40]]


def test_the_batch_holding_the_log_start_is_copied_whole(tmp_path: Path) -> None:
    plog = gappy_log(tmp_path)
    plog.delete_records_before(11)
    rows = list(rows_of(plog.read, plog.log_start_offset, plog.log_end_offset, row_bytes=1))
    assert bases(rows) == [[10], [12], [40]]


def test_an_empty_log_has_no_rows_and_a_missing_batch_is_an_error(tmp_path: Path) -> None:
    assert list(rows_of(lambda _o, _n: b"", 5, 5)) == []
    with pytest.raises(MigrateError, match="no record batch at offset 3"):
        list(rows_of(lambda _o, _n: b"", 3, 9))


def test_batches_past_the_planned_end_are_left_out(tmp_path: Path) -> None:
    plog = gappy_log(tmp_path)
    rows = list(rows_of(plog.read, 0, 12, row_bytes=1))
    assert bases(rows) == [[0], [10]]


def test_the_logs_of_a_data_dir_are_named_as_the_storage_engine_names_them(
    tmp_path: Path,
) -> None:
    for name in ("meta", "groups", "share-state", "transactions"):
        (tmp_path / name).mkdir()
    topics = tmp_path / "topics"
    for name in ("orders-0", "orders-1", "my-topic-12", "gone-0.abc123-delete", "junk"):
        (topics / name).mkdir(parents=True)
    (topics / "orders-0" / "partition.metadata").write_text("version: 0\ntopic_id: abc\n")
    (topics / "stray-3").write_text("a file, not a log")
    found = source_logs(tmp_path)
    assert [s.name for s in found] == [
        "groups",
        "meta",
        "share-state",
        "topics/my-topic-12",
        "topics/orders-0",
        "topics/orders-1",
        "transactions",
    ]
    assert {s.name: s.topic_id for s in found}["topics/orders-0"] == "abc"
    assert [s.coordinator for s in found].count(True) == 4


def test_a_directory_without_a_metadata_log_is_not_a_data_dir(tmp_path: Path) -> None:
    (tmp_path / "topics").mkdir()
    with pytest.raises(MigrateError, match="not the data dir of a spool broker"):
        source_logs(tmp_path)


def test_the_cli_takes_a_password_file_and_refuses_a_url_that_is_not_postgresql(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from broker.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(
        ["migrate", "--from", "d", "--to", "postgresql://u@h/db", "--storage-password-file", "f"]
    )
    assert (args.source, args.url, args.password_file) == (
        Path("d"),
        "postgresql://u@h/db",
        Path("f"),
    )
    args = parser.parse_args(["migrate", "--from", "d", "--to", "mysql://u:pw@h/db"])
    assert args.run(args) == 2
    assert "postgresql://" in capsys.readouterr().err
    missing = str(tmp_path / "missing")
    args = parser.parse_args(
        ["migrate", "--from", "d", "--to", "postgresql://u@h/db", "--password-file", missing]
    )
    assert args.run(args) == 2
    assert "--password-file" in capsys.readouterr().err
