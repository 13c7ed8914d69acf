"""Transactional produce throughput next to plain (idempotent, acks=all) produce.

Registered in `bench.__main__` as "transactions" (`python -m bench --only transactions`):
for each record size, one producer writes `ctx.records` records plainly, then a
transactional producer writes as many in transactions of 1,000 records each
(begin, produce, commit_transaction: AddPartitionsToTxn, the records, EndTxn with its
markers made durable on every partition). Figures are printed, never asserted.

Where a transaction's time goes (librdkafka's debug trace shows no client-side waits, no
CONCURRENT_TRANSACTIONS retries): about nine fsync rounds one after the other, on
GroupCommit's single fsync thread: AddPartitionsToTxn (transaction log), the records on
each partition, then EndTxn's PrepareCommit, one marker per partition and CompleteCommit.
The per-partition rounds (records, markers) are separate files that could be fsynced at
the same time; on ext4 parallel fsyncs of several files cost about one.
"""

from __future__ import annotations

import os
import time

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from bench import BenchContext, Result, client_config

RECORDS_PER_TRANSACTION = 1000


def _run(ctx: BenchContext, topic: str, size: int, transactional: bool) -> Result:
    config = {**client_config(ctx), "acks": "all", "linger.ms": 5, "message.timeout.ms": 60_000}
    if transactional:
        config["transactional.id"] = f"bench-{topic}"
    producer = Producer(config)
    if transactional:
        producer.init_transactions(30)
    value = os.urandom(size)
    failed = 0

    def on_delivery(err: object, _msg: object) -> None:
        nonlocal failed
        failed += err is not None

    start = time.perf_counter()
    deadline = start + ctx.time_limit_s
    done = 0
    while done < ctx.records and time.perf_counter() < deadline:
        chunk = min(RECORDS_PER_TRANSACTION, ctx.records - done)
        if transactional:
            producer.begin_transaction()
        for i in range(chunk):
            while True:
                try:
                    producer.produce(
                        topic, value=value, partition=i % ctx.partitions, on_delivery=on_delivery
                    )
                    break
                except BufferError:
                    producer.poll(0.01)
        if transactional:
            producer.commit_transaction(60)
        done += chunk
    if not transactional:
        producer.flush(60)
    seconds = time.perf_counter() - start
    notes = [f"{failed} failed"] if failed else []
    if done < ctx.records:
        notes.append(f"time limit hit after {done}")
    kind = f"txn of {RECORDS_PER_TRANSACTION}" if transactional else "plain"
    return Result(
        f"produce {size} B {kind}", done - failed, seconds, (done - failed) * size, "; ".join(notes)
    )


def bench_transactions(ctx: BenchContext) -> list[Result]:
    admin = AdminClient(client_config(ctx))
    results = []
    for size in ctx.sizes:
        for transactional in (False, True):
            topic = f"bench-txn-{size}-{'txn' if transactional else 'plain'}"
            admin.create_topics([NewTopic(topic, ctx.partitions, 1)])[topic].result(timeout=30)
            results.append(_run(ctx, topic, size, transactional))
    return results
