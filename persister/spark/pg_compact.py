"""`spool compact --storage postgresql://...`: remove superseded share-state rows.

On PostgreSQL the share-state log is rows of `spool_batches`, one per append
(persister.spark.pg). Compaction decides as the file compaction does
(persister.share_compaction): a key's records before its last snapshot or tombstone are
superseded, since replay makes its state after a snapshot depend on that snapshot alone
and after a tombstone on nothing. A row is removed when every record in it is
superseded; a row holding any record still needed is kept whole, never rewritten (its
bytes stay the ones the broker wrote and its data dir holds, and no new row is written
under a broker appending to the same log). A key's last tombstone is kept too (the file
compaction drops it, but here an older record of the key may stay in a row kept for
another key's sake, and the tombstone is what deletes it again on replay). So the rows
left replay, key by key, to the state the whole log replays to, with gaps in the
offsets where rows went, which replay and the engine's restore step over.

Safety against a running broker, which appends rows at higher offsets as this runs:

- Only rows below a bound are read and removed: the base offset of the rows of the
  log's last commit (its rows share a transaction id, `xmin`). The broker may undo its
  last commit (one whose answer it lost is removed by its next commit of the log, see
  persister.pg_commit); every earlier commit is settled, so a snapshot or tombstone
  relied on below the bound stays.
- Spark reads the rows below the bound (through the JDBC source) and decides; then one
  transaction, under an advisory lock that serialises compactions, checks that every
  row it removes or relies on (each key's last reset) is still there with the same
  bytes (md5), and deletes the removed rows by their primary key. Nothing else is
  touched: `spool_logs` (log start and end offsets, the broker's epoch) stays, and no
  lock the broker's commits take is held, so they go on while it runs. If a row
  changed, nothing is deleted and the run says to try again.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any

from persister.share_records import ShareTombstone, ShareUpdate, decode
from persister.spark.pg import (
    SHARE_STATE_LOG,
    TABLE,
    PgTarget,
    StorageUnavailable,
    batch_frame,
    count_rows,
)
from persister.spark.pg import logs as pg_logs
from persister.spark.segments import SNAPSHOT, TOMBSTONE, UPDATE
from protocol.records import decode_records, iter_batches

# pg_advisory_xact_lock key of compactions: "spool" in ASCII plus 2 (pg_schema's
# migrations use plus 1).
COMPACT_LOCK = 0x73706F6F6C02

ShareKeyTuple = tuple[str, str, int]
# One row as the executors summarise it: base offset, last offset, md5 of its data, its
# size, and (key, offset, record type) of each record.
RowSummary = tuple[int, int, str, int, list[tuple[ShareKeyTuple, int, str]]]


class CompactionConflict(RuntimeError):
    """A row the compaction read changed before it could delete: nothing was deleted."""


@dataclass(frozen=True, slots=True)
class PgCompaction:
    """What a run read and removed."""

    bound: int
    rows_read: int
    records_read: int
    bytes_read: int
    rows_deleted: int
    records_deleted: int
    bytes_deleted: int
    keys: int

    def to_dict(self) -> dict[str, int]:
        return {
            "bound": self.bound,
            "rows_read": self.rows_read,
            "records_read": self.records_read,
            "bytes_read": self.bytes_read,
            "rows_deleted": self.rows_deleted,
            "records_deleted": self.records_deleted,
            "bytes_deleted": self.bytes_deleted,
            "keys": self.keys,
        }


def summarize(row: Any) -> RowSummary:
    """Executor side: a row (base_offset, last_offset, data, md5) decoded to its records'
    keys, offsets and types. ValueError (CorruptRecordError) on anything that is not a
    sound batch of share-state records: the run then removes nothing."""
    base, last, data = int(row[0]), int(row[1]), bytes(row[2])
    records = []
    for pos, header in iter_batches(data, validate=True):
        if header.is_control:
            continue
        for record in decode_records(data, pos, header):
            if record.key is None:
                raise ValueError(f"{TABLE} row {base}: record at offset {record.offset} has no key")
            try:
                share = decode(record.key, record.value)
            except ValueError as exc:
                raise ValueError(f"{TABLE} row {base}: offset {record.offset}: {exc}") from exc
            kind = SNAPSHOT
            if isinstance(share, ShareTombstone):
                kind = TOMBSTONE
            elif isinstance(share, ShareUpdate):
                kind = UPDATE
            k = share.key
            records.append(((k.group_id, str(k.topic_id), k.partition), record.offset, kind))
    return (base, last, hashlib.md5(data).hexdigest(), len(data), records)


def resets(summary: RowSummary) -> Iterator[tuple[ShareKeyTuple, int]]:
    """(key, offset) of each snapshot or tombstone of a row."""
    for key, offset, kind in summary[4]:
        if kind != UPDATE:
            yield key, offset


def superseded(summary: RowSummary, last_reset: dict[ShareKeyTuple, int]) -> bool:
    """Whether every record of the row lies before its key's last reset (the reset
    itself is kept, a tombstone included: see the module docstring)."""
    records = summary[4]
    if not records:
        return False  # control batches only (none in a share-state log): left alone
    for key, offset, _kind in records:
        reset = last_reset.get(key)
        if reset is None or offset >= reset:
            return False
    return True


def relied_on(summary: RowSummary, last_reset: dict[ShareKeyTuple, int]) -> bool:
    """Whether the row holds some key's last reset."""
    return any(last_reset.get(key) == offset for key, offset, kind in summary[4] if kind != UPDATE)


def settled_bound(db: PgTarget, log_id: int) -> int | None:
    """The base offset of the rows of the log's last commit (None: no rows)."""

    async def work(conn: Any) -> int | None:
        value = await conn.fetchval(
            f"SELECT min(base_offset) FROM {TABLE} WHERE log_id = $1 AND xmin = "
            f"(SELECT xmin FROM {TABLE} WHERE log_id = $1 ORDER BY base_offset DESC LIMIT 1)",
            log_id,
        )
        return None if value is None else int(value)

    return db.run(work)


def delete_rows(
    db: PgTarget, log_id: int, bound: int, deleted: dict[int, str], checked: dict[int, str]
) -> int:
    """In one transaction: check that the rows `deleted` and `checked` (base offset ->
    md5) are as read, then delete the `deleted` ones; how many went.
    CompactionConflict when any changed."""

    async def work(conn: Any) -> int:
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", COMPACT_LOCK)
            expected = {**checked, **deleted}
            found = await conn.fetch(
                f"SELECT base_offset, md5(data) AS md5 FROM {TABLE} "
                "WHERE log_id = $1 AND base_offset = ANY($2::bigint[])",
                log_id,
                list(expected),
            )
            now = {int(r["base_offset"]): r["md5"] for r in found}
            changed = sorted(base for base, md5 in expected.items() if now.get(base) != md5)
            if changed:
                raise CompactionConflict(
                    f"{len(changed)} rows changed or went since they were read (first at "
                    f"base offset {changed[0]}): nothing deleted; run again"
                )
            status = await conn.execute(
                f"DELETE FROM {TABLE} WHERE log_id = $1 AND base_offset = ANY($2::bigint[]) "
                "AND base_offset < $3",
                log_id,
                sorted(deleted),
                bound,
            )
            return int(status.split()[-1])

    return db.run(work)


def _say(out: IO[str], message: str) -> None:
    print(f"spool compact: {message}", file=out, flush=True)


def _last_reset(pairs: Iterable[tuple[ShareKeyTuple, int]]) -> dict[ShareKeyTuple, int]:
    last: dict[ShareKeyTuple, int] = {}
    for key, offset in pairs:
        if offset > last.get(key, -1):
            last[key] = offset
    return last


def compact_pg(spark: Any, db: PgTarget, progress: IO[str] = sys.stderr) -> PgCompaction:
    """Remove the superseded rows of the database's share-state log; see the module
    docstring. StorageUnavailable when it is not a spool database; CompactionConflict
    when a row changed under the run (nothing deleted then)."""
    from pyspark import StorageLevel

    logs = pg_logs(db)
    share = logs.get(SHARE_STATE_LOG)
    bound = None if share is None else settled_bound(db, share.log_id)
    if share is None or bound is None:
        _say(progress, f"{db.masked} has no {SHARE_STATE_LOG} rows; nothing to compact")
        return PgCompaction(0, 0, 0, 0, 0, 0, 0, 0)
    rows, first = count_rows(db, share.log_id, bound)
    if not rows or first is None:
        _say(progress, f"only the last commit's rows (from offset {bound}); nothing to compact")
        return PgCompaction(bound, 0, 0, 0, 0, 0, 0, 0)
    _say(
        progress,
        f"stage 1/3: reading {rows} rows of {SHARE_STATE_LOG} below offset {bound} "
        f"(the rows of the broker's last commit and later are left) through JDBC",
    )
    frame = batch_frame(spark, db, share.log_id, first, bound, rows)
    summaries = frame.rdd.map(summarize).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        last_reset = _last_reset(summaries.flatMap(resets).reduceByKey(max).collect())
        _say(progress, f"stage 2/3: {len(last_reset)} keys have a snapshot or tombstone")
        reset_b = spark.sparkContext.broadcast(last_reset)
        totals = summaries.map(lambda s: (1, len(s[4]), s[3])).reduce(
            lambda a, b: (a[0] + b[0], a[1] + b[1], a[2] + b[2])
        )
        dead = (
            summaries.filter(lambda s: superseded(s, reset_b.value))
            .map(lambda s: (s[0], s[2], s[3], len(s[4])))
            .collect()
        )
        keep = (
            summaries.filter(lambda s: relied_on(s, reset_b.value))
            .map(lambda s: (s[0], s[2]))
            .collect()
        )
        keys = summaries.flatMap(lambda s: [r[0] for r in s[4]]).distinct().count()
    finally:
        summaries.unpersist()
    deleted = {base: md5 for base, md5, _size, _n in dead}
    _say(
        progress,
        f"stage 3/3: deleting {len(deleted)} of {totals[0]} rows whose every record is "
        "superseded, in one transaction",
    )
    gone = delete_rows(db, share.log_id, bound, deleted, dict(keep)) if deleted else 0
    result = PgCompaction(
        bound,
        totals[0],
        totals[1],
        totals[2],
        gone,
        sum(n for _b, _m, _s, n in dead),
        sum(size for _b, _m, size, _n in dead),
        keys,
    )
    _say(
        progress,
        f"done: {result.rows_deleted} rows ({result.records_deleted} records, "
        f"{result.bytes_deleted} bytes) removed of {result.rows_read} ({result.records_read} "
        f"records, {result.bytes_read} bytes) below offset {bound}, {keys} keys",
    )
    return result


__all__ = ["CompactionConflict", "PgCompaction", "StorageUnavailable", "compact_pg"]
