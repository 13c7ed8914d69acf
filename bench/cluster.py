"""A cluster of brokers on one PostgreSQL: share consumption on 1, 2 and 3 brokers, and
the failover time after a kill -9.

`bench_cluster(ctx)` is registered in `bench.__main__` as "cluster"; run it alone with
`python -m bench --only cluster`.

It starts a throwaway PostgreSQL (tests/postgres.py, as bench.storage does) and broker
processes on this machine sharing one database of it (broker.registry,
broker.leadership: the partitions are spread evenly over the live brokers).

- Share consumption with per-record acknowledgements: the records (value size the run's
  first --sizes) are produced once to a 6-partition topic while one broker runs; then
  the cluster grows and shrinks, 1, 2, 3, 2, 1 brokers (a broker joins, or one stops
  gracefully and hands its partitions and coordinators over, preferably one holding
  no coordinator; each reading waits until every live broker names the same leaders,
  spread evenly over them). At each size two readings, each by a new share group
  reading every record from the earliest offset with CONSUMERS consumer processes in
  explicit acknowledgement mode, every record acknowledged ACCEPT:
  - `protocol`, the figure: bench.share_client's consumer, which behaves on the wire
    as Kafka's Java KafkaShareConsumer 4.2: a ShareFetch to every leader of its
    partitions at once, each node's next one sent when its answer is handled, the
    acknowledgements of a delivery piggybacked on the next ShareFetch to that node
    (the last ones on the ShareAcknowledge closing the session). Its per-record work
    is small (batch headers, not records, are read), so the brokers, not the
    consumers, take most of the machine. `cluster.share_ratio_2_1` is the ratio of
    its mean rates on 2 brokers and on 1.
  - `librdkafka`, informational: confluent-kafka's ShareConsumer with librdkafka's
    defaults, each poll's acknowledgements sent with commit_sync. It has one
    ShareFetch in flight at a time, to one broker picked round-robin over its
    partitions; a broker with nothing for it holds that fetch for fetch.wait.max.ms
    (500 ms) while the other broker's partitions wait. Its consumers also use more
    CPU per record than the protocol ones.
  The clock starts once the group's assignment has settled (every member holds its
  target, the partitions split between them): a member takes a new target only at
  its own heartbeat (5 s), and a reading taken meanwhile has the first member on
  every partition, the others on few. The consumers are separate processes, so one
  client's interpreter lock does not bound the rate; the rate counts from the first
  record delivered to the last. Every earlier delivery has then been acknowledged:
  a protocol consumer's next ShareFetch carries the acknowledgements (and is only
  answered once they are applied), a librdkafka one counts records after
  commit_sync. The last ShareFetch of each protocol consumer's nodes, at most
  max.poll.records of them, are acknowledged when it closes, after the clock;
  every reading then checks that each share-partition's start offset reached the
  log end (all records acknowledged). The sizes visited twice (1 and 2 brokers, on
  the way up and down) take the mean of their two readings, which cancels a drift
  of the machine's other load over the run.
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
processes share its cores (2 here), with whatever else runs there. Beside each
reading: the load average, and the cores used while it ran by each broker, the
consumer processes together, PostgreSQL (all its processes) and the whole machine.
A second broker can only add what the machine has left: with B, C and P the cores
the broker, the consumers and PostgreSQL use per unit of rate, 2 brokers reach at
most 2 / (B + C + P) units where one broker, if it is the bound, reaches 1 / B, so
the ratio is at most 2B / (B + C + P) on 2 cores, less whatever else runs. A
share-partition leader that is not the share coordinator's broker also sends its
share-state writes over the wire to it (broker.share.remote_persister, one request
in flight per broker, RPC and group), more work per record than a broker doing both. And
every share-state write of the cluster is committed by the one broker holding the
`share-state` coordinator log (broker.leadership.COORDINATOR_LOGS; one commit in
flight per log, persister.pg_commit), whatever the number of brokers: with one
ShareFetch in flight per consumer and node, a round that crosses more processes
(consumer, leader, share coordinator's broker, PostgreSQL, and back) delivers fewer
records per second unless the CPU, not the round trip, was the bound. Under
SPOOL_BENCH_CLUSTER_DEBUG=1 the consumers print each node's time per ShareFetch.
SPOOL_BENCH_CLUSTER_RECORDS (500000) records, SPOOL_BENCH_CLUSTER_CONSUMERS (3)
consumer processes, SPOOL_BENCH_CLUSTER_CLIENT (`key=value,...`) more librdkafka
consumer properties (e.g. fetch.wait.max.ms=10), SPOOL_BENCH_CLUSTER_DEBUG=1 has each
protocol consumer print its ShareFetch count, time in flight and records per node.
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
    share_client,
    share_group_from_earliest,
)

DEFAULT_CLUSTER_RECORDS = int(os.environ.get("SPOOL_BENCH_CLUSTER_RECORDS", "500000"))
CONSUMERS = int(os.environ.get("SPOOL_BENCH_CLUSTER_CONSUMERS", "3"))
PARTITIONS = 6
SIZES = (1, 2, 3, 2, 1)  # brokers at each reading: up, then down
CASE_TIME_LIMIT_S = 90.0
SETTLE_TIMEOUT_S = 60.0
# broker.session.timeout.ms -> broker.heartbeat.interval.ms (Kafka's defaults first).
FAILOVER_SESSIONS_MS = {9000: 2000, 3000: 500}
PRODUCE_INTERVAL_MS = 5.0
PROBE_GROUP = "spool-bench-probe"
# The consumers of each reading: bench.share_client's protocol-level share consumer
# (the figure), then confluent-kafka's ShareConsumer (informational).
PROTOCOL_CLIENT, LIBRDKAFKA_CLIENT = "protocol", "librdkafka"
CLIENTS = (PROTOCOL_CLIENT, LIBRDKAFKA_CLIENT)
CLIENT_TITLES = {
    PROTOCOL_CLIENT: "bench.share_client consumers (a ShareFetch per leader at once, "
    "as Kafka's Java KafkaShareConsumer): cluster.share_ratio_2_1",
    LIBRDKAFKA_CLIENT: "confluent-kafka ShareConsumer (librdkafka: one ShareFetch at a "
    "time, round-robin over brokers; informational)",
}
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
    client: str = PROTOCOL_CLIENT
    # Cores used while the records were read: each broker's, the consumer processes'
    # (together), PostgreSQL's (all its processes) and the whole machine's.
    broker_cores: dict[int, float] = dataclasses.field(default_factory=dict)
    machine_cores: float | None = None
    client_cores: float | None = None
    postgres_cores: float | None = None


@dataclasses.dataclass
class CpuSample:
    at: float
    brokers: dict[int, float]  # node id -> CPU seconds
    busy: float  # machine-wide busy and total jiffies (/proc/stat)
    total: float
    clients: float = 0.0  # CPU seconds of the consumer processes
    postgres: float | None = None  # CPU seconds of PostgreSQL's processes


def _process_cpu_s(pid: int, tick: int) -> float | None:
    """utime + stime of a process, in seconds (None when it cannot be read)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / tick
    return None


def _tree_cpu_s(root: int, tick: int) -> float | None:
    """CPU seconds of `root` and its children (PostgreSQL's postmaster and backends);
    backends that ended between two samples are missed, so it is a lower bound."""
    total = _process_cpu_s(root, tick)
    if total is None:
        return None
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == root:
                    total += (int(fields[11]) + int(fields[12])) / tick
    return total


def cpu_sample(
    brokers: dict[int, BrokerProcess],
    clients: list[int] | None = None,
    postgres_pid: int | None = None,
) -> CpuSample:
    """CPU seconds of each broker process, of the `clients` processes together, of
    PostgreSQL (its postmaster `postgres_pid` and children), and the machine's
    busy/total time, from /proc (left out where it cannot be read)."""
    tick = os.sysconf("SC_CLK_TCK")
    used: dict[int, float] = {}
    for node_id, b in brokers.items():
        if b.process is None:
            continue
        cpu = _process_cpu_s(b.process.pid, tick)
        if cpu is not None:
            used[node_id] = cpu
    client_s = sum(filter(None, (_process_cpu_s(pid, tick) for pid in clients or ())))
    postgres_s = None if postgres_pid is None else _tree_cpu_s(postgres_pid, tick)
    busy = total = 0.0
    with contextlib.suppress(OSError, ValueError):
        values = [float(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        total = sum(values)
        busy = total - values[3] - (values[4] if len(values) > 4 else 0.0)  # idle, iowait
    return CpuSample(time.monotonic(), used, busy, total, client_s, postgres_s)


@dataclasses.dataclass
class Cores:
    """Cores used between two samples (CPU seconds / wall seconds)."""

    brokers: dict[int, float]
    machine: float | None
    clients: float | None
    postgres: float | None


def cores_used(before: CpuSample, after: CpuSample) -> Cores:
    wall = after.at - before.at
    if wall <= 0:
        return Cores({}, None, None, None)
    brokers = {
        n: (after.brokers[n] - before.brokers[n]) / wall
        for n in before.brokers
        if n in after.brokers
    }
    span = after.total - before.total
    machine = (after.busy - before.busy) / span * (os.cpu_count() or 1) if span > 0 else None
    clients = (after.clients - before.clients) / wall
    postgres = None
    if before.postgres is not None and after.postgres is not None:
        postgres = max(after.postgres - before.postgres, 0.0) / wall
    return Cores(brokers, machine, clients, postgres)


def postmaster_pid(data_dir: Path) -> int | None:
    """PostgreSQL's postmaster pid, from postmaster.pid in its data directory."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int((data_dir / "postmaster.pid").read_text().split()[0])
    return None


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

# What the consumer processes add up in a shared array of doubles.
RECORDS, FIRST_AT, DONE_AT, REDELIVERED, ERRORS, READY = range(6)
ACK_FAILED, ACKED, FETCHES, EMPTY_FETCHES = range(6, 10)
SHARED_SLOTS = 10


def client_overrides() -> dict[str, str]:
    """SPOOL_BENCH_CLUSTER_CLIENT=key=value,key=value: more librdkafka consumer
    properties (the confluent-kafka reading only)."""
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
    """One confluent-kafka ShareConsumer, explicit acknowledgements, each poll's
    acknowledgements sent with commit_sync; adds its first deliveries to `shared`
    (the slots above; times are time.monotonic) once they are committed. It counts
    itself ready once subscribed and polls once `go` is set."""
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
        shared[READY] += 1
    go.wait(time_limit_s)
    deadline = time.monotonic() + time_limit_s
    try:
        while not stop.is_set() and time.monotonic() < deadline:
            msgs = list(consumer.poll(0.5))
            with lock:
                shared[FETCHES] += 1
                shared[EMPTY_FETCHES] += not msgs
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
            acked = True
            try:
                consumer.commit_sync(30.0)
            except Exception:
                acked = False
            now = time.monotonic()
            with lock:
                if shared[FIRST_AT] == 0.0 and first:
                    shared[FIRST_AT] = now
                shared[RECORDS] += first
                shared[REDELIVERED] += redelivered
                shared[ERRORS] += errors
                shared[ACKED if acked else ACK_FAILED] += first + redelivered
                if shared[RECORDS] >= expected and shared[DONE_AT] == 0.0:
                    shared[DONE_AT] = now
                    stop.set()
    finally:
        consumer.close()


CLIENT_PROCESSES: dict[str, Callable[..., None]] = {
    PROTOCOL_CLIENT: share_client.consumer_process,
    LIBRDKAFKA_CLIENT: _consumer_process,
}


async def _describe(bootstrap: str, group: str) -> Any:
    from protocol.admin import AdminClient

    async with await AdminClient.connect(bootstrap, 10.0, "spool-bench-cluster") as admin:
        return await admin.describe_share_group(group)


def assignment_settled(description: Any, topic: str, members: int, partitions: int) -> bool:
    """`members` members, each holding the group's current target assignment (member
    epoch = assignment epoch), their partitions of `topic` disjoint and covering all."""
    if len(description.members) != members:
        return False
    held: list[int] = []
    for m in description.members:
        if m.member_epoch != description.assignment_epoch:
            return False
        held += m.assignment.get(topic, ())
    return sorted(held) == list(range(partitions))


def wait_for_assignment(
    bootstrap: str, group: str, topic: str, members: int, timeout_s: float
) -> float | None:
    """Seconds until every member holds its target assignment (`assignment_settled`),
    or None if it did not within `timeout_s`. A member takes its target only at its
    own heartbeat (group.share.heartbeat.interval.ms, 5000): until then the first to
    join still holds every partition."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        with contextlib.suppress(Exception):
            if assignment_settled(
                asyncio.run(_describe(bootstrap, group)), topic, members, PARTITIONS
            ):
                return time.monotonic() - start
        time.sleep(0.1)
    return None


async def _unacknowledged(bootstrap: str, group: str, topic: str) -> dict[int, int | None]:
    """Per partition, the offsets between the group's share-partition start offset and
    the log end (0 once every record was acknowledged; None when not known)."""
    from protocol.admin import LATEST_TIMESTAMP, AdminClient

    async with await AdminClient.connect(bootstrap, 30.0, "spool-bench-cluster") as admin:
        offsets = await admin.describe_share_group_offsets(group, {topic: range(PARTITIONS)})
        ends = await admin.list_offsets({(topic, p): LATEST_TIMESTAMP for p in range(PARTITIONS)})
    return {
        o.partition: None
        if o.start_offset is None
        else ends[(topic, o.partition)].offset - o.start_offset
        for o in offsets
    }


def share_consume_processes(
    bootstrap: str,
    topic: str,
    group: str,
    consumers: int,
    expected: int,
    time_limit_s: float,
    sample: Callable[[list[int]], CpuSample] | None = None,
    target: Callable[..., None] = _consumer_process,
) -> tuple[Result, CpuSample | None, CpuSample | None]:
    """`consumers` processes running `target` (a consumer in `group`) read `topic`
    until `expected` first deliveries (or the time limit); the rate from the first
    record to the last, and `sample(consumer pids)` taken when they start fetching and
    when they are done. The clock starts once the group's assignment has settled
    (`wait_for_assignment`), so no reading runs while the first member still holds
    every partition."""
    mp = multiprocessing.get_context("spawn")  # no fork of a process running librdkafka
    shared = mp.Array("d", SHARED_SLOTS, lock=False)
    lock = mp.Lock()
    go = mp.Event()
    stop = mp.Event()
    procs = [
        mp.Process(
            target=target,
            args=(bootstrap, topic, group, expected, time_limit_s, shared, lock, go, stop),
            daemon=True,
        )
        for _ in range(consumers)
    ]
    for p in procs:
        p.start()
    ready_by = time.monotonic() + 60
    while shared[READY] < consumers and time.monotonic() < ready_by:
        time.sleep(0.02)
    settled = wait_for_assignment(bootstrap, group, topic, consumers, SETTLE_TIMEOUT_S / 2)
    pids = [p.pid for p in procs if p.pid is not None]
    before = sample(pids) if sample else None
    start = time.monotonic()
    deadline = start + time_limit_s
    go.set()
    while not stop.is_set() and time.monotonic() < deadline:
        time.sleep(0.01)
    after = sample(pids) if sample else None
    for p in procs:
        p.join(max(deadline - time.monotonic(), 0) + 30)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5)
    records, first_at, done_at, redelivered, errors = (shared[i] for i in range(5))
    first_at = first_at or start
    seconds = (done_at or time.monotonic()) - first_at
    notes = [
        "assignment settled after "
        + (f"{settled:.1f}s" if settled is not None else "- (not settled: started anyway)"),
        f"first record after {first_at - start:.2f}s",
        f"{int(shared[FETCHES])} fetches ({int(shared[EMPTY_FETCHES])} empty)",
    ]
    if records < expected:
        notes.append(f"time limit hit: {int(records)} of {expected}")
    if redelivered:
        notes.append(f"{int(redelivered)} redeliveries")
    if errors:
        notes.append(f"{int(errors)} error events")
    if shared[ACK_FAILED]:
        notes.append(f"{int(shared[ACK_FAILED])} acknowledgements failed")
    try:
        left = asyncio.run(_unacknowledged(bootstrap, group, topic))
        unsettled = {p: n for p, n in left.items() if n != 0}
        notes.append(
            "every record acknowledged (share-partition start offsets at the log end)"
            if not unsettled
            else f"offsets not acknowledged per partition {unsettled}"
        )
    except Exception as exc:
        notes.append(f"start offsets not read: {exc}")
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
    parts = [" ".join(f"b{n} {c:.2f}" for n, c in sorted(r.broker_cores.items()))]
    if r.client_cores is not None:
        parts.append(f"consumers {r.client_cores:.2f}")
    if r.postgres_cores is not None:
        parts.append(f"postgres {r.postgres_cores:.2f}")
    machine = "n/a" if r.machine_cores is None else f"{r.machine_cores:.2f}"
    parts.append(f"machine {machine} of {os.cpu_count()}")
    return ", ".join(parts)


def cpu_per_record(r: Reading) -> tuple[float, float, float] | None:
    """CPU microseconds per record of a reading: brokers (together), consumers,
    PostgreSQL; None when a part was not measured."""
    if not r.broker_cores or r.client_cores is None or r.postgres_cores is None:
        return None
    if r.result.records <= 0 or r.result.seconds <= 0:
        return None
    per = r.result.seconds / r.result.records * 1e6
    return sum(r.broker_cores.values()) * per, r.client_cores * per, r.postgres_cores * per


def ceilings(readings: list[Reading], cores: int | None = None) -> list[str]:
    """What the CPU per record allows on this machine: one broker at most one core's
    worth (1 / its broker CPU per record), N brokers at most the machine's cores over
    everything's CPU per record (brokers, consumers, PostgreSQL), nothing else running.
    Lines for the broker counts of `readings` that were measured."""
    cores = cores or os.cpu_count() or 1
    by_size: dict[int, list[tuple[float, float, float]]] = {}
    for r in readings:
        measured = cpu_per_record(r)
        if measured is not None:
            by_size.setdefault(r.brokers, []).append(measured)
    lines = []
    for n, costs in sorted(by_size.items()):
        b, c, p = (sum(x[i] for x in costs) / len(costs) for i in range(3))
        limit = cores / (b + c + p) * 1e6
        if n == 1:
            limit = min(limit, 1e6 / b)
        lines.append(
            f"{n:>7} broker(s): CPU per record {b:.2f} us brokers, {c:.2f} us consumers, "
            f"{p:.2f} us postgres: at most {limit:,.0f} rec/s on {cores} cores"
        )
    return lines


def mean_rates(readings: list[Reading], client: str) -> dict[int, float]:
    """Broker count -> the mean rate of `client`'s readings at that count."""
    by_size: dict[int, list[float]] = {}
    for r in readings:
        if r.client == client:
            by_size.setdefault(r.brokers, []).append(r.result.records_per_s)
    return {n: sum(rates) / len(rates) for n, rates in by_size.items()}


def format_side_by_side(readings: list[Reading], failovers: list[Failover]) -> str:
    """Per consumer kind: rates by broker count (each reading with the load average,
    and the mean of a count's readings), the ratios to 1 broker, the cores used; then
    the failover times."""
    lines: list[str] = []
    for client in CLIENTS:
        mine = [r for r in readings if r.client == client]
        if not mine:
            continue
        means = mean_rates(mine, client)
        if lines:
            lines.append("")
        lines.append(CLIENT_TITLES[client])
        header = (
            f"{'brokers':>7} {'share rec/s (mean)':>19} {'vs 1 broker':>11}  readings (load avg)"
        )
        lines += [header, "-" * len(header)]
        for n in sorted(means):
            ratio = f"{means[n] / means[1]:.2f}" if means.get(1) else "n/a"
            each = ", ".join(
                f"{r.result.records_per_s:,.0f} ({r.load:.1f})" for r in mine if r.brokers == n
            )
            lines.append(f"{n:>7} {means[n]:>19,.0f} {ratio:>11}  {each}")
            for r in mine:
                if r.brokers == n and r.broker_cores:
                    lines.append(f"{'':>7} {'':>19} {'':>11}    cores used: {describe_cores(r)}")
        lines += ceilings(mine)
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
            postgres = postmaster_pid(server.data)
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
                    # Preferably not a coordinators' broker: a graceful stop hands
                    # partitions and coordinators over (broker.leadership), but the
                    # coordinators' state would be loading as the next reading starts.
                    held = asyncio.run(_coordinators(cluster.bootstrap, PROBE_GROUP))
                    leaving = min(set(live) - held, default=max(live))
                    progress(f"cluster: stopping broker {leaving} (hand-over)")
                    live[leaving].stop()
                layout = settle(cluster, topic)
                live = cluster.live()
                for client in CLIENTS:
                    group = f"bench-cluster-{run}-{brokers}b-{client}"
                    start_from_earliest(ctx, cluster.bootstrap, group, topic)
                    progress(
                        f"cluster: {CONSUMERS} {client} consumers on {brokers} broker(s), "
                        f"leaders {dict(sorted(layout.items()))}"
                    )
                    result, before, after = share_consume_processes(
                        cluster.bootstrap,
                        topic,
                        group,
                        CONSUMERS,
                        stored,
                        CASE_TIME_LIMIT_S,
                        functools.partial(cpu_sample, live, postgres_pid=postgres),
                        CLIENT_PROCESSES[client],
                    )
                    result.case = (
                        f"{result.case} {brokers} broker{'s' if brokers > 1 else ''} {client}"
                    )
                    reading = Reading(brokers, result, os.getloadavg()[0], client)
                    if before is not None and after is not None:
                        cores = cores_used(before, after)
                        reading.broker_cores, reading.machine_cores = cores.brokers, cores.machine
                        reading.client_cores, reading.postgres_cores = (
                            cores.clients,
                            cores.postgres,
                        )
                        result.notes += "; cores: " + describe_cores(reading)
                    result.notes += f"; load {reading.load:.2f}"
                    progress(
                        f"cluster: {client} on {brokers} broker(s): "
                        f"{result.records_per_s:,.0f} rec/s; {result.notes}"
                    )
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
    figure = [r for r in readings if r.client == PROTOCOL_CLIENT]
    rates = mean_rates(figure, PROTOCOL_CLIENT)
    if all(r.result.records >= stored > 0 for r in figure) and 1 in rates and 2 in rates:
        ctx.figures["cluster.share_ratio_2_1"] = rates[2] / rates[1]
    else:
        ctx.not_run["cluster.share_ratio_2_1"] = "a reading did not read all its records"
    for f in failovers:
        name = f"cluster.failover_s_{f.session_ms}"
        if f.seconds is not None:
            ctx.figures[name] = f.seconds
        else:
            ctx.not_run[name] = f"no record from the new leader: {f.notes}"
    return [r.result for r in readings]
