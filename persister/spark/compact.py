"""`spool compact`: fold the share-state log's closed segments into one snapshot per key.

Reads every closed segment of `DATA/share-state/` (never the active one) on Spark and
folds each key's (group, topic id, partition) records into one ShareSnapshot with
`persister.share_replay` (the coordinator's own replay rules), in one pass: each split
folds its keys from their last snapshot or tombstone in it and keeps their raw updates
where it has none (`fold_split`), so what is shuffled is one small run per key and
split; each key's runs are then folded in offset order (`fold_runs`). Keys whose state
ends deleted are dropped; the snapshots are written as new segments into a staging
directory `share-state/compacted-<id>/`, plus `manifest.json`, written last.

Offsets: each snapshot keeps the offset (and timestamp) of its key's last record in the
input, so the output lies inside the input's offset range, in order, and replaying it
followed by the segments it did not cover gives the same state as the original: for
every key the output holds the state as of the end of the input.

The broker adopts the output (`persister.spark.adopt`) only if the input segments are
still exactly those the manifest names (size, mtime, inode, CRC32); if the broker has
compacted or truncated any of them since, the output is stale and discarded. A running
broker adopts it on its next compaction round; a stopped one at start.

With `--storage postgresql://...` the log is the database's rows instead: superseded
rows are deleted in place while the broker runs (persister.spark.pg_compact).

Also runnable as `spark-submit persister/spark/compact.py --data-dir DIR`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NamedTuple

from persister.files import write_synced
from persister.segment import LOG_SUFFIX
from persister.share_records import ShareKey, ShareSnapshot, ShareUpdate, decode, encode
from persister.share_replay import apply, fold
from persister.spark.pg import StorageUnavailable, add_source_arguments, source_target
from persister.spark.pg_compact import CompactionConflict, compact_pg
from persister.spark.segments import (
    DEFAULT_SPLIT_BYTES,
    SNAPSHOT,
    TOMBSTONE,
    UPDATE,
    NotASpoolDataDir,
    SegmentFile,
    Split,
    closed_segments,
    job_session,
    plan_splits,
    record_of_row,
    share_state_dir,
    split_records,
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
# The smallest split compact cuts a segment into for parallelism alone.
MIN_SPLIT_BYTES = 1 << 20

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


class KeyRun(NamedTuple):
    """One key's records in one split, as the map side leaves them (`fold_split`).

    `reset`: the split holds a snapshot or tombstone of the key, and `state` is the key's
    state at its last record there, encoded (None: deleted). Otherwise `updates` are its
    updates' raw values (all under `update_key`), which need the state before the split.
    """

    last_offset: int
    last_timestamp: int
    reset: bool
    state: tuple[bytes, bytes | None] | None
    update_key: bytes | None
    updates: list[bytes]


class _Run:
    """A key's `KeyRun` while its split is read."""

    __slots__ = ("last_offset", "last_timestamp", "reset", "state", "update_key", "updates")

    def __init__(self) -> None:
        self.last_offset = self.last_timestamp = -1
        self.reset = False
        self.state: ShareSnapshot | None = None
        self.update_key: bytes | None = None
        self.updates: list[bytes] = []

    def done(self) -> KeyRun:
        state = None
        if self.reset and self.state is not None:
            state = encode(self.state)
        return KeyRun(
            self.last_offset, self.last_timestamp, self.reset, state, self.update_key, self.updates
        )


def fold_split(split: Split) -> Iterator[tuple[Any, Any]]:
    """Executor side: per key of `split`, `(key, KeyRun)`, and `(None, counts by record
    type)`. Updates after a key's snapshot or tombstone are folded here, so what is
    shuffled is one small item per key and split, not every record."""
    runs: dict[ShareKey, _Run] = {}
    counts: Counter[str] = Counter()
    for _base, record, share in split_records(split):
        run = runs.get(share.key)
        if run is None:
            run = runs[share.key] = _Run()
        run.last_offset, run.last_timestamp = record.offset, record.timestamp
        if isinstance(share, ShareUpdate):
            counts[UPDATE] += 1
            if run.reset:
                run.state = apply(run.state, share)
            else:
                assert record.key is not None and record.value is not None
                run.update_key = record.key
                run.updates.append(record.value)
            continue
        counts[SNAPSHOT if isinstance(share, ShareSnapshot) else TOMBSTONE] += 1
        # The key's state from here on owes nothing to what came before.
        run.reset, run.updates, run.update_key = True, [], None
        run.state = share if isinstance(share, ShareSnapshot) else None
    for key, run in runs.items():
        yield (key.group_id, str(key.topic_id), key.partition), run.done()
    yield None, dict(counts)


def fold_runs(runs: Iterable[KeyRun]) -> Snapshot | None:
    """Executor side: one key's KeyRuns (any order) to the encoded snapshot of its state
    at its last record, or None when the key is deleted: `fold_key` of its records."""
    ordered = sorted(runs, key=lambda run: run.last_offset)
    state: ShareSnapshot | None = None
    first = 0
    for i in range(len(ordered) - 1, -1, -1):
        run = ordered[i]
        if run.reset:
            state = None if run.state is None else _snapshot(*run.state)
            first = i + 1
            break
    for run in ordered[first:]:
        for update in run.updates:
            assert run.update_key is not None
            state = apply(state, decode(run.update_key, update))
    if state is None:
        return None
    key, value = encode(state)
    assert value is not None
    last = ordered[-1]
    return (last.last_offset, last.last_timestamp, key, value)


def _snapshot(key: bytes, value: bytes | None) -> ShareSnapshot:
    state = decode(key, value)
    assert isinstance(state, ShareSnapshot)
    return state


def _fold_splits(splits: Iterable[Split]) -> Iterator[tuple[Any, Any]]:
    for split in splits:
        yield from fold_split(split)


def _finish(item: tuple[Any, Iterable[Any]]) -> tuple[str, Any]:
    key, values = item
    if key is None:
        counts: Counter[str] = Counter()
        for split_counts in values:
            counts.update(split_counts)
        return ("counts", dict(counts))
    return ("snapshot", fold_runs(values))


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
        write_synced(staging / name, bytes(buf))
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
    write_synced(tmp, json.dumps(manifest, indent=2, sort_keys=True).encode())
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
    module docstring. NotASpoolDataDir if `data_dir` is not a spool data dir.
    `split_bytes`: the most one task decodes."""
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

    # Splits enough to keep every core busy (a log of one segment is otherwise one
    # task), none so small that a task costs more than its work.
    cores = spark.sparkContext.defaultParallelism
    split_bytes = min(split_bytes, max(MIN_SPLIT_BYTES, -(-bytes_in // (2 * cores))))
    splits = plan_splits(segments, split_bytes)
    _progress(progress, f"stage 2/4: decoding and folding {len(splits)} splits on the executors")
    # One pass: each split folded per key on the map side (`fold_split`), then each key's
    # runs folded in offset order (`fold_runs`).
    results = (
        spark.sparkContext.parallelize(splits, max(len(splits), 1))
        .mapPartitions(_fold_splits)
        .groupByKey()
        .map(_finish)
        .collect()
    )
    by_type: dict[str, int] = {}
    folded = []
    for tag, value in results:
        if tag == "counts":
            by_type = value
        else:
            folded.append(value)
    _progress(progress, f"stage 3/4: folded {sum(by_type.values())} records {by_type} per key")
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
    add_source_arguments(parser)
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
        "compaction round (log.cleaner.backoff.ms), a stopped one when it starts. With "
        "--storage, remove the database's share-state rows whose every record is "
        "superseded, while the broker runs.",
    )
    _add_arguments(parser, "local[*]")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.data_dir is None:
        return _run_storage(args)
    try:
        share_state_dir(args.data_dir)
    except NotASpoolDataDir as exc:
        print(f"spool compact: {exc}", file=sys.stderr)
        return 2
    with job_session(args.master, "spool-compact") as spark:
        try:
            compact(spark, args.data_dir, segment_bytes=args.segment_bytes)
        except (ValueError, OSError) as exc:
            print(f"spool compact: failed: {exc}", file=sys.stderr)
            return 1
    return 0


def _run_storage(args: argparse.Namespace) -> int:
    """`spool compact --storage URL` (persister.spark.pg_compact)."""
    try:
        db = source_target(args)
    except StorageUnavailable as exc:
        print(f"spool compact: {exc}", file=sys.stderr)
        return 2
    with job_session(args.master, "spool-compact") as spark:
        try:
            compact_pg(spark, db)
        except StorageUnavailable as exc:
            print(f"spool compact: {db.masked}: {exc}", file=sys.stderr)
            return 2
        except (ValueError, OSError, CompactionConflict) as exc:
            print(f"spool compact: failed: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(prog="compact.py", description=__doc__)
    _add_arguments(_parser, None)
    sys.exit(run(_parser.parse_args()))
