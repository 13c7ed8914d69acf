"""Integration harness: a real spool broker process and real confluent-kafka clients.

Each test gets its own broker on a free port with a data dir under `tmp_path`. The
process's stdout/stderr go to `broker.log` in that dir; when a test fails, the tail
of the log is attached to the report. Every wait in here is bounded.

Storage engines: the brokers of `broker`, `broker_factory` and of module fixtures that
pass `storage_settings_for(request, storage)` to `module_broker` keep their state in files (the
default) or on PostgreSQL, as the `storage` fixture says. A module or test runs on both
with `@BOTH_STORAGES` (or `pytestmark = BOTH_STORAGES`): each test runs once per engine,
ids `[file]` and `[postgresql]`; on PostgreSQL every broker gets a fresh database of its
own on the session's throwaway server (the `pg_server` fixture, tests/postgres.py),
started only when a test needs it. A broker given an explicit `storage` setting keeps
it. The PostgreSQL tests' own helpers (a database per test, brokers of one cluster) are
in tests/integration/pg_helpers.py, which builds on this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from tests import ports
from tests.postgres import PostgresServer, postgres_server

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0
LOG_TAIL_LINES = 200
TEST_DEFAULTS: dict[str, str | None] = {
    "group.share.min.heartbeat.interval.ms": "500",
    "group.share.heartbeat.interval.ms": "1000",
}

# The engines a test parametrised with BOTH_STORAGES runs on (the `storage` fixture).
STORAGES = ("file", "postgresql")
BOTH_STORAGES = pytest.mark.parametrize("storage", STORAGES, indirect=True)

# Log files of the brokers a test started, for the failure report (paths only, so the
# brokers and their clients are freed after the test).
_LOGS_KEY = pytest.StashKey[list[Path]]()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, reserved for this test
    process (tests/ports.py: pytest-xdist workers run brokers side by side)."""
    return ports.free_port("127.0.0.1")


class BrokerError(AssertionError):
    """The broker process did not start, stop or exit as expected."""


class Broker:
    """One `python -m broker serve` process with a fixed port and data dir.

    `restart()` and `kill9()` keep both, so a test can check what survives.
    """

    def __init__(
        self,
        data_dir: Path,
        log_path: Path,
        settings: dict[str, str | None] | None = None,
        open_file_limit: int | None = None,
        env: dict[str, str] | None = None,
    ):
        self.data_dir = data_dir
        self.log_path = log_path
        # Test brokers answer share heartbeats every second instead of Kafka's 5 s, so a
        # new group's first member (assigned at its second heartbeat, as in Kafka 4.2)
        # starts in 1 s; a test of the defaults sets them back (or to None: dropped).
        merged = {**TEST_DEFAULTS, **(settings or {})}
        self.settings = {k: v for k, v in merged.items() if v is not None}
        # RLIMIT_NOFILE (soft and hard) for the broker process; None: inherited.
        self.open_file_limit = open_file_limit
        # Extra environment variables of the process (e.g. SPOOL_CRASH_AT, broker.faults);
        # a test may change them between a kill and the next start.
        self.env = dict(env or {})
        self.port = free_port()
        self.host = "127.0.0.1"
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "broker", "serve"]
        # A `listeners` setting replaces --listen (it keeps PLAINTEXT on `port`, where
        # start() waits for the broker).
        if "listeners" not in self.settings:
            cmd += ["--listen", self.bootstrap]
        cmd += ["--data-dir", str(self.data_dir)]
        for key, value in self.settings.items():
            cmd += ["--set", f"{key}={value}"]
        if self.open_file_limit is not None:
            # Set the limit, then exec the broker in the same process (same pid); no
            # preexec_fn, which is unsafe with the client threads of the test process.
            n = self.open_file_limit
            cmd[1:1] = [
                "-c",
                "import os, resource, sys; "
                f"resource.setrlimit(resource.RLIMIT_NOFILE, ({n}, {n})); "
                "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])",
            ]
        return cmd

    def start(self) -> None:
        """Start the process and wait until it accepts TCP connections."""
        assert not self.running, "broker already running"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        with self.log_path.open("ab") as log:
            log.write(f"\n===== start #{self.starts}: {' '.join(self.command())}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                self.command(),
                cwd=REPO_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
            )
        self._wait_accepting()

    def _wait_accepting(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process is not None
            code = self.process.poll()
            if code is not None:
                raise BrokerError(f"broker exited with {code} during start\n{self.log_tail()}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection((self.host, self.port), timeout=1.0),
            ):
                return
            time.sleep(0.1)
        self.kill9()
        raise BrokerError(
            f"broker did not accept connections within {START_TIMEOUT_S}s\n{self.log_tail()}"
        )

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM, wait, and require a clean exit (code 0)."""
        assert self.process is not None, "broker was never started"
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
            raise BrokerError(
                f"broker did not exit within {timeout}s of SIGTERM\n{self.log_tail()}"
            ) from None
        if code != 0:
            raise BrokerError(f"broker exited with {code} after SIGTERM\n{self.log_tail()}")

    def kill9(self) -> None:
        """SIGKILL: no chance to flush anything."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.kill()
        self.process.wait(timeout=10)

    def restart(self) -> None:
        """Clean stop (exit code 0 required) then start on the same port and data dir."""
        self.stop()
        self.start()

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return _tail(self.log_path, lines)


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return "(no broker log)"
    return "\n".join(text.splitlines()[-lines:])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.failed:
        for log_path in item.stash.get(_LOGS_KEY, []):
            report.sections.append((f"broker log {log_path}", _tail(log_path)))
    return report


# --- PostgreSQL: one throwaway server per test session, a database per broker ------

_databases = itertools.count()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    with postgres_server() as server:
        yield server


def create_database(server: PostgresServer, name: str) -> str:
    """A new empty database on `server`; its URL."""

    async def create() -> None:
        conn = await asyncpg.connect(server.dsn)
        try:
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()

    asyncio.run(create())
    return server.dsn.rsplit("/", 1)[0] + f"/{name}"


def new_database(server: PostgresServer) -> str:
    """The URL of a new empty database on `server`, named for no one else."""
    return create_database(server, f"spool_test_{next(_databases)}")


@pytest.fixture(scope="module")
def storage(request: pytest.FixtureRequest) -> str:
    """The storage engine of this test's brokers: "file" unless the test is parametrised
    with BOTH_STORAGES (module scope, so module-scoped brokers can follow it too)."""
    engine: str = getattr(request, "param", "file")
    assert engine in STORAGES, engine
    return engine


def storage_settings_for(request: pytest.FixtureRequest, storage: str) -> dict[str, str]:
    """Broker settings for the engine `storage` (the fixture's value, which a fixture
    must name among its arguments for BOTH_STORAGES to reach it): none for files, a new
    empty database (the `storage` URL) for PostgreSQL."""
    if storage == "file":
        return {}
    return {"storage": new_database(request.getfixturevalue("pg_server"))}


@pytest.fixture
def broker_factory(
    request: pytest.FixtureRequest, tmp_path: Path, storage: str
) -> Iterator[Callable[..., Broker]]:
    """Start brokers with extra `--set` settings (and optionally a lower open-file
    limit, or extra environment variables: `env`, kept in `Broker.env`), on the test's
    storage engine (each its own database on PostgreSQL, unless the settings name a
    `storage`); all are stopped (exit 0) at teardown."""
    brokers: list[Broker] = []
    request.node.stash[_LOGS_KEY] = []

    def make(
        settings: dict[str, str] | None = None,
        open_file_limit: int | None = None,
        env: dict[str, str] | None = None,
    ) -> Broker:
        n = len(brokers)
        if not settings or "storage" not in settings:
            settings = {**storage_settings_for(request, storage), **(settings or {})}
        broker = Broker(
            tmp_path / f"data{n}", tmp_path / f"broker{n}.log", settings, open_file_limit, env
        )
        brokers.append(broker)
        request.node.stash[_LOGS_KEY].append(broker.log_path)
        broker.start()
        return broker

    yield make
    for broker in brokers:
        if broker.running:
            broker.stop()


@pytest.fixture
def broker(broker_factory: Callable[..., Broker]) -> Broker:
    """A broker with default settings."""
    return broker_factory()


AnyBroker = TypeVar("AnyBroker", bound=Broker)


@contextlib.contextmanager
def started(broker: AnyBroker) -> Iterator[AnyBroker]:
    """`broker` started, and stopped (exit 0 required) at the end unless a test did."""
    broker.start()
    try:
        yield broker
    finally:
        if broker.running:
            broker.stop()


@contextlib.contextmanager
def module_broker(
    tmp_path_factory: pytest.TempPathFactory, name: str, settings: dict[str, str] | None = None
) -> Iterator[Broker]:
    """A started broker for a module-scoped fixture (tests that need no broker of their
    own share one), stopped (exit 0 required) when the module is done. On files unless
    `settings` say otherwise: pass `{**settings, **storage_settings_for(request, storage)}`
    to follow the `storage` fixture."""
    root = tmp_path_factory.mktemp(name)
    with started(Broker(root / "data", root / "broker.log", settings)) as broker:
        yield broker


# --- client configs --------------------------------------------------------------


# librdkafka logs go through Python logging, so pytest shows them with a failing test
# (and a client outliving a stopped broker does not write to the terminal).
CLIENT_LOGGER = logging.getLogger("librdkafka")


def _base_config(broker: Broker) -> dict[str, Any]:
    return {
        "bootstrap.servers": broker.bootstrap,
        "logger": CLIENT_LOGGER,
        "broker.address.family": "v4",
        "socket.timeout.ms": 10_000,
        "reconnect.backoff.ms": 50,
        "reconnect.backoff.max.ms": 500,
    }


def producer_config(broker: Broker, **overrides: Any) -> dict[str, Any]:
    """An idempotent acks=all producer that gives up after 30 s."""
    return {
        **_base_config(broker),
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 5,
        "message.timeout.ms": 30_000,
        **overrides,
    }


def consumer_config(broker: Broker, **overrides: Any) -> dict[str, Any]:
    """A consumer for `assign()`: no commits, reports partition EOF."""
    return {
        **_base_config(broker),
        "group.id": "spool-it-assign",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": True,
        "fetch.wait.max.ms": 100,
        **overrides,
    }


def admin_config(broker: Broker, **overrides: Any) -> dict[str, Any]:
    return {**_base_config(broker), **overrides}


# --- helpers used by several test modules -----------------------------------------

ADMIN_TIMEOUT_S = 30.0


def create_topic(
    broker: Broker, name: str, partitions: int = 1, config: dict[str, str] | None = None
) -> None:
    admin = AdminClient(admin_config(broker))
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})],
        request_timeout=ADMIN_TIMEOUT_S,
    )
    futures[name].result(timeout=ADMIN_TIMEOUT_S)
    wait_for_partitions(broker, name, partitions)


def wait_for_partitions(broker: Broker, topic: str, partitions: int) -> None:
    """Wait (bounded) until metadata shows `topic` with exactly `partitions` partitions."""
    admin = AdminClient(admin_config(broker))
    deadline = time.monotonic() + ADMIN_TIMEOUT_S
    seen: object = None
    while time.monotonic() < deadline:
        md = admin.list_topics(topic=topic, timeout=10)
        tmd = md.topics.get(topic)
        seen = None if tmd is None else (tmd.error, len(tmd.partitions))
        if tmd is not None and tmd.error is None and len(tmd.partitions) == partitions:
            return
        time.sleep(0.1)
    raise AssertionError(f"topic {topic!r} never showed {partitions} partitions; last {seen}")


@dataclass(frozen=True)
class Sent:
    """One record as the producer sent it and the broker acknowledged it."""

    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    partition: int
    offset: int


@dataclass
class ProduceOutcome:
    acked: list[Sent]
    errors: list[KafkaError]
    unflushed: int


def produce(
    producer: Producer,
    topic: str,
    records: Sequence[tuple[int | None, bytes | None, bytes | None, list[tuple[str, Any]]]],
    flush_timeout: float = 60.0,
    timestamps: Sequence[int] | None = None,
) -> ProduceOutcome:
    """Produce (partition, key, value, headers) tuples and flush; collect delivery reports.

    `partition` None lets the client's partitioner choose.
    """
    acked: list[Sent] = []
    errors: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            errors.append(err)
            return
        acked.append(
            Sent(
                key=msg.key(),
                value=msg.value(),
                headers=tuple(msg.headers() or ()),
                partition=msg.partition(),
                offset=msg.offset(),
            )
        )

    for i, (partition, key, value, headers) in enumerate(records):
        kwargs: dict[str, Any] = {"key": key, "value": value, "on_delivery": on_delivery}
        if headers:
            kwargs["headers"] = headers
        if partition is not None:
            kwargs["partition"] = partition
        if timestamps is not None:
            kwargs["timestamp"] = timestamps[i]
        # Local queue full is back-pressure, not an error: serve callbacks and retry.
        for _ in range(10_000):
            try:
                producer.produce(topic, **kwargs)
                break
            except BufferError:
                producer.poll(0.05)
        else:
            raise AssertionError("producer queue stayed full")
        producer.poll(0)
    unflushed = producer.flush(flush_timeout)
    return ProduceOutcome(acked=acked, errors=errors, unflushed=unflushed)


@dataclass(frozen=True)
class Received:
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    partition: int
    offset: int
    timestamp: int


def consume_assigned(
    broker: Broker,
    topic: str,
    partitions: Sequence[int],
    expected: int,
    timeout: float = 60.0,
    **config: Any,
) -> list[Received]:
    """Read `partitions` of `topic` from the beginning until `expected` records or EOF on all.

    Stops at whichever comes last of: `expected` records read and every partition at EOF.
    Bounded by `timeout`; any consumer error other than partition EOF fails the test.
    """
    consumer = Consumer(consumer_config(broker, **config))
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        out: list[Received] = []
        at_eof: set[int] = set()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(out) >= expected and at_eof == set(partitions):
                break
            for msg in consumer.consume(num_messages=1000, timeout=0.5):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        at_eof.add(msg.partition())
                        continue
                    raise AssertionError(f"consumer error: {err}")
                at_eof.discard(msg.partition())
                out.append(
                    Received(
                        key=msg.key(),
                        value=msg.value(),
                        headers=tuple(msg.headers() or ()),
                        partition=msg.partition(),
                        offset=msg.offset(),
                        timestamp=msg.timestamp()[1],
                    )
                )
        else:
            raise AssertionError(
                f"read {len(out)} of {expected} records from {topic} within {timeout}s; "
                f"partitions at EOF: {sorted(at_eof)}"
            )
        return out
    finally:
        consumer.close()


def watermarks(broker: Broker, topic: str, partition: int) -> tuple[int, int]:
    """(low, high) watermarks straight from the broker (ListOffsets)."""
    consumer = Consumer(consumer_config(broker))
    try:
        low, high = consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=10, cached=False
        )
        return int(low), int(high)
    finally:
        consumer.close()


def assert_round_trip(broker: Broker, topic: str, count: int = 50) -> None:
    """A fresh producer and consumer can still write and read a new topic `topic`."""
    create_topic(broker, topic)
    producer = Producer(producer_config(broker))
    records = [(0, f"k{i}".encode(), f"v{i}".encode(), []) for i in range(count)]
    outcome = produce(producer, topic, records, flush_timeout=30)
    assert outcome.errors == [] and outcome.unflushed == 0, outcome.errors
    got = consume_assigned(broker, topic, [0], count, timeout=30)
    assert [r.value for r in got] == [v for (_, _, v, _) in records]
    assert [r.offset for r in got] == list(range(count))
