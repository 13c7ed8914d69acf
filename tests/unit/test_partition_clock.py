"""Topic partitions take their time from the broker's clock: append timestamps and
time-based retention follow a ManualClock, not the wall clock."""

from __future__ import annotations

import uuid
from pathlib import Path

from broker.config import BrokerConfig
from broker.partitions import LogManager, validate_produce_data
from persister.clock import ManualClock
from persister.commit import GroupCommit
from protocol.records import NewRecord, build_batch


async def test_log_append_time_is_the_clocks_time(tmp_path: Path) -> None:
    clock = ManualClock(now_ms=1_000_000)
    commit = GroupCommit()
    commit.start()
    logs = LogManager(tmp_path, BrokerConfig({}), commit, clock)
    try:
        logs.open_topic("t", uuid.uuid4(), 1, {"message.timestamp.type": "LogAppendTime"})
        partition = logs.get("t", 0)
        assert partition is not None
        clock.advance(5_000)
        data, batches = validate_produce_data(build_batch([NewRecord(key=None, value=b"v")]))
        outcome = partition.append(data, batches)
        assert outcome.log_append_time == 1_005_000
        await partition.wait_durable(outcome.last_offset, timeout_s=10)
    finally:
        await logs.flush_all()
        logs.close()
        await commit.stop()


async def test_retention_by_time_follows_the_clock(tmp_path: Path) -> None:
    clock = ManualClock(now_ms=1_000_000)
    commit = GroupCommit()
    commit.start()
    logs = LogManager(tmp_path, BrokerConfig({}), commit, clock)
    try:
        logs.open_topic("t", uuid.uuid4(), 1, {"retention.ms": "60000", "segment.ms": "1000"})
        partition = logs.get("t", 0)
        assert partition is not None
        for _ in range(2):
            batch = build_batch([NewRecord(key=None, value=b"v")], default_timestamp=clock.now_ms())
            data, batches = validate_produce_data(batch)
            await partition.wait_durable(partition.append(data, batches).last_offset, 10)
            clock.advance(2_000)  # past segment.ms: the next append rolls
        assert logs.enforce_retention() == 0
        clock.advance(60_000)
        assert logs.enforce_retention() >= 1
        assert partition.log_start_offset > 0
    finally:
        await logs.flush_all()
        logs.close()
        await commit.stop()
