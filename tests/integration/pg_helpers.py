"""PostgreSQL for the storage and cluster tests: one throwaway server per test session
(the `pg_server` fixture of tests/integration/conftest.py, over tests/postgres.py), a
fresh database per test (`pg_dsn`), and brokers of one cluster on it (`cluster`,
`start_brokers`).

Import the fixtures where they are used and name them in the module's `__all__`
(`from tests.integration.pg_helpers import cluster, pg_dsn, pg_server`): pytest finds
fixtures imported into a test module.

A cluster's brokers each have a node id (`--node-id`), a data dir and ports of their own,
`--metrics`, and short leases (broker.session.timeout.ms SESSION_MS,
broker.heartbeat.interval.ms INTERVAL_MS) to keep the tests fast. `start_brokers`
returns once every broker sees all of them live (its ActiveBrokerCount).
"""

from __future__ import annotations

import asyncio
import re
import signal
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import pytest

from tests.integration.conftest import (
    START_TIMEOUT_S,
    Broker,
    create_database,
    free_port,
    new_database,
    pg_server,
)
from tests.postgres import PostgresServer

__all__ = [
    "ACTIVE",
    "INTERVAL_MS",
    "SESSION_MS",
    "ClusterBroker",
    "cluster",
    "create_database",
    "db_rows",
    "new_database",
    "pg_dsn",
    "pg_server",
    "start_brokers",
    "wait_all_live",
    "wait_for",
]

SESSION_MS = 3000
INTERVAL_MS = 500
WAIT_S = 20.0
# The live brokers a broker sees (Kafka's ActiveBrokerCount), in its /metrics.
ACTIVE = "kafka_controller_kafkacontroller_activebrokercount"


def db_rows(dsn: str, query: str, *args: Any) -> list[Any]:
    """Run `query` on the database at `dsn` (one connection of its own); its rows."""

    async def run() -> list[Any]:
        conn = await asyncpg.connect(dsn)
        try:
            return list(await conn.fetch(query, *args))
        finally:
            await conn.close()

    return asyncio.run(run())


@pytest.fixture
def pg_dsn(pg_server: PostgresServer) -> str:
    """The URL of a database of its own for this test."""
    return new_database(pg_server)


# --- brokers of one cluster on the test's database ---------------------------------


class ClusterBroker(Broker):
    """A broker of the test's database with its node id, short leases and `--metrics`."""

    def __init__(self, root: Path, name: str, dsn: str, node_id: int) -> None:
        super().__init__(
            root / f"data-{name}",
            root / f"{name}.log",
            {
                "storage": dsn,
                "broker.session.timeout.ms": str(SESSION_MS),
                "broker.heartbeat.interval.ms": str(INTERVAL_MS),
            },
        )
        self.node_id = node_id
        self.metrics_port = free_port()

    def command(self) -> list[str]:
        return [
            *super().command(),
            *("--node-id", str(self.node_id)),
            *("--metrics", f"127.0.0.1:{self.metrics_port}"),
        ]

    def metrics(self) -> str:
        """Its /metrics, as text."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            return str(response.read().decode())

    def metric(self, name: str) -> float | None:
        """The sample `name` (without labels); None if it has none."""
        found = re.search(rf"^{name} (\S+)$", self.metrics(), re.MULTILINE)
        return None if found is None else float(found.group(1))

    def metric_sum(self, pattern: str) -> float:
        """The sum of the samples whose line matches `pattern` (a regex of the name and
        labels, before the value); 0 if none does."""
        return sum(
            float(m.group(1))
            for m in re.finditer(rf"^{pattern} (\S+)$", self.metrics(), re.MULTILINE)
        )

    def sees(self) -> int | None:
        """How many live brokers it sees (itself included)."""
        value = self.metric(ACTIVE)
        return None if value is None else int(value)


@pytest.fixture
def cluster(tmp_path: Path, pg_dsn: str) -> Iterator[Callable[..., ClusterBroker]]:
    """`cluster(node_id, name=None)` makes (does not start) a broker on the test's
    database; those running at the end are resumed (a test may have paused one with
    SIGSTOP) and stopped (exit 0 required)."""
    made: list[ClusterBroker] = []

    def make(node_id: int, name: str | None = None) -> ClusterBroker:
        b = ClusterBroker(tmp_path, name or f"broker{node_id}", pg_dsn, node_id)
        made.append(b)
        return b

    yield make
    for b in made:
        if b.process is not None and b.process.poll() is None:
            b.process.send_signal(signal.SIGCONT)
            b.stop()


def take_over_while_paused(first: Broker, dsn: str, start_second: Callable[[], Broker]) -> Broker:
    """Pause `first` (SIGSTOP) until its lease in spool_brokers has expired, start the
    broker that takes its logs over (`start_second`, which waits for what it claims),
    then let `first` run again: a zombie that still thinks it leads. The second broker."""
    assert first.process is not None
    first.process.send_signal(signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 30
        while db_rows(dsn, "SELECT 1 FROM spool_brokers WHERE lease_expires_at > now()"):
            assert time.monotonic() < deadline, "the paused broker's lease never expired"
            time.sleep(0.1)
        return start_second()
    finally:
        first.process.send_signal(signal.SIGCONT)


def wait_for(check: Callable[[], bool], what: str, timeout: float = WAIT_S) -> float:
    """Poll `check` until true; the seconds it took."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if check():
            return time.monotonic() - started
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def wait_all_live(brokers: Sequence[ClusterBroker], timeout: float = WAIT_S) -> None:
    """Wait (at most `timeout`) until each of `brokers` sees all of them live."""
    for b in brokers:
        wait_for(
            lambda b=b: b.sees() == len(brokers),
            f"broker {b.node_id} to see {len(brokers)} live brokers",
            timeout,
        )


AnyClusterBroker = TypeVar("AnyClusterBroker", bound=ClusterBroker)


def start_brokers(
    brokers: Sequence[AnyClusterBroker], *, at_once: bool = False, timeout: float = WAIT_S
) -> list[AnyClusterBroker]:
    """Start `brokers`, one after another (or all at once, each from a thread of its
    own), and wait (at most `timeout`) until each sees all of them live; `brokers`."""
    if at_once:
        failed: list[BaseException] = []

        def start(b: ClusterBroker) -> None:
            try:
                b.start()
            except BaseException as exc:
                failed.append(exc)

        threads = [threading.Thread(target=start, args=(b,)) for b in brokers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=2 * START_TIMEOUT_S)
        if failed:
            raise failed[0]
        assert all(b.running for b in brokers), "a broker did not start"
    else:
        for b in brokers:
            b.start()
    wait_all_live(brokers, timeout)
    return list(brokers)
