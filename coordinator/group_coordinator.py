"""The group coordinator: share groups, their configs, timers and share state.

The rules live in the sans-IO `ShareGroup` and `GroupConfigStore`; this shell looks
groups up, feeds them the current topic metadata and time, and runs every change as an
operation of the `CoordinatorRuntime` over `data/groups/`: records are computed from
committed state under the group's key (its id), fsynced, then replayed (`_replay`, the
one place group records take effect). It initializes share-partition state through the
`Persister` and tells the broker when members go away (their acquired records stay
theirs until their share session closes, their connection drops or the locks expire, as
in Kafka). Group configs are keyed by group id too, so a config change and a heartbeat of
one group never interleave.
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import structlog

from coordinator import group_records
from coordinator.assignor import TopicMetadata
from coordinator.group_config import AlterConfigOp, GroupConfig, GroupConfigRecord, GroupConfigStore
from coordinator.group_records import GroupRecord
from coordinator.runtime import (
    CoordinatorLog,
    CoordinatorRuntime,
    KeyCompaction,
    for_coordinator_rpc,
)
from coordinator.share_group import (
    HeartbeatResult,
    ShareGroup,
    ShareGroupCurrentMemberAssignmentTombstone,
    ShareGroupDescription,
    ShareGroupMemberMetadataTombstone,
    ShareGroupRecord,
    ShareGroupTargetAssignmentMemberTombstone,
    ShareGroupTombstone,
    validate_heartbeat_request,
)
from coordinator.share_state import UNINITIALIZED_START_OFFSET, Persister, ShareStateKey
from persister.clock import SYSTEM_CLOCK, Clock, Timer
from persister.record_log import MemoryRecordLog
from protocol.errors import ErrorCode, KafkaError

log = structlog.get_logger("spool.groups")

TopicsProvider = Callable[[], Mapping[uuid.UUID, TopicMetadata]]
MemberRemoved = Callable[[str, str], None]
StateDeleted = Callable[[str, uuid.UUID], None]
Partitions = dict[uuid.UUID, frozenset[int]]

# How often member session timeouts are checked.
EXPIRY_SWEEP_MS = 250

# Records that only remove a member: for a group that is not there they change nothing.
_MEMBER_TOMBSTONES = (
    ShareGroupMemberMetadataTombstone,
    ShareGroupTargetAssignmentMemberTombstone,
    ShareGroupCurrentMemberAssignmentTombstone,
)


@dataclass(frozen=True, slots=True)
class GroupListing:
    group_id: str
    state: str


class GroupCoordinator:
    def __init__(
        self,
        persister: Persister,
        topics: TopicsProvider,
        config_store: GroupConfigStore,
        record_log: CoordinatorLog | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.persister = persister
        self.topics = topics
        self.configs = config_store
        self.clock = clock
        self.groups: dict[str, ShareGroup] = {}
        self.runtime: CoordinatorRuntime[GroupRecord] = CoordinatorRuntime(
            "groups",
            record_log if record_log is not None else MemoryRecordLog(),
            encode=group_records.encode,
            decode=group_records.decode,
            replay=self._replay,
            clock=clock,
            compaction=KeyCompaction(group_records.compaction_keys, clock),
        )
        # Called with (group id, member id) after a member leaves or is fenced.
        self.member_removed_hooks: list[MemberRemoved] = []
        # Called with (group id, topic id) when a group's share state of a topic is deleted.
        self.state_deleted_hooks: list[StateDeleted] = []
        self._expiry_timer: Timer | None = None
        self._expiry_task: asyncio.Task[None] | None = None
        self._initializing: set[asyncio.Task[None]] = set()
        self._stopped = False

    # -- lifecycle --------------------------------------------------------------

    def load(self) -> None:
        """Rebuild groups and configs by replaying the record log (startup)."""
        count = self.runtime.load()
        now = self.clock.now_ms()
        for group_id, group in self.groups.items():
            group.on_loaded(now, self.config(group_id))
        log.info("groups_loaded", records=count, groups=len(self.groups))

    def start(self) -> None:
        self._stopped = False
        self._schedule_expiry()

    async def stop(self) -> None:
        self._stopped = True
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
        if self._expiry_task is not None:
            self._expiry_task.cancel()
        for task in list(self._initializing):
            task.cancel()
        await self.runtime.stop()

    def close(self) -> None:
        self.runtime.close()

    # -- records ----------------------------------------------------------------

    def _replay(self, record: GroupRecord) -> None:
        """The one place group records take effect, live (once fsynced) and at startup."""
        if isinstance(record, GroupConfigRecord):
            self.configs.replay(record)
            return
        group = self.groups.get(record.group_id)
        if isinstance(record, ShareGroupTombstone):
            if group is not None:
                group.replay(record)
                del self.groups[record.group_id]
            return
        if group is None:
            if isinstance(record, _MEMBER_TOMBSTONES):
                return
            group = self.groups[record.group_id] = ShareGroup(record.group_id)
        group.replay(record)

    def config(self, group_id: str) -> GroupConfig:
        return self.configs.config(group_id)

    @staticmethod
    def _with_initializing(
        group: ShareGroup, records: Sequence[ShareGroupRecord]
    ) -> tuple[list[ShareGroupRecord], Partitions]:
        """Add to `records` the bookkeeping that starts share-state initialization of the
        partitions the group subscribes to once they apply (in the same batch, as
        Kafka's heartbeat does), and return those partitions."""
        after = group
        if records:
            after = copy.deepcopy(group)
            after.replay_all(records)
        pending = after.partitions_to_initialize()
        if not pending:
            return list(records), {}
        return [*records, *after.mark_initializing(pending)], pending

    # -- ShareGroupHeartbeat ----------------------------------------------------

    async def heartbeat(
        self,
        group_id: str,
        member_id: str,
        member_epoch: int,
        subscribed_topic_names: list[str] | None,
        rack_id: str | None,
        client_id: str,
        client_host: str,
    ) -> HeartbeatResult:
        # Kafka validates the request before anything else; then a group that does not
        # exist is GROUP_ID_NOT_FOUND unless the member joins (GroupMetadataManager's
        # getOrMaybeCreateShareGroup, and shareGroup() for a leave).
        validate_heartbeat_request(
            group_id, member_id, member_epoch, subscribed_topic_names, rack_id
        )

        def op() -> tuple[list[ShareGroupRecord], tuple[HeartbeatResult, set[str], Partitions]]:
            group = self.groups.get(group_id)
            if group is None:
                if member_epoch != 0:
                    raise KafkaError(
                        ErrorCode.group_id_not_found, f"Share group {group_id} not found."
                    )
                # Computes the new group's first records; replaying them creates it.
                group = ShareGroup(group_id)
            before = set(group.members)
            result = group.heartbeat(
                member_id,
                member_epoch,
                subscribed_topic_names,
                rack_id,
                client_id,
                client_host,
                self.topics(),
                self.clock.now_ms(),
                self.config(group_id),
            )
            records, pending = self._with_initializing(group, result.records)
            return records, (result, before, pending)

        try:
            result, before, pending = await self.runtime.run(group_id, op)
        except KafkaError as exc:
            raise for_coordinator_rpc(exc) from exc
        group = self.groups.get(group_id)
        members = set() if group is None else set(group.members)
        if (
            group is not None
            and member_id in members
            and group.session_deadline_ms(member_id) is None
        ):
            # A new group: the replay created it, not the one that set the session timer.
            group.on_loaded(self.clock.now_ms(), self.config(group_id))
        for gone in before - members:
            self._member_removed(group_id, gone, "left")
        if member_id not in before and member_id in members:
            assert group is not None
            log.info(
                "member_joined",
                group=group_id,
                member=member_id,
                group_epoch=group.group_epoch,
                client_id=client_id,
            )
        self._start_initializing(group_id, pending)
        return result

    def _member_removed(self, group_id: str, member_id: str, reason: str) -> None:
        log.info("member_removed", group=group_id, member=member_id, reason=reason)
        for hook in self.member_removed_hooks:
            hook(group_id, member_id)

    # -- share-state initialization ---------------------------------------------

    def _start_initializing(self, group_id: str, pending: Partitions) -> None:
        """Give newly subscribed partitions share state (InitializeShareGroupState); their
        bookkeeping already says `initializing`."""
        if not pending or self._stopped:
            return
        task = asyncio.ensure_future(self._initialize(group_id, pending))
        self._initializing.add(task)
        task.add_done_callback(self._initializing.discard)

    async def _initialize(self, group_id: str, pending: Mapping[uuid.UUID, Iterable[int]]) -> None:
        done: dict[uuid.UUID, set[int]] = {}
        failed: dict[uuid.UUID, set[int]] = {}
        for topic_id, partitions in pending.items():
            for partition in partitions:
                key = ShareStateKey(group_id, topic_id, partition)
                try:
                    await self.persister.initialize_state(key, 0, UNINITIALIZED_START_OFFSET)
                    done.setdefault(topic_id, set()).add(partition)
                except KafkaError as exc:
                    log.warning(
                        "share_state_initialize_failed",
                        group=group_id,
                        topic_id=str(topic_id),
                        partition=partition,
                        error=exc.message,
                    )
                    failed.setdefault(topic_id, set()).add(partition)
        try:
            if done:
                await self._mark(group_id, lambda g: g.mark_initialized(done))
            if failed:
                await self._mark(group_id, lambda g: g.mark_uninitialized(failed))
        except KafkaError as exc:
            # The partitions stay `initializing`; a share fetch initializes them on use.
            log.warning("share_state_bookkeeping_failed", group=group_id, error=exc.message)

    async def _mark(
        self, group_id: str, records_of: Callable[[ShareGroup], list[ShareGroupRecord]]
    ) -> None:
        def op() -> tuple[list[ShareGroupRecord], None]:
            group = self.groups.get(group_id)
            return ([] if group is None else records_of(group)), None

        await self.runtime.run(group_id, op)

    def is_initialized(self, group_id: str, topic_id: uuid.UUID, partition: int) -> bool:
        group = self.groups.get(group_id)
        return group is not None and partition in group.initialized.get(topic_id, frozenset())

    async def ensure_initialized(self, group_id: str, topic_id: uuid.UUID, partition: int) -> None:
        """Initialize share state now if the group's background initialization has not
        reached this partition yet (a fetch can arrive right after the heartbeat)."""
        if group_id not in self.groups or self.is_initialized(group_id, topic_id, partition):
            return
        for task in list(self._initializing):
            await asyncio.shield(task)
        if group_id in self.groups and not self.is_initialized(group_id, topic_id, partition):
            await self._initialize(group_id, {topic_id: [partition]})

    # -- timers and topic changes -------------------------------------------------

    def _schedule_expiry(self) -> None:
        if self._stopped:
            return
        self._expiry_timer = self.clock.call_at(
            self.clock.now_ms() + EXPIRY_SWEEP_MS, self._on_expiry_timer
        )

    def _on_expiry_timer(self) -> None:
        self._expiry_task = asyncio.ensure_future(self._expiry_sweep())

    async def _expiry_sweep(self) -> None:
        try:
            await self.expire_members(self.clock.now_ms())
        except Exception:
            log.exception("member_expiry_failed")
        finally:
            self._schedule_expiry()

    async def expire_members(self, at_ms: int) -> None:
        """Fence the members whose session timed out by `at_ms` (share.session.timeout.ms)."""
        for group_id, group in list(self.groups.items()):
            if not group.expire_members(at_ms).expired:
                continue

            def op(group_id: str = group_id) -> tuple[list[ShareGroupRecord], list[str]]:
                group = self.groups.get(group_id)
                if group is None:
                    return [], []
                result = group.expire_members(at_ms)
                return result.records, [m.member_id for m in result.expired]

            try:
                expired = await self.runtime.run(group_id, op)
            except KafkaError as exc:
                log.warning("member_expiry_not_written", group=group_id, error=exc.message)
                continue
            for member_id in expired:
                self._member_removed(group_id, member_id, "session_timeout")

    async def on_topics_changed(self) -> None:
        """Topics were created, deleted or grew: recompute assignments, drop dead state."""
        topics = self.topics()
        for group_id in list(self.groups):

            def op(
                group_id: str = group_id,
            ) -> tuple[list[ShareGroupRecord], tuple[Partitions, Partitions]]:
                group = self.groups.get(group_id)
                if group is None:
                    return [], ({}, {})
                result = group.on_topics_changed(topics)
                # What had share state, as committed before these records forget it.
                deleted = {
                    topic_id: group.initialized.get(topic_id, frozenset())
                    | group.initializing.get(topic_id, frozenset())
                    for topic_id in result.deleted_topic_ids
                }
                records, pending = self._with_initializing(group, result.records)
                return records, (deleted, pending)

            try:
                deleted, pending = await self.runtime.run(group_id, op)
            except KafkaError as exc:
                log.warning("topic_change_not_written", group=group_id, error=exc.message)
                continue
            for topic_id, partitions in deleted.items():
                for partition in sorted(partitions):
                    key = ShareStateKey(group_id, topic_id, partition)
                    try:
                        await self.persister.delete_state(key)
                    except KafkaError as exc:
                        log.warning(
                            "share_state_delete_failed",
                            group=group_id,
                            topic_id=str(topic_id),
                            partition=partition,
                            error=exc.message,
                        )
                for hook in self.state_deleted_hooks:
                    hook(group_id, topic_id)
            self._start_initializing(group_id, pending)

    # -- describe / list / configs ------------------------------------------------

    def describe(self, group_id: str) -> ShareGroupDescription:
        group = self.groups.get(group_id)
        if group is None or group.deleted:
            raise KafkaError(ErrorCode.group_id_not_found, f"Group {group_id} not found.")
        return group.describe()

    def list_groups(self) -> list[GroupListing]:
        return [
            GroupListing(g.group_id, g.state.value)
            for g in sorted(self.groups.values(), key=lambda g: g.group_id)
            if not g.deleted
        ]

    async def alter_configs(
        self, group_id: str, ops: list[AlterConfigOp], validate_only: bool
    ) -> None:
        """IncrementalAlterConfigs of a GROUP; a failed write is KAFKA_STORAGE_ERROR."""
        if validate_only:
            self.configs.incremental_alter(group_id, ops)
            return

        def op() -> tuple[list[GroupConfigRecord], list[GroupConfigRecord]]:
            records = self.configs.incremental_alter(group_id, ops)
            return records, records

        records = await self.runtime.run(group_id, op)
        log.info("group_config_altered", group=group_id, configs={r.name: r.value for r in records})
