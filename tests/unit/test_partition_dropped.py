"""A partition whose log another broker claimed is dropped by its LogManager
(`LogManager.drop_partition`): the log closed, the local copy discarded where the
storage keeps it as a cache, NOT_LEADER_OR_FOLLOWER from then on (`not_leader`),
never opened again by a later open_topic, forgotten when its topic is deleted."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.config import BrokerConfig
from broker.partitions import LogManager, Partition
from persister.clock import ManualClock
from persister.commit import GroupCommit
from persister.storage import Fenced, FileStorage
from protocol.errors import ErrorCode, KafkaError
from tests.unit.test_partition_flush import append_one, gate, turns

TOPIC_ID = uuid.uuid4()


class CacheStorage(FileStorage):
    """The file engine, but its files only a cache (as PostgreSQL's data dir is)."""

    def __init__(self) -> None:
        self.discarded: list[Path] = []

    def discard_log(self, directory: Path) -> None:
        self.discarded.append(directory)


@pytest.fixture
async def logs(tmp_path: Path) -> AsyncIterator[tuple[LogManager, CacheStorage]]:
    group = GroupCommit(threads=1)
    group.start()
    storage = CacheStorage()
    manager = LogManager(
        tmp_path, BrokerConfig({}), group, ManualClock(now_ms=1_000_000), storage=storage
    )
    manager.open_topic("t", TOPIC_ID, 2, {})
    try:
        yield manager, storage
    finally:
        await manager.flush_all()
        manager.close()
        await group.stop()


async def fence(part: Partition) -> None:
    flush = gate(part)
    flush.error = Fenced("topics/t-0", 1)
    last = append_one(part)
    flush.gate.set()
    with pytest.raises(KafkaError) as refused:
        await part.wait_durable(last, timeout_s=10)
    assert refused.value.code == ErrorCode.not_leader_or_follower


async def test_a_fenced_partition_is_dropped_and_answers_not_leader(
    logs: tuple[LogManager, CacheStorage],
) -> None:
    manager, storage = logs
    dropped: list[tuple[Partition, str]] = []
    manager.on_dropped = lambda part, reason: dropped.append((part, reason))
    part = manager.get("t", 0)
    assert part is not None and manager.not_leader("t", 0) is None
    await fence(part)
    await turns()

    assert manager.get("t", 0) is None
    moved = manager.not_leader("t", 0)
    assert moved is not None and moved.code == ErrorCode.not_leader_or_follower
    assert dropped == [(part, str(part.fenced))]
    assert storage.discarded == [manager.directory / "t-0"]
    assert manager.not_leader("t", 1) is None and manager.get("t", 1) is not None
    with pytest.raises(KafkaError) as read:
        part.read(0, 1 << 20)  # a request still holding it
    assert read.value.code == ErrorCode.not_leader_or_follower

    # Not opened again (that would claim the log back), until the topic is deleted.
    manager.open_topic("t", TOPIC_ID, 3, {})
    assert manager.get("t", 0) is None and manager.get("t", 2) is not None
    manager.remove_topic("t")
    assert manager.not_leader("t", 0) is None


async def test_drop_partition_without_a_fence_stops_serving_and_wakes_waiters(
    logs: tuple[LogManager, CacheStorage],
) -> None:
    manager, _ = logs
    part = manager.get("t", 1)
    assert part is not None
    woken: list[bool] = []
    part.add_listener(lambda: woken.append(True))
    assert manager.drop_partition("t", 1, "leadership moved") is part
    assert woken and manager.get("t", 1) is None
    with pytest.raises(KafkaError) as appended:
        append_one(part)
    assert appended.value.code == ErrorCode.not_leader_or_follower
    moved = manager.not_leader("t", 1)
    assert moved is not None and "leadership moved" in (moved.message or "")
