"""The group coordinator's shell for KIP-848 consumer groups (ConsumerGroupHeartbeat,
ConsumerGroupDescribe), around the sans-IO `ConsumerGroup` (coordinator.consumer_group).

Every change is one operation of the coordinator's runtime under the group's key: the
group computes records from committed state, the runtime makes them durable, and
`replay` (called by the coordinator's `_replay`) applies them. The session timeout
(`group.consumer.session.timeout.ms`) of every member and the rebalance timeout of a
member asked to revoke partitions run on `GroupTimers` ("session", g, m) and
("rebalance", g, m); their operations fence the member as Kafka's do. `on_loaded`
re-arms both for every member after a load or a failover, as Kafka's onLoaded does.

One namespace of group ids (coordinator.group_host): a heartbeat naming a share group
is GROUP_ID_NOT_FOUND ("not a consumer group"). A join naming an empty classic group
(e.g. one only offsets were committed for) converts it in the same write, as Kafka does
under every migration policy; a non-empty classic group is refused as Kafka 4.2 refuses
it with `group.consumer.migration.policy=disabled`: spool does not move members
between the protocols.
"""

from __future__ import annotations

import base64
import dataclasses
import typing
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import structlog

from coordinator import topic_regex
from coordinator.assignor import TopicMetadata
from coordinator.consumer_assignors import ASSIGNORS, ConsumerAssignor
from coordinator.consumer_group import (
    ConsumerGroup,
    ConsumerGroupCurrentMemberAssignmentTombstone,
    ConsumerGroupDescription,
    ConsumerGroupMemberMetadataTombstone,
    ConsumerGroupRecord,
    ConsumerGroupRegularExpressionTombstone,
    ConsumerGroupTargetAssignmentMemberTombstone,
    ConsumerGroupTombstone,
    ConsumerHeartbeat,
    ConsumerHeartbeatResult,
    validate_heartbeat_request,
)
from coordinator.group_config import ConsumerGroupConfig, GroupConfigStore, GroupCoordinatorConfig
from coordinator.group_host import GroupType, OffsetGroup
from coordinator.group_timers import GroupTimers
from coordinator.runtime import CoordinatorRuntime, for_coordinator_rpc
from persister.clock import Clock
from protocol.errors import ErrorCode, KafkaError

log = structlog.get_logger("spool.groups")

CONSUMER_GROUP_RECORDS = typing.get_args(ConsumerGroupRecord)

_TOMBSTONES = (
    ConsumerGroupTombstone,
    ConsumerGroupMemberMetadataTombstone,
    ConsumerGroupTargetAssignmentMemberTombstone,
    ConsumerGroupCurrentMemberAssignmentTombstone,
    ConsumerGroupRegularExpressionTombstone,
)

# The topic names among those given that a principal may DESCRIBE.
Describable = Callable[[list[str]], list[str]]


class ConsumerHost(Protocol):
    """What the consumer-group shell needs of the group coordinator."""

    runtime: CoordinatorRuntime[Any]
    clock: Clock
    consumer_groups: dict[str, OffsetGroup]
    classic_groups: dict[str, OffsetGroup]
    configs: GroupConfigStore

    def topics(self) -> Mapping[uuid.UUID, TopicMetadata]: ...

    def group_type(self, group_id: str) -> GroupType | None: ...


def new_member_id() -> str:
    """A member id as Kafka makes one (Uuid.randomUuid().toString(): url-safe base64)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


class ConsumerGroupOps:
    def __init__(self, host: ConsumerHost, config: GroupCoordinatorConfig | None = None) -> None:
        self.host = host
        self.config = config if config is not None else GroupCoordinatorConfig()
        self.timers: GroupTimers[Any] = GroupTimers(host.runtime, host.clock)
        # Per group, the DESCRIBE filter of the member whose heartbeat last named a regex:
        # regexes resolve to the topics it may see, on topic changes too (Kafka resolves
        # with the context of the member that asked).
        self._describable: dict[str, Describable] = {}

    def _resolver(
        self, group_id: str
    ) -> Callable[[Iterable[str], Iterable[str]], Mapping[str, frozenset[str]]]:
        describable = self._describable.get(group_id)

        def resolve(regexes: Iterable[str], names: Iterable[str]) -> dict[str, frozenset[str]]:
            visible = list(names) if describable is None else describable(list(names))
            return topic_regex.resolve(regexes, visible)

        return resolve

    @property
    def assignors(self) -> dict[str, ConsumerAssignor]:
        return {
            name: ASSIGNORS[name]
            for name in self.config.consumer_group_assignors
            if name in ASSIGNORS
        }

    def group_config(self, group_id: str) -> ConsumerGroupConfig:
        """The group's `consumer.session.timeout.ms` and `consumer.heartbeat.interval.ms`
        (its overrides, else the broker's `group.consumer.*` values)."""
        return ConsumerGroupConfig.effective(self.host.configs.overrides(group_id), self.config)

    def _group(self, group_id: str) -> ConsumerGroup | None:
        group = self.host.consumer_groups.get(group_id)
        return group if isinstance(group, ConsumerGroup) else None

    # -- records ----------------------------------------------------------------

    def replay(self, record: ConsumerGroupRecord) -> None:
        groups = self.host.consumer_groups
        group = self._group(record.group_id)
        if group is None:
            if isinstance(record, _TOMBSTONES):
                return  # removes something of a group that is not there: nothing
            # Offsets replayed before the group's records made a simple group of the id
            # (a compacted log keeps keys out of order): the consumer group replaces it.
            self.host.classic_groups.pop(record.group_id, None)
            group = ConsumerGroup(record.group_id)
            groups[record.group_id] = group
        group.replay(record)
        if group.deleted:
            del groups[record.group_id]
            self.timers.cancel_group(record.group_id)
            self._describable.pop(record.group_id, None)

    # -- lifecycle --------------------------------------------------------------

    def on_loaded(self) -> None:
        """After a load: every member gets a full session to heartbeat again, and those
        revoking partitions their rebalance timeout (Kafka's onLoaded)."""
        now = self.host.clock.now_ms()
        for group_id, group in self.host.consumer_groups.items():
            if not isinstance(group, ConsumerGroup):
                continue
            for member in group.members.values():
                self._schedule_session(group_id, member.member_id, now)
                if member.state == member.state.UNREVOKED_PARTITIONS:
                    self._schedule_rebalance(
                        group_id,
                        member.member_id,
                        member.member_epoch,
                        now + max(member.rebalance_timeout_ms, 0),
                    )

    def unload(self) -> None:
        self.timers.cancel_all()
        self._describable.clear()

    # -- ConsumerGroupHeartbeat -------------------------------------------------

    async def heartbeat(
        self,
        group_id: str,
        request: ConsumerHeartbeat,
        api_version: int,
        describable: Describable | None = None,
    ) -> ConsumerHeartbeatResult:
        """One ConsumerGroupHeartbeat. `describable` filters the topics a regex may
        resolve to (the member's DESCRIBE permission; None: every topic)."""
        validate_heartbeat_request(
            group_id, request, api_version, self.config.consumer_group_assignors
        )
        if request.subscribed_topic_regex:
            topic_regex.validate(request.subscribed_topic_regex)
            if describable is None:
                self._describable.pop(group_id, None)
            else:
                self._describable[group_id] = describable
        if not request.member_id:  # v0: the coordinator names the member
            request = _with_member_id(request, new_member_id())

        def op() -> tuple[list[Any], ConsumerHeartbeatResult]:
            found = self.host.group_type(group_id)
            joining = request.member_epoch == 0
            converted: list[Any] = []
            if found == GroupType.CLASSIC and joining:
                classic = self.host.classic_groups[group_id]
                if not classic.is_empty:
                    # Kafka with group.consumer.migration.policy=disabled: spool does not
                    # move a classic group's members to the consumer protocol.
                    raise KafkaError(
                        ErrorCode.group_id_not_found,
                        f"Cannot upgrade classic group {group_id} to consumer group because "
                        "online upgrade is disabled.",
                    )
                # An empty classic group becomes a consumer group in the same write, under
                # every policy (Kafka's maybeDeleteEmptyClassicGroup); offsets stay, they
                # belong to the group id.
                converted = list(classic.tombstones())
            elif found in (GroupType.SHARE, GroupType.CLASSIC):
                raise KafkaError(
                    ErrorCode.group_id_not_found, f"Group {group_id} is not a consumer group."
                )
            group = self._group(group_id)
            if group is None:
                if request.member_epoch != 0:
                    raise KafkaError(
                        ErrorCode.group_id_not_found, f"Consumer group {group_id} not found."
                    )
                group = ConsumerGroup(group_id)
            result = group.heartbeat(
                request,
                self.host.topics(),
                self.host.clock.now_ms(),
                self.config,
                self.assignors,
                self._resolver(group_id),
            )
            if found == GroupType.CLASSIC:
                log.info("classic_group_converted", group=group_id, to=GroupType.CONSUMER.value)
            return [*converted, *result.records], result

        try:
            result: ConsumerHeartbeatResult = await self.host.runtime.run(group_id, op)
        except KafkaError as exc:
            raise for_coordinator_rpc(exc) from exc
        if request.member_epoch == 0:
            log.info(
                "consumer_member_joined",
                group=group_id,
                member=result.member_id,
                member_epoch=result.member_epoch,
                instance_id=request.instance_id,
                client_id=request.client_id,
            )
        self._after(group_id, result)
        return result

    def _after(self, group_id: str, result: ConsumerHeartbeatResult) -> None:
        now = self.host.clock.now_ms()
        for gone in result.removed:
            self.timers.cancel(("session", group_id, gone))
            self.timers.cancel(("rebalance", group_id, gone))
            log.info("consumer_member_removed", group=group_id, member=gone)
        if result.member_epoch >= 0:
            self._schedule_session(group_id, result.member_id, now)
            if result.revoking is not None:
                epoch, timeout_ms = result.revoking
                key = ("rebalance", group_id, result.member_id)
                if self.timers.deadline(key) is None:
                    self._schedule_rebalance(group_id, result.member_id, epoch, now + timeout_ms)
            else:
                self.timers.cancel(("rebalance", group_id, result.member_id))

    def _schedule_session(self, group_id: str, member_id: str, now: int) -> None:
        self.timers.schedule(
            ("session", group_id, member_id),
            group_id,
            now + self.group_config(group_id).session_timeout_ms,
            lambda: self._expire(group_id, member_id, None, "session_timeout"),
        )

    def _schedule_rebalance(self, group_id: str, member_id: str, epoch: int, at_ms: int) -> None:
        self.timers.schedule(
            ("rebalance", group_id, member_id),
            group_id,
            at_ms,
            lambda: self._expire(group_id, member_id, epoch, "rebalance_timeout"),
        )

    def _expire(
        self, group_id: str, member_id: str, epoch: int | None, reason: str
    ) -> tuple[list[ConsumerGroupRecord], None]:
        """A timer's operation: fence the member if it is still there (and, for the
        rebalance timeout, still revoking at the epoch it was asked at)."""
        group = self._group(group_id)
        if group is None:
            return [], None
        member = group.members.get(member_id)
        if member is None:
            return [], None
        if epoch is not None and (
            member.member_epoch != epoch or member.state != member.state.UNREVOKED_PARTITIONS
        ):
            return [], None
        log.info("consumer_member_fenced", group=group_id, member=member_id, reason=reason)
        self.timers.cancel(("session", group_id, member_id))
        self.timers.cancel(("rebalance", group_id, member_id))
        return group.fence(member_id, self.host.topics()), None

    # -- topics ---------------------------------------------------------------

    async def on_topics_changed(self) -> None:
        """Topics were created, deleted or grew: regexes are resolved again and the
        groups whose subscribed topics moved get a new group epoch."""
        topics = self.host.topics()
        for group_id in list(self.host.consumer_groups):

            def op(group_id: str = group_id) -> tuple[list[ConsumerGroupRecord], None]:
                group = self._group(group_id)
                if group is None or not group.members:
                    return [], None
                now = self.host.clock.now_ms()
                return group.refresh_topics(topics, now, self._resolver(group_id)), None

            try:
                await self.host.runtime.run(group_id, op)
            except KafkaError as exc:
                log.warning("consumer_topic_change_not_written", group=group_id, error=exc.message)

    # -- describe / list --------------------------------------------------------

    def describe(self, group_id: str) -> ConsumerGroupDescription:
        """ConsumerGroupDescribe of one group; GROUP_ID_NOT_FOUND for none or another
        type (Kafka's consumerGroup lookup)."""
        self.host.runtime.check_led()
        group = self._group(group_id)
        if group is None:
            found = self.host.group_type(group_id)
            if found is not None:
                raise KafkaError(
                    ErrorCode.group_id_not_found, f"Group {group_id} is not a consumer group."
                )
            raise KafkaError(ErrorCode.group_id_not_found, f"Group {group_id} not found.")
        return group.describe(self.config.consumer_group_default_assignor)

    def list_groups(self) -> list[tuple[str, str]]:
        """(group id, state) of every consumer group, by id."""
        return [
            (group_id, group.state_name)
            for group_id, group in sorted(self.host.consumer_groups.items())
        ]


def _with_member_id(request: ConsumerHeartbeat, member_id: str) -> ConsumerHeartbeat:
    return dataclasses.replace(request, member_id=member_id)
