"""`spool serve --metrics`: /health and /metrics of a real broker under share traffic.

One broker process for the module (the tests run in file order and each leaves no client
behind); confluent-kafka's Producer and ShareConsumer make the traffic, and every number
asserted is one the test itself caused.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration import share_helpers as share
from tests.integration.conftest import Broker, create_topic, free_port

TOPIC = "metrics-queue"
GROUP = "metrics-group"
RECORDS = 40
VALUE_BYTES = 100
WAIT_S = 30.0

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class MetricsBroker(Broker):
    """The harness's broker process with `--metrics 127.0.0.1:<free port>`."""

    def __init__(self, data_dir: Path, log_path: Path) -> None:
        super().__init__(data_dir, log_path)
        self.metrics_port = free_port()

    def command(self) -> list[str]:
        return [*super().command(), "--metrics", f"127.0.0.1:{self.metrics_port}"]

    def get(self, path: str) -> tuple[int, bytes]:
        url = f"http://127.0.0.1:{self.metrics_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MetricsBroker]:
    tmp = tmp_path_factory.mktemp("metrics")
    b = MetricsBroker(tmp / "data", tmp / "broker.log")
    b.start()
    try:
        # The harness's own probe connection has gone before any test counts connections.
        wait_for(lambda: gauge(scrape(b), CONNECTIONS) == 0, "the start probe to disconnect")
    except AssertionError:
        b.kill9()
        raise
    yield b
    b.stop()  # a clean exit (code 0) is part of the test


def scrape(broker: MetricsBroker) -> Samples:
    status, body = broker.get("/metrics")
    assert status == 200, body
    out: Samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels` (0 when none)."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= set(ls))


def gauge(samples: Samples, name: str, **labels: str) -> float | None:
    """`value`, but None when no sample matches: a gauge of 0 must be there to be 0."""
    wanted = set(labels.items())
    found = [v for (n, ls), v in samples.items() if n == name and wanted <= set(ls)]
    return sum(found) if found else None


def wait_for(check: Callable[[], bool], what: str, timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


CONNECTIONS = "kafka_server_socket_server_metrics_connection_count"
REQUESTS = "kafka_network_requestmetrics_requests_total"
LAG = "spool_share_group_lag"


def test_health_is_200_and_serving_once_the_broker_accepts_clients(broker: MetricsBroker) -> None:
    status, body = broker.get("/health")
    assert status == 200
    doc = json.loads(body)
    assert doc["status"] == "serving"
    assert doc["node_id"] == 1
    assert doc["cluster_id"]
    assert broker.get("/nothing")[0] == 404


def test_connection_gauge_follows_clients_connecting_and_leaving(broker: MetricsBroker) -> None:
    sockets = [socket.create_connection((broker.host, broker.port), timeout=5) for _ in range(3)]
    try:
        wait_for(lambda: value(scrape(broker), CONNECTIONS) == 3, "3 open connections")
        sockets.pop().close()
        wait_for(lambda: value(scrape(broker), CONNECTIONS) == 2, "2 open connections")
    finally:
        for s in sockets:
            s.close()
    wait_for(lambda: gauge(scrape(broker), CONNECTIONS) == 0, "no open connections")
    assert (
        value(scrape(broker), "kafka_server_socket_server_metrics_connection_creation_total") >= 3
    )


def test_share_traffic_is_counted_and_lag_falls_to_zero_once_all_is_accepted(
    broker: MetricsBroker,
) -> None:
    create_topic(broker, TOPIC)
    share.earliest(broker, GROUP)
    before = scrape(broker)
    values = [bytes([65 + i % 26]) * VALUE_BYTES for i in range(RECORDS)]
    share.produce_values(broker, TOPIC, values)

    consumer = share.share_consumer(broker, GROUP, [TOPIC])
    try:
        log = share.consume(
            consumer,
            until=lambda log: len(log.deliveries) >= RECORDS,
            timeout=60,
            decide=share.accept_all,
        )
    finally:
        share.close_quietly(consumer)
    assert sorted(log.offsets()) == [(0, offset) for offset in range(RECORDS)]

    group = {"group": GROUP, "topic": TOPIC, "partition": "0"}
    # commit_sync returned after each acknowledgement was durable: nothing is left to do.
    wait_for(lambda: gauge(scrape(broker), LAG, **group) == 0, "the group's lag to reach 0")
    after = scrape(broker)

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew(REQUESTS, request="ShareFetch") > 0
    assert grew(REQUESTS, request="ShareAcknowledge") > 0
    assert grew(REQUESTS, request="Produce") > 0
    assert grew("kafka_network_requestmetrics_totaltimems_count", request="ShareFetch") == grew(
        REQUESTS, request="ShareFetch"
    )
    assert grew("kafka_server_brokertopicmetrics_totalsharefetchrequests_total") > 0
    assert grew("kafka_server_brokertopicmetrics_messagesin_total") == RECORDS
    assert grew("kafka_server_brokertopicmetrics_bytesin_total") >= RECORDS * VALUE_BYTES
    assert grew("kafka_server_brokertopicmetrics_bytesout_total") >= RECORDS * VALUE_BYTES
    # Every record acquired once, accepted once, none redelivered.
    assert value(after, "spool_share_records_acquired_total", **group) == RECORDS
    accepted = "kafka_server_sharegroupmetrics_recordacknowledgements_total"
    assert value(after, accepted, ackType="Accept", **group) == RECORDS
    assert value(after, accepted, ackType="Release", **group) == 0
    deliveries = "spool_share_group_delivery_count_bucket"
    assert value(after, deliveries, group=GROUP, le="1.0") == RECORDS
    assert value(after, deliveries, group=GROUP, le="+Inf") == RECORDS
    assert value(after, "kafka_server_sharepartitionmetrics_acquisitionlocktimeout_total") == 0
    assert gauge(after, "spool_share_partition_acquired_records", **group) == 0
    assert gauge(after, "kafka_server_sharepartitionmetrics_inflightmessagecount", **group) == 0
    assert value(after, "kafka_log_log_logendoffset", topic=TOPIC, partition="0") == RECORDS
    assert value(after, "kafka_log_log_size", topic="__share_group_state") > 0
    assert grew("kafka_log_logflushstats_logflushrateandtimems_count") > 0


def test_lag_of_records_nobody_fetched_is_kept_across_a_restart(broker: MetricsBroker) -> None:
    share.produce_values(broker, TOPIC, [b"x" * VALUE_BYTES] * 10)
    group = {"group": GROUP, "topic": TOPIC, "partition": "0"}
    wait_for(lambda: gauge(scrape(broker), LAG, **group) == 10, "lag of the 10 new records")
    broker.restart()
    # Counters start again from 0; the lag is read from the durable share state.
    wait_for(lambda: broker.get("/health")[0] == 200, "the restarted broker to serve")
    after = scrape(broker)
    assert gauge(after, LAG, **group) == 10
    assert value(after, "spool_share_records_acquired_total", **group) == 0
