"""Kafka 4.2's failure semantics for share clients, on the wire.

- A member's acquired records are released when its share session closes
  (ShareSessionEpoch -1, after that request's acknowledgements), when its connection
  drops, or when their locks expire; never because a heartbeat says the member left.
- FENCED_STATE_EPOCH from the share coordinator reaches share clients as
  NOT_LEADER_OR_FOLLOWER on the partition.
- ShareGroupHeartbeat, ShareFetch and ShareAcknowledge request validation.
- ApiVersions advertises what a default Kafka 4.2 broker advertises.
- The share coordinator's answers for never-initialized state.

Raw requests go through spool's own `KafkaClient`; the close race uses confluent-kafka
ShareConsumers in explicit acknowledgement mode.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType, Producer, TopicPartition

from protocol.client import KafkaClient
from protocol.errors import ErrorCode
from tests.integration.conftest import Broker, create_topic, producer_config
from tests.integration.share_helpers import (
    PollLog,
    close_quietly,
    earliest,
    heartbeat,
    log_lines,
    poll_once,
    produce_values,
    run_wire,
    share_consumer,
    topic_id,
)
from tests.integration.share_helpers import (
    share_ack_body as ack_body,
)
from tests.integration.share_helpers import (
    share_fetch_body as fetch_body,
)

pytestmark = pytest.mark.timeout(180)

HEARTBEAT, DESCRIBE, FETCH, ACK, API_VERSIONS, METADATA = 76, 77, 78, 79, 18, 3
INITIALIZE, READ, WRITE, DELETE, SUMMARY = 83, 84, 85, 86, 87
GAP, ACCEPT, RELEASE, REJECT, RENEW = 0, 1, 2, 3, 4


# --- wire helpers ---------------------------------------------------------------------


def batch(first: int, last: int, *types: int) -> dict[str, Any]:
    return {"first_offset": first, "last_offset": last, "acknowledge_types": list(types)}


def partitions_of(response: Any) -> dict[tuple[uuid.UUID, int], Any]:
    return {
        (t.topic_id, int(p.partition_index)): p for t in response.responses for p in t.partitions
    }


def acquired(response: Any) -> dict[tuple[uuid.UUID, int], list[tuple[int, int, int]]]:
    """(topic id, partition) -> [(first, last, delivery count)] of a ShareFetch response."""
    return {
        tp: [(a.first_offset, a.last_offset, a.delivery_count) for a in p.acquired_records]
        for tp, p in partitions_of(response).items()
        if p.acquired_records
    }


async def fetch_until_acquired(
    client: KafkaClient,
    group: str,
    member: str,
    epoch: int,
    partitions: dict[tuple[uuid.UUID, int], list[dict[str, Any]]],
    timeout_s: float = 15,
) -> tuple[int, Any]:
    """ShareFetch (opening with `epoch`) until something is acquired; returns the next
    epoch and the response that acquired."""
    deadline = time.monotonic() + timeout_s
    while True:
        r = await client.request(
            FETCH, 1, fetch_body(group, member, epoch, partitions, max_wait=500)
        )
        assert r.error_code == ErrorCode.none, r
        epoch += 1
        partitions = {tp: [] for tp in partitions}
        if acquired(r) or time.monotonic() >= deadline:
            return epoch, r


# --- 1. records are released on session close, disconnect or lock expiry, not on leave ---


def test_leave_heartbeat_keeps_the_session_and_its_records_until_the_final_acknowledge(
    broker_factory: Callable[..., Broker],
) -> None:
    """The member leaves first, then closes its session with acknowledgements: they all
    apply, the unacknowledged record is released, and nothing accepted comes back."""
    broker = broker_factory({"group.share.record.lock.duration.ms": "60000"})
    create_topic(broker, "leave-first", partitions=2)
    earliest(broker, "g-leave-first")
    produce_values(broker, "leave-first", [b"a0", b"a1", b"a2"], partition=0)
    produce_values(broker, "leave-first", [b"b0", b"b1"], partition=1)

    async def scenario(client: KafkaClient) -> None:
        g, m = "g-leave-first", "m-leaver"
        joined = await heartbeat(client, g, m, 0, ["leave-first"])
        assert joined.error_code == ErrorCode.none
        tid = await topic_id(client, "leave-first")
        tps = {(tid, 0): [], (tid, 1): []}
        got: dict[tuple[uuid.UUID, int], list[tuple[int, int, int]]] = {}
        epoch = 0
        deadline = time.monotonic() + 15
        while set(got) != set(tps) and time.monotonic() < deadline:
            r = await client.request(FETCH, 1, fetch_body(g, m, epoch, tps, max_wait=500))
            assert r.error_code == ErrorCode.none
            epoch += 1
            got.update(acquired(r))
        assert got == {(tid, 0): [(0, 2, 1)], (tid, 1): [(0, 1, 1)]}

        left = await heartbeat(client, g, m, -1)
        assert left.error_code == ErrorCode.none
        # The member is gone from the group, but its share session is not: the final
        # acknowledgements apply (offset 2 of partition 0 stays unacknowledged).
        final = await client.request(
            ACK,
            1,
            ack_body(g, m, -1, {(tid, 0): [batch(0, 1, ACCEPT)], (tid, 1): [batch(0, 1, REJECT)]}),
        )
        assert final.error_code == ErrorCode.none, final
        results = {tp: p.error_code for tp, p in partitions_of(final).items()}
        assert results == {(tid, 0): ErrorCode.none, (tid, 1): ErrorCode.none}
        gone = await client.request(ACK, 1, ack_body(g, m, 1, {(tid, 0): []}))
        assert gone.error_code == ErrorCode.share_session_not_found

        # Another member gets exactly the released record, with its second delivery.
        other = "m-after"
        assert (await heartbeat(client, g, other, 0, ["leave-first"])).error_code == 0
        _, r = await fetch_until_acquired(client, g, other, 0, tps)
        assert acquired(r) == {(tid, 0): [(2, 2, 2)]}

    run_wire(broker, scenario)


def test_session_timeout_keeps_acquired_records_until_their_locks_expire(
    broker_factory: Callable[..., Broker],
) -> None:
    """Kafka 4.2 releases nothing when the group coordinator fences a member by session
    timeout: the share session lives on and its records stay locked until the lock
    expires (or the session closes, or the connection drops)."""
    broker = broker_factory(
        {
            "group.share.min.session.timeout.ms": "1000",
            "group.share.session.timeout.ms": "1000",
            "group.share.min.heartbeat.interval.ms": "500",
            "group.share.heartbeat.interval.ms": "500",
            "group.share.min.record.lock.duration.ms": "1000",
            "group.share.record.lock.duration.ms": "6000",
        }
    )
    create_topic(broker, "fenced", partitions=1)
    earliest(broker, "g-fenced")
    produce_values(broker, "fenced", [b"x"])

    async def scenario(client: KafkaClient) -> None:
        g = "g-fenced"
        assert (await heartbeat(client, g, "m-silent", 0, ["fenced"])).error_code == 0
        tid = await topic_id(client, "fenced")
        tps = {(tid, 0): []}
        _, r = await fetch_until_acquired(client, g, "m-silent", 0, tps)
        acquired_at = time.monotonic()
        assert acquired(r) == {(tid, 0): [(0, 0, 1)]}

        # Another member keeps heartbeating while "m-silent" stops and is fenced.
        busy = await heartbeat(client, g, "m-busy", 0, ["fenced"])
        assert busy.error_code == ErrorCode.none
        busy_epoch = busy.member_epoch
        fenced = False
        while time.monotonic() - acquired_at < 4:
            hb = await heartbeat(client, g, "m-busy", busy_epoch)
            assert hb.error_code == ErrorCode.none, hb
            busy_epoch = hb.member_epoch
            described = await client.request(
                DESCRIBE, 1, {"group_ids": [g], "include_authorized_operations": False}
            )
            members = {m.member_id for m in described.groups[0].members}
            fenced = fenced or members == {"m-busy"}
            await asyncio.sleep(0.3)
        assert fenced, "m-silent was never fenced by session timeout"
        epoch, r = await fetch_until_acquired(client, g, "m-busy", 0, tps, timeout_s=0.1)
        assert acquired(r) == {}, "a fenced member's records were released before lock expiry"
        # The fenced member's session still exists (Kafka keeps it).
        still = await client.request(ACK, 1, ack_body(g, "m-silent", 1, {(tid, 0): []}))
        assert still.error_code == ErrorCode.none
        # Lock expiry hands the record over, with its second delivery.
        _, r = await fetch_until_acquired(client, g, "m-busy", epoch, tps, timeout_s=15)
        assert acquired(r) == {(tid, 0): [(0, 0, 2)]}
        assert time.monotonic() - acquired_at >= 5.5

    run_wire(broker, scenario)


def test_final_share_fetch_applies_its_acknowledgements_then_releases_the_rest(
    broker_factory: Callable[..., Broker],
) -> None:
    broker = broker_factory({"group.share.record.lock.duration.ms": "60000"})
    create_topic(broker, "final-fetch", partitions=2)
    earliest(broker, "g-final-fetch")
    produce_values(broker, "final-fetch", [b"p0-0", b"p0-1"], partition=0)
    produce_values(broker, "final-fetch", [b"p1-0", b"p1-1"], partition=1)

    async def scenario(client: KafkaClient) -> None:
        g, m = "g-final-fetch", "m-final"
        assert (await heartbeat(client, g, m, 0, ["final-fetch"])).error_code == 0
        tid = await topic_id(client, "final-fetch")
        tps = {(tid, 0): [], (tid, 1): []}
        got: dict[tuple[uuid.UUID, int], list[tuple[int, int, int]]] = {}
        epoch = 0
        deadline = time.monotonic() + 15
        while set(got) != set(tps) and time.monotonic() < deadline:
            r = await client.request(FETCH, 1, fetch_body(g, m, epoch, tps, max_wait=500))
            epoch += 1
            got.update(acquired(r))
        assert got == {(tid, 0): [(0, 1, 1)], (tid, 1): [(0, 1, 1)]}
        # Close with a ShareFetch: accept offset 0 of both partitions; a bad batch on
        # partition 1 (offset 9 was never delivered) fails only partition 1.
        final = await client.request(
            FETCH,
            1,
            fetch_body(
                g,
                m,
                -1,
                {(tid, 0): [batch(0, 0, ACCEPT)], (tid, 1): [batch(0, 0, ACCEPT)]},
            ),
        )
        assert final.error_code == ErrorCode.none, final
        codes = {tp: p.acknowledge_error_code for tp, p in partitions_of(final).items()}
        assert codes == {(tid, 0): ErrorCode.none, (tid, 1): ErrorCode.none}
        assert acquired(final) == {}

        other = "m-next"
        assert (await heartbeat(client, g, other, 0, ["final-fetch"])).error_code == 0
        got = {}
        epoch = 0
        deadline = time.monotonic() + 15
        while set(got) != set(tps) and time.monotonic() < deadline:
            r = await client.request(FETCH, 1, fetch_body(g, other, epoch, tps, max_wait=500))
            epoch += 1
            got.update(acquired(r))
        # Offset 1 of each partition was released by the close; offset 0 was accepted.
        assert got == {(tid, 0): [(1, 1, 2)], (tid, 1): [(1, 1, 2)]}

    run_wire(broker, scenario)


CLOSE_ROUNDS = 10
CONSUMERS_PER_ROUND = 2
PARTITIONS = 6
# Each round adds this many records to every partition, in small batches, so that one
# poll's records span several partitions and each close acknowledges on all of them.
RECORDS_PER_ROUND = 20


def test_consumers_that_acknowledge_and_close_at_once_lose_no_acknowledgement(
    broker_factory: Callable[..., Broker],
) -> None:
    """Explicit-mode ShareConsumers take a poll's worth of records on several partitions,
    acknowledge them all and close straight away, round after round: the close sends the
    final acknowledgements and the leave heartbeat together. Every acknowledgement must
    be confirmed without error, and nothing accepted may ever be delivered again."""
    broker = broker_factory({"group.share.record.lock.duration.ms": "60000"})
    topic, group = "ack-and-close", "g-ack-and-close"
    create_topic(broker, topic, partitions=PARTITIONS)
    earliest(broker, group)
    producer = Producer(producer_config(broker))

    lock = threading.Lock()
    produced: set[tuple[int, int]] = set()
    accepted: set[tuple[int, int]] = set()  # acknowledged ACCEPT by some consumer
    confirmed: set[tuple[int, int]] = set()  # confirmed by the broker without error
    failures: list[str] = []
    delivered_twice: list[tuple[int, int]] = []
    spans: list[int] = []  # partitions acknowledged by each close that had records
    round_done = threading.Event()

    def one_consumer(round_no: int, index: int) -> None:
        consumer = share_consumer(broker, group, [topic], **{"max.poll.records": 500})

        def on_commit(offsets: dict[TopicPartition, set[int]], error: Any) -> None:
            with lock:
                keys = {(tp.partition, o) for tp, offs in offsets.items() for o in offs}
                if error is not None:
                    failures.append(f"round {round_no} consumer {index}: {error} for {keys}")
                else:
                    confirmed.update(keys)

        consumer.set_acknowledgement_commit_callback(on_commit)
        log = PollLog()
        try:
            deadline = time.monotonic() + 20
            msgs = []
            while not msgs and not round_done.is_set() and time.monotonic() < deadline:
                msgs = poll_once(consumer, log)
            with lock:
                if msgs:
                    spans.append(len({msg.partition() for msg in msgs}))
                for msg in msgs:
                    key = (msg.partition(), msg.offset())
                    if key in accepted:
                        delivered_twice.append(key)
                    accepted.add(key)
                if produced <= accepted:
                    round_done.set()
            for msg in msgs:
                consumer.acknowledge(msg, AcknowledgeType.ACCEPT)
        finally:
            # No commit: close() sends the acknowledgements and leaves the group at once.
            close_quietly(consumer)

    for round_no in range(CLOSE_ROUNDS):
        for p in range(PARTITIONS):
            sent = produce_values(
                broker,
                topic,
                [f"{round_no}-{p}-{i}".encode() for i in range(RECORDS_PER_ROUND)],
                partition=p,
                batch=5,
                producer=producer,
            )
            with lock:
                produced.update((s.partition, s.offset) for s in sent)
        round_done.clear()
        threads = [
            threading.Thread(target=one_consumer, args=(round_no, i), daemon=True)
            for i in range(CONSUMERS_PER_ROUND)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads), f"round {round_no} did not finish"

    assert not failures, failures[:5]
    assert not delivered_twice, f"accepted records delivered again: {delivered_twice[:10]}"
    assert accepted, "the consumers got nothing"
    assert max(spans) > 1, f"no close acknowledged on several partitions: {spans}"
    assert accepted == confirmed, (
        f"acknowledgements without a confirmation: {sorted(accepted - confirmed)[:10]}"
    )

    # A later consumer drains the topic for a while: it must see exactly what was never
    # accepted (records a closing consumer held without handing them out), never again
    # what was.
    drainer = share_consumer(broker, group, [topic], **{"max.poll.records": 500})
    drained = PollLog()
    seen: set[tuple[int, int]] = set()
    try:
        quiet_until = time.monotonic() + 3
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (
            seen | accepted != produced or time.monotonic() < quiet_until
        ):
            msgs = poll_once(drainer, drained)
            for msg in msgs:
                seen.add((msg.partition(), msg.offset()))
                drainer.acknowledge(msg, AcknowledgeType.ACCEPT)
            if msgs:
                drainer.commit_sync()
    finally:
        close_quietly(drainer)
    redelivered = sorted(seen & accepted)
    assert not redelivered, f"accepted records delivered again: {redelivered[:10]}"
    missing = sorted(produced - seen - accepted)
    assert not missing, f"never delivered: {missing[:10]}"


# --- 2. FENCED_STATE_EPOCH reaches share clients as NOT_LEADER_OR_FOLLOWER ---------------


async def initialize_state(
    client: KafkaClient, group: str, tid: uuid.UUID, partition: int, state_epoch: int, start: int
) -> Any:
    r = await client.request(
        INITIALIZE,
        0,
        {
            "group_id": group,
            "topics": [
                {
                    "topic_id": tid,
                    "partitions": [
                        {"partition": partition, "state_epoch": state_epoch, "start_offset": start}
                    ],
                }
            ],
        },
    )
    return r.results[0].partitions[0]


async def fetch_until_acquired_by(
    client: KafkaClient,
    group: str,
    member: str,
    epoch: int,
    tps: dict[tuple[uuid.UUID, int], list[dict[str, Any]]],
    deadline: float,
    got: dict[tuple[uuid.UUID, int], list[tuple[int, int, int]]],
    codes: list[int],
) -> tuple[int, dict[tuple[uuid.UUID, int], list[tuple[int, int, int]]]]:
    """ShareFetch (300 ms long polls) on one partition until something is acquired or
    `deadline` passes; each response's partition error code goes to `codes`. Returns the
    next session epoch and what was acquired."""
    (tp,) = tps
    while not got and time.monotonic() < deadline:
        r = await client.request(FETCH, 1, fetch_body(group, member, epoch, tps, max_wait=300))
        epoch += 1
        codes.append(partitions_of(r)[tp].error_code)
        got = acquired(r)
    return epoch, got


def test_a_state_epoch_bumped_by_an_admin_reaches_the_member_as_not_leader_or_follower(
    broker_factory: Callable[..., Broker],
) -> None:
    """An admin InitializeShareGroupState (a newer state epoch) under a live share
    partition: the leader's next write is fenced by the share coordinator, and the share
    client is told NOT_LEADER_OR_FOLLOWER (retry after a metadata refresh), never
    UNKNOWN_SERVER_ERROR; the partition then serves from the new state."""
    broker = broker_factory({"group.share.record.lock.duration.ms": "60000"})
    create_topic(broker, "fenced-state", partitions=1)
    earliest(broker, "g-fenced-state")
    produce_values(broker, "fenced-state", [b"r0", b"r1", b"r2"])

    async def scenario(client: KafkaClient) -> None:
        g, m = "g-fenced-state", "m-fenced-state"
        assert (await heartbeat(client, g, m, 0, ["fenced-state"])).error_code == 0
        tid = await topic_id(client, "fenced-state")
        tps = {(tid, 0): []}
        epoch, r = await fetch_until_acquired(client, g, m, 0, tps)
        assert acquired(r) == {(tid, 0): [(0, 2, 1)]}

        # The admin resets the partition's state with a newer state epoch.
        reset = await initialize_state(client, g, tid, 0, state_epoch=5, start=1)
        assert reset.error_code == ErrorCode.none

        # The member's acknowledgement needs a state write: fenced.
        r = await client.request(
            FETCH, 1, fetch_body(g, m, epoch, {(tid, 0): [batch(0, 0, ACCEPT)]})
        )
        epoch += 1
        assert r.error_code == ErrorCode.none
        part = partitions_of(r)[(tid, 0)]
        assert part.acknowledge_error_code == ErrorCode.not_leader_or_follower, part
        assert part.error_code != ErrorCode.unknown_server_error, part

        # The leader reads the new state (at once, or on a later fetch): delivery
        # restarts at the admin's start offset.
        deadline = time.monotonic() + 15
        got = acquired(r)
        codes = [part.error_code]
        epoch, got = await fetch_until_acquired_by(client, g, m, epoch, tps, deadline, got, codes)
        assert ErrorCode.unknown_server_error not in codes, codes
        assert got == {(tid, 0): [(1, 2, 1)]}, (got, codes)

    run_wire(broker, scenario)
    assert not log_lines(broker, "request_failed"), log_lines(broker, "request_failed")[:3]


def test_a_lock_expiry_whose_state_write_is_fenced_drops_the_partition_for_the_new_state(
    broker_factory: Callable[..., Broker],
) -> None:
    """An acquisition writes nothing (KIP-932), so the first write after an admin's
    InitializeShareGroupState is the lock expiry's release: it is fenced, the leader drops
    its view, and the next fetch serves the admin's state, where the expired delivery was
    never recorded (delivery count 1 again), with no UNKNOWN_SERVER_ERROR on the way."""
    broker = broker_factory(
        {
            "group.share.min.record.lock.duration.ms": "1000",
            "group.share.record.lock.duration.ms": "1000",
        }
    )
    create_topic(broker, "fenced-expiry", partitions=1)
    earliest(broker, "g-fenced-expiry")
    produce_values(broker, "fenced-expiry", [b"first"])

    async def scenario(client: KafkaClient) -> None:
        g, m = "g-fenced-expiry", "m-fenced-expiry"
        assert (await heartbeat(client, g, m, 0, ["fenced-expiry"])).error_code == 0
        tid = await topic_id(client, "fenced-expiry")
        tps = {(tid, 0): []}
        epoch, r = await fetch_until_acquired(client, g, m, 0, tps)
        assert acquired(r) == {(tid, 0): [(0, 0, 1)]}
        assert (await initialize_state(client, g, tid, 0, 3, 0)).error_code == 0
        # The lock (1 s) expires; releasing the record writes with the old state epoch.
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not log_lines(
            broker, "share_state_write_failed", "operation=lock_expiry"
        ):
            await asyncio.sleep(0.1)
        fenced = log_lines(broker, "share_state_write_failed", "operation=lock_expiry")
        assert fenced and "error=not_leader_or_follower" in fenced[0], fenced
        produce_values(broker, "fenced-expiry", [b"second"])
        got: dict[tuple[uuid.UUID, int], list[tuple[int, int, int]]] = {}
        codes = []
        epoch, got = await fetch_until_acquired_by(client, g, m, epoch, tps, deadline, got, codes)
        assert ErrorCode.unknown_server_error not in codes, codes
        assert got == {(tid, 0): [(0, 1, 1)]}, (got, codes)

    run_wire(broker, scenario)
    assert not log_lines(broker, "request_failed"), log_lines(broker, "request_failed")[:3]


# --- 3. ShareGroupHeartbeat validation -------------------------------------------------


def test_heartbeat_validation_and_unknown_groups_answer_as_kafka(broker: Broker) -> None:
    create_topic(broker, "hb-rules", partitions=1)
    uuid_member = str(uuid.uuid4())  # 36 characters

    async def scenario(client: KafkaClient) -> None:
        async def code(group: str, member: str, epoch: int, **kw: Any) -> ErrorCode:
            return ErrorCode((await heartbeat(client, group, member, epoch, **kw)).error_code)

        assert await code("g-none", "m", 3) == ErrorCode.group_id_not_found
        assert await code("g-none", "m", -1) == ErrorCode.group_id_not_found
        assert await code("", "m", 0, topics=["hb-rules"]) == ErrorCode.invalid_request
        assert await code("", "m", 2) == ErrorCode.invalid_request
        assert await code("g-none", "", 0, topics=["hb-rules"]) == ErrorCode.invalid_request
        too_long = uuid_member + "0"
        assert await code("g-none", too_long, 0, topics=["hb-rules"]) == ErrorCode.invalid_request
        assert await code("g-none", "m", -2) == ErrorCode.invalid_request
        assert await code("g-none", "m", 0) == ErrorCode.invalid_request
        assert await code("g-none", "m", 0, topics=[]) == ErrorCode.invalid_request
        rack = await code("g-none", "m", 0, topics=["hb-rules"], rack="")
        assert rack == ErrorCode.invalid_request
        # None of the refused requests created the group.
        listed = await client.request(16, 5, {"states_filter": [], "types_filter": []})
        assert [g.group_id for g in listed.groups] == []

        joined = await heartbeat(client, "g-rules", uuid_member, 0, ["hb-rules"])
        assert joined.error_code == ErrorCode.none
        assert await code("g-rules", "stranger", 1) == ErrorCode.unknown_member_id
        assert await code("g-rules", "stranger", -1) == ErrorCode.unknown_member_id
        refused = await heartbeat(client, "g-rules", too_long, 1)
        assert refused.error_code == ErrorCode.invalid_request
        assert refused.error_message

    run_wire(broker, scenario)


# --- 4. ShareFetch / ShareAcknowledge validation ---------------------------------------


def test_share_fetch_and_acknowledge_refuse_a_bad_member_id_as_a_whole(broker: Broker) -> None:
    create_topic(broker, "member-ids", partitions=1)

    async def scenario(client: KafkaClient) -> None:
        tid = await topic_id(client, "member-ids")
        for member in ("", "m" * 37):
            for version in (1, 2):
                fetch = await client.request(
                    FETCH, version, fetch_body("g-ids", member, 0, {(tid, 0): []}, version=version)
                )
                assert fetch.error_code == ErrorCode.invalid_request, (member, version)
                assert fetch.responses == ()
                ack = await client.request(
                    ACK,
                    version,
                    ack_body(
                        "g-ids", member, 1, {(tid, 0): [batch(0, 0, ACCEPT)]}, version=version
                    ),
                )
                assert ack.error_code == ErrorCode.invalid_request, (member, version)
                assert ack.responses == ()
        # 36 characters is fine: the request gets as far as the session check.
        ok = await client.request(FETCH, 1, fetch_body("g-ids", "m" * 36, 1, {(tid, 0): []}))
        assert ok.error_code == ErrorCode.share_session_not_found

    run_wire(broker, scenario)


def test_renew_and_malformed_acknowledgements_fail_only_their_partition(
    broker_factory: Callable[..., Broker],
) -> None:
    broker = broker_factory({"group.share.record.lock.duration.ms": "60000"})
    create_topic(broker, "ack-rules", partitions=2)
    earliest(broker, "g-ack-rules")
    produce_values(broker, "ack-rules", [b"a", b"b", b"c"], partition=0)
    produce_values(broker, "ack-rules", [b"x", b"y", b"z"], partition=1)

    async def scenario(client: KafkaClient) -> None:
        g, m = "g-ack-rules", "m-ack-rules"
        assert (await heartbeat(client, g, m, 0, ["ack-rules"])).error_code == 0
        tid = await topic_id(client, "ack-rules")
        p0, p1 = (tid, 0), (tid, 1)
        got: dict[tuple[uuid.UUID, int], list[tuple[int, int, int]]] = {}
        epoch = 0
        deadline = time.monotonic() + 15
        while set(got) != {p0, p1} and time.monotonic() < deadline:
            r = await client.request(
                FETCH, 2, fetch_body(g, m, epoch, {p0: [], p1: []}, version=2, max_wait=500)
            )
            epoch += 1
            got.update(acquired(r))
        assert got == {p0: [(0, 2, 1)], p1: [(0, 2, 1)]}

        async def ack(version: int, batches: dict[Any, Any], renew: bool = False) -> dict[Any, Any]:
            nonlocal epoch
            r = await client.request(
                ACK, version, ack_body(g, m, epoch, batches, version=version, renew=renew)
            )
            epoch += 1
            assert r.error_code == ErrorCode.none, r
            return {tp: ErrorCode(p.error_code) for tp, p in partitions_of(r).items()}

        # Renew (4) in v1, and in v2 without IsRenewAck: that partition only is refused.
        ok = [batch(0, 0, ACCEPT)]
        assert await ack(1, {p0: [batch(1, 1, RENEW)], p1: ok}) == {
            p0: ErrorCode.invalid_request,
            p1: ErrorCode.none,
        }
        assert await ack(2, {p0: [batch(1, 1, RENEW)], p1: [batch(1, 1, ACCEPT)]}) == {
            p0: ErrorCode.invalid_request,
            p1: ErrorCode.none,
        }
        # With IsRenewAck in v2 it applies.
        assert await ack(2, {p0: [batch(1, 1, RENEW)]}, renew=True) == {p0: ErrorCode.none}
        # Malformed batches (Kafka's validateAcknowledgementBatches), each refused alone.
        for bad in (
            [batch(2, 1, ACCEPT)],  # first after last
            [batch(1, 2, ACCEPT, ACCEPT, ACCEPT)],  # three types for two offsets
            [batch(1, 1, 7)],  # no such type
            [batch(1, 1)],  # no type at all
            [batch(1, 2, ACCEPT), batch(0, 0, ACCEPT)],  # going backwards
        ):
            assert await ack(1, {p0: bad, p1: []}) == {p0: ErrorCode.invalid_request}, bad
        # The same rules on a ShareFetch's piggybacked acknowledgements.
        r = await client.request(
            FETCH, 1, fetch_body(g, m, epoch, {p0: [batch(2, 2, RENEW)], p1: [batch(2, 2, REJECT)]})
        )
        epoch += 1
        codes = {tp: p.acknowledge_error_code for tp, p in partitions_of(r).items()}
        assert codes == {p0: ErrorCode.invalid_request, p1: ErrorCode.none}
        # A renew-only ShareFetch (v2) must ask for nothing.
        r = await client.request(
            FETCH, 2, fetch_body(g, m, epoch, {p0: [batch(1, 1, RENEW)]}, version=2, renew=True)
        )
        assert r.error_code == ErrorCode.invalid_request
        assert "must be set to 0" in (r.error_message or "")
        r = await client.request(
            FETCH,
            2,
            fetch_body(
                g,
                m,
                epoch,
                {p0: [batch(1, 1, RENEW)]},
                version=2,
                renew=True,
                max_bytes=0,
                min_bytes=0,
                max_records=0,
            ),
        )
        assert r.error_code == ErrorCode.none, r
        assert partitions_of(r)[p0].acknowledge_error_code == ErrorCode.none

    run_wire(broker, scenario)


# --- 5. ApiVersions ----------------------------------------------------------------------

# What a default Kafka 4.2 broker advertises for the APIs spool serves: each request
# JSON's validVersions, minus a latestVersionUnstable last version (InitProducerId v6).
# Kafka advertises Produce from v0 for librdkafka's sake (KAFKA-18659) but serves v3+;
# spool advertises what it serves.
KAFKA_4_2_VERSIONS = {
    0: (3, 13),  # Produce
    1: (4, 18),  # Fetch
    2: (1, 11),  # ListOffsets
    3: (0, 13),  # Metadata
    8: (2, 10),  # OffsetCommit
    9: (1, 10),  # OffsetFetch
    10: (0, 6),  # FindCoordinator
    11: (0, 9),  # JoinGroup
    12: (0, 4),  # Heartbeat
    13: (0, 5),  # LeaveGroup
    14: (0, 5),  # SyncGroup
    15: (0, 6),  # DescribeGroups
    16: (0, 5),  # ListGroups
    17: (0, 1),  # SaslHandshake
    18: (0, 4),  # ApiVersions
    19: (2, 7),  # CreateTopics
    20: (1, 6),  # DeleteTopics
    21: (0, 2),  # DeleteRecords
    22: (0, 5),  # InitProducerId
    24: (0, 5),  # AddPartitionsToTxn
    25: (0, 4),  # AddOffsetsToTxn
    # Kafka serves EndTxn v5, which is transaction version 2 (KIP-890 part 2); spool has
    # transaction version 1 only, so it stops at v4 and clients use that.
    26: (0, 4),  # EndTxn
    27: (1, 2),  # WriteTxnMarkers
    28: (0, 5),  # TxnOffsetCommit
    29: (1, 3),  # DescribeAcls
    30: (1, 3),  # CreateAcls
    31: (1, 3),  # DeleteAcls
    32: (1, 4),  # DescribeConfigs
    36: (0, 2),  # SaslAuthenticate
    37: (0, 3),  # CreatePartitions
    42: (0, 2),  # DeleteGroups
    44: (0, 1),  # IncrementalAlterConfigs
    47: (0, 0),  # OffsetDelete
    50: (0, 0),  # DescribeUserScramCredentials
    51: (0, 0),  # AlterUserScramCredentials
    60: (0, 2),  # DescribeCluster
    65: (0, 0),  # DescribeTransactions
    66: (0, 2),  # ListTransactions
    68: (0, 1),  # ConsumerGroupHeartbeat
    69: (0, 1),  # ConsumerGroupDescribe
    76: (1, 1),  # ShareGroupHeartbeat
    77: (1, 1),  # ShareGroupDescribe
    78: (1, 2),  # ShareFetch
    79: (1, 2),  # ShareAcknowledge
    83: (0, 0),  # InitializeShareGroupState
    84: (0, 0),  # ReadShareGroupState
    85: (0, 1),  # WriteShareGroupState
    86: (0, 0),  # DeleteShareGroupState
    87: (0, 1),  # ReadShareGroupStateSummary
    90: (0, 1),  # DescribeShareGroupOffsets
    91: (0, 0),  # AlterShareGroupOffsets
    92: (0, 0),  # DeleteShareGroupOffsets
}


def test_api_versions_advertise_what_kafka_4_2_enables_by_default(broker: Broker) -> None:
    async def scenario(client: KafkaClient) -> None:
        r = await client.request(
            API_VERSIONS,
            3,
            {"client_software_name": "spool-it", "client_software_version": "1"},
        )
        assert r.error_code == ErrorCode.none
        advertised = {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in r.api_keys}
        assert advertised == KAFKA_4_2_VERSIONS

    run_wire(broker, scenario)


# --- 6. The share coordinator and never-initialized state --------------------------------


def test_share_coordinator_answers_never_initialized_state_as_kafka(broker: Broker) -> None:
    create_topic(broker, "uninit", partitions=1)

    async def scenario(client: KafkaClient) -> None:
        tid = await topic_id(client, "uninit")
        g = "g-never-initialized"
        topics_read = [{"topic_id": tid, "partitions": [{"partition": 0, "leader_epoch": 0}]}]
        read = await client.request(READ, 0, {"group_id": g, "topics": topics_read})
        part = read.results[0].partitions[0]
        assert part.error_code == ErrorCode.invalid_request
        assert "uninitialized share partition" in (part.error_message or "")

        write_part = {
            "partition": 0,
            "state_epoch": 0,
            "leader_epoch": 0,
            "start_offset": 0,
            "state_batches": [],
        }
        write = await client.request(
            WRITE, 0, {"group_id": g, "topics": [{"topic_id": tid, "partitions": [write_part]}]}
        )
        part = write.results[0].partitions[0]
        assert part.error_code == ErrorCode.invalid_request
        assert "uninitialized share partition" in (part.error_message or "")

        for version in (0, 1):
            summary = await client.request(SUMMARY, version, {"group_id": g, "topics": topics_read})
            part = summary.results[0].partitions[0]
            assert part.error_code == ErrorCode.none, part
            assert (part.state_epoch, part.leader_epoch, part.start_offset) == (0, 0, -1)
            if version >= 1:
                assert part.delivery_complete_count == -1

        # An empty group id, or no partitions, is answered with no results at all.
        for api, version, body in (
            (READ, 0, {"group_id": "", "topics": topics_read}),
            (SUMMARY, 1, {"group_id": "", "topics": topics_read}),
            (WRITE, 0, {"group_id": "", "topics": [{"topic_id": tid, "partitions": [write_part]}]}),
            (
                DELETE,
                0,
                {"group_id": "", "topics": [{"topic_id": tid, "partitions": [{"partition": 0}]}]},
            ),
            (READ, 0, {"group_id": g, "topics": [{"topic_id": tid, "partitions": []}]}),
        ):
            r = await client.request(api, version, body)
            assert r.results == (), (api, r)

    run_wire(broker, scenario)
