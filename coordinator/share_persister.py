"""The durable share coordinator: `ShareCoordinatorShard` on the share-state log.

Implements `Persister` for the share-partition leader, the group coordinator and the
wire RPCs. Each call asks the shard for records, writes them to `data/share-state/`,
replays them (the same `replay` recovery uses), and returns once they are fsynced, so
an acknowledged write survives kill -9. Closed segments are compacted in a worker
thread; only the swap of a compacted segment runs on the event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

import structlog

from coordinator.share_coordinator import ShareCoordinatorShard
from coordinator.share_state import PersistedBatch, ShareState, ShareStateKey
from persister import share_records
from persister.commit import GroupCommit
from persister.log import LogConfig
from persister.record_log import RecordLog
from persister.share_compaction import (
    plan_share_compaction,
    read_share_records,
    write_cleaned_segment,
)

log = structlog.get_logger("spool.share_coordinator")


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class _ShardPersister:
    """`Persister` over a `ShareCoordinatorShard`; subclasses decide where records go."""

    def __init__(self, snapshot_update_records_per_snapshot: int = 500) -> None:
        self.shard = ShareCoordinatorShard(snapshot_update_records_per_snapshot)

    async def _commit(self, records: Sequence[share_records.ShareRecord]) -> None:
        for record in records:
            self.shard.replay(record)

    async def initialize_state(
        self, key: ShareStateKey, state_epoch: int, start_offset: int
    ) -> None:
        records, _ = self.shard.initialize_state(key, state_epoch, start_offset, _now_ms())
        await self._commit(records)

    async def read_state(self, key: ShareStateKey, leader_epoch: int) -> ShareState:
        records, state = self.shard.read_state(key, leader_epoch, _now_ms())
        await self._commit(records)
        return state

    async def write_state(
        self,
        key: ShareStateKey,
        state_epoch: int,
        leader_epoch: int,
        start_offset: int,
        batches: Sequence[PersistedBatch],
    ) -> None:
        records, _ = self.shard.write_state(
            key, state_epoch, leader_epoch, start_offset, batches, _now_ms()
        )
        await self._commit(records)

    async def delete_state(self, key: ShareStateKey) -> None:
        records, _ = self.shard.delete_state(key)
        await self._commit(records)

    async def read_summary(self, key: ShareStateKey) -> ShareState:
        return self.shard.read_summary(key)


class InMemoryPersister(_ShardPersister):
    """The share coordinator without a log: for unit tests of its callers."""


class DurablePersister(_ShardPersister):
    """The share coordinator on `data/share-state/`: every change fsynced first."""

    def __init__(
        self,
        directory: Path,
        commit: GroupCommit,
        *,
        snapshot_update_records_per_snapshot: int = 500,
        segment_bytes: int = 104857600,
    ) -> None:
        super().__init__(snapshot_update_records_per_snapshot)
        self.records = RecordLog(
            directory,
            commit,
            LogConfig(segment_bytes=segment_bytes, retention_ms=-1, segment_ms=2**62),
        )
        self._compacted_segments: tuple[int, ...] = ()

    def load(self) -> int:
        """Rebuild the shard by replaying the log; returns the records replayed."""
        started = time.monotonic()
        count = 0
        for _, record in read_share_records(self.records.log):
            self.shard.replay(record)
            count += 1
        log.info(
            "share_state_loaded",
            records=count,
            keys=len(tuple(self.shard.keys())),
            seconds=round(time.monotonic() - started, 3),
        )
        return count

    async def _commit(self, records: Sequence[share_records.ShareRecord]) -> None:
        if not records:
            return
        self.records.write([share_records.encode(r) for r in records])
        for record in records:
            self.shard.replay(record)
        await self.records.sync()

    async def compact(self) -> int:
        """Compact closed segments not compacted yet; returns segments rewritten."""
        plog = self.records.log
        closed = tuple(plog.closed_segment_base_offsets)
        if not closed or closed == self._compacted_segments:
            return 0
        # Closed segments never change, so reading them and writing the cleaned copies
        # can leave the loop; appends go to the active segment meanwhile.
        plan = await asyncio.to_thread(plan_share_compaction, plog)
        rewritten = 0
        for base_offset in plan.base_offsets:
            cleaned = await asyncio.to_thread(write_cleaned_segment, plog, base_offset, plan)
            if cleaned is not None:
                plog.replace_closed_segment(base_offset, cleaned, _now_ms())
                rewritten += 1
        self._compacted_segments = closed
        log.info("share_state_compacted", segments=len(closed), rewritten=rewritten)
        return rewritten

    def close(self) -> None:
        self.records.close()
