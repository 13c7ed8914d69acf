"""Helpers for the share-group integration tests: ShareConsumers, group configs, describe.

Everything here talks to a real broker started by the harness in `conftest.py`; every
loop is bounded in both count and time.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import AcknowledgeType, Message, Producer, ShareConsumer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from protocol import api
from protocol.client import KafkaClient
from tests.integration.conftest import (
    ADMIN_TIMEOUT_S,
    Broker,
    Sent,
    admin_config,
    produce,
    producer_config,
)

SHARE_GROUP_DESCRIBE_KEY = 77
SHARE_GROUP_DESCRIBE_VERSION = 1

# One poll call never blocks longer than this, so loops notice their deadlines.
POLL_S = 0.5


# --- configs ------------------------------------------------------------------------


def share_consumer_config(
    broker: Broker, group: str, mode: str = "explicit", **overrides: Any
) -> dict[str, Any]:
    """A ShareConsumer config; pass dotted names as `**{"max.poll.records": 10}`."""
    return {
        "bootstrap.servers": broker.bootstrap,
        "broker.address.family": "v4",
        "group.id": group,
        "share.acknowledgement.mode": mode,
        "socket.timeout.ms": 10_000,
        "reconnect.backoff.ms": 50,
        "reconnect.backoff.max.ms": 500,
        **overrides,
    }


def share_consumer(
    broker: Broker, group: str, topics: Sequence[str], mode: str = "explicit", **overrides: Any
) -> ShareConsumer:
    consumer = ShareConsumer(share_consumer_config(broker, group, mode, **overrides))
    consumer.subscribe(list(topics))
    return consumer


def set_group_configs(broker: Broker, group: str, configs: dict[str, str]) -> None:
    """IncrementalAlterConfigs SET on resource type GROUP (the group may not exist yet)."""
    admin = AdminClient(admin_config(broker))
    resource = ConfigResource(
        "GROUP",
        group,
        incremental_configs=[
            ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
            for name, value in configs.items()
        ],
    )
    futures = admin.incremental_alter_configs([resource], request_timeout=ADMIN_TIMEOUT_S)
    for future in futures.values():
        future.result(timeout=ADMIN_TIMEOUT_S)


def earliest(broker: Broker, group: str) -> None:
    """Set `share.auto.offset.reset=earliest` for `group` (before or after it exists)."""
    set_group_configs(broker, group, {"share.auto.offset.reset": "earliest"})


# --- producing ----------------------------------------------------------------------


def produce_values(
    broker: Broker,
    topic: str,
    values: Iterable[bytes],
    partition: int | None = 0,
    batch: int | None = None,
    producer: Producer | None = None,
) -> list[Sent]:
    """Produce `values` (in flushed chunks of `batch` records if given, so the log holds
    batches no larger than that); require every one acknowledged."""
    producer = producer or Producer(producer_config(broker))
    values = list(values)
    step = batch or max(len(values), 1)
    acked: list[Sent] = []
    for start in range(0, len(values), step):
        chunk = [(partition, None, v, []) for v in values[start : start + step]]
        outcome = produce(producer, topic, chunk, flush_timeout=30)
        assert outcome.errors == [] and outcome.unflushed == 0, outcome.errors[:5]
        acked += outcome.acked
    assert len(acked) == len(values)
    return acked


# --- consuming ----------------------------------------------------------------------


@dataclass(frozen=True)
class Delivery:
    """One record as a ShareConsumer handed it out."""

    partition: int
    offset: int
    value: bytes | None
    delivery_count: int | None

    @property
    def key(self) -> tuple[int, int]:
        return (self.partition, self.offset)


def to_delivery(msg: Message) -> Delivery:
    count = msg.delivery_count() if hasattr(msg, "delivery_count") else None
    return Delivery(msg.partition(), msg.offset(), msg.value(), count)


@dataclass
class PollLog:
    """What a consumer saw over a bounded run: deliveries in order, and client errors."""

    deliveries: list[Delivery] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    polls: int = 0

    def offsets(self) -> list[tuple[int, int]]:
        return [d.key for d in self.deliveries]

    def values(self) -> list[bytes | None]:
        return [d.value for d in self.deliveries]


def poll_once(consumer: ShareConsumer, log: PollLog, timeout: float = POLL_S) -> list[Message]:
    """One poll; data messages are returned (and logged), error events only logged."""
    log.polls += 1
    out: list[Message] = []
    for msg in consumer.poll(timeout):
        err = msg.error()
        if err is not None:
            log.errors.append(str(err))
            continue
        log.deliveries.append(to_delivery(msg))
        out.append(msg)
    return out


def consume(
    consumer: ShareConsumer,
    *,
    until: Callable[[PollLog], bool],
    timeout: float,
    decide: Callable[[Message], AcknowledgeType | None] | None = None,
    log: PollLog | None = None,
    max_polls: int = 10_000,
    after_poll: Callable[[], None] | None = None,
) -> PollLog:
    """Poll until `until(log)` or `timeout` s or `max_polls` polls.

    Explicit mode: `decide(msg)` picks each record's acknowledgement (None means
    ACCEPT); they are committed with commit_sync after every non-empty poll. Implicit
    mode: leave `decide` None; the next poll accepts the previous poll's records.
    """
    log = log if log is not None else PollLog()
    deadline = time.monotonic() + timeout
    for _ in range(max_polls):
        if until(log) or time.monotonic() >= deadline:
            break
        msgs = poll_once(consumer, log, min(POLL_S, max(deadline - time.monotonic(), 0.05)))
        if decide is not None and msgs:
            for msg in msgs:
                consumer.acknowledge(msg, decide(msg) or AcknowledgeType.ACCEPT)
            consumer.commit_sync()
        if after_poll is not None:
            after_poll()
    return log


def accept_all(_msg: Message) -> AcknowledgeType:
    return AcknowledgeType.ACCEPT


def never(_log: PollLog) -> bool:
    return False


def accept_until(
    broker: Broker,
    group: str,
    topics: list[str],
    count: int,
    *,
    settle_s: float = 0.0,
    **overrides: Any,
) -> PollLog:
    """Share-consume `topics` as `group` (explicit mode, consumer `overrides`), accepting
    every record, until `count` were delivered (60 s at most), then `settle_s` s more for
    any that should not come; the consumer is closed (its last commit_sync answered)."""
    consumer = share_consumer(broker, group, topics, **overrides)
    try:
        log = consume(
            consumer,
            until=lambda log: len(log.deliveries) >= count,
            timeout=60,
            decide=accept_all,
        )
        if settle_s:
            consume(consumer, until=never, timeout=settle_s, log=log)
    finally:
        close_quietly(consumer)
    return log


def close_quietly(consumer: ShareConsumer) -> None:
    """close(), bounded by a watchdog thread so a hung close cannot hang the test."""
    done = threading.Event()

    def run() -> None:
        try:
            consumer.close()
        finally:
            done.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert done.wait(30), "ShareConsumer.close() did not return within 30 s"


# --- broker log ---------------------------------------------------------------------


def log_lines(broker: Broker, *needles: str) -> list[str]:
    """Broker log lines containing every one of `needles` (for failure messages)."""
    try:
        text = broker.log_path.read_text(errors="replace")
    except FileNotFoundError:
        return []
    return [line for line in text.splitlines() if all(n in line for n in needles)]


# --- ShareGroupDescribe over the wire (confluent-kafka has no share-group admin) ----


@dataclass(frozen=True)
class MemberInfo:
    member_id: str
    member_epoch: int
    client_id: str
    subscribed: tuple[str, ...]
    assignment: dict[str, tuple[int, ...]]


@dataclass(frozen=True)
class GroupInfo:
    error_code: int
    group_id: str
    state: str
    group_epoch: int
    assignment_epoch: int
    assignor: str
    members: tuple[MemberInfo, ...]


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n:
        chunk = sock.recv(n)
        if not chunk:
            raise ConnectionError("broker closed the connection")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def describe_share_group(broker: Broker, group: str) -> GroupInfo:
    """ShareGroupDescribe v1 for one group, with spool's own codec."""
    body = api.build(
        api.request_class(SHARE_GROUP_DESCRIBE_KEY, SHARE_GROUP_DESCRIBE_VERSION),
        {"group_ids": [group], "include_authorized_operations": False},
    )
    frame = api.encode_request(
        SHARE_GROUP_DESCRIBE_KEY, SHARE_GROUP_DESCRIBE_VERSION, 1, "spool-it", body
    )
    with socket.create_connection((broker.host, broker.port), timeout=10) as sock:
        sock.sendall(frame)
        (size,) = struct.unpack(">i", _recv_exact(sock, 4))
        reply = _recv_exact(sock, size)
    correlation_id, resp = api.decode_response(
        SHARE_GROUP_DESCRIBE_KEY, SHARE_GROUP_DESCRIBE_VERSION, reply
    )
    assert correlation_id == 1
    (g,) = resp.groups
    return GroupInfo(
        error_code=int(g.error_code),
        group_id=g.group_id,
        state=g.group_state,
        group_epoch=int(g.group_epoch),
        assignment_epoch=int(g.assignment_epoch),
        assignor=g.assignor_name,
        members=tuple(
            MemberInfo(
                member_id=m.member_id,
                member_epoch=int(m.member_epoch),
                client_id=m.client_id,
                subscribed=tuple(m.subscribed_topic_names),
                assignment={
                    tp.topic_name: tuple(int(p) for p in tp.partitions)
                    for tp in m.assignment.topic_partitions
                },
            )
            for m in g.members
        ),
    )


def wait_for_members(broker: Broker, group: str, count: int, timeout: float = 30.0) -> GroupInfo:
    """Wait (bounded) until `group` has `count` members, each with some assignment."""
    deadline = time.monotonic() + timeout
    info: GroupInfo | None = None
    while time.monotonic() < deadline:
        info = describe_share_group(broker, group)
        members = info.members
        if len(members) == count and all(any(m.assignment.values()) for m in members):
            return info
        time.sleep(0.1)
    raise AssertionError(f"group {group!r} never had {count} assigned members; last {info}")


# --- raw requests through spool's own client ----------------------------------------


def run_wire(
    broker: Broker,
    scenario: Callable[[KafkaClient], Awaitable[None]],
    client_id: str = "spool-it-share",
) -> None:
    """Run `scenario` with one connection to `broker`, closed afterwards."""

    async def main() -> None:
        client = await KafkaClient.connect(broker.host, broker.port, client_id)
        try:
            await scenario(client)
        finally:
            await client.close()

    asyncio.run(main())


async def heartbeat(
    client: KafkaClient,
    group: str,
    member: str,
    epoch: int,
    topics: list[str] | None = None,
    rack: str | None = None,
) -> Any:
    """ShareGroupHeartbeat v1."""
    return await client.request(
        76,
        1,
        {
            "group_id": group,
            "member_id": member,
            "member_epoch": epoch,
            "rack_id": rack,
            "subscribed_topic_names": topics,
        },
    )


async def heartbeat_until_assigned(
    client: KafkaClient, group: str, member: str, epoch: int, timeout: float = 15.0
) -> Any:
    """Heartbeat (every 50 ms, for at most `timeout` s) until the response carries a
    non-empty assignment. A new group's members are assigned only partitions whose share
    state is initialized (Kafka 4.2), so the join itself answers an empty assignment."""
    deadline = time.monotonic() + timeout
    while True:
        response = await heartbeat(client, group, member, epoch)
        assert response.error_code == 0, response
        epoch = response.member_epoch
        if response.assignment is not None and any(
            t.partitions for t in response.assignment.topic_partitions
        ):
            return response
        assert time.monotonic() < deadline, f"member {member} of {group} was never assigned"
        await asyncio.sleep(0.05)


async def topic_id(client: KafkaClient, topic: str) -> uuid.UUID:
    """The topic's id, from Metadata v12."""
    md = await client.request(
        3,
        12,
        {
            "topics": [{"name": topic}],
            "allow_auto_topic_creation": False,
            "include_topic_authorized_operations": False,
        },
    )
    return md.topics[0].topic_id


def _request_topics(
    partitions: dict[tuple[uuid.UUID, int], list[dict[str, Any]]],
) -> list[dict[str, Any]]:
    """Request topics from (topic id, partition) -> acknowledgement batches."""
    topics: dict[uuid.UUID, list[dict[str, Any]]] = {}
    for (tid, p), acks in partitions.items():
        topics.setdefault(tid, []).append({"partition_index": p, "acknowledgement_batches": acks})
    return [{"topic_id": t, "partitions": ps} for t, ps in topics.items()]


def share_fetch_body(
    group: str,
    member: str,
    epoch: int,
    partitions: dict[tuple[uuid.UUID, int], list[dict[str, Any]]],
    *,
    version: int = 1,
    max_wait: int = 0,
    renew: bool = False,
    **overrides: Any,
) -> dict[str, Any]:
    """A ShareFetch body; `partitions` maps (topic id, partition) to its ack batches;
    `overrides` replace any field (max_records, ...)."""
    body: dict[str, Any] = {
        "group_id": group,
        "member_id": member,
        "share_session_epoch": epoch,
        "max_wait": max_wait,
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "max_records": 500,
        "batch_size": 500,
        "forgotten_topics_data": [],
        "topics": _request_topics(partitions),
        **overrides,
    }
    if version >= 2:
        body.setdefault("share_acquire_mode", 0)
        body["is_renew_ack"] = renew
    return body


def share_ack_body(
    group: str,
    member: str,
    epoch: int,
    partitions: dict[tuple[uuid.UUID, int], list[dict[str, Any]]],
    *,
    version: int = 1,
    renew: bool = False,
) -> dict[str, Any]:
    """A ShareAcknowledge body; `partitions` maps (topic id, partition) to its batches."""
    body: dict[str, Any] = {
        "group_id": group,
        "member_id": member,
        "share_session_epoch": epoch,
        "topics": _request_topics(partitions),
    }
    if version >= 2:
        body["is_renew_ack"] = renew
    return body
