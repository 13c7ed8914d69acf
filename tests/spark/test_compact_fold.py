"""`persister.share_replay.fold` against the share coordinator's replay (no Spark needed):
folding a key's records gives the state replay leaves, a log whose prefix is
replaced by one folded snapshot per key replays to the same state as the original, and
`spool compact`'s split-then-key fold equals folding each key's records."""

from __future__ import annotations

import itertools
import tempfile
import uuid
from collections import Counter, defaultdict
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.share_coordinator import ShareCoordinatorShard
from coordinator.share_state import ShareState, ShareStateKey
from persister.share_records import (
    ShareKey,
    ShareRecord,
    ShareSnapshot,
    ShareTombstone,
    ShareUpdate,
    StateBatch,
    decode,
    encode,
)
from persister.share_replay import fold
from persister.spark.compact import KeyRun, fold_key, fold_runs, fold_split
from persister.spark.segments import Row, Split, read_split
from protocol.records import NewRecord, build_batch

KEYS = [ShareKey(f"g{g}", uuid.UUID(int=t), p) for g in range(2) for t in (1, 2) for p in (0, 1)]

offsets = st.integers(0, 60)
batches = st.builds(
    lambda a, n, s, c: StateBatch(a, a + n, s, c),
    offsets,
    st.integers(0, 6),
    st.sampled_from((0, 2, 4)),
    st.integers(0, 5),
)
batch_lists = st.lists(batches, max_size=4).map(
    lambda bs: tuple(sorted({(b.first_offset, b.last_offset): b for b in bs}.values()))
)
counts = st.sampled_from((-1, 0, 3, 7))


def _non_overlapping(bs: tuple[StateBatch, ...]) -> tuple[StateBatch, ...]:
    out: list[StateBatch] = []
    for b in bs:
        if not out or b.first_offset > out[-1].last_offset:
            out.append(b)
    return tuple(out)


snapshots = st.builds(
    ShareSnapshot,
    key=st.sampled_from(KEYS),
    snapshot_epoch=st.integers(0, 5),
    state_epoch=st.integers(0, 3),
    leader_epoch=st.integers(-1, 4),
    start_offset=st.integers(-1, 30),
    create_timestamp_ms=st.integers(-1, 10**6),
    write_timestamp_ms=st.integers(-1, 10**6),
    batches=batch_lists.map(_non_overlapping),
    delivery_complete_count=counts,
)
updates = st.builds(
    ShareUpdate,
    key=st.sampled_from(KEYS),
    snapshot_epoch=st.integers(0, 5),
    leader_epoch=st.integers(-1, 4),
    start_offset=st.integers(-1, 40),
    batches=batch_lists.map(_non_overlapping),
    delivery_complete_count=counts,
)
tombstones = st.builds(ShareTombstone, key=st.sampled_from(KEYS))
# Mostly updates, as a real log has; any order, including updates before any snapshot.
records = st.lists(
    st.one_of(updates, updates, updates, snapshots, tombstones), min_size=1, max_size=60
)


def _state_key(key: ShareKey) -> ShareStateKey:
    return ShareStateKey(key.group_id, key.topic_id, key.partition)


def _replay(log: list[ShareRecord]) -> ShareCoordinatorShard:
    shard = ShareCoordinatorShard()
    for record in log:
        shard.replay(record)
    return shard


def _as_state(snapshot: ShareSnapshot | None) -> ShareState | None:
    if snapshot is None:
        return None
    return ShareState(
        state_epoch=snapshot.state_epoch,
        leader_epoch=snapshot.leader_epoch,
        start_offset=snapshot.start_offset,
        batches=list(snapshot.batches),
        delivery_complete_count=snapshot.delivery_complete_count,
    )


def _observable(shard: ShareCoordinatorShard) -> dict[ShareStateKey, object]:
    return {k: (shard.state(k), shard.snapshot_epoch(k)) for k in list(shard.keys())}


@settings(max_examples=300, deadline=None)
@given(records)
def test_fold_of_a_keys_records_is_the_state_replay_leaves(log: list[ShareRecord]) -> None:
    shard = _replay(log)
    for key in KEYS:
        folded = fold(r for r in log if r.key == key)
        assert _as_state(folded) == shard.state(_state_key(key))
        expected_epoch = shard.snapshot_epoch(_state_key(key))
        assert (None if folded is None else folded.snapshot_epoch) == expected_epoch


@settings(max_examples=300, deadline=None)
@given(records, st.integers(0, 60))
def test_a_prefix_folded_to_one_snapshot_per_key_replays_the_same(
    log: list[ShareRecord], cut: int
) -> None:
    """What `spool compact` does to the closed segments: the rest of the log (the
    segments it did not cover) replayed after its output gives the original state."""
    cut = min(cut, len(log))
    prefix, rest = log[:cut], log[cut:]
    compacted: list[ShareRecord] = []
    for key in KEYS:
        state = fold(r for r in prefix if r.key == key)
        if state is not None:
            # Through the wire format, as the output segments carry it.
            compacted.append(decode(*encode(state)))
    assert _observable(_replay(compacted + rest)) == _observable(_replay(log))


def _per_offset(bs: tuple[StateBatch, ...]) -> dict[int, tuple[int, int]]:
    return {
        o: (b.delivery_state, b.delivery_count)
        for b in bs
        for o in range(b.first_offset, b.last_offset + 1)
    }


@settings(max_examples=300, deadline=None)
@given(records)
def test_fold_matches_kafkas_merge_written_out_offset_by_offset(log: list[ShareRecord]) -> None:
    """An independent model of Kafka's ShareCoordinatorShard.merge (per offset, no
    batch arithmetic), so a fault shared by fold and replay still shows."""
    for key in KEYS:
        model: dict[str, object] | None = None
        offsets_: dict[int, tuple[int, int]] = {}
        for r in (r for r in log if r.key == key):
            if isinstance(r, ShareTombstone):
                model, offsets_ = None, {}
            elif isinstance(r, ShareSnapshot):
                model = {
                    "state": r.state_epoch,
                    "leader": r.leader_epoch,
                    "start": r.start_offset,
                    "snap": r.snapshot_epoch,
                    "count": r.delivery_complete_count,
                    "created": r.create_timestamp_ms,
                }
                offsets_ = _per_offset(r.batches)
            else:
                if model is None:
                    model = {"state": 0, "leader": -1, "start": -1, "snap": r.snapshot_epoch}
                    model["created"] = -1
                if r.start_offset != -1:
                    model["start"] = r.start_offset
                if r.leader_epoch != -1:
                    model["leader"] = r.leader_epoch
                model["count"] = r.delivery_complete_count
                offsets_.update(_per_offset(r.batches))
                start = model["start"]
                assert isinstance(start, int)
                offsets_ = {o: v for o, v in offsets_.items() if o >= start}
        folded = fold(r for r in log if r.key == key)
        if model is None:
            assert folded is None
            continue
        assert folded is not None
        assert {
            "state": folded.state_epoch,
            "leader": folded.leader_epoch,
            "start": folded.start_offset,
            "snap": folded.snapshot_epoch,
            "count": folded.delivery_complete_count,
            "created": folded.create_timestamp_ms,
        } == model
        assert _per_offset(folded.batches) == offsets_


def _write_splits(directory: Path, log: list[ShareRecord], cuts: list[int]) -> list[Split]:
    """`log` as one segment file, one batch per record, cut into splits at `cuts`."""
    data = bytearray()
    starts = []
    for offset, record in enumerate(log):
        starts.append(len(data))
        data += build_batch([NewRecord(*encode(record))], base_offset=offset)
    path = directory / f"{0:020d}.log"
    path.write_bytes(data)
    bounds = sorted({0, *(starts[c] for c in cuts if c < len(log)), len(data)})
    return [Split(str(path), path.name, a, b) for a, b in itertools.pairwise(bounds)]


@settings(max_examples=150, deadline=None)
@given(records, st.lists(st.integers(0, 60), max_size=5))
def test_folding_each_split_then_each_keys_runs_gives_the_fold_of_the_whole_log(
    log: list[ShareRecord], cuts: list[int]
) -> None:
    """`spool compact`'s two steps (per split on the map side, per key after the
    shuffle, runs in any order) give exactly what folding each key's rows does, and
    count the records by type."""
    with tempfile.TemporaryDirectory() as tmp:
        splits = _write_splits(Path(tmp), log, cuts)
        runs: dict[object, list[KeyRun]] = defaultdict(list)
        counts: Counter[str] = Counter()
        for split in reversed(splits):  # the shuffle keeps no order
            for key, value in fold_split(split):
                if key is None:
                    counts.update(value)
                else:
                    runs[key].append(value)
        rows: dict[object, list[Row]] = defaultdict(list)
        for split in splits:
            for row in read_split(split):
                rows[(row[5], row[6], row[7])].append(row)
    assert runs.keys() == rows.keys()
    for key, key_rows in rows.items():
        assert fold_runs(runs[key]) == fold_key(key_rows)
    assert counts == Counter(row[4] for key_rows in rows.values() for row in key_rows)
