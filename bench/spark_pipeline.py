"""Spark pipeline throughput: `spool compact` and `spool audit` over share-state logs.

    python -m bench --only spark_pipeline                   # 10^5 and 10^6 records
    SPOOL_BENCH_SPARK_RECORDS=100000,1000000,10000000 python -m bench --only spark_pipeline
    python -m bench.spark_pipeline --records 100000,1000000 --master 'local[2]'

For each size a data dir is written in a temp dir: `meta/` and a share-state log of that
many records, encoded with `persister.share_records` and appended by the coordinators'
record-log writer (`persister.coordinator_log.RecordLog`) in batches of 100, as the share
coordinator writes them. KEYS share partitions take turns; each record of a key
acknowledges its next 10 offsets and moves its start offset, and every
SNAPSHOT_EVERY-th record of a key is a ShareSnapshot of the state so far (Kafka's
share.coordinator.snapshot.update.records.per.snapshot), so the log folds to one valid
state per key. After the last record the log rolls, so every generated record lies in a
closed segment (compaction never reads the active one).

Then, with one SparkSession (its start-up is reported on its own), as the compose
pipeline runs them: `compact` (closed segments -> one snapshot per key, staged with a
manifest), then `audit` (every segment plus the compaction output -> report.json/html
and Parquet). Throughput is share-state records of the log per second; the last lines
say how each step's time grows with the log. 10^7 records (about 1 GB of log; on 2
shared cores about 2 minutes to generate, 1-1.5 to compact and 4-7 to audit) only when
asked by --records or SPOOL_BENCH_SPARK_RECORDS; `--steps compact` times compact alone.

Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import io
import itertools
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import BenchContext, Result, format_table

DEFAULT_SIZES = (100_000, 1_000_000)
SIZES_ENV = "SPOOL_BENCH_SPARK_RECORDS"
KEYS = 1000
SNAPSHOT_EVERY = 500  # share.coordinator.snapshot.update.records.per.snapshot
RECORDS_PER_BATCH = 100
SEGMENT_BYTES = 64 * 1024 * 1024  # the broker's internal logs roll at this size
OFFSETS_PER_RECORD = 10
DEFAULT_MASTER = "local[*]"
WARM_UP_RECORDS = 10_000
STEPS = ("compact", "audit")


# ------------------------------------------------------------------ the log


@dataclass(frozen=True)
class GeneratedLog:
    data_dir: Path
    records: int
    snapshots: int
    keys: int
    log_bytes: int
    segments: int
    seconds: float


def topic_ids_for(keys: int) -> list[uuid.UUID]:
    """One topic per 100 share partitions."""
    return [uuid.uuid4() for _ in range(max(1, keys // 100))]


def share_state_records(count: int, keys: int, topic_ids: Sequence[uuid.UUID]) -> Iterator[Any]:
    """`count` share-state records over `keys` share partitions (key k: topic
    k % topics, partition k // topics), round robin: the first record of a key is a
    snapshot, then updates, a snapshot every SNAPSHOT_EVERY."""
    from persister.share_records import (
        ShareKey,
        ShareSnapshot,
        ShareUpdate,
        StateBatch,
        merge_batches,
    )

    share_keys = [
        ShareKey("bench-group", topic_ids[k % len(topic_ids)], k // len(topic_ids))
        for k in range(keys)
    ]
    states: list[tuple[int, tuple[StateBatch, ...]]] = [(0, ())] * keys  # (epoch, batches)
    created_ms = 1_700_000_000_000
    for i in range(count):
        k = i % keys
        step = i // keys
        first = step * OFFSETS_PER_RECORD
        snapshot_epoch, stored = states[k]
        update = (
            StateBatch(first, first + 6, 2, 1),  # acknowledged
            StateBatch(first + 7, first + OFFSETS_PER_RECORD - 1, 0, 2),  # released
        )
        batches = tuple(merge_batches(stored, update, first))
        if step % SNAPSHOT_EVERY == 0:
            snapshot_epoch += 1
            yield ShareSnapshot(
                share_keys[k], snapshot_epoch, 0, 0, first, created_ms, created_ms + i, batches
            )
        else:
            yield ShareUpdate(share_keys[k], snapshot_epoch, -1, first, update)
        states[k] = (snapshot_epoch, batches)


def write_topics(data_dir: Path, topic_ids: Sequence[uuid.UUID], partitions: int, end: int) -> None:
    """The topics the share partitions belong to, as the audit reads them: `meta/` topic
    records and, per partition, a log whose end offset is `end` (an empty segment based
    there, as a log whose records retention deleted), so every state offset is in range."""
    from coordinator.metadata import Topic, _encode, topic_record
    from persister.commit import GroupCommit
    from persister.coordinator_log import RecordLog
    from persister.segment import LOG_SUFFIX, segment_file_name

    meta = RecordLog(data_dir / "meta", GroupCommit())
    try:
        for n, topic_id in enumerate(topic_ids):
            topic = Topic(f"bench-{n}", topic_id, partitions)
            meta.write(_encode(topic_record(topic)))
            for p in range(partitions):
                directory = data_dir / "topics" / f"{topic.name}-{p}"
                directory.mkdir(parents=True)
                (directory / segment_file_name(end, LOG_SUFFIX)).touch()
    finally:
        meta.close()


def write_share_state_log(data_dir: Path, count: int, keys: int = KEYS) -> GeneratedLog:
    """A spool data dir whose share-state log holds `count` records, all in closed
    segments, and whose topics hold every offset they name (see the module docstring)."""
    from persister.clock import ManualClock
    from persister.commit import GroupCommit
    from persister.coordinator_log import RecordLog
    from persister.file_log import LogConfig
    from persister.share_records import ShareSnapshot, encode

    started = time.perf_counter()
    topic_ids = topic_ids_for(keys)
    per_key = -(-count // keys)
    write_topics(data_dir, topic_ids, -(-keys // len(topic_ids)), per_key * OFFSETS_PER_RECORD)
    log_dir = data_dir / "share-state"
    clock = ManualClock(1_700_000_000_000)
    # segment.ms of 1 with a clock that stands still: rolls by size only, until the
    # clock moves before the last write, which then opens a new (active) segment.
    config = LogConfig(segment_bytes=SEGMENT_BYTES, retention_ms=-1, segment_ms=1)
    # The GroupCommit is never started: write() only appends; close() flushes.
    log = RecordLog(log_dir, GroupCommit(), config, clock=clock)
    pending: list[tuple[bytes, bytes | None]] = []
    snapshots = 0
    try:
        last: Any = None
        for record in share_state_records(count, keys, topic_ids):
            snapshots += isinstance(record, ShareSnapshot)
            pending.append(encode(record))
            last = record
            if len(pending) == RECORDS_PER_BATCH:
                log.write(pending)
                pending.clear()
        if pending:
            log.write(pending)
        if last is not None:
            # The active segment: the newest record again (its key's state unchanged),
            # outside the count, after a roll.
            clock.advance(2)
            log.write([encode(last)])
        segments = len(log.partition_log.segment_base_offsets)
    finally:
        log.close()
    log_bytes = sum(p.stat().st_size for p in log_dir.glob("*.log"))
    return GeneratedLog(
        data_dir, count, snapshots, keys, log_bytes, segments, time.perf_counter() - started
    )


# ------------------------------------------------------------------ the steps


@dataclass(frozen=True)
class StepTime:
    step: str
    records: int
    seconds: float
    notes: str


def run_compact(spark: Any, log: GeneratedLog) -> StepTime:
    from persister.spark.compact import compact

    started = time.perf_counter()
    output = compact(spark, log.data_dir, progress=io.StringIO())
    seconds = time.perf_counter() - started
    manifest = output.manifest
    notes = (
        f"{manifest.get('records_in')} -> {manifest.get('records_out')} records, "
        f"{manifest.get('bytes_in', 0) / 1e6:.0f} -> {manifest.get('bytes_out', 0) / 1e6:.1f} MB"
    )
    return StepTime("compact", log.records, seconds, notes)


def run_audit(spark: Any, log: GeneratedLog, out: Path) -> StepTime:
    from persister.spark.audit import run_audit as audit

    started = time.perf_counter()
    result = audit(spark, log.data_dir, out)
    seconds = time.perf_counter() - started
    failed = [c["rule"] for c in result.checks if not c["passed"]]
    notes = f"{result.summary.get('keys')} keys; " + (
        "every check passed" if not failed else f"{len(result.violations)} violations: {failed}"
    )
    return StepTime("audit", log.records, seconds, notes)


def growth(times: Sequence[StepTime]) -> list[str]:
    """For each step, how its time grew from one size to the next."""
    lines = []
    for step in dict.fromkeys(t.step for t in times):
        mine = [t for t in times if t.step == step]
        for a, b in itertools.pairwise(mine):
            lines.append(
                f"{step}: {b.records / a.records:.0f}x records -> {b.seconds / a.seconds:.1f}x "
                f"time ({a.records / a.seconds:,.0f} -> {b.records / b.seconds:,.0f} records/s)"
            )
    return lines


def run_sizes(
    sizes: Sequence[int], master: str, keys: int = KEYS, steps: Sequence[str] = STEPS
) -> tuple[list[Result], list[str]]:
    """Generate a log of each size and run `steps` on it (compact, audit, in that
    order); (table rows, growth lines)."""
    import structlog.testing

    from persister.spark.segments import spark_session

    results: list[Result] = []
    times: list[StepTime] = []
    started = time.perf_counter()
    spark = spark_session(master, "spool-bench")
    results.append(
        Result(f"spark session start ({master})", 0, time.perf_counter() - started, 0, "")
    )
    try:
        # Python workers, JIT and code paths warmed once, so the first size is not
        # charged for them.
        with (
            tempfile.TemporaryDirectory(prefix="spool-bench-spark-") as tmp,
            structlog.testing.capture_logs(),
        ):
            started = time.perf_counter()
            log = write_share_state_log(Path(tmp) / "data", WARM_UP_RECORDS, keys)
            run_compact(spark, log)
            run_audit(spark, log, Path(tmp) / "audit")
            results.append(
                Result(f"warm-up ({WARM_UP_RECORDS} records)", 0, time.perf_counter() - started, 0)
            )
        for size in sizes:
            with (
                tempfile.TemporaryDirectory(prefix="spool-bench-spark-") as tmp,
                structlog.testing.capture_logs(),
            ):
                log = write_share_state_log(Path(tmp) / "data", size, keys)
                results.append(
                    Result(
                        f"generate {size:.0e} records",
                        log.records,
                        log.seconds,
                        log.log_bytes,
                        f"{log.snapshots} snapshots, {log.keys} keys, {log.segments} segments, "
                        f"{log.log_bytes / 1e6:.0f} MB",
                    )
                )
                # In the pipeline's order: the audit also checks the compaction output.
                for step in STEPS:
                    if step not in steps:
                        continue
                    if step == "compact":
                        timed = run_compact(spark, log)
                    else:
                        timed = run_audit(spark, log, Path(tmp) / "audit")
                    times.append(timed)
                    results.append(
                        Result(
                            f"{timed.step} {size:.0e} records",
                            timed.records,
                            timed.seconds,
                            log.log_bytes,
                            timed.notes,
                        )
                    )
                print(f"spark_pipeline: {size} records done", file=sys.stderr, flush=True)
    finally:
        spark.stop()
    return results, growth(times)


def sizes_from(text: str | None) -> tuple[int, ...]:
    if not text:
        return DEFAULT_SIZES
    return tuple(int(float(s)) for s in text.split(",") if s.strip())


def bench_spark_pipeline(ctx: BenchContext) -> list[Result]:
    """Registered in `bench.__main__`; needs no broker (ctx is unused)."""
    del ctx
    results, lines = run_sizes(sizes_from(os.environ.get(SIZES_ENV)), DEFAULT_MASTER)
    for line in lines:
        print(f"growth: {line}", flush=True)
    return results


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.spark_pipeline", description=__doc__)
    parser.add_argument(
        "--records",
        default=os.environ.get(SIZES_ENV),
        help=f"log sizes, comma separated (env {SIZES_ENV}; default 100000,1000000)",
    )
    parser.add_argument("--master", default=DEFAULT_MASTER, help="Spark master URL")
    parser.add_argument("--keys", type=int, default=KEYS, help="share partitions in the log")
    parser.add_argument(
        "--steps",
        default=",".join(STEPS),
        help="steps to time, comma separated (default compact,audit; e.g. compact for 10^7)",
    )
    args = parser.parse_args(argv)
    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    unknown = sorted(set(steps) - set(STEPS))
    if unknown:
        parser.error(f"unknown steps {unknown}: choose from {', '.join(STEPS)}")
    results, lines = run_sizes(sizes_from(args.records), args.master, args.keys, steps)
    print(format_table(results))
    for line in lines:
        print(f"growth: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
