"""No client can exhaust the broker: idle and slowloris connections are closed, half-sent
frames stop being read at `queued.max.request.bytes`, oversized frames and connections
over `max.connections(.per.ip)` are closed, and running out of file descriptors refuses
new topics and connections while existing clients keep being served.

Raw sockets play the misbehaving clients; confluent-kafka clients the well-behaved ones.
Every wait is a bounded poll.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from protocol import api
from tests.integration.conftest import (
    Broker,
    admin_config,
    assert_round_trip,
    consumer_config,
    create_topic,
    produce,
    producer_config,
)

IO_TIMEOUT_S = 10.0
API_FETCH = 1
API_VERSIONS = 18
MAX_IDLE_MS = 1000


# -- raw connections -----------------------------------------------------------------------


def connect(broker: Broker) -> socket.socket:
    return socket.create_connection((broker.host, broker.port), timeout=IO_TIMEOUT_S)


def request_frame(
    api_key: int, version: int, correlation_id: int, body: dict[str, object]
) -> bytes:
    entity = api.build(api.request_class(api_key, version), body)
    return api.encode_request(api_key, version, correlation_id, "spool-limits-test", entity)


def read_frame(sock: socket.socket, timeout: float = IO_TIMEOUT_S) -> bytes | None:
    """The next response frame, or None if the broker closed the connection.

    Raises TimeoutError if neither happens within `timeout`.
    """
    sock.settimeout(timeout)
    try:
        head = _read_exactly(sock, 4)
        if head is None:
            return None
        (size,) = struct.unpack(">i", head)
        return _read_exactly(sock, size)
    except ConnectionResetError:
        return None


def _read_exactly(sock: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def ask_api_versions(sock: socket.socket, correlation_id: int) -> None:
    """One ApiVersions round trip; fails if the connection was closed."""
    sock.sendall(request_frame(API_VERSIONS, 0, correlation_id, {}))
    frame = read_frame(sock)
    assert frame is not None, "connection closed"
    assert struct.unpack_from(">i", frame)[0] == correlation_id


def is_closed(sock: socket.socket) -> bool:
    """Whether the broker has closed `sock` (nothing is expected on it but EOF)."""
    # select, not MSG_DONTWAIT: a socket with a timeout waits that long before recv.
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        data = sock.recv(1)
    except ConnectionResetError:
        return True
    assert data == b"", f"unexpected bytes {data!r}"
    return True


def wait_closed(sock: socket.socket, timeout: float) -> float | None:
    """Seconds until the broker closed `sock`, or None if it stayed open `timeout`."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if is_closed(sock):
            return time.monotonic() - started
        time.sleep(0.05)
    return None


def served_connection(broker: Broker, timeout: float = IO_TIMEOUT_S) -> socket.socket:
    """A connection that answered ApiVersions, retrying while closes still settle."""
    deadline = time.monotonic() + timeout
    while True:
        sock = connect(broker)
        try:
            ask_api_versions(sock, 1)
            return sock
        except (AssertionError, OSError):
            sock.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


# -- idle connections ------------------------------------------------------------------------


def test_idle_and_slowloris_connections_are_closed_while_an_active_one_stays_open(
    broker_factory: Callable[..., Broker],
) -> None:
    broker = broker_factory({"connections.max.idle.ms": str(MAX_IDLE_MS)})
    active = served_connection(broker)
    idle = connect(broker)
    slow = connect(broker)
    started = time.monotonic()
    # A 100-byte frame trickled a byte every 200 ms: it would take 20 s to complete.
    slow.sendall(struct.pack(">i", 100) + b"\x00")
    closed_at: dict[str, float] = {}
    correlation_id = 1
    deadline = started + 15
    # Keep going until both are closed and the active connection has lived 3 limits.
    while time.monotonic() < deadline and (
        len(closed_at) < 2 or time.monotonic() - started < 3 * MAX_IDLE_MS / 1000
    ):
        correlation_id += 1
        ask_api_versions(active, correlation_id)
        if "slowloris" not in closed_at:
            with contextlib.suppress(OSError):
                slow.send(b"\x00")
        for name, sock in (("idle", idle), ("slowloris", slow)):
            if name not in closed_at and is_closed(sock):
                closed_at[name] = time.monotonic() - started
        time.sleep(0.2)
    assert set(closed_at) == {"idle", "slowloris"}, closed_at
    # Closed by the idle limit: not before it, and not long after.
    assert all(0.9 <= t <= 5.0 for t in closed_at.values()), closed_at
    assert time.monotonic() - started >= 3 * MAX_IDLE_MS / 1000
    ask_api_versions(active, correlation_id + 1)
    for sock in (active, idle, slow):
        sock.close()


def test_parked_long_poll_is_not_idle_and_idle_time_runs_from_its_response(
    broker_factory: Callable[..., Broker],
) -> None:
    broker = broker_factory({"connections.max.idle.ms": str(MAX_IDLE_MS)})
    create_topic(broker, "parked")
    max_wait_ms = 2500
    fetch = request_frame(
        API_FETCH,
        4,
        7,
        {
            "replica_id": -1,
            "max_wait": max_wait_ms,
            "min_bytes": 1,
            "max_bytes": 1 << 20,
            "topics": [
                {
                    "topic": "parked",
                    "partitions": [
                        {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}
                    ],
                }
            ],
        },
    )
    with served_connection(broker) as sock:
        sent = time.monotonic()
        sock.sendall(fetch)
        frame = read_frame(sock, timeout=max_wait_ms / 1000 + IO_TIMEOUT_S)
        answered = time.monotonic()
        assert frame is not None, "closed while the fetch was parked"
        assert struct.unpack_from(">i", frame)[0] == 7
        # Parked for longer than the idle limit, and still answered.
        assert answered - sent >= 2.0
        closed_after = wait_closed(sock, timeout=5 * MAX_IDLE_MS / 1000)
        assert closed_after is not None, "never closed once idle"
        assert closed_after >= 0.8, "closed before the idle limit passed after the response"


# -- request size and queued bytes ---------------------------------------------------------


def test_size_prefix_over_socket_request_max_bytes_closes_before_the_body_is_sent(
    broker_factory: Callable[..., Broker],
) -> None:
    broker = broker_factory({"socket.request.max.bytes": str(1 << 20)})
    with connect(broker) as sock:
        sock.sendall(struct.pack(">i", (1 << 20) + 1))
        started = time.monotonic()
        assert read_frame(sock, timeout=5) is None, "expected the connection to be closed"
        assert time.monotonic() - started < 2
    with served_connection(broker):
        pass


HOGS = 40
HOG_BYTES = 4 << 20  # sent of each claimed frame, which never completes
CLAIMED_FRAME = 50_000_000
QUEUED_MAX = 50 << 20  # queued.max.request.bytes, and socket.request.max.bytes
# What the broker may hold beyond the budget: per connection, its stream buffer and
# one socket read (a few hundred KiB), plus allocator slack.
PER_CONNECTION_SLACK = 1 << 20
OTHER_SLACK = 16 << 20


def push_half_frames(hogs: list[socket.socket], pid: int) -> tuple[int, int]:
    """Send each hog's claimed-frame prefix and up to HOG_BYTES of body, without blocking,
    until all is sent or nothing moved for 2 s; returns (bytes sent, peak broker RSS)."""
    for sock in hogs:
        sock.sendall(struct.pack(">i", CLAIMED_FRAME))
        sock.setblocking(False)
    chunk = b"\x00" * (256 << 10)
    sent = [0] * len(hogs)
    peak = rss_bytes(pid)
    deadline = time.monotonic() + 60
    last_progress = time.monotonic()
    while min(sent) < HOG_BYTES and time.monotonic() - last_progress < 2.0:
        assert time.monotonic() < deadline, f"hogs still sending after 60 s: {sum(sent)} bytes"
        for i, sock in enumerate(hogs):
            if sent[i] >= HOG_BYTES:
                continue
            try:
                sent[i] += sock.send(chunk[: HOG_BYTES - sent[i]])
                last_progress = time.monotonic()
            except BlockingIOError:
                pass
        peak = max(peak, rss_bytes(pid))
        time.sleep(0.01)
    # Let the broker read whatever the kernel still holds for it.
    settle = time.monotonic() + 2
    while time.monotonic() < settle:
        peak = max(peak, rss_bytes(pid))
        time.sleep(0.1)
    return sum(sent), peak


def test_half_sent_frames_stop_being_read_once_queued_max_request_bytes_is_reserved(
    broker_factory: Callable[..., Broker],
) -> None:
    broker = broker_factory(
        {"socket.request.max.bytes": str(QUEUED_MAX), "queued.max.request.bytes": str(QUEUED_MAX)}
    )
    assert broker.process is not None
    pid = broker.process.pid
    assert_round_trip(broker, "before-hogs", count=10)
    baseline = rss_bytes(pid)
    hogs = [connect(broker) for _ in range(HOGS)]
    probe = served_connection(broker)
    try:
        sent, peak = push_half_frames(hogs, pid)
        bound = QUEUED_MAX + HOGS * PER_CONNECTION_SLACK + OTHER_SLACK
        print(
            f"\nRSS baseline {baseline / 2**20:.1f} MiB, peak {peak / 2**20:.1f} MiB "
            f"(+{(peak - baseline) / 2**20:.1f} MiB) with {sent / 2**20:.1f} MiB of half-sent "
            f"frames pushed by {HOGS} connections; bound +{bound / 2**20:.0f} MiB"
        )
        assert peak - baseline < bound
        # Reading is paused: even a small request waits for the budget.
        probe.sendall(request_frame(API_VERSIONS, 0, 2, {}))
        with pytest.raises(TimeoutError):
            read_frame(probe, timeout=1.0)
    finally:
        for sock in hogs:
            sock.close()
    # The hogs are gone: their bytes are released and the waiting request is answered.
    frame = read_frame(probe, timeout=IO_TIMEOUT_S)
    assert frame is not None and struct.unpack_from(">i", frame)[0] == 2
    probe.close()
    assert_round_trip(broker, "after-hogs", count=10)


# -- connection counts ---------------------------------------------------------------------


@pytest.mark.parametrize("key", ["max.connections", "max.connections.per.ip"])
def test_connection_over_the_limit_is_closed_and_earlier_ones_still_work(
    broker_factory: Callable[..., Broker], key: str
) -> None:
    broker = broker_factory({key: "3"})
    conns = [served_connection(broker) for _ in range(3)]
    with connect(broker) as extra:
        # Closed without a byte sent.
        assert read_frame(extra, timeout=5) is None
    for i, sock in enumerate(conns):
        ask_api_versions(sock, 10 + i)
    conns.pop().close()
    # Once the broker has seen that close, a new connection gets the free slot.
    conns.append(served_connection(broker))
    for sock in conns:
        sock.close()


# -- file descriptors ------------------------------------------------------------------------

OPEN_FILE_LIMIT = 300


def test_running_out_of_descriptors_refuses_topics_and_connections_not_existing_clients(
    broker_factory: Callable[..., Broker],
) -> None:
    broker = broker_factory(open_file_limit=OPEN_FILE_LIMIT)
    create_topic(broker, "live")
    producer = Producer(producer_config(broker))
    consumer = Consumer(consumer_config(broker))
    admin = AdminClient(admin_config(broker))
    try:
        consumer.assign([TopicPartition("live", 0, OFFSET_BEGINNING)])
        consumed: list[bytes] = []

        def produce_and_consume(tag: str) -> None:
            values = [f"{tag}-{i}".encode() for i in range(10)]
            outcome = produce(producer, "live", [(0, None, v, []) for v in values], 30)
            assert outcome.errors == [] and outcome.unflushed == 0, outcome.errors
            deadline = time.monotonic() + 30
            while not set(values) <= set(consumed):
                assert time.monotonic() < deadline, f"consumed {len(consumed)} of {tag}"
                for msg in consumer.consume(num_messages=100, timeout=0.5):
                    if msg.error() is None:
                        consumed.append(msg.value())
                    else:
                        assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()

        produce_and_consume("before")

        # Topics of 10 partitions until the broker refuses one.
        created: list[str] = []
        refusal: KafkaError | None = None
        for i in range(OPEN_FILE_LIMIT // 10):
            name = f"filler-{i}"
            future = admin.create_topics([NewTopic(name, 10, 1)], request_timeout=30)[name]
            try:
                future.result(timeout=30)
            except KafkaException as exc:
                refusal = exc.args[0]
                break
            created.append(name)
        assert created, "not even one topic fitted"
        assert refusal is not None, f"{len(created)} topics created, none refused"
        assert refusal.code() == KafkaError.KAFKA_STORAGE_ERROR, refusal
        assert "too many open files" in refusal.str()
        assert f"limit {OPEN_FILE_LIMIT}" in refusal.str()
        assert f"filler-{len(created)}" not in admin.list_topics(timeout=10).topics

        # More sockets than descriptors: each is served or closed at once, none hangs.
        socks: list[socket.socket] = []
        served = refused = 0
        try:
            for _ in range(OPEN_FILE_LIMIT):
                sock = connect(broker)
                socks.append(sock)
                sock.sendall(request_frame(API_VERSIONS, 0, 1, {}))
                try:
                    if read_frame(sock, timeout=5) is None:
                        refused += 1
                    else:
                        served += 1
                except TimeoutError:
                    raise AssertionError(
                        f"connection hung after {served} served, {refused} refused"
                    ) from None
            assert refused > 0 and served > 0, (served, refused)
            # Existing clients are still served with every descriptor taken.
            produce_and_consume("exhausted")
        finally:
            for sock in socks:
                sock.close()

        deleted = admin.delete_topics(created, request_timeout=30)
        for future in deleted.values():
            future.result(timeout=30)
        produce_and_consume("after")
    finally:
        consumer.close()
        producer.flush(10)
    # Room again: topics can be created, by a new client too.
    assert_round_trip(broker, "room-again", count=10)
