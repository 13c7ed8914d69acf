"""Share consumption that rejects 10% of the records, with and without a dead-letter topic.

`bench_dead_letters(ctx)` is registered in `bench.__main__` as "dead_letters"; run it
alone with `python -m bench --only dead_letters [--records N]`.

KIP-1191: a share group with `errors.deadletterqueue.topic.name` copies every record it
rejects to that topic (here with `errors.deadletterqueue.copy.record.enable=true`: key,
value, headers and timestamp), and archives it only once the copy is durable; a group
without one archives the record at once. The bench reads the same records both ways:

- the records (value size the run's first --sizes) round-robin over a 4-partition
  topic, acks=all;
- one ShareConsumer in explicit acknowledgement mode in a new group from the earliest
  offset acknowledges each record on its own, REJECT for every tenth (offset % 10 == 0
  on each partition) and ACCEPT for the rest, each poll's acknowledgements sent with
  commit_sync;
- "dead-letter topic": the group dead-letters to `dlq.bench` (4 partitions, opted in
  with `errors.deadletterqueue.group.enable=true`); the run ends once every record was
  delivered and every rejected one's copy is in the dead-letter topic (the copies are
  written after the acknowledgement is answered: a run that left them behind would
  not be done);
- "archived": the same without a dead-letter topic, as spool does today.

The rate counts from the first record delivered to the end, as in bench.share. Each of
SPOOL_BENCH_DLQ_RUNS (3) runs produces a new topic and reads it both ways, alternating
which goes first; the median run of each counts. Records per run:
SPOOL_BENCH_DLQ_RECORDS (100000), at most --records. Figure `dead_letters.ratio` =
dead-letter rate / archived rate, target >= 0.8.
"""

from __future__ import annotations

import os
import time

from confluent_kafka import AcknowledgeType, Consumer, ShareConsumer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)

from bench import BenchContext, Result, client_config, fill_topic, median_reading, progress

DEFAULT_DLQ_RECORDS = int(os.environ.get("SPOOL_BENCH_DLQ_RECORDS", "100000"))
RUNS = int(os.environ.get("SPOOL_BENCH_DLQ_RUNS", "3"))
PARTITIONS = 4
REJECT_EVERY = 10  # offset % 10 == 0: 10% of the records
DLQ_TOPIC = "dlq.bench"
CASE_TIME_LIMIT_S = 60.0
COPIES_WAIT_S = 30.0
CASES = ("dead-letter topic", "archived")
FIGURE = "dead_letters.ratio"


def _admin(ctx: BenchContext) -> AdminClient:
    return AdminClient(client_config(ctx))


def _set_group(ctx: BenchContext, group: str, configs: dict[str, str]) -> None:
    entries = [
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()
    ]
    resource = ConfigResource("GROUP", group, incremental_configs=entries)
    admin = _admin(ctx)  # kept alive until the futures are answered
    for future in admin.incremental_alter_configs([resource], request_timeout=30).values():
        future.result(timeout=30)


def _dlq_size(ctx: BenchContext) -> int:
    """Records in the dead-letter topic (the sum of its high watermarks)."""
    consumer = Consumer({**client_config(ctx), "group.id": "spool-bench-dlq-watermarks"})
    try:
        return sum(
            int(consumer.get_watermark_offsets(TopicPartition(DLQ_TOPIC, p), 10, False)[1])
            for p in range(PARTITIONS)
        )
    finally:
        consumer.close()


def rejected(offset: int) -> bool:
    return offset % REJECT_EVERY == 0


def consume_rejecting(
    ctx: BenchContext, topic: str, group: str, expected: int, *, dead_letters: bool
) -> Result:
    """One explicit-mode ShareConsumer in `group` reads `topic` until `expected` first
    deliveries, rejecting every tenth record; with `dead_letters`, the run ends only
    once the dead-letter topic holds a copy of each rejected record."""
    dlq_before = _dlq_size(ctx) if dead_letters else 0
    consumer = ShareConsumer(
        {**client_config(ctx), "group.id": group, "share.acknowledgement.mode": "explicit"}
    )
    consumer.subscribe([topic])
    start = time.perf_counter()
    deadline = start + min(ctx.time_limit_s, CASE_TIME_LIMIT_S)
    first_at: float | None = None
    first = rejects = redeliveries = errors = payload = 0
    try:
        while first < expected and time.perf_counter() < deadline:
            msgs = consumer.poll(0.5)
            acked = False
            for msg in msgs:
                if msg.error() is not None:
                    errors += 1
                    continue
                if first_at is None:
                    first_at = time.perf_counter()
                if msg.delivery_count() == 1:
                    first += 1
                    payload += len(msg.value() or b"")
                    rejects += 1 if rejected(msg.offset()) else 0
                else:
                    redeliveries += 1
                if rejected(msg.offset()):
                    consumer.acknowledge(msg, AcknowledgeType.REJECT)
                else:
                    consumer.acknowledge(msg, AcknowledgeType.ACCEPT)
                acked = True
            if acked:
                consumer.commit_sync(30.0)
        consumed_at = time.perf_counter()
        copies = 0
        if dead_letters:
            wait_until = time.perf_counter() + COPIES_WAIT_S
            while True:
                copies = _dlq_size(ctx) - dlq_before
                if copies >= rejects or time.perf_counter() >= wait_until:
                    break
                time.sleep(0.01)
        done_at = time.perf_counter()
    finally:
        consumer.close()
    seconds = done_at - (first_at or start)
    notes = [f"{rejects} rejected"]
    if first_at is not None:
        notes.append(f"first record after {first_at - start:.2f}s")
    if dead_letters:
        notes.append(f"{copies} copies, last {1000 * (done_at - consumed_at):.0f} ms after")
        if copies < rejects:
            notes.append(f"copies missing: {copies} of {rejects}")
    if first < expected:
        notes.append(f"time limit hit: {first} of {expected}")
    if redeliveries:
        notes.append(f"{redeliveries} redeliveries")
    if errors:
        notes.append(f"{errors} error events")
    case = CASES[0] if dead_letters else CASES[1]
    return Result(
        f"share {PARTITIONS}p, 10% rejected, {case}", first, seconds, payload, "; ".join(notes)
    )


def complete(result: Result, expected: int) -> bool:
    return result.records >= expected > 0 and "missing" not in result.notes


def format_side_by_side(medians: dict[str, Result]) -> str:
    header = f"{'share consumption, 10% rejected (median)':<42} {'records/s':>12} {'ratio':>7}"
    lines = [header, "-" * len(header)]
    base = medians.get(CASES[1])
    for case in CASES:
        r = medians.get(case)
        if r is None:
            continue
        ratio = (
            f"{r.records_per_s / base.records_per_s:.2f}" if base and base.records_per_s else "n/a"
        )
        lines.append(f"{case:<42} {r.records_per_s:>12,.0f} {ratio:>7}")
    return "\n".join(lines)


def bench_dead_letters(ctx: BenchContext, records: int | None = None) -> list[Result]:
    """10% of the records rejected into a dead-letter topic, next to the same records
    rejected without one (archived); records `dead_letters.ratio`."""
    records = records or min(ctx.records, DEFAULT_DLQ_RECORDS)
    size = ctx.sizes[0] if ctx.sizes else 100
    admin = _admin(ctx)
    dlq = NewTopic(DLQ_TOPIC, PARTITIONS, 1, config={"errors.deadletterqueue.group.enable": "true"})
    try:
        admin.create_topics([dlq], request_timeout=30)[DLQ_TOPIC].result(30)
    except Exception as exc:
        why = f"could not create {DLQ_TOPIC}: {exc}"
        print(f"dead_letters: not run: {why}", flush=True)
        ctx.not_run[FIGURE] = why
        return []
    readings: dict[str, list[Result]] = {case: [] for case in CASES}
    produced: list[int] = []
    for run in range(RUNS):
        topic = f"bench-dlq-{run}"
        progress(f"dead_letters: producing {records} records to {topic} ({run + 1}/{RUNS})")
        stored = fill_topic(ctx, topic, records, size, partitions=PARTITIONS)
        produced.append(stored)
        order = CASES if run % 2 == 0 else CASES[::-1]
        for case in order:
            dead_letters = case == CASES[0]
            group = f"bench-dlq-{run}-{'dlq' if dead_letters else 'archive'}"
            configs = {"share.auto.offset.reset": "earliest"}
            if dead_letters:
                configs["errors.deadletterqueue.topic.name"] = DLQ_TOPIC
                configs["errors.deadletterqueue.copy.record.enable"] = "true"
            _set_group(ctx, group, configs)
            progress(f"dead_letters: {case} ({run + 1}/{RUNS})")
            result = consume_rejecting(ctx, topic, group, stored, dead_letters=dead_letters)
            progress(f"dead_letters: {case}: {result.records_per_s:,.0f} records/s; {result.notes}")
            readings[case].append(result)
    medians = {case: median_reading(r) for case, r in readings.items()}
    ctx.sections.append(format_side_by_side(medians))
    # The two cases of one run are read back to back: their ratio is less exposed to the
    # machine's speed drifting over the runs. Shown beside the figure, which stays the
    # ratio of the medians.
    paired = sorted(
        d.records_per_s / a.records_per_s
        for d, a in zip(readings[CASES[0]], readings[CASES[1]], strict=True)
        if a.records_per_s
    )
    if paired:
        ctx.sections.append(
            f"per-run ratios (dead-letter / archived, same run): "
            f"{', '.join(f'{x:.2f}' for x in paired)}; median {paired[len(paired) // 2]:.2f}"
        )
    all_complete = all(
        complete(r, n) for case in CASES for r, n in zip(readings[case], produced, strict=True)
    )
    base = medians[CASES[1]].records_per_s
    if all_complete and base > 0:
        ctx.figures[FIGURE] = medians[CASES[0]].records_per_s / base
    else:
        ctx.not_run[FIGURE] = "a run did not read all its records or write all its copies"
    return list(medians.values())
