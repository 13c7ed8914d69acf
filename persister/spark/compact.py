"""`spool compact`: fold the share-state log's closed segments into one snapshot per key.

Reads every closed segment of `DATA/share-state/` (never the active one) on Spark,
keeps per key (group, topic id, partition) its last snapshot or tombstone and the
updates after it (combiners drop older records before the shuffle), folds those into
one ShareSnapshot on the executors
with `persister.share_fold.fold` (the coordinator's own replay rules), drops keys whose
state ends deleted, and writes the snapshots as new segments into a staging directory
`share-state/compacted-<id>/`, plus `manifest.json`, written last.

Offsets: each snapshot keeps the offset (and timestamp) of its key's last record in the
input, so the output lies inside the input's offset range, in order, and replaying it
followed by the segments it did not cover gives the same state as the original: for
every key the output holds the state as of the end of the input.

The broker adopts the output (`persister.spark.adopt`) only if the input segments are
still exactly those the manifest names (size, mtime, inode, CRC32); if the broker has
compacted or truncated any of them since, the output is stale and discarded. A running
broker adopts it on its next compaction round; a stopped one at start.

Also runnable as `spark-submit persister/spark/compact.py --data-dir DIR`.
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import sys
import time
import uuid
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from persister.segment import LOG_SUFFIX
from persister.share_fold import fold
from persister.share_records import encode
from persister.spark.segments import (
    DEFAULT_SPLIT_BYTES,
    UPDATE,
    NotASpoolDataDir,
    Row,
    SegmentFile,
    closed_segments,
    plan_splits,
    record_of_row,
    rows_rdd,
    share_state_dir,
)
from protocol.records import Record, build_batch, parse_header

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "spool-share-state-compaction"
MANIFEST_VERSION = 1
STAGING_PREFIX = "compacted-"
# share.coordinator.state.topic.segment.bytes default: output segments roll at this size.
DEFAULT_SEGMENT_BYTES = 104857600
# Records per output batch: small enough to keep batches far below max.message.bytes.
_BATCH_RECORDS = 256
_BATCH_BYTES = 512 * 1024
_CRC_CHUNK = 1 << 20

# (offset, timestamp, key bytes, value bytes) of one output snapshot.
Snapshot = tuple[int, int, bytes, bytes]


@dataclass(frozen=True, slots=True)
class CompactionOutput:
    """What a run wrote (None staging: nothing to compact)."""

    staging: Path | None
    manifest: dict[str, Any]


def file_crc32(path: str | Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CRC_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(path: Path, data: bytes) -> None:
    """Write and fsync `path`."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def fold_key(rows: Iterable[Sequence[Any]]) -> Snapshot | None:
    """Executor side: one key's kept rows (last reset and what follows, any order) to the
    encoded snapshot of its state at its last record, or None when the key is deleted."""
    ordered = sorted(rows, key=lambda row: row[2])
    state = fold(record_of_row(row) for row in ordered)
    if state is None:
        return None
    key, value = encode(state)
    assert value is not None
    last = ordered[-1]
    return (last[2], last[3], key, value)


def _since_last_reset(rows: list[Row]) -> list[Row]:
    resets = [row[2] for row in rows if row[4] != UPDATE]
    if not resets:
        return rows
    last = max(resets)
    return [row for row in rows if row[2] >= last]


def _first_row(row: Row) -> list[Row]:
    return [row]


def _add_row(rows: list[Row], row: Row) -> list[Row]:
    rows.append(row)
    return _since_last_reset(rows) if row[4] != UPDATE else rows


def _merge_rows(a: list[Row], b: list[Row]) -> list[Row]:
    return _since_last_reset(a + b)


def _batches(snapshots: Sequence[Snapshot], max_bytes: int) -> Iterable[bytes]:
    batch: list[Record] = []
    size = 0
    for offset, timestamp, key, value in snapshots:
        batch.append(Record(offset, timestamp, key, value))
        size += len(key) + len(value)
        if len(batch) >= _BATCH_RECORDS or size >= max_bytes:
            yield build_batch(batch, base_offset=batch[0].offset)
            batch, size = [], 0
    if batch:
        yield build_batch(batch, base_offset=batch[0].offset)


def write_segments(
    staging: Path, first: int, snapshots: Sequence[Snapshot], segment_bytes: int
) -> list[dict[str, Any]]:
    """Write the snapshots (sorted by offset) as segment files in `staging`, each fsynced;
    the first is named `first` (the base offset of the run it replaces), each later one
    its first batch's base offset. At least one file, empty if there are no snapshots."""
    files: list[tuple[int, bytearray, int]] = [(first, bytearray(), 0)]
    # Batches of at most half a segment, so segments hold several and roll near the size.
    for data in _batches(snapshots, min(_BATCH_BYTES, segment_bytes // 2)):
        header = parse_header(data)
        base, buf, count = files[-1]
        if buf and len(buf) + len(data) > segment_bytes:
            files.append((header.base_offset, bytearray(), 0))
            base, buf, count = files[-1]
        buf += data
        files[-1] = (base, buf, count + header.records_count)
    outputs = []
    for base, buf, count in files:
        name = f"{base:020d}{LOG_SUFFIX}"
        write_file(staging / name, bytes(buf))
        outputs.append(
            {
                "file": name,
                "base_offset": base,
                "size": len(buf),
                "crc32": zlib.crc32(buf),
                "records": count,
            }
        )
    return outputs


def describe_inputs(segments: Sequence[SegmentFile]) -> list[dict[str, Any]]:
    return [
        {
            "file": s.name,
            "base_offset": s.base_offset,
            "limit_offset": s.limit,
            "size": s.size,
            "mtime_ns": s.mtime_ns,
            "inode": s.inode,
            "crc32": file_crc32(s.path),
        }
        for s in segments
    ]


def write_manifest(staging: Path, manifest: dict[str, Any]) -> None:
    """The manifest last, atomically (temp file, fsync, rename, fsync the directory): a
    staging directory without one is unfinished and never adopted."""
    tmp = staging / (MANIFEST + ".tmp")
    write_file(tmp, json.dumps(manifest, indent=2, sort_keys=True).encode())
    os.replace(tmp, staging / MANIFEST)
    fsync_path(staging)
    fsync_path(staging.parent)


def _progress(out: IO[str], message: str) -> None:
    print(f"spool compact: {message}", file=out, flush=True)


def compact(
    spark: Any,
    data_dir: Path,
    *,
    segment_bytes: int = DEFAULT_SEGMENT_BYTES,
    split_bytes: int = DEFAULT_SPLIT_BYTES,
    progress: IO[str] = sys.stderr,
) -> CompactionOutput:
    """Compact the closed segments of `data_dir`'s share-state log with `spark`; see the
    module docstring. NotASpoolDataDir if `data_dir` is not a spool data dir."""
    from pyspark import StorageLevel

    log_dir = share_state_dir(data_dir)
    segments = closed_segments(log_dir)
    if not segments:
        _progress(progress, f"{log_dir} has no closed segments; nothing to compact")
        return CompactionOutput(None, {})
    first, limit = segments[0].base_offset, segments[-1].limit
    bytes_in = sum(s.size for s in segments)
    _progress(
        progress,
        f"stage 1/4: {len(segments)} closed segments, {bytes_in} bytes, offsets "
        f"{first}..{limit - 1}; checksumming",
    )
    inputs = describe_inputs(segments)

    _progress(progress, "stage 2/4: decoding segments on the executors")
    rows = rows_rdd(spark, plan_splits(segments, split_bytes)).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        by_type = dict(rows.map(lambda row: (row[4], 1)).reduceByKey(operator.add).collect())
        _progress(progress, f"stage 3/4: folding {sum(by_type.values())} records {by_type} per key")
        # Per key only its last snapshot or tombstone and what follows matter: the
        # combiners drop the rest before the shuffle (each split is in offset order).
        folded = (
            rows.map(lambda row: ((row[5], row[6], row[7]), row))
            .combineByKey(_first_row, _add_row, _merge_rows)
            .map(lambda kv: fold_key(kv[1]))
            .collect()
        )
    finally:
        rows.unpersist()
    snapshots = sorted(s for s in folded if s is not None)
    dropped = len(folded) - len(snapshots)

    run_id = f"{int(time.time() * 1000)}-{uuid.uuid4().hex[:8]}"
    staging = log_dir / f"{STAGING_PREFIX}{run_id}"
    _progress(progress, f"stage 4/4: writing {len(snapshots)} snapshots to {staging}")
    staging.mkdir()
    outputs = write_segments(staging, first, snapshots, segment_bytes)
    bytes_out = sum(o["size"] for o in outputs)
    manifest = {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "id": run_id,
        "first_offset": first,
        "limit_offset": limit,
        "inputs": inputs,
        "outputs": outputs,
        "records_in": sum(by_type.values()),
        "records_in_by_type": by_type,
        "records_out": len(snapshots),
        "keys_kept": len(snapshots),
        "keys_dropped": dropped,
        "bytes_in": bytes_in,
        "bytes_out": bytes_out,
    }
    write_manifest(staging, manifest)
    _progress(
        progress,
        f"done: {bytes_in} -> {bytes_out} bytes, {manifest['records_in']} -> "
        f"{len(snapshots)} records, {dropped} deleted keys dropped; the broker adopts "
        f"{staging.name} on its next compaction round (or at start)",
    )
    return CompactionOutput(staging, manifest)


# ------------------------------------------------------------------ command line


def _add_arguments(parser: argparse.ArgumentParser, default_master: str | None) -> None:
    parser.add_argument("--data-dir", type=Path, required=True, help="the broker's data dir")
    parser.add_argument(
        "--master",
        default=default_master,
        help="Spark master URL (default local[*]; under spark-submit, its --master)",
    )
    parser.add_argument(
        "--segment-bytes",
        type=int,
        default=DEFAULT_SEGMENT_BYTES,
        help="size of the output segments (share.coordinator.state.topic.segment.bytes)",
    )


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "compact",
        help="compact the share-state log's closed segments on Spark",
        description="Fold the closed segments of DATA/share-state/ into one snapshot per "
        "share partition, on Spark. A running broker adopts the output on its next "
        "compaction round (log.cleaner.backoff.ms), a stopped one when it starts.",
    )
    _add_arguments(parser, "local[*]")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        share_state_dir(args.data_dir)
    except NotASpoolDataDir as exc:
        print(f"spool compact: {exc}", file=sys.stderr)
        return 2
    from persister.spark.segments import spark_session

    spark = spark_session(args.master, "spool-compact")
    try:
        compact(spark, args.data_dir, segment_bytes=args.segment_bytes)
    except (ValueError, OSError) as exc:
        print(f"spool compact: failed: {exc}", file=sys.stderr)
        return 1
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(prog="compact.py", description=__doc__)
    _add_arguments(_parser, None)
    sys.exit(run(_parser.parse_args()))
