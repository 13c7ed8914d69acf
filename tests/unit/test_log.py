"""The persister's segmented log: append/read, rolls, recovery, indexes, retention."""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from persister.file_log import (
    CLEAN_SHUTDOWN_FILE,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    LogConfig,
    PartitionLog,
)
from persister.segment import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX
from protocol.errors import ErrorCode, KafkaError
from protocol.records import HEADER, HEADER_SIZE, BatchHeader, iter_batches

NOW = 1_700_000_000_000


def make_batch(
    records: int = 1, *, timestamp: int = NOW, max_timestamp: int | None = None, payload: int = 20
) -> bytearray:
    """A structurally valid v2 batch with an opaque body and a correct CRC32C."""
    body = bytes((i * 7) % 251 for i in range(payload))
    buf = bytearray(
        HEADER.pack(
            0,
            HEADER_SIZE - 12 + len(body),
            -1,
            2,
            0,
            0,
            records - 1,
            timestamp,
            timestamp if max_timestamp is None else max_timestamp,
            -1,
            -1,
            -1,
            records,
        )
        + body
    )
    struct.pack_into(">I", buf, 17, crc32c.crc32c(bytes(buf[21:])))
    return buf


def headers(data: bytes) -> list[BatchHeader]:
    return [h for _, h in iter_batches(data)]


def small_config(**overrides: int) -> LogConfig:
    values = {"segment_bytes": 600, "index_interval_bytes": 100, "retention_ms": -1}
    values.update(overrides)
    return LogConfig(**values)


def fill(plog: PartitionLog, count: int, *, start_ts: int = NOW) -> list[bytearray]:
    """Append `count` batches of varying record counts and sizes; return them as written."""
    written = []
    for i in range(count):
        batch = make_batch(1 + i % 4, timestamp=start_ts + i, payload=10 + (i * 13) % 90)
        plog.append(batch, NOW)
        written.append(batch)
    return written


def read_all(plog: PartitionLog, start: int | None = None) -> bytes:
    out = bytearray()
    offset = plog.log_start_offset if start is None else start
    while offset < plog.log_end_offset:
        chunk = plog.read(offset, 250)
        assert chunk
        out += chunk
        offset = headers(chunk)[-1].next_offset
    return bytes(out)


def segment_files(directory: Path, suffix: str) -> list[Path]:
    return sorted(directory.glob(f"*{suffix}"))


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    return tmp_path / "topics" / "orders-0"


@pytest.fixture(autouse=True)
def no_fd_leak() -> Iterator[None]:
    """Every segment fd (log and index files) is closed by close()/delete()."""
    before = len(os.listdir("/proc/self/fd"))
    yield
    assert len(os.listdir("/proc/self/fd")) == before


# ------------------------------------------------------------------ append / read


def test_append_assigns_consecutive_offsets(log_dir: Path) -> None:
    plog = PartitionLog.open(log_dir, LogConfig(), NOW)
    first = plog.append(make_batch(3), NOW)
    data = make_batch(2) + make_batch(5, timestamp=NOW + 9)
    second = plog.append(data, NOW)
    assert (first.first_offset, first.last_offset) == (0, 2)
    assert (second.first_offset, second.last_offset, second.batch_count) == (3, 9, 2)
    assert (second.max_timestamp, second.offset_of_max_timestamp) == (NOW + 9, 9)
    assert [h.base_offset for h in headers(bytes(data))] == [3, 5]
    assert plog.log_end_offset == 10
    plog.close()


def test_round_trip_across_many_segment_rolls(log_dir: Path) -> None:
    plog = PartitionLog.open(log_dir, small_config(), NOW)
    written = fill(plog, 200)
    assert len(plog.segment_base_offsets) > 20
    assert read_all(plog) == b"".join(written)
    assert plog.size_bytes == sum(len(b) for b in written)
    for base in plog.segment_base_offsets:
        assert (log_dir / f"{base:020d}.log").exists()
        assert (log_dir / f"{base:020d}.index").exists()
        assert (log_dir / f"{base:020d}.timeindex").exists()
    plog.close()


def test_read_at_every_offset_returns_the_batch_containing_it(log_dir: Path) -> None:
    plog = PartitionLog.open(log_dir, small_config(), NOW)
    fill(plog, 120)
    for offset in range(plog.log_end_offset):
        first = headers(plog.read(offset, 1))[0]
        assert first.base_offset <= offset <= first.last_offset
    plog.close()


def test_max_bytes_returns_whole_batches_and_at_least_one(log_dir: Path) -> None:
    plog = PartitionLog.open(log_dir, LogConfig(), NOW)
    small = [make_batch(payload=40) for _ in range(3)]
    for batch in small:
        plog.append(batch, NOW)
    big = make_batch(payload=5000)
    plog.append(big, NOW)

    assert plog.read(0, 0) == small[0]
    assert plog.read(0, len(small[0]) * 2 + 10) == small[0] + small[1]
    assert plog.read(0, 10_000) == b"".join(small) + big
    assert plog.read(3, 100) == big  # larger than max_bytes, still returned whole
    plog.close()


def test_every_max_bytes_cut_ends_on_a_batch_boundary(log_dir: Path) -> None:
    plog = PartitionLog.open(log_dir, small_config(segment_bytes=5000, index_interval_bytes=1), NOW)
    content = b"".join(fill(plog, 40))
    starts = {h.base_offset: pos for pos, h in iter_batches(content)}
    for offset, pos in list(starts.items())[:10]:
        for max_bytes in range(0, 900, 11):
            data = plog.read(offset, max_bytes)
            assert content[pos:].startswith(data)
            assert headers(data)  # validates: no partial batch at the end
            assert len(data) <= max_bytes or len(headers(data)) == 1
    plog.close()


def test_max_offset_is_an_exclusive_upper_bound(log_dir: Path) -> None:
    plog = PartitionLog.open(log_dir, small_config(), NOW)
    fill(plog, 30)
    bases = [h.base_offset for h in headers(read_all(plog))]
    bound = bases[12]
    data = b""
    offset = 0
    while chunk := plog.read(offset, 300, max_offset=bound):
        data += chunk
        offset = headers(chunk)[-1].next_offset
    assert headers(data)[-1].next_offset == bound
    assert plog.read(bound, 300, max_offset=bound) == b""
    plog.close()


def test_read_outside_the_log_is_offset_out_of_range(log_dir: Path) -> None:
    plog = PartitionLog.open(log_dir, LogConfig(), NOW)
    plog.append(make_batch(2), NOW)
    assert plog.read(2, 100) == b""
    for offset in (-1, 3):
        with pytest.raises(KafkaError) as info:
            plog.read(offset, 100)
        assert info.value.code == ErrorCode.offset_out_of_range
    plog.close()


def test_batch_over_max_message_bytes_is_rejected(log_dir: Path) -> None:
    plog = PartitionLog.open(log_dir, LogConfig(max_message_bytes=200), NOW)
    with pytest.raises(KafkaError) as info:
        plog.append(make_batch(payload=300), NOW)
    assert info.value.code == ErrorCode.message_too_large
    assert plog.log_end_offset == 0
    plog.close()


def test_segment_rolls_by_batch_timestamp_after_segment_ms(log_dir: Path) -> None:
    plog = PartitionLog.open(log_dir, LogConfig(segment_ms=1000), NOW)
    plog.append(make_batch(timestamp=NOW), NOW)
    plog.append(make_batch(timestamp=NOW + 1000), NOW)
    assert plog.segment_base_offsets == [0]
    plog.append(make_batch(timestamp=NOW + 1001), NOW)
    assert plog.segment_base_offsets == [0, 2]
    plog.close()


def test_segment_without_timestamps_rolls_by_creation_time(log_dir: Path) -> None:
    plog = PartitionLog.open(log_dir, LogConfig(segment_ms=1000), NOW)
    plog.append(make_batch(timestamp=-1), NOW)
    plog.append(make_batch(timestamp=-1), NOW + 1000)
    assert plog.segment_base_offsets == [0]
    plog.append(make_batch(timestamp=-1), NOW + 1001)
    assert plog.segment_base_offsets == [0, 2]
    plog.close()


def test_iter_batch_headers_from_an_offset(log_dir: Path) -> None:
    plog = PartitionLog.open(log_dir, small_config(), NOW)
    fill(plog, 50)
    all_headers = list(plog.iter_batch_headers())
    assert [h.base_offset for h in all_headers] == [h.base_offset for h in headers(read_all(plog))]
    later = list(plog.iter_batch_headers(40))
    assert later[0].base_offset <= 40 <= later[0].last_offset
    assert later[-1].next_offset == plog.log_end_offset
    plog.close()


# ------------------------------------------------------------------ reopen / recovery


@pytest.mark.parametrize("clean", [True, False])
def test_reopen_gives_the_same_log(log_dir: Path, clean: bool) -> None:
    config = small_config()
    plog = PartitionLog.open(log_dir, config, NOW)
    fill(plog, 100)
    plog.delete_records_before(7)
    before = (plog.log_start_offset, plog.log_end_offset, plog.segment_base_offsets)
    content = read_all(plog)
    if not clean:
        plog.flush()  # the log start offset is checkpointed by flush
    plog.close(clean=clean)
    assert (log_dir / CLEAN_SHUTDOWN_FILE).exists() == clean

    reopened = PartitionLog.open(log_dir, config, NOW)
    assert not (log_dir / CLEAN_SHUTDOWN_FILE).exists()
    after = (reopened.log_start_offset, reopened.log_end_offset, reopened.segment_base_offsets)
    assert after == before
    assert read_all(reopened) == content
    result = reopened.append(make_batch(2), NOW)
    assert result.first_offset == before[1]
    reopened.close()


def test_clean_reopen_keeps_index_files_byte_for_byte(log_dir: Path) -> None:
    plog = PartitionLog.open(log_dir, small_config(), NOW)
    fill(plog, 100)
    plog.close()
    files = {p.name: p.read_bytes() for p in log_dir.iterdir() if p.suffix != ".log"}
    PartitionLog.open(log_dir, small_config(), NOW).close()
    assert {p.name: p.read_bytes() for p in log_dir.iterdir() if p.suffix != ".log"} == files
    assert any(len(data) > 0 for name, data in files.items() if name.endswith(INDEX_SUFFIX))


@pytest.mark.parametrize("chop", [1, 12, HEADER_SIZE, HEADER_SIZE + 5, "batch", "batch-1"])
def test_torn_tail_is_truncated_and_appends_continue(log_dir: Path, chop: int | str) -> None:
    config = small_config(segment_bytes=10_000)
    plog = PartitionLog.open(log_dir, config, NOW)
    written = fill(plog, 20)
    plog.close(clean=False)
    last = written[-1]
    cut = {"batch": len(last), "batch-1": len(last) - 1}.get(str(chop), chop)
    assert isinstance(cut, int)
    segment = segment_files(log_dir, LOG_SUFFIX)[-1]
    os.truncate(segment, segment.stat().st_size - cut)

    reopened = PartitionLog.open(log_dir, config, NOW)
    expected_end = headers(bytes(written[-2]))[0].next_offset
    assert reopened.log_end_offset == expected_end
    assert read_all(reopened) == b"".join(written[:-1])
    fresh = make_batch(3)
    assert reopened.append(fresh, NOW).first_offset == expected_end
    assert read_all(reopened) == b"".join(written[:-1]) + fresh
    reopened.close()
    again = PartitionLog.open(log_dir, config, NOW)
    assert again.log_end_offset == expected_end + 3
    again.close()


@pytest.mark.parametrize("victim", [-1, -5])
def test_corrupt_byte_cuts_the_log_at_that_batch(log_dir: Path, victim: int) -> None:
    config = small_config(segment_bytes=10_000)
    plog = PartitionLog.open(log_dir, config, NOW)
    written = fill(plog, 20)
    plog.close(clean=False)
    segment = segment_files(log_dir, LOG_SUFFIX)[-1]
    position = sum(len(b) for b in written[:victim]) + HEADER_SIZE + 3
    data = bytearray(segment.read_bytes())
    data[position] ^= 0xFF
    segment.write_bytes(data)

    reopened = PartitionLog.open(log_dir, config, NOW)
    assert read_all(reopened) == b"".join(written[:victim])
    assert segment.stat().st_size == sum(len(b) for b in written[:victim])
    reopened.close()


def test_corruption_in_an_unflushed_older_segment_drops_everything_after_it(
    log_dir: Path,
) -> None:
    config = small_config()
    plog = PartitionLog.open(log_dir, config, NOW)
    written = fill(plog, 60)
    plog.close(clean=False)  # no flush: no recovery point, every segment is suspect
    assert not (log_dir / RECOVERY_POINT_CHECKPOINT).exists()
    segments = segment_files(log_dir, LOG_SUFFIX)
    victim = segments[2]
    data = bytearray(victim.read_bytes())
    data[-3] ^= 0xFF
    victim.write_bytes(data)

    reopened = PartitionLog.open(log_dir, config, NOW)
    assert segment_files(log_dir, LOG_SUFFIX) == segments[:3]
    content = read_all(reopened)
    assert b"".join(written).startswith(content)
    assert len(content) < sum(len(b) for b in written)
    assert reopened.log_end_offset == headers(content)[-1].next_offset
    reopened.close()


def test_segments_below_the_recovery_point_are_not_rescanned(log_dir: Path) -> None:
    config = small_config()
    plog = PartitionLog.open(log_dir, config, NOW)
    fill(plog, 60)
    plog.flush()
    plog.close(clean=False)
    # Damage a flushed segment's body (not its header): a trusted segment is not re-validated,
    # which is what makes an unclean start cheap.
    segments = segment_files(log_dir, LOG_SUFFIX)
    data = bytearray(segments[0].read_bytes())
    data[HEADER_SIZE + 2] ^= 0xFF
    segments[0].write_bytes(data)
    reopened = PartitionLog.open(log_dir, config, NOW)
    assert segment_files(log_dir, LOG_SUFFIX) == segments
    reopened.close()


@pytest.mark.parametrize("damage", ["delete", "odd_length", "garbage"])
def test_missing_or_corrupt_index_files_are_rebuilt(log_dir: Path, damage: str) -> None:
    config = small_config(segment_bytes=3000, index_interval_bytes=50)
    plog = PartitionLog.open(log_dir, config, NOW)
    fill(plog, 150)
    plog.close()
    originals = {p: p.read_bytes() for p in log_dir.glob("*index")}
    victims = [
        *segment_files(log_dir, INDEX_SUFFIX)[:2],
        *segment_files(log_dir, TIME_INDEX_SUFFIX)[1:3],
    ]
    for path in victims:
        if damage == "delete":
            path.unlink()
        elif damage == "odd_length":
            path.write_bytes(path.read_bytes()[:-3])
        else:
            path.write_bytes(b"\xff" * 24)

    reopened = PartitionLog.open(log_dir, config, NOW)
    for offset in range(reopened.log_end_offset):
        first = headers(reopened.read(offset, 1))[0]
        assert first.base_offset <= offset <= first.last_offset
    assert reopened.offset_for_timestamp(NOW + 75) is not None
    reopened.close()
    assert {p: p.read_bytes() for p in log_dir.glob("*index")} == originals


def test_stale_offset_index_pointing_past_the_log_is_rebuilt(log_dir: Path) -> None:
    config = small_config(segment_bytes=100_000, index_interval_bytes=50)
    plog = PartitionLog.open(log_dir, config, NOW)
    written = fill(plog, 40)
    plog.close()
    segment = segment_files(log_dir, LOG_SUFFIX)[0]
    os.truncate(segment, sum(len(b) for b in written[:30]))  # index now points past the end
    reopened = PartitionLog.open(log_dir, config, NOW)
    assert read_all(reopened) == b"".join(written[:30])
    reopened.close()


def test_log_start_checkpoint_is_written_by_flush(log_dir: Path) -> None:
    plog = PartitionLog.open(log_dir, small_config(), NOW)
    fill(plog, 50)
    plog.delete_records_before(33)
    plog.flush()
    assert (log_dir / LOG_START_OFFSET_CHECKPOINT).read_text().split() == ["0", "33"]
    plog.close(clean=False)
    reopened = PartitionLog.open(log_dir, small_config(), NOW)
    assert reopened.log_start_offset == 33
    reopened.close()


# ------------------------------------------------------------------ deletion / retention


def test_delete_records_before_moves_log_start_and_drops_whole_segments(log_dir: Path) -> None:
    plog = PartitionLog.open(log_dir, small_config(), NOW)
    fill(plog, 100)
    bases = plog.segment_base_offsets
    target = bases[3] + 1
    assert plog.delete_records_before(target) == target
    assert plog.log_start_offset == target
    assert plog.segment_base_offsets == bases[3:]
    assert not (log_dir / f"{bases[0]:020d}.log").exists()
    with pytest.raises(KafkaError) as info:
        plog.read(target - 1, 100)
    assert info.value.code == ErrorCode.offset_out_of_range
    first = headers(plog.read(target, 1))[0]
    assert first.base_offset <= target <= first.last_offset
    assert plog.delete_records_before(2) == target  # never moves back
    with pytest.raises(KafkaError):
        plog.delete_records_before(plog.log_end_offset + 1)
    assert plog.delete_records_before(plog.log_end_offset) == plog.log_end_offset
    assert plog.segment_base_offsets == bases[-1:]
    assert plog.read(plog.log_end_offset, 100) == b""
    plog.close()


def test_retention_by_bytes_deletes_oldest_segments(log_dir: Path) -> None:
    config = small_config(retention_bytes=2000)
    plog = PartitionLog.open(log_dir, config, NOW)
    fill(plog, 100)
    total = plog.size_bytes
    active_base = plog.segment_base_offsets[-1]
    deleted = plog.enforce_retention(NOW)
    assert deleted > 0
    oldest_size = (log_dir / f"{plog.segment_base_offsets[0]:020d}.log").stat().st_size
    # Kafka deletes whole segments only while the log stays at or above retention.bytes.
    assert plog.size_bytes - oldest_size < 2000 <= plog.size_bytes < total
    assert plog.segment_base_offsets[-1] == active_base
    assert plog.log_start_offset == plog.segment_base_offsets[0]
    assert plog.enforce_retention(NOW) == 0
    plog.close()


def test_retention_by_time_keeps_recent_segments(log_dir: Path) -> None:
    config = small_config(retention_ms=10_000)
    plog = PartitionLog.open(log_dir, config, NOW)
    fill(plog, 60, start_ts=NOW)
    first_recent = plog.log_end_offset
    fill(plog, 60, start_ts=NOW + 20_000)
    bases = plog.segment_base_offsets
    # The segment holding the first recent batch has a recent max timestamp: it stays.
    boundary = max(b for b in bases if b <= first_recent)
    deleted = plog.enforce_retention(NOW + 20_000 + 5_000)
    assert deleted == bases.index(boundary)
    assert plog.segment_base_offsets[0] == boundary
    assert plog.log_start_offset == boundary
    assert plog.enforce_retention(NOW + 20_000 + 5_000) == 0
    plog.close()


def test_expired_active_segment_is_rolled_and_deleted(log_dir: Path) -> None:
    config = small_config(retention_ms=1000, segment_bytes=100_000)
    plog = PartitionLog.open(log_dir, config, NOW)
    fill(plog, 10)
    end = plog.log_end_offset
    assert plog.enforce_retention(NOW + 500) == 0
    assert plog.enforce_retention(NOW + 5000) == 1
    assert plog.segment_base_offsets == [end]
    assert plog.log_start_offset == plog.log_end_offset == end
    assert plog.size_bytes == 0
    assert plog.append(make_batch(timestamp=NOW + 5000), NOW + 5000).first_offset == end
    assert plog.enforce_retention(NOW + 5000) == 0
    plog.close()
    reopened = PartitionLog.open(log_dir, config, NOW)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (end, end + 1)
    reopened.close()


def test_retention_forever_deletes_nothing(log_dir: Path) -> None:
    plog = PartitionLog.open(log_dir, small_config(retention_ms=-1), NOW)
    fill(plog, 50)
    assert plog.enforce_retention(NOW + 10**12) == 0
    plog.close()


# ------------------------------------------------------------------ timestamps


def test_offset_for_timestamp_finds_first_batch_at_or_after(log_dir: Path) -> None:
    plog = PartitionLog.open(log_dir, small_config(index_interval_bytes=30), NOW)
    batches = []
    for i in range(80):
        batch = make_batch(2, timestamp=NOW + 10 * i, max_timestamp=NOW + 10 * i + 5)
        plog.append(batch, NOW)
        batches.append(headers(bytes(batch))[0])
    for h in batches:
        for target in (h.max_timestamp - 9, h.max_timestamp):
            assert plog.offset_for_timestamp(target) == (h.base_offset, h.max_timestamp)
    assert plog.offset_for_timestamp(NOW - 1000) == (0, NOW + 5)
    assert plog.offset_for_timestamp(NOW + 10_000) is None
    assert plog.max_timestamp_offset() == (batches[-1].base_offset, batches[-1].max_timestamp)
    plog.close()


def test_offset_for_timestamp_with_out_of_order_timestamps(log_dir: Path) -> None:
    plog = PartitionLog.open(log_dir, small_config(index_interval_bytes=30), NOW)
    stamps = [50, 10, 70, 20, 90, 30, 60]
    for ts in stamps:
        plog.append(make_batch(timestamp=NOW + ts), NOW)
    for target in range(0, 100, 5):
        expected = next(
            ((i, NOW + ts) for i, ts in enumerate(stamps) if NOW + ts >= NOW + target), None
        )
        assert plog.offset_for_timestamp(NOW + target) == expected
    assert plog.max_timestamp_offset() == (4, NOW + 90)
    plog.close()


def test_offset_for_timestamp_skips_records_below_log_start(log_dir: Path) -> None:
    plog = PartitionLog.open(log_dir, LogConfig(), NOW)
    for i in range(10):
        plog.append(make_batch(timestamp=NOW + i), NOW)
    plog.delete_records_before(5)
    assert plog.offset_for_timestamp(NOW) == (5, NOW + 5)
    plog.close()


# ------------------------------------------------------------------ concurrency / lifecycle


def test_flush_thread_concurrent_with_appends_rolls_and_retention(log_dir: Path) -> None:
    config = small_config(segment_bytes=400, retention_bytes=6000)
    plog = PartitionLog.open(log_dir, config, NOW)
    stop = threading.Event()
    errors: list[BaseException] = []
    flushes = 0

    def flusher() -> None:
        nonlocal flushes
        while not stop.is_set():
            try:
                plog.flush()
                flushes += 1
            except BaseException as exc:
                errors.append(exc)
                return

    thread = threading.Thread(target=flusher)
    thread.start()
    try:
        for round_ in range(40):
            fill(plog, 25)
            plog.enforce_retention(NOW)
            if round_ % 10 == 9:
                plog.delete_records_before(plog.log_end_offset - 5)
    finally:
        stop.set()
        thread.join()
    assert errors == []
    assert flushes > 0
    content = read_all(plog)
    state = (plog.log_start_offset, plog.log_end_offset, plog.segment_base_offsets)
    plog.flush()
    plog.close(clean=False)
    reopened = PartitionLog.open(log_dir, config, NOW)
    assert (
        reopened.log_start_offset,
        reopened.log_end_offset,
        reopened.segment_base_offsets,
    ) == state
    assert read_all(reopened) == content
    reopened.close()


def test_stray_files_from_interrupted_work_are_removed(log_dir: Path) -> None:
    plog = PartitionLog.open(log_dir, small_config(), NOW)
    fill(plog, 30)
    plog.close()
    (log_dir / f"{10**9:020d}.index").write_bytes(b"")
    (log_dir / "log-start-offset-checkpoint.tmp").write_text("junk")
    reopened = PartitionLog.open(log_dir, small_config(), NOW)
    assert not (log_dir / f"{10**9:020d}.index").exists()
    assert not (log_dir / "log-start-offset-checkpoint.tmp").exists()
    reopened.close()


def test_closed_log_refuses_work_and_delete_removes_directory(log_dir: Path) -> None:
    plog = PartitionLog.open(log_dir, LogConfig(), NOW)
    plog.append(make_batch(), NOW)
    plog.delete()
    assert not log_dir.exists()
    with pytest.raises(KafkaError):
        plog.append(make_batch(), NOW)
    plog.flush()  # a late GroupCommit round on a deleted log is harmless


def test_log_config_from_kafka_names() -> None:
    config = LogConfig.from_topic_configs(
        {"segment.bytes": "1024", "retention.ms": -1, "cleanup.policy": "delete"}
    )
    assert (config.segment_bytes, config.retention_ms) == (1024, -1)
    assert config.retention_bytes == -1 and config.max_message_bytes == 1048588


# ------------------------------------------------ truncation (undoing a failed write)


def batch_offsets(plog: PartitionLog) -> list[int]:
    return [h.base_offset for h in headers(read_all(plog))]


@pytest.mark.parametrize("clean", [True, False])
def test_truncate_to_cuts_the_active_segment_and_appends_continue(
    log_dir: Path, clean: bool
) -> None:
    config = small_config(segment_bytes=100_000, index_interval_bytes=60)
    plog = PartitionLog.open(log_dir, config, NOW)
    written = fill(plog, 20)
    cut = batch_offsets(plog)[12]
    plog.truncate_to(cut)
    assert plog.log_end_offset == cut
    assert read_all(plog) == b"".join(written[:12])
    # Index entries pointing past the cut are gone: every remaining offset reads back.
    for offset in range(cut):
        first = headers(plog.read(offset, 1))[0]
        assert first.base_offset <= offset <= first.last_offset
    fresh = make_batch(2)
    assert plog.append(fresh, NOW).first_offset == cut
    plog.flush()
    plog.close(clean=clean)
    reopened = PartitionLog.open(log_dir, config, NOW)
    assert read_all(reopened) == b"".join(written[:12]) + fresh
    reopened.close()


def test_truncate_to_across_segments_deletes_later_ones_and_survives_a_crash(
    log_dir: Path,
) -> None:
    plog = PartitionLog.open(log_dir, small_config(), NOW)
    written = fill(plog, 40)
    plog.flush()  # the recovery point names a segment the truncation deletes
    bases = plog.segment_base_offsets
    assert len(bases) >= 4
    offsets = batch_offsets(plog)
    cut_index = next(i for i, o in enumerate(offsets) if o > bases[1]) + 1
    cut = offsets[cut_index]
    assert bases[1] < cut < bases[2]
    plog.truncate_to(cut)
    assert plog.segment_base_offsets == bases[:2]
    assert sorted(p.name for p in segment_files(log_dir, LOG_SUFFIX)) == [
        f"{b:020d}.log" for b in bases[:2]
    ]
    assert plog.log_end_offset == cut
    more = fill(plog, 10, start_ts=NOW + 1000)
    expected = b"".join(written[:cut_index]) + b"".join(more)
    assert read_all(plog) == expected
    plog.flush()
    plog.close(clean=False)
    reopened = PartitionLog.open(log_dir, small_config(), NOW)
    assert read_all(reopened) == expected
    reopened.close()


def test_truncate_to_recomputes_the_max_timestamp(log_dir: Path) -> None:
    plog = PartitionLog.open(log_dir, small_config(segment_bytes=100_000), NOW)
    fill(plog, 5)
    cut = plog.log_end_offset
    plog.append(make_batch(timestamp=NOW + 10_000), NOW)
    assert plog.offset_for_timestamp(NOW + 10_000) is not None
    plog.truncate_to(cut)
    assert plog.offset_for_timestamp(NOW + 10_000) is None
    assert plog.max_timestamp_offset() == (batch_offsets(plog)[-1], NOW + 4)
    plog.close()


def test_truncate_to_removes_the_leftovers_of_a_failed_append(log_dir: Path) -> None:
    plog = PartitionLog.open(log_dir, small_config(segment_bytes=100_000), NOW)
    written = fill(plog, 5)
    segment = segment_files(log_dir, LOG_SUFFIX)[-1]
    size = segment.stat().st_size
    with segment.open("r+b") as f:  # a partial batch the failed append left behind
        f.seek(size)
        f.write(bytes(make_batch(3))[:40])
    plog.truncate_to(plog.log_end_offset)
    assert segment.stat().st_size == size
    plog.close(clean=False)
    reopened = PartitionLog.open(log_dir, small_config(segment_bytes=100_000), NOW)
    assert read_all(reopened) == b"".join(written)
    reopened.close()


def test_truncate_to_inside_a_batch_is_refused(log_dir: Path) -> None:
    plog = PartitionLog.open(log_dir, small_config(segment_bytes=100_000), NOW)
    plog.append(make_batch(4), NOW)
    with pytest.raises(ValueError, match="not at its start"):
        plog.truncate_to(2)
    assert plog.log_end_offset == 4
    plog.close()


# ------------------------------------------------ replacing a run of segments


def _concatenated(log_dir: Path, bases: list[int], name: str) -> Path:
    path = log_dir / name
    path.write_bytes(b"".join((log_dir / f"{b:020d}.log").read_bytes() for b in bases))
    return path


def test_replace_closed_segments_merges_a_run_into_one(log_dir: Path) -> None:
    plog = PartitionLog.open(log_dir, small_config(), NOW)
    fill(plog, 40)
    content = read_all(plog)
    bases = plog.segment_base_offsets
    run = bases[:3]
    cleaned = _concatenated(log_dir, run, f"{run[0]:020d}.log.cleaned")
    plog.replace_closed_segments(run, cleaned, NOW)
    assert plog.segment_base_offsets == [run[0], *bases[3:]]
    assert read_all(plog) == content
    assert not list(log_dir.glob("*.swap")) and not cleaned.exists()
    plog.close(clean=False)
    reopened = PartitionLog.open(log_dir, small_config(), NOW)
    assert reopened.segment_base_offsets == [run[0], *bases[3:]]
    assert read_all(reopened) == content
    reopened.close()


def test_replace_closed_segments_refuses_the_active_segment(log_dir: Path) -> None:
    plog = PartitionLog.open(log_dir, small_config(), NOW)
    fill(plog, 20)
    bases = plog.segment_base_offsets
    cleaned = _concatenated(log_dir, bases[-2:], "x.cleaned")
    with pytest.raises(KafkaError):
        plog.replace_closed_segments(bases[-2:], cleaned, NOW)
    plog.close()


@pytest.mark.parametrize("deleted_before_crash", [0, 1, 3])
def test_open_finishes_a_segment_swap_a_crash_interrupted(
    log_dir: Path, deleted_before_crash: int
) -> None:
    plog = PartitionLog.open(log_dir, small_config(), NOW)
    fill(plog, 40)
    content = read_all(plog)
    bases = plog.segment_base_offsets
    run, limit = bases[:3], bases[3]
    plog.close()
    # The swap file was written and named; the crash came while old files were removed.
    _concatenated(log_dir, run, f"{run[0]:020d}.{limit:020d}.swap")
    for base in run[:deleted_before_crash]:
        for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX):
            (log_dir / f"{base:020d}{suffix}").unlink()
    reopened = PartitionLog.open(log_dir, small_config(), NOW)
    assert reopened.segment_base_offsets == [run[0], *bases[3:]]
    assert read_all(reopened) == content
    assert not list(log_dir.glob("*.swap"))
    reopened.close()


# ------------------------------------------------------------------ property


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    specs=st.lists(st.tuples(st.integers(1, 6), st.integers(0, 300)), min_size=1, max_size=60),
    segment_bytes=st.integers(400, 3000),
    index_interval=st.integers(1, 500),
)
def test_any_append_sequence_reads_back_and_survives_reopen(
    tmp_path: Path, specs: list[tuple[int, int]], segment_bytes: int, index_interval: int
) -> None:
    directory = tmp_path / f"p-{len(list(tmp_path.iterdir()))}"
    config = small_config(segment_bytes=segment_bytes, index_interval_bytes=index_interval)
    plog = PartitionLog.open(directory, config, NOW)
    written = []
    for records, payload in specs:
        batch = make_batch(records, payload=payload)
        plog.append(batch, NOW)
        written.append(batch)
    expected = b"".join(written)
    assert read_all(plog) == expected
    for offset in range(0, plog.log_end_offset, 3):
        first = headers(plog.read(offset, 1))[0]
        assert first.base_offset <= offset <= first.last_offset
    plog.close(clean=False)
    reopened = PartitionLog.open(directory, config, NOW)
    assert read_all(reopened) == expected
    reopened.close()


def test_a_segment_roll_the_disk_refuses_leaves_the_active_segment_writable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    from persister import file_log as log_module

    plog = PartitionLog.open(tmp_path / "p", LogConfig(segment_bytes=300, retention_ms=-1), NOW)
    plog.append(make_batch(payload=200), NOW)
    real_create = log_module.LogSegment.create

    def no_space(*args: object, **kwargs: object) -> object:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(log_module.LogSegment, "create", no_space)
    with pytest.raises(KafkaError) as refused:
        plog.append(make_batch(payload=200), NOW)  # needs a new segment
    assert refused.value.code == ErrorCode.kafka_storage_error
    assert plog.log_end_offset == 1
    assert plog.segment_base_offsets == [0]

    monkeypatch.setattr(log_module.LogSegment, "create", real_create)
    plog.append(make_batch(payload=200), NOW)
    assert plog.log_end_offset == 2
    assert plog.segment_base_offsets == [0, 1]
    assert [h.base_offset for h in headers(plog.read(0, 10_000))] == [0]
    assert [h.base_offset for h in headers(plog.read(1, 10_000))] == [1]
    plog.close()
