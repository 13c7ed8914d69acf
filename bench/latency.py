"""Latency of the share path and the throughput of batched share-state writes.

    python -m bench.latency write-state [--partitions 500 --requests 20]
    python -m bench.latency broker      [--records 2000 --interval-ms 2 --runs 3]
    python -m bench.latency e2e         [--records 2000 --interval-ms 2 --consumers 2]

- write-state: WriteShareGroupState naming N partitions of one group, one request at a
  time over one connection; prints partition updates/s. One request is one append and
  one fsync of the share-state log (coordinator.runtime `run_many`).
- broker: a producer (linger.ms=0, acks=all) writes a record every `interval` ms; a raw
  client long-polls ShareFetch (MaxWait 500 ms, MinBytes 1) and acknowledges each
  delivery in the next ShareFetch. Latency is the record's produce timestamp (set by
  the producing thread just before `produce`) to the moment the raw ShareFetch
  response carrying it is decoded. With `--trace` the broker runs with SPOOL_TRACE set
  (broker.trace) and the per-step gaps of the records' paths are printed.
- e2e: the same producer, `--consumers` confluent-kafka ShareConsumers (explicit
  acknowledgement, commit_async), latency from produce timestamp to poll return.
- disk: the floor under both: append a small record to two files in turn and
  fdatasync each, at the same pace, where the broker keeps its data (`--dir`); prints
  the fdatasync percentiles. A record's way to a consumer waits for its log's sync (an
  acquisition is not written, as KIP-932 has it; acknowledgements are), so a disk whose
  p99.9 sync stalls for tens of ms puts that into the record latencies' p99.
- floor: the least a Python broker on this machine could take for the broker path: a
  bare uvloop relay in its own process reads a 16-byte message from one TCP connection,
  appends it to a file, fdatasyncs it (on a worker thread, as spool does; on the loop;
  or not at all) and writes it to another connection, at the same pace. No Kafka
  protocol and no share state: what is left is the disk, the thread hand-offs and the
  two sockets.
- cold: the CPU time one Produce takes in the broker's dispatch (in process, no
  sockets) back to back and after the event loop has idled 0.5, 2 or 5 ms. Where the
  machine makes code run slower after time away from it (a shared VM), a request 2 ms
  after the last costs several times a back-to-back one, and the latency bench's pace
  is one record every 2 ms. `--spin` busy-waits the gaps instead, on the same thread.

Records are durable before they are delivered and acknowledgements durable before they
are answered (the broker's defaults). The machine is shared: run several times and
compare medians. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import struct
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench import BenchContext, BrokerProcess, Result

INITIALIZE, WRITE = 83, 85


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def broker_cpu_s(broker: BrokerProcess) -> float:
    """CPU seconds (user and system, every thread) the broker process has used so far,
    from /proc; NaN where there is none. CPU per record is steadier than latency on a
    shared machine, so a change to the path shows in it first."""
    if broker.process is None:
        return float("nan")
    try:
        fields = Path(f"/proc/{broker.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    # utime and stime are fields 14 and 15 of stat(5), 12 and 13 after the name.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_summary(cpu_s: float, records: int) -> str:
    if records == 0 or cpu_s != cpu_s:
        return "broker CPU not measured"
    return f"broker CPU {cpu_s * 1000 / records:.2f} ms/record"


def summary(values_ms: list[float]) -> str:
    if not values_ms:
        return "no samples"
    return (
        f"n={len(values_ms)} p50={percentile(values_ms, 0.5):.2f} ms "
        f"p99={percentile(values_ms, 0.99):.2f} ms max={max(values_ms):.2f} ms"
    )


# ------------------------------------------------------------------ write-state


async def _write_state(broker: BrokerProcess, partitions: int, requests: int) -> float:
    from protocol.client import KafkaClient

    client = await KafkaClient.connect(broker.host, broker.port, "spool-bench-latency")
    try:
        topic_id = uuid.uuid4()
        group = "bench-write-state"
        init = {
            "group_id": group,
            "topics": [
                {
                    "topic_id": topic_id,
                    "partitions": [
                        {"partition": p, "state_epoch": 0, "start_offset": 0}
                        for p in range(partitions)
                    ],
                }
            ],
        }
        await client.request(INITIALIZE, 0, init, timeout_s=120)
        started = time.perf_counter()
        for n in range(requests):
            body = {
                "group_id": group,
                "topics": [
                    {
                        "topic_id": topic_id,
                        "partitions": [
                            {
                                "partition": p,
                                "state_epoch": 0,
                                "leader_epoch": 0,
                                "start_offset": n,
                                "state_batches": [
                                    {
                                        "first_offset": n,
                                        "last_offset": n,
                                        "delivery_state": 2,
                                        "delivery_count": 1,
                                    }
                                ],
                            }
                            for p in range(partitions)
                        ],
                    }
                ],
            }
            response = await client.request(WRITE, 0, body, timeout_s=120)
            errors = [p.error_code for r in response.results for p in r.partitions if p.error_code]
            if errors:
                raise RuntimeError(f"WriteShareGroupState failed: {errors[:3]}")
        return partitions * requests / (time.perf_counter() - started)
    finally:
        await client.close()


def bench_write_state(args: argparse.Namespace) -> None:
    figures = []
    for run in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="spool-bench-") as tmp:
            broker = BrokerProcess(Path(tmp) / "data")
            broker.start()
            broker.wait_warm()
            try:
                rate = asyncio.run(_write_state(broker, args.partitions, args.requests))
            finally:
                broker.stop()
        figures.append(rate)
        print(f"run {run + 1}: {rate:,.0f} partition updates/s", flush=True)
    print(
        f"WriteShareGroupState x {args.partitions} partitions: median "
        f"{statistics.median(figures):,.0f} partition updates/s over {len(figures)} runs"
    )


# ------------------------------------------------------------------ the share path

HEARTBEAT, SHARE_FETCH, METADATA = 76, 78, 3
ACCEPT = 1
STAMP = struct.Struct(">q")  # the record value: perf_counter_ns when it was produced


def _create_topic(broker: BrokerProcess, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap, "broker.address.family": "v4"})
    admin.create_topics([NewTopic(topic, 1, 1)], request_timeout=30)[topic].result(30)


class Producing(threading.Thread):
    """Produces `count` records, one every `interval_s`, linger.ms=0 and acks=all; each
    record's value is its send time (perf_counter_ns, the clock the broker traces with)."""

    def __init__(self, broker: BrokerProcess, topic: str, count: int, interval_s: float):
        super().__init__(daemon=True)
        self.broker, self.topic, self.count, self.interval_s = broker, topic, count, interval_s
        self.failed = 0

    def run(self) -> None:
        from confluent_kafka import Producer

        producer = Producer(
            {
                "bootstrap.servers": self.broker.bootstrap,
                "broker.address.family": "v4",
                "linger.ms": 0,
                "acks": "all",
            }
        )

        def delivered(err: object, _msg: object) -> None:
            if err is not None:
                self.failed += 1

        # Connected, with the topic's metadata, before the first timed record: the
        # client's bootstrap is not the broker path.
        producer.list_topics(self.topic, timeout=30)
        next_at = time.perf_counter()
        for _ in range(self.count):
            next_at += self.interval_s
            pause = next_at - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            producer.produce(self.topic, STAMP.pack(time.perf_counter_ns()), on_delivery=delivered)
            producer.poll(0)
        producer.flush(30)


async def _raw_share_consumer(
    broker: BrokerProcess, topic: str, group: str, count: int, started: threading.Event
) -> list[tuple[int, int, int]]:
    """Long-poll ShareFetch with a raw client; acknowledge each delivery in the next
    fetch. Returns (offset, produced ns, received ns) per record (perf_counter_ns)."""
    from protocol.client import KafkaClient
    from protocol.records import decode_records, iter_batches

    client = await KafkaClient.connect(broker.host, broker.port, "spool-bench-latency")
    member = str(uuid.uuid4())
    md = await client.request(
        METADATA,
        12,
        {
            "topics": [{"name": topic}],
            "allow_auto_topic_creation": False,
            "include_topic_authorized_operations": False,
        },
    )
    topic_id = md.topics[0].topic_id
    epoch = 0
    for _ in range(100):
        hb = await client.request(
            HEARTBEAT,
            1,
            {
                "group_id": group,
                "member_id": member,
                "member_epoch": epoch,
                "rack_id": None,
                "subscribed_topic_names": [topic],
            },
        )
        epoch = hb.member_epoch
        if hb.assignment is not None and hb.assignment.topic_partitions:
            break
        await asyncio.sleep(0.1)

    async def keep_alive() -> None:
        while True:
            await asyncio.sleep(2)
            await client.request(
                HEARTBEAT,
                1,
                {
                    "group_id": group,
                    "member_id": member,
                    "member_epoch": epoch,
                    "rack_id": None,
                    "subscribed_topic_names": None,
                },
            )

    beating = asyncio.create_task(keep_alive())
    samples: list[tuple[int, int, int]] = []
    session_epoch = 0
    acks: list[dict[str, Any]] = []
    deadline = time.monotonic() + 120
    try:
        while len(samples) < count and time.monotonic() < deadline:
            body = {
                "group_id": group,
                "member_id": member,
                "share_session_epoch": session_epoch,
                "max_wait": 500,
                "min_bytes": 1,
                "max_bytes": 1 << 20,
                "max_records": 500,
                "batch_size": 500,
                "forgotten_topics_data": [],
                "topics": [
                    {
                        "topic_id": topic_id,
                        "partitions": [{"partition_index": 0, "acknowledgement_batches": acks}],
                    }
                ],
            }
            response = await client.request(SHARE_FETCH, 1, body)
            received_ns = time.perf_counter_ns()
            started.set()
            session_epoch += 1
            acks = []
            for t in response.responses:
                for p in t.partitions:
                    data = bytes(p.records or b"")
                    for pos, header in iter_batches(data, validate=False):
                        for record in decode_records(data, pos, header):
                            sent_ns = STAMP.unpack(record.value or bytes(8))[0]
                            samples.append((record.offset, sent_ns, received_ns))
                    acks += [
                        {
                            "first_offset": r.first_offset,
                            "last_offset": r.last_offset,
                            "acknowledge_types": [ACCEPT],
                        }
                        for r in p.acquired_records
                    ]
    finally:
        beating.cancel()
        await client.close()
    return samples


def _trace_env(path: Path | None) -> None:
    if path is None:
        os.environ.pop("SPOOL_TRACE", None)
    else:
        os.environ["SPOOL_TRACE"] = str(path)


async def _broker_path_run(
    broker: BrokerProcess, records: int, interval_ms: float, topic: str = "latency"
) -> list[tuple[int, int, int]]:
    _create_topic(broker, topic)
    started = threading.Event()
    producing = Producing(broker, topic, records, interval_ms / 1000)
    # The clients here are Python too: a full collection in this process would stop the
    # producing thread and the raw consumer and be counted against the broker.
    gc.freeze()
    task = asyncio.create_task(
        _raw_share_consumer(broker, topic, f"group-{topic}", records, started)
    )
    while not started.is_set() and not task.done():
        await asyncio.sleep(0.05)
    # The share partition starts at the log end: produce once it exists.
    producing.start()
    samples = await task
    await asyncio.to_thread(producing.join, 60)
    return samples


def bench_broker_path(args: argparse.Namespace) -> None:
    """Produce (linger 0, acks=all) to a raw ShareFetch long poll, `--runs` times."""

    def once(broker: BrokerProcess) -> tuple[list[float], dict[int, tuple[int, int]]]:
        samples = asyncio.run(_broker_path_run(broker, args.records, args.interval_ms))
        latencies = [(received - sent) / 1e6 for _, sent, received in samples]
        return latencies, {offset: (sent, received) for offset, sent, received in samples}

    _measure(args, "broker path (produce linger 0 acks=all -> raw ShareFetch long poll)", once)


def _measure(
    args: argparse.Namespace,
    what: str,
    once: Callable[[BrokerProcess], tuple[list[float], dict[int, tuple[int, int]] | None]],
) -> None:
    """`once` against a fresh broker (traced with --trace), `--runs` times; prints each
    run, its per-step breakdown when traced, and the medians of the runs."""
    p50s, p99s, maxes, cpus = [], [], [], []
    for run in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="spool-bench-") as tmp:
            trace_path = Path(tmp) / "trace.jsonl" if args.trace else None
            _trace_env(trace_path)
            broker = BrokerProcess(Path(tmp) / "data")
            try:
                broker.start()
            finally:
                _trace_env(None)
            try:
                broker.wait_warm()
                cpu_before = broker_cpu_s(broker)
                latencies, offsets = once(broker)
                cpu_s = broker_cpu_s(broker) - cpu_before
            finally:
                broker.stop()
            cpus.append(cpu_s * 1000 / max(len(latencies), 1))
            p50s.append(percentile(latencies, 0.5))
            p99s.append(percentile(latencies, 0.99))
            maxes.append(max(latencies, default=float("nan")))
            print(
                f"run {run + 1}: {summary(latencies)}, {cpu_summary(cpu_s, len(latencies))}",
                flush=True,
            )
            if trace_path is not None and trace_path.exists():
                print(format_breakdown(breakdown(trace_path, offsets)), flush=True)
                print(gc_pauses(trace_path), flush=True)
    print(
        f"{what}, medians over {args.runs} runs: p50 {statistics.median(p50s):.2f} ms, "
        f"p99 {statistics.median(p99s):.2f} ms, max {statistics.median(maxes):.2f} ms; "
        f"broker CPU {statistics.median(cpus):.2f} ms/record"
    )


# ------------------------------------------------------------------ end to end


class ShareConsuming(threading.Thread):
    """A confluent-kafka ShareConsumer (explicit acknowledgement, commit_async after each
    poll) noting each record's produce-to-poll latency; warm-up records (stamp 0) are
    only acknowledged."""

    def __init__(self, broker: BrokerProcess, topic: str, group: str, stop: threading.Event):
        super().__init__(daemon=True)
        self.broker, self.topic, self.group, self.stop_at = broker, topic, group, stop
        self.latencies_ms: list[float] = []
        self.warm = threading.Event()

    def run(self) -> None:
        from confluent_kafka import AcknowledgeType, ShareConsumer

        consumer = ShareConsumer(
            {
                "bootstrap.servers": self.broker.bootstrap,
                "broker.address.family": "v4",
                "group.id": self.group,
                "share.acknowledgement.mode": "explicit",
            }
        )
        consumer.subscribe([self.topic])
        try:
            while not self.stop_at.is_set():
                messages = [m for m in consumer.poll(0.1) if m.error() is None]
                polled_ns = time.perf_counter_ns()
                for m in messages:
                    sent_ns = STAMP.unpack(m.value() or bytes(8))[0]
                    if sent_ns:
                        self.latencies_ms.append((polled_ns - sent_ns) / 1e6)
                    else:
                        self.warm.set()
                    consumer.acknowledge(m, AcknowledgeType.ACCEPT)
                if messages:
                    consumer.commit_async()
        finally:
            consumer.close()


def _end_to_end_run(
    broker: BrokerProcess, records: int, interval_ms: float, consumers: int
) -> list[float]:
    """One measurement against a running broker (a fresh topic and group)."""
    from confluent_kafka import Producer

    topic, group = f"latency-{uuid.uuid4().hex[:8]}", f"bench-e2e-{uuid.uuid4().hex[:8]}"
    stop = threading.Event()
    threads = [ShareConsuming(broker, topic, group, stop) for _ in range(consumers)]
    try:
        _create_topic(broker, topic)
        for c in threads:
            c.start()
        # Warm-up records until every consumer has had some: sessions are open.
        warm = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
        deadline = time.monotonic() + 60
        while not all(c.warm.is_set() for c in threads) and time.monotonic() < deadline:
            for _ in range(10):
                warm.produce(topic, STAMP.pack(0))
            warm.flush(10)
            time.sleep(0.2)
        producing = Producing(broker, topic, records, interval_ms / 1000)
        producing.start()
        producing.join(120)
        deadline = time.monotonic() + 30
        while sum(len(c.latencies_ms) for c in threads) < records and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        stop.set()
        for c in threads:
            c.join(30)
    return [ms for c in threads for ms in c.latencies_ms]


def bench_end_to_end(args: argparse.Namespace) -> None:
    """Produce (linger 0, acks=all) to `--consumers` ShareConsumers, `--runs` times."""

    def once(broker: BrokerProcess) -> tuple[list[float], None]:
        return _end_to_end_run(broker, args.records, args.interval_ms, args.consumers), None

    _measure(args, f"end to end ({args.consumers} ShareConsumers, produce linger 0 acks=all)", once)


def fdatasync_ms(directory: Path, syncs: int, interval_s: float) -> list[float]:
    """fdatasync latencies (ms) of `syncs` appends of 120 bytes, alternating between two
    files in `directory`, one every `interval_s`: the broker's pattern (topic log and
    share-state log) without the broker."""
    sync = getattr(os, "fdatasync", os.fsync)
    paths = [directory / f"spool-disk-probe-{i}" for i in range(2)]
    fds = [os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) for p in paths]
    took: list[float] = []
    try:
        for n in range(syncs):
            fd = fds[n % 2]
            os.write(fd, b"x" * 120)
            started = time.perf_counter()
            sync(fd)
            took.append((time.perf_counter() - started) * 1000)
            time.sleep(interval_s)
    finally:
        for fd in fds:
            os.close(fd)
        for path in paths:
            path.unlink(missing_ok=True)
    return took


def disk_summary(took: list[float]) -> str:
    return (
        f"fdatasync p50={percentile(took, 0.5):.3f} ms p99={percentile(took, 0.99):.3f} ms "
        f"p99.9={percentile(took, 0.999):.3f} ms max={max(took):.3f} ms"
    )


def bench_disk(args: argparse.Namespace) -> None:
    print(f"{args.dir}: {disk_summary(fdatasync_ms(Path(args.dir), args.syncs, 0.001))}")


# ------------------------------------------------------------------ the floor

RELAY_SYNCS = ("thread", "inline", "none")
# Named like the disk probe's files: `make bench` points both at the broker's data dir.
RELAY_FILE = "spool-relay-probe"


def _relay_serve(directory: str, sync: str, ready: Any) -> None:
    """A Python process that does only what the broker path cannot skip: read a 16-byte
    message from the producing connection, append it to a file, fdatasync it (on a worker
    thread as the broker does, on the loop, or not at all) and write it to every
    receiving connection. No Kafka protocol, no share state. Runs until killed."""
    import uvloop

    async def serve() -> None:
        fd = os.open(Path(directory) / RELAY_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        pool = ThreadPoolExecutor(1)
        loop = asyncio.get_running_loop()
        receivers: list[asyncio.StreamWriter] = []

        async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            if await reader.readexactly(1) == b"R":
                receivers.append(writer)
                return
            while True:
                message = await reader.readexactly(RELAY_MESSAGE.size)
                os.write(fd, message)
                if sync == "thread":
                    await loop.run_in_executor(pool, os.fdatasync, fd)
                elif sync == "inline":
                    os.fdatasync(fd)
                for receiver in receivers:
                    receiver.write(message)

        server = await asyncio.start_server(connected, "127.0.0.1", 0)
        ready.put(server.sockets[0].getsockname()[1])
        await asyncio.Event().wait()

    uvloop.run(serve())


RELAY_MESSAGE = struct.Struct(">qq")  # perf_counter_ns when sent, padding


def relay_floor_ms(directory: Path, sync: str, records: int, interval_ms: float) -> list[float]:
    """Latencies (ms) of `records` messages, one every `interval_ms`, through
    `_relay_serve` in its own process: the least any Python broker on this machine could
    take for a durable hand-over (TCP in, append, `sync`, TCP out)."""
    import multiprocessing
    import socket

    context = multiprocessing.get_context("spawn")
    ready = context.Queue()
    relay = context.Process(target=_relay_serve, args=(str(directory), sync, ready), daemon=True)
    relay.start()
    try:
        port = ready.get(timeout=30)
        receiving = socket.create_connection(("127.0.0.1", port))
        sending = socket.create_connection(("127.0.0.1", port))
        for sock in (receiving, sending):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        receiving.sendall(b"R")
        sending.sendall(b"S")
        time.sleep(0.2)  # both connections accepted before the first timed message
        latencies: list[float] = []

        def receive() -> None:
            pending = b""
            while len(latencies) < records:
                chunk = receiving.recv(65536)
                if not chunk:
                    return
                now = time.perf_counter_ns()
                pending += chunk
                while len(pending) >= RELAY_MESSAGE.size:
                    sent, _ = RELAY_MESSAGE.unpack_from(pending)
                    pending = pending[RELAY_MESSAGE.size :]
                    latencies.append((now - sent) / 1e6)

        receiver = threading.Thread(target=receive, daemon=True)
        receiver.start()
        next_at = time.perf_counter()
        for _ in range(records):
            next_at += interval_ms / 1000
            pause = next_at - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            sending.sendall(RELAY_MESSAGE.pack(time.perf_counter_ns(), 0))
        receiver.join(60)
        sending.close()
        receiving.close()
        return latencies
    finally:
        relay.kill()
        relay.join(10)
        (directory / RELAY_FILE).unlink(missing_ok=True)


def bench_floor(args: argparse.Namespace) -> None:
    for sync in args.sync or RELAY_SYNCS:
        with tempfile.TemporaryDirectory(prefix="spool-bench-", dir=args.dir) as tmp:
            latencies = relay_floor_ms(Path(tmp), sync, args.records, args.interval_ms)
        print(f"python relay, fdatasync {_SYNC_WORDS[sync]}: {summary(latencies)}", flush=True)


_SYNC_WORDS = {"thread": "on a worker thread", "inline": "on the event loop", "none": "skipped"}


# ------------------------------------------------------------------ cold requests


async def _dispatch_cpu_us(
    directory: Path, gaps_ms: list[float], requests: int, *, spin: bool = False
) -> dict[float, float]:
    """Median CPU time (µs, this thread) of one Produce (acks=1, one record) through the
    broker's dispatch, in process with no sockets, when requests come back to back and
    when the loop idles `gap` ms before each (`spin`: busy-waits it on this thread, so
    the CPU never idles)."""
    from bench import free_port
    from broker import logging as spool_logging
    from broker.broker import Broker
    from broker.config import BrokerConfig
    from broker.server import Endpoint, RequestContext
    from protocol import api, request_check
    from protocol.records import NewRecord, build_batch

    spool_logging.configure("console", "warning")

    def request(key: int, version: int, body: dict[str, Any]) -> tuple[Any, bytes, int]:
        entity = api.build(api.request_class(key, version), body)
        frame = api.encode_request(key, version, 1, "spool-bench-cold", entity)[4:]
        header, offset = request_check.decode_request_header(frame)
        return RequestContext(header, "127.0.0.1", 1), frame, offset

    broker = Broker(BrokerConfig({}), directory, Endpoint("127.0.0.1", free_port()))
    await broker.start()
    try:
        topics = {"topics": [{"name": "cold", "num_partitions": 1, "replication_factor": 1}]}
        await broker.dispatch(*request(19, 4, {**topics, "timeout": 30000}))
        batch = build_batch([NewRecord(key=None, value=bytes(8))], default_timestamp=0)
        produce = request(
            0,
            10,
            {
                "acks": 1,
                "timeout": 30000,
                "topic_data": [
                    {"name": "cold", "partition_data": [{"index": 0, "records": batch}]}
                ],
            },
        )
        for _ in range(requests):  # warm: every code path taken once
            await broker.dispatch(*produce)
        medians = {}
        for gap in gaps_ms:
            took = []
            for _ in range(requests):
                if gap and spin:
                    until = time.perf_counter() + gap / 1000
                    while time.perf_counter() < until:
                        pass
                elif gap:
                    await asyncio.sleep(gap / 1000)
                started = time.thread_time_ns()
                await broker.dispatch(*produce)
                took.append((time.thread_time_ns() - started) / 1000)
            medians[gap] = statistics.median(took)
        return medians
    finally:
        await broker.stop()


def bench_cold(args: argparse.Namespace) -> None:
    import uvloop

    with tempfile.TemporaryDirectory(prefix="spool-bench-") as tmp:
        medians = uvloop.run(
            _dispatch_cpu_us(Path(tmp) / "data", args.gap_ms, args.requests, spin=args.spin)
        )
    for gap, us in medians.items():
        idle = "busy-waiting" if args.spin else "idle"
        when = "back to back" if not gap else f"after {gap:g} ms {idle}"
        print(f"Produce dispatch CPU, {when}: median {us:.0f} us", flush=True)


def bench_latency(ctx: BenchContext) -> list[Result]:
    """For `python -m bench --only latency`: one broker-path and one end-to-end (two
    ShareConsumers) measurement against the harness's broker, as LATENCY_FIGURES."""
    records = min(ctx.records, 2000)
    started = time.perf_counter()
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    cpu_started = broker_cpu_s(ctx.broker)
    samples = asyncio.run(_broker_path_run(ctx.broker, records, 2.0, topic))
    broker_path = [(received - sent) / 1e6 for _, sent, received in samples]
    middle = time.perf_counter()
    cpu_middle = broker_cpu_s(ctx.broker)
    e2e = _end_to_end_run(ctx.broker, records, 2.0, 2)
    ended = time.perf_counter()
    cpu_ended = broker_cpu_s(ctx.broker)
    updates_per_s = asyncio.run(_write_state(ctx.broker, 500, 20))
    disk_started = time.perf_counter()
    disk = fdatasync_ms(ctx.broker.data_dir, 4 * records, 0.001)
    disk_s = time.perf_counter() - disk_started
    floor_started = time.perf_counter()
    floor = relay_floor_ms(ctx.broker.data_dir, "thread", records, 2.0)
    floor_s = time.perf_counter() - floor_started
    ctx.figures["latency.broker_p50_ms"] = percentile(broker_path, 0.5)
    ctx.figures["latency.broker_p99_ms"] = percentile(broker_path, 0.99)
    ctx.figures["latency.consumer_p99_ms"] = percentile(e2e, 0.99)
    ctx.figures["latency.consumer_max_ms"] = max(e2e, default=float("nan"))
    return [
        Result(
            "latency broker path (raw ShareFetch)",
            len(broker_path),
            middle - started,
            0,
            f"{summary(broker_path)}, {cpu_summary(cpu_middle - cpu_started, len(broker_path))}",
        ),
        Result(
            "latency end to end (2 ShareConsumers)",
            len(e2e),
            ended - middle,
            0,
            f"{summary(e2e)}, {cpu_summary(cpu_ended - cpu_middle, len(e2e))}",
        ),
        Result("disk floor: fdatasync, 2 files in turn", len(disk), disk_s, 0, disk_summary(disk)),
        Result(
            "floor: Python relay, fdatasync thread",
            len(floor),
            floor_s,
            0,
            summary(floor),
        ),
        Result(
            "WriteShareGroupState x500 partitions",
            10_000,
            10_000 / updates_per_s,
            0,
            f"{updates_per_s:,.0f} partition updates/s (one fsync per request)",
        ),
    ]


# ------------------------------------------------------------------ trace breakdown

# The steps of a record's path, in order, as (name, event) of broker.trace; each gap is
# from the previous step's time to this one's.
PRODUCE_STEPS = (
    ("producer sent", ""),
    ("produce received", "request_received"),
    ("appended", "append"),
    ("fsync round started", "fsync.started"),
    ("fsync thread running (wake-up, GIL)", "fsync.entered"),
    ("fsync done (fsync thread)", "fsync.flushed"),
    ("fsync seen on loop (thread hand-off)", "fsync.finished"),
    ("fsync's waiters told (on the loop)", "fsync"),
    ("high watermark advanced", "hw"),
)
FETCH_STEPS = (
    ("ShareFetch woken / received (< 0: on append)", ""),
    ("acquired in memory (and any ack write)", ""),
    ("records durable in their log (waited)", ""),
    ("handler returned", ""),
    ("response encoded", ""),
    ("written to socket", ""),
    ("client decoded the response", ""),
)
# Whole stretches inside the broker (per record, not sums of the step p50s): steadier
# than the client's figure on a shared machine, since neither client is in them.
SPANS = {
    "total: appended -> high watermark": ("appended", "high watermark advanced"),
    "total: appended -> written to socket": ("appended", "written to socket"),
}


def breakdown(
    path: Path, clients: dict[int, tuple[int, int]] | None = None
) -> dict[str, list[float]]:
    """Per step, the gaps (ms) from the step before, over the records of the trace: those
    of `clients` (offset: when produced and when received, by the clients), or every
    record appended."""
    offsets: Iterable[int] | None = clients
    events = [json.loads(line) for line in path.read_text().splitlines()]
    if offsets is None:
        offsets = [
            o for e in events if e["e"] == "append" for o in range(e["first"], e["last"] + 1)
        ]
    by_request: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for e in events:
        if e["r"] is not None:
            by_request.setdefault((e["r"][0], e["r"][1]), []).append(e)
    appends = [e for e in events if e["e"] == "append"]
    acquired = [e for e in events if e["e"] == "acquired"]
    gaps: dict[str, list[float]] = {}
    for offset in offsets:
        produce = next((e for e in appends if e["first"] <= offset <= e["last"]), None)
        fetch = next(
            (
                e
                for e in acquired
                if any(first <= offset <= last for _, _, first, last in e["ranges"])
            ),
            None,
        )
        if produce is None or fetch is None:
            continue
        produce_events = by_request[(produce["r"][0], produce["r"][1])]
        sent, received = (None, None) if clients is None else clients[offset]
        times = [sent, *_produce_times(produce_events, offset)]
        times += _fetch_times(by_request[(fetch["r"][0], fetch["r"][1])], fetch)
        times.append(received)
        previous: int | None = None
        at_step: dict[str, int] = {}
        for (name, _), at in zip(PRODUCE_STEPS + FETCH_STEPS, times, strict=True):
            if at is None:
                continue
            at_step[name] = at
            if previous is not None:
                gaps.setdefault(name, []).append((at - previous) / 1e6)
            previous = at
        for total, (start, end) in SPANS.items():
            if start in at_step and end in at_step:
                gaps.setdefault(total, []).append((at_step[end] - at_step[start]) / 1e6)
    return gaps


def _first(events: list[dict[str, Any]], name: str, **match: Any) -> dict[str, Any] | None:
    return next(
        (e for e in events if e["e"] == name and all(e.get(k) == v for k, v in match.items())),
        None,
    )


def _last_before(events: list[dict[str, Any]], name: str, at: int) -> dict[str, Any] | None:
    found = [e for e in events if e["e"] == name and e["t"] <= at]
    return found[-1] if found else None


def _produce_times(events: list[dict[str, Any]], offset: int) -> list[int | None]:
    received = _first(events, "request_received")
    append = _first(events, "append")
    fsync = next((e for e in events if e["e"] == "fsync" and e["log"] != "share-state"), None)
    hw = next((e for e in events if e["e"] == "hw" and e["offset"] > offset), None)
    steps: list[dict[str, Any] | None] = [received, append]
    times = [None if e is None else e["t"] for e in steps]
    if fsync is None:
        times += [None] * 5
    else:
        times += [
            fsync["started"],
            fsync["entered"],
            fsync["flushed"],
            fsync["finished"],
            fsync["t"],
        ]
    return [*times, None if hw is None else hw["t"]]


def _fetch_times(events: list[dict[str, Any]], acquired: dict[str, Any]) -> list[int | None]:
    """Anchored on the fetch round that handed the record out: the wake-up (or arrival)
    before it, its acquisition in memory (with the write of any acknowledgements it
    carried), its wait for the records' log fsync, then the response's way out."""
    in_memory = _last_before(events, "acquire_done", acquired["t"])
    if in_memory is None:
        return [None] * len(FETCH_STEPS)
    woken = _last_before(events, "share_fetch_woken", in_memory["t"])
    if woken is None:
        # Not parked: the fetch arrived after the records were there.
        woken = _first(events, "request_received")
    after = [e for e in events if e["t"] >= acquired["t"]]
    handled, encoded, written = (_first(after, n) for n in ("handled", "encoded", "written"))
    return [
        None if woken is None else woken["t"],
        in_memory["t"],
        acquired["t"],
        *(None if e is None else e["t"] for e in (handled, encoded, written)),
    ]


def gc_pauses(path: Path) -> str:
    """The broker's garbage-collection pauses (they stop every thread), per generation."""
    pauses: dict[int, list[float]] = {}
    for line in path.read_text().splitlines():
        e = json.loads(line)
        if e["e"] == "gc":
            pauses.setdefault(e["generation"], []).append((e["t"] - e["started"]) / 1e6)
    return "  gc pauses: " + (
        ", ".join(
            f"gen{g} n={len(v)} p50={percentile(v, 0.5):.3f} ms max={max(v):.3f} ms"
            for g, v in sorted(pauses.items())
        )
        or "none"
    )


def format_breakdown(gaps: dict[str, list[float]]) -> str:
    lines = [f"  {'step (gap from the one before)':<42} {'p50 ms':>8} {'p99 ms':>8} {'n':>6}"]
    for name in [n for n, _ in PRODUCE_STEPS[1:] + FETCH_STEPS] + list(SPANS):
        values = gaps.get(name, [])
        if values:
            lines.append(
                f"  {name:<42} {percentile(values, 0.5):>8.3f} "
                f"{percentile(values, 0.99):>8.3f} {len(values):>6}"
            )
    return "\n".join(lines)


# ------------------------------------------------------------------ CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.latency", description=__doc__)
    sub = parser.add_subparsers(dest="mode", required=True)
    ws = sub.add_parser("write-state", help="WriteShareGroupState over many partitions")
    ws.add_argument("--partitions", type=int, default=500)
    ws.add_argument("--requests", type=int, default=20)
    ws.add_argument("--runs", type=int, default=3)
    ws.set_defaults(run=bench_write_state)
    bp = sub.add_parser("broker", help="produce -> raw ShareFetch long poll latency")
    bp.add_argument("--records", type=int, default=2000)
    bp.add_argument("--interval-ms", type=float, default=2.0)
    bp.add_argument("--runs", type=int, default=3)
    bp.add_argument("--trace", action="store_true", help="run the broker with SPOOL_TRACE")
    bp.set_defaults(run=bench_broker_path)
    e2e = sub.add_parser("e2e", help="produce -> confluent-kafka ShareConsumers latency")
    e2e.add_argument("--records", type=int, default=2000)
    e2e.add_argument("--interval-ms", type=float, default=2.0)
    e2e.add_argument("--consumers", type=int, default=2)
    e2e.add_argument("--runs", type=int, default=3)
    e2e.add_argument("--trace", action="store_true", help="run the broker with SPOOL_TRACE")
    e2e.set_defaults(run=bench_end_to_end)
    dk = sub.add_parser("disk", help="fdatasync latency of the data directory's disk")
    dk.add_argument("--dir", default=tempfile.gettempdir())
    dk.add_argument("--syncs", type=int, default=8000)
    dk.set_defaults(run=bench_disk)
    fl = sub.add_parser(
        "floor", help="a bare Python relay (append, fdatasync, forward): the path's floor"
    )
    fl.add_argument("--records", type=int, default=2000)
    fl.add_argument("--interval-ms", type=float, default=2.0)
    fl.add_argument("--sync", action="append", choices=RELAY_SYNCS)
    fl.add_argument("--dir", default=tempfile.gettempdir())
    fl.set_defaults(run=bench_floor)
    cd = sub.add_parser(
        "cold", help="CPU of one Produce in the broker: back to back, and after the loop idles"
    )
    cd.add_argument("--gap-ms", type=float, action="append")
    cd.add_argument("--requests", type=int, default=400)
    cd.add_argument(
        "--spin", action="store_true", help="busy-wait the gaps: the CPU runs this thread"
    )
    cd.set_defaults(run=bench_cold)
    args = parser.parse_args(argv)
    if args.mode == "cold" and not args.gap_ms:
        args.gap_ms = [0.0, 0.5, 2.0, 5.0]
    args.run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
