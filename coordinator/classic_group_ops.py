"""Classic groups' rebalance protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) on
the group coordinator's runtime: Kafka 4.2's GroupMetadataManager for classic groups.

Every request is one operation of the group coordinator's `CoordinatorRuntime` under
the group's id, so requests on one group are serialised with each other and with the
group's timers (`GroupTimers`: a member's session, the join phase, the initial
rebalance delay, the sync phase). The group's rebalance in progress lives in memory
only, as in Kafka; what is written is the group's GroupMetadata record: when the
leader's SyncGroup sets a generation's assignment, when the group goes Empty, when a
static member is replaced, and when a JoinGroup creates the group.

A JoinGroup or SyncGroup that has to wait for the other members is parked: its
operation hands the member a responder that completes an `asyncio.Future`, and the
request awaits that future outside the operation, so a parked request never holds the
group. The futures are completed by later operations (the last member joining, the
leader's assignment once durable, a timer) or, when the coordinator unloads, with
NOT_COORDINATOR, which sends the clients to the new coordinator.

Records are replayed at load to rebuild each group at its last stored generation
(Stable with its members, or Empty), whose members then get a session to heartbeat in;
after load, a replayed GroupMetadata record is the operation's own write and changes
nothing (the operation changed the group in memory already), as Kafka's classic group
operations write records without replaying them. A failed write is answered
NOT_COORDINATOR; a failed assignment write resets the assignment and rebalances, a
failed static-member replacement puts the old member back, as in Kafka.

Kafka's empty-group conversions: a JoinGroup on an empty consumer group tombstones it
and creates the classic group in the same batch; a JoinGroup on a "simple" group
(offsets committed with generation -1, no members) turns it into a classic group.
Online migration of non-empty groups is not served (INCONSISTENT_GROUP_PROTOCOL, as
Kafka's `group.consumer.migration.policy=disabled` answers).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from coordinator.classic_group import (
    ClassicGroup,
    ClassicGroupConfig,
    ClassicGroupState,
    ClassicGroupTombstone,
    DescribedGroup,
    GroupMetadataRecord,
    JoinProtocol,
    JoinResponder,
    JoinResult,
    Member,
    SyncResponder,
    SyncResult,
    describe,
)
from coordinator.group_host import GroupType, OffsetGroup
from coordinator.group_timers import GroupTimers
from coordinator.runtime import CoordinatorRuntime, for_coordinator_rpc
from persister.clock import Clock
from protocol.errors import ErrorCode, KafkaError

log = structlog.get_logger("spool.groups")

_S = ClassicGroupState
# JoinGroup v4+ requires a known member id of a dynamic member (KIP-394); v9 lets a
# static leader rejoining a Stable group skip the assignment (KIP-814).
REQUIRES_KNOWN_MEMBER_ID_VERSION = 4
SKIP_ASSIGNMENT_VERSION = 9


class ClassicHost(Protocol):
    """What the classic groups need of the group coordinator."""

    @property
    def runtime(self) -> CoordinatorRuntime[Any]: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def classic_groups(self) -> dict[str, OffsetGroup]: ...
    @property
    def consumer_groups(self) -> dict[str, OffsetGroup]: ...
    def group_type(self, group_id: str) -> GroupType | None: ...


@dataclass(frozen=True, slots=True)
class JoinRequest:
    group_id: str
    member_id: str
    group_instance_id: str | None
    protocol_type: str
    protocols: tuple[JoinProtocol, ...]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    client_id: str
    client_host: str
    api_version: int
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class SyncRequest:
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None
    protocol_type: str | None
    protocol_name: str | None
    assignments: Mapping[str, bytes]


@dataclass(frozen=True, slots=True)
class LeavingMember:
    member_id: str
    group_instance_id: str | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class LeaveOutcome:
    member_id: str
    group_instance_id: str | None
    error: ErrorCode = ErrorCode.none
    message: str | None = None


@dataclass(slots=True)
class _Outcome:
    """What an operation leaves to do once its records are durable (`applied`), or
    if writing them failed (`failed`: run as a later operation on the group)."""

    applied: list[Callable[[], None]] = field(default_factory=list)
    failed: list[Callable[[KafkaError], list[Any]]] = field(default_factory=list)


def _hb_key(group_id: str, member_id: str) -> Hashable:
    return ("classic-hb", group_id, member_id)


def _not_found(group_id: str) -> KafkaError:
    return KafkaError(ErrorCode.unknown_member_id, f"Group {group_id} not found.")


class ClassicGroupOps:
    """The classic groups of a group coordinator; see the module docstring."""

    def __init__(self, host: ClassicHost, config: ClassicGroupConfig | None = None) -> None:
        self.host = host
        self.config = config or ClassicGroupConfig()
        self.timers: GroupTimers[Any] = GroupTimers(host.runtime, host.clock)
        # After load, replayed GroupMetadata records are the operations' own writes.
        self._live = False
        self._outcome: _Outcome | None = None

    # -- lifecycle -------------------------------------------------------------------

    def replay(self, record: GroupMetadataRecord | ClassicGroupTombstone) -> None:
        groups = self.host.classic_groups
        current = groups.get(record.group_id)
        if isinstance(record, ClassicGroupTombstone):
            if isinstance(current, ClassicGroup):
                current.state = _S.DEAD
                self._fail_parked(current, ErrorCode.coordinator_not_available)
            groups.pop(record.group_id, None)
            self.timers.cancel_group(record.group_id)
            return
        if self._live and isinstance(current, ClassicGroup):
            return  # the operation that wrote it changed the group already
        groups[record.group_id] = ClassicGroup.from_record(record)

    def on_loaded(self) -> None:
        """The log is replayed: from now on the groups change by operations."""
        self._live = True

    def start(self) -> None:
        """Give every loaded member a session to heartbeat in (Kafka's onLoaded)."""
        now = self._now()
        for group in self._classic_groups():
            for member in group.members.values():
                self._schedule_heartbeat(
                    group.group_id, member.member_id, member.session_timeout_ms
                )
            if len(group.members) > self.config.max_size:
                group_id = group.group_id
                self._schedule(
                    ("join", group_id),
                    group_id,
                    now,
                    functools.partial(self._rebalance_over_capacity, group_id),
                )
            log.info(
                "classic_group_loaded",
                group=group.group_id,
                members=len(group.members),
                generation=group.generation_id,
            )

    def unload(self) -> None:
        """Another broker coordinates the groups now: every timer stops and every
        parked JoinGroup and SyncGroup is answered NOT_COORDINATOR."""
        self._live = False
        self.timers.cancel_all()
        for group in self._classic_groups():
            self._fail_parked(group, ErrorCode.not_coordinator)

    def answer_parked(self) -> None:
        """The broker is stopping: every parked JoinGroup and SyncGroup is answered
        NOT_COORDINATOR now (the client looks for the coordinator again), so that a clean
        stop does not wait for a rebalance."""
        for group in self._classic_groups():
            self._fail_parked(group, ErrorCode.not_coordinator)

    def _fail_parked(self, group: ClassicGroup, code: ErrorCode) -> None:
        for member in list(group.members.values()):
            group.complete_join(member, JoinResult(code, member_id=member.member_id))
            group.complete_sync(member, SyncResult(code))

    def _classic_groups(self) -> list[ClassicGroup]:
        groups: list[ClassicGroup] = []
        for group in self.host.classic_groups.values():
            if isinstance(group, ClassicGroup):
                groups.append(group)
        return groups

    def _now(self) -> int:
        return self.host.clock.now_ms()

    def _group(self, group_id: str) -> ClassicGroup | None:
        group = self.host.classic_groups.get(group_id)
        return group if isinstance(group, ClassicGroup) else None

    # -- running operations ------------------------------------------------------------

    async def _run(self, group_id: str, fn: Callable[[], tuple[list[Any], Any]]) -> Any:
        outcome = _Outcome()

        def op() -> tuple[list[Any], Any]:
            self._outcome = outcome
            try:
                return fn()
            finally:
                self._outcome = None

        def applied(_response: Any) -> None:
            for callback in outcome.applied:
                callback()

        try:
            return await self.host.runtime.run(group_id, op, applied=applied)
        except KafkaError as exc:
            error = for_coordinator_rpc(exc)
            if outcome.failed:
                await self._after_failure(group_id, outcome, error)
            raise error from exc

    async def _after_failure(self, group_id: str, outcome: _Outcome, error: KafkaError) -> None:
        def fix() -> tuple[list[Any], None]:
            records: list[Any] = []
            for callback in outcome.failed:
                records.extend(callback(error))
            return records, None

        try:
            await self._run(group_id, fix)
        except KafkaError as exc:
            log.warning("classic_group_recovery_failed", group=group_id, error=exc.message)

    def _schedule(
        self, key: Hashable, group_id: str, at_ms: int, fn: Callable[[], list[Any]]
    ) -> None:
        def op() -> tuple[list[Any], _Outcome]:
            outcome = _Outcome()
            self._outcome = outcome
            try:
                return fn(), outcome
            finally:
                self._outcome = None

        def applied(outcome: _Outcome) -> None:
            for callback in outcome.applied:
                callback()

        self.timers.schedule(key, group_id, at_ms, op, applied=applied, retry=False)

    def _schedule_heartbeat(self, group_id: str, member_id: str, timeout_ms: int) -> None:
        self._schedule(
            _hb_key(group_id, member_id),
            group_id,
            self._now() + timeout_ms,
            lambda: self._expire_heartbeat(group_id, member_id),
        )

    # -- JoinGroup -------------------------------------------------------------------------

    async def join(self, request: JoinRequest) -> JoinResult:
        """JoinGroup: the answer once the join phase completes (or at once)."""
        if not request.group_id:
            return JoinResult(
                ErrorCode.invalid_group_id, request.member_id, message="The group id is empty."
            )
        low, high = self.config.min_session_timeout_ms, self.config.max_session_timeout_ms
        if not low <= request.session_timeout_ms <= high:
            return JoinResult(
                ErrorCode.invalid_session_timeout,
                request.member_id,
                message=f"session.timeout.ms {request.session_timeout_ms} is outside the "
                f"broker's group.min.session.timeout.ms ({low}) and "
                f"group.max.session.timeout.ms ({high}).",
            )
        future: asyncio.Future[JoinResult] = asyncio.get_running_loop().create_future()

        def respond(result: JoinResult) -> None:
            if not future.done():
                future.set_result(result)

        try:
            await self._run(request.group_id, lambda: (self._join(request, respond), None))
        except KafkaError as exc:
            respond(JoinResult(exc.code, request.member_id, message=exc.message))
        return await future

    def _join(self, req: JoinRequest, respond: JoinResponder) -> list[Any]:
        group_id = req.group_id
        records: list[Any] = []
        found = self.host.group_type(group_id)
        if found == GroupType.SHARE:
            respond(
                JoinResult(
                    ErrorCode.inconsistent_group_protocol,
                    "",
                    message=f"Group {group_id} is a share group; it cannot be joined with "
                    "the classic protocol.",
                )
            )
            return []
        if found == GroupType.CONSUMER:
            consumer = self.host.consumer_groups[group_id]
            if not consumer.is_empty:
                respond(
                    JoinResult(
                        ErrorCode.inconsistent_group_protocol,
                        "",
                        message=f"Cannot join the consumer group {group_id} with the classic "
                        "protocol because the group migration is disabled.",
                    )
                )
                return []
            # An empty consumer group becomes a classic group (its offsets stay).
            records.extend(consumer.tombstones())
            del self.host.consumer_groups[group_id]
            log.info("consumer_group_converted_to_classic", group=group_id)
            converted: OffsetGroup | None = consumer
        else:
            converted = None
        group = self._group(group_id)
        is_new = False
        if group is None:
            if group_id not in self.host.classic_groups and req.member_id:
                respond(
                    JoinResult(
                        ErrorCode.unknown_member_id,
                        req.member_id,
                        message=f"Group {group_id} not found; join without a member id.",
                    )
                )
                return records
            # A new group, or a simple group (offsets only) that now gets members.
            is_new = group_id not in self.host.classic_groups
            group = ClassicGroup(group_id, self._now())
            self.host.classic_groups[group_id] = group
        if not self._accepts_joining(group, req.member_id):
            group.remove(req.member_id)
            respond(
                JoinResult(
                    ErrorCode.group_max_size_reached,
                    "",
                    message=f"Group {group_id} has reached group.max.size "
                    f"({self.config.max_size}) members.",
                )
            )
            result: list[Any] = []
        elif not req.member_id:
            result = self._join_new_member(group, req, respond)
        else:
            result = self._join_existing_member(group, req, respond)
        if is_new and not result:
            # The new group is stored at once, as Kafka does (an empty GroupMetadata).
            result = [group.to_record({})]
        if converted is not None:
            outcome = self._outcome
            assert outcome is not None
            outcome.failed.append(
                functools.partial(self._undo_conversion, group_id, converted, group)
            )
        return records + result

    def _undo_conversion(
        self, group_id: str, consumer: OffsetGroup, classic: ClassicGroup, error: KafkaError
    ) -> list[Any]:
        """The conversion's write failed: the consumer group is back (and the classic
        group's first joins are answered the error), unless the classic group has
        completed a join phase since."""
        if self.host.classic_groups.get(group_id) is classic and classic.generation_id == 0:
            self._fail_parked(classic, error.code)
            del self.host.classic_groups[group_id]
            self.timers.cancel_group(group_id)
            self.host.consumer_groups.setdefault(group_id, consumer)
        return []

    def _accepts_joining(self, group: ClassicGroup, member_id: str) -> bool:
        member = group.members.get(member_id)
        if group.state in (_S.EMPTY, _S.DEAD):
            return True
        if group.state == _S.PREPARING_REBALANCE:
            return (
                member is not None and member.awaiting_join is not None
            ) or group.num_awaiting_join() < self.config.max_size
        return member is not None or len(group.members) < self.config.max_size

    def _join_new_member(
        self, group: ClassicGroup, req: JoinRequest, respond: JoinResponder
    ) -> list[Any]:
        if group.state == _S.DEAD:
            respond(JoinResult(ErrorCode.coordinator_not_available, ""))
            return []
        if not group.supports_protocols(req.protocol_type, [n for n, _ in req.protocols]):
            respond(self._inconsistent(group, req, ""))
            return []
        new_id = group.generate_member_id(req.client_id, req.group_instance_id)
        if req.group_instance_id is not None:
            existing = group.static_members.get(req.group_instance_id)
            if existing is not None:
                log.info(
                    "classic_static_member_replaced",
                    group=group.group_id,
                    instance_id=req.group_instance_id,
                    old_member=existing,
                    member=new_id,
                    state=group.state_name,
                )
                return self._update_static_member(group, req, existing, new_id, respond)
            return self._add_member_then_rebalance(group, req, new_id, respond)
        if req.api_version >= REQUIRES_KNOWN_MEMBER_ID_VERSION:
            group.add_pending_member(new_id)
            self._schedule_heartbeat(group.group_id, new_id, req.session_timeout_ms)
            respond(
                JoinResult(
                    ErrorCode.member_id_required,
                    new_id,
                    message="Join again with the member id given.",
                )
            )
            return []
        return self._add_member_then_rebalance(group, req, new_id, respond)

    def _inconsistent(self, group: ClassicGroup, req: JoinRequest, member_id: str) -> JoinResult:
        if group.is_empty:
            why = "a JoinGroup must name a protocol type and at least one protocol"
        elif group.protocol_type_ != req.protocol_type:
            why = (
                f"its members use protocol type {group.protocol_type_!r}, not {req.protocol_type!r}"
            )
        else:
            why = (
                f"none of the protocols {[n for n, _ in req.protocols]} is supported by "
                f"every member (they support {sorted(group.candidate_protocols())})"
            )
        return JoinResult(
            ErrorCode.inconsistent_group_protocol,
            member_id,
            message=f"Cannot join group {group.group_id}: {why}.",
        )

    def _join_existing_member(
        self, group: ClassicGroup, req: JoinRequest, respond: JoinResponder
    ) -> list[Any]:
        member_id = req.member_id
        if group.state == _S.DEAD:
            respond(JoinResult(ErrorCode.coordinator_not_available, member_id))
            return []
        if not group.supports_protocols(req.protocol_type, [n for n, _ in req.protocols]):
            respond(self._inconsistent(group, req, member_id))
            return []
        if group.is_pending_member(member_id):
            return self._add_member_then_rebalance(group, req, member_id, respond)
        try:
            group.validate_member(member_id, req.group_instance_id, "join-group")
        except KafkaError as exc:
            respond(JoinResult(exc.code, member_id, message=exc.message))
            return []
        member = group.members[member_id]
        if group.state == _S.PREPARING_REBALANCE:
            return self._update_member_then_rebalance(group, member, req, respond, "rejoining")
        if group.state == _S.COMPLETING_REBALANCE:
            if member.matches(req.protocols):
                # Lost its JoinGroup answer: the current generation again.
                respond(group.join_result(member_id, members=group.is_leader(member_id)))
                return []
            return self._update_member_then_rebalance(
                group, member, req, respond, "new metadata during CompletingRebalance"
            )
        if group.state == _S.STABLE:
            if group.is_leader(member_id):
                return self._update_member_then_rebalance(
                    group, member, req, respond, "the leader rejoined"
                )
            if not member.matches(req.protocols):
                return self._update_member_then_rebalance(
                    group, member, req, respond, "new metadata"
                )
            respond(group.join_result(member_id, members=False))
            return []
        respond(
            JoinResult(
                ErrorCode.unknown_member_id,
                member_id,
                message=f"Group {group.group_id} is Empty; join without a member id.",
            )
        )
        return []

    def _update_member_then_rebalance(
        self,
        group: ClassicGroup,
        member: Member,
        req: JoinRequest,
        respond: JoinResponder,
        reason: str,
    ) -> list[Any]:
        self._supersede_join(member)
        group.update_member(
            member, req.protocols, req.rebalance_timeout_ms, req.session_timeout_ms, respond
        )
        return self._maybe_prepare_rebalance_or_complete_join(
            group, f"member {member.member_id}: {reason} ({req.reason or 'no reason given'})"
        )

    @staticmethod
    def _supersede_join(member: Member) -> None:
        # A JoinGroup parked from an earlier request of this member (its client gave up
        # on it): answered so that nothing waits for it forever.
        if member.awaiting_join is not None:
            responder, member.awaiting_join = member.awaiting_join, None
            responder(JoinResult(ErrorCode.rebalance_in_progress, member.member_id))

    def _add_member_then_rebalance(
        self, group: ClassicGroup, req: JoinRequest, member_id: str, respond: JoinResponder
    ) -> list[Any]:
        member = Member(
            member_id,
            req.group_instance_id,
            req.client_id,
            req.client_host,
            req.rebalance_timeout_ms,
            req.session_timeout_ms,
            req.protocol_type,
            req.protocols,
            is_new=True,
        )
        if group.state == _S.PREPARING_REBALANCE and group.previous_state == _S.EMPTY:
            group.new_member_added = True  # the initial rebalance may wait longer
        group.add(member, respond)
        # A new member cannot heartbeat while its JoinGroup is parked: it has this long.
        self._schedule_heartbeat(group.group_id, member_id, self.config.new_member_join_timeout_ms)
        return self._maybe_prepare_rebalance_or_complete_join(
            group, f"new member {member_id} ({req.reason or 'no reason given'})"
        )

    def _update_static_member(
        self,
        group: ClassicGroup,
        req: JoinRequest,
        old_id: str,
        new_id: str,
        respond: JoinResponder,
    ) -> list[Any]:
        """A static member rejoined with no member id (a restarted consumer): its entry
        is taken over by the new id; in a Stable group whose protocol stays, without a
        rebalance (Kafka's updateStaticMemberThenRebalanceOrCompleteJoin)."""
        instance_id = req.group_instance_id
        assert instance_id is not None
        group_id = group.group_id
        current_leader = group.leader_id
        member = group.replace_static_member(instance_id, old_id, new_id)
        self.timers.cancel(_hb_key(group_id, old_id))
        self._schedule_heartbeat(group_id, new_id, member.session_timeout_ms)
        old = (member.protocols, member.rebalance_timeout_ms, member.session_timeout_ms)
        group.update_member(
            member, req.protocols, req.rebalance_timeout_ms, req.session_timeout_ms, respond
        )
        if group.state == _S.STABLE:
            if (group.protocol_name or "") == group.select_protocol():
                generation = group.generation_id
                outcome = self._outcome
                assert outcome is not None

                def applied() -> None:
                    if group.members.get(new_id) is not member:
                        return
                    if req.api_version >= SKIP_ASSIGNMENT_VERSION:
                        leader = group.is_leader(new_id)
                        group.complete_join(
                            member, group.join_result(new_id, members=leader, skip=leader)
                        )
                    else:
                        # The old leader id, so that a rejoining leader acts as a
                        # follower and keeps the assignment (no rebalance).
                        result = group.join_result(new_id, members=False)
                        group.complete_join(
                            member,
                            JoinResult(
                                member_id=new_id,
                                generation_id=result.generation_id,
                                protocol_type=result.protocol_type,
                                protocol_name=result.protocol_name,
                                leader=current_leader or "",
                            ),
                        )

                def failed(error: KafkaError) -> list[Any]:
                    if group.members.get(new_id) is member:
                        group.update_member(member, old[0], old[1], old[2], None)
                        restored = group.replace_static_member(instance_id, new_id, old_id)
                        self.timers.cancel(_hb_key(group_id, new_id))
                        self._schedule_heartbeat(group_id, old_id, restored.session_timeout_ms)
                    respond(
                        JoinResult(
                            error.code,
                            "",
                            generation_id=generation,
                            leader=current_leader or "",
                            message=error.message,
                        )
                    )
                    return []

                outcome.applied.append(applied)
                outcome.failed.append(failed)
                return [group.to_record(group.group_assignment())]
            return self._maybe_prepare_rebalance_or_complete_join(
                group, f"static member {instance_id} rejoined with another protocol"
            )
        if group.state == _S.COMPLETING_REBALANCE:
            # The leader may have been given the old member id: assign again.
            return self._prepare_rebalance(group, f"static member {instance_id} rejoined")
        return self._maybe_complete_join_phase(group)

    # -- the rebalance -------------------------------------------------------------------

    def _maybe_prepare_rebalance_or_complete_join(
        self, group: ClassicGroup, reason: str
    ) -> list[Any]:
        if group.can_rebalance():
            return self._prepare_rebalance(group, reason)
        return self._maybe_complete_join_phase(group)

    def _maybe_complete_join_phase(self, group: ClassicGroup) -> list[Any]:
        if group.state != _S.PREPARING_REBALANCE:
            return []
        if group.previous_state == _S.EMPTY:
            return []  # the initial rebalance waits for its delay
        if not group.has_all_members_joined():
            return []
        return self._complete_join(group)

    def _prepare_rebalance(self, group: ClassicGroup, reason: str) -> list[Any]:
        group_id = group.group_id
        if group.state == _S.COMPLETING_REBALANCE:
            self._reset_and_propagate(group, ErrorCode.rebalance_in_progress)
        group.pending_sync_members.clear()
        self.timers.cancel(("sync", group_id))
        initial = group.state == _S.EMPTY
        if initial:
            delay = self.config.initial_rebalance_delay_ms
            remaining = max(group.rebalance_timeout_ms() - delay, 0)
            self._schedule_initial(group_id, delay, delay, remaining)
        group.transition_to(_S.PREPARING_REBALANCE, self._now())
        log.info(
            "classic_group_rebalancing",
            group=group_id,
            generation=group.generation_id,
            members=len(group.members),
            reason=reason,
        )
        if initial:
            return []
        if group.has_all_members_joined():
            return self._complete_join(group)
        self._schedule_join_deadline(group)
        return []

    def _schedule_join_deadline(self, group: ClassicGroup) -> None:
        group_id = group.group_id
        self._schedule(
            ("join", group_id),
            group_id,
            self._now() + group.rebalance_timeout_ms(),
            lambda: self._complete_join_of(group_id),
        )

    def _schedule_initial(self, group_id: str, at_delay: int, delay: int, remaining: int) -> None:
        self._schedule(
            ("join", group_id),
            group_id,
            self._now() + at_delay,
            lambda: self._initial_delay_over(group_id, delay, remaining),
        )

    def _initial_delay_over(self, group_id: str, delay: int, remaining: int) -> list[Any]:
        group = self._group(group_id)
        if group is None:
            return []
        if group.new_member_added and remaining != 0:
            # Members keep arriving: wait another delay, within the rebalance timeout.
            group.new_member_added = False
            new_delay = min(self.config.initial_rebalance_delay_ms, remaining)
            self._schedule_initial(group_id, new_delay, new_delay, max(remaining - delay, 0))
            return []
        return self._complete_join(group)

    def _complete_join_of(self, group_id: str) -> list[Any]:
        group = self._group(group_id)
        return [] if group is None else self._complete_join(group)

    def _complete_join(self, group: ClassicGroup) -> list[Any]:
        """The join phase ends: dynamic members that did not rejoin are removed, the
        next generation starts, every parked JoinGroup is answered (the leader's with
        the members) and the group waits for the SyncGroups."""
        group_id = group.group_id
        self.timers.cancel(("join", group_id))
        gone = [m.member_id for m in group.not_yet_rejoined() if not m.is_static]
        for member_id in gone:
            self._remove(group, member_id)
        if gone:
            log.info("classic_members_not_rejoined", group=group_id, members=gone)
        if group.state == _S.DEAD:
            return []
        if not group.maybe_elect_new_joined_leader() and group.members:
            # Nobody rejoined: wait until the sessions remove the silent members.
            self._schedule_join_deadline(group)
            return []
        group.init_next_generation(self._now())
        if group.is_empty:
            log.info("classic_group_empty", group=group_id, generation=group.generation_id)
            return [group.to_record({})]
        log.info(
            "classic_group_join_completed",
            group=group_id,
            generation=group.generation_id,
            members=len(group.members),
            protocol=group.protocol_name,
            leader=group.leader_id,
        )
        for member in list(group.members.values()):
            leader = group.is_leader(member.member_id)
            group.complete_join(member, group.join_result(member.member_id, members=leader))
            self._schedule_heartbeat(group_id, member.member_id, member.session_timeout_ms)
            member.is_new = False
            group.pending_sync_members.add(member.member_id)
        generation = group.generation_id
        self._schedule(
            ("sync", group_id),
            group_id,
            self._now() + group.rebalance_timeout_ms(),
            lambda: self._expire_pending_sync(group_id, generation),
        )
        return []

    def _expire_pending_sync(self, group_id: str, generation: int) -> list[Any]:
        group = self._group(group_id)
        if group is None or group.generation_id != generation:
            return []
        if group.state in (_S.COMPLETING_REBALANCE, _S.STABLE) and group.pending_sync_members:
            missing = sorted(group.pending_sync_members)
            for member_id in missing:
                self._remove(group, member_id)
            return self._prepare_rebalance(group, f"no SyncGroup from {missing}")
        return []

    def _rebalance_over_capacity(self, group_id: str) -> list[Any]:
        group = self._group(group_id)
        if group is None or not group.can_rebalance():
            return []
        return self._prepare_rebalance(
            group, f"over group.max.size ({self.config.max_size}) after loading"
        )

    def _reset_and_propagate(self, group: ClassicGroup, error: ErrorCode) -> None:
        for member in group.members.values():
            member.assignment = b""
        self._propagate(group, error)

    def _set_and_propagate(self, group: ClassicGroup, assignment: Mapping[str, bytes]) -> None:
        for member in group.members.values():
            member.assignment = assignment.get(member.member_id, b"")
        self._propagate(group, ErrorCode.none)

    def _propagate(self, group: ClassicGroup, error: ErrorCode) -> None:
        ok = error == ErrorCode.none
        for member in list(group.members.values()):
            result = SyncResult(
                error,
                group.protocol_type_ if ok else None,
                group.protocol_name if ok else None,
                member.assignment,
            )
            if group.complete_sync(member, result):
                self._schedule_heartbeat(
                    group.group_id, member.member_id, member.session_timeout_ms
                )

    def _remove(self, group: ClassicGroup, member_id: str) -> None:
        member = group.members.get(member_id)
        if member is not None:
            group.complete_sync(member, SyncResult(ErrorCode.unknown_member_id))
        group.remove(member_id)
        self.timers.cancel(_hb_key(group.group_id, member_id))

    def _expire_heartbeat(self, group_id: str, member_id: str) -> list[Any]:
        group = self._group(group_id)
        if group is None or group.state == _S.DEAD:
            return []
        if group.is_pending_member(member_id):
            log.info("classic_pending_member_expired", group=group_id, member=member_id)
            group.remove(member_id)
            if group.state == _S.PREPARING_REBALANCE and group.has_all_members_joined():
                return self._complete_join(group)
            return []
        member = group.members.get(member_id)
        if member is None or member.has_satisfied_heartbeat():
            return []
        log.info("classic_member_expired", group=group_id, member=member_id)
        return self._remove_member_and_update(group, member, "session timeout")

    def _remove_member_and_update(
        self, group: ClassicGroup, member: Member, reason: str
    ) -> list[Any]:
        group.complete_join(member, JoinResult(ErrorCode.unknown_member_id, ""))
        self._remove(group, member.member_id)
        if group.state in (_S.STABLE, _S.COMPLETING_REBALANCE):
            return self._maybe_prepare_rebalance_or_complete_join(
                group, f"member {member.member_id} removed: {reason}"
            )
        if group.state == _S.PREPARING_REBALANCE and group.has_all_members_joined():
            return self._complete_join(group)
        return []

    # -- SyncGroup -------------------------------------------------------------------------

    async def sync(self, request: SyncRequest) -> SyncResult:
        """SyncGroup: the member's assignment once the leader's is durable (or at once)."""
        if not request.group_id:
            return SyncResult(ErrorCode.invalid_group_id, message="The group id is empty.")
        future: asyncio.Future[SyncResult] = asyncio.get_running_loop().create_future()

        def respond(result: SyncResult) -> None:
            if not future.done():
                future.set_result(result)

        try:
            await self._run(request.group_id, lambda: (self._sync(request, respond), None))
        except KafkaError as exc:
            respond(SyncResult(exc.code, message=exc.message))
        return await future

    def _sync(self, req: SyncRequest, respond: SyncResponder) -> list[Any]:
        group_id = req.group_id
        group = self._group(group_id)
        if group is None or group.is_empty:
            # Unknown, of another type, a simple group or Empty (Kafka's classicGroupSync).
            respond(
                SyncResult(
                    ErrorCode.unknown_member_id,
                    message=f"Group {group_id} not found."
                    if group is None
                    else f"Group {group_id} is Empty; rejoin it.",
                )
            )
            return []
        member_id = req.member_id
        if group.state == _S.DEAD:
            respond(SyncResult(ErrorCode.coordinator_not_available))
            return []
        try:
            group.validate_member(member_id, req.group_instance_id, "sync-group")
        except KafkaError as exc:
            respond(SyncResult(exc.code, message=exc.message))
            return []
        if req.generation_id != group.generation_id:
            respond(
                SyncResult(
                    ErrorCode.illegal_generation,
                    message=f"Generation {req.generation_id} is not the current generation "
                    f"{group.generation_id} of group {group_id}; rejoin the group.",
                )
            )
            return []
        if _inconsistent(req.protocol_type, group.protocol_type_) or _inconsistent(
            req.protocol_name, group.protocol_name
        ):
            respond(
                SyncResult(
                    ErrorCode.inconsistent_group_protocol,
                    message=f"Group {group_id} uses protocol type {group.protocol_type_!r} "
                    f"and protocol {group.protocol_name!r}.",
                )
            )
            return []
        member = group.members[member_id]
        if group.state == _S.PREPARING_REBALANCE:
            respond(
                SyncResult(
                    ErrorCode.rebalance_in_progress,
                    message=f"Group {group_id} is rebalancing; rejoin it.",
                )
            )
            return []
        if group.state == _S.COMPLETING_REBALANCE:
            if member.awaiting_sync is not None:
                member.awaiting_sync(SyncResult(ErrorCode.rebalance_in_progress))
            member.awaiting_sync = respond
            self._remove_pending_sync(group, member_id)
            if not group.is_leader(member_id):
                return []
            assignment = {m: b"" for m in group.members}
            assignment.update((m, a) for m, a in req.assignments.items() if m in group.members)
            generation = group.generation_id
            outcome = self._outcome
            assert outcome is not None

            def current() -> bool:
                return (
                    self._group(group_id) is group
                    and group.state == _S.COMPLETING_REBALANCE
                    and group.generation_id == generation
                )

            def applied() -> None:
                if current():
                    self._set_and_propagate(group, assignment)
                    group.transition_to(_S.STABLE, self._now())
                    log.info(
                        "classic_group_stable",
                        group=group_id,
                        generation=generation,
                        members=len(group.members),
                    )

            def failed(error: KafkaError) -> list[Any]:
                if not current():
                    return []
                self._reset_and_propagate(group, error.code)
                return self._maybe_prepare_rebalance_or_complete_join(
                    group, f"storing the assignment failed ({error.code.name})"
                )

            outcome.applied.append(applied)
            outcome.failed.append(failed)
            return [group.to_record(assignment)]
        # Stable: the assignment of this generation again.
        self._remove_pending_sync(group, member_id)
        respond(
            SyncResult(ErrorCode.none, group.protocol_type_, group.protocol_name, member.assignment)
        )
        return []

    def _remove_pending_sync(self, group: ClassicGroup, member_id: str) -> None:
        group.pending_sync_members.discard(member_id)
        if group.state in (_S.DEAD, _S.EMPTY, _S.PREPARING_REBALANCE) or (
            not group.pending_sync_members
        ):
            self.timers.cancel(("sync", group.group_id))

    # -- Heartbeat -------------------------------------------------------------------------

    async def heartbeat(
        self, group_id: str, generation_id: int, member_id: str, instance_id: str | None
    ) -> None:
        """Heartbeat: returns if the member is in the current generation of a settled
        group; raises REBALANCE_IN_PROGRESS, ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, ..."""
        if not group_id:
            raise KafkaError(ErrorCode.invalid_group_id, "The group id is empty.")

        def op() -> tuple[list[Any], None]:
            self._heartbeat(group_id, generation_id, member_id, instance_id)
            return [], None

        await self._run(group_id, op)

    def _heartbeat(
        self, group_id: str, generation_id: int, member_id: str, instance_id: str | None
    ) -> None:
        group = self._group(group_id)
        if group is None:
            if group_id in self.host.classic_groups:  # a simple group has no members
                raise KafkaError(
                    ErrorCode.unknown_member_id,
                    f"Member {member_id!r} is not a member of group {group_id}; rejoin.",
                )
            raise _not_found(group_id)
        if group.state == _S.DEAD:
            raise KafkaError(ErrorCode.coordinator_not_available)
        group.validate_member(member_id, instance_id, "heartbeat")
        if generation_id != group.generation_id:
            raise KafkaError(
                ErrorCode.illegal_generation,
                f"Generation {generation_id} is not the current generation "
                f"{group.generation_id} of group {group_id}; rejoin the group.",
            )
        if group.state == _S.EMPTY:
            raise KafkaError(ErrorCode.unknown_member_id, f"Group {group_id} is Empty.")
        member = group.members[member_id]
        self._schedule_heartbeat(group_id, member_id, member.session_timeout_ms)
        if group.state == _S.PREPARING_REBALANCE:
            raise KafkaError(
                ErrorCode.rebalance_in_progress,
                f"Group {group_id} is rebalancing; rejoin it.",
            )

    # -- LeaveGroup ------------------------------------------------------------------------

    async def leave(self, group_id: str, members: Sequence[LeavingMember]) -> list[LeaveOutcome]:
        """LeaveGroup: each member's outcome; a group-level failure raises."""
        if not group_id:
            raise KafkaError(ErrorCode.invalid_group_id, "The group id is empty.")
        result: list[LeaveOutcome] = await self._run(
            group_id, lambda: self._leave(group_id, members)
        )
        return result

    def _leave(
        self, group_id: str, leaving: Sequence[LeavingMember]
    ) -> tuple[list[Any], list[LeaveOutcome]]:
        group = self._group(group_id)
        if group is None:
            if group_id not in self.host.classic_groups:
                raise _not_found(group_id)
            # A simple group: nobody to remove.
            return [], [
                LeaveOutcome(
                    m.member_id,
                    m.group_instance_id,
                    ErrorCode.unknown_member_id,
                    f"Group {group_id} has no members.",
                )
                for m in leaving
            ]
        if group.state == _S.DEAD:
            raise KafkaError(ErrorCode.coordinator_not_available)
        outcomes: list[LeaveOutcome] = []
        removed: list[str] = []
        for m in leaving:
            if not m.member_id:
                # An admin removing a static member by its instance id.
                existing = (
                    group.static_members.get(m.group_instance_id)
                    if m.group_instance_id is not None
                    else None
                )
                if existing is None:
                    outcomes.append(
                        LeaveOutcome(
                            m.member_id,
                            m.group_instance_id,
                            ErrorCode.unknown_member_id,
                            f"No member with group.instance.id {m.group_instance_id} in group "
                            f"{group_id}.",
                        )
                    )
                    continue
                self._remove_current(group, existing, m.reason)
                removed.append(existing)
            elif group.is_pending_member(m.member_id):
                group.remove(m.member_id)
                self.timers.cancel(_hb_key(group_id, m.member_id))
                removed.append(m.member_id)
            else:
                try:
                    group.validate_member(m.member_id, m.group_instance_id, "leave-group")
                except KafkaError as exc:
                    outcomes.append(
                        LeaveOutcome(m.member_id, m.group_instance_id, exc.code, exc.message)
                    )
                    continue
                self._remove_current(group, m.member_id, m.reason)
                removed.append(m.member_id)
            outcomes.append(LeaveOutcome(m.member_id, m.group_instance_id))
        records: list[Any] = []
        if removed:
            reason = f"members {removed} left"
            if group.state in (_S.STABLE, _S.COMPLETING_REBALANCE):
                records = self._maybe_prepare_rebalance_or_complete_join(group, reason)
            elif group.state == _S.PREPARING_REBALANCE:
                records = self._maybe_complete_join_phase(group)
        return records, outcomes

    def _remove_current(self, group: ClassicGroup, member_id: str, reason: str | None) -> None:
        log.info(
            "classic_member_left",
            group=group.group_id,
            member=member_id,
            reason=reason or "not provided",
        )
        member = group.members[member_id]
        group.complete_join(member, JoinResult(ErrorCode.unknown_member_id, ""))
        self._remove(group, member_id)

    # -- DescribeGroups, ListGroups ----------------------------------------------------------

    def describe(self, group_id: str, api_version: int) -> DescribedGroup:
        """DescribeGroups of one group: a classic group as it is now; another type or
        none: state Dead, with GROUP_ID_NOT_FOUND from v6 (Kafka 4.2's describeGroups)."""
        if not group_id:
            return DescribedGroup(
                group_id, "", error=ErrorCode.invalid_group_id, message="The group id is empty."
            )
        self.host.runtime.check_led()
        found = self.host.group_type(group_id)
        if found != GroupType.CLASSIC:
            message = (
                f"Group {group_id} not found."
                if found is None
                else f"Group {group_id} is not a classic group."
            )
            if api_version >= 6:
                return DescribedGroup(
                    group_id, _S.DEAD.value, error=ErrorCode.group_id_not_found, message=message
                )
            return DescribedGroup(group_id, _S.DEAD.value)
        group = self.host.classic_groups[group_id]
        if isinstance(group, ClassicGroup):
            return describe(group)
        return DescribedGroup(group_id, group.state_name, group.protocol_type)


def _inconsistent(given: str | None, current: str | None) -> bool:
    """SyncGroup v5 names the protocol type and name: they must be the group's."""
    return given is not None and given != current
