"""ShareFetch and ShareAcknowledge, from a decoded request to its answer (KIP-932).

`ShareFetchService` is what the handlers call, one entry point per RPC, as Kafka's
KafkaApis hands a share fetch to its SharePartitionManager: it checks the request,
moves the member's share session (`ShareSessionCache`), applies the acknowledgements,
and, for a fetch, runs the acquisition rounds of a `DelayedShareFetch` (the long poll
up to MaxWaitMs) against the share partitions (`SharePartitionManager`). A session that
ends (epoch -1, or its connection closing) releases what its member still holds, as
Kafka's releaseSession.

The requests and answers here are plain data (`ShareFetchParams`, `ShareFetchResult`,
...): the handler decodes the wire request into one, and encodes the answer.
Time comes from the injected `Clock`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import structlog

from broker.partitions import Partition
from broker.share.delayed_fetch import DelayedShareFetch, FetchEntry, not_leader
from broker.share.manager import AckBatches, AckOutcome, SharePartitionManager
from broker.share.partition import ShareAcquireMode
from broker.share.session import ShareSessionCache, TopicIdPartition
from coordinator.share_group import member_id_valid
from coordinator.share_state import ShareStateKey
from persister.clock import Clock
from protocol.errors import ErrorCode, KafkaError

log = structlog.get_logger("spool.share")

RENEW_ACK = 4  # AcknowledgeType Renew (KIP-1222, ShareFetch/ShareAcknowledge v2)
# MaxRecords when a ShareFetch leaves it 0 (Kafka's share consumer default max.poll.records).
DEFAULT_MAX_RECORDS = 500


def _readable(topic_id: uuid.UUID) -> bool:
    return True


def _leads(topic_id: uuid.UUID, partition: int) -> bool:
    return True


@dataclass(frozen=True, slots=True)
class ShareFetchParams:
    """A ShareFetch as decoded from the wire."""

    group_id: str
    member_id: str
    member_id_raw: str | None  # as sent (None: missing), for Kafka's isMemberIdValid
    epoch: int
    partitions: list[TopicIdPartition]
    forgotten: list[TopicIdPartition]
    acks: dict[TopicIdPartition, AckBatches]
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    max_records: int
    batch_size: int
    acquire_mode: int = 0  # v2+ ShareAcquireMode (KIP-1206)
    renew_only: bool = False  # v2+ IsRenewAck (KIP-1222)
    version: int = 1
    connection_id: str | None = None
    # May the requester READ the topic? A partition of a topic it may not is answered
    # TOPIC_AUTHORIZATION_FAILED (fetch and acknowledgement alike), as Kafka 4.2 does.
    readable: Callable[[uuid.UUID], bool] = _readable
    # Does this broker lead the partition (and so its share partition)? One it does not
    # is answered NOT_LEADER_OR_FOLLOWER (fetch and acknowledgement alike): nothing of it
    # is acquired or acknowledged here.
    leads: Callable[[uuid.UUID, int], bool] = _leads


@dataclass(frozen=True, slots=True)
class ShareAcknowledgeParams:
    """A ShareAcknowledge as decoded from the wire."""

    group_id: str
    member_id: str
    member_id_raw: str | None
    epoch: int
    acks: dict[TopicIdPartition, AckBatches]
    renew: bool = False  # v2+ IsRenewAck
    version: int = 1
    readable: Callable[[uuid.UUID], bool] = _readable
    leads: Callable[[uuid.UUID, int], bool] = _leads


@dataclass(slots=True)
class ShareFetchResult:
    """A ShareFetch's answer: request-level error, or per partition what it got and how
    its acknowledgements went."""

    acquisition_lock_timeout_ms: int
    error_code: ErrorCode = ErrorCode.none
    error_message: str | None = None
    partitions: dict[TopicIdPartition, FetchEntry] = field(default_factory=dict)


@dataclass(slots=True)
class ShareAcknowledgeResult:
    acquisition_lock_timeout_ms: int
    error_code: ErrorCode = ErrorCode.none
    error_message: str | None = None
    partitions: dict[TopicIdPartition, AckOutcome] = field(default_factory=dict)


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


def invalid_member_id(api: str, member_id: str | None) -> KafkaError | None:
    """Kafka's isMemberIdValid check, the first of ShareFetch and ShareAcknowledge."""
    if member_id_valid(member_id):
        return None
    return KafkaError(
        ErrorCode.invalid_request,
        f"Invalid member id in the request: {api} needs a MemberId of 1 to 36 characters.",
    )


def acquire_mode(mode_id: int) -> ShareAcquireMode:
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


class ShareFetchService:
    """The share session cache, the delayed share fetch and the share partitions, behind
    one entry point per RPC."""

    def __init__(
        self,
        manager: SharePartitionManager,
        sessions: ShareSessionCache,
        topic_known: Callable[[uuid.UUID], bool],
        log_partition: Callable[[uuid.UUID, int], Partition | None],
        *,
        clock: Clock,
    ) -> None:
        self.manager = manager
        self.sessions = sessions
        self._topic_known = topic_known
        self._log_partition = log_partition
        self.clock = clock
        # Round-robin start for share fetches, so MaxRecords starves no partition.
        self.rotation = 0

    def topic_known(self, topic_id: uuid.UUID) -> bool:
        return self._topic_known(topic_id)

    def log_partition(self, topic_id: uuid.UUID, partition: int) -> Partition | None:
        return self._log_partition(topic_id, partition)

    def _lock_timeout_ms(self, group_id: str) -> int:
        return self.manager.groups.config(group_id).record_lock_duration_ms

    # -- ShareFetch -------------------------------------------------------------------

    async def share_fetch(self, req: ShareFetchParams) -> ShareFetchResult:
        """Answer a ShareFetch: session, acknowledgements, then acquisition rounds until
        something is acquired or failed, or MaxWaitMs has passed."""
        group_id, member_id = req.group_id, req.member_id
        result = ShareFetchResult(self._lock_timeout_ms(group_id))
        try:
            mode = self._check_fetch(req)
            session_ctx = self.sessions.share_fetch(
                group_id,
                member_id,
                req.epoch,
                req.partitions,
                req.forgotten,
                self.clock.now_ms(),
                has_acknowledgements=bool(req.acks),
                connection_id=req.connection_id,
            )
        except KafkaError as exc:
            _refused(result, "share_fetch_refused", group_id, member_id, req.epoch, exc)
            return result
        ack_results, acks = self._acknowledgements(
            group_id,
            req.acks,
            req.version,
            is_renew_ack=req.renew_only,
            readable=req.readable,
            leads=req.leads,
        )
        entries = result.partitions

        def report_acks() -> None:
            for tp, (code, message) in ack_results.items():
                entry = entries.setdefault(tp, FetchEntry())
                entry.acknowledge_error_code = code
                entry.acknowledge_error_message = message

        if session_ctx.is_final or req.renew_only:
            if acks:
                self._ack_outcomes(
                    ack_results, await self.manager.acknowledge_many(acks, member_id)
                )
            report_acks()
            if session_ctx.is_final:
                # The session's partitions: a final context fetches nothing, but releases all.
                await self.close_session(group_id, member_id, session_ctx.session.partitions)
                return result
            # KIP-1222: a renew-only request carries acknowledgements and fetches nothing.
            for tp in req.partitions:
                entries.setdefault(tp, FetchEntry())
            return result
        delayed = DelayedShareFetch(
            self,
            session_ctx.session,
            member_id,
            max_records=req.max_records if req.max_records > 0 else DEFAULT_MAX_RECORDS,
            batch_size=max(req.batch_size, 1),
            max_bytes=req.max_bytes,
            mode=mode,
            entries=entries,
            readable=req.readable,
            leads=req.leads,
        )
        # The first round applies the acknowledgements as well: they and the acquisitions
        # are made durable by one share-state write (one fsync), since a ShareFetch
        # carrying the previous delivery's acknowledgements is a share consumer's steady
        # state.
        await delayed.run(
            self.clock.now_ms() + max(req.max_wait_ms, 0),
            acks,
            ack_results,
            on_first_round=lambda: _first_round_done(report_acks, entries, req.partitions),
        )
        return result

    @staticmethod
    def _check_fetch(req: ShareFetchParams) -> ShareAcquireMode:
        """The request-level checks, before anything is applied."""
        invalid = invalid_member_id("ShareFetch", req.member_id_raw)
        if invalid is not None:
            raise invalid
        if not req.group_id:
            raise KafkaError(ErrorCode.invalid_request, "ShareFetch needs a GroupId")
        mode = acquire_mode(req.acquire_mode)
        if req.renew_only:
            # KIP-1222: a renew-only ShareFetch must not ask for records.
            nonzero = [
                name
                for name, value in (
                    ("maxBytes", req.max_bytes),
                    ("minBytes", req.min_bytes),
                    ("maxRecords", req.max_records),
                    ("maxWaitMs", req.max_wait_ms),
                )
                if value != 0
            ]
            if nonzero:
                raise KafkaError(
                    ErrorCode.invalid_request,
                    f"{', '.join(nonzero)} must be set to 0 if isRenewAck is true.",
                )
        return mode

    # -- ShareAcknowledge --------------------------------------------------------------

    async def share_acknowledge(self, req: ShareAcknowledgeParams) -> ShareAcknowledgeResult:
        group_id, member_id = req.group_id, req.member_id
        result = ShareAcknowledgeResult(self._lock_timeout_ms(group_id))
        try:
            invalid = invalid_member_id("ShareAcknowledge", req.member_id_raw)
            if invalid is not None:
                raise invalid
            session = self.sessions.share_acknowledge(
                group_id, member_id, req.epoch, self.clock.now_ms()
            )
        except KafkaError as exc:
            _refused(result, "share_acknowledge_refused", group_id, member_id, req.epoch, exc)
            return result
        log.debug(
            "share_acknowledge",
            group=group_id,
            member=member_id,
            epoch=req.epoch,
            batches=sum(len(b) for b in req.acks.values()),
        )
        # Every partition's acknowledgements, made durable by one share-state write; each
        # partition gets its own result.
        results, valid = self._acknowledgements(
            group_id,
            req.acks,
            req.version,
            is_renew_ack=req.renew,
            readable=req.readable,
            leads=req.leads,
        )
        if valid:
            self._ack_outcomes(results, await self.manager.acknowledge_many(valid, member_id))
        if req.epoch == -1:
            await self.close_session(group_id, member_id, session.partitions)
        result.partitions = results
        return result

    # -- sessions ending ---------------------------------------------------------------

    async def close_session(
        self, group_id: str, member_id: str, partitions: list[TopicIdPartition]
    ) -> None:
        """ShareSessionEpoch -1, after the request's acknowledgements were applied:
        forget the session and release what the member still holds on its partitions,
        with one share-state write (Kafka's SharePartitionManager.releaseSession)."""
        self.sessions.remove(group_id, member_id)
        keys = [ShareStateKey(group_id, tid, p) for tid, p in partitions]
        await self.manager.release_member(group_id, member_id, keys)

    def connection_closed(self, connection_id: str) -> list[tuple[str, str, list[ShareStateKey]]]:
        """A closed connection ends its share sessions, as Kafka's share session cache
        does on disconnect: per session (group, member, partitions) to release."""
        return [
            (
                s.group_id,
                s.member_id,
                [ShareStateKey(s.group_id, tid, p) for tid, p in s.partitions],
            )
            for s in self.sessions.remove_connection(connection_id)
        ]

    # -- acknowledgements --------------------------------------------------------------

    def _acknowledgements(
        self,
        group_id: str,
        acks: Mapping[TopicIdPartition, AckBatches],
        version: int,
        *,
        is_renew_ack: bool,
        readable: Callable[[uuid.UUID], bool] = _readable,
        leads: Callable[[uuid.UUID, int], bool] = _leads,
    ) -> tuple[dict[TopicIdPartition, AckOutcome], dict[ShareStateKey, AckBatches]]:
        """The request's acknowledgements: the results of those refused before reaching a
        share partition (unknown topic, no READ on it, malformed batches, a partition
        led by another broker), and the rest, per partition."""
        results: dict[TopicIdPartition, AckOutcome] = {}
        valid: dict[ShareStateKey, AckBatches] = {}
        for (topic_id, partition), batches in acks.items():
            if not self.topic_known(topic_id):
                results[(topic_id, partition)] = (
                    ErrorCode.unknown_topic_id,
                    f"Topic id {topic_id} does not exist",
                )
                continue
            if not readable(topic_id):
                results[(topic_id, partition)] = (
                    ErrorCode.topic_authorization_failed,
                    "Topic authorization failed.",
                )
                continue
            invalid = acknowledgement_batches_error(
                batches, supports_renew=version >= 2, is_renew_ack=is_renew_ack
            )
            if invalid is not None:
                results[(topic_id, partition)] = (ErrorCode.invalid_request, invalid)
                continue
            if not leads(topic_id, partition):
                results[(topic_id, partition)] = not_leader(topic_id, partition)
                continue
            valid[ShareStateKey(group_id, topic_id, partition)] = batches
        return results, valid

    @staticmethod
    def _ack_outcomes(
        results: dict[TopicIdPartition, AckOutcome], acked: Mapping[ShareStateKey, AckOutcome]
    ) -> None:
        for key, outcome in acked.items():
            results[(key.topic_id, key.partition)] = outcome


def _first_round_done(
    report_acks: Callable[[], None],
    entries: dict[TopicIdPartition, FetchEntry],
    requested: list[TopicIdPartition],
) -> None:
    """After the first round: the acknowledgements' outcomes, and an entry for every
    partition the request named (answered even when it got nothing)."""
    report_acks()
    for tp in requested:
        entries.setdefault(tp, FetchEntry())


def _refused(
    result: ShareFetchResult | ShareAcknowledgeResult,
    event: str,
    group_id: str,
    member_id: str,
    epoch: int,
    exc: KafkaError,
) -> None:
    """A ShareFetch/ShareAcknowledge the broker refused as a whole: logged, and answered
    with the request-level error and no partitions."""
    log.info(
        event,
        group=group_id,
        member=member_id,
        epoch=epoch,
        error=exc.code.name,
        reason=exc.message,
    )
    result.error_code = exc.code
    result.error_message = exc.message
