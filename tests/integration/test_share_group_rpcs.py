"""Share-group RPCs on the wire: heartbeat rules, session timeouts, ListGroups,
ShareFetch/ShareAcknowledge sessions and Renew (v2), driven with spool's own client so
each Kafka error code is visible."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from protocol.client import KafkaClient
from protocol.errors import ErrorCode
from tests.integration.conftest import Broker, create_topic
from tests.integration.share_helpers import (
    earliest,
    heartbeat,
    heartbeat_until_assigned,
    produce_values,
    share_ack_body,
    share_fetch_body,
    topic_id,
)
from tests.integration.share_helpers import run_wire as run  # one connection per scenario

pytestmark = pytest.mark.timeout(120)

HEARTBEAT, DESCRIBE, LIST_GROUPS, FETCH, ACK = 76, 77, 16, 78, 79
ACCEPT, RELEASE, RENEW = 1, 2, 4


def fetch_body(
    group: str,
    member: str,
    epoch: int,
    tid: uuid.UUID,
    *,
    version: int = 1,
    acks: list[dict[str, Any]] | None = None,
    max_wait: int = 0,
    renew: bool = False,
) -> dict[str, Any]:
    """A ShareFetch of partition 0 of `tid`, up to 100 records."""
    return share_fetch_body(
        group,
        member,
        epoch,
        {(tid, 0): acks or []},
        version=version,
        max_wait=max_wait,
        renew=renew,
        max_records=100,
        batch_size=100,
    )


def ack_body(
    group: str, member: str, epoch: int, tid: uuid.UUID, batches: list[dict[str, Any]]
) -> dict[str, Any]:
    """A ShareAcknowledge of partition 0 of `tid`."""
    return share_ack_body(group, member, epoch, {(tid, 0): batches})


def test_heartbeat_errors_follow_kafka(broker_factory: Callable[..., Broker]) -> None:
    # Kafka's heartbeat interval (5 s), not the test brokers' shorter one.
    broker = broker_factory(
        {"group.share.min.heartbeat.interval.ms": None, "group.share.heartbeat.interval.ms": None}
    )
    create_topic(broker, "hb", partitions=2)
    member = uuid.uuid4().hex

    async def scenario(client: KafkaClient) -> None:
        joined = await heartbeat(client, "g-hb", member, 0, ["hb"])
        assert joined.error_code == ErrorCode.none
        assert joined.member_epoch > 0
        # Nothing is assigned before the share state is initialized (Kafka 4.2); a later
        # heartbeat gets both partitions, at the epoch their initialization bumped to.
        assert not joined.assignment.topic_partitions
        assert joined.heartbeat_interval.total_seconds() * 1000 == 5000
        joined = await heartbeat_until_assigned(client, "g-hb", member, joined.member_epoch)
        assert sorted(joined.assignment.topic_partitions[0].partitions) == [0, 1]
        stale = await heartbeat(client, "g-hb", member, joined.member_epoch + 5)
        assert stale.error_code == ErrorCode.fenced_member_epoch
        stranger = await heartbeat(client, "g-hb", uuid.uuid4().hex, 3)
        assert stranger.error_code == ErrorCode.unknown_member_id
        steady = await heartbeat(client, "g-hb", member, joined.member_epoch)
        assert steady.error_code == ErrorCode.none
        assert steady.assignment is None  # unchanged assignment is not resent
        left = await heartbeat(client, "g-hb", member, -1)
        assert left.error_code == ErrorCode.none
        assert left.member_epoch == -1
        described = await client.request(
            DESCRIBE, 1, {"group_ids": ["g-hb", "no-such"], "include_authorized_operations": False}
        )
        by_id = {g.group_id: g for g in described.groups}
        assert by_id["g-hb"].group_state == "Empty"
        assert by_id["no-such"].error_code == ErrorCode.group_id_not_found

    run(broker, scenario)


def test_member_without_heartbeats_is_removed_after_the_session_timeout(
    broker_factory: Callable[..., Broker],
) -> None:
    broker = broker_factory(
        {
            "group.share.min.session.timeout.ms": "1000",
            "group.share.session.timeout.ms": "1500",
            "group.share.min.heartbeat.interval.ms": "500",
            "group.share.heartbeat.interval.ms": "500",
        }
    )
    create_topic(broker, "quiet", partitions=1)

    async def scenario(client: KafkaClient) -> None:
        joined = await heartbeat(client, "g-quiet", "m-quiet", 0, ["quiet"])
        assert joined.error_code == ErrorCode.none
        deadline = time.monotonic() + 20
        state = None
        while time.monotonic() < deadline:
            described = await client.request(
                DESCRIBE, 1, {"group_ids": ["g-quiet"], "include_authorized_operations": False}
            )
            state = described.groups[0].group_state
            if state == "Empty":
                break
            await asyncio.sleep(0.2)
        assert state == "Empty"
        again = await heartbeat(client, "g-quiet", "m-quiet", joined.member_epoch)
        assert again.error_code == ErrorCode.unknown_member_id

    run(broker, scenario)
    assert "reason=session_timeout" in broker.log_path.read_text()


def test_list_groups_filters_share_groups_by_type_and_state(broker: Broker) -> None:
    create_topic(broker, "lg", partitions=1)

    async def scenario(client: KafkaClient) -> None:
        assert (await heartbeat(client, "g-list-a", "m1", 0, ["lg"])).error_code == 0
        assert (await heartbeat(client, "g-list-b", "m2", 0, ["lg"])).error_code == 0
        assert (await heartbeat(client, "g-list-b", "m2", -1)).error_code == 0
        everything = await client.request(LIST_GROUPS, 5, {"states_filter": [], "types_filter": []})
        groups = {g.group_id: (g.group_state, g.group_type) for g in everything.groups}
        assert groups == {"g-list-a": ("Stable", "share"), "g-list-b": ("Empty", "share")}
        stable = await client.request(
            LIST_GROUPS, 5, {"states_filter": ["Stable"], "types_filter": ["share"]}
        )
        assert [g.group_id for g in stable.groups] == ["g-list-a"]
        consumer_only = await client.request(
            LIST_GROUPS, 5, {"states_filter": [], "types_filter": ["consumer"]}
        )
        assert consumer_only.groups == ()

    run(broker, scenario)


def test_share_session_epochs_and_acknowledgements_on_open(broker: Broker) -> None:
    create_topic(broker, "sess", partitions=1)
    earliest(broker, "g-sess")
    produce_values(broker, "sess", [b"a", b"b"])

    async def scenario(client: KafkaClient) -> None:
        member = "m-sess"
        assert (await heartbeat(client, "g-sess", member, 0, ["sess"])).error_code == 0
        tid = await topic_id(client, "sess")
        ack = [{"first_offset": 0, "last_offset": 0, "acknowledge_types": [ACCEPT]}]
        opening_with_acks = await client.request(
            FETCH, 1, fetch_body("g-sess", member, 0, tid, acks=ack)
        )
        assert opening_with_acks.error_code == ErrorCode.invalid_request
        unknown = await client.request(FETCH, 1, fetch_body("g-sess", member, 4, tid))
        assert unknown.error_code == ErrorCode.share_session_not_found
        opened = await client.request(FETCH, 1, fetch_body("g-sess", member, 0, tid))
        assert opened.error_code == ErrorCode.none
        (acquired,) = opened.responses[0].partitions[0].acquired_records
        assert (acquired.first_offset, acquired.last_offset, acquired.delivery_count) == (0, 1, 1)
        skipped = await client.request(FETCH, 1, fetch_body("g-sess", member, 3, tid))
        assert skipped.error_code == ErrorCode.invalid_share_session_epoch
        release = [{"first_offset": 0, "last_offset": 1, "acknowledge_types": [RELEASE]}]
        released = await client.request(ACK, 1, ack_body("g-sess", member, 1, tid, release))
        assert released.responses[0].partitions[0].error_code == ErrorCode.none
        # Released records are Available, held by nobody: accepting them is refused.
        accept = [{"first_offset": 0, "last_offset": 1, "acknowledge_types": [ACCEPT]}]
        again = await client.request(ACK, 1, ack_body("g-sess", member, 2, tid, accept))
        assert again.responses[0].partitions[0].error_code == ErrorCode.invalid_record_state
        closed = await client.request(FETCH, 1, fetch_body("g-sess", member, -1, tid))
        assert closed.error_code == ErrorCode.none
        after_close = await client.request(FETCH, 1, fetch_body("g-sess", member, 4, tid))
        assert after_close.error_code == ErrorCode.share_session_not_found

    run(broker, scenario)


def test_renew_keeps_records_locked_past_their_first_deadline(
    broker_factory: Callable[..., Broker],
) -> None:
    broker = broker_factory(
        {
            "group.share.min.record.lock.duration.ms": "1000",
            "group.share.record.lock.duration.ms": "2000",
        }
    )
    create_topic(broker, "renew", partitions=1)
    earliest(broker, "g-renew")
    produce_values(broker, "renew", [b"slow-job"])

    async def scenario(client: KafkaClient) -> None:
        holder, other = "m-holder", "m-other"
        assert (await heartbeat(client, "g-renew", holder, 0, ["renew"])).error_code == 0
        assert (await heartbeat(client, "g-renew", other, 0, ["renew"])).error_code == 0
        tid = await topic_id(client, "renew")
        got = await client.request(FETCH, 2, fetch_body("g-renew", holder, 0, tid, version=2))
        assert got.acquisition_lock_timeout.total_seconds() == 2
        assert len(got.responses[0].partitions[0].acquired_records) == 1
        opened = await client.request(FETCH, 2, fetch_body("g-renew", other, 0, tid, version=2))
        assert opened.responses[0].partitions[0].acquired_records == ()
        renew = [{"first_offset": 0, "last_offset": 0, "acknowledge_types": [RENEW]}]
        epoch = 1
        # Renew every 0.5 s for 4 s: twice the lock duration.
        for _ in range(8):
            await asyncio.sleep(0.5)
            renewed = await client.request(
                ACK,
                2,
                {
                    "group_id": "g-renew",
                    "member_id": holder,
                    "share_session_epoch": epoch,
                    "is_renew_ack": True,
                    "topics": [
                        {
                            "topic_id": tid,
                            "partitions": [
                                {"partition_index": 0, "acknowledgement_batches": renew}
                            ],
                        }
                    ],
                },
            )
            epoch += 1
            assert renewed.responses[0].partitions[0].error_code == ErrorCode.none
        stolen = await client.request(FETCH, 2, fetch_body("g-renew", other, 1, tid, version=2))
        assert stolen.responses[0].partitions[0].acquired_records == ()
        # Without renewals the lock runs out and the record goes to the other member.
        deadline = time.monotonic() + 15
        other_epoch, redelivered = 2, ()
        while time.monotonic() < deadline and not redelivered:
            await asyncio.sleep(0.5)
            r = await client.request(
                FETCH, 2, fetch_body("g-renew", other, other_epoch, tid, version=2)
            )
            other_epoch += 1
            redelivered = r.responses[0].partitions[0].acquired_records if r.responses else ()
        assert [(a.first_offset, a.delivery_count) for a in redelivered] == [(0, 2)]

    run(broker, scenario)


def test_groups_and_group_configs_survive_a_restart(broker: Broker) -> None:
    create_topic(broker, "durable-group", partitions=2)
    earliest(broker, "g-durable")

    async def join(client: KafkaClient) -> None:
        joined = await heartbeat(client, "g-durable", "m-durable", 0, ["durable-group"])
        assert joined.error_code == ErrorCode.none
        await heartbeat_until_assigned(client, "g-durable", "m-durable", joined.member_epoch)

    run(broker, join)
    broker.kill9()
    broker.start()

    async def after(client: KafkaClient) -> None:
        described = await client.request(
            DESCRIBE, 1, {"group_ids": ["g-durable"], "include_authorized_operations": False}
        )
        (group,) = described.groups
        assert group.error_code == ErrorCode.none
        assert [m.member_id for m in group.members] == ["m-durable"]
        assert sorted(group.members[0].assignment.topic_partitions[0].partitions) == [0, 1]
        configs = await client.request(
            32,
            4,
            {
                "resources": [
                    {
                        "resource_type": 32,
                        "resource_name": "g-durable",
                        "configuration_keys": ["share.auto.offset.reset"],
                    }
                ],
                "include_synonyms": False,
                "include_documentation": False,
            },
        )
        (entry,) = configs.results[0].configs
        assert (entry.name, entry.value) == ("share.auto.offset.reset", "earliest")

    run(broker, after)


def test_closing_the_connection_releases_the_members_records_at_once(
    broker_factory: Callable[..., Broker],
) -> None:
    # A 60 s lock: only the disconnect, not lock expiry, can hand the record over in time.
    broker = broker_factory({"group.share.record.lock.duration.ms": "60000"})
    create_topic(broker, "hangup", partitions=1)
    earliest(broker, "g-hangup")
    produce_values(broker, "hangup", [b"held"])

    async def holder(client: KafkaClient) -> None:
        assert (await heartbeat(client, "g-hangup", "m-gone", 0, ["hangup"])).error_code == 0
        tid = await topic_id(client, "hangup")
        got = await client.request(FETCH, 1, fetch_body("g-hangup", "m-gone", 0, tid))
        assert len(got.responses[0].partitions[0].acquired_records) == 1
        # `run` closes the connection without closing the share session.

    run(broker, holder)

    async def other(client: KafkaClient) -> None:
        assert (await heartbeat(client, "g-hangup", "m-next", 0, ["hangup"])).error_code == 0
        tid = await topic_id(client, "hangup")
        epoch, acquired = 0, ()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not acquired:
            r = await client.request(
                FETCH, 1, fetch_body("g-hangup", "m-next", epoch, tid, max_wait=500)
            )
            epoch += 1
            acquired = r.responses[0].partitions[0].acquired_records if r.responses else ()
        assert [(a.first_offset, a.delivery_count) for a in acquired] == [(0, 2)]

    run(broker, other)
