"""The file engine next to PostgreSQL: the same workloads on a broker of each.

`bench_storage(ctx)` is registered in `bench.__main__` as "storage"; run it alone with
`python -m bench --only storage [--records N]`.

It starts a throwaway PostgreSQL (tests/postgres.py: Debian's server in a temporary
directory, on loopback, fsync and synchronous_commit on, as a user's server has them)
and two brokers: one on its data directory's files, one with `storage` set to a
database of that server. On each in turn (the engines alternate, run after run, so a
burst of other load on the machine falls on both):

- produce: the records (value size the run's first --sizes) round-robin over a
  4-partition topic, acks=all, linger 5 ms;
- share consumption with per-record acknowledgements: ShareConsumers in explicit
  acknowledgement mode, each record acknowledged ACCEPT on its own and each poll's
  acknowledgements sent with commit_sync (bench.share `share_consume`), one consumer in
  a new group from the earliest offset; the rate counts from the first record to the
  last, as in bench.share. Four consumers are left out (as in bench.security): their
  rate measures how long the assignment takes to spread over them (a heartbeat
  interval, the same on both engines), swinging 5x from run to run;
- produce to delivery: a producer (linger 0, acks=all) writes a record every 2 ms to a
  1-partition topic read by two ShareConsumers (explicit acknowledgement); latency from
  the produce call to the poll that returned it (bench.latency `_end_to_end_run`).

SPOOL_BENCH_STORAGE_RECORDS (200000) records per produce, SPOOL_BENCH_STORAGE_RUNS (3)
runs; the median run counts. A side-by-side table gives each workload's figures on
both engines; `storage.pg_share_rate` (the ShareConsumer on PostgreSQL) and
`storage.pg_p99_ms` are checked against their targets (>= 50,000 records/s, <= 10 ms).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bench import (
    BenchContext,
    BrokerProcess,
    Result,
    median_reading,
    produce_reading,
    progress,
    share_group_from_earliest,
)
from bench.share import share_consume

DEFAULT_STORAGE_RECORDS = int(os.environ.get("SPOOL_BENCH_STORAGE_RECORDS", "200000"))
RUNS = int(os.environ.get("SPOOL_BENCH_STORAGE_RUNS", "3"))
PARTITIONS = 4
CONSUMERS = (1,)
CASE_TIME_LIMIT_S = 60.0
LATENCY_RECORDS = 2000
LATENCY_INTERVAL_MS = 2.0
ENGINES = ("file", "postgresql")


def _share(ctx: BenchContext, topic: str, consumers: int, expected: int, group: str) -> Result:
    share_group_from_earliest(ctx, group)
    result = share_consume(
        ctx, topic, group, consumers, expected, mode="explicit", time_limit_s=CASE_TIME_LIMIT_S
    )
    result.case = f"share {PARTITIONS}p x{consumers} per-record acks"
    return result


def _latency(ctx: BenchContext) -> tuple[Result, float, float]:
    """One produce-to-delivery measurement: its row (records delivered in how long, at
    the producer's pace: not a rate to compare), p50 and p99 in ms."""
    from bench.latency import _end_to_end_run, percentile

    start = time.perf_counter()
    latencies = _end_to_end_run(ctx.broker, LATENCY_RECORDS, LATENCY_INTERVAL_MS, 2)
    seconds = time.perf_counter() - start
    p50, p99 = percentile(latencies, 0.5), percentile(latencies, 0.99)
    # The machine's load while it ran: p99 on a shared machine follows it.
    notes = f"p50 {p50:.2f} ms, p99 {p99:.2f} ms, load {os.getloadavg()[0]:.2f}"
    if len(latencies) < LATENCY_RECORDS:
        notes += f"; {len(latencies)} of {LATENCY_RECORDS} delivered"
    row = Result("produce to delivery (2 ShareConsumers)", len(latencies), seconds, 0, notes)
    return row, p50, p99


def format_side_by_side(
    rates: dict[str, dict[str, Result]], latency: dict[str, tuple[float, float]]
) -> str:
    header = f"{'workload (median run)':<40} {'file':>16} {'postgresql':>16} {'pg/file':>8}"
    lines = [header, "-" * len(header)]
    for key, on_file in rates["file"].items():
        on_pg = rates["postgresql"].get(key)
        if on_pg is None:
            continue
        a, b = on_file.records_per_s, on_pg.records_per_s
        ratio = f"{b / a:.2f}" if a else "n/a"
        lines.append(f"{on_file.case:<40} {a:>10,.0f} rec/s {b:>10,.0f} rec/s {ratio:>8}")
    if set(ENGINES) <= set(latency):
        for i, name in enumerate(("p50", "p99")):
            a, b = latency["file"][i], latency["postgresql"][i]
            ratio = f"{b / a:.2f}" if a else "n/a"
            case = f"produce to delivery {name}"
            lines.append(f"{case:<40} {a:>13.2f} ms {b:>13.2f} ms {ratio:>8}")
    return "\n".join(lines)


def bench_storage(ctx: BenchContext, records: int | None = None) -> list[Result]:
    """Produce, share-consume with per-record acknowledgements and produce-to-delivery
    latency on a file-engine broker and a PostgreSQL-engine broker, side by side;
    records `storage.pg_share_rate` and `storage.pg_p99_ms`."""
    from tests.postgres import PostgresServer, PostgresUnavailable

    records = records or min(ctx.records, DEFAULT_STORAGE_RECORDS)
    size = ctx.sizes[0] if ctx.sizes else 100
    figures = ("storage.pg_share_rate", "storage.pg_p99_ms")

    def not_run(why: str) -> list[Result]:
        print(f"storage: not run: {why}", flush=True)
        for figure in figures:
            ctx.not_run[figure] = why
        return []

    readings: dict[str, dict[str, list[Result]]] = {name: {} for name in ENGINES}
    latencies: dict[str, list[tuple[float, float]]] = {name: [] for name in ENGINES}
    rows: dict[str, list[Result]] = {name: [] for name in ENGINES}
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="spool-bench-storage-")))
        try:
            server = PostgresServer()  # its own directory, which the postgres user owns
            stack.callback(server.cleanup)
            server.start()
        except (PostgresUnavailable, OSError, subprocess.CalledProcessError) as exc:
            return not_run(f"no PostgreSQL server: {exc}")
        brokers = {
            "file": BrokerProcess(tmp / "file" / "data"),
            "postgresql": BrokerProcess(tmp / "pg" / "data", {"storage": server.dsn}),
        }
        for name, broker in brokers.items():
            broker.data_dir.parent.mkdir(parents=True)
            stack.callback(_stop, name, broker)
            try:
                broker.start()
                broker.wait_warm()
            except RuntimeError as exc:
                return not_run(f"the {name} broker did not start: {exc}\n{broker.log_tail()}")
        subs = {name: dataclasses.replace(ctx, broker=b) for name, b in brokers.items()}
        for run in range(RUNS):
            for name, sub in subs.items():
                cases = readings[name]
                topic = f"bench-storage-{run}"
                progress(f"storage: producing {records} records on {name} ({run + 1})")
                produced = produce_reading(
                    sub, topic, records, size, partitions=PARTITIONS, time_limit_s=CASE_TIME_LIMIT_S
                )
                cases.setdefault("produce", []).append(produced)
                for consumers in CONSUMERS:
                    progress(f"storage: {consumers} ShareConsumer(s) on {name} ({run + 1})")
                    group = f"storage-{run}-x{consumers}"
                    share = _share(sub, topic, consumers, produced.records, group)
                    cases.setdefault(f"share x{consumers}", []).append(share)
                progress(f"storage: produce to delivery on {name} ({run + 1})")
                row, p50, p99 = _latency(sub)
                progress(f"storage: {name} ({run + 1}): {row.notes}")
                rows[name].append(row)
                latencies[name].append((p50, p99))
    rates = {
        name: {c: median_reading(r) for c, r in cases.items()} for name, cases in readings.items()
    }
    latency = {
        name: (
            statistics.median(p50 for p50, _ in values),
            statistics.median(p99 for _, p99 in values),
        )
        for name, values in latencies.items()
        if values
    }
    ctx.sections.append(format_side_by_side(rates, latency))
    pg = readings["postgresql"]
    best = f"share x{max(CONSUMERS)}"
    complete = all(
        share.records >= produced.records > 0
        for consumers in CONSUMERS
        for share, produced in zip(pg[f"share x{consumers}"], pg["produce"], strict=True)
    )
    if complete:
        ctx.figures["storage.pg_share_rate"] = rates["postgresql"][best].records_per_s
    else:
        ctx.not_run["storage.pg_share_rate"] = "a share case did not read all its records"
    ctx.figures["storage.pg_p99_ms"] = latency["postgresql"][1]
    results: list[Result] = []
    for name, medians in rates.items():
        results += [dataclasses.replace(r, case=f"{r.case} {name}") for r in medians.values()]
        if name in latency and rows[name]:
            p50s = ", ".join(f"{p50:.2f}" for p50, _ in latencies[name])
            p99s = ", ".join(f"{p99:.2f}" for _, p99 in latencies[name])
            loads = ", ".join(r.notes.rsplit("load ", 1)[-1].split(";")[0] for r in rows[name])
            runs = rows[name]
            results.append(
                Result(
                    f"{runs[0].case} {name}",
                    sum(r.records for r in runs),
                    sum(r.seconds for r in runs),
                    0,
                    f"p50 {latency[name][0]:.2f} ms, p99 {latency[name][1]:.2f} ms "
                    f"(medians of {len(runs)} runs; p50s {p50s}; p99s {p99s}; "
                    f"load averages {loads})",
                )
            )
    return results


def _stop(name: str, broker: BrokerProcess) -> None:
    code = broker.stop()
    if code not in (0, -1):
        print(f"storage: the {name} broker exited with {code}\n{broker.log_tail()}", flush=True)
