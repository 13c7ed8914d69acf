"""The share-partition manager with an in-memory share coordinator and a fake log."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass

from broker.share.manager import IDLE_UNLOAD_MS, SharePartitionManager, now_ms
from coordinator.group_config import GroupConfig
from coordinator.share_persister import InMemoryPersister
from coordinator.share_state import ShareStateKey
from protocol.errors import ErrorCode
from protocol.records import NewRecord, build_batch

TOPIC_ID = uuid.uuid4()
KEY = ShareStateKey("g", TOPIC_ID, 0)
ACCEPT = 1


@dataclass
class FakeLog:
    """One batch of ten records at offsets 0-9."""

    topic: str = "t"
    index: int = 0
    log_start_offset: int = 0
    high_watermark: int = 10
    last_stable_offset: int = 10

    def read(self, offset: int, max_bytes: int, *, committed_only: bool = False) -> bytes:
        return build_batch([NewRecord(None, f"v{i}".encode()) for i in range(10)])


class FakeGroups:
    def __init__(self, persister: InMemoryPersister) -> None:
        self.persister = persister

    def config(self, group_id: str) -> GroupConfig:
        return GroupConfig.effective({"share.auto.offset.reset": "earliest"})

    async def ensure_initialized(self, group_id: str, topic_id: uuid.UUID, partition: int) -> None:
        key = ShareStateKey(group_id, topic_id, partition)
        if self.persister.shard.state(key) is None:
            await self.persister.initialize_state(key, 0, -1)


def manager() -> tuple[SharePartitionManager, InMemoryPersister]:
    persister = InMemoryPersister()
    log = FakeLog()
    return (
        SharePartitionManager(
            persister, FakeGroups(persister), lambda t, p: log, lambda part, ts: None
        ),
        persister,
    )


def test_idle_partition_is_unloaded_only_when_nothing_is_acquired_and_reloads_its_state() -> None:
    async def scenario() -> None:
        mgr, persister = manager()
        fetched = await mgr.acquire(KEY, "m", max_records=100, batch_size=100, max_bytes=1 << 20)
        assert [(r.first_offset, r.last_offset) for r in fetched.acquired] == [(0, 9)]
        later = now_ms() + 10 * IDLE_UNLOAD_MS
        assert mgr.unload_idle(later) == 0  # records are held: stays loaded
        assert await mgr.acknowledge(KEY, "m", [(0, 9, (ACCEPT,))]) == (ErrorCode.none, None)
        assert mgr.unload_idle(later) == 1
        assert KEY not in mgr.partitions
        # Reloaded from the share coordinator: the accepted records are not delivered again.
        again = await mgr.acquire(KEY, "m", max_records=100, batch_size=100, max_bytes=1 << 20)
        assert again.acquired == []
        assert mgr.partitions[KEY].spso == 10
        assert persister.shard.state(KEY).start_offset == 10  # type: ignore[union-attr]
        mgr.stop()

    asyncio.run(scenario())


def test_recently_used_partition_is_not_unloaded() -> None:
    async def scenario() -> None:
        mgr, _ = manager()
        fetched = await mgr.acquire(KEY, "m", max_records=100, batch_size=100, max_bytes=1 << 20)
        await mgr.acknowledge(
            KEY, "m", [(r.first_offset, r.last_offset, (ACCEPT,)) for r in fetched.acquired]
        )
        assert mgr.unload_idle(now_ms()) == 0
        assert KEY in mgr.partitions
        mgr.stop()

    asyncio.run(scenario())
