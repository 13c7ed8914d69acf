"""The share-state log's closed segments as rows, for Spark jobs (`spool compact`, audit).

The driver lists the closed segments (`closed_segments`: every `.log` of the log
directory but the last, which the broker is still appending to) and cuts big ones into
splits at batch boundaries (`plan_splits`); executors decode each split with
`read_split`, a pure function of the file's bytes built on `protocol.records` batch
parsing and `persister.share_records.decode`. `share_state_frame` does both and returns
a DataFrame in `ROW_SCHEMA`.

One row per record, in `ROW_FIELDS` order:

    segment, batch_base_offset, offset, timestamp, record_type (snapshot/update/tombstone),
    group_id, topic_id, partition, snapshot_epoch, state_epoch, leader_epoch,
    start_offset, create_timestamp_ms, write_timestamp_ms, delivery_complete_count,
    batches [(first_offset, last_offset, delivery_state, delivery_count)]

Fields a record type does not carry are null: a tombstone has only its key; an update
has no state epoch or timestamps. `delivery_complete_count` is null when the record does
not say (Kafka 4.2's tagged field absent, or -1).

pyspark is imported inside the functions that need it, so the broker (which uses
`closed_segments` when adopting a compaction) never loads it.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from persister.segment import LOG_SUFFIX, scan_batches
from persister.share_records import (
    ShareKey,
    ShareRecord,
    ShareSnapshot,
    ShareTombstone,
    ShareUpdate,
    StateBatch,
    decode,
)
from persister.spark.pg import jdbc_jar
from protocol.records import Record, decode_records, iter_batches

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

SHARE_STATE_DIR = "share-state"
# The cluster-metadata log every spool data dir has (coordinator.metadata.MetadataStore).
_META_DIR = "meta"
SNAPSHOT = "snapshot"
UPDATE = "update"
TOMBSTONE = "tombstone"
# Segments bigger than this are decoded by several tasks.
DEFAULT_SPLIT_BYTES = 32 * 1024 * 1024
_UNKNOWN_COUNT = -1

ROW_FIELDS = (
    "segment",
    "batch_base_offset",
    "offset",
    "timestamp",
    "record_type",
    "group_id",
    "topic_id",
    "partition",
    "snapshot_epoch",
    "state_epoch",
    "leader_epoch",
    "start_offset",
    "create_timestamp_ms",
    "write_timestamp_ms",
    "delivery_complete_count",
    "batches",
)
Row = tuple[Any, ...]


class NotASpoolDataDir(ValueError):
    """The directory given is not a spool data dir (or has no share-state log)."""


@dataclass(frozen=True, slots=True)
class SegmentFile:
    """A closed segment as it was when listed: what a compaction reads and replaces.

    `limit` is the next segment's base offset: every offset of this one lies below it.
    """

    name: str
    path: str
    base_offset: int
    limit: int
    size: int
    mtime_ns: int
    inode: int


@dataclass(frozen=True, slots=True)
class Split:
    """Bytes [start, end) of a segment file, beginning and ending on batch boundaries."""

    path: str
    name: str
    start: int
    end: int


def share_state_dir(data_dir: Path) -> Path:
    """The share-state log directory of a spool data dir; NotASpoolDataDir if it is not one."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise NotASpoolDataDir(f"{data_dir} is not a directory")
    log_dir = data_dir / SHARE_STATE_DIR
    if not (data_dir / _META_DIR).is_dir() or not log_dir.is_dir():
        raise NotASpoolDataDir(
            f"{data_dir} is not a spool data dir: it has no {_META_DIR}/ and "
            f"{SHARE_STATE_DIR}/ (pass the --data-dir the broker was started with)"
        )
    return log_dir


def segment_base_offsets(log_dir: Path) -> list[int]:
    """Base offsets of the log's `.log` files, sorted (the last is the active segment)."""
    bases = []
    for name in os.listdir(log_dir):
        stem, dot, suffix = name.partition(".")
        if dot and f".{suffix}" == LOG_SUFFIX and len(stem) == 20 and stem.isdigit():
            bases.append(int(stem))
    return sorted(bases)


def closed_segments(log_dir: Path) -> list[SegmentFile]:
    """The closed segments of the log in `log_dir`, oldest first: all but the last."""
    log_dir = Path(log_dir)
    bases = segment_base_offsets(log_dir)
    out = []
    for base, limit in itertools.pairwise(bases):
        path = log_dir / f"{base:020d}{LOG_SUFFIX}"
        st = path.stat()
        out.append(
            SegmentFile(path.name, str(path), base, limit, st.st_size, st.st_mtime_ns, st.st_ino)
        )
    return out


def plan_splits(
    segments: Sequence[SegmentFile], split_bytes: int = DEFAULT_SPLIT_BYTES
) -> list[Split]:
    """One split per segment, or several at batch boundaries for a segment over `split_bytes`."""
    splits = []
    for seg in segments:
        if seg.size <= split_bytes:
            splits.append(Split(seg.path, seg.name, 0, seg.size))
            continue
        fd = os.open(seg.path, os.O_RDONLY)
        try:
            start = 0
            for pos, header in scan_batches(fd, 0, seg.size, validate=False):
                if pos > start and pos + header.size - start > split_bytes:
                    splits.append(Split(seg.path, seg.name, start, pos))
                    start = pos
            splits.append(Split(seg.path, seg.name, start, seg.size))
        finally:
            os.close(fd)
    return splits


def _count(value: int) -> int | None:
    return None if value == _UNKNOWN_COUNT else value


def _row(name: str, base: int, offset: int, timestamp: int, record: ShareRecord) -> Row:
    key = record.key
    head = (name, base, offset, timestamp)
    ident = (key.group_id, str(key.topic_id), key.partition)
    if isinstance(record, ShareTombstone):
        return (*head, TOMBSTONE, *ident, *(None,) * 8)
    batches = [tuple(b) for b in record.batches]
    count = _count(record.delivery_complete_count)
    if isinstance(record, ShareSnapshot):
        return (
            *head,
            SNAPSHOT,
            *ident,
            record.snapshot_epoch,
            record.state_epoch,
            record.leader_epoch,
            record.start_offset,
            record.create_timestamp_ms,
            record.write_timestamp_ms,
            count,
            batches,
        )
    return (
        *head,
        UPDATE,
        *ident,
        record.snapshot_epoch,
        None,
        record.leader_epoch,
        record.start_offset,
        None,
        None,
        count,
        batches,
    )


def split_records(split: Split) -> Iterator[tuple[int, Record, ShareRecord]]:
    """(batch base offset, record, its share record) of each record in `split`, in
    offset order; ValueError (or CorruptRecordError) naming the file and offset for
    anything that is not a valid share-state record."""
    with open(split.path, "rb") as f:
        f.seek(split.start)
        data = f.read(split.end - split.start)
    for pos, header in iter_batches(data, validate=True):
        if header.is_control:
            continue
        for record in decode_records(data, pos, header):
            if record.key is None:
                raise ValueError(
                    f"{split.name}: record at offset {record.offset} has no key; it is not a "
                    "share-state record"
                )
            try:
                share = decode(record.key, record.value)
            except ValueError as exc:
                raise ValueError(f"{split.name}: record at offset {record.offset}: {exc}") from exc
            yield header.base_offset, record, share


def read_split(split: Split) -> Iterator[Row]:
    """Rows of the records in `split` (see the module docstring and `split_records`)."""
    for base, record, share in split_records(split):
        yield _row(split.name, base, record.offset, record.timestamp, share)


def read_segment(path: str | Path) -> Iterator[Row]:
    """Rows of every record of one segment file."""
    path = Path(path)
    yield from read_split(Split(str(path), path.name, 0, path.stat().st_size))


def record_of_row(row: Sequence[Any]) -> ShareRecord:
    """The share record a row describes (a tuple or a pyspark Row in `ROW_FIELDS` order)."""
    key = ShareKey(row[5], uuid.UUID(row[6]), row[7])
    kind = row[4]
    if kind == TOMBSTONE:
        return ShareTombstone(key)
    batches = tuple(StateBatch(*b) for b in row[15])
    count = _UNKNOWN_COUNT if row[14] is None else row[14]
    if kind == SNAPSHOT:
        return ShareSnapshot(
            key, row[8], row[9], row[10], row[11], row[12], row[13], batches, count
        )
    return ShareUpdate(key, row[8], row[10], row[11], batches, count)


def row_schema() -> StructType:
    """The Spark schema of the rows (`ROW_FIELDS`)."""
    from pyspark.sql.types import (
        ArrayType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
    )

    batch = StructType(
        [
            StructField("first_offset", LongType(), False),
            StructField("last_offset", LongType(), False),
            StructField("delivery_state", IntegerType(), False),
            StructField("delivery_count", IntegerType(), False),
        ]
    )
    types = {
        "segment": StringType(),
        "batch_base_offset": LongType(),
        "offset": LongType(),
        "timestamp": LongType(),
        "record_type": StringType(),
        "group_id": StringType(),
        "topic_id": StringType(),
        "partition": IntegerType(),
        "snapshot_epoch": IntegerType(),
        "state_epoch": IntegerType(),
        "leader_epoch": IntegerType(),
        "start_offset": LongType(),
        "create_timestamp_ms": LongType(),
        "write_timestamp_ms": LongType(),
        "delivery_complete_count": IntegerType(),
        "batches": ArrayType(batch, False),
    }
    required = {"segment", "batch_base_offset", "offset", "timestamp", "record_type"}
    required |= {"group_id", "topic_id", "partition"}
    return StructType([StructField(n, types[n], n not in required) for n in ROW_FIELDS])


@contextlib.contextmanager
def job_session(master: str | None, app_name: str) -> Iterator[SparkSession]:
    """The session a `spool compact` / `spool audit` run works in: `spark_session`,
    stopped at the end unless it was already running in this process before the run
    (then it belongs to whoever started it, e.g. a test session or a notebook)."""
    from pyspark.sql import SparkSession

    existing = SparkSession.getActiveSession()
    spark = spark_session(master, app_name)
    try:
        yield spark
    finally:
        if existing is None:
            spark.stop()


def spark_session(master: str | None = "local[*]", app_name: str = "spool") -> SparkSession:
    """A SparkSession for spool's jobs: no web UI, console progress on, quiet logs.

    `master` None keeps what spark-submit set (or Spark's own default, local[*]).
    """
    import sys

    from pyspark.sql import SparkSession

    # Executors run the same interpreter (and so find spool's packages) as the driver.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    if is_local_master(master):
        # A local job talks only to itself: loopback, whatever the host's name resolves
        # to. Against a cluster the executors must reach the driver, so Spark's own
        # choice (or SPARK_LOCAL_IP / spark.driver.host from the caller) stands.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = builder.config("spark.driver.host", os.environ["SPARK_LOCAL_IP"])
    jar = jdbc_jar()
    if jar is not None:
        # The PostgreSQL JDBC driver, for `--storage postgresql://...` (persister.spark.pg).
        builder = builder.config("spark.jars", jar)
    builder = (
        builder.config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "true")
        .config("spark.sql.shuffle.partitions", "8")
    )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def rows_rdd(spark: SparkSession, splits: Sequence[Split]) -> Any:
    """An RDD of rows: one task per split, decoded on the executors."""
    sc = spark.sparkContext
    return sc.parallelize(list(splits), max(len(splits), 1)).flatMap(read_split)


def share_state_frame(
    spark: SparkSession, segments: Sequence[SegmentFile], split_bytes: int = DEFAULT_SPLIT_BYTES
) -> DataFrame:
    """A DataFrame (`row_schema()`) of every record of `segments`."""
    return spark.createDataFrame(rows_rdd(spark, plan_splits(segments, split_bytes)), row_schema())


def is_local_master(master: str | None) -> bool:
    """Whether `master` runs the job in this process (`local`, `local[N]`, ...). None is
    what spark-submit set: its settings (driver host included) are left as they are."""
    if master is None:
        return False
    return master == "local" or master.startswith("local[")
