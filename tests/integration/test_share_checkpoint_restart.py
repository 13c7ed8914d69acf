"""A broker killed with -9 under share traffic restarts from its share-state checkpoint
(written at the clean stop before) plus the log after it, and ends up with exactly the
state a full replay of the same data directory gives: checked key by key against an
in-process share coordinator with checkpoints disabled, over a copy of the directory
taken between the kill and the restart."""

from __future__ import annotations

import contextlib
import shutil
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import KafkaException

from coordinator.share_persister import DurablePersister
from coordinator.share_state import ShareStateKey
from persister.commit import GroupCommit
from tests.integration.conftest import Broker, create_topic
from tests.integration.share_helpers import (
    close_quietly,
    earliest,
    log_lines,
    produce_values,
    share_consumer,
)
from tests.integration.test_share_durability import (
    SHORT_LOCK,
    decide_mixed,
    recent_log,
    run_mixed_workload,
    share_state_loaded,
)
from tests.integration.test_share_state_rpcs import (
    assert_ok,
    batches_of,
    read,
    summary,
    topic_ids,
)
from tests.unit.test_runtime import share_state

State = dict[ShareStateKey, tuple[int, int, int, list[tuple[int, ...]]]]


def broker_state(broker: Broker, keys: list[ShareStateKey]) -> State:
    """What the broker answers for each key (a read at the stored leader epoch writes
    nothing)."""
    out: State = {}
    for key in keys:
        s = summary(broker, key.group_id, key.topic_id, key.partition)
        assert_ok(s, f"summary {key}")
        r = read(
            broker, key.group_id, key.topic_id, key.partition, leader_epoch=int(s.leader_epoch)
        )
        assert_ok(r, f"read {key}")
        out[key] = (int(r.state_epoch), int(s.leader_epoch), int(r.start_offset), batches_of(r))
    return out


def load_copy(source: Path, target: Path, *, checkpoints: bool) -> tuple[DurablePersister, int]:
    shutil.copytree(source, target)
    persister = DurablePersister(target, GroupCommit(), checkpoints=checkpoints)
    return persister, persister.load()


def as_broker_state(persister: DurablePersister, keys: list[ShareStateKey]) -> State:
    out: State = {}
    for key in keys:
        state = persister.shard.state(key)
        assert state is not None, f"no state for {key} in the full replay"
        out[key] = (
            state.state_epoch,
            state.leader_epoch,
            state.start_offset,
            [tuple(b) for b in state.batches],
        )
    return out


def acknowledge_until(
    broker: Broker, group: str, topic: str, commits: threading.Semaphore, stop: threading.Event
) -> None:
    """Poll, acknowledge (accept, reject, release) and commit until `stop`; each
    successful commit is signalled on `commits`."""
    consumer = share_consumer(broker, group, [topic], **{"max.poll.records": 5})
    try:
        while not stop.is_set():
            data = [m for m in consumer.poll(0.2) if m.error() is None]
            for m in data:
                consumer.acknowledge(m, decide_mixed(m))
            if data:
                with contextlib.suppress(KafkaException):
                    consumer.commit_sync(2.0)
                    commits.release()
    except KafkaException:
        pass  # the broker is gone
    finally:
        close_quietly(consumer)


@pytest.mark.timeout(150)
def test_a_kill_9_under_share_traffic_restarts_from_the_checkpoint_to_the_full_replay_state(
    broker_factory: Callable[..., Broker], tmp_path: Path
) -> None:
    broker = broker_factory(
        {**SHORT_LOCK, "share.coordinator.snapshot.update.records.per.snapshot": "7"}
    )
    topic, partitions, per_partition = "ckpt", 2, 120
    groups = ["g-ckpt-before", "g-ckpt-during"]
    create_topic(broker, topic, partitions=partitions)
    for g in groups:
        earliest(broker, g)
    for p in range(partitions):
        produce_values(broker, topic, [f"c{p}-{i}".encode() for i in range(per_partition)], p)
    tid: uuid.UUID = topic_ids(broker)[topic]
    keys = [ShareStateKey(g, tid, p) for g in groups for p in range(partitions)]

    run_mixed_workload(broker, groups[0], topic, per_partition, expire_once=False)
    broker.restart()  # a clean stop writes the checkpoint
    assert log_lines(broker, "checkpoint_loaded"), f"no checkpoint at restart{recent_log(broker)}"

    # Share traffic on the other group, killed with -9 once commits are flowing.
    commits = threading.Semaphore(0)
    stop = threading.Event()
    consumer = threading.Thread(
        target=acknowledge_until, args=(broker, groups[1], topic, commits, stop), daemon=True
    )
    consumer.start()
    for _ in range(3):
        assert commits.acquire(timeout=30), f"no share commits{recent_log(broker)}"
    broker.kill9()
    stop.set()
    consumer.join(timeout=30)
    assert not consumer.is_alive(), "the consumer did not stop after the kill"

    state_dir = broker.data_dir / "share-state"
    full, full_records = load_copy(state_dir, tmp_path / "full", checkpoints=False)
    fast, fast_records = load_copy(state_dir, tmp_path / "fast", checkpoints=True)
    try:
        assert share_state(fast) == share_state(full)
        assert fast_records < full_records, (fast_records, full_records)
        expected = as_broker_state(full, keys)
    finally:
        full.close()
        fast.close()

    broker.start()
    loaded = share_state_loaded(broker)
    assert loaded[-1] == fast_records, f"replayed {loaded}{recent_log(broker)}"
    assert broker_state(broker, keys) == expected
