"""The metrics registry (broker.metrics): counting, the snapshot it exposes, /health.

No sockets: counters are driven directly or through the share-partition manager with
an in-memory share coordinator and a ManualClock; the endpoint's responses are built
by calling them, with the event loop they wait on running in the test.
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from broker.metrics import (
    MAX_VERSIONS_PER_API,
    OTHER_VERSION,
    SERVING,
    SHARE_FETCH,
    STARTING,
    STOPPING,
    BrokerMetrics,
    Histogram,
    MetricsServer,
    ShareMetrics,
    SharePartitionStats,
    collect,
)
from broker.share.manager import EXPIRY_RETRY_BACKOFF_MS
from coordinator.share_state import ShareStateKey
from protocol import api
from protocol.errors import ErrorCode
from protocol.records import NewRecord, build_batch
from tests.unit.test_share_manager import (
    ACCEPT,
    KEY,
    RELEASE,
    STORAGE,
    SyncingLog,
    fetch,
    manager,
)

REJECT = 3
T = ShareStateKey("g", uuid.uuid4(), 0)


class FakeTimer:
    """Monotonic seconds that move only when told to."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def samples(families: list[Any]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, sorted labels) -> value, as a scraper would read the exposition."""
    registry = CollectorRegistry(auto_describe=False)

    class Snapshot:
        def collect(self) -> Any:
            return iter(families)

    registry.register(Snapshot())  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def bare_broker(metrics: BrokerMetrics) -> Any:
    """What `collect` needs of a broker that has not opened its stores yet."""
    return SimpleNamespace(metrics=metrics, server=None, node_id=1, cluster_id="c")


# -- counting ---------------------------------------------------------------------------


def test_histogram_puts_a_value_equal_to_a_bound_in_that_bucket_and_exports_cumulative() -> None:
    h = Histogram((1, 5))
    h.observe(1)
    h.observe(3, n=2)
    h.observe(9)
    assert h.counts == [1, 2, 1]
    assert (h.count, h.sum) == (4, 1 + 6 + 9)
    assert h.cumulative() == [("1.0", 1), ("5.0", 3), ("+Inf", 4)]


def test_request_is_counted_by_version_and_timed_in_milliseconds() -> None:
    timer = FakeTimer()
    m = BrokerMetrics(timer=timer)
    started = m.timer()
    timer.now += 0.003  # 3 ms
    m.request_done(SHARE_FETCH, 1, started)
    m.request_done(SHARE_FETCH, 1, m.timer())
    stats = m.requests[SHARE_FETCH]
    assert (stats.name, stats.by_version) == ("ShareFetch", {1: 2})
    assert stats.total_time_ms.count == 2
    assert abs(stats.total_time_ms.sum - 3.0) < 1e-6
    got = samples(collect(bare_broker(m)))
    assert (
        got[
            (
                "kafka_network_requestmetrics_requests_total",
                (("request", "ShareFetch"), ("version", "1")),
            )
        ]
        == 2
    )
    bucket = (
        "kafka_network_requestmetrics_totaltimems_bucket",
        (("le", "2.5"), ("request", "ShareFetch")),
    )
    assert got[bucket] == 1  # the 0 ms one; the 3 ms one is above 2.5


def test_made_up_api_versions_share_one_series() -> None:
    m = BrokerMetrics(timer=FakeTimer())
    for version in range(MAX_VERSIONS_PER_API + 10):
        m.request_done(0, version, m.timer())
    by_version = m.requests[0].by_version
    assert len(by_version) == MAX_VERSIONS_PER_API + 1
    assert by_version[OTHER_VERSION] == 10


def _produce_request(*partitions: bytes | None) -> Any:
    return SimpleNamespace(
        topic_data=[
            SimpleNamespace(partition_data=[SimpleNamespace(records=r) for r in partitions])
        ]
    )


def test_produce_counts_appended_bytes_and_records_in_and_failed_partitions_rejected() -> None:
    m = BrokerMetrics()
    ok = build_batch([NewRecord(None, b"a"), NewRecord(None, b"bb"), NewRecord(None, b"c")])
    bad = build_batch([NewRecord(None, b"x")])
    # The handler's answer as it builds it: a kio response entity.
    result = api.build_response(
        0,
        13,
        {
            "responses": [
                {
                    "topic_id": uuid.uuid4(),
                    "partition_responses": [
                        {"index": 0, "error_code": ErrorCode.none},
                        {"index": 1, "error_code": ErrorCode.kafka_storage_error},
                    ],
                }
            ]
        },
    )
    m.payload(0, _produce_request(ok, bad), result)
    assert (m.bytes_in, m.messages_in, m.bytes_rejected) == (len(ok), 3, len(bad))
    # acks=0 has no response: what was sent counts as in.
    m.payload(0, _produce_request(ok), None)
    assert (m.bytes_in, m.messages_in) == (2 * len(ok), 6)
    # acks=0 with bytes that are no record batch (the fuzzer sent magic 9): counted as
    # bytes, no records, and counting never raises.
    junk = bytearray(ok)
    junk[16] = 9  # the magic byte
    m.payload(0, _produce_request(bytes(junk)), None)
    assert (m.bytes_in, m.messages_in) == (3 * len(ok), 6)


def test_fetch_counts_the_record_bytes_it_sends_out() -> None:
    m = BrokerMetrics()
    partition = {"error_code": ErrorCode.none, "high_watermark": 9}
    for version, topic in ((12, {"topic": "t"}), (18, {"topic_id": uuid.uuid4()})):
        result = api.build_response(
            1,
            version,
            {
                "responses": [
                    {
                        **topic,
                        "partitions": [
                            {**partition, "partition_index": 0, "records": b"x" * 5},
                            {**partition, "partition_index": 1, "records": None},
                        ],
                    }
                ]
            },
        )
        m.payload(1, None, result)
    assert m.bytes_out == 10


def test_share_requests_count_bytes_out_and_a_partition_error_as_a_failed_request() -> None:
    m = BrokerMetrics()
    part = {"error_code": ErrorCode.none, "acknowledge_error_code": 0, "partition_index": 0}
    topic_id = uuid.uuid4()

    def fetched(**data: Any) -> Any:
        return api.build_response(78, 2, data)

    good = fetched(
        responses=[{"topic_id": topic_id, "partitions": [{**part, "records": b"x" * 7}]}]
    )
    failed_ack = fetched(
        responses=[
            {
                "topic_id": topic_id,
                "partitions": [
                    {**part, "acknowledge_error_code": ErrorCode.invalid_record_state.value}
                ],
            }
        ]
    )
    m.payload(SHARE_FETCH, None, good)
    m.payload(SHARE_FETCH, None, failed_ack)
    acked = {"topic_id": topic_id, "partitions": [{"partition_index": 0, "error_code": 0}]}
    m.payload(79, None, api.build_response(79, 2, {"responses": [acked]}))
    m.payload(79, None, api.build_response(79, 2, {"error_code": ErrorCode.invalid_request}))
    assert (m.bytes_out, m.share_fetch_requests, m.share_fetch_failed) == (7, 2, 1)
    assert (m.share_ack_requests, m.share_ack_failed) == (2, 1)


def test_acknowledgements_are_counted_per_type_and_a_release_at_the_limit_is_archived() -> None:
    share = ShareMetrics()
    # 0-4 accepted; 5-9 per offset: release, release, reject, accept, accept.
    share.acknowledged(
        T, [(0, 4, (ACCEPT,)), (5, 9, (RELEASE, RELEASE, REJECT, ACCEPT, ACCEPT))], 1
    )
    s = share.partition(T)
    assert s.acknowledged == [0, 7, 2, 1, 0]
    # Two released, one of them became available: the other was at the delivery limit.
    assert (s.released_acknowledged, s.archived_delivery_limit) == (1, 1)


def test_acquisitions_record_each_records_delivery_count() -> None:
    share = ShareMetrics()
    share.acquired(T, [(0, 9, 1), (10, 11, 3)])
    s = share.partition(T)
    assert s.acquired == 12
    assert s.delivery_counts.counts[:4] == [10, 0, 2, 0]


# -- the share-partition manager counts what it hands out, and only changes it wrote ---------


async def test_manager_counts_acquired_records_handed_out_and_accepted_ones_written() -> None:
    mgr, persister, _ = manager()
    await fetch(mgr)
    assert persister.writes == 1  # the start offset: the acquisition is counted unwritten
    assert await mgr.acknowledge(KEY, "m", [(0, 5, (ACCEPT,))]) == (ErrorCode.none, None)
    s = mgr.metrics.partition(KEY)
    assert (s.acquired, s.acknowledged[ACCEPT]) == (10, 6)
    mgr.stop()


async def fetch_while_log_syncs() -> tuple[Any, SyncingLog, SharePartitionStats, asyncio.Task[Any]]:
    """A fetch that has acquired offsets 0-9 in memory and waits for their log's fsync."""
    log = SyncingLog()
    mgr, _, _ = manager(log)
    fetching = asyncio.create_task(fetch(mgr))
    for _ in range(20):
        await asyncio.sleep(0)
    assert mgr.partitions[KEY].acquired_count == 10
    return mgr, log, mgr.metrics.partition(KEY), fetching


async def test_records_are_counted_acquired_when_handed_out_not_when_their_log_sync_fails() -> None:
    mgr, log, s, fetching = await fetch_while_log_syncs()
    assert (s.acquired, s.delivery_counts.counts[:2]) == (0, [0, 0])  # not handed out yet
    log.failed()
    assert (await asyncio.wait_for(fetching, 5)).error_code == ErrorCode.kafka_storage_error
    assert (s.acquired, s.delivery_counts.counts[:2]) == (0, [0, 0])
    mgr.stop()

    mgr, log, s, fetching = await fetch_while_log_syncs()
    log.synced()
    assert [tuple(r) for r in (await asyncio.wait_for(fetching, 5)).acquired] == [(0, 9, 1)]
    assert (s.acquired, s.delivery_counts.counts[:2]) == (10, [10, 0])
    mgr.stop()


async def test_manager_counts_nothing_for_a_write_that_failed() -> None:
    mgr, persister, clock = manager()
    persister.fail_next(STORAGE, after_successes=1)  # the initialization succeeds
    # A plain fetch writes nothing, so the queued failure does not touch it: counted.
    assert [tuple(r) for r in (await fetch(mgr)).acquired] == [(0, 9, 1)]
    s = mgr.metrics.partition(KEY)
    assert (s.acquired, s.delivery_counts.counts[:3]) == (10, [10, 0, 0])  # delivery 1
    assert persister.failures[KEY] == [STORAGE]
    # The acknowledgement meets it: not counted.
    code, _ = await mgr.acknowledge(KEY, "m", [(0, 9, (ACCEPT,))])
    assert code == ErrorCode.coordinator_not_available
    assert (s.acquired, s.acknowledged[ACCEPT]) == (10, 0)
    # A fetch carrying acknowledgements whose write fails: neither the released records
    # nor their re-acquisition is counted.
    persister.fail_next(STORAGE)
    acked, got = await mgr.acknowledge_and_acquire(
        {KEY: [(0, 9, (RELEASE,))]}, [KEY], "m", max_records=100, batch_size=100, max_bytes=1 << 20
    )
    assert (acked[KEY][0], got[KEY].error_code) == (ErrorCode.coordinator_not_available,) * 2
    assert (s.acquired, s.acknowledged[RELEASE], s.released_acknowledged) == (10, 0, 0)
    assert s.delivery_counts.counts[:3] == [10, 0, 0]  # no delivery 2
    # A lock expiry whose release fails: no timeout counted until the retry is written.
    persister.fail_next(STORAGE)
    clock.advance(30_000)  # share.record.lock.duration.ms
    await mgr.settle()
    assert (s.lock_timeouts, s.released_lock_timeout) == (0, 0)
    assert mgr.partitions[KEY].acquired_count == 10
    clock.advance(EXPIRY_RETRY_BACKOFF_MS)
    await mgr.settle()
    assert (s.lock_timeouts, s.released_lock_timeout) == (10, 10)
    assert persister.failures[KEY] == []
    mgr.stop()


async def test_lock_expiry_counts_timeouts_and_redelivery_shows_in_the_delivery_counts() -> None:
    mgr, _, clock = manager(delivery_count_limit=2)
    await fetch(mgr)
    clock.advance(30_000)  # share.record.lock.duration.ms
    await mgr.settle()
    s = mgr.metrics.partition(KEY)
    assert (s.lock_timeouts, s.released_lock_timeout, s.archived_delivery_limit) == (10, 10, 0)
    await fetch(mgr)  # delivery 2 of 2
    clock.advance(30_000)
    await mgr.settle()
    assert (s.lock_timeouts, s.released_lock_timeout, s.archived_delivery_limit) == (20, 10, 10)
    assert s.delivery_counts.counts[:3] == [10, 10, 0]
    mgr.stop()


async def test_member_release_counts_records_made_available() -> None:
    mgr, _, _ = manager()
    await fetch(mgr)
    assert await mgr.release_member("g", "m") == 10
    assert mgr.metrics.partition(KEY).released_member == 10
    mgr.stop()


# -- /health ------------------------------------------------------------------------------


def _health_server(state: str) -> MetricsServer:
    m = BrokerMetrics()
    m.state = state
    server = MetricsServer("127.0.0.1", 0, bare_broker(m))
    server.loop = asyncio.get_running_loop()
    return server


async def test_health_is_503_with_a_reason_while_starting_and_stopping() -> None:
    for state in (STARTING, STOPPING):
        status, ctype, body = await asyncio.to_thread(_health_server(state).health_response)
        assert (status, ctype) == (503, "application/json")
        doc = json.loads(body)
        assert doc["status"] == state
        assert doc["reason"]


async def test_health_is_200_when_serving_and_the_loop_answers() -> None:
    status, _, body = await asyncio.to_thread(_health_server(SERVING).health_response)
    assert status == 200
    assert json.loads(body) == {"status": "serving", "node_id": 1, "cluster_id": "c"}


async def test_health_is_503_when_the_event_loop_does_not_answer() -> None:
    server = _health_server(SERVING)
    server.loop_timeout_s = 0.05
    answered = threading.Event()
    result: list[tuple[int, str, bytes]] = []

    def probe() -> None:
        result.append(server.health_response())
        answered.set()

    thread = threading.Thread(target=probe)
    thread.start()
    # Hold the loop (as a synchronous step would) until the probe has given up.
    assert answered.wait(10)
    thread.join()
    status, _, body = result[0]
    assert status == 503
    assert json.loads(body)["status"] == "unresponsive"


async def test_metrics_response_is_the_snapshot_taken_on_the_loop() -> None:
    m = BrokerMetrics()
    m.bytes_in = 42
    server = MetricsServer("127.0.0.1", 0, bare_broker(m))
    server.loop = asyncio.get_running_loop()
    status, ctype, body = await asyncio.to_thread(server.metrics_response)
    assert status == 200
    assert ctype.startswith("text/plain")
    assert "kafka_server_brokertopicmetrics_bytesin_total 42.0" in body.decode()


def test_metrics_response_is_503_when_no_loop_runs() -> None:
    server = MetricsServer("127.0.0.1", 0, bare_broker(BrokerMetrics()))
    loop = asyncio.new_event_loop()
    loop.close()
    server.loop = loop
    status, _, _ = server.metrics_response()
    assert status == 503


async def test_metrics_response_is_500_when_a_collector_fails() -> None:
    broken = bare_broker(BrokerMetrics())
    broken.metrics.requests = None  # a bug: collect() raises
    server = MetricsServer("127.0.0.1", 0, broken)
    server.loop = asyncio.get_running_loop()
    status, _, body = await asyncio.to_thread(server.metrics_response)
    assert status == 500
    assert b"see the log" in body
