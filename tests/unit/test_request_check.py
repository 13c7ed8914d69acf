"""The request structure check (`protocol.request_check`): no body reaches kio's reader unless
every declared length fits the frame, and schema rules kio does not enforce are
answered as INVALID_REQUEST."""

from __future__ import annotations

import dataclasses
import datetime
import functools
import io
import random
import struct
import tracemalloc
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.serial import entity_writer

from protocol import api, request_check
from tests.fuzz import frames

# The 21-byte frame that aborted the broker: Metadata v12 whose topics compact array
# claims 2^32-2 elements (kio reserved ~34 GB up front).
METADATA_V12_HUGE_TOPICS = bytes.fromhex("000000110003000c0000000100017800ffffffff0f")


@functools.cache
def advertised() -> list[tuple[int, int, int]]:
    return frames.advertised_apis()


def every_version() -> list[tuple[int, int]]:
    return [(key, v) for key, lo, hi in advertised() for v in range(lo, hi + 1)]


def frame_of(api_key: int, version: int, body: Any, client_id: str = "test") -> bytes:
    """A request frame without its size prefix."""
    return api.encode_request(api_key, version, 7, client_id, body)[4:]


def check(frame: bytes) -> bytes:
    """Header, then the guard, as dispatch runs them; returns what kio would read."""
    header, offset = request_check.decode_request_header(frame)
    return request_check.check_request(header.api_key, header.api_version, frame, offset)


def decode(frame: bytes) -> Any:
    header, offset = request_check.decode_request_header(frame)
    checked = request_check.check_request(header.api_key, header.api_version, frame, offset)
    return api.decode_request(header.api_key, header.api_version, checked, offset)


def body_of(api_key: int, version: int, data: dict[str, Any]) -> Any:
    return api.build(api.request_class(api_key, version), data)


def built(api_key: int, version: int, seed: int) -> tuple[frames.Frame, list[frames.Length]]:
    """A valid frame from the fuzzer's builder, and where its lengths are."""
    pools = frames.Pools(topic_ids=[uuid.UUID(int=5)])
    return frames.valid_frame(random.Random(seed), pools, api_key, version, 7)


# -- the crash frames ----------------------------------------------------------------


def test_metadata_frame_claiming_four_billion_topics_is_malformed_not_allocated() -> None:
    payload = METADATA_V12_HUGE_TOPICS[4:]
    assert struct.unpack(">i", METADATA_V12_HUGE_TOPICS[:4])[0] == len(payload)
    with pytest.raises(api.MalformedRequest):
        check(payload)  # compiles the check: not part of what is measured
    tracemalloc.start()
    try:
        with pytest.raises(api.MalformedRequest) as caught:
            check(payload)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (caught.value.api_key, caught.value.api_version) == (3, 12)
    assert caught.value.reason.startswith("topics: array of 4294967294 elements")
    assert "0 bytes left" in caught.value.reason
    assert peak < 64 * 1024


@pytest.mark.parametrize(
    ("api_key", "version", "data", "field"),
    [
        (10, 4, {"key_type": 0, "coordinator_keys": ["g"]}, "coordinator_keys"),
        (20, 6, {"topics": [{"name": "t"}], "timeout": 1000}, "topics"),
        (2, 9, {"replica_id": -1, "topics": [{"name": "t", "partitions": []}]}, "topics"),
        (77, 1, {"group_ids": ["g"]}, "group_ids"),
        (79, 2, {"group_id": "g", "member_id": "m", "topics": []}, "topics"),
        (85, 1, {"group_id": "g", "topics": []}, "topics"),
    ],
)
@pytest.mark.parametrize("count", [2**32 - 2, 2**31, 10_000])
def test_array_count_past_the_end_of_the_frame_is_malformed(
    api_key: int, version: int, data: dict[str, Any], field: str, count: int
) -> None:
    payload, lengths = frames.encode_body(body_of(api_key, version, data))
    target = next(n for n in lengths if n.path == field)
    header = frame_of(api_key, version, body_of(api_key, version, data))
    header = header[: len(header) - len(payload)]
    lying = header + frames.splice_length(payload, target, count + 1)
    with pytest.raises(api.MalformedRequest) as caught:
        check(lying)
    assert caught.value.reason.startswith(f"{field}: array of {count} elements")


@pytest.mark.parametrize(
    ("api_key", "version", "data", "field", "what"),
    [
        (3, 12, {"topics": [{"name": "t"}]}, "topics[0].name", "string"),
        (3, 4, {"topics": [{"name": "t"}]}, "topics[0].name", "string"),
        (
            0,
            9,
            {"acks": -1, "topic_data": [{"name": "t", "partition_data": [{"records": b"x"}]}]},
            "topic_data[0].partition_data[0].records",
            "bytes",
        ),
        (
            0,
            7,
            {"acks": -1, "topic_data": [{"name": "t", "partition_data": [{"records": b"x"}]}]},
            "topic_data[0].partition_data[0].records",
            "bytes",
        ),
    ],
)
@pytest.mark.parametrize("size", [2**31 - 1, 2**20, 100])
def test_string_or_bytes_length_past_the_end_is_malformed(
    api_key: int, version: int, data: dict[str, Any], field: str, what: str, size: int
) -> None:
    body = body_of(api_key, version, data)
    payload, lengths = frames.encode_body(body)
    target = next(n for n in lengths if n.path == field)
    compact = target.kind == "uvarint"
    if target.kind == "int16":
        size = min(size, 2**15 - 1)
    header = frame_of(api_key, version, body)
    header = header[: len(header) - len(payload)]
    lying = header + frames.splice_length(payload, target, size + 1 if compact else size)
    with pytest.raises(api.MalformedRequest) as caught:
        check(lying)
    assert caught.value.reason.startswith(f"{field}: {what} of {size} bytes but")


@pytest.mark.parametrize(("api_key", "version"), [(k, hi) for k, _, hi in advertised()])
def test_every_advertised_api_refuses_each_lying_length(api_key: int, version: int) -> None:
    """A valid frame at the api's max version, every length in turn set past the end."""
    lied = 0
    for seed in range(6):
        frame, lengths = built(api_key, version, seed)
        payload = frame.payload
        for target in lengths:
            if target.path.startswith("header"):
                continue
            huge = 2**31 - 1 if target.kind != "int16" else 2**15 - 1
            with pytest.raises(api.MalformedRequest):
                check(frames.splice_length(payload, target, huge))
            lied += 1
    assert lied > 0, "no length field to lie about"


# -- schema rules: INVALID_REQUEST -----------------------------------------------------


@pytest.mark.parametrize(
    ("api_key", "version", "data", "field"),
    [
        (10, 4, {"key_type": 0, "coordinator_keys": None}, "coordinator_keys"),
        (20, 6, {"topics": None, "timeout": 1000}, "topics"),
        (20, 3, {"topic_names": None, "timeout": 1000}, "topic_names"),
        (21, 2, {"topics": None, "timeout": 1000}, "topics"),
        (0, 9, {"acks": -1, "topic_data": None}, "topic_data"),
        (0, 3, {"acks": -1, "topic_data": None}, "topic_data"),
        (77, 1, {"group_ids": None}, "group_ids"),
    ],
)
def test_null_where_the_array_is_not_nullable_is_invalid_request(
    api_key: int, version: int, data: dict[str, Any], field: str
) -> None:
    # kio's writer writes a None array as null whatever the schema says.
    body = _replace(body_of(api_key, version, data), field, None)
    with pytest.raises(request_check.InvalidRequest) as caught:
        check(frame_of(api_key, version, body))
    assert caught.value.field_path == field
    assert "not nullable" in caught.value.reason


def _replace(entity: Any, field: str, value: Any) -> Any:
    return dataclasses.replace(entity, **{field: value})


def test_null_in_a_nullable_array_passes() -> None:
    frame = frame_of(3, 12, body_of(3, 12, {"topics": None}))
    assert decode(frame).topics is None


def test_negative_string_length_other_than_null_is_invalid_request() -> None:
    body = body_of(3, 4, {"topics": [{"name": "abc"}]})
    payload, lengths = frames.encode_body(body)
    target = next(n for n in lengths if n.path == "topics[0].name")
    frame = frame_of(3, 4, body)
    frame = frame[: len(frame) - len(payload)] + frames.splice_length(payload, target, -5)
    with pytest.raises(request_check.InvalidRequest) as caught:
        check(frame)
    assert caught.value.field_path == "topics[0].name"
    assert "negative string length -5" in caught.value.reason


def test_text_that_is_not_utf8_is_invalid_request() -> None:
    frame = bytearray(frame_of(3, 12, body_of(3, 12, {"topics": [{"name": "abc"}]})))
    at = frame.index(b"abc")
    frame[at : at + 3] = b"a\xff\xfe"
    with pytest.raises(request_check.InvalidRequest) as caught:
        check(bytes(frame))
    assert caught.value.field_path == "topics[0].name"
    assert "UTF-8" in caught.value.reason


def test_boolean_byte_other_than_zero_or_one_is_invalid_request() -> None:
    frame = bytearray(frame_of(3, 12, body_of(3, 12, {"topics": None})))
    # Body: topics (0x00), allow_auto_topic_creation, include_topic_authorized_operations, tags.
    frame[-3] = 7
    with pytest.raises(request_check.InvalidRequest) as caught:
        check(bytes(frame))
    assert caught.value.field_path == "allow_auto_topic_creation"


def test_unparseable_bytes_win_over_a_broken_rule() -> None:
    """Null in a non-nullable array, then a cut-short frame: the connection must close."""
    frame = frame_of(20, 6, _replace(body_of(20, 6, {"timeout": 5}), "topics", None))
    with pytest.raises(request_check.InvalidRequest):
        check(frame)
    with pytest.raises(api.MalformedRequest) as caught:
        check(frame[:-3])
    assert caught.value.reason == "timeout: 4 bytes needed but 2 left"


# -- varints and tagged fields ------------------------------------------------------


def test_varint_longer_than_five_bytes_is_malformed() -> None:
    frame = frame_of(3, 12, body_of(3, 12, {"topics": None}))
    header_end = len(frame) - 4
    bad = frame[:header_end] + b"\x81\x80\x80\x80\x80\x00" + frame[header_end + 1 :]
    with pytest.raises(api.MalformedRequest) as caught:
        check(bad)
    assert caught.value.reason == "topics: varint longer than 5 bytes"


def _fetch_v18(**extra: Any) -> Any:
    return body_of(
        1,
        18,
        {
            "max_wait": 10,
            "min_bytes": 1,
            "topics": [{"topic_id": uuid.UUID(int=9), "partitions": [{"partition": 0}]}],
            **extra,
        },
    )


def test_unknown_tagged_fields_are_skipped_as_kafka_does() -> None:
    body = _fetch_v18(cluster_id="c1")
    frame = frame_of(1, 18, body)
    # The top-level tagged section is last: count 1, tag 0 (cluster_id).
    tail = b"\x01\x00\x03\x03c1"
    assert frame.endswith(tail)
    with_unknown = frame[: -len(tail)] + b"\x03\x00\x03\x03c1\x05\x02\xab\xcd\x09\x00"
    checked = check(with_unknown)
    assert checked == frame
    assert decode(with_unknown) == body


def test_unknown_tag_inside_a_known_tagged_struct_is_skipped_and_its_size_fixed() -> None:
    from kio.schema.fetch.v18.request import ReplicaState

    body = _replace(_fetch_v18(), "replica_state", ReplicaState(replica_id=3, replica_epoch=4))
    frame = frame_of(1, 18, body)
    # replica_state: tag 1, size 13 = int32 + int64 + empty tag section.
    known = b"\x01\x01\x0d" + struct.pack(">iq", 3, 4) + b"\x00"
    assert frame.endswith(known)
    inner = struct.pack(">iq", 3, 4) + b"\x01\x07\x01\xee"
    with_unknown = frame[: -len(known)] + b"\x01\x01" + bytes([len(inner)]) + inner
    assert check(with_unknown) == frame
    assert decode(with_unknown) == body


def test_known_tag_whose_size_disagrees_with_its_value_is_malformed() -> None:
    body = _fetch_v18(cluster_id="c1")
    frame = frame_of(1, 18, body)
    bad = frame[:-5] + b"\x00\x04\x03c1\x00"  # size 4, value takes 3
    with pytest.raises(api.MalformedRequest) as caught:
        check(bad)
    assert caught.value.reason.startswith("cluster_id: tag 0 declares 4 bytes")


def test_tag_size_past_the_end_is_malformed() -> None:
    frame = frame_of(1, 18, _fetch_v18(cluster_id="c1"))
    bad = frame[:-5] + b"\x00\xff\xff\x03"
    with pytest.raises(api.MalformedRequest) as caught:
        check(bad)
    assert caught.value.reason.startswith("_tagged_fields: tag 0 of 65535 bytes")


def test_tag_count_larger_than_the_bytes_left_is_malformed() -> None:
    frame = frame_of(3, 12, body_of(3, 12, {"topics": None}))
    bad = frame[:-1] + b"\xff\xff\xff\xff\x0f"
    with pytest.raises(api.MalformedRequest) as caught:
        check(bad)
    assert "tagged fields but 0 bytes left" in caught.value.reason


# -- valid frames ----------------------------------------------------------------------


@pytest.mark.parametrize(("api_key", "version"), every_version())
def test_valid_frames_of_every_advertised_version_pass_unchanged(
    api_key: int, version: int
) -> None:
    for seed in range(25):
        payload = built(api_key, version, seed)[0].payload
        assert check(payload) is payload
        decode(payload)


def test_bytes_after_the_body_are_allowed_as_kafka_does() -> None:
    frame = frame_of(3, 12, body_of(3, 12, {"topics": [{"name": "t"}]}))
    assert decode(frame + b"\x01\x00\x00") == decode(frame)


def test_produce_of_megabytes_is_checked_without_reading_or_copying_the_records() -> None:
    records = bytes(8 << 20)
    body = body_of(
        0,
        9,
        {"acks": -1, "topic_data": [{"name": "t", "partition_data": [{"records": records}]}]},
    )
    frame = frame_of(0, 9, body)
    check(frame)  # compiles the check: not part of what is measured
    tracemalloc.start()
    try:
        assert check(frame) is frame
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024


# -- the request header ------------------------------------------------------------------


def test_client_id_length_past_the_end_is_malformed() -> None:
    frame = bytearray(frame_of(3, 12, body_of(3, 12, {"topics": None}), client_id="abc"))
    struct.pack_into(">h", frame, 8, 30000)
    with pytest.raises(api.MalformedRequest) as caught:
        request_check.decode_request_header(bytes(frame))
    assert (caught.value.api_key, caught.value.api_version) == (3, 12)
    assert caught.value.reason.startswith("client_id: string of 30000 bytes")


def test_negative_client_id_length_is_a_null_client_id_as_in_kafka() -> None:
    frame = struct.pack(">hhih", 18, 0, 5, -7)
    header, offset = request_check.decode_request_header(frame)
    assert header.client_id is None and offset == 10


def test_header_tags_are_skipped_and_a_cut_tag_section_is_malformed() -> None:
    frame = frame_of(3, 12, body_of(3, 12, {"topics": None}), client_id="c")
    # Header: fixed 8, client id 2+1, then the tag count at 11.
    tagged = frame[:11] + b"\x01\x05\x02\xaa\xbb" + frame[12:]
    header, offset = request_check.decode_request_header(tagged)
    assert header.client_id == "c" and offset == 16
    with pytest.raises(api.MalformedRequest):
        request_check.decode_request_header(frame[:11] + b"\x01\x05\x09\xaa")


def test_client_id_that_is_not_utf8_is_decoded_leniently() -> None:
    frame = struct.pack(">hhih", 18, 0, 5, 2) + b"\xff\xfe"
    header, _ = request_check.decode_request_header(frame)
    assert header.client_id == "\ufffd\ufffd"


def test_decode_errors_after_the_guard_are_malformed_request() -> None:
    frame = frame_of(3, 12, body_of(3, 12, {"topics": [{"name": "t"}]}))
    _, offset = request_check.decode_request_header(frame)
    with pytest.raises(api.MalformedRequest) as caught:
        api.decode_request(3, 12, frame[:-4], offset)  # kio sees it cut short
    assert caught.value.api_key == 3


# -- properties ----------------------------------------------------------------------------


@st.composite
def mutated_frames(draw: st.DrawFn) -> bytes:
    api_key, version = draw(st.sampled_from(every_version()))
    frame, lengths = built(api_key, version, draw(st.integers(0, 2**32 - 1)))
    payload, header_size = frame.payload, frame.header_size
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["lie", "truncate", "flip", "append", "splice"]))
        if op == "lie" and lengths:
            target = draw(st.sampled_from(lengths))
            if target.offset + 5 <= len(payload):
                new = draw(
                    st.one_of(
                        st.integers(-(2**15), 2**15 - 1),
                        st.sampled_from([2**31 - 1, 2**32 - 1, -(2**31), 0, 1]),
                        st.integers(0, 2**35 - 1),
                    )
                )
                if target.kind == "int16":
                    new = max(-(2**15), min(new, 2**15 - 1))
                elif target.kind == "int32":
                    new = max(-(2**31), min(new, 2**31 - 1))
                else:
                    new = abs(new)
                payload = frames.splice_length(payload, target, new)
        elif op == "truncate":
            payload = payload[: draw(st.integers(header_size, len(payload)))]
        elif op == "flip" and len(payload) > header_size:
            at = draw(st.integers(header_size, len(payload) - 1))
            data = bytearray(payload)
            data[at] ^= draw(st.integers(1, 255))
            payload = bytes(data)
        elif op == "append":
            payload += draw(st.binary(max_size=40))
        elif op == "splice" and len(payload) > header_size:
            at = draw(st.integers(header_size, len(payload)))
            payload = payload[:at] + draw(st.binary(min_size=1, max_size=12)) + payload[at:]
    return payload


def _guard_then_kio(payload: bytes) -> None:
    """The guard raises only its two exceptions; when it passes, kio decodes."""
    try:
        header, offset = request_check.decode_request_header(payload)
    except api.MalformedRequest:
        return
    try:
        checked = request_check.check_request(header.api_key, header.api_version, payload, offset)
    except (api.MalformedRequest, request_check.InvalidRequest):
        return
    cls = api.request_class(header.api_key, header.api_version)
    entity, _ = api._reader(cls)(checked, offset)
    assert isinstance(entity, cls)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_frames())
def test_mutated_frames_raise_only_guard_errors_and_what_passes_decodes(payload: bytes) -> None:
    _guard_then_kio(payload)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(every_version()), st.binary(max_size=300))
def test_random_bodies_raise_only_guard_errors_and_what_passes_decodes(
    api_version: tuple[int, int], body: bytes
) -> None:
    api_key, version = api_version
    flexible = api.is_flexible(api_key, version)
    header = struct.pack(">hhih", api_key, version, 1, 1) + b"x" + (b"\x00" if flexible else b"")
    _guard_then_kio(header + body)


def test_fuzz_encoder_writes_what_kio_writes() -> None:
    """The fuzzer finds lengths by encoding itself: its bytes must be kio's."""
    for api_key, version in every_version():
        for seed in range(10):
            rng = random.Random(seed)
            entity = frames.Builder(rng, frames.Pools(topic_ids=[uuid.uuid4()])).entity(
                api.request_class(api_key, version)
            )
            mine, _ = frames.encode_body(entity)
            buf = io.BytesIO()
            entity_writer(type(entity))(buf, entity)
            assert mine == buf.getvalue(), (api_key, version, seed)


def test_timestamps_and_durations_kio_cannot_represent_are_invalid_request() -> None:
    """No advertised request has these types today; the guard still mirrors kio."""
    probe = dataclasses.make_dataclass(
        "Probe",
        [("at", datetime.datetime, dataclasses.field(metadata={"kafka_type": "datetime_i64"}))],
        frozen=True,
        namespace={"__flexible__": False, "__api_key__": 3, "__version__": 0},
    )
    good = struct.pack(">q", 1_700_000_000_000)
    assert request_check.check_entity(probe, good, 0) == good
    for bad in (-5, 2**62):
        with pytest.raises(request_check.InvalidRequest):
            request_check.check_entity(probe, struct.pack(">q", bad), 0)
