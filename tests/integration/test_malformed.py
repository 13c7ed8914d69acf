"""Bad bytes on the wire: each is answered or its connection closed, and the broker
keeps serving other clients with nothing stored changed.

Frames are built by hand with `struct` for the broken parts and kio's entity writers
for the valid ones.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import hashlib
import importlib
import io
import random
import socket
import struct
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import crc32c
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from kio.records.schema import NewRecordBatch, Record
from kio.records.writers import write_new_batch
from kio.schema.api_versions.v0.request import ApiVersionsRequest as ApiVersionsRequestV0
from kio.schema.api_versions.v0.response import ApiVersionsResponse as ApiVersionsResponseV0
from kio.schema.api_versions.v3.request import ApiVersionsRequest as ApiVersionsRequestV3
from kio.schema.api_versions.v3.response import ApiVersionsResponse as ApiVersionsResponseV3
from kio.schema.errors import ErrorCode
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.schema.types import TopicName
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i8, i16, i32, i64

from protocol import api
from tests.fuzz import frames as fuzz_frames
from tests.integration.conftest import (
    Broker,
    admin_config,
    assert_round_trip,
    consumer_config,
    create_topic,
    produce,
    producer_config,
    watermarks,
)

IO_TIMEOUT_S = 10.0
API_PRODUCE = 0
API_METADATA = 3
API_INIT_PRODUCER_ID = 22
API_VERSIONS = 18
CRC_OFFSET = 17  # base_offset(8) + batch_length(4) + leader_epoch(4) + magic(1)


class Closed(Exception):
    """The broker closed the connection."""


class RawConnection:
    """A blocking socket speaking just enough Kafka framing to misbehave on purpose."""

    def __init__(self, broker: Broker) -> None:
        self.sock = socket.create_connection((broker.host, broker.port), timeout=IO_TIMEOUT_S)
        self.sock.settimeout(IO_TIMEOUT_S)
        self.correlation_id = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_frame(self, payload: bytes) -> None:
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)

    def header_bytes(self, api_key: int, version: int, flexible: bool) -> bytes:
        self.correlation_id += 1
        buf = io.BytesIO()
        fields = {
            "request_api_key": i16(api_key),
            "request_api_version": i16(version),
            "correlation_id": i32(self.correlation_id),
            "client_id": "spool-malformed-test",
        }
        if flexible:
            entity_writer(RequestHeaderV2)(buf, RequestHeaderV2(**fields))
        else:
            entity_writer(RequestHeaderV1)(buf, RequestHeaderV1(**fields))
        return buf.getvalue()

    def send_request(self, request: Any, version: int | None = None) -> int:
        """Send a kio request entity (optionally claiming another version); return its id."""
        api_key = int(request.__api_key__)
        header = self.header_bytes(
            api_key,
            int(request.__version__) if version is None else version,
            request.__header_schema__ is RequestHeaderV2,
        )
        body = io.BytesIO()
        entity_writer(type(request))(body, request)
        self.send_frame(header + body.getvalue())
        return self.correlation_id

    def _recv_exact(self, n: int) -> bytes:
        chunks = []
        while n:
            try:
                chunk = self.sock.recv(n)
            except ConnectionResetError:
                raise Closed from None
            if not chunk:
                raise Closed
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def recv_frame(self) -> bytes:
        """The next response frame; Closed if the broker closes the connection first.

        A socket timeout (neither answer nor close) propagates and fails the test.
        """
        (size,) = struct.unpack(">i", self._recv_exact(4))
        assert 0 <= size < 64 * 1024 * 1024, f"absurd response size {size}"
        return self._recv_exact(size)

    def answer_or_close(self) -> bytes | None:
        """The response frame, or None if the broker closed the connection."""
        try:
            return self.recv_frame()
        except Closed:
            return None

    def response(self, response_type: Any, correlation_id: int) -> Any:
        """Read one frame and decode it as `response_type` (kio entity)."""
        frame = self.recv_frame()
        header, size = entity_reader(response_type.__header_schema__)(frame, 0)
        assert header.correlation_id == correlation_id
        body, body_size = entity_reader(response_type)(frame, size)
        assert size + body_size == len(frame), "trailing bytes in response"
        return body


def api_versions(conn: RawConnection) -> dict[int, tuple[int, int]]:
    cid = conn.send_request(ApiVersionsRequestV0())
    resp = conn.response(ApiVersionsResponseV0, cid)
    assert resp.error_code == ErrorCode.none
    return {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in resp.api_keys}


def assert_still_serving(broker: Broker, topic: str) -> None:
    assert broker.running, "broker process died"
    assert_round_trip(broker, topic)


def test_truncated_frame_then_close_leaves_broker_serving(broker: Broker) -> None:
    cases = [
        b"\x00\x00",  # half a size prefix
        struct.pack(">i", 100) + b"\x00" * 10,  # size says 100, 10 bytes arrive
        struct.pack(">i", 40) + struct.pack(">hhi", API_VERSIONS, 0, 7),  # header cut short
    ]
    for data in cases:
        with RawConnection(broker) as conn:
            conn.send_raw(data)
    # A connection that sends a partial frame and waits must not block others either.
    with RawConnection(broker) as stalled:
        stalled.send_raw(struct.pack(">i", 100) + b"\x00" * 10)
        assert_still_serving(broker, "after-truncated")


@pytest.mark.parametrize(
    ("api_key", "version", "flexible"),
    [(API_METADATA, 12, True), (API_PRODUCE, 9, True), (API_METADATA, 4, False)],
)
def test_garbage_after_valid_header_is_answered_or_closed(
    broker: Broker, api_key: int, version: int, flexible: bool
) -> None:
    with RawConnection(broker) as conn:
        header = conn.header_bytes(api_key, version, flexible)
        conn.send_frame(header + b"\xff" * 64)
        frame = conn.answer_or_close()
        if frame is not None:
            (cid,) = struct.unpack_from(">i", frame)
            assert cid == conn.correlation_id
            # Answered rather than closed: the connection must go on working.
            assert API_VERSIONS in api_versions(conn)
    assert_still_serving(broker, "after-garbage")


def test_unknown_api_key_is_answered_or_closed(broker: Broker) -> None:
    with RawConnection(broker) as conn:
        conn.send_frame(conn.header_bytes(9999, 0, flexible=False))
        frame = conn.answer_or_close()
        if frame is not None:
            (cid,) = struct.unpack_from(">i", frame)
            assert cid == conn.correlation_id
            # Answered rather than closed: the connection must go on working.
            assert API_VERSIONS in api_versions(conn)
    assert_still_serving(broker, "after-unknown-api")


def test_version_without_a_schema_closes_the_connection_only(broker: Broker) -> None:
    """Metadata v99 has no schema to read the body by or to answer in: Kafka closes the
    connection (its request parser refuses the version); a bare error code would be a
    reply no client can parse."""
    with RawConnection(broker) as conn:
        conn.send_frame(conn.header_bytes(API_METADATA, 99, flexible=True))
        assert conn.answer_or_close() is None, "a v99 request was answered"
    assert_still_serving(broker, "after-metadata-v99")


def test_version_the_broker_does_not_serve_gets_unsupported_version(broker: Broker) -> None:
    """InitProducerId v6 has a schema but is not advertised (unstable in Kafka 4.2): the
    client gets UNSUPPORTED_VERSION in that version's response and the connection goes on."""
    with RawConnection(broker) as conn:
        assert api_versions(conn)[API_INIT_PRODUCER_ID][1] < 6
        request = api.build(
            api.request_class(API_INIT_PRODUCER_ID, 6),
            {"transactional_id": None, "transaction_timeout": 60_000},
        )
        cid = conn.send_request(request, version=6)
        response = conn.response(api.response_class(API_INIT_PRODUCER_ID, 6), cid)
        assert response.error_code == ErrorCode.unsupported_version
        assert API_VERSIONS in api_versions(conn)
    assert_still_serving(broker, "after-unsupported-version")


def test_api_versions_with_unsupported_version_answers_v0_with_api_list(broker: Broker) -> None:
    with RawConnection(broker) as conn:
        # Like a newer client: header v2 and a v3-shaped body, claiming version 99.
        request = ApiVersionsRequestV3(
            client_software_name="spool-test", client_software_version="0.0.1"
        )
        cid = conn.send_request(request, version=99)
        frame = conn.recv_frame()
        header, size = entity_reader(ResponseHeaderV0)(frame, 0)
        assert header.correlation_id == cid
        body, body_size = entity_reader(ApiVersionsResponseV0)(frame, size)
        assert size + body_size == len(frame), "response is not ApiVersions v0"
        assert body.error_code == ErrorCode.unsupported_version
        ranges = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in body.api_keys}
        assert API_VERSIONS in ranges and ranges[API_VERSIONS][1] >= 3
        assert API_PRODUCE in ranges and API_METADATA in ranges
        assert all(lo <= hi for lo, hi in ranges.values())

        # The client then retries with a version the broker listed, on the same connection.
        cid = conn.send_request(request)
        resp = conn.response(ApiVersionsResponseV3, cid)
        assert resp.error_code == ErrorCode.none
        assert {int(k.api_key) for k in resp.api_keys} == set(ranges)
    assert_still_serving(broker, "after-unsupported-version")


@pytest.mark.parametrize("size", [2**31 - 1, 200 * 1024 * 1024, -1])
def test_oversized_or_negative_size_prefix_closes_connection(broker: Broker, size: int) -> None:
    with RawConnection(broker) as conn:
        conn.send_raw(struct.pack(">i", size) + b"\x00" * 16)
        assert conn.answer_or_close() is None, "expected the connection to be closed"
    assert_still_serving(broker, "after-oversized")


def produce_version(conn: RawConnection) -> int:
    """The highest Produce version both the broker and kio's v3..v12 speak.

    v13 addresses topics by id; names keep these tests simple.
    """
    lo, hi = api_versions(conn)[API_PRODUCE]
    version = min(hi, 12)
    assert version >= max(lo, 3), f"broker Produce range {lo}..{hi}"
    return version


def _produce_module(version: int) -> tuple[Any, Any]:
    request = importlib.import_module(f"kio.schema.produce.v{version}.request")
    response = importlib.import_module(f"kio.schema.produce.v{version}.response")
    return request, response


def _batch(values: list[bytes]) -> bytes:
    now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    records = tuple(
        Record(
            attributes=i8(0),
            timestamp=now,
            offset=i64(i),
            key=f"k{i}".encode(),
            value=value,
            headers=(),
        )
        for i, value in enumerate(values)
    )
    buf = io.BytesIO()
    write_new_batch(
        buf,
        NewRecordBatch(
            producer_id=i64(-1),
            producer_epoch=i16(-1),
            base_sequence=i32(-1),
            attributes=i16(0),
            records=records,
        ),
    )
    return buf.getvalue()


def _produce_request(version: int, topic: str, batch: bytes, partition: int, acks: int) -> Any:
    req_mod, _ = _produce_module(version)
    return req_mod.ProduceRequest(
        acks=i16(acks),
        timeout=datetime.timedelta(seconds=10),
        topic_data=(
            req_mod.TopicProduceData(
                name=TopicName(topic),
                partition_data=(req_mod.PartitionProduceData(index=i32(partition), records=batch),),
            ),
        ),
    )


def _produce(
    conn: RawConnection, version: int, topic: str, batch: bytes, partition: int = 0
) -> Any:
    """Send one Produce (acks=all) to one partition; return that partition's response."""
    req_mod, resp_mod = _produce_module(version)
    request = req_mod.ProduceRequest(
        acks=i16(-1),
        timeout=datetime.timedelta(seconds=10),
        topic_data=(
            req_mod.TopicProduceData(
                name=TopicName(topic),
                partition_data=(req_mod.PartitionProduceData(index=i32(partition), records=batch),),
            ),
        ),
    )
    cid = conn.send_request(request)
    response = conn.response(resp_mod.ProduceResponse, cid)
    [topic_response] = response.responses
    [partition_response] = topic_response.partition_responses
    return partition_response


@pytest.mark.parametrize("corrupt", ["crc_field", "record_byte", "truncated_batch"])
def test_produce_with_corrupt_batch_is_corrupt_message_and_appends_nothing(
    broker: Broker, corrupt: str
) -> None:
    topic = "crc-check"
    create_topic(broker, topic)
    with RawConnection(broker) as conn:
        version = produce_version(conn)

        good = _batch([b"first", b"second", b"third"])
        bad = bytearray(good)
        expected = {ErrorCode.corrupt_message}
        if corrupt == "crc_field":
            bad[CRC_OFFSET] ^= 0xFF
        elif corrupt == "record_byte":
            bad[-1] ^= 0x01  # inside the last record: the CRC no longer matches
        else:
            del bad[-10:]  # batch_length now claims more bytes than are sent
            expected.add(ErrorCode.invalid_record)  # what newer Kafka may answer
        result = _produce(conn, version, topic, bytes(bad))
        assert result.error_code in expected, result
        assert watermarks(broker, topic, 0) == (0, 0)

        # Same connection, valid batch: accepted at offset 0, so nothing was appended.
        result = _produce(conn, version, topic, good)
        assert result.error_code == ErrorCode.none, result
        assert result.base_offset == 0
    assert watermarks(broker, topic, 0) == (0, 3)
    assert_still_serving(broker, "after-bad-crc")


def test_produce_errors_for_missing_partition_and_oversized_batch_append_nothing(
    broker_factory: Callable[..., Broker],
) -> None:
    broker = broker_factory({"message.max.bytes": "10000"})
    topic = "limits"
    create_topic(broker, topic)
    with RawConnection(broker) as conn:
        version = produce_version(conn)

        result = _produce(conn, version, topic, _batch([b"x" * 20_000]))
        assert result.error_code == ErrorCode.message_too_large, result

        result = _produce(conn, version, topic, _batch([b"ok"]), partition=7)
        assert result.error_code == ErrorCode.unknown_topic_or_partition, result

        result = _produce(conn, version, topic, _batch([b"ok"]))
        assert result.error_code == ErrorCode.none and result.base_offset == 0, result
    assert watermarks(broker, topic, 0) == (0, 1)
    assert_still_serving(broker, "after-limits")


def test_a_failed_produce_with_acks_0_closes_the_connection_after_earlier_answers(
    broker: Broker,
) -> None:
    """Kafka's handleProduceRequest: a producer with acks=0 waits for no answer, so an
    error closes the connection (for it to refresh its metadata); the requests before
    it are answered, none after it."""
    topic = "acks-zero"
    create_topic(broker, topic)
    with RawConnection(broker) as conn:
        version = produce_version(conn)
        # A good acks=0 produce: no answer, the connection stays open.
        conn.send_request(_produce_request(version, topic, _batch([b"ok"]), 0, acks=0))
        before = conn.send_request(ApiVersionsRequestV0())
        assert conn.response(ApiVersionsResponseV0, before).error_code == ErrorCode.none
        # Pipelined: ApiVersions, a failing acks=0 produce, ApiVersions.
        first = conn.send_request(ApiVersionsRequestV0())
        conn.send_request(_produce_request(version, topic, _batch([b"x"]), 7, acks=0))
        conn.send_request(ApiVersionsRequestV0())
        assert conn.response(ApiVersionsResponseV0, first).error_code == ErrorCode.none
        assert conn.answer_or_close() is None
    assert watermarks(broker, topic, 0) == (0, 1)
    assert_still_serving(broker, "after-acks-zero")


# --- lying lengths and broken schema rules (protocol/request_check.py) ------------------------
#
# These share one broker that holds a topic with records: after every bad frame the
# process must be up, the bad connection closed (unparseable) or answered
# (INVALID_REQUEST), a real client served, and no stored byte changed.

# Metadata v12 whose topics compact array claims 2^32-2 elements: it aborted the broker
# (kio reserved ~34 GB before reading the first element).
METADATA_V12_HUGE_TOPICS = bytes.fromhex("000000110003000c0000000100017800ffffffff0f")
STORED_TOPIC = "stored"


def data_hashes(broker: Broker) -> dict[str, str]:
    """sha256 of every file under the data dir, by relative path."""
    out = {}
    for path in sorted(broker.data_dir.rglob("*")):
        if path.is_file():
            out[str(path.relative_to(broker.data_dir))] = hashlib.sha256(
                path.read_bytes()
            ).hexdigest()
    return out


@pytest.fixture(scope="module")
def stored_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """A broker with a topic of 20 records, flushed, shared by the tests below."""
    root = tmp_path_factory.mktemp("guarded")
    broker = Broker(root / "data", root / "broker.log")
    broker.start()
    try:
        create_topic(broker, STORED_TOPIC)
        outcome = produce(
            Producer(producer_config(broker)),
            STORED_TOPIC,
            [(0, f"k{i}".encode(), f"v{i}".encode(), []) for i in range(20)],
        )
        assert outcome.errors == [] and outcome.unflushed == 0
        yield broker
    finally:
        if broker.running:
            broker.stop()


@contextlib.contextmanager
def nothing_stored_changes(broker: Broker) -> Iterator[None]:
    before = data_hashes(broker)
    yield
    assert broker.running, f"broker process died\n{broker.log_tail(40)}"
    assert data_hashes(broker) == before, "stored bytes changed"


def assert_served(broker: Broker) -> None:
    """The broker answers raw ApiVersions and a real client's metadata request."""
    assert broker.running, f"broker process died\n{broker.log_tail(40)}"
    with RawConnection(broker) as conn:
        assert API_VERSIONS in api_versions(conn)
    metadata = AdminClient(admin_config(broker)).list_topics(timeout=10)
    assert STORED_TOPIC in metadata.topics


def send_closed(broker: Broker, payload: bytes) -> None:
    """Send one frame; the broker must close the connection without answering."""
    with RawConnection(broker) as conn:
        conn.send_frame(payload)
        frame = conn.answer_or_close()
        assert frame is None, f"answered instead of closing: {frame.hex()}"


def lying_frame(api_key: int, version: int) -> tuple[bytes, str]:
    """A valid frame of this api and version with its first body length set past the
    end of the frame, and that length's field path."""
    pools = fuzz_frames.Pools(topics=[STORED_TOPIC])
    for seed in range(50):
        frame, lengths = fuzz_frames.valid_frame(random.Random(seed), pools, api_key, version, 9)
        body = [n for n in lengths if not n.path.startswith("header")]
        if body:
            target = body[0]
            huge = {"int16": 2**15 - 1, "int32": 2**31 - 1}.get(target.kind, 2**32 - 1)
            return fuzz_frames.splice_length(frame.payload, target, huge), target.path
    raise AssertionError(f"no frame of {api_key} v{version} has a length field")


def test_metadata_claiming_four_billion_topics_closes_the_connection_only(
    stored_broker: Broker,
) -> None:
    with nothing_stored_changes(stored_broker), RawConnection(stored_broker) as conn:
        conn.send_raw(METADATA_V12_HUGE_TOPICS)
        assert conn.answer_or_close() is None
    assert_served(stored_broker)


@pytest.mark.parametrize(
    ("api_key", "version"), [(k, hi) for k, _, hi in fuzz_frames.advertised_apis()]
)
def test_a_lying_length_in_each_advertised_api_closes_the_connection_only(
    stored_broker: Broker, api_key: int, version: int
) -> None:
    payload, _ = lying_frame(api_key, version)
    with nothing_stored_changes(stored_broker):
        send_closed(stored_broker, payload)
    assert_served(stored_broker)


@pytest.mark.parametrize(
    ("api_key", "version", "prefix"),
    [
        (10, 4, "00"),  # FindCoordinator: key_type, then coordinator_keys
        (20, 6, ""),  # DeleteTopics: topics
        (2, 9, "ffffffff00"),  # ListOffsets: replica_id, isolation_level, then topics
        (77, 1, ""),  # ShareGroupDescribe: group_ids
        (79, 2, "0267026d0000000000"),  # ShareAcknowledge: "g", "m", epoch, renew, topics
        (85, 1, "0267"),  # WriteShareGroupState: group_id "g", then topics
    ],
)
def test_huge_array_counts_reported_as_aborting_close_the_connection(
    stored_broker: Broker, api_key: int, version: int, prefix: str
) -> None:
    """The other APIs reported to abort the broker: a compact array of 2^32-2."""
    with RawConnection(stored_broker) as conn:
        header = conn.header_bytes(api_key, version, flexible=True)
    payload = header + bytes.fromhex(prefix + "ffffffff0f")
    with nothing_stored_changes(stored_broker):
        send_closed(stored_broker, payload)
    assert_served(stored_broker)


@pytest.mark.parametrize("what", ["client_id", "string", "bytes"])
def test_huge_string_and_bytes_lengths_close_the_connection(
    stored_broker: Broker, what: str
) -> None:
    with RawConnection(stored_broker) as conn:
        header = conn.header_bytes(API_METADATA, 12, flexible=True)
    if what == "client_id":
        payload = bytearray(header + b"\x01\x01\x00\x00")
        struct.pack_into(">h", payload, 8, 32767)
    elif what == "string":
        # one topic: zero uuid, then a name claiming 2^32-2 bytes
        payload = bytearray(header + b"\x02" + bytes(16) + b"\xff\xff\xff\xff\x0f")
    else:
        produce_header = struct.pack(">hh", API_PRODUCE, 9) + header[4:]
        # transactional_id null, acks, timeout, one topic "stored", one partition whose
        # records claim 2^31 bytes
        payload = bytearray(
            produce_header
            + b"\x00\xff\xff\x00\x00\x27\x10\x02\x07stored\x02\x00\x00\x00\x00"
            + b"\x80\x80\x80\x80\x08"
        )
    with nothing_stored_changes(stored_broker):
        send_closed(stored_broker, bytes(payload))
    assert_served(stored_broker)


def _request(api_key: int, version: int, data: dict[str, Any], **nulls: None) -> Any:
    body = api.build(api.request_class(api_key, version), data)
    # kio's writer writes None for an array as null, whatever the schema allows.
    return dataclasses.replace(body, **nulls)


@pytest.mark.parametrize(
    ("api_key", "version", "data", "field"),
    [
        (10, 4, {"key_type": 0}, "coordinator_keys"),
        (20, 6, {"timeout": 1000}, "topics"),
        (21, 2, {"timeout": 1000}, "topics"),
        (0, 9, {"acks": -1, "timeout": 1000}, "topic_data"),
        (77, 1, {}, "group_ids"),
    ],
)
def test_null_where_the_array_is_not_nullable_is_answered_and_stores_nothing(
    stored_broker: Broker, api_key: int, version: int, data: dict[str, Any], field: str
) -> None:
    """These responses have no top-level error code: the answer is the api's empty
    response (as Kafka's for an empty request) and the broker logs INVALID_REQUEST."""
    request = _request(api_key, version, data, **{field: None})
    with nothing_stored_changes(stored_broker), RawConnection(stored_broker) as conn:
        cid = conn.send_request(request)
        response = conn.response(api.response_class(api_key, version), cid)
        assert response is not None
        # Answered, not closed: the connection goes on working.
        assert API_VERSIONS in api_versions(conn)
    log_text = stored_broker.log_path.read_text(errors="replace")
    assert f"{field}: null array, but the field is not nullable" in log_text
    assert_served(stored_broker)


def test_null_array_in_a_request_with_an_error_field_gets_invalid_request(
    stored_broker: Broker,
) -> None:
    request = _request(79, 2, {"group_id": "g", "member_id": "m"}, topics=None)
    with RawConnection(stored_broker) as conn:
        cid = conn.send_request(request)
        response = conn.response(api.response_class(79, 2), cid)
    assert response.error_code == ErrorCode.invalid_request
    assert response.error_message == "topics: null array, but the field is not nullable"


# --- odd but well-formed requests the fuzzer found crashing handlers ----------------


def test_produce_to_an_empty_topic_name_is_unknown_topic(stored_broker: Broker) -> None:
    """Found by `python -m tests.fuzz`: the empty name was read as a missing one and
    the response could not be encoded."""
    with RawConnection(stored_broker) as conn:
        result = _produce(conn, 9, "", _batch([b"x"]))
    assert result.error_code == ErrorCode.unknown_topic_or_partition


def test_metadata_topic_with_neither_name_nor_id_is_invalid_request(
    stored_broker: Broker,
) -> None:
    """Fuzzer frame: Metadata v12, one topic with a null name and the zero topic id."""
    payload = bytes.fromhex(
        "0003000c00000008000a73706f6f6c2d66757a7a0002000000000000000000000000000000000000010000"
    )
    with RawConnection(stored_broker) as conn:
        conn.send_frame(payload)
        frame = conn.recv_frame()
    header, size = entity_reader(ResponseHeaderV1)(frame, 0)
    assert header.correlation_id == 8
    body, _ = entity_reader(api.response_class(3, 12))(frame, size)
    [topic] = body.topics
    assert topic.error_code == ErrorCode.invalid_request


def test_metadata_v10_topic_without_a_name_is_invalid_request(stored_broker: Broker) -> None:
    """v10-11 cannot address topics by id; Kafka refuses a null name there."""
    request = api.build(api.request_class(3, 10), {"topics": [{"name": None}]})
    with RawConnection(stored_broker) as conn:
        cid = conn.send_request(request)
        body = conn.response(api.response_class(3, 10), cid)
    [topic] = body.topics
    assert topic.error_code == ErrorCode.invalid_request


def test_share_state_rpc_with_the_zero_topic_id_is_invalid_request(
    stored_broker: Broker,
) -> None:
    """Fuzzer: InitializeShareGroupState naming the zero uuid (kio reads it as None)."""
    request = api.build(
        api.request_class(83, 0),
        {
            "group_id": "g",
            "topics": [
                {
                    "topic_id": uuid.UUID(int=0),
                    "partitions": [{"partition": 0, "state_epoch": 0, "start_offset": 0}],
                }
            ],
        },
    )
    with RawConnection(stored_broker) as conn:
        cid = conn.send_request(request)
        body = conn.response(api.response_class(83, 0), cid)
    [result] = body.results
    [partition] = result.partitions
    assert partition.error_code == ErrorCode.invalid_request
    assert partition.error_message == "The topic id cannot be null."


@pytest.mark.parametrize("codec", [1, 4, 7])
def test_batch_flagged_compressed_that_does_not_decompress_is_refused(
    broker: Broker, codec: int
) -> None:
    """Fuzzer: a gzip/zstd-flagged batch of plain records was stored, and every
    ListOffsets by timestamp on the partition then failed decompressing it."""
    topic = "flagged"
    create_topic(broker, topic)
    good = _batch([b"a", b"b"])
    bad = bytearray(good)
    attributes_at = CRC_OFFSET + 4
    struct.pack_into(">h", bad, attributes_at, codec)
    crc = crc32c.crc32c(bytes(bad[attributes_at:]))
    struct.pack_into(">I", bad, CRC_OFFSET, crc)
    with RawConnection(broker) as conn:
        result = _produce(conn, produce_version(conn), topic, bytes(bad))
        assert result.error_code in (
            ErrorCode.corrupt_message,
            ErrorCode.unsupported_compression_type,
        ), result
        result = _produce(conn, produce_version(conn), topic, good)
        assert result.error_code == ErrorCode.none and result.base_offset == 0, result
    assert watermarks(broker, topic, 0) == (0, 2)
    consumer = Consumer(consumer_config(broker, **{"group.id": "flagged"}))
    try:
        found = consumer.offsets_for_times([TopicPartition(topic, 0, 0)], timeout=10)
        assert found[0].offset == 0
    finally:
        consumer.close()
