"""Compaction of the share-state log: same replay, tombstoned keys gone, crash-safe swaps."""

from __future__ import annotations

import random
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.share_coordinator import ShareCoordinatorShard
from coordinator.share_state import PersistedBatch, ShareState, ShareStateKey
from persister.file_log import CLEANED_SUFFIX, LogConfig, PartitionLog
from persister.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    LogSegment,
    segment_file_name,
)
from persister.share_compaction import (
    compact_share_log,
    plan_share_compaction,
    read_share_records,
    write_cleaned_segment,
)
from persister.share_records import ShareKey, ShareRecord, ShareTombstone, encode
from protocol.errors import KafkaError
from protocol.records import NewRecord, build_batch

NOW = 1_700_000_000_000
TOPIC = uuid.UUID(int=42)
KEYS = [ShareStateKey(f"group-{g}", TOPIC, p) for g in range(3) for p in range(2)]
SMALL = LogConfig(segment_bytes=2048, index_interval_bytes=256, retention_ms=-1)

Snapshot = dict[ShareStateKey, tuple[ShareState | None, int, int | None]]


def states(shard: ShareCoordinatorShard) -> Snapshot:
    return {
        key: (shard.state(key), shard.updates_since_snapshot(key), shard.snapshot_epoch(key))
        for key in list(shard.keys())
    }


def replay(log: PartitionLog, per_snapshot: int) -> ShareCoordinatorShard:
    shard = ShareCoordinatorShard(per_snapshot)
    for _, record in read_share_records(log):
        shard.replay(record)
    return shard


def append(log: PartitionLog, records: list[ShareRecord], now_ms: int) -> None:
    batch = build_batch(
        [NewRecord(*encode(record)) for record in records], default_timestamp=now_ms
    )
    if len(batch) > log.config.segment_bytes // 2 and len(records) > 1:
        # A batch must fit a segment; the tiny test segments take big groups one by one.
        for record in records:
            append(log, [record], now_ms)
        return
    log.append(bytearray(batch), now_ms)


class Workload:
    """A live shard whose records go to a real log, as the runtime would do it."""

    def __init__(self, log: PartitionLog, per_snapshot: int, seed: int) -> None:
        self.log = log
        self.shard = ShareCoordinatorShard(per_snapshot)
        self.rng = random.Random(seed)
        self.pending: list[ShareRecord] = []
        self.now = NOW

    def _apply(self, result: tuple[list[ShareRecord], Any]) -> None:
        records = result[0]
        for record in records:
            self.shard.replay(record)
        self.pending.extend(records)
        # Group several operations' records into one batch now and then.
        if self.pending and self.rng.random() < 0.6:
            append(self.log, self.pending, self.now)
            self.pending = []

    def flush(self) -> None:
        if self.pending:
            append(self.log, self.pending, self.now)
            self.pending = []

    def step(self, keys: list[ShareStateKey] = KEYS) -> None:
        rng = self.rng
        self.now += 1
        key = rng.choice(keys)
        state = self.shard.state(key)
        try:
            if state is None or rng.random() < 0.03:
                epoch = 0 if state is None else state.state_epoch + rng.randint(0, 1)
                self._apply(self.shard.initialize_state(key, epoch, rng.randint(0, 20), self.now))
            elif rng.random() < 0.05:
                self._apply(self.shard.delete_state(key))
            elif rng.random() < 0.1:
                self._apply(self.shard.read_state(key, state.leader_epoch + 1, self.now))
            else:
                start = max(state.start_offset, 0)
                first = start + rng.randint(0, 30)
                batches = [
                    PersistedBatch(first, first + rng.randint(0, 5), rng.choice([0, 2, 3, 4]), 1)
                ]
                move = start + rng.randint(0, 3) if rng.random() < 0.3 else -1
                self._apply(
                    self.shard.write_state(
                        key, state.state_epoch, state.leader_epoch, move, batches, self.now
                    )
                )
        except KafkaError:
            pass


def build(directory: Path, steps: int, per_snapshot: int = 4, seed: int = 1) -> Workload:
    log = PartitionLog.open(directory, SMALL, NOW)
    work = Workload(log, per_snapshot, seed)
    for _ in range(steps):
        work.step()
    work.flush()
    return work


def closed_records(log: PartitionLog) -> list[tuple[int, ShareRecord]]:
    active = log.segment_base_offsets[-1]
    return [(o, r) for o, r in read_share_records(log) if o < active]


def file_bytes(log: PartitionLog, base: int, suffix: str = LOG_SUFFIX) -> bytes:
    return (log.directory / segment_file_name(base, suffix)).read_bytes()


# ---------------------------------------------------------------------------


def test_compaction_keeps_replay_and_drops_tombstoned_keys(tmp_path: Path) -> None:
    work = build(tmp_path / "share-state", 600)
    log = work.log
    # Delete two keys for good, then write enough to close the segment holding the tombstones.
    for key in KEYS[:2]:
        records, _ = work.shard.delete_state(key)
        for record in records:
            work.shard.replay(record)
        append(log, records, NOW)
    for _ in range(100):
        work.step(KEYS[2:])
    work.flush()
    assert len(log.closed_segment_base_offsets) >= 5
    live = states(work.shard)
    assert states(replay(log, 4)) == live

    active = log.segment_base_offsets[-1]
    active_files = {s: file_bytes(log, active, s) for s in (LOG_SUFFIX, INDEX_SUFFIX)}
    before = closed_records(log)
    deleted = {
        record.key for _, record in before if isinstance(record, ShareTombstone)
    }  # keys deleted at least once
    last_kind = {record.key: type(record) for _, record in before}
    log_end = log.log_end_offset

    result = compact_share_log(log, NOW + 10_000)

    assert result.segments_rewritten > 0
    assert result.records_after < result.records_before == len(before)
    assert result.bytes_after < result.bytes_before
    assert states(replay(log, 4)) == live
    after = closed_records(log)
    assert len(after) == result.records_after
    # Offsets are kept: the compacted records are a subsequence of the originals.
    original = dict(before)
    assert all(original[offset] == record for offset, record in after)
    # A key whose last record in the closed segments is a tombstone has nothing left there.
    gone = {key for key, kind in last_kind.items() if kind is ShareTombstone}
    assert deleted and gone
    assert not any(record.key in gone for _, record in after)
    assert not any(isinstance(record, ShareTombstone) for _, record in after)
    # At most one snapshot per key (the newest), and it comes before its key's updates.
    first_kind: dict[ShareKey, str] = {}
    for _, record in after:
        first_kind.setdefault(record.key, type(record).__name__)
    snapshots = [r.key for _, r in after if type(r).__name__ == "ShareSnapshot"]
    assert len(snapshots) == len(set(snapshots))
    # The active segment is untouched, and the log end too.
    assert log.segment_base_offsets[-1] == active
    assert {s: file_bytes(log, active, s) for s in active_files} == active_files
    assert log.log_end_offset == log_end

    # Appends continue, a second run has nothing to do, and a reopen replays the same.
    for _ in range(50):
        work.step()
    work.flush()
    live = states(work.shard)
    assert states(replay(log, 4)) == live
    log.close()
    reopened = PartitionLog.open(tmp_path / "share-state", SMALL, NOW + 20_000)
    assert states(replay(reopened, 4)) == live
    compact_share_log(reopened, NOW + 20_000)
    again = compact_share_log(reopened, NOW + 20_000)
    assert again.segments_rewritten == 0
    assert states(replay(reopened, 4)) == live
    reopened.close(clean=False)
    unclean = PartitionLog.open(tmp_path / "share-state", SMALL, NOW + 30_000)
    assert states(replay(unclean, 4)) == live
    unclean.close()


def test_reads_after_compaction_find_every_kept_offset(tmp_path: Path) -> None:
    work = build(tmp_path / "s", 400)
    log = work.log
    compact_share_log(log, NOW)
    for offset, _ in read_share_records(log):
        data = log.read(offset, 1)
        assert data
        from_offset = [o for o, _ in read_share_records(log, offset)]
        assert from_offset[0] == offset
        break
    offsets = [o for o, _ in read_share_records(log)]
    assert offsets == sorted(offsets) and len(offsets) == len(set(offsets))
    log.close()


def test_crash_between_cleaned_file_and_rename(tmp_path: Path) -> None:
    work = build(tmp_path / "s", 500)
    log = work.log
    live = states(work.shard)
    plan = plan_share_compaction(log)
    originals = {base: file_bytes(log, base) for base in plan.base_offsets}
    cleaned = [write_cleaned_segment(log, base, plan) for base in plan.base_offsets]
    assert any(path is not None and path.exists() for path in cleaned)
    # Crash: the originals are still in place.
    log.close(clean=False)
    reopened = PartitionLog.open(tmp_path / "s", SMALL, NOW)
    assert not list((tmp_path / "s").glob(f"*{CLEANED_SUFFIX}"))
    assert {base: file_bytes(reopened, base) for base in plan.base_offsets} == originals
    assert states(replay(reopened, 4)) == live
    compact_share_log(reopened, NOW)
    assert states(replay(reopened, 4)) == live
    reopened.close()


def test_crash_after_rename_before_index_rebuild(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = build(tmp_path / "s", 500)
    log = work.log
    live = states(work.shard)
    plan = plan_share_compaction(log)
    target = next(
        base for base in plan.base_offsets if write_cleaned_segment(log, base, plan) is not None
    )

    def crash(*args: object, **kwargs: object) -> None:
        raise OSError("simulated crash after the rename")

    with monkeypatch.context() as patch:
        patch.setattr(LogSegment, "load", crash)
        with pytest.raises(OSError, match="simulated crash"):
            log.replace_closed_segment(
                target,
                log.directory / (segment_file_name(target, LOG_SUFFIX) + CLEANED_SUFFIX),
                NOW,
            )
    assert not (log.directory / segment_file_name(target, INDEX_SUFFIX)).exists()
    log.close(clean=False)
    reopened = PartitionLog.open(tmp_path / "s", SMALL, NOW)
    for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
        assert (reopened.directory / segment_file_name(target, suffix)).exists()
    assert states(replay(reopened, 4)) == live
    reopened.close()


def test_any_prefix_of_swapped_segments_replays_the_same(tmp_path: Path) -> None:
    work = build(tmp_path / "s", 500, per_snapshot=3, seed=7)
    log = work.log
    live = states(work.shard)
    plan = plan_share_compaction(log)
    for base in plan.base_offsets:
        cleaned = write_cleaned_segment(log, base, plan)
        if cleaned is not None:
            log.replace_closed_segment(base, cleaned, NOW)
        assert states(replay(log, 3)) == live
    log.close()


def test_replace_closed_segment_checks_its_input(tmp_path: Path) -> None:
    work = build(tmp_path / "s", 300)
    log = work.log
    bases = log.segment_base_offsets
    stray = log.directory / "x.cleaned"
    stray.write_bytes(file_bytes(log, bases[1]))
    with pytest.raises(KafkaError, match="no closed segment"):
        log.replace_closed_segment(bases[-1], stray, NOW)
    with pytest.raises(KafkaError, match="no closed segment"):
        log.replace_closed_segment(bases[0] + 1, stray, NOW)
    # Batches of another segment's offsets are refused and nothing changes.
    before = file_bytes(log, bases[0])
    with pytest.raises(KafkaError, match="outside the segment"):
        log.replace_closed_segment(bases[0], stray, NOW)
    assert file_bytes(log, bases[0]) == before
    # So is a torn file.
    stray.write_bytes(before[:-3])
    with pytest.raises(KafkaError):
        log.replace_closed_segment(bases[0], stray, NOW)
    assert file_bytes(log, bases[0]) == before
    log.close()


def test_nothing_to_compact_with_only_an_active_segment(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "s", LogConfig(), NOW)
    shard = ShareCoordinatorShard()
    records, _ = shard.initialize_state(KEYS[0], 0, 0, NOW)
    append(log, records, NOW)
    result = compact_share_log(log, NOW)
    assert result.segments_compacted == 0 and result.segments_rewritten == 0
    log.close()


def test_corrupt_share_record_stops_compaction_before_any_change(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "s", SMALL, NOW)
    append(log, [ShareTombstone(ShareKey("g", TOPIC, 0))], NOW)
    log.append(bytearray(build_batch([NewRecord(b"\x00\x07junk", b"x" * 1950)])), NOW)
    log.append(bytearray(build_batch([NewRecord(b"k", b"v")])), NOW)
    assert log.closed_segment_base_offsets == [0, 1]
    before = file_bytes(log, 0)
    with pytest.raises(ValueError, match="record at offset 1"):
        compact_share_log(log, NOW)
    assert file_bytes(log, 0) == before
    log.close()


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32), st.integers(0, 5), st.integers(50, 400))
def test_compaction_property(seed: int, per_snapshot: int, steps: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = build(Path(tmp) / "s", steps, per_snapshot=per_snapshot, seed=seed)
        live = states(work.shard)
        compact_share_log(work.log, NOW)
        assert states(replay(work.log, per_snapshot)) == live
        work.log.close(clean=False)
        reopened = PartitionLog.open(Path(tmp) / "s", SMALL, NOW)
        assert states(replay(reopened, per_snapshot)) == live
        reopened.close()
