"""The share-state log's record codec: Kafka's ShareSnapshot/ShareUpdate layout."""

from __future__ import annotations

import contextlib
import struct
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from persister.share_records import (
    ShareKey,
    ShareRecord,
    ShareSnapshot,
    ShareTombstone,
    ShareUpdate,
    StateBatch,
    decode,
    encode,
)

TOPIC = uuid.UUID("12345678-1234-5678-1234-567812345678")
KEY = ShareKey("group-a", TOPIC, 3)
BATCHES = (StateBatch(10, 19, 2, 1), StateBatch(20, 20, 4, 5))


def test_snapshot_round_trip() -> None:
    record = ShareSnapshot(KEY, 2, 7, 3, 10, 1_000, 2_000, BATCHES)
    assert decode(*encode(record)) == record


def test_update_round_trip() -> None:
    record = ShareUpdate(KEY, 2, -1, -1, BATCHES)
    assert decode(*encode(record)) == record


def test_tombstone_is_the_snapshot_key_with_a_null_value() -> None:
    key_bytes, value = encode(ShareTombstone(KEY))
    assert value is None
    assert key_bytes == encode(ShareSnapshot(KEY, 0, 0, -1, 0, 0, 0))[0]
    assert decode(key_bytes, None) == ShareTombstone(KEY)
    # An update key with a null value is a tombstone too.
    assert decode(encode(ShareUpdate(KEY, 0, -1, -1))[0], None) == ShareTombstone(KEY)


def test_exact_layout() -> None:
    key_bytes, value = encode(ShareSnapshot(KEY, 1, 2, 3, 4, 5, 6, (StateBatch(7, 8, 2, 9),)))
    assert key_bytes == (struct.pack(">hh", 0, 7) + b"group-a" + TOPIC.bytes + struct.pack(">i", 3))
    assert value == (
        struct.pack(">hiiiqqq", 0, 1, 2, 3, 4, 5, 6)
        + b"\x02"  # compact array: 1 batch
        + struct.pack(">qqbh", 7, 8, 2, 9)
        + b"\x00"  # batch tagged fields
        + b"\x00"  # top-level tagged fields
    )
    update_key, update_value = encode(ShareUpdate(KEY, 1, 3, -1, ()))
    assert update_key[:2] == struct.pack(">h", 1)
    assert update_value == struct.pack(">hiiq", 0, 1, 3, -1) + b"\x01" + b"\x00"


def test_delivery_complete_count_is_tagged_field_0_and_unknown_tags_are_skipped() -> None:
    # Kafka 4.2 (KIP-1226) adds DeliveryCompleteCount as tagged field 0 (int32).
    key_bytes, value = encode(ShareUpdate(KEY, 1, 3, 5, ()))
    assert value is not None
    tagged = value[:-1] + b"\x01" + b"\x00" + b"\x04" + struct.pack(">i", 42)
    assert decode(key_bytes, tagged) == ShareUpdate(KEY, 1, 3, 5, (), 42)
    unknown = value[:-1] + b"\x01" + b"\x07" + b"\x02" + b"ab"
    assert decode(key_bytes, unknown) == ShareUpdate(KEY, 1, 3, 5, ())


def test_a_value_without_delivery_complete_count_decodes_with_minus_one() -> None:
    # What older spool wrote: an empty tagged-field section.
    key_bytes, value = encode(ShareSnapshot(KEY, 2, 7, 3, 10, 1_000, 2_000, BATCHES))
    assert value is not None and value.endswith(b"\x00")
    assert decode(key_bytes, value).delivery_complete_count == -1  # type: ignore[union-attr]
    _, counted = encode(ShareSnapshot(KEY, 2, 7, 3, 10, 1_000, 2_000, BATCHES, 4))
    assert counted is not None
    assert counted == value[:-1] + b"\x01\x00\x04" + struct.pack(">i", 4)


batches = st.lists(
    st.builds(
        StateBatch,
        st.integers(0, 2**62),
        st.integers(0, 2**62),
        st.sampled_from([0, 2, 4]),
        st.integers(0, 2**15 - 1),
    ),
    max_size=5,
).map(tuple)
keys = st.builds(
    ShareKey,
    st.text(st.characters(exclude_categories=["Cs"]), max_size=30),
    st.uuids(),
    st.integers(0, 2**31 - 1),
)
epochs = st.integers(-1, 2**31 - 1)
counts = st.integers(-1, 2**31 - 1)
offsets = st.integers(-1, 2**63 - 1)
records: st.SearchStrategy[ShareRecord] = st.one_of(
    st.builds(
        ShareSnapshot, keys, epochs, epochs, epochs, offsets, offsets, offsets, batches, counts
    ),
    st.builds(ShareUpdate, keys, epochs, epochs, offsets, batches, counts),
    st.builds(ShareTombstone, keys),
)


@given(records)
def test_round_trip_property(record: ShareRecord) -> None:
    assert decode(*encode(record)) == record


def _good() -> tuple[bytes, bytes]:
    key_bytes, value = encode(ShareSnapshot(KEY, 2, 7, 3, 10, 1_000, 2_000, BATCHES))
    assert value is not None
    return key_bytes, value


@pytest.mark.parametrize(
    ("key_bytes", "value", "message"),
    [
        (b"", b"", "truncated in record type"),
        (struct.pack(">h", 5) + _good()[0][2:], _good()[1], "type 5"),
        (_good()[0][:-1], _good()[1], "truncated in Partition"),
        (_good()[0] + b"x", _good()[1], "bytes after its last field"),
        (struct.pack(">hh", 0, -1), b"", "null GroupId"),
        (struct.pack(">hh", 0, 2) + b"\xff\xfe" + TOPIC.bytes + b"\0\0\0\0", b"", "UTF-8"),
        (_good()[0], _good()[1][:10], "truncated in header fields"),
        (_good()[0], _good()[1][:-3], "truncated|claims"),
        (_good()[0], _good()[1] + b"\x00", "bytes after its last field"),
        (_good()[0], struct.pack(">h", 1) + _good()[1][2:], "version 1 is not supported"),
        (_good()[0], _good()[1][:38] + b"\x00", "null StateBatches"),
        (_good()[0], _good()[1][:38] + b"\xff\xff\xff\x0f", "claims"),
        (_good()[0], _good()[1][:38] + b"\xff\xff\xff\xff\xff\xff", "varint longer"),
    ],
)
def test_corrupt_input_is_a_value_error(key_bytes: bytes, value: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        decode(key_bytes, value)


@given(st.binary(max_size=80), st.binary(max_size=80) | st.none())
def test_random_bytes_never_raise_anything_but_value_error(key: bytes, value: bytes | None) -> None:
    with contextlib.suppress(ValueError):
        decode(key, value)


@given(st.data())
def test_truncations_of_valid_records_are_value_errors(data: st.DataObject) -> None:
    record = data.draw(records.filter(lambda r: not isinstance(r, ShareTombstone)))
    key_bytes, value = encode(record)
    assert value is not None
    cut = data.draw(st.integers(0, len(value) - 1))
    with pytest.raises(ValueError):
        decode(key_bytes, value[:cut])
