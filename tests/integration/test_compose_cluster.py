"""docker-compose.cluster.yml's brokers run as processes on one real PostgreSQL.

No Docker engine here: each broker service's command and environment are taken from
the compose file as they are, with only what Docker would provide substituted: the
container's ports (each broker gets free loopback ports for its EXTERNAL and PLAINTEXT
listeners, bound where the container binds 0.0.0.0 and advertised where it advertises
localhost:909N or broker-N), the `postgres` service (the test's server and database,
same user), the data dir volume, and the secrets volume, whose password file is written
by the pg-password service's own script. The three processes start at once, as
compose starts them once postgres is healthy; then every broker must list all three in
Metadata and DescribeCluster, on each listener with that listener's endpoints, under
one cluster id; the image's health check must pass on each EXTERNAL listener; a client
bootstrapped from broker-1's published port must follow a 6-partition topic's leaders
(two per broker) to the others' published ports. And after a share group accepted
records of a two-partition topic (led by two brokers), the pipeline's own `spool
compact` and `spool audit` command lines (the Spark master made `local[1]`, the audit
volume a directory) must read the same database, with that group's share state, and
pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from confluent_kafka import Producer

from protocol.client import KafkaClient
from tests.integration.conftest import (
    REPO_ROOT,
    Broker,
    BrokerError,
    consume_assigned,
    create_topic,
    free_port,
    produce,
    producer_config,
)
from tests.integration.pg_helpers import db_rows, pg_dsn, pg_server
from tests.integration.share_helpers import accept_until
from tests.integration.test_docker_healthcheck import healthcheck, run_healthcheck
from tests.unit.test_compose import commands_of
from tests.unit.test_compose_cluster import (
    SERVICES,
    brokers,
    environment,
    generate_password,
    listeners,
    password_file,
)

__all__ = ["healthcheck", "pg_dsn", "pg_server"]  # the fixtures

WAIT_S = 30.0
START_TIMEOUT_S = 60.0
PIPELINE_TIMEOUT_S = 240
PARTITIONS = 6
GROUP = "compose-group"


@pytest.fixture(autouse=True)
def _no_spool_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the compose file's environment configures the brokers."""
    for name in list(os.environ):
        if name.startswith("SPOOL_") or name == "PGPASSWORD":
            monkeypatch.delenv(name)


def substitute(value: str, replacements: dict[str, str]) -> str:
    """Every occurrence of a key replaced at once (longest keys first)."""
    pattern = "|".join(re.escape(k) for k in sorted(replacements, key=len, reverse=True))
    return re.sub(pattern, lambda m: replacements[m.group(0)], value)


def url_on_test_server(compose_url: str, dsn: str) -> str:
    """The compose storage URL on the test's server and database (the same user)."""
    compose, test = urlsplit(compose_url), urlsplit(dsn)
    assert compose.username == test.username, "the test server's user is the compose one"
    return urlunsplit(compose._replace(netloc=test.netloc, path=test.path))


class ComposeBroker(Broker):
    """A broker service of the compose file as a process: its argv and environment
    with the substitutions, `spool` run as `python -m broker` from this tree."""

    def __init__(
        self, root: Path, name: str, argv: list[str], env: dict[str, str], ports: tuple[int, int]
    ) -> None:
        super().__init__(root / f"data-{name}", root / f"{name}.log")
        self.name = name
        self.argv = argv
        self.env = env
        self.port, self.internal_port = ports  # EXTERNAL (the health check's), PLAINTEXT

    def command(self) -> list[str]:
        assert self.argv[0] == "spool"
        return [sys.executable, "-m", "broker", *self.argv[1:]]

    def launch(self) -> None:
        self.starts += 1
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command(),
                cwd=REPO_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
            )

    def wait_accepting(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise BrokerError(f"{self.name} exited during start\n{self.log_tail()}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection((self.host, self.port), timeout=1.0),
            ):
                return
            time.sleep(0.1)
        self.kill9()
        raise BrokerError(f"{self.name} did not start\n{self.log_tail()}")


@pytest.fixture
def secrets_dir(tmp_path: Path) -> Path:
    """The secrets volume, its password file written by pg-password's script."""
    directory = tmp_path / "secrets-volume"
    directory.mkdir(mode=0o700)
    generate_password(directory)
    return directory


@pytest.fixture
def compose_cluster(
    tmp_path: Path, pg_dsn: str, secrets_dir: Path
) -> Iterator[dict[str, ComposeBroker]]:
    """The compose file's brokers as processes on the test's database, all up."""
    secret = str(secrets_dir / Path(password_file()).name)
    ports = {name: (free_port(), free_port()) for name in brokers()}  # EXTERNAL, PLAINTEXT
    made: dict[str, ComposeBroker] = {}
    for name, service in brokers().items():
        external, internal = listeners(service)["EXTERNAL"], listeners(service)["PLAINTEXT"]
        ext_port, int_port = ports[name]
        argv = [str(a) for a in commands_of(service)[0]]
        storage = argv[argv.index("--storage") + 1]
        data_dir = argv[argv.index("--data-dir") + 1]
        replacements = {
            f"{external.host}:{external.port}": f"127.0.0.1:{ext_port}",
            f"{internal.host}:{internal.port}": f"127.0.0.1:{int_port}",
            f"{external.advertised_host}:{external.advertised_port}": f"127.0.0.1:{ext_port}",
            f"{internal.advertised_host}:{internal.advertised_port}": f"127.0.0.1:{int_port}",
            storage: url_on_test_server(storage, pg_dsn),
            password_file(): secret,
        }
        argv = [
            str(tmp_path / f"data-{name}") if a == data_dir else substitute(a, replacements)
            for a in argv
        ]
        env = {k: substitute(v, replacements) for k, v in environment(service).items()}
        leftover = " ".join([*argv, *env.values()])
        for docker_only in ("0.0.0.0", "localhost", "//broker-", "@postgres", "/secrets/"):
            assert docker_only not in leftover, f"{name}: {docker_only} left in {leftover}"
        made[name] = ComposeBroker(tmp_path, name, argv, env, ports[name])
    try:
        for b in made.values():  # at once, as compose starts them
            b.launch()
        for b in made.values():
            b.wait_accepting()
        yield made
    finally:
        for b in made.values():
            if b.running:
                b.stop()


def listed(port: int) -> tuple[str, dict[int, tuple[str, int]], dict[int, tuple[str, int]]]:
    """(cluster id, Metadata's brokers, DescribeCluster's brokers) asked on `port`."""

    async def ask() -> tuple[str, dict[int, tuple[str, int]], dict[int, tuple[str, int]]]:
        client = await KafkaClient.connect("127.0.0.1", port, "spool-it-compose")
        try:
            metadata = await client.request(
                3,
                12,
                {
                    "topics": [],
                    "allow_auto_topic_creation": False,
                    "include_topic_authorized_operations": False,
                },
            )
            described = await client.request(
                60, 0, {"include_cluster_authorized_operations": False}
            )
        finally:
            await client.close()
        assert metadata.cluster_id == described.cluster_id
        return (
            str(metadata.cluster_id),
            {int(n.node_id): (str(n.host), int(n.port)) for n in metadata.brokers},
            {int(n.broker_id): (str(n.host), int(n.port)) for n in described.brokers},
        )

    return asyncio.run(ask())


def wait_for(check: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def node_ids() -> dict[str, int]:
    from tests.unit.test_compose_cluster import broker_config

    return {name: int(broker_config(s)[1].get("node.id")) for name, s in brokers().items()}


def test_the_compose_brokers_form_one_cluster_on_postgresql(
    compose_cluster: dict[str, ComposeBroker], healthcheck: Path
) -> None:
    ids = node_ids()
    assert sorted(ids.values()) == [1, 2, 3]
    external = {ids[n]: ("127.0.0.1", b.port) for n, b in compose_cluster.items()}
    internal = {ids[n]: ("127.0.0.1", b.internal_port) for n, b in compose_cluster.items()}
    cluster_ids = set()
    for name, b in compose_cluster.items():
        # Each listener answers with its own advertised endpoints of every broker.
        for port, expected in ((b.port, external), (b.internal_port, internal)):
            wait_for(
                lambda port=port, expected=expected: listed(port)[1:] == (expected, expected),
                f"{name} on port {port} to list the three brokers",
            )
            cluster_ids.add(listed(port)[0])
        result = run_healthcheck(healthcheck, f"127.0.0.1:{b.port}")
        assert result.returncode == 0, f"{name}: {result.stderr}"
    assert len(cluster_ids) == 1, cluster_ids

    # A client on the host, bootstrapped from broker-1's published port, follows the
    # leaders to the others' published ports: every partition written and read back.
    one, _, three = compose_cluster.values()
    create_topic(one, "spread", PARTITIONS)
    wait_for(lambda: spread(compose_cluster, "spread"), "the leaders to spread over three")
    # `spool cluster`, as the README has the user run it from the host, says the same.
    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            "broker",
            "cluster",
            "--bootstrap-server",
            one.bootstrap,
            "--topic",
            "spread",
            "--output",
            "json",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    view = json.loads(shown.stdout)
    assert {b["id"]: (b["host"], b["port"]) for b in view["brokers"]} == external
    [topic] = [t for t in view["topics"] if t["topic"] == "spread"]
    assert sorted(Counter(p["leader"] for p in topic["partitions"]).values()) == [2, 2, 2]
    outcome = produce(
        Producer(producer_config(one)),
        "spread",
        [(i % PARTITIONS, None, f"v-{i}".encode(), []) for i in range(60)],
        flush_timeout=60,
    )
    assert outcome.errors == [] and len(outcome.acked) == 60
    got = consume_assigned(three, "spread", list(range(PARTITIONS)), 60)
    assert sorted(r.value for r in got) == sorted(r.value for r in outcome.acked)  # type: ignore[type-var]


def leaders(b: ComposeBroker, topic: str) -> dict[int, int]:
    """Partition -> leader id as broker `b` answers Metadata."""

    async def ask() -> dict[int, int]:
        client = await KafkaClient.connect("127.0.0.1", b.port, "spool-it-compose")
        try:
            metadata = await client.request(
                3,
                12,
                {
                    "topics": None,
                    "allow_auto_topic_creation": False,
                    "include_topic_authorized_operations": False,
                },
            )
        finally:
            await client.close()
        found = [t for t in metadata.topics if t.name == topic]
        return {int(p.partition_index): int(p.leader_id) for t in found for p in t.partitions}

    return asyncio.run(ask())


def spread(cluster: dict[str, ComposeBroker], topic: str) -> bool:
    """Every broker names the same leaders for all partitions, two on each broker."""
    seen = [leaders(b, topic) for b in cluster.values()]
    return (
        len(seen[0]) == PARTITIONS
        and all(s == seen[0] for s in seen)
        and sorted(Counter(seen[0].values()).values()) == [2, 2, 2]
    )


def pipeline_steps(dsn: str, secret: str, out: Path) -> list[list[str]]:
    """The pipeline's compact and audit argv, on the test's database and directories."""
    steps = commands_of(SERVICES["pipeline"])
    storage = steps[0][steps[0].index("--storage") + 1]
    audit_out = steps[1][steps[1].index("--out") + 1]
    replacements = {
        storage: url_on_test_server(storage, dsn),
        password_file(): secret,
        "spark://spark-master:7077": "local[1]",
    }
    result = []
    for argv in steps:
        assert argv[0] == "spool"
        argv = [str(out) if a == audit_out else substitute(a, replacements) for a in argv]
        result.append([sys.executable, "-m", "broker", *argv[1:]])
    return result


@pytest.mark.slow
def test_the_compose_pipeline_reads_the_brokers_database(
    compose_cluster: dict[str, ComposeBroker], pg_dsn: str, secrets_dir: Path, tmp_path: Path
) -> None:
    pytest.importorskip("pyspark")
    from persister.spark.pg import jdbc_jar

    if jdbc_jar() is None:
        pytest.skip("no PostgreSQL JDBC driver (`make test` installs it)")
    secret = str(secrets_dir / Path(password_file()).name)
    password = Path(secret).read_text().strip()
    # Share state for the jobs to read: a share group accepts records of a topic, which a
    # producer keeps writing to both partitions meanwhile (a new share group starts at
    # the log end, so records written before it fetched would not be delivered).
    one = next(iter(compose_cluster.values()))
    create_topic(one, "queue", 2)
    stop = threading.Event()
    produced: list[Any] = []

    def keep_producing() -> None:
        producer = Producer(producer_config(one))
        i = 0
        while not stop.is_set():
            outcome = produce(producer, "queue", [(i % 2, None, f"q-{i}".encode(), [])])
            produced.extend(outcome.errors)
            i += 1
            time.sleep(0.05)

    writer = threading.Thread(target=keep_producing, daemon=True)
    writer.start()
    try:
        delivered = accept_until(one, GROUP, ["queue"], 20)
    finally:
        stop.set()
        writer.join(timeout=90)
    assert produced == [], produced
    assert len(delivered.deliveries) >= 20, delivered.errors
    assert {d.partition for d in delivered.deliveries} == {0, 1}
    out = tmp_path / "audit"
    for argv in pipeline_steps(pg_dsn, secret, out):
        result = subprocess.run(
            argv,
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=PIPELINE_TIMEOUT_S,
        )
        assert result.returncode == 0, f"{argv[3]}: {result.stdout[-3000:]}{result.stderr[-3000:]}"
        assert password not in result.stdout + result.stderr
    report: dict[str, Any] = json.loads((out / "report.json").read_text())
    assert report["passed"] and all(c["passed"] for c in report["checks"]), report["checks"]
    # The database the brokers use (its URL as the report shows it, password masked),
    # every row of its share-state log read.
    summary = report["summary"]
    assert summary["storage"].rpartition("@")[2] == pg_dsn.rpartition("@")[2], summary
    rows = db_rows(
        pg_dsn,
        "SELECT count(*) AS n FROM spool_batches b JOIN spool_logs l USING (log_id) "
        "WHERE l.name = 'share-state'",
    )
    assert summary["rows"] == rows[0]["n"] > 0, summary
    parts = [p for p in report["partitions"] if p["group_id"] == GROUP]
    assert sorted(p["partition"] for p in parts) == [0, 1], report["partitions"]
    assert all(p["topic"] == "queue" for p in parts), parts
