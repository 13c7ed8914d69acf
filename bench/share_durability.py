"""Share-state durability benchmarks: acknowledgement latency, share-state log bytes per
acknowledged record, and the time to recover a share-state log of a million updates.

Two functions registered in `bench.__main__` as "share_ack" and "share_recovery"
(`python -m bench --only share_ack --only share_recovery`):

- `bench_share_ack_latency(ctx)`: one explicit-mode ShareConsumer on a 1-partition topic
  accepts every record of each poll and calls `commit_sync()`; each commit is a round
  trip that the broker answers only after the share state is fsynced. Reports the
  median and p99 commit round trip, and the growth of `<data>/share-state` divided by
  the records accepted.
- `bench_share_state_recovery(ctx)`: no broker. Builds a share-state log of
  1,000,000 WriteShareGroupState-equivalent records in a temp dir with the share
  coordinator's own code (`ShareCoordinatorShard.write_state` over 100 keys, so a
  ShareSnapshot every 500 updates per key, as the broker writes them), then times
  `DurablePersister(...)` open + `load()` (the broker's startup replay), once after a
  clean close and once without the clean-shutdown marker (as after kill -9).

Figures are printed, never asserted.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from confluent_kafka import (
    AcknowledgeType,
    KafkaException,
    ShareConsumer,
)

from bench import (
    BenchContext,
    BrokerProcess,
    Result,
    client_config,
    fill_topic,
    progress,
    share_group_from_earliest,
    topic_id,
)

ACK_RECORDS = int(os.environ.get("SPOOL_BENCH_ACK_RECORDS", "5000"))
ACK_BATCH_RECORDS = 10  # producer batch size: acquisition is per log batch
ACK_TIME_LIMIT_S = 45.0
RECOVERY_UPDATES = int(os.environ.get("SPOOL_BENCH_RECOVERY_UPDATES", "1000000"))
RECOVERY_KEYS = 100
RECOVERY_RECORDS_PER_BATCH = 100  # share records per appended batch (one write each)


def _dir_bytes(path: Path) -> int:
    if not path.exists():
        return 0
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file() and f.suffix == ".log")


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def _setup(ctx: BenchContext, topic: str, group: str, count: int, size: int) -> int:
    share_group_from_earliest(ctx, group)
    return fill_topic(
        ctx, topic, count, size, producer_config={"batch.num.messages": ACK_BATCH_RECORDS}
    )


def bench_share_ack_latency(ctx: BenchContext) -> list[Result]:
    """commit_sync round trips (explicit mode, fsynced share state) and share-state log
    bytes per accepted record."""
    records = min(ctx.records, ACK_RECORDS)
    size = ctx.sizes[0] if ctx.sizes else 100
    topic, group = "bench-share-ack", "spool-bench-share-ack"
    stored = _setup(ctx, topic, group, records, size)
    state_dir = ctx.broker.data_dir / "share-state"
    bytes_before = _dir_bytes(state_dir)

    consumer = ShareConsumer(
        {
            **client_config(ctx),
            "group.id": group,
            "share.acknowledgement.mode": "explicit",
            "max.poll.records": ACK_BATCH_RECORDS,
        }
    )
    consumer.subscribe([topic])
    latencies: list[float] = []
    accepted: set[int] = set()
    failed_commits = 0
    payload = 0
    start = time.perf_counter()
    deadline = start + min(ctx.time_limit_s, ACK_TIME_LIMIT_S)
    first_at: float | None = None
    try:
        while len(accepted) < stored and time.perf_counter() < deadline:
            msgs = [m for m in consumer.poll(0.5) if m.error() is None]
            if not msgs:
                continue
            if first_at is None:
                first_at = time.perf_counter()
            for m in msgs:
                consumer.acknowledge(m, AcknowledgeType.ACCEPT)
            t0 = time.perf_counter()
            try:
                result = consumer.commit_sync(30.0)
            except KafkaException:
                failed_commits += 1
                continue
            latencies.append(time.perf_counter() - t0)
            if result and all(err is None for err in result.values()):
                accepted.update(m.offset() for m in msgs)
                payload += sum(len(m.value() or b"") for m in msgs)
            else:
                failed_commits += 1
    finally:
        consumer.close()
    seconds = time.perf_counter() - (first_at or start)
    grown = _dir_bytes(state_dir) - bytes_before

    ordered = sorted(latencies)
    notes = [
        f"median {statistics.median(ordered) * 1e3:.2f} ms" if ordered else "no commits",
        f"p99 {_percentile(ordered, 0.99) * 1e3:.2f} ms",
        f"{len(ordered)} commits of ~{len(accepted) / max(len(ordered), 1):.0f} records",
    ]
    if failed_commits:
        notes.append(f"{failed_commits} failed commits")
    if len(accepted) < stored:
        notes.append(f"time limit hit: {len(accepted)} of {stored}")
    per_record = grown / len(accepted) if accepted else float("nan")
    return [
        Result("share ack commit_sync (fsync)", len(accepted), seconds, payload, ", ".join(notes)),
        Result(
            "share-state log bytes per ack",
            len(accepted),
            seconds,
            grown,
            f"{per_record:.1f} B/record ({grown} B for {len(accepted)} records, "
            f"{len(ordered)} commits); MB/s = share-state log write rate",
        ),
    ]


# --- recovery of a share-state log, no broker ------------------------------------------


def build_share_state_log(directory: Path, updates: int, keys: int = RECOVERY_KEYS) -> int:
    """Write `updates` WriteShareGroupState-equivalent records (plus one initializing
    snapshot per key) with the share coordinator's code; returns the records written.

    Each update acknowledges the next 10 offsets of its key and moves the start offset
    past the previous ones, as a share-partition leader's writes do, so the state stays
    small and a snapshot replaces the updates every 500 of them.
    """
    from coordinator.share_coordinator import ShareCoordinatorShard
    from coordinator.share_state import PersistedBatch, ShareStateKey
    from persister import share_records
    from persister.commit import GroupCommit
    from persister.coordinator_log import RecordLog
    from persister.file_log import LogConfig

    shard = ShareCoordinatorShard()
    state_keys = [ShareStateKey("bench-group", uuid.uuid4(), p) for p in range(keys)]
    # The GroupCommit is never started: RecordLog.write only appends; close() flushes.
    records_log = RecordLog(
        directory,
        GroupCommit(),
        LogConfig(segment_bytes=104857600, retention_ms=-1, segment_ms=2**62),
    )
    pending: list[tuple[bytes, bytes | None]] = []
    written = 0

    def emit(records: list[share_records.ShareRecord]) -> None:
        nonlocal written
        for record in records:
            shard.replay(record)
            pending.append(share_records.encode(record))
        written += len(records)
        if len(pending) >= RECOVERY_RECORDS_PER_BATCH:
            records_log.write(pending)
            pending.clear()

    try:
        for key in state_keys:
            emit(shard.initialize_state(key, 0, 0, 0)[0])
        for i in range(updates):
            key = state_keys[i % keys]
            step = i // keys
            first = step * 10
            batches = [
                PersistedBatch(first, first + 6, 2, 1),
                PersistedBatch(first + 7, first + 9, 0, 2),
            ]
            emit(shard.write_state(key, 0, 0, first, batches, 0)[0])
        if pending:
            records_log.write(pending)
    finally:
        records_log.close()
    return written


def _timed_load(directory: Path) -> tuple[float, float, int, int]:
    """(open seconds, load seconds, records replayed, keys) of a DurablePersister."""
    from coordinator.share_persister import DurablePersister
    from persister.commit import GroupCommit

    t0 = time.perf_counter()
    persister = DurablePersister(directory, GroupCommit())
    t1 = time.perf_counter()
    try:
        replayed = persister.load()
        t2 = time.perf_counter()
        keys = len(tuple(persister.shard.keys()))
    finally:
        persister.close()
    return t1 - t0, t2 - t1, replayed, keys


def bench_share_state_recovery(ctx: BenchContext) -> list[Result]:
    """Open + replay a share-state log of RECOVERY_UPDATES updates (no broker)."""
    import structlog.testing

    updates = RECOVERY_UPDATES
    results = []
    with tempfile.TemporaryDirectory(prefix="spool-bench-share-state-") as tmp:
        directory = Path(tmp) / "share-state"
        with structlog.testing.capture_logs():
            t0 = time.perf_counter()
            written = build_share_state_log(directory, updates)
            built_s = time.perf_counter() - t0
            log_bytes = _dir_bytes(directory)
            for label, clean in (("clean shutdown", True), ("after kill -9", False)):
                if not clean:
                    # As after a crash: the log is scanned and every batch CRC-checked.
                    (directory / ".kafka_cleanshutdown").unlink(missing_ok=True)
                    (directory / "recovery-point-offset-checkpoint").unlink(missing_ok=True)
                open_s, load_s, replayed, keys = _timed_load(directory)
                total = open_s + load_s
                results.append(
                    Result(
                        f"share-state recovery, {label}",
                        replayed,
                        total,
                        log_bytes,
                        f"{updates} updates, {written} records, {keys} keys, "
                        f"{log_bytes / 1e6:.1f} MB; open {open_s:.2f}s + replay {load_s:.2f}s; "
                        f"log built in {built_s:.1f}s",
                    )
                )
    return results


# --- restart of a broker killed with -9 after a million share-state updates -------------

RESTART_RECORDS = 1000
RESTART_TIMEOUT_S = 120.0


async def _serve_times(
    broker: BrokerProcess, topic: str, group: str, t0: float
) -> tuple[float, float, int]:
    """Seconds from `t0` until the (re)starting broker answers ApiVersions, and until a
    ShareFetch of a new member of `group` acquires records; and how many it acquired."""
    from bench.memory import RawShareMember, api_versions
    from protocol.client import KafkaClient

    deadline = time.perf_counter() + RESTART_TIMEOUT_S
    client = None
    while client is None:
        try:
            client = await KafkaClient.connect(broker.host, broker.port, "spool-bench-restart")
            await api_versions(client)
        except (TimeoutError, OSError) as exc:
            if client is not None:
                await client.close()
                client = None
            if time.perf_counter() > deadline:
                raise RuntimeError(f"no ApiVersions answer in {RESTART_TIMEOUT_S}s") from exc
            await asyncio.sleep(0.01)
    api_s = time.perf_counter() - t0
    try:
        tid = await topic_id(client, topic)
        member = RawShareMember(client, group)
        await member.join([topic])
        acquired = 0
        while not acquired and time.perf_counter() < deadline:
            got = await member.fetch({(tid, 0): []}, RESTART_RECORDS, max_wait_ms=500)
            acquired = sum(last - first + 1 for r in got.values() for first, last in r)
        return api_s, time.perf_counter() - t0, acquired
    finally:
        await client.close()


def write_as_killed_broker(directory: Path, updates: int) -> int:
    """Append `updates` share-state updates to the log in `directory` as a live broker
    would have written them before a kill -9: its share coordinator checkpoints every
    DEFAULT_CHECKPOINT_INTERVAL_RECORDS replayed records, so the last checkpoint lies at
    most one interval behind the end (here exactly one: the worst case). No clean-shutdown
    marker or recovery point is left, so a restart CRC-checks every batch. Returns the
    records written."""
    from coordinator.runtime import DEFAULT_CHECKPOINT_INTERVAL_RECORDS
    from coordinator.share_persister import DurablePersister
    from persister.commit import GroupCommit

    tail = min(DEFAULT_CHECKPOINT_INTERVAL_RECORDS, updates)
    written = build_share_state_log(directory, updates - tail)
    persister = DurablePersister(directory, GroupCommit())
    persister.load()
    assert asyncio.run(persister.runtime.checkpoint())
    persister.records.log.close(clean=False)  # kill -9: no checkpoint at close
    written += build_share_state_log(directory, tail)
    (directory / ".kafka_cleanshutdown").unlink(missing_ok=True)
    (directory / "recovery-point-offset-checkpoint").unlink(missing_ok=True)
    return written


def bench_restart(ctx: BenchContext) -> list[Result]:
    """A broker with a share group's state is killed with -9; RECOVERY_UPDATES share-state
    updates are appended to its share-state log as the broker would have written them
    before the kill (`write_as_killed_broker`: checkpointed up to one interval back); the
    restart is timed until ApiVersions is answered and until a ShareFetch acquires the
    group's remaining records. Records `restart.api_versions_s` and
    `restart.share_fetch_s` (target <= 2 s)."""
    import dataclasses

    import structlog.testing

    results = []
    with tempfile.TemporaryDirectory(prefix="spool-bench-restart-") as tmp:
        broker = BrokerProcess(Path(tmp) / "data", ctx.broker.settings)
        broker.start()
        own = dataclasses.replace(ctx, broker=broker, endpoint=None, produced={})
        topic, group = "bench-restart", "bench-restart"
        try:
            fill_topic(own, topic, RESTART_RECORDS, 100)
            share_group_from_earliest(own, group)
            # The group's share partition exists (and half its records are acquired).
            asyncio.run(_serve_times(broker, topic, group, time.perf_counter()))
            assert broker.process is not None
            broker.process.kill()
            broker.process.wait(timeout=30)
            progress(f"restart: appending {RECOVERY_UPDATES} share-state updates to the log")
            state_dir = broker.data_dir / "share-state"
            with structlog.testing.capture_logs():
                written = write_as_killed_broker(state_dir, RECOVERY_UPDATES)
            log_bytes = _dir_bytes(state_dir)
            progress("restart: starting the broker again")
            t0 = time.perf_counter()
            broker.start(wait=False)
            api_s, fetch_s, acquired = asyncio.run(_serve_times(broker, topic, group, t0))
        finally:
            code = broker.stop()
            if code != 0:
                progress(f"restart: broker exited with {code}\n{broker.log_tail()}")
        ctx.figures["restart.api_versions_s"] = api_s
        ctx.figures["restart.share_fetch_s"] = fetch_s
        results.append(
            Result(
                f"restart after kill -9, {RECOVERY_UPDATES:,} updates",
                written,
                fetch_s,
                log_bytes,
                f"ApiVersions after {api_s:.2f}s, ShareFetch acquired {acquired} after "
                f"{fetch_s:.2f}s; {written} share records, {log_bytes / 1e6:.1f} MB of log; "
                f"MB/s = log bytes replayed per second to the first ShareFetch",
            )
        )
    return results


def bench_share_state_recovery_checkpointed(ctx: BenchContext) -> list[Result]:
    """Open + load after kill -9 of a share coordinator that checkpointed as the broker
    does: a log of RECOVERY_UPDATES updates whose last periodic checkpoint lies one
    checkpoint interval (coordinator.runtime.DEFAULT_CHECKPOINT_INTERVAL_RECORDS) of
    records before the end, the most a restart can find behind it. No broker."""
    import structlog.testing

    from coordinator.runtime import DEFAULT_CHECKPOINT_INTERVAL_RECORDS

    tail = DEFAULT_CHECKPOINT_INTERVAL_RECORDS
    with tempfile.TemporaryDirectory(prefix="spool-bench-share-ckpt-") as tmp:
        directory = Path(tmp) / "share-state"
        with structlog.testing.capture_logs():
            written = write_as_killed_broker(directory, RECOVERY_UPDATES)
            open_s, load_s, replayed, keys = _timed_load(directory)
        log_bytes = _dir_bytes(directory)
    return [
        Result(
            "share-state recovery after kill -9, checkpointed",
            replayed,
            open_s + load_s,
            log_bytes,
            f"{RECOVERY_UPDATES} updates, {written} records, {keys} keys; checkpoint "
            f"{tail} records behind the end; open {open_s:.2f}s + checkpoint and tail "
            f"replay {load_s:.2f}s",
        )
    ]
