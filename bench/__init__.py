"""Benchmarks for spool, run by `make bench` (`python -m bench`).

Each benchmark is a function taking a `BenchContext` (a running broker plus the run's
parameters) and returning `Result` rows; `bench.__main__` keeps them in a registry,
runs the selected ones against one broker and prints a table. Figures are printed,
never asserted: tests do not time things. A benchmark may also record named figures in
`ctx.figures` (checked against `TARGETS` in the final table, or listed without a target
in `FIGURES`) and spool-vs-reference rows
in `ctx.comparisons`; `progress()` prints a line per step on stderr while it runs.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class BrokerProcess:
    """A `python -m broker serve` process on a free port, logging to a file.

    The integration tests have their own richer helper (tests/integration/conftest.py);
    this one only starts and stops.
    """

    def __init__(self, data_dir: Path, settings: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.log_path = data_dir.parent / "broker.log"
        self.settings = dict(settings or {})
        self.host = "127.0.0.1"
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 30.0, *, wait: bool = True) -> None:
        """Launch the broker; unless `wait` is False, return once it accepts connections.
        With a `listeners` setting (several listeners), it must include PLAINTEXT on
        `self.port`, which is where the start is awaited."""
        cmd = [sys.executable, "-m", "broker", "serve"]
        if "listeners" not in self.settings:
            cmd += ["--listen", self.bootstrap]
        cmd += ["--data-dir", str(self.data_dir)]
        for key, value in self.settings.items():
            cmd += ["--set", f"{key}={value}"]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                cmd,
                cwd=REPO_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        if not wait:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"broker exited with {self.process.returncode}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection((self.host, self.port), timeout=1.0),
            ):
                return
            time.sleep(0.1)
        self.process.kill()
        self.process.wait(timeout=10)
        raise RuntimeError(f"broker did not accept connections within {timeout}s")

    def wait_warm(self, timeout: float = 30.0) -> None:
        """Wait for the broker's `schemas_loaded` log line: the Kafka schema classes it
        loads between requests after a start are loaded, so a benchmark measures the
        broker as it runs from then on, not its first seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(FileNotFoundError):
                if "schemas_loaded" in self.log_path.read_text(errors="replace"):
                    return
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"broker exited with {self.process.returncode}")
            time.sleep(0.05)
        raise RuntimeError(f"broker did not log schemas_loaded within {timeout}s")

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait; returns the exit code (kills after `timeout`)."""
        if self.process is None or self.process.poll() is not None:
            return -1 if self.process is None else self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(timeout=10)

    def log_tail(self, lines: int = 40) -> str:
        with contextlib.suppress(FileNotFoundError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return "(no broker log)"


@dataclass
class BenchContext:
    """What every benchmark gets: where the broker is and how much work to do."""

    broker: BrokerProcess
    records: int
    sizes: tuple[int, ...]
    partitions: int
    time_limit_s: float
    # Benchmarks may leave things for later ones (e.g. produced topics to fetch).
    produced: dict[str, int] = field(default_factory=dict)
    # The long variants (10^7 records of backlog, ...): --long or SPOOL_BENCH_LONG=1.
    long: bool = False
    # Named figures for the target table (see TARGETS), and why a figure is missing.
    figures: dict[str, float] = field(default_factory=dict)
    not_run: dict[str, str] = field(default_factory=dict)
    comparisons: list[Comparison] = field(default_factory=list)
    # Another cluster to point the clients at (librdkafka's mock, bench.reference).
    endpoint: str | None = None
    # More client properties for every client (security.protocol, sasl.*, ssl.*).
    client: dict[str, object] = field(default_factory=dict)
    # Tables a benchmark prints after the results (e.g. PLAINTEXT next to SASL_SSL).
    sections: list[str] = field(default_factory=list)

    @property
    def bootstrap(self) -> str:
        return self.endpoint or self.broker.bootstrap


@dataclass
class Result:
    """One row of the table. `records` is what completed within the time limit."""

    case: str
    records: int
    seconds: float
    payload_bytes: int
    notes: str = ""

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.payload_bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0


_STARTED = time.monotonic()


def progress(message: str) -> None:
    """One line per step on stderr, with the seconds since the run started."""
    print(f"[bench {time.monotonic() - _STARTED:7.1f}s] {message}", file=sys.stderr, flush=True)


def format_table(results: list[Result]) -> str:
    header = f"{'case':<34} {'records':>10} {'seconds':>8} {'records/s':>11} {'MB/s':>8}  notes"
    lines = [header, "-" * len(header)]
    for r in results:
        lines.append(
            f"{r.case:<34} {r.records:>10} {r.seconds:>8.2f} {r.records_per_s:>11.0f} "
            f"{r.mb_per_s:>8.2f}  {r.notes}"
        )
    return "\n".join(lines)


# --- spool next to a reference, and the targets -------------------------------------


@dataclass
class Comparison:
    """One workload on spool and on the reference (librdkafka's mock cluster); a side
    without a figure says why in `reason`."""

    case: str
    unit: str
    spool: float | None
    reference: float | None
    reason: str = ""

    @property
    def ratio(self) -> float | None:
        if self.spool is None or not self.reference:
            return None
        return self.spool / self.reference


def format_comparisons(rows: list[Comparison]) -> str:
    header = f"{'workload':<40} {'spool':>12} {'mock':>12} {'spool/mock':>10}  notes"
    lines = [header, "-" * len(header)]
    for c in rows:
        spool = f"{c.spool:,.0f}" if c.spool is not None else "n/a"
        ref = f"{c.reference:,.0f}" if c.reference is not None else "n/a"
        ratio = f"{c.ratio:.2f}" if c.ratio is not None else "n/a"
        lines.append(f"{c.case:<40} {spool:>12} {ref:>12} {ratio:>10}  {c.unit}; {c.reason}")
    return "\n".join(lines)


@dataclass(frozen=True)
class Target:
    """`figure` (a key of ctx.figures) must be <= (or >=) `limit`."""

    name: str
    figure: str
    limit: float
    unit: str
    at_most: bool = True

    def met(self, value: float) -> bool:
        return value <= self.limit if self.at_most else value >= self.limit


TARGETS: tuple[Target, ...] = (
    Target("broker path p50 (raw ShareFetch)", "latency.broker_p50_ms", 0.5, "ms"),
    Target("broker path p99 (raw ShareFetch)", "latency.broker_p99_ms", 2.0, "ms"),
    Target("ShareConsumer end to end p99", "latency.consumer_p99_ms", 5.0, "ms"),
    Target("ShareConsumer end to end max", "latency.consumer_max_ms", 20.0, "ms"),
    Target("restart after kill -9, 10^6 updates", "restart.share_fetch_s", 2.0, "s"),
    Target("RSS, fragmenting acks at scale", "memory.fragmented_rss_mb", 300.0, "MB"),
    Target("RSS growth, 1,000 idle connections", "memory.idle_growth_mb", 50.0, "MB"),
    Target("share rate, largest backlog / 10^5", "backlog.flatness", 0.8, "x", at_most=False),
    Target("share rate, SASL_SSL / PLAINTEXT", "security.share_ratio", 0.6, "x", at_most=False),
    Target(
        "share rate on PostgreSQL, per-record acks",
        "storage.pg_share_rate",
        50_000,
        "rec/s",
        at_most=False,
    ),
    Target("produce to delivery p99 on PostgreSQL", "storage.pg_p99_ms", 10.0, "ms"),
    Target(
        "share rate, 2 brokers / 1 (PostgreSQL)",
        "cluster.share_ratio_2_1",
        1.5,
        "x",
        at_most=False,
    ),
    # broker.session.timeout.ms plus 5 s, as issue 25 asks traffic to resume.
    Target("failover, kill -9, session 9000 ms", "cluster.failover_s_9000", 14.0, "s"),
    Target("failover, kill -9, session 3000 ms", "cluster.failover_s_3000", 8.0, "s"),
    Target(
        "share rate, 10% to a DLQ / archived",
        "dead_letters.ratio",
        0.8,
        "x",
        at_most=False,
    ),
)


def evaluate_targets(
    figures: dict[str, float], not_run: dict[str, str] | None = None
) -> list[tuple[Target, float | None, str]]:
    """(target, figure, "met" | "not met" | "not run: why") for every target."""
    rows: list[tuple[Target, float | None, str]] = []
    for target in TARGETS:
        value = figures.get(target.figure)
        if value is None or math.isnan(value):
            why = (not_run or {}).get(target.figure, "no figure (benchmark not selected)")
            rows.append((target, None, f"not run: {why}"))
        else:
            rows.append((target, value, "met" if target.met(value) else "not met"))
    return rows


def format_targets(rows: list[tuple[Target, float | None, str]]) -> str:
    header = f"{'target':<40} {'limit':>12} {'figure':>12}  status"
    lines = [header, "-" * len(header)]
    for target, value, status in rows:
        sign = "<=" if target.at_most else ">="
        limit = f"{sign} {target.limit:g} {target.unit}"
        shown = f"{value:.3g} {target.unit}" if value is not None else "-"
        lines.append(f"{target.name:<40} {limit:>12} {shown:>12}  {status}")
    return "\n".join(lines)


@dataclass(frozen=True)
class Figure:
    """A figure (a key of ctx.figures) shown without a target: the issue asking for it
    set none."""

    name: str
    figure: str
    unit: str


FIGURES: tuple[Figure, ...] = (
    Figure("consumer group (KIP-848), async commits", "groups.consume_rate_consumer", "rec/s"),
    Figure("consumer group (classic), async commits", "groups.consume_rate_classic", "rec/s"),
    Figure("share group, per-record acks", "groups.share_rate", "rec/s"),
    Figure("rebalance, 10th of 10 members (KIP-848)", "groups.rebalance_s_consumer", "s"),
    Figure("rebalance, 10th of 10 members (classic)", "groups.rebalance_s_classic", "s"),
)


def format_figures(figures: dict[str, float], not_run: dict[str, str] | None = None) -> str:
    """The FIGURES table: each figure, or why it is missing."""
    header = f"{'figure (no target)':<40} {'value':>14}  notes"
    lines = [header, "-" * len(header)]
    for f in FIGURES:
        value = figures.get(f.figure)
        if value is None or math.isnan(value):
            why = (not_run or {}).get(f.figure, "no figure (benchmark not selected)")
            lines.append(f"{f.name:<40} {'-':>14}  not run: {why}")
        else:
            shown = f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
            lines.append(f"{f.name:<40} {f'{shown} {f.unit}':>14}  {f.figure}")
    return "\n".join(lines)


# --- setup shared by the benchmarks ---------------------------------------------------


def client_config(ctx: BenchContext) -> dict[str, object]:
    return {"bootstrap.servers": ctx.bootstrap, "broker.address.family": "v4", **ctx.client}


def fill_topic(
    ctx: BenchContext,
    topic: str,
    count: int,
    size: int,
    *,
    partitions: int = 1,
    producer_config: dict[str, object] | None = None,
    create: bool = True,
    time_limit_s: float = 60.0,
) -> int:
    """Create `topic` (unless `create` is False: the caller made it) and write `count`
    records of `size` random bytes round-robin over its partitions (acks=all); returns
    how many were stored. Setup, not a measurement."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    if create:
        admin = AdminClient(client_config(ctx))
        admin.create_topics([NewTopic(topic, partitions, 1)], request_timeout=30)[topic].result(30)
    producer = Producer(
        {
            **client_config(ctx),
            "acks": "all",
            "linger.ms": 5,
            "message.timeout.ms": 60_000,
            **(producer_config or {}),
        }
    )
    value = os.urandom(size)
    delivered = 0

    def on_delivery(err: object, _msg: object) -> None:
        nonlocal delivered
        if err is None:
            delivered += 1

    deadline = time.monotonic() + time_limit_s
    sent = 0
    while sent < count and time.monotonic() < deadline:
        try:
            producer.produce(
                topic, value=value, partition=sent % partitions, on_delivery=on_delivery
            )
            sent += 1
        except BufferError:
            producer.poll(0.01)
            continue
        if sent % 1000 == 0:
            producer.poll(0)
    producer.flush(60)
    return delivered


def produce_reading(
    ctx: BenchContext, topic: str, records: int, size: int, *, partitions: int, time_limit_s: float
) -> Result:
    """`fill_topic` timed (topic creation included: a few ms) as a produce reading."""
    start = time.perf_counter()
    stored = fill_topic(ctx, topic, records, size, partitions=partitions, time_limit_s=time_limit_s)
    seconds = time.perf_counter() - start
    notes = f"time limit hit: {stored} of {records}" if stored < records else ""
    return Result(f"produce {size} B acks=all", stored, seconds, stored * size, notes)


def median_reading(readings: list[Result]) -> Result:
    """The median reading by rate, its notes listing every reading."""
    ordered = sorted(readings, key=lambda r: r.records_per_s)
    middle = ordered[len(ordered) // 2]
    rates = ", ".join(f"{r.records_per_s:,.0f}" for r in readings)
    notes = "; ".join(n for n in (middle.notes, f"median of {len(readings)}: {rates}") if n)
    return replace(middle, notes=notes)


def share_group_from_earliest(ctx: BenchContext, *groups: str) -> None:
    """Set `share.auto.offset.reset=earliest` for (possibly future) share groups."""
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    admin = AdminClient(client_config(ctx))
    entry = ConfigEntry(
        "share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET
    )
    resources = [ConfigResource("GROUP", g, incremental_configs=[entry]) for g in groups]
    for future in admin.incremental_alter_configs(resources, request_timeout=30).values():
        future.result(timeout=30)


def drain(consumer: Any, expected: int, deadline: float, batch: int = 1000) -> tuple[int, int, int]:
    """Consume with a plain Consumer until `expected` records or `deadline`
    (perf_counter); returns (records, payload bytes, error events)."""
    received = payload = errors = 0
    while received < expected and time.perf_counter() < deadline:
        for msg in consumer.consume(num_messages=batch, timeout=0.1):
            if msg.error() is not None:
                errors += 1
                continue
            received += 1
            payload += len(msg.value() or b"")
    return received, payload, errors


async def topic_id(client: Any, topic: str) -> uuid.UUID:
    """`topic`'s id from Metadata v12, over a `protocol.client.KafkaClient` (ShareFetch
    and ShareAcknowledge name topics by id)."""
    md = await client.request(
        3,
        12,
        {
            "topics": [{"name": topic}],
            "allow_auto_topic_creation": False,
            "include_topic_authorized_operations": False,
        },
    )
    return uuid.UUID(str(md.topics[0].topic_id))
