"""The group coordinator runtime: share groups, their configs, timers and share state.

The rules live in the sans-IO `ShareGroup` and `GroupConfigStore`; this runtime looks
groups up, feeds them the current topic metadata and time, applies the records they
return (`_apply`, the one place records take effect), initializes share-partition
state through the `Persister`, and tells the broker when members go away so their
acquired records can be released.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import structlog

from coordinator import group_records
from coordinator.assignor import TopicMetadata
from coordinator.group_config import (
    AlterConfigOp,
    GroupConfig,
    GroupConfigRecord,
    GroupConfigStore,
)
from coordinator.share_group import (
    HeartbeatResult,
    ShareGroup,
    ShareGroupDescription,
    ShareGroupRecord,
)
from coordinator.share_state import UNINITIALIZED_START_OFFSET, Persister, ShareStateKey
from protocol.errors import ErrorCode, KafkaError

log = structlog.get_logger("spool.groups")


class RecordLog(Protocol):
    """Where the coordinator's records go (persister.record_log.RecordLog)."""

    def write(self, records: Sequence[tuple[bytes | None, bytes | None]]) -> None: ...
    async def sync(self) -> None: ...
    def replay(self) -> Iterator[tuple[bytes | None, bytes | None]]: ...
    def close(self) -> None: ...


TopicsProvider = Callable[[], Mapping[uuid.UUID, TopicMetadata]]
MemberRemoved = Callable[[str, str], None]
StateDeleted = Callable[[str, uuid.UUID], None]

# How often member session timeouts are checked.
EXPIRY_SWEEP_S = 0.25


def now_ms() -> int:
    return time.time_ns() // 1_000_000


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
        record_log: RecordLog | None = None,
    ) -> None:
        self.persister = persister
        self.record_log = record_log
        self.topics = topics
        self.configs = config_store
        self.groups: dict[str, ShareGroup] = {}
        # Called with (group id, member id) after a member leaves or is fenced.
        self.member_removed_hooks: list[MemberRemoved] = []
        # Called with (group id, topic id) when a group's share state of a topic is deleted.
        self.state_deleted_hooks: list[StateDeleted] = []
        self._expiry_task: asyncio.Task[None] | None = None
        self._initializing: set[asyncio.Task[None]] = set()

    # -- lifecycle --------------------------------------------------------------

    def load(self) -> None:
        """Rebuild groups and configs by replaying the record log (startup)."""
        if self.record_log is None:
            return
        count = 0
        for _, value in self.record_log.replay():
            if value is None:
                continue
            record = group_records.decode(value)
            count += 1
            if isinstance(record, GroupConfigRecord):
                self.configs.replay(record)
            else:
                group = self.groups.get(record.group_id)
                if group is None:
                    group = self.groups[record.group_id] = ShareGroup(record.group_id)
                group.replay(record)
        for group_id, group in list(self.groups.items()):
            if group.deleted:
                del self.groups[group_id]
            else:
                group.on_loaded(now_ms(), self.config(group_id))
        log.info("groups_loaded", records=count, groups=len(self.groups))

    def start(self) -> None:
        self._expiry_task = asyncio.create_task(self._expiry_loop())

    async def stop(self) -> None:
        if self._expiry_task is not None:
            self._expiry_task.cancel()
        for task in list(self._initializing):
            task.cancel()

    def close(self) -> None:
        if self.record_log is not None:
            self.record_log.close()

    # -- records ----------------------------------------------------------------

    async def _apply(self, group: ShareGroup, records: Iterable[ShareGroupRecord]) -> None:
        """The one place group records take effect: written to the log, replayed, and
        fsynced before the caller answers (later requests already see the change)."""
        records = list(records)
        if not records:
            return
        if self.record_log is not None:
            self.record_log.write([group_records.encode(r) for r in records])
        group.replay_all(records)
        if self.record_log is not None:
            await self.record_log.sync()

    def config(self, group_id: str) -> GroupConfig:
        return self.configs.config(group_id)

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
        if not group_id:
            raise KafkaError(ErrorCode.invalid_group_id, "GroupId can't be empty.")
        group = self.groups.get(group_id)
        if group is None or group.deleted:
            if member_epoch != 0:
                raise KafkaError(
                    ErrorCode.unknown_member_id, f"Share group {group_id} does not exist"
                )
            group = ShareGroup(group_id)
            self.groups[group_id] = group
        before = set(group.members)
        result = group.heartbeat(
            member_id,
            member_epoch,
            subscribed_topic_names,
            rack_id,
            client_id,
            client_host,
            self.topics(),
            now_ms(),
            self.config(group_id),
        )
        await self._apply(group, result.records)
        for gone in before - set(group.members):
            self._member_removed(group_id, gone, "left")
        if member_id not in before and member_id in group.members:
            log.info(
                "member_joined",
                group=group_id,
                member=member_id,
                group_epoch=group.group_epoch,
                client_id=client_id,
            )
        self._initialize_new_partitions(group)
        return result

    def _member_removed(self, group_id: str, member_id: str, reason: str) -> None:
        log.info("member_removed", group=group_id, member=member_id, reason=reason)
        for hook in self.member_removed_hooks:
            hook(group_id, member_id)

    def _initialize_new_partitions(self, group: ShareGroup) -> None:
        """Give newly subscribed partitions share state (InitializeShareGroupState)."""
        pending = group.partitions_to_initialize()
        if not pending:
            return
        records = group.mark_initializing(pending)
        if self.record_log is not None:
            self.record_log.write([group_records.encode(r) for r in records])
        group.replay_all(records)
        task = asyncio.create_task(self._initialize(group, pending))
        self._initializing.add(task)
        task.add_done_callback(self._initializing.discard)

    async def _initialize(
        self, group: ShareGroup, pending: Mapping[uuid.UUID, Iterable[int]]
    ) -> None:
        done: dict[uuid.UUID, set[int]] = {}
        failed: dict[uuid.UUID, set[int]] = {}
        for topic_id, partitions in pending.items():
            for partition in partitions:
                key = ShareStateKey(group.group_id, topic_id, partition)
                try:
                    await self.persister.initialize_state(key, 0, UNINITIALIZED_START_OFFSET)
                    done.setdefault(topic_id, set()).add(partition)
                except KafkaError as exc:
                    log.warning(
                        "share_state_initialize_failed",
                        group=group.group_id,
                        topic_id=str(topic_id),
                        partition=partition,
                        error=exc.message,
                    )
                    failed.setdefault(topic_id, set()).add(partition)
        if done:
            await self._apply(group, group.mark_initialized(done))
        if failed:
            await self._apply(group, group.mark_uninitialized(failed))

    def is_initialized(self, group_id: str, topic_id: uuid.UUID, partition: int) -> bool:
        group = self.groups.get(group_id)
        return group is not None and partition in group.initialized.get(topic_id, frozenset())

    async def ensure_initialized(self, group_id: str, topic_id: uuid.UUID, partition: int) -> None:
        """Initialize share state now if the group's background initialization has not
        reached this partition yet (a fetch can arrive right after the heartbeat)."""
        group = self.groups.get(group_id)
        if group is None or self.is_initialized(group_id, topic_id, partition):
            return
        for task in list(self._initializing):
            await asyncio.shield(task)
        if not self.is_initialized(group_id, topic_id, partition):
            await self._initialize(group, {topic_id: [partition]})

    # -- timers and topic changes -------------------------------------------------

    async def _expiry_loop(self) -> None:
        while True:
            await asyncio.sleep(EXPIRY_SWEEP_S)
            try:
                await self.expire_members(now_ms())
            except Exception:
                log.exception("member_expiry_failed")

    async def expire_members(self, at_ms: int) -> None:
        for group in list(self.groups.values()):
            result = group.expire_members(at_ms)
            if not result.expired:
                continue
            await self._apply(group, result.records)
            for member in result.expired:
                self._member_removed(group.group_id, member.member_id, "session_timeout")

    async def on_topics_changed(self) -> None:
        """Topics were created, deleted or grew: recompute assignments, drop dead state."""
        topics = self.topics()
        for group in list(self.groups.values()):
            if group.deleted:
                continue
            result = group.on_topics_changed(topics)
            await self._apply(group, result.records)
            for topic_id in result.deleted_topic_ids:
                partitions = group.initialized.get(topic_id, frozenset()) | group.initializing.get(
                    topic_id, frozenset()
                )
                for partition in partitions:
                    await self.persister.delete_state(
                        ShareStateKey(group.group_id, topic_id, partition)
                    )
                if partitions:
                    await self._apply(group, group.mark_uninitialized({topic_id: partitions}))
                for hook in self.state_deleted_hooks:
                    hook(group.group_id, topic_id)
            self._initialize_new_partitions(group)

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
        records = self.configs.incremental_alter(group_id, ops)
        if validate_only:
            return
        if self.record_log is not None:
            self.record_log.write([group_records.encode(r) for r in records])
        for record in records:
            self.configs.replay(record)
        if self.record_log is not None:
            await self.record_log.sync()
        log.info("group_config_altered", group=group_id, configs={r.name: r.value for r in records})
