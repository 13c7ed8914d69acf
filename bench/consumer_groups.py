"""Consumer groups next to share groups: consumption of one topic, and rebalance time.

`bench_consumer_groups(ctx)` is registered in `bench.__main__` as "consumer_groups"; run
it alone with `python -m bench --only consumer_groups`.

Everything runs on the run's one broker (file storage), side by side:

- Consumption: RECORDS records (SPOOL_BENCH_GROUPS_RECORDS, 200000; value size the run's
  first --sizes) are produced once to a PARTITIONS-partition topic, then read in full
  by new groups of CONSUMERS (2) consumer processes (separate processes, so one
  client's interpreter lock does not bound the rate), three kinds below, each RUNS
  times (SPOOL_BENCH_GROUPS_RUNS, 3), the kinds interleaved so a drift of the
  machine's other load hits all; a kind's figure is its median reading:
  - a consumer group with `group.protocol=consumer` (KIP-848), and one with
    `group.protocol=classic` (librdkafka's default assignors, range then roundrobin):
    confluent-kafka `Consumer`s, `auto.offset.reset=earliest`, auto commit off, each
    batch of `consume()` (up to BATCH records) followed by an asynchronous commit of
    the positions (`commit(asynchronous=True)`), so committing costs the broker one
    OffsetCommit per batch per consumer; `groups.consume_rate_consumer`,
    `groups.consume_rate_classic`.
  - a share group: confluent-kafka `ShareConsumer`s in explicit acknowledgement mode,
    every record acknowledged ACCEPT and each poll's acknowledgements sent with
    commit_sync (bench.cluster's librdkafka consumer process, the group started at
    offset 0 as bench.cluster does); `groups.share_rate`. Per record the broker keeps
    acquisition state and writes share state for the acknowledgements, where a consumer
    group only advances one committed offset per partition.
  Every reading's clock runs from the first record delivered to the last, and starts
  only once the group's assignment has settled (both members hold a non-empty part,
  together every partition): a consumer group member pauses the partitions it is
  given until then; the share reading waits on DescribeShareGroup (bench.cluster).
  Without that wait the first member to join reads most of the topic alone: a KIP-848
  member gives partitions up only at its next heartbeat (group.consumer.heartbeat.
  interval.ms, 5000). The consumer group readings count records, not distinct
  offsets; a count above the topic's is reported in the notes, and so is when each
  member's first record came. At the start each member resumes its partitions and
  seeks them to the beginning: in librdkafka 2.16 a resumed partition that was
  already in its active fetch state (the KIP-848 member that held every partition
  first) is only fetched on its broker thread's next wake-up, about a second later
  (seen with the broker and the consumers nearly idle: one member then read its half
  after the other had finished, a third of the rate), while the seek's offset lookup
  wakes it at once.
- Rebalance time for REBALANCE_MEMBERS (10) members, per protocol (consumer, classic):
  an empty REBALANCE_PARTITIONS-partition (20) topic and a new group; nine `Consumer`s
  (threads of this process, each polling every POLL_S) join and settle, then the
  clock starts as the tenth calls subscribe() and stops when all ten hold a stable
  assignment: each a non-empty set of partitions, disjoint, together the whole topic
  (read from each member's `assignment()` after its polls). KIP-848: the coordinator
  computes the new target at once, but each old member gives up its partitions at its
  own next heartbeat (5 s interval) and the newcomer receives them at one of its own
  heartbeats after they are revoked, so the time is bound by about one to two
  heartbeat intervals. Classic: the tenth JoinGroup starts a rebalance, the others
  learn it from a Heartbeat answer (librdkafka's heartbeat.interval.ms, 3000), rejoin,
  and the leader's assignment goes out in SyncGroup, so about one client heartbeat
  interval (group.initial.rebalance.delay.ms applies to an empty group only: it is
  in the nine's settling time, shown in the notes). `groups.rebalance_s_consumer`,
  `groups.rebalance_s_classic`.

Each reading prints the 1-minute load average when it ended and the cores the broker
(and the consumer processes) used while it ran: on a 2-core machine shared with other
work, the consumers and the broker compete for the same cores, so the rates are bound
by the machine as much as by the broker. There are no targets for these figures (the
issue gives none): they are listed in the informational figure table.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic

from bench import (
    BenchContext,
    Result,
    client_config,
    fill_topic,
    median_reading,
    progress,
)
from bench.cluster import (
    CLIENT_PROCESSES,
    LIBRDKAFKA_CLIENT,
    cores_used,
    cpu_sample,
    share_consume_processes,
    start_from_earliest,
)

RECORDS = int(os.environ.get("SPOOL_BENCH_GROUPS_RECORDS", "200000"))
PARTITIONS = 6  # bench.cluster.PARTITIONS: its share helpers assume this many
CONSUMERS = 2
RUNS = int(os.environ.get("SPOOL_BENCH_GROUPS_RUNS", "3"))
BATCH = 500
CASE_TIME_LIMIT_S = 90.0
SETTLE_TIMEOUT_S = 60.0
REBALANCE_MEMBERS = 10
REBALANCE_PARTITIONS = 20
POLL_S = 0.05
PROTOCOLS = ("consumer", "classic")
FIGURES = (
    "groups.consume_rate_consumer",
    "groups.consume_rate_classic",
    "groups.share_rate",
    "groups.rebalance_s_consumer",
    "groups.rebalance_s_classic",
)

# Slots of the array the consumer processes share: totals, then per process its
# assigned-partition count (from ASSIGNED on) and when its first record came (after
# those, FIRST_BY slots on).
RECORDS_SLOT, FIRST_AT, DONE_AT, ERRORS, COMMITS, COMMIT_ERRORS, EARLY, ASSIGNED = range(8)


def stable_assignment(held: Mapping[int, frozenset[int]], members: int, partitions: int) -> bool:
    """`members` members each holding a non-empty set of partitions, the sets disjoint
    and together every partition 0..partitions-1."""
    if len(held) != members or any(not p for p in held.values()):
        return False
    union: set[int] = set()
    total = 0
    for parts in held.values():
        union |= parts
        total += len(parts)
    return total == partitions and union == set(range(partitions))


def split_settled(counts: list[float], partitions: int) -> bool:
    """Every consumer holds some partitions and together they hold `partitions` (the
    counts of a settled assignment of that many partitions)."""
    return all(c > 0 for c in counts) and sum(counts) == partitions


def _group_consumer_process(
    bootstrap: str,
    topic: str,
    group: str,
    protocol: str,
    index: int,
    consumers: int,
    expected: int,
    time_limit_s: float,
    shared: Any,
    lock: Any,
    go: Any,
    stop: Any,
) -> None:
    """One confluent-kafka Consumer in `group` (`group.protocol=protocol`): it pauses
    what it is assigned until `go`, then reads batches, committing each batch's
    positions asynchronously; adds its records to `shared` (times are monotonic)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    started = threading.Event()

    def on_assign(consumer: Any, partitions: list[Any]) -> None:
        if protocol == "consumer":
            consumer.incremental_assign(partitions)
        else:
            consumer.assign(partitions)
        if not started.is_set():
            consumer.pause(partitions)

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "broker.address.family": "v4",
            "group.id": group,
            "group.protocol": protocol,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic], on_assign=on_assign)
    deadline = time.monotonic() + SETTLE_TIMEOUT_S + time_limit_s
    try:
        while not go.is_set() and time.monotonic() < deadline:
            for msg in consumer.consume(num_messages=BATCH, timeout=0.05):
                if msg.error() is None:  # paused partitions deliver nothing: not expected
                    with lock:
                        shared[EARLY] += 1
            with lock:
                shared[ASSIGNED + index] = len(consumer.assignment())
        started.set()
        held = consumer.assignment()
        consumer.resume(held)
        for tp in held:  # a partition already fetching waits up to 1 s unless woken
            consumer.seek(TopicPartition(tp.topic, tp.partition, OFFSET_BEGINNING))
        deadline = time.monotonic() + time_limit_s
        while not stop.is_set() and time.monotonic() < deadline:
            msgs = consumer.consume(num_messages=BATCH, timeout=0.1)
            if not msgs:
                continue
            records = errors = 0
            for msg in msgs:
                if msg.error() is not None:
                    errors += 1
                else:
                    records += 1
            committed = True
            try:
                consumer.commit(asynchronous=True)
            except Exception:
                committed = False
            now = time.monotonic()
            with lock:
                if shared[FIRST_AT] == 0.0 and records:
                    shared[FIRST_AT] = now
                first_by = ASSIGNED + consumers + index
                if shared[first_by] == 0.0 and records:
                    shared[first_by] = now
                shared[RECORDS_SLOT] += records
                shared[ERRORS] += errors
                shared[COMMITS if committed else COMMIT_ERRORS] += 1
                if shared[RECORDS_SLOT] >= expected and shared[DONE_AT] == 0.0:
                    shared[DONE_AT] = now
                    stop.set()
    finally:
        consumer.close()


def group_consume_processes(
    bootstrap: str,
    topic: str,
    group: str,
    protocol: str,
    consumers: int,
    expected: int,
    time_limit_s: float,
    sample: Callable[[list[int]], Any] | None = None,
) -> tuple[Result, Any, Any]:
    """`consumers` Consumer processes in a new consumer group read `topic` until
    `expected` records; the clock starts once the assignment has settled."""
    mp = multiprocessing.get_context("spawn")  # no fork of a process running librdkafka
    shared = mp.Array("d", ASSIGNED + 2 * consumers, lock=False)
    lock = mp.Lock()
    go = mp.Event()
    stop = mp.Event()
    procs = [
        mp.Process(
            target=_group_consumer_process,
            args=(
                bootstrap,
                topic,
                group,
                protocol,
                i,
                consumers,
                expected,
                time_limit_s,
                shared,
                lock,
                go,
                stop,
            ),
            daemon=True,
        )
        for i in range(consumers)
    ]
    launched = time.monotonic()
    for p in procs:
        p.start()
    settled: float | None = None
    while time.monotonic() - launched < SETTLE_TIMEOUT_S:
        if split_settled([shared[ASSIGNED + i] for i in range(consumers)], PARTITIONS):
            settled = time.monotonic() - launched
            break
        time.sleep(0.02)
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
    records, first_at, done_at = shared[RECORDS_SLOT], shared[FIRST_AT], shared[DONE_AT]
    first_at = first_at or start
    seconds = (done_at or time.monotonic()) - first_at
    firsts = [shared[ASSIGNED + consumers + i] for i in range(consumers)]
    notes = [
        "assignment settled after "
        + (f"{settled:.1f}s" if settled is not None else "- (not settled: started anyway)"),
        "each member's first record after "
        + ", ".join(f"{f - start:.2f}s" if f else "-" for f in firsts),
        f"{int(shared[COMMITS])} async commits",
    ]
    if records < expected:
        notes.append(f"time limit hit: {int(records)} of {expected}")
    elif records > expected:
        notes.append(f"{int(records - expected)} records more than the topic holds")
    if shared[ERRORS]:
        notes.append(f"{int(shared[ERRORS])} error events")
    if shared[EARLY]:
        notes.append(f"{int(shared[EARLY])} records delivered before the clock (not counted)")
    if shared[COMMIT_ERRORS]:
        notes.append(f"{int(shared[COMMIT_ERRORS])} commits refused")
    failed = [p.exitcode for p in procs if p.exitcode not in (0, None)]
    if failed:
        notes.append(f"consumer exit codes {failed}")
    result = Result(
        f"group {protocol} {PARTITIONS}p x{consumers} async commits",
        int(records),
        seconds,
        0,
        "; ".join(notes),
    )
    return result, before, after


# --- rebalance time ----------------------------------------------------------------------


class _Members:
    """Consumer threads of one group, each publishing its assignment after its polls."""

    def __init__(self, bootstrap: str, topic: str, group: str, protocol: str) -> None:
        self.config = {
            "bootstrap.servers": bootstrap,
            "broker.address.family": "v4",
            "group.id": group,
            "group.protocol": protocol,
            "enable.auto.commit": False,
        }
        self.topic = topic
        self.lock = threading.Lock()
        self.held: dict[int, frozenset[int]] = {}
        self.subscribed: dict[int, float] = {}
        self.failures: list[BaseException] = []
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    def add(self) -> int:
        index = len(self.threads)
        thread = threading.Thread(target=self._run, args=(index,), daemon=True)
        self.threads.append(thread)
        thread.start()
        return index

    def _run(self, index: int) -> None:
        from confluent_kafka import Consumer

        try:
            consumer = Consumer(self.config)
            try:
                with self.lock:
                    self.subscribed[index] = time.monotonic()
                consumer.subscribe([self.topic])
                while not self.stop.is_set():
                    consumer.poll(POLL_S)
                    held = frozenset(tp.partition for tp in consumer.assignment())
                    with self.lock:
                        self.held[index] = held
            finally:
                consumer.close()
        except BaseException as exc:
            self.failures.append(exc)

    def wait_stable(self, members: int, partitions: int, timeout_s: float) -> float | None:
        """The monotonic time when `members` members first held a stable assignment."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self.failures:
            with self.lock:
                held = dict(self.held)
            if stable_assignment(held, members, partitions):
                return time.monotonic()
            time.sleep(0.01)
        return None

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)


def rebalance_time(
    ctx: BenchContext, topic: str, protocol: str, sample: Callable[[], Any]
) -> tuple[float | None, str, Any, Any]:
    """Seconds from the tenth member's subscribe() until all ten hold a stable
    assignment of `topic`, with notes and CPU samples around that span."""
    group = f"spool-bench-rebalance-{protocol}"
    members = _Members(ctx.bootstrap, topic, group, protocol)
    notes: list[str] = []
    before = after = None
    try:
        began = time.monotonic()
        for _ in range(REBALANCE_MEMBERS - 1):
            members.add()
        first = members.wait_stable(REBALANCE_MEMBERS - 1, REBALANCE_PARTITIONS, SETTLE_TIMEOUT_S)
        if first is None:
            why = f"the first {REBALANCE_MEMBERS - 1} did not settle in {SETTLE_TIMEOUT_S:g}s"
            if members.failures:
                why += f": {members.failures[0]!r}"
            return None, why, None, None
        notes.append(f"{REBALANCE_MEMBERS - 1} members settled after {first - began:.1f}s")
        before = sample()
        tenth = members.add()
        done = members.wait_stable(REBALANCE_MEMBERS, REBALANCE_PARTITIONS, SETTLE_TIMEOUT_S)
        after = sample()
        with members.lock:
            subscribed = members.subscribed.get(tenth)
        if done is None or subscribed is None:
            notes.append(f"{REBALANCE_MEMBERS} members not settled in {SETTLE_TIMEOUT_S:g}s")
            if members.failures:
                notes.append(f"member failed: {members.failures[0]!r}")
            return None, "; ".join(notes), before, after
        return done - subscribed, "; ".join(notes), before, after
    finally:
        members.close()


# --- the benchmark -----------------------------------------------------------------------


def _cores_note(before: Any, after: Any, with_clients: bool) -> str:
    if before is None or after is None:
        return ""
    cores = cores_used(before, after)
    parts = [f"broker {cores.brokers.get(1, float('nan')):.2f}"]
    if with_clients and cores.clients is not None:
        parts.append(f"consumers {cores.clients:.2f}")
    machine = "n/a" if cores.machine is None else f"{cores.machine:.2f}"
    parts.append(f"machine {machine} of {os.cpu_count()}")
    return "cores: " + ", ".join(parts)


def bench_consumer_groups(ctx: BenchContext, records: int | None = None) -> list[Result]:
    """Consumer-group consumption (KIP-848 and classic, async commits) next to share
    consumption (per-record acks) of one topic, and the rebalance time for 10 members
    per protocol; records the FIGURES."""
    records = records or min(ctx.records, RECORDS)
    size = ctx.sizes[0] if ctx.sizes else 100
    brokers = {1: ctx.broker}
    results: list[Result] = []

    def note(result: Result, cores: str) -> Result:
        load = os.getloadavg()[0]
        result.notes = "; ".join(n for n in (result.notes, cores, f"load {load:.2f}") if n)
        progress(f"groups: {result.case}: {result.records_per_s:,.0f} rec/s; {result.notes}")
        return result

    def add(result: Result, figure: str, value: float | None) -> None:
        results.append(result)
        if value is not None:
            ctx.figures[figure] = value

    topic = "bench-groups"
    progress(f"groups: producing {records} records of {size} B to {PARTITIONS} partitions")
    stored = fill_topic(ctx, topic, records, size, partitions=PARTITIONS)
    sample = lambda pids: cpu_sample(brokers, pids)  # noqa: E731
    readings: dict[str, list[Result]] = {}
    for run in range(max(RUNS, 1)):  # the kinds interleaved: a drift of the load hits all
        for protocol in PROTOCOLS:
            progress(f"groups: {CONSUMERS} consumers, group.protocol={protocol} (run {run + 1})")
            result, before, after = group_consume_processes(
                ctx.bootstrap,
                topic,
                f"spool-bench-groups-{protocol}-{run}",
                protocol,
                CONSUMERS,
                stored,
                CASE_TIME_LIMIT_S,
                sample,
            )
            result.payload_bytes = result.records * size
            readings.setdefault(protocol, []).append(note(result, _cores_note(before, after, True)))
        progress(f"groups: {CONSUMERS} share consumers, explicit per-record acks (run {run + 1})")
        group = f"spool-bench-groups-share-{run}"
        start_from_earliest(ctx, ctx.bootstrap, group, topic)
        result, before, after = share_consume_processes(
            ctx.bootstrap,
            topic,
            group,
            CONSUMERS,
            stored,
            CASE_TIME_LIMIT_S,
            sample,
            CLIENT_PROCESSES[LIBRDKAFKA_CLIENT],
        )
        result.case = f"share {PARTITIONS}p x{CONSUMERS} per-record acks"
        result.payload_bytes = result.records * size
        readings.setdefault("share", []).append(note(result, _cores_note(before, after, True)))
    for kind, figure in (
        ("consumer", "groups.consume_rate_consumer"),
        ("classic", "groups.consume_rate_classic"),
        ("share", "groups.share_rate"),
    ):
        mine = readings[kind]
        short = [r for r in mine if r.records < stored or stored <= 0]
        if short:
            ctx.not_run[figure] = f"a reading read {short[0].records} of {stored} records"
            add(short[0], figure, None)
            continue
        middle = median_reading(mine)
        add(middle, figure, middle.records_per_s)

    rebalance_topic = "bench-groups-rebalance"
    admin = AdminClient(client_config(ctx))
    admin.create_topics([NewTopic(rebalance_topic, REBALANCE_PARTITIONS, 1)], request_timeout=30)[
        rebalance_topic
    ].result(30)
    for protocol in PROTOCOLS:
        figure = f"groups.rebalance_s_{protocol}"
        progress(f"groups: rebalance of {REBALANCE_MEMBERS} members, group.protocol={protocol}")
        seconds, notes, before, after = rebalance_time(
            ctx, rebalance_topic, protocol, lambda: cpu_sample(brokers)
        )
        if seconds is None:
            ctx.not_run[figure] = notes
        result = Result(
            f"rebalance {REBALANCE_MEMBERS} members {protocol}",
            REBALANCE_MEMBERS if seconds is not None else 0,
            seconds or 0.0,
            0,
            ("" if seconds is None else f"{seconds:.2f}s to stable; ") + notes,
        )
        add(note(result, _cores_note(before, after, False)), figure, seconds)
    return results
