"""The delayed share fetch: a ShareFetch's acquisition rounds and its long poll.

As Kafka's DelayedShareFetch: a round tries every partition of the member's share
session (try-acquiring each partition's lock, starting at a different partition each
time so MaxRecords starves none); when nothing was acquired and nothing failed, the
fetch parks until a produce, a release, a lock expiry or a busy partition being let go
wakes it on one of its partitions, or until MaxWaitMs has passed. It is always answered
by then: no round waits on another request (`broker.share.locks`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from broker import trace
from broker.partitions import Partition, Subscribable, Wakeup
from broker.share.manager import AckBatches, AckOutcome, SharePartitionManager
from broker.share.partition import AcquiredRange, ShareAcquireMode
from broker.share.reader import FetchedPartition
from broker.share.session import ShareSession, ShareSessionCache, TopicIdPartition
from coordinator.share_state import ShareStateKey
from persister.clock import Clock
from protocol.errors import ErrorCode


class FetchHost(Protocol):
    """What a delayed share fetch uses of the service running it (`ShareFetchService`)."""

    manager: SharePartitionManager
    sessions: ShareSessionCache
    clock: Clock
    # Round-robin start for share fetches, so MaxRecords starves no partition.
    rotation: int

    def topic_known(self, topic_id: uuid.UUID) -> bool: ...
    def log_partition(self, topic_id: uuid.UUID, partition: int) -> Partition | None: ...


def not_leader(topic_id: uuid.UUID, partition: int) -> tuple[ErrorCode, str]:
    """A partition this broker does not lead: its share partition lives on the leader."""
    return (
        ErrorCode.not_leader_or_follower,
        f"This broker is not the leader of partition {partition} of topic id {topic_id}",
    )


@dataclass(slots=True)
class FetchEntry:
    """One partition of a ShareFetch's answer."""

    error_code: ErrorCode = ErrorCode.none
    error_message: str | None = None
    acknowledge_error_code: ErrorCode = ErrorCode.none
    acknowledge_error_message: str | None = None
    records: bytes = b""
    acquired: list[AcquiredRange] = field(default_factory=list)


class DelayedShareFetch:
    def __init__(
        self,
        service: FetchHost,
        session: ShareSession,
        member_id: str,
        *,
        max_records: int,
        batch_size: int,
        max_bytes: int,
        mode: ShareAcquireMode,
        entries: dict[TopicIdPartition, FetchEntry],
        readable: Callable[[uuid.UUID], bool] = lambda _: True,
        leads: Callable[[uuid.UUID, int], bool] = lambda _t, _p: True,
    ) -> None:
        self.service = service
        self.session = session
        self.member_id = member_id
        self.max_records = max_records
        self.batch_size = batch_size
        self.max_bytes = max_bytes
        self.mode = mode
        self.entries = entries
        # A partition of a topic the requester may not READ is answered
        # TOPIC_AUTHORIZATION_FAILED, and the fetch waits for the others.
        self.readable = readable
        # A partition this broker does not lead is answered NOT_LEADER_OR_FOLLOWER
        # (looked at each round: leadership may move while the fetch waits).
        self.leads = leads

    async def run(
        self,
        deadline_ms: int,
        acks: Mapping[ShareStateKey, AckBatches],
        ack_results: dict[TopicIdPartition, AckOutcome],
        on_first_round: Callable[[], None],
    ) -> None:
        """Rounds until one acquires or fails something, or `deadline_ms` (the request's
        MaxWaitMs) has passed on the clock. The first round applies `acks` too (their
        outcomes go to `ack_results`), then `on_first_round` runs."""
        clock = self.service.clock
        partitions = self.session.partitions
        # Listening from before the first look: a produce, release or lock expiry during a
        # round (which may wait for its write) wakes the wait after it.
        with Wakeup(self._work_sources(partitions)) as wakeup:
            got_any = await self._round(partitions, acks, ack_results)
            on_first_round()
            while not got_any and partitions:
                remaining_ms = deadline_ms - clock.now_ms()
                if remaining_ms <= 0:
                    break
                await wakeup.wait(remaining_ms / 1000, clock=clock)
                if trace.ENABLED:
                    trace.event("share_fetch_woken")
                session = self.service.sessions.get(self.session.group_id, self.member_id)
                if session is not self.session:
                    # The session was closed (epoch -1, disconnect) or replaced while this
                    # fetch waited: records acquired now could only sit locked until expiry.
                    break
                got_any = await self._round(partitions)

    async def _round(
        self,
        partitions: list[TopicIdPartition],
        acks: Mapping[ShareStateKey, AckBatches] | None = None,
        ack_results: dict[TopicIdPartition, AckOutcome] | None = None,
    ) -> bool:
        """One pass over the session's partitions, applying `acks` first (their outcomes
        go to `ack_results`); True if anything was acquired or failed."""
        service = self.service
        group_id = self.session.group_id
        got_any = False
        # Start at a different partition each time so none is starved by MaxRecords.
        start = service.rotation % max(len(partitions), 1)
        service.rotation += 1
        keys = []
        denied = False
        for tid, p in partitions[start:] + partitions[:start]:
            if not service.topic_known(tid):
                entry = self.entries.setdefault((tid, p), FetchEntry())
                entry.error_code = ErrorCode.unknown_topic_id
                entry.error_message = f"Topic id {tid} does not exist"
                got_any = True
                continue
            if not self.readable(tid):
                entry = self.entries.setdefault((tid, p), FetchEntry())
                entry.error_code = ErrorCode.topic_authorization_failed
                entry.error_message = "Topic authorization failed."
                denied = True
                continue
            if not self.leads(tid, p):
                entry = self.entries.setdefault((tid, p), FetchEntry())
                entry.error_code, entry.error_message = not_leader(tid, p)
                denied = True
                continue
            keys.append(ShareStateKey(group_id, tid, p))
        # Nothing readable and led here to wait for: answer now (Kafka answers at once when no
        # partition is left to fetch).
        got_any |= denied and not keys
        # Every partition's acknowledgements and acquisitions: one share-state write.
        acked, fetched_all = await service.manager.acknowledge_and_acquire(
            acks or {},
            keys,
            self.member_id,
            max_records=self.max_records,
            batch_size=self.batch_size,
            max_bytes=self.max_bytes,
            mode=self.mode,
        )
        if ack_results is not None:
            for key, outcome in acked.items():
                ack_results[(key.topic_id, key.partition)] = outcome
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
            got_any |= self._answer(key, fetched)
        return got_any

    def _answer(self, key: ShareStateKey, fetched: FetchedPartition) -> bool:
        """Put what a partition got into the answer; True if anything (or an error)."""
        tp = (key.topic_id, key.partition)
        if fetched.error_code != ErrorCode.none:
            entry = self.entries.setdefault(tp, FetchEntry())
            entry.error_code = fetched.error_code
            entry.error_message = fetched.error_message
            return True
        if not fetched.acquired:
            return False
        entry = self.entries.setdefault(tp, FetchEntry())
        entry.records = fetched.records
        entry.acquired = list(fetched.acquired)
        return True

    def _work_sources(self, partitions: list[TopicIdPartition]) -> list[Subscribable]:
        """What wakes a parked ShareFetch: a produce, a release, a lock expiry or a busy
        partition let go, on one of its partitions."""
        service = self.service
        group_id = self.session.group_id
        sources: list[Subscribable] = [
            service.manager.listeners(ShareStateKey(group_id, tid, p)) for tid, p in partitions
        ]
        logs = [service.log_partition(tid, p) for tid, p in partitions]
        # A produce wakes it on append (read_uncommitted acquires before the fsync ends) and
        # again when the high watermark or LSO moves (read_committed waits for those).
        sources += [lp for lp in logs if lp is not None]
        sources += [lp.appends for lp in logs if lp is not None]
        return sources
