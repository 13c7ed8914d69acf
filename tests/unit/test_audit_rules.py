"""The audit's pure parts (persister.spark.audit), without Spark: scanning a segment's
bytes, each per-key rule, the replay comparison and the per-partition figures."""

from __future__ import annotations

import json
import struct
import uuid
from collections import defaultdict
from pathlib import Path

from persister.share_records import (
    ShareKey,
    ShareRecord,
    ShareSnapshot,
    ShareTombstone,
    ShareUpdate,
    StateBatch,
    encode,
)
from persister.spark import audit
from persister.spark.audit import (
    CRC_AND_FRAMING,
    DELIVERY_COUNT_WITHIN_LIMIT,
    DELIVERY_STATE_KNOWN,
    OFFSETS_IN_TOPIC_LOG,
    REPLAY_EQUIVALENT,
    START_OFFSET_MONOTONIC,
    STATE_BATCHES_ORDERED,
    STATE_EPOCH_MONOTONIC,
    DataDirContext,
    KeyContext,
)
from persister.spark.findings import LogRecord, Violation
from protocol.records import CRC_OFFSET, NewRecord, build_batch

TOPIC = uuid.UUID(int=7)
KEY = ShareKey("g1", TOPIC, 3)
SEGMENT = "00000000000000000000.log"
CONTEXT = KeyContext(topic="orders", log_start_offset=0, log_end_offset=100)


def snap(state_epoch: int = 0, start: int = 0, *batches: StateBatch) -> ShareSnapshot:
    return ShareSnapshot(KEY, 0, state_epoch, -1, start, 1, 1, tuple(batches))


def upd(start: int = -1, *batches: StateBatch) -> ShareUpdate:
    return ShareUpdate(KEY, 0, -1, start, tuple(batches))


def rows(*records: ShareRecord, source: str = audit.SOURCE_LOG) -> list[LogRecord]:
    """Records at offsets 0, 1, 2, ... of one segment."""
    return [audit.log_record(source, SEGMENT, 0, i, r) for i, r in enumerate(records)]


def where(violations: list[Violation]) -> list[tuple[str, str | None, int | None, int | None]]:
    return [(v.rule, v.group_id, v.partition, v.offset) for v in violations]


# ------------------------------------------------------------------ scanning bytes


def segment_bytes(*records: ShareRecord) -> bytearray:
    """One batch per record, at offsets 0, 1, 2, ..."""
    out = bytearray()
    for i, record in enumerate(records):
        out += build_batch([NewRecord(*encode(record))], base_offset=i)
    return out


def test_scan_of_a_sound_segment_yields_every_record_with_its_position() -> None:
    data = segment_bytes(snap(0, 0), upd(5), ShareTombstone(KEY))
    got = list(audit.scan_segment(bytes(data), SEGMENT))
    assert all(isinstance(r, LogRecord) for r in got)
    assert [(r.offset, r.record_type, r.segment) for r in got] == [  # type: ignore[union-attr]
        (0, "snapshot", SEGMENT),
        (1, "update", SEGMENT),
        (2, "tombstone", SEGMENT),
    ]
    assert got[1].byte_position == len(segment_bytes(snap(0, 0)))  # type: ignore[union-attr]


def test_a_bad_crc_is_a_violation_at_its_batch_and_the_batches_after_it_still_read() -> None:
    data = segment_bytes(snap(0, 0), upd(5), upd(6))
    second = len(segment_bytes(snap(0, 0)))
    data[second + CRC_OFFSET] ^= 0xFF  # the stored CRC of the batch at offset 1
    got = list(audit.scan_segment(bytes(data), SEGMENT))
    bad = [v for v in got if isinstance(v, Violation)]
    assert where(bad) == [(CRC_AND_FRAMING, "g1", 3, 1)]
    assert bad[0].byte_position == second and "CRC32C" in bad[0].message
    assert [r.offset for r in got if isinstance(r, LogRecord)] == [0, 2]


def test_a_truncated_last_batch_is_a_violation_naming_its_key_and_offset() -> None:
    data = segment_bytes(snap(0, 0), upd(5, StateBatch(5, 9, 0, 1)))
    got = list(audit.scan_segment(bytes(data[:-7]), SEGMENT))
    bad = [v for v in got if isinstance(v, Violation)]
    assert where(bad) == [(CRC_AND_FRAMING, "g1", 3, 1)]
    assert "truncated" in bad[0].message
    assert [r.offset for r in got if isinstance(r, LogRecord)] == [0]


def test_trailing_bytes_shorter_than_a_header_are_a_torn_write() -> None:
    data = segment_bytes(snap(0, 0)) + b"\x00" * 10
    bad = [v for v in audit.scan_segment(bytes(data), SEGMENT) if isinstance(v, Violation)]
    assert [(v.rule, v.byte_position) for v in bad] == [(CRC_AND_FRAMING, len(data) - 10)]


def test_an_incomplete_batch_at_the_end_of_the_segment_a_broker_is_writing_is_no_violation() -> (
    None
):
    # With a broker running on the data dir, the newest segment's end may be a write in
    # progress; the same bytes in any other segment are damage (the tests above).
    data = segment_bytes(snap(0, 0), upd(5, StateBatch(5, 9, 0, 1)))
    for tail in (bytes(data[:-7]), bytes(segment_bytes(snap(0, 0)) + b"\x00" * 10)):
        got = list(audit.scan_segment(tail, SEGMENT, writing=True))
        assert [type(r) for r in got] == [LogRecord]
    # A bad CRC in a whole batch is damage even there.
    whole = bytearray(data)
    whole[CRC_OFFSET] ^= 0xFF
    got = list(audit.scan_segment(bytes(whole), SEGMENT, writing=True))
    assert [v.rule for v in got if isinstance(v, Violation)] == [CRC_AND_FRAMING]


def test_a_record_that_is_not_a_share_state_record_is_a_framing_violation() -> None:
    data = bytes(build_batch([NewRecord(b"\x00\x07garbage", b"x")], base_offset=4))
    bad = list(audit.scan_segment(data, SEGMENT))
    assert [(v.rule, v.offset) for v in bad] == [(CRC_AND_FRAMING, 4)]  # type: ignore[union-attr]


def test_a_garbled_batch_length_stops_the_scan_with_a_violation_not_a_crash() -> None:
    data = segment_bytes(snap(0, 0), upd(5))
    second = len(segment_bytes(snap(0, 0)))
    struct.pack_into(">i", data, second + 8, 3)  # batch_length smaller than a header
    got = list(audit.scan_segment(bytes(data), SEGMENT))
    assert [type(x).__name__ for x in got] == ["LogRecord", "Violation"]


# ------------------------------------------------------------------ per-key rules


def test_state_epoch_going_back_is_flagged_at_the_record() -> None:
    records = rows(snap(3, 0), upd(4), snap(2, 4))
    assert where(audit.check_state_epochs(records)) == [(STATE_EPOCH_MONOTONIC, "g1", 3, 2)]


def test_state_epoch_may_start_afresh_after_a_tombstone() -> None:
    assert audit.check_state_epochs(rows(snap(3, 0), ShareTombstone(KEY), snap(0, 0))) == []


def test_start_offset_back_without_a_new_state_epoch_is_flagged() -> None:
    records = rows(snap(1, 10), upd(20), upd(15))
    assert where(audit.check_start_offsets(records)) == [(START_OFFSET_MONOTONIC, "g1", 3, 2)]


def test_start_offset_back_with_a_new_state_epoch_is_a_reset_not_a_violation() -> None:
    assert audit.check_start_offsets(rows(snap(1, 10), upd(20), snap(2, 0), upd(-1))) == []


def test_overlapping_state_batches_are_flagged() -> None:
    records = rows(snap(0, 0, StateBatch(0, 5, 2, 1), StateBatch(5, 8, 0, 1)))
    got = audit.check_batches(records)
    assert where(got) == [(STATE_BATCHES_ORDERED, "g1", 3, 0)] and "overlaps" in got[0].message


def test_unordered_state_batches_are_flagged() -> None:
    records = rows(snap(0, 0), upd(-1, StateBatch(10, 12, 2, 1), StateBatch(3, 4, 2, 1)))
    got = audit.check_batches(records)
    assert where(got) == [(STATE_BATCHES_ORDERED, "g1", 3, 1)] and "out of order" in got[0].message


def test_a_state_batch_below_the_start_offset_in_force_is_flagged() -> None:
    # The update leaves the start offset unchanged (-1): the snapshot's 10 is in force.
    records = rows(snap(0, 10), upd(-1, StateBatch(8, 12, 2, 1)))
    got = audit.check_batches(records)
    assert where(got) == [(STATE_BATCHES_ORDERED, "g1", 3, 1)] and "below" in got[0].message


def test_sound_state_batches_pass() -> None:
    records = rows(snap(0, 0, StateBatch(0, 4, 2, 1)), upd(5, StateBatch(5, 7, 0, 2)))
    assert audit.check_batches(records) == []


def test_an_unknown_delivery_state_is_flagged_and_the_stored_ones_pass() -> None:
    records = rows(
        snap(0, 0, StateBatch(0, 1, 0, 1), StateBatch(2, 3, 2, 1), StateBatch(4, 5, 4, 5)),
        upd(-1, StateBatch(6, 6, 1, 1)),
        upd(-1, StateBatch(7, 7, 3, 5)),  # Archiving (KIP-1191) is stored too
    )
    assert where(audit.check_delivery_states(records)) == [(DELIVERY_STATE_KNOWN, "g1", 3, 1)]


def test_a_delivery_count_over_the_groups_limit_is_flagged_naming_the_limit() -> None:
    context = KeyContext(delivery_count_limit=3, limit_source="group config")
    records = rows(snap(0, 0, StateBatch(0, 1, 4, 3)), upd(-1, StateBatch(2, 2, 0, 4)))
    got = audit.check_delivery_counts(records, context)
    assert where(got) == [(DELIVERY_COUNT_WITHIN_LIMIT, "g1", 3, 1)]
    assert "share.delivery.count.limit 3, group config" in got[0].message


def test_offsets_past_the_topic_log_end_are_flagged() -> None:
    records = rows(snap(0, 0), upd(101), upd(-1, StateBatch(100, 100, 0, 1)))
    got = audit.check_topic_offsets(records, CONTEXT)
    assert where(got) == [(OFFSETS_IN_TOPIC_LOG, "g1", 3, 1), (OFFSETS_IN_TOPIC_LOG, "g1", 3, 2)]
    assert "log end offset 100 of orders-3" in got[0].message


def test_a_start_offset_at_the_log_end_is_in_the_log() -> None:
    assert audit.check_topic_offsets(rows(snap(0, 100)), CONTEXT) == []


def test_live_state_of_an_unknown_topic_is_flagged_but_deleted_state_is_not() -> None:
    unknown = KeyContext()
    got = audit.check_topic_offsets(rows(snap(0, 0), upd(3)), unknown)
    assert where(got) == [(OFFSETS_IN_TOPIC_LOG, "g1", 3, 1)]
    assert audit.check_topic_offsets(rows(snap(0, 0), ShareTombstone(KEY)), unknown) == []


def test_replay_from_the_newest_snapshot_equals_the_full_replay_of_a_sound_log() -> None:
    records = rows(
        upd(2, StateBatch(2, 3, 2, 1)),
        snap(0, 0, StateBatch(0, 4, 0, 1)),
        upd(1, StateBatch(1, 2, 2, 1)),
        upd(-1, StateBatch(3, 3, 4, 2)),
    )
    assert audit.check_replay_equivalent(records, None) == []


def test_compacted_output_that_replays_differently_is_flagged_at_its_record() -> None:
    original = rows(snap(0, 0), upd(5, StateBatch(5, 6, 2, 1)))
    compacted = [audit.log_record(audit.SOURCE_COMPACTED, "compacted-1/x.log", 0, 1, snap(0, 5))]
    got = audit.check_replay_equivalent(original, compacted)
    assert [(v.rule, v.segment, v.offset) for v in got] == [
        (REPLAY_EQUIVALENT, "compacted-1/x.log", 1)
    ]
    assert "0 state batches" in got[0].message and "1 state batches" in got[0].message


def test_compacted_output_that_replays_the_same_passes() -> None:
    original = rows(snap(0, 0), upd(5, StateBatch(5, 6, 2, 1)))
    folded = audit.fold(original)
    assert folded is not None
    compacted = [audit.log_record(audit.SOURCE_COMPACTED, "c/x.log", 0, 1, folded)]
    assert audit.check_replay_equivalent(original, compacted) == []


# ------------------------------------------------------------------ figures and limits


def test_partition_stats_count_outcomes_histogram_and_lag() -> None:
    records = rows(
        snap(0, 10),
        upd(
            -1,
            StateBatch(10, 13, 2, 1),  # 4 accepted
            StateBatch(14, 14, 4, 5),  # 1 archived
            StateBatch(15, 16, 0, 2),  # 2 released, redelivered
        ),
    )
    stats = audit.partition_stats(("g1", str(TOPIC), 3), records, CONTEXT)
    assert (stats["accepted"], stats["archived"], stats["released"], stats["redelivered"]) == (
        4,
        1,
        2,
        3,
    )
    assert stats["delivery_count_histogram"] == {"1": 4, "2": 2, "5": 1}
    assert stats["lag"] == 100 - 10 - 5


def test_partition_stats_count_dead_lettered_offsets_next_to_archived_ones() -> None:
    records = rows(
        snap(0, 10),
        upd(-1, StateBatch(10, 11, 4, 5)),  # archived without a dead-letter topic
        upd(-1, StateBatch(12, 15, 3, 5), StateBatch(16, 16, 3, 2)),  # -> Archiving
        upd(-1, StateBatch(12, 14, 4, 5)),  # copies durable: archived
        upd(-1, StateBatch(16, 16, 4, 2)),
        upd(-1, StateBatch(17, 17, 3, 1)),  # rejected, its copy not written yet
    )
    stats = audit.partition_stats(("g1", str(TOPIC), 3), records, CONTEXT)
    assert (stats["archived"], stats["dead_lettered"], stats["archiving"]) == (6, 4, 2)
    assert stats["lag"] == 100 - 10 - 6  # archiving offsets are not done
    # A reset (a new state epoch) delivers the offsets anew: their past does not count.
    reset = rows(*(r.share for r in records), snap(1, 10, StateBatch(12, 12, 4, 1)))
    assert audit.partition_stats(("g1", str(TOPIC), 3), reset, CONTEXT)["dead_lettered"] == 0


def test_the_delivery_count_limit_is_the_groups_then_the_brokers_then_kafkas_default() -> None:
    ctx = DataDirContext(
        broker_configs={"group.share.delivery.count.limit": "7"}, group_limits={"g1": 3}
    )
    assert ctx.delivery_count_limit("g1") == (3, "group config")
    assert ctx.delivery_count_limit("g2") == (7, "broker config group.share.delivery.count.limit")
    assert DataDirContext().delivery_count_limit("g2") == (5, "Kafka default")


def test_only_a_local_master_pins_the_spark_driver_to_loopback() -> None:
    from persister.spark.segments import is_local_master

    assert is_local_master("local[*]") and is_local_master("local") and is_local_master("local[2]")
    assert not is_local_master("spark://spark-master:7077")
    assert not is_local_master(None)  # spark-submit's own --master and driver settings


# ------------------------------------------------------------------ the Spark job's steps


def _scan_then_check(
    tasks: list[audit.ScanTask], ctx: DataDirContext
) -> tuple[list[Violation], list[tuple[str, object]]]:
    """run_audit's steps in-process: `scan_keys` per file, grouped by key in no
    particular order (as the shuffle leaves them), `check_group` per key."""
    groups: dict[object, list[object]] = defaultdict(list)
    for index, task in reversed(list(enumerate(tasks))):
        for key, value in audit.scan_keys(index, task):
            groups[key].append(value)
    results = [
        r
        for key, parts in groups.items()
        for r in audit.check_group((key, parts), tasks, ctx, None, True)  # type: ignore[arg-type]
    ]
    framing = audit.in_scan_order(p for tag, p in results if tag == "framing")
    return framing, [(tag, p) for tag, p in results if tag != "framing"]


def test_scanning_by_key_then_decoding_finds_what_scanning_each_file_does(tmp_path: Path) -> None:
    """The job shuffles undecoded records: a record that does not decode, a bad batch,
    each key's rule violations, figures and table rows come out as `scan_segment` and
    the per-key rules over its records give them, framing in scan order."""
    from persister.spark.report import record_row

    other = ShareKey("g2", TOPIC, 0)
    key_bytes, value = encode(upd(7))
    assert value is not None
    first = segment_bytes(snap(0, 0), upd(5), ShareUpdate(other, 0, -1, 2, ()))
    # A batch whose first record has no key and whose second does not decode.
    first += build_batch([NewRecord(None, b"x"), NewRecord(key_bytes, value[:-3])], base_offset=3)
    first += build_batch([NewRecord(*encode(upd(3)))], base_offset=5)  # start offset back
    crc_at = len(first)
    first += build_batch([NewRecord(*encode(upd(9)))], base_offset=6)
    first[crc_at + CRC_OFFSET] ^= 0xFF
    second = build_batch([NewRecord(key_bytes, value[:-2])], base_offset=7)
    second += build_batch([NewRecord(*encode(upd(8)))], base_offset=8)
    second += build_batch([NewRecord(*encode(ShareTombstone(other)))], base_offset=9)[:-5]
    names = [f"{0:020d}.log", f"{7:020d}.log"]
    for name, data in zip(names, (first, second), strict=True):
        (tmp_path / name).write_bytes(bytes(data))
    tasks = [audit.ScanTask(str(tmp_path / n), n, audit.SOURCE_LOG, False) for n in names]
    bounds = {("orders", 3): (0, 100), ("orders", 0): (0, 100)}
    ctx = DataDirContext(topics={str(TOPIC): ("orders", 4)}, bounds=bounds)

    framing, results = _scan_then_check(tasks, ctx)

    scanned = [x for t in tasks for x in audit.scan_file(t.path, t.segment, t.source)]
    expected_framing = [x for x in scanned if isinstance(x, Violation)]
    assert [(v.segment, v.offset) for v in expected_framing] == [
        (names[0], 3),
        (names[0], 4),
        (names[0], 6),
        (names[1], 7),
        (names[1], 9),
    ]
    assert framing == expected_framing
    records = [x for x in scanned if isinstance(x, LogRecord)]
    expected = [
        r
        for key in (KEY, other)
        for r in audit._audit_key(
            (
                (key.group_id, str(key.topic_id), key.partition),
                [x for x in records if x.group_id == key.group_id],
            ),
            ctx,
            None,
        )
    ]
    got_rows = [p for tag, p in results if tag == "row"]
    assert sorted(map(repr, got_rows)) == sorted(repr(record_row(r)) for r in records)
    checked = [(tag, p) for tag, p in results if tag != "row"]
    assert sorted(map(repr, checked)) == sorted(map(repr, expected))
    violations = [v for tag, v in checked if isinstance(v, Violation)]
    assert where(violations) == [(START_OFFSET_MONOTONIC, "g1", 3, 5)]


def test_the_replay_from_the_last_reset_is_redone_when_the_full_replays_state_there_differs() -> (
    None
):
    """check_key takes the replay of what a compaction keeps from the full replay only
    when the newest reset leaves the same state either way; otherwise it replays it."""
    records = rows(upd(2, StateBatch(2, 3, 2, 1)), snap(0, 0, StateBatch(0, 4, 0, 1)), upd(6))
    states = audit.key_states(records)
    assert audit.check_replay_equivalent(records, None, states) == []
    # States that say the snapshot left something else: the suffix is replayed itself.
    wrong = [*states[:2], snap(1, 1), snap(1, 6)]
    got = audit.check_replay_equivalent(records, None, wrong)
    assert [(v.rule, v.offset) for v in got] == [(REPLAY_EQUIVALENT, 2)]
    assert "state epoch 0, start offset 6" in got[0].message  # the suffix's own replay
    assert "state epoch 1, start offset 6" in got[0].message  # the full replay's


def test_the_audit_takes_the_clusters_broker_configs_and_a_brokers_own() -> None:
    """The metadata log holds the cluster-wide dynamic broker configs and a broker's own
    (a record naming its node): neither hides the other."""
    records = [
        {"type": "broker_config", "configs": {"group.share.delivery.count.limit": "7"}},
        {"type": "broker_config", "configs": {"num.partitions": "3"}, "node": "1"},
    ]
    ctx = audit.build_context(
        [(b"k", json.dumps(r).encode()) for r in records], [], lambda topic, p: (0, 0)
    )
    assert ctx.broker_configs == {"group.share.delivery.count.limit": "7", "num.partitions": "3"}
    assert ctx.delivery_count_limit("g") == (7, "broker config group.share.delivery.count.limit")
