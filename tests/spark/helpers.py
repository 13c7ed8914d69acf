"""Share-state logs for the Spark tests: generated through the share coordinator's own
state machine, and replayed back into one key by key."""

from __future__ import annotations

import random
import uuid
from pathlib import Path

from coordinator.share_coordinator import ShareCoordinatorShard
from coordinator.share_state import PersistedBatch, ShareState, ShareStateKey
from persister.file_log import LogConfig, PartitionLog
from persister.share_compaction import read_share_records
from persister.share_records import ShareRecord, encode
from protocol.records import NewRecord, build_batch

NOW = 1_700_000_000_000
States = dict[ShareStateKey, ShareState | None]


def replay_dir(log_dir: Path) -> ShareCoordinatorShard:
    """The shard a broker starting on `log_dir` would rebuild (opening the log finishes
    an interrupted swap, as the broker's open does)."""
    plog = PartitionLog.open(log_dir, LogConfig(retention_ms=-1), NOW)
    try:
        shard = ShareCoordinatorShard()
        for _, record in read_share_records(plog):
            shard.replay(record)
        return shard
    finally:
        plog.close(clean=False)


def states_of(shard: ShareCoordinatorShard) -> States:
    return {key: shard.state(key) for key in list(shard.keys())}


class Generator:
    """Random initialize/write/delete traffic on `keys` share partitions, written to a
    share-state log with small segments, exactly as the coordinator would write it."""

    def __init__(
        self,
        log_dir: Path,
        *,
        keys: int = 20,
        segment_bytes: int = 64 * 1024,
        per_snapshot: int = 50,
        seed: int = 0,
    ) -> None:
        self.rng = random.Random(seed)
        topic = uuid.UUID(int=seed + 1)
        self.keys = [ShareStateKey(f"group-{k % 7}", topic, k) for k in range(keys)]
        self.shard = ShareCoordinatorShard(per_snapshot)
        self.log = PartitionLog.open(
            log_dir, LogConfig(segment_bytes=segment_bytes, retention_ms=-1), NOW
        )
        self.now = NOW
        self.next_offset = {k: 0 for k in self.keys}
        self.updates = 0

    def _write(self, records: list[ShareRecord]) -> None:
        if not records:
            return
        self.now += 1
        batch = build_batch([NewRecord(*encode(r)) for r in records], default_timestamp=self.now)
        self.log.append(bytearray(batch), self.now)
        for record in records:
            self.shard.replay(record)

    def step(self) -> None:
        key = self.rng.choice(self.keys)
        state = self.shard.state(key)
        roll = self.rng.random()
        if state is None or roll < 0.002:
            epoch = 0 if state is None else state.state_epoch + 1
            self.next_offset[key] = self.rng.randrange(0, 50)
            self._write(self.shard.initialize_state(key, epoch, self.next_offset[key], self.now)[0])
        elif roll < 0.004:
            self._write(self.shard.delete_state(key)[0])
        else:
            first = self.next_offset[key] + self.rng.randrange(0, 5)
            last = first + self.rng.randrange(0, 8)
            batches = [PersistedBatch(first, last, self.rng.choice((0, 2, 4)), 1)]
            if self.rng.random() < 0.3:
                back = max(state.start_offset, 0)
                batches.append(PersistedBatch(back, back + 2, 0, 2))
            start = -1
            if self.rng.random() < 0.2:
                start = self.next_offset[key]
            self.next_offset[key] = last + 1 if self.rng.random() < 0.5 else first
            leader = -1 if self.rng.random() < 0.9 else max(state.leader_epoch, 0) + 1
            self._write(self.shard.write_state(key, -1, leader, start, batches, self.now)[0])
            self.updates += 1

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.step()

    def close(self, clean: bool = True) -> None:
        self.log.close(clean=clean)
