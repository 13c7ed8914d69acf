"""bench.share_client's sans-IO parts: which offsets a ShareFetch answer delivered (from
batch headers) and the acknowledgement batches settling its acquired ranges."""

from __future__ import annotations

import pytest

from bench.share_client import (
    ACCEPT,
    GAP,
    RELEASE,
    ShareConsumer,
    _NodeSession,
    ack_batch_bodies,
    build_acknowledgements,
    delivered_runs,
    kafka_uuid_string,
    next_epoch,
    warm_up,
)
from protocol.errors import CorruptRecordError
from protocol.records import NewRecord, build_batch, build_end_txn_marker_batch


def batch(base: int, count: int, *, deltas: list[int] | None = None) -> bytes:
    records = (
        [NewRecord(None, b"v") for _ in range(count)]
        if deltas is None
        else [NewRecord(None, b"v", offset_delta=d) for d in deltas]
    )
    return build_batch(records, base_offset=base)


def test_dense_batches_are_read_from_their_headers_and_merged() -> None:
    data = batch(0, 5) + batch(5, 3) + batch(10, 2)
    assert delivered_runs(data) == [(0, 7), (10, 11)]
    assert delivered_runs(b"") == []


def test_a_compacted_batch_is_decoded_and_a_control_batch_delivers_nothing() -> None:
    marker = build_end_txn_marker_batch(
        producer_id=1,
        producer_epoch=0,
        commit=True,
        coordinator_epoch=0,
        timestamp=0,
        base_offset=4,
    )
    data = batch(0, 3, deltas=[0, 2, 3]) + marker + batch(5, 2)
    assert delivered_runs(data) == [(0, 0), (2, 3), (5, 6)]


def test_a_partial_trailing_batch_is_ignored_but_a_bad_crc_raises() -> None:
    whole = batch(0, 4)
    assert delivered_runs(whole + batch(4, 4)[:-3]) == [(0, 3)]
    corrupt = bytearray(whole)
    corrupt[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError):
        delivered_runs(bytes(corrupt))


def test_every_acquired_offset_is_accepted_or_a_gap() -> None:
    # Acquired 0-9 (first delivery) and 20-24 (second); records at 0-3, 6-9, 20-24.
    d = build_acknowledgements([(20, 24, 2), (0, 9, 1)], [(0, 3), (6, 9), (20, 24)])
    assert d.acks == [(0, 3, ACCEPT), (4, 5, GAP), (6, 9, ACCEPT), (20, 24, ACCEPT)]
    assert (d.first, d.redelivered, d.records) == (8, 5, 13)


def test_records_outside_the_acquired_ranges_are_neither_counted_nor_acknowledged() -> None:
    # A whole batch 0-99 came back but only 40-59 were acquired (the rest by others).
    d = build_acknowledgements([(40, 59, 1)], [(0, 99)])
    assert d.acks == [(40, 59, ACCEPT)]
    assert d.first == 20
    # Adjacent acquired ranges with equal types make one batch; a range past the
    # records is one gap.
    d = build_acknowledgements([(0, 4, 1), (5, 9, 3), (10, 12, 1)], [(0, 9)])
    assert d.acks == [(0, 9, ACCEPT), (10, 12, GAP)]
    assert (d.first, d.redelivered) == (5, 5)
    assert build_acknowledgements([(3, 5, 1)], []).acks == [(3, 5, GAP)]
    assert build_acknowledgements([(3, 5, 1)], [(0, 10)], RELEASE).acks == [(3, 5, RELEASE)]


def test_a_run_spanning_several_acquired_ranges_covers_each() -> None:
    d = build_acknowledgements([(0, 2, 1), (8, 9, 1)], [(1, 8)])
    assert d.acks == [(0, 0, GAP), (1, 2, ACCEPT), (8, 8, ACCEPT), (9, 9, GAP)]
    assert d.first == 3


def test_ack_bodies_and_epochs() -> None:
    assert ack_batch_bodies([(0, 3, ACCEPT), (4, 4, GAP)]) == [
        {"first_offset": 0, "last_offset": 3, "acknowledge_types": [1]},
        {"first_offset": 4, "last_offset": 4, "acknowledge_types": [0]},
    ]
    assert next_epoch(0) == 1
    assert next_epoch(2**31 - 1) == 1
    member = kafka_uuid_string()
    assert len(member) == 22 and "=" not in member


def consumer(assigned: set[int], leaders: dict[int, int]) -> ShareConsumer:
    c = ShareConsumer("127.0.0.1:9092", "g", "t")
    c.assigned = frozenset(assigned)
    c.leaders = {p: (n, 0) for p, n in leaders.items()}
    return c


def test_a_session_opens_with_every_partition_then_names_only_changes() -> None:
    c = consumer({0, 1, 2}, {0: 1, 1: 1, 2: 2})
    s = _NodeSession(acks={0: [(0, 4, ACCEPT)]})
    request = c._request_body(1, s)
    assert request is not None
    body, acks = request
    # An opening request cannot carry acknowledgements: they are failed.
    assert acks == {} and c.stats.ack_failed == 5
    assert body["share_session_epoch"] == 0
    assert [p["partition_index"] for p in body["topics"][0]["partitions"]] == [0, 1]
    assert body["forgotten_topics_data"] == []
    assert body["max_wait"] == 500 and body["max_records"] == 500

    s.epoch = 1
    s.acks = {1: [(10, 19, ACCEPT)]}
    c.leaders[0] = (2, 1)  # partition 0 moved to node 2
    request = c._request_body(1, s)
    assert request is not None
    body, acks = request
    assert acks == {1: [(10, 19, ACCEPT)]} and s.acks == {}
    (topic,) = body["topics"]
    assert topic["partitions"] == [
        {
            "partition_index": 1,
            "acknowledgement_batches": [
                {"first_offset": 10, "last_offset": 19, "acknowledge_types": [1]}
            ],
        }
    ]
    assert body["forgotten_topics_data"][0]["partitions"] == [0]
    assert s.partitions == {1}

    # Nothing led there, nothing to forget or acknowledge: no request.
    c.assigned = frozenset({0, 2})
    assert c._request_body(1, s) is not None  # forgets 1
    assert c._request_body(1, s) is None


def test_the_warm_up_builds_both_requests() -> None:
    warm_up()  # raises if a sample request names a field its API does not have
