"""`spool audit` on Spark: a log a real broker wrote under share traffic passes every
check; each kind of damage fails the rule it breaks, naming the key and the position.

The damaged logs are written with spool's own encoder (persister.share_records) into
a data dir laid out as the broker lays it out (meta/, groups/, topics/, share-state/);
CRC and truncation damage is done to the bytes afterwards.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import AcknowledgeType, Message
from pyspark.sql import SparkSession

from broker.cli import main as spool_main
from coordinator import group_records
from coordinator.group_config import GroupConfigRecord
from persister.coordinator_log import internal_log_config
from persister.file_log import PartitionLog
from persister.share_records import (
    ShareKey,
    ShareRecord,
    ShareSnapshot,
    ShareUpdate,
    StateBatch,
    encode,
)
from persister.spark import audit
from persister.spark.audit import run_audit
from persister.spark.findings import AuditResult, LogRecord
from protocol.records import CRC_START, NewRecord, build_batch
from tests.integration.conftest import REPO_ROOT, Broker, create_topic, watermarks
from tests.integration.share_helpers import (
    close_quietly,
    consume,
    earliest,
    produce_values,
    set_group_configs,
    share_consumer,
)

NOW = 1_700_000_000_000
DLQ = "dlq.audited"
TOPIC_ID = uuid.UUID(int=42)
TOPIC = "orders"
TOPIC_RECORDS = 50
KEY = ShareKey("g1", TOPIC_ID, 1)
SEGMENT = f"{0:020d}.log"


# ------------------------------------------------------------------ writing data dirs


def _write_log(directory: Path, records: list[tuple[bytes | None, bytes | None]]) -> None:
    """One batch per record, at offsets 0, 1, 2, ... (as the coordinator logs hold them)."""
    plog = PartitionLog.open(directory, internal_log_config(), NOW)
    try:
        for key, value in records:
            plog.append(bytearray(build_batch([NewRecord(key, value)])), NOW)
    finally:
        plog.close()


def write_data_dir(
    root: Path, share: list[ShareRecord], group_limits: dict[str, str] | None = None
) -> Path:
    """A data dir: topic `orders` (2 partitions of TOPIC_RECORDS records each) in the
    metadata log, group configs in the groups log, and `share` in the share-state log."""
    topic = {"type": "topic", "name": TOPIC, "topic_id": str(TOPIC_ID), "partitions": 2}
    _write_log(root / "meta", [(f"topic:{TOPIC}".encode(), json.dumps(topic).encode())])
    configs = [
        GroupConfigRecord(group, audit.GROUP_LIMIT_KEY, value)
        for group, value in (group_limits or {}).items()
    ]
    _write_log(root / "groups", [kv for c in configs for kv in group_records.encode(c)])
    for p in range(2):
        _write_log(
            root / "topics" / f"{TOPIC}-{p}", [(None, b"v%d" % i) for i in range(TOPIC_RECORDS)]
        )
    _write_log(root / "share-state", [encode(r) for r in share])
    return root


def snap(state_epoch: int, start: int, *batches: StateBatch, key: ShareKey = KEY) -> ShareSnapshot:
    return ShareSnapshot(key, 0, state_epoch, 0, start, NOW, NOW, tuple(batches))


def upd(start: int, *batches: StateBatch, key: ShareKey = KEY) -> ShareUpdate:
    return ShareUpdate(key, 0, -1, start, tuple(batches))


# A sound history of KEY (offsets 0..3) and of another key, which every damaged log
# keeps, so each test also shows the damage is pinned to the right key.
OTHER = ShareKey("g2", TOPIC_ID, 0)
SOUND: list[ShareRecord] = [
    snap(1, 0),
    upd(0, StateBatch(0, 4, 2, 1)),
    snap(1, 0, StateBatch(0, 1, 4, 1), key=OTHER),
    upd(5, StateBatch(5, 7, 0, 2), StateBatch(8, 9, 2, 1)),
]
BAD_OFFSET = len(SOUND)  # where each test's damaging record lands


def share_segment(data_dir: Path) -> Path:
    return data_dir / "share-state" / SEGMENT


def audit_dir(spark: SparkSession, data_dir: Path, tmp_path: Path) -> AuditResult:
    """The audit without its Parquet tables (test_reports_and_tables_are_written reads
    those): the checks and reports are the same, in a third of the time."""
    return run_audit(spark, data_dir, tmp_path / "out", tables=False)


def assert_fails_at(result: AuditResult, rule: str, key: ShareKey, offset: int) -> None:
    failed = [c["rule"] for c in result.checks if not c["passed"]]
    assert rule in failed, (rule, failed, result.violations)
    hits = [v for v in result.violations if v.rule == rule]
    assert [(v.group_id, v.topic_id, v.partition, v.segment, v.offset) for v in hits] == [
        (key.group_id, str(key.topic_id), key.partition, SEGMENT, offset)
    ], hits
    assert hits[0].topic == TOPIC
    assert audit.exit_code(result) == 1


# ------------------------------------------------------------------ damaged logs


# OTHER's group has a dead-letter topic (KIP-1191): offsets 2-4 rejected go Archiving,
# then 2-3 Archived once their copies are durable; 4's copy is still to be written.
DEAD_LETTERS: list[ShareRecord] = [
    upd(-1, StateBatch(2, 4, 3, 5), key=OTHER),
    upd(-1, StateBatch(2, 3, 4, 5), key=OTHER),
]


def test_the_sound_log_passes_every_check(spark: SparkSession, tmp_path: Path) -> None:
    data_dir = write_data_dir(tmp_path / "data", [*SOUND, *DEAD_LETTERS])
    result = audit_dir(spark, data_dir, tmp_path)
    assert result.violations == []
    assert all(c["passed"] for c in result.checks) and audit.exit_code(result) == 0
    stats = {(p["group_id"], p["partition"]): p for p in result.partitions}
    key = stats[("g1", 1)]
    assert (key["accepted"], key["released"], key["start_offset"]) == (2, 3, 5)
    assert key["lag"] == TOPIC_RECORDS - 5 - 2
    other = stats[("g2", 0)]
    assert (other["archived"], other["dead_lettered"], other["archiving"]) == (4, 2, 1)
    summary = result.summary
    assert (summary["archived"], summary["dead_lettered"], summary["archiving"]) == (4, 2, 1)
    page = (tmp_path / "out" / "report.html").read_text()
    assert "archived 4 (dead-lettered 2), still archiving 1" in page


DAMAGE: dict[str, tuple[str, list[ShareRecord], dict[str, str]]] = {
    "epoch going back": (audit.STATE_EPOCH_MONOTONIC, [snap(0, 10)], {}),
    "start offset back without an epoch change": (audit.START_OFFSET_MONOTONIC, [upd(3)], {}),
    "overlapping batches": (
        audit.STATE_BATCHES_ORDERED,
        [upd(5, StateBatch(10, 14, 2, 1), StateBatch(12, 13, 2, 1))],
        {},
    ),
    "unordered batches": (
        audit.STATE_BATCHES_ORDERED,
        [upd(5, StateBatch(20, 21, 2, 1), StateBatch(10, 11, 2, 1))],
        {},
    ),
    "batch below the start offset": (
        audit.STATE_BATCHES_ORDERED,
        [upd(-1, StateBatch(2, 6, 2, 1))],
        {},
    ),
    "unknown delivery state": (audit.DELIVERY_STATE_KNOWN, [upd(-1, StateBatch(10, 10, 1, 1))], {}),
    "delivery count over the group's limit": (
        audit.DELIVERY_COUNT_WITHIN_LIMIT,
        [upd(-1, StateBatch(10, 10, 0, 4))],
        {"g1": "3"},
    ),
    "start offset past the topic end": (
        audit.OFFSETS_IN_TOPIC_LOG,
        [upd(TOPIC_RECORDS + 1)],
        {},
    ),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_record_fails_its_rule_at_its_key_and_offset(
    spark: SparkSession, tmp_path: Path, damage: str
) -> None:
    rule, bad, limits = DAMAGE[damage]
    data_dir = write_data_dir(tmp_path / "data", [*SOUND, *bad], limits)
    assert_fails_at(audit_dir(spark, data_dir, tmp_path), rule, KEY, BAD_OFFSET)


def test_a_delivery_count_at_the_limit_passes_and_the_limit_source_is_reported(
    spark: SparkSession, tmp_path: Path
) -> None:
    data_dir = write_data_dir(
        tmp_path / "data", [*SOUND, upd(-1, StateBatch(10, 10, 0, 3))], {"g1": "3"}
    )
    result = audit_dir(spark, data_dir, tmp_path)
    assert result.violations == []
    limits = result.summary["delivery_count_limits"]
    assert limits["g1"] == {"limit": 3, "source": "group config"}
    assert limits["g2"] == {"limit": 5, "source": "Kafka default"}


def _flip_a_byte_under_the_crc(data: bytes) -> bytes:
    """One bit pattern changed in the last record's value, which the CRC32C covers."""
    last = [r for r in audit.scan_segment(data, SEGMENT) if isinstance(r, LogRecord)][-1]
    assert len(data) - 3 > last.byte_position + CRC_START
    damaged = bytearray(data)
    damaged[-3] ^= 0x55
    return bytes(damaged)


BYTE_DAMAGE = {
    "bad CRC": (_flip_a_byte_under_the_crc, "CRC32C"),
    "truncated record": (lambda data: data[:-10], "truncated"),
}


@pytest.mark.parametrize("damage", list(BYTE_DAMAGE))
def test_damaged_bytes_fail_framing_at_their_key_and_offset(
    spark: SparkSession, tmp_path: Path, damage: str
) -> None:
    mutate, words = BYTE_DAMAGE[damage]
    data_dir = write_data_dir(tmp_path / "data", [*SOUND, upd(-1, StateBatch(10, 11, 2, 1))])
    path = share_segment(data_dir)
    path.write_bytes(mutate(path.read_bytes()))
    result = audit_dir(spark, data_dir, tmp_path)
    assert_fails_at(result, audit.CRC_AND_FRAMING, KEY, BAD_OFFSET)
    assert words in result.violations[0].message


def test_compacted_output_that_replays_differently_fails_replay_equivalence(
    spark: SparkSession, tmp_path: Path
) -> None:
    data_dir = write_data_dir(tmp_path / "data", SOUND)
    share_dir = data_dir / "share-state"
    # A staging dir as persister.spark.compact writes it, whose snapshot of KEY lost the
    # start offset move and the batches of offset 3.
    staging = share_dir / "compacted-1-test"
    staging.mkdir()
    wrong = snap(1, 0, StateBatch(0, 4, 2, 1))
    out_name = SEGMENT
    (staging / out_name).write_bytes(
        build_batch([NewRecord(*encode(SOUND[2]))], base_offset=2)
        + build_batch([NewRecord(*encode(wrong))], base_offset=3)
    )
    manifest = {
        "inputs": [{"file": SEGMENT, "size": share_segment(data_dir).stat().st_size}],
        "outputs": [{"file": out_name}],
    }
    (staging / "manifest.json").write_text(json.dumps(manifest))
    result = audit_dir(spark, data_dir, tmp_path)
    hits = [v for v in result.violations if v.rule == audit.REPLAY_EQUIVALENT]
    assert [(v.group_id, v.partition, v.segment, v.offset) for v in hits] == [
        ("g1", 1, f"compacted-1-test/{out_name}", 3)
    ], result.violations
    assert audit.exit_code(result) == 1


def test_reports_and_tables_are_written(spark: SparkSession, tmp_path: Path) -> None:
    data_dir = write_data_dir(tmp_path / "data", [*SOUND, upd(3)])
    out = tmp_path / "out"
    run_audit(spark, data_dir, out)
    report = json.loads((out / "report.json").read_text())
    by_rule = {c["rule"]: c for c in report["checks"]}
    assert set(by_rule) == set(audit.RULES)
    assert not by_rule[audit.START_OFFSET_MONOTONIC]["passed"]
    (v,) = by_rule[audit.START_OFFSET_MONOTONIC]["violations"]
    assert (v["group_id"], v["partition"], v["segment"], v["offset"]) == ("g1", 1, SEGMENT, 4)
    page = (out / "report.html").read_text()
    assert "<script" not in page and "<svg" in page and "start_offset_monotonic" in page
    violations = spark.read.parquet(str(out / "violations")).collect()
    assert [(r.rule, r.offset) for r in violations] == [(audit.START_OFFSET_MONOTONIC, 4)]
    records = spark.read.parquet(str(out / "records"))
    assert records.count() == len(SOUND) + 1
    (row,) = records.where("offset = 3").collect()
    assert (row.source, row.segment, row.record_type, row.group_id, row.partition) == (
        audit.SOURCE_LOG,
        SEGMENT,
        "update",
        "g1",
        1,
    )
    assert (row.snapshot_epoch, row.state_epoch, row.start_offset, row.batch_count) == (
        0,
        None,
        5,
        2,
    )
    assert [tuple(b) for b in row.batches] == [(5, 7, 0, 2), (8, 9, 2, 1)]
    assert [f.name for f in records.schema["batches"].dataType.elementType.fields] == [
        "first_offset",
        "last_offset",
        "delivery_state",
        "delivery_count",
    ]
    stats = spark.read.parquet(str(out / "partition_stats")).collect()
    assert sorted((r.group_id, r.partition) for r in stats) == [("g1", 1), ("g2", 0)]
    assert sorted((r.archived, r.dead_lettered, r.archiving) for r in stats) == [
        (0, 0, 0),
        (2, 0, 0),
    ]


def test_a_dir_that_is_not_a_data_dir_is_a_usage_error(tmp_path: Path) -> None:
    code = spool_main(["audit", "--data-dir", str(tmp_path / "none"), "--out", str(tmp_path)])
    assert code == 2


# ------------------------------------------------------------------ a real broker's log


def _run_share_traffic(broker: Broker, dead_letters: bool = False) -> dict[str, Any]:
    """Produce to 2 partitions; one share group accepts most records, releases some once
    (redelivered with count 2) and rejects some (archived; with `dead_letters`, through
    Archiving and a copy in the group's dead-letter topic, KIP-1191)."""
    topic, group = "audited", "audit-group"
    create_topic(broker, topic, partitions=2)
    earliest(broker, group)
    if dead_letters:
        create_topic(broker, DLQ, config={"errors.deadletterqueue.group.enable": "true"})
        set_group_configs(broker, group, {"errors.deadletterqueue.topic.name": DLQ})
    sent = [s for p in range(2) for s in produce_values(broker, topic, [b"x"] * 20, partition=p)]
    rejected = {(s.partition, s.offset) for s in sent if s.offset % 7 == 3}
    released = {(s.partition, s.offset) for s in sent if s.offset % 5 == 1}
    done: set[tuple[int, int]] = set()

    def decide(msg: Message) -> AcknowledgeType:
        at = (msg.partition(), msg.offset())
        if at in rejected:
            done.add(at)
            return AcknowledgeType.REJECT
        if at in released and msg.delivery_count() == 1:
            return AcknowledgeType.RELEASE
        done.add(at)
        return AcknowledgeType.ACCEPT

    consumer = share_consumer(broker, group, [topic])
    try:
        consume(consumer, until=lambda _log: len(done) == len(sent), timeout=60, decide=decide)
    finally:
        close_quietly(consumer)
    assert len(done) == len(sent)
    deadline = time.monotonic() + 30
    while dead_letters and watermarks(broker, DLQ, 0)[1] < len(rejected):
        assert time.monotonic() < deadline, "the dead-letter copies never appeared"
        time.sleep(0.1)
    return {"topic": topic, "group": group, "rejected": rejected, "released": released}


@pytest.mark.timeout(240)
def test_a_log_written_by_a_broker_under_share_traffic_passes_every_check(
    tmp_path: Path,
) -> None:
    # Small share-state segments and frequent snapshots: the log has closed segments and
    # snapshots between updates, as a long-running broker's has.
    broker = Broker(
        tmp_path / "data",
        tmp_path / "broker.log",
        {
            "share.coordinator.state.topic.segment.bytes": "1024",
            "share.coordinator.snapshot.update.records.per.snapshot": "3",
        },
    )
    broker.start()
    try:
        traffic = _run_share_traffic(broker, dead_letters=True)
    finally:
        broker.stop()
    # The rejected records went through Archiving (state 3), which the log holds.
    share_dir = broker.data_dir / "share-state"
    states = {
        b.delivery_state
        for path in sorted(share_dir.glob("*.log"))
        for r in audit.scan_segment(path.read_bytes(), path.name)
        if isinstance(r, LogRecord)
        for b in r.batches
    }
    assert audit.ARCHIVING in states, states
    out = tmp_path / "out"
    # The command as an operator runs it: its own Spark, its exit code.
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "broker",
            "audit",
            "--data-dir",
            str(broker.data_dir),
            "--out",
            str(out),
            "--master",
            "local[2]",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "[5/5]" in proc.stderr  # progress was shown
    report = json.loads((out / "report.json").read_text())
    assert report["passed"] and all(c["passed"] for c in report["checks"])
    assert report["summary"]["segments"] > 1
    parts = [p for p in report["partitions"] if p["group_id"] == traffic["group"]]
    assert sorted(p["partition"] for p in parts) == [0, 1]
    for p in parts:
        rejected = sum(1 for q, _ in traffic["rejected"] if q == p["partition"])
        assert p["lag"] == 0 and p["topic"] == traffic["topic"]
        # Offsets below the start offset are done and no longer itemised; what the state
        # still holds never has more archived offsets than were rejected.
        assert p["archived"] <= rejected
        assert p["dead_lettered"] <= p["archived"]
    assert report["summary"]["dead_lettered"] <= report["summary"]["archived"]
