"""Producer-state snapshots (`<offset>.snapshot`, Kafka's ProducerStateManager snapshots):
the encoding round-trips, a torn or damaged one is refused and leaves the state alone,
and a partition opened from its newest snapshot plus the batches after it has exactly
the producer state, open transactions and aborted ranges a full scan of the log gives,
after kill -9 and after a clean close, falling back to an older snapshot or a full scan."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import structlog.testing

from broker.partitions import Partition
from persister.checkpoint import producer_snapshot_offsets, producer_snapshot_path
from persister.file_log import LogConfig, PartitionLog
from persister.producer_state import ProducerStateManager
from tests.unit import test_transactions_log
from tests.unit.test_producer_state import batch
from tests.unit.test_transactions_log import Harness, end_txn, produce

h = test_transactions_log.h


def view(producers: ProducerStateManager) -> dict[str, Any]:
    return {
        "producers": {
            e.producer_id: (
                e.producer_epoch,
                list(e.batches),
                e.last_timestamp,
                e.current_txn_first_offset,
                e.coordinator_epoch,
            )
            for e in producers
        },
        "open": producers.open_transactions(),
        "first_unstable": producers.first_unstable_offset(),
    }


def full_scan(directory: Path, tmp_path: Path) -> tuple[dict[str, Any], list[Any]]:
    """The producer view and aborted ranges of a copy of `directory` without snapshots."""
    copy = tmp_path / "full-scan"
    shutil.copytree(directory, copy)
    for offset in producer_snapshot_offsets(copy):
        producer_snapshot_path(copy, offset).unlink()
    plog = PartitionLog.open(copy, LogConfig(), 0)
    producers = ProducerStateManager()
    plog.load_producer_state(producers)
    try:
        return view(producers), plog.aborted_transactions(0, plog.log_end_offset)
    finally:
        plog.close(clean=False)


async def rolling_traffic(h: Harness) -> Partition:
    """Idempotent and transactional producers over several segments (each produce
    after the clock moved past segment.ms rolls): commits, aborts, epoch bumps, and
    transactions left open across rolls."""
    h.overrides = {"segment.ms": "1000"}
    part = h.reopen(clean=True)

    async def step() -> None:
        h.clock.advance(2000)

    seq = {1: 0, 2: 0, 3: 0}
    for round_ in range(4):
        await step()
        await produce(part, 2, pid=1, seq=seq[1])  # idempotent, no transaction
        seq[1] += 2
        await step()
        await produce(part, 1, pid=2, seq=seq[2], transactional=True)
        seq[2] += 1
        await step()
        await produce(part, 3, pid=3, seq=seq[3], transactional=True)
        seq[3] += 3
        await end_txn(part, 2, commit=round_ % 2 == 0)
        await step()
        await produce(part, 1)  # no producer id
    # Producer 3's transaction stays open across every roll; producer 2 opens another.
    await produce(part, 1, pid=2, seq=seq[2], transactional=True)
    # A new epoch for producer 1 restarts its sequence.
    await produce(part, 1, pid=1, epoch=1, seq=0)
    return part


def test_a_snapshot_round_trips_open_transactions_and_retained_batches() -> None:
    producers = ProducerStateManager()
    for i in range(7):
        producers.update(batch(i, producer_id=1, base_offset=i, timestamp=100 + i), 0)
    producers.update(batch(0, producer_id=2, base_offset=7, transactional=True), 0)
    producers.update(batch(0, producer_id=3, epoch=4, base_offset=8, transactional=True), 0)
    data = producers.snapshot_bytes()
    loaded = ProducerStateManager()
    loaded.load_snapshot(data)
    assert view(loaded) == view(producers)
    assert len(loaded.entry(1).batches) == 5  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "damage",
    [lambda d: d[:-3], lambda d: d[:5], lambda d: d[:10] + bytes([d[10] ^ 1]) + d[11:]],
    ids=["torn", "header-only", "flipped-byte"],
)
def test_a_torn_or_damaged_snapshot_is_refused_and_changes_nothing(damage: Any) -> None:
    source = ProducerStateManager()
    source.update(batch(0, producer_id=1, transactional=True), 1)
    kept = ProducerStateManager()
    kept.update(batch(0, producer_id=9), 1)
    before = view(kept)
    with pytest.raises(ValueError):
        kept.load_snapshot(damage(source.snapshot_bytes()))
    assert view(kept) == before


async def test_kill_9_loads_the_newest_snapshot_and_equals_a_full_scan(
    h: Harness, tmp_path: Path
) -> None:
    part = await rolling_traffic(h)
    assert len(producer_snapshot_offsets(h.partition_dir)) == 2  # the newest two kept
    live = view(part.producers), part.aborted_transactions(0, part.log_end_offset)
    assert live[0]["open"]  # transactions are open at the crash
    assert live[1]  # and some were aborted
    part.log.close(clean=False)

    with structlog.testing.capture_logs() as events:
        part = h.reopen(clean=False)
    loaded = [e for e in events if e["event"] == "producer_snapshot_loaded"]
    assert loaded and loaded[0]["offset"] > 0
    restarted = view(part.producers), part.aborted_transactions(0, part.log_end_offset)
    assert restarted == live == full_scan(h.partition_dir, tmp_path)


async def test_a_torn_newest_snapshot_falls_back_to_the_older_one(
    h: Harness, tmp_path: Path
) -> None:
    part = await rolling_traffic(h)
    live = view(part.producers), part.aborted_transactions(0, part.log_end_offset)
    part.log.close(clean=False)
    older, newest = producer_snapshot_offsets(h.partition_dir)
    path = producer_snapshot_path(h.partition_dir, newest)
    path.write_bytes(path.read_bytes()[:-4])

    with structlog.testing.capture_logs() as events:
        part = h.reopen(clean=False)
    assert [e["event"] for e in events if "producer_snapshot" in e["event"]] == [
        "producer_snapshot_ignored",
        "producer_snapshot_loaded",
    ]
    assert [e["offset"] for e in events if e["event"] == "producer_snapshot_loaded"] == [older]
    restarted = view(part.producers), part.aborted_transactions(0, part.log_end_offset)
    assert restarted == live == full_scan(h.partition_dir, tmp_path)


async def test_a_clean_close_snapshots_at_the_log_end_and_the_open_scans_nothing(
    h: Harness, tmp_path: Path
) -> None:
    part = await rolling_traffic(h)
    live = view(part.producers), part.aborted_transactions(0, part.log_end_offset)
    end = part.log_end_offset
    h.logs.close()
    assert producer_snapshot_offsets(h.partition_dir)[-1] == end
    with structlog.testing.capture_logs() as events:
        part = h.reopen(clean=False)  # the logs are closed already
    assert [e["offset"] for e in events if e["event"] == "producer_snapshot_loaded"] == [end]
    restarted = view(part.producers), part.aborted_transactions(0, part.log_end_offset)
    assert restarted == live == full_scan(h.partition_dir, tmp_path)
    # The reopened transactions end as before the restart.
    await end_txn(part, 3, commit=False)
    assert part.producers.entry(3).current_txn_first_offset is None  # type: ignore[union-attr]


async def test_truncation_removes_the_snapshots_above_the_cut(h: Harness) -> None:
    part = await rolling_traffic(h)
    offsets = producer_snapshot_offsets(h.partition_dir)
    part.log.truncate_to(offsets[0])
    assert producer_snapshot_offsets(h.partition_dir) == [offsets[0]]
