"""The storage seam (persister.storage): the broker opens its logs through the engine it
is given, and works on whatever log that engine returns."""

from __future__ import annotations

import uuid
from pathlib import Path

from broker.config import BrokerConfig
from broker.partitions import LogManager, validate_produce_data
from persister.clock import SYSTEM_CLOCK, Clock, ManualClock
from persister.commit import GroupCommit
from persister.file_log import LogConfig
from persister.storage import CoordinatorLog, FileStorage, TopicLog
from protocol.records import NewRecord, build_batch


class RecordingStorage(FileStorage):
    """The file engine, noting what it was asked to open and what it returned."""

    def __init__(self) -> None:
        self.topic_logs: dict[str, TopicLog] = {}
        self.coordinator_logs: list[str] = []

    def open_topic_log(self, directory: Path, config: LogConfig, now_ms: int) -> TopicLog:
        opened = super().open_topic_log(directory, config, now_ms)
        self.topic_logs[directory.name] = opened
        return opened

    def open_coordinator_log(
        self,
        directory: Path,
        commit: GroupCommit,
        config: LogConfig | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
    ) -> CoordinatorLog:
        self.coordinator_logs.append(directory.name)
        return super().open_coordinator_log(directory, commit, config, clock=clock)


async def test_log_manager_opens_partition_logs_through_its_engine(tmp_path: Path) -> None:
    storage = RecordingStorage()
    commit = GroupCommit()
    commit.start()
    logs = LogManager(tmp_path, BrokerConfig({}), commit, ManualClock(now_ms=1_000), storage)
    try:
        logs.open_topic("orders", uuid.uuid4(), 2, {})
        assert sorted(storage.topic_logs) == ["orders-0", "orders-1"]
        partition = logs.get("orders", 1)
        assert partition is not None
        assert partition.log is storage.topic_logs["orders-1"]
        data, batches = validate_produce_data(build_batch([NewRecord(key=None, value=b"v")]))
        outcome = partition.append(data, batches)
        await partition.wait_durable(outcome.last_offset, timeout_s=10)
        assert storage.topic_logs["orders-1"].log_end_offset == 1
        assert storage.topic_logs["orders-0"].log_end_offset == 0
    finally:
        await logs.flush_all()
        logs.close()
        await commit.stop()


async def test_coordinator_logs_come_from_the_engine(tmp_path: Path) -> None:
    storage = RecordingStorage()
    commit = GroupCommit()
    commit.start()
    log = storage.open_coordinator_log(tmp_path / "groups", commit)
    try:
        assert storage.coordinator_logs == ["groups"]
        start = log.write([(b"k", b"v"), (b"k2", None)])
        await log.sync()
        assert start == 0
        assert log.end_offset == 2
        assert list(log.replay()) == [(b"k", b"v"), (b"k2", None)]
        assert list(log.replay(1)) == [(b"k2", None)]
    finally:
        log.close()
        await commit.stop()
