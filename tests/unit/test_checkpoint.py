"""Coordinator checkpoints: a restart after kill -9 that loads the share-state checkpoint
and replays only the log after it holds exactly the state a full replay of the same
directory gives (key by key, with update counts and snapshot epochs), also after
compaction dropped a tombstone and after a failed write was truncated; an unusable
checkpoint falls back to a full replay."""

from __future__ import annotations

import asyncio
import errno
import random
import shutil
import struct
import uuid
from pathlib import Path
from typing import Any

import pytest
import structlog.testing

from coordinator.share_persister import DurablePersister
from coordinator.share_state import PersistedBatch, ShareStateKey
from persister.checkpoint import CHECKPOINT_FILE, CheckpointFile, encode_checkpoint
from persister.clock import ManualClock
from persister.commit import GroupCommit
from persister.share_compaction import read_share_records
from persister.share_records import ShareKey
from protocol.errors import KafkaError
from tests.unit import test_runtime
from tests.unit.test_runtime import Disk, share_state, until

clock = test_runtime.clock
commit = test_runtime.commit
disk = test_runtime.disk

TOPIC = uuid.UUID(int=11)
KEYS = [ShareStateKey(f"g{g}", TOPIC, p) for g in range(2) for p in range(3)]


def open_state(
    directory: Path,
    commit: GroupCommit,
    clock: ManualClock,
    *,
    checkpoints: bool = True,
    interval: int = 10**9,
    segment_bytes: int = 1 << 20,
) -> DurablePersister:
    persister = DurablePersister(
        directory,
        commit,
        clock=clock,
        snapshot_update_records_per_snapshot=3,
        segment_bytes=segment_bytes,
        checkpoints=checkpoints,
        checkpoint_interval_records=interval,
    )
    persister.load()
    return persister


def kill_9(persister: DurablePersister) -> None:
    """Stop as kill -9 would: no clean close, so no checkpoint at shutdown and no marker."""
    persister.records.log.close(clean=False)


def restart_both(
    directory: Path, tmp_path: Path, commit: GroupCommit, clock: ManualClock
) -> tuple[DurablePersister, DurablePersister, list[dict[str, Any]]]:
    """The directory restarted as the broker does (checkpoint), and a copy of it
    replayed in full; with the checkpointed restart's log events."""
    copy = tmp_path / "full-replay"
    shutil.copytree(directory, copy)
    (copy / CHECKPOINT_FILE).unlink(missing_ok=True)
    with structlog.testing.capture_logs() as events:
        fast = open_state(directory, commit, clock)
    full = open_state(copy, commit, clock, checkpoints=False)
    return fast, full, events


async def traffic(persister: DurablePersister, rng: random.Random, writes: int) -> None:
    """Share-partition leader traffic: writes, leader-epoch moves, deletes, re-inits."""
    for _ in range(writes):
        key = rng.choice(KEYS)
        state = persister.shard.state(key)
        if state is None:
            await persister.initialize_state(key, rng.randrange(3), rng.randrange(50))
            continue
        roll = rng.random()
        if roll < 0.05:
            await persister.delete_state(key)
        elif roll < 0.1:
            await persister.read_state(key, state.leader_epoch + 1)
        else:
            first = max(state.start_offset, 0) + rng.randrange(5)
            batches = [PersistedBatch(first, first + rng.randrange(4), rng.choice((0, 2, 3, 4)), 1)]
            await persister.write_state(key, -1, -1, first - rng.randrange(2), batches)


async def compact_all(persister: DurablePersister) -> None:
    """Compact every closed segment (after a compaction the writes started, if any)."""
    await until(lambda: persister.runtime._compaction_task is None)
    await persister.compact()


def events_named(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == name]


async def test_a_restart_after_kill_9_loads_the_periodic_checkpoint_and_equals_a_full_replay(
    tmp_path: Path, commit: GroupCommit, clock: ManualClock
) -> None:
    directory = tmp_path / "share-state"
    persister = open_state(directory, commit, clock, interval=50)
    rng = random.Random(1)
    await traffic(persister, rng, 400)
    await until(lambda: persister.runtime._checkpoint_task is None)
    assert persister.runtime.checkpoint_offset is not None
    live = share_state(persister)
    kill_9(persister)

    fast, full, events = restart_both(directory, tmp_path, commit, clock)
    assert share_state(fast) == share_state(full) == live
    loaded = events_named(events, "checkpoint_loaded")
    assert loaded and loaded[0]["offset"] > 0
    # Only the tail after the checkpoint was replayed (at most one interval and a write).
    assert events_named(events, "share_state_loaded")[0]["records"] < 60

    # Both go on alike: the update counts decide the next snapshots.
    await traffic(fast, random.Random(2), 100)
    await traffic(full, random.Random(2), 100)
    assert share_state(fast) == share_state(full)
    fast.close()
    full.close()


async def test_a_compaction_that_drops_a_tombstone_after_the_checkpoint_is_not_undone(
    tmp_path: Path, commit: GroupCommit, clock: ManualClock
) -> None:
    directory = tmp_path / "share-state"
    persister = open_state(directory, commit, clock, segment_bytes=1024)
    for key in KEYS:
        await persister.initialize_state(key, 0, 0)
    assert await persister.runtime.checkpoint()
    gone = KEYS[0]
    await persister.delete_state(gone)
    # Enough writes on the other keys to roll past the tombstone, then compact.
    for i in range(200):
        await persister.write_state(KEYS[1 + i % 5], -1, -1, i, [PersistedBatch(i, i, 2, 1)])
    await compact_all(persister)
    # The tombstone and everything of the key are gone from the log: a replay from the
    # first checkpoint would bring the key back.
    dropped = ShareKey(gone.group_id, gone.topic_id, gone.partition)
    assert all(r.key != dropped for _, r in read_share_records(persister.records.log))
    live = share_state(persister)
    assert gone not in live
    kill_9(persister)

    fast, full, _ = restart_both(directory, tmp_path, commit, clock)
    assert share_state(fast) == share_state(full) == live
    fast.close()
    full.close()


async def test_a_checkpoint_after_compaction_restarts_to_the_compacted_replay(
    tmp_path: Path, commit: GroupCommit, clock: ManualClock
) -> None:
    directory = tmp_path / "share-state"
    persister = open_state(directory, commit, clock, segment_bytes=1024, interval=40)
    await traffic(persister, random.Random(3), 600)
    await compact_all(persister)
    await traffic(persister, random.Random(4), 100)
    runtime = persister.runtime
    await until(lambda: runtime._checkpoint_task is None and runtime._compaction_task is None)
    if runtime.checkpoint_offset is None:
        # A compaction of records past the last periodic checkpoint just removed it.
        assert await runtime.checkpoint()
    live = share_state(persister)
    kill_9(persister)

    fast, full, events = restart_both(directory, tmp_path, commit, clock)
    assert events_named(events, "checkpoint_loaded")
    assert share_state(fast) == share_state(full) == live
    fast.close()
    full.close()


async def test_a_checkpoint_never_covers_a_write_that_a_failed_fsync_truncated(
    tmp_path: Path, commit: GroupCommit, clock: ManualClock, disk: Disk
) -> None:
    directory = tmp_path / "share-state"
    persister = open_state(directory, commit, clock)
    disk.attach(persister.records)
    for key in KEYS:
        await persister.initialize_state(key, 0, 0)
    end_before = persister.records.end_offset

    flushes = disk.flushes_started
    disk.gate.clear()
    disk.fail("fsync", errno.EIO)
    write = asyncio.ensure_future(
        persister.write_state(KEYS[1], -1, -1, 0, [PersistedBatch(0, 9, 2, 1)])
    )
    await until(lambda: disk.flushes_started > flushes)
    assert persister.records.end_offset > end_before  # appended, waiting for its fsync
    # A checkpoint taken while the write waits for its fsync covers what came before.
    assert await persister.runtime.checkpoint()
    assert persister.runtime.checkpoint_offset == end_before
    disk.gate.set()
    with pytest.raises(KafkaError):
        await write
    assert persister.records.end_offset == end_before  # truncated

    await persister.write_state(KEYS[2], -1, -1, 0, [PersistedBatch(0, 4, 2, 1)])
    live = share_state(persister)
    kill_9(persister)
    fast, full, events = restart_both(directory, tmp_path, commit, clock)
    assert events_named(events, "checkpoint_loaded")[0]["offset"] == end_before
    assert share_state(fast) == share_state(full) == live
    assert fast.shard.state(KEYS[1]).batches == []  # type: ignore[union-attr]
    fast.close()
    full.close()


def _damage_payload(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))


def _newer_version(path: Path) -> None:
    data = bytearray(path.read_bytes())
    struct.pack_into(">h", data, 4, 99)
    path.write_bytes(bytes(data))


def _beyond_the_log(path: Path) -> None:
    checkpoint = CheckpointFile(path.parent, "share-state").read()
    assert checkpoint is not None
    path.write_bytes(encode_checkpoint("share-state", 10**6, checkpoint.payload))


def _torn(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:9])


def _other_kind(path: Path) -> None:
    checkpoint = CheckpointFile(path.parent, "share-state").read()
    assert checkpoint is not None
    path.write_bytes(encode_checkpoint("groups", checkpoint.offset, checkpoint.payload))


def _valid_crc_bad_payload(path: Path) -> None:
    checkpoint = CheckpointFile(path.parent, "share-state").read()
    assert checkpoint is not None
    path.write_bytes(encode_checkpoint("share-state", checkpoint.offset, b"\x00\x00\x00\x05xx"))


@pytest.mark.parametrize(
    ("damage", "event"),
    [
        (_damage_payload, "checkpoint_ignored"),
        (_torn, "checkpoint_ignored"),
        (_newer_version, "checkpoint_ignored"),
        (_other_kind, "checkpoint_ignored"),
        (_beyond_the_log, "checkpoint_outside_log"),
        (_valid_crc_bad_payload, "checkpoint_undecodable"),
    ],
    ids=["crc", "torn", "too-new", "other-kind", "beyond-log", "bad-payload"],
)
async def test_an_unusable_checkpoint_falls_back_to_a_full_replay(
    tmp_path: Path, commit: GroupCommit, clock: ManualClock, damage: Any, event: str
) -> None:
    directory = tmp_path / "share-state"
    persister = open_state(directory, commit, clock)
    await traffic(persister, random.Random(5), 120)
    assert await persister.runtime.checkpoint()
    await traffic(persister, random.Random(6), 30)
    live = share_state(persister)
    total = persister.records.end_offset
    kill_9(persister)
    damage(directory / CHECKPOINT_FILE)

    with structlog.testing.capture_logs() as events:
        restarted = open_state(directory, commit, clock)
    assert events_named(events, event)
    assert not events_named(events, "checkpoint_loaded")
    assert events_named(events, "share_state_loaded")[0]["records"] == total
    assert share_state(restarted) == live
    restarted.close()


async def test_a_clean_close_checkpoints_and_the_restart_replays_nothing(
    tmp_path: Path, commit: GroupCommit, clock: ManualClock
) -> None:
    directory = tmp_path / "share-state"
    persister = open_state(directory, commit, clock)
    await traffic(persister, random.Random(7), 80)
    live = share_state(persister)
    persister.close()
    with structlog.testing.capture_logs() as events:
        restarted = open_state(directory, commit, clock)
    assert events_named(events, "share_state_loaded")[0]["records"] == 0
    assert share_state(restarted) == live
    restarted.close()


async def test_a_persister_never_loaded_writes_no_checkpoint_at_close(
    tmp_path: Path, commit: GroupCommit, clock: ManualClock
) -> None:
    directory = tmp_path / "share-state"
    persister = open_state(directory, commit, clock)
    await traffic(persister, random.Random(8), 40)
    persister.close()
    (directory / CHECKPOINT_FILE).unlink()
    unloaded = DurablePersister(directory, commit, clock=clock)
    unloaded.close()
    assert not (directory / CHECKPOINT_FILE).exists()


def test_a_write_begun_before_a_removal_does_not_land(tmp_path: Path) -> None:
    file = CheckpointFile(tmp_path, "share-state")
    generation = file.generation
    file.remove()
    assert not file.write(5, b"state", generation)
    assert file.read() is None
    assert file.write(5, b"state", file.generation)
    found = file.read()
    assert found is not None and (found.offset, found.payload) == (5, b"state")
    assert [p.name for p in tmp_path.iterdir()] == [CHECKPOINT_FILE]
