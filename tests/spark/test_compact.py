"""`spool compact` on Spark and the broker adopting its output.

A share-state log generated through the share coordinator's state machine (hundreds of
thousands of updates) and one written by a real broker under ShareConsumer traffic
(with a kill -9) compact to a small fraction of their size and replay to the same
state key by key; a running broker adopts an output while consumers keep working and
nothing accepted is delivered again; an output the broker's own compaction overtook is
discarded; a crash at any step of an adoption leaves a log that replays the same.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from broker.cli import main as spool_main
from persister.file_log import LogConfig, PartitionLog
from persister.share_compaction import compact_share_log
from persister.spark import adopt as spark_adopt
from persister.spark.compact import MANIFEST, compact, fold_key, write_manifest, write_segments
from persister.spark.segments import closed_segments, read_segment, segment_base_offsets
from tests.integration.conftest import Broker, create_topic
from tests.integration.share_helpers import earliest, log_lines, produce_values
from tests.integration.test_share_durability import SHORT_LOCK, Ledger, start_consumer
from tests.spark.helpers import NOW, Generator, States, replay_dir, states_of

TOPIC = "jobs"
GROUP = "compact-workers"


def assert_same_states(before: States, after: States) -> None:
    assert after.keys() == before.keys(), (
        f"keys lost: {sorted(before.keys() - after.keys())[:5]}, "
        f"gained: {sorted(after.keys() - before.keys())[:5]}"
    )
    differ = [key for key in before if before[key] != after[key]]
    assert not differ, f"{len(differ)} keys differ, e.g. {differ[0]}: {before[differ[0]]} != " + (
        f"{after[differ[0]]}"
    )


def restamp(data_dir: Path) -> None:
    """Make a copied data dir's compaction output name the copy's input files (inode
    and mtime differ after a copy): the copy is then exactly what the job read."""
    log_dir = data_dir / "share-state"
    for staging in spark_adopt.staging_dirs(log_dir):
        manifest = json.loads((staging / MANIFEST).read_text())
        for item in manifest["inputs"]:
            st = (log_dir / item["file"]).stat()
            item.update(size=st.st_size, mtime_ns=st.st_mtime_ns, inode=st.st_ino)
        write_manifest(staging, manifest)


# ------------------------------------------------------------------ a generated log


@pytest.fixture(scope="module")
def generated(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, Path, dict[str, Any]]]:
    """(data dir with a Spark output waiting, a pristine copy of it, the manifest).

    The generator keeps writing after the job read the closed segments, so the log
    continues past what the output covers (the active segment and maybe new ones).
    """
    root = tmp_path_factory.mktemp("generated")
    data = root / "data"
    (data / "meta").mkdir(parents=True)
    gen = Generator(data / "share-state", keys=300, segment_bytes=512 * 1024, per_snapshot=500)
    gen.run(100_000)
    out = compact(spark, data, segment_bytes=16 * 1024)
    gen.run(3_000)
    gen.close(clean=False)
    assert gen.updates > 95_000
    pristine = root / "pristine"
    shutil.copytree(data, pristine)
    restamp(pristine)
    yield data, pristine, out.manifest


def test_generated_log_compacts_to_a_fraction_and_replays_the_same_key_by_key(
    generated: tuple[Path, Path, dict[str, Any]],
) -> None:
    data, _, manifest = generated
    log_dir = data / "share-state"
    before = states_of(replay_dir(log_dir))
    assert manifest["records_in"] > 95_000
    assert manifest["bytes_out"] * 50 < manifest["bytes_in"], manifest
    assert manifest["records_out"] == manifest["keys_kept"] <= 300
    assert len(manifest["outputs"]) > 1  # 16 KiB output segments

    assert spark_adopt.adopt_at_start(log_dir)

    assert spark_adopt.staging_dirs(log_dir) == []
    after = states_of(replay_dir(log_dir))
    assert_same_states(before, after)
    assert len(before) > 250


def test_an_output_the_brokers_own_compaction_overtook_is_discarded(
    generated: tuple[Path, Path, dict[str, Any]], tmp_path: Path
) -> None:
    _, pristine, _ = generated
    data = tmp_path / "data"
    shutil.copytree(pristine, data)
    restamp(data)
    log_dir = data / "share-state"
    [staging] = spark_adopt.staging_dirs(log_dir)
    checked = spark_adopt.check(staging, log_dir)
    assert isinstance(checked, spark_adopt.Manifest), checked  # it fits, until ...
    before = states_of(replay_dir(log_dir))

    plog = PartitionLog.open(log_dir, LogConfig(retention_ms=-1), NOW)
    try:
        # ... the broker compacts the segments the job read, then tries to adopt it.
        assert compact_share_log(plog, NOW).segments_rewritten > 0
        bases = plog.segment_base_offsets
        assert not spark_adopt.adopt_live(plog, checked, plog.log_end_offset, NOW)
        assert plog.segment_base_offsets == bases
    finally:
        plog.close()
    assert not staging.exists()
    assert_same_states(before, states_of(replay_dir(log_dir)))


# ------------------------------------------------------------------ crash during adoption


class Crash(OSError):
    pass


def _fail_at(monkeypatch: pytest.MonkeyPatch, step: int) -> list[str]:
    """Make the `step`-th file-system change (link, rename, unlink, rmdir, fsync) raise
    EIO, as a crash right there would stop the swap; returns the calls seen."""
    seen: list[str] = []
    for name in ("link", "replace", "unlink", "rmdir", "fsync"):
        real: Callable[..., Any] = getattr(os, name)

        def wrapper(*args: Any, _real: Callable[..., Any] = real, _name: str = name) -> Any:
            seen.append(_name)
            if len(seen) == step:
                raise Crash(errno.EIO, f"simulated crash at {_name} #{step}")
            return _real(*args)

        monkeypatch.setattr(os, name, wrapper)
    return seen


def _local_output(log_dir: Path) -> tuple[list[int], list[tuple[int, Path]], int]:
    """What `spool compact` writes, folded in-process (the crash test is about the swap),
    in several small output segments."""
    segments = closed_segments(log_dir)
    rows: dict[tuple[Any, ...], list[tuple[Any, ...]]] = defaultdict(list)
    for segment in segments:
        for row in read_segment(segment.path):
            rows[(row[5], row[6], row[7])].append(row)
    snapshots = sorted(s for s in map(fold_key, rows.values()) if s is not None)
    staging = log_dir / "compacted-0-local"
    staging.mkdir()
    outputs = write_segments(staging, segments[0].base_offset, snapshots, 1024)
    assert len(outputs) > 2
    inputs = [s.base_offset for s in segments]
    return inputs, [(o["base_offset"], staging / o["file"]) for o in outputs], segments[-1].limit


def test_a_crash_at_any_step_of_an_adoption_leaves_a_log_that_replays_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "source"
    gen = Generator(source, keys=40, segment_bytes=16 * 1024, per_snapshot=30, seed=7)
    gen.run(600)
    gen.close()
    before = states_of(replay_dir(source))
    step, outcomes = 0, set()
    while True:
        step += 1
        log_dir = tmp_path / f"try{step}"
        shutil.copytree(source, log_dir)
        inputs, outputs, limit = _local_output(log_dir)
        plog = PartitionLog.open(log_dir, LogConfig(retention_ms=-1), NOW)
        with monkeypatch.context() as m:
            seen = _fail_at(m, step)
            try:
                plog.replace_closed_segments_with(inputs, outputs, NOW)
            except Crash:
                crashed = True
            else:
                crashed = False
        # No close: the process died. The next open finishes or drops the swap.
        after = replay_dir(log_dir)
        assert_same_states(before, states_of(after))
        run = [b for b in segment_base_offsets(log_dir) if b < limit]
        assert run in (inputs, [b for b, _ in outputs]), f"step {step}: a mixed run {run}"
        outcomes.add("old" if run == inputs else "new")
        shutil.rmtree(log_dir)
        if not crashed:
            assert step > len(seen)
            break
        assert step < 500, seen
    # Crashes before the commit left the old run, after it the new one.
    assert outcomes == {"old", "new"}, step


# ------------------------------------------------------------------ a real broker


BROKER_SETTINGS = {
    **SHORT_LOCK,
    "share.coordinator.state.topic.segment.bytes": "2048",
    "share.coordinator.snapshot.update.records.per.snapshot": "200",
    "log.cleaner.backoff.ms": "300",
}


def _wait_for_verdict(broker: Broker, staging: str, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for event in ("share_state_compaction_adopted", "share_state_compaction_discarded"):
            if log_lines(broker, event, staging):
                return event
        time.sleep(0.2)
    raise AssertionError(f"the broker neither adopted nor discarded {staging} in {timeout}s")


def test_broker_adopts_outputs_live_and_at_start_under_share_traffic(
    spark: SparkSession, tmp_path: Path
) -> None:
    broker = Broker(tmp_path / "data", tmp_path / "broker.log", BROKER_SETTINGS)
    log_dir = broker.data_dir / "share-state"
    broker.start()
    try:
        create_topic(broker, TOPIC, partitions=2)
        earliest(broker, GROUP)
        values = [f"job-{i}".encode() for i in range(2_400)]
        produce_values(broker, TOPIC, values[:1_200], partition=0, batch=100)
        produce_values(broker, TOPIC, values[1_200:], partition=1, batch=100)
        ledger = Ledger()

        def traffic(cycle: int, until_confirmed: int) -> list[BaseException]:
            stop = threading.Event()
            thread, failures = start_consumer(broker, GROUP, TOPIC, ledger, cycle, stop)
            deadline = time.monotonic() + 60
            while len(ledger.confirmed) < until_confirmed and time.monotonic() < deadline:
                time.sleep(0.1)
            if cycle == 0:
                broker.kill9()  # in the middle of the traffic
            stop.set()
            thread.join(60)
            return failures

        failures = traffic(0, 800)
        ledger.life += 1
        broker.start()
        failures += traffic(1, 1_600)
        assert len(closed_segments(log_dir)) >= 5

        # A consumer keeps working while the job runs and the broker adopts its output.
        stop = threading.Event()
        thread, more = start_consumer(broker, GROUP, TOPIC, ledger, 2, stop, max_s=120.0)
        failures += more
        verdicts = []
        for _ in range(4):
            staging = compact(spark, broker.data_dir).staging
            assert staging is not None
            verdicts.append(_wait_for_verdict(broker, staging.name))
            if verdicts[-1] == "share_state_compaction_adopted":
                break
        assert verdicts[-1] == "share_state_compaction_adopted", verdicts
        deadline = time.monotonic() + 90
        while len(ledger.confirmed) < len(values) and time.monotonic() < deadline:
            time.sleep(0.2)
        stop.set()
        thread.join(60)
        assert not failures, failures
        assert ledger.redelivered_after_confirm == [], ledger.redelivered_after_confirm[:5]
        assert len(ledger.confirmed) == len(values), (
            f"{len(ledger.confirmed)} of {len(values)} accepted; commit errors "
            f"{ledger.commit_errors[:3]}"
        )

        # Stopped: the CLI's output is adopted at start, before the replay.
        broker.stop()
        before = states_of(replay_dir(log_dir))
        size_before = sum(s.size for s in closed_segments(log_dir))
        assert (
            spool_main(["compact", "--data-dir", str(broker.data_dir), "--master", "local[2]"]) == 0
        )
        broker.start()
        assert log_lines(broker, "share_state_compaction_adopted", "at_start")
        assert spark_adopt.staging_dirs(log_dir) == []
        assert sum(s.size for s in closed_segments(log_dir)) * 5 < size_before
        broker.stop()
        assert_same_states(before, states_of(replay_dir(log_dir)))
    finally:
        broker.kill9()


def test_compact_refuses_a_directory_that_is_not_a_spool_data_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert spool_main(["compact", "--data-dir", str(tmp_path)]) == 2
    assert "is not a spool data dir" in capsys.readouterr().err
