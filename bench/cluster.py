"""A cluster of brokers on one PostgreSQL: share consumption on 1, 2 and 3 brokers, and
the failover time after a kill -9.

`bench_cluster(ctx)` is registered in `bench.__main__` as "cluster"; run it alone with
`python -m bench --only cluster`.

It starts a throwaway PostgreSQL (tests/postgres.py, as bench.storage does) and broker
processes on this machine sharing one database of it (broker.registry,
broker.leadership: the partitions are spread evenly over the live brokers).

- Share consumption with per-record acknowledgements: the records (value size the run's
  first --sizes) are produced once to a 6-partition topic while one broker runs; then
  the cluster grows and shrinks, 1, 2, 3, 2, 1 brokers (a broker joins, or one not
  holding the coordinators stops gracefully and hands its partitions over: coordinator
  logs are not handed over on a stop yet; each reading waits until every live broker
  names the same leaders, spread evenly over them), and at each size a new share group
  reads every record from the earliest offset with CONSUMERS ShareConsumers in
  explicit acknowledgement mode, each record acknowledged ACCEPT and each poll's
  acknowledgements sent with commit_sync. The consumers are separate processes (one
  ShareConsumer each), so one client process's interpreter lock does not bound the
  rate; the rate counts from the first record to the last, as in bench.share. The
  sizes visited twice (1 and 2 brokers, on the way up and down) take the mean of their
  two readings, which cancels a drift of the machine's other load over the run. The
  ratio 2 brokers / 1 broker is `cluster.share_ratio_2_1`.
- Failover: for each broker.session.timeout.ms of FAILOVER_SESSIONS_MS (Kafka's
  default 9000, with broker.heartbeat.interval.ms at its default 2000, and 3000 with
  500), three brokers on a new database, a 6-partition topic, an idempotent producer
  writing a record every PRODUCE_INTERVAL_MS round-robin and a ShareConsumer reading
  them (explicit acknowledgements). A broker leading partitions but neither the group
  nor the share coordinator is killed with SIGKILL; the failover time is from the kill
  to the first record delivered from one of its partitions that was produced after the
  kill, so written and served by the new leader: the lease running out, a survivor
  claiming the partition and loading it, and the clients finding the new leader
  (`cluster.failover_s_9000`, `cluster.failover_s_3000`).

Everything runs on the same machine: the brokers, PostgreSQL and the consumer
processes share its cores (2 here), with whatever else runs there; the load average
at each reading is printed beside it, with the cores each broker and the machine
used. When one broker uses well under a core while the machine is busy on both, the
clients and the rest of the machine bound the rate, not the broker, and a second
broker has little to add; a share-partition leader that is not the share
coordinator's broker also sends its share-state writes over the wire to it, more
work per record than a broker doing both.
SPOOL_BENCH_CLUSTER_RECORDS (200000) records, SPOOL_BENCH_CLUSTER_CONSUMERS (3)
consumer processes, SPOOL_BENCH_CLUSTER_CLIENT (`key=value,...`) more consumer
properties: the readings use librdkafka's defaults, and with several consumers and
several brokers they wait on its ShareFetch long poll (fetch.wait.max.ms, 500 ms),
the brokers near idle; `SPOOL_BENCH_CLUSTER_CLIENT=fetch.wait.max.ms=10` shows the
rate without that wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import multiprocessing
import os
import struct
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import (
    BenchContext,
    BrokerProcess,
    Result,
    fill_topic,
    progress,
    share_group_from_earliest,
)

DEFAULT_CLUSTER_RECORDS = int(os.environ.get("SPOOL_BENCH_CLUSTER_RECORDS", "200000"))
CONSUMERS = int(os.environ.get("SPOOL_BENCH_CLUSTER_CONSUMERS", "3"))
PARTITIONS = 6
SIZES = (1, 2, 3, 2, 1)  # brokers at each reading: up, then down
CASE_TIME_LIMIT_S = 90.0
SETTLE_TIMEOUT_S = 60.0
# broker.session.timeout.ms -> broker.heartbeat.interval.ms (Kafka's defaults first).
FAILOVER_SESSIONS_MS = {9000: 2000, 3000: 500}
PRODUCE_INTERVAL_MS = 5.0
PROBE_GROUP = "spool-bench-probe"
FIGURES = (
    "cluster.share_ratio_2_1",
    "cluster.failover_s_9000",
    "cluster.failover_s_3000",
)


@dataclasses.dataclass
class Reading:
    brokers: int
    result: Result
    load: float  # the 1-minute load average when it ended
    # Cores used while the records were read: each broker's, and the whole machine's.
    broker_cores: dict[int, float] = dataclasses.field(default_factory=dict)
    machine_cores: float | None = None


@dataclasses.dataclass
class CpuSample:
    at: float
    brokers: dict[int, float]  # node id -> CPU seconds
    busy: float  # machine-wide busy and total jiffies (/proc/stat)
    total: float


def cpu_sample(brokers: dict[int, BrokerProcess]) -> CpuSample:
    """CPU seconds of each broker process and the machine's busy/total time, from /proc
    (zeros where it cannot be read)."""
    tick = os.sysconf("SC_CLK_TCK")
    used: dict[int, float] = {}
    for node_id, b in brokers.items():
        if b.process is None:
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{b.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
            used[node_id] = (int(fields[11]) + int(fields[12])) / tick
    busy = total = 0.0
    with contextlib.suppress(OSError, ValueError):
        values = [float(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        total = sum(values)
        busy = total - values[3] - (values[4] if len(values) > 4 else 0.0)  # idle, iowait
    return CpuSample(time.monotonic(), used, busy, total)


def cores_used(before: CpuSample, after: CpuSample) -> tuple[dict[int, float], float | None]:
    wall = after.at - before.at
    if wall <= 0:
        return {}, None
    brokers = {
        n: (after.brokers[n] - before.brokers[n]) / wall
        for n in before.brokers
        if n in after.brokers
    }
    span = after.total - before.total
    machine = (after.busy - before.busy) / span * (os.cpu_count() or 1) if span > 0 else None
    return brokers, machine


@dataclasses.dataclass
class Failover:
    session_ms: int
    seconds: float | None
    killed: int
    partitions: tuple[int, ...]
    notes: str = ""


# --- the brokers ---------------------------------------------------------------------


class Cluster:
    """Broker processes on one database, node ids from 1; started and stopped by id."""

    def __init__(self, root: Path, dsn: str, settings: dict[str, str] | None = None) -> None:
        self.root = root
        self.dsn = dsn
        self.settings = dict(settings or {})
        self.brokers: dict[int, BrokerProcess] = {}

    def start(self, node_id: int) -> BrokerProcess:
        data = self.root / f"broker{node_id}" / "data"
        data.parent.mkdir(parents=True, exist_ok=True)
        b = BrokerProcess(data, {**self.settings, "storage": self.dsn, "node.id": str(node_id)})
        self.brokers[node_id] = b
        b.start()
        b.wait_warm()
        return b

    def live(self) -> dict[int, BrokerProcess]:
        return {
            n: b
            for n, b in self.brokers.items()
            if b.process is not None and b.process.poll() is None
        }

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.live().values())

    def stop_all(self) -> None:
        for b in self.live().values():
            b.stop()


async def _leaders(b: BrokerProcess, topic: str) -> dict[int, int]:
    """Partition -> leader id as broker `b` answers Metadata (-1: none)."""
    from protocol.client import KafkaClient

    client = await KafkaClient.connect(b.host, b.port, "spool-bench-cluster")
    try:
        metadata = await client.request(
            3,
            12,
            {
                "topics": [{"name": topic}],
                "allow_auto_topic_creation": False,
                "include_topic_authorized_operations": False,
            },
        )
    finally:
        await client.close()
    for t in metadata.topics:
        if t.name == topic:
            return {int(p.partition_index): int(p.leader_id) for p in t.partitions}
    return {}


def leaders(b: BrokerProcess, topic: str) -> dict[int, int]:
    return asyncio.run(_leaders(b, topic))


def spread_evenly(layouts: list[dict[int, int]], live: set[int], partitions: int) -> bool:
    """Every broker names the same leaders for all partitions, spread evenly over `live`."""
    if not layouts or len(layouts[0]) != partitions:
        return False
    if any(layout != layouts[0] for layout in layouts[1:]):
        return False
    counts = Counter(layouts[0].values())
    return set(counts) == live and max(counts.values()) - min(counts.values()) <= 1


def settle(cluster: Cluster, topic: str, timeout: float = SETTLE_TIMEOUT_S) -> dict[int, int]:
    """Wait until every live broker names the same leaders, spread over the live ones."""
    deadline = time.monotonic() + timeout
    layouts: list[dict[int, int]] = []
    while time.monotonic() < deadline:
        live = cluster.live()
        with contextlib.suppress(OSError, Exception):
            layouts = [leaders(b, topic) for b in live.values()]
            if spread_evenly(layouts, set(live), PARTITIONS):
                return layouts[0]
        time.sleep(0.2)
    raise RuntimeError(f"the leaders of {topic} did not settle within {timeout:g}s: {layouts}")


async def _reset_to_start(bootstrap: str, group: str, topic: str) -> None:
    from protocol.admin import AdminClient

    async with await AdminClient.connect(bootstrap, 30.0, "spool-bench-cluster") as admin:
        await admin.alter_share_group_offsets(group, {(topic, p): 0 for p in range(PARTITIONS)})


def start_from_earliest(ctx: BenchContext, bootstrap: str, group: str, topic: str) -> None:
    """A new share group reading `topic` from offset 0 on every partition: the group
    config share.auto.offset.reset=earliest, and its start offsets set to 0 with
    AlterShareGroupOffsets (kafka-share-groups.sh --reset-offsets --to-earliest), which
    initializes the share state in the share coordinator before the first member
    joins. (The second also covered share-partition leaders that resolved the reset
    with the default before group configs were shared by all brokers.)"""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        try:  # the coordinators may be moving: a broker that just joined claims them
            share_group_from_earliest(dataclasses.replace(ctx, endpoint=bootstrap), group)
            asyncio.run(_reset_to_start(bootstrap, group, topic))
            return
        except Exception as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(f"cannot start group {group} at offset 0: {exc}") from exc
            time.sleep(0.5)


# --- share consumption in processes -----------------------------------------------------


def client_overrides() -> dict[str, str]:
    """SPOOL_BENCH_CLUSTER_CLIENT=key=value,key=value: more consumer properties."""
    text = os.environ.get("SPOOL_BENCH_CLUSTER_CLIENT", "")
    return dict(item.split("=", 1) for item in text.split(",") if "=" in item)


def _consumer_process(
    bootstrap: str,
    topic: str,
    group: str,
    expected: int,
    time_limit_s: float,
    shared: Any,
    lock: Any,
    go: Any,
    stop: Any,
) -> None:
    """One ShareConsumer, explicit acknowledgements; adds its first deliveries to
    `shared` = [records, first_at, done_at, redeliveries, errors, ready] (time.monotonic).
    It counts itself ready once subscribed and polls once `go` is set, so every
    consumer process has started (imported, connected) before the clock runs."""
    from confluent_kafka import AcknowledgeType, ShareConsumer

    consumer = ShareConsumer(
        {
            "bootstrap.servers": bootstrap,
            "broker.address.family": "v4",
            "group.id": group,
            "share.acknowledgement.mode": "explicit",
            **client_overrides(),
        }
    )
    consumer.subscribe([topic])
    with lock:
        shared[5] += 1
    go.wait(time_limit_s)
    deadline = time.monotonic() + time_limit_s
    try:
        while not stop.is_set() and time.monotonic() < deadline:
            msgs = list(consumer.poll(0.5))
            if not msgs:
                continue
            first = redelivered = errors = 0
            for msg in msgs:
                if msg.error() is not None:
                    errors += 1
                    continue
                consumer.acknowledge(msg, AcknowledgeType.ACCEPT)
                if msg.delivery_count() == 1:
                    first += 1
                else:
                    redelivered += 1
            consumer.commit_sync(30.0)
            now = time.monotonic()
            with lock:
                if shared[1] == 0.0 and first:
                    shared[1] = now
                shared[0] += first
                shared[3] += redelivered
                shared[4] += errors
                if shared[0] >= expected and shared[2] == 0.0:
                    shared[2] = now
                    stop.set()
    finally:
        consumer.close()


def share_consume_processes(
    bootstrap: str,
    topic: str,
    group: str,
    consumers: int,
    expected: int,
    time_limit_s: float,
    sample: Callable[[], CpuSample] | None = None,
) -> tuple[Result, CpuSample | None, CpuSample | None]:
    """`consumers` ShareConsumer processes in `group` read `topic` until `expected` first
    deliveries (or the time limit); the rate from the first record to the last, and
    `sample()` taken when the consumers start polling and when they are done."""
    mp = multiprocessing.get_context("spawn")  # no fork of a process running librdkafka
    shared = mp.Array("d", 6, lock=False)
    lock = mp.Lock()
    go = mp.Event()
    stop = mp.Event()
    procs = [
        mp.Process(
            target=_consumer_process,
            args=(bootstrap, topic, group, expected, time_limit_s, shared, lock, go, stop),
            daemon=True,
        )
        for _ in range(consumers)
    ]
    for p in procs:
        p.start()
    ready_by = time.monotonic() + 60
    while shared[5] < consumers and time.monotonic() < ready_by:
        time.sleep(0.02)
    before = sample() if sample else None
    start = time.monotonic()
    deadline = start + time_limit_s
    go.set()
    while not stop.is_set() and time.monotonic() < deadline:
        time.sleep(0.01)
    after = sample() if sample else None
    for p in procs:
        p.join(max(deadline - time.monotonic(), 0) + 30)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5)
    records, first_at, done_at, redelivered, errors = (shared[i] for i in range(5))
    first_at = first_at or start
    seconds = (done_at or time.monotonic()) - first_at
    notes = [f"first record after {first_at - start:.2f}s"]
    if records < expected:
        notes.append(f"time limit hit: {int(records)} of {expected}")
    if redelivered:
        notes.append(f"{int(redelivered)} redeliveries")
    if errors:
        notes.append(f"{int(errors)} error events")
    failed = [p.exitcode for p in procs if p.exitcode not in (0, None)]
    if failed:
        notes.append(f"consumer exit codes {failed}")
    result = Result(
        f"share {PARTITIONS}p x{consumers} per-record acks",
        int(records),
        seconds,
        0,
        "; ".join(notes),
    )
    return result, before, after


# --- failover ----------------------------------------------------------------------------


async def _coordinators(bootstrap: str, group: str) -> set[int]:
    """The brokers holding the group and share coordinators for `group`."""
    from protocol.admin import AdminClient

    async with await AdminClient.connect(bootstrap, 30.0, "spool-bench-cluster") as admin:
        found = await admin.find_coordinators([group], 0)
        found += await admin.find_coordinators([f"{group}:probe:0"], 2)
    return {c.node.node_id for c in found if c.node is not None}


def failover(ctx: BenchContext, root: Path, dsn: str, session_ms: int) -> Failover:
    """Three brokers with `session_ms`; kill -9 of one leading partitions but no
    coordinator, under produce and share-consume load; the seconds from the kill to the
    first record of its partitions produced after the kill and delivered."""
    from confluent_kafka import AcknowledgeType, Producer, ShareConsumer

    interval_ms = FAILOVER_SESSIONS_MS[session_ms]
    cluster = Cluster(
        root,
        dsn,
        {
            "broker.session.timeout.ms": str(session_ms),
            "broker.heartbeat.interval.ms": str(interval_ms),
        },
    )
    topic, group = "bench-failover", f"bench-failover-{session_ms}"
    try:
        for node_id in (1, 2, 3):
            progress(f"cluster: failover ({session_ms} ms): starting broker {node_id}")
            cluster.start(node_id)
        sub = dataclasses.replace(ctx, endpoint=cluster.bootstrap)
        fill_topic(sub, topic, 0, 10, partitions=PARTITIONS)
        layout = settle(cluster, topic)
        start_from_earliest(ctx, cluster.bootstrap, group, topic)
        coordinators = asyncio.run(_coordinators(cluster.bootstrap, group))
        candidates = sorted(set(layout.values()) - coordinators)
        if not candidates:
            return Failover(session_ms, None, -1, (), f"every leader coordinates: {coordinators}")
        victim = candidates[0]
        theirs = tuple(p for p, leader in layout.items() if leader == victim)

        stop = threading.Event()
        killed_at: list[float] = []
        first_after: list[float] = []
        delivered = [0]
        errors: list[str] = []

        def produce() -> None:
            producer = Producer(
                {
                    "bootstrap.servers": cluster.bootstrap,
                    "broker.address.family": "v4",
                    "enable.idempotence": True,
                    "linger.ms": 0,
                    "message.timeout.ms": 120_000,
                }
            )
            i = 0
            while not stop.is_set():
                value = struct.pack(">d", time.monotonic())
                producer.produce(topic, value=value, partition=i % PARTITIONS)
                producer.poll(0)
                i += 1
                time.sleep(PRODUCE_INTERVAL_MS / 1000)
            producer.flush(10)

        def consume() -> None:
            consumer = ShareConsumer(
                {
                    "bootstrap.servers": cluster.bootstrap,
                    "broker.address.family": "v4",
                    "group.id": group,
                    "share.acknowledgement.mode": "explicit",
                }
            )
            consumer.subscribe([topic])
            try:
                while not stop.is_set():
                    msgs = list(consumer.poll(0.2))
                    now = time.monotonic()
                    for msg in msgs:
                        if msg.error() is not None:
                            errors.append(str(msg.error()))
                            continue
                        delivered[0] += 1
                        with contextlib.suppress(Exception):
                            consumer.acknowledge(msg, AcknowledgeType.ACCEPT)
                        (sent,) = struct.unpack(">d", msg.value() or bytes(8))
                        if (
                            killed_at
                            and not first_after
                            and msg.partition() in theirs
                            and sent >= killed_at[0]
                        ):
                            first_after.append(now)
                    if msgs:
                        with contextlib.suppress(Exception):
                            consumer.commit_sync(10.0)
            finally:
                with contextlib.suppress(Exception):
                    consumer.close()

        threads = [threading.Thread(target=f, daemon=True) for f in (produce, consume)]
        for t in threads:
            t.start()
        # Traffic flows through every partition before the kill.
        warm_deadline = time.monotonic() + 60
        while delivered[0] < 200 and time.monotonic() < warm_deadline:
            time.sleep(0.1)
        progress(
            f"cluster: failover ({session_ms} ms): kill -9 of broker {victim} "
            f"(partitions {list(theirs)}; coordinators on {sorted(coordinators)})"
        )
        process = cluster.brokers[victim].process
        assert process is not None
        killed_at.append(time.monotonic())
        process.kill()
        process.wait(10)
        wait_until = killed_at[0] + session_ms / 1000 + 60
        while not first_after and time.monotonic() < wait_until:
            time.sleep(0.05)
        stop.set()
        for t in threads:
            t.join(30)
        notes = f"{delivered[0]} records delivered"
        if errors:
            notes += f"; {len(errors)} error events ({errors[0]})"
        seconds = first_after[0] - killed_at[0] if first_after else None
        return Failover(session_ms, seconds, victim, theirs, notes)
    finally:
        cluster.stop_all()


# --- the bench ---------------------------------------------------------------------------


def _create_database(server_dsn: str, name: str) -> str:
    import asyncpg

    async def create() -> None:
        conn = await asyncpg.connect(server_dsn)
        try:
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()

    asyncio.run(create())
    return server_dsn.rsplit("/", 1)[0] + f"/{name}"


def describe_cores(r: Reading) -> str:
    brokers = " ".join(f"b{n} {c:.2f}" for n, c in sorted(r.broker_cores.items()))
    machine = "n/a" if r.machine_cores is None else f"{r.machine_cores:.2f}"
    return f"{brokers}, machine {machine} of {os.cpu_count()}"


def format_side_by_side(readings: list[Reading], failovers: list[Failover]) -> str:
    """Rates by broker count (each reading, and the mean of a count's readings), the
    ratios to 1 broker, then the failover times."""
    by_size: dict[int, list[Reading]] = {}
    for r in readings:
        by_size.setdefault(r.brokers, []).append(r)
    means = {n: sum(r.result.records_per_s for r in rs) / len(rs) for n, rs in by_size.items()}
    header = f"{'brokers':>7} {'share rec/s (mean)':>19} {'vs 1 broker':>11}  readings (load avg)"
    lines = [header, "-" * len(header)]
    for n in sorted(by_size):
        ratio = f"{means[n] / means[1]:.2f}" if means.get(1) else "n/a"
        each = ", ".join(f"{r.result.records_per_s:,.0f} ({r.load:.1f})" for r in by_size[n])
        lines.append(f"{n:>7} {means[n]:>19,.0f} {ratio:>11}  {each}")
        for r in by_size[n]:
            if r.broker_cores:
                lines.append(f"{'':>7} {'':>19} {'':>11}    cores used: {describe_cores(r)}")
    if failovers:
        lines.append("")
        header = f"{'broker.session.timeout.ms':>25} {'failover s':>10}  killed"
        lines += [header, "-" * len(header)]
        for f in failovers:
            took = f"{f.seconds:.2f}" if f.seconds is not None else "n/a"
            lines.append(
                f"{f.session_ms:>25} {took:>10}  broker {f.killed} "
                f"(partitions {','.join(map(str, f.partitions))}); {f.notes}"
            )
    return "\n".join(lines)


def bench_cluster(ctx: BenchContext, records: int | None = None) -> list[Result]:
    """Share consumption with per-record acknowledgements on 1, 2 and 3 brokers of one
    cluster, side by side, and the failover time after a kill -9; records
    `cluster.share_ratio_2_1` and `cluster.failover_s_<session ms>`."""
    from tests.postgres import PostgresServer, PostgresUnavailable

    records = records or min(ctx.records, DEFAULT_CLUSTER_RECORDS)
    size = ctx.sizes[0] if ctx.sizes else 100

    def not_run(why: str) -> list[Result]:
        print(f"cluster: not run: {why}", flush=True)
        for figure in FIGURES:
            ctx.not_run.setdefault(figure, why)
        return []

    readings: list[Reading] = []
    failovers: list[Failover] = []
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="spool-bench-cluster-")))
        try:
            server = PostgresServer()
            stack.callback(server.cleanup)
            server.start()
        except (PostgresUnavailable, OSError, subprocess.CalledProcessError) as exc:
            return not_run(f"no PostgreSQL server: {exc}")
        cluster = Cluster(tmp / "scale", _create_database(server.dsn, "spool_bench_scale"))
        stack.callback(cluster.stop_all)
        topic = "bench-cluster"
        try:
            progress("cluster: starting broker 1")
            cluster.start(1)
            sub = dataclasses.replace(ctx, endpoint=cluster.bootstrap)
            progress(f"cluster: producing {records} records to {PARTITIONS} partitions")
            stored = fill_topic(sub, topic, records, size, partitions=PARTITIONS)
            for run, brokers in enumerate(SIZES):
                live = cluster.live()
                if brokers > len(live):
                    progress(f"cluster: starting broker {brokers}")
                    cluster.start(brokers)
                elif brokers < len(live):
                    # Not the coordinators' broker: coordinator logs are not handed over
                    # on a graceful stop yet (broker.leadership), partitions are.
                    held = asyncio.run(_coordinators(cluster.bootstrap, PROBE_GROUP))
                    leaving = min(set(live) - held)
                    progress(f"cluster: stopping broker {leaving} (hand-over)")
                    live[leaving].stop()
                layout = settle(cluster, topic)
                group = f"bench-cluster-{run}-{brokers}b"
                start_from_earliest(ctx, cluster.bootstrap, group, topic)
                progress(
                    f"cluster: {CONSUMERS} consumers on {brokers} broker(s), leaders "
                    f"{dict(sorted(layout.items()))}"
                )
                live = cluster.live()
                result, before, after = share_consume_processes(
                    cluster.bootstrap,
                    topic,
                    group,
                    CONSUMERS,
                    stored,
                    CASE_TIME_LIMIT_S,
                    functools.partial(cpu_sample, live),
                )
                result.case = f"{result.case} {brokers} broker{'s' if brokers > 1 else ''}"
                reading = Reading(brokers, result, os.getloadavg()[0])
                if before is not None and after is not None:
                    reading.broker_cores, reading.machine_cores = cores_used(before, after)
                    result.notes += "; cores: " + describe_cores(reading)
                readings.append(reading)
        except Exception as exc:
            for n, b in cluster.brokers.items():
                code = None if b.process is None else b.process.poll()
                print(f"cluster: broker {n} (exit {code}):\n{b.log_tail(20)}", flush=True)
            return not_run(f"the cluster failed: {exc}")
        finally:
            cluster.stop_all()
        for session_ms in FAILOVER_SESSIONS_MS:
            dsn = _create_database(server.dsn, f"spool_bench_failover_{session_ms}")
            try:
                failovers.append(failover(ctx, tmp / f"failover-{session_ms}", dsn, session_ms))
            except (RuntimeError, AssertionError) as exc:
                ctx.not_run[f"cluster.failover_s_{session_ms}"] = f"failover run failed: {exc}"
    ctx.sections.append(format_side_by_side(readings, failovers))
    complete = [r for r in readings if r.result.records >= stored > 0]
    rates: dict[int, list[float]] = {}
    for r in complete:
        rates.setdefault(r.brokers, []).append(r.result.records_per_s)
    if len(complete) == len(readings) and 1 in rates and 2 in rates:
        one = sum(rates[1]) / len(rates[1])
        two = sum(rates[2]) / len(rates[2])
        ctx.figures["cluster.share_ratio_2_1"] = two / one
    else:
        ctx.not_run["cluster.share_ratio_2_1"] = "a reading did not read all its records"
    for f in failovers:
        name = f"cluster.failover_s_{f.session_ms}"
        if f.seconds is not None:
            ctx.figures[name] = f.seconds
        else:
            ctx.not_run[name] = f"no record from the new leader: {f.notes}"
    return [r.result for r in readings]
