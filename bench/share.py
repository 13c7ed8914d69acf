"""Share-group consumption benchmark: records/s for ShareConsumers, next to plain Fetch.

`bench_share(ctx)` is registered in `bench.__main__` as "share"; run it alone with
`python -m bench --only share [--records N] [--set key=value]`.

For a 1-partition and a 4-partition topic it produces the records once, then reads
them all with: a plain assign()/Fetch consumer; one ShareConsumer; four ShareConsumers
in threads (one consumer per thread). Share consumers use implicit acknowledgement
and a fresh group each, set to `share.auto.offset.reset=earliest`. A share case's
rate counts from its first record to its last: joining the group is in the notes
("first record after", from subscribe()). A new group's first member waits one
heartbeat interval (group.share.heartbeat.interval.ms, 5 s) for its first assignment,
as in Kafka 4.2, where only partitions with initialized share state are assigned and
the initialization runs after the heartbeat that asked for it; counting that wait
would make the rate a measure of the interval. Figures are printed, never asserted.
"""

from __future__ import annotations

import os
import threading
import time

from confluent_kafka import AcknowledgeType, Consumer, Message, ShareConsumer, TopicPartition

from bench import (
    BenchContext,
    Result,
    client_config,
    drain,
    fill_topic,
    progress,
    share_group_from_earliest,
)

# Share consumption is much slower than plain Fetch: cap the per-case record count so
# the whole benchmark (2 topics x 3 readers) stays around a minute.
DEFAULT_SHARE_RECORDS = int(os.environ.get("SPOOL_BENCH_SHARE_RECORDS", "500000"))
SHARE_PARTITIONS = (1, 4)
SHARE_CONSUMERS = (1, 4)
CASE_TIME_LIMIT_S = 30.0


def _limit(ctx: BenchContext) -> float:
    return min(ctx.time_limit_s, CASE_TIME_LIMIT_S)


def _plain_fetch(ctx: BenchContext, topic: str, partitions: int, expected: int) -> Result:
    consumer = Consumer(
        {
            **client_config(ctx),
            "group.id": "spool-bench-share-plain",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, -2) for p in range(partitions)])
    start = time.perf_counter()
    received, payload, errors = drain(consumer, expected, start + _limit(ctx))
    seconds = time.perf_counter() - start
    consumer.close()
    notes = [f"{errors} errors"] if errors else []
    if received < expected:
        notes.append(f"time limit hit: {received} of {expected}")
    return Result(
        f"fetch {partitions}p (assign, 1 consumer)", received, seconds, payload, "; ".join(notes)
    )


class _Tally:
    """Deliveries counted across consumer threads."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.lock = threading.Lock()
        self.records = 0
        self.payload = 0
        self.first_deliveries = 0  # delivery count 1: each record at most once
        self.errors = 0
        self.first_at: float | None = None
        self.done_at: float | None = None
        self.done = threading.Event()

    def add(self, msgs: list[Message]) -> None:
        with self.lock:
            for msg in msgs:
                if msg.error() is not None:
                    self.errors += 1
                    continue
                self.records += 1
                self.payload += len(msg.value() or b"")
                if msg.delivery_count() == 1:
                    self.first_deliveries += 1
            if self.first_at is None and self.records:
                self.first_at = time.perf_counter()
            if self.first_deliveries >= self.expected and not self.done.is_set():
                self.done_at = time.perf_counter()
                self.done.set()


def share_consume(
    ctx: BenchContext,
    topic: str,
    group: str,
    consumers: int,
    expected: int,
    *,
    mode: str = "implicit",
    time_limit_s: float | None = None,
) -> Result:
    """`consumers` ShareConsumers (one thread each) in `group` read `topic` until
    `expected` first deliveries. "implicit": the next poll accepts; "explicit": every
    record is acknowledged ACCEPT and each poll's acknowledgements are sent with
    commit_sync. The group must already start from the earliest offset."""
    tally = _Tally(expected)
    start = time.perf_counter()
    deadline = start + (time_limit_s or _limit(ctx))
    failures: list[BaseException] = []

    def worker() -> None:
        try:
            consumer = ShareConsumer(
                {**client_config(ctx), "group.id": group, "share.acknowledgement.mode": mode}
            )
            consumer.subscribe([topic])
            try:
                while not tally.done.is_set() and time.perf_counter() < deadline:
                    msgs = list(consumer.poll(0.5))
                    if mode == "explicit" and msgs:
                        for msg in msgs:
                            if msg.error() is None:
                                consumer.acknowledge(msg, AcknowledgeType.ACCEPT)
                        consumer.commit_sync(30.0)
                    tally.add(msgs)
                # Accept the last poll's records (implicit mode accepts on the next poll).
                consumer.poll(0.1)
            finally:
                consumer.close()
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(consumers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(deadline - time.perf_counter(), 0) + 30)
    # From the first record to the last new one: joining the group (one heartbeat
    # interval for a new group's first member) and closing are not consumption time.
    seconds = (tally.done_at or time.perf_counter()) - (tally.first_at or start)
    notes = []
    if tally.first_at is not None:
        notes.append(f"first record after {tally.first_at - start:.2f}s")
    if tally.first_deliveries < expected:
        notes.append(f"time limit hit: {tally.first_deliveries} of {expected}")
    if tally.records > tally.first_deliveries:
        notes.append(f"{tally.records - tally.first_deliveries} redeliveries")
    if tally.errors:
        notes.append(f"{tally.errors} error events")
    if failures:
        notes.append(f"consumer failed: {failures[0]!r}")
    return Result(
        f"share {topic} x{consumers} {mode}",
        tally.first_deliveries,
        seconds,
        tally.payload,
        "; ".join(notes),
    )


def _share_consume(
    ctx: BenchContext, topic: str, partitions: int, consumers: int, expected: int, run: int
) -> Result:
    group = f"spool-bench-share-{partitions}p-{consumers}c-{run}"
    share_group_from_earliest(ctx, group)
    result = share_consume(ctx, topic, group, consumers, expected)
    result.case = (
        f"share {partitions}p x{consumers} consumer{'s' if consumers > 1 else ''} implicit"
    )
    return result


def bench_share(ctx: BenchContext, records: int | None = None) -> list[Result]:
    """Share consumption (1 and 4 ShareConsumers, implicit acks) on 1 and 4 partitions,
    with a plain Fetch reading the same topic for comparison.

    `records` per topic defaults to `ctx.records` capped at DEFAULT_SHARE_RECORDS.
    """
    records = records or min(ctx.records, DEFAULT_SHARE_RECORDS)
    size = ctx.sizes[0] if ctx.sizes else 100
    results: list[Result] = []
    for partitions in SHARE_PARTITIONS:
        topic = f"bench-share-{partitions}p"
        stored = fill_topic(ctx, topic, records, size, partitions=partitions)
        results.append(_plain_fetch(ctx, topic, partitions, stored))
        for run, consumers in enumerate(SHARE_CONSUMERS):
            results.append(_share_consume(ctx, topic, partitions, consumers, stored, run))
    return results


# --- share consumption against a growing backlog ---------------------------------------

# 10^7 records (about 1.1 GB of log) take under a minute to produce, so they run by
# default; SPOOL_BENCH_BACKLOGS=100000,1000000 skips them.
BACKLOGS = tuple(
    int(n) for n in os.environ.get("SPOOL_BENCH_BACKLOGS", "100000,1000000,10000000").split(",")
)
# Every backlog is read for the same number of records: the smallest backlog's.
BACKLOG_WINDOW = int(os.environ.get("SPOOL_BENCH_BACKLOG_WINDOW", "100000"))
# Reading 10^5 records takes a few tenths of a second, so one reading swings by a third
# with whatever else the machine does: each backlog is read this many times, each by a new
# share group from the start, and the median reading counts.
BACKLOG_RUNS = int(os.environ.get("SPOOL_BENCH_BACKLOG_RUNS", "3"))


def bench_share_backlog(ctx: BenchContext) -> list[Result]:
    """One ShareConsumer reads the first BACKLOG_WINDOW records of a 1-partition topic
    holding 10^5, 10^6 and 10^7 records: the rate must not depend on how much lies
    behind (acquisition works from the start offset, not the log's length). Each backlog
    is read BACKLOG_RUNS times (a new share group each) and its median reading is kept.
    Records `backlog.flatness` = rate at the largest backlog / rate at the smallest."""
    size = ctx.sizes[0] if ctx.sizes else 100
    backlogs = sorted(BACKLOGS)
    results: list[Result] = []
    rates: dict[int, float] = {}
    for backlog in backlogs:
        topic = f"bench-backlog-{backlog}"
        progress(f"backlog: producing {backlog} records to {topic}")
        stored = fill_topic(ctx, topic, backlog, size, time_limit_s=max(60.0, backlog / 5_000))
        window = min(BACKLOG_WINDOW, backlogs[0], stored)
        readings = []
        for run in range(max(BACKLOG_RUNS, 1)):
            group = f"spool-bench-backlog-{backlog}-{run}"
            share_group_from_earliest(ctx, group)
            progress(f"backlog: share-consuming {window} of {stored} records (run {run + 1})")
            readings.append(share_consume(ctx, topic, group, 1, window))
        complete = [r for r in readings if r.records >= window and r.seconds > 0]
        complete.sort(key=lambda r: r.records_per_s)
        result = complete[len(complete) // 2] if complete else readings[0]
        result.case = f"share 1p x1, first {window} of {stored} backlog"
        if complete:
            rates[backlog] = result.records_per_s
            result.notes += f"; median of {len(complete)}: " + ", ".join(
                f"{r.records_per_s:,.0f}" for r in complete
            )
        results.append(result)
    smallest, largest = backlogs[0], backlogs[-1]
    if smallest in rates and largest in rates:
        ctx.figures["backlog.flatness"] = rates[largest] / rates[smallest]
    else:
        ctx.not_run["backlog.flatness"] = "a backlog case did not read its window in time"
    return results
