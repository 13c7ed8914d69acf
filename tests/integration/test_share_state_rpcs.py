"""The share coordinator's RPCs on the wire (api keys 83-87), against a real broker.

Initialize / Read / Write / Delete ShareGroupState and ReadShareGroupStateSummary are
sent with spool's own `KafkaClient` from plain dicts, one connection per call. Keys are
(group, topic id, partition); the share coordinator does not require the topic to
exist, so most tests use fresh random topic ids. The helpers here are also used by
`test_share_durability.py` to read live state.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from typing import Any

import pytest

from protocol.client import KafkaClient
from protocol.errors import ErrorCode
from tests.integration.conftest import Broker

INITIALIZE, READ, WRITE, DELETE, SUMMARY = 83, 84, 85, 86, 87
METADATA = 3

# (first offset, last offset, delivery state, delivery count)
Batch = tuple[int, int, int, int]
AVAILABLE, ACKNOWLEDGED, ARCHIVED = 0, 2, 4


# --- wire helpers ---------------------------------------------------------------------


async def _call(broker: Broker, api_key: int, version: int, body: dict[str, Any]) -> Any:
    client = await KafkaClient.connect(broker.host, broker.port, "spool-it-share-state")
    try:
        return await client.request(api_key, version, body, timeout_s=30)
    finally:
        await client.close()


def call(broker: Broker, api_key: int, version: int, body: dict[str, Any]) -> Any:
    """One request on a fresh connection; returns the decoded response entity."""
    return asyncio.run(_call(broker, api_key, version, body))


def _only_partition(response: Any) -> Any:
    (result,) = response.results
    (partition,) = result.partitions
    return partition


def initialize(
    broker: Broker, group: str, topic_id: uuid.UUID, partition: int, state_epoch: int, start: int
) -> Any:
    body = {
        "group_id": group,
        "topics": [
            {
                "topic_id": topic_id,
                "partitions": [
                    {"partition": partition, "state_epoch": state_epoch, "start_offset": start}
                ],
            }
        ],
    }
    return _only_partition(call(broker, INITIALIZE, 0, body))


def read(broker: Broker, group: str, topic_id: uuid.UUID, partition: int, leader_epoch: int) -> Any:
    body = {
        "group_id": group,
        "topics": [
            {
                "topic_id": topic_id,
                "partitions": [{"partition": partition, "leader_epoch": leader_epoch}],
            }
        ],
    }
    return _only_partition(call(broker, READ, 0, body))


def write(
    broker: Broker,
    group: str,
    topic_id: uuid.UUID,
    partition: int,
    *,
    state_epoch: int,
    leader_epoch: int,
    start: int,
    batches: Sequence[Batch] = (),
    version: int = 1,
) -> Any:
    body = {
        "group_id": group,
        "topics": [
            {
                "topic_id": topic_id,
                "partitions": [
                    {
                        "partition": partition,
                        "state_epoch": state_epoch,
                        "leader_epoch": leader_epoch,
                        "start_offset": start,
                        "delivery_complete_count": -1,
                        "state_batches": [
                            {
                                "first_offset": f,
                                "last_offset": la,
                                "delivery_state": s,
                                "delivery_count": c,
                            }
                            for f, la, s, c in batches
                        ],
                    }
                ],
            }
        ],
    }
    return _only_partition(call(broker, WRITE, version, body))


def delete(broker: Broker, group: str, topic_id: uuid.UUID, partition: int) -> Any:
    body = {
        "group_id": group,
        "topics": [{"topic_id": topic_id, "partitions": [{"partition": partition}]}],
    }
    return _only_partition(call(broker, DELETE, 0, body))


def summary(
    broker: Broker,
    group: str,
    topic_id: uuid.UUID,
    partition: int,
    leader_epoch: int = -1,
    version: int = 1,
) -> Any:
    body = {
        "group_id": group,
        "topics": [
            {
                "topic_id": topic_id,
                "partitions": [{"partition": partition, "leader_epoch": leader_epoch}],
            }
        ],
    }
    return _only_partition(call(broker, SUMMARY, version, body))


def batches_of(partition_result: Any) -> list[Batch]:
    return [
        (int(b.first_offset), int(b.last_offset), int(b.delivery_state), int(b.delivery_count))
        for b in partition_result.state_batches
    ]


def topic_ids(broker: Broker) -> dict[str, uuid.UUID]:
    """Topic name -> topic id, from Metadata v12."""
    body = {
        "topics": None,
        "allow_auto_topic_creation": False,
        "include_topic_authorized_operations": False,
    }
    response = call(broker, METADATA, 12, body)
    return {t.name: t.topic_id for t in response.topics}


def assert_ok(result: Any, what: str) -> None:
    assert result.error_code == ErrorCode.none, (
        f"{what}: expected NONE, got {ErrorCode(result.error_code).name}: {result.error_message}"
    )


def assert_error(result: Any, code: ErrorCode, what: str) -> None:
    assert result.error_code == code, (
        f"{what}: expected {code.name}, got {ErrorCode(result.error_code).name}: "
        f"{result.error_message}"
    )
    assert result.error_message, f"{what}: {code.name} came without an error message"


# --- tests ----------------------------------------------------------------------------


def test_initialized_state_reads_back_with_its_start_offset_and_state_epoch(
    broker: Broker,
) -> None:
    tid = uuid.uuid4()
    assert_ok(initialize(broker, "g-init", tid, 0, state_epoch=1, start=10), "initialize")

    got = read(broker, "g-init", tid, 0, leader_epoch=0)
    assert_ok(got, "read")
    assert (got.state_epoch, got.start_offset, batches_of(got)) == (1, 10, [])

    s = summary(broker, "g-init", tid, 0)
    assert_ok(s, "summary")
    assert (s.state_epoch, s.leader_epoch, s.start_offset) == (1, 0, 10)
    s0 = summary(broker, "g-init", tid, 0, version=0)
    assert_ok(s0, "summary v0")
    assert (s0.state_epoch, s0.start_offset) == (1, 10)


def test_written_batches_merge_over_stored_ones_newer_winning_and_start_offset_trims(
    broker: Broker,
) -> None:
    g, tid = "g-merge", uuid.uuid4()
    assert_ok(initialize(broker, g, tid, 3, state_epoch=0, start=0), "initialize")
    first = [(0, 9, AVAILABLE, 1), (10, 19, ACKNOWLEDGED, 1)]
    assert_ok(write(broker, g, tid, 3, state_epoch=0, leader_epoch=0, start=0, batches=first), "w1")
    got = read(broker, g, tid, 3, leader_epoch=0)
    assert_ok(got, "read 1")
    assert batches_of(got) == first

    # Overlaps the tail of the first batch and the head of the second: the new one wins.
    second = [(5, 14, ARCHIVED, 2)]
    assert_ok(
        write(broker, g, tid, 3, state_epoch=0, leader_epoch=0, start=-1, batches=second), "w2"
    )
    got = read(broker, g, tid, 3, leader_epoch=0)
    assert_ok(got, "read 2")
    assert got.start_offset == 0, "start offset -1 must leave it unchanged"
    assert batches_of(got) == [
        (0, 4, AVAILABLE, 1),
        (5, 14, ARCHIVED, 2),
        (15, 19, ACKNOWLEDGED, 1),
    ]

    # Moving the start offset drops what lies below it and trims the batch it falls in.
    assert_ok(write(broker, g, tid, 3, state_epoch=0, leader_epoch=0, start=8), "w3")
    got = read(broker, g, tid, 3, leader_epoch=0)
    assert_ok(got, "read 3")
    assert got.start_offset == 8
    assert batches_of(got) == [(8, 14, ARCHIVED, 2), (15, 19, ACKNOWLEDGED, 1)]

    # A batch wholly below the start offset is dropped even when it arrives in the write.
    fourth = [(2, 6, ACKNOWLEDGED, 1), (20, 24, AVAILABLE, 3)]
    assert_ok(
        write(
            broker, g, tid, 3, state_epoch=0, leader_epoch=0, start=-1, batches=fourth, version=0
        ),
        "w4 (v0)",
    )
    got = read(broker, g, tid, 3, leader_epoch=0)
    assert_ok(got, "read 4")
    assert batches_of(got) == [
        (8, 14, ARCHIVED, 2),
        (15, 19, ACKNOWLEDGED, 1),
        (20, 24, AVAILABLE, 3),
    ]


def test_write_with_an_older_state_epoch_is_fenced_and_changes_nothing(broker: Broker) -> None:
    g, tid = "g-state-epoch", uuid.uuid4()
    assert_ok(initialize(broker, g, tid, 0, state_epoch=3, start=0), "initialize")
    good = [(0, 4, ACKNOWLEDGED, 1)]
    assert_ok(write(broker, g, tid, 0, state_epoch=3, leader_epoch=0, start=0, batches=good), "w")

    stale = write(
        broker, g, tid, 0, state_epoch=2, leader_epoch=0, start=3, batches=[(5, 9, ARCHIVED, 1)]
    )
    assert_error(stale, ErrorCode.fenced_state_epoch, "write with state epoch 2 < 3")
    got = read(broker, g, tid, 0, leader_epoch=0)
    assert (got.state_epoch, got.start_offset, batches_of(got)) == (3, 0, good)

    # Initialize (an admin reset) bumps the state epoch; the old one is fenced from then on.
    assert_ok(initialize(broker, g, tid, 0, state_epoch=4, start=5), "re-initialize")
    assert_error(
        write(broker, g, tid, 0, state_epoch=3, leader_epoch=0, start=-1),
        ErrorCode.fenced_state_epoch,
        "write with state epoch 3 after a reset to 4",
    )
    assert_error(
        initialize(broker, g, tid, 0, state_epoch=2, start=0),
        ErrorCode.fenced_state_epoch,
        "initialize with state epoch 2 < 4",
    )
    got = read(broker, g, tid, 0, leader_epoch=0)
    assert_ok(got, "read after reset")
    assert (got.state_epoch, got.start_offset, batches_of(got)) == (4, 5, [])


def test_read_and_write_with_an_older_leader_epoch_are_fenced(broker: Broker) -> None:
    g, tid = "g-leader-epoch", uuid.uuid4()
    assert_ok(initialize(broker, g, tid, 1, state_epoch=0, start=0), "initialize")
    # A newer leader epoch on read is recorded.
    assert_ok(read(broker, g, tid, 1, leader_epoch=5), "read with leader epoch 5")
    assert summary(broker, g, tid, 1).leader_epoch == 5

    assert_error(
        read(broker, g, tid, 1, leader_epoch=4),
        ErrorCode.fenced_leader_epoch,
        "read with leader epoch 4 < 5",
    )
    assert_error(
        write(broker, g, tid, 1, state_epoch=0, leader_epoch=4, start=0, batches=[(0, 0, 2, 1)]),
        ErrorCode.fenced_leader_epoch,
        "write with leader epoch 4 < 5",
    )
    got = read(broker, g, tid, 1, leader_epoch=5)
    assert_ok(got, "read with leader epoch 5")
    assert batches_of(got) == [], "a fenced write must not change the state"

    assert_ok(
        write(broker, g, tid, 1, state_epoch=0, leader_epoch=6, start=0, batches=[(0, 0, 2, 1)]),
        "write with leader epoch 6",
    )
    # Kafka 4.2: a write's record carries the stored leader epoch; only a read moves it.
    assert summary(broker, g, tid, 1).leader_epoch == 5
    assert_ok(read(broker, g, tid, 1, leader_epoch=6), "read with leader epoch 6")
    assert summary(broker, g, tid, 1).leader_epoch == 6
    assert_error(
        read(broker, g, tid, 1, leader_epoch=5),
        ErrorCode.fenced_leader_epoch,
        "read with leader epoch 5 after a read with 6",
    )


def test_unknown_key_is_invalid_request_with_a_message(broker: Broker) -> None:
    # Kafka's share coordinator: read/write of uninitialized state is INVALID_REQUEST; the
    # summary of a key with no state answers the uninitialized defaults.
    g, tid = "g-unknown", uuid.uuid4()
    assert_error(read(broker, g, tid, 0, leader_epoch=0), ErrorCode.invalid_request, "read")
    assert_error(
        write(broker, g, tid, 0, state_epoch=0, leader_epoch=0, start=0, batches=[(0, 0, 2, 1)]),
        ErrorCode.invalid_request,
        "write",
    )
    s = summary(broker, g, tid, 0)
    assert_ok(s, "summary")
    assert (s.state_epoch, s.leader_epoch, s.start_offset) == (0, 0, -1)
    # A known key in another group or partition does not make this one known.
    assert_ok(initialize(broker, "g-other", tid, 0, state_epoch=0, start=0), "initialize other")
    assert_error(
        read(broker, g, tid, 0, leader_epoch=0),
        ErrorCode.invalid_request,
        "read (other group known)",
    )
    assert_error(
        read(broker, "g-other", tid, 1, leader_epoch=0),
        ErrorCode.invalid_request,
        "read (other partition known)",
    )


def test_each_partition_of_a_request_gets_its_own_result(broker: Broker) -> None:
    g, tid = "g-per-partition", uuid.uuid4()
    assert_ok(initialize(broker, g, tid, 0, state_epoch=0, start=7), "initialize")
    body = {
        "group_id": g,
        "topics": [
            {
                "topic_id": tid,
                "partitions": [
                    {"partition": 0, "leader_epoch": 0},
                    {"partition": 1, "leader_epoch": 0},
                ],
            }
        ],
    }
    (result,) = call(broker, READ, 0, body).results
    by_partition = {int(p.partition): p for p in result.partitions}
    assert set(by_partition) == {0, 1}
    assert_ok(by_partition[0], "read partition 0")
    assert by_partition[0].start_offset == 7
    assert_error(by_partition[1], ErrorCode.invalid_request, "read partition 1")


def test_deleted_state_reads_as_unknown_and_can_be_initialized_again(broker: Broker) -> None:
    g, tid = "g-delete", uuid.uuid4()
    assert_ok(initialize(broker, g, tid, 0, state_epoch=2, start=0), "initialize")
    assert_ok(
        write(broker, g, tid, 0, state_epoch=2, leader_epoch=0, start=3, batches=[(3, 9, 0, 1)]),
        "write",
    )
    assert_ok(delete(broker, g, tid, 0), "delete")

    assert_error(read(broker, g, tid, 0, leader_epoch=0), ErrorCode.invalid_request, "r")
    s = summary(broker, g, tid, 0)
    assert_ok(s, "summary")
    assert (s.state_epoch, s.leader_epoch, s.start_offset) == (0, 0, -1)
    assert_error(
        write(broker, g, tid, 0, state_epoch=2, leader_epoch=0, start=-1),
        ErrorCode.invalid_request,
        "write after delete",
    )
    # Deleting what is not there is not an error.
    assert_ok(delete(broker, g, tid, 0), "delete again")
    assert_ok(delete(broker, g, uuid.uuid4(), 0), "delete of a never-initialized key")

    assert_ok(initialize(broker, g, tid, 0, state_epoch=0, start=20), "initialize again")
    got = read(broker, g, tid, 0, leader_epoch=0)
    assert_ok(got, "read after re-initialize")
    assert (got.state_epoch, got.start_offset, batches_of(got)) == (0, 20, [])


@pytest.mark.parametrize(
    "bad_batch",
    [(0, 4, 7, 1), (0, 4, 1, 1), (0, 4, 5, 1), (9, 4, 2, 1)],
    ids=["delivery-state-7", "delivery-state-1-acquired", "delivery-state-5", "first-after-last"],
)
def test_malformed_state_batch_is_invalid_request_and_changes_nothing(
    broker: Broker, bad_batch: Batch
) -> None:
    g, tid = "g-invalid", uuid.uuid4()
    assert_ok(initialize(broker, g, tid, 0, state_epoch=0, start=0), "initialize")
    good = [(0, 1, ACKNOWLEDGED, 1)]
    assert_ok(write(broker, g, tid, 0, state_epoch=0, leader_epoch=0, start=0, batches=good), "w")
    result = write(
        broker,
        g,
        tid,
        0,
        state_epoch=0,
        leader_epoch=0,
        start=-1,
        batches=[(10, 12, AVAILABLE, 1), bad_batch],
    )
    assert_error(result, ErrorCode.invalid_request, f"write with batch {bad_batch}")
    got = read(broker, g, tid, 0, leader_epoch=0)
    assert batches_of(got) == good, "a rejected write must not apply any of its batches"


def test_an_archiving_batch_is_stored_and_read_back(broker: Broker) -> None:
    # KIP-1191's Archiving state (3): a record waiting for its dead-letter copy.
    g, tid = "g-archiving", uuid.uuid4()
    assert_ok(initialize(broker, g, tid, 0, state_epoch=0, start=0), "initialize")
    batches = [(0, 1, ACKNOWLEDGED, 1), (2, 2, 3, 5)]
    assert_ok(
        write(broker, g, tid, 0, state_epoch=0, leader_epoch=0, start=0, batches=batches), "w"
    )
    assert batches_of(read(broker, g, tid, 0, leader_epoch=0)) == batches


@pytest.mark.parametrize("bad_first", [False, True])
def test_a_malformed_partition_fails_alone_beside_a_good_one_in_the_same_write(
    broker: Broker, bad_first: bool
) -> None:
    # The good partitions of a request share one append; a refused one is not part of it.
    g, tid = "g-invalid-beside", uuid.uuid4()
    for p in (0, 1):
        assert_ok(initialize(broker, g, tid, p, state_epoch=0, start=0), f"initialize {p}")

    def part(p: int, state: int) -> dict[str, Any]:
        batch = {"first_offset": 0, "last_offset": 1, "delivery_state": state, "delivery_count": 1}
        return {
            "partition": p,
            "state_epoch": 0,
            "leader_epoch": 0,
            "start_offset": -1,
            "delivery_complete_count": -1,
            "state_batches": [batch],
        }

    parts = [part(0, 2), part(1, 7)]
    if bad_first:
        parts.reverse()
    body = {"group_id": g, "topics": [{"topic_id": tid, "partitions": parts}]}
    (result,) = call(broker, WRITE, 1, body).results
    good, bad = sorted(result.partitions, key=lambda r: r.partition)
    assert_error(bad, ErrorCode.invalid_request, "delivery state 7")
    assert_ok(good, "the good partition beside it")
    assert batches_of(read(broker, g, tid, 0, leader_epoch=0)) == [(0, 1, ACKNOWLEDGED, 1)]
    assert batches_of(read(broker, g, tid, 1, leader_epoch=0)) == []


@pytest.mark.parametrize("api", ["initialize", "read", "write", "delete", "summary"])
def test_empty_group_id_gets_an_empty_response(broker: Broker, api: str) -> None:
    # Kafka's ShareCoordinatorService answers an empty group id with no results at all.
    tid = uuid.uuid4()
    key, version, partition = {
        "initialize": (INITIALIZE, 0, {"partition": 0, "state_epoch": 0, "start_offset": 0}),
        "read": (READ, 0, {"partition": 0, "leader_epoch": 0}),
        "write": (
            WRITE,
            1,
            {
                "partition": 0,
                "state_epoch": 0,
                "leader_epoch": 0,
                "start_offset": 0,
                "state_batches": [],
            },
        ),
        "delete": (DELETE, 0, {"partition": 0}),
        "summary": (SUMMARY, 1, {"partition": 0, "leader_epoch": 0}),
    }[api]
    topics = [{"topic_id": tid, "partitions": [partition]}]
    response = call(broker, key, version, {"group_id": "", "topics": topics})
    assert response.results == (), f"{api} with group id '': {response}"


@pytest.mark.timeout(120)
def test_share_state_survives_a_clean_restart_and_a_kill9(broker: Broker) -> None:
    g, tid = "g-restart", uuid.uuid4()
    assert_ok(initialize(broker, g, tid, 0, state_epoch=1, start=0), "initialize p0")
    assert_ok(initialize(broker, g, tid, 1, state_epoch=0, start=100), "initialize p1")
    assert_ok(read(broker, g, tid, 0, leader_epoch=3), "read p0 with leader epoch 3")
    batches = [(0, 4, ACKNOWLEDGED, 1), (5, 5, AVAILABLE, 2), (6, 9, ARCHIVED, 5)]
    assert_ok(
        write(broker, g, tid, 0, state_epoch=1, leader_epoch=3, start=2, batches=batches), "w"
    )
    assert_ok(initialize(broker, g, tid, 2, state_epoch=0, start=0), "initialize p2")
    assert_ok(delete(broker, g, tid, 2), "delete p2")
    expected = [(2, 4, ACKNOWLEDGED, 1), (5, 5, AVAILABLE, 2), (6, 9, ARCHIVED, 5)]

    def check(when: str) -> None:
        p0 = read(broker, g, tid, 0, leader_epoch=3)
        assert_ok(p0, f"read p0 {when}")
        assert (p0.state_epoch, p0.start_offset, batches_of(p0)) == (1, 2, expected), when
        s0 = summary(broker, g, tid, 0)
        assert (s0.state_epoch, s0.leader_epoch, s0.start_offset) == (1, 3, 2), when
        p1 = read(broker, g, tid, 1, leader_epoch=0)
        assert_ok(p1, f"read p1 {when}")
        assert (p1.state_epoch, p1.start_offset, batches_of(p1)) == (0, 100, []), when
        assert_error(
            read(broker, g, tid, 2, leader_epoch=0),
            ErrorCode.invalid_request,
            f"deleted p2 {when}",
        )
        assert_error(
            read(broker, g, tid, 0, leader_epoch=2),
            ErrorCode.fenced_leader_epoch,
            f"older leader epoch {when}",
        )

    check("before any restart")
    broker.restart()
    check("after a clean restart")
    # Acknowledged writes are fsynced: nothing acknowledged is lost to kill -9.
    assert_ok(
        write(
            broker, g, tid, 1, state_epoch=0, leader_epoch=0, start=-1, batches=[(100, 101, 4, 1)]
        ),
        "write p1 before kill9",
    )
    broker.kill9()
    broker.start()
    p1 = read(broker, g, tid, 1, leader_epoch=0)
    assert_ok(p1, "read p1 after kill9")
    assert batches_of(p1) == [(100, 101, ARCHIVED, 1)]
    p0 = read(broker, g, tid, 0, leader_epoch=3)
    assert (p0.state_epoch, p0.start_offset, batches_of(p0)) == (1, 2, expected)
