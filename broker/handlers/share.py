"""ShareGroupHeartbeat, ShareGroupDescribe, ListGroups, ShareFetch, ShareAcknowledge."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from broker import trace
from broker.cluster import MetadataStore
from broker.logs import Partition, Subscribable, Wakeup
from broker.server import RequestContext
from broker.share.manager import AckBatches, SharePartitionManager
from broker.share.partition import ShareAcquireMode
from broker.share.session import ShareSessionCache
from coordinator.group_coordinator import GroupCoordinator
from coordinator.share_group import member_id_valid
from coordinator.share_state import ShareStateKey
from persister.clock import Clock
from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from broker.handlers.requests import (
        ListGroupsRequest,
        ShareAcknowledgeRequest,
        ShareFetchRequest,
        ShareGroupDescribeRequest,
        ShareGroupHeartbeatRequest,
    )

log = structlog.get_logger("spool.share")


class ShareBroker(Protocol):
    """What the share-group handlers use of the broker."""

    @property
    def node_id(self) -> int: ...
    @property
    def metadata(self) -> MetadataStore: ...
    @property
    def groups(self) -> GroupCoordinator: ...
    @property
    def sessions(self) -> ShareSessionCache: ...
    @property
    def share(self) -> SharePartitionManager: ...
    @property
    def clock(self) -> Clock: ...

    # Round-robin start for share fetches, so MaxRecords starves no partition.
    share_rotation: int

    def log_partition(self, topic_id: uuid.UUID, partition: int) -> Partition | None: ...


SHARE_GROUP_TYPE = "share"
# Share groups report "share" as their protocol type in ListGroups, as Kafka does.
SHARE_PROTOCOL_TYPE = "share"
AUTHORIZED_OPERATIONS_OMITTED = -(2**31)
Entries = dict[tuple[uuid.UUID, int], dict[str, Any]]
ZERO_UUID = uuid.UUID(int=0)


def _topic_id(topic_id: uuid.UUID | None) -> uuid.UUID:
    """kio reads the zero uuid as None; to Kafka it is a topic id naming no topic."""
    return ZERO_UUID if topic_id is None else topic_id


RENEW_ACK = 4  # AcknowledgeType Renew (KIP-1222, ShareFetch/ShareAcknowledge v2)


def acknowledgement_batches_error(
    batches: AckBatches, *, supports_renew: bool, is_renew_ack: bool
) -> str | None:
    """Why a partition's AcknowledgementBatches are INVALID_REQUEST, or None.

    Kafka's KafkaApis.validateAcknowledgementBatches, per partition: each batch must
    have first <= last, must not start before the previous batch's last offset, must
    carry acknowledge types, one type or one per offset, each in 0..3 (0..4 in v2),
    and Renew (4) only in a request whose IsRenewAck is set.
    """
    previous_last = -1
    max_type = RENEW_ACK if supports_renew else 3
    for first, last, types in batches:
        if first > last:
            return f"acknowledgement batch {first}-{last} ends before it starts"
        if first < previous_last:
            return f"acknowledgement batch {first}-{last} overlaps the previous batch"
        if not types:
            return f"acknowledgement batch {first}-{last} has no acknowledge types"
        if len(types) > 1 and last - first != len(types) - 1:
            return (
                f"acknowledgement batch {first}-{last} has {len(types)} acknowledge types; "
                "expected one, or one per offset"
            )
        if any(t < 0 or t > max_type for t in types):
            return f"acknowledge types must be 0-{max_type} in this version, got {list(types)}"
        if RENEW_ACK in types and not is_renew_ack:
            return (
                "acknowledge type 4 (Renew) needs IsRenewAck set (ShareFetch/ShareAcknowledge v2)"
            )
        previous_last = last
    return None


def _acquire_mode(mode_id: int) -> ShareAcquireMode:
    """ShareFetch v2's ShareAcquireMode (KIP-1206), refused with INVALID_REQUEST if unknown.

    Kafka 4.2 throws IllegalArgumentException ("Unknown share acquire mode id") from
    ShareFetch's constructor, which goes out as UNKNOWN_SERVER_ERROR once the request's
    acknowledgements were applied; spool refuses the request before anything is applied,
    with the error Kafka gives a malformed ShareFetch."""
    try:
        return ShareAcquireMode(mode_id)
    except ValueError:
        names = ", ".join(f"{m.value} ({m.name.lower()})" for m in ShareAcquireMode)
        raise KafkaError(
            ErrorCode.invalid_request,
            f"Unknown ShareAcquireMode {mode_id}: must be one of {names} "
            "(the share consumer's share.acquire.mode)",
        ) from None


def invalid_member_id(api: str, member_id: str | None) -> KafkaError | None:
    """Kafka's isMemberIdValid check, the first of ShareFetch and ShareAcknowledge."""
    if member_id_valid(member_id):
        return None
    return KafkaError(
        ErrorCode.invalid_request,
        f"Invalid member id in the request: {api} needs a MemberId of 1 to 36 characters.",
    )


def _leader(node_id: int) -> dict[str, int]:
    return {"leader_id": node_id, "leader_epoch": 0}


def _partition_entry(node_id: int, entries: Entries, tp: tuple[uuid.UUID, int]) -> dict[str, Any]:
    """The response entry of a partition, created empty on first use."""
    if tp not in entries:
        entries[tp] = {
            "partition_index": tp[1],
            "error_code": ErrorCode.none,
            "acknowledge_error_code": ErrorCode.none,
            "current_leader": _leader(node_id),
            "records": b"",
            "acquired_records": [],
        }
    return entries[tp]


async def share_group_heartbeat(
    ctx: RequestContext, req: ShareGroupHeartbeatRequest, broker: ShareBroker
) -> dict[str, Any]:
    try:
        result = await broker.groups.heartbeat(
            req.group_id,
            req.member_id,
            req.member_epoch,
            None if req.subscribed_topic_names is None else list(req.subscribed_topic_names),
            req.rack_id,
            ctx.header.client_id or "",
            ctx.client_host,
        )
    except KafkaError as exc:
        log.info(
            "share_heartbeat_refused",
            group=req.group_id,
            member=req.member_id,
            member_epoch=req.member_epoch,
            error=exc.code.name,
            reason=exc.message,
        )
        return {
            "error_code": exc.code,
            "error_message": exc.message,
            "member_id": req.member_id,
            "member_epoch": -1,
            "heartbeat_interval": 0,
            "assignment": None,
        }
    assignment = None
    if result.assignment is not None:
        assignment = {
            "topic_partitions": [
                {"topic_id": topic_id, "partitions": sorted(parts)}
                for topic_id, parts in sorted(result.assignment.items(), key=lambda i: str(i[0]))
            ]
        }
    return {
        "error_code": ErrorCode.none,
        "member_id": result.member_id,
        "member_epoch": result.member_epoch,
        "heartbeat_interval": result.heartbeat_interval_ms,
        "assignment": assignment,
    }


async def share_group_describe(
    ctx: RequestContext, req: ShareGroupDescribeRequest, broker: ShareBroker
) -> dict[str, Any]:
    names = {t.topic_id: t.name for t in broker.metadata.state.topics.values()}
    groups = []
    for group_id in req.group_ids:
        try:
            d = broker.groups.describe(group_id)
        except KafkaError as exc:
            groups.append(
                {
                    "group_id": group_id,
                    "error_code": exc.code,
                    "error_message": exc.message,
                    "group_state": "Dead",
                    "authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
                }
            )
            continue
        groups.append(
            {
                "error_code": ErrorCode.none,
                "group_id": d.group_id,
                "group_state": d.group_state,
                "group_epoch": d.group_epoch,
                "assignment_epoch": d.assignment_epoch,
                "assignor_name": d.assignor_name,
                "members": [
                    {
                        "member_id": m.member_id,
                        "rack_id": m.rack_id,
                        "member_epoch": m.member_epoch,
                        "client_id": m.client_id,
                        "client_host": m.client_host,
                        "subscribed_topic_names": list(m.subscribed_topic_names),
                        "assignment": {
                            "topic_partitions": [
                                {
                                    "topic_id": tid,
                                    "topic_name": names.get(tid, ""),
                                    "partitions": sorted(parts),
                                }
                                for tid, parts in m.assignment.items()
                            ]
                        },
                    }
                    for m in d.members
                ],
                "authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
            }
        )
    return {"throttle_time": 0, "groups": groups}


async def list_groups(
    ctx: RequestContext, req: ListGroupsRequest, broker: ShareBroker
) -> dict[str, Any]:
    states_filter: tuple[str, ...] = getattr(req, "states_filter", ())  # v4+
    types_filter: tuple[str, ...] = getattr(req, "types_filter", ())  # v5+
    states = {s.lower() for s in states_filter or ()}
    types = {t.lower() for t in types_filter or ()}
    groups = []
    if not types or SHARE_GROUP_TYPE in types:
        for g in broker.groups.list_groups():
            if states and g.state.lower() not in states:
                continue
            groups.append(
                {
                    "group_id": g.group_id,
                    "protocol_type": SHARE_PROTOCOL_TYPE,
                    "group_state": g.state,
                    "group_type": SHARE_GROUP_TYPE,
                }
            )
    return {"throttle_time": 0, "error_code": ErrorCode.none, "groups": groups}


def _topic_known(broker: ShareBroker, topic_id: uuid.UUID) -> bool:
    return topic_id in broker.metadata.state.topics_by_id


AckResults = dict[tuple[uuid.UUID, int], tuple[ErrorCode, str | None]]


def _acknowledgements(
    broker: ShareBroker,
    group_id: str,
    req: ShareFetchRequest | ShareAcknowledgeRequest,
    version: int,
) -> tuple[AckResults, dict[ShareStateKey, AckBatches]]:
    """The request's acknowledgements: the results of those refused before reaching a
    share partition (unknown topic, malformed batches), and the rest, per partition."""
    results: AckResults = {}
    valid: dict[ShareStateKey, AckBatches] = {}
    is_renew_ack: bool = getattr(req, "is_renew_ack", False)  # v2+
    for t in req.topics:
        topic_id = _topic_id(t.topic_id)
        for p in t.partitions:
            if not p.acknowledgement_batches:
                continue
            tp = (topic_id, p.partition_index)
            if not _topic_known(broker, topic_id):
                results[tp] = (
                    ErrorCode.unknown_topic_id,
                    f"Topic id {topic_id} does not exist",
                )
                continue
            batches: AckBatches = [
                (b.first_offset, b.last_offset, tuple(b.acknowledge_types))
                for b in p.acknowledgement_batches
            ]
            invalid = acknowledgement_batches_error(
                batches, supports_renew=version >= 2, is_renew_ack=is_renew_ack
            )
            if invalid is not None:
                results[tp] = (ErrorCode.invalid_request, invalid)
                continue
            valid[ShareStateKey(group_id, topic_id, p.partition_index)] = batches
    return results, valid


def _ack_outcomes(
    results: AckResults, acked: Mapping[ShareStateKey, tuple[ErrorCode, str | None]]
) -> None:
    for key, result in acked.items():
        results[(key.topic_id, key.partition)] = result


async def _apply_acknowledgements(
    broker: ShareBroker,
    group_id: str,
    member_id: str,
    req: ShareFetchRequest | ShareAcknowledgeRequest,
    version: int,
) -> AckResults:
    """Apply every partition's acknowledgements, made durable by one share-state write;
    each partition gets its own result."""
    results, valid = _acknowledgements(broker, group_id, req, version)
    if valid:
        _ack_outcomes(results, await broker.share.acknowledge_many(valid, member_id))
    return results


async def _close_session(
    broker: ShareBroker, group_id: str, member_id: str, partitions: list[tuple[uuid.UUID, int]]
) -> None:
    """ShareSessionEpoch -1, after the request's acknowledgements were applied:
    release what the member still holds on the session's partitions and forget the
    session (Kafka's SharePartitionManager.releaseSession)."""
    broker.sessions.remove(group_id, member_id)
    keys = [ShareStateKey(group_id, tid, p) for tid, p in partitions]
    await broker.share.release_member(group_id, member_id, keys)


async def share_fetch(
    ctx: RequestContext, req: ShareFetchRequest, broker: ShareBroker
) -> dict[str, Any]:
    group_id, member_id = req.group_id or "", req.member_id or ""
    config = broker.groups.config(group_id)
    base: dict[str, Any] = {
        "throttle_time": 0,
        "acquisition_lock_timeout": config.record_lock_duration_ms,
    }
    requested: list[tuple[uuid.UUID, int]] = [
        (_topic_id(t.topic_id), p.partition_index) for t in req.topics for p in t.partitions
    ]
    forgotten: list[tuple[uuid.UUID, int]] = [
        (_topic_id(t.topic_id), p) for t in req.forgotten_topics_data for p in t.partitions
    ]
    has_acks = any(p.acknowledgement_batches for t in req.topics for p in t.partitions)
    renew_only: bool = getattr(req, "is_renew_ack", False)  # v2+
    mode_id: int = getattr(req, "share_acquire_mode", 0)  # v2+ (KIP-1206)
    try:
        invalid = invalid_member_id("ShareFetch", req.member_id)
        if invalid is not None:
            raise invalid
        if not group_id:
            raise KafkaError(ErrorCode.invalid_request, "ShareFetch needs a GroupId")
        mode = _acquire_mode(mode_id)
        if renew_only:
            # KIP-1222: a renew-only ShareFetch must not ask for records.
            nonzero = [
                name
                for name, value in (
                    ("maxBytes", req.max_bytes),
                    ("minBytes", req.min_bytes),
                    ("maxRecords", req.max_records),
                    ("maxWaitMs", int(req.max_wait.total_seconds() * 1000)),
                )
                if value != 0
            ]
            if nonzero:
                raise KafkaError(
                    ErrorCode.invalid_request,
                    f"{', '.join(nonzero)} must be set to 0 if isRenewAck is true.",
                )
        session_ctx = broker.sessions.share_fetch(
            group_id,
            member_id,
            req.share_session_epoch,
            requested,
            forgotten,
            broker.clock.now_ms(),
            has_acknowledgements=has_acks,
            connection_id=str(ctx.connection_id),
        )
    except KafkaError as exc:
        return _session_refused(
            "share_fetch_refused", group_id, member_id, req.share_session_epoch, exc, base
        )
    ack_results, acks = _acknowledgements(broker, group_id, req, ctx.api_version)
    entries: Entries = {}

    def entry(tp: tuple[uuid.UUID, int]) -> dict[str, Any]:
        return _partition_entry(broker.node_id, entries, tp)

    def report_acks() -> None:
        for tp, (code, message) in ack_results.items():
            entry(tp).update(acknowledge_error_code=code, acknowledge_error_message=message)

    if session_ctx.is_final or renew_only:
        if acks:
            _ack_outcomes(ack_results, await broker.share.acknowledge_many(acks, member_id))
        report_acks()
        if session_ctx.is_final:
            # The session's partitions: a final context fetches nothing, but releases all.
            await _close_session(broker, group_id, member_id, session_ctx.session.partitions)
            return {**base, "error_code": ErrorCode.none, "responses": _group(entries)}
        for tp in requested:
            entry(tp)
        # KIP-1222: a renew-only request carries acknowledgements and fetches nothing.
        return {**base, "error_code": ErrorCode.none, "responses": _group(entries)}

    partitions = session_ctx.partitions
    # The broker's clock, not time.monotonic: tests drive the long poll with a ManualClock.
    deadline_ms = broker.clock.now_ms() + max(round(req.max_wait.total_seconds() * 1000), 0)
    # Listening from before the first look: a produce, release or lock expiry during a
    # round (which may wait for its write) wakes the wait after it.
    with Wakeup(_work_sources(broker, group_id, partitions)) as wakeup:
        # The first round applies the acknowledgements as well: they and the acquisitions
        # are made durable by one share-state write (one fsync), since a ShareFetch
        # carrying the previous delivery's acknowledgements is a share consumer's steady
        # state.
        got_any = await _fetch_round(
            broker, group_id, member_id, req, mode, partitions, entries, acks, ack_results
        )
        report_acks()
        for tp in requested:
            entry(tp)
        while not got_any and partitions:
            remaining_ms = deadline_ms - broker.clock.now_ms()
            if remaining_ms <= 0:
                break
            await wakeup.wait(remaining_ms / 1000, clock=broker.clock)
            if trace.ENABLED:
                trace.event("share_fetch_woken")
            if broker.sessions.get(group_id, member_id) is not session_ctx.session:
                # The session was closed (epoch -1, disconnect) or replaced while this
                # fetch waited: records acquired now could only sit locked until expiry.
                break
            got_any = await _fetch_round(
                broker, group_id, member_id, req, mode, partitions, entries
            )
    return {**base, "error_code": ErrorCode.none, "responses": _group(entries)}


async def _fetch_round(
    broker: ShareBroker,
    group_id: str,
    member_id: str,
    req: ShareFetchRequest,
    mode: ShareAcquireMode,
    partitions: list[tuple[uuid.UUID, int]],
    entries: Entries,
    acks: Mapping[ShareStateKey, AckBatches] | None = None,
    ack_results: AckResults | None = None,
) -> bool:
    """One pass over the session's partitions, applying `acks` first (their outcomes go
    to `ack_results`); True if anything was acquired or failed."""
    max_records: int = req.max_records if req.max_records > 0 else 500
    got_any = False
    # Start at a different partition each time so none is starved by MaxRecords.
    start = broker.share_rotation % max(len(partitions), 1)
    broker.share_rotation += 1
    keys = []
    for tid, p in partitions[start:] + partitions[:start]:
        if not _topic_known(broker, tid):
            _partition_entry(broker.node_id, entries, (tid, p)).update(
                error_code=ErrorCode.unknown_topic_id,
                error_message=f"Topic id {tid} does not exist",
            )
            got_any = True
            continue
        keys.append(ShareStateKey(group_id, tid, p))
    # Every partition's acknowledgements and acquisitions: one share-state write.
    acked, fetched_all = await broker.share.acknowledge_and_acquire(
        acks or {},
        keys,
        member_id,
        max_records=max_records,
        batch_size=max(req.batch_size, 1),
        max_bytes=req.max_bytes,
        mode=mode,
    )
    if ack_results is not None:
        _ack_outcomes(ack_results, acked)
    if trace.ENABLED:
        trace.event(
            "acquired",
            ranges=[
                [str(k.topic_id), k.partition, r.first_offset, r.last_offset]
                for k, f in fetched_all.items()
                for r in f.acquired
            ],
        )
    for key, fetched in fetched_all.items():
        tp = (key.topic_id, key.partition)
        if fetched.error_code != ErrorCode.none:
            _partition_entry(broker.node_id, entries, tp).update(
                error_code=fetched.error_code, error_message=fetched.error_message
            )
            got_any = True
            continue
        if not fetched.acquired:
            continue
        e = _partition_entry(broker.node_id, entries, tp)
        e["records"] = fetched.records
        e["acquired_records"] = [
            {
                "first_offset": r.first_offset,
                "last_offset": r.last_offset,
                "delivery_count": r.delivery_count,
            }
            for r in fetched.acquired
        ]
        got_any = True
    return got_any


def _work_sources(
    broker: ShareBroker, group_id: str, partitions: list[tuple[uuid.UUID, int]]
) -> list[Subscribable]:
    """What wakes a parked ShareFetch: a produce, a release or a lock expiry on one of
    its partitions."""
    sources: list[Subscribable] = [
        broker.share.listeners(ShareStateKey(group_id, tid, p)) for tid, p in partitions
    ]
    logs = [broker.log_partition(tid, p) for tid, p in partitions]
    # A produce wakes it on append (read_uncommitted acquires before the fsync ends) and
    # again when the high watermark or LSO moves (read_committed waits for those).
    sources += [lp for lp in logs if lp is not None]
    sources += [lp.appends for lp in logs if lp is not None]
    return sources


async def share_acknowledge(
    ctx: RequestContext, req: ShareAcknowledgeRequest, broker: ShareBroker
) -> dict[str, Any]:
    group_id, member_id = req.group_id or "", req.member_id or ""
    config = broker.groups.config(group_id)
    base: dict[str, Any] = {
        "throttle_time": 0,
        "acquisition_lock_timeout": config.record_lock_duration_ms,
    }
    try:
        invalid = invalid_member_id("ShareAcknowledge", req.member_id)
        if invalid is not None:
            raise invalid
        session = broker.sessions.share_acknowledge(
            group_id, member_id, req.share_session_epoch, broker.clock.now_ms()
        )
    except KafkaError as exc:
        return _session_refused(
            "share_acknowledge_refused", group_id, member_id, req.share_session_epoch, exc, base
        )
    log.debug(
        "share_acknowledge",
        group=group_id,
        member=member_id,
        epoch=req.share_session_epoch,
        batches=sum(len(p.acknowledgement_batches) for t in req.topics for p in t.partitions),
    )
    results = await _apply_acknowledgements(broker, group_id, member_id, req, ctx.api_version)
    if req.share_session_epoch == -1:
        await _close_session(broker, group_id, member_id, session.partitions)
    entries = {
        tp: {
            "partition_index": tp[1],
            "error_code": code,
            "error_message": message,
            "current_leader": _leader(broker.node_id),
        }
        for tp, (code, message) in results.items()
    }
    return {**base, "error_code": ErrorCode.none, "responses": _group(entries)}


def _group(entries: dict[tuple[uuid.UUID, int], dict[str, Any]]) -> list[dict[str, Any]]:
    by_topic: dict[uuid.UUID, list[dict[str, Any]]] = {}
    for (tid, _), e in sorted(entries.items(), key=lambda i: (str(i[0][0]), i[0][1])):
        by_topic.setdefault(tid, []).append(e)
    return [{"topic_id": tid, "partitions": parts} for tid, parts in by_topic.items()]


def _session_refused(
    event: str, group_id: str, member_id: str, epoch: int, exc: KafkaError, base: dict[str, Any]
) -> dict[str, Any]:
    """A ShareFetch/ShareAcknowledge whose session the broker refused: logged, and
    answered with the request-level error and no partitions."""
    log.info(
        event,
        group=group_id,
        member=member_id,
        epoch=epoch,
        error=exc.code.name,
        reason=exc.message,
    )
    return {**base, "error_code": exc.code, "error_message": exc.message, "responses": []}
