"""The group coordinator: share groups, their configs, timers and share state.

The rules live in the sans-IO `ShareGroup` and `GroupConfigStore`; this shell looks
groups up, feeds them the current topic metadata and time, and runs every change as an
operation of the `CoordinatorRuntime` over `data/groups/`: records are computed from
committed state under the group's key (its id), fsynced, then replayed (`_replay`, the
one place group records take effect). It initializes share-partition state through the
`Persister` in the background (a heartbeat never waits for it; only initialized
partitions are assigned, so the first heartbeats of a new group get an empty
assignment until the state is durable, as in Kafka 4.2) and tells the broker when
members go away (their acquired records stay theirs until their share session closes,
their connection drops or the locks expire, as in Kafka). Group configs are read from
the store it is given: on a broker the cluster metadata's, as Kafka's group coordinator
reads GroupConfigManager, which the metadata log feeds (coordinator.group_config).
"""

from __future__ import annotations

import asyncio
import copy
import typing
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from coordinator import group_records
from coordinator.assignor import TopicMetadata
from coordinator.classic_group import ClassicGroupTombstone, GroupMetadataRecord
from coordinator.classic_group_ops import ClassicGroupOps
from coordinator.consumer_group_ops import CONSUMER_GROUP_RECORDS, ConsumerGroupOps
from coordinator.group_config import (
    OFFSETS_COMMIT_TIMEOUT_MS,
    AlterConfigOp,
    GroupConfig,
    GroupConfigRecord,
    GroupConfigStore,
)
from coordinator.group_host import GroupType, OffsetGroup
from coordinator.group_records import GroupRecord
from coordinator.offsets import (
    OFFSETS_RETENTION_CHECK_INTERVAL_MS,
    FetchedOffset,
    OffsetRecord,
    OffsetStore,
    PartitionCommit,
    SimpleGroup,
)
from coordinator.runtime import (
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
from coordinator.share_state import (
    Persister,
    ShareStateKey,
)
from coordinator.transactions import offsets_partition
from persister.clock import SYSTEM_CLOCK, Clock, Timer
from persister.coordinator_log import MemoryRecordLog
from persister.share_records import UNINITIALIZED_START_OFFSET, UNKNOWN_DELIVERY_COMPLETE_COUNT
from persister.storage import CoordinatorLog
from protocol.errors import ErrorCode, KafkaError

log = structlog.get_logger("spool.groups")

TopicsProvider = Callable[[], Mapping[uuid.UUID, TopicMetadata]]
MemberRemoved = Callable[[str, str], None]
StateDeleted = Callable[[str, uuid.UUID], None]
Partitions = dict[uuid.UUID, frozenset[int]]
# (topic id, partition) -> the log end offset (high watermark), None if unknown.
EndOffset = Callable[[uuid.UUID, int], "int | None"]
# What DescribeShareGroupOffsets answers without share state (Kafka's PartitionFactory).
UNKNOWN_LAG = -1
NO_STATE_LEADER_EPOCH = 0
UNKNOWN_TOPIC_MESSAGE = "This server does not host this topic-partition."

# How often member session timeouts are checked.
EXPIRY_SWEEP_MS = 250
# How long a ShareFetch's load waits for a share-state initialization already under way
# before it initializes the partition itself (Kafka's offsets.commit.timeout.ms).
INITIALIZE_WAIT_MS = OFFSETS_COMMIT_TIMEOUT_MS

_SHARE_GROUP_RECORDS = typing.get_args(ShareGroupRecord)
_OFFSET_RECORDS = typing.get_args(OffsetRecord)
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
    group_type: str = GroupType.SHARE.value
    protocol_type: str = "share"


@dataclass(frozen=True, slots=True)
class PartitionOffsets:
    """One partition of DescribeShareGroupOffsets."""

    partition: int
    start_offset: int = UNINITIALIZED_START_OFFSET
    leader_epoch: int = NO_STATE_LEADER_EPOCH
    lag: int = UNKNOWN_LAG


@dataclass(frozen=True, slots=True)
class PartitionResult:
    """One partition's outcome of an admin change (AlterShareGroupOffsets)."""

    partition: int
    error: ErrorCode = ErrorCode.none
    message: str | None = None


@dataclass(frozen=True, slots=True)
class TopicResult:
    """One topic of an admin RPC's answer: its id (None if unknown) and per-partition
    results, or a topic-level error (DeleteShareGroupOffsets)."""

    name: str
    topic_id: uuid.UUID | None
    partitions: tuple[PartitionOffsets | PartitionResult, ...] = ()
    error: ErrorCode = ErrorCode.none
    message: str | None = None


class GroupCoordinator:
    def __init__(
        self,
        persister: Persister,
        topics: TopicsProvider,
        config_store: GroupConfigStore,
        record_log: CoordinatorLog | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
        configs_in_metadata: bool = False,
        offsets: OffsetStore | None = None,
        offsets_retention_check_interval_ms: int = OFFSETS_RETENTION_CHECK_INTERVAL_MS,
    ) -> None:
        self.persister = persister
        self.topics = topics
        # The group configs read (the broker's: the cluster metadata's store, which
        # every broker's metadata replay changes, wherever the change was made).
        self.configs = config_store
        # With `configs_in_metadata` (the broker), group config records found in the
        # groups log (written by spool before configs moved to the metadata log) are
        # collected here for the broker to adopt into the metadata log, not applied;
        # and configs are altered through the metadata, not here.
        self.configs_in_metadata = configs_in_metadata
        self.legacy_configs = GroupConfigStore(config_store.broker)
        self.clock = clock
        self.groups: dict[str, ShareGroup] = {}
        # The other group types of the one group-id namespace (coordinator.group_host):
        # an id is a key of at most one of these dicts and `groups`.
        self.classic_groups: dict[str, OffsetGroup] = {}
        self.consumer_groups: dict[str, OffsetGroup] = {}
        # Committed offsets of consumer and classic groups (coordinator.offsets).
        self.offsets = offsets if offsets is not None else OffsetStore()
        self.offsets_retention_check_interval_ms = offsets_retention_check_interval_ms
        self._retention_timer: Timer | None = None
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
        # Called with (group id, topic id) when a group's share state of a topic is deleted
        # or replaced (an admin reset): the share-partition leader drops what it holds.
        self.state_deleted_hooks: list[StateDeleted] = []
        self._expiry_timer: Timer | None = None
        self._expiry_task: asyncio.Task[None] | None = None
        self._initializing: set[asyncio.Task[None]] = set()
        self._stopped = False
        self.runtime.on_fenced = self._unload
        # KIP-848 consumer groups (ConsumerGroupHeartbeat): coordinator.consumer_group_ops.
        self.consumer = ConsumerGroupOps(self)
        # Classic groups (JoinGroup/SyncGroup): coordinator.classic_group_ops.
        self.classic = ClassicGroupOps(self)

    # -- lifecycle --------------------------------------------------------------

    def load(self) -> None:
        """Rebuild groups and configs by replaying the record log (startup)."""
        count = self.runtime.load()
        self.consumer.on_loaded()
        self.classic.on_loaded()
        now = self.clock.now_ms()
        for group_id, group in self.groups.items():
            group.on_loaded(now, self.config(group_id))
        log.info("groups_loaded", records=count, groups=len(self.groups))

    def start(self) -> None:
        self._stopped = False
        self._schedule_expiry()
        self._schedule_retention()
        self.classic.start()
        self._track(self._finish_pending())

    async def settle(self) -> None:
        """Wait for the background share-state work started so far (initialization,
        the restart's recovery) to finish."""
        while pending := [task for task in self._initializing if not task.done()]:
            await asyncio.gather(*pending, return_exceptions=True)

    def _track(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._initializing.add(task)
        task.add_done_callback(self._initializing.discard)

    async def _finish_pending(self) -> None:
        """After a restart, finish what a crash cut short: share state of `deleting`
        topics is deleted (then unmarked), `initializing` partitions get state (or are
        marked initialized if they have it already, e.g. a reset done up to its last
        step)."""
        for group_id, group in list(self.groups.items()):
            try:
                if group.deleting:
                    topics = self.topics()
                    pending = {
                        t: frozenset(range(topics[t].num_partitions))
                        for t in group.deleting
                        if t in topics
                    }
                    failed = await self._delete_state(group_id, pending)
                    done = group.deleting - failed
                    await self._mark(group_id, _marks_deleted(done))
                if group.initializing:
                    await self._initialize(group_id, dict(group.initializing))
            except KafkaError as exc:
                log.warning("share_state_recovery_failed", group=group_id, error=exc.message)

    async def stop(self) -> None:
        self._stopped = True
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
        if self._retention_timer is not None:
            self._retention_timer.cancel()
        if self._expiry_task is not None:
            self._expiry_task.cancel()
        for task in list(self._initializing):
            task.cancel()
        self.consumer.unload()
        self.classic.timers.cancel_all()
        await self.runtime.stop()

    def close(self) -> None:
        self.runtime.close()

    def _unload(self) -> None:
        """The groups log was claimed by another broker (a write refused as fenced): it
        coordinates these groups now. Drop them from memory and stop the member expiry
        timer; every later operation answers NOT_COORDINATOR (the runtime refuses it),
        describing a group too, and none is listed."""
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
            self._expiry_timer = None
        for task in list(self._initializing):
            task.cancel()
        if self._retention_timer is not None:
            self._retention_timer.cancel()
            self._retention_timer = None
        self.consumer.unload()
        unloaded = len(self.groups) + len(self.classic_groups) + len(self.consumer_groups)
        self.groups.clear()
        self.classic.unload()  # its parked requests answered before the groups go
        self._forget_offsets()
        log.warning("groups_unloaded", groups=unloaded)

    async def unload(self, reason: str) -> None:
        """This broker no longer leads the groups log (handed over): operations from
        now on answer NOT_COORDINATOR, those in flight finish, then the groups leave
        memory and the timers stop."""
        self.runtime.unload(reason)
        await self.runtime.quiesce()
        await self.stop()
        self._unload()

    def drop(self, reason: str) -> None:
        """Another broker claimed the groups log: unload at once (writes are fenced)."""
        self.runtime.unload(reason)
        self._stopped = True
        self._unload()

    def reload(self, record_log: CoordinatorLog) -> None:
        """This broker leads the groups log (again), restored from the database: the
        groups are rebuilt by replaying `record_log` and the timers started."""
        self.groups.clear()
        self.classic.unload()  # its parked requests answered before the groups go
        self._forget_offsets()
        self.runtime.reopen(record_log)
        self.load()
        self.start()

    def _check_coordinator(self) -> None:
        # NOT_COORDINATOR, or COORDINATOR_LOAD_IN_PROGRESS while the log loads here.
        self.runtime.check_led()

    # -- records ----------------------------------------------------------------

    def _replay(self, record: GroupRecord) -> None:
        """The one place group records take effect, live (once fsynced) and at startup."""
        if isinstance(record, GroupConfigRecord):
            (self.legacy_configs if self.configs_in_metadata else self.configs).replay(record)
            return
        if isinstance(record, _OFFSET_RECORDS):
            self._replay_offsets(record)
            return
        if isinstance(record, CONSUMER_GROUP_RECORDS):
            self.consumer.replay(record)
            return
        if isinstance(record, GroupMetadataRecord | ClassicGroupTombstone):
            self.classic.replay(record)
            return
        if not isinstance(record, _SHARE_GROUP_RECORDS):
            # Consumer-group, classic-group and offset records: the codec knows them, but
            # this coordinator serves share groups only; a log holding them was written by
            # a spool that serves those groups, and loading it here would lose them.
            raise ValueError(
                f"the groups log holds a {type(record).__name__} record (group "
                f"{record.group_id!r}): consumer and classic groups are not served by this "
                "version of spool"
            )
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

    def _replay_offsets(self, record: OffsetRecord) -> None:
        """An offset record takes effect; an id with offsets and no group is a simple
        group (Kafka makes one on replay too), which goes with its last offset."""
        self.offsets.replay(record)
        group_id = record.group_id
        if self.offsets.has_offsets(group_id):
            if self.group_type(group_id) is None:
                self.classic_groups[group_id] = SimpleGroup(group_id)
        elif isinstance(self.classic_groups.get(group_id), SimpleGroup):
            del self.classic_groups[group_id]

    def _forget_offsets(self) -> None:
        self.offsets.committed.clear()
        self.offsets.pending.clear()
        self.classic_groups.clear()
        self.consumer_groups.clear()

    def config(self, group_id: str) -> GroupConfig:
        return self.configs.config(group_id)

    def group_type(self, group_id: str) -> GroupType | None:
        """The type of the group `group_id` names, None if there is none."""
        share = self.groups.get(group_id)
        if share is not None and not share.deleted:
            return GroupType.SHARE
        for groups in (self.classic_groups, self.consumer_groups):
            other = groups.get(group_id)
            if other is not None:
                return other.group_type
        return None

    def _refuse_other_type(self, group_id: str) -> None:
        """A share-group RPC naming a classic or consumer group: GROUP_ID_NOT_FOUND, as
        Kafka 4.2's shareGroup() lookup answers."""
        found = self.group_type(group_id)
        if found is not None and found != GroupType.SHARE:
            raise KafkaError(
                ErrorCode.group_id_not_found, f"Group {group_id} is not a share group."
            )

    def _with_initializing(
        self, group: ShareGroup, records: Sequence[ShareGroupRecord]
    ) -> tuple[list[ShareGroupRecord], Partitions]:
        """Add to `records` the bookkeeping that starts share-state initialization of the
        partitions the group subscribes to once they apply (in the same batch, as
        Kafka's heartbeat does), and return those partitions."""
        after = group
        if records:
            after = copy.deepcopy(group)
            after.replay_all(records)
        now = self.clock.now_ms()
        retry_ms = self.config(group.group_id).initialize_retry_interval_ms
        pending = after.partitions_to_initialize(now, retry_ms)
        if not pending:
            return list(records), {}
        group.initializing_started(pending, now)
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
            self._refuse_other_type(group_id)
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
            # The heartbeat's records already mark `result.initialize` initializing.
            return result.records, (result, before, result.initialize)

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
        group = self.groups.get(group_id)
        # The state epoch is the group epoch the initialization was decided at (Kafka's
        # buildInitializeShareGroupStateRequest).
        epoch = 0 if group is None else group.group_epoch
        self._track(self._initialize(group_id, pending, epoch))

    async def _initialize(
        self,
        group_id: str,
        pending: Mapping[uuid.UUID, Iterable[int]],
        state_epoch: int | None = None,
    ) -> None:
        """InitializeShareGroupState for `pending` (Kafka's persisterInitialize): state
        epoch the group epoch, start offset -1, so the share-partition leader resolves
        `share.auto.offset.reset` when it first loads the partition. Then, durably, the
        partitions that got state are `initialized` (and assigned: the same write bumps
        the group epoch), those that failed forgotten, for a later heartbeat to retry
        (Kafka's uninitializeShareGroupState). If that write fails too, they stay
        `initializing`, unassigned, until `group.share.initialize.retry.interval.ms`
        has passed and a heartbeat retries them."""
        if state_epoch is None:
            group = self.groups.get(group_id)
            state_epoch = 0 if group is None else group.group_epoch
        done: dict[uuid.UUID, set[int]] = {}
        failed: dict[uuid.UUID, set[int]] = {}
        for topic_id, partitions in pending.items():
            for partition in partitions:
                key = ShareStateKey(group_id, topic_id, partition)
                current = self.groups.get(group_id)
                if (
                    current is None
                    or current.deleted
                    or topic_id in current.deleting
                    or topic_id not in self.topics()
                ):
                    # DeleteGroups (or DeleteShareGroupOffsets) began meanwhile, or the topic
                    # was deleted: state made now would outlive the deletion.
                    continue
                try:
                    # Checked in the share-state key's turn: a reset's (or a consumer's)
                    # state is never clobbered when bookkeeping lagged behind.
                    await self.persister.initialize_if_absent(key, state_epoch)
                    done.setdefault(topic_id, set()).add(partition)
                except KafkaError as exc:
                    _state_call_failed("share_state_initialize_failed", key, exc)
                    failed.setdefault(topic_id, set()).add(partition)
        try:
            if done:
                # Checked in the group's turn: a topic deleted meanwhile is not counted.
                await self._mark(
                    group_id,
                    lambda g: g.mark_initialized(
                        {t: p for t, p in done.items() if t in self.topics()}
                    ),
                )
                group = self.groups.get(group_id)
                log.info(
                    "share_state_initialized",
                    group=group_id,
                    partitions={str(t): sorted(p) for t, p in done.items()},
                    group_epoch=None if group is None else group.group_epoch,
                )
            if failed:
                await self._mark(group_id, lambda g: g.mark_uninitialized(failed))
        except KafkaError as exc:
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
        """Before a ShareFetch loads a partition: give it share state if the group has
        none for it yet. Members are only assigned initialized partitions, but a fetch
        may name any partition; it waits (at most INITIALIZE_WAIT_MS on the clock) for
        the share-state work under way, then initializes the partition itself if still
        needed."""
        if group_id not in self.groups or self.is_initialized(group_id, topic_id, partition):
            return
        pending = [task for task in self._initializing if not task.done()]
        if pending:
            await self._wait_bounded(pending, INITIALIZE_WAIT_MS)
        if group_id in self.groups and not self.is_initialized(group_id, topic_id, partition):
            await self._initialize(group_id, {topic_id: [partition]})

    async def _wait_bounded(self, tasks: list[asyncio.Task[None]], timeout_ms: int) -> None:
        """Wait for `tasks` (never cancelling them) until `timeout_ms` passes on the clock."""
        timed_out = False
        waiter = asyncio.ensure_future(asyncio.wait(tasks))

        def expire() -> None:
            nonlocal timed_out
            timed_out = True
            waiter.cancel()

        timer = self.clock.call_at(self.clock.now_ms() + timeout_ms, expire)
        try:
            await waiter
        except asyncio.CancelledError:
            if not timed_out:
                raise
        finally:
            timer.cancel()

    # -- committed offsets (OffsetCommit, OffsetFetch, OffsetDelete) ----------------

    def _offset_group(self, group_id: str) -> OffsetGroup | None:
        """The consumer or classic group `group_id` names; GROUP_ID_NOT_FOUND for a share
        group ("not a consumer group", as Kafka 4.2's ShareGroup answers offset RPCs)."""
        found = self.group_type(group_id)
        if found == GroupType.SHARE:
            raise KafkaError(
                ErrorCode.group_id_not_found, f"Group {group_id} is not a consumer group."
            )
        return self.classic_groups.get(group_id) or self.consumer_groups.get(group_id)

    async def commit_offsets(
        self,
        group_id: str,
        member_id: str,
        instance_id: str | None,
        generation_or_epoch: int,
        partitions: Sequence[PartitionCommit],
        *,
        retention_ms: int = -1,
        api_version: int,
    ) -> list[tuple[PartitionCommit, ErrorCode]]:
        """OffsetCommit (Kafka's OffsetMetadataManager.commitOffset): the group validates
        the member; an id naming no group takes the commit as a simple group's when the
        generation is -1, else GROUP_ID_NOT_FOUND (v9+) or ILLEGAL_GENERATION (before).
        The offsets are durable when this returns; a failed write is NOT_COORDINATOR."""

        def op() -> tuple[list[OffsetRecord], list[tuple[PartitionCommit, ErrorCode]]]:
            group = self._offset_group(group_id)
            if group is None:
                if generation_or_epoch >= 0:
                    if api_version >= 9:
                        raise KafkaError(
                            ErrorCode.group_id_not_found, f"Group {group_id} not found."
                        )
                    raise KafkaError(
                        ErrorCode.illegal_generation,
                        f"Group {group_id} has no generation {generation_or_epoch}.",
                    )
                group = SimpleGroup(group_id)
            group.validate_offset_commit(
                member_id,
                instance_id,
                generation_or_epoch,
                transactional=False,
                api_version=api_version,
            )
            return self.offsets.commit(group_id, partitions, self.clock.now_ms(), retention_ms)

        self._check_coordinator()
        outcomes: list[tuple[PartitionCommit, ErrorCode]] = await self._run_admin(group_id, op)
        return outcomes

    async def commit_transactional_offsets(
        self,
        group_id: str,
        member_id: str,
        instance_id: str | None,
        generation: int,
        producer_id: int,
        producer_epoch: int,
        partitions: Sequence[PartitionCommit],
        *,
        api_version: int,
    ) -> list[tuple[PartitionCommit, ErrorCode]]:
        """TxnOffsetCommit (Kafka's commitTransactionalOffset), the producer verified by
        the caller: pending offsets, committed by the transaction's marker. An id naming
        no group takes them as a simple group's with generation -1, else
        ILLEGAL_GENERATION; a stale member epoch is ILLEGAL_GENERATION too."""

        def op() -> tuple[list[OffsetRecord], list[tuple[PartitionCommit, ErrorCode]]]:
            group = self._offset_group(group_id)
            if group is None:
                if generation >= 0:
                    raise KafkaError(
                        ErrorCode.illegal_generation,
                        f"Group {group_id} has no generation {generation}.",
                    )
                group = SimpleGroup(group_id)
            try:
                group.validate_offset_commit(
                    member_id, instance_id, generation, transactional=True, api_version=api_version
                )
            except KafkaError as exc:
                if exc.code != ErrorCode.stale_member_epoch:
                    raise
                raise KafkaError(ErrorCode.illegal_generation, exc.message) from exc
            return self.offsets.commit_transactional(
                group_id, producer_id, producer_epoch, partitions, self.clock.now_ms()
            )

        self._check_coordinator()
        outcomes: list[tuple[PartitionCommit, ErrorCode]] = await self._run_admin(group_id, op)
        return outcomes

    async def complete_transaction(
        self, producer_id: int, commit: bool, offsets_partitions: frozenset[int]
    ) -> None:
        """The marker of the producer's transaction for these `__consumer_offsets`
        partitions: each group of them with pending offsets of the producer gets them
        committed (or dropped); returns once that is durable. A failed write raises, so
        the transaction coordinator retries the marker, as Kafka's does."""
        for group_id in self.offsets.pending_groups(producer_id):
            if offsets_partition(group_id) not in offsets_partitions:
                continue

            def op(group_id: str = group_id) -> tuple[list[OffsetRecord], None]:
                return self.offsets.complete(group_id, producer_id, commit), None

            await self.runtime.run(group_id, op)
            log.info(
                "transactional_offsets_completed",
                group=group_id,
                producer_id=producer_id,
                commit=commit,
            )

    def fetch_offsets(
        self,
        group_id: str,
        topics: Sequence[tuple[str, Sequence[int], uuid.UUID | None]] | None,
        *,
        member_id: str | None = None,
        member_epoch: int | None = None,
        require_stable: bool = False,
    ) -> list[tuple[str, uuid.UUID | None, list[FetchedOffset]]]:
        """OffsetFetch for one group, from committed state (Kafka's fetchOffsets /
        fetchAllOffsets): a group that does not exist, or a share group, has none (every
        named partition answers -1, no error); a consumer group checks the member."""
        self._check_coordinator()
        found = self.group_type(group_id)
        group = (
            None
            if found in (None, GroupType.SHARE)
            else self.classic_groups.get(group_id) or self.consumer_groups.get(group_id)
        )
        if group is None:
            if topics is None:
                return []
            return [(t, tid, [FetchedOffset(p) for p in parts]) for t, parts, tid in topics]
        group.validate_offset_fetch(member_id, member_epoch)
        return self.offsets.fetch(group_id, topics, require_stable=require_stable)

    async def delete_committed_offsets(
        self, group_id: str, topics: Sequence[tuple[str, Sequence[int]]]
    ) -> list[tuple[str, list[tuple[int, ErrorCode]]]]:
        """OffsetDelete (Kafka's deleteOffsets): GROUP_ID_NOT_FOUND for no group (or a
        share group), the group's own refusal (NON_EMPTY_GROUP), then per topic
        GROUP_SUBSCRIBED_TO_TOPIC or the partitions' offsets deleted."""

        def op() -> tuple[list[OffsetRecord], list[tuple[str, list[tuple[int, ErrorCode]]]]]:
            group = self._offset_group(group_id)
            if group is None:
                raise KafkaError(ErrorCode.group_id_not_found, f"Group {group_id} not found.")
            group.validate_offset_delete()
            return self.offsets.delete(group_id, topics, group)

        self._check_coordinator()
        answers: list[tuple[str, list[tuple[int, ErrorCode]]]] = await self._run_admin(group_id, op)
        return answers

    async def _delete_offset_group(self, group_id: str) -> None:
        """DeleteGroups of a classic or consumer group: its offsets and its records go in
        one write (Kafka's deleteGroups: deleteAllOffsets, createGroupTombstoneRecords)."""

        def op() -> tuple[list[Any], None]:
            group = self._offset_group(group_id)
            if group is None:
                raise KafkaError(ErrorCode.group_id_not_found, f"Group {group_id} not found.")
            group.validate_delete_group()
            records: list[Any] = [*self.offsets.delete_all(group_id), *group.tombstones()]
            return records, None

        await self._run_admin(group_id, op)
        if isinstance(self.classic_groups.get(group_id), SimpleGroup):
            del self.classic_groups[group_id]  # its offsets were all it was
        log.info("group_deleted", group=group_id, type="classic")

    def _schedule_retention(self) -> None:
        if self._stopped or self.runtime.fenced is not None:
            return
        self._retention_timer = self.clock.call_at(
            self.clock.now_ms() + self.offsets_retention_check_interval_ms,
            lambda: self._track(self._retention_sweep()),
        )

    async def _retention_sweep(self) -> None:
        try:
            await self.expire_offsets(self.clock.now_ms())
        except Exception:
            log.exception("offset_expiry_failed")
        finally:
            self._schedule_retention()

    async def expire_offsets(self, at_ms: int) -> int:
        """offsets.retention.minutes: delete the offsets whose time is up, group by group
        (Kafka's cleanupGroupMetadata); an Empty classic or consumer group whose offsets
        are all gone goes too (maybeDeleteGroup), a simple group with its last offset.
        Returns how many offsets were deleted."""
        deleted = 0
        group_ids = self.offsets.group_ids() | set(self.classic_groups) | set(self.consumer_groups)
        for group_id in sorted(group_ids):

            def op(group_id: str = group_id) -> tuple[list[Any], int]:
                group = self._offset_group(group_id)
                if group is None:
                    return [], 0
                records: list[Any]
                records, all_gone = self.offsets.expire(group_id, group, at_ms)
                expired = len(records)
                if all_gone and group.is_empty:
                    records = [*records, *group.tombstones()]
                return records, expired

            try:
                deleted += await self.runtime.run(group_id, op)
            except KafkaError as exc:
                log.warning("offset_expiry_not_written", group=group_id, error=exc.message)
        if deleted:
            log.info("offsets_expired", offsets=deleted)
        return deleted

    async def _delete_offsets_of_deleted_topics(self) -> None:
        """Offsets of topics that are gone (Kafka's onPartitionsDeleted)."""
        names = {t.name for t in self.topics().values()}
        gone_by_group: dict[str, list[OffsetRecord]] = {}
        for record in self.offsets.on_topics_deleted(
            {t for committed in self.offsets.committed.values() for t, _ in committed} - names
        ):
            gone_by_group.setdefault(record.group_id, []).append(record)
        for group_id, records in gone_by_group.items():

            def op(records: list[OffsetRecord] = records) -> tuple[list[OffsetRecord], None]:
                return records, None

            try:
                await self.runtime.run(group_id, op)
            except KafkaError as exc:
                log.warning("offset_cleanup_not_written", group=group_id, error=exc.message)

    # -- timers and topic changes -------------------------------------------------

    def _schedule_expiry(self) -> None:
        if self._stopped or self.runtime.fenced is not None:
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
        """Topics were created, deleted or grew: recompute assignments, drop dead state
        and the offsets of deleted topics."""
        await self._delete_offsets_of_deleted_topics()
        await self.consumer.on_topics_changed()
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
            if deleted:
                # An initialization of a deleted topic already calling the share coordinator
                # lands first (bounded), so the deletion removes what it made.
                running = [task for task in self._initializing if not task.done()]
                if running:
                    await self._wait_bounded(running, INITIALIZE_WAIT_MS)
            await self._delete_state(group_id, deleted)
            self._start_initializing(group_id, pending)

    # -- describe / list / configs ------------------------------------------------

    def describe(self, group_id: str) -> ShareGroupDescription:
        self._check_coordinator()
        self._refuse_other_type(group_id)
        group = self.groups.get(group_id)
        if group is None or group.deleted:
            raise KafkaError(ErrorCode.group_id_not_found, f"Group {group_id} not found.")
        return group.describe()

    def share_group_topics(self, group_id: str) -> tuple[frozenset[str], frozenset[uuid.UUID]]:
        """The topics share group `group_id` consumes, as this coordinator knows them:
        its members' subscribed topic names, and the ids of the topics it has share
        state on (initialized or being initialized). Empty for no such group here."""
        group = self.groups.get(group_id)
        if group is None or group.deleted:
            return frozenset(), frozenset()
        return group.subscribed_topic_names(), frozenset({*group.initialized, *group.initializing})

    def list_groups(self) -> list[GroupListing]:
        """Every group of every type, by id (ListGroups)."""
        listed = [
            GroupListing(g.group_id, g.state.value) for g in self.groups.values() if not g.deleted
        ]
        listed.extend(
            GroupListing(g.group_id, g.state_name, GroupType.CLASSIC.value, g.protocol_type)
            for g in self.classic_groups.values()
        )
        listed.extend(
            GroupListing(group_id, state, GroupType.CONSUMER.value, "consumer")
            for group_id, state in self.consumer.list_groups()
        )
        return sorted(listed, key=lambda g: g.group_id)

    async def alter_configs(
        self, group_id: str, ops: list[AlterConfigOp], validate_only: bool
    ) -> None:
        """IncrementalAlterConfigs of a GROUP in the groups log, for a coordinator that
        keeps its own configs (no cluster metadata: unit tests, tools); a failed write
        is KAFKA_STORAGE_ERROR. validate_only checks in the group's turn too, against
        the configs every earlier change left, and writes nothing. The broker alters
        them in the cluster metadata instead (`MetadataStore.alter_group_configs`)."""
        if self.configs_in_metadata:
            raise AssertionError("group configs are altered in the cluster metadata")

        def op() -> tuple[list[GroupConfigRecord], list[GroupConfigRecord]]:
            records = self.configs.incremental_alter(group_id, ops)
            return ([] if validate_only else records), records

        records = await self.runtime.run(group_id, op)
        if validate_only:
            return
        log.info("group_config_altered", group=group_id, configs={r.name: r.value for r in records})

    # -- admin RPCs: describe, reset and delete share-group offsets; delete groups ----

    def _topic_by_name(self) -> dict[str, TopicMetadata]:
        return {t.name: t for t in self.topics().values()}

    async def _summary_offsets(
        self, key: ShareStateKey, topic: TopicMetadata, end_offset: EndOffset
    ) -> PartitionOffsets:
        """Kafka's computeShareGroupLagAndBuildResponse for one partition: no state (or
        an unknown partition) is start -1, leader epoch 0, lag -1, never an error; lag
        is end offset - start offset - delivery complete count once both are known."""
        if not 0 <= key.partition < topic.num_partitions:
            return PartitionOffsets(key.partition)
        try:
            summary = await self.persister.read_summary(key)
        except KafkaError:
            return PartitionOffsets(key.partition)
        lag = UNKNOWN_LAG
        if (
            summary.start_offset != UNINITIALIZED_START_OFFSET
            and summary.delivery_complete_count != UNKNOWN_DELIVERY_COMPLETE_COUNT
        ):
            end = end_offset(key.topic_id, key.partition)
            if end is not None:
                lag = end - summary.start_offset - summary.delivery_complete_count
        return PartitionOffsets(key.partition, summary.start_offset, summary.leader_epoch, lag)

    async def describe_offsets(
        self,
        group_id: str,
        topics: Sequence[tuple[str, Sequence[int]]] | None,
        end_offset: EndOffset,
    ) -> list[TopicResult]:
        """DescribeShareGroupOffsets for one group, from the share coordinator's summary
        (so partitions no leader has loaded answer too). `topics` None: every topic the
        group has initialized share state for (Kafka's describeShareGroupAllOffsets); a
        group that does not exist then has none. Named topics are read whatever the
        group: an unknown topic answers topic id zero and start offset -1 per partition."""
        self._check_coordinator()
        result: list[TopicResult] = []
        if topics is None:
            group = self.groups.get(group_id)
            metadata = self.topics()
            initialized = {} if group is None else group.initialized
            wanted = [
                (metadata[t], sorted(parts)) for t, parts in initialized.items() if t in metadata
            ]
            wanted.sort(key=lambda item: item[0].name)
        else:
            by_name = self._topic_by_name()
            wanted = []
            for name, partitions in topics:
                topic = by_name.get(name)
                if topic is None:
                    result.append(
                        TopicResult(name, None, tuple(PartitionOffsets(p) for p in partitions))
                    )
                else:
                    wanted.append((topic, list(partitions)))
        described = [
            TopicResult(
                topic.name,
                topic.topic_id,
                tuple(
                    [
                        await self._summary_offsets(
                            ShareStateKey(group_id, topic.topic_id, p), topic, end_offset
                        )
                        for p in partitions
                    ]
                ),
            )
            for topic, partitions in wanted
        ]
        # Kafka lists the topics it read first, then those not in the metadata.
        return described + result

    async def alter_offsets(
        self, group_id: str, topics: Sequence[tuple[str, Sequence[tuple[int, int]]]]
    ) -> list[TopicResult]:
        """AlterShareGroupOffsets: reset the share-partition start offsets of an Empty
        group (KIP-932). Whole-request failures raise KafkaError (NON_EMPTY_GROUP,
        INVALID_REQUEST, NOT_COORDINATOR for a failed group write, KAFKA_STORAGE_ERROR for
        a failed share-state write); per-partition problems are in the result.

        As Kafka (GroupMetadataManager.alterShareGroupOffsets, then persisterInitialize):
        a group that does not exist is created Empty; the partitions are marked
        `initializing` durably first, then each is re-initialized in the share
        coordinator at its new start offset with a state epoch above the stored one (so
        delivery counts start over, and a leader still holding the old state is fenced
        and reloads), then marked `initialized`. A crash between the steps leaves them
        `initializing`; the restart finishes them (`_finish_pending`).
        """
        _refuse_duplicates(
            [name for name, _ in topics],
            "topic",
            [(name, p) for name, parts in topics for p, _ in parts],
        )
        by_name = self._topic_by_name()
        results: dict[str, list[PartitionResult]] = {}
        valid: dict[uuid.UUID, dict[int, int]] = {}
        for name, partitions in topics:
            topic = by_name.get(name)
            entries = results.setdefault(name, [])
            for partition, offset in partitions:
                if topic is None or not 0 <= partition < topic.num_partitions:
                    entries.append(
                        PartitionResult(
                            partition, ErrorCode.unknown_topic_or_partition, UNKNOWN_TOPIC_MESSAGE
                        )
                    )
                elif offset < 0:
                    entries.append(
                        PartitionResult(
                            partition,
                            ErrorCode.invalid_request,
                            f"Start offset {offset} for partition {partition} of topic {name} "
                            "is negative; give an offset of the log (0 or more).",
                        )
                    )
                else:
                    valid.setdefault(topic.topic_id, {})[partition] = offset
                    entries.append(PartitionResult(partition))

        def begin() -> tuple[list[ShareGroupRecord], None]:
            self._refuse_other_type(group_id)
            group = self.groups.get(group_id) or ShareGroup(group_id)
            group.require_empty()
            return group.mark_altering(valid, self.clock.now_ms()), None

        await self._run_admin(group_id, begin)
        done: dict[uuid.UUID, set[int]] = {}
        try:
            for topic_id, offsets in valid.items():
                for partition, offset in sorted(offsets.items()):
                    key = ShareStateKey(group_id, topic_id, partition)
                    await self.persister.reset_state(key, offset)
                    done.setdefault(topic_id, set()).add(partition)
        except KafkaError as exc:
            log.error("share_offsets_reset_failed", group=group_id, error=exc.message)
            raise KafkaError(
                ErrorCode.kafka_storage_error,
                f"Resetting the share state of group {group_id} failed ({exc.code.name}: "
                f"{exc.message}); partitions reset so far keep their new offsets. Retry.",
            ) from exc
        finally:
            for topic_id in done:
                self._state_replaced(group_id, topic_id)
        await self._run_admin(group_id, lambda: (self._records_of(group_id, done), None))
        log.info(
            "share_offsets_reset",
            group=group_id,
            partitions={str(t): sorted(o.items()) for t, o in valid.items()},
        )
        return [
            TopicResult(name, by_name[name].topic_id if name in by_name else None, tuple(parts))
            for name, parts in results.items()
        ]

    def _records_of(
        self, group_id: str, initialized: Mapping[uuid.UUID, Iterable[int]]
    ) -> list[ShareGroupRecord]:
        group = self.groups.get(group_id)
        return [] if group is None else group.mark_initialized(initialized)

    async def delete_offsets(self, group_id: str, topic_names: Sequence[str]) -> list[TopicResult]:
        """DeleteShareGroupOffsets of an Empty group: per topic, its share state is
        deleted (DeleteShareGroupState for every partition) and the group forgets it.

        Kafka's order: the topics move from `initialized` to `deleting` durably, the
        state is deleted, then `deleting` is cleared for the topics that succeeded; a
        crash in between leaves them `deleting`, and the restart (or a retry) finishes.
        An unknown group is GROUP_ID_NOT_FOUND, a group with members NON_EMPTY_GROUP;
        an unknown topic, or one with no share state, is UNKNOWN_TOPIC_OR_PARTITION.
        """
        _refuse_duplicates(list(topic_names), "topic", [])
        by_name = self._topic_by_name()
        errors: list[TopicResult] = []
        ids: list[uuid.UUID] = []
        for name in topic_names:
            topic = by_name.get(name)
            if topic is None:
                errors.append(
                    TopicResult(
                        name,
                        None,
                        error=ErrorCode.unknown_topic_or_partition,
                        message=UNKNOWN_TOPIC_MESSAGE,
                    )
                )
            else:
                ids.append(topic.topic_id)

        def begin() -> tuple[list[ShareGroupRecord], Partitions]:
            group = self._existing(group_id)
            group.require_empty()
            return group.mark_deleting_topics(ids, self.topics())

        to_delete = await self._run_admin(group_id, begin)
        for topic_id in ids:
            if topic_id not in to_delete:
                name = self.topics()[topic_id].name
                errors.append(
                    TopicResult(
                        name,
                        topic_id,
                        error=ErrorCode.unknown_topic_or_partition,
                        message="There is no offset information to delete.",
                    )
                )
        failed = await self._delete_state(group_id, to_delete)
        succeeded = frozenset(to_delete) - failed

        def finish() -> tuple[list[ShareGroupRecord], None]:
            group = self.groups.get(group_id)
            return ([] if group is None else group.mark_deleted_topics(succeeded)), None

        await self._run_admin(group_id, finish)
        metadata = self.topics()
        done = [
            TopicResult(metadata[t].name if t in metadata else "", t)
            for t in sorted(succeeded, key=lambda t: metadata[t].name if t in metadata else "")
        ]
        for topic_id in sorted(failed):
            errors.append(
                TopicResult(
                    metadata[topic_id].name if topic_id in metadata else "",
                    topic_id,
                    error=ErrorCode.kafka_storage_error,
                    message="Deleting the topic's share state failed; it stays marked for "
                    "deletion and is finished on retry or restart.",
                )
            )
        log.info("share_offsets_deleted", group=group_id, topics=[r.name for r in done])
        return done + errors

    async def delete_groups(self, group_ids: Sequence[str]) -> list[tuple[str, KafkaError | None]]:
        """DeleteGroups for share groups, each on its own: GROUP_ID_NOT_FOUND if it does
        not exist, NON_EMPTY_GROUP if it has members. Its share state is deleted for
        every partition it had (its topics marked `deleting` first, durably), then the
        group is tombstoned; its group configs stay, as in Kafka 4.2. A failure before the
        tombstone leaves an Empty group whose state deletion the restart or a retry
        finishes."""
        results: list[tuple[str, KafkaError | None]] = []
        for group_id in dict.fromkeys(group_ids):  # Kafka de-duplicates
            try:
                if self.group_type(group_id) in (GroupType.CLASSIC, GroupType.CONSUMER):
                    await self._delete_offset_group(group_id)
                else:
                    await self._delete_group(group_id)
                results.append((group_id, None))
            except KafkaError as exc:
                results.append((group_id, exc))
        return results

    async def _delete_group(self, group_id: str) -> None:
        def begin() -> tuple[list[ShareGroupRecord], Partitions]:
            group = self._existing(group_id)
            group.require_empty()
            return group.mark_deleting_all(self.topics())

        to_delete = await self._run_admin(group_id, begin)
        # An initialization already calling the share coordinator lands first (bounded
        # wait), so the deletion after it removes what it made; those not yet started see
        # the topics `deleting` and skip them (`_initialize`).
        pending = [task for task in self._initializing if not task.done()]
        if pending:
            await self._wait_bounded(pending, INITIALIZE_WAIT_MS)
            # A member that joined meanwhile took its topics back out of `deleting`: their
            # state is the group's again (and the group answers NON_EMPTY_GROUP below).
            group = self.groups.get(group_id)
            still = frozenset() if group is None else group.deleting
            to_delete = {t: p for t, p in to_delete.items() if t in still}
        failed = await self._delete_state(group_id, to_delete)
        if failed:
            raise KafkaError(
                ErrorCode.kafka_storage_error,
                f"Deleting the share state of group {group_id} failed for "
                f"{len(failed)} topic(s); the group stays until a retry succeeds.",
            )

        def finish() -> tuple[list[GroupRecord], None]:
            group = self._existing(group_id)
            group.require_empty()  # a member may have joined meanwhile (Kafka re-checks)
            # The group's configs stay, as in Kafka (its DeleteGroups leaves them).
            records: list[GroupRecord] = list(group.delete())
            return records, None

        try:
            await self._run_admin(group_id, finish)
        except KafkaError as exc:
            if exc.code == ErrorCode.non_empty_group and to_delete:
                # A member joined while the state was being deleted, and may count topics
                # initialized whose state is now gone: forget them, so that they are
                # initialized again (the next heartbeat, or a ShareFetch's load).
                try:
                    await self._mark(group_id, lambda g: g.mark_uninitialized(to_delete))
                except KafkaError as mark_exc:
                    log.warning(
                        "share_state_bookkeeping_failed", group=group_id, error=mark_exc.message
                    )
            raise
        log.info("group_deleted", group=group_id, topics=len(to_delete))

    def _existing(self, group_id: str) -> ShareGroup:
        self._refuse_other_type(group_id)
        group = self.groups.get(group_id)
        if group is None or group.deleted:
            raise KafkaError(ErrorCode.group_id_not_found, f"Group {group_id} not found.")
        return group

    async def _run_admin(self, group_id: str, op: Callable[[], tuple[list[Any], Any]]) -> Any:
        """A group-metadata write of an admin RPC; a failed write is NOT_COORDINATOR (the
        client looks the coordinator up again and retries), as Kafka's coordinators."""
        try:
            return await self.runtime.run(group_id, op)
        except KafkaError as exc:
            raise for_coordinator_rpc(exc) from exc

    async def _delete_state(
        self, group_id: str, partitions: Mapping[uuid.UUID, Iterable[int]]
    ) -> frozenset[uuid.UUID]:
        """DeleteShareGroupState for each partition; returns the topics that failed. The
        share-partition leader forgets the group's partitions of each topic either way."""
        failed: set[uuid.UUID] = set()
        for topic_id, parts in partitions.items():
            for partition in sorted(parts):
                key = ShareStateKey(group_id, topic_id, partition)
                try:
                    await self.persister.delete_state(key)
                except KafkaError as exc:
                    _state_call_failed("share_state_delete_failed", key, exc)
                    failed.add(topic_id)
            self._state_replaced(group_id, topic_id)
        return frozenset(failed)

    def _state_replaced(self, group_id: str, topic_id: uuid.UUID) -> None:
        for hook in self.state_deleted_hooks:
            hook(group_id, topic_id)


def _state_call_failed(event: str, key: ShareStateKey, exc: KafkaError) -> None:
    log.warning(
        event,
        group=key.group_id,
        topic_id=str(key.topic_id),
        partition=key.partition,
        error=exc.message,
    )


def _marks_deleted(
    topic_ids: frozenset[uuid.UUID],
) -> Callable[[ShareGroup], list[ShareGroupRecord]]:
    return lambda group: group.mark_deleted_topics(topic_ids)


def _refuse_duplicates(
    names: Sequence[str], what: str, partitions: Sequence[tuple[str, int]]
) -> None:
    """A topic (or a topic's partition) named twice is a malformed request: which of the
    two would win is not defined, so the whole request is INVALID_REQUEST."""
    for items, label in ((names, what), (partitions, "partition")):
        seen: set[Any] = set()
        for item in items:
            if item in seen:
                raise KafkaError(
                    ErrorCode.invalid_request,
                    f"The request names {label} {item} more than once; name each once.",
                )
            seen.add(item)
