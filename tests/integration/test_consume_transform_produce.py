"""Exactly-once consume-transform-produce across kill -9 of the application.

The application is a separate process: a read_committed Consumer that assigns the input
partitions (it resumes at the group's committed offsets), and a transactional Producer
that writes each input record's transformation to the output topic and commits the
consumed offsets in the same transaction (send_offsets_to_transaction: AddOffsetsToTxn
and TxnOffsetCommit). It is killed with SIGKILL several times mid-stream and started
again; its new instance fences the old one (init_transactions aborts what it left
open). At the end the output, read committed, holds every input record exactly once.
On both storage engines."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Producer

from tests.integration.conftest import (
    BOTH_STORAGES,
    REPO_ROOT,
    Broker,
    consume_assigned,
    create_topic,
    produce,
    producer_config,
)

pytestmark = BOTH_STORAGES

PARTITIONS = 3
RECORDS = 3000
KILLS = 3

APP = textwrap.dedent(
    """
    import sys
    from confluent_kafka import Consumer, Producer, TopicPartition

    bootstrap, source, sink, group, tid, partitions = sys.argv[1:7]
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
    })
    consumer.assign([TopicPartition(source, p) for p in range(int(partitions))])
    producer = Producer({
        "bootstrap.servers": bootstrap,
        "transactional.id": tid,
        "linger.ms": 5,
    })
    producer.init_transactions(30)
    idle = 0
    while idle < 40:  # ~10 s without a record: done
        batch = consumer.consume(200, 0.25)
        batch = [m for m in batch if m.error() is None]
        if not batch:
            idle += 1
            continue
        idle = 0
        producer.begin_transaction()
        for m in batch:
            key = f"{m.partition()}:{m.offset()}".encode()
            producer.produce(sink, key=key, value=(m.value() or b"").upper())
        positions = consumer.position(
            [TopicPartition(source, p) for p in range(int(partitions))]
        )
        producer.send_offsets_to_transaction(
            [tp for tp in positions if tp.offset >= 0], consumer.consumer_group_metadata(), 30
        )
        producer.commit_transaction(30)
        print("committed", len(batch), flush=True)
    consumer.close()
    """
)


def _start_app(
    broker: Broker, tmp_path: Path, source: str, sink: str, n: int
) -> subprocess.Popen[bytes]:
    script = tmp_path / "ctp_app.py"
    script.write_text(APP)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.Popen(
        [sys.executable, str(script), broker.bootstrap, source, sink, "ctp-group", "ctp-app",
         str(PARTITIONS)],
        stdout=subprocess.PIPE,
        stderr=(tmp_path / f"app{n}.log").open("wb"),
        env=env,
    )  # fmt: skip


def _wait_for_commits(app: subprocess.Popen[bytes], commits: int, timeout_s: float) -> None:
    assert app.stdout is not None
    deadline = time.monotonic() + timeout_s
    seen = 0
    while seen < commits and time.monotonic() < deadline:
        line = app.stdout.readline()
        if not line:
            break
        if line.startswith(b"committed"):
            seen += 1
    assert seen >= commits, f"the application committed {seen} transactions, not {commits}"


def test_every_input_record_is_in_the_output_exactly_once_across_kills(
    broker_factory: Callable[..., Broker], tmp_path: Path
) -> None:
    broker = broker_factory()
    source, sink = "ctp-input", "ctp-output"
    create_topic(broker, source, PARTITIONS)
    create_topic(broker, sink, PARTITIONS)
    outcome = produce(
        Producer(producer_config(broker, **{"linger.ms": 20})),
        source,
        [(i % PARTITIONS, None, b"record-%d" % i, []) for i in range(RECORDS)],
    )
    assert not outcome.errors and len(outcome.acked) == RECORDS

    for n in range(KILLS):
        app = _start_app(broker, tmp_path, source, sink, n)
        try:
            _wait_for_commits(app, 2, 60)
        finally:
            app.send_signal(signal.SIGKILL)
            app.wait(10)
    final = _start_app(broker, tmp_path, source, sink, KILLS)
    try:
        final.wait(180)  # it stops once idle for ~10 s
    finally:
        if final.poll() is None:
            final.kill()
            final.wait(10)
    assert final.returncode == 0, (tmp_path / f"app{KILLS}.log").read_text()[-3000:]

    got = consume_assigned(
        broker, sink, range(PARTITIONS), RECORDS, **{"isolation.level": "read_committed"}
    )
    keys = Counter(r.key for r in got)
    assert len(keys) == RECORDS, f"{RECORDS - len(keys)} input records missing from the output"
    assert max(keys.values()) == 1, [k for k, n in keys.items() if n > 1][:10]
    expected = {f"{o.partition}:{o.offset}".encode() for o in outcome.acked}
    assert set(keys) == expected
