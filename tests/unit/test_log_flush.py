"""What a partition-log flush makes durable, and why an unclean start never trusts an
index the flush left unsynced.

A record is durable once its segment's `.log` is: the produce-path flush syncs only the
active segment's `.log`; indexes are synced at roll (before the recovery point passes the
segment) and at clean close, as Kafka flushes them. The active segment is always at or
above the persisted recovery point, so an unclean start rebuilds its indexes from the log.
"""

from __future__ import annotations

import os
import sys
from array import array
from collections.abc import Iterator
from pathlib import Path

import pytest

from persister import segment as segment_module
from persister.file_log import RECOVERY_POINT_CHECKPOINT, PartitionLog
from persister.segment import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX
from tests.unit.test_log import NOW, fill, headers, make_batch, read_all, small_config


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "topics" / "orders-0"


@pytest.fixture
def synced(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Names of the files each fsync/fdatasync call synced, in order (directories and
    checkpoint temp files included)."""
    calls: list[str] = []
    real_fsync, real_fdatasync = os.fsync, segment_module._fdatasync

    def name(fd: int) -> str:
        return os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))

    def fsync(fd: int) -> None:
        calls.append(name(fd))
        real_fsync(fd)

    def fdatasync(fd: int) -> None:
        calls.append(name(fd))
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(segment_module, "_fdatasync", fdatasync)
    yield calls


def segment_syncs(calls: list[str]) -> list[str]:
    suffixes = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, ".txnindex")
    return [c for c in calls if c.endswith(suffixes)]


def active_base(log_dir: Path) -> int:
    return int(sorted(log_dir.glob(f"*{LOG_SUFFIX}"))[-1].name.split(".")[0])


def test_a_flush_without_a_roll_syncs_only_the_active_log_file(
    log_dir: Path, synced: list[str]
) -> None:
    plog = PartitionLog.open(log_dir, small_config(segment_bytes=100_000), NOW)
    plog.flush()  # the new directory and checkpoints
    fill(plog, 30)  # index_interval_bytes=100: the active indexes have entries
    assert plog.offset_for_timestamp(NOW + 20) is not None
    synced.clear()
    plog.flush()
    assert synced == [f"{0:020d}{LOG_SUFFIX}"]
    plog.close()


def test_a_flush_after_a_roll_syncs_the_rolled_segment_and_its_indexes_first(
    log_dir: Path, synced: list[str]
) -> None:
    plog = PartitionLog.open(log_dir, small_config(), NOW)
    plog.flush()
    fill(plog, 2)
    assert plog.segment_base_offsets == [0]
    synced.clear()
    plog.flush()
    assert segment_syncs(synced) == [f"{0:020d}{LOG_SUFFIX}"]
    before = plog.segment_base_offsets
    while plog.segment_base_offsets == before:
        plog.append(make_batch(2, payload=60), NOW)
    rolled, active = plog.segment_base_offsets[-2:]
    synced.clear()
    plog.flush()
    assert segment_syncs(synced) == [
        f"{rolled:020d}{LOG_SUFFIX}",
        f"{rolled:020d}{INDEX_SUFFIX}",
        f"{rolled:020d}{TIME_INDEX_SUFFIX}",
        f"{active:020d}{LOG_SUFFIX}",
    ]
    # The recovery point passes the rolled segment only in the flush that synced its
    # indexes, and never passes the active one.
    assert synced.index(RECOVERY_POINT_CHECKPOINT + ".tmp") > synced.index(
        f"{rolled:020d}{TIME_INDEX_SUFFIX}"
    )
    assert (log_dir / RECOVERY_POINT_CHECKPOINT).read_text().split()[-1] == str(active)
    plog.close()


def test_a_clean_close_syncs_the_active_segments_indexes(log_dir: Path, synced: list[str]) -> None:
    plog = PartitionLog.open(log_dir, small_config(segment_bytes=100_000), NOW)
    fill(plog, 30)
    plog.flush()
    synced.clear()
    plog.close()
    assert {f"{0:020d}{INDEX_SUFFIX}", f"{0:020d}{TIME_INDEX_SUFFIX}"} <= set(synced)


@pytest.mark.parametrize("stale", ["older", "sane_but_wrong", "missing"])
def test_after_kill_9_the_active_segments_unsynced_indexes_are_rebuilt(
    log_dir: Path, stale: str
) -> None:
    """The on-disk indexes of the active segment may be anything a crash leaves of
    unsynced writes: an older version, entries that pass the sanity check but point at the
    wrong batch, or nothing. Reopening after kill -9 answers every offset and timestamp
    lookup from the log itself."""
    config = small_config(segment_bytes=4_000, index_interval_bytes=300)
    plog = PartitionLog.open(log_dir, config, NOW)
    written = fill(plog, 50)  # rolls: closed segments below the recovery point
    plog.flush()
    base = plog.segment_base_offsets[-1]
    assert base > 0
    index = log_dir / f"{base:020d}{INDEX_SUFFIX}"
    time_index = log_dir / f"{base:020d}{TIME_INDEX_SUFFIX}"
    older = (index.read_bytes(), time_index.read_bytes())
    written += fill(plog, 20, start_ts=NOW + 50)
    plog.flush()  # the .log is durable; the active indexes are not synced
    assert index.stat().st_size > len(older[0])
    plog.close(clean=False)  # kill -9: no clean-shutdown marker
    assert (log_dir / RECOVERY_POINT_CHECKPOINT).read_text().split()[-1] == str(base)

    if stale == "older":
        index.write_bytes(older[0])
        time_index.write_bytes(older[1])
    elif stale == "sane_but_wrong":
        # Entries a sanity check accepts (increasing, inside the file, the last one right)
        # but one points at a later batch than its offset: a lookup trusting it skips
        # batches. A cut-and-rewritten segment can leave such entries behind.
        entries = array("i", index.read_bytes())
        swap = sys.byteorder == "little"  # big-endian on disk
        if swap:
            entries.byteswap()
        k = 2 * (len(entries) // 4)
        assert entries[k] - entries[k - 2] > 1
        entries[k] = entries[k - 2] + 1
        if swap:
            entries.byteswap()
        index.write_bytes(entries.tobytes())
    else:
        index.unlink()
        time_index.unlink()

    reopened = PartitionLog.open(log_dir, config, NOW)
    assert reopened.log_end_offset == headers(written[-1])[0].next_offset
    assert read_all(reopened) == b"".join(written)
    for offset in range(reopened.log_end_offset):
        first = headers(reopened.read(offset, 1))[0]
        assert first.base_offset <= offset <= first.last_offset
    for i, batch in enumerate(written):
        # fill() gives batch i the timestamp NOW + i (also the second fill's NOW + 50 + j).
        assert reopened.offset_for_timestamp(NOW + i) == (headers(batch)[0].base_offset, NOW + i)
    assert reopened.offset_for_timestamp(NOW + 5_000) is None
    reopened.close()
