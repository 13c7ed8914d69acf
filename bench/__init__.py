"""Benchmarks for spool, run by `make bench` (`python -m bench`).

Each benchmark is a function taking a `BenchContext` (a running broker plus the run's
parameters) and returning `Result` rows; `bench.__main__` keeps them in a registry,
runs the selected ones against one broker and prints a table. Figures are printed,
never asserted: tests do not time things.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
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

    def start(self, timeout: float = 30.0) -> None:
        cmd = [sys.executable, "-m", "broker", "serve", "--listen", self.bootstrap]
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


def format_table(results: list[Result]) -> str:
    header = f"{'case':<34} {'records':>10} {'seconds':>8} {'records/s':>11} {'MB/s':>8}  notes"
    lines = [header, "-" * len(header)]
    for r in results:
        lines.append(
            f"{r.case:<34} {r.records:>10} {r.seconds:>8.2f} {r.records_per_s:>11.0f} "
            f"{r.mb_per_s:>8.2f}  {r.notes}"
        )
    return "\n".join(lines)


# --- setup shared by the benchmarks ---------------------------------------------------


def client_config(ctx: BenchContext) -> dict[str, object]:
    return {"bootstrap.servers": ctx.broker.bootstrap, "broker.address.family": "v4"}


def fill_topic(
    ctx: BenchContext,
    topic: str,
    count: int,
    size: int,
    *,
    partitions: int = 1,
    producer_config: dict[str, object] | None = None,
) -> int:
    """Create `topic` and write `count` records of `size` random bytes round-robin over
    its partitions (acks=all); returns how many were stored. Setup, not a measurement."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

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

    deadline = time.monotonic() + 60
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


def share_group_from_earliest(ctx: BenchContext, group: str) -> None:
    """Set `share.auto.offset.reset=earliest` for a (possibly future) share group."""
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    admin = AdminClient(client_config(ctx))
    entry = ConfigEntry(
        "share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET
    )
    resource = ConfigResource("GROUP", group, incremental_configs=[entry])
    for future in admin.incremental_alter_configs([resource], request_timeout=30).values():
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
