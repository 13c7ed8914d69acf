"""`python -m bench`: start a broker, run the benchmarks, print records/s and MB/s.

    python -m bench                      # every benchmark (aimed at about 15 min on 2 cores)
    python -m bench --only share --only reference
    python -m bench --records 2000000    # or SPOOL_BENCH_RECORDS=2000000
    python -m bench --only produce_fetch --sizes 100,1024 --set log.flush.interval.messages=1

The long variants, off by default to keep `make bench` near 15 minutes on 2 cores:
    python -m bench --only memory --long # or SPOOL_BENCH_LONG=1: fragmenting acks in all
                                         # 100 groups (else SPOOL_BENCH_MEMORY_BUDGET_S, 180 s)
    SPOOL_BENCH_SPARK_RECORDS=100000,1000000,10000000 python -m bench --only spark_pipeline
Share backlog sizes: SPOOL_BENCH_BACKLOGS (default 100000,1000000,10000000).
PLAINTEXT next to SASL_SSL (`--only security`): SPOOL_BENCH_SECURITY_RECORDS (500000).
Files next to PostgreSQL (`--only storage`): SPOOL_BENCH_STORAGE_RECORDS (200000).
Consumer groups next to share groups, rebalance of 10 members (`--only consumer_groups`):
SPOOL_BENCH_GROUPS_RECORDS (200000).
10% of the records rejected into a dead-letter topic next to archived (`--only dead_letters`):
SPOOL_BENCH_DLQ_RECORDS (100000), SPOOL_BENCH_DLQ_RUNS (3).
1, 2 and 3 brokers on one PostgreSQL, failover (`--only cluster`): SPOOL_BENCH_CLUSTER_RECORDS
(500000), SPOOL_BENCH_CLUSTER_CONSUMERS (3).

MB/s counts record value bytes (1 MB = 10^6 bytes). Each step prints a line on stderr.
After the results: spool next to librdkafka's mock cluster (bench.reference), and the
target table (bench.TARGETS), each target met / not met / not run with the reason, and
the figures without a target (bench.FIGURES).
To add a benchmark, write `def bench_x(ctx) -> list[Result]` (recording figures for
targets in `ctx.figures`) and add it to `BENCHMARKS`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from bench import (
    BenchContext,
    BrokerProcess,
    Result,
    client_config,
    drain,
    evaluate_targets,
    format_comparisons,
    format_figures,
    format_table,
    format_targets,
    progress,
)
from bench.cluster import bench_cluster
from bench.consumer_groups import bench_consumer_groups
from bench.dead_letters import bench_dead_letters
from bench.memory import bench_memory
from bench.reference import bench_reference
from bench.security import bench_security
from bench.share import bench_share, bench_share_backlog
from bench.share_durability import (
    bench_restart,
    bench_share_ack_latency,
    bench_share_state_recovery,
    bench_share_state_recovery_checkpointed,
)
from bench.spark_pipeline import bench_spark_pipeline
from bench.storage import bench_storage
from bench.transactions import bench_transactions

DEFAULT_RECORDS = 500_000
DEFAULT_SIZES = (100, 1024)


def _create_topic(ctx: BenchContext, topic: str) -> None:
    admin = AdminClient(client_config(ctx))
    futures = admin.create_topics([NewTopic(topic, ctx.partitions, 1)], request_timeout=30)
    futures[topic].result(timeout=30)


def _produce(ctx: BenchContext, topic: str, size: int) -> Result:
    producer = Producer(
        {**client_config(ctx), "acks": "all", "linger.ms": 5, "message.timeout.ms": 60_000}
    )
    value = os.urandom(size)
    delivered = 0
    failed = 0

    def on_delivery(err: KafkaError | None, _msg: Message) -> None:
        nonlocal delivered, failed
        if err is None:
            delivered += 1
        else:
            failed += 1

    start = time.perf_counter()
    deadline = start + ctx.time_limit_s
    sent = 0
    while sent < ctx.records and time.perf_counter() < deadline:
        try:
            producer.produce(topic, value=value, on_delivery=on_delivery)
            sent += 1
        except BufferError:
            producer.poll(0.01)
            continue
        if sent % 1000 == 0:
            producer.poll(0)
    remaining = producer.flush(max(1.0, deadline - time.perf_counter()) + 30)
    seconds = time.perf_counter() - start
    ctx.produced[topic] = delivered
    notes = []
    if failed or remaining:
        notes.append(f"{failed} failed, {remaining} unflushed")
    if sent < ctx.records:
        notes.append(f"time limit hit after {sent} sent")
    return Result(
        f"produce {size} B acks=all linger=5ms",
        delivered,
        seconds,
        delivered * size,
        "; ".join(notes),
    )


def _fetch(ctx: BenchContext, topic: str, size: int) -> Result:
    expected = ctx.produced.get(topic, 0)
    consumer = Consumer(
        {
            **client_config(ctx),
            "group.id": "spool-bench",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(ctx.partitions)])
    start = time.perf_counter()
    received, payload, errors = drain(consumer, expected, start + ctx.time_limit_s, 10_000)
    seconds = time.perf_counter() - start
    consumer.close()
    notes = []
    if errors:
        notes.append(f"{errors} consumer errors")
    if received < expected:
        notes.append(f"time limit hit: {received} of {expected}")
    return Result(
        f"fetch {size} B (assign, from start)", received, seconds, payload, "; ".join(notes)
    )


def bench_produce_fetch(ctx: BenchContext) -> list[Result]:
    """Produce throughput (acks=all, linger 5 ms), then fetch the same records back."""
    results = []
    for size in ctx.sizes:
        topic = f"bench-{size}"
        _create_topic(ctx, topic)
        results.append(_produce(ctx, topic, size))
        results.append(_fetch(ctx, topic, size))
    return results


LATENCY_FIGURES = (
    "latency.broker_p50_ms",
    "latency.broker_p99_ms",
    "latency.consumer_p99_ms",
    "latency.consumer_max_ms",
)


def bench_latency_hook(ctx: BenchContext) -> list[Result]:
    """Latency percentiles (raw ShareFetch and ShareConsumer) from `bench.latency` once it
    exists: its `bench_latency(ctx)` records LATENCY_FIGURES in `ctx.figures`. Until then
    this prints "not run" and the latency targets say why."""
    try:
        from bench.latency import bench_latency  # type: ignore[import-not-found,unused-ignore]
    except ImportError as exc:
        if isinstance(exc, ModuleNotFoundError) and exc.name not in ("bench.latency", None):
            raise
        why = f"bench.latency not available ({exc})"
        print(f"latency: not run: {why}", file=sys.stderr, flush=True)
        for name in LATENCY_FIGURES:
            ctx.not_run[name] = why
        return []
    results: list[Result] = bench_latency(ctx)
    for name in LATENCY_FIGURES:
        ctx.not_run.setdefault(name, "bench.latency recorded no such figure")
    return results


BENCHMARKS: dict[str, Callable[[BenchContext], list[Result]]] = {
    "produce_fetch": bench_produce_fetch,
    "share": bench_share,
    "reference": bench_reference,
    "share_ack": bench_share_ack_latency,
    "latency": bench_latency_hook,
    "share_recovery": bench_share_state_recovery,
    "share_recovery_checkpointed": bench_share_state_recovery_checkpointed,
    "restart": bench_restart,
    "memory": bench_memory,
    "backlog": bench_share_backlog,
    "transactions": bench_transactions,
    "spark_pipeline": bench_spark_pipeline,
    "security": bench_security,
    "storage": bench_storage,
    "cluster": bench_cluster,
    "consumer_groups": bench_consumer_groups,
    "dead_letters": bench_dead_letters,
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--records",
        type=int,
        default=int(os.environ.get("SPOOL_BENCH_RECORDS", DEFAULT_RECORDS)),
        help="records per case (env SPOOL_BENCH_RECORDS; default %(default)s)",
    )
    parser.add_argument(
        "--sizes",
        default=",".join(map(str, DEFAULT_SIZES)),
        help="record value sizes in bytes, comma separated (default %(default)s)",
    )
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument(
        "--time-limit", type=float, default=60.0, help="seconds per case before it stops early"
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=sorted(BENCHMARKS),
        help="run only this benchmark (repeatable; default: all)",
    )
    parser.add_argument(
        "--long",
        action="store_true",
        default=os.environ.get("SPOOL_BENCH_LONG", "") not in ("", "0"),
        help="the long variants: fragmenting acks in all 100 groups (env SPOOL_BENCH_LONG=1)",
    )
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="broker setting"
    )
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    settings = dict(item.split("=", 1) for item in args.set)
    with tempfile.TemporaryDirectory(prefix="spool-bench-") as tmp:
        broker = BrokerProcess(Path(tmp) / "data", settings)
        try:
            broker.start()
            broker.wait_warm()
        except RuntimeError as e:
            print(f"broker failed to start: {e}\n{broker.log_tail()}", file=sys.stderr)
            return 1
        ctx = BenchContext(
            broker=broker,
            records=args.records,
            sizes=tuple(int(s) for s in args.sizes.split(",")),
            partitions=args.partitions,
            time_limit_s=args.time_limit,
            long=args.long,
        )
        print(
            f"spool bench: broker {broker.bootstrap}, {ctx.records} records per case, "
            f"{ctx.partitions} partitions",
            flush=True,
        )
        results: list[Result] = []
        selected = args.only or list(BENCHMARKS)
        try:
            for i, name in enumerate(selected, 1):
                progress(f"{name} ({i}/{len(selected)})")
                results += BENCHMARKS[name](ctx)
                progress(f"{name} done")
        finally:
            code = broker.stop()
        print(format_table(results))
        if ctx.comparisons:
            print()
            print(format_comparisons(ctx.comparisons))
        for section in ctx.sections:
            print()
            print(section)
        print()
        print(format_targets(evaluate_targets(ctx.figures, ctx.not_run)))
        print()
        print(format_figures(ctx.figures, ctx.not_run))
        if code != 0:
            print(f"broker exited with {code}\n{broker.log_tail()}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
